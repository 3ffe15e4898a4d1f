package tier

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/dtype"
	"github.com/strata-ai/strata/internal/shard"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/pinned"
)

// Spec describes a shard state at registration.
type Spec struct {
	Elems int         // elements
	DType dtype.DType // element type
	Home  shard.Tier  // where the shard persists: its space there is held until Unregister
}

// SizeBytes is Elems × DType.Size().
func (s Spec) SizeBytes() int64 { return int64(s.Elems) * int64(s.DType.Size()) }

// Mode is what a lease holder does with the copy.
type Mode uint8

const (
	// Read leases share the copy with other leases and with moves reading it.
	Read Mode = iota
	// Write leases wait until no move reads the copy; moves from the copy wait
	// until the lease is released. Release makes the copy the newest: every
	// other copy becomes stale, and the shard is dirty unless the copy is home.
	Write
)

func (m Mode) String() string {
	if m == Write {
		return "write"
	}
	return "read"
}

// mem is the memory of one copy: exactly one field is set.
type mem struct {
	dev  gpu.Buffer
	host *pinned.Buffer
	ext  *nvme.Extent
}

// replica is the state of a shard's copy in one tier.
type replica struct {
	present     bool   // memory is held (or being allocated) in this tier
	m           mem    // empty while being allocated
	version     uint64 // valid when == entry.version; 0: holds no valid data
	blank       bool   // an NVMe home never written: its data is the zeros of Register
	lost        error  // corrupt data found; version is 0
	incoming    *Op    // a move or an allocation fills the copy
	newDst      bool   // the incoming move allocated this copy (free it if the move fails)
	readers     int    // moves in flight (or waiting) that read the copy
	leaving     bool   // a write-back will drop the copy when it completes
	leases      int
	writeLeases int
	failed      error // the error of the last move into this copy that failed
	orphan      bool  // its filling move failed while moves waited to read it: dropped when they are done
}

// entry is one registered shard state.
type entry struct {
	key          shard.Key
	spec         Spec
	sizeBytes    int64
	ioBytes      int64                  // sizeBytes rounded up to the swap alignment (host buffers and extents)
	charge       [shard.TierCount]int64 // bytes a copy costs in each tier's budget
	version      uint64                 // newest data; starts at 1 (the zeros of Register)
	copies       [shard.TierCount]replica
	stagingBytes int64 // host staging buffers of two-hop moves in flight
}

func (e *entry) valid(c *replica) bool {
	return c.present && c.incoming == nil && c.lost == nil && c.version != 0 && c.version == e.version
}

// survivesElsewhere reports whether a copy other than t holds (or is
// writing back) the newest data.
func (e *entry) survivesElsewhere(t shard.Tier) bool {
	for u := range e.copies {
		if shard.Tier(u) != t && e.valid(&e.copies[u]) {
			return true
		}
	}
	return false
}

// usage is one budget: the host, the NVMe swap, or one device's HBM.
type usage struct {
	budget, inUse, peak int64
}

type linkCounters struct {
	bytes, moves int64
	busy         time.Duration
}

// Store is the residency table of every registered shard state and the
// executor of moves between tiers. Its methods are safe for concurrent use.
type Store struct {
	opts      Options
	devs      []gpu.Device
	h2d, d2h  []gpu.Stream
	pool      *pinned.Pool
	swap      *nvme.Swap
	ioAlign   int64 // the swap's alignment, or 1
	hostAlign int64

	mu      sync.Mutex
	cond    *sync.Cond
	closed  bool
	entries map[shard.Key]*entry
	pools   []usage // poolHost, poolNVMe, then poolHBM+rank
	wg      sync.WaitGroup

	links                                 [LinkCount]linkCounters
	submitted, completed, failed, instant int64
	inFlight                              int
	flightTime                            time.Duration
	waited                                [shard.TierCount]time.Duration
	waits                                 [shard.TierCount]int64
	waiting                               int // Acquires blocked now (tests)
}

const (
	poolHost = 0
	poolNVMe = 1
	poolHBM  = 2
)

// New returns a store over the given devices, pinned pool and swap. It takes
// one host-to-device and one device-to-host copy stream per device; it owns
// none of the resources (Close does not close them).
func New(o Options) (*Store, error) {
	o = o.withDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	s := &Store{
		opts:      o,
		devs:      o.Devices,
		pool:      o.Host,
		swap:      o.Swap,
		ioAlign:   1,
		hostAlign: o.Host.Options().AlignBytes,
		entries:   map[shard.Key]*entry{},
		pools:     make([]usage, poolHBM+len(o.Devices)),
	}
	if s.hostAlign == 0 {
		s.hostAlign = 4096
	}
	s.cond = sync.NewCond(&s.mu)
	if o.Swap != nil {
		s.ioAlign = o.Swap.Alignment()
	}
	s.pools[poolHost].budget = o.HostBudgetBytes
	s.pools[poolNVMe].budget = o.NVMeBudgetBytes
	for i, d := range o.Devices {
		if d.Index() != i {
			return nil, fmt.Errorf("tier: Devices[%d] has index %d: devices must be given in rank order", i, d.Index())
		}
		s.pools[poolHBM+i].budget = o.HBMBudgetBytes
		s.h2d = append(s.h2d, d.NewStream())
		s.d2h = append(s.d2h, d.NewStream())
	}
	return s, nil
}

