package pinned

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-ai/strata/internal/hostmem"
	"github.com/strata-ai/strata/internal/units"
)

// Registrar is told about every arena, so that a consumer can register the
// memory once: the CUDA backend with cuMemHostRegister, the io_uring engine
// as fixed buffers (arenaIndex is then the fixed-buffer index). Calls come
// with the pool's lock held: a Registrar must not call back into the Pool.
type Registrar interface {
	Register(arenaIndex int, mem []byte) error
	Unregister(arenaIndex int, mem []byte) error
}

// Residency says how the arenas sit in RAM, for cmd to print.
type Residency struct {
	Locked    bool   // mlock succeeded for every arena
	LockNote  string // why (not) locked, with the fix when not
	HugePages bool   // MADV_HUGEPAGE was requested
	THPMode   string // /sys/kernel/mm/transparent_hugepage/enabled: always, madvise or never
	// HugePageBytes of MappedBytes are backed by transparent huge pages
	// after populating (AnonHugePages in /proc/self/smaps; -1 when it could
	// not be read). On 4 KiB pages a 1 MiB O_DIRECT request needs 256
	// segments, more than many disks take (max_segments), and is split.
	HugePageBytes int64
	MappedBytes   int64
	Populate      PopulateMethod // the method that faulted the pages in
	PopulateTime  time.Duration  // time to map and populate every arena
}

func (r Residency) String() string {
	hp := "no huge-page advice"
	if r.HugePages {
		hp = "MADV_HUGEPAGE requested, THP " + r.THPMode
		if r.THPMode == "never" {
			hp += " (disabled: 4 KiB pages)"
		}
	}
	switch {
	case r.HugePageBytes < 0:
		hp += ", huge pages unknown (no /proc/self/smaps)"
	case r.HugePageBytes == 0 && r.MappedBytes > 0:
		hp += ", no huge pages: 1 MiB O_DIRECT requests may be split by the disk's max_segments"
	case r.MappedBytes > 0:
		hp += fmt.Sprintf(", %s of %s on huge pages", units.FormatBytes(r.HugePageBytes), units.FormatBytes(r.MappedBytes))
	}
	return fmt.Sprintf("%s; %s; populated by %s in %s", r.LockNote, hp, r.Populate, r.PopulateTime.Round(time.Millisecond))
}

// PurposeStats are the counters of one purpose.
type PurposeStats struct {
	Purpose    string
	InUseBytes int64 // padded bytes held now
	PeakBytes  int64 // highest InUseBytes
	Count      int   // buffers held now
	Gets       int64 // successful Gets so far
}

// Stats is a snapshot of the pool's counters.
type Stats struct {
	BudgetBytes int64 // mapped bytes: the budget rounded down to the alignment
	InUseBytes  int64 // padded bytes held by callers
	PeakBytes   int64
	Purposes    []PurposeStats
	// Relocations and RelocatedBytes count the buffers GetRelocating moved
	// to make a free run out of fragmented memory, and their padded bytes.
	Relocations, RelocatedBytes int64
}

type extent struct{ offsetBytes, sizeBytes int64 }

// arena is one piece of the pool's mapping: the unit in which it is
// registered (io_uring takes at most 1 GiB per fixed buffer), populated and
// locked. Buffers are carved from the whole mapping and may span arenas.
type arena struct {
	index int
	mem   []byte
}

// Pool hands out pinned buffers from arenas mapped at New, under a hard byte
// budget. Its methods are safe for concurrent use.
type Pool struct {
	opts      Options
	heap      []byte   // the whole mapping
	mapped    int64    // its bytes
	arenas    []*arena // heap cut in pieces of at most ArenaSizeBytes
	residency Residency
	closed    atomic.Bool

	mu         sync.Mutex
	free       []extent // of heap: sorted by offset, coalesced
	inUseBytes int64
	peakBytes  int64
	purposes   map[string]*PurposeStats
	held       map[*Buffer]struct{}
	registrars []Registrar
	// relocations and relocatedBytes count the buffers GetRelocating moved.
	relocations, relocatedBytes int64
}

// meminfoPath is where New reads MemAvailable (tests point it at a file of
// their own).
var meminfoPath = hostmem.MeminfoPath

