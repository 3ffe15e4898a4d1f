package gpu

import (
	"fmt"
	"math"
)

// The variants of attention, rotary embeddings and the gated MLP that the
// model families ask of Ops: their zero values are the plain forms (scale
// 1/sqrt(headDim), full causal attention, no soft cap; SwiGLU).

// AttnOptions are the variants of one attention call (AttentionForward,
// AttentionBackward, AttentionCached).
type AttnOptions struct {
	// Scale multiplies the scores q·k; 0 means 1/sqrt(headDim) (Gemma's
	// query_pre_attn_scalar^-0.5 differs).
	Scale float32
	// Window > 0 is a sliding window: the query at i sees only the keys j
	// with i - j < Window (Mistral's sliding_window, Gemma's local layers).
	Window int
	// SoftCap > 0 caps each scaled score x at SoftCap·tanh(x/SoftCap)
	// (Gemma 2's attn_logit_softcapping).
	SoftCap float32
}

// ScaleFor is the softmax scale of a call with heads of headDim values:
// Scale, or 1/sqrt(headDim) rounded to fp32 when it is 0.
func (o AttnOptions) ScaleFor(headDim int) float32 {
	if o.Scale != 0 {
		return o.Scale
	}
	return float32(1 / math.Sqrt(float64(headDim)))
}

// Check says what is wrong with o.
func (o AttnOptions) Check() error {
	switch {
	case o.Scale < 0 || math.IsNaN(float64(o.Scale)) || math.IsInf(float64(o.Scale), 0):
		return fmt.Errorf("scale %v must be finite and >= 0", o.Scale)
	case o.Window < 0:
		return fmt.Errorf("window %d must be >= 0", o.Window)
	case o.SoftCap < 0 || math.IsNaN(float64(o.SoftCap)) || math.IsInf(float64(o.SoftCap), 0):
		return fmt.Errorf("soft cap %v must be finite and >= 0", o.SoftCap)
	}
	return nil
}

// MaxRopeDims is the most rotated values per head a Rope may have (its
// inverse frequencies travel by value, as a kernel argument on CUDA).
const MaxRopeDims = 512

// Rope is one call's rotary embedding: the inverse frequency of each
// rotated pair (Dims/2 of them, fp32 as Hugging Face's modeling_rope_utils
// computes them for the rope type and the call's length), the attention
// scaling every cos and sin is multiplied by (YaRN's and LongRoPE's
// attention factor; 1 otherwise), and the rotated values per head.
type Rope struct {
	InvFreq []float32
	Scale   float32
	Dims    int
}

// DefaultRope is the plain rotary embedding of heads of headDim values
// with base theta: InvFreq[i] = 1/theta^(2i/headDim), computed as
// Hugging Face computes it in fp32, and scale 1.
func DefaultRope(headDim int, theta float64) Rope {
	return Rope{InvFreq: InvFreq(headDim, theta), Scale: 1, Dims: headDim}
}

// InvFreq is Hugging Face's default inverse frequencies for dims rotated
// values with base theta, in fp32 as torch computes them: the exponent
// float32(2i)/float32(dims) rounded to fp32, theta (rounded to fp32)
// raised to it and rounded, then 1 divided by that in fp32.
func InvFreq(dims int, theta float64) []float32 {
	inv := make([]float32, dims/2)
	base := float64(float32(theta))
	for i := range inv {
		e := float32(2*i) / float32(dims)
		inv[i] = 1 / float32(math.Pow(base, float64(e)))
	}
	return inv
}

// Check says what is wrong with r for heads of headDim values.
func (r Rope) Check(headDim int) error {
	switch {
	case r.Dims < 2 || r.Dims%2 != 0 || r.Dims > headDim || r.Dims > MaxRopeDims:
		return fmt.Errorf("rotated dims %d must be even, in [2, %d] and at most %d", r.Dims, headDim, MaxRopeDims)
	case len(r.InvFreq) != r.Dims/2:
		return fmt.Errorf("%d inverse frequencies for %d rotated dims (want %d)", len(r.InvFreq), r.Dims, r.Dims/2)
	case !(r.Scale > 0) || math.IsInf(float64(r.Scale), 0):
		return fmt.Errorf("scale %v must be finite and > 0", r.Scale)
	}
	for i, f := range r.InvFreq {
		if !(f > 0) || math.IsInf(float64(f), 0) {
			return fmt.Errorf("inverse frequency %d is %v: must be finite and > 0", i, f)
		}
	}
	return nil
}

//go:generate go tool stringer -type=GLUAct -linecomment -output=gluact_string.go

// GLUAct is the activation of a gated MLP (GLUForward).
type GLUAct uint8

const (
	// Silu: x·sigmoid(x): SwiGLU (Llama, Mistral, Qwen, Phi-3)
	Silu GLUAct = iota // silu
	// GeluTanh: GELU's tanh approximation (gelu_pytorch_tanh): GeGLU (Gemma)
	GeluTanh // gelu_pytorch_tanh
)
