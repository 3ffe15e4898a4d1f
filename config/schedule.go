package config

import "math"

// LRAt is DeepSpeed's get_lr() for the configured scheduler with
// last_batch_iteration = iteration, computed with DeepSpeed's formulas
// (deepspeed/runtime/lr_schedules.py):
//
//	W     = max(2, warmup_num_steps)
//	gamma = log(iteration+1) / log(W)          warmup_type "log",    iteration < W
//	gamma = iteration / W                      warmup_type "linear", iteration < W
//	gamma = 1                                  WarmupLR,             iteration >= W
//	gamma = max(0, (T - iteration) / max(1, T - W))  WarmupDecayLR,  iteration >= W (T = total_num_steps)
//	lr    = warmup_min_lr + (warmup_max_lr - warmup_min_lr) · gamma
//
// and lr = warmup_min_lr for iteration < 0 (before the first scheduler step).
// Without a scheduler it is optimizer.params.lr.
func (s Scheduler) LRAt(iteration int, optimizerLR float64) float64 {
	p := s.Params
	if s.Type == "" {
		return optimizerLR
	}
	if iteration < 0 {
		return p.WarmupMinLR
	}
	w := max(2, p.WarmupNumSteps)
	it := float64(iteration)
	var gamma float64
	switch {
	case iteration < w && p.WarmupType == "linear":
		gamma = it / float64(w)
	case iteration < w:
		gamma = math.Log(it+1) / math.Log(float64(w))
	case s.Type == "WarmupDecayLR":
		t := float64(p.TotalNumSteps)
		gamma = max(0, (t-it)/max(1, t-float64(w)))
	default:
		gamma = 1
	}
	return p.WarmupMinLR + (p.WarmupMaxLR-p.WarmupMinLR)*gamma
}

// LR is the learning rate of optimizer step `step` (0 for the first update),
// exactly as a DeepSpeed engine applies it: the scheduler sets warmup_min_lr
// when it is built (last_batch_iteration = -1) and steps once after every
// optimizer step, so update k runs with LRAt(k-1). Without a scheduler it is
// optimizer.params.lr for every step.
func (c *Config) LR(step int) float64 {
	return c.Scheduler.LRAt(step-1, c.Optimizer.Params.LR)
}
