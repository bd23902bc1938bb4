package perftest

// The out-of-band exchange format (version 1): one message per line, ASCII,
// terminated by "\n", at most maxLine bytes:
//
//	KIND [word ...] [key=value ...]
//
// KIND is upper case; words and values are printable ASCII without spaces;
// keys are [a-z0-9_.]; words come before fields, a key appears once. ERR is
// the exception: everything after "ERR " is free text (one line, printable).
// Messages (see doc.go for the order):
//
//	HELLO 1 test=write_bw all=0 size=65536 iters=5000 dur=0 qps=1 bidir=0
//	      atomic=FETCH_AND_ADD conn=RC fmt=MBS dev=shm0 tx=128 rx=1 cqmod=100
//	      inline=0 mtu=0
//	ACCEPT dev=shm0 transport=shm mtu=4096
//	QP 0000:0010:0a1b2c:3d4e5f:1234abcd:00007f5a3c000000:00000000 idx=0 addr=534d4831...
//	SYNC connected | SIZE 65536 | READY 65536 | DONE
//	RESULT size=65536 iters=5000 peak=... bwavg=... rate=... (bandwidth)
//	RESULT size=2 iters=1000 min=... max=... typical=... tavg=... stdev=... p99=... p999=... (latency)
//	RESULT size=2 iters=1000 tavg=... tps=... (latency, -D)
//	ERR free text
//
// The QP line's first word is exactly perftest's KEY_PRINT_FMT
// ("%04x:%04x:%06x:%06x:%08x:%016llx:%08x": LID, outstanding reads, QPN,
// PSN, rkey, VA, SRQN), the key string its Ethernet exchange sends as a
// 59-byte NUL-terminated message per QP; rdmakit adds the transport's QP
// address (verbs QP.Address, which perftest has no use for on an RNIC)
// and the QP's index. docs/perf.md lists what exact wire compatibility
// with perftest would take.
//
// parseLine and the typed parsers never panic, whatever the input
// (FuzzParseLine). Everything here is pure functions, called from the
// control connection's reader goroutine (parseLine) and the run's
// goroutine (the rest).

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

const (
	wireVersion = 1
	// maxLine bounds a message, newline included.
	maxLine = 4096
	// maxAddr bounds a transport QP address.
	maxAddr = 1024
	maxKind = 16
	maxKey  = 32
	maxToks = 64
)

// Message kinds.
const (
	kindHello  = "HELLO"
	kindAccept = "ACCEPT"
	kindQP     = "QP"
	kindSync   = "SYNC"
	kindSize   = "SIZE"
	kindReady  = "READY"
	kindResult = "RESULT"
	kindDone   = "DONE"
	kindErr    = "ERR"
)

var errMalformed = errors.New("malformed exchange message")

func malformed(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errMalformed, fmt.Sprintf(format, a...))
}

type field struct{ k, v string }

// line is one parsed message.
type line struct {
	kind   string
	words  []string
	fields []field
	text   string // ERR only
}