// Options returns the options the store runs with, defaults applied.
func (s *Store) Options() Options { return s.opts }

func (s *Store) poolOf(t shard.Tier, rank int32) int {
	switch t {
	case shard.Host:
		return poolHost
	case shard.NVMe:
		return poolNVMe
	}
	return poolHBM + int(rank)
}

// tierOK says whether the store has tier t for shards of rank.
func (s *Store) tierOK(t shard.Tier, rank int32) error {
	switch {
	case int(t) >= shard.TierCount:
		return fmt.Errorf("unknown tier %d: %w", t, ErrBadMove)
	case t == shard.HBM && (rank < 0 || int(rank) >= len(s.devs)):
		return fmt.Errorf("no device for rank %d (%d devices): %w", rank, len(s.devs), ErrBadMove)
	case t == shard.NVMe && s.swap == nil:
		return fmt.Errorf("no nvme tier (no swap configured): %w", ErrBadMove)
	}
	return nil
}

// Register adds a shard state with its home copy, which holds zeros: HBM and
// host memory are zeroed; an NVMe home is a fresh extent, not written, that
// reads as zeros until the first write-back. It fails with a *BudgetError
// when the home tier's budget cannot hold the shard.
func (s *Store) Register(key shard.Key, spec Spec) error {
	if spec.Elems <= 0 || spec.DType < dtype.F32 || spec.DType > dtype.F64 {
		return fmt.Errorf("tier: register %s: %d elements of %s: want a positive count of a known dtype", key, spec.Elems, spec.DType)
	}
	if err := s.tierOK(spec.Home, key.Rank); err != nil {
		return fmt.Errorf("tier: register %s home %s: %w", key, spec.Home, err)
	}
	e := &entry{key: key, spec: spec, sizeBytes: spec.SizeBytes(), version: 1}
	e.ioBytes = units.AlignUp(e.sizeBytes, s.ioAlign)
	e.charge[shard.HBM] = e.sizeBytes
	e.charge[shard.Host] = units.AlignUp(e.ioBytes, s.hostAlign)
	e.charge[shard.NVMe] = e.ioBytes

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("tier: register %s: %w", key, ErrClosed)
	}
	if _, ok := s.entries[key]; ok {
		return fmt.Errorf("tier: register %s: already registered: %w", key, ErrBadMove)
	}
	h := spec.Home
	if err := s.reserveLocked(e, h, e.charge[h], "copy"); err != nil {
		return err
	}
	op := newOp(Move{Key: key, To: h, Reason: Alloc})
	c := &e.copies[h]
	c.present, c.incoming, c.version, c.blank = true, op, e.version, h == shard.NVMe
	s.entries[key] = e
	s.wg.Add(1)
	s.mu.Unlock()
	m, err := s.allocMem(e, h)
	if err == nil && m.host != nil {
		clear(m.host.Bytes())
	}
	s.mu.Lock()
	s.wg.Done()
	c.incoming = nil
	close(op.done)
	s.cond.Broadcast()
	if err != nil {
		delete(s.entries, key)
		s.unreserveLocked(e, h, e.charge[h])
		return fmt.Errorf("tier: register %s: %w", key, err)
	}
	c.m = m
	return nil
}

// Unregister drops every copy of a shard, the home included. Nothing may be
// leased or in flight.
func (s *Store) Unregister(key shard.Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[key]
	if e == nil {
		return fmt.Errorf("tier: unregister %s: %w", key, ErrUnknown)
	}
	for t := range e.copies {
		c := &e.copies[t]
		if c.leases > 0 {
			return fmt.Errorf("tier: unregister %s: %s copy has %d leases: %w", key, shard.Tier(t), c.leases, ErrLeased)
		}
		if c.incoming != nil || c.readers > 0 || c.leaving {
			return fmt.Errorf("tier: unregister %s: %s copy: %w", key, shard.Tier(t), ErrBusy)
		}
	}
	for t := range e.copies {
		if e.copies[t].present {
			s.dropLocked(e, shard.Tier(t))
		}
	}
	delete(s.entries, key)
	return nil
}

// allocMem takes the memory of a copy of e in t (no lock held).
func (s *Store) allocMem(e *entry, t shard.Tier) (mem, error) {
	switch t {
	case shard.HBM:
		b, err := s.devs[e.key.Rank].Alloc(e.spec.Elems, e.spec.DType, gpu.Tag{Kind: gpu.ModelState, Purpose: e.key.State.String()})
		return mem{dev: b}, err
	case shard.Host:
		b, err := s.pool.Get(e.ioBytes, e.key.State.String())
		return mem{host: b}, err
	default:
		x, err := s.swap.Alloc(e.ioBytes)
		return mem{ext: x}, err
	}
}

