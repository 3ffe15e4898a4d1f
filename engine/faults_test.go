package engine

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tier"
)

// allocFaults is a device that, once armed with k, refuses the k-th
// following allocation whose purpose is purpose, with the
// *gpu.OutOfMemoryError a full device gives: an OOM inside a pass, at a
// chosen hook, without shrinking the budget New checks.
type allocFaults struct {
	gpu.Device
	purpose string
	left    atomic.Int64 // matching allocations until the failing one; <= 0: disarmed
	failed  atomic.Int64
}

func (d *allocFaults) arm(k int) { d.left.Store(int64(k)) }

func (d *allocFaults) Alloc(n int, dt gpu.DType, tag gpu.Tag) (gpu.Buffer, error) {
	if tag.Purpose == d.purpose && d.left.Load() > 0 && d.left.Add(-1) == 0 {
		d.failed.Add(1)
		return nil, &gpu.OutOfMemoryError{Device: d.Index(), RequestedBytes: int64(n * dt.Size()), Tag: tag, Stats: d.MemStats()}
	}
	return d.Device.Alloc(n, dt, tag)
}

// stepWithin runs e.Step and panics, with the test's name, if it does not
// return within a minute: a rank waiting for a collective its failed peer
// never issued.
func stepWithin(t *testing.T, e *Engine) (report.StepStats, error) {
	t.Helper()
	type result struct {
		st  report.StepStats
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := e.Step()
		done <- result{st, err}
	}()
	select {
	case r := <-done:
		return r.st, r.err
	case <-time.After(time.Minute):
		// Not t.Fatal: the engine's Close, a cleanup, waits for the hung
		// streams too (the panic ends in the runtime's deadlock report or
		// go test's timeout); say why first.
		msg := fmt.Sprintf("%s: step %d hangs: a rank waits for a collective its failed peer never issues", t.Name(), e.StepCount()+1)
		fmt.Fprintln(os.Stderr, msg)
		panic(msg)
	}
}

// checkFaultMessage checks that err names the engine once (the error is
// wrapped once per package boundary) and the shard: chunk, rank, state.
func checkFaultMessage(t *testing.T, err error, more ...string) {
	t.Helper()
	msg := err.Error()
	if n := strings.Count(msg, "engine:"); n != 1 {
		t.Errorf("%q names the engine %d times, want once", msg, n)
	}
	state := false
	for st := range shard.StateCount {
		state = state || strings.Contains(msg, shard.State(st).String())
	}
	if !state {
		t.Errorf("%q names no state", msg)
	}
	for _, want := range append([]string{"chunk ", "rank "}, more...) {
		if !strings.Contains(msg, want) {
			t.Errorf("%q does not name %q", msg, want)
		}
	}
}

// TestWorkspaceOOM: the device memory a step uses (gathered chunks,
// gradient buckets, reduce shards, the gradient shards bound for the tier
// store, the tier store's HBM slots) is taken at New, so a device that
// cannot hold it is refused there, on the last rank (N = 1, 2, 4), with
// the *gpu.OutOfMemoryError naming the allocation and one error naming the
// engine once and the rank; nothing is left allocated on any device, and
// an engine made next on the same devices trains to the bits of a run that
// never failed. (No step allocates: TestNoDeviceAllocsAfterStep1.)
func TestWorkspaceOOM(t *testing.T) {
	cases := []struct {
		spec    runSpec
		purpose string
		k       int // the k-th allocation of purpose fails
	}{
		{runSpec{stage: 3, micro: 1, accum: 1}, "gathered chunk", 2},
		{runSpec{stage: 3, micro: 1, accum: 2}, "grad bucket", 3},
		{runSpec{stage: 2, micro: 1, accum: 1}, "grad bucket", 1},
		{runSpec{stage: 2, micro: 1, accum: 2}, "reduce shard", 2},
	}
	const steps = 3
	for _, n := range []int{1, 2, 4} {
		for _, c := range cases {
			s := c.spec
			s.n = n
			t.Run(fmt.Sprintf("%v/%s%d", s, strings.ReplaceAll(c.purpose, " ", "-"), c.k), func(t *testing.T) {
				want, _ := runEngine(t, s, steps)
				cdevs, comms, err := cpu.New(cpu.Options{Devices: n, HBMBytes: 256 << 20})
				if err != nil {
					t.Fatal(err)
				}
				devs := cpu.Devices(cdevs)
				faulty := &allocFaults{Device: devs[n-1], purpose: c.purpose}
				devs[n-1] = faulty
				faulty.arm(c.k)
				cfg := testConfig(t, s.configJSON())
				opts := Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2}
				_, err = startEngine(t, cfg, devs, comms, opts)
				checkNewOOM(t, err, faulty, c.purpose, n-1)
				e, err := startEngine(t, cfg, devs, comms, opts)
				if err != nil {
					t.Fatal(err)
				}
				trainFor(t, e, steps)
				p, m := readState(t, e)
				if d, x := diff(p, want.params); d != 0 {
					t.Errorf("%d params differ from the run without a failure (max %g)", d, x)
				}
				if d, x := diff(m, want.master); d != 0 {
					t.Errorf("%d master weights differ (max %g)", d, x)
				}
			})
		}
	}
}

