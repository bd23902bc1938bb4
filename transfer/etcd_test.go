//go:build linux

package transfer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/transfer/internal/etcdtest"
)

// TestEtcd: three nodes (two in this process, one a child process) over
// shm0 and tcp0 with the metadata in a real etcd: segments found and read
// across nodes; duplicate names refused; the killed child's node and
// segment leave etcd within its lease; etcd stopped: clear errors within a
// bound; etcd restarted on its data: nodes renew and serve again.
func TestEtcd(t *testing.T) {
	dir := t.TempDir()
	e, url, port := etcdtest.Start(t, dir, 0)
	defer func() { e.Close() }()
	ctx := context.Background()
	for _, dev := range []string{"shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) {
			cfg := Config{MetadataAddr: url, Devices: []string{dev}, Secret: secret, ArenaSize: 1 << 30, LeaseTTL: 2 * time.Second, PeerTimeout: time.Second}
			var nodes []*Node
			for i := 0; i < 2; i++ {
				c := cfg
				c.Name = fmt.Sprintf("%s-n%d", dev, i)
				n, err := New(ctx, c)
				if err != nil {
					t.Fatal(err)
				}
				defer n.Close()
				nodes = append(nodes, n)
			}
			mr, err := nodes[0].AllocSegment(ctx, dev+"-seg", 4<<20)
			if err != nil {
				t.Fatal(err)
			}
			fill(mr.Bytes(), 9)
			if _, err := nodes[1].AllocSegment(ctx, dev+"-seg", 4096); !errors.Is(err, ErrExists) {
				t.Fatalf("duplicate: %v", err)
			}
			pc := startChild(t, url, dev+"-child", dev, 4<<20)
			defer pc.Kill()
			buf, _ := nodes[1].AllocMR(8 << 20)
			b, err := nodes[1].Submit(ctx, []Request{{Local: buf, Segment: dev + "-seg", Length: 4 << 20},
				{Local: buf, LocalOffset: 4 << 20, Segment: "seg-" + dev + "-child", Length: 4 << 20}})
			if err == nil {
				err = b.Wait(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !equalBytes(buf.Bytes()[:4<<20], mr.Bytes()) {
				t.Fatal("data differs")
			}
			pc.Kill()
			killed := time.Now()
			for {
				_, err := nodes[1].OpenSegment(ctx, "seg-"+dev+"-child")
				if errors.Is(err, ErrNoSegment) {
					break
				}
				if time.Since(killed) > 10*time.Second {
					t.Fatalf("killed node's segment still in etcd: %v", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if _, err := nodes[1].meta.GetNode(ctx, dev+"-child"); !errors.Is(err, ErrNoNode) {
				t.Fatalf("killed node still in etcd: %v", err)
			}
		})
	}

	// etcd down: a clear error within a bound; back on the same data:
	// the nodes renew and their segments are found again.
	n, err := New(ctx, Config{Name: "survivor", MetadataAddr: url, Devices: []string{"tcp0"}, Secret: secret, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := n.AllocSegment(ctx, "survivor-seg", 4096); err != nil {
		t.Fatal(err)
	}
	e.Close()
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = n.OpenSegment(dctx, "survivor-seg")
	if err == nil || time.Since(start) > 3*time.Second || !strings.Contains(err.Error(), "etcd") {
		t.Fatalf("etcd down: %v after %v", err, time.Since(start))
	}
	if _, err := New(dctx, Config{Name: "late", MetadataAddr: url, Devices: []string{"tcp0"}, Secret: secret}); err == nil {
		t.Fatal("a node joined with etcd down")
	}
	e, _, _ = etcdtest.Start(t, dir, port)
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := n.OpenSegment(ctx, "survivor-seg")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestEtcdUnreachable(t *testing.T) {
	start := time.Now()
	_, err := New(context.Background(), Config{MetadataAddr: "etcd://127.0.0.1:1", Devices: []string{"tcp0"}, Secret: secret})
	if err == nil || time.Since(start) > 3*etcdTimeout {
		t.Fatalf("%v after %v", err, time.Since(start))
	}
	t.Log(err)
	if _, err := OpenEtcd("etcd://"); err == nil {
		t.Fatal("empty URL accepted")
	}
}

func equalBytes(a, b []byte) bool { return string(a) == string(b) }
