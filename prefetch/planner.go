package prefetch

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/strata-ai/strata/internal/shard"
)

// Reason says why a Move exists (shard.Reason: the store executes a
// planned move by the same reason).
type Reason = shard.Reason

const (
	// Prefetch copies a shard one tier toward where a predicted access
	// needs it, or (write-behind) a dirty copy toward its home.
	Prefetch = shard.Prefetch
	// Demand copies a shard for an access that has already started (a miss).
	Demand = shard.Demand
	// Evict frees a clean copy; a valid copy remains in a slower tier (To).
	Evict = shard.Evict
	// WriteBack copies a dirty copy one tier down (From -> To) and then
	// frees the From copy.
	WriteBack = shard.WriteBack
	// Alloc reserves space in To for an access of kind Write.
	Alloc = shard.Alloc
)

// Move is one instruction to the store: shard.Move, the type tier
// executes, so a planned move is submitted as it is.
type Move = shard.Move

// Stats are the planner's counters since New.
type Stats struct {
	Accesses int64
	Hits     int64 // the shard was ready in the access tier when the access began
	Late     int64 // a prefetch was under way but had not landed
	Misses   int64 // nothing was under way: demand fetch (or a write that had to wait for room)
	// Divergences counts steps whose accesses differed from the trace;
	// Rerecords counts traces replaced because of that.
	Divergences int64
	Rerecords   int64
	Bytes       [LinkCount]int64 // bytes put on each link (all ranks)
	MoveCount   [Alloc + 1]int64 // moves issued, by reason
	// WriteBehinds counts the Prefetch moves that were write-behinds
	// (Move.WriteBehind); they are in MoveCount[Prefetch] too.
	WriteBehinds int64
	// LateVictims counts the times a prefetch evicted the best victim
	// free now instead of waiting for Belady's busy one, because waiting
	// would have made it land after its deadline (Options.WaitForVictim).
	LateVictims int64
	// Stall is the time accesses waited for their shard, by access tier.
	Stall [shard.TierCount]time.Duration
}

// HitRate is hits over accesses (1 when there were none).
func (s Stats) HitRate() float64 {
	if s.Accesses == 0 {
		return 1
	}
	return float64(s.Hits) / float64(s.Accesses)
}

type copyState uint8

const (
	absent copyState = iota
	reserved
	incoming
	present
)

const never = int64(math.MaxInt64)

type keyState struct {
	key       shard.Key
	sizeBytes int64
	home      shard.Tier
	copies    [shard.TierCount]copyState
	dirty     bool // the home copy is older than the newest one
	pins      [shard.TierCount]int32
	sources   [shard.TierCount]int32 // in-flight moves reading this copy
	leaving   [shard.TierCount]bool  // a write-back of this copy is in flight
	behind    [shard.TierCount]bool  // a write-behind of this copy is in flight
	stale     [shard.TierCount]bool  // overwritten elsewhere: drop when free
	lastUse   int64
	version   uint32  // bumped by every write
	occ       []int32 // positions in the trace
	hbmPool   int32   // index of its HBM pool; 0 until known
	// ver changes with copies, stale, leaving or dirty: what chain reads.
	ver uint32
}

// chainMemo is the result of chain for one (shard, tier, write or not),
// valid while the shard's ver is ver-1.
type chainMemo struct {
	ver uint32
	ok  bool
	c   cand
}

type taccess struct {
	slot    int32
	tier    shard.Tier
	kind    Kind
	compute time.Duration
}

type pending struct {
	slot  int32
	tier  shard.Tier
	kind  Kind
	g     int64
	start time.Duration
	rec   int
}

type use struct {
	slot int32
	tier shard.Tier
	kind Kind
}

type flight struct {
	m       Move
	slot    int32
	version uint32 // of the shard when the transfer was issued
	link    int    // link instance (see hop)
}

