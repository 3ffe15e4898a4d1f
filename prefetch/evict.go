package prefetch

import (
	"time"

	"github.com/strata-ai/strata/shard"
)

// victim is a copy that makeRoom could evict, with what Belady's rule and
// the do-no-harm rule need to know about it.
type victim struct {
	s         int32
	next      int64 // next use after g
	use       int64 // its use at or before g, when before
	evictable bool  // free now and not needed before g
	dirty     bool
	before    bool // needed at or before g
	lastUse   int64
}

// victimFirst orders victims by Belady's rule: furthest next use first,
// then free before busy, clean before dirty, least recently used, slot.
func victimFirst(va, vc *victim) bool {
	if va.next != vc.next {
		return va.next > vc.next
	}
	if va.evictable != vc.evictable {
		return va.evictable
	}
	if va.dirty != vc.dirty {
		return !va.dirty
	}
	if va.lastUse != vc.lastUse {
		return va.lastUse < vc.lastUse
	}
	return va.s < vc.s
}

// makeRoom frees space in pool pi for size bytes needed by the access at
// global index g: Belady's rule picks the victims whose next use is furthest
// away, never one used at or before g (do no harm) and never a pinned copy.
// Clean victims go at once; dirty ones are written back and the room exists
// when that completes. It reports whether the room exists now.
//
// A prefetch also waits rather than evict a copy used sooner than one that
// is pinned now (in use or being read): once that one is free it is the
// better victim. This keeps the evictions those of Belady's MIN, at the cost
// of a later prefetch, unless waiting would make the transfer land after
// its deadline (lateIfWait): then the best victims free now go instead,
// clean first, a dirty one only if its write-back still lets the transfer
// land in time. A demand evicts what it can at once.
//
// The steps: list the candidate victims (listVictims), order them lazily
// (victimOrder), then, with write-behind on, take the clean ones first
// (evictCleanFirst), and finally follow Belady's order, writing dirty
// victims back (evictInOrder).
func (p *Planner) makeRoom(pi int, size int64, g int64, demand bool, u urgency) bool {
	b := p.budget[pi]
	if b == 0 || p.used[pi]+size <= b {
		return true
	}
	r := room{pi: pi, t: p.poolIDs[pi].tier, size: size, g: g, demand: demand, u: u}
	base := len(p.scratch.victims) // makeRoom recurses: each call owns the tail it appended
	defer func() { p.scratch.victims = p.scratch.victims[:base] }()
	p.listVictims(&r)
	vs := p.scratch.victims[base:]
	if r.enough(p) {
		return false // write-backs under way will make the room
	}
	// Victims in order of Belady's rule (furthest next use first), sorted
	// lazily: at(i) pops a heap, as few victims are needed at a time.
	for i := range vs {
		v := &vs[i]
		v.lastUse = p.keys[v.s].lastUse
	}
	vo := victimOrder{vs: vs, heapN: len(vs)}
	vo.heapify()
	evictions := p.evictions()
	if p.opts.DisableWriteBehind || !p.evictCleanFirst(&r, &vo) {
		p.evictInOrder(&r, &vo)
	}
	if r.late && p.evictions() != evictions {
		p.stats.LateVictims++
	}
	return p.used[pi]+size <= b
}

// room is one makeRoom call: the room asked for and what is known so far.
type room struct {
	pi     int // the pool
	t      shard.Tier
	size   int64 // bytes needed
	g      int64 // global index of the access they are for
	demand bool
	u      urgency
	// leaving counts the bytes of the pool's copies being written back:
	// their room exists once the writes land.
	leaving int64
	// late: a busy victim was passed over because waiting for it would
	// make the transfer late (see lateIfWait).
	late bool
}

// enough reports whether the room will exist once the write-backs under
// way land.
func (r *room) enough(p *Planner) bool {
	return p.used[r.pi]-r.leaving+r.size <= p.budget[r.pi]
}

// evictions counts the moves that free room: evictions and write-backs.
func (p *Planner) evictions() int64 {
	return p.stats.MoveCount[shard.Evict] + p.stats.MoveCount[shard.WriteBack]
}

