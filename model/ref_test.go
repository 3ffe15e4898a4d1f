package model

import "math"

// refLoss is a plain float64 forward of the whole model, GPT-2 or the
// Llama family: the oracle of the gradient checks. params holds one
// []float64 per chunk, laid out as layout says; b is the micro-batch
// (batch×seq, with its positions and ignored targets). The loss is the
// mean over the tokens with a target, 0 when there is none.
func refLoss(l *Layout, params [][]float64, b Batch, batch, seq int) float64 {
	s := l.Shape
	c, v := s.Dim, s.Vocab
	bt := batch * seq
	pos := b.Pos
	if pos == nil {
		pos = make([]int32, bt)
		for i := range pos {
			pos[i] = int32(i % seq)
		}
	}
	emb := params[EmbeddingChunk]
	x := make([]float64, bt*c)
	for r := 0; r < bt; r++ {
		for i := 0; i < c; i++ {
			x[r*c+i] = emb[int(b.IDs[r])*c+i]
			if !s.IsLlama() {
				x[r*c+i] += emb[v*c+int(pos[r])*c+i]
			}
		}
	}
	for layer := 0; layer < s.Layers; layer++ {
		if s.IsLlama() {
			refLlamaBlock(l, params[BlockChunk(layer)], x, pos, batch, seq)
		} else {
			refGPT2Block(l, params[BlockChunk(layer)], x, pos, batch, seq)
		}
	}
	fin := params[l.FinalNormChunk()]
	var h, head []float64
	if s.IsLlama() {
		h = refRMSNorm(x, fin[:c], bt, c, s.Eps())
	} else {
		h = refLayerNorm(x, fin[:c], fin[c:], bt, c, s.Eps())
	}
	if s.TiedHead() {
		head = emb[:v*c]
	} else {
		head = fin[c:]
	}
	var loss float64
	counted := 0
	logits := make([]float64, v)
	for r := 0; r < bt; r++ {
		if b.Targets[r] == IgnoreTarget {
			continue
		}
		counted++
		mx := math.Inf(-1)
		for j := 0; j < v; j++ {
			var dot float64
			for i := 0; i < c; i++ {
				dot += h[r*c+i] * head[j*c+i]
			}
			logits[j] = dot
			mx = math.Max(mx, dot)
		}
		var sum float64
		for _, z := range logits {
			sum += math.Exp(z - mx)
		}
		loss += mx + math.Log(sum) - logits[b.Targets[r]]
	}
	if counted == 0 {
		return 0
	}
	return loss / float64(counted)
}

// refGPT2Block applies GPT-2 block w to x in place.
func refGPT2Block(l *Layout, w, x []float64, pos []int32, batch, seq int) {
	s := l.Shape
	c, f, bt, eps := s.Dim, s.FFNDim(), batch*seq, s.Eps()
	o := l.block()
	h := refLayerNorm(x, w[o.ln1g:], w[o.ln1b:], bt, c, eps)
	qkv := refLinear(h, w[o.qkvW:], w[o.qkvB:], bt, c, 3*c)
	atty := refAttention(qkv, pos, batch, seq, s.Heads, s.Heads, s.HeadDim())
	proj := refLinear(atty, w[o.projW:], w[o.projB:], bt, c, c)
	for i := range x {
		x[i] += proj[i]
	}
	h2 := refLayerNorm(x, w[o.ln2g:], w[o.ln2b:], bt, c, eps)
	fc := refLinear(h2, w[o.fcW:], w[o.fcB:], bt, c, f)
	for i, z := range fc {
		fc[i] = 0.5 * z * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(z+0.044715*z*z*z)))
	}
	mlp := refLinear(fc, w[o.fcpW:], w[o.fcpB:], bt, f, c)
	for i := range x {
		x[i] += mlp[i]
	}
}

