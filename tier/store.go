package tier

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/pinned"
	"github.com/strata-ai/strata/shard"
)

// Spec describes a shard state at registration.
type Spec struct {
	Elems int         // elements
	DType dtype.DType // element type
	Home  shard.Tier  // where the shard persists: its space there is held until Unregister
	// Stored, when set, is the dtype of the host and NVMe copies, which
	// the HBM copy (DType) is decoded from as it arrives: BF16 from NF4
	// or INT8 (a frozen base streamed in 4 or 8 bits, gpu.Ops.Dequantize on the
	// device's host-to-device stream). Such a shard's HBM copy is
	// read-only: nothing writes it back. 0: DType everywhere.
	Stored dtype.DType
}

// SizeBytes is DType.Bytes(Elems): the HBM copy's size.
func (s Spec) SizeBytes() int64 { return s.DType.Bytes(s.Elems) }

// StoredBytes is the size of the host and NVMe copies: Stored.Bytes(Elems),
// or SizeBytes.
func (s Spec) StoredBytes() int64 {
	if s.Stored == 0 {
		return s.SizeBytes()
	}
	return s.Stored.Bytes(s.Elems)
}

// coded says whether the host and NVMe copies are coded (Stored set).
func (s Spec) coded() bool { return s.Stored != 0 && s.Stored != s.DType }

// mem is the memory of one copy: exactly one of dev, host, ext is set. An
// HBM copy in a slot (ReserveHBM) names its class and index.
type mem struct {
	dev       gpu.Buffer
	host      *pinned.Buffer
	ext       *nvme.Extent
	slot      *hbmClass
	slotIndex int
}

