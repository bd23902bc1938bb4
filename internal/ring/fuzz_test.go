package ring

import "testing"

// FuzzAttach feeds arbitrary bytes as a ring a peer might have corrupted:
// attaching and using it must neither panic nor hang.
func FuzzAttach(f *testing.F) {
	good := make([]byte, Size(4, 16))
	Init(good, 4, 16)
	f.Add(good)
	f.Add(make([]byte, 300))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b)%8 != 0 {
			b = b[:len(b)/8*8]
		}
		buf := make([]byte, len(b)) // 8-byte aligned copy
		copy(buf, b)
		r, err := Attach(buf)
		if err != nil {
			return
		}
		var p [64]byte
		for i := 0; i < 8; i++ {
			r.TryPush(p[:r.Payload()%64])
			r.TryPop(p[:r.Payload()%64])
		}
		r.Empty()
		r.Len()
	})
}
