package tier

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/shard"
)

// bf16 is the slot class of a bf16 shard of the given bytes.
func bf16(bytes int64) SlotClass { return SlotClass{Elems: int(bytes / 2), DType: dtype.BF16} }

func TestSlabBytes(t *testing.T) {
	shards := []SlotClass{bf16(1000), bf16(300), bf16(300), bf16(300), bf16(300), bf16(0)}
	for _, c := range []struct{ budget, want int64 }{
		{0, 0},
		{299, 0},
		{600, 600},          // two small, the large does not fit
		{1000, 1000 + 900},  // one large, three small
		{1300, 1000 + 1200}, // every small one
		{2200, 2200},        // every shard: exactly their bytes
		{1 << 40, 2200},
	} {
		if got := SlabBytes(c.budget, shards); got != c.want {
			t.Errorf("SlabBytes(%d) = %d, want %d", c.budget, got, c.want)
		}
	}
	// 150 f32 elements are 600 bytes as 300 bf16 are, but another class
	// (another buffer of slots): 2 of them fit in 1300 beside 4 of bf16.
	if got := SlabBytes(1300, append(shards, SlotClass{Elems: 150, DType: dtype.F32}, SlotClass{Elems: 150, DType: dtype.F32})); got != 1000+1200+1200 {
		t.Errorf("SlabBytes(1300) with two f32 shards = %d, want %d", got, 1000+1200+1200)
	}
}

// TestPlanBudgetsSlots: the HBM slots must fit what is left on the device:
// the default budget is lowered until they do; an explicit one that does
// not fit is an error saying so. With the saved inputs of
// cpu_checkpointing the params' room is lowered, the inputs' kept, and
// the inputs' class has as many slots as the whole budget can hold.
func TestPlanBudgetsSlots(t *testing.T) {
	shards := []SlotClass{bf16(1000)}
	for range 10 {
		shards = append(shards, bf16(300))
	}
	s := Sizes{Ranks: 1, ParamBytes: 4000, MaxParamBytes: 1000, SlotShards: shards, HBMFreeBytes: 3500}
	b, err := PlanBudgets(s)
	if err != nil {
		t.Fatal(err)
	}
	// 3500 of budget would take 1000 + 10×300 = 4000 of slots; up to 2699
	// it takes 1000 + 8×300 = 3400, which fits.
	if b.HBMBytes != 2699 || b.HBMSlabBytes != 3400 {
		t.Errorf("budget %d, slots %d; want 2699 and 3400", b.HBMBytes, b.HBMSlabBytes)
	}
	s.HBMBytes = 3000
	if _, err := PlanBudgets(s); err == nil || !strings.Contains(err.Error(), "slots") {
		t.Errorf("an explicit budget whose slots do not fit: %v", err)
	}
	s.HBMBytes, s.HBMFreeBytes = 0, 1<<20
	if b, err := PlanBudgets(s); err != nil || b.HBMBytes != 4000 || b.HBMSlabBytes != 4000 {
		t.Errorf("room for every shard: %+v, %v", b, err)
	}

	// Six saved inputs of 400 bytes (f32), room for two (800): the budget
	// is 4000 + 800, which could hold all six inputs at once (the planner
	// may evict params for them), so they get six slots.
	in := SlotClass{Elems: 100, DType: dtype.F32}
	s = Sizes{Ranks: 1, ParamBytes: 4000, MaxParamBytes: 1000, HBMFreeBytes: 1 << 20, ActivationHBMBytes: 800,
		SlotShards: append(slices.Clone(shards), in, in, in, in, in, in)}
	if b, err := PlanBudgets(s); err != nil || b.HBMBytes != 4800 || b.HBMSlabBytes != 4000+2400 {
		t.Errorf("room for every shard and input: %+v, %v; want budget 4800, slots 6400", b, err)
	}
	// 6200 left: 4000 + 800 of budget would take 1000 + 10×300 + 6×400 =
	// 6400 of slots; up to 2999 (2199 for the params, 800 for the inputs)
	// it takes 1000 + 9×300 + 6×400 = 6100, which fits.
	s.HBMFreeBytes = 6200
	if b, err := PlanBudgets(s); err != nil || b.HBMBytes != 2999 || b.HBMSlabBytes != 6100 {
		t.Errorf("6200 left: %+v, %v; want budget 2999, slots 6100", b, err)
	}
	// 5000 left: the slots of any budget with two of the largest params
	// (2000) beside the inputs' room take more.
	s.HBMFreeBytes = 5000
	if _, err := PlanBudgets(s); err == nil || !strings.Contains(err.Error(), "at least two of the largest") || !strings.Contains(err.Error(), "saved block inputs") {
		t.Errorf("5000 left: %v", err)
	}
	// An explicit budget whose slots, inputs included, do not fit.
	s.HBMFreeBytes, s.HBMBytes = 6200, 4000
	if _, err := PlanBudgets(s); err == nil || !strings.Contains(err.Error(), "slots") || !strings.Contains(err.Error(), "saved block inputs") {
		t.Errorf("an explicit budget whose slots with the inputs' do not fit: %v", err)
	}
	// Inputs only (the optimizer on the device): two slots, the room.
	s = Sizes{Ranks: 1, HBMFreeBytes: 1000, ActivationHBMBytes: 800, SlotShards: []SlotClass{in, in, in, in}}
	if b, err := PlanBudgets(s); err != nil || b.HBMBytes != 800 || b.HBMSlabBytes != 800 {
		t.Errorf("inputs only: %+v, %v; want budget and slots 800", b, err)
	}
}