func (s *Store) freeMem(e *entry, m mem) {
	switch {
	case m.dev != nil:
		s.devs[e.key.Rank].Free(m.dev)
	case m.host != nil:
		s.pool.Put(m.host)
	case m.ext != nil:
		s.swap.Free(m.ext)
	}
}

// dropLocked frees the copy of e in t and returns its bytes to the budget.
func (s *Store) dropLocked(e *entry, t shard.Tier) {
	c := &e.copies[t]
	s.freeMem(e, c.m)
	s.unreserveLocked(e, t, e.charge[t])
	*c = replica{}
}

func (s *Store) reserveLocked(e *entry, t shard.Tier, n int64, purpose string) error {
	pi := s.poolOf(t, e.key.Rank)
	u := &s.pools[pi]
	if u.inUse+n > u.budget {
		return s.budgetErrorLocked(pi, t, n, e.key, purpose)
	}
	u.inUse += n
	u.peak = max(u.peak, u.inUse)
	return nil
}

func (s *Store) unreserveLocked(e *entry, t shard.Tier, n int64) {
	u := &s.pools[s.poolOf(t, e.key.Rank)]
	u.inUse -= n
	if u.inUse < 0 {
		panic(fmt.Sprintf("tier: %s budget accounting went negative (%d B)", t, u.inUse))
	}
}

// budgetErrorLocked lists who uses pool pi.
func (s *Store) budgetErrorLocked(pi int, t shard.Tier, n int64, key shard.Key, purpose string) *BudgetError {
	u := s.pools[pi]
	be := &BudgetError{Tier: t, Device: -1, BudgetBytes: u.budget, InUseBytes: u.inUse, RequestBytes: n, Key: key, Purpose: purpose}
	if t == shard.HBM {
		be.Device = pi - poolHBM
	}
	byChunk := map[shard.ChunkID]int64{}
	for _, e := range s.entries {
		for ct := range e.copies {
			c := &e.copies[ct]
			if !c.present || s.poolOf(shard.Tier(ct), e.key.Rank) != pi {
				continue
			}
			n := e.charge[ct]
			be.ByState[e.key.State] += n
			byChunk[e.key.Chunk] += n
			if c.incoming != nil {
				be.InFlightBytes += n
			}
		}
		if pi == poolHost && e.stagingBytes > 0 {
			be.ByState[e.key.State] += e.stagingBytes
			byChunk[e.key.Chunk] += e.stagingBytes
			be.InFlightBytes += e.stagingBytes
		}
	}
	be.ByChunk = sortChunks(byChunk)
	return be
}

// Submit starts a move. Evict of a copy that another copy backs, Alloc, and
// moves whose destination already holds the newest data complete before
// Submit returns (Op.Done is true; OnComplete is not called). Every other
// move runs asynchronously. The error of Submit means nothing was started:
// a *BudgetError when a destination or a staging buffer does not fit, or
// ErrUnknown, ErrNotResident, ErrLost, ErrLeased, ErrBusy, ErrBadMove,
// ErrClosed. The error of the Op (a *MoveError) is a transfer that failed.
func (s *Store) Submit(m Move) (*Op, error) {
	if m.Reason >= reasonCount {
		return nil, fmt.Errorf("tier: %s: %w", m, ErrBadMove)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("tier: %s: %w", m, ErrClosed)
	}
	e := s.entries[m.Key]
	if e == nil {
		return nil, fmt.Errorf("tier: %s: %w", m, ErrUnknown)
	}
	var op *Op
	var err error
	switch m.Reason {
	case Alloc:
		op, err = s.allocLocked(e, m)
	case Evict:
		op, err = s.evictLocked(e, m)
	default:
		op, err = s.transferLocked(e, m, m.Reason == WriteBack, m)
	}
	if err != nil {
		return nil, err
	}
	s.submitted++
	if op.Done() {
		s.instant++
	}
	return op, nil
}

// Fetch copies the shard from one tier to another (a Prefetch move).
func (s *Store) Fetch(key shard.Key, from, to shard.Tier) (*Op, error) {
	return s.Submit(Move{Key: key, From: from, To: to, Reason: Prefetch})
}

// Evict drops the shard's copy in from. A dirty copy (the only one holding
// the newest data) is first written back to the home tier, and dropped when
// that completes; a clean one is dropped at once. The home copy is never
// evicted, and a leased copy or one a move is using is refused (ErrLeased,
// ErrBusy): eviction never waits.
func (s *Store) Evict(key shard.Key, from shard.Tier) (*Op, error) {
	s.mu.Lock()
	var home shard.Tier
	if e := s.entries[key]; e != nil {
		home = e.spec.Home
	}
	s.mu.Unlock()
	return s.Submit(Move{Key: key, From: from, To: home, Reason: Evict})
}

