package tier

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/pinned"
	"github.com/strata-ai/strata/shard"
)

// TestRandomMoves drives the store with random moves, leases, writes and
// reads from several goroutines under tight budgets, and checks:
//   - no budget is ever exceeded (current use and peak, per tier and per
//     device, in the store's accounting and in the device's and pool's own);
//   - every Read lease that succeeds sees exactly the bytes of the last
//     write of that shard (a model kept per shard), so no move ever exposes
//     stale or torn data as valid;
//   - Submit fails only with the documented errors, and moves never fail
//     (no faults are injected);
//   - at the end every shard's newest data survives a write-back home.
func TestRandomMoves(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { randomMoves(t, seed, false) })
	}
}

// TestRandomMovesTightPool is TestRandomMoves with a pinned pool no larger
// than the host budget, so that shards of many sizes coming and going
// fragment it: host copies are moved out of the way (Store.hostBuffer)
// while other goroutines move, lease and check them, and every Read lease
// still sees the last write. A request no relocation can serve (the copies
// around every run are leased or moving) is refused with the pool's
// budget error.
func TestRandomMovesTightPool(t *testing.T) {
	// One seed relocates about twice: the test asks for one over all. Of
	// 12 seeds, about one run in six lost a shard to a move back onto a
	// copy still arriving from its destination (transferLocked): 96 seeds
	// catch that in most runs.
	var moved int64
	for seed := uint64(1); seed <= 96; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { moved += randomMoves(t, seed, true) })
	}
	if moved == 0 && !t.Failed() {
		t.Error("a pool as tight as the budget never needed a relocation")
	}
}

const (
	randomWorkers = 3
	randomKeysPer = 5
	randomSteps   = 400
)

// shardModel is what a shard must hold: the bytes of its last write.
type shardModel struct {
	key  shard.Key
	want []byte
}

// randomCounts are the outcomes the test must have exercised.
type randomCounts struct {
	mu             sync.Mutex
	budget, waited int // Submits refused for budget, moves waited for
	fragmented     int // of budget: the pool's refusals (free bytes, no run)
}

func (c *randomCounts) add(budget, waited int) {
	c.mu.Lock()
	c.budget += budget
	c.waited += waited
	c.mu.Unlock()
}

// randomMoves runs the workers on a store; it returns the buffers the
// pinned pool relocated.
func randomMoves(t *testing.T, seed uint64, tight bool) int64 {
	checkLeaks(t)
	hbmBudget, hostBudget, nvmeBudget := 48*units.KiB, 128*units.KiB, 640*units.KiB
	pool := int64(units.MiB)
	if tight {
		pool = hostBudget
	}
	r := newRig(t, rigConfig{devices: 2, hbmBudgetBytes: hbmBudget, poolBytes: pool, hostBudgetBytes: hostBudget,
		swapBytes: 4 * units.MiB, nvmeBudgetBytes: nvmeBudget, stripeBytes: 8 * units.KiB})
	var (
		counts randomCounts
		mu     sync.Mutex
		all    []*shardModel
		wg     sync.WaitGroup
	)
	for w := range randomWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keys := randomWorker(t, r, seed, w, &counts)
			mu.Lock()
			all = append(all, keys...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		return 0
	}
	checkHome(t, r, all)
	st := r.s.Stats()
	checkBudgets(t, st)
	for i, d := range r.devs {
		if p := d.MemStats().PeakByKind[gpu.ModelState]; p > hbmBudget {
			t.Errorf("device %d: model-state peak %d over the store's budget %d", i, p, hbmBudget)
		}
	}
	if p := r.pool.Stats().PeakBytes; p > hostBudget {
		t.Errorf("pinned pool peak %d over the host budget %d", p, hostBudget)
	}
	if counts.budget == 0 || counts.waited == 0 || st.Links[shard.NVMeToHost].Moves == 0 || st.Links[shard.HBMToHost].Moves == 0 {
		t.Errorf("the test did not exercise the store: %d budget refusals, %d moves waited; %s", counts.budget, counts.waited, st)
	}
	ps := r.pool.Stats()
	t.Logf("%d budget refusals (%d of them the pool's, fragmented), %d moves waited, %d buffers relocated; %s",
		counts.budget, counts.fragmented, counts.waited, ps.Relocations, st)
	return ps.Relocations
}

