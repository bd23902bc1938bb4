package keytab

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestInsertLookupRemove(t *testing.T) {
	tab := Init(make([]byte, Size(64)), 64)
	keys := map[uint32]bool{}
	for len(keys) < 32 {
		k := rand.Uint32()
		if k == 0 || keys[k] {
			continue
		}
		keys[k] = true
		if err := tab.Insert(Entry{Key: k, VA: uint64(k) * 2, Length: 10}); err != nil {
			t.Fatal(err)
		}
	}
	for k := range keys {
		e, ok := tab.Lookup(k)
		if !ok || e.VA != uint64(k)*2 {
			t.Fatalf("lookup %x: %v %v", k, e, ok)
		}
		if tab.Insert(Entry{Key: k}) == nil {
			t.Fatal("duplicate insert accepted")
		}
	}
	for k := range keys {
		if !tab.Remove(k) {
			t.Fatalf("remove %x", k)
		}
		if _, ok := tab.Lookup(k); ok {
			t.Fatalf("%x found after remove", k)
		}
	}
	if _, ok := tab.Lookup(0); ok {
		t.Fatal("key 0 found")
	}
}

func TestConcurrentReaders(t *testing.T) {
	tab := Init(make([]byte, Size(256)), 256)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				for k := uint32(1); k < 64; k++ {
					if e, ok := tab.Lookup(k); ok && e.VA != uint64(k)*3 {
						t.Errorf("torn entry %d: %+v", k, e)
					}
				}
			}
		}()
	}
	for i := 0; i < 2000; i++ {
		k := uint32(i%63 + 1)
		tab.Insert(Entry{Key: k, VA: uint64(k) * 3})
		tab.Remove(uint32((i+30)%63 + 1))
	}
	stop.Store(true)
	wg.Wait()
}

func TestAttachRejectsGarbage(t *testing.T) {
	if _, err := Attach(make([]byte, 128)); err == nil {
		t.Fatal("attached zeros")
	}
}

func TestLookupCached(t *testing.T) {
	tab := Init(make([]byte, Size(16)), 16)
	tab.Insert(Entry{Key: 5, VA: 1})
	var c Cache
	if e, ok := tab.LookupCached(5, &c); !ok || e.VA != 1 {
		t.Fatal("first lookup")
	}
	if e, ok := tab.LookupCached(5, &c); !ok || e.VA != 1 {
		t.Fatal("cached lookup")
	}
	tab.Remove(5)
	if _, ok := tab.LookupCached(5, &c); ok {
		t.Fatal("cache survived removal")
	}
	tab.Insert(Entry{Key: 5, VA: 2})
	if e, ok := tab.LookupCached(5, &c); !ok || e.VA != 2 {
		t.Fatal("cache served a stale entry")
	}
}

// An operation that pinned a key keeps Idle waiting until it leaves; once
// the key is removed, Enter fails; a tombstone still in use is not reused.
func TestPinIdle(t *testing.T) {
	b := make([]byte, Size(8))
	tb := Init(b, 8)
	if err := tb.Insert(Entry{Key: 42, VA: 1, Length: 1}); err != nil {
		t.Fatal(err)
	}
	_, pin, ok := tb.LookupPin(42, nil)
	if !ok || !tb.Enter(pin) {
		t.Fatal("live key: Enter failed")
	}
	s := tb.RemoveSlot(42)
	if s == 0 {
		t.Fatal("not removed")
	}
	if tb.Idle(s, 10*time.Millisecond) {
		t.Fatal("Idle with an operation inside")
	}
	// Every slot but the pinned tombstone can be taken.
	for k := uint32(100); k < 107; k++ {
		if err := tb.Insert(Entry{Key: k}); err != nil {
			t.Fatalf("insert %d: %v", k, err)
		}
	}
	if err := tb.Insert(Entry{Key: 200}); err != ErrFull {
		t.Fatalf("the pinned tombstone was reused (%v)", err)
	}
	tb.Leave(pin)
	if !tb.Idle(s, time.Second) {
		t.Fatal("not idle after Leave")
	}
	if tb.Enter(pin) {
		t.Fatal("Enter succeeded on a removed key")
	}
	if err := tb.Insert(Entry{Key: 200}); err != nil {
		t.Fatal(err)
	}
}

// A Hold keeps its pin entered between touches: the key's slot is busy
// until the hold is released, by a failed touch after the removal or by
// ReleaseSlot, and a touch of a removed key fails.
func TestHold(t *testing.T) {
	tb := Init(make([]byte, Size(8)), 8)
	for _, k := range []uint32{42, 43} {
		if err := tb.Insert(Entry{Key: k, VA: 1, Length: 1}); err != nil {
			t.Fatal(err)
		}
	}
	_, p42, _ := tb.LookupPin(42, nil)
	_, p43, _ := tb.LookupPin(43, nil)
	var h Hold
	if !tb.EnterHeld(&h, p42) || !tb.EnterHeld(&h, p42) {
		t.Fatal("live key: EnterHeld failed")
	}
	s42 := tb.RemoveSlot(42)
	if !h.Holds(s42) {
		t.Fatal("Holds does not name the held slot")
	}
	if tb.Idle(s42, 5*time.Millisecond) {
		t.Fatal("idle while held")
	}
	// The next touch sees the removal and lets the slot go.
	if tb.EnterHeld(&h, p42) {
		t.Fatal("EnterHeld succeeded on a removed key")
	}
	if !tb.Idle(s42, time.Second) || h.Holds(s42) {
		t.Fatal("a failed touch kept the hold")
	}
	// Moving to another key leaves the one held before; ReleaseSlot lets
	// a removed key go without a touch.
	if !tb.EnterHeld(&h, p43) {
		t.Fatal("EnterHeld of a second key failed")
	}
	s43 := tb.RemoveSlot(43)
	tb.ReleaseSlot(&h, s42) // another slot: nothing happens
	if tb.Idle(s43, 5*time.Millisecond) {
		t.Fatal("ReleaseSlot of another slot released the hold")
	}
	tb.ReleaseSlot(&h, s43)
	if !tb.Idle(s43, time.Second) {
		t.Fatal("ReleaseSlot did not release the hold")
	}
	if !tb.EnterHeld(&h, Pin{}) {
		t.Fatal("the zero pin (inline data) must always enter")
	}
}
