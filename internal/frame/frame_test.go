package frame

// Tests run on the test goroutine, with a writer goroutine where a test
// needs a live peer (net.Pipe).

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

type testFrame struct {
	typ     byte
	payload []byte
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func smallFrames() []testFrame {
	return []testFrame{
		{1, nil},
		{2, []byte{0xff}},
		{255, pattern(100, 3)},
		{0, pattern(5, 9)},
	}
}

func bigFrames() []testFrame {
	return []testFrame{
		{7, pattern(growMin+1, 1)},
		{8, pattern(keepMax+5, 2)},
		{9, pattern(3, 4)}, // after a big one: the big buffer is dropped
		{10, pattern(200_000, 5)},
	}
}

func encodeAll(fs []testFrame) []byte {
	var b []byte
	for _, f := range fs {
		b = AppendFrame(b, f.typ, f.payload)
	}
	return b
}

// readAll reads frames until an error; payloads are copied.
func readAll(r *Reader) ([]testFrame, error) {
	var out []testFrame
	for {
		typ, p, err := r.Next()
		if err != nil {
			return out, err
		}
		out = append(out, testFrame{typ, bytes.Clone(p)})
	}
}

func sameFrames(t *testing.T, got, want []testFrame) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d frames, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].typ != want[i].typ || !bytes.Equal(got[i].payload, want[i].payload) {
			t.Errorf("frame %d: type %d, %d bytes; want type %d, %d bytes", i, got[i].typ, len(got[i].payload), want[i].typ, len(want[i].payload))
		}
	}
}

func TestRoundTrip(t *testing.T) {
	want := append(smallFrames(), bigFrames()...)
	var buf bytes.Buffer
	w := NewWriter(&buf, 1<<20)
	for _, f := range want {
		if err := w.WriteFrame(f.typ, f.payload); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(buf.Bytes(), encodeAll(want)) {
		t.Fatal("Writer and AppendFrame disagree")
	}
	got, err := readAll(NewReader(&buf, 1<<20))
	if err != io.EOF {
		t.Fatalf("end of stream: %v, want io.EOF", err)
	}
	sameFrames(t, got, want)
}

// checkPrefix reads a prefix of a stream of frames: it must give the
// frames wholly inside it, then io.EOF at a frame boundary or a truncation
// error elsewhere.
func checkPrefix(t *testing.T, all []byte, frames []testFrame, n int) {
	t.Helper()
	got, err := readAll(NewReader(bytes.NewReader(all[:n]), 1<<20))
	end, whole := 0, 0
	for _, f := range frames {
		if end+HeaderLen+len(f.payload) > n {
			break
		}
		end += HeaderLen + len(f.payload)
		whole++
	}
	sameFrames(t, got, frames[:whole])
	if end == n {
		if err != io.EOF {
			t.Fatalf("prefix of %d bytes (a frame boundary): %v, want io.EOF", n, err)
		}
		return
	}
	if !errors.Is(err, ErrTruncated) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("prefix of %d bytes: %v, want ErrTruncated", n, err)
	}
}

