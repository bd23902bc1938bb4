package perftest

import (
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// checkRun fails unless both sides succeeded and printed want result
// lines with a positive figure, the server the same lines as the client.
func checkRun(t *testing.T, r pairResult, want int) []string {
	t.Helper()
	if r.clientErr != nil || r.serverErr != nil {
		t.Fatalf("client: %v\nserver: %v\nclient output:\n%s\nserver output:\n%s", r.clientErr, r.serverErr, r.clientOut, r.serverOut)
	}
	cl, sl := resultLines(r.clientOut), resultLines(r.serverOut)
	if len(cl) != want {
		t.Fatalf("client printed %d result lines, want %d:\n%s", len(cl), want, r.clientOut)
	}
	if strings.Join(cl, "\n") != strings.Join(sl, "\n") {
		t.Errorf("server printed other results:\nclient:\n%s\nserver:\n%s", strings.Join(cl, "\n"), strings.Join(sl, "\n"))
	}
	for _, l := range cl {
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil || v <= 0 {
			t.Errorf("result line without a positive last figure: %q", l)
		}
	}
	return cl
}

func TestEveryTestShm(t *testing.T) {
	for _, name := range Tests {
		t.Run(name, func(t *testing.T) {
			args := []string{name, "-d", "shm0", "-n", "200"}
			r := runPair(t, args, args)
			lines := checkRun(t, r, 1)
			if !strings.Contains(r.clientOut, "Device         : shm0") || !strings.Contains(r.clientOut, " local address: LID 0000 QPN 0x") {
				t.Errorf("header missing:\n%s", r.clientOut)
			}
			if f := strings.Fields(lines[0]); f[1] != "200" {
				t.Errorf("iterations %s, want 200", f[1])
			}
		})
	}
}

func TestEveryTestTCP(t *testing.T) {
	for _, name := range Tests {
		t.Run(name, func(t *testing.T) {
			// In one process both sides' spinning goroutines hold both Ps, and
			// the transport's goroutines wait for the network poller (up to
			// sysmon's 10 ms): keep this short; two processes do not have it.
			args := []string{name, "-d", "tcp0", "-n", "20"}
			checkRun(t, runPair(t, args, args), 1)
		})
	}
}

func TestSweepJSONPlot(t *testing.T) {
	dir := t.TempDir()
	js, pl := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.png")
	args := []string{"write_bw", "-a", "-n", "5", "-d", "shm0"}
	r := runPair(t, args, append(args, "--out_json", js, "--plot", pl))
	lines := checkRun(t, r, 23)
	for i, l := range lines {
		if f := strings.Fields(l); f[0] != strconv.Itoa(2<<i) {
			t.Errorf("line %d is for size %s, want %d", i, f[0], 2<<i)
		}
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TestInfo map[string]any   `json:"test_info"`
		Results  []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("JSON: %v\n%s", err, b)
	}
	if len(doc.Results) != 23 || doc.TestInfo["Device"] != "shm0" || doc.Results[22]["MsgSize"] != float64(8<<20) {
		t.Errorf("JSON content: %s", b)
	}
	for _, k := range []string{"BW_peak", "BW_average", "MsgRate", "n_iterations"} {
		if _, ok := doc.Results[0][k]; !ok {
			t.Errorf("JSON result lacks %s", k)
		}
	}
	f, err := os.Open(pl)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("plot is not a PNG: %v", err)
	}
}

func TestLatencySweepAndHistogram(t *testing.T) {
	args := []string{"read_lat", "-a", "-n", "20", "-d", "shm0"}
	checkRun(t, runPair(t, args, args), 23)
	args = []string{"write_lat", "-n", "50", "-H", "-d", "shm0"}
	r := runPair(t, args, args)
	checkRun(t, r, 1)
	if !strings.Contains(r.clientOut, "#, usec\n1, ") || !strings.Contains(r.clientOut, "\n47, ") {
		t.Errorf("histogram missing or short:\n%s", r.clientOut)
	}
}

