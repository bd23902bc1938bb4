//go:build linux

package transfer

import (
	"bytes"
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/transport/roce"
	"github.com/rdmakit/rdmakit/verbs"
)

// TestAutoDevicesRoCE: with the roce transport linked (its devices sort
// before tcp0 in verbs.Devices), a node still picks shm0 and tcp0 by
// default, and opens roce devices only when Config.Devices names them.
func TestAutoDevicesRoCE(t *testing.T) {
	t.Setenv(roce.EnvIfaces, "lo")
	infos, err := verbs.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(infos, func(d verbs.DeviceInfo) bool { return d.Transport == "roce" }) {
		t.Fatalf("roce linked but no roce device on lo: %+v", infos)
	}
	got := autoDevices()
	var want []string
	for _, d := range infos {
		if d.Transport == "ibverbs" && d.Caps.Has(verbs.CapNetwork) {
			want = append(want, d.Name)
		}
	}
	want = append(append([]string{"shm0"}, want...), "tcp0")
	if !slices.Equal(got, want) {
		t.Fatalf("autoDevices() = %q, want %q", got, want)
	}
	n, err := New(context.Background(), Config{Name: "auto", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if d := n.Devices(); slices.ContainsFunc(d, func(s string) bool { return strings.HasPrefix(s, "roce") }) {
		t.Fatalf("default devices %q include roce", d)
	}
}

// TestRoCETwoAddresses: a node on 127.0.0.1 and a child process node on
// 127.0.0.2 (each its own roce socket; ports of the system's choosing so
// that other runs on this host holding 4791 do not matter) read and write
// each other's segments over roce0 (the loopback interface's).
func TestRoCETwoAddresses(t *testing.T) {
	t.Setenv(roce.EnvIfaces, "lo")
	t.Setenv(roce.EnvAddr, "127.0.0.1:0")
	ctx := context.Background()
	a, err := New(ctx, Config{Name: "a", Devices: []string{"roce0"}, Secret: secret, ArenaSize: 1 << 30, PeerTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got := roce.LocalAddr(a.devs[0].ctx); got.Addr() != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("node a's roce0 bound %v", got)
	}
	const size = 8 << 20
	startChild(t, a.Addr(), "b", "roce0", size, roce.EnvAddr+"=127.0.0.2:0")
	buf, err := a.AllocMR(2 * size)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	fill(want, 1)
	// Read the child's segment whole, write half of it back elsewhere in
	// it, and read that back.
	b, err := a.Submit(ctx, []Request{{Op: Read, Local: buf, Segment: "seg-b", Length: size}})
	if err == nil {
		err = b.Wait(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes()[:size], want) {
		t.Fatal("read over roce: wrong bytes")
	}
	fill(buf.Bytes()[size:size+size/2], 42)
	b, err = a.Submit(ctx, []Request{{Op: Write, Local: buf, LocalOffset: size, Segment: "seg-b", Offset: size / 2, Length: size / 2}})
	if err == nil {
		err = b.Wait(ctx)
	}
	if err == nil {
		b, err = a.Submit(ctx, []Request{{Op: Read, Local: buf, Segment: "seg-b", Length: size}})
	}
	if err == nil {
		err = b.Wait(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	fill(want[size/2:], 42)
	if !bytes.Equal(buf.Bytes()[:size], want) {
		t.Fatal("write then read over roce: wrong bytes")
	}
	// The bytes came as RoCEv2 packets: two reads of the segment in
	// read responses of at most 4096 bytes (lo's IB MTU).
	st, _ := roce.Stats(a.devs[0].ctx)
	if st.RxPackets < 2*size/4096 || st.RxBadICRC != 0 || st.RxMalformed != 0 {
		t.Fatalf("roce counters %+v", st)
	}
}

// TestClusterRoCE: three nodes of one process over roce0, each context on
// its own port.
func TestClusterRoCE(t *testing.T) {
	t.Setenv(roce.EnvIfaces, "lo")
	t.Setenv(roce.EnvAddr, ":0")
	testCluster(t, "roce0")
}
