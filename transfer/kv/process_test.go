//go:build linux

package kv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/reexec"
	"github.com/rdmakit/rdmakit/transfer"
	"github.com/rdmakit/rdmakit/transfer/internal/etcdtest"
)

// A child store node: reexec role "kv-node" with the master's address,
// its name, its device, its capacity and "dying" (its transfer lease
// measured: dying's 1 s) or "steady" (tcfg's). It prints "ready" and
// serves until its standard input ends.
func init() {
	reexec.Register("kv-node", func(args []string) int {
		capacity, _ := strconv.ParseInt(args[3], 10, 64)
		tc := tcfg(args[2])
		if args[4] == "dying" {
			tc = dying(args[2])
		}
		c := Config{Addr: args[0], Capacity: capacity, Transfer: tc}
		c.Transfer.Name = args[1]
		s, err := Open(context.Background(), c)
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		defer s.Close()
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin)
		return 0
	})
}

func startNode(t *testing.T, master, name, dev string, capacity int64, mode string) *os.Process {
	cmd := reexec.Command("kv-node", []string{master, name, dev, strconv.FormatInt(capacity, 10), mode})
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child %s: %q", name, line)
	}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	return cmd.Process
}

// TestProcesses: a store of three processes (the master, holding nothing,
// in the test; two store nodes as children) over shm0 and tcp0: values
// spread over both children read back whole from the master's process; a
// child killed while a batch reads: its keys fail (not hang), the other
// child's are read; after the holder TTL its keys are gone and the store
// keeps serving the rest and takes new values.
//
// What it times is the holder TTL; the transfer leases and peer timeouts
// are tcfg's (a killed process's connections end at once, and its keys go
// with its holder session), and the holder TTL is 5 s, not 2 s: with 2 s
// (heartbeats every 667 ms) a loaded host stalled a live child past it
// and the master dropped it and its puts during PutBatch ("put expired,
// ended, or its store node left").
func TestProcesses(t *testing.T) {
	const holderTTL = 5 * time.Second
	for _, dev := range []string{"shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) {
			ctx := context.Background()
			c := Config{Transfer: tcfg(dev), HolderTTL: holderTTL}
			c.Transfer.Name = "master"
			m, err := Open(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			startNode(t, m.Addr(), "b", dev, 32<<20, "steady")
			pc := startNode(t, m.Addr(), "c", dev, 32<<20, "steady")
			defer pc.Kill()
			var keys, vals [][]byte
			for i := 0; i < 40; i++ {
				keys = append(keys, []byte(fmt.Sprintf("req7/layer%d", i)))
				vals = append(vals, value(uint64(i), 256<<10+i))
			}
			if err := m.PutBatch(ctx, keys, vals); err != nil {
				t.Fatal(err)
			}
			st, _ := m.Stats(ctx)
			if len(st.Nodes) != 2 || st.Nodes[0].Values == 0 || st.Nodes[1].Values == 0 {
				t.Fatalf("not spread: %+v", st)
			}
			got, err := m.GetBatch(ctx, keys)
			if err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if string(got[i]) != string(vals[i]) {
					t.Fatalf("value %d differs", i)
				}
			}
			// Kill c while a batch reads everything.
			done := make(chan struct{})
			var res [][]byte
			var gerr error
			go func() {
				defer close(done)
				for k := 0; k < 20; k++ {
					if res, gerr = m.GetBatch(ctx, keys); gerr != nil {
						return
					}
				}
			}()
			time.Sleep(20 * time.Millisecond)
			pc.Kill()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				t.Fatal("batch hangs after a store node was killed")
			}
			// Some batch may have finished before the kill; one more.
			if gerr == nil {
				res, gerr = m.GetBatch(ctx, keys)
			}
			var lost, kept int
			for i := range keys {
				if res[i] == nil {
					lost++
				} else if string(res[i]) != string(vals[i]) {
					t.Fatalf("value %d differs after the kill", i)
				} else {
					kept++
				}
			}
			if lost == 0 || kept == 0 || gerr == nil {
				t.Fatalf("lost %d kept %d: %v", lost, kept, gerr)
			}
			if !errors.Is(gerr, transfer.ErrPeerLost) && !errors.Is(gerr, transfer.ErrNoSegment) && !errors.Is(gerr, transfer.ErrNoNode) {
				t.Fatalf("cause: %v", gerr)
			}
			// Within the holder TTL (plus a sweep, and a margin for a
			// loaded host), the lost keys are gone and the others served.
			deadline := time.Now().Add(holderTTL + 4*time.Second)
			nf := 0
			for {
				res, gerr = m.GetBatch(ctx, keys)
				nf = 0
				for i := range keys {
					if res[i] == nil {
						nf++
					} else if string(res[i]) != string(vals[i]) {
						t.Fatalf("value %d differs", i)
					}
				}
				// The killed node's keys: those lost in the batch, and
				// those it served before it died.
				if nf >= lost && nf < len(keys) && errors.Is(gerr, ErrNotFound) && !errors.Is(gerr, transfer.ErrPeerLost) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("lost keys still listed (%d of %d lost): %v", nf, lost, gerr)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err := m.Put(ctx, []byte("after"), vals[0]); err != nil {
				t.Fatal(err)
			}
			if v, err := m.Get(ctx, []byte("after")); err != nil || string(v) != string(vals[0]) {
				t.Fatal(err)
			}
		})
	}
}

// TestEtcdStore: the store with its transfer metadata in a real etcd: a
// master, a store node as a child process, a client; values read back;
// the child killed: its node leaves etcd within its lease.
func TestEtcdStore(t *testing.T) {
	e, url, _ := etcdtest.Start(t, t.TempDir(), 0)
	defer e.Close()
	ctx := context.Background()
	c := Config{Transfer: tcfg("tcp0")} // (the child's lease is what is timed)
	c.Transfer.MetadataAddr = url
	c.Transfer.Name = "etcd-master"
	m, err := Open(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	pc := startNode(t, m.Addr(), "etcd-holder", "tcp0", 8<<20, "dying")
	defer pc.Kill()
	cl := client(t, "tcp0", m.Addr())
	v := value(5, 1<<20)
	if err := cl.Put(ctx, []byte("k"), v); err != nil {
		t.Fatal(err)
	}
	got, err := m.Get(ctx, []byte("k"))
	if err != nil || string(got) != string(v) {
		t.Fatal(err)
	}
	meta, err := transfer.OpenEtcd(url)
	if err != nil {
		t.Fatal(err)
	}
	defer meta.Close()
	if _, err := meta.GetNode(ctx, "etcd-holder"); err != nil {
		t.Fatalf("holder not in etcd: %v", err)
	}
	pc.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := meta.GetNode(ctx, "etcd-holder"); errors.Is(err, transfer.ErrNoNode) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("killed holder still in etcd")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