func (s *Store) allocLocked(e *entry, m Move) (*Op, error) {
	t := m.To
	if err := s.tierOK(t, e.key.Rank); err != nil {
		return nil, fmt.Errorf("tier: %s: %w", m, err)
	}
	c := &e.copies[t]
	if c.present {
		return doneOp(m), nil // the space is there
	}
	if err := s.reserveLocked(e, t, e.charge[t], "copy"); err != nil {
		return nil, err
	}
	op := newOp(m)
	c.present, c.incoming, c.version = true, op, 0
	s.wg.Add(1)
	s.mu.Unlock()
	mm, err := s.allocMem(e, t)
	s.mu.Lock()
	s.wg.Done()
	c.incoming = nil
	close(op.done)
	s.cond.Broadcast()
	if err != nil {
		*c = replica{}
		s.unreserveLocked(e, t, e.charge[t])
		return nil, fmt.Errorf("tier: %s: %w", m, err)
	}
	c.m = mm
	return op, nil
}

func (s *Store) evictLocked(e *entry, m Move) (*Op, error) {
	from := m.From
	if err := s.tierOK(from, e.key.Rank); err != nil {
		return nil, fmt.Errorf("tier: %s: %w", m, err)
	}
	c := &e.copies[from]
	switch {
	case !c.present:
		return nil, fmt.Errorf("tier: %s: no copy there: %w", m, ErrNotResident)
	case from == e.spec.Home:
		return nil, fmt.Errorf("tier: %s: the home copy is never evicted: %w", m, ErrBadMove)
	case c.leases > 0:
		return nil, fmt.Errorf("tier: %s: %d leases: %w", m, c.leases, ErrLeased)
	case c.incoming != nil || c.readers > 0 || c.leaving:
		return nil, fmt.Errorf("tier: %s: %w", m, ErrBusy)
	}
	if e.valid(c) && !e.survivesElsewhere(from) {
		to := m.To
		if to == from || s.tierOK(to, e.key.Rank) != nil {
			to = e.spec.Home
		}
		return s.transferLocked(e, Move{ID: m.ID, Key: m.Key, From: from, To: to, SizeBytes: m.SizeBytes, Reason: WriteBack}, true, m)
	}
	s.dropLocked(e, from)
	return doneOp(m), nil
}

// whyInvalid explains why copy c of e holds no usable data.
func (e *entry) whyInvalid(c *replica) error {
	switch {
	case c.lost != nil:
		return fmt.Errorf("%w: %w", ErrLost, c.lost)
	case c.version == 0 && c.failed != nil:
		return fmt.Errorf("%w: never completed: %w", ErrNotResident, c.failed)
	case c.version == 0:
		return fmt.Errorf("%w: reserved, never written", ErrNotResident)
	}
	return fmt.Errorf("%w: stale (a newer version was written elsewhere)", ErrNotResident)
}