// Planner is the online planner the engine drives. It is not safe for
// concurrent use; the engine calls it from one goroutine.
type Planner struct {
	opts    Options
	keys    []keyState
	index   map[shard.Key]int32
	pools   map[poolID]int
	poolIDs []poolID // by pool index
	used    []int64
	budget  []int64
	names   []string

	trace     []taccess
	known     Trace
	stepBase  int64 // global index of the first access of this step
	pos       int   // accesses begun in this step
	diverged  bool
	rec       Recorder
	lastReady time.Duration // when the latest access became ready
	lastPos   int           // trace position of the latest access, -1 if none or unknown
	readyKnow bool

	pending  []pending
	inUse    []use
	inflight map[uint64]flight
	nextID   uint64
	outbox   []Move
	limit    int64 // accesses beyond this global index never happen (simulation); never = no limit

	wakeAt  time.Duration
	wakeSet bool
	stats   Stats

	// Scratch of Next, reused to keep it free of allocation.
	cands    []cand
	refs     []hopRef
	order    []int32
	blocked  []bool
	linkNext []time.Duration
	linkSet  []bool
	victims  []victim

	// Write-behind.
	linkBusy   []int32         // planner transfers in flight per link instance
	dirtyList  []dirtyCopy     // copies made dirty by a Release, not yet cleaned
	linkDue    []time.Duration // per link instance: earliest planned start not issued
	overflow   []bool          // per pool: the trace needs more than its budget
	cum        []time.Duration // cum[i]: compute of trace accesses 0..i-1
	t0         time.Duration   // predicted start of the next access (last candidates)
	seenGen    []uint32        // per (slot, tier): candidates() generation that saw it
	writerGen  []uint32        // per slot: generation that recorded a write
	writerTier []shard.Tier
	gen        uint32
	memo       []chainMemo // per (slot, tier, write): chain's last answer

	freeOK   []bool  // per candidate: fits free room (markFree)
	freeNeed []int64 // per pool, scratch of markFree
	freeStop []bool

	// planned: the candidate list (p.cands, with its ALAP starts, planned
	// for p.t0) is what candidates() would build now, up to a shift of
	// time: nothing happened since it was built but the moves it issued.
	planned bool

	// hist holds the compute times of the last Options.ComputeSteps traces
	// of the same accesses (see keepHistory), oldest first.
	hist [][]time.Duration
}

type poolID struct {
	tier shard.Tier
	rank int32 // only for HBM
}

// New returns a planner for the shards of res, starting in recording mode
// (every access on demand) until SetTrace or the end of the first step.
func New(res Residency, opts Options) (*Planner, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	p := &Planner{
		opts:     opts,
		index:    make(map[shard.Key]int32, len(res)),
		pools:    map[poolID]int{},
		inflight: map[uint64]flight{},
		limit:    never,
		lastPos:  -1,
	}
	keys := make([]shard.Key, 0, len(res))
	for k := range res {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keyLess(keys[i], keys[j]) })
	p.pool(shard.Host, 0)
	p.pool(shard.NVMe, 0)
	for _, k := range keys {
		pl := res[k]
		if pl.SizeBytes <= 0 {
			return nil, fmt.Errorf("prefetch: %s: size %d B is not positive", k, pl.SizeBytes)
		}
		if pl.Home >= shard.Tier(shard.TierCount) {
			return nil, fmt.Errorf("prefetch: %s: unknown home tier %d", k, pl.Home)
		}
		ks := keyState{key: k, sizeBytes: pl.SizeBytes, home: pl.Home, lastUse: -1}
		for t := shard.Tier(0); int(t) < shard.TierCount; t++ {
			if t == pl.Home || pl.Cached.Has(t) {
				ks.copies[t] = present
				p.used[p.pool(t, k.Rank)] += pl.SizeBytes
			}
		}
		p.index[k] = int32(len(p.keys))
		p.keys = append(p.keys, ks)
	}
	for i, u := range p.used {
		if b := p.budget[i]; b > 0 && u > b {
			return nil, fmt.Errorf("prefetch: the starting residency puts %d B in %s, over its budget of %d B", u, p.names[i], b)
		}
	}
	return p, nil
}

func keyLess(a, b shard.Key) bool {
	if a.Chunk != b.Chunk {
		return a.Chunk < b.Chunk
	}
	if a.Rank != b.Rank {
		return a.Rank < b.Rank
	}
	return a.State < b.State
}

func (p *Planner) pool(t shard.Tier, rank int32) int {
	id := poolID{tier: t}
	if t == shard.HBM {
		id.rank = rank
	}
	if i, ok := p.pools[id]; ok {
		return i
	}
	i := len(p.used)
	p.pools[id] = i
	p.poolIDs = append(p.poolIDs, id)
	p.used = append(p.used, 0)
	p.budget = append(p.budget, p.opts.BudgetBytes[t])
	name := t.String()
	if t == shard.HBM {
		name = fmt.Sprintf("hbm of rank %d", rank)
	}
	p.names = append(p.names, name)
	return i
}

func (p *Planner) poolOf(s int32, t shard.Tier) int {
	switch t {
	case shard.Host:
		return 0 // made first by New
	case shard.NVMe:
		return 1
	}
	ks := &p.keys[s]
	if ks.hbmPool == 0 { // 0 is the host pool: not known yet
		ks.hbmPool = int32(p.pool(shard.HBM, ks.key.Rank))
	}
	return int(ks.hbmPool)
}

