package model

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/strata-ai/strata/gpu"
)

// The rotary embeddings and attention variants of the Llama family's
// members, as Hugging Face's modeling_rope_utils and modeling code compute
// them: the inverse frequencies of each rope type in fp32 as torch computes
// them, the attention factor of YaRN and LongRoPE, partial rotary
// (partial_rotary_factor), sliding-window layers, Gemma's scale and soft
// caps.

// Rope types (RopeScaling.Type), transformers' rope_type names.
const (
	RopeDefault  = "default"
	RopeLinear   = "linear"
	RopeDynamic  = "dynamic"
	RopeYaRN     = "yarn"
	RopeLlama3   = "llama3"
	RopeLongRoPE = "longrope"
)

// RopeScaling is config.json's rope_scaling (rope_parameters): the keys
// each rope type reads; the zero value (and Type "default") is plain
// rotary embeddings with rope_theta. Factors are kept as text
// (comma-separated numbers, FormatFactors) so that a Shape stays
// comparable. It is an alias of an unnamed struct type, which
// config.RopeScaling aliases too (the same fields and tags, so the same
// type): a Shape converts to and from config.Shape without either package
// importing the other. Keep the two declarations alike; the conversions
// in engine and cmd do not compile otherwise.
type RopeScaling = struct {
	Type   string  `json:"rope_type,omitempty"`
	Factor float64 `json:"factor,omitempty"` // linear, dynamic, yarn, llama3; longrope (when no original_max_position_embeddings says otherwise)
	// OriginalMax is original_max_position_embeddings: llama3's and
	// yarn's (in rope_scaling), longrope's (config.json's top level, as
	// Phi-3 writes it, or rope_scaling's).
	OriginalMax     int     `json:"original_max_position_embeddings,omitempty"`
	LowFreqFactor   float64 `json:"low_freq_factor,omitempty"`  // llama3
	HighFreqFactor  float64 `json:"high_freq_factor,omitempty"` // llama3
	AttentionFactor float64 `json:"attention_factor,omitempty"` // yarn, longrope; 0 = computed
	BetaFast        float64 `json:"beta_fast,omitempty"`        // yarn; 0 = 32
	BetaSlow        float64 `json:"beta_slow,omitempty"`        // yarn; 0 = 1
	Mscale          float64 `json:"mscale,omitempty"`           // yarn
	MscaleAllDim    float64 `json:"mscale_all_dim,omitempty"`   // yarn
	NoTruncate      bool    `json:"no_truncate,omitempty"`      // yarn's truncate: false
	ShortFactor     string  `json:"short_factor,omitempty"`     // longrope, Dims/2 numbers
	LongFactor      string  `json:"long_factor,omitempty"`      // longrope, Dims/2 numbers
}

// FormatFactors is factors as RopeScaling keeps them.
func FormatFactors(f []float64) string {
	parts := make([]string, len(f))
	for i, v := range f {
		parts[i] = strconv.FormatFloat(v, 'g', -1, 64)
	}
	return strings.Join(parts, ",")
}

// ParseFactors reads factors back (FormatFactors).
func ParseFactors(s string) ([]float64, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	out := make([]float64, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil {
			return nil, fmt.Errorf("model: rope factor %d %q: %v", i, p, err)
		}
		out[i] = v
	}
	return out, nil
}

// variants says whether s sets any of the Llama family's attention
// variants.
func (s Shape) variants() bool {
	return s.HeadDimension != 0 || s.Rope != (RopeScaling{}) || s.RotaryFraction != 0 || s.SlidingWindow != 0 ||
		s.LayerTypes != "" || s.RopeLocalTheta != 0 || s.QueryScale != 0 || s.AttnSoftCap != 0 || s.FinalSoftCap != 0
}

func (s Shape) rotaryFraction() float64 {
	if s.RotaryFraction == 0 {
		return 1
	}
	return s.RotaryFraction
}