// transferLocked starts a copy m.From -> m.To, dropping the source when it
// completes if drop. orig is the move reported to the caller.
func (s *Store) transferLocked(e *entry, m Move, drop bool, orig Move) (*Op, error) {
	from, to := m.From, m.To
	for _, t := range []shard.Tier{from, to} {
		if err := s.tierOK(t, e.key.Rank); err != nil {
			return nil, fmt.Errorf("tier: %s: %w", orig, err)
		}
	}
	if from == to {
		return nil, fmt.Errorf("tier: %s: source and destination are one tier: %w", orig, ErrBadMove)
	}
	src, dst := &e.copies[from], &e.copies[to]
	switch {
	case !src.present:
		if src.failed != nil {
			return nil, fmt.Errorf("tier: %s: no copy in %s: %w: %w", orig, from, ErrNotResident, src.failed)
		}
		return nil, fmt.Errorf("tier: %s: no copy in %s: %w", orig, from, ErrNotResident)
	case src.leaving:
		return nil, fmt.Errorf("tier: %s: the %s copy is being written back and dropped: %w", orig, from, ErrBusy)
	case src.incoming == nil && !e.valid(src):
		return nil, fmt.Errorf("tier: %s: the %s copy: %w", orig, from, e.whyInvalid(src))
	case drop && from == e.spec.Home:
		return nil, fmt.Errorf("tier: %s: the home copy is never dropped: %w", orig, ErrBadMove)
	case drop && src.leases > 0:
		return nil, fmt.Errorf("tier: %s: the %s copy has %d leases: %w", orig, from, src.leases, ErrLeased)
	case drop && src.readers > 0:
		return nil, fmt.Errorf("tier: %s: the %s copy is the source of %d moves: %w", orig, from, src.readers, ErrBusy)
	case src.incoming == nil && e.valid(dst) && !dst.leaving:
		// The destination already holds the newest data: nothing to copy.
		if drop {
			s.dropLocked(e, from)
		}
		return doneOp(orig), nil
	case dst.present && dst.leases > 0:
		return nil, fmt.Errorf("tier: %s: the %s copy has %d leases: %w", orig, to, dst.leases, ErrLeased)
	case dst.present && (dst.incoming != nil || dst.readers > 0 || dst.leaving):
		return nil, fmt.Errorf("tier: %s: the %s copy: %w", orig, to, ErrBusy)
	}
	twoHop := from != shard.Host && to != shard.Host
	newDst := !dst.present
	if newDst {
		if err := s.reserveLocked(e, to, e.charge[to], "copy"); err != nil {
			return nil, err
		}
	}
	if twoHop {
		if err := s.reserveLocked(e, shard.Host, e.charge[shard.Host], "staging"); err != nil {
			if newDst {
				s.unreserveLocked(e, to, e.charge[to])
			}
			return nil, err
		}
		e.stagingBytes += e.charge[shard.Host]
	}
	op := newOp(orig)
	if newDst {
		*dst = replica{present: true}
	}
	dst.incoming, dst.newDst, dst.version, dst.failed = op, newDst, 0, nil
	src.readers++
	src.leaving = drop
	s.inFlight++
	s.wg.Add(1)

	var stage *pinned.Buffer
	if newDst || twoHop {
		s.mu.Unlock()
		var dm mem
		var err error
		if newDst {
			dm, err = s.allocMem(e, to)
		}
		if err == nil && twoHop {
			if stage, err = s.pool.Get(e.ioBytes, "staging"); err != nil {
				s.freeMem(e, dm)
			}
		}
		s.mu.Lock()
		if err != nil {
			src.readers--
			src.leaving = false
			if newDst {
				*dst = replica{}
				s.unreserveLocked(e, to, e.charge[to])
			} else {
				dst.incoming = nil
			}
			if twoHop {
				s.unreserveLocked(e, shard.Host, e.charge[shard.Host])
				e.stagingBytes -= e.charge[shard.Host]
			}
			s.inFlight--
			s.wg.Done()
			s.cond.Broadcast()
			return nil, fmt.Errorf("tier: %s: %w", orig, err)
		}
		if newDst {
			dst.m = dm
		}
	}
	go s.run(e, op, from, to, drop, stage)
	return op, nil
}

// run executes a transfer started by transferLocked.
func (s *Store) run(e *entry, op *Op, from, to shard.Tier, drop bool, stage *pinned.Buffer) {
	defer s.wg.Done()
	src, dst := &e.copies[from], &e.copies[to]
	s.mu.Lock()
	for !s.closed && (src.incoming != nil || src.writeLeases > 0) {
		s.cond.Wait() // the source is still arriving, or being written
	}
	var err error
	var ver uint64
	var blank bool
	switch {
	case s.closed:
		err = ErrClosed
	case !src.present || src.version == 0 || src.lost != nil:
		// Its own move failed: there is nothing to copy. (A source that
		// is merely stale now, because the shard was written elsewhere
		// after Submit, is copied with its version: the destination lands
		// stale, as the planner expects.)
		err = fmt.Errorf("the %s copy: %w", from, e.whyInvalid(src))
	default:
		ver, blank = src.version, src.blank
	}
	sm, dm := src.m, dst.m
	s.mu.Unlock()

	var links [LinkCount]linkCounters
	if err == nil {
		err = s.transfer(e, from, to, sm, dm, stage, blank, &links)
	}

	s.mu.Lock()
	src.readers--
	src.leaving = false
	if src.orphan && src.readers == 0 && src.leases == 0 {
		s.dropLocked(e, from)
	}
	dst.incoming = nil
	if stage != nil {
		s.pool.Put(stage)
		s.unreserveLocked(e, shard.Host, e.charge[shard.Host])
		e.stagingBytes -= e.charge[shard.Host]
	}
	if err == nil {
		dst.version, dst.blank, dst.lost, dst.failed = ver, false, nil, nil
		if drop {
			s.dropLocked(e, from)
		}
		s.completed++
	} else {
		err = &MoveError{Move: op.move, Err: err}
		if from == shard.NVMe && src.present && errors.Is(err, nvme.ErrCorrupt) {
			src.version, src.lost = 0, err // the extent's data is known bad
		}
		switch {
		case dst.newDst && dst.readers > 0:
			dst.version, dst.orphan = 0, true // moves wait on it: the last one drops it
		case dst.newDst:
			s.dropLocked(e, to)
		default:
			dst.version = 0 // partly overwritten
		}
		dst.failed = err
		s.failed++
	}
	dst.newDst = false
	for l := range links {
		s.links[l].bytes += links[l].bytes
		s.links[l].moves += links[l].moves
		s.links[l].busy += links[l].busy
	}
	op.err = err
	op.took = time.Since(op.start)
	for _, l := range links {
		op.bytes += l.bytes
	}
	s.inFlight--
	s.flightTime += op.took
	s.cond.Broadcast()
	s.mu.Unlock()
	close(op.done)
	if cb := s.opts.OnComplete; cb != nil {
		cb(op.move, err)
	}
}

