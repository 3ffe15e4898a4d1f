package model

import (
	"errors"
	"fmt"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// ErrNoGradients is the error of Weights.Grad and Weights.GradReady:
// inference holds no gradients.
var ErrNoGradients = errors.New("model: inference weights hold no gradients")

// Weights keeps every chunk's parameters on one device and nothing else:
// the Params of inference (Decoder). Acquire returns the same buffer every
// time and never fails; Grad and GradReady return ErrNoGradients, so a
// Backward through Weights stops at its first gradient.
type Weights struct {
	dev    gpu.Device
	layout *Layout
	dt     gpu.DType
	params []gpu.Buffer
}

// WeightsBytes is the device memory NewWeights allocates for layout in dt:
// every parameter once (not counting the device's allocation granularity).
func WeightsBytes(layout *Layout, dt gpu.DType) int64 {
	return layout.ParamCount() * int64(dt.Size())
}

// NewWeights allocates every chunk's parameters in dt (F32, BF16 or F16)
// on dev, zeroed, tagged gpu.ModelState; LoadChunk fills them.
func NewWeights(dev gpu.Device, layout *Layout, dt gpu.DType) (*Weights, error) {
	return NewWeightsOf(dev, layout, dt, nil)
}

// NewWeightsOf is NewWeights of the chunks keep says (nil: all of them);
// the others are not allocated, and acquiring one is an error (a Params
// that keeps them elsewhere serves them: infer's experts off the device).
func NewWeightsOf(dev gpu.Device, layout *Layout, dt gpu.DType, keep func(c int) bool) (*Weights, error) {
	if dt != gpu.F32 && !dt.Half() {
		return nil, fmt.Errorf("model: parameter dtype %s is not f32, bf16 or f16", dt)
	}
	w := &Weights{dev: dev, layout: layout, dt: dt}
	for _, ch := range layout.Chunks {
		if keep != nil && !keep(ch.Index) {
			w.params = append(w.params, nil)
			continue
		}
		p, err := dev.Alloc(ch.Len, dt, gpu.Tag{Kind: gpu.ModelState, Purpose: "param"})
		if err != nil {
			w.Free()
			return nil, fmt.Errorf("model: params of chunk %d: %w", ch.Index, err)
		}
		w.params = append(w.params, p)
	}
	return w, nil
}

// DType is the parameters' dtype.
func (w *Weights) DType() gpu.DType { return w.dt }

// LoadChunk enqueues the upload of chunk c's values (Layout.Chunks[c].Len
// of them) on s, rounded on the host for BF16 and F16 weights. The values
// are copied into a staging buffer before it returns, so v may be reused
// at once; the staging buffer lives until the copy completes.
func (w *Weights) LoadChunk(s gpu.Stream, c int, v []float32) {
	upload(w.dev, s, w.params[c], v)
}

// Free releases the parameters; the streams that used them must have
// completed.
func (w *Weights) Free() {
	for _, b := range w.params {
		if b != nil {
			w.dev.Free(b)
		}
	}
	w.params = nil
}

// Acquire implements Params.
func (w *Weights) Acquire(_ gpu.Stream, c int, _ shard.Phase) (gpu.Buffer, error) {
	if w.params[c] == nil {
		return nil, fmt.Errorf("model: chunk %d (%s) is not among the weights on the device", c, w.layout.Chunks[c].Name)
	}
	return w.params[c], nil
}

// Release implements Params.
func (w *Weights) Release(gpu.Stream, int, shard.Phase) {}

// Grad implements Params: ErrNoGradients.
func (w *Weights) Grad(gpu.Stream, int) (gpu.Buffer, error) { return nil, ErrNoGradients }

// GradReady implements Params: ErrNoGradients.
func (w *Weights) GradReady(gpu.Stream, int) error { return ErrNoGradients }