// SetTrace loads a known trace: planning starts at the next access. It fails,
// naming the shard and the budget, when an access cannot fit at all.
func (p *Planner) SetTrace(tr Trace) error {
	if err := p.checkTrace(tr); err != nil {
		return err
	}
	p.planned = false
	p.adopt(tr)
	return nil
}

func (p *Planner) checkTrace(tr Trace) error {
	if err := tr.Validate(); err != nil {
		return err
	}
	for i, a := range tr.Accesses {
		if err := p.checkAccess(a); err != nil {
			return fmt.Errorf("%w (trace access %d)", err, i)
		}
	}
	return nil
}

func (p *Planner) checkAccess(a Access) error {
	s, ok := p.index[a.Key]
	if !ok {
		return fmt.Errorf("prefetch: %s has no placement", a.Key)
	}
	ks := &p.keys[s]
	if a.Tier != shard.HBM && a.Tier != shard.Host {
		return fmt.Errorf("prefetch: %s: compute cannot use a shard in %s", a.Key, a.Tier)
	}
	if a.SizeBytes != 0 && a.SizeBytes != ks.sizeBytes {
		return fmt.Errorf("prefetch: %s: access of %d B, placement says %d B", a.Key, a.SizeBytes, ks.sizeBytes)
	}
	// The access tier, and every tier a read passes through, must hold it.
	lo, hi := a.Tier, a.Tier
	if a.Kind != Write {
		hi = ks.home
	}
	for t := lo; t <= hi; t++ {
		i := p.poolOf(s, t)
		if b := p.budget[i]; b > 0 && ks.sizeBytes > b {
			return fmt.Errorf("prefetch: %s (%d B) does not fit the %s budget of %d B", a.Key, ks.sizeBytes, p.names[i], b)
		}
	}
	return nil
}

func (p *Planner) adopt(tr Trace) {
	p.keepHistory(tr)
	p.known = Trace{Accesses: append([]Access(nil), tr.Accesses...)}
	p.trace = p.trace[:0]
	for i := range p.keys {
		p.keys[i].occ = p.keys[i].occ[:0]
	}
	p.cum = append(p.cum[:0], 0)
	for i, a := range tr.Accesses {
		s := p.index[a.Key]
		c := a.Compute
		for _, h := range p.hist {
			c = min(c, h[i])
		}
		p.trace = append(p.trace, taccess{slot: s, tier: a.Tier, kind: a.Kind, compute: c})
		p.keys[s].occ = append(p.keys[s].occ, int32(i))
		p.cum = append(p.cum, p.cum[i]+c)
	}
	p.footprint()
}

// keepHistory records the compute times of tr among the last
// Options.ComputeSteps traces of the same accesses (a trace with other
// accesses starts the history again). adopt plans each access with the
// shortest of them: compute measured on a busy machine varies from step to
// step, and a deadline predicted too late makes a prefetch late, while one
// predicted too early only holds its room a little longer.
func (p *Planner) keepHistory(tr Trace) {
	same := len(tr.Accesses) == len(p.known.Accesses)
	for i := 0; same && i < len(tr.Accesses); i++ {
		same = p.known.Accesses[i].SameSlot(tr.Accesses[i])
	}
	if !same {
		p.hist = p.hist[:0]
	}
	n := p.opts.ComputeSteps
	if n == 0 {
		n = 4
	}
	var h []time.Duration
	for len(p.hist) >= n { // reuse the oldest one's slice
		h = p.hist[0][:0]
		p.hist = append(p.hist[:0], p.hist[1:]...)
	}
	for _, a := range tr.Accesses {
		h = append(h, a.Compute)
	}
	p.hist = append(p.hist, h)
}

// footprint marks the pools whose budget is smaller than what the trace
// would keep in them if nothing were ever evicted: the homes there plus one
// copy of every shard an access needs there or stages through there. Only
// in those pools can a dirty copy have to be evicted, so only there is a
// write-behind worth its link time.
func (p *Planner) footprint() {
	fp := make([]int64, len(p.used))
	seen := make(map[[2]int32]bool)
	addTo := func(s int32, t shard.Tier) {
		pi := p.poolOf(s, t)
		for pi >= len(fp) {
			fp = append(fp, 0)
		}
		if t == p.keys[s].home || seen[[2]int32{s, int32(t)}] {
			return
		}
		seen[[2]int32{s, int32(t)}] = true
		fp[pi] += p.keys[s].sizeBytes
	}
	for i := range p.keys {
		ks := &p.keys[i]
		for t := shard.Tier(0); int(t) < shard.TierCount; t++ {
			if t == ks.home || ks.copies[t] != absent {
				pi := p.poolOf(int32(i), t)
				for pi >= len(fp) {
					fp = append(fp, 0)
				}
				fp[pi] += ks.sizeBytes
				seen[[2]int32{int32(i), int32(t)}] = true
			}
		}
	}
	for _, a := range p.trace {
		addTo(a.slot, a.tier)
		if a.kind != Write {
			for t := a.tier + 1; t < p.keys[a.slot].home; t++ {
				addTo(a.slot, t)
			}
		}
	}
	p.overflow = make([]bool, len(fp))
	for pi, f := range fp {
		p.overflow[pi] = pi < len(p.budget) && p.budget[pi] > 0 && f > p.budget[pi]
	}
}

