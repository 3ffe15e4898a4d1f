package model

import (
	"fmt"

	"github.com/strata-ai/strata/gpu"
)

// activations are views into the model's allocations; see planActivations.
type activations struct {
	ids, targets, pos gpu.Buffer // I32 (B·T)
	res               []gpu.Buffer
	layers            []layerActs
	lnf               gpu.Buffer // B·T·C: the final norm's output
	lnfMean           gpu.Buffer // B·T (GPT-2's layernorm only)
	lnfRstd           gpu.Buffer // B·T
	logits            gpu.Buffer // B·T·V
	dlogits           gpu.Buffer // B·T·V
	losses            gpu.Buffer // B·T
	dres              gpu.Buffer // B·T·C: gradient of the residual stream
	dtmp              gpu.Buffer // B·T·C
	dbig              gpu.Buffer // B·T·max(qkv width, MLP gradient width): gradient of qkv or of the MLP hidden layer
}

// layerActs are what one block saves for its backward. GPT-2 fills every
// field; the Llama family has no norm means (RMSNorm), and its fch is the
// fused gate|up output (2F wide).
type layerActs struct {
	ln1, ln1Mean, ln1Rstd gpu.Buffer // B·T·C, B·T, B·T: the first norm's output and statistics
	qkv                   gpu.Buffer // B·T·(H+2·KV)·D: q, k, v (rotated, for the Llama family)
	atty                  gpu.Buffer // B·T·C: attention output before the output projection
	lse                   gpu.Buffer // B·H·T: attention's row log-sum-exp
	res2                  gpu.Buffer // B·T·C: residual after attention
	ln2, ln2Mean, ln2Rstd gpu.Buffer // B·T·C, B·T, B·T
	fch                   gpu.Buffer // B·T·F (GPT-2: c_fc output) or B·T·2F (gate|up output)
	fchAct                gpu.Buffer // B·T·F: gelu(fch) or swiglu(gate, up); reused for its gradient in backward
}

// segment is one named tensor inside an activation allocation.
type segment struct {
	name string
	n    int
	dst  *gpu.Buffer
}

// allocation is one device allocation holding several segments.
type allocation struct {
	purpose string
	dtype   gpu.DType
	segs    []segment
}

// segmentAlign keeps every activation tensor 256-byte aligned within its
// allocation, as a GPU kernel wants.
const segmentAlign = 64

func alignUp(n int) int { return (n + segmentAlign - 1) / segmentAlign * segmentAlign }

func (a allocation) elements() int {
	n := 0
	for _, s := range a.segs {
		n += alignUp(s.n)
	}
	return n
}

// qkvWidth is the number of values of one token's packed q|k|v row.
func qkvWidth(s Shape) int { return (s.Heads + 2*s.KVHeadCount()) * s.HeadDim() }

// mlpWidth is the width of the MLP's first GEMM output: GPT-2's c_fc (F),
// the Llama family's fused gate|up (2F).
func mlpWidth(s Shape) int {
	if s.IsLlama() {
		return 2 * s.FFNDim()
	}
	return s.FFNDim()
}

// planActivations lists the allocations of a model of shape s for batch×seq
// tokens; when a is not nil, each segment's dst points into it.
//
// Per token: the embedding output (C). Per token and block: GPT-2 saves
// ln1, res2, ln2, the attention output and the block output (C each), qkv
// (3C), c_fc's output and its gelu (F each), four norm statistics and H
// attention row statistics: 8C + 2F + 4 + H (16C + 4 + H with F = 4C). The
// Llama family saves ln1, res2, ln2, the attention output and the block
// output (C each), qkv (C + 2·KV·D), gate|up (2F), the SwiGLU output (F),
// two norm statistics and H: 6C + 2·KV·D + 3F + 2 + H. The head holds the
// final norm (C and its 2 or 1 statistics), the logits and their gradient
// (2V) and the losses (1); the backward scratch is 2C plus the wider of
// qkv and the MLP's gradient (GPT-2 max(3C, F), Llama max(C + 2·KV·D, 2F)).
func planActivations(s Shape, batch, seq int, a *activations) []allocation {
	if a == nil {
		a = &activations{}
	}
	bt, c, v, ffn := batch*seq, s.Dim, s.Vocab, s.FFNDim()
	llama := s.IsLlama()
	a.res = make([]gpu.Buffer, s.Layers+1)
	a.layers = make([]layerActs, s.Layers)
	plan := []allocation{
		{"tokens", gpu.I32, []segment{{"ids", bt, &a.ids}, {"targets", bt, &a.targets}, {"pos", bt, &a.pos}}},
		{"embedding out", gpu.F32, []segment{{"res0", bt * c, &a.res[0]}}},
	}
	// stats are a norm's statistics: mean and rstd for LayerNorm, rstd for RMSNorm.
	stats := func(mean, rstd *gpu.Buffer, name string) []segment {
		if llama {
			return []segment{{name + " rstd", bt, rstd}}
		}
		return []segment{{name + " mean", bt, mean}, {name + " rstd", bt, rstd}}
	}
	for l := 0; l < s.Layers; l++ {
		la := &a.layers[l]
		segs := []segment{{"ln1", bt * c, &la.ln1}}
		segs = append(segs, stats(&la.ln1Mean, &la.ln1Rstd, "ln1")...)
		segs = append(segs, segment{"qkv", bt * qkvWidth(s), &la.qkv}, segment{"atty", bt * c, &la.atty},
			segment{"lse", batch * s.Heads * seq, &la.lse}, segment{"res2", bt * c, &la.res2}, segment{"ln2", bt * c, &la.ln2})
		segs = append(segs, stats(&la.ln2Mean, &la.ln2Rstd, "ln2")...)
		segs = append(segs, segment{"fch", bt * mlpWidth(s), &la.fch}, segment{"fch act", bt * ffn, &la.fchAct},
			segment{"out", bt * c, &a.res[l+1]})
		plan = append(plan, allocation{fmt.Sprintf("block %d", l), gpu.F32, segs})
	}
	head := []segment{{"lnf", bt * c, &a.lnf}}
	head = append(head, stats(&a.lnfMean, &a.lnfRstd, "lnf")...)
	head = append(head, segment{"logits", bt * v, &a.logits}, segment{"dlogits", bt * v, &a.dlogits}, segment{"losses", bt, &a.losses})
	plan = append(plan,
		allocation{"head", gpu.F32, head},
		allocation{"backward scratch", gpu.F32, []segment{
			{"dres", bt * c, &a.dres}, {"dtmp", bt * c, &a.dtmp}, {"dbig", bt * max(qkvWidth(s), mlpWidth(s)), &a.dbig},
		}},
	)
	return plan
}

// ActivationBytes is the device memory a Model of shape s allocates for
// micro-batches of batch sequences of seq tokens: the embedding output (C
// floats per token), every block's saved activations (per token, GPT-2:
// 8C + 2F + 4 + H floats; the Llama family: 6C + 2·KV·D + 3F + 2 + H), the
// head (the final norm, the logits and their gradient, 2V per token) and
// the backward scratch (2C + the wider of qkv and the MLP gradient per
// token), each tensor padded to 256 bytes, and the token ids, targets and
// positions (3 int32 per token); planActivations lists them. Attention keeps H
// log-sum-exp values per token, not the seq×seq probabilities, so the
// bytes are linear in seq. It does not include the device's allocation
// granularity.
func ActivationBytes(s Shape, batch, seq int) int64 {
	var n int64
	for _, a := range planActivations(s, batch, seq, nil) {
		n += int64(a.elements()) * int64(a.dtype.Size())
	}
	return n
}
