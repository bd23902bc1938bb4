package ring

import "github.com/rdmakit/rdmakit/internal/sys"

// Batches: a producer or consumer that has several entries to move at
// once claims them with one CAS of the tail or head instead of one each.
// The methods take a pointer: a Ring copied into the frame of a call
// chain is read back in pieces the CPU cannot forward from the copy's
// 16-byte stores (measured: a third of a one-entry batch).

// ReserveN claims up to k consecutive free slots for a producer (at
// least one unless the ring is full, then n is 0) and returns the
// position of the first and how many. The producer fills each
// (Slot(pos+i)) and publishes them all with PublishN(pos, n).
func (r *Ring) ReserveN(k int) (pos uint64, n int) {
	return r.takeN(offTail, 0, k)
}

// takeN is ReserveN (off offTail, a free slot's sequence lag 0) and
// ClaimN (offHead, a published slot's lag 1): it counts up to k
// consecutive slots whose sequence is their position plus lag from the
// counter at off, and moves the counter past them with one CAS. None
// are there when the ring is full (empty) at the counter, or when the
// counter did not move past a slot that is not ready (an inconsistent
// slot).
func (r *Ring) takeN(off int, lag uint64, k int) (pos uint64, n int) {
	k = min(k, int(r.mask)+1)
	pos = sys.Load64(r.b, off)
	for k > 0 {
		n = 0
		for n < k && sys.Load64(r.b, headerSize+int((pos+uint64(n))&r.mask)*r.slot) == pos+uint64(n)+lag {
			n++
		}
		if n > 0 {
			if sys.CAS64(r.b, off, pos, pos+uint64(n)) {
				return pos, n
			}
			pos = sys.Load64(r.b, off)
			continue
		}
		// As in Reserve and Claim: full (empty), or another producer
		// (consumer) moved on; a counter that did not move means an
		// inconsistent slot.
		if seq := sys.Load64(r.b, headerSize+int(pos&r.mask)*r.slot); int64(seq-(pos+lag)) < 0 {
			return 0, 0
		}
		np := sys.Load64(r.b, off)
		if np == pos {
			return 0, 0
		}
		pos = np
	}
	return 0, 0
}

// Slot returns the payload of the slot at pos, which the caller reserved
// or claimed.
func (r *Ring) Slot(pos uint64) []byte {
	so := headerSize + int(pos&r.mask)*r.slot
	return r.b[so+8 : so+r.slot]
}

// PublishN publishes the n slots ReserveN returned at pos, in order; the
// last store is Publish's (a full barrier, for Notify's check of the
// waiters after it).
func (r *Ring) PublishN(pos uint64, n int) {
	raceRelease()
	for i := range n {
		p := pos + uint64(i)
		if i < n-1 {
			sys.StoreRelease64(r.b, headerSize+int(p&r.mask)*r.slot, p+1)
		} else {
			sys.Store64(r.b, headerSize+int(p&r.mask)*r.slot, p+1)
		}
	}
}

// ClaimN takes up to k of the oldest published entries for a consumer
// (none if the ring is empty) and returns the position of the first and
// how many; the consumer reads each in place (Slot) and gives each back
// with Release.
func (r *Ring) ClaimN(k int) (pos uint64, n int) {
	pos, n = r.takeN(offHead, 1, k)
	if n > 0 {
		raceAcquire()
	}
	return pos, n
}