// listVictims appends to p.scratch.victims every copy in r's pool that could
// make room (held there, not its home, not stale), with its next use, and
// counts in r.leaving the copies already being written back.
func (p *Planner) listVictims(r *room) {
	t := r.t
	for _, i := range p.members[r.pi] {
		ks := &p.keys[i]
		if ks.leaving[t] {
			r.leaving += ks.sizes[t]
			continue
		}
		if t == ks.home || ks.stale[t] || (ks.copies[t] != present && ks.copies[t] != incoming) {
			continue
		}
		v := victim{s: i, next: p.nextUse(i, t, -1)}
		v.evictable = ks.copies[t] == present && ks.pins[t] == 0 && ks.sources[t] == 0 && v.next > r.g
		if v.next <= r.g {
			v.before = true
			v.use = v.next
			v.next = p.nextUse(i, t, r.g+1)
		}
		if v.evictable {
			v.dirty = p.needsWriteBack(i, t)
		}
		p.scratch.victims = append(p.scratch.victims, v)
	}
}

// evictCleanFirst is the pass of write-behind: a clean victim is taken
// before a dirty one, and a prefetch does not wait for a busy victim that
// will still be dirty when free: either would put an NVMe or PCIe write on
// the critical path, which costs more than a fetch of a shard that Belady
// would have kept (fetches are prefetched and hidden). It reports whether
// makeRoom is done: the room will exist, or the prefetch waits for a victim.
func (p *Planner) evictCleanFirst(r *room, vo *victimOrder) bool {
	t := r.t
	for i := range vo.vs {
		v := vo.at(i)
		if r.enough(p) {
			break
		}
		if !v.evictable {
			if r.demand || p.willBeDirty(v.s, t) || p.keys[v.s].behind[t] || (v.before && p.writesBefore(v.s, t, r.g)) {
				// Waiting for a copy under write-behind, or for one
				// that an access before g will update (it would then
				// need a write first), would make this prefetch late
				// (it is due now); the next clean victim is as good:
				// it is written already.
				continue
			}
			if p.lateIfWait(&v, t, r.u) {
				r.late = true // see lateIfWait
				continue
			}
			return true // wait for it
		}
		if v.dirty {
			continue
		}
		p.evictClean(v.s, t, r.pi)
	}
	return r.enough(p)
}

// evictInOrder takes the victims in Belady's order: clean ones go at once,
// dirty ones are written back one tier down (writeBackVictim). A prefetch
// stops at a busy victim (it waits for it) unless waiting is late.
func (p *Planner) evictInOrder(r *room, vo *victimOrder) {
	t := r.t
	for i := range vo.vs {
		if r.enough(p) {
			break
		}
		v := vo.at(i)
		if !v.evictable {
			if r.demand {
				continue
			}
			if p.lateIfWait(&v, t, r.u) {
				r.late = true
				continue
			}
			break // Belady's victim is busy or needed first: wait for it
		}
		ks := &p.keys[v.s]
		if ks.copies[t] != present {
			continue // evicted by the first pass
		}
		if !v.dirty {
			p.evictClean(v.s, t, r.pi)
			continue
		}
		p.writeBackVictim(r, v.s)
	}
}

// writeBackVictim starts the write-back of the dirty copy of s in r's pool
// to the next tier down, making room there first when that is not its
// home, unless the write-back could not land in time (past a victim
// skipped because waiting for it is late, a dirty one is taken only if its
// write-back still lets the transfer land by the deadline).
func (p *Planner) writeBackVictim(r *room, s int32) {
	t := r.t
	ks := &p.keys[s]
	down := t + 1
	if r.late && !r.demand {
		if l, ok := shard.LinkOf(t, down); !ok || r.u.now+p.opts.TransferTime(l, ks.linkBytes())+r.u.need > r.u.deadline {
			return
		}
	}
	if down != ks.home {
		if ks.copies[down] != absent {
			return
		}
		if !p.makeRoom(p.poolOf(s, down), ks.sizes[down], r.g, r.demand, r.u) {
			return
		}
		p.used[p.poolOf(s, down)] += ks.sizes[down]
	}
	ks.ver++
	if down == ks.home {
		ks.copies[down] = present // the home copy stays allocated; it is invalid until the write-back lands
	} else {
		p.setCopy(s, down, incoming)
		ks.asap[down] = p.asap(s, t, p.hop(s, t, down).link) // a write-back of data written just now
	}
	ks.leaving[t] = true
	ks.sources[t]++
	r.leaving += ks.sizes[t]
	p.emit(shard.Move{Key: ks.key, From: t, To: down, SizeBytes: ks.linkBytes(), Reason: shard.WriteBack})
	p.track(s, p.hop(s, t, down).link, ks.version)
}

