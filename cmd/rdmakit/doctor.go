package main

// rdmakit doctor: the command line of internal/doctor. What the files
// under /sys cannot tell, the port's active MTU, comes from the linked
// transports (verbs.Devices; built with -tags ibverbs, the RNICs'). The
// peer check (--peer, --serve-peer) runs rdmakit perf as child processes:
// send_lat on PORT and write_bw on PORT+1.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/internal/cli"
	"github.com/rdmakit/rdmakit/internal/doctor"
	"github.com/rdmakit/rdmakit/internal/rdmafs"
	"github.com/rdmakit/rdmakit/internal/reexec"
	"github.com/rdmakit/rdmakit/verbs"
)

func init() {
	register("doctor", doctor.Summary, func(args []string) int {
		return doctor.Main(args, doctor.Options{PortMTU: verbsPortMTU, Peer: peerMeasure, ServePeer: servePeer})
	})
}

// verbsDevices lists the linked transports' devices once (opening an
// ibverbs device to query it is not free).
var verbsDevices = sync.OnceValue(func() []verbs.DeviceInfo {
	devs, _ := verbs.Devices()
	return devs
})

// verbsPortMTU returns the active MTU of an RDMA device's port as the
// linked ibverbs transport reports it.
func verbsPortMTU(dev string, port int) (int, error) {
	for _, d := range verbsDevices() {
		if d.Name != dev || d.Transport != "ibverbs" {
			continue
		}
		for _, p := range d.Ports {
			if p.Num == port && p.ActiveMTU.Bytes() > 0 {
				return p.ActiveMTU.Bytes(), nil
			}
		}
	}
	return 0, errors.New("no ibverbs port " + dev)
}

// peerTests are the two perf runs of a peer check, in order.
var peerTests = []struct {
	test string
	args []string
}{
	{"send_lat", []string{"-s", "64", "-n", "1000"}},
	{"write_bw", []string{"-s", "1048576", "-D", "2"}},
}

func perfArgs(i int, dev string, port int) []string {
	a := append([]string{"perf", peerTests[i].test}, peerTests[i].args...)
	a = append(a, "-p", strconv.Itoa(port+i))
	if dev != "" {
		a = append(a, "-d", dev)
	}
	return a
}

// peerMeasure runs the two tests against addr and reads their results.
func peerMeasure(addr, dev string) (doctor.PeerResult, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return doctor.PeerResult{}, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return doctor.PeerResult{}, fmt.Errorf("port %q: %w", ps, err)
	}
	var r doctor.PeerResult
	for i := range peerTests {
		var out []byte
		// The peer restarts its server after each run: retry a refused
		// connection for a few seconds.
		for try := 0; ; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			cmd := reexec.Command("rdmakit", append(perfArgs(i, dev, port), host))
			out, err = commandOutput(ctx, cmd)
			cancel()
			if err == nil || try >= 6 || !strings.Contains(string(out), "refused") {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if err != nil {
			return r, fmt.Errorf("rdmakit %s %s: %v: %s", strings.Join(perfArgs(i, dev, port), " "), host, err, lastLines(out, 2))
		}
		row, dv := perfRow(string(out))
		if r.Device == "" {
			r.Device = dv
		}
		switch {
		case i == 0 && len(row) > 4:
			r.LatencyUs, _ = strconv.ParseFloat(row[4], 64)
		case i == 1 && len(row) > 3:
			mib, _ := strconv.ParseFloat(row[3], 64)
			r.BitsPerS = mib * 1048576 * 8
		default:
			return r, fmt.Errorf("rdmakit perf %s: no result line in: %s", peerTests[i].test, lastLines(out, 3))
		}
	}
	if f, ok := devRate(r.Device); ok {
		r.LinkBits = f
	}
	return r, nil
}

// commandOutput runs cmd under ctx and returns stdout and stderr together.
func commandOutput(ctx context.Context, cmd *exec.Cmd) ([]byte, error) {
	var b strings.Builder
	cmd.Stdout, cmd.Stderr = &b, &b
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return []byte(b.String()), err
	case <-ctx.Done():
		cmd.Process.Kill()
		<-done
		return []byte(b.String()), ctx.Err()
	}
}

// perfRow returns the fields of the result line (the one after the
// "#bytes" header) and the device perf names.
func perfRow(out string) (row []string, dev string) {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if _, after, ok := strings.Cut(l, "Device         : "); ok && dev == "" {
			dev = strings.TrimSpace(after)
		}
		if strings.HasPrefix(strings.TrimSpace(l), "#bytes") && i+1 < len(lines) {
			row = strings.Fields(lines[i+1])
		}
	}
	return row, dev
}

func lastLines(b []byte, n int) string {
	l := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}

// devRate is the rate of the RDMA device's first active port, from sysfs.
func devRate(dev string) (float64, bool) {
	d, err := rdmafs.FS{}.Device(dev)
	if err != nil {
		return 0, false
	}
	for _, p := range d.Ports {
		if p.State == "ACTIVE" && p.RateBits > 0 {
			return p.RateBits, true
		}
	}
	return 0, false
}

// servePeer runs the two perf servers again and again until a signal.
func servePeer(dev string, port int) int {
	sig := cli.NotifySignals(context.Background())
	defer sig.Stop()
	fmt.Fprintf(os.Stderr, "rdmakit doctor: serving peer checks on TCP ports %d (send_lat) and %d (write_bw)%s\n", port, port+1, map[bool]string{true: " on " + dev, false: ""}[dev != ""])
	var wg sync.WaitGroup
	for i := range peerTests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sig.Err() == nil {
				cmd := reexec.Command("rdmakit", perfArgs(i, dev, port))
				out, err := commandOutput(sig, cmd)
				if sig.Err() != nil {
					return
				}
				if err != nil {
					fmt.Fprintf(os.Stderr, "rdmakit doctor: %s server: %v: %s\n", peerTests[i].test, err, lastLines(out, 2))
					time.Sleep(time.Second)
				}
			}
		}()
	}
	wg.Wait()
	return sig.Status()
}