// RotaryDims is the number of rotated values of each head: int(HeadDim ·
// partial_rotary_factor), as transformers truncates it.
func (s Shape) RotaryDims() int { return int(float64(s.HeadDim()) * s.rotaryFraction()) }

// checkVariants says what is wrong with the variants of a Llama-family
// shape: one error naming the key and value.
func (s Shape) checkVariants() error {
	bad := func(key string, v any, why string) error {
		return fmt.Errorf("model: %s %v: %s", key, v, why)
	}
	switch rd := s.RotaryDims(); {
	case s.RotaryFraction < 0 || s.RotaryFraction > 1 || math.IsNaN(s.RotaryFraction):
		return bad("partial_rotary_factor", s.RotaryFraction, "must be in (0, 1]")
	case rd < 2 || rd%2 != 0 || rd > gpu.MaxRopeDims:
		return bad("partial_rotary_factor", s.rotaryFraction(), fmt.Sprintf("rotates %d values of each head of %d: must be even, at least 2 and at most %d", rd, s.HeadDim(), gpu.MaxRopeDims))
	case s.Arch == ArchPhi3 && s.HeadDimension != 0 && s.HeadDimension*s.Heads != s.Dim:
		return bad("head_dim", s.HeadDimension, "Phi-3's heads are hidden_size / num_attention_heads wide")
	case s.SlidingWindow < 0:
		return bad("sliding_window", s.SlidingWindow, "must not be negative")
	case s.LayerTypes != "" && len(s.LayerTypes) != s.Layers:
		return bad("layer_types", fmt.Sprintf("%q", s.LayerTypes), fmt.Sprintf("has %d entries for %d layers", len(s.LayerTypes), s.Layers))
	case strings.Trim(s.LayerTypes, "sf") != "":
		return bad("layer_types", fmt.Sprintf("%q", s.LayerTypes), "holds a letter other than s (sliding) and f (full)")
	case strings.Contains(s.LayerTypes, "s") && s.SlidingWindow == 0:
		return bad("layer_types", fmt.Sprintf("%q", s.LayerTypes), "names sliding layers without a sliding_window")
	case s.RopeLocalTheta < 0 || s.QueryScale < 0 || s.AttnSoftCap < 0 || s.FinalSoftCap < 0:
		return fmt.Errorf("model: rope_local_base_freq %g, query_pre_attn_scalar %g and the soft caps %g, %g must not be negative", s.RopeLocalTheta, s.QueryScale, s.AttnSoftCap, s.FinalSoftCap)
	}
	_, _, err := s.ropeAt(s.Rope, s.Theta(), 0)
	return err
}

// Sliding says whether layer l attends within SlidingWindow.
func (s Shape) Sliding(l int) bool {
	if s.SlidingWindow == 0 {
		return false
	}
	return s.LayerTypes == "" || s.LayerTypes[l] == 's'
}

// AttnFor is layer l's attention variants: its window, Gemma's scale and
// soft cap.
func (s Shape) AttnFor(l int) gpu.AttnOptions {
	var o gpu.AttnOptions
	if s.Sliding(l) {
		o.Window = s.SlidingWindow
	}
	if s.QueryScale != 0 {
		o.Scale = float32(math.Pow(s.QueryScale, -0.5))
	}
	o.SoftCap = float32(s.AttnSoftCap)
	return o
}

// RopeFor is layer l's rotary embedding for a call whose positions are
// below seqLen (the dynamic and longrope types depend on it, as Hugging
// Face's dynamic_rope_update makes them: the longest position of the call
// plus one).
func (s Shape) RopeFor(l, seqLen int) gpu.Rope {
	rs, theta := s.Rope, s.Theta()
	if s.RopeLocalTheta != 0 && s.Sliding(l) {
		rs, theta = RopeScaling{}, s.RopeLocalTheta
	}
	inv, scale, err := s.ropeAt(rs, theta, seqLen)
	if err != nil {
		panic(err) // Validate refused it
	}
	return gpu.Rope{InvFreq: inv, Scale: scale, Dims: s.RotaryDims()}
}

