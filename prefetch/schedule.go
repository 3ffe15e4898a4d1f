package prefetch

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/strata-ai/strata/shard"
)

// chainMemo is the result of chain for one (shard, tier, write or not),
// valid while the shard's ver is ver-1.
type chainMemo struct {
	ver uint32
	ok  bool
	c   cand
}

// hop is one transfer of a candidate chain.
type hop struct {
	from, to shard.Tier
	link     int // link instance: Link, per rank for HBM links
	xfer     time.Duration
	finish   time.Duration // must land by
	start    time.Duration // latest start (ALAP)
}

type cand struct {
	slot     int32
	tier     shard.Tier
	g        int64
	demand   bool
	alloc    bool
	ready    bool // the first hop's source is valid now
	deadline time.Duration
	hops     [2]hop
	nhops    int
}

// Next returns the moves to issue at time now, in order: the store must
// apply each Evict before the transfers after it.
func (p *Planner) Next(now time.Duration) []shard.Move {
	if !p.replan(now) {
		// An eviction can make a candidate of a shard that was resident
		// when the list was built: after one, the list is built again.
		p.planned = true
		for round := 0; p.dispatch(now); round++ {
			if round >= 4*len(p.keys)+4 {
				p.planned = false
				break
			}
		}
		p.planLinkDue()
	}
	p.writeBehind(now)
	p.clearFresh()
	out := p.outbox
	p.outbox = nil
	p.checkPending(now)
	return out
}

// replan reports whether the plan of the last Next still holds at now, and
// then shifts it to now. It holds when nothing happened since but the moves
// that Next issued (an issued candidate only leaves the list, which delays
// the others: ALAP starts depend on later transfers only), the predicted
// start of the next access did not move earlier (the whole plan moves with
// it: every deadline, and so every ALAP start, shifts by the same amount),
// and no candidate became due: every due one was issued or found no room,
// and room only changes with an Access, Release or Completed.
func (p *Planner) replan(now time.Duration) bool {
	if !p.planned {
		return false
	}
	d := p.predictT0(now) - p.t0
	if d < 0 || (p.wakeSet && now >= p.wakeAt+d) {
		return false
	}
	if d == 0 {
		return true
	}
	// p.cands is not shifted: dispatch builds it again before reading it.
	p.t0 += d
	p.wakeAt += d
	for i, st := range p.linkDue {
		if st != math.MaxInt64 && st != math.MinInt64 {
			p.linkDue[i] = st + d
		}
	}
	return true
}

// predictT0 is the predicted start of the next access: now, or later when
// the latest access is ready and its compute has not ended yet. Without a
// trace to follow it is the last one planned for (nothing is predicted).
func (p *Planner) predictT0(now time.Duration) time.Duration {
	if len(p.trace) == 0 || p.diverged {
		return p.t0
	}
	t0 := now
	if p.readyKnow && p.lastPos >= 0 && len(p.pending) == 0 {
		if t := p.lastReady + p.trace[p.lastPos].compute; t > t0 {
			t0 = t
		}
	}
	return t0
}

// dispatch issues the due candidates in order of latest start (first hops
// only) and reports whether it stopped early because it evicted something.
func (p *Planner) dispatch(now time.Duration) bool {
	cands := p.candidates(now)
	p.alap(cands)
	p.markFree(cands)
	// Only the due candidates are issued, in order; the others set WakeAt.
	order := p.scratch.order[:0]
	p.wakeSet = false
	for i := range cands {
		c := &cands[i]
		if !c.ready {
			continue
		}
		if st := c.firstStart(); st > now && !c.demand && !p.eager(c) && !p.scratch.freeOK[i] {
			if !p.wakeSet || st < p.wakeAt {
				p.wakeAt, p.wakeSet = st, true
			}
			continue
		}
		order = append(order, int32(i))
	}
	slices.SortFunc(order, func(a, b int32) int { // (start, g) is a total order
		ca, cb := &cands[a], &cands[b]
		if c := cmp.Compare(ca.firstStart(), cb.firstStart()); c != 0 {
			return c
		}
		return cmp.Compare(ca.g, cb.g)
	})
	p.scratch.order = order
	if len(p.scratch.blocked) < len(p.used) {
		p.scratch.blocked = make([]bool, len(p.used))
	}
	blocked := p.scratch.blocked
	clear(blocked)
	for _, i := range order {
		c := &cands[i]
		to := c.tier
		if !c.alloc {
			to = c.hops[0].to
		}
		if pi := p.poolOf(c.slot, to); to != p.keys[c.slot].home { // a home copy has its room
			if pi >= len(blocked) {
				blocked = append(blocked, make([]bool, pi+1-len(blocked))...)
				p.scratch.blocked = blocked
			}
			if blocked[pi] {
				continue
			}
			evictions := p.stats.MoveCount[shard.Evict] + p.stats.MoveCount[shard.WriteBack]
			u := urgency{now: now, deadline: c.deadline}
			for h := 0; h < c.nhops; h++ {
				u.need += c.hops[h].xfer
			}
			ok := p.makeRoom(pi, p.keys[c.slot].sizes[p.poolIDs[pi].tier], c.g, c.demand, u)
			if ok {
				p.issue(c)
			} else {
				blocked[pi] = true
			}
			if p.stats.MoveCount[shard.Evict]+p.stats.MoveCount[shard.WriteBack] != evictions {
				return true
			}
			continue
		}
		p.issue(c)
	}
	return false
}