// transfer moves the data (no lock held). Pinned buffers handed to a copy
// engine or to the kernel are leased until the transfer completes.
func (s *Store) transfer(e *entry, from, to shard.Tier, sm, dm mem, stage *pinned.Buffer, blank bool, links *[LinkCount]linkCounters) error {
	hop := func(l Link, n int64, f func() error) error {
		t0 := time.Now()
		err := f()
		if err == nil {
			links[l].bytes += n
			links[l].moves++
			links[l].busy += time.Since(t0)
		}
		return err
	}
	// hostSide is the host buffer of the hop that touches the host: the
	// staging buffer of a two-hop move, else the host copy.
	switch {
	case from == shard.HBM && to == shard.Host:
		return hop(HBMToHost, e.sizeBytes, func() error { return s.download(e, sm.dev, dm.host) })
	case from == shard.Host && to == shard.HBM:
		return hop(HostToHBM, e.sizeBytes, func() error { return s.upload(e, sm.host, dm.dev) })
	case from == shard.Host && to == shard.NVMe:
		return hop(HostToNVMe, e.ioBytes, func() error { return s.write(sm.host, dm.ext) })
	case from == shard.NVMe && to == shard.Host:
		if blank {
			clear(dm.host.Bytes())
			return nil
		}
		return hop(NVMeToHost, e.ioBytes, func() error { return s.read(sm.ext, dm.host) })
	case from == shard.HBM && to == shard.NVMe:
		if err := hop(HBMToHost, e.sizeBytes, func() error { return s.download(e, sm.dev, stage) }); err != nil {
			return err
		}
		return hop(HostToNVMe, e.ioBytes, func() error { return s.write(stage, dm.ext) })
	case from == shard.NVMe && to == shard.HBM:
		if blank {
			clear(stage.Bytes())
		} else if err := hop(NVMeToHost, e.ioBytes, func() error { return s.read(sm.ext, stage) }); err != nil {
			return err
		}
		return hop(HostToHBM, e.sizeBytes, func() error { return s.upload(e, stage, dm.dev) })
	}
	panic(fmt.Sprintf("tier: transfer %s -> %s", from, to))
}

// download copies a device buffer into a pinned buffer on the device's
// device-to-host stream and waits for the copy's event.
func (s *Store) download(e *entry, src gpu.Buffer, dst *pinned.Buffer) error {
	r := e.key.Rank
	dst.Lease()
	defer dst.Release()
	st := s.d2h[r]
	s.devs[r].CopyDeviceToHost(st, dst.Bytes()[:e.sizeBytes], src, 0)
	ev := s.devs[r].NewEvent()
	st.Record(ev)
	ev.Synchronize()
	return nil
}

// upload copies a pinned buffer into a device buffer on the device's
// host-to-device stream and waits for the copy's event.
func (s *Store) upload(e *entry, src *pinned.Buffer, dst gpu.Buffer) error {
	r := e.key.Rank
	src.Lease()
	defer src.Release()
	st := s.h2d[r]
	s.devs[r].CopyHostToDevice(st, dst, 0, src.Bytes()[:e.sizeBytes])
	ev := s.devs[r].NewEvent()
	st.Record(ev)
	ev.Synchronize()
	return nil
}

// write stores a pinned buffer in an extent (the swap records a CRC-32C per
// stripe unit).
func (s *Store) write(src *pinned.Buffer, x *nvme.Extent) error {
	src.Lease()
	defer src.Release()
	return s.swap.Write(x, src.Bytes())
}

// read fills a pinned buffer from an extent and verifies its checksums.
func (s *Store) read(x *nvme.Extent, dst *pinned.Buffer) error {
	dst.Lease()
	defer dst.Release()
	return s.swap.Read(x, dst.Bytes())
}

// Lease pins one copy of a shard: it cannot be dropped, evicted or
// overwritten until Release.
type Lease struct {
	s        *Store
	e        *entry
	tier     shard.Tier
	mode     Mode
	dev      gpu.Buffer
	host     []byte
	released atomic.Bool
}

