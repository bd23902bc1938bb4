package perftest

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func sampleHello() hello {
	return hello{version: 1, test: Test{VerbWrite, KindBW}, all: true, size: 8 << 20, iters: 5000, duration: 0, qps: 2,
		bidir: true, atomic: CmpAndSwap, conn: "RC", gbits: true, device: "tcp0", tx: 128, rx: 1, cqMod: 100, inline: 0, mtu: 1024}
}

func TestMessagesRoundTrip(t *testing.T) {
	h := sampleHello()
	l := reparse(t, h.line())
	if got, err := parseHello(l); err != nil || !reflect.DeepEqual(got, h) {
		t.Errorf("hello: %+v %v", got, err)
	}
	a := accept{device: "shm0", transport: "shm", mtu: 4096}
	if got, err := parseAccept(reparse(t, a.line())); err != nil || got != a {
		t.Errorf("accept: %+v %v", got, err)
	}
	q := qpInfo{lid: 0, outReads: 16, qpn: 0xabcdef, psn: 0x123456, rkey: 0xdeadbeef, vaddr: 0x7f0012345000, srqn: 0, idx: 3, addr: []byte("SHM1\x00\x01\xff")}
	ql := q.line()
	if ql.words[0] != "0000:0010:abcdef:123456:deadbeef:00007f0012345000:00000000" || len(ql.words[0]) != 58 {
		t.Errorf("key string %q is not perftest's KEY_PRINT_FMT", ql.words[0])
	}
	if got, err := parseQPInfo(reparse(t, ql)); err != nil || !reflect.DeepEqual(got, q) {
		t.Errorf("qp: %+v %v", got, err)
	}
	for _, r := range []result{
		{kind: KindBW, size: 65536, iters: 5000, peak: 1234.5, bwAvg: 1000.25, rate: 0.015},
		{kind: KindLat, size: 2, iters: 1000, min: 0.1, max: 9, typical: 0.2, tAvg: 0.25, stdev: 0.01, p99: 0.5, p999: 3},
		{kind: KindLat, dur: true, size: 2, iters: 123456, tAvg: 0.3, tps: 3e6},
	} {
		if got, err := parseResult(reparse(t, r.line())); err != nil || got != r {
			t.Errorf("result: %+v %v, want %+v", got, err, r)
		}
	}
	if n, err := parseSizeLine(reparse(t, sizeLine(kindReady, 4096)), kindReady); err != nil || n != 4096 {
		t.Errorf("ready: %d %v", n, err)
	}
	e := errLine("bad\nthing\x00 here")
	if got := reparse(t, e); got.kind != kindErr || got.text != "bad thing  here" {
		t.Errorf("err: %+v", got)
	}
}

// reparse encodes l and parses it back.
func reparse(t *testing.T, l line) line {
	t.Helper()
	b := l.encode()
	if b[len(b)-1] != '\n' || bytes.Count(b, []byte("\n")) != 1 {
		t.Fatalf("encoding %q is not one line", b)
	}
	got, err := parseLine(b[:len(b)-1])
	if err != nil {
		t.Fatalf("parsing %q: %v", b, err)
	}
	return got
}

func TestParseLineRejects(t *testing.T) {
	for _, s := range []string{
		"", "hello 1", "HELLO  1", "HELLO 1 ", "HELLO a=1 word", "HELLO a=1 a=2", "HELLO A=1", "HELLO a=",
		"HELLO =1", "HELLO \x01", "ERR bad\x7f", "TOOLONGKINDNAMEXXX", "QP\tx",
		"HELLO " + strings.Repeat("x", maxLine),
		"HELLO" + strings.Repeat(" x", maxToks+1),
	} {
		if _, err := parseLine([]byte(s)); !errors.Is(err, errMalformed) {
			t.Errorf("parseLine(%.40q) = %v, want malformed", s, err)
		}
	}
}

func TestTypedRejects(t *testing.T) {
	good := sampleHello().line()
	mutate := func(k, v string) line {
		l := line{kind: good.kind, words: good.words}
		for _, f := range good.fields {
			if f.k == k {
				if v == "" {
					continue
				}
				f.v = v
			}
			l.fields = append(l.fields, f)
		}
		return l
	}
	for _, c := range []struct{ k, v string }{
		{"test", "write_foo"}, {"size", "0"}, {"size", "99999999999"}, {"qps", "0"}, {"bidir", "2"}, {"atomic", "SWAP"},
		{"fmt", "KBS"}, {"tx", "-1"}, {"mtu", "x"}, {"dev", ""}, {"iters", "1e3"},
	} {
		if _, err := parseHello(mutate(c.k, c.v)); !errors.Is(err, errMalformed) {
			t.Errorf("hello with %s=%q: %v", c.k, c.v, err)
		}
	}
	for _, s := range []string{
		"QP 0000:0010:abcdef:123456:deadbeef:00007f0012345000 idx=0 addr=00",
		"QP 0000:0010:abcdef:123456:deadbeef:00007f0012345000:0000000g idx=0 addr=00",
		"QP 000:0010:abcdef:123456:deadbeef:00007f0012345000:00000000 idx=0 addr=00",
		"QP 0000:0010:abcdef:123456:deadbeef:00007f0012345000:00000000 idx=0 addr=0",
		"QP 0000:0010:abcdef:123456:deadbeef:00007f0012345000:00000000 addr=00",
		"QP 0000:0010:abcdef:123456:deadbeef:00007f0012345000:00000000 idx=99999 addr=00",
		"RESULT size=1 iters=1 peak=NaN bwavg=1 rate=1",
		"RESULT size=1 iters=1 peak=-1 bwavg=1 rate=1",
		"RESULT size=1 iters=1 peak=+Inf bwavg=1 rate=1",
		"RESULT size=1 iters=1 min=1",
		"READY 0", "READY x", "READY 1 2",
	} {
		l, err := parseLine([]byte(s))
		if err != nil {
			continue
		}
		var perr error
		switch l.kind {
		case kindQP:
			_, perr = parseQPInfo(l)
		case kindResult:
			_, perr = parseResult(l)
		case kindReady:
			_, perr = parseSizeLine(l, kindReady)
		}
		if !errors.Is(perr, errMalformed) {
			t.Errorf("%q: %v, want malformed", s, perr)
		}
	}
}

// FuzzParseLine: no input makes a parser panic, and whatever parses
// encodes back to the same message.
func FuzzParseLine(f *testing.F) {
	f.Add([]byte("HELLO 1 test=write_bw all=0 size=65536 iters=5000 dur=0 qps=1 bidir=0 atomic=FETCH_AND_ADD conn=RC fmt=MBS dev=shm0 tx=128 rx=1 cqmod=100 inline=0 mtu=0"))
	f.Add([]byte("QP 0000:0010:0a1b2c:3d4e5f:1234abcd:00007f5a3c000000:00000000 idx=0 addr=534d4831"))
	f.Add([]byte("RESULT size=2 iters=1000 min=0.1 max=3 typical=0.2 tavg=0.2 stdev=0.01 p99=1 p999=2"))
	f.Add([]byte("ERR client and server disagree"))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := parseLine(b)
		if err != nil {
			return
		}
		parseHello(l)
		parseAccept(l)
		parseQPInfo(l)
		parseResult(l)
		parseSizeLine(l, kindSize)
		helloVersion(l)
		enc := l.encode()
		l2, err := parseLine(enc[:len(enc)-1])
		if err != nil || !reflect.DeepEqual(l, l2) {
			t.Fatalf("%q → %q → %+v, %v", b, enc, l2, err)
		}
	})
}
