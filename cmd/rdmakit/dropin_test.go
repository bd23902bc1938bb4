package main

import (
	"bufio"
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/reexec"
)

// The role "rdmakit-argv0" runs main's dispatch on this process's
// argv[0], which the tests set to the name of a perftest or nccl-tests
// binary, as a symlink would.
func init() {
	reexec.Register("rdmakit-argv0", func(args []string) int { return runAs(os.Args[0], args) })
}

// runArgv0 runs rdmakit invoked as argv0 with args.
func runArgv0(t *testing.T, argv0 string, args ...string) (string, string, int) {
	t.Helper()
	cmd := reexec.Command("rdmakit-argv0", args)
	cmd.Args[0] = argv0
	return wait(t, cmd, args)
}

func wait(t *testing.T, cmd *exec.Cmd, args []string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%q hung", args)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}, {"perf", "--version"}, {"perf", "-V"}, {"coll-perf", "--version"},
		{"info", "--version"}, {"ping", "--version"}, {"ib_write_bw", "--version"}, {"all_reduce_perf", "--version"}} {
		out, errOut, code := rdmakit(t, args...)
		if code != 0 || errOut != "" || !regexp.MustCompile(`^rdmakit \S+ go\S+ \w+/\w+\n$`).MatchString(out) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}

// Help goes to stdout with status 0, in every command; usage errors are
// status 2 with the reason on stderr.
func TestHelpAndUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-h"}, "usage: rdmakit COMMAND"},
		{[]string{"--help"}, "usage: rdmakit COMMAND"},
		{[]string{"help"}, "usage: rdmakit COMMAND"},
		{[]string{"help", "perf"}, "usage: rdmakit perf TEST"},
		{[]string{"help", "coll-perf"}, "usage: rdmakit coll-perf COLLECTIVE"},
		{[]string{"help", "info"}, "usage: rdmakit info"},
		{[]string{"help", "ping"}, "usage: rdmakit ping"},
		{[]string{"help", "ib_send_lat"}, "usage: rdmakit perf TEST"},
		{[]string{"help", "alltoall_perf"}, "usage: rdmakit coll-perf COLLECTIVE"},
		{[]string{"perf", "-h"}, "usage: rdmakit perf TEST"},
		{[]string{"coll-perf", "-h"}, "-T, --timeout V"},
		{[]string{"coll-perf", "all_reduce", "--help"}, "GPUs here are ranks"},
		{[]string{"all_reduce_perf", "-h"}, "-g, --ngpus V"},
		{[]string{"info", "-h"}, "usage: rdmakit info"},
		{[]string{"ping", "-h"}, "usage: rdmakit ping"},
	} {
		out, errOut, code := rdmakit(t, c.args...)
		if code != 0 || errOut != "" || !strings.Contains(out, c.want) {
			t.Errorf("%q: exit %d, stderr %q, stdout lacks %q:\n%s", c.args, code, errOut, c.want, out)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "usage: rdmakit COMMAND"},
		{[]string{"nosuch"}, `unknown command "nosuch"`},
		{[]string{"help", "nosuch"}, `unknown command "nosuch"`},
		{[]string{"perf", "write_bw", "--bogus"}, "unknown flag --bogus"},
		{[]string{"perf", "write_bw", "--use_cuda=0"}, "no GPU support in this build"},
		{[]string{"coll-perf", "all_reduce", "--bogus"}, "unknown flag --bogus"},
		{[]string{"coll-perf", "all_reduce", "-b", "8", "extra"}, `unexpected argument "extra"`},
		{[]string{"coll-perf", "all_reduc"}, `unknown collective "all_reduc"`},
		{[]string{"all_reduce_perf", "-b", "1K", "1M"}, `unexpected argument "1M"`},
		{[]string{"coll-perf", "all_reduce", "--ranks", "100000"}, "100000 local ranks on"},
		{[]string{"coll-perf", "all_reduce", "-g", "1000"}, "1000 local ranks on"},
		{[]string{"info", "--bogus"}, "unknown argument"},
		{[]string{"ping", "--bogus"}, "flag provided but not defined"},
	} {
		out, errOut, code := rdmakit(t, c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr lacks %q: %q", c.args, code, out, c.want, errOut)
		}
	}
}