func TestBidirectional(t *testing.T) {
	for _, name := range []string{"send_bw", "write_bw", "read_bw", "atomic_bw"} {
		t.Run(name, func(t *testing.T) {
			args := []string{name, "-b", "-n", "300", "-d", "shm0"}
			r := runPair(t, args, args)
			checkRun(t, r, 1)
			if !strings.Contains(r.clientOut, "Bidirectional BW Test") {
				t.Errorf("title:\n%s", r.clientOut)
			}
		})
	}
}

func TestMultipleQPs(t *testing.T) {
	for _, name := range []string{"send_bw", "write_bw"} {
		args := []string{name, "-q", "3", "-n", "100", "-d", "shm0"}
		lines := checkRun(t, runPair(t, args, args), 1)
		if f := strings.Fields(lines[0]); f[1] != "300" {
			t.Errorf("%s: iterations %s, want 300 (3 QPs × 100)", name, f[1])
		}
	}
}

func TestDuration(t *testing.T) {
	args := []string{"write_bw", "-D", "1", "-d", "shm0"}
	r := runPair(t, args, args)
	checkRun(t, r, 1)
	if !strings.Contains(r.clientOut, "WARNING: BW peak won't be measured") {
		t.Errorf("no peak warning:\n%s", r.clientOut)
	}
	args = []string{"send_lat", "-D", "1", "-d", "shm0"}
	r = runPair(t, args, args)
	checkRun(t, r, 1)
	if !strings.Contains(r.clientOut, "tps average") {
		t.Errorf("duration latency header missing:\n%s", r.clientOut)
	}
}

