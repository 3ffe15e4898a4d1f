package engine

import (
	"errors"
	"fmt"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/lossscale"
)

// fp16 mixed precision (the config's fp16 block, Options.Precision
// gpu.F16): fp16 params, gradients and activations on the devices, fp32
// master weights and moments, and DeepSpeed's loss scaling
// (internal/lossscale). The loss gradient is multiplied by the scale
// (Model.Backward's gradScale), the norm and the update divide it out
// (AdamParams.GradScale = clip coefficient / scale, as DeepSpeed's
// combined scale), and a step whose gradients overflow is skipped:
//
//   - decided at the norm, where the non-finite test already is (every
//     rank's shard sums, so an Inf or NaN on any rank is seen by all);
//   - nothing is updated: no chunk's update has started under serial,
//     exact or dpu (the pending update of the step before is a complete
//     step of its own and lands as usual: under dpu it is uploaded by this
//     step's pass, which read the params before it); under
//     update_in_backward the updates begun during the backward are undone
//     (the copy that undoes a non-finite step), and on the device nothing
//     has run;
//   - the step count moves on (the next step reads the next batch, the
//     checkpoint names the step), but the optimizer's does not: Adam's
//     bias correction and the learning-rate schedule use the applied
//     updates, Step − skipped (DeepSpeed does not call the optimizer's
//     step nor the LR scheduler's on an overflow, and counts
//     skipped_steps).
//
// An overflow at min_loss_scale stops the run with one error naming the
// step and the scale, before anything is written.

// scalerConfig is the fp16 block as lossscale takes it.
func scalerConfig(f config.FP16) lossscale.Config {
	return lossscale.Config{Static: f.LossScale, InitialPower: f.InitialScalePower, Window: f.LossScaleWindow,
		Hysteresis: f.Hysteresis, ConsecutiveHysteresis: f.ConsecutiveHysteresis, MinScale: f.MinLossScale}
}

// precisionOf is the engine's device precision: Options.Precision, else
// fp16 when the config enables it, else bf16. fp16 in the config with
// another Options.Precision is an error.
func precisionOf(cfg *config.Config, opts Options) (gpu.DType, error) {
	switch {
	case cfg.FP16.Enabled && opts.Precision != 0 && opts.Precision != gpu.F16:
		return 0, fmt.Errorf("engine: the config enables fp16, Options.Precision is %s", opts.Precision)
	case cfg.FP16.Enabled:
		return gpu.F16, nil
	}
	return opts.Precision, nil
}

// newScaler is the loss scaler of an fp16 engine (nil otherwise).
func newScaler(cfg *config.Config, precision gpu.DType) (*lossscale.Scaler, error) {
	if precision != gpu.F16 {
		return nil, nil
	}
	c := scalerConfig(cfg.FP16)
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	return lossscale.New(c), nil
}

// LossScale is the loss scale the next step runs with (1 without fp16).
func (e *Engine) LossScale() float64 {
	if e.scaler == nil {
		return 1
	}
	return e.scaler.Scale()
}

// Precision is the dtype of the device params and gradients: gpu.BF16,
// gpu.F16 or gpu.F32.
func (e *Engine) Precision() gpu.DType { return e.precision }

// SkippedSteps is the steps skipped for an fp16 overflow so far.
func (e *Engine) SkippedSteps() int64 { return e.skipped }

// updates is the optimizer's step count: the steps whose update was
// applied.
func (e *Engine) updates() int64 { return e.step - e.skipped }

// nextAdam is Adam's parameters of the next update with the clipping
// coefficient coef: its learning rate and bias correction those of update
// e.updates()+1, the gradient divided by the loss scale.
func (e *Engine) nextAdam(coef float64) gpu.AdamParams {
	return e.adamParams(e.updates()+1, coef/e.LossScale())
}

