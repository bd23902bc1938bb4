//go:build linux

package transfer

// File leases guard mapped file segments against truncation: a file
// mapped and served to peers would raise SIGBUS in the serving goroutine
// (and end the process) if another process shrank it. With a lease, the
// kernel holds back another process's truncating (or writing) open and
// tells the node with SIGIO; the node withdraws the segment (its
// registrations wait for accesses in flight, then the mapping goes) and
// lets the lease go, and only then does the other open proceed. Peers'
// later requests fail with ErrNoSegment or a remote access error.

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const canLease = true

// leaseFile takes a read lease (a read-only segment: breaks when the file
// is opened for writing or truncated) or a write lease (a read-write one:
// breaks when the file is opened at all) on f.
func leaseFile(f *os.File, write bool) error {
	typ := unix.F_RDLCK
	if write {
		typ = unix.F_WRLCK
	}
	_, err := unix.FcntlInt(f.Fd(), unix.F_SETLEASE, typ)
	return err
}

// leaseBroken reports whether f's lease is being broken (or gone).
func leaseBroken(f *os.File) bool {
	t, err := unix.FcntlInt(f.Fd(), unix.F_GETLEASE, 0)
	return err != nil || t == unix.F_UNLCK
}

func unleaseFile(f *os.File) { unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_UNLCK) }

// watchLeases withdraws file segments whose lease is being broken; it
// runs on its own goroutine from the first leased segment until Close.
func (n *Node) watchLeases() {
	n.leaseOnce.Do(func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGIO)
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer signal.Stop(ch)
			for {
				select {
				case <-n.ctx.Done():
					return
				case <-ch:
				}
				n.withdrawBroken()
			}
		}()
	})
}

// withdrawBroken unregisters the file segments whose lease is being
// broken.
func (n *Node) withdrawBroken() {
	var names []string
	n.mu.Lock()
	for name, s := range n.segs {
		if s.file != nil && s.file.leased && leaseBroken(s.file.f) {
			names = append(names, name)
		}
	}
	n.mu.Unlock()
	for _, name := range names {
		ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
		n.UnregisterSegment(ctx, name)
		cancel()
	}
}
