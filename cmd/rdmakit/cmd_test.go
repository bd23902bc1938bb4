package main

import (
	"bytes"
	"github.com/rdmakit/rdmakit/internal/reexec"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The test binary acts as rdmakit in the role "rdmakit" (main.go): the
// tests run it (and its loopback mode re-executes it) as the built command.
func TestMain(m *testing.M) {
	reexec.Init()
	os.Exit(m.Run())
}

// rdmakit runs the command with args and returns stdout, stderr and the
// exit status.
// TestInfoRoCE: the loopback interface's roce device, with its GID
// (127.0.0.1, IPv4-mapped) and MTU.
func TestInfoRoCE(t *testing.T) {
	t.Setenv("RDMAKIT_ROCE_IFACES", "lo")
	out, errOut, code := rdmakit(t, "info", "-v", "-d", "roce0")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{"hca_id:\troce0\n", "\ttransport:\t\t\troce\n", "\t\t\tactive_mtu:\t\t4096 (5)\n",
		"\t\t\tlink_layer:\t\tEthernet\n", "0000:0000:0000:0000:0000:ffff:7f00:0001"} {
		if !strings.Contains(out, want) {
			t.Errorf("info lacks %q:\n%s", want, out)
		}
	}
}

func rdmakit(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := reexec.Command("rdmakit", args)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("rdmakit %q hung", args)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

func TestPerfLoopback(t *testing.T) {
	for _, args := range [][]string{
		{"perf", "write_bw", "--loopback", "-n", "300"},
		{"perf", "ib_read_lat", "--loopback", "-n", "300"},
		{"perf", "send_lat", "--loopback", "-n", "100", "-d", "tcp0"},
		{"perf", "atomic_bw", "--loopback", "-n", "300", "-A", "CMP_AND_SWAP", "--report_gbits"},
		// -e: completions by the driver's blocking wait.
		{"perf", "send_bw", "--loopback", "-n", "300", "-e", "-d", "tcp0"},
		{"perf", "read_lat", "--loopback", "-n", "100", "-e", "-o", "4"},
		// -l: lists of work requests.
		{"perf", "write_bw", "--loopback", "-n", "400", "-l", "8", "-d", "tcp0"},
	} {
		out, errOut, code := rdmakit(t, args...)
		if code != 0 || errOut != "" {
			t.Errorf("%q: exit %d, stderr %q", args, code, errOut)
			continue
		}
		for _, want := range []string{"-----\n", " Dual-port       : OFF\t\tDevice         : ", " #bytes ", " local address: LID 0000 QPN 0x"} {
			if !strings.Contains(out, want) {
				t.Errorf("%q: output lacks %q:\n%s", args, want, out)
			}
		}
	}
}

// TestPerfLoopbackRoCE: `perf --loopback -d roceN` works as it is: the
// server child binds a port of the system's choosing, not the client's
// 4791.
func TestPerfLoopbackRoCE(t *testing.T) {
	t.Setenv("RDMAKIT_ROCE_IFACES", "lo")
	t.Setenv("RDMAKIT_ROCE_ADDR", "")
	os.Unsetenv("RDMAKIT_ROCE_ADDR")
	for _, args := range [][]string{
		{"perf", "write_bw", "--loopback", "-n", "300", "-d", "roce0"},
		{"perf", "read_lat", "--loopback", "-n", "100", "-d", "roce0"},
	} {
		// The client binds 127.0.0.1:4791 (the default): another test run
		// on this host may hold it.
		if c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4791}); err != nil {
			t.Skipf("SKIP (loud): 127.0.0.1:4791 is taken on this host (another RoCE endpoint or test run): %v", err)
		} else {
			c.Close()
		}
		out, errOut, code := rdmakit(t, args...)
		if code != 0 || errOut != "" || !strings.Contains(out, " #bytes ") {
			t.Errorf("%q: exit %d, stderr %q\n%s", args, code, errOut, out)
		}
	}
}

func TestPerfErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"perf", "write_bw", "--bogus"}, 2, "rdmakit perf: unknown flag --bogus"},
		{[]string{"perf", "write_bw", "-Y"}, 2, "rdmakit perf: unknown flag -Y"},
		{[]string{"perf", "write_foo"}, 2, "unknown test \"write_foo\""},
		{[]string{"perf", "write_bw", "-s", "3G", "--loopback"}, 2, "message size 3221225472 is too large"},
		{[]string{"perf", "write_bw", "-c", "UD"}, 2, "connection type UD is not supported"},
		{[]string{"perf", "write_bw", "-d", "shm0", "-p", port, "127.0.0.1"}, 1, "rdmakit perf: cannot reach server 127.0.0.1:" + port + ": connection refused"},
		{[]string{"perf", "write_bw", "-d", "nosuch0", "127.0.0.1"}, 1, "device nosuch0 is not available"},
	}
	for _, c := range cases {
		start := time.Now()
		out, errOut, code := rdmakit(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) || strings.Count(errOut, "\n") != 1 || out != "" {
			t.Errorf("%q: exit %d, stderr %q, stdout %q; want exit %d and one line with %q", c.args, code, errOut, out, c.code, c.want)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%q took %v", c.args, d)
		}
	}
	out, _, code := rdmakit(t, "perf", "-h")
	if code != 0 || !strings.Contains(out, "usage: rdmakit perf TEST") {
		t.Errorf("perf -h: exit %d\n%s", code, out)
	}
}

func TestInfo(t *testing.T) {
	// roce devices follow the host's interfaces: none here, so that the
	// lists below are the same on every host (TestInfoRoCE shows one).
	t.Setenv("RDMAKIT_ROCE_IFACES", "none")
	out, errOut, code := rdmakit(t, "info")
	if ibverbsNote != nil {
		// The ibverbs build on a host where libibverbs finds no device
		// says so (TestInfoNoIBVerbsDevice).
		errOut = strings.TrimPrefix(errOut, ibverbsNote(nil, ""))
	}
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{"hca_id:\tshm0\n", "hca_id:\ttcp0\n", "\ttransport:\t\t\tshm\n", "\t\tport:\t1\n",
		"\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n", "\t\t\tactive_mtu:\t\t4096 (5)\n", "\t\t\tlink_layer:\t\tTCP\n", "\tnode_guid:\t\t\t"} {
		if !strings.Contains(out, want) {
			t.Errorf("info lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "max_qp") {
		t.Error("info without -v shows limits")
	}
	out, _, code = rdmakit(t, "info", "-v", "-d", "tcp0")
	if code != 0 || strings.Contains(out, "shm0") {
		t.Fatalf("info -v -d tcp0: exit %d\n%s", code, out)
	}
	for _, want := range []string{"\tmax_mr_size:\t\t\t0x", "\tmax_qp:\t\t\t\t", "\tmax_qp_wr:\t\t\t", "\tmax_sge:\t\t\t",
		"\tmax_cqe:\t\t\t", "\tatomic_cap:\t\t\tATOMIC_HCA (1)\n", "\tmax_inline_data:\t\t1024\n", "\t\t\tGID[  0]:\t\t"} {
		if !strings.Contains(out, want) {
			t.Errorf("info -v lacks %q:\n%s", want, out)
		}
	}
	out, _, code = rdmakit(t, "info", "-l")
	if code != 0 || !strings.HasPrefix(out, "2 HCAs found:\n\tshm0\n\ttcp0\n") {
		t.Errorf("info -l: exit %d\n%s", code, out)
	}
	_, errOut, code = rdmakit(t, "info", "-d", "nosuch0")
	if code != 1 || errOut != "rdmakit info: device \"nosuch0\" wasn't found (devices: shm0, tcp0)\n" {
		t.Errorf("info -d nosuch0: exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = rdmakit(t, "info", "--bogus")
	if code != 2 || !strings.Contains(errOut, "unknown argument") {
		t.Errorf("info --bogus: exit %d, stderr %q", code, errOut)
	}
}
