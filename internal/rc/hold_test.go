package rc

import (
	"testing"

	"github.com/rdmakit/rdmakit/internal/keytab"
	"github.com/rdmakit/rdmakit/internal/sys"
)

// TestResolveHostileLength: a peer's key table lives in memory the peer
// writes, so an entry's Length may be anything. One too long to be an
// int (here 2^64-1, -1 as an int) is refused, not sliced: the region
// check wrapped around and the slice expression panicked.
func TestResolveHostileLength(t *testing.T) {
	const rkey = 0x1234
	for _, e := range []keytab.Entry{
		{Key: rkey, Flags: keytab.FlagRemoteKey | AccessRemoteWrite, VA: 0, Length: ^uint64(0), Handle: 64},
		{Key: rkey, Flags: keytab.FlagRemoteKey | AccessRemoteWrite, VA: 0, Length: 1 << 63, Handle: 64},
		{Key: rkey, Flags: keytab.FlagRemoteKey | AccessRemoteWrite, VA: 0, Length: 128, Handle: ^uint64(0) - 8},
	} {
		tb := make([]byte, keytab.Size(8))
		keys := keytab.Init(tb, 8)
		if err := keys.Insert(e); err != nil {
			t.Fatal(err)
		}
		tg := &Target{arena: make([]byte, 4096), qcb: make([]byte, QCBSize), keys: keys}
		sys.Store32(tg.qcb, qAccess, AccessRemoteWrite)
		var h RemoteHold
		var c keytab.Cache
		if m, ok := h.Resolve(tg, &c, rkey, 0, 8, AccessRemoteWrite); ok {
			t.Errorf("Length %#x Handle %#x: resolved %d bytes of a 4096-byte arena", e.Length, e.Handle, len(m))
		}
		h.Leave(tg)
	}
}
