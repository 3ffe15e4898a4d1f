package pinned

import (
	"sort"

	"github.com/strata-ai/strata/internal/units"
)

// Relocation is one buffer GetRelocating moved: Old's bytes are now New's,
// and Old has been returned (as with Put).
type Relocation struct{ Old, New *Buffer }

// GetRelocating is Get, except that when the free memory is merely
// fragmented it makes a free run of the size asked for by moving buffers
// that movable allows (none of them leased) into the free memory around
// it, and then carves the request from that run. Of the runs that can be
// freed it picks the one that moves the fewest bytes; each buffer moved
// goes best-fit into a free extent outside the run. The moves are copies
// within the mapping, made under the pool's lock: the caller must keep
// every movable buffer from being read or written until GetRelocating
// returns, and then use the New buffer of each Relocation in place of its
// Old one (Old is returned; a stale handle panics as after Put).
//
// When no run can be freed (the free bytes are too few, or too little of
// what is around them may move), the error is Get's. Moving is the way
// out that a planner counting bytes needs: its budget says the memory
// exists, the pool's extents disagree, and nothing it could evict would
// be adjacent by design.
func (p *Pool) GetRelocating(sizeBytes int64, purpose string, movable func(*Buffer) bool) (*Buffer, []Relocation, error) {
	if sizeBytes <= 0 || purpose == "" {
		panic("pinned: GetRelocating needs a positive size and a purpose")
	}
	padded := units.AlignUp(sizeBytes, p.opts.AlignBytes)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mustBeOpen("GetRelocating")
	off, ok := p.carve(padded)
	var moved []Relocation
	if !ok && p.mappedBytes()-p.inUseBytes >= padded {
		moved = p.relocateLocked(padded, movable)
		off, ok = p.carve(padded)
	}
	if !ok {
		return nil, nil, p.budgetError(sizeBytes, padded, purpose)
	}
	return p.hold(off, sizeBytes, padded, purpose), moved, nil
}

// segment is a piece of the mapping in address order: a free extent (b
// nil) or a held buffer.
type segment struct {
	off, size int64
	b         *Buffer
}

// relocateLocked frees a run of at least padded bytes by moving movable,
// unleased buffers out of it (see GetRelocating), and returns what it
// moved; nil when no run can be freed.
func (p *Pool) relocateLocked(padded int64, movable func(*Buffer) bool) []Relocation {
	segs := make([]segment, 0, len(p.free)+len(p.held))
	for _, e := range p.free {
		segs = append(segs, segment{off: e.offsetBytes, size: e.sizeBytes})
	}
	for b := range p.held {
		segs = append(segs, segment{off: b.offsetBytes, size: b.paddedBytes, b: b})
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].off < segs[j].off })
	can := make([]bool, len(segs))
	for i, s := range segs {
		can[i] = s.b == nil || s.b.Leases() == 0 && movable(s.b)
	}
	// The windows of consecutive segments that span padded bytes, every
	// held one movable, the shortest from each start, cheapest first.
	type window struct {
		i, j int
		cost int64
	}
	var ws []window
	for i := range segs {
		if !can[i] {
			continue
		}
		span, cost := int64(0), int64(0)
		for j := i; j < len(segs) && can[j]; j++ {
			span += segs[j].size
			if segs[j].b != nil {
				cost += segs[j].size
			}
			if span >= padded {
				ws = append(ws, window{i, j, cost})
				break
			}
		}
	}
	sort.SliceStable(ws, func(a, b int) bool { return ws[a].cost < ws[b].cost }) // of equals, the lowest
	for _, w := range ws {
		if moved, ok := p.tryWindow(segs[w.i : w.j+1]); ok {
			return moved
		}
	}
	return nil
}

// tryWindow moves the held buffers of win into the free extents outside
// it, largest first, best-fit, when they all fit; it reports whether they
// did (nothing moves otherwise).
func (p *Pool) tryWindow(win []segment) ([]Relocation, bool) {
	lo, hi := win[0].off, win[len(win)-1].off+win[len(win)-1].size
	outside := make([]extent, 0, len(p.free))
	for _, e := range p.free {
		if e.offsetBytes+e.sizeBytes <= lo || e.offsetBytes >= hi {
			outside = append(outside, e)
		}
	}
	var bs []*Buffer
	for _, s := range win {
		if s.b != nil {
			bs = append(bs, s.b)
		}
	}
	sort.SliceStable(bs, func(i, j int) bool { return bs[i].paddedBytes > bs[j].paddedBytes })
	// Place them on a copy of the outside extents first: all or nothing.
	trial := append([]extent(nil), outside...)
	for _, b := range bs {
		if _, ok := carveFrom(&trial, b.paddedBytes); !ok {
			return nil, false
		}
	}
	// Move: carve from the real free list with the window's extents held
	// out, so that no buffer lands inside the run being freed.
	inside := make([]extent, 0, len(win))
	for _, e := range p.free {
		if !(e.offsetBytes+e.sizeBytes <= lo || e.offsetBytes >= hi) {
			inside = append(inside, e)
		}
	}
	p.free = outside
	moved := make([]Relocation, 0, len(bs))
	for _, old := range bs {
		off, ok := p.carve(old.paddedBytes)
		if !ok {
			panic("pinned: a relocation the trial placed found no extent")
		}
		nb := &Buffer{pool: p, offsetBytes: off, sizeBytes: old.sizeBytes, paddedBytes: old.paddedBytes, purpose: old.purpose}
		copy(p.heap[off:off+old.sizeBytes], p.heap[old.offsetBytes:old.offsetBytes+old.sizeBytes])
		old.markPut()
		delete(p.held, old)
		p.held[nb] = struct{}{}
		moved = append(moved, Relocation{Old: old, New: nb})
		p.relocatedBytes += old.paddedBytes
		p.relocations++
	}
	for _, e := range inside {
		p.release(e)
	}
	for _, r := range moved {
		p.release(extent{r.Old.offsetBytes, r.Old.paddedBytes})
	}
	return moved, true
}
