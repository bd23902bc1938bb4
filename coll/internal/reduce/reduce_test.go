package reduce

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// f16Ref is every finite float16 and +Inf as float64, ascending, with its
// bits, for a brute-force nearest-even reference.
var f16Ref = func() (r []struct {
	v float64
	h uint16
}) {
	for h := 0; h < 0x7c00; h++ {
		r = append(r, struct {
			v float64
			h uint16
		}{float64(F16ToF32(uint16(h))), uint16(h)})
	}
	r = append(r, struct {
		v float64
		h uint16
	}{65536, 0x7c00}) // infinity sits where the next binade would start
	return r
}()

func refF32ToF16(f float32) uint16 { return refF64ToF16(float64(f)) }

func refF64ToF16(f float64) uint16 {
	if math.IsNaN(f) {
		return 0x7e00
	}
	v := math.Abs(f)
	var sign uint16
	if math.Signbit(f) {
		sign = 0x8000
	}
	if v >= 65536 {
		return sign | 0x7c00
	}
	i := sort.Search(len(f16Ref), func(i int) bool { return f16Ref[i].v >= v })
	if f16Ref[i].v == v {
		return sign | f16Ref[i].h
	}
	lo, hi := f16Ref[i-1], f16Ref[i]
	switch dl, dh := v-lo.v, hi.v-v; {
	case dl < dh:
		return sign | lo.h
	case dh < dl:
		return sign | hi.h
	case lo.h&1 == 0:
		return sign | lo.h
	default:
		return sign | hi.h
	}
}

func TestF16RoundTrip(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := F16ToF32(uint16(h))
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			if !math.IsNaN(float64(f)) {
				t.Fatalf("%#04x: want NaN, got %v", h, f)
			}
			continue
		}
		if g := F32ToF16(f); g != uint16(h) {
			t.Fatalf("%#04x → %v → %#04x", h, f, g)
		}
	}
}

func TestF32ToF16Rounding(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	check := func(f float32) {
		want, got := refF32ToF16(f), F32ToF16(f)
		if math.IsNaN(float64(f)) {
			if got&0x7c00 != 0x7c00 || got&0x3ff == 0 {
				t.Fatalf("%v: got %#04x, not a NaN", f, got)
			}
			return
		}
		if got != want {
			t.Fatalf("%v (%#08x): got %#04x want %#04x", f, math.Float32bits(f), got, want)
		}
	}
	// Every tie and near-tie between adjacent halves, and random values.
	for h := 0; h < 0x7c00; h++ {
		a := float64(F16ToF32(uint16(h)))
		b := float64(F16ToF32(uint16(h + 1)))
		if h+1 == 0x7c00 {
			b = 65536
		}
		mid := float32((a + b) / 2)
		for _, f := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e9), -mid} {
			check(f)
		}
	}
	for i := 0; i < 200000; i++ {
		check(math.Float32frombits(r.Uint32()))
		check(float32(r.NormFloat64() * 100))
		check(float32(r.NormFloat64() * 1e-6))
	}
	for _, f := range []float32{0, float32(math.Copysign(0, -1)), 65504, 65519.99, 65520, 1e9, float32(math.Inf(1)), float32(math.Inf(-1)), 5.96e-8, 2.98e-8, 2.99e-8, 1e-45} {
		check(f)
	}
}

func refF32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if math.IsNaN(float64(f)) {
		return uint16(b>>16) | 0x40
	}
	lo := b &^ 0xffff
	hi := lo + 0x10000
	v := math.Abs(float64(f))
	dl := v - math.Abs(float64(math.Float32frombits(lo)))
	var vh float64
	if hi&0x7fffffff == 0x7f800000 {
		vh = math.Ldexp(1, 128) // infinity's place
	} else {
		vh = math.Abs(float64(math.Float32frombits(hi)))
	}
	dh := vh - v
	switch {
	case dl < dh:
		return uint16(lo >> 16)
	case dh < dl:
		return uint16(hi >> 16)
	case (lo>>16)&1 == 0:
		return uint16(lo >> 16)
	}
	return uint16(hi >> 16)
}

