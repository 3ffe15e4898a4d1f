// Package lossscale is fp16 mixed precision's loss scaler.
//
// It follows DeepSpeed's rules exactly (deepspeed/runtime/fp16/loss_scaler.py,
// DynamicLossScaler and LossScaler; defaults from
// deepspeed/runtime/precision_config.py).
// The loss is multiplied by the scale before the backward, so that small
// gradients survive fp16's range; the gradients are divided by it before
// clipping and the update. A step whose gradients overflow (an Inf or NaN
// anywhere) is skipped, and Update decides the next scale:
//
//   - overflow: if hysteresis is 1 (or the hysteresis left, CurHysteresis,
//     is 1), the scale is halved, but not below MinScale; an overflow
//     while the scale already is MinScale is an error (ErrMinScale:
//     DeepSpeed raises "Current loss scale already at minimum"). Otherwise
//     CurHysteresis drops by one and the scale stays. Either way the
//     iteration is remembered as the last overflow.
//   - no overflow: with ConsecutiveHysteresis, CurHysteresis refills to
//     Hysteresis; and when (iteration − last overflow) is a multiple of
//     Window, the scale doubles and (without ConsecutiveHysteresis)
//     CurHysteresis refills. The iterations count from 0 and the last
//     overflow starts at −1, so with no overflow the first doubling
//     comes after Window steps.
//   - every call advances the iteration by one.
//
// A static scale (Config.Static > 0) never changes; its overflowing steps
// are skipped too (DeepSpeed's FP16 optimizers skip on overflow whatever
// the scaler).
//
// A Scaler's State is what a checkpoint keeps (checkpoint.FP16.Scaler),
// written as JSON; Restore takes it back.
package lossscale