func TestMismatch(t *testing.T) {
	cases := []struct {
		server, client []string
		want           string
	}{
		{[]string{"write_bw"}, []string{"write_lat"}, "disagree on the test: server write_bw, client write_lat"},
		{[]string{"write_bw"}, []string{"write_bw", "-s", "4096"}, "message size: server -s 65536, client -s 4096; give both the same -s"},
		{[]string{"write_bw", "-a"}, []string{"write_bw"}, "-a (all sizes)"},
		{[]string{"write_bw", "-n", "100"}, []string{"write_bw", "-n", "200"}, "iterations: server -n 100, client -n 200"},
		{[]string{"send_bw", "-q", "2"}, []string{"send_bw"}, "number of QPs"},
		{[]string{"send_bw", "-b"}, []string{"send_bw"}, "-b (bidirectional)"},
		{[]string{"atomic_lat", "-A", "CMP_AND_SWAP"}, []string{"atomic_lat"}, "atomic type"},
		{[]string{"write_bw", "-d", "tcp0"}, []string{"write_bw"}, "disagree on the device: server -d tcp0, client uses shm0"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			start := time.Now()
			r := runPair(t, c.server, append(c.client, "-d", "shm0"))
			if r.clientErr == nil || r.serverErr == nil {
				t.Fatalf("want errors on both sides, got client %v, server %v", r.clientErr, r.serverErr)
			}
			for side, err := range map[string]error{"client": r.clientErr, "server": r.serverErr} {
				if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
					t.Errorf("%s error %q, want one line with %q", side, err, c.want)
				}
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
}

func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	o, err := ParseArgs([]string{"write_bw", "-d", "shm0", "-p", strconv.Itoa(port), "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = Run(context.Background(), o, Env{Stdout: &syncBuffer{}})
	// The hint depends on the build: with -tags ibverbs this side can speak
	// rdma_cm itself, so it asks for the same flag instead.
	hint := "a perftest server run with -R or -z listens through rdma_cm, which this build of rdmakit perf speaks only on roce devices (-d roceN with -R or -z; build with -tags ibverbs for RDMA NICs): run it without -R or -z)"
	if rcmFirst == "ibverbs" {
		hint = "a perftest server run with -R or -z listens through rdma_cm: give this side the same flag)"
	}
	want := "cannot reach server 127.0.0.1:" + strconv.Itoa(port) + ": connection refused (no server on that port; " + hint
	if err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("error does not wrap ECONNREFUSED")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %v", d)
	}
}

func TestClientUnknownDevice(t *testing.T) {
	o, _ := ParseArgs([]string{"write_bw", "-d", "mlx5_0", "127.0.0.1"})
	err := Run(context.Background(), o, Env{Stdout: &syncBuffer{}})
	// Every linked device is listed (roce ones too, one per up interface:
	// rcm_roce.go imports transport/roce), shm0 and tcp0 among them.
	devs, _ := verbs.Devices()
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	list := strings.Join(names, ", ")
	if !strings.Contains(list, "shm0") || !strings.Contains(list, "tcp0") {
		t.Errorf("devices %q: no shm0 or tcp0", list)
	}
	if err == nil || err.Error() != "device mlx5_0 is not available (devices: "+list+"); choose one with -d" {
		t.Errorf("error %v", err)
	}
}

// A perftest binary (or anything else) on the other end is recognized.
func TestForeignPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		v := make([]byte, 16)
		copy(v, "6.28")
		c.Write(v) // perftest's exchange_versions
		time.Sleep(2 * time.Second)
	}()
	o, _ := ParseArgs([]string{"write_bw", "-d", "shm0", "-p", strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), "127.0.0.1"})
	start := time.Now()
	err = Run(context.Background(), o, Env{Stdout: &syncBuffer{}})
	if err == nil || !strings.Contains(err.Error(), "perftest") {
		t.Errorf("error %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("took %v", d)
	}

	// And garbage sent to a server.
	sl, _ := net.Listen("tcp", "127.0.0.1:0")
	so, _ := ParseArgs([]string{"write_bw"})
	done := make(chan error, 1)
	go func() { done <- Run(context.Background(), so, Env{Stdout: &syncBuffer{}, Listener: sl}) }()
	c, err := net.Dial("tcp", sl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, errMalformed) {
			t.Errorf("server error %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("server did not give up on garbage")
	}
	c.Close()
}

func TestLoopback(t *testing.T) {
	marker := t.Name() + strconv.Itoa(os.Getpid())
	o, _ := ParseArgs([]string{"write_lat", "-n", "100", "--loopback"})
	var out syncBuffer
	if err := Run(context.Background(), o, Env{Stdout: &out, ServerCommand: childCommand(marker)}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if l := resultLines(out.String()); len(l) != 1 || !strings.Contains(out.String(), "Device         : shm0") {
		t.Errorf("output:\n%s", out.String())
	}
	if p := leftovers(marker); len(p) > 0 {
		t.Errorf("server processes left: %v", p)
	}
}

func TestLoopbackServerRefuses(t *testing.T) {
	marker := t.Name() + strconv.Itoa(os.Getpid())
	mk := childCommand(marker)
	// A server that was started with another size.
	cmd := func(args []string) *exec.Cmd { return mk(append(args, "-s", "128")) }
	o, _ := ParseArgs([]string{"write_bw", "-n", "100", "--loopback"})
	start := time.Now()
	err := Run(context.Background(), o, Env{Stdout: &syncBuffer{}, ServerCommand: cmd})
	if err == nil || !strings.Contains(err.Error(), "message size: server -s 128, client -s 65536") {
		t.Errorf("error %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
	if p := leftovers(marker); len(p) > 0 {
		t.Errorf("server processes left: %v", p)
	}
}

func TestLoopbackInterrupted(t *testing.T) {
	marker := t.Name() + strconv.Itoa(os.Getpid())
	o, _ := ParseArgs([]string{"write_bw", "-D", "30", "--loopback"})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(1500*time.Millisecond, cancel)
	start := time.Now()
	err := Run(ctx, o, Env{Stdout: &syncBuffer{}, ServerCommand: childCommand(marker)})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v to stop", d)
	}
	if p := leftovers(marker); len(p) > 0 {
		t.Errorf("server processes left: %v", p)
	}
}

// A server that dies mid-run ends the client's run with an error, soon.
func TestServerDies(t *testing.T) {
	cases := [][]string{
		{"write_bw", "-D", "30", "-d", "shm0"},
		{"write_lat", "-D", "30", "-d", "shm0"},
		{"send_bw", "-D", "30", "-d", "tcp0"},
		{"send_lat", "-D", "30", "-d", "tcp0"},
	}
	for _, args := range cases {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			marker := strconv.Itoa(os.Getpid()) + strings.Join(args, "")
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			f, _ := ln.(*net.TCPListener).File()
			port := ln.Addr().(*net.TCPAddr).Port
			ln.Close()
			cmd := childCommand(marker)(args)
			cmd.ExtraFiles = []*os.File{f}
			cmd.Env = append(cmd.Env, ListenFDEnv+"=3")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			f.Close()
			defer cmd.Wait()
			defer cmd.Process.Kill()
			o, _ := ParseArgs(append(args, "-p", strconv.Itoa(port), "127.0.0.1"))
			var out syncBuffer
			killed := make(chan time.Time, 1)
			time.AfterFunc(1500*time.Millisecond, func() {
				killed <- time.Now()
				cmd.Process.Kill()
			})
			ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
			defer cancel()
			err = Run(ctx, o, Env{Stdout: &out})
			if err == nil || ctx.Err() != nil {
				t.Fatalf("error %v (ctx %v)\n%s", err, ctx.Err(), out.String())
			}
			if !strings.Contains(err.Error(), "server") || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q does not say the server is gone in one line", err)
			}
			var killedAt time.Time
			select {
			case killedAt = <-killed:
			default:
				t.Fatalf("the client failed before the server was killed: %v", err)
			}
			if d := time.Since(killedAt); d > 3*time.Second {
				t.Errorf("client noticed after %v", d)
			}
		})
	}
}

