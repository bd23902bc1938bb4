package keytab

import (
	"encoding/binary"
	"testing"
)

// FuzzLookup looks keys up in arbitrary tables (a peer's arena can hold
// anything): no panic, no hang.
func FuzzLookup(f *testing.F) {
	good := make([]byte, Size(16))
	tab := Init(good, 16)
	tab.Insert(Entry{Key: 0xdeadbeef, VA: 1, Length: 2})
	f.Add(good, uint32(0xdeadbeef))
	f.Add(make([]byte, 64), uint32(1))
	f.Fuzz(func(t *testing.T, b []byte, key uint32) {
		buf := make([]byte, len(b)/8*8)
		copy(buf, b)
		if len(buf) >= 8 {
			// Keep sequence words even so lookups terminate, as a live
			// writer would.
			for o := headerSize; o+4 <= len(buf); o += slotSize {
				binary.LittleEndian.PutUint32(buf[o:], binary.LittleEndian.Uint32(buf[o:])&^1)
			}
		}
		tb, err := Attach(buf)
		if err != nil {
			return
		}
		tb.Lookup(key)
	})
}
