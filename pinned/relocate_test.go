package pinned

import (
	"errors"
	"testing"
)

// fill writes a pattern of seed over b.
func fill(b *Buffer, seed byte) {
	m := b.Bytes()
	for i := range m {
		m[i] = seed + byte(i*7)
	}
}

// holds reports whether b still holds fill's pattern of seed.
func holds(b *Buffer, seed byte) bool {
	for i, v := range b.Bytes() {
		if v != seed+byte(i*7) {
			return false
		}
	}
	return true
}

func TestGetRelocating(t *testing.T) {
	p := newPool(t, Options{BudgetBytes: 8 * mib, ArenaSizeBytes: 2 * mib})
	var bufs []*Buffer
	for i := range 8 {
		b := mustGet(t, p, mib-100, "state") // padded to 1 MiB; the copy keeps the bytes asked for
		fill(b, byte(i))
		bufs = append(bufs, b)
	}
	for _, i := range []int{0, 2, 5} {
		p.Put(bufs[i])
	}
	// 3 MiB free in runs of 1 MiB. Only bufs[1] and bufs[4] may move, and
	// bufs[4] is leased (its I/O runs).
	movable := map[*Buffer]bool{bufs[1]: true, bufs[4]: true}
	bufs[4].Lease()
	if _, err := p.Get(2*mib, "big"); !errors.Is(err, ErrBudget) {
		t.Fatalf("Get of 2 MiB in runs of 1 MiB: %v, want a budget error", err)
	}
	big, moved, err := p.GetRelocating(2*mib, "big", func(b *Buffer) bool { return movable[b] })
	if err != nil {
		t.Fatal(err)
	}
	// The cheapest run: [0, 2 MiB), freed by moving bufs[1] (1 MiB) to the
	// best-fitting hole outside it, at 2 MiB.
	if len(moved) != 1 || moved[0].Old != bufs[1] || moved[0].New.Offset() != 2*mib || big.Offset() != 0 {
		t.Fatalf("moved %+v, big at %d; want bufs[1] moved to 2 MiB and big at 0", moved, big.Offset())
	}
	if !holds(moved[0].New, 1) || moved[0].New.Purpose() != "state" || moved[0].New.Len() != mib-100 {
		t.Fatal("the moved buffer lost its bytes, purpose or size")
	}
	for _, i := range []int{3, 4, 6, 7} {
		if !holds(bufs[i], byte(i)) {
			t.Fatalf("bufs[%d], not moved, changed", i)
		}
	}
	mustPanic(t, func() { moved[0].Old.Bytes() }, "already returned")
	st := p.Stats()
	if st.Relocations != 1 || st.RelocatedBytes != mib || st.InUseBytes != 7*mib {
		t.Fatalf("stats %+v; want 1 relocation of 1 MiB and 7 MiB in use", st)
	}
	bufs[1] = moved[0].New

	// 1 MiB free (at 5 MiB), between bufs[4] (leased) and bufs[6] (not
	// movable): nothing can make 2 MiB, and nothing moves.
	p.Put(big)
	hold := mustGet(t, p, 2*mib, "hold") // back into [0, 2 MiB)
	_, _, err = p.GetRelocating(2*mib, "big", func(b *Buffer) bool { return movable[b] })
	if !errors.Is(err, ErrBudget) {
		t.Fatalf("GetRelocating with only unmovable neighbours: %v, want a budget error", err)
	}
	if st := p.Stats(); st.Relocations != 1 || bufs[1].Offset() != 2*mib {
		t.Fatalf("a failed GetRelocating moved something: %+v", st)
	}
	bufs[4].Release()
	for _, b := range append(bufs[1:2], bufs[3], bufs[4], bufs[6], bufs[7], hold) {
		p.Put(b)
	}
}

// TestGetRelocatingAllOrNothing: a run that could be freed only if its
// buffers fit in the holes outside it, and they do not: nothing moves.
func TestGetRelocatingAllOrNothing(t *testing.T) {
	p := newPool(t, Options{BudgetBytes: 4 * mib})
	var bufs []*Buffer
	for i := range 4 {
		b := mustGet(t, p, mib, "state")
		fill(b, byte(i))
		bufs = append(bufs, b)
	}
	p.Put(bufs[0])
	p.Put(bufs[2])
	// 3 MiB would need [0, 3 MiB) (bufs[1] to the only hole outside: none)
	// or [1, 4 MiB) (bufs[1] and bufs[3] into one hole of 1 MiB).
	_, moved, err := p.GetRelocating(3*mib, "big", func(*Buffer) bool { return true })
	if !errors.Is(err, ErrBudget) || moved != nil {
		t.Fatalf("got %v, moved %v; want a budget error and nothing moved", err, moved)
	}
	if !holds(bufs[1], 1) || !holds(bufs[3], 3) || bufs[1].Offset() != mib || p.Stats().Relocations != 0 {
		t.Fatal("a refused relocation changed the buffers")
	}
	// 2 MiB: bufs[1] moves into the hole at 2 MiB, or bufs[3]... the
	// cheapest, lowest run is [0, 2 MiB).
	b, moved, err := p.GetRelocating(2*mib, "big", func(*Buffer) bool { return true })
	if err != nil || len(moved) != 1 || b.Offset() != 0 || !holds(moved[0].New, 1) {
		t.Fatalf("got %v, moved %+v, at %d", err, moved, b.Offset())
	}
	p.Put(b)
	p.Put(moved[0].New)
	p.Put(bufs[3])
}