// markFree sets freeOK[i] for the candidates that may be issued now even
// into a pool the trace overflows, because they take free room that no
// access before theirs needs: walking the candidates in access order, the
// room every one of them takes in each pool (allocations too) is summed,
// and while that prefix fits the pool's free room, nothing issued early can
// force an eviction before its own access (do no harm). In the optimizer
// phase this uploads the new params into the HBM room their stale copies
// left, right after they are written, instead of holding them in host
// memory until their ALAP start in the next forward.
func (p *Planner) markFree(cands []cand) {
	sc := &p.scratch
	if cap(sc.freeOK) < len(cands) {
		sc.freeOK = make([]bool, len(cands))
	}
	sc.freeOK = sc.freeOK[:len(cands)]
	clear(sc.freeOK)
	if p.opts.DisableEager || len(p.trace) == 0 || p.diverged {
		return
	}
	if len(sc.freeNeed) < len(p.used) {
		sc.freeNeed = make([]int64, len(p.used))
		sc.freeStop = make([]bool, len(p.used))
	}
	need, stop := sc.freeNeed[:len(p.used)], sc.freeStop[:len(p.used)]
	clear(need)
	clear(stop)
	for i := range cands {
		c := &cands[i]
		if c.demand {
			continue
		}
		ks := &p.keys[c.slot]
		ok := true
		add := func(t shard.Tier) {
			if t == ks.home {
				return
			}
			pi := p.poolOf(c.slot, t)
			if pi >= len(need) || p.budget[pi] == 0 {
				return
			}
			need[pi] += ks.sizes[t]
			if stop[pi] || p.used[pi]+need[pi] > p.budget[pi] {
				stop[pi] = true
				ok = false
			}
		}
		if c.alloc {
			add(c.tier)
			continue
		}
		for h := 0; h < c.nhops; h++ {
			add(c.hops[h].to)
		}
		sc.freeOK[i] = ok
	}
}

// eager reports whether a prefetch may be issued as soon as its source is
// ready rather than at its latest start: every pool it lands in is one the
// trace does not overflow, so the copy takes room nobody else will want
// (ALAP exists to hold memory only as long as needed), and issued early it
// is immune to late wake-ups and to compute that runs faster than the trace
// says. Allocations and transfers into overflowing pools stay ALAP.
func (p *Planner) eager(c *cand) bool {
	if c.alloc || c.nhops == 0 || p.opts.DisableEager || len(p.trace) == 0 || p.diverged {
		return false
	}
	for i := 0; i < c.nhops; i++ {
		to := c.hops[i].to
		if to == p.keys[c.slot].home {
			continue
		}
		if pi := p.poolOf(c.slot, to); pi >= len(p.overflow) || p.overflow[pi] {
			return false
		}
	}
	return true
}

func (c *cand) firstStart() time.Duration {
	if c.demand {
		return math.MinInt64
	}
	if c.alloc {
		return c.deadline
	}
	return c.hops[0].start
}

