package model

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/units"
)

// BenchmarkSlidingWindow measures what a sliding window costs per token
// on the CPU backend: one Mistral-style block (forward and backward, fp32)
// over a long sequence with a window, against the same block over a short
// sequence with full causal attention, the two runs alternated and the
// ratio of their medians reported (window/short per token), in CPU time
// (user + system, the process's: the work, which a loaded shared host
// does not inflate as it does the wall clock). Also the same
// window at half the length, whose per-token cost must match (the window
// makes the attention O(T·W), not O(T²)). Sizes come from the
// environment: STRATA_WINDOW_LONG (default 32768 tokens),
// STRATA_WINDOW_SHORT (4096), STRATA_WINDOW (4096), STRATA_WINDOW_DIM
// (1024: 8 heads of 128, 2 key/value heads, FFN 2816), STRATA_WINDOW_REPS
// (3). bench/window.sh runs it.
func BenchmarkSlidingWindow(b *testing.B) {
	env := func(k string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
			return v
		}
		return def
	}
	long, short, window := env("STRATA_WINDOW_LONG", 32768), env("STRATA_WINDOW_SHORT", 4096), env("STRATA_WINDOW", 4096)
	dim, reps := env("STRATA_WINDOW_DIM", 1024), env("STRATA_WINDOW_REPS", 3)
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 64 * units.GiB})
	if err != nil {
		b.Fatal(err)
	}
	dev := devs[0]
	st := dev.DefaultStream()
	shape := func(seq, w int) Shape {
		return Shape{Name: "window-bench", Arch: ArchLlama, Layers: 1, Dim: dim, Heads: dim / 128, KVHeads: max(1, dim/512), FFN: dim * 11 / 4,
			Vocab: 256, MaxSeq: seq, RopeTheta: 10000, SlidingWindow: w}
	}
	// step runs one forward and backward of seq tokens and returns the
	// time per token.
	step := func(s Shape, seq int) func() time.Duration {
		l, err := NewLayout(s)
		if err != nil {
			b.Fatal(err)
		}
		res, err := NewResident(dev, l, gpu.F32)
		if err != nil {
			b.Fatal(err)
		}
		res.Load(st, l.Init(1))
		m, err := New(dev, l, 1, seq)
		if err != nil {
			b.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		bt := Batch{Rows: 1, Seq: seq, IDs: make([]int32, seq), Targets: make([]int32, seq)}
		for i := range bt.IDs {
			bt.IDs[i], bt.Targets[i] = int32(rng.IntN(256)), int32(rng.IntN(256))
		}
		return func() time.Duration {
			t0 := cpuTime()
			if err := m.Forward(st, res, bt); err != nil {
				b.Fatal(err)
			}
			if err := m.Backward(st, res, 1); err != nil {
				b.Fatal(err)
			}
			if err := st.Synchronize(); err != nil {
				b.Fatal(err)
			}
			return (cpuTime() - t0) / time.Duration(seq)
		}
	}
	runs := []struct {
		name string
		f    func() time.Duration
		ts   []time.Duration
	}{
		{fmt.Sprintf("full %d", short), step(shape(short, 0), short), nil},
		{fmt.Sprintf("window %d over %d", window, long), step(shape(long, window), long), nil},
		{fmt.Sprintf("window %d over %d", window, long/2), step(shape(long/2, window), long/2), nil},
	}
	b.ResetTimer()
	for range b.N {
		for r := 0; r < reps; r++ {
			for i := range runs {
				runs[i].ts = append(runs[i].ts, runs[i].f())
			}
		}
	}
	med := func(ts []time.Duration) float64 {
		sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
		return float64(ts[len(ts)/2])
	}
	for _, r := range runs {
		b.Logf("%-24s %8.1f µs/token of CPU time (median of %d)", r.name, med(r.ts)/1e3, len(r.ts))
	}
	b.ReportMetric(med(runs[1].ts)/med(runs[0].ts), "window/full-per-token")
	b.ReportMetric(med(runs[1].ts)/med(runs[2].ts), "long/half-per-token")
}

// cpuTime is the process's CPU time so far (user + system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