// randomWorker registers a few shards of its own and runs random moves,
// writes and reads on them; it returns the shards with their last writes.
func randomWorker(t *testing.T, r *rig, seed uint64, w int, counts *randomCounts) []*shardModel {
	rng := rand.New(rand.NewPCG(seed, uint64(w)))
	var keys []*shardModel
	for i := range randomKeysPer {
		k := shard.Key{Chunk: shard.ChunkID(w*randomKeysPer + i), Rank: int32(rng.IntN(2)), State: shard.State(rng.IntN(shard.StateCount))}
		elems := 64 * (1 + rng.IntN(96)) // 256 B .. 24 KiB of f32, a multiple of the device's 64 B granule
		home := []shard.Tier{shard.Host, shard.NVMe, shard.NVMe, shard.HBM}[rng.IntN(4)]
		if home == shard.Host && i > 0 {
			home = shard.NVMe // keep host homes few, so the host tier has room to move
		}
		if err := r.s.Register(k, Spec{Elems: elems, DType: dtype.F32, Home: home}); err != nil {
			if errors.Is(err, ErrBudget) || errors.Is(err, pinned.ErrBudget) {
				continue // the budget is full, or the pool fragmented around copies other workers lease or move
			}
			t.Error(err)
			return nil
		}
		keys = append(keys, &shardModel{key: k, want: make([]byte, elems*4)})
	}
	var ops []*Op
	for step := 0; step < randomSteps && !t.Failed(); step++ {
		m := keys[rng.IntN(len(keys))]
		switch x := rng.IntN(10); {
		case x < 5: // a random move
			mv := shard.Move{Key: m.key, From: shard.Tier(rng.IntN(3)), To: shard.Tier(rng.IntN(3)), Reason: shard.Reason(rng.IntN(shard.ReasonCount))}
			op, err := r.s.Submit(mv)
			switch {
			case err == nil:
				ops = append(ops, op)
			case errors.Is(err, ErrBudget):
				counts.add(1, 0)
			case errors.Is(err, pinned.ErrBudget):
				counts.add(1, 0)
				counts.mu.Lock()
				counts.fragmented++
				counts.mu.Unlock()
			case errors.Is(err, ErrBusy), errors.Is(err, ErrNotResident), errors.Is(err, ErrBadMove):
			default:
				t.Errorf("%s: unexpected error %v", mv, err)
			}
		case x < 7 && len(ops) > 0: // wait for a move
			i := rng.IntN(len(ops))
			if err := ops[i].Wait(); err != nil {
				t.Errorf("%s: %v", ops[i].Move(), err)
			}
			counts.add(0, 1)
			ops = append(ops[:i], ops[i+1:]...)
		case x < 8: // write a new version
			randomWrite(t, r, m, shard.Tier(rng.IntN(2)), rng.Uint64())
		default: // read and check
			tr := shard.Tier(rng.IntN(2))
			l, err := r.s.Acquire(m.key, tr, shard.Read)
			if err != nil {
				if !errors.Is(err, ErrNotResident) {
					t.Errorf("read %s in %s: %v", m.key, tr, err)
				}
				continue
			}
			if got := r.contents(t, l); !bytes.Equal(got, m.want) {
				t.Errorf("step %d: %s in %s: a Read lease sees data that is not the last write", step, m.key, tr)
			}
			l.Release()
		}
		checkBudgets(t, r.s.Stats())
	}
	for _, op := range ops {
		if err := op.Wait(); err != nil {
			t.Errorf("%s: %v", op.Move(), err)
		}
	}
	return keys
}

// randomWrite writes a new version of m's shard through a Write lease in tr.
func randomWrite(t *testing.T, r *rig, m *shardModel, tr shard.Tier, seed uint64) {
	l, err := r.s.Acquire(m.key, tr, shard.Write)
	if err != nil {
		if !errors.Is(err, ErrNotResident) {
			t.Errorf("write %s in %s: %v", m.key, tr, err)
		}
		return
	}
	data := pattern(m.key, seed, int64(len(m.want)))
	if tr == shard.HBM {
		writeDevice(t, r, l.Buffer(), data)
	} else {
		copy(l.Bytes(), data)
	}
	l.Release()
	m.want = data
}

// checkHome evicts every copy to its home (host copies first: HBM
// write-backs to NVMe need host staging), then reads every shard back
// through host and compares it with its last write.
func checkHome(t *testing.T, r *rig, all []*shardModel) {
	for _, tr := range []shard.Tier{shard.Host, shard.NVMe, shard.HBM} {
		for _, m := range all {
			res, _ := r.s.Where(m.key)
			if tr == res.Spec.Home || !res.Copies[tr].Present {
				continue
			}
			op, err := r.s.Evict(m.key, tr)
			if err == nil {
				err = op.Wait()
			}
			if err != nil {
				t.Errorf("final evict %s from %s: %v", m.key, tr, err)
			}
		}
	}
	for _, m := range all {
		res, _ := r.s.Where(m.key)
		if res.Dirty || res.Lost != nil {
			t.Errorf("%s after eviction to home: %+v", m.key, res)
			continue
		}
		via := res.Spec.Home
		if via == shard.NVMe {
			op, err := r.s.Fetch(m.key, shard.NVMe, shard.Host)
			if err == nil {
				err = op.Wait()
			}
			if err != nil {
				t.Errorf("final fetch %s: %v", m.key, err)
				continue
			}
			via = shard.Host
		}
		l, err := r.s.Acquire(m.key, via, shard.Read)
		if err != nil {
			t.Errorf("final read %s: %v", m.key, err)
			continue
		}
		if !bytes.Equal(r.contents(t, l), m.want) {
			t.Errorf("%s: data after write-back home differs from the last write", m.key)
		}
		l.Release()
		if via != res.Spec.Home {
			if _, err := r.s.Evict(m.key, via); err != nil {
				t.Error(err)
			}
		}
	}
}

func writeDevice(t testing.TB, r *rig, b gpu.Buffer, data []byte) {
	d := r.devs[b.DeviceIndex()]
	st := d.NewStream()
	d.CopyHostToDevice(st, b, 0, data)
	if err := st.Synchronize(); err != nil {
		t.Error(err)
	}
}
