package config

import (
	"fmt"
	"strconv"
)

// Auto holds the trainer's values for the keys a config writes as "auto"
// (the Hugging Face and DeepSpeed example configs write every optimizer,
// scheduler, batch and clipping value so). Strata is the trainer: cmd fills
// these from its flags, and a zero field takes the default below. A flag
// fills only "auto" keys; a file that writes a different value is an error
// that says so.
type Auto struct {
	LR          float64 // optimizer.params.lr, scheduler warmup_max_lr: --lr; default DefaultLR
	MicroBatch  int     // train_micro_batch_size_per_gpu: --micro-batch; default DefaultMicroBatch
	WarmupSteps int     // scheduler warmup_num_steps: --warmup-steps; default 0 (the Hugging Face Trainer's)
	Steps       int     // scheduler total_num_steps: --steps; default strata.steps
}

// Values Strata chooses for "auto" keys that no flag fills.
const (
	DefaultAutoWeightDecay      = 0.0 // the Hugging Face Trainer's weight_decay
	DefaultAutoGradientClipping = 1.0 // the Hugging Face Trainer's max_grad_norm
	DefaultAutoWarmupSteps      = 0   // the Hugging Face Trainer's warmup_steps
)

// AutoChosen lists the values Strata filled in for keys written as "auto",
// "key = value (from where)", in document order; cmd prints them as one
// notice, and Config.JSON holds them.
func (c *Config) AutoChosen() []string { return append([]string(nil), c.chosen...) }

// autoKey says whether the file writes key as "auto"; if so it is recorded
// for fillAuto.
func (s *section) autoKey(key string) bool {
	if !isAuto(s.get(key)) {
		return false
	}
	s.d.autos = append(s.d.autos, join(s.path, key))
	return true
}

// fillAuto gives each key written "auto" its value: from opts (cmd's flags)
// or the documented default. A flag that disagrees with a value the file
// writes out is an error: the file's value would silently win otherwise.
func (c *Config) fillAuto(d *decoder, a Auto) {
	auto := map[string]bool{}
	for _, k := range d.autos {
		auto[k] = true
	}
	choose := func(key, val, from string) {
		c.chosen = append(c.chosen, fmt.Sprintf("%s = %s (%s)", key, val, from))
	}
	flagged := func(key, flag string, set bool, fileVal, flagVal string) {
		if set && !auto[key] && d.given(key) && fileVal != flagVal {
			d.errPath(key, "%s in %s, but %s %s: write \"auto\" to let the flag decide, or drop the flag", fileVal, d.name(), flag, flagVal)
		}
	}
	p := &c.Optimizer.Params
	lr, lrFrom := DefaultLR, "default"
	if a.LR > 0 {
		lr, lrFrom = a.LR, "--lr"
	}
	flagged("optimizer.params.lr", "--lr", a.LR > 0, num(p.LR), num(a.LR))
	flagged("train_micro_batch_size_per_gpu", "--micro-batch", a.MicroBatch > 0, strconv.Itoa(c.batch.micro), strconv.Itoa(a.MicroBatch))
	flagged("scheduler.params.warmup_num_steps", "--warmup-steps", a.WarmupSteps > 0, strconv.Itoa(c.Scheduler.Params.WarmupNumSteps), strconv.Itoa(a.WarmupSteps))
	sp := &c.Scheduler.Params
	for _, k := range d.autos {
		switch k {
		case "optimizer.params.lr":
			p.LR = lr
			choose(k, num(lr), lrFrom)
		case "optimizer.params.betas":
			p.Betas = [2]float64{DefaultBeta1, DefaultBeta2}
			choose(k, fmt.Sprintf("[%s, %s]", num(DefaultBeta1), num(DefaultBeta2)), "default")
		case "optimizer.params.eps":
			p.Eps = DefaultEps
			choose(k, num(DefaultEps), "default")
		case "optimizer.params.weight_decay":
			p.WeightDecay = DefaultAutoWeightDecay
			choose(k, num(DefaultAutoWeightDecay), "default")
		case "scheduler.params.warmup_min_lr":
			sp.WarmupMinLR = 0
			choose(k, "0", "default")
		case "scheduler.params.warmup_max_lr":
			sp.WarmupMaxLR = p.LR
			choose(k, num(p.LR), "optimizer.params.lr")
		case "scheduler.params.warmup_num_steps":
			sp.WarmupNumSteps, lrFrom = DefaultAutoWarmupSteps, "default"
			if a.WarmupSteps > 0 {
				sp.WarmupNumSteps, lrFrom = a.WarmupSteps, "--warmup-steps"
			}
			if sp.WarmupNumSteps < 2 {
				lrFrom += "; DeepSpeed warms up over max(2, this) steps: updates 1-2 at warmup_min_lr"
			}
			choose(k, strconv.Itoa(sp.WarmupNumSteps), lrFrom)
		case "scheduler.params.total_num_steps":
			sp.TotalNumSteps, lrFrom = c.Strata.Steps, "strata.steps"
			if a.Steps > 0 {
				sp.TotalNumSteps, lrFrom = a.Steps, "--steps"
			}
			choose(k, strconv.Itoa(sp.TotalNumSteps), lrFrom)
		case "gradient_clipping":
			c.GradientClipping = DefaultAutoGradientClipping
			choose(k, num(DefaultAutoGradientClipping), "default")
		case "bf16.enabled":
			c.BF16.Enabled = !c.FP16.Enabled
			if c.FP16.Enabled {
				choose(k, "false", "fp16.enabled is true")
			} else {
				choose(k, "true", "Strata trains in bf16 unless fp16 is enabled")
			}
		case "fp16.enabled":
			choose(k, "false", "Strata trains in bf16 unless fp16.enabled is true")
		case "train_micro_batch_size_per_gpu":
			if a.MicroBatch > 0 {
				c.batch.micro = a.MicroBatch
				choose(k, strconv.Itoa(a.MicroBatch), "--micro-batch")
			} else if c.batch.train == 0 {
				c.batch.micro = DefaultMicroBatch
				choose(k, strconv.Itoa(DefaultMicroBatch), "default")
			}
		}
	}
}

// num formats a float as JSON would.
func num(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// chooseBatch records the batch keys written "auto" that resolveBatch
// derived.
func (c *Config) chooseBatch(d *decoder) {
	for _, k := range d.autos {
		switch k {
		case "train_batch_size":
			c.chosen = append(c.chosen, fmt.Sprintf("%s = %d (micro-batch × accumulation × devices)", k, c.TrainBatchSize))
		case "gradient_accumulation_steps":
			c.chosen = append(c.chosen, fmt.Sprintf("%s = %d (derived)", k, c.GradientAccumulationSteps))
		}
	}
}