func (p *Planner) issue(c *cand) {
	ks := &p.keys[c.slot]
	ks.ver++
	if c.alloc {
		p.setCopy(c.slot, c.tier, reserved)
		ks.stale[c.tier] = false
		p.used[p.poolOf(c.slot, c.tier)] += ks.sizes[c.tier]
		p.emit(shard.Move{Key: ks.key, From: c.tier, To: c.tier, SizeBytes: ks.sizes[c.tier], Reason: shard.Alloc})
		return
	}
	h := c.hops[0]
	reason := shard.Prefetch
	if c.demand {
		reason = shard.Demand
	}
	p.setCopy(c.slot, h.to, incoming)
	ks.stale[h.to] = false
	ks.asap[h.to] = p.asap(c.slot, h.from, h.link)
	ks.sources[h.from]++
	if h.to != ks.home {
		p.used[p.poolOf(c.slot, h.to)] += ks.sizes[h.to]
	}
	p.emit(shard.Move{Key: ks.key, From: h.from, To: h.to, SizeBytes: ks.linkBytes(), Reason: reason})
	p.track(c.slot, h.link, ks.version)
}

// candidates lists the accesses that need a move: the started ones waiting
// (demand), then the predicted ones within the window, each (shard, tier) once.
// The list lives in p.cands and is valid until the next call.
func (p *Planner) candidates(now time.Duration) []cand {
	sc := &p.scratch
	out := p.cands[:0]
	sc.gen++
	if sc.gen == 0 { // wrapped: clear the stamps
		clear(sc.seenGen)
		clear(sc.writerGen)
		sc.gen = 1
	}
	gen := sc.gen
	if len(sc.seenGen) < len(p.keys)*shard.TierCount {
		sc.seenGen = make([]uint32, len(p.keys)*shard.TierCount)
		sc.memo = make([]chainMemo, 2*len(p.keys)*shard.TierCount)
		sc.writerGen = make([]uint32, len(p.keys))
		sc.writerTier = make([]shard.Tier, len(p.keys))
	}
	// writer[s] is the tier of a write to s that comes first: a copy
	// fetched elsewhere before it lands would be stale.
	for _, u := range p.inUse {
		if u.kind != shard.Read {
			sc.writerGen[u.slot], sc.writerTier[u.slot] = gen, u.tier
		}
	}
	add := func(s int32, t shard.Tier, k shard.Kind, g int64, deadline time.Duration, demand bool) {
		id := int(s)*shard.TierCount + int(t)
		written := sc.writerGen[s] == gen
		wt := sc.writerTier[s]
		if k != shard.Read && !written {
			sc.writerGen[s], sc.writerTier[s] = gen, t
		}
		if sc.seenGen[id] == gen {
			return
		}
		sc.seenGen[id] = gen
		mi := 2 * id
		if k == shard.Write {
			mi++
		}
		m := &sc.memo[mi]
		if m.ver != p.keys[s].ver+1 {
			m.c, m.ok = p.chain(s, t, k)
			m.ver = p.keys[s].ver + 1
		}
		if m.ok {
			c := m.c
			c.g, c.deadline, c.demand = g, deadline, demand
			if written && wt != t && !c.alloc {
				c.ready = false
			}
			out = append(out, c)
		}
	}
	for _, w := range p.pending {
		add(w.slot, w.tier, w.kind, w.g, now, true)
	}
	n := len(p.trace)
	if n == 0 || p.diverged {
		p.cands = out
		return out
	}
	t0 := p.predictT0(now)
	p.t0 = t0
	w := p.window
	if w <= 0 || w > n {
		w = n
	}
	d := t0
	i := p.pos % n
	for k := 0; k < w; k++ {
		g := p.stepBase + int64(p.pos) + int64(k)
		if g >= p.limit {
			break
		}
		a := &p.trace[i]
		if !p.gated(i, g) {
			add(a.slot, a.tier, a.kind, g, d, false)
		}
		d += a.compute
		if i++; i == n {
			i = 0
		}
	}
	// Shards written beyond the window's reach: their next access, when
	// an eager transfer serves it (see followWritten).
	for _, f := range p.followWritten(p.stepBase + int64(p.pos) + int64(w)) {
		a := &p.trace[f.pos]
		before := len(out)
		add(a.slot, a.tier, a.kind, f.g, t0+p.computeUntil(f.g), false)
		if len(out) > before && !p.eager(&out[before]) {
			out = out[:before]
			p.keys[a.slot].followed = false // the window will reach it
		}
	}
	p.written = slices.DeleteFunc(p.written, func(s int32) bool { return !p.keys[s].followed })
	p.cands = out
	return out
}