// computeUntil is the modeled compute from the next access to begin up to
// the start of the access at global index g (g at or after it).
func (p *Planner) computeUntil(g int64) time.Duration {
	n := int64(len(p.trace))
	cur := p.stepBase + int64(p.pos)
	if n == 0 || g <= cur {
		return 0
	}
	// Accesses cur..g-1, cyclic over the trace.
	full := (g - cur) / n
	d := time.Duration(full) * p.cum[n]
	from, to := int64(p.pos)%n, (int64(p.pos)+(g-cur)%n)%n
	if to >= from {
		d += p.cum[to] - p.cum[from]
	} else {
		d += p.cum[n] - p.cum[from] + p.cum[to]
	}
	return d
}

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
		p.emit(Move{Key: ks.key, From: t, To: down, SizeBytes: ks.sizeBytes, Reason: Prefetch, WriteBehind: true})
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
		if w.slot == s && w.kind != Read {
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
		if p.trace[o].kind != Read {
			return true
		}
	}
	return false
}

// Trace returns the trace the planner plans from.
func (p *Planner) Trace() Trace { return Trace{Accesses: append([]Access(nil), p.known.Accesses...)} }

// Stale reports whether the current step has diverged from the trace.
func (p *Planner) Stale() bool { return p.diverged }

// Stats returns the counters.
func (p *Planner) Stats() Stats { return p.stats }

// Bandwidth returns the link bandwidths the planner plans with.
func (p *Planner) Bandwidth() [LinkCount]float64 { return p.opts.BandwidthBytesPerSec }

// SetBandwidth replaces the link bandwidths the planner plans with (bytes/s,
// each positive and finite; measured ones, between steps). The next Next
// plans with them: every transfer time and latest start is recomputed.
// Transfers already issued keep their modeled completion.
func (p *Planner) SetBandwidth(bw [LinkCount]float64) error {
	o := p.opts
	o.BandwidthBytesPerSec = bw
	if err := o.Validate(); err != nil {
		return err
	}
	p.opts = o
	p.planned = false
	return nil
}

// BeginStep marks the start of a training step at time now. The accesses of
// the step that ended become the trace (their measured compute times
// refresh the deadlines; when they diverged from the trace, this is the
// re-recording).
func (p *Planner) BeginStep(now time.Duration) {
	p.planned = false
	if p.rec.Len() > 0 {
		if len(p.trace) > 0 && (p.diverged || p.pos != len(p.trace)) {
			if !p.diverged {
				p.stats.Divergences++
			}
			p.stats.Rerecords++
		}
		tr := p.rec.Finish(now)
		if p.checkTrace(tr) == nil { // accesses were checked one by one; this cannot fail
			p.adopt(tr)
		}
	}
	p.stepBase += int64(p.pos)
	p.pos = 0
	p.diverged = false
	p.lastPos = -1
}

// Access tells the planner that the compute begins to use a.Key in a.Tier
// at time now. hit is true when the shard is ready there. When it is not,
// the access may proceed once Ready(a) is true, which happens after the
// completion of a move for this key (returned now or by a later Next). The
// returned moves are what Next(now) would return. The shard stays pinned in
// a.Tier until Release. An access that differs from the trace is served on
// demand and makes the planner re-record the step. err is non-nil only when
// the access can never be served (unknown shard, larger than a budget).
func (p *Planner) Access(a Access, now time.Duration) (hit bool, moves []Move, err error) {
	if err := p.checkAccess(a); err != nil {
		return false, nil, err
	}
	s := p.index[a.Key]
	a.SizeBytes = p.keys[s].sizeBytes
	p.planned = false
	ri := p.rec.Begin(a, now)
	if len(p.trace) > 0 && !p.diverged {
		if p.pos >= len(p.trace) || !p.known.Accesses[p.pos].SameSlot(a) {
			p.diverged = true
			p.stats.Divergences++
		}
	}
	if p.diverged || len(p.trace) == 0 {
		p.lastPos = -1
	} else {
		p.lastPos = p.pos
	}
	g := p.stepBase + int64(p.pos)
	p.pos++
	p.stats.Accesses++
	ks := &p.keys[s]
	ks.lastUse = g
	ks.pins[a.Tier]++
	p.inUse = append(p.inUse, use{slot: s, tier: a.Tier, kind: a.Kind})
	if p.ready(s, a.Tier, a.Kind) {
		p.stats.Hits++
		p.rec.Ready(ri, now)
		p.lastReady, p.readyKnow = now, true
		return true, p.Next(now), nil
	}
	late := false
	if a.Kind != Write {
		for t := range ks.copies {
			if ks.copies[t] == incoming && !ks.stale[t] {
				late = true
			}
		}
	}
	p.readyKnow = false
	p.pending = append(p.pending, pending{slot: s, tier: a.Tier, kind: a.Kind, g: g, start: now, rec: ri})
	moves = p.Next(now)
	if p.ready(s, a.Tier, a.Kind) {
		// A write found room at once (Next saw it ready, with no stall).
		p.stats.Hits++
		return true, moves, nil
	}
	if late {
		p.stats.Late++
	} else {
		p.stats.Misses++
	}
	return false, moves, nil
}