// LongestSeq is the longest sequence the model takes: MaxSeq
// (max_position_embeddings), or with dynamic NTK scaling, whose point is
// to run past it, MaxSeq × factor.
func (s Shape) LongestSeq() int {
	if s.IsLlama() && s.Rope.Type == RopeDynamic && s.Rope.Factor > 1 {
		return int(float64(s.MaxSeq) * s.Rope.Factor)
	}
	return s.MaxSeq
}

// SeqDependentRope says whether RopeFor depends on the call's length.
func (s Shape) SeqDependentRope() bool {
	return s.Rope.Type == RopeDynamic || s.Rope.Type == RopeLongRoPE
}

// ropeAt computes the inverse frequencies and attention factor of rope
// type rs with base theta for a call of seqLen positions, as
// modeling_rope_utils does (the tensors in fp32, the scalars in float64).
func (s Shape) ropeAt(rs RopeScaling, theta float64, seqLen int) ([]float32, float32, error) {
	dim := s.RotaryDims()
	bad := func(key string, v any, why string) error {
		return fmt.Errorf("model: rope_scaling %s %v: %s", key, v, why)
	}
	needFactor := func() error {
		if !(rs.Factor >= 1) || math.IsInf(rs.Factor, 0) {
			return bad("factor", rs.Factor, "must be a number >= 1")
		}
		return nil
	}
	switch rs.Type {
	case "", RopeDefault:
		return gpu.InvFreq(dim, theta), 1, nil
	case RopeLinear:
		if err := needFactor(); err != nil {
			return nil, 0, err
		}
		inv := gpu.InvFreq(dim, theta)
		for i := range inv {
			inv[i] /= float32(rs.Factor)
		}
		return inv, 1, nil
	case RopeDynamic:
		if err := needFactor(); err != nil {
			return nil, 0, err
		}
		maxPos := float64(s.MaxSeq)
		n := math.Max(float64(seqLen), maxPos)
		base := theta * math.Pow(rs.Factor*n/maxPos-(rs.Factor-1), float64(dim)/float64(dim-2))
		return gpu.InvFreq(dim, base), 1, nil
	case RopeLlama3:
		if err := needFactor(); err != nil {
			return nil, 0, err
		}
		if rs.OriginalMax < 1 || !(rs.HighFreqFactor > rs.LowFreqFactor) || !(rs.LowFreqFactor > 0) {
			return nil, 0, bad("(llama3)", fmt.Sprintf("original_max_position_embeddings %d, low_freq_factor %g, high_freq_factor %g", rs.OriginalMax, rs.LowFreqFactor, rs.HighFreqFactor),
				"need original_max_position_embeddings >= 1 and 0 < low_freq_factor < high_freq_factor")
		}
		return llama3InvFreq(gpu.InvFreq(dim, theta), rs), 1, nil
	case RopeYaRN:
		return s.yarn(rs, theta, dim)
	case RopeLongRoPE:
		return s.longrope(rs, theta, dim, seqLen)
	}
	return nil, 0, bad("rope_type", fmt.Sprintf("%q", rs.Type), "is not built (default, linear, dynamic, yarn, llama3, longrope are)")
}

// llama3InvFreq is Llama 3.1's frequency-dependent scaling of inv (fp32
// tensor arithmetic in torch's order).
func llama3InvFreq(inv []float32, rs RopeScaling) []float32 {
	factor, lo, hi := float32(rs.Factor), float32(rs.LowFreqFactor), float32(rs.HighFreqFactor)
	old := float64(rs.OriginalMax)
	lowWave, highWave := float32(old/rs.LowFreqFactor), float32(old/rs.HighFreqFactor)
	out := make([]float32, len(inv))
	for i, f := range inv {
		wave := float32(2*math.Pi) / f
		v := f
		if wave > lowWave {
			v = f / factor
		}
		if !(wave < highWave) && !(wave > lowWave) {
			smooth := (float32(old)/wave - lo) / (hi - lo)
			v = (1-smooth)*v/factor + smooth*v
		}
		out[i] = v
	}
	return out
}