// followed is the next access of a shard written by a Release (see
// followWritten): its global index and trace position.
type followed struct {
	g   int64
	pos int32
}

// followWritten returns, in access order, the next access of each shard
// written by a Release (p.written) when it lies at or beyond end, the
// first global index past the window, and drops the others from
// p.written: the window sees them, or they never come. This keeps the
// eager rule (a transfer into a pool the trace does not overflow goes as
// soon as its source is valid) for the shards a write makes valid, such as
// the new params the optimizer writes in host memory, whose next access
// (the next forward) is usually far beyond the window. candidates drops
// those a transfer would not serve eagerly; once issued, chain finds
// nothing to do and they leave the list here at the next build. The list
// holds only written shards whose transfer has not been issued, so this is
// O(transfers pending), not O(trace).
func (p *Planner) followWritten(end int64) []followed {
	out := p.scratch.followed[:0]
	j := 0
	for _, s := range p.written {
		ks := &p.keys[s]
		g, pos, ok := p.nextAccess(s)
		if !ok || g < end || g >= p.limit {
			ks.followed = false
			continue
		}
		if p.gated(int(pos), g) {
			p.written[j] = s // not yet: it stays followed until confirmed, or the window reaches it
			j++
			continue
		}
		if m := &p.scratch.memo[2*(int(s)*shard.TierCount+int(p.trace[pos].tier))]; p.trace[pos].kind != shard.Write && m.ver == ks.ver+1 && !m.ok {
			ks.followed = false // nothing to move (issued, or there already)
			continue
		}
		p.written[j] = s
		j++
		out = append(out, followed{g: g, pos: pos})
	}
	p.written = p.written[:j]
	slices.SortFunc(out, func(a, b followed) int { return cmp.Compare(a.g, b.g) })
	p.scratch.followed = out
	return out
}

// nextAccess is the global index and trace position of the first access
// of s from the next one to begin on, cyclically; false when the trace has
// none.
func (p *Planner) nextAccess(s int32) (int64, int32, bool) {
	n := len(p.trace)
	occ := p.keys[s].occ
	if n == 0 || p.diverged || len(occ) == 0 {
		return 0, 0, false
	}
	pos := p.pos % n
	base := p.stepBase + int64(p.pos-pos)
	k := sort.Search(len(occ), func(i int) bool { return int(occ[i]) >= pos })
	if k == len(occ) {
		return base + int64(n) + int64(occ[0]), occ[0], true
	}
	return base + int64(occ[k]), occ[k], true
}

// chain builds the transfers that bring slot into t, or reports that none is
// needed (already there or on its way).
func (p *Planner) chain(s int32, t shard.Tier, k shard.Kind) (cand, bool) {
	ks := &p.keys[s]
	c := cand{slot: s, tier: t}
	if k == shard.Write {
		if ks.copies[t] != absent && !ks.stale[t] {
			return c, false
		}
		if ks.copies[t] != absent { // stale copy still held: wait for it to go
			return c, false
		}
		c.alloc, c.ready = true, true
		return c, true
	}
	if p.valid(s, t) || (ks.copies[t] == incoming && !ks.stale[t]) {
		return c, false
	}
	if ks.copies[t] != absent && t != ks.home {
		return c, false // a stale copy in the way; it goes when released
	}
	// Nearest tier with a valid (or incoming) copy; faster first on ties.
	src, ready := shard.Tier(0), false
	found := false
	for d := 1; d < shard.TierCount && !found; d++ {
		for _, u := range []int{int(t) - d, int(t) + d} {
			if u < 0 || u >= shard.TierCount {
				continue
			}
			ut := shard.Tier(u)
			if p.valid(s, ut) && !ks.leaving[ut] {
				src, ready, found = ut, true, true
				break
			}
			if ks.copies[ut] == incoming || (p.valid(s, ut) && ks.leaving[ut]) {
				src, ready, found = ut, false, true
				break
			}
		}
	}
	if !found {
		return c, false
	}
	step := shard.Tier(1)
	if src > t {
		c.nhops = int(src - t)
		for i, from := 0, src; from != t; i, from = i+1, from-step {
			c.hops[i] = p.hop(s, from, from-step)
		}
	} else {
		c.nhops = int(t - src)
		for i, from := 0, src; from != t; i, from = i+1, from+step {
			c.hops[i] = p.hop(s, from, from+step)
		}
	}
	// An intermediate tier that already holds (or waits for) a copy shortens the chain.
	if c.nhops == 2 && ks.copies[c.hops[0].to] != absent && !(c.hops[0].to == ks.home && ks.dirty) {
		return c, false
	}
	c.ready = ready
	return c, true
}

