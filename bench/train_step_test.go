package bench

import (
	"math"
	"testing"
	"time"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
)

// TestTrainStepTiny runs the benchmark's code path on the tiny shape and
// checks what it reports, not how fast it is.
func TestTrainStepTiny(t *testing.T) {
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
		r, err := TrainStep(TrainStepOptions{Shape: "tiny", Batch: 2, Seq: 16, Precision: dt, Steps: 1, HBMBytes: 256 * units.MiB})
		if err != nil {
			t.Fatal(err)
		}
		t.Log(r)
		if len(r.Losses) != 2 || math.Abs(r.Losses[0]-math.Log(256)) > 0.2 {
			t.Errorf("losses %v, want 2 near ln 256", r.Losses)
		}
		if !(r.StepSeconds > 0) || !(r.GemmGFLOPS > 0) || !(r.Ratio > 0) {
			t.Errorf("step %v s, gemm %v GFLOP/s, ratio %v", r.StepSeconds, r.GemmGFLOPS, r.Ratio)
		}
		// Model state: params and grads (4 or 2 bytes each), Adam m and v, and
		// in bf16 an fp32 master copy: 16 bytes per parameter either way.
		psi := r.Shape.ParamCount()
		if r.ModelState < 16*psi || r.ModelState > 16*psi+64*1024 {
			t.Errorf("%s: model state peak %d bytes, want 16Ψ = %d", dt, r.ModelState, 16*psi)
		}
		if r.Activations < r.ActivationFor || r.Activations > r.ActivationFor+64*1024 {
			t.Errorf("activation peak %d, ActivationBytes %d", r.Activations, r.ActivationFor)
		}
	}
	if _, err := TrainStep(TrainStepOptions{Shape: "tiny", Seq: 65}); err == nil {
		t.Error("seq past max_seq_len accepted")
	}
	if _, err := TrainStep(TrainStepOptions{Shape: "gpt-9z"}); err == nil {
		t.Error("unknown shape accepted")
	}
}

// BenchmarkTrainStepGPT2 is one training step of GPT-2 124M (vocabulary
// 50257) on the CPU backend, batch 1 × seq 64, fp32 and bf16 (about a minute each here):
//
//	go test -run '^$' -bench TrainStepGPT2 -benchtime 2x ./bench/
//
// ns/op is one step (the default metric, not repeated): the model is built and warmed up by one step before
// the timed loop, and the GEMM anchor is measured after it. It also
// reports the step's GFLOP/s against the backend's GEMM at the model's
// c_fc shape measured in the same run.
func BenchmarkTrainStepGPT2(b *testing.B) {
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
		b.Run(dt.String(), func(b *testing.B) {
			run, err := newTrainStepRun(TrainStepOptions{Batch: 1, Seq: 64, Precision: dt})
			if err != nil {
				b.Fatal(err)
			}
			defer run.close()
			if _, err := run.step(); err != nil { // warm-up
				b.Fatal(err)
			}
			var measured time.Duration
			steps := 0
			for b.Loop() { // times only the steps: b.Loop resets the timer at its first call and stops it at its last
				d, err := run.step()
				if err != nil {
					b.Fatal(err)
				}
				measured += d
				steps++
			}
			// The timed region is the steps and nothing else: no set-up,
			// no warm-up, no anchor (the slack covers the loop itself).
			if el := b.Elapsed(); el > measured+measured/10+50*time.Millisecond {
				b.Fatalf("%v timed for %d steps of %v in all: set-up inside the timed region", el, steps, measured)
			}
			r, err := run.result(measured, steps)
			if err != nil {
				b.Fatal(err)
			}
			b.Log(r)
			b.ReportMetric(r.TokensPerSec, "tokens/s")
			b.ReportMetric(r.StepGFLOPS, "GFLOP/s")
			b.ReportMetric(r.Ratio, "step/gemm")
		})
	}
}
