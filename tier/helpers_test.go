package tier

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/leaktest"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/pinned"
	"github.com/strata-ai/strata/shard"
)

// rigConfig sizes a test store. Zero budgets mean the resources' size.
type rigConfig struct {
	devices         int
	deviceBytes     int64 // per device memory
	hbmBudgetBytes  int64
	poolBytes       int64 // pinned pool (kept small: RLIMIT_MEMLOCK is 8 MiB for non-root)
	hostBudgetBytes int64
	swapBytes       int64 // 0: no NVMe tier
	swapPaths       int   // default 2 (striping)
	stripeBytes     int64
	nvmeBudgetBytes int64
	faults          []nvme.Fault
	wrap            func(nvme.Device) nvme.Device // wraps the device (after faults)
	noFixedIO       bool                          // do not register arenas and swap files (as before the store did)
	onComplete      func(shard.Move, error)
	wrapDevs        func([]gpu.Device) []gpu.Device // stands in for the devices the store is given
}

type rig struct {
	t      testing.TB
	s      *Store
	devs   []*cpu.Device
	pool   *pinned.Pool
	swap   *nvme.Swap
	faulty *nvme.Faulty
	eng    *nvme.Engine
	paths  []string
}

func newRig(t testing.TB, c rigConfig) *rig {
	t.Helper()
	if c.devices == 0 {
		c.devices = 1
	}
	if c.deviceBytes == 0 {
		c.deviceBytes = 64 * units.MiB
	}
	if c.poolBytes == 0 {
		c.poolBytes = 4 * units.MiB
	}
	if c.swapPaths == 0 {
		c.swapPaths = 2
	}
	if c.stripeBytes == 0 {
		c.stripeBytes = 64 * units.KiB
	}
	r := &rig{t: t}
	devs, _, err := cpu.New(cpu.Options{Devices: c.devices, HBMBytes: c.deviceBytes, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	r.devs = devs
	r.pool, err = pinned.New(pinned.Options{BudgetBytes: c.poolBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.pool.Close(); err != nil {
			t.Errorf("pinned pool close: %v", err)
		}
	})
	gdevs := cpu.Devices(devs)
	if c.wrapDevs != nil {
		gdevs = c.wrapDevs(gdevs)
	}
	o := Options{Devices: gdevs, HBMBudgetBytes: c.hbmBudgetBytes, Host: r.pool, HostBudgetBytes: c.hostBudgetBytes, OnComplete: c.onComplete}
	if c.swapBytes > 0 {
		eng, err := nvme.Open(nvme.Options{QueueDepth: 16})
		if err != nil {
			t.Fatal(err)
		}
		r.eng = eng
		if !c.noFixedIO {
			o.FixedIO = eng
		}
		var dev nvme.Device = eng
		if len(c.faults) > 0 {
			r.faulty = nvme.NewFaulty(eng, c.faults...)
			dev = r.faulty
		}
		if c.wrap != nil {
			dev = c.wrap(dev)
		}
		t.Cleanup(func() { eng.Close() })
		for range c.swapPaths {
			r.paths = append(r.paths, nvmetest.Dir(t))
		}
		r.swap, err = nvme.NewSwap(dev, nvme.SwapOptions{Paths: r.paths, SizeBytes: c.swapBytes, StripeBytes: c.stripeBytes})
		if err != nil {
			if errors.Is(err, nvme.ErrNoDirectIO) {
				t.Skipf("swap: %v", err)
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { r.swap.Close() })
		o.Swap = r.swap
		o.NVMeBudgetBytes = c.nvmeBudgetBytes
	}
	r.s, err = New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.s.Close(); err != nil {
			t.Errorf("store close: %v", err)
		}
	})
	return r
}

// pattern is deterministic bytes for (key, seed).
func pattern(k shard.Key, seed uint64, n int64) []byte {
	rng := rand.New(rand.NewPCG(uint64(k.Chunk)<<32|uint64(k.Rank)<<8|uint64(k.State), seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// put writes data into the copy of key in t through a Write lease.
func (r *rig) put(t testing.TB, k shard.Key, tr shard.Tier, data []byte) {
	t.Helper()
	l, err := r.s.Acquire(k, tr, shard.Write)
	if err != nil {
		t.Fatal(err)
	}
	if tr == shard.HBM {
		d := r.devs[k.Rank]
		d.CopyHostToDevice(d.DefaultStream(), l.Buffer(), 0, data)
		if err := d.DefaultStream().Synchronize(); err != nil {
			t.Fatal(err)
		}
	} else {
		copy(l.Bytes(), data)
	}
	l.Release()
}

// get reads the copy of key in t through a Read lease.
func (r *rig) get(t testing.TB, k shard.Key, tr shard.Tier) ([]byte, error) {
	t.Helper()
	l, err := r.s.Acquire(k, tr, shard.Read)
	if err != nil {
		return nil, err
	}
	defer l.Release()
	return r.contents(t, l), nil
}

func (r *rig) contents(t testing.TB, l *Lease) []byte {
	if l.Tier() == shard.HBM {
		b := l.Buffer()
		out := make([]byte, b.Bytes())
		d := r.devs[b.DeviceIndex()]
		d.CopyDeviceToHost(d.DefaultStream(), out, b, 0)
		if err := d.DefaultStream().Synchronize(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	return append([]byte(nil), l.Bytes()...)
}

func (r *rig) mustOp(op *Op, err error) *Op {
	t := r.t
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	return op
}

func (r *rig) mustWait(op *Op, err error) {
	t := r.t
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(); err != nil {
		t.Fatal(err)
	}
}

// checkBudgets fails when a tier's use or peak passed its budget.
func checkBudgets(t testing.TB, st Stats) {
	t.Helper()
	check := func(name string, u Usage) {
		if u.InUseBytes > u.BudgetBytes || u.PeakBytes > u.BudgetBytes || u.InUseBytes < 0 {
			t.Errorf("%s: in use %d, peak %d, budget %d", name, u.InUseBytes, u.PeakBytes, u.BudgetBytes)
		}
	}
	for i, u := range st.HBM {
		check("hbm"+string(rune('0'+i)), u)
	}
	check("host", st.Host)
	check("nvme", st.NVMe)
}

// checkLeaks fails the test if goroutines or file descriptors outlive it
// (its cleanups, registered later, run first: store, swap, engine, pool).
func checkLeaks(t *testing.T) {
	t.Helper()
	leaktest.Check(t)
}

// checkOnce fails unless err names this package once: an error of tier kept
// as a cause and wrapped again must not repeat "tier:".
func checkOnce(t testing.TB, err error) {
	t.Helper()
	if err == nil {
		t.Error("no error")
		return
	}
	if n := strings.Count(err.Error(), "tier:"); n != 1 {
		t.Errorf("error %q names tier %d times, want once", err, n)
	}
}