// TestHBMSlots: with ReserveHBM, copies of the reserved shards move in and
// out of HBM (fetches, evictions, write-backs of dirty copies, from two
// ranks at once) with no device allocation after the reservation, in
// slots per shard size as SlabBytes counts them, and keep their bytes; a
// slot leased at Close is freed at its last Release.
func TestHBMSlots(t *testing.T) {
	checkLeaks(t)
	const budget = 3 * 2 * 1000 // three of the large shards' bytes
	r := newRig(t, rigConfig{devices: 2, hbmBudgetBytes: budget})
	type shardOf struct {
		key  shard.Key
		data []byte
	}
	var keys []shardOf
	var sizes []SlotClass
	for rank := range int32(2) {
		for c, n := range []int{1000, 300, 300, 300, 300, 300} {
			k := shard.Key{Chunk: shard.ChunkID(c), Rank: rank, State: shard.Param}
			if err := r.s.Register(k, Spec{Elems: n, DType: dtype.BF16, Home: shard.Host}); err != nil {
				t.Fatal(err)
			}
			d := pattern(k, 1, int64(2*n))
			r.put(t, k, shard.Host, d)
			keys = append(keys, shardOf{k, d})
			if rank == 0 {
				sizes = append(sizes, bf16(int64(2*n)))
			}
		}
		// Optimizer state is not reserved: it never goes to HBM here.
		if err := r.s.Register(shard.Key{Chunk: 9, Rank: rank, State: shard.Master}, Spec{Elems: 500, DType: dtype.F32, Home: shard.Host}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.s.ReserveHBM(shard.Param); err != nil {
		t.Fatal(err)
	}
	if err := r.s.ReserveHBM(shard.Param); !errors.Is(err, ErrBadMove) {
		t.Errorf("a second ReserveHBM: %v", err)
	}
	for i, b := range r.s.SlotBytes() {
		want := units.AlignUp(SlabBytes(budget, sizes[:1]), 64) + units.AlignUp(SlabBytes(budget, sizes[1:]), 64)
		if b != SlabBytes(budget, sizes) || r.devs[i].MemStats().InUseByPurpose["tier hbm copies"] != want {
			t.Errorf("device %d: slots of %d B (SlabBytes %d), %d B on the device", i, b, SlabBytes(budget, sizes), r.devs[i].MemStats().InUseByPurpose["tier hbm copies"])
		}
	}
	before := []gpu.DriverCounters{r.devs[0].DriverCounters(), r.devs[1].DriverCounters()}
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 6 {
				for i := range keys {
					// Each rank walks its shards from a different start, so
					// that different slots hold different shards.
					j := (i + round) % len(keys)
					k := keys[j].key
					if int(k.Rank) != rank {
						continue
					}
					if err := cycleHBM(r, k, keys[j].data, round%2 == 1); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	for i, d := range r.devs {
		if got := d.DriverCounters(); got != before[i] {
			t.Errorf("device %d: driver counters %+v after the moves, %+v before", i, got, before[i])
		}
	}
	checkBudgets(t, r.s.Stats())
	// A copy leased at Close keeps its slot until its last Release.
	k := keys[0].key
	r.mustWait(r.s.Fetch(k, shard.Host, shard.HBM))
	l, err := r.s.Acquire(k, shard.HBM, shard.Read)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.s.Close(); err == nil {
		t.Error("close with a leased HBM copy: no error")
	}
	if got := r.contents(t, l); !bytes.Equal(got, keys[0].data) {
		t.Error("the leased copy changed at Close")
	}
	l.Release()
	for i, d := range r.devs {
		if in := d.MemStats().InUseBytes; in != 0 {
			t.Errorf("device %d: %d B left after Close and the last Release", i, in)
		}
	}
}

// TestHBMInputSlots: saved block inputs (shard.Activation) reserved with
// the params get slots of their own class, tagged gpu.Activation ("tier
// hbm inputs", so the device counts them with the activations), as many
// as the whole budget can hold (it is shared with the params); a class
// that holds a param too is model state. Their copies move in and out of
// HBM with no device allocation.
func TestHBMInputSlots(t *testing.T) {
	checkLeaks(t)
	const budget = 2*1000 + 2*800 // two params, two inputs
	r := newRig(t, rigConfig{devices: 1, hbmBudgetBytes: budget})
	var keys []shard.Key
	var data [][]byte
	reg := func(c int, st shard.State, n int, dt dtype.DType) {
		k := shard.Key{Chunk: shard.ChunkID(c), State: st}
		if err := r.s.Register(k, Spec{Elems: n, DType: dt, Home: shard.Host}); err != nil {
			t.Fatal(err)
		}
		d := pattern(k, 3, int64(n*dt.Size()))
		r.put(t, k, shard.Host, d)
		keys, data = append(keys, k), append(data, d)
	}
	for c := range 3 {
		reg(c, shard.Param, 500, dtype.BF16)
	}
	for c := range 5 {
		reg(c, shard.Activation, 200, dtype.F32) // 800 B: 4 fit in the budget
	}
	reg(9, shard.Activation, 500, dtype.BF16) // a param's class: model state
	if err := r.s.ReserveHBM(shard.Param, shard.Activation); err != nil {
		t.Fatal(err)
	}
	ms := r.devs[0].MemStats()
	if got, want := ms.InUseByPurpose[InputSlotPurpose], units.AlignUp(4*800, 64); got != want {
		t.Errorf("input slots: %d B, want %d (4 of the 5 inputs: the budget holds 4)", got, want)
	}
	if got, want := ms.InUseByPurpose[SlotPurpose], units.AlignUp(3*1000, 64); got != want {
		t.Errorf("param slots: %d B, want %d (3 params and the input of their class: the budget holds 3)", got, want)
	}
	if got, want := ms.InUseByKind[gpu.Activation], ms.InUseByPurpose[InputSlotPurpose]; got != want {
		t.Errorf("activation memory %d B, want the input slots' %d", got, want)
	}
	before := r.devs[0].DriverCounters()
	for round := range 3 {
		for i, k := range keys {
			if err := cycleHBM(r, k, data[i], (round+i)%2 == 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := r.devs[0].DriverCounters(); got != before {
		t.Errorf("driver counters %+v after the moves, %+v before", got, before)
	}
}

// cycleHBM fetches k to HBM, checks its bytes there, and evicts it; dirty
// rewrites it in HBM first (the eviction then writes it back home).
func cycleHBM(r *rig, k shard.Key, data []byte, dirty bool) error {
	op, err := r.s.Fetch(k, shard.Host, shard.HBM)
	if err != nil {
		return err
	}
	if err := op.Wait(); err != nil {
		return err
	}
	l, err := r.s.Acquire(k, shard.HBM, shard.Read)
	if err != nil {
		return err
	}
	got := r.contents(r.t, l)
	l.Release()
	if !bytes.Equal(got, data) {
		return fmt.Errorf("%s: bytes differ in HBM", k)
	}
	if dirty {
		w, err := r.s.Acquire(k, shard.HBM, shard.Write)
		if err != nil {
			return err
		}
		d := r.devs[k.Rank]
		st := d.NewStream()
		d.CopyHostToDevice(st, w.Buffer(), 0, data)
		if err := st.Synchronize(); err != nil {
			return err
		}
		w.Release()
	}
	ev, err := r.s.Evict(k, shard.HBM)
	if err != nil {
		return err
	}
	return ev.Wait()
}

// freeProbe is a device whose Free first checks that the store's lock is
// free: it waits until another goroutine has taken and released it. Held
// by the caller (cuMemFree under the store's mutex: the GPU waits for a
// rank that waits for the mutex), that never happens, and the probe
// reports it once it has waited 20 seconds (a hang guard, not a timing),
// then stops probing.
type freeProbe struct {
	gpu.Device
	s      atomic.Pointer[Store]
	frees  atomic.Int64
	locked atomic.Int64
}

func (p *freeProbe) Free(b gpu.Buffer) {
	if s := p.s.Load(); s != nil && p.locked.Load() == 0 { // one hang is enough to fail
		done := make(chan struct{})
		go func() {
			s.mu.Lock()
			s.mu.Unlock()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			p.locked.Add(1)
		}
		p.frees.Add(1)
	}
	p.Device.Free(b)
}

// TestNoDeviceFreeUnderLock: copies outside the slots (no ReserveHBM) are
// allocated and freed per move; the free never runs while the store's
// lock is held (evictions, write-backs and lease releases of two ranks at
// once, under the race detector in CI).
func TestNoDeviceFreeUnderLock(t *testing.T) {
	checkLeaks(t)
	var probes []*freeProbe
	r := newRig(t, rigConfig{devices: 2, wrapDevs: func(ds []gpu.Device) []gpu.Device {
		for i, d := range ds {
			p := &freeProbe{Device: d}
			probes = append(probes, p)
			ds[i] = p
		}
		return ds
	}})
	for _, p := range probes {
		p.s.Store(r.s)
	}
	var wg sync.WaitGroup
	for rank := range int32(2) {
		var keys []shard.Key
		var data [][]byte
		for c := range 4 {
			k := shard.Key{Chunk: shard.ChunkID(c), Rank: rank, State: shard.Param}
			if err := r.s.Register(k, Spec{Elems: 4096, DType: dtype.BF16, Home: shard.Host}); err != nil {
				t.Fatal(err)
			}
			d := pattern(k, 2, 8192)
			r.put(t, k, shard.Host, d)
			keys, data = append(keys, k), append(data, d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 4 {
				for i, k := range keys {
					if err := cycleHBM(r, k, data[i], (round+i)%2 == 0); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	for i, p := range probes {
		if p.frees.Load() == 0 {
			t.Errorf("device %d: no free: the test moved nothing out of HBM", i)
		}
		if n := p.locked.Load(); n != 0 {
			t.Errorf("device %d: %d frees ran holding the store's lock", i, n)
		}
	}
}