// pendingFree is a device buffer dropped with s.mu held, freed once it is
// released (unlock).
type pendingFree struct {
	rank int32
	buf  gpu.Buffer
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
	sizeBytes    int64                  // the HBM copy's (Spec.SizeBytes)
	storedBytes  int64                  // the host and NVMe copies' (Spec.StoredBytes)
	ioBytes      int64                  // storedBytes rounded up to the swap alignment (host buffers and extents)
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
	reg       Registration
	ioAlign   int64 // the swap's alignment, or 1
	hostAlign int64

	// mu guards the residency. Nothing that may wait for a device runs
	// while it is held (Device.Free: cuMemFree waits for the whole GPU,
	// whose streams may wait for another rank that needs mu): buffers
	// dropped under it are freed by unlock, after it is released.
	mu     sync.Mutex
	cond   *sync.Cond
	closed bool
	frees  []pendingFree
	// freeing counts, per device, the buffers unlock has taken off s.frees
	// and not yet freed (guarded by freeMu, never held across a wait on a
	// device: s.mu may be held when it is taken); devAlloc waits for its
	// device's to reach 0, so that a budget given back under s.mu is
	// never allocated on the device before the buffer it stood for is
	// freed there.
	freeMu   sync.Mutex
	freeCond *sync.Cond
	freeing  []int
	slots    hbmSlots
	codec    []codecScratch // per device: where coded shards land before they are decoded
	entries  map[shard.Key]*entry
	pools    []usage // poolHost, poolNVMe, then poolHBM+rank
	wg       sync.WaitGroup
	runners  map[int32]*Runner // woken when a move of their rank completes

	links                                 [shard.LinkCount]linkCounters
	active                                [shard.LinkCount]activity // the time each link had a hop on it (own lock)
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
		runners:   map[int32]*Runner{},
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
	s.codec = make([]codecScratch, len(o.Devices))
	s.freeing = make([]int, len(o.Devices))
	s.freeCond = sync.NewCond(&s.freeMu)
	s.register()
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
	if spec.Elems <= 0 || spec.DType < dtype.F32 || spec.DType > dtype.Q8 && spec.DType != dtype.F16 && spec.DType != dtype.Rem16 {
		return fmt.Errorf("tier: register %s: %d elements of %s: want a positive count of a known dtype", key, spec.Elems, spec.DType)
	}
	if spec.coded() && (!spec.DType.Half() || !spec.Stored.Coded() || spec.Home == shard.HBM) {
		return fmt.Errorf("tier: register %s: %s decoded from %s homed in %s: only bf16 or f16 from a dtype.Codecs format (nf4, int8), homed in host RAM or on NVMe, is built: %w", key, spec.DType, spec.Stored, spec.Home, ErrBadMove)
	}
	if err := s.tierOK(spec.Home, key.Rank); err != nil {
		return fmt.Errorf("tier: register %s home %s: %w", key, spec.Home, err)
	}
	e := &entry{key: key, spec: spec, sizeBytes: spec.SizeBytes(), storedBytes: spec.StoredBytes(), version: 1}
	e.ioBytes = units.AlignUp(e.storedBytes, s.ioAlign)
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
	op := newOp(shard.Move{Key: key, To: h, Reason: shard.Alloc})
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
	defer s.unlock()
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

// allocMem takes the memory of a copy of e in t (no lock held): in HBM a
// slot (ReserveHBM), else a device allocation.
func (s *Store) allocMem(e *entry, t shard.Tier) (mem, error) {
	switch t {
	case shard.HBM:
		if m, ok := s.takeSlot(e); ok {
			return m, nil
		}
		kind := gpu.ModelState
		if e.key.State == shard.Activation {
			kind = gpu.Activation // a restored block input: the device counts it with the activations
		}
		b, err := s.devAlloc(e.key.Rank, e.spec.Elems, e.spec.DType, gpu.Tag{Kind: kind, Purpose: e.key.State.String()})
		return mem{dev: b}, err
	case shard.Host:
		b, err := s.hostBuffer(e.ioBytes, e.key.State.String())
		return mem{host: b}, err
	default:
		x, err := s.swap.Alloc(e.ioBytes)
		return mem{ext: x}, err
	}
}

// hostBuffer takes n bytes of pinned memory for purpose (no lock held).
// When the pool's free memory is merely fragmented it moves idle host
// copies (no lease, no move reading or filling them, not leaving) out of
// the way (pinned.Pool.GetRelocating) under the lock, so that the planner,
// which counts bytes, is never refused a room its budget holds.
func (s *Store) hostBuffer(n int64, purpose string) (*pinned.Buffer, error) {
	b, err := s.pool.Get(n, purpose)
	var be *pinned.BudgetError
	if err == nil || !errors.As(err, &be) || be.FreeBytes < be.PaddedBytes {
		return b, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	idle := make(map[*pinned.Buffer]*replica)
	for _, e := range s.entries {
		c := &e.copies[shard.Host]
		if c.present && c.m.host != nil && c.incoming == nil && c.readers == 0 && c.leases == 0 && c.writeLeases == 0 && !c.leaving && !c.orphan {
			idle[c.m.host] = c
		}
	}
	b, moved, err := s.pool.GetRelocating(n, purpose, func(b *pinned.Buffer) bool { return idle[b] != nil })
	for _, r := range moved {
		idle[r.Old].m.host = r.New
	}
	return b, err
}

// freeMem gives back the memory of a copy (no lock held).
func (s *Store) freeMem(e *entry, m mem) {
	if m.dev != nil && m.slot == nil {
		s.devs[e.key.Rank].Free(m.dev)
		return
	}
	s.mu.Lock()
	s.freeMemLocked(e, m)
	s.unlock()
}

// freeMemLocked gives back the memory of a copy with s.mu held: a device
// buffer outside the slots is freed by unlock.
func (s *Store) freeMemLocked(e *entry, m mem) {
	switch {
	case m.slot != nil:
		s.putSlotLocked(m)
	case m.dev != nil:
		s.frees = append(s.frees, pendingFree{e.key.Rank, m.dev})
	case m.host != nil:
		s.pool.Put(m.host)
	case m.ext != nil:
		s.swap.Free(m.ext)
	}
}

// unlock releases s.mu, then frees the device buffers dropped while it was
// held.
func (s *Store) unlock() {
	frees := s.frees
	s.frees = nil
	if len(frees) == 0 {
		s.mu.Unlock()
		return
	}
	s.freeMu.Lock() // counted before s.mu is released: a budget reserved after it waits for them
	for _, f := range frees {
		s.freeing[f.rank]++
	}
	s.freeMu.Unlock()
	s.mu.Unlock()
	for _, f := range frees {
		s.devs[f.rank].Free(f.buf)
		s.freeMu.Lock()
		s.freeing[f.rank]--
		s.freeMu.Unlock()
	}
	s.freeCond.Broadcast()
}

// devAlloc allocates on device r once the device buffers whose budget was
// given back before it are freed there (unlock): the device never holds
// more model state than the store's budget. It is called without s.mu,
// which a free in progress (cuMemFree waits for the device) never holds.
func (s *Store) devAlloc(r int32, elems int, dt dtype.DType, tag gpu.Tag) (gpu.Buffer, error) {
	s.freeMu.Lock()
	for s.freeing[r] > 0 {
		s.freeCond.Wait()
	}
	s.freeMu.Unlock()
	return s.devs[r].Alloc(elems, dt, tag)
}

// dropLocked frees the copy of e in t and returns its bytes to the budget.
func (s *Store) dropLocked(e *entry, t shard.Tier) {
	c := &e.copies[t]
	s.freeMemLocked(e, c.m)
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
	SizeBytes int64 // the HBM copy's (Spec.SizeBytes)
	// StoredBytes is the host and NVMe copies' (Spec.StoredBytes): what
	// WriteHome and ReadNewest move and a host lease's Bytes hold.
	StoredBytes int64
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
	r := Residency{Spec: e.spec, SizeBytes: e.sizeBytes, StoredBytes: e.storedBytes, ChargeBytes: e.charge}
	alive := false
	var causes []error
	for t := range e.copies {
		c := &e.copies[t]
		cs := CopyState{Present: c.present, Valid: e.valid(c), Incoming: c.incoming != nil, Leaving: c.leaving, Leases: c.leases, Readers: c.readers}
		if c.lost != nil {
			cs.Err = c.lost
			causes = append(causes, inner{c.lost})
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
	regErr := s.unregister()

	s.mu.Lock()
	defer s.unlock()
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
	s.closeSlotsLocked()
	s.closeCodecLocked()
	if len(leased) > 0 {
		return errors.Join(regErr, fmt.Errorf("tier: closed with leases outstanding (their copies are freed at the last Release): %s", strings.Join(leased, ", ")))
	}
	return regErr
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