// yarn is _compute_yarn_parameters.
func (s Shape) yarn(rs RopeScaling, theta float64, dim int) ([]float32, float32, error) {
	factor, origMax := rs.Factor, float64(s.MaxSeq)
	if rs.OriginalMax != 0 { // DeepSeek-V3, Qwen: the ratio of the two lengths is the factor
		origMax = float64(rs.OriginalMax)
		factor = float64(s.MaxSeq) / origMax
	}
	if !(factor >= 1) || math.IsInf(factor, 0) {
		return nil, 0, fmt.Errorf("model: rope_scaling (yarn) factor %g (max_position_embeddings / original_max_position_embeddings when that is given) must be >= 1", factor)
	}
	mscale := func(scale, m float64) float64 {
		if scale <= 1 {
			return 1
		}
		return 0.1*m*math.Log(scale) + 1
	}
	att := rs.AttentionFactor
	if att == 0 {
		if rs.Mscale != 0 && rs.MscaleAllDim != 0 {
			att = mscale(factor, rs.Mscale) / mscale(factor, rs.MscaleAllDim)
		} else {
			att = mscale(factor, 1)
		}
	}
	betaFast, betaSlow := rs.BetaFast, rs.BetaSlow
	if betaFast == 0 {
		betaFast = 32
	}
	if betaSlow == 0 {
		betaSlow = 1
	}
	corr := func(rot float64) float64 {
		return float64(dim) * math.Log(origMax/(rot*2*math.Pi)) / (2 * math.Log(theta))
	}
	low, high := corr(betaFast), corr(betaSlow)
	if !rs.NoTruncate {
		low, high = math.Floor(low), math.Ceil(high)
	}
	low, high = math.Max(low, 0), math.Min(high, float64(dim-1))
	if low == high {
		high += 0.001
	}
	ext := gpu.InvFreq(dim, theta) // 1/pos_freqs
	inv := make([]float32, dim/2)
	base := float64(float32(theta))
	for i := range inv {
		pos := float32(math.Pow(base, float64(float32(2*i)/float32(dim))))
		interp := 1 / (float32(factor) * pos)
		ramp := (float32(i) - float32(low)) / float32(high-low)
		ramp = min(max(ramp, 0), 1)
		extFactor := 1 - ramp
		inv[i] = interp*(1-extFactor) + ext[i]*extFactor
	}
	return inv, float32(att), nil
}

// longrope is _compute_longrope_parameters: the short factors up to the
// original length, the long ones past it.
func (s Shape) longrope(rs RopeScaling, theta float64, dim, seqLen int) ([]float32, float32, error) {
	short, err := ParseFactors(rs.ShortFactor)
	if err != nil {
		return nil, 0, err
	}
	long, err := ParseFactors(rs.LongFactor)
	if err != nil {
		return nil, 0, err
	}
	if len(short) != dim/2 || len(long) != dim/2 {
		return nil, 0, fmt.Errorf("model: rope_scaling (longrope) short_factor has %d numbers and long_factor %d: want %d each (half the rotated dims)", len(short), len(long), dim/2)
	}
	factor, origMax := rs.Factor, float64(s.MaxSeq)
	if rs.OriginalMax != 0 {
		origMax = float64(rs.OriginalMax)
		factor = float64(s.MaxSeq) / origMax
	}
	att := rs.AttentionFactor
	if att == 0 {
		att = 1
		if factor > 1 {
			att = math.Sqrt(1 + math.Log(factor)/math.Log(origMax))
		}
	}
	ext := short
	if float64(seqLen) > origMax {
		ext = long
	}
	inv := make([]float32, dim/2)
	base := float64(float32(theta))
	for i := range inv {
		p := float32(math.Pow(base, float64(float32(2*i)/float32(dim))))
		inv[i] = 1 / (float32(ext[i]) * p)
	}
	return inv, float32(att), nil
}