func TestBF16(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := BF16ToF32(uint16(h))
		if math.IsNaN(float64(f)) {
			continue
		}
		if g := F32ToBF16(f); g != uint16(h) {
			t.Fatalf("%#04x → %v → %#04x", h, f, g)
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 500000; i++ {
		b := r.Uint32()
		if i%4 == 0 {
			b = b&^0xffff | 0x8000 // exact ties
		}
		f := math.Float32frombits(b)
		got := F32ToBF16(f)
		if math.IsNaN(float64(f)) {
			if !math.IsNaN(float64(BF16ToF32(got))) {
				t.Fatalf("%#08x: NaN became %#04x", b, got)
			}
			continue
		}
		if want := refF32ToBF16(f); got != want {
			t.Fatalf("%#08x: got %#04x want %#04x", b, got, want)
		}
	}
}

// ref computes one element of a op b through float64 / wide integers.
func ref(t Type, op Op, a, b []byte) []byte {
	out := make([]byte, Size(t))
	le := binary.LittleEndian
	switch t {
	case Float16, BFloat16:
		to, from := F16ToF32, F32ToF16
		if t == BFloat16 {
			to, from = BF16ToF32, F32ToBF16
		}
		x, y := to(le.Uint16(a)), to(le.Uint16(b))
		var r uint16
		switch op {
		case Sum:
			r = from(x + y)
		case Prod:
			r = from(x * y)
		case Min:
			r = le.Uint16(a)
			if y < x || (y == x && math.Signbit(float64(y)) && !math.Signbit(float64(x))) {
				r = le.Uint16(b)
			}
		case Max:
			r = le.Uint16(a)
			if y > x || (y == x && !math.Signbit(float64(y)) && math.Signbit(float64(x))) {
				r = le.Uint16(b)
			}
		}
		le.PutUint16(out, r)
	case Float32:
		x, y := math.Float32frombits(le.Uint32(a)), math.Float32frombits(le.Uint32(b))
		le.PutUint32(out, math.Float32bits(fop(op, x, y)))
	case Float64:
		x, y := math.Float64frombits(le.Uint64(a)), math.Float64frombits(le.Uint64(b))
		le.PutUint64(out, math.Float64bits(fop(op, x, y)))
	case Int8:
		out[0] = byte(iop(op, int8(a[0]), int8(b[0])))
	case Uint8:
		out[0] = iop(op, a[0], b[0])
	case Int32:
		le.PutUint32(out, uint32(iop(op, int32(le.Uint32(a)), int32(le.Uint32(b)))))
	case Uint32:
		le.PutUint32(out, iop(op, le.Uint32(a), le.Uint32(b)))
	case Int64:
		le.PutUint64(out, uint64(iop(op, int64(le.Uint64(a)), int64(le.Uint64(b)))))
	case Uint64:
		le.PutUint64(out, iop(op, le.Uint64(a), le.Uint64(b)))
	}
	return out
}

func fop[T float32 | float64](op Op, x, y T) T {
	switch op {
	case Sum:
		return x + y
	case Prod:
		return x * y
	case Min:
		return min(x, y)
	}
	return max(x, y)
}

func iop[T int8 | uint8 | int32 | uint32 | int64 | uint64](op Op, x, y T) T {
	switch op {
	case Sum:
		return x + y
	case Prod:
		return x * y
	case Min:
		return min(x, y)
	}
	return max(x, y)
}

func randElems(r *rand.Rand, t Type, n int) []byte {
	b := make([]byte, n*Size(t))
	for i := 0; i < n; i++ {
		e := b[i*Size(t):]
		switch t {
		case Float16:
			binary.LittleEndian.PutUint16(e, F32ToF16(float32(r.NormFloat64()*10)))
		case BFloat16:
			binary.LittleEndian.PutUint16(e, F32ToBF16(float32(r.NormFloat64()*10)))
		case Float32:
			binary.LittleEndian.PutUint32(e, math.Float32bits(float32(r.NormFloat64()*10)))
		case Float64:
			binary.LittleEndian.PutUint64(e, math.Float64bits(r.NormFloat64()*10))
		default:
			for j := 0; j < Size(t); j++ {
				e[j] = byte(r.Uint32())
			}
		}
	}
	return b
}

func TestApply(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for ty := Type(0); ty < NumTypes; ty++ {
		for op := Op(0); op < NumOps; op++ {
			sz := Size(ty)
			for _, n := range []int{0, 1, 7, 8, 9, 31, 100, 700} {
				for _, mis := range []int{0, 1} {
					a, b := randElems(r, ty, n), randElems(r, ty, n)
					// Misaligned copies when mis is set (skipped for bytes).
					ab := make([]byte, len(a)+mis)[mis:]
					bb := make([]byte, len(b)+mis)[mis:]
					copy(ab, a)
					copy(bb, b)
					d := make([]byte, len(a)+mis)[mis:]
					Apply(ty, op, d, ab, bb)
					for i := 0; i < n; i++ {
						want := ref(ty, op, a[i*sz:], b[i*sz:])
						if string(d[i*sz:(i+1)*sz]) != string(want) {
							t.Fatalf("type %d op %d n %d mis %d elem %d: got %x want %x", ty, op, n, mis, i, d[i*sz:(i+1)*sz], want)
						}
					}
					// In place: dst is a.
					Apply(ty, op, ab, ab, bb)
					if string(ab) != string(d) {
						t.Fatalf("type %d op %d n %d: in-place result differs", ty, op, n)
					}
				}
			}
		}
	}
}

func TestDiv(t *testing.T) {
	le := binary.LittleEndian
	b := make([]byte, 8*9)
	for i := 0; i < 9; i++ {
		le.PutUint32(b[i*4:], uint32(int32(i*10-40)))
	}
	Div(Int32, b[:36], b[:36], 3)
	for i := 0; i < 9; i++ {
		if got, want := int32(le.Uint32(b[i*4:])), int32(i*10-40)/3; got != want {
			t.Fatalf("int32 %d: %d want %d", i, got, want)
		}
	}
	h := make([]byte, 2*11)
	for i := 0; i < 11; i++ {
		le.PutUint16(h[i*2:], F32ToF16(float32(i)*3))
	}
	Div(Float16, h[1:21], h[1:21], 1) // misaligned path, identity
	Div(Float16, h, h, 3)
	for i := 0; i < 11; i++ {
		if got := F16ToF32(le.Uint16(h[i*2:])); got != float32(i) {
			t.Fatalf("f16 %d: %v", i, got)
		}
	}
}

// TestHalfArithmeticExact checks that float16 sum and product through
// float32 equal the correctly rounded result of the exact operation.
func TestHalfArithmeticExact(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	x, y, d := make([]byte, 2), make([]byte, 2), make([]byte, 2)
	le := binary.LittleEndian
	for i := 0; i < 300000; i++ {
		a, b := uint16(r.Uint32()), uint16(r.Uint32())
		if a&0x7c00 == 0x7c00 || b&0x7c00 == 0x7c00 {
			continue
		}
		le.PutUint16(x, a)
		le.PutUint16(y, b)
		fa, fb := float64(F16ToF32(a)), float64(F16ToF32(b))
		for _, c := range []struct {
			op    Op
			exact float64
		}{{Sum, fa + fb}, {Prod, fa * fb}} {
			Apply(Float16, c.op, d, x, y)
			if got, want := le.Uint16(d), refF64ToF16(c.exact); got != want && !(got&0x7fff == 0 && want&0x7fff == 0) {
				t.Fatalf("%#04x op%d %#04x: got %#04x want %#04x", a, c.op, b, got, want)
			}
		}
	}
}

func TestNoAlloc(t *testing.T) {
	a := make([]byte, 4096)
	n := testing.AllocsPerRun(100, func() {
		for ty := Type(0); ty < NumTypes; ty++ {
			Apply(ty, Sum, a, a, a)
			Apply(ty, Max, a[1:1001], a[2:], a[3:])
			Div(ty, a[:1000], a, 2)
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per run", n)
	}
}

var typeNames = [NumTypes]string{"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64"}
var opNames = [NumOps]string{"sum", "prod", "min", "max"}

// BenchmarkApply measures the kernels alone. The reported throughput is
// the size of one operand per second; memory traffic is three times that
// (two reads, one write).
func BenchmarkApply(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 16 << 20} {
		for ty := Type(0); ty < NumTypes; ty++ {
			ops := []Op{Sum}
			if ty == Float32 || ty == Float16 {
				ops = []Op{Sum, Prod, Min, Max}
			}
			for _, op := range ops {
				b.Run(fmt.Sprintf("%s/%s/%dKiB", typeNames[ty], opNames[op], size>>10), func(b *testing.B) {
					x := make([]byte, size)
					y := make([]byte, size)
					r := rand.New(rand.NewPCG(1, 1))
					copy(x, randElems(r, ty, size/Size(ty)))
					copy(y, randElems(r, ty, size/Size(ty)))
					d := make([]byte, size)
					b.SetBytes(int64(size))
					b.ReportAllocs()
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						Apply(ty, op, d, x, y)
					}
				})
			}
		}
	}
}

func BenchmarkCopy(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 16 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			x := make([]byte, size)
			d := make([]byte, size)
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				copy(d, x)
			}
		})
	}
}