// refLlamaBlock applies Llama-family block w to x in place, written from
// Hugging Face's LlamaDecoderLayer: RMSNorm, q/k/v projections (Qwen2:
// with biases), rotate_half rotary embeddings, repeat_kv grouped
// attention, o_proj, residual, RMSNorm, down(silu(gate)·up), residual.
func refLlamaBlock(l *Layout, w, x []float64, pos []int32, batch, seq int) {
	s := l.Shape
	c, f, bt, eps := s.Dim, s.FFNDim(), batch*seq, s.Eps()
	h, kv, d := s.Heads, s.KVHeadCount(), s.HeadDim()
	q := qkvWidth(s)
	o := l.llamaBlock()
	ln1 := refRMSNorm(x, w[o.ln1:], bt, c, eps)
	var bias []float64
	if o.qkvB >= 0 {
		bias = w[o.qkvB:]
	}
	qkv := refLinear(ln1, w[o.qkvW:], bias, bt, c, q)
	for r := 0; r < bt; r++ {
		for hd := 0; hd < h+kv; hd++ { // q heads, then k heads
			refRotate(qkv[r*q+hd*d:r*q+(hd+1)*d], float64(pos[r]), s.Theta())
		}
	}
	atty := refAttention(qkv, pos, batch, seq, h, kv, d)
	proj := refLinear(atty, w[o.oW:], nil, bt, c, c)
	for i := range x {
		x[i] += proj[i]
	}
	ln2 := refRMSNorm(x, w[o.ln2:], bt, c, eps)
	gu := refLinear(ln2, w[o.gateUpW:], nil, bt, c, 2*f)
	act := make([]float64, bt*f)
	for r := 0; r < bt; r++ {
		for i := 0; i < f; i++ {
			g, u := gu[r*2*f+i], gu[r*2*f+f+i]
			act[r*f+i] = g / (1 + math.Exp(-g)) * u
		}
	}
	down := refLinear(act, w[o.downW:], nil, bt, f, c)
	for i := range x {
		x[i] += down[i]
	}
}

// refRotate applies rotate_half rotary embedding at position p to one
// head: x·cos + rotate_half(x)·sin with the angles p·theta^(-2i/D).
func refRotate(x []float64, p, theta float64) {
	half := len(x) / 2
	for i := 0; i < half; i++ {
		a := p * math.Pow(theta, -2*float64(i)/float64(len(x)))
		x1, x2 := x[i], x[half+i]
		x[i], x[half+i] = x1*math.Cos(a)-x2*math.Sin(a), x2*math.Cos(a)+x1*math.Sin(a)
	}
}

// refAttention is causal grouped-query attention over packed qkv rows
// ((h + 2·kv)·d values per token), query head hd using key/value head
// hd/(h/kv), a query at (b, t) seeing keys t-pos .. t of its row.
func refAttention(qkv []float64, pos []int32, batch, seq, h, kv, d int) []float64 {
	q := (h + 2*kv) * d
	out := make([]float64, batch*seq*h*d)
	scale := 1 / math.Sqrt(float64(d))
	for b := 0; b < batch; b++ {
		for hd := 0; hd < h; hd++ {
			g := hd / (h / kv)
			for t := 0; t < seq; t++ {
				lo := t - int(pos[b*seq+t])
				qv := qkv[(b*seq+t)*q+hd*d:]
				scores := make([]float64, t+1-lo)
				mx := math.Inf(-1)
				for u := lo; u <= t; u++ {
					k := qkv[(b*seq+u)*q+(h+g)*d:]
					var dot float64
					for i := 0; i < d; i++ {
						dot += qv[i] * k[i]
					}
					scores[u-lo] = dot * scale
					mx = math.Max(mx, scores[u-lo])
				}
				var sum float64
				for i := range scores {
					scores[i] = math.Exp(scores[i] - mx)
					sum += scores[i]
				}
				o := out[(b*seq+t)*h*d+hd*d:]
				for u := lo; u <= t; u++ {
					vv := qkv[(b*seq+u)*q+(h+kv+g)*d:]
					for i := 0; i < d; i++ {
						o[i] += scores[u-lo] / sum * vv[i]
					}
				}
			}
		}
	}
	return out
}

func refLayerNorm(x, g, b []float64, rows, cols int, eps float64) []float64 {
	y := make([]float64, len(x))
	for r := 0; r < rows; r++ {
		row := x[r*cols : (r+1)*cols]
		var mean, vr float64
		for _, z := range row {
			mean += z
		}
		mean /= float64(cols)
		for _, z := range row {
			vr += (z - mean) * (z - mean)
		}
		rstd := 1 / math.Sqrt(vr/float64(cols)+eps)
		for i, z := range row {
			y[r*cols+i] = (z-mean)*rstd*g[i] + b[i]
		}
	}
	return y
}

func refRMSNorm(x, g []float64, rows, cols int, eps float64) []float64 {
	y := make([]float64, len(x))
	for r := 0; r < rows; r++ {
		row := x[r*cols : (r+1)*cols]
		var ms float64
		for _, z := range row {
			ms += z * z
		}
		rstd := 1 / math.Sqrt(ms/float64(cols)+eps)
		for i, z := range row {
			y[r*cols+i] = z * rstd * g[i]
		}
	}
	return y
}

// refLinear returns x (rows×in) · Wᵀ + b with W out×in; b may be nil.
func refLinear(x, w, b []float64, rows, in, out int) []float64 {
	y := make([]float64, rows*out)
	for r := 0; r < rows; r++ {
		for j := 0; j < out; j++ {
			var acc float64
			if b != nil {
				acc = b[j]
			}
			for i := 0; i < in; i++ {
				acc += x[r*in+i] * w[j*in+i]
			}
			y[r*out+j] = acc
		}
	}
	return y
}
