package config_test

import (
	"math"
	"testing"

	"github.com/strata-ai/strata/config"
)

// Expected values are DeepSpeed's formulas (lr_schedules.py) worked by hand
// at sample iterations. Tolerance: 1e-15 relative, the rounding of one log
// ratio and one multiply-add in float64; the formulas are the same, so only
// the order of float operations could differ.
func TestSchedules(t *testing.T) {
	type sample struct {
		iteration int
		want      float64
	}
	cases := []struct {
		name    string
		s       config.Scheduler
		samples []sample
	}{
		{"WarmupLR log", config.Scheduler{Type: "WarmupLR", Params: config.SchedulerParams{WarmupMinLR: 0, WarmupMaxLR: 1e-4, WarmupNumSteps: 100, WarmupType: "log"}},
			[]sample{{-1, 0}, {0, 0}, {9, 1e-4 * math.Log(10) / math.Log(100)}, {49, 1e-4 * math.Log(50) / math.Log(100)}, {99, 1e-4}, {100, 1e-4}, {5000, 1e-4}}},
		{"WarmupLR linear with floor", config.Scheduler{Type: "WarmupLR", Params: config.SchedulerParams{WarmupMinLR: 1e-5, WarmupMaxLR: 1e-3, WarmupNumSteps: 10, WarmupType: "linear"}},
			[]sample{{-1, 1e-5}, {0, 1e-5}, {5, 1e-5 + (1e-3-1e-5)*0.5}, {9, 1e-5 + (1e-3-1e-5)*0.9}, {10, 1e-3}}},
		{"WarmupDecayLR linear", config.Scheduler{Type: "WarmupDecayLR", Params: config.SchedulerParams{WarmupMaxLR: 3e-3, WarmupNumSteps: 5, WarmupType: "linear", TotalNumSteps: 20}},
			[]sample{{0, 0}, {1, 3e-3 * 0.2}, {4, 3e-3 * 0.8}, {5, 3e-3}, {10, 3e-3 * 10 / 15}, {19, 3e-3 / 15}, {20, 0}, {25, 0}}},
		{"WarmupDecayLR log", config.Scheduler{Type: "WarmupDecayLR", Params: config.SchedulerParams{WarmupMinLR: 1e-6, WarmupMaxLR: 1e-4, WarmupNumSteps: 1000, WarmupType: "log", TotalNumSteps: 10000}},
			[]sample{{0, 1e-6}, {99, 1e-6 + (1e-4-1e-6)*math.Log(100)/math.Log(1000)}, {1000, 1e-4}, {5500, 1e-6 + (1e-4-1e-6)*0.5}, {10000, 1e-6}}},
		// DeepSpeed uses max(2, warmup_num_steps): 0 or 1 warm-up steps still warm up over 2.
		{"warmup_num_steps 0 is 2", config.Scheduler{Type: "WarmupLR", Params: config.SchedulerParams{WarmupMaxLR: 1, WarmupNumSteps: 0, WarmupType: "linear"}},
			[]sample{{0, 0}, {1, 0.5}, {2, 1}}},
		// total_num_steps below the warm-up: the decay denominator is max(1, T-W).
		{"total below warmup", config.Scheduler{Type: "WarmupDecayLR", Params: config.SchedulerParams{WarmupMaxLR: 1, WarmupNumSteps: 5, WarmupType: "linear", TotalNumSteps: 3}},
			[]sample{{4, 0.8}, {5, 0}}},
		{"no scheduler", config.Scheduler{}, []sample{{-1, 0.25}, {0, 0.25}, {1000, 0.25}}},
	}
	for _, tc := range cases {
		for _, s := range tc.samples {
			got := tc.s.LRAt(s.iteration, 0.25)
			if math.Abs(got-s.want) > 1e-15*math.Abs(s.want) {
				t.Errorf("%s: LRAt(%d) = %.17g, want %.17g", tc.name, s.iteration, got, s.want)
			}
		}
	}
}

// Optimizer step k runs with the scheduler at iteration k-1, as in a
// DeepSpeed engine: the first update uses warmup_min_lr.
func TestLRPerStep(t *testing.T) {
	c, err := config.Parse([]byte(`{"train_micro_batch_size_per_gpu": 1,
		"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.1, "warmup_max_lr": 1.1, "warmup_num_steps": 4, "warmup_type": "linear"}}}`), "", config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{0.1, 0.1, 0.35, 0.6, 0.85, 1.1, 1.1}
	for step, w := range want {
		if got := c.LR(step); math.Abs(got-w) > 1e-15 {
			t.Errorf("LR(%d) = %v, want %v", step, got, w)
		}
	}
	d := config.Default()
	if d.LR(0) != config.DefaultLR || d.LR(100) != config.DefaultLR {
		t.Errorf("no scheduler: LR %v %v, want %v", d.LR(0), d.LR(100), config.DefaultLR)
	}
}