// Ready reports whether access a can run: its shard is valid in a.Tier (or,
// for a Write, has room there).
func (p *Planner) Ready(a Access) bool {
	s, ok := p.index[a.Key]
	return ok && p.ready(s, a.Tier, a.Kind)
}

func (p *Planner) valid(s int32, t shard.Tier) bool {
	ks := &p.keys[s]
	// A copy being written back is on its way out: an access waits for it
	// to go and fetches it again (the store frees it when the write lands).
	return ks.copies[t] == present && !ks.stale[t] && !ks.leaving[t] && (t != ks.home || !ks.dirty)
}

func (p *Planner) ready(s int32, t shard.Tier, k Kind) bool {
	if k != Read && p.keys[s].sources[t] > 0 {
		return false // the store lets a write in only when no move reads the copy
	}
	if k == Write {
		c := p.keys[s].copies[t]
		return (c == present || c == reserved) && !p.keys[s].stale[t] && !p.keys[s].leaving[t]
	}
	return p.valid(s, t)
}

// Release ends the access of key begun by the oldest unreleased Access of
// it. For Update and Write it makes that copy the newest one: other copies
// become stale and are evicted by the next Next.
func (p *Planner) Release(key shard.Key, now time.Duration) {
	s, ok := p.index[key]
	i := -1
	if ok {
		for j, u := range p.inUse {
			if u.slot == s {
				i = j
				break
			}
		}
	}
	if i < 0 {
		panic(fmt.Sprintf("prefetch: release of %s, which is not in use", key))
	}
	u := p.inUse[i]
	p.planned = false
	p.inUse = append(p.inUse[:i], p.inUse[i+1:]...)
	ks := &p.keys[s]
	ks.pins[u.tier]--
	if u.kind != Read && (ks.copies[u.tier] == present || ks.copies[u.tier] == reserved) && !ks.stale[u.tier] {
		ks.ver++
		ks.copies[u.tier] = present
		ks.dirty = u.tier != ks.home
		if ks.dirty {
			p.dirtyList = append(p.dirtyList, dirtyCopy{s, u.tier})
		}
		ks.version++
		for t := shard.Tier(0); int(t) < shard.TierCount; t++ {
			if t != u.tier && t != ks.home && ks.copies[t] == present {
				ks.stale[t] = true // copies in flight are judged by version when they land
			}
		}
	}
	for t := shard.Tier(0); int(t) < shard.TierCount; t++ {
		p.dropStale(s, t)
	}
}

// dropStale frees a stale copy once nothing holds it.
func (p *Planner) dropStale(s int32, t shard.Tier) {
	ks := &p.keys[s]
	if !ks.stale[t] || t == ks.home || ks.pins[t] > 0 || ks.sources[t] > 0 || ks.leaving[t] || ks.copies[t] == incoming {
		return
	}
	ks.ver++
	ks.stale[t] = false
	if ks.copies[t] == absent {
		return
	}
	ks.copies[t] = absent
	p.used[p.poolOf(s, t)] -= ks.sizeBytes
	p.emit(Move{Key: ks.key, From: t, To: ks.home, SizeBytes: ks.sizeBytes, Reason: Evict})
}

