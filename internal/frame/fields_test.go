package frame

// Tests run on the test goroutine.

import (
	"bytes"
	"errors"
	"runtime"
	"strings"
	"testing"
)

// fieldPayload encodes one field of every kind.
func fieldPayload() []byte {
	var b []byte
	b = append(b, 0xfe)
	b = AppendUint16(b, 0xbeef)
	b = AppendUint32(b, 0xdeadbeef)
	b = AppendUint64(b, 0x0123456789abcdef)
	b = AppendBytes8(b, []byte("eight"))
	b = AppendBytes16(b, pattern(300, 1))
	b = AppendBytes32(b, nil)
	b = AppendString8(b, "")
	b = AppendString16(b, "sixteen")
	b = AppendString32(b, "thirty-two")
	return b
}

// decodeFields reads what fieldPayload wrote and reports whether every
// field came back.
func decodeFields(d *Decoder) bool {
	ok := d.Uint8() == 0xfe
	ok = d.Uint16() == 0xbeef && ok
	ok = d.Uint32() == 0xdeadbeef && ok
	ok = d.Uint64() == 0x0123456789abcdef && ok
	ok = string(d.Bytes8()) == "eight" && ok
	ok = bytes.Equal(d.Bytes16(), pattern(300, 1)) && ok
	ok = len(d.Bytes32()) == 0 && ok
	ok = d.String8() == "" && ok
	ok = d.String16() == "sixteen" && ok
	ok = d.String32() == "thirty-two" && ok
	return ok
}

func TestFieldsRoundTrip(t *testing.T) {
	p := fieldPayload()
	d := NewDecoder(p)
	if !decodeFields(&d) || d.Finish() != nil || d.Len() != 0 {
		t.Fatalf("round trip: %v", d.Finish())
	}
	// Every truncated payload fails with ErrTruncated, never a panic, and
	// the failure sticks.
	for n := range len(p) {
		d := NewDecoder(p[:n])
		decodeFields(&d)
		if err := d.Err(); !errors.Is(err, ErrTruncated) {
			t.Fatalf("payload cut to %d bytes: %v", n, err)
		}
		if d.Uint32() != 0 || d.Bytes8() != nil || d.Rest() != nil || d.Len() != 0 {
			t.Fatalf("payload cut to %d bytes: reads after the failure return data", n)
		}
	}
	d = NewDecoder(append(p, 0, 0))
	decodeFields(&d)
	if err := d.Finish(); !errors.Is(err, ErrTrailing) || d.Len() != 2 || !bytes.Equal(d.Rest(), []byte{0, 0}) {
		t.Errorf("two trailing bytes: %v", err)
	}
}

// A length prefix claiming more than the payload holds fails, and costs
// no more than the error value, whatever it claims.
func TestFieldLengthChecked(t *testing.T) {
	p := AppendUint32(nil, 0xffffffff)
	p = append(p, "short"...)
	var err error
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		d := NewDecoder(p)
		if d.Bytes32() != nil {
			t.Fatal("a 4 GiB field decoded")
		}
		err = d.Err()
	}
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), "4294967295-byte field at offset 4 with 5 bytes left") {
		t.Errorf("oversized length prefix: %v", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<10 {
		t.Errorf("100 refused 4 GiB fields allocated %d bytes", grew)
	}
	d := NewDecoder([]byte{1, 2, 3})
	if d.Bytes(-1) != nil || !errors.Is(d.Err(), ErrTruncated) {
		t.Errorf("Bytes(-1): %v", d.Err())
	}
}

func TestAppendTooLongPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"Bytes8":   func() { AppendBytes8(nil, make([]byte, 256)) },
		"String8":  func() { AppendString8(nil, strings.Repeat("x", 256)) },
		"Bytes16":  func() { AppendBytes16(nil, make([]byte, 1<<16)) },
		"String16": func() { AppendString16(nil, strings.Repeat("x", 1<<16)) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s with an oversized field did not panic", name)
				}
			}()
			f()
		}()
	}
	if b := AppendBytes8(nil, make([]byte, 255)); len(b) != 256 || b[0] != 255 {
		t.Error("AppendBytes8 of 255 bytes")
	}
}
