package prefetch

import (
	"math"
	"sort"
	"time"

	"github.com/strata-ai/strata/shard"
)

// writeBehind copies dirty copies to their home while the link is idle
// (see Move.WriteBehind). A copy qualifies when its home is the next tier
// down (no room is needed anywhere: the home is always allocated), its pool
// is one the trace overflows, nothing uses or reads it, no planner transfer
// is on that link and none is planned to start there before this one would
// end, and the next write of the shard is predicted to begin after it ends.
func (p *Planner) writeBehind(now time.Duration) {
	if len(p.dirtyList) == 0 || p.opts.DisableWriteBehind {
		p.dirtyList = p.dirtyList[:0]
		return
	}
	j := 0
	for _, dc := range p.dirtyList {
		ks := &p.keys[dc.slot]
		t := dc.tier
		if !ks.dirty || !p.valid(dc.slot, t) || !p.needsWriteBack(dc.slot, t) {
			continue // cleaned, rewritten elsewhere or gone: drop from the list
		}
		down := t + 1
		if down != ks.home || ks.copies[down] == incoming {
			continue // only a write to an adjacent home needs no room
		}
		j0 := j
		p.dirtyList[j] = dc
		j++
		pi := p.poolOf(dc.slot, t)
		if ks.pins[t] > 0 || ks.sources[t] > 0 || (len(p.trace) > 0 && !p.overflow[pi]) || (len(p.trace) == 0 && p.budget[pi] == 0) {
			continue
		}
		h := p.hop(dc.slot, t, down)
		busy := 0
		if h.link < len(p.linkBusy) {
			busy = int(p.linkBusy[h.link])
		}
		if busy >= max(p.opts.WriteBehindDepth, 1) {
			continue
		}
		end := now + time.Duration(busy+1)*h.xfer // behind those in flight
		if h.link < len(p.linkDue) && max(p.linkDue[h.link], now) < end {
			continue
		}
		if p.writtenBefore(dc.slot, end) {
			continue
		}
		ks.sources[t]++
		ks.behind[t] = true
		ks.asap[down] = false // into the home: nothing reads it there
		p.emit(shard.Move{Key: ks.key, From: t, To: down, SizeBytes: ks.linkBytes(), Reason: shard.Prefetch, WriteBehind: true})
		p.stats.WriteBehinds++
		p.track(dc.slot, h.link, ks.version)
		j = j0 // in flight: Completed decides whether it is still dirty
	}
	p.dirtyList = p.dirtyList[:j]
}

// planLinkDue sets linkDue to the earliest planned start of a transfer of
// the plan not issued yet, per link instance.
func (p *Planner) planLinkDue() {
	for i := range p.linkDue {
		p.linkDue[i] = math.MaxInt64
	}
	for i := range p.cands {
		c := &p.cands[i]
		if c.alloc || c.nhops == 0 {
			continue
		}
		h := &c.hops[0]
		if p.keys[c.slot].copies[h.to] == incoming {
			continue // issued
		}
		for h.link >= len(p.linkDue) {
			p.linkDue = append(p.linkDue, math.MaxInt64)
		}
		if st := c.firstStart(); st < p.linkDue[h.link] {
			p.linkDue[h.link] = st
		}
	}
}

// writtenBefore reports whether an access that writes s is waiting, or is
// predicted to begin before end.
func (p *Planner) writtenBefore(s int32, end time.Duration) bool {
	for _, w := range p.pending {
		if w.slot == s && w.kind != shard.Read {
			return true
		}
	}
	n := len(p.trace)
	if n == 0 || p.diverged {
		return false
	}
	ks := &p.keys[s]
	if len(ks.occ) == 0 {
		return false
	}
	// The occurrences from the current position on, cyclically: position o
	// of the trace is global index base+o in this cycle, base+n+o in the next.
	pos := p.pos % n
	base := p.stepBase + int64(p.pos-pos)
	k := sort.Search(len(ks.occ), func(i int) bool { return int(ks.occ[i]) >= pos })
	for i := 0; i < len(ks.occ); i++ {
		o, g := ks.occ[(k+i)%len(ks.occ)], base
		if k+i >= len(ks.occ) {
			g += int64(n)
		}
		g += int64(o)
		if g >= p.limit || p.t0+p.computeUntil(g) >= end {
			return false
		}
		if p.trace[o].kind != shard.Read {
			return true
		}
	}
	return false
}

// dirtyCopy is a copy made dirty by a Release: a write-behind candidate.
type dirtyCopy struct {
	slot int32
	tier shard.Tier
}