// checkNewOOM checks New's error err: the refused allocation of purpose
// on faulty (rank), named once by the engine with the rank, and every
// device empty again.
func checkNewOOM(t *testing.T, err error, faulty *allocFaults, purpose string, rank int) {
	t.Helper()
	if err == nil {
		t.Fatalf("New succeeded; %d allocations refused", faulty.failed.Load())
	}
	t.Logf("%v", err)
	var oom *gpu.OutOfMemoryError
	if !errors.As(err, &oom) || oom.Tag.Purpose != purpose {
		t.Errorf("%v is not the refused %q", err, purpose)
	}
	msg := err.Error()
	if strings.Count(msg, "engine:") != 1 || !strings.Contains(msg, fmt.Sprintf("rank %d", rank)) {
		t.Errorf("%q does not name the engine once and rank %d", msg, rank)
	}
	if in := faulty.MemStats().InUseBytes; in != 0 {
		t.Errorf("%d bytes left on the device after the failed New", in)
	}
}

// TestTierSlotOOM: as TestWorkspaceOOM for the tier store's HBM slots
// (params and optimizer state on NVMe, N = 1, 2), for the gradient shards
// bound for it, and, with cpu_checkpointing, for the saved inputs' slots
// (taken after the params', which the failure gives back).
func TestTierSlotOOM(t *testing.T) {
	nvmetest.Require(t)
	const steps = 3
	for _, n := range []int{1, 2} {
		for _, purpose := range []string{tier.SlotPurpose, "grad shard", tier.InputSlotPurpose} {
			t.Run(fmt.Sprintf("N%d/%s", n, strings.ReplaceAll(purpose, " ", "-")), func(t *testing.T) {
				s := tierSpec{n: n, param: "nvme", opt: "nvme", shapeJSON: deepShapeJSON}
				if purpose == tier.InputSlotPurpose {
					s.ckpt = `{"cpu_checkpointing": true}` // the inputs' slots after the params'
				}
				want, _ := runTier(t, s, Options{}, steps)
				cdevs, comms, err := cpu.New(cpu.Options{Devices: n, HBMBytes: 256 << 20})
				if err != nil {
					t.Fatal(err)
				}
				devs := cpu.Devices(cdevs)
				faulty := &allocFaults{Device: devs[n-1], purpose: purpose}
				devs[n-1] = faulty
				faulty.arm(1)
				cfg := testConfig(t, s.configJSON(nvmetest.Dir(t)))
				opts := Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2}
				_, err = startEngine(t, cfg, devs, comms, opts)
				checkNewOOM(t, err, faulty, purpose, n-1)
				e, err := startEngine(t, cfg, devs, comms, opts)
				if err != nil {
					t.Fatal(err)
				}
				trainFor(t, e, steps)
				p, m := readState(t, e)
				if d, x := diff(p, want.params); d != 0 {
					t.Errorf("%d params differ from the run without a failure (max %g)", d, x)
				}
				if d, x := diff(m, want.master); d != 0 {
					t.Errorf("%d master weights differ (max %g)", d, x)
				}
			})
		}
	}
}

func readState(t *testing.T, e *Engine) (params, master [][]float32) {
	t.Helper()
	var err error
	if params, err = e.Params(); err != nil {
		t.Fatal(err)
	}
	if master, err = e.Master(); err != nil {
		t.Fatal(err)
	}
	return params, master
}

func memInUse(e *Engine) []int64 {
	var out []int64
	for _, r := range e.ranks {
		out = append(out, r.dev.MemStats().InUseBytes)
	}
	return out
}

// switchNVMe passes requests to the device until armed, then to a
// nvme.Faulty over it.
type switchNVMe struct {
	nvme.Device
	faulty *nvme.Faulty
	armed  atomic.Bool
}

func (d *switchNVMe) dev() nvme.Device {
	if d.armed.Load() {
		return d.faulty
	}
	return d.Device
}