// skip ends step st as skipped for an overflow (the updates begun are
// undone by now): the scaler takes the verdict, the step count moves on.
// At min_loss_scale it is the run's error instead, and nothing moves.
func (e *Engine) skip(st report.StepStats) (report.StepStats, error) {
	if err := e.scaler.Update(true); err != nil {
		if errors.Is(err, lossscale.ErrMinScale) {
			return st, fmt.Errorf("engine: step %d: fp16 gradients overflow at loss scale %g, which is fp16.min_loss_scale: the scale cannot go lower (DeepSpeed stops here too); parameters not updated, the last checkpoint is the one to go on from: lower min_loss_scale, lower the learning rate, or train in bf16", st.Step, st.LossScale)
		}
		return st, err
	}
	st.Skipped = true
	e.step = st.Step
	e.skipped++
	e.countFP16(st)
	return st, nil
}

// fp16Run is what an fp16 engine's steps did since New or LoadCheckpoint,
// for FP16NoUpdate.
type fp16Run struct {
	steps   int64   // steps run
	skipped int64   // of them, skipped for an overflow
	zero    int64   // of them, applied with every gradient zero (norm 0 after unscaling)
	first   float64 // the loss scale of the first
}

// countFP16 records step st (fp16 only).
func (e *Engine) countFP16(st report.StepStats) {
	if e.scaler == nil {
		return
	}
	r := &e.fp16Run
	if r.steps == 0 {
		r.first = st.LossScale
	}
	r.steps++
	switch {
	case st.Skipped:
		r.skipped++
	case st.GradNorm == 0:
		r.zero++
	}
}

// FP16NoUpdate is the error of an fp16 engine none of whose steps since
// New or LoadCheckpoint brought a gradient to the weights (nil otherwise,
// and without fp16 or steps): each was skipped for an overflow (the scale
// too large for fp16: 65504 is its largest value) or had a gradient norm
// of exactly 0, every gradient flushed to zero (the scale too small:
// 2^-24 is fp16's smallest subnormal). A model's real gradient is never
// all zero, so a zero norm is the scale's doing. A run where only some
// steps are lost so is a working run (dynamic scaling skips its first
// steps by design), and gradients only partly flushed are not seen here.
func (e *Engine) FP16NoUpdate() error {
	r := e.fp16Run
	if e.scaler == nil || r.steps == 0 || r.skipped+r.zero < r.steps {
		return nil
	}
	static := !e.scaler.Dynamic()
	if r.zero == 0 {
		if static {
			return fmt.Errorf("engine: fp16: all %d steps overflowed at the static fp16.loss_scale %.6g and were skipped: no update reached the weights; lower loss_scale, or set it to 0 for dynamic scaling (DeepSpeed's default)", r.steps, r.first)
		}
		return fmt.Errorf("engine: fp16: all %d steps overflowed and were skipped (loss scale %.6g at the first, %.6g now): no update reached the weights; lower fp16.initial_scale_power (DeepSpeed's default is 16), run more steps for the scale to come down, or train in bf16", r.steps, r.first, e.LossScale())
	}
	also := ""
	if r.skipped > 0 {
		also = fmt.Sprintf(", %d others overflowed and were skipped", r.skipped)
	}
	fix := "raise fp16.initial_scale_power or min_loss_scale"
	if static {
		fix = "raise fp16.loss_scale, or set it to 0 for dynamic scaling (DeepSpeed's default)"
	}
	return fmt.Errorf("engine: fp16: every gradient of %d of the %d steps flushed to zero at loss scale %.6g (a gradient norm of 0)%s: no update reached the weights; %s", r.zero, r.steps, e.LossScale(), also, fix)
}

// fp16State is the checkpoint's record of the loss scaling (nil without fp16).
func (e *Engine) fp16State() *checkpoint.FP16 {
	if e.scaler == nil {
		return nil
	}
	return &checkpoint.FP16{Scaler: e.scaler.State(), SkippedSteps: e.skipped}
}

// restoreFP16 takes a checkpoint's loss scaling: an fp16 run resumed from
// an fp16 checkpoint goes on with its scale and skipped steps; from a
// bf16 one (or an fp16 checkpoint into a bf16 run) it starts afresh.
func (e *Engine) restoreFP16(f *checkpoint.FP16) {
	e.skipped, e.fp16Run = 0, fp16Run{}
	if e.scaler == nil {
		return
	}
	e.scaler = lossscale.New(scalerConfig(e.cfg.FP16))
	if f != nil {
		e.scaler.Restore(f.Scaler)
		e.skipped = f.SkippedSteps
	}
}
