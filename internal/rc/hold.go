package rc

// RemoteHold runs on the goroutine of the executor that owns it, under
// that executor's lock.

import (
	"github.com/rdmakit/rdmakit/internal/keytab"
	"github.com/rdmakit/rdmakit/internal/sys"
)

// RemoteHold keeps one region of a target entered across the work
// requests of one executor call that runs them back to back (shm's
// direct path), and remembers what its key table said about it: while
// the region is entered no Dereg of it can return, so a request to the
// same key is checked against the remembered flags and bounds without the
// key table (the QP's access flags are still read each time). So a
// request after a Dereg removed the key but before the hold lets go still
// succeeds: that Dereg has not returned (it waits for the hold); requests
// on the key are sure to fail only once it has. The hold leaves the
// region once ChunkSize bytes went through it (Touched), so a
// Dereg waits no longer than for one chunk, and Leave ends it; the
// executor calls Leave before its lock is released. Not for concurrent
// use; the zero value holds nothing.
type RemoteHold struct {
	pin   keytab.Pin // entered while not zero
	key   uint32
	flags uint32
	va    uint64
	mem   []byte // the region's memory, from va
	bytes int    // touched since the region was entered
}

// Resolve is RemotePin followed by Enter for n > 0 bytes, through h: it
// returns the memory of [addr, addr+n) of the region named by rkey, now
// entered, or false if a check fails or the key was removed (nothing is
// then entered; RemotePin tells why).
func (h *RemoteHold) Resolve(t *Target, c *keytab.Cache, rkey uint32, addr uint64, n int, access uint32) ([]byte, bool) {
	if sys.Load32(t.qcb, qAccess)&access == 0 || n <= 0 {
		return nil, false
	}
	if !h.pin.Zero() && rkey == h.key && h.flags&access != 0 {
		if off, end := addr-h.va, addr+uint64(n); addr >= h.va && end >= addr && off+uint64(n) <= uint64(len(h.mem)) {
			return h.mem[off : off+uint64(n)], true
		}
	}
	e, pin, ok := t.keys.LookupRef(rkey, c)
	if !ok || e.Flags&keytab.FlagRemoteKey == 0 || e.PD != t.pd || e.Flags&access == 0 || !inBounds(e, addr, n) {
		return nil, false
	}
	region, ok := t.memory(e, e.VA, int(e.Length))
	if !ok || uint64(len(region)) != e.Length {
		return nil, false
	}
	if pin != h.pin {
		if !t.keys.Enter(pin) {
			return nil, false
		}
		h.Leave(t)
		h.pin, h.bytes = pin, 0
	}
	h.key, h.flags, h.va, h.mem = rkey, e.Flags, e.VA, region
	off := addr - e.VA
	return region[off : off+uint64(n)], true
}

// Touched counts n bytes copied through the held region, leaving it once
// ChunkSize bytes did.
func (h *RemoteHold) Touched(t *Target, n int) {
	if h.bytes += n; h.bytes >= ChunkSize {
		h.Leave(t)
	}
}

// Leave leaves the held region, if any.
func (h *RemoteHold) Leave(t *Target) {
	if !h.pin.Zero() {
		t.keys.Leave(h.pin)
		h.pin = keytab.Pin{} // the rest is not looked at without a pin
	}
}
