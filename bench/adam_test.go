package bench

import (
	"math"
	"strings"
	"testing"

	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/internal/leaktest"
)

func TestRunAdamSmall(t *testing.T) {
	for _, o := range []AdamOptions{
		{Params: 10_000, Rounds: 3, Roofline: true},
		{Params: 999, Rounds: 2, GradBF16: true, BF16Out: true, Threads: 2, ISA: cpuadam.ISAGo},
		{Params: 5000, Rounds: 2, Moments: cpuadam.MomentsBF16, Roofline: true},
		{Params: 5000, Rounds: 2, Moments: cpuadam.MomentsInt8, GradBF16: true, Threads: 2},
		{Params: 5000, Rounds: 2, Moments: cpuadam.MomentsInt8, GradBF16: true, BF16Out: true, Remainder: true},
		{Params: 4001, Rounds: 2, GradBF16: true, BF16Out: true, Remainder: true, ISA: cpuadam.ISAGo},
	} {
		res, err := RunAdam(o.WithDefaults())
		if err != nil {
			t.Fatal(err)
		}
		// 8 (param) + 4 or 2 (grad) + 2 × (m, v) + 2 (out).
		want := map[cpuadam.Moments]float64{cpuadam.MomentsF32: 28, cpuadam.MomentsBF16: 20,
			cpuadam.MomentsInt8: 16 + 2*2*4*20/5000.0}[o.Moments] // 5000 params: 20 blocks of scales
		if o.GradBF16 {
			want -= 2
		}
		if o.BF16Out {
			want += 2
		}
		if o.Remainder { // reads the params, reads and writes 2 B and a bit instead of the fp32 master's 4 B
			want += 2 + 2*(2+float64((o.Params+7)/8)/float64(o.Params)) - 8
		}
		if math.Abs(res.BytesPerParam-want) > 1e-9 || res.Params != o.Params || res.Rounds != o.Rounds {
			t.Fatalf("%+v: result %+v", o, res)
		}
		if narrow := o.Moments != cpuadam.MomentsF32 || o.Remainder; res.Moments != o.Moments.String() || narrow != (res.SpeedupVsFP32 > 0 && res.FP32ParamsPerS > 0) ||
			(res.Master == "bf16+remainder") != o.Remainder {
			t.Fatalf("%+v: moments %q, fp32 comparison %v %v", o, res.Moments, res.FP32ParamsPerS, res.SpeedupVsFP32)
		}
		if !(res.GBps > 0 && res.ParamsPerS > 0) || (o.Roofline && !(res.RooflineGBps > 0 && res.Ratio > 0)) || (!o.Roofline && res.RooflineGBps != 0) {
			t.Fatalf("%+v: figures missing: %+v", o, res)
		}
	}
	if _, err := RunAdam(AdamOptions{Params: -1}.WithDefaults()); err == nil {
		t.Fatal("negative params accepted")
	}
}

// TestAdamOptionsExplicitZeros: WithDefaults fills only zero fields, and an
// explicit 0 or negative value that reaches Validate (or RunAdam) is
// refused instead of silently becoming the default.
func TestAdamOptionsExplicitZeros(t *testing.T) {
	leaktest.Check(t)
	def := AdamOptions{}.WithDefaults()
	if def.Params != 100_000_000 || def.Threads != 1 || def.Rounds != 7 {
		t.Fatalf("defaults %+v", def)
	}
	if got := (AdamOptions{Params: 5, Threads: 3, Rounds: 2}).WithDefaults(); got.Params != 5 || got.Threads != 3 || got.Rounds != 2 {
		t.Fatalf("WithDefaults changed set fields: %+v", got)
	}
	cases := []struct {
		edit func(*AdamOptions)
		want string
	}{
		{func(o *AdamOptions) { o.Params = 0 }, "--params 0"},
		{func(o *AdamOptions) { o.Params = -5 }, "--params -5"},
		{func(o *AdamOptions) { o.Threads = 0 }, "--threads 0"},
		{func(o *AdamOptions) { o.Threads = -1 }, "--threads -1"},
		{func(o *AdamOptions) { o.Threads = 1025 }, "--threads 1025"},
		{func(o *AdamOptions) { o.Rounds = 0 }, "--rounds 0"},
	}
	for _, c := range cases {
		o := def
		c.edit(&o)
		before := o
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want an error containing %q", o, err, c.want)
		}
		if o.Params != before.Params || o.Threads != before.Threads || o.Rounds != before.Rounds {
			t.Errorf("Validate changed the options: %+v -> %+v", before, o)
		}
		if _, err := RunAdam(o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("RunAdam(%+v): got %v, want an error containing %q", o, err, c.want)
		}
	}
}