// Acquire leases the shard's copy in tier t (HBM or host) and returns it. It
// blocks while a move fills that copy (and, for Write, while moves read it);
// the time blocked is counted in Stats.Waited. It fails with ErrNotResident
// when there is no copy there (the move that was to fill it failed: its
// error is wrapped too), or, for Read, when the copy does not hold the
// newest data; ErrLost when its data was found corrupt.
func (s *Store) Acquire(key shard.Key, t shard.Tier, mode Mode) (*Lease, error) {
	if t != shard.HBM && t != shard.Host {
		return nil, fmt.Errorf("tier: acquire %s in %s: only hbm and host copies are addressable: %w", key, t, ErrBadMove)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var t0 time.Time
	for {
		if s.closed {
			return nil, fmt.Errorf("tier: acquire %s in %s: %w", key, t, ErrClosed)
		}
		e := s.entries[key]
		if e == nil {
			return nil, fmt.Errorf("tier: acquire %s: %w", key, ErrUnknown)
		}
		if err := s.tierOK(t, key.Rank); err != nil {
			return nil, fmt.Errorf("tier: acquire %s in %s: %w", key, t, err)
		}
		c := &e.copies[t]
		if c.present && (c.incoming != nil || (mode == Write && c.readers > 0)) {
			if t0.IsZero() {
				t0 = time.Now()
			}
			s.waiting++
			s.cond.Wait()
			s.waiting--
			continue
		}
		if !t0.IsZero() {
			s.waited[t] += time.Since(t0)
			s.waits[t]++
		}
		switch {
		case !c.present && c.failed != nil:
			return nil, fmt.Errorf("tier: acquire %s in %s: %w: %w", key, t, ErrNotResident, c.failed)
		case !c.present:
			return nil, fmt.Errorf("tier: acquire %s in %s: %w", key, t, ErrNotResident)
		case c.leaving:
			return nil, fmt.Errorf("tier: acquire %s in %s: being written back and dropped: %w", key, t, ErrNotResident)
		case mode == Read && !e.valid(c):
			return nil, fmt.Errorf("tier: acquire %s in %s: %w", key, t, e.whyInvalid(c))
		}
		c.leases++
		if mode == Write {
			c.writeLeases++
		}
		l := &Lease{s: s, e: e, tier: t, mode: mode}
		if t == shard.HBM {
			l.dev = c.m.dev
		} else {
			l.host = c.m.host.Bytes()[:e.sizeBytes:e.sizeBytes]
		}
		return l, nil
	}
}

// Key is the leased shard.
func (l *Lease) Key() shard.Key { return l.e.key }

// Tier is where the leased copy lives.
func (l *Lease) Tier() shard.Tier { return l.tier }

// Buffer is the leased HBM copy (nil for a host lease).
func (l *Lease) Buffer() gpu.Buffer { return l.dev }

// Bytes is the leased host copy, exactly the shard's size (nil for an HBM
// lease). It is pinned memory: it must not be used after Release.
func (l *Lease) Bytes() []byte { return l.host }

// Release ends the lease. Releasing a Write lease makes the copy the newest
// version of the shard. Releasing twice panics.
func (l *Lease) Release() {
	if !l.released.CompareAndSwap(false, true) {
		panic(fmt.Sprintf("tier: lease of %s in %s released twice", l.e.key, l.tier))
	}
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &l.e.copies[l.tier]
	c.leases--
	if l.mode == Write {
		c.writeLeases--
		l.e.version++
		c.version, c.blank, c.lost, c.failed, c.orphan = l.e.version, false, nil, nil, false
	}
	if s.closed && c.leases == 0 {
		s.dropLocked(l.e, l.tier)
		s.removeIfEmptyLocked(l.e)
	}
	s.cond.Broadcast()
}

// CopyState is the state of one copy of a shard.
type CopyState struct {
	Present  bool  // memory is held in this tier
	Valid    bool  // it holds the newest data
	Incoming bool  // a move or allocation is filling it
	Leaving  bool  // a write-back will drop it
	Leases   int   // leases held
	Readers  int   // moves in flight reading it
	Err      error // why it holds no data, when a move failed or corruption was found
}

// Residency is where a shard is.
type Residency struct {
	Spec      Spec
	SizeBytes int64
	// ChargeBytes is what a copy costs in each tier's budget: SizeBytes in
	// HBM, the pinned buffer's padded size in host, the extent (padded to
	// the swap's alignment) in NVMe. A planner must count these.
	ChargeBytes [shard.TierCount]int64
	Copies      [shard.TierCount]CopyState
	// Dirty: the home copy does not hold the newest data.
	Dirty bool
	// Lost is non-nil when no copy holds the newest data and none is
	// arriving: the shard's data is gone (it wraps ErrLost and the cause).
	Lost error
}

// Where returns the residency of a shard.
func (s *Store) Where(key shard.Key) (Residency, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[key]
	if e == nil {
		return Residency{}, fmt.Errorf("tier: where %s: %w", key, ErrUnknown)
	}
	r := Residency{Spec: e.spec, SizeBytes: e.sizeBytes, ChargeBytes: e.charge}
	alive := false
	var causes []error
	for t := range e.copies {
		c := &e.copies[t]
		cs := CopyState{Present: c.present, Valid: e.valid(c), Incoming: c.incoming != nil, Leaving: c.leaving, Leases: c.leases, Readers: c.readers}
		if c.lost != nil {
			cs.Err = c.lost
			causes = append(causes, c.lost)
		} else if c.failed != nil && !cs.Valid {
			cs.Err = c.failed
		}
		alive = alive || cs.Valid || cs.Incoming
		r.Copies[t] = cs
	}
	r.Dirty = !r.Copies[e.spec.Home].Valid
	if !alive {
		r.Lost = fmt.Errorf("tier: %s: %w: %w", key, ErrLost, errors.Join(causes...))
	}
	return r, nil
}

// Usage is one budget's bytes.
type Usage struct {
	BudgetBytes int64
	InUseBytes  int64 // copies, reservations of moves in flight, staging buffers
	PeakBytes   int64 // highest InUseBytes since New or ResetPeaks
}

// LinkStats are the counters of one link.
type LinkStats struct {
	Bytes int64         // bytes moved (NVMe: whole extents, padded to the swap's alignment)
	Moves int64         // hops completed
	Busy  time.Duration // sum over hops of the time each took (hops overlap: can exceed wall time)
}

// Stats are the store's counters since New.
type Stats struct {
	Links [LinkCount]LinkStats
	HBM   []Usage // per device
	Host  Usage
	NVMe  Usage
	// Moves accepted by Submit, of which Instant completed within it;
	// Completed and Failed count asynchronous moves that ended.
	Submitted, Instant, Completed, Failed int64
	InFlight                              int
	// FlightTime is the sum of the durations of the asynchronous moves.
	FlightTime time.Duration
	// Waited is the time Acquire blocked on moves, per tier; Waits the
	// number of Acquires that blocked.
	Waited [shard.TierCount]time.Duration
	Waits  [shard.TierCount]int64
	Shards int
}

func (u usage) out() Usage {
	return Usage{BudgetBytes: u.budget, InUseBytes: u.inUse, PeakBytes: u.peak}
}

// Stats returns a snapshot of the counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Host: s.pools[poolHost].out(), NVMe: s.pools[poolNVMe].out(),
		Submitted: s.submitted, Instant: s.instant, Completed: s.completed, Failed: s.failed,
		InFlight: s.inFlight, FlightTime: s.flightTime, Waited: s.waited, Waits: s.waits, Shards: len(s.entries),
	}
	for i := range s.devs {
		st.HBM = append(st.HBM, s.pools[poolHBM+i].out())
	}
	for l := range s.links {
		st.Links[l] = LinkStats{Bytes: s.links[l].bytes, Moves: s.links[l].moves, Busy: s.links[l].busy}
	}
	return st
}