// New checks that the host can give the budget (CheckHost: nothing is
// mapped otherwise), maps the whole budget as arenas, requests huge pages, faults every page
// in once and locks the arenas when allowed (see Options.Lock).
func New(o Options) (*Pool, error) {
	o = o.withDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if err := CheckHost(o.BudgetBytes, o.Lock, meminfoPath); err != nil {
		return nil, err
	}
	p := &Pool{
		opts:     o,
		purposes: map[string]*PurposeStats{},
		held:     map[*Buffer]struct{}{},
	}
	p.residency = Residency{HugePages: !o.NoHugePages, THPMode: thpMode(), Populate: o.Populate}
	start := time.Now()
	sizes := o.arenaSizes()
	var totalBytes int64
	for _, size := range sizes {
		totalBytes += size
	}
	align := o.AlignBytes
	if !o.NoHugePages && totalBytes >= hugePageBytes {
		align = max(align, hugePageBytes)
	}
	heap, err := sysMap(totalBytes, align, o)
	for i, off := 0, int64(0); err == nil && i < len(sizes); i++ {
		a := &arena{index: i, mem: heap[off : off+sizes[i] : off+sizes[i]]}
		if p.residency.Populate, err = sysPopulate(a.mem, o.Populate); err != nil {
			_ = sysUnmap(heap)
			err = fmt.Errorf("arena %d of %s: %w", i, units.FormatBytes(sizes[i]), err)
			break
		}
		p.arenas = append(p.arenas, a)
		off += sizes[i]
	}
	if err != nil {
		p.arenas = nil
		hint := "is it larger than free RAM?"
		if limit, ok := hostmem.AddressSpaceLimit(); ok {
			hint = "is it past the address-space limit, RLIMIT_AS (ulimit -v) " + units.FormatBytes(limit) + "?"
		}
		return nil, fmt.Errorf("pinned: mapping of %s in %d arenas (budget %s; %s): %w",
			units.FormatBytes(totalBytes), len(sizes), units.FormatBytes(o.BudgetBytes), hint, err)
	}
	p.heap, p.mapped, p.free = heap, totalBytes, []extent{{0, totalBytes}}
	p.residency.PopulateTime = time.Since(start)
	p.residency.MappedBytes = totalBytes
	hugeBytes, err := sysHugePageBytes(p.Arenas())
	if err != nil {
		hugeBytes = -1
	}
	p.residency.HugePageBytes = hugeBytes
	if o.Lock == LockNever {
		p.residency.LockNote = "mlock: off (LockNever); running unlocked"
		return p, nil
	}
	var lockErr error
	for i, a := range p.arenas {
		if lockErr = sysLock(a.mem); lockErr != nil {
			for _, b := range p.arenas[:i] {
				_ = sysUnlock(b.mem)
			}
			break
		}
	}
	p.residency.Locked = lockErr == nil
	p.residency.LockNote = lockNote(lockErr, totalBytes)
	if lockErr != nil && o.Lock == LockRequired {
		p.unmapAll()
		return nil, fmt.Errorf("pinned: %s (Lock is LockRequired): %w", strings.TrimSuffix(p.residency.LockNote, "; running unlocked"), lockErr)
	}
	return p, nil
}

// Options are the pool's options with defaults applied.
func (p *Pool) Options() Options { return p.opts }

// Residency says whether the arenas are locked and how they were populated.
func (p *Pool) Residency() Residency { return p.residency }

// Arenas are the mapped arenas, in index order, for consumers that register
// them all at once (io_uring's register_buffers). Valid until Close.
func (p *Pool) Arenas() [][]byte {
	out := make([][]byte, len(p.arenas))
	for i, a := range p.arenas {
		out[i] = a.mem
	}
	return out
}

// AddRegistrar calls r.Register for every arena. If one fails, the arenas
// already registered are unregistered and the error is returned. Close (or
// RemoveRegistrar) calls r.Unregister for every arena.
func (p *Pool) AddRegistrar(r Registrar) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mustBeOpen("AddRegistrar")
	for i, a := range p.arenas {
		if err := r.Register(a.index, a.mem); err != nil {
			for _, b := range p.arenas[:i] {
				_ = r.Unregister(b.index, b.mem)
			}
			return fmt.Errorf("pinned: register arena %d (%s): %w", a.index, units.FormatBytes(int64(len(a.mem))), err)
		}
	}
	p.registrars = append(p.registrars, r)
	return nil
}

