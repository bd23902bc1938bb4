package tcp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// TestNetns connects QPs of two processes in two network namespaces joined
// by a veth pair (192.0.2.1 and 192.0.2.2, a documentation range, reachable
// only inside the namespaces). Side a listens on its IP, so its address
// carries it; side b listens on every interface, so a finds it through the
// GID of the address handle, as package cm fills it. It needs root and
// iproute2, and runs only with RDMAKIT_TCP_NETNS=1.
func TestNetns(t *testing.T) {
	if os.Getenv("RDMAKIT_TCP_NETNS") != "1" {
		t.Skip("set RDMAKIT_TCP_NETNS=1 (needs root and iproute2)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	id := strconv.Itoa(os.Getpid() % 100000)
	nsA, nsB := "rdmakit-a"+id, "rdmakit-b"+id
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	ip("netns", "add", nsA)
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", nsA).Run() })
	ip("netns", "add", nsB)
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", nsB).Run() })
	ip("link", "add", "rka"+id, "type", "veth", "peer", "name", "rkb"+id)
	ip("link", "set", "rka"+id, "netns", nsA)
	ip("link", "set", "rkb"+id, "netns", nsB)
	ip("-n", nsA, "addr", "add", "192.0.2.1/24", "dev", "rka"+id)
	ip("-n", nsB, "addr", "add", "192.0.2.2/24", "dev", "rkb"+id)
	for _, ns := range []string{nsA, nsB} {
		ip("-n", ns, "link", "set", "lo", "up")
	}
	ip("-n", nsA, "link", "set", "rka"+id, "up")
	ip("-n", nsB, "link", "set", "rkb"+id, "up")

	dir := t.TempDir()
	start := func(ns, role, listen string) (*exec.Cmd, *bytes.Buffer) {
		cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run", "^TestNetnsPeer$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "RDMAKIT_TCP_NETNS_ROLE="+role, "RDMAKIT_TCP_NETNS_DIR="+dir, EnvAddr+"="+listen)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, &out
	}
	ca, outA := start(nsA, "a", "192.0.2.1:0")
	cb, outB := start(nsB, "b", ":0")
	errA, errB := ca.Wait(), cb.Wait()
	t.Logf("side a:\n%s\nside b:\n%s", outA, outB)
	if errA != nil || errB != nil {
		t.Fatalf("peers failed: a %v, b %v", errA, errB)
	}
}

type netnsInfo struct {
	Addr []byte
	QPN  uint32
	PSN  uint32
	VA   uint64
	RKey uint32
}

// TestNetnsPeer is one side of TestNetns (in its child processes).
func TestNetnsPeer(t *testing.T) {
	role, dir := os.Getenv("RDMAKIT_TCP_NETNS_ROLE"), os.Getenv("RDMAKIT_TCP_NETNS_DIR")
	if role == "" {
		t.Skip("run by TestNetns")
	}
	other := map[string]string{"a": "b", "b": "a"}[role]
	o := opts{mrSize: 2 << 20}.withDefaults()
	e := newEnd(t, openCtx(t), o, 0)
	t.Logf("%s listens on %v, devices GIDs %v", role, ListenAddr(e.ctx), e.ctx.Info().Ports[0].GIDs)
	me := netnsInfo{Addr: e.qp.Address(), QPN: e.qp.Num(), PSN: e.psn, VA: e.mr.Addr(), RKey: e.mr.RKey()}
	publish := func(name string, v any) {
		b, _ := json.Marshal(v)
		os.WriteFile(filepath.Join(dir, name+".tmp"), b, 0o600)
		if err := os.Rename(filepath.Join(dir, name+".tmp"), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	await := func(name string, v any) {
		deadline := time.Now().Add(20 * time.Second)
		for {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err == nil {
				if v != nil {
					if err := json.Unmarshal(b, v); err != nil {
						t.Fatal(err)
					}
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s from the other side", name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	publish(role+".json", me)
	var peer netnsInfo
	await(other+".json", &peer)
	var gid net.IP
	if role == "a" {
		gid = net.IPv4(192, 0, 2, 2) // b listens everywhere: its address has no IP
	}
	if err := e.qp.Modify(verbs.QPAttr{State: verbs.QPRTR, DestQPN: peer.QPN, RQPSN: peer.PSN,
		AH: verbs.AddressHandle{Dest: peer.Addr, GID: gid}, MinRNRTimer: 1}); err != nil {
		t.Fatal(err)
	}
	e.toRTS(o)

	const n = 1 << 20
	e.postRecv(1, e.mr.SGE(n, 4096))
	pattern(e.mr.Bytes()[:n], map[string]uint64{"a": 1, "b": 2}[role])
	// Write our pattern into the peer's second half, then read it back.
	e.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(e.mr, 0, n/2), RemoteAddr: peer.VA + n + 8192, RKey: peer.RKey},
		verbs.SendWR{ID: 2, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: sgl(e.mr, n/2, n/2), RemoteAddr: peer.VA + n + 8192, RKey: peer.RKey},
		verbs.SendWR{ID: 3, Opcode: verbs.OpSendWithImm, Imm: 42, Flags: verbs.SendSignaled, SGL: sgl(e.mr, 0, 100)})
	for _, wc := range e.sends(3) {
		expect(t, wc, verbs.StatusSuccess)
	}
	if !bytes.Equal(e.mr.Bytes()[:n/2], e.mr.Bytes()[n/2:n]) {
		t.Fatal("read back differs from what was written")
	}
	if r := e.recvs(1)[0]; r.Status != 0 || r.Imm != 42 || r.ByteLen != 100 {
		t.Fatalf("receive %+v", r)
	}
	publish(role+".done", struct{}{})
	await(other+".done", nil)
	fmt.Println(role, "ok")
}
