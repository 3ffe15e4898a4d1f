package data

import (
	"math"
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
)

// The end-to-end tests of masking and packing: rows made by this package
// from JSONL, run through the model (fp32, one CPU device, the params
// resident). They need the model side of model.Batch.Pos (attention kept
// inside each example, positions restarting) and model.IgnoreTarget (no
// loss, no gradient).

// e2eModel is the tiny byte-level GPT-2 shape in fp32 with rows of seq
// tokens, its params initialised from a seed.
type e2eModel struct {
	m   *model.Model
	res *model.Resident
	s   gpu.Stream
}

func newE2EModel(t *testing.T, rows, seq int) *e2eModel {
	t.Helper()
	shape, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	layout, err := model.NewLayout(shape)
	if err != nil {
		t.Fatal(err)
	}
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	dev := devs[0]
	res, err := model.NewResident(dev, layout, gpu.F32)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(dev, layout, rows, seq)
	if err != nil {
		t.Fatal(err)
	}
	e := &e2eModel{m: m, res: res, s: dev.NewStream()}
	t.Cleanup(func() { e.s.Synchronize(); m.Free(); res.Free() })
	var chunks [][]float32
	for c := range layout.Chunks {
		chunks = append(chunks, layout.InitChunk(3, c))
	}
	res.Load(e.s, chunks)
	return e
}

// lossGrad is the batch's mean loss over its targets and the gradient of
// that mean.
func (e *e2eModel) lossGrad(t *testing.T, b model.Batch) (float64, [][]float32) {
	t.Helper()
	e.res.ZeroGrads(e.s)
	if err := e.m.Forward(e.s, e.res, b); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Backward(e.s, e.res, 1); err != nil {
		t.Fatal(err)
	}
	l, err := e.m.Loss(e.s)
	if err != nil {
		t.Fatal(err)
	}
	g, err := e.res.ReadGrads(e.s)
	if err != nil {
		t.Fatal(err)
	}
	return l, g
}

// targets is the number of targets of a batch.
func targets(b model.Batch) int {
	n := 0
	for _, t := range b.Targets {
		if t != model.IgnoreTarget {
			n++
		}
	}
	return n
}

// addScaled accumulates w·g into acc (allocated on first use).
func addScaled(acc *[][]float64, g [][]float32, w float64) {
	if *acc == nil {
		*acc = make([][]float64, len(g))
		for c := range g {
			(*acc)[c] = make([]float64, len(g[c]))
		}
	}
	for c := range g {
		for i, v := range g[c] {
			(*acc)[c][i] += w * float64(v)
		}
	}
}

// closeGrads checks got against want elementwise: |got-want| <= tol·max|want|.
func closeGrads(t *testing.T, what string, got [][]float32, want [][]float64, tol float64) {
	t.Helper()
	var scale, worst float64
	for c := range want {
		for _, v := range want[c] {
			scale = max(scale, math.Abs(v))
		}
	}
	for c := range want {
		for i, v := range want[c] {
			worst = max(worst, math.Abs(float64(got[c][i])-v))
		}
	}
	if !(scale > 0) || worst > tol*scale {
		t.Errorf("%s: gradients differ by %g (largest %g, tolerance %g of it)", what, worst, scale, tol)
	}
}

// e2eRows packs a JSONL text into rows of seq (file order) and returns the
// first n rows.
func e2eRows(t *testing.T, jsonl string, seq, n int) model.Batch {
	t.Helper()
	src, err := Open(writeFile(t, "e2e.jsonl", jsonl), Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	p, err := NewPacked(src.File, seq, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Rows(0, n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMaskedTargetsContributeNothing: a packed row of prompt/completion
// examples (the prompts' targets model.IgnoreTarget) has the loss and the
// gradient of the mean over its completion tokens alone: run with only
// target i kept, for each completion target i, the mean of those losses
// and gradients is the row's. The prompt tokens' targets add nothing.
func TestMaskedTargetsContributeNothing(t *testing.T) {
	const seq = 48
	b := e2eRows(t, `{"prompt": "The sky is ", "completion": "blue."}`+"\n"+`{"prompt": "Two and two make ", "completion": "four."}`+"\n", seq, 1)
	n := targets(b)
	if n != 10 { // "blue." and "four.": the completions' 5+5 bytes
		t.Fatalf("%d targets in the row, want the 10 completion tokens", n)
	}
	e := newE2EModel(t, 1, seq)
	loss, grad := e.lossGrad(t, b)
	var meanLoss float64
	var meanGrad [][]float64
	for i, tg := range b.Targets {
		if tg == model.IgnoreTarget {
			continue
		}
		one := b
		one.Targets = make([]int32, len(b.Targets))
		for j := range one.Targets {
			one.Targets[j] = model.IgnoreTarget
		}
		one.Targets[i] = tg
		l, g := e.lossGrad(t, one)
		meanLoss += l / float64(n)
		addScaled(&meanGrad, g, 1/float64(n))
	}
	// fp32 model, the same per-token terms summed in another order: 1e-5.
	if math.Abs(loss-meanLoss) > 1e-5*meanLoss {
		t.Errorf("row loss %v, mean of its completion tokens' losses %v", loss, meanLoss)
	}
	closeGrads(t, "masked row vs its completion tokens one by one", grad, meanGrad, 1e-5)
}

// TestPackedRowEqualsExamples: a row packing three examples (positions
// restarting, attention inside each) has the loss and gradient of the
// three examples run alone, each in a row of its own starting at column
// 0: the target-weighted mean of theirs. Nothing is seen across an
// example's end.
func TestPackedRowEqualsExamples(t *testing.T) {
	const seq = 64
	lines := []string{`{"text": "abcabcabc hello"}`, `{"prompt": "Q: 1+1? ", "completion": "A: 2"}`, `{"text": "xyz xyz"}`}
	packed := e2eRows(t, lines[0]+"\n"+lines[1]+"\n"+lines[2]+"\n", seq, 1)
	// 15, 12 and 7 tokens: 14, 11 and 6 columns from columns 0, 14, 25.
	if packed.Pos[13] != 13 || packed.Pos[14] != 0 || packed.Pos[24] != 10 || packed.Pos[25] != 0 || packed.Pos[31] != 0 {
		t.Fatalf("the row does not hold the three examples at columns 0, 14, 25 and padding from 31: positions %v", packed.Pos)
	}
	e := newE2EModel(t, 1, seq)
	loss, grad := e.lossGrad(t, packed)
	var sumLoss float64
	var sumGrad [][]float64
	total := 0
	for _, l := range lines {
		alone := e2eRows(t, l+"\n", seq, 1)
		k := targets(alone)
		el, eg := e.lossGrad(t, alone)
		sumLoss += el * float64(k)
		addScaled(&sumGrad, eg, float64(k))
		total += k
	}
	if total != targets(packed) {
		t.Fatalf("the examples alone have %d targets, packed %d", total, targets(packed))
	}
	for c := range sumGrad {
		for i := range sumGrad[c] {
			sumGrad[c][i] /= float64(total)
		}
	}
	// fp32 model, the same per-token terms summed in another order: 1e-5.
	if want := sumLoss / float64(total); math.Abs(loss-want) > 1e-5*want {
		t.Errorf("packed row loss %v, the examples alone %v", loss, want)
	}
	closeGrads(t, "packed row vs its examples alone", grad, sumGrad, 1e-5)
}
