package tier

import (
	"fmt"
	"slices"
	"sync"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/shard"
)

// HBM slots. A copy in HBM that came and went with device allocations
// would allocate and free device memory at every eviction, during the
// step, and a free waits for the whole device to go idle (cuMemFree). So
// the store takes its HBM copies' memory once, at ReserveHBM, as slots:
// per device and per slot class (elements and dtype) one device buffer of
// slots of that class. The budget still decides what fits, byte for byte;
// the slots only hold it. A class of shards of s bytes needs at most
// min(its shards, ⌊budget / s⌋) slots, because the budget never holds more
// of them at once and each shard has one HBM copy at most, so no copy ever
// waits for a slot and none is ever refused for fragmentation. When the
// budget holds every shard (the default) that is exactly the shards'
// bytes; when it holds fewer, the classes other than the largest cost
// their slots on top (SlabBytes). The rule holds whatever the states of a
// class: param shards and the saved block inputs of cpu_checkpointing
// (shard.Activation) share one HBM budget, and the planner may hold more
// inputs than the budget's room for two when it has evicted param copies
// for them, so the inputs' class gets min(inputs, ⌊budget / input⌋) slots
// too.

// The purposes of the slots' device allocations (gpu.Tag): param shards
// (and any class with model state), and saved block inputs.
const (
	SlotPurpose      = "tier hbm copies"
	InputSlotPurpose = "tier hbm inputs"
)

// SlotClass is what a shard's HBM copy needs of a slot: its elements and
// dtype. Shards of one class (per device) share one buffer of slots.
type SlotClass struct {
	Elems int
	DType dtype.DType
}

// Bytes is the class's slot size: DType.Bytes(Elems).
func (c SlotClass) Bytes() int64 { return c.DType.Bytes(c.Elems) }

// hbmClass is the slots of one device for shards of one class.
type hbmClass struct {
	rank  int32
	elems int
	dt    dtype.DType
	n     int        // slots
	buf   gpu.Buffer // n × elems elements; nil once freed
	free  []int      // slot indices not holding a copy
}

type hbmClassKey struct {
	rank  int32
	elems int
	dt    dtype.DType
}

// hbmSlots are the store's slots (ReserveHBM), guarded by their own mutex:
// a slot is taken without the store's lock (allocMem) and given back with
// it (dropLocked); neither calls the device.
type hbmSlots struct {
	mu      sync.Mutex
	classes map[hbmClassKey]*hbmClass
	bytes   []int64 // per device
	closed  bool    // Close: a class is freed once all its slots are back
}

// SlabBytes is the device memory the slots of ReserveHBM take for a budget
// of budgetBytes per device and the shards of one rank (their classes, one
// per shard, in any order): for each class of s bytes, min(the shards of
// that class, ⌊budgetBytes / s⌋) slots of s bytes.
func SlabBytes(budgetBytes int64, shards []SlotClass) int64 {
	count := map[SlotClass]int64{}
	for _, c := range shards {
		if c.Bytes() > 0 {
			count[c]++
		}
	}
	var total int64
	for c, n := range count {
		total += min(n, max(budgetBytes, 0)/c.Bytes()) * c.Bytes()
	}
	return total
}

