package model

import "math"

// refLoss is a plain float64 forward of the whole model: the oracle of the
// gradient check. params holds one []float64 per chunk, laid out as layout
// says; ids and targets are batch×seq.
func refLoss(l *Layout, params [][]float64, ids, targets []int32, batch, seq int) float64 {
	s := l.Shape
	c, v, nh, hs := s.Dim, s.Vocab, s.Heads, s.HeadDim()
	bt := batch * seq
	emb := params[0]
	wte, wpe := emb[:v*c], emb[v*c:]

	x := make([]float64, bt*c)
	for b := 0; b < batch; b++ {
		for t := 0; t < seq; t++ {
			r := b*seq + t
			for i := 0; i < c; i++ {
				x[r*c+i] = wte[int(ids[r])*c+i] + wpe[t*c+i]
			}
		}
	}
	o := l.block()
	for layer := 0; layer < s.Layers; layer++ {
		w := params[BlockChunk(layer)]
		h := refLayerNorm(x, w[o.ln1g:], w[o.ln1b:], bt, c)
		qkv := refLinear(h, w[o.qkvW:], w[o.qkvB:], bt, c, 3*c)
		atty := make([]float64, bt*c)
		scale := 1 / math.Sqrt(float64(hs))
		for b := 0; b < batch; b++ {
			for hd := 0; hd < nh; hd++ {
				for t := 0; t < seq; t++ {
					q := qkv[(b*seq+t)*3*c+hd*hs:]
					scores := make([]float64, t+1)
					mx := math.Inf(-1)
					for u := 0; u <= t; u++ {
						k := qkv[(b*seq+u)*3*c+c+hd*hs:]
						var dot float64
						for i := 0; i < hs; i++ {
							dot += q[i] * k[i]
						}
						scores[u] = dot * scale
						mx = math.Max(mx, scores[u])
					}
					var sum float64
					for u := range scores {
						scores[u] = math.Exp(scores[u] - mx)
						sum += scores[u]
					}
					out := atty[(b*seq+t)*c+hd*hs:]
					for u := 0; u <= t; u++ {
						vv := qkv[(b*seq+u)*3*c+2*c+hd*hs:]
						p := scores[u] / sum
						for i := 0; i < hs; i++ {
							out[i] += p * vv[i]
						}
					}
				}
			}
		}
		proj := refLinear(atty, w[o.projW:], w[o.projB:], bt, c, c)
		for i := range x {
			x[i] += proj[i]
		}
		h2 := refLayerNorm(x, w[o.ln2g:], w[o.ln2b:], bt, c)
		f := refLinear(h2, w[o.fcW:], w[o.fcB:], bt, c, 4*c)
		for i, z := range f {
			f[i] = 0.5 * z * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(z+0.044715*z*z*z)))
		}
		mlp := refLinear(f, w[o.fcpW:], w[o.fcpB:], bt, 4*c, c)
		for i := range x {
			x[i] += mlp[i]
		}
	}
	fin := params[l.FinalNormChunk()]
	h := refLayerNorm(x, fin[:c], fin[c:], bt, c)
	var loss float64
	logits := make([]float64, v)
	for r := 0; r < bt; r++ {
		mx := math.Inf(-1)
		for j := 0; j < v; j++ {
			var dot float64
			for i := 0; i < c; i++ {
				dot += h[r*c+i] * wte[j*c+i]
			}
			logits[j] = dot
			mx = math.Max(mx, dot)
		}
		var sum float64
		for _, z := range logits {
			sum += math.Exp(z - mx)
		}
		loss += mx + math.Log(sum) - logits[targets[r]]
	}
	return loss / float64(bt)
}

func refLayerNorm(x, g, b []float64, rows, cols int) []float64 {
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
		rstd := 1 / math.Sqrt(vr/float64(cols)+LayerNormEps)
		for i, z := range row {
			y[r*cols+i] = (z-mean)*rstd*g[i] + b[i]
		}
	}
	return y
}

// refLinear returns x (rows×in) · Wᵀ + b with W out×in.
func refLinear(x, w, b []float64, rows, in, out int) []float64 {
	y := make([]float64, rows*out)
	for r := 0; r < rows; r++ {
		for j := 0; j < out; j++ {
			acc := b[j]
			for i := 0; i < in; i++ {
				acc += x[r*in+i] * w[j*in+i]
			}
			y[r*out+j] = acc
		}
	}
	return y
}