func (p *Planner) hop(s int32, from, to shard.Tier) hop {
	l, ok := shard.LinkOf(from, to)
	if !ok {
		panic(fmt.Sprintf("prefetch: no link %s->%s", from, to))
	}
	inst := int(l)
	if from == shard.HBM || to == shard.HBM {
		inst = shard.LinkCount * (1 + p.poolOf(s, shard.HBM))
		inst += int(l)
	}
	return hop{from: from, to: to, link: inst, xfer: p.opts.TransferTime(l, p.keys[s].linkBytes())}
}

// alap gives every hop its latest start: each link serves its hops one at a
// time, the last hop of a chain must land by deadline-slack, an earlier hop
// by the start of the next. Hops into HBM first, then into Host.
func (p *Planner) alap(cands []cand) {
	sc := &p.scratch
	if n := shard.LinkCount * (1 + len(p.used)); len(sc.linkNext) < n {
		sc.linkNext = make([]time.Duration, n)
		sc.linkSet = make([]bool, n)
	}
	for _, into := range []shard.Tier{shard.HBM, shard.Host} {
		refs := sc.refs[:0]
		// Fed latest first, the refs are nearly in sorted order already.
		for ci := len(cands) - 1; ci >= 0; ci-- {
			c := &cands[ci]
			for hi := 0; hi < c.nhops; hi++ {
				h := &c.hops[hi]
				if h.to != into {
					continue
				}
				if hi == c.nhops-1 {
					h.finish = c.deadline - p.opts.Slack
				} else {
					h.finish = c.hops[hi+1].start
				}
				refs = append(refs, hopRef{int32(ci), int32(hi)})
			}
		}
		// Each link serves its hops by (finish, g), latest first: the
		// later access takes the later slot. (finish, g) is a total order,
		// and the links are independent, so one order over all will do.
		// The candidates come in access order, so fed latest first the
		// refs are sorted already for the last hops (finish = deadline -
		// slack); only first hops, which finish when the second starts,
		// can be out of place: an insertion sort that gives up when the
		// input is far from sorted.
		later := func(a, b hopRef) bool {
			ha, hb := &cands[a.c].hops[a.h], &cands[b.c].hops[b.h]
			if ha.finish != hb.finish {
				return ha.finish > hb.finish
			}
			return cands[a.c].g > cands[b.c].g
		}
		if !insertionSort(refs, later, 8*len(refs)+64) {
			slices.SortFunc(refs, func(a, b hopRef) int {
				switch {
				case later(a, b):
					return -1
				case later(b, a):
					return 1
				}
				return 0
			})
		}
		clear(sc.linkSet)
		for _, r := range refs {
			h := &cands[r.c].hops[r.h]
			f := h.finish
			if sc.linkSet[h.link] && sc.linkNext[h.link] < f {
				f = sc.linkNext[h.link]
			}
			h.start = f - h.xfer
			sc.linkNext[h.link], sc.linkSet[h.link] = h.start, true
		}
		sc.refs = refs
	}
}

type hopRef struct{ c, h int32 }

// insertionSort sorts refs by less unless that takes more than maxMoves
// moves; it reports whether it finished (refs is a permutation either way).
func insertionSort(refs []hopRef, less func(a, b hopRef) bool, maxMoves int) bool {
	moves := 0
	for i := 1; i < len(refs); i++ {
		r := refs[i]
		j := i
		for j > 0 && less(r, refs[j-1]) {
			refs[j] = refs[j-1]
			j--
			if moves++; moves > maxMoves {
				refs[j] = r
				return false
			}
		}
		refs[j] = r
	}
	return true
}
