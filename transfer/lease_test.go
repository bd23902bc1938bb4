//go:build linux

package transfer

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestFileShrinks: a file served mapped (tcp0) that another open truncates
// is withdrawn before the truncation proceeds: the truncation completes,
// the holder does not crash (no SIGBUS), and reads fail with a clear
// error; the node keeps serving its other segments.
func TestFileShrinks(t *testing.T) {
	for _, readOnly := range []bool{true, false} {
		ctx := context.Background()
		nodes := cluster(t, "tcp0", 2)
		path := filepath.Join(t.TempDir(), "shard")
		data := make([]byte, 8<<20)
		fill(data, 3)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := nodes[0].RegisterFileSegment(ctx, "shard", path, readOnly); err != nil {
			t.Fatal(err)
		}
		if _, err := nodes[0].AllocSegment(ctx, "other", 1<<20); err != nil {
			t.Fatal(err)
		}
		buf, _ := nodes[1].AllocMR(8 << 20)
		read := func(seg string, n int) error {
			b, err := nodes[1].Submit(ctx, []Request{{Local: buf, Segment: seg, Length: n}})
			if err != nil {
				return err
			}
			return b.Wait(ctx)
		}
		if err := read("shard", 8<<20); err != nil {
			t.Fatal(err)
		}
		// Truncate (blocks until the holder lets its lease go) while
		// reads go on.
		stop := make(chan struct{})
		readErr := make(chan error, 1)
		go func() {
			var last error
			for {
				select {
				case <-stop:
					readErr <- last
					return
				default:
				}
				last = read("shard", 8<<20)
			}
		}()
		time.Sleep(20 * time.Millisecond)
		start := time.Now()
		if err := os.Truncate(path, 4096); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("truncate waited %v (the lease was not let go)", took)
		}
		time.Sleep(20 * time.Millisecond)
		close(stop)
		err := <-readErr
		if err == nil {
			t.Fatalf("read-only %v: reads of a truncated file segment still succeed", readOnly)
		}
		if !errors.Is(err, ErrNoSegment) && !errors.Is(err, ErrTransfer) {
			t.Fatalf("cause: %v", err)
		}
		if _, err := nodes[1].OpenSegment(ctx, "shard"); !errors.Is(err, ErrNoSegment) {
			t.Fatalf("segment still listed: %v", err)
		}
		if err := read("other", 1<<20); err != nil {
			t.Fatalf("other segment: %v", err)
		}
	}
}