// The names of perftest's and nccl-tests' binaries, as arguments and as
// argv[0].
func TestAliases(t *testing.T) {
	out, errOut, code := rdmakit(t, "ib_write_bw", "--loopback", "-n", "100")
	if code != 0 || !strings.Contains(out, "RDMA_Write BW Test") {
		t.Errorf("rdmakit ib_write_bw: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = runArgv0(t, "/usr/local/bin/ib_read_lat", "--loopback", "-n", "50")
	if code != 0 || !strings.Contains(out, "RDMA_Read Latency Test") {
		t.Errorf("argv[0] ib_read_lat: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = rdmakit(t, "all_reduce_perf", "-b", "8", "-e", "8", "-n", "1", "-w", "0")
	if code != 0 || !strings.Contains(out, "# Collective test starting: all_reduce_perf\n") {
		t.Errorf("rdmakit all_reduce_perf: exit %d\n%s%s", code, out, errOut)
	}
	// -g: GPUs are ranks here; two rank processes.
	out, errOut, code = runArgv0(t, "all_gather_perf", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "-g", "2")
	if code != 0 || !strings.Contains(out, "# Collective test starting: all_gather_perf\n") || !strings.Contains(out, "#  Rank  1 Group  0") {
		t.Errorf("argv[0] all_gather_perf -g 2: exit %d\n%s%s", code, out, errOut)
	}
	// Any other name is rdmakit.
	if out, _, code := runArgv0(t, "/opt/rdmakit-1.0", "--help"); code != 0 || !strings.HasPrefix(out, "usage: rdmakit COMMAND") {
		t.Errorf("argv[0] rdmakit-1.0: exit %d\n%s", code, out)
	}
}

// nccl-tests' header and trailer lines, with its defaults.
func TestCollPerfFormat(t *testing.T) {
	out, errOut, code := rdmakit(t, "coll-perf", "reduce_scatter", "-b", "64", "-e", "64", "-G", "1")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if errOut != "coll-perf: note: -G (CUDA graphs): no GPUs, so no graphs; collectives are called directly\n" {
		t.Errorf("stderr %q: want the one-line note on -G", errOut)
	}
	for _, re := range []string{
		`(?m)^# nccl-tests version rdmakit-\S+ nccl-headers=0 nccl-library=0$`,
		`(?m)^# Collective test starting: reduce_scatter_perf$`,
		`(?m)^# nThread 1 nGpus 1 minBytes 64 maxBytes 64 step: 1048576\(bytes\) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0$`,
		`(?m)^#\n# Using devices\n#  Rank  0 Group  0 Pid +\d+ on +\S+ device `,
		`(?m)^#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong $`,
		`(?m)^# Out of bounds values : 0 OK$`,
		`(?m)^# Avg bus bandwidth    : (0|\d+(\.\d+)?|\d(\.\d+)?e[-+]\d\d) $`,
		`(?m)^# Collective test concluded: reduce_scatter_perf$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output lacks %s:\n%s", re, out)
		}
	}
	out, _, code = rdmakit(t, "coll-perf", "all_reduce", "-b", "8", "-e", "8", "-n", "2", "-w", "1", "-m", "2", "-z", "1", "-p", "1", "-C", "1", "-N", "2", "-c", "0")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	for _, want := range []string{"agg iters: 2 validation: 0", "# Blocking Enabled: wait for completion and barrier after each collective \n",
		"# Parallel Init Enabled: threads call into NcclInitRank concurrently \n", "  cputime   algbw"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if rows := strings.Count(out, "\n           8 "); rows != 2 {
		t.Errorf("-N 2: %d rows, want 2:\n%s", rows, out)
	}

	// --csv (nccl-tests' -F/--output_file): one line per row; and
	// NCCL_TESTS_MIN_BW judges the average bus bandwidth.
	csv := filepath.Join(t.TempDir(), "r.csv")
	cmd := reexec.Command("rdmakit", []string{"coll-perf", "all_gather", "-b", "1K", "-e", "4K", "-f", "2", "-n", "1", "-w", "0", "--csv", csv, "--ranks", "2"}, "NCCL_TESTS_MIN_BW=1e9")
	out, errOut, code = wait(t, cmd, nil)
	if code != 1 || !regexp.MustCompile(`(?m)^# Avg bus bandwidth    : \S+ FAILED$`).MatchString(out) {
		t.Errorf("NCCL_TESTS_MIN_BW=1e9: exit %d, want 1 and FAILED:\n%s%s", code, out, errOut)
	}
	b, err := os.ReadFile(csv)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if err != nil || len(lines) != 4 || !strings.HasPrefix(lines[0], "collective,size,count,type,redop,root,oop_time_us,") || !strings.HasPrefix(lines[1], "all_gather,1024,128,float,none,-1,") {
		t.Errorf("csv %v:\n%s", err, b)
	}
}

// A run ended by a signal exits with 128 + the signal, as a shell reports.
func TestSignalExit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	// Each is signaled once it shows it runs (ready, a line of its
	// output): a fixed sleep was too short on a loaded host, where the
	// signal then came before the program's handler and killed it.
	for _, c := range []struct {
		args  []string
		sig   syscall.Signal
		ready string
	}{
		{[]string{"perf", "write_bw", "-d", "tcp0", "-p", port}, syscall.SIGTERM, "Waiting for client"},
		{[]string{"perf", "write_lat", "-d", "tcp0", "-p", port}, syscall.SIGINT, "Waiting for client"},
		{[]string{"coll-perf", "all_reduce", "-b", "8", "-e", "8", "-n", "100000000", "--ranks", "2"}, syscall.SIGTERM, "# Using devices"},
	} {
		cmd := reexec.Command("rdmakit", c.args)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ready := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(stdout)
			seen := false
			for sc.Scan() {
				if !seen && strings.Contains(sc.Text(), c.ready) {
					seen = true
					close(ready)
				}
			}
		}()
		select {
		case <-ready:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("%q: no %q on stdout in 60 s; stderr %q", c.args, c.ready, errb.String())
		}
		time.Sleep(100 * time.Millisecond)
		cmd.Process.Signal(c.sig)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Fatalf("%q ignored %v", c.args, c.sig)
		}
		if code := cmd.ProcessState.ExitCode(); code != 128+int(c.sig) {
			t.Errorf("%q after %v: exit %d, want %d; stderr %q", c.args, c.sig, code, 128+int(c.sig), errb.String())
		}
	}
}

// rping's command lines: -d is debug (a boolean, never a device), -P, -q
// and -l are accepted, and a stray argument is an error naming it.
func TestPingRpingFlags(t *testing.T) {
	// 192.0.2.1 (TEST-NET-1) is no device's: the server stops at once
	// (127.0.0.1 would be lo's roce device's, and the server would wait
	// for a client).
	_, errOut, code := rdmakit(t, "ping", "-s", "-a", "192.0.2.1", "-v", "-d", "-C", "1", "-P", "-q")
	if code == 2 || strings.Contains(errOut, "unexpected argument") {
		t.Fatalf("rping's -d -C 1 -P -q refused (exit %d): %s", code, errOut)
	}
	if !strings.Contains(errOut, "-P is accepted") || !strings.Contains(errOut, "-q is accepted") {
		t.Errorf("no note for -P/-q: %s", errOut)
	}
	_, errOut, code = rdmakit(t, "ping", "-s", "-a", "127.0.0.1", "extra")
	if code != 2 || !strings.Contains(errOut, `unexpected argument "extra"`) {
		t.Errorf("stray argument: exit %d: %s", code, errOut)
	}
}
