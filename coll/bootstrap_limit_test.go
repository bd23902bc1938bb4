package coll

// Tests run on the test goroutine; the root's goroutines and a fake root's
// goroutine run beside it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// hugeClaim is a frame header claiming a 256 MiB payload of type typ,
// followed by nothing.
func hugeClaim(typ byte) []byte { return []byte{0x10, 0, 0, 0, typ} }

const hugeClaimText = "268435456-byte frame exceeds the"

func totalAlloc() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// A stranger that connects to the root and claims a 256 MiB hello is
// refused at once, with a reason, and the root allocates nothing for it.
func TestBootstrapRootRefusesHugeFrame(t *testing.T) {
	r, err := startRoot("127.0.0.1:0", 42, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	c, err := net.Dial("tcp", r.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := totalAlloc()
	if _, err := c.Write(hugeClaim(msgHello)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second)) // before the root's hello timeout
	reply, err := io.ReadAll(c)
	grew := totalAlloc() - before
	if err != nil {
		t.Errorf("the root kept the connection open: %v", err)
	}
	t.Logf("root's reply: %q", reply)
	if !bytes.Contains(reply, []byte(hugeClaimText)) {
		t.Errorf("the root's reply %q does not say why", reply)
	}
	if grew > 16<<20 {
		t.Errorf("the root allocated %d bytes because a stranger claimed a 256 MiB frame", grew)
	}
}

// A rank whose "root" answers its hello with a 256 MiB frame fails at once
// with a clear error and allocates nothing for it.
func TestBootstrapRankRefusesHugeFrame(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		var buf [4096]byte
		c.Read(buf[:]) // the hello
		c.Write(hugeClaim(msgInfo))
		io.Copy(io.Discard, c) // until the rank hangs up
	}()
	before := totalAlloc()
	start := time.Now()
	_, _, err = joinRoot(context.Background(), ln.Addr().String(), 1, 0, 2, 3*time.Second)
	grew := totalAlloc() - before
	<-done
	t.Logf("joinRoot: %v", err)
	if !errors.Is(err, ErrBootstrap) || !strings.Contains(err.Error(), hugeClaimText) {
		t.Errorf("joinRoot: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("joinRoot took %v to give up", d)
	}
	if grew > 16<<20 {
		t.Errorf("the rank allocated %d bytes because its root claimed a 256 MiB frame", grew)
	}
}

// A member that knows the nonce but announces an absurd rank count is
// refused before the root sizes its tables by it.
func TestBootstrapRootBoundsRankCount(t *testing.T) {
	r, err := startRoot("127.0.0.1:0", 42, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	before := totalAlloc()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, err = joinRoot(ctx, r.ln.Addr().String(), 42, 0, 1<<28, 3*time.Second)
	grew := totalAlloc() - before
	if err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("a 2^28-rank hello: %v", err)
	}
	if grew > 16<<20 {
		t.Errorf("the root allocated %d bytes for a 2^28-rank claim", grew)
	}
	// With a well-formed id (naming this root), so that only the rank
	// count can be refused.
	id, err := ParseUniqueID(fmt.Sprintf("rkc1:%016x@%s", 42, r.ln.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewComm(ctx, id, MaxRanks+1, 0, nil); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "rank 0 of") {
		t.Errorf("NewComm with %d ranks: %v", MaxRanks+1, err)
	}
}