// urgency is what makeRoom needs to tell whether waiting for a busy
// victim would make a transfer late: the time now, the deadline of the
// access it serves, and the transfer time from issue to landing (every
// hop). A demand has no deadline to keep: it evicts what it can at once.
type urgency struct {
	now, deadline, need time.Duration
}

// lateIfWait reports whether waiting for the busy victim v (of tier t)
// would make the transfer u describes land after its deadline: v is
// predicted to be free when the access using it ends (the next access to
// begin, p.t0), when its last use at or before g ends, and when a move
// that reads or fills it lands; the transfer can start only then. Only a
// wait that delays it counts: free must be later than now (a transfer late
// even if issued now gains nothing from a worse victim).
func (p *Planner) lateIfWait(v *victim, t shard.Tier, u urgency) bool {
	if p.opts.WaitForVictim {
		return false
	}
	ks := &p.keys[v.s]
	free := u.now
	if ks.pins[t] > 0 && p.t0 > free {
		free = p.t0
	}
	if v.before {
		if e := p.t0 + p.computeUntil(v.use+1); e > free {
			free = e
		}
	}
	if ks.copies[t] == incoming || ks.sources[t] > 0 {
		var x time.Duration // the slowest link into or out of t
		for _, o := range []shard.Tier{t - 1, t + 1} {
			if o < 0 || int(o) >= shard.TierCount {
				continue
			}
			for _, l := range [][2]shard.Tier{{o, t}, {t, o}} {
				if k, ok := shard.LinkOf(l[0], l[1]); ok {
					x = max(x, p.opts.TransferTime(k, ks.linkBytes()))
				}
			}
		}
		if e := u.now + x; e > free {
			free = e
		}
	}
	// Late only because of the wait: issued now, it would land sooner
	// (when it is late even issued now, waiting costs stall only if the
	// victim frees later than now).
	return free > u.now && free+u.need > u.deadline
}

// victimOrder yields vs in victimFirst order, sorting lazily with a heap: vs[:heapN]
// is a heap whose root comes first; popped victims fill vs from the end.
type victimOrder struct {
	vs    []victim
	heapN int
}

func (o *victimOrder) heapify() {
	for i := o.heapN/2 - 1; i >= 0; i-- {
		o.down(i)
	}
}

func (o *victimOrder) down(i int) {
	vs, n := o.vs, o.heapN
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		j := l
		if r := l + 1; r < n && victimFirst(&vs[r], &vs[l]) {
			j = r
		}
		if !victimFirst(&vs[j], &vs[i]) {
			return
		}
		vs[i], vs[j] = vs[j], vs[i]
		i = j
	}
}

// at returns the i-th victim in order.
func (o *victimOrder) at(i int) victim {
	k := len(o.vs)
	for k-1-i < o.heapN {
		o.heapN--
		o.vs[0], o.vs[o.heapN] = o.vs[o.heapN], o.vs[0]
		o.down(0)
	}
	return o.vs[k-1-i]
}

// evictClean frees the clean copy of s in t (pool pi).
func (p *Planner) evictClean(s int32, t shard.Tier, pi int) {
	ks := &p.keys[s]
	ks.ver++
	p.setCopy(s, t, absent)
	p.used[pi] -= ks.sizes[t]
	to := t + 1
	for int(to) < shard.TierCount && ks.copies[to] == absent {
		to++
	}
	p.emit(shard.Move{Key: ks.key, From: t, To: to, SizeBytes: ks.linkBytes(), Reason: shard.Evict})
}