// Completed tells the planner that a transfer it issued has finished.
func (p *Planner) Completed(m Move, now time.Duration) {
	f, ok := p.inflight[m.ID]
	if !ok {
		panic(fmt.Sprintf("prefetch: completion of unknown move %d (%s)", m.ID, m))
	}
	delete(p.inflight, m.ID)
	p.planned = false
	p.linkBusy[f.link]--
	s := f.slot
	ks := &p.keys[s]
	m = f.m
	ks.ver++
	ks.sources[m.From]--
	if m.WriteBehind {
		ks.behind[m.From] = false
	}
	switch m.Reason {
	case WriteBack:
		ks.leaving[m.From] = false
		ks.copies[m.From] = absent
		ks.stale[m.From] = false
		p.used[p.poolOf(s, m.From)] -= ks.sizeBytes
		ks.copies[m.To] = present
		if m.To == ks.home {
			ks.dirty = false
		}
	default:
		ks.copies[m.To] = present
		if f.version != ks.version {
			ks.stale[m.To] = m.To != ks.home // the shard was rewritten while this copy travelled
		} else if m.To == ks.home {
			ks.dirty = false
		}
	}
	p.dropStale(s, m.From)
	p.dropStale(s, m.To)
	p.checkPending(now)
}

func (p *Planner) checkPending(now time.Duration) {
	j := 0
	for _, w := range p.pending {
		if p.ready(w.slot, w.tier, w.kind) {
			p.stats.Stall[w.tier] += now - w.start
			p.rec.Ready(w.rec, now)
			if w.rec == p.rec.Len()-1 {
				p.lastReady, p.readyKnow = now, true
			}
			continue
		}
		p.pending[j] = w
		j++
	}
	p.pending = p.pending[:j]
}

// track records the transfer just emitted as in flight on link instance link.
func (p *Planner) track(s int32, link int, version uint32) {
	p.inflight[p.nextID] = flight{m: p.outbox[len(p.outbox)-1], slot: s, version: version, link: link}
	for link >= len(p.linkBusy) {
		p.linkBusy = append(p.linkBusy, 0)
	}
	p.linkBusy[link]++
}

func (p *Planner) emit(m Move) {
	p.nextID++
	m.ID = p.nextID
	p.stats.MoveCount[m.Reason]++
	if l, ok := m.Link(); ok {
		p.stats.Bytes[l] += m.SizeBytes
	}
	p.outbox = append(p.outbox, m)
}

