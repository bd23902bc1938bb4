package conformance

import (
	"errors"
	"testing"

	"github.com/rdmakit/rdmakit/verbs"
)

// AliasKeepsMemoryReserved checks on dev that memory registered more than
// once stays reserved until its last registration goes: an alias's keys
// never reach memory that a later AllocMR hands out.
func AliasKeepsMemoryReserved(t *testing.T, dev string) {
	ctx, err := verbs.Open(dev, verbs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	pd, _ := ctx.AllocPD()
	pd2, _ := ctx.AllocPD()
	orig, err := pd.AllocMR(1<<16, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	alias, err := pd.RegMR(orig.Bytes()[4096:8192], verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	if err := orig.Dereg(); err != nil {
		t.Fatal(err)
	}
	overlaps := func(a, b *verbs.MR) bool {
		return a.Addr() < b.Addr()+uint64(b.Len()) && b.Addr() < a.Addr()+uint64(a.Len())
	}
	var fresh []*verbs.MR
	for i := 0; i < 4; i++ {
		m, err := pd2.AllocMR(1<<16, verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		if overlaps(m, alias) {
			t.Fatalf("AllocMR handed out memory an alias (rkey %#x) still reaches", alias.RKey())
		}
		fresh = append(fresh, m)
	}
	// Once the alias goes, the memory is free, and registering it
	// (through a stale slice) is refused.
	if err := alias.Dereg(); err != nil {
		t.Fatal(err)
	}
	if _, err := pd.RegMR(orig.Bytes()[:4096], verbs.AccessAll); !errors.Is(err, verbs.ErrInvalidArgument) {
		t.Fatalf("RegMR of memory whose regions are gone: %v", err)
	}
	for _, m := range fresh {
		m.Dereg()
	}
	m, err := pd2.AllocMR(1<<16, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if m.Addr() != orig.Addr() {
		t.Logf("memory not reused at once (%#x, was %#x): allowed", m.Addr(), orig.Addr())
	}

}
