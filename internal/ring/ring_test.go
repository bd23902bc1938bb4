package ring

import (
	"encoding/binary"
	"sync"
	"testing"
	"time"
)

func TestFIFOAndFull(t *testing.T) {
	b := make([]byte, Size(4, 16))
	r := Init(b, 4, 16)
	var buf [16]byte
	for i := 0; i < 4; i++ {
		binary.LittleEndian.PutUint64(buf[:], uint64(i))
		if !r.TryPush(buf[:]) {
			t.Fatalf("push %d failed", i)
		}
	}
	if r.TryPush(buf[:]) {
		t.Fatal("push into full ring succeeded")
	}
	for i := 0; i < 4; i++ {
		if !r.TryPop(buf[:]) || binary.LittleEndian.Uint64(buf[:]) != uint64(i) {
			t.Fatalf("pop %d wrong", i)
		}
	}
	if r.TryPop(buf[:]) || !r.Empty() {
		t.Fatal("pop from empty ring succeeded")
	}
	if _, err := Attach(b); err != nil {
		t.Fatal(err)
	}
	if _, err := Attach(make([]byte, 300)); err == nil {
		t.Fatal("attached garbage")
	}
}

func TestMPMC(t *testing.T) {
	b := make([]byte, Size(64, 8))
	r := Init(b, 64, 8)
	const producers, per = 4, 20000
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			var buf [8]byte
			for i := 0; i < per; i++ {
				binary.LittleEndian.PutUint64(buf[:], uint64(p*per+i))
				for !r.TryPush(buf[:]) {
				}
				r.Notify()
			}
		}(p)
	}
	seen := make([]bool, producers*per)
	var mu sync.Mutex
	var cw sync.WaitGroup
	total := 0
	for c := 0; c < 2; c++ {
		cw.Add(1)
		go func() {
			defer cw.Done()
			var buf [8]byte
			for {
				mu.Lock()
				if total == producers*per {
					mu.Unlock()
					return
				}
				mu.Unlock()
				if !r.TryPop(buf[:]) {
					r.Wait(time.Millisecond)
					continue
				}
				v := binary.LittleEndian.Uint64(buf[:])
				mu.Lock()
				if seen[v] {
					t.Errorf("duplicate %d", v)
				}
				seen[v] = true
				total++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	cw.Wait()
}
