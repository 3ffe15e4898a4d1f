package tier

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/dtype"
	"github.com/strata-ai/strata/internal/shard"
	"github.com/strata-ai/strata/internal/units"
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
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { randomMoves(t, seed) })
	}
}

func randomMoves(t *testing.T, seed uint64) {
	checkLeaks(t)
	const (
		workers = 3
		keysPer = 5
		steps   = 400
	)
	hbmBudget, hostBudget, nvmeBudget := 48*units.KiB, 128*units.KiB, 640*units.KiB
	r := newRig(t, rigConfig{devices: 2, hbmBudgetBytes: hbmBudget, poolBytes: 1 * units.MiB, hostBudgetBytes: hostBudget,
		swapBytes: 4 * units.MiB, nvmeBudgetBytes: nvmeBudget, stripeBytes: 8 * units.KiB})
	var (
		mu      sync.Mutex
		budgetN int
		okMoves int
	)
	type model struct {
		key  shard.Key
		want []byte
	}
	var all []*model
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			var keys []*model
			for i := range keysPer {
				k := shard.Key{Chunk: shard.ChunkID(w*keysPer + i), Rank: int32(rng.IntN(2)), State: shard.State(rng.IntN(shard.StateCount))}
				elems := 64 * (1 + rng.IntN(96)) // 256 B .. 24 KiB of f32, a multiple of the device's 64 B granule
				home := []shard.Tier{shard.Host, shard.NVMe, shard.NVMe, shard.HBM}[rng.IntN(4)]
				if home == shard.Host && i > 0 {
					home = shard.NVMe // keep host homes few, so the host tier has room to move
				}
				if err := r.s.Register(k, Spec{Elems: elems, DType: dtype.F32, Home: home}); err != nil {
					if errors.Is(err, ErrBudget) {
						continue
					}
					t.Error(err)
					return
				}
				keys = append(keys, &model{key: k, want: make([]byte, elems*4)})
			}
			var ops []*Op
			for step := 0; step < steps && !t.Failed(); step++ {
				m := keys[rng.IntN(len(keys))]
				switch x := rng.IntN(10); {
				case x < 5: // a random move
					mv := Move{Key: m.key, From: shard.Tier(rng.IntN(3)), To: shard.Tier(rng.IntN(3)), Reason: Reason(rng.IntN(int(reasonCount)))}
					op, err := r.s.Submit(mv)
					switch {
					case err == nil:
						ops = append(ops, op)
					case errors.Is(err, ErrBudget):
						mu.Lock()
						budgetN++
						mu.Unlock()
					case errors.Is(err, ErrBusy), errors.Is(err, ErrNotResident), errors.Is(err, ErrBadMove):
					default:
						t.Errorf("%s: unexpected error %v", mv, err)
					}
				case x < 7 && len(ops) > 0: // wait for a move
					i := rng.IntN(len(ops))
					if err := ops[i].Wait(); err != nil {
						t.Errorf("%s: %v", ops[i].Move(), err)
					}
					mu.Lock()
					okMoves++
					mu.Unlock()
					ops = append(ops[:i], ops[i+1:]...)
				case x < 8: // write a new version
					tr := shard.Tier(rng.IntN(2))
					l, err := r.s.Acquire(m.key, tr, Write)
					if err != nil {
						if !errors.Is(err, ErrNotResident) {
							t.Errorf("write %s in %s: %v", m.key, tr, err)
						}
						continue
					}
					data := pattern(m.key, rng.Uint64(), int64(len(m.want)))
					if tr == shard.HBM {
						writeDevice(t, r, l.Buffer(), data)
					} else {
						copy(l.Bytes(), data)
					}
					l.Release()
					m.want = data
				default: // read and check
					tr := shard.Tier(rng.IntN(2))
					l, err := r.s.Acquire(m.key, tr, Read)
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
			mu.Lock()
			all = append(all, keys...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// Everything home (host copies first: HBM write-backs to NVMe need host
	// staging), then read every shard back through host.
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
		l, err := r.s.Acquire(m.key, via, Read)
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
	if budgetN == 0 || okMoves == 0 || st.Links[NVMeToHost].Moves == 0 || st.Links[HBMToHost].Moves == 0 {
		t.Errorf("the test did not exercise the store: %d budget refusals, %d moves waited; %s", budgetN, okMoves, st)
	}
	t.Logf("%d budget refusals, %d moves waited; %s", budgetN, okMoves, st)
}

func writeDevice(t testing.TB, r *rig, b gpu.Buffer, data []byte) {
	d := r.devs[b.DeviceIndex()]
	st := d.NewStream()
	d.CopyHostToDevice(st, b, 0, data)
	if err := st.Synchronize(); err != nil {
		t.Error(err)
	}
}