// TestRunInfinitely: --run_infinitely prints one result per -D period
// until the client is interrupted; then both sides end cleanly (nil).
func TestRunInfinitely(t *testing.T) {
	for _, name := range []string{"write_bw", "send_bw"} {
		t.Run(name, func(t *testing.T) {
			args := []string{name, "--run_infinitely", "-D", "1", "-d", "shm0"}
			so, _ := ParseArgs(args)
			co, _ := ParseArgs(args)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			co.Server, co.Port = "127.0.0.1", ln.Addr().(*net.TCPAddr).Port
			var sout, cout syncBuffer
			done := make(chan error, 1)
			go func() { done <- Run(context.Background(), so, Env{Stdout: &sout, Listener: ln}) }()
			// Interrupted once it has printed two periods (or after 30 s).
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			go func() {
				for ctx.Err() == nil && len(resultLines(cout.String())) < 2 {
					time.Sleep(20 * time.Millisecond)
				}
				cancel()
			}()
			if err := Run(ctx, co, Env{Stdout: &cout}); err != nil {
				t.Fatalf("client: %v\n%s", err, cout.String())
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("server: %v\n%s", err, sout.String())
				}
			case <-time.After(15 * time.Second):
				t.Fatal("server did not end after the client was interrupted")
			}
			if n := len(resultLines(cout.String())); n < 2 {
				t.Errorf("client printed %d periods, want 2 before it was interrupted:\n%s", n, cout.String())
			}
		})
	}
	for _, bad := range [][]string{{"write_lat", "--run_infinitely"}, {"write_bw", "--run_infinitely", "-a"}, {"write_bw", "--run_infinitely", "--loopback"}} {
		if _, err := ParseArgs(bad); !errors.Is(err, ErrUsage) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
}