// RemoveRegistrar calls r.Unregister for every arena, for a consumer that
// shuts down before the pool. The errors of all arenas are joined. After
// Close it does nothing (Close has unregistered every Registrar).
func (p *Pool) RemoveRegistrar(r Registrar) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return nil
	}
	i := -1
	for j, q := range p.registrars {
		if q == r {
			i = j
		}
	}
	if i < 0 {
		panic("pinned: RemoveRegistrar of a Registrar never added")
	}
	p.registrars = append(p.registrars[:i], p.registrars[i+1:]...)
	return p.unregister(r)
}

func (p *Pool) unregister(r Registrar) error {
	var errs []error
	for _, a := range p.arenas {
		if err := r.Unregister(a.index, a.mem); err != nil {
			errs = append(errs, fmt.Errorf("pinned: unregister arena %d: %w", a.index, err))
		}
	}
	return errors.Join(errs...)
}

// Get returns a buffer of sizeBytes (address and capacity aligned to
// AlignBytes) charged to purpose, carved best-fit from the pool's mapping
// (it may span arenas). When the budget cannot hold the request, the error
// (a *BudgetError, errors.Is ErrBudget) lists what uses how much by purpose
// and says whether the free memory is merely fragmented.
func (p *Pool) Get(sizeBytes int64, purpose string) (*Buffer, error) {
	if sizeBytes <= 0 || purpose == "" {
		panic(fmt.Sprintf("pinned: Get of %d bytes for purpose %q (need a positive size and a purpose)", sizeBytes, purpose))
	}
	padded := units.AlignUp(sizeBytes, p.opts.AlignBytes)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mustBeOpen("Get")
	off, ok := p.carve(padded)
	if !ok {
		return nil, p.budgetError(sizeBytes, padded, purpose)
	}
	return p.hold(off, sizeBytes, padded, purpose), nil
}

// hold makes the padded bytes carved at off a Buffer charged to purpose.
func (p *Pool) hold(off, sizeBytes, padded int64, purpose string) *Buffer {
	b := &Buffer{pool: p, offsetBytes: off, sizeBytes: sizeBytes, paddedBytes: padded, purpose: purpose}
	p.held[b] = struct{}{}
	p.inUseBytes += padded
	p.peakBytes = max(p.peakBytes, p.inUseBytes)
	ps := p.purposes[purpose]
	if ps == nil {
		ps = &PurposeStats{Purpose: purpose}
		p.purposes[purpose] = ps
	}
	ps.InUseBytes += padded
	ps.PeakBytes = max(ps.PeakBytes, ps.InUseBytes)
	ps.Count++
	ps.Gets++
	return b
}

// Put returns b's memory to the free extents, merged with its free
// neighbours. It panics if b has leases outstanding (its I/O
// has not completed), was already returned, or belongs to another pool.
func (p *Pool) Put(b *Buffer) {
	if b == nil || b.pool != p {
		panic("pinned: Put of a nil buffer or one from another pool")
	}
	b.markPut()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return // Close already reported it as held; the memory is gone
	}
	delete(p.held, b)
	p.release(extent{b.offsetBytes, b.paddedBytes})
	p.inUseBytes -= b.paddedBytes
	ps := p.purposes[b.purpose]
	ps.InUseBytes -= b.paddedBytes
	ps.Count--
}

// Stats returns a snapshot of the counters, purposes sorted by name.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statsLocked()
}

func (p *Pool) statsLocked() Stats {
	st := Stats{BudgetBytes: p.mappedBytes(), InUseBytes: p.inUseBytes, PeakBytes: p.peakBytes,
		Relocations: p.relocations, RelocatedBytes: p.relocatedBytes}
	for _, ps := range p.purposes {
		st.Purposes = append(st.Purposes, *ps)
	}
	sort.Slice(st.Purposes, func(i, j int) bool { return st.Purposes[i].Purpose < st.Purposes[j].Purpose })
	return st
}