// ReserveHBM takes, on every device, the slots of the HBM copies of the
// shards of the given states that are registered now and not homed in HBM
// (their copies come and go with moves): one allocation per slot class,
// tagged gpu.ModelState, "tier hbm copies", or, for a class of saved block
// inputs only (shard.Activation), gpu.Activation, "tier hbm inputs". Later
// copies of those shards in HBM take a slot and give it back, with no
// device allocation; copies of other shards are allocated and freed as
// before. Call it once, after registering the shards, before the first
// move; a device that cannot hold the slots is an error wrapping its
// *gpu.OutOfMemoryError, with nothing taken.
func (s *Store) ReserveHBM(states ...shard.State) error {
	s.slots.mu.Lock()
	twice := s.slots.classes != nil
	s.slots.mu.Unlock()
	if twice {
		return fmt.Errorf("tier: ReserveHBM called twice: %w", ErrBadMove)
	}
	want := map[hbmClassKey]int64{}
	models := map[hbmClassKey]bool{}     // classes that hold model state (not only saved inputs)
	stored := make([]int64, len(s.devs)) // the largest coded shard per device: its codec scratch
	s.mu.Lock()
	for _, e := range s.entries {
		if e.spec.Home != shard.HBM && slices.Contains(states, e.key.State) && int(e.key.Rank) < len(s.devs) {
			k := hbmClassKey{e.key.Rank, e.spec.Elems, e.spec.DType}
			want[k]++
			models[k] = models[k] || e.key.State != shard.Activation
			if e.spec.coded() {
				stored[e.key.Rank] = max(stored[e.key.Rank], e.storedBytes)
			}
		}
	}
	s.mu.Unlock()
	keys := make([]hbmClassKey, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b hbmClassKey) int {
		if a.rank != b.rank {
			return int(a.rank - b.rank)
		}
		return int(b.dt.Bytes(b.elems) - a.dt.Bytes(a.elems))
	})
	classes := map[hbmClassKey]*hbmClass{}
	bytes := make([]int64, len(s.devs))
	undo := func() {
		for k, c := range classes {
			s.devs[k.rank].Free(c.buf)
		}
	}
	for _, k := range keys {
		size := k.dt.Bytes(k.elems)
		n := min(want[k], s.pools[poolHBM+int(k.rank)].budget/size)
		if n == 0 {
			continue
		}
		tag := gpu.Tag{Kind: gpu.ModelState, Purpose: SlotPurpose}
		if !models[k] {
			tag = gpu.Tag{Kind: gpu.Activation, Purpose: InputSlotPurpose}
		}
		buf, err := s.devAlloc(k.rank, int(n)*k.elems, k.dt, tag)
		if err != nil {
			undo()
			return fmt.Errorf("tier: rank %d: %d hbm slots of %s: %w", k.rank, n, units.FormatBytes(size), err)
		}
		c := &hbmClass{rank: k.rank, elems: k.elems, dt: k.dt, n: int(n), buf: buf}
		for i := range int(n) {
			c.free = append(c.free, int(n)-1-i)
		}
		classes[k] = c
		bytes[k.rank] += buf.Bytes()
	}
	if err := s.reserveCodec(stored, bytes); err != nil {
		undo()
		return err
	}
	s.slots.mu.Lock()
	s.slots.classes, s.slots.bytes = classes, bytes
	s.slots.mu.Unlock()
	return nil
}

// SlotBytes is the device memory of each device's HBM slots (ReserveHBM).
func (s *Store) SlotBytes() []int64 {
	s.slots.mu.Lock()
	defer s.slots.mu.Unlock()
	return append([]int64(nil), s.slots.bytes...)
}

// takeSlot returns a free slot for a copy of e in HBM; ok is false when e
// has no slots (or, against the arithmetic above, none is free).
func (s *Store) takeSlot(e *entry) (mem, bool) {
	s.slots.mu.Lock()
	defer s.slots.mu.Unlock()
	c := s.slots.classes[hbmClassKey{e.key.Rank, e.spec.Elems, e.spec.DType}]
	if c == nil || len(c.free) == 0 {
		return mem{}, false
	}
	i := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	return mem{dev: c.buf.Slice(i*c.elems, c.elems), slot: c, slotIndex: i}, true
}

// putSlotLocked gives a slot back (s.mu held). After Close, the class's
// memory is freed with its last slot, once s.mu is released.
func (s *Store) putSlotLocked(m mem) {
	s.slots.mu.Lock()
	defer s.slots.mu.Unlock()
	c := m.slot
	c.free = append(c.free, m.slotIndex)
	if s.slots.closed && len(c.free) == c.n && c.buf != nil {
		s.frees = append(s.frees, pendingFree{c.rank, c.buf})
		c.buf = nil
	}
}

// closeSlotsLocked frees, once s.mu is released, the memory of every class
// whose slots are all back (Close, s.mu held); the others follow their
// last slot (putSlotLocked).
func (s *Store) closeSlotsLocked() {
	s.slots.mu.Lock()
	defer s.slots.mu.Unlock()
	s.slots.closed = true
	for _, c := range s.slots.classes {
		if len(c.free) == c.n && c.buf != nil {
			s.frees = append(s.frees, pendingFree{c.rank, c.buf})
			c.buf = nil
		}
	}
}
