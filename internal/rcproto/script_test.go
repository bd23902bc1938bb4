package rcproto

// Script tests: testdata/*.txt drive the simulated network (sim_test.go)
// and compare what happens with what the script expects.
//
// A script is a sequence of blocks: one or more command lines, a line
// "----", the expected output, and an empty line. Lines starting with #
// outside expected output are comments. Run with -rewrite to regenerate
// the expected output (then review the diff).
//
// Commands:
//
//	config [mtu=N] [timeout=N] [retry=N] [rnr_retry=N] [min_rnr=N]
//	       [max_rd=N] [max_dest=N] [window=N] [first_psn=N] [resp_psn=N] [reliable]
//	       [noconnect] [connect_timeout=DUR]   new pair of engines
//	connect                                     the path is up
//	post OP LEN [bad] [lerr] [fence]            OP: write write_imm send send_imm read cas faa
//	recv N                                      post N receives at the responder
//	drop req|resp N, dup req|resp N             fault the next N packets sent
//	reorder req|resp                            swap the next two delivered
//	run                                         move packets until nothing moves
//	tick DUR                                    advance time, firing timers
//	lost                                        the peer is gone (PeerLost)
//	activity                                    the peer shows signs of life (Activity)
//	state, wrs                                  print engine state, work requests
//
// Goroutines: the test's only.

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/rc"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata scripts")

var opByName = map[string]Opcode{
	"write": OpWrite, "write_imm": OpWriteImm, "send": OpSend, "send_imm": OpSendImm,
	"read": OpRead, "cas": OpCmpSwap, "faa": OpFetchAdd,
}

func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

func runScript(t *testing.T, file string) {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var out strings.Builder
	var s *sim
	for i := 0; i < len(lines); {
		line := lines[i]
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			i++
			continue
		}
		// Commands up to "----".
		var cmds []string
		start := i
		for i < len(lines) && lines[i] != "----" {
			cmds = append(cmds, lines[i])
			i++
		}
		if i == len(lines) {
			t.Fatalf("%s:%d: block without ----", file, start+1)
		}
		i++
		var want []string
		for i < len(lines) && lines[i] != "" {
			want = append(want, lines[i])
			i++
		}
		var got strings.Builder
		for _, c := range cmds {
			if s != nil {
				s.log.Reset()
			}
			var res string
			s, res = command(t, s, c, fmt.Sprintf("%s:%d", file, start+1))
			got.WriteString(res)
		}
		g := strings.TrimRight(got.String(), "\n")
		for _, c := range cmds {
			out.WriteString(c + "\n")
		}
		out.WriteString("----\n")
		if g != "" {
			out.WriteString(g + "\n")
		}
		if !*rewrite && g != strings.Join(want, "\n") {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", file, start+1, strings.Join(cmds, "; "), g, strings.Join(want, "\n"))
		}
		if s != nil && s.err != nil {
			t.Errorf("%s:%d: %v", file, start+1, s.err)
		}
	}
	if *rewrite {
		res := strings.TrimRight(out.String(), "\n") + "\n"
		if err := os.WriteFile(file, []byte(res), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func command(t *testing.T, s *sim, line, where string) (*sim, string) {
	f := strings.Fields(line)
	num := func(i int) int {
		if i >= len(f) {
			t.Fatalf("%s: %q: missing argument", where, line)
		}
		n, err := strconv.ParseInt(f[i], 0, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", where, line, err)
		}
		return int(n)
	}
	if f[0] != "config" && s == nil {
		t.Fatalf("%s: %q before config", where, line)
	}
	dir := func() (*faults, bool) {
		switch {
		case len(f) > 1 && f[1] == "req":
			return &s.reqF, true
		case len(f) > 1 && f[1] == "resp":
			return &s.respF, true
		}
		t.Fatalf("%s: %q: req or resp?", where, line)
		return nil, false
	}
	switch f[0] {
	case "config":
		cfg := Config{MaxWR: 64, Timeout: 10, RetryCount: 3, RNRRetry: 3}
		rcfg := RespConfig{}
		minRNR := uint8(1)
		connect := true
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 0, 64)
			switch k {
			case "mtu":
				cfg.MTU, rcfg.MTU = uint32(n), uint32(n)
			case "timeout":
				cfg.Timeout = uint8(n)
			case "retry":
				cfg.RetryCount = uint8(n)
			case "rnr_retry":
				cfg.RNRRetry = uint8(n)
			case "min_rnr":
				minRNR = uint8(n)
			case "max_rd":
				cfg.MaxRdAtomic = int(n)
			case "max_dest":
				rcfg.MaxDestRdAtomic = int(n)
			case "window":
				cfg.Window = int(n)
			case "first_psn":
				cfg.FirstPSN, rcfg.FirstPSN = PSN(n), PSN(n)
			case "resp_psn":
				rcfg.FirstPSN = PSN(n)
			case "reliable":
				cfg.Reliable = true
			case "noconnect":
				connect = false
			case "connect_timeout":
				d, err := time.ParseDuration(v)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				cfg.ConnectTimeout = d
			default:
				t.Fatalf("%s: unknown config %q", where, k)
			}
		}
		s = newSim(cfg, rcfg, minRNR)
		if connect {
			s.apply(s.req.Connected(s.now))
		}
	case "connect":
		s.apply(s.req.Connected(s.now))
	case "post":
		op, ok := opByName[f[1]]
		if !ok {
			t.Fatalf("%s: unknown op %q", where, f[1])
		}
		bad, lerr, fence := false, rc.Success, false
		for _, x := range f[3:] {
			switch x {
			case "fence":
				fence = true
			case "bad":
				bad = true
			case "lerr":
				lerr = rc.LocalProtection
			}
		}
		s.post(op, uint32(num(2)), bad, lerr, fence)
	case "recv":
		s.recvs += num(1)
	case "drop":
		d, _ := dir()
		d.drop += num(2)
	case "dup":
		d, _ := dir()
		d.dup += num(2)
	case "reorder":
		d, _ := dir()
		d.reorder = true
	case "run":
		s.run()
	case "tick":
		d, err := time.ParseDuration(f[1])
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		s.advance(d)
	case "lost":
		s.apply(s.req.PeerLost(s.now))
	case "activity":
		s.apply(s.req.Activity(s.now))
	case "state":
		s.logf("%s", s.state())
	case "wrs":
		for i, w := range s.wrs {
			st := "pending"
			if w.done {
				st = stName(w.status)
			}
			s.logf("wr=%d %s %d: %s", s.cfg.FirstWR+uint64(i), w.op, w.len, st)
		}
	default:
		t.Fatalf("%s: unknown command %q", where, f[0])
	}
	return s, s.log.String()
}