func (st Stats) String() string {
	var b strings.Builder
	for i, u := range st.HBM {
		fmt.Fprintf(&b, "hbm%d %s/%s (peak %s); ", i, units.FormatBytes(u.InUseBytes), units.FormatBytes(u.BudgetBytes), units.FormatBytes(u.PeakBytes))
	}
	fmt.Fprintf(&b, "host %s/%s (peak %s); nvme %s/%s (peak %s)",
		units.FormatBytes(st.Host.InUseBytes), units.FormatBytes(st.Host.BudgetBytes), units.FormatBytes(st.Host.PeakBytes),
		units.FormatBytes(st.NVMe.InUseBytes), units.FormatBytes(st.NVMe.BudgetBytes), units.FormatBytes(st.NVMe.PeakBytes))
	for l, ls := range st.Links {
		fmt.Fprintf(&b, "; %s %s in %d", Link(l), units.FormatBytes(ls.Bytes), ls.Moves)
	}
	fmt.Fprintf(&b, "; moves %d (%d instant, %d failed, %d in flight)", st.Submitted, st.Instant, st.Failed, st.InFlight)
	return b.String()
}

// ResetPeaks sets every peak to the current use (at a step boundary).
func (s *Store) ResetPeaks() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.pools {
		s.pools[i].peak = s.pools[i].inUse
	}
}

// Close cancels moves that have not started their transfer (they fail with
// ErrClosed), waits for the others and for their completion callbacks, and
// frees every copy that is not leased. Copies still leased are named in the
// returned error and freed when their last lease is released. Submit, Acquire and Register
// fail after Close; a second Close does nothing. It must not be called from
// OnComplete.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
	s.wg.Wait()

	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]shard.Key, 0, len(s.entries))
	for k := range s.entries {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keyLess(keys[i], keys[j]) })
	var leased []string
	for _, k := range keys {
		e := s.entries[k]
		for t := range e.copies {
			c := &e.copies[t]
			if !c.present {
				continue
			}
			if c.leases > 0 {
				leased = append(leased, fmt.Sprintf("%s in %s (%d)", k, shard.Tier(t), c.leases))
				continue
			}
			s.dropLocked(e, shard.Tier(t))
		}
	}
	for _, e := range s.entries {
		s.removeIfEmptyLocked(e)
	}
	if len(leased) > 0 {
		return fmt.Errorf("tier: closed with leases outstanding (their copies are freed at the last Release): %s", strings.Join(leased, ", "))
	}
	return nil
}

// removeIfEmptyLocked forgets a shard with no copy left (after Close).
func (s *Store) removeIfEmptyLocked(e *entry) {
	for t := range e.copies {
		if e.copies[t].present {
			return
		}
	}
	delete(s.entries, e.key)
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