// WakeAt is the earliest time at which Next would issue a move that is not
// due yet; false when nothing waits on time (only on completions or accesses).
func (p *Planner) WakeAt() (time.Duration, bool) { return p.wakeAt, p.wakeSet }

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
func (p *Planner) Next(now time.Duration) []Move {
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
	order := p.order[:0]
	p.wakeSet = false
	for i := range cands {
		c := &cands[i]
		if !c.ready {
			continue
		}
		if st := c.firstStart(); st > now && !c.demand && !p.eager(c) && !p.freeOK[i] {
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
	p.order = order
	if len(p.blocked) < len(p.used) {
		p.blocked = make([]bool, len(p.used))
	}
	blocked := p.blocked
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
				p.blocked = blocked
			}
			if blocked[pi] {
				continue
			}
			evictions := p.stats.MoveCount[Evict] + p.stats.MoveCount[WriteBack]
			u := urgency{now: now, deadline: c.deadline}
			for h := 0; h < c.nhops; h++ {
				u.need += c.hops[h].xfer
			}
			ok := p.makeRoom(pi, p.keys[c.slot].sizeBytes, c.g, c.demand, u)
			if ok {
				p.issue(c)
			} else {
				blocked[pi] = true
			}
			if p.stats.MoveCount[Evict]+p.stats.MoveCount[WriteBack] != evictions {
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
	if cap(p.freeOK) < len(cands) {
		p.freeOK = make([]bool, len(cands))
	}
	p.freeOK = p.freeOK[:len(cands)]
	clear(p.freeOK)
	if p.opts.DisableEager || len(p.trace) == 0 || p.diverged {
		return
	}
	if len(p.freeNeed) < len(p.used) {
		p.freeNeed = make([]int64, len(p.used))
		p.freeStop = make([]bool, len(p.used))
	}
	need, stop := p.freeNeed[:len(p.used)], p.freeStop[:len(p.used)]
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
			need[pi] += ks.sizeBytes
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
		p.freeOK[i] = ok
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
		ks.copies[c.tier] = reserved
		ks.stale[c.tier] = false
		p.used[p.poolOf(c.slot, c.tier)] += ks.sizeBytes
		p.emit(Move{Key: ks.key, From: c.tier, To: c.tier, SizeBytes: ks.sizeBytes, Reason: Alloc})
		return
	}
	h := c.hops[0]
	reason := Prefetch
	if c.demand {
		reason = Demand
	}
	ks.copies[h.to] = incoming
	ks.stale[h.to] = false
	ks.sources[h.from]++
	if h.to != ks.home {
		p.used[p.poolOf(c.slot, h.to)] += ks.sizeBytes
	}
	p.emit(Move{Key: ks.key, From: h.from, To: h.to, SizeBytes: ks.sizeBytes, Reason: reason})
	p.track(c.slot, h.link, ks.version)
}

// candidates lists the accesses that need a move: the started ones waiting
// (demand), then the predicted ones within the window, each (shard, tier) once.
// The list lives in p.cands and is valid until the next call.
func (p *Planner) candidates(now time.Duration) []cand {
	out := p.cands[:0]
	p.gen++
	if p.gen == 0 { // wrapped: clear the stamps
		clear(p.seenGen)
		clear(p.writerGen)
		p.gen = 1
	}
	gen := p.gen
	if len(p.seenGen) < len(p.keys)*shard.TierCount {
		p.seenGen = make([]uint32, len(p.keys)*shard.TierCount)
		p.memo = make([]chainMemo, 2*len(p.keys)*shard.TierCount)
		p.writerGen = make([]uint32, len(p.keys))
		p.writerTier = make([]shard.Tier, len(p.keys))
	}
	// writer[s] is the tier of a write to s that comes first: a copy
	// fetched elsewhere before it lands would be stale.
	for _, u := range p.inUse {
		if u.kind != Read {
			p.writerGen[u.slot], p.writerTier[u.slot] = gen, u.tier
		}
	}
	add := func(s int32, t shard.Tier, k Kind, g int64, deadline time.Duration, demand bool) {
		id := int(s)*shard.TierCount + int(t)
		written := p.writerGen[s] == gen
		wt := p.writerTier[s]
		if k != Read && !written {
			p.writerGen[s], p.writerTier[s] = gen, t
		}
		if p.seenGen[id] == gen {
			return
		}
		p.seenGen[id] = gen
		mi := 2 * id
		if k == Write {
			mi++
		}
		m := &p.memo[mi]
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
	w := p.opts.Window
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
		add(a.slot, a.tier, a.kind, g, d, false)
		d += a.compute
		if i++; i == n {
			i = 0
		}
	}
	p.cands = out
	return out
}

// chain builds the transfers that bring slot into t, or reports that none is
// needed (already there or on its way).
func (p *Planner) chain(s int32, t shard.Tier, k Kind) (cand, bool) {
	ks := &p.keys[s]
	c := cand{slot: s, tier: t}
	if k == Write {
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
	l, ok := LinkOf(from, to)
	if !ok {
		panic(fmt.Sprintf("prefetch: no link %s->%s", from, to))
	}
	inst := int(l)
	if from == shard.HBM || to == shard.HBM {
		inst = LinkCount * (1 + p.poolOf(s, shard.HBM))
		inst += int(l)
	}
	return hop{from: from, to: to, link: inst, xfer: p.opts.TransferTime(l, p.keys[s].sizeBytes)}
}

// alap gives every hop its latest start: each link serves its hops one at a
// time, the last hop of a chain must land by deadline-slack, an earlier hop
// by the start of the next. Hops into HBM first, then into Host.
func (p *Planner) alap(cands []cand) {
	if n := LinkCount * (1 + len(p.used)); len(p.linkNext) < n {
		p.linkNext = make([]time.Duration, n)
		p.linkSet = make([]bool, n)
	}
	for _, into := range []shard.Tier{shard.HBM, shard.Host} {
		refs := p.refs[:0]
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
		clear(p.linkSet)
		for _, r := range refs {
			h := &cands[r.c].hops[r.h]
			f := h.finish
			if p.linkSet[h.link] && p.linkNext[h.link] < f {
				f = p.linkNext[h.link]
			}
			h.start = f - h.xfer
			p.linkNext[h.link], p.linkSet[h.link] = h.start, true
		}
		p.refs = refs
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

type dirtyCopy struct {
	slot int32
	tier shard.Tier
}

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
func (p *Planner) makeRoom(pi int, size int64, g int64, demand bool, u urgency) bool {
	b := p.budget[pi]
	if b == 0 || p.used[pi]+size <= b {
		return true
	}
	id := p.poolIDs[pi]
	t := id.tier
	var leaving int64
	base := len(p.victims) // makeRoom recurses: each call owns the tail it appended
	defer func() { p.victims = p.victims[:base] }()
	for i := range p.keys {
		ks := &p.keys[i]
		if t == shard.HBM && ks.key.Rank != id.rank {
			continue
		}
		if ks.leaving[t] {
			leaving += ks.sizeBytes
			continue
		}
		if t == ks.home || ks.stale[t] || (ks.copies[t] != present && ks.copies[t] != incoming) {
			continue
		}
		v := victim{s: int32(i), next: p.nextUse(int32(i), t, -1)}
		v.evictable = ks.copies[t] == present && ks.pins[t] == 0 && ks.sources[t] == 0 && v.next > g
		if v.next <= g {
			v.before = true
			v.use = v.next
			v.next = p.nextUse(int32(i), t, g+1)
		}
		if v.evictable {
			v.dirty = p.needsWriteBack(int32(i), t)
		}
		p.victims = append(p.victims, v)
	}
	vs := p.victims[base:]
	if p.used[pi]-leaving+size <= b {
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
	late := false // a busy victim was passed over because waiting is late
	defer func(evictions int64) {
		if late && p.stats.MoveCount[Evict]+p.stats.MoveCount[WriteBack] != evictions {
			p.stats.LateVictims++
		}
	}(p.stats.MoveCount[Evict] + p.stats.MoveCount[WriteBack])
	if !p.opts.DisableWriteBehind {
		// With write-behind, a clean victim is taken before a dirty one
		// and a prefetch does not wait for a busy victim that will still
		// be dirty when free: either would put an NVMe or PCIe write on
		// the critical path, which costs more than a fetch of a shard
		// that Belady would have kept (fetches are prefetched and hidden).
		waited := false
		for i := range vs {
			v := vo.at(i)
			if p.used[pi]-leaving+size <= b {
				break
			}
			if !v.evictable {
				if demand || p.willBeDirty(v.s, t) || p.keys[v.s].behind[t] || (v.before && p.writesBefore(v.s, t, g)) {
					// Waiting for a copy under write-behind, or for one
					// that an access before g will update (it would then
					// need a write first), would make this prefetch late
					// (it is due now); the next clean victim is as good:
					// it is written already.
					continue
				}
				if p.lateIfWait(&v, t, u) {
					late = true // see lateIfWait
					continue
				}
				waited = true
				break
			}
			if v.dirty {
				continue
			}
			p.evictClean(v.s, t, pi)
		}
		if waited || p.used[pi]-leaving+size <= b {
			return p.used[pi]+size <= b
		}
	}
	for i := range vs {
		if p.used[pi]-leaving+size <= b {
			break
		}
		v := vo.at(i)
		if !v.evictable {
			if demand {
				continue
			}
			if p.lateIfWait(&v, t, u) {
				late = true
				continue
			}
			break // Belady's victim is busy or needed first: wait for it
		}
		ks := &p.keys[v.s]
		if ks.copies[t] != present {
			continue // evicted by the first pass
		}
		if !v.dirty {
			p.evictClean(v.s, t, pi)
			continue
		}
		down := t + 1
		if late && !demand {
			// Past a victim skipped because waiting for it is late, a
			// dirty one is taken only if its write-back still lets the
			// transfer land by the deadline.
			if l, ok := LinkOf(t, down); !ok || u.now+p.opts.TransferTime(l, ks.sizeBytes)+u.need > u.deadline {
				continue
			}
		}
		if down != ks.home {
			if ks.copies[down] != absent {
				continue
			}
			if !p.makeRoom(p.poolOf(v.s, down), ks.sizeBytes, g, demand, u) {
				continue
			}
			p.used[p.poolOf(v.s, down)] += ks.sizeBytes
		}
		ks.ver++
		ks.copies[down] = incoming
		if down == ks.home {
			ks.copies[down] = present // the home copy stays allocated; it is invalid until the write-back lands
		}
		ks.leaving[t] = true
		ks.sources[t]++
		leaving += ks.sizeBytes
		p.emit(Move{Key: ks.key, From: t, To: down, SizeBytes: ks.sizeBytes, Reason: WriteBack})
		p.track(v.s, p.hop(v.s, t, down).link, ks.version)
	}
	return p.used[pi]+size <= b
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
				if k, ok := LinkOf(l[0], l[1]); ok {
					x = max(x, p.opts.TransferTime(k, ks.sizeBytes))
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
	ks.copies[t] = absent
	p.used[pi] -= ks.sizeBytes
	to := t + 1
	for int(to) < shard.TierCount && ks.copies[to] == absent {
		to++
	}
	p.emit(Move{Key: ks.key, From: t, To: to, SizeBytes: ks.sizeBytes, Reason: Evict})
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
		if u.slot == s && u.tier == t && u.kind != Read {
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
			if a := p.trace[o]; a.kind != Read && a.tier == t {
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
func (p *Planner) needsWriteBack(s int32, t shard.Tier) bool {
	ks := &p.keys[s]
	if !ks.dirty {
		return false
	}
	for u := shard.Tier(0); int(u) < shard.TierCount; u++ {
		if u != t && p.valid(s, u) {
			return false
		}
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
			if w.slot == s && w.kind != Write && (w.tier == t || (!fasterHeld && w.tier < t)) {
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
			if a.kind == Write {
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