func (d *switchNVMe) Submit(reqs ...*nvme.Request) error { return d.dev().Submit(reqs...) }
func (d *switchNVMe) ReadAt(f *nvme.File, buf []byte, off int64) error {
	return d.dev().ReadAt(f, buf, off)
}
func (d *switchNVMe) WriteAt(f *nvme.File, buf []byte, off int64) error {
	return d.dev().WriteAt(f, buf, off)
}
func (d *switchNVMe) Sync(f *nvme.File) error { return d.dev().Sync(f) }

// TestTierFaultInPass: an NVMe read error in the step after a good one
// (params and optimizer state on NVMe, on 1 and 2 ranks) ends Step with
// one error naming the engine once, the shard (chunk, rank, state) and
// the swap file, without hanging the other rank, and nothing is updated:
// the params and master weights in the tier store are those of the step
// before. (Read around the failed planners: Params and Master refuse to
// run after a tier failure, as every later Step does.)
//
// The same with a mixture of experts whose ranks reach only some experts
// (routedSource): the failed rank drains its step's calls, joining the
// peers' union of routed experts with none of its own and skipping what
// they skip, so that it issues their gathers.
func TestTierFaultInPass(t *testing.T) {
	nvmetest.Require(t)
	moe := strings.Replace(mixtralShapeJSON, `"num_experts": 4`, `"num_experts": 8`, 1)
	for _, c := range []struct {
		name  string
		n     int
		shape string
	}{{"N1", 1, deepShapeJSON}, {"N2", 2, deepShapeJSON}, {"N2/moe", 2, moe}} {
		t.Run(c.name, func(t *testing.T) {
			n := c.n
			var sw *switchNVMe
			s := tierSpec{n: n, param: "nvme", opt: "nvme", shapeJSON: c.shape}
			o := Options{NVMeDevice: func(d nvme.Device) nvme.Device {
				sw = &switchNVMe{Device: d, faulty: nvme.NewFaulty(d, nvme.Fault{Kind: nvme.FaultEIO, Op: nvme.OpRead, Nth: 1})}
				return sw
			}}
			if c.shape == moe {
				lo, err := model.NewLayout(model.Shape(*testConfig(t, s.configJSON(t.TempDir())).Shape()))
				if err != nil {
					t.Fatal(err)
				}
				o.Init = routedSource{lo, testSeed, nil}
			}
			e := newTierEngine(t, s, o)
			if _, err := e.Step(); err != nil {
				t.Fatal(err)
			}
			params, master := readState(t, e)
			sw.armed.Store(true)
			_, err := stepWithin(t, e)
			sw.armed.Store(false)
			if err == nil {
				t.Fatalf("step 2 succeeded; %d faults injected", sw.faulty.Injected(nvme.FaultEIO))
			}
			t.Logf("%v", err)
			checkFaultMessage(t, err, "step 2", ".swap")
			if !strings.Contains(err.Error(), "EIO") {
				t.Errorf("%q does not say EIO", err)
			}
			if e.StepCount() != 1 {
				t.Errorf("step count %d after the failed step, want 1", e.StepCount())
			}
			p2, m2 := readTierState(t, e)
			if m, _ := diff(p2, params); m != 0 {
				t.Errorf("%d params changed in the failed step", m)
			}
			if m, _ := diff(m2, master); m != 0 {
				t.Errorf("%d master weights changed in the failed step", m)
			}
			if _, err := e.Step(); err == nil {
				t.Error("the step after the failure succeeded")
			}
		})
	}
}

// readTierState is Params and Master of an engine whose planners have
// failed: it waits for their moves in flight and reads every shard
// around them.
func readTierState(t *testing.T, e *Engine) (params, master [][]float32) {
	t.Helper()
	for _, d := range e.tiers.runners {
		d.Pause() // its error is the one the step returned
	}
	defer e.tiers.resume()
	for _, r := range e.ranks {
		if err := r.sync(); err != nil {
			t.Fatal(err)
		}
	}
	read := func(f func(*rank, int) ([]float32, error)) [][]float32 {
		out := make([][]float32, len(e.chunks))
		for c, p := range e.chunks {
			for _, r := range e.ranks {
				v, err := f(r, c)
				if err != nil {
					t.Fatalf("chunk %d rank %d: %v", c, r.idx, err)
				}
				out[c] = append(out[c], v...)
			}
			out[c] = out[c][:p.len]
		}
		return out
	}
	state := func(s shard.State, dt gpu.DType) func(*rank, int) ([]float32, error) {
		return func(r *rank, c int) ([]float32, error) {
			dst := make([]byte, e.chunks[c].shard*dt.Size())
			if err := r.saveShard(c, s, dst); err != nil {
				return nil, err
			}
			if err := r.sync(); err != nil {
				return nil, err
			}
			return decode(dst, dt), nil
		}
	}
	return read(state(shard.Param, e.precision)), read(state(shard.Master, gpu.F32))
}
