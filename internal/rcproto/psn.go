package rcproto

// 24-bit packet sequence numbers.
//
// Goroutines: none; a PSN is a value.

// PSN is an InfiniBand packet sequence number: 24 bits, arithmetic modulo
// 2^24. Two PSNs compare by their signed distance, which is meaningful
// while they are less than 2^23 apart (the IBTA window), so that an
// initial PSN may sit anywhere in the space and sequences wrap freely.
type PSN uint32

// PSNMask masks the 24 significant bits of a PSN.
const PSNMask = 1<<24 - 1

// Add returns p advanced by n (modulo 2^24).
func (p PSN) Add(n uint32) PSN { return PSN((uint32(p) + n) & PSNMask) }

// Sub returns the signed distance p - q, valid when |p - q| < 2^23.
func (p PSN) Sub(q PSN) int32 {
	d := (uint32(p) - uint32(q)) & PSNMask
	return int32(d<<8) >> 8
}

// Before reports whether p comes strictly before q.
func (p PSN) Before(q PSN) bool { return p.Sub(q) < 0 }

// After reports whether p comes strictly after q.
func (p PSN) After(q PSN) bool { return p.Sub(q) > 0 }

// InRange reports whether p lies in the half-open range [lo, hi).
func (p PSN) InRange(lo, hi PSN) bool {
	return p.Sub(lo) >= 0 && p.Sub(hi) < 0
}
