package prefetch

import (
	"testing"
	"time"

	"github.com/strata-ai/strata/shard"
)

// TestSimulateSteadyState runs the optimizer pipeline of a model whose
// optimizer state does not fit the host budget and checks that, once the
// first step is over, the planner hides the NVMe traffic entirely where the
// arithmetic allows it.
//
// The model: 8 layers × 2 ranks, 100 B param and grad shards, 200 B master,
// m and v shards (modelStep), params and master/m/v homed on NVMe, grads on
// host, HBM unlimited. NVMe reads and writes at 400 B/ms, PCIe at 4000 B/ms,
// 250µs of slack. A layer computes 4ms forward and 8ms backward; the
// optimizer computes 3ms per (chunk, rank), 48ms in all: 144ms a step.
//
// The arithmetic that makes zero stall possible:
//   - host budget = grad homes (1600 B), one copy of every param (1600 B)
//     and half the optimizer state (4800 of 9600 B): at least 24 of the 48
//     master/m/v shards must be read again every step, and all 48 (9600 B,
//     24ms) plus 16 new params (1600 B, 4ms) written, against 144ms of
//     compute a step: each link is busy at most 24ms + 4ms of it.
//   - within the optimizer, one (chunk, rank) needs 3 × 500µs = 1.5ms of
//     reads and 3 × 500µs + 250µs = 1.75ms of writes against the 3ms of
//     compute of the one before it; the pipeline needs room for three of
//     them (updated, being written, being read: 1800 B) and the other
//     3000 B of the half can hold state across the step boundary, read
//     during the 96ms of forward and backward while the NVMe read link
//     carries nothing else.
//   - PCIe moves a param in 25µs against 4ms of layer compute.
//
// With the optimizer visiting the chunks in ascending order every such
// constraint has slack, so from the second step on every access must hit
// and the predicted stall must be exactly zero (the simulation is exact in
// nanoseconds). In backward order (descending, modelStep's) the last
// access of a step writes the new c0.r1 param in host and the first
// accesses of the next step read it in HBM with no compute in between: one
// host->hbm transfer (25µs) per step is inherent, and it is the only stall
// allowed (hit rate 127/128).
//
// The planner looks ahead a bounded window: by default (Options.Window 0)
// MinWindow = 32 of the 128 accesses of a step (HorizonChains × 2 ranks
// × the lead, 500µs of chain plus 250µs of slack, covers fewer), and in the last two cases 8. The
// bounds are the same: the optimizer's reads are due within a chunk of
// their access, and the new params it writes in host memory go up to HBM
// when written although the next forward that reads them is beyond the
// window (Planner.followWritten). Without that, with a window of 16, the
// uploads of the params written first waited until the window reached the
// next forward and queued at the step boundary in front of the last one
// (50µs of stall a step in backward order).
//
// This failed before the planner stopped waiting for a victim that an
// access before the prefetched one will update (step 1: 114/128 hits, 7ms
// of stall: the m and v reads of every (chunk, rank) 500µs late).
func TestSimulateSteadyState(t *testing.T) {
	const layers, ranks = 8, 2
	const paramBytes = 100
	for _, tc := range []struct {
		name         string
		optAscending bool
		stallMax     time.Duration // per step, from the second on
		missesMax    int           // per step, from the second on
		window       int           // Options.Window
	}{
		{"optimizer ascending", true, 0, 0, 0},
		{"optimizer in backward order", false, 25 * time.Microsecond, 1, 0},
		{"optimizer ascending, window 8", true, 0, 0, 8},
		{"optimizer in backward order, window 8", false, 25 * time.Microsecond, 1, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, res := modelStepOrder(layers, ranks, paramBytes, 4*time.Millisecond, 3*time.Millisecond, tc.optAscending)
			opts := DefaultOptions()
			opts.BandwidthBytesPerSec = [shard.LinkCount]float64{shard.NVMeToHost: 400e3, shard.HostToNVMe: 400e3, shard.HostToHBM: 4000e3, shard.HBMToHost: 4000e3}
			opts.Slack = 250 * time.Microsecond
			opts.Window = tc.window
			const optState = layers * ranks * 3 * 2 * paramBytes
			opts.BudgetBytes[shard.Host] = layers*ranks*paramBytes /* grads */ + layers*ranks*paramBytes /* params */ + optState/2
			if d := opts.TransferTime(shard.HostToHBM, paramBytes); d != 25*time.Microsecond {
				t.Fatalf("a param upload takes %v, the arithmetic above says 25µs", d)
			}
			const steps = 5
			s, err := Plan(tr, res, opts, steps)
			if err != nil {
				t.Fatal(err)
			}
			n := len(tr.Accesses)
			for step := 1; step < steps; step++ {
				var hits int
				var stall time.Duration
				for _, a := range s.Accesses[step*n : (step+1)*n] {
					if a.Step != step {
						t.Fatalf("access %d of step %d is in step %d", a.Index, step, a.Step)
					}
					if a.Outcome == Hit {
						hits++
					}
					stall += a.Ready - a.Start
				}
				var read int64
				for _, m := range s.Moves {
					if m.Step == step && m.From == shard.NVMe && m.To == shard.Host {
						read += m.SizeBytes
					}
				}
				rate := float64(hits) / float64(n)
				t.Logf("step %d: hits %d/%d (%.1f%%), stall %v, nvme->host %d B", step, hits, n, 100*rate, stall, read)
				if rate < 0.99 || n-hits > tc.missesMax {
					t.Errorf("step %d: hit rate %.1f%% (%d of %d accesses waited), want >= 99%% and at most %d", step, 100*rate, n-hits, n, tc.missesMax)
				}
				if stall > tc.stallMax {
					t.Errorf("step %d: predicted stall %v, want at most %v", step, stall, tc.stallMax)
				}
				// Half the optimizer state does not fit. The params' room
				// (1600 B) can hold optimizer state too once the new params
				// have gone up to HBM (eagerly: HBM is not overflowed) and
				// down to NVMe, so at least 4800 - 1600 B are read again.
				if want := int64(optState/2 - layers*ranks*paramBytes); read < want {
					t.Errorf("step %d: read %d B from NVMe: the case no longer overflows the host budget (want >= %d B)", step, read, want)
				}
			}
			if t.Failed() {
				t.Log(s)
			}
		})
	}
}