// Every prefix of a valid stream is read without a panic: whole frames,
// then io.EOF or ErrTruncated.
func TestTruncatedPrefixes(t *testing.T) {
	frames := smallFrames()
	all := encodeAll(frames)
	for n := 0; n < len(all); n++ {
		checkPrefix(t, all, frames, n)
	}
	// Big frames: boundaries, their neighbours and a sample in between.
	frames = bigFrames()
	all = encodeAll(frames)
	end := 0
	for _, f := range frames {
		for _, n := range []int{end, end + 1, end + HeaderLen - 1, end + HeaderLen, end + HeaderLen + 1} {
			checkPrefix(t, all, frames, n)
		}
		end += HeaderLen + len(f.payload)
		checkPrefix(t, all, frames, end-1)
	}
	for n := 0; n < len(all); n += 4099 {
		checkPrefix(t, all, frames, n)
	}
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// A header claiming 256 MiB is refused as soon as it is in: nothing is
// read past it and nothing is allocated for it.
func TestTooLargeRefusedBeforeAllocation(t *testing.T) {
	claim := append([]byte{0x10, 0, 0, 0, 3}, make([]byte, 64)...)
	src := bytes.NewReader(claim)
	cr := &countingReader{r: src}
	r := NewReader(cr, 64<<10)
	_, _, err := r.Next()
	const want = "frame: 268435456-byte frame exceeds the 65536-byte limit"
	var se *SizeError
	if !errors.Is(err, ErrTooLarge) || !errors.As(err, &se) || err.Error() != want {
		t.Fatalf("Next: %v, want %q", err, want)
	}
	if se.Size != 256<<20 || se.Limit != 64<<10 || se.Type != 3 || se.Write {
		t.Errorf("SizeError %+v", se)
	}
	if cr.n != HeaderLen {
		t.Errorf("read %d bytes, want just the %d of the header", cr.n, HeaderLen)
	}
	if _, _, err2 := r.Next(); err2 != err {
		t.Errorf("Next after a refused frame: %v, want the same error", err2)
	}
	// The one allocation is the error value itself.
	allocs := testing.AllocsPerRun(100, func() {
		src.Reset(claim)
		r.Reset(src)
		if _, _, err := r.Next(); !errors.Is(err, ErrTooLarge) {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Errorf("%v allocations per refused frame, want at most 1 (the error)", allocs)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		src.Reset(claim)
		r.Reset(src)
		r.Next()
	}
	runtime.ReadMemStats(&after)
	if d := after.TotalAlloc - before.TotalAlloc; d > 64<<10 {
		t.Errorf("100 refused frames allocated %d bytes", d)
	}
}

// Under a large limit, a frame costs what the peer sent, not what it
// claimed.
func TestAllocationFollowsData(t *testing.T) {
	claim := append([]byte{0x04, 0, 0, 0, 1}, make([]byte, 1000)...) // 64 MiB claimed, 1000 bytes sent
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := NewReader(bytes.NewReader(claim), 128<<20).Next()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), "after 1000 of 67108864 payload bytes") {
		t.Errorf("Next: %v", err)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 4*growMin {
		t.Errorf("a 1000-byte start of a 64 MiB frame allocated %d bytes", d)
	}
}

func TestLimits(t *testing.T) {
	p := pattern(100, 0)
	b := AppendFrame(nil, 1, p)
	if _, got, err := NewReader(bytes.NewReader(b), 100).Next(); err != nil || !bytes.Equal(got, p) {
		t.Errorf("payload at the limit: %v", err)
	}
	if _, _, err := NewReader(bytes.NewReader(b), 99).Next(); !errors.Is(err, ErrTooLarge) {
		t.Errorf("payload one over the limit: %v", err)
	}
	r := NewReader(bytes.NewReader(b), 0)
	if r.Limit() != DefaultLimit {
		t.Errorf("limit 0 gives %d", r.Limit())
	}
	r.SetLimit(50)
	if _, _, err := r.Next(); !errors.Is(err, ErrTooLarge) {
		t.Errorf("after SetLimit(50): %v", err)
	}
	var out bytes.Buffer
	w := NewWriter(&out, 99)
	err := w.WriteFrame(4, p)
	var se *SizeError
	if !errors.As(err, &se) || !se.Write || out.Len() != 0 {
		t.Errorf("writing over the limit: %v, %d bytes written", err, out.Len())
	} else if want := "frame: cannot send a 100-byte frame (type 4): exceeds the 99-byte limit"; err.Error() != want {
		t.Errorf("%q, want %q", err, want)
	}
	w.SetLimit(100)
	if err := w.WriteFrame(4, p); err != nil || !bytes.Equal(out.Bytes(), AppendFrame(nil, 4, p)) {
		t.Errorf("writing at the limit: %v", err)
	}
}

// writeCounter counts Write calls.
type writeCounter struct {
	bytes.Buffer
	calls int
}

func (w *writeCounter) Write(p []byte) (int, error) { w.calls++; return w.Buffer.Write(p) }

func TestWriterOneWriteAndReuse(t *testing.T) {
	var wc writeCounter
	w := NewWriter(&wc, 0)
	p := pattern(copyMax, 1)
	if err := w.WriteFrame(1, p); err != nil || wc.calls != 1 {
		t.Fatalf("%v, %d writes", err, wc.calls)
	}
	if allocs := testing.AllocsPerRun(100, func() { wc.Reset(); w.WriteFrame(2, p[:100]) }); allocs != 0 {
		t.Errorf("%v allocations per small frame", allocs)
	}
	wc.Reset()
	big := pattern(copyMax+1, 2)
	if err := w.WriteFrame(3, big); err != nil || !bytes.Equal(wc.Bytes(), AppendFrame(nil, 3, big)) {
		t.Errorf("big frame: %v", err)
	}
	if cap(w.buf) > 2*copyMax {
		t.Errorf("writer buffer grew to %d", cap(w.buf))
	}
}

// Reading small frames reuses the buffer: no allocation per frame.
func TestReaderReuse(t *testing.T) {
	b := encodeAll(smallFrames())
	src := bytes.NewReader(b)
	r := NewReader(src, 0)
	readAll(r) // warm up
	allocs := testing.AllocsPerRun(100, func() {
		src.Reset(b)
		r.Reset(src)
		for {
			if _, _, err := r.Next(); err != nil {
				break
			}
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per stream of small frames", allocs)
	}
	// A big payload is not kept once the next frame is read.
	b = encodeAll(bigFrames())
	r = NewReader(bytes.NewReader(b), 1<<20)
	r.Next()
	r.Next()
	r.Next()
	if cap(r.buf) > keepMax {
		t.Errorf("kept a %d-byte buffer after a small frame", cap(r.buf))
	}
}

// A read deadline expiring mid-frame leaves the Reader where it was; it
// carries on with the same frame once the deadline moves.
func TestDeadlineResume(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	p := pattern(3000, 6)
	f := AppendFrame(nil, 5, p)
	r := NewReader(a, 0)
	from := 0
	for _, to := range []int{3, HeaderLen + 1000} { // mid-header, mid-payload
		if _, err := b.Write(f[from:to]); err != nil {
			t.Fatal(err)
		}
		from = to
		a.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, _, err := r.Next(); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("after %d bytes: %v, want a deadline error", to, err)
		}
	}
	if _, err := b.Write(f[from:]); err != nil {
		t.Fatal(err)
	}
	a.SetReadDeadline(time.Now().Add(5 * time.Second))
	typ, got, err := r.Next()
	if err != nil || typ != 5 || !bytes.Equal(got, p) {
		t.Fatalf("resumed frame: type %d, %d bytes, %v", typ, len(got), err)
	}
}

func TestPutHeaderPanics(t *testing.T) {
	ns := []int{-1}
	if over := uint64(MaxLimit) + 1; uint64(math.MaxInt) >= over {
		ns = append(ns, int(over))
	}
	for _, n := range ns {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("PutHeader with length %d did not panic", n)
				}
			}()
			PutHeader(make([]byte, HeaderLen), 0, n)
		}()
	}
}

func ExampleReader() {
	var stream bytes.Buffer
	w := NewWriter(&stream, 1024)
	w.WriteFrame(1, []byte("hello"))
	w.WriteFrame(2, nil)
	stream.Write([]byte{0, 0, 8, 0, 3}) // claims 2048 bytes

	r := NewReader(&stream, 1024)
	for {
		typ, p, err := r.Next()
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("type %d: %q\n", typ, p)
	}
	// Output:
	// type 1: "hello"
	// type 2: ""
	// frame: 2048-byte frame exceeds the 1024-byte limit
}