// willBeDirty reports whether the copy of s in t, busy now, will need a
// write-back once free: it holds data no slower copy has and no
// write-behind of it is under way, or an access in use will write it.
func (p *Planner) willBeDirty(s int32, t shard.Tier) bool {
	ks := &p.keys[s]
	if ks.copies[t] == incoming {
		return false
	}
	for _, u := range p.inUse {
		if u.slot == s && u.tier == t && u.kind != shard.Read {
			return t != ks.home
		}
	}
	return ks.sources[t] == 0 && p.needsWriteBack(s, t)
}

// writesBefore reports whether an access predicted to begin before the one
// at global index g writes the copy of s in t, which then needs a
// write-back (t is not its home) before it can be evicted for g.
func (p *Planner) writesBefore(s int32, t shard.Tier, g int64) bool {
	n := int64(len(p.trace))
	ks := &p.keys[s]
	if n == 0 || p.diverged || t == ks.home {
		return false
	}
	cur := p.stepBase + int64(p.pos)
	for cyc := int64(0); p.stepBase+cyc*n < g; cyc++ {
		for _, o := range ks.occ {
			gi := p.stepBase + cyc*n + int64(o)
			if gi < cur {
				continue
			}
			if gi >= g {
				return false
			}
			if a := p.trace[o]; a.kind != shard.Read && a.tier == t {
				return true
			}
		}
	}
	return false
}

// needsWriteBack reports whether the copy in t holds data that no other
// copy has. A faster valid copy counts too (write-back caching): the new
// param the optimizer writes in host memory and then uploads to HBM needs
// no NVMe write to leave host memory; the HBM copy carries the data, and
// is written back (through host) only if it is evicted in turn. The store
// drops such a copy without writing it (Evict keeps what survives elsewhere).
// Only a faster copy in a pool the trace does not overflow counts: in one
// it does (an HBM tier smaller than the params), the faster copy is
// evicted before the shard is written again, and then its write-back
// (through t, one hop more) lands on the critical path of the transfer
// that needs its room, where the write-behind of the copy in t is hidden.
func (p *Planner) needsWriteBack(s int32, t shard.Tier) bool {
	ks := &p.keys[s]
	if !ks.dirty {
		return false
	}
	for u := shard.Tier(0); int(u) < shard.TierCount; u++ {
		if u == t || !p.valid(s, u) {
			continue
		}
		if u < t && len(p.trace) > 0 {
			if pi := p.poolOf(s, u); pi < len(p.overflow) && p.overflow[pi] {
				continue
			}
		}
		return false
	}
	return true
}

// nextUse is the global index of the first access at or after from (from < 0:
// the next access to begin) that needs the copy of s in t: one that needs it
// in t, or in a faster tier when no faster copy exists. A Write before that
// ends the copy's usefulness. never when there is none within a cycle.
func (p *Planner) nextUse(s int32, t shard.Tier, from int64) int64 {
	n := int64(len(p.trace))
	ks := &p.keys[s]
	fasterHeld := false
	for u := shard.Tier(0); u < t; u++ {
		if ks.copies[u] == present || ks.copies[u] == incoming {
			fasterHeld = true
		}
	}
	if from < 0 {
		// A started access still waiting for this copy (or for it as its staging source).
		for _, w := range p.pending {
			if w.slot == s && w.kind != shard.Write && (w.tier == t || (!fasterHeld && w.tier < t)) {
				return w.g
			}
		}
	}
	if n == 0 {
		return never
	}
	cur := p.stepBase + int64(p.pos)
	if from < cur {
		from = cur
	}
	// Scan from the next access, one cycle past from.
	off := int64(p.pos)
	for cyc := int64(0); ; cyc++ {
		for _, i := range ks.occ {
			g := p.stepBase + cyc*n + int64(i)
			if cyc == 0 && int64(i) < off {
				continue
			}
			if g >= p.limit || g >= from+n {
				return never
			}
			a := p.trace[i]
			if a.kind == shard.Write {
				return never
			}
			if g >= from && (a.tier == t || (!fasterHeld && a.tier < t)) {
				return g
			}
		}
		if p.stepBase+cyc*n >= from+n || len(ks.occ) == 0 {
			return never
		}
	}
}
