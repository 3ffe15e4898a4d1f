package gputest

import (
	"fmt"
	"math"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

// The ops on token ids: cross-entropy (with ignored targets) and the
// embedding (with positions and an optional position table).

// crossEntropyRef is -log softmax(z[r])[targets[r]], 0 for a target < 0,
// where z = logits, or with softCap > 0 z = softCap·tanh(logits/softCap)
// (capLogits).
func crossEntropyRef(logits []float64, targets []int, rows, vocab int, softCap float64) (loss, mag []float64) {
	loss, mag = make([]float64, rows), make([]float64, rows)
	for r := range rows {
		if targets[r] < 0 {
			continue
		}
		l := capLogits(logits[r*vocab:(r+1)*vocab], softCap)
		mx := math.Inf(-1)
		for _, v := range l {
			mx = math.Max(mx, v)
		}
		var s float64
		for _, v := range l {
			s += math.Exp(v - mx)
		}
		loss[r] = math.Log(s) + mx - l[targets[r]]
		mag[r] = math.Abs(math.Log(s)) + math.Abs(mx) + math.Abs(l[targets[r]])
	}
	return loss, mag
}

// capLogits is softCap·tanh(x/softCap) of each logit in float64, or a
// copy of l with softCap 0.
func capLogits(l []float64, softCap float64) []float64 {
	z := append([]float64(nil), l...)
	if softCap > 0 {
		for i, v := range z {
			z[i] = softCap * math.Tanh(v/softCap)
		}
	}
	return z
}

// ceTargets draws rows targets in [0, vocab), the first vocab-1 and the
// last IgnoreTarget (-1).
func ceTargets(r interface{ IntN(int) int }, rows, vocab int) []int {
	targets := make([]int, rows)
	for i := range targets {
		targets[i] = r.IntN(vocab)
	}
	targets[0], targets[rows-1] = vocab-1, -1
	return targets
}

// testCrossEntropy checks CrossEntropyForward and CrossEntropyBackward
// (in place over the logits) against float64, without and with a final
// soft cap (Gemma 2's 30 would leave these logits of about 4 nearly
// uncapped; 3 bends them), and a target past the vocabulary as an error
// on the stream. The capped backward is (softmax(z) - onehot)·(1 -
// (z/cap)²)·scale; fp32 rounds z once, within 1e-5 of the terms.
func testCrossEntropy(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(14)
	rows, vocab := 6, 37
	for _, softCap := range []float64{0, 3} {
		name := fmt.Sprintf("soft cap %g", softCap)
		logits := stored(randVals(r, rows*vocab, 4), dt)
		targets := ceTargets(r, rows, vocab)
		gl, gt := upload(t, d, s, logits, dt), upload(t, d, s, intVals(targets), gpu.I32)
		gloss := upload(t, d, s, constVals(rows, math.NaN()), dt)
		d.Ops().CrossEntropyForward(s, gl, gt, gloss, rows, vocab, float32(softCap))
		want, mag := crossEntropyRef(logits, targets, rows, vocab, softCap)
		checkClose(t, name+" losses", download(t, d, s, gloss), want, mag, dt, rtolF32)

		// Backward, in place over the logits; the ignored row is zero.
		scale := 0.25
		d.Ops().CrossEntropyBackward(s, gl, gt, gl, rows, vocab, float32(scale), float32(softCap))
		got := download(t, d, s, gl)
		ref := make([]float64, rows*vocab)
		for i := range rows {
			if targets[i] < 0 {
				continue
			}
			z := capLogits(logits[i*vocab:(i+1)*vocab], softCap)
			p := softmaxRow(z)
			p[targets[i]]--
			for c, v := range p {
				dz := 1.0
				if softCap > 0 {
					dz = 1 - (z[c]/softCap)*(z[c]/softCap)
				}
				ref[i*vocab+c] = v * dz * scale
			}
		}
		checkClose(t, name+" dlogits in place", got, ref, constVals(rows*vocab, scale), dt, rtolF32)
	}

	// A target past the vocabulary is an error on the stream.
	gl, gloss := upload(t, d, s, randVals(r, rows*vocab, 1), dt), alloc(t, d, rows, dt)
	d.Ops().CrossEntropyForward(s, gl, upload(t, d, s, constVals(rows, float64(vocab)), gpu.I32), gloss, rows, vocab, 0)
	if err := s.Synchronize(); err == nil {
		t.Error("cross-entropy with target = vocab: no error on the stream")
	}
}

// gradCrossEntropy: CrossEntropyBackward against central differences of
// the float64 loss, without and with a soft cap.
func gradCrossEntropy(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(35)
	rows, vocab := 4, 9
	scale := 1.0 / 4
	for _, softCap := range []float64{0, 2} {
		logits := stored(randVals(r, rows*vocab, 3), dt)
		targets := ceTargets(r, rows, vocab)
		gl, gt := upload(t, d, s, logits, dt), upload(t, d, s, intVals(targets), gpu.I32)
		gdl := upload(t, d, s, constVals(rows*vocab, math.NaN()), dt)
		d.Ops().CrossEntropyBackward(s, gl, gt, gdl, rows, vocab, float32(scale), float32(softCap))
		fd := fdGrad(func(v []float64) float64 {
			loss, _ := crossEntropyRef(v, targets, rows, vocab, softCap)
			var l float64
			for _, x := range loss {
				l += scale * x
			}
			return l
		}, logits)
		checkGrad(t, fmt.Sprintf("soft cap %g dlogits", softCap), download(t, d, s, gdl), fd, nil, dt)
	}
}

// embCase is an embedding configuration: positions (nil: t) and whether
// there is a position table.
type embCase struct {
	name string
	pos  []int
	wpe  bool
}

func embeddingRef(ids, pos []int, wte, wpe []float64, batch, seq, dim int) []float64 {
	out := make([]float64, batch*seq*dim)
	for bt := range batch * seq {
		p := bt % seq
		if pos != nil {
			p = pos[bt]
		}
		for c := range dim {
			out[bt*dim+c] = wte[ids[bt]*dim+c]
			if wpe != nil {
				out[bt*dim+c] += wpe[p*dim+c]
			}
		}
	}
	return out
}

const embB, embT, embDim, embVocab, embMaxSeq = 2, 5, 7, 11, 9

var embCases = []embCase{
	{name: "gpt2", wpe: true},
	{name: "gpt2 packed", wpe: true, pos: []int{0, 1, 0, 1, 2, 0, 0, 1, 2, 3}},
	{name: "no position table", pos: []int{0, 1, 2, 0, 1, 0, 1, 2, 3, 4}},
}

func testEmbedding(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(15)
	for _, c := range embCases {
		ids := make([]int, embB*embT)
		for i := range ids {
			ids[i] = r.IntN(embVocab)
		}
		wte, wpe := stored(randVals(r, embVocab*embDim, 1), dt), stored(randVals(r, embMaxSeq*embDim, 1), dt)
		gi, gte := upload(t, d, s, intVals(ids), gpu.I32), upload(t, d, s, wte, dt)
		var gpe, gpos gpu.Buffer
		if c.wpe {
			gpe = upload(t, d, s, wpe, dt)
		} else {
			wpe = nil
		}
		if c.pos != nil {
			gpos = upload(t, d, s, intVals(c.pos), gpu.I32)
		}
		gout := upload(t, d, s, constVals(embB*embT*embDim, math.NaN()), dt)
		d.Ops().EmbeddingForward(s, gi, gpos, gte, gpe, gout, embB, embT, embDim)
		want := embeddingRef(ids, c.pos, wte, wpe, embB, embT, embDim)
		var magPE []float64
		if wpe != nil {
			magPE = absVals(wpe)
		}
		mag := embeddingRef(ids, c.pos, absVals(wte), magPE, embB, embT, embDim)
		checkClose(t, c.name, download(t, d, s, gout), want, mag, dt, rtolF32)
	}
	// A position past the table is an error on the stream.
	gi := upload(t, d, s, constVals(embT, 1), gpu.I32)
	gpos := upload(t, d, s, []float64{0, 1, 2, 3, embT}, gpu.I32)
	gte, gpe := alloc(t, d, embVocab*embDim, dt), alloc(t, d, embT*embDim, dt)
	d.Ops().EmbeddingForward(s, gi, gpos, gte, gpe, alloc(t, d, embT*embDim, dt), 1, embT, embDim)
	if err := s.Synchronize(); err == nil {
		t.Error("embedding with a position past wpe: no error on the stream")
	}
}

func gradEmbedding(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(36)
	B, T, dim, vocab, maxSeq := 2, 3, 4, 5, 4
	ids := []int{1, 3, 1, 4, 1, 0} // repeats: accumulation order matters
	for _, c := range []embCase{{name: "gpt2", wpe: true}, {name: "gpt2 packed", wpe: true, pos: []int{0, 1, 0, 0, 0, 1}}, {name: "no position table"}} {
		wte, wpe := stored(randVals(r, vocab*dim, 1), dt), stored(randVals(r, maxSeq*dim, 1), dt)
		w := stored(randVals(r, B*T*dim, 1), dt)
		dte0, dpe0 := stored(randVals(r, vocab*dim, 1), dt), stored(randVals(r, maxSeq*dim, 1), dt)
		gi, gw, gdte := upload(t, d, s, intVals(ids), gpu.I32), upload(t, d, s, w, dt), upload(t, d, s, dte0, dt)
		var gdpe, gpos gpu.Buffer
		if c.wpe {
			gdpe = upload(t, d, s, dpe0, dt)
		}
		if c.pos != nil {
			gpos = upload(t, d, s, intVals(c.pos), gpu.I32)
		}
		d.Ops().EmbeddingBackward(s, gi, gpos, gw, gdte, gdpe, B, T, dim)
		pe := wpe
		if !c.wpe {
			pe = nil
		}
		fdTE := fdGrad(func(v []float64) float64 { return dotVals(w, embeddingRef(ids, c.pos, v, pe, B, T, dim)) }, wte)
		checkGrad(t, fmt.Sprintf("%s dwte", c.name), download(t, d, s, gdte), fdTE, dte0, dt)
		if c.wpe {
			fdPE := fdGrad(func(v []float64) float64 { return dotVals(w, embeddingRef(ids, c.pos, wte, v, B, T, dim)) }, wpe)
			checkGrad(t, fmt.Sprintf("%s dwpe", c.name), download(t, d, s, gdpe), fdPE, dpe0, dt)
		}
	}
}