func isKind(s string) bool {
	if s == "" || len(s) > maxKind {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

func isKey(s string) bool {
	if s == "" || len(s) > maxKey {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

func isText(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return false
		}
	}
	return true
}

// parseLine parses one message without its trailing newline.
func parseLine(b []byte) (line, error) {
	if len(b) >= maxLine {
		return line{}, malformed("%d bytes, longer than %d", len(b), maxLine-1)
	}
	s := string(b)
	kind, rest, _ := strings.Cut(s, " ")
	if !isKind(kind) {
		return line{}, malformed("bad message kind %.20q", kind)
	}
	l := line{kind: kind}
	if kind == kindErr {
		if !isText(rest) {
			return line{}, malformed("control characters in ERR text")
		}
		l.text = rest
		return l, nil
	}
	if rest == "" {
		if strings.HasSuffix(s, " ") {
			return line{}, malformed("trailing space")
		}
		return l, nil
	}
	toks := strings.Split(rest, " ")
	if len(toks) > maxToks {
		return line{}, malformed("%d tokens, more than %d", len(toks), maxToks)
	}
	for _, t := range toks {
		if !isToken(t) {
			return line{}, malformed("bad token %.20q", t)
		}
		k, v, ok := strings.Cut(t, "=")
		if !ok {
			if len(l.fields) > 0 {
				return line{}, malformed("word %.20q after fields", t)
			}
			l.words = append(l.words, t)
			continue
		}
		if !isKey(k) || v == "" {
			return line{}, malformed("bad field %.20q", t)
		}
		for _, f := range l.fields {
			if f.k == k {
				return line{}, malformed("field %q twice", k)
			}
		}
		l.fields = append(l.fields, field{k, v})
	}
	return l, nil
}

// encode returns the message with its newline. It panics on a message
// parseLine would refuse: those are programming errors.
func (l line) encode() []byte {
	var sb strings.Builder
	sb.WriteString(l.kind)
	if l.kind == kindErr {
		sb.WriteByte(' ')
		sb.WriteString(l.text)
	}
	for _, w := range l.words {
		sb.WriteByte(' ')
		sb.WriteString(w)
	}
	for _, f := range l.fields {
		sb.WriteByte(' ')
		sb.WriteString(f.k)
		sb.WriteByte('=')
		sb.WriteString(f.v)
	}
	sb.WriteByte('\n')
	b := []byte(sb.String())
	if _, err := parseLine(b[:len(b)-1]); err != nil {
		panic("perftest: encoding an invalid message: " + err.Error())
	}
	return b
}

// errLine makes an ERR message from any text: control characters become
// spaces and the text is cut to fit a line.
func errLine(text string) line {
	b := []byte(text)
	for i, c := range b {
		if c < ' ' || c == 0x7f {
			b[i] = ' '
		}
	}
	if len(b) > maxLine-16 {
		b = b[:maxLine-16]
	}
	return line{kind: kindErr, text: string(b)}
}

func (l line) get(k string) (string, bool) {
	for _, f := range l.fields {
		if f.k == k {
			return f.v, true
		}
	}
	return "", false
}

func (l *line) set(k string, v any) {
	var s string
	switch v := v.(type) {
	case bool:
		s = "0"
		if v {
			s = "1"
		}
	case float64:
		s = strconv.FormatFloat(v, 'g', -1, 64)
	default:
		s = fmt.Sprint(v)
	}
	l.fields = append(l.fields, field{k, s})
}

// fieldReader decodes required fields of a line, remembering the first
// error.
type fieldReader struct {
	l   line
	err error
}

func (r *fieldReader) str(k string) string {
	v, ok := r.l.get(k)
	if !ok && r.err == nil {
		r.err = malformed("%s without %s", r.l.kind, k)
	}
	return v
}

func (r *fieldReader) int(k string, lo, hi int64) int64 {
	v := r.str(k)
	if r.err != nil {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		r.err = malformed("%s %s=%.20q out of range %d..%d", r.l.kind, k, v, lo, hi)
		return 0
	}
	return n
}

func (r *fieldReader) bool(k string) bool { return r.int(k, 0, 1) == 1 }

func (r *fieldReader) float(k string) float64 {
	v := r.str(k)
	if r.err != nil {
		return 0
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		r.err = malformed("%s %s=%.20q is not a non-negative number", r.l.kind, k, v)
		return 0
	}
	return f
}

// hello is the client's opening message: the protocol version, the test
// and every parameter.
type hello struct {
	version  int
	test     Test
	all      bool
	size     int64
	iters    int64
	duration int
	infinite bool
	qps      int
	bidir    bool
	atomic   AtomicOp
	conn     string
	gbits    bool
	device   string
	tx, rx   int
	cqMod    int
	inline   int
	mtu      int
}

func (h hello) line() line {
	l := line{kind: kindHello, words: []string{strconv.Itoa(h.version)}}
	l.set("test", h.test)
	l.set("all", h.all)
	l.set("size", h.size)
	l.set("iters", h.iters)
	l.set("dur", h.duration)
	l.set("inf", h.infinite)
	l.set("qps", h.qps)
	l.set("bidir", h.bidir)
	l.set("atomic", h.atomic)
	l.set("conn", h.conn)
	f := "MBS"
	if h.gbits {
		f = "GBS"
	}
	l.set("fmt", f)
	l.set("dev", h.device)
	l.set("tx", h.tx)
	l.set("rx", h.rx)
	l.set("cqmod", h.cqMod)
	l.set("inline", h.inline)
	l.set("mtu", h.mtu)
	return l
}

// helloVersion returns the version a HELLO announces, so that a peer of
// another version gets a clear answer even if its fields differ.
func helloVersion(l line) (int, error) {
	if l.kind != kindHello || len(l.words) != 1 {
		return 0, malformed("expected HELLO VERSION")
	}
	v, err := strconv.Atoi(l.words[0])
	if err != nil || v < 0 || v > 1<<20 {
		return 0, malformed("bad HELLO version %.20q", l.words[0])
	}
	return v, nil
}

func parseHello(l line) (hello, error) {
	v, err := helloVersion(l)
	if err != nil {
		return hello{}, err
	}
	r := fieldReader{l: l}
	h := hello{version: v}
	test := r.str("test")
	h.all = r.bool("all")
	h.size = r.int("size", 1, maxMsgSize)
	h.iters = r.int("iters", 0, 1<<32)
	h.duration = int(r.int("dur", 0, 1<<20))
	h.infinite = r.bool("inf")
	h.qps = int(r.int("qps", 1, maxQPs))
	h.bidir = r.bool("bidir")
	atomic := r.str("atomic")
	h.conn = r.str("conn")
	f := r.str("fmt")
	h.device = r.str("dev")
	h.tx = int(r.int("tx", 1, maxTx))
	h.rx = int(r.int("rx", 1, maxRx))
	h.cqMod = int(r.int("cqmod", 1, maxCQMod))
	h.inline = int(r.int("inline", 0, maxInline))
	h.mtu = int(r.int("mtu", 0, 4096))
	if r.err != nil {
		return hello{}, r.err
	}
	if h.test, err = ParseTest(test); err != nil {
		return hello{}, malformed("HELLO test: %v", err)
	}
	switch atomic {
	case "FETCH_AND_ADD":
		h.atomic = FetchAndAdd
	case "CMP_AND_SWAP":
		h.atomic = CmpAndSwap
	default:
		return hello{}, malformed("HELLO atomic=%.20q", atomic)
	}
	switch f {
	case "MBS":
	case "GBS":
		h.gbits = true
	default:
		return hello{}, malformed("HELLO fmt=%.20q", f)
	}
	return h, nil
}

// accept is the server's answer to an acceptable HELLO.
type accept struct {
	device, transport string
	mtu               int
}

func (a accept) line() line {
	l := line{kind: kindAccept}
	l.set("dev", a.device)
	l.set("transport", a.transport)
	l.set("mtu", a.mtu)
	return l
}

func parseAccept(l line) (accept, error) {
	if l.kind != kindAccept || len(l.words) != 0 {
		return accept{}, malformed("expected ACCEPT")
	}
	r := fieldReader{l: l}
	a := accept{device: r.str("dev"), transport: r.str("transport"), mtu: int(r.int("mtu", 256, 4096))}
	return a, r.err
}

// qpInfo is what the peer needs to connect to and target one queue pair.
type qpInfo struct {
	lid, outReads uint16
	qpn, psn      uint32 // 24 bits
	rkey          uint32
	vaddr         uint64
	srqn          uint32
	idx           int
	addr          []byte // verbs QP.Address
}

// keyString is perftest's KEY_PRINT_FMT.
func (q qpInfo) keyString() string {
	return fmt.Sprintf("%04x:%04x:%06x:%06x:%08x:%016x:%08x", q.lid, q.outReads, q.qpn&0xffffff, q.psn&0xffffff, q.rkey, q.vaddr, q.srqn)
}

func (q qpInfo) line() line {
	l := line{kind: kindQP, words: []string{q.keyString()}}
	l.set("idx", q.idx)
	l.set("addr", hex.EncodeToString(q.addr))
	return l
}

func parseQPInfo(l line) (qpInfo, error) {
	if l.kind != kindQP || len(l.words) != 1 {
		return qpInfo{}, malformed("expected QP KEY")
	}
	parts := strings.Split(l.words[0], ":")
	widths := []int{4, 4, 6, 6, 8, 16, 8}
	if len(parts) != len(widths) {
		return qpInfo{}, malformed("QP key %.80q: want LID:OUT:QPN:PSN:RKEY:VADDR:SRQN", l.words[0])
	}
	var v [7]uint64
	for i, p := range parts {
		if len(p) != widths[i] {
			return qpInfo{}, malformed("QP key field %d %.20q: want %d hex digits", i, p, widths[i])
		}
		n, err := strconv.ParseUint(p, 16, 64)
		if err != nil {
			return qpInfo{}, malformed("QP key field %d %.20q: not hex", i, p)
		}
		v[i] = n
	}
	q := qpInfo{lid: uint16(v[0]), outReads: uint16(v[1]), qpn: uint32(v[2]), psn: uint32(v[3]),
		rkey: uint32(v[4]), vaddr: v[5], srqn: uint32(v[6])}
	r := fieldReader{l: l}
	q.idx = int(r.int("idx", 0, maxQPs-1))
	a := r.str("addr")
	if r.err != nil {
		return qpInfo{}, r.err
	}
	if len(a) > 2*maxAddr {
		return qpInfo{}, malformed("QP address longer than %d bytes", maxAddr)
	}
	addr, err := hex.DecodeString(a)
	if err != nil {
		return qpInfo{}, malformed("QP address is not hex")
	}
	q.addr = addr
	return q, nil
}

// result is one size's figures, sent by the client to the server (and
// both ways with -b). Bandwidth figures are in the report's unit.
type result struct {
	kind  Kind
	dur   bool // latency by duration: only tavg and tps
	size  int64
	iters int64
	// bandwidth
	peak, bwAvg, rate float64
	// latency, usec
	min, max, typical, tAvg, stdev, p99, p999 float64
	tps                                       float64
	// --cpu_util (bandwidth, duration mode): percent, when measured.
	cpu    float64
	hasCPU bool
}

func (r result) line() line {
	l := line{kind: kindResult}
	l.set("size", r.size)
	l.set("iters", r.iters)
	switch {
	case r.kind == KindBW:
		l.set("peak", r.peak)
		l.set("bwavg", r.bwAvg)
		l.set("rate", r.rate)
		if r.hasCPU {
			l.set("cpu", r.cpu)
		}
	case r.dur:
		l.set("tavg", r.tAvg)
		l.set("tps", r.tps)
	default:
		l.set("min", r.min)
		l.set("max", r.max)
		l.set("typical", r.typical)
		l.set("tavg", r.tAvg)
		l.set("stdev", r.stdev)
		l.set("p99", r.p99)
		l.set("p999", r.p999)
	}
	return l
}

func parseResult(l line) (result, error) {
	if l.kind != kindResult || len(l.words) != 0 {
		return result{}, malformed("expected RESULT")
	}
	r := fieldReader{l: l}
	res := result{size: r.int("size", 1, maxMsgSize), iters: r.int("iters", 0, 1<<50)}
	switch {
	case hasField(l, "peak"):
		res.kind = KindBW
		res.peak, res.bwAvg, res.rate = r.float("peak"), r.float("bwavg"), r.float("rate")
		if hasField(l, "cpu") {
			res.cpu, res.hasCPU = r.float("cpu"), true
		}
	case hasField(l, "tps"):
		res.kind, res.dur = KindLat, true
		res.tAvg, res.tps = r.float("tavg"), r.float("tps")
	default:
		res.kind = KindLat
		res.min, res.max, res.typical = r.float("min"), r.float("max"), r.float("typical")
		res.tAvg, res.stdev, res.p99, res.p999 = r.float("tavg"), r.float("stdev"), r.float("p99"), r.float("p999")
	}
	return res, r.err
}

func hasField(l line, k string) bool {
	_, ok := l.get(k)
	return ok
}

// sizeLine makes SIZE n or READY n; parseSizeLine reads either.
func sizeLine(kind string, n int64) line {
	return line{kind: kind, words: []string{strconv.FormatInt(n, 10)}}
}

func parseSizeLine(l line, kind string) (int64, error) {
	if l.kind != kind || len(l.words) != 1 || len(l.fields) != 0 {
		return 0, malformed("expected %s N", kind)
	}
	n, err := strconv.ParseInt(l.words[0], 10, 64)
	if err != nil || n < 1 || n > maxMsgSize {
		return 0, malformed("%s %.20q: not a message size", kind, l.words[0])
	}
	return n, nil
}