// Close unregisters the arenas from every Registrar (newest first), unlocks
// and unmaps them. It panics if a buffer is still leased (DMA or I/O could
// write into unmapped memory); buffers still held but not leased are listed
// in the returned error, and their memory is gone. An arena whose Unregister
// failed is left mapped, and said so. A second Close does nothing.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return nil
	}
	var leased []string
	for b := range p.held {
		if n := b.Leases(); n > 0 {
			leased = append(leased, fmt.Sprintf("%q %s (%d leases)", b.purpose, units.FormatBytes(b.sizeBytes), n))
		}
	}
	if len(leased) > 0 {
		sort.Strings(leased)
		panic("pinned: Close with buffers still leased: " + strings.Join(leased, ", "))
	}
	var errs []error
	keep := map[*arena]bool{}
	for i := len(p.registrars) - 1; i >= 0; i-- {
		for _, a := range p.arenas {
			if err := p.registrars[i].Unregister(a.index, a.mem); err != nil {
				keep[a] = true
				errs = append(errs, fmt.Errorf("pinned: unregister arena %d: %w; left mapped", a.index, err))
			}
		}
	}
	p.registrars = nil
	if len(p.held) > 0 {
		errs = append(errs, fmt.Errorf("pinned: close with %d buffers still held (unmapped anyway): %s",
			len(p.held), byPurpose(p.statsLocked().Purposes)))
	}
	p.closed.Store(true)
	for _, a := range p.arenas {
		if keep[a] {
			continue
		}
		if err := p.unmap(a); err != nil {
			errs = append(errs, fmt.Errorf("pinned: unmap arena %d: %w", a.index, err))
		}
	}
	return errors.Join(errs...)
}

func (p *Pool) unmap(a *arena) error {
	if p.residency.Locked {
		_ = sysUnlock(a.mem)
	}
	return sysUnmap(a.mem)
}

func (p *Pool) unmapAll() {
	_ = sysUnmap(p.heap)
	p.heap, p.arenas = nil, nil
}

func (p *Pool) mustBeOpen(op string) {
	if p.closed.Load() {
		panic("pinned: " + op + " after Close")
	}
}

func (p *Pool) mappedBytes() int64 { return p.mapped }

// carve takes padded bytes from the start of the best-fitting free extent
// (the smallest that holds them; the lowest of equals) and returns their
// offset.
func (p *Pool) carve(padded int64) (int64, bool) { return carveFrom(&p.free, padded) }

// carveFrom is carve on the free list given.
func carveFrom(free *[]extent, padded int64) (int64, bool) {
	best := -1
	for i, e := range *free {
		if e.sizeBytes >= padded && (best < 0 || e.sizeBytes < (*free)[best].sizeBytes) {
			best = i
		}
	}
	if best < 0 {
		return 0, false
	}
	e := &(*free)[best]
	off := e.offsetBytes
	e.offsetBytes += padded
	e.sizeBytes -= padded
	if e.sizeBytes == 0 {
		*free = append((*free)[:best], (*free)[best+1:]...)
	}
	return off, true
}

// release inserts e into the sorted free list, merging with its neighbours.
func (p *Pool) release(e extent) {
	i := sort.Search(len(p.free), func(i int) bool { return p.free[i].offsetBytes > e.offsetBytes })
	if i > 0 && p.free[i-1].offsetBytes+p.free[i-1].sizeBytes > e.offsetBytes ||
		i < len(p.free) && e.offsetBytes+e.sizeBytes > p.free[i].offsetBytes {
		panic(fmt.Sprintf("pinned: freeing [%d, %d) overlaps a free extent", e.offsetBytes, e.offsetBytes+e.sizeBytes))
	}
	if i > 0 && p.free[i-1].offsetBytes+p.free[i-1].sizeBytes == e.offsetBytes {
		p.free[i-1].sizeBytes += e.sizeBytes
		if i < len(p.free) && e.offsetBytes+e.sizeBytes == p.free[i].offsetBytes {
			p.free[i-1].sizeBytes += p.free[i].sizeBytes
			p.free = append(p.free[:i], p.free[i+1:]...)
		}
		return
	}
	if i < len(p.free) && e.offsetBytes+e.sizeBytes == p.free[i].offsetBytes {
		p.free[i].offsetBytes = e.offsetBytes
		p.free[i].sizeBytes += e.sizeBytes
		return
	}
	p.free = append(p.free, extent{})
	copy(p.free[i+1:], p.free[i:])
	p.free[i] = e
}

func (p *Pool) budgetError(sizeBytes, padded int64, purpose string) *BudgetError {
	e := &BudgetError{
		BudgetBytes:  p.mappedBytes(),
		RequestBytes: sizeBytes,
		PaddedBytes:  padded,
		Purpose:      purpose,
		InUse:        p.statsLocked().Purposes,
		FreeBytes:    p.mappedBytes() - p.inUseBytes,
	}
	for _, x := range p.free {
		e.LargestFreeBytes = max(e.LargestFreeBytes, x.sizeBytes)
	}
	return e
}

// touch writes one byte per page so every page is faulted in for writing.
func touch(mem []byte, pageBytes int64) {
	for i := int64(0); i < int64(len(mem)); i += pageBytes {
		mem[i] = 0
	}
}
