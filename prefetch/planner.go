package prefetch

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/strata-ai/strata/shard"
)

// Stats are the planner's counters since New.
type Stats struct {
	Accesses int64
	Hits     int64 // the shard was ready in the access tier when the access began
	Late     int64 // a prefetch was under way but had not landed
	Misses   int64 // nothing was under way: demand fetch (or a write that had to wait for room)
	// RoomWaits counts the Misses that were writes: the shard needed room
	// in the access tier (its copy there made, or a victim written back)
	// and none was free when the access began.
	RoomWaits int64
	// Dependent counts the reads that waited for a prefetch issued as
	// soon as its data existed: the copy it makes was written by an
	// access that ended just before (cpuadam's new param, read by the
	// next forward as the update pipeline hands it over), or landed from
	// such a move, and the planner issued the move at once, on a link
	// with nothing else of its in flight. No plan could have had them
	// ready; they are not Late, and HitRate leaves them out (their wait
	// is in Stall).
	Dependent int64
	// Skipped counts the conditional accesses a step passed over (Skip).
	Skipped int64
	// Divergences counts steps whose accesses differed from the trace;
	// Rerecords counts traces replaced because of that.
	Divergences int64
	Rerecords   int64
	Bytes       [shard.LinkCount]int64 // bytes put on each link (all ranks)
	MoveCount   [shard.Alloc + 1]int64 // moves issued, by reason
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

// HitRate is hits over the accesses a prefetch could have served: all
// but the Dependent ones (1 when there were none).
func (s Stats) HitRate() float64 {
	return HitRate(s.Hits, s.Accesses, s.Dependent)
}

// HitRate is hits over accesses less the dependent ones (1 when none is
// left): the one definition of the figure, for sums of Stats too.
func HitRate(hits, accesses, dependent int64) float64 {
	if n := accesses - dependent; n > 0 {
		return float64(hits) / float64(n)
	}
	return 1
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
	sizeBytes int64                  // the largest of sizes: an access's size
	sizes     [shard.TierCount]int64 // a copy's size in each tier (Placement.TierBytes)
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
	// member[t] is 1 + the index of this shard in the member list of its
	// pool of tier t (see setCopy); 0 when it holds no copy there or t is
	// its home.
	member [shard.TierCount]int32
	// followed: in Planner.written.
	followed bool
	// fresh[t]: copy t's data came to exist since the last Next (a write
	// released there, or an asap move landed); asap[t]: the move into t
	// now or last in flight was issued from a fresh copy (Stats.Dependent).
	fresh [shard.TierCount]bool
	asap  [shard.TierCount]bool
}

type taccess struct {
	slot    int32
	tier    shard.Tier
	kind    shard.Kind
	cond    bool // shard.Access.Conditional: planned for only once confirmed
	compute time.Duration
}

type pending struct {
	slot  int32
	tier  shard.Tier
	kind  shard.Kind
	g     int64
	start time.Duration
	rec   int // its index in the recording; -1: the recording ended (BeginStep)
}

type use struct {
	slot int32
	tier shard.Tier
	kind shard.Kind
}

type flight struct {
	m       shard.Move
	slot    int32
	version uint32 // of the shard when the transfer was issued
	link    int    // link instance (see hop)
}

// Planner is the online planner the engine drives. It is not safe for
// concurrent use; the engine calls it from one goroutine.
type Planner struct {
	opts  Options
	keys  []keyState
	index map[shard.Key]int32
	// Pools (see pool): host, NVMe, then HBM per rank as shards are seen.
	pools    map[poolID]int
	poolIDs  []poolID // by pool index
	used     []int64
	budget   []int64
	names    []string
	overflow []bool // per pool: the trace needs more than its budget
	// members lists per pool the shards holding a copy there that is not
	// their home (reserved, incoming or present): the only possible
	// victims, so that choosing one costs O(copies in the pool), not
	// O(shards).
	members [][]int32

	// The trace and where the step is in it.
	trace    []taccess
	known    Trace
	cum      []time.Duration // cum[i]: compute of trace accesses 0..i-1
	stepBase int64           // global index of the first access of this step
	pos      int             // accesses begun (or skipped) in this step
	stepGen  uint32          // bumped by every BeginStep
	// confirmed[i] == stepGen: trace access i (Conditional) is confirmed
	// in this step (Confirm), so the plan moves its shard.
	confirmed []uint32
	diverged  bool
	rec       Recorder
	lastReady time.Duration // when the latest access became ready
	lastPos   int           // trace position of the latest access, -1 if none or unknown
	readyKnow bool
	limit     int64 // accesses beyond this global index never happen (simulation); never = no limit
	window    int   // accesses the plan looks ahead (horizon), set with the trace
	// hist holds the compute times of the last Options.ComputeSteps traces
	// of the same accesses (see keepHistory), oldest first.
	hist [][]time.Duration

	// Accesses and moves under way.
	pending   []pending
	inUse     []use
	inflight  map[uint64]flight
	nextID    uint64
	outbox    []shard.Move
	linkBusy  []int32     // planner transfers in flight per link instance
	dirtyList []dirtyCopy // copies made dirty by a Release, not yet cleaned
	// written lists the shards written by a Release whose next access may
	// lie beyond the window (see followWritten).
	written []int32
	// freshList holds the copies marked fresh since the last Next, which
	// clears them.
	freshList []freshCopy

	// The plan of the last Next.
	cands   []cand
	t0      time.Duration   // predicted start of the next access (last candidates)
	linkDue []time.Duration // per link instance: earliest planned start not issued
	wakeAt  time.Duration
	wakeSet bool
	// planned: the candidate list (p.cands, with its ALAP starts, planned
	// for p.t0) is what candidates() would build now, up to a shift of
	// time: nothing happened since it was built but the moves it issued.
	planned bool

	stats   Stats
	scratch scratch
}

// scratch is what Next reuses from call to call to stay free of
// allocation: buffers whose contents do not outlive the call that fills
// them, and the memo of chain.
type scratch struct {
	refs     []hopRef        // alap: the hops into one tier
	linkNext []time.Duration // alap: per link instance, the start of its latest hop
	linkSet  []bool
	order    []int32  // dispatch: the due candidates
	blocked  []bool   // dispatch: per pool, found no room
	victims  []victim // makeRoom: each call owns the tail it appended
	freeOK   []bool   // markFree: per candidate, fits free room
	freeNeed []int64  // markFree: per pool
	freeStop []bool

	// candidates: stamps of the generation gen, so that each (slot, tier)
	// is listed once and a write found first is seen by later reads.
	seenGen    []uint32 // per (slot, tier): candidates() generation that saw it
	writerGen  []uint32 // per slot: generation that recorded a write
	writerTier []shard.Tier
	gen        uint32
	memo       []chainMemo // per (slot, tier, write): chain's last answer
	followed   []followed  // candidates: the next accesses of written shards
}

type freshCopy struct {
	slot int32
	tier shard.Tier
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
		for t := range ks.sizes {
			ks.sizes[t] = pl.SizeBytes
			if b := pl.TierBytes[t]; b > 0 {
				ks.sizes[t] = b
				ks.sizeBytes = max(ks.sizeBytes, b)
			}
		}
		for t := shard.Tier(0); int(t) < shard.TierCount; t++ {
			if t == pl.Home || pl.Cached.Has(t) {
				p.used[p.pool(t, k.Rank)] += ks.sizes[t]
			}
		}
		s := int32(len(p.keys))
		p.index[k] = s
		p.keys = append(p.keys, ks)
		for t := shard.Tier(0); int(t) < shard.TierCount; t++ {
			if t == pl.Home || pl.Cached.Has(t) {
				p.setCopy(s, t, present)
			}
		}
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

// linkBytes is what a move of the shard carries on a link: its host size
// (a coded shard moves coded; the device decodes it).
func (ks *keyState) linkBytes() int64 { return ks.sizes[shard.Host] }

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
	p.members = append(p.members, nil)
	return i
}

// setCopy sets the state of the copy of s in t and keeps the member list
// of its pool (copies that are not the home) in step.
func (p *Planner) setCopy(s int32, t shard.Tier, c copyState) {
	ks := &p.keys[s]
	ks.copies[t] = c
	if t == ks.home {
		return
	}
	switch in := ks.member[t] != 0; {
	case c != absent && !in:
		pi := p.poolOf(s, t)
		p.members[pi] = append(p.members[pi], s)
		ks.member[t] = int32(len(p.members[pi]))
	case c == absent && in:
		pi := p.poolOf(s, t)
		ms := p.members[pi]
		i, last := ks.member[t]-1, ms[len(ms)-1]
		ms[i] = last
		p.keys[last].member[t] = i + 1
		p.members[pi] = ms[:len(ms)-1]
		ks.member[t] = 0
	}
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

// Trace returns the trace the planner plans from.
func (p *Planner) Trace() Trace {
	return Trace{Accesses: append([]shard.Access(nil), p.known.Accesses...)}
}

// Stale reports whether the current step has diverged from the trace.
func (p *Planner) Stale() bool { return p.diverged }

// Stats returns the counters.
func (p *Planner) Stats() Stats { return p.stats }

// Bandwidth returns the link bandwidths the planner plans with.
func (p *Planner) Bandwidth() [shard.LinkCount]float64 { return p.opts.BandwidthBytesPerSec }

// SetBandwidth replaces the link bandwidths the planner plans with (bytes/s,
// each positive and finite; measured ones, between steps). The next Next
// plans with them: every transfer time and latest start is recomputed.
// Transfers already issued keep their modeled completion.
func (p *Planner) SetBandwidth(bw [shard.LinkCount]float64) error {
	o := p.opts
	o.BandwidthBytesPerSec = bw
	if err := o.Validate(); err != nil {
		return err
	}
	p.opts = o
	p.planned = false
	p.window = p.horizon()
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
		// An access declared in the step that ends and not ready yet
		// (tier.Runner.Begin: cpuadam waits for it, the rank went on)
		// stays pending, out of the recording that holds it.
		for i := range p.pending {
			p.pending[i].rec = -1
		}
		if p.checkTrace(tr) == nil { // accesses were checked one by one; this cannot fail
			p.adopt(tr)
		}
	}
	p.stepBase += int64(p.pos)
	p.pos = 0
	p.stepGen++
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
func (p *Planner) Access(a shard.Access, now time.Duration) (hit bool, moves []shard.Move, err error) {
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
	if !a.Ahead {
		p.stats.Accesses++ // an access declared ahead counts when awaited
	}
	ks := &p.keys[s]
	ks.lastUse = g
	ks.pins[a.Tier]++
	p.inUse = append(p.inUse, use{slot: s, tier: a.Tier, kind: a.Kind})
	if p.ready(s, a.Tier, a.Kind) {
		if !a.Ahead {
			p.stats.Hits++
		}
		p.rec.Ready(ri, now)
		p.lastReady, p.readyKnow = now, true
		return true, p.Next(now), nil
	}
	late := p.incoming(s, a)
	p.readyKnow = false
	p.pending = append(p.pending, pending{slot: s, tier: a.Tier, kind: a.Kind, g: g, start: now, rec: ri})
	moves = p.Next(now)
	if a.Ahead {
		return p.ready(s, a.Tier, a.Kind), moves, nil // judged when awaited
	}
	if p.ready(s, a.Tier, a.Kind) {
		// A write found room at once (Next saw it ready, with no stall).
		p.stats.Hits++
		return true, moves, nil
	}
	p.judgeLate(s, a, late)
	return false, moves, nil
}

// Confirm says that conditional access a (shard.Access.Conditional) will
// happen in this step, at its next place in the trace: from now on the
// plan moves its shard there as it does any access's. Until then, and in
// the steps that do not confirm it, the plan moves nothing for it. A
// confirmation the trace has no place for does nothing (the access, when
// it comes, is served on demand). It returns what Next(now) would.
func (p *Planner) Confirm(a shard.Access, now time.Duration) []shard.Move {
	s, ok := p.index[a.Key]
	if !ok || len(p.trace) == 0 || p.diverged {
		return nil
	}
	for _, i := range p.keys[s].occ {
		if int(i) < p.pos {
			continue
		}
		if t := &p.trace[i]; t.cond && t.tier == a.Tier && t.kind == a.Kind && p.confirmed[i] != p.stepGen {
			p.confirmed[i] = p.stepGen
			p.planned = false
			break
		}
	}
	return p.Next(now)
}

// Skip says that conditional access a, which would come next, does not
// happen in this step: the trace keeps its place (the recording holds it,
// with no compute of its own) and the step moves on past it, without a
// divergence when the trace has it there. A skipped access pins nothing
// and moves nothing; it is not counted among the accesses. It returns
// what Next(now) would.
func (p *Planner) Skip(a shard.Access, now time.Duration) ([]shard.Move, error) {
	if err := p.checkAccess(a); err != nil {
		return nil, err
	}
	s := p.index[a.Key]
	a.SizeBytes, a.Conditional, a.Ahead = p.keys[s].sizeBytes, true, false
	p.planned = false
	p.rec.Skip(a)
	if len(p.trace) > 0 && !p.diverged {
		if p.pos >= len(p.trace) || !p.known.Accesses[p.pos].SameSlot(a) || !p.trace[p.pos].cond {
			p.diverged = true
			p.stats.Divergences++
		}
	}
	if p.diverged || len(p.trace) == 0 {
		p.lastPos = -1
	}
	p.pos++
	p.stats.Skipped++
	return p.Next(now), nil
}

// gated says whether trace access i, at global index g, is a conditional
// one the plan must not move anything for: not confirmed in this step
// (an access of a later step is never confirmed yet).
func (p *Planner) gated(i int, g int64) bool {
	return p.trace[i].cond && (g-p.stepBase >= int64(len(p.trace)) || p.confirmed[i] != p.stepGen)
}

// incoming says whether a move toward a's shard is under way (a read's:
// a write waits for room, not data).
func (p *Planner) incoming(s int32, a shard.Access) bool {
	if a.Kind == shard.Write {
		return false
	}
	ks := &p.keys[s]
	for t := range ks.copies {
		if ks.copies[t] == incoming && !ks.stale[t] {
			return true
		}
	}
	return false
}

// judgeLate counts an access whose shard is not ready: dependent, late
// (a move toward it under way) or a miss.
func (p *Planner) judgeLate(s int32, a shard.Access, late bool) {
	ks := &p.keys[s]
	switch {
	case late && ks.copies[a.Tier] == incoming && ks.asap[a.Tier] && !ks.stale[a.Tier]:
		p.stats.Dependent++
	case late:
		p.stats.Late++
	default:
		p.stats.Misses++
		if a.Kind == shard.Write {
			p.stats.RoomWaits++
		}
	}
}

// Awaited counts and judges access a, declared ahead of its use (a.Ahead)
// and in use since, now that it is needed (in the step's figures of the
// step that needs it): a hit if its shard is ready, else late,
// dependent or a miss as Access judges one.
func (p *Planner) Awaited(a shard.Access, now time.Duration) {
	s, ok := p.index[a.Key]
	if !ok {
		return
	}
	p.stats.Accesses++
	if p.ready(s, a.Tier, a.Kind) {
		p.stats.Hits++
		return
	}
	p.judgeLate(s, a, p.incoming(s, a))
}

// Ready reports whether access a can run: its shard is valid in a.Tier (or,
// for a Write, has room there).
func (p *Planner) Ready(a shard.Access) bool {
	s, ok := p.index[a.Key]
	return ok && p.ready(s, a.Tier, a.Kind)
}

func (p *Planner) valid(s int32, t shard.Tier) bool {
	ks := &p.keys[s]
	// A copy being written back is on its way out: an access waits for it
	// to go and fetches it again (the store frees it when the write lands).
	return ks.copies[t] == present && !ks.stale[t] && !ks.leaving[t] && (t != ks.home || !ks.dirty)
}

func (p *Planner) ready(s int32, t shard.Tier, k shard.Kind) bool {
	if k != shard.Read && p.keys[s].sources[t] > 0 {
		return false // the store lets a write in only when no move reads the copy
	}
	if k == shard.Write {
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
	if u.kind != shard.Read && (ks.copies[u.tier] == present || ks.copies[u.tier] == reserved) && !ks.stale[u.tier] {
		ks.ver++
		p.setCopy(s, u.tier, present)
		ks.dirty = u.tier != ks.home
		if ks.dirty {
			p.dirtyList = append(p.dirtyList, dirtyCopy{s, u.tier})
		}
		if !ks.followed {
			ks.followed = true
			p.written = append(p.written, s)
		}
		p.markFresh(s, u.tier)
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
	p.setCopy(s, t, absent)
	p.used[p.poolOf(s, t)] -= ks.sizes[t]
	p.emit(shard.Move{Key: ks.key, From: t, To: ks.home, SizeBytes: ks.linkBytes(), Reason: shard.Evict})
}

// Completed tells the planner that a transfer it issued has finished.
func (p *Planner) Completed(m shard.Move, now time.Duration) {
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
	case shard.WriteBack:
		ks.leaving[m.From] = false
		p.setCopy(s, m.From, absent)
		ks.stale[m.From] = false
		p.used[p.poolOf(s, m.From)] -= ks.sizes[m.From]
		p.setCopy(s, m.To, present)
		if m.To == ks.home {
			ks.dirty = false
		}
	default:
		p.setCopy(s, m.To, present)
		if f.version != ks.version {
			ks.stale[m.To] = m.To != ks.home // the shard was rewritten while this copy travelled
		} else if m.To == ks.home {
			ks.dirty = false
		}
		if ks.asap[m.To] && !ks.stale[m.To] {
			p.markFresh(s, m.To) // the next hop of the chain is asap too
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
			if w.rec >= 0 {
				p.rec.Ready(w.rec, now)
				if w.rec == p.rec.timed-1 { // the latest access begun (skips aside)
					p.lastReady, p.readyKnow = now, true
				}
			}
			continue
		}
		p.pending[j] = w
		j++
	}
	p.pending = p.pending[:j]
}

// markFresh notes that copy t of slot s holds data that exists only since
// now: a move from it issued by the next Next is as early as any could be.
func (p *Planner) markFresh(s int32, t shard.Tier) {
	if !p.keys[s].fresh[t] {
		p.keys[s].fresh[t] = true
		p.freshList = append(p.freshList, freshCopy{s, t})
	}
}

// asap says whether a move of slot s from copy from, about to be issued
// on link instance link, starts as soon as its data exists: the copy is
// fresh and no other transfer of the planner's is in flight on the link
// (one issued before it, maybe for a later access, would delay it).
func (p *Planner) asap(s int32, from shard.Tier, link int) bool {
	return p.keys[s].fresh[from] && (link >= len(p.linkBusy) || p.linkBusy[link] == 0)
}

// Resumed tells the planner that it could not issue moves for a while
// (the store was paused, Next not called): the data written meanwhile
// existed before the next Next, which must not count its moves as asap.
func (p *Planner) Resumed() { p.clearFresh() }

// clearFresh ends the fresh marks at the end of a Next.
func (p *Planner) clearFresh() {
	for _, f := range p.freshList {
		p.keys[f.slot].fresh[f.tier] = false
	}
	p.freshList = p.freshList[:0]
}

// track records the transfer just emitted as in flight on link instance link.
func (p *Planner) track(s int32, link int, version uint32) {
	p.inflight[p.nextID] = flight{m: p.outbox[len(p.outbox)-1], slot: s, version: version, link: link}
	for link >= len(p.linkBusy) {
		p.linkBusy = append(p.linkBusy, 0)
	}
	p.linkBusy[link]++
}

func (p *Planner) emit(m shard.Move) {
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
