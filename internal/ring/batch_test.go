package ring

import (
	"encoding/binary"
	"sync"
	"testing"
)

// Batches keep FIFO order, stop at a full or empty ring, and wrap.
func TestBatchFIFO(t *testing.T) {
	r := Init(make([]byte, Size(8, 8)), 8, 8)
	next, want := uint64(0), uint64(0)
	for round := 0; round < 5; round++ {
		for {
			pos, n := r.ReserveN(3)
			if n == 0 {
				break
			}
			for i := range n {
				binary.LittleEndian.PutUint64(r.Slot(pos+uint64(i)), next)
				next++
			}
			r.PublishN(pos, n)
		}
		if r.Len() != 8 {
			t.Fatalf("round %d: %d entries after filling, want 8", round, r.Len())
		}
		for {
			pos, n := r.ClaimN(5)
			if n == 0 {
				break
			}
			for i := range n {
				if v := binary.LittleEndian.Uint64(r.Slot(pos + uint64(i))); v != want {
					t.Fatalf("got %d, want %d", v, want)
				}
				want++
				r.Release(pos + uint64(i))
			}
		}
		if !r.Empty() || want != next {
			t.Fatalf("round %d: %d taken of %d", round, want, next)
		}
	}
	if _, n := r.ReserveN(0); n != 0 {
		t.Fatal("ReserveN(0) reserved")
	}
	if _, n := r.ClaimN(0); n != 0 {
		t.Fatal("ClaimN(0) claimed")
	}
}

// Batch and single producers and consumers at once: every entry arrives
// exactly once.
func TestBatchMPMC(t *testing.T) {
	r := Init(make([]byte, Size(64, 8)), 64, 8)
	const producers, per = 4, 20000
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; {
				k := 1 + (p+i)%7
				if p%2 == 0 {
					k = 1
				}
				pos, n := r.ReserveN(min(k, per-i))
				for j := range n {
					binary.LittleEndian.PutUint64(r.Slot(pos+uint64(j)), uint64(p*per+i+j))
				}
				r.PublishN(pos, n)
				i += n
			}
		}()
	}
	seen := make([]bool, producers*per)
	var mu sync.Mutex
	total := 0
	var cw sync.WaitGroup
	for c := range 2 {
		cw.Add(1)
		go func() {
			defer cw.Done()
			for {
				mu.Lock()
				done := total == producers*per
				mu.Unlock()
				if done {
					return
				}
				pos, n := r.ClaimN(1 + c*4)
				for j := range n {
					v := binary.LittleEndian.Uint64(r.Slot(pos + uint64(j)))
					r.Release(pos + uint64(j))
					mu.Lock()
					if seen[v] {
						t.Errorf("duplicate %d", v)
					}
					seen[v] = true
					total++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	cw.Wait()
}
