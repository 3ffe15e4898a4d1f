package engine

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
)

// heldOutSet is a raw held-out text cut into windows of testSeq: 32 full
// rows, so that 2 ranks × 2 rows per round divide it and no row is padded
// (every target counts).
func heldOutSet(t *testing.T) *data.EvalSet {
	t.Helper()
	text := strings.Repeat("A held-out line, not in the training text; ", 40)[:32*testSeq+1]
	src := &data.Source{Corpus: model.Tokens(model.Encode([]byte(text))), Stats: data.Stats{Format: data.Text}}
	set, err := data.NewEvalSet(src, testSeq)
	if err != nil {
		t.Fatal(err)
	}
	if set.Len() != 32 {
		t.Fatalf("held-out set of %d rows, want 32", set.Len())
	}
	return set
}

// evalRun trains steps steps of e, evaluating set after every step when
// set is not nil, and returns the training result and the eval losses.
func evalRun(t *testing.T, e *Engine, steps int, set *data.EvalSet) (result, []float64) {
	t.Helper()
	var res result
	var evals []float64
	for range steps {
		st, err := stepWithin(t, e)
		if err != nil {
			t.Fatal(err)
		}
		res.losses = append(res.losses, st.Loss)
		if set != nil {
			es, err := e.Eval(t.Context(), set)
			if err != nil {
				t.Fatalf("eval after step %d: %v", st.Step, err)
			}
			if es.Tokens != set.Targets() || es.Rows != set.Len() || !(es.Loss > 0) {
				t.Fatalf("eval after step %d: %+v, want %d tokens over %d rows", st.Step, es, set.Targets(), set.Len())
			}
			evals = append(evals, es.Loss)
		}
	}
	var err error
	if res.params, err = e.Params(); err != nil {
		t.Fatal(err)
	}
	if res.master, err = e.Master(); err != nil {
		t.Fatal(err)
	}
	return res, evals
}

// refEval is the held-out loss of params computed apart from the engine:
// one device, the params resident (model.Resident), the model (with the
// engine's activation options) forward on the same micro-batches of B
// rows in the same order, weighted by their target counts.
func refEval(t *testing.T, params [][]float32, set *data.EvalSet, micro int) float64 {
	t.Helper()
	cfg := testConfig(t, runSpec{stage: 0, n: 1, micro: 1, accum: 1}.configJSON())
	layout, err := model.NewLayout(model.Shape(*cfg.Shape()))
	if err != nil {
		t.Fatal(err)
	}
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	dev := devs[0]
	res, err := model.NewResident(dev, layout, gpu.BF16)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Free()
	// The activations the engine's model keeps in bf16 mode (bf16).
	m, err := model.NewWith(dev, layout, micro, testSeq, estimate.ActivationOptionsFromConfig(cfg, layout.Shape, gpu.BF16))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	s := dev.NewStream()
	res.Load(s, params)
	var sum float64
	var n int64
	for first := int64(0); first < set.Len(); first += int64(micro) {
		b, err := set.Rows(first, micro)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Forward(s, res, b); err != nil {
			t.Fatal(err)
		}
		l, err := m.Loss(s)
		if err != nil {
			t.Fatal(err)
		}
		var k int64
		for _, tg := range b.Targets {
			if tg != model.IgnoreTarget {
				k++
			}
		}
		sum += l * float64(k)
		n += k
	}
	return sum / float64(n)
}

// TestEvalKeepsTraining: Eval after every step changes nothing of the
// training: the losses, params and master weights of 5 steps are
// bit-identical to the same run without it, at stages 0-3, with the
// optimizer on the device, on the host under the next step (exact), with
// the delayed update (dpu) and with params and optimizer state on NVMe.
// Its loss is the held-out loss of the engine's params computed apart
// (refEval: the same kernels on the same bits, so equal), and it falls
// as the model trains. No device memory is allocated or freed after step
// 1, Evals included.
func TestEvalKeepsTraining(t *testing.T) {
	set := heldOutSet(t)
	const steps = 5
	type run struct {
		name string
		mk   func(t *testing.T) *Engine
	}
	js := func(s runSpec) func(t *testing.T) *Engine {
		return func(t *testing.T) *Engine { return newEngineJSON(t, s.configJSON(), s.n) }
	}
	runs := []run{
		{"stage0/device", js(runSpec{stage: 0, n: 2, micro: 2, accum: 2, clip: 1})},
		{"stage2/host-exact", js(runSpec{stage: 2, n: 2, offload: true, micro: 2, accum: 1, clip: 1})},
		{"stage3/host-exact", js(runSpec{stage: 3, n: 2, offload: true, micro: 2, accum: 1})},
		{"stage3/dpu", func(t *testing.T) *Engine {
			return newEngineJSON(t, dpuJSON(runSpec{stage: 3, n: 2, offload: true, micro: 2, accum: 1, clip: 1}, 2), 2)
		}},
		{"stage3/param-nvme-opt-nvme", func(t *testing.T) *Engine {
			return newTierEngine(t, tierSpec{n: 2, param: "nvme", opt: "nvme"}, Options{})
		}},
	}
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			want, _ := evalRun(t, r.mk(t), steps, nil)
			e := r.mk(t)
			got, evals := evalRun(t, e, steps, set)
			sameResult(t, "training with Eval after every step", got, want)
			// Eval's loss is that of the params it evaluated: those of the
			// last step (check the last, whose params the run returned;
			// under dpu the devices hold the step before's, which Params
			// returns too).
			micro := e.micro
			if ref := refEval(t, got.params, set, micro); evals[steps-1] != ref {
				t.Errorf("eval loss %v, the same params evaluated apart %v", evals[steps-1], ref)
			}
			if !(evals[steps-1] < evals[0]) {
				t.Errorf("held-out loss did not fall: %v", evals)
			}
			// Eval's gathered chunks come from the same rings as a step's:
			// no device memory is taken or given back after step 1.
			for _, d := range e.Summary().PerDevice {
				if d.DeviceAllocsAfterStep1 != 0 {
					t.Errorf("%s: %d device allocations and frees after step 1 with Eval between the steps", d.Device, d.DeviceAllocsAfterStep1)
				}
			}
		})
	}
}

// TestEvalPadding: rows past the set's end are padding without targets:
// a set of 5 rows on 2 ranks of 2 rows reads 8 rows in 2 rounds and
// averages over the 5 rows' targets only.
func TestEvalPadding(t *testing.T) {
	text := strings.Repeat("padding test ", 20)[:5*testSeq+1]
	src := &data.Source{Corpus: model.Tokens(model.Encode([]byte(text))), Stats: data.Stats{Format: data.Text}}
	set, err := data.NewEvalSet(src, testSeq)
	if err != nil {
		t.Fatal(err)
	}
	e := newEngineJSON(t, runSpec{stage: 3, n: 2, offload: true, micro: 2, accum: 1}.configJSON(), 2)
	st, err := e.Eval(t.Context(), set)
	if err != nil {
		t.Fatal(err)
	}
	params, err := e.Params()
	if err != nil {
		t.Fatal(err)
	}
	if st.Tokens != 5*testSeq || st.Rows != 5 {
		t.Fatalf("eval of 5 rows: %+v", st)
	}
	if ref := refEval(t, params, set, 1); math.Abs(st.Loss-ref) > 1e-12*ref {
		// The engine sums per micro-batch of 2 rows, the reference per row:
		// the same per-token losses, summed in another order (float64).
		t.Errorf("eval loss %v, reference %v", st.Loss, ref)
	}
	if _, err := e.Eval(t.Context(), heldOutSetSeq(t, 8)); err == nil || !strings.Contains(err.Error(), "the set's rows are 8 tokens, the run's seq_len is 16") {
		t.Errorf("a set of another row length: %v", err)
	}
}

// heldOutSetSeq is a held-out set of rows of seq tokens.
func heldOutSetSeq(t *testing.T, seq int) *data.EvalSet {
	t.Helper()
	src := &data.Source{Corpus: model.Tokens(model.Encode([]byte(strings.Repeat("x", 100)))), Stats: data.Stats{Format: data.Text}}
	set, err := data.NewEvalSet(src, seq)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// packedRows packs generated JSONL examples (text, prompt/completion and
// chat lines, some longer than a row) into rows of testSeq.
func packedRows(t *testing.T, seed uint64) *data.Packed {
	t.Helper()
	var b strings.Builder
	for i := range 300 {
		switch i % 3 {
		case 0:
			fmt.Fprintf(&b, `{"text": "line %d of the packed test: %s"}`+"\n", i, strings.Repeat("ab", i%17))
		case 1:
			fmt.Fprintf(&b, `{"prompt": "Q%d? ", "completion": "A%d."}`+"\n", i, i*i)
		default:
			fmt.Fprintf(&b, `{"messages": [{"role": "user", "content": "u%d"}, {"role": "assistant", "content": "a%d"}]}`+"\n", i, i)
		}
	}
	p := filepath.Join(t.TempDir(), "packed.jsonl")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := data.Open(p, data.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	rows, err := data.NewPacked(src.File, testSeq, seed, true)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestDatasetRowsSplit: a packed dataset's global batch is the same rows
// however it is split over ranks, micro-batches and rows per micro-batch:
// step t's rows t·G .. t·G+G-1, rank r's micro-batch k the B rows from
// (r·A+k)·B, as the sampler splits its windows.
func TestDatasetRowsSplit(t *testing.T) {
	ds := packedRows(t, 3)
	const g = 8
	for _, sp := range [][3]int{{1, 1, 8}, {2, 2, 2}, {4, 1, 2}, {8, 1, 1}, {2, 4, 1}} {
		e := &Engine{n: sp[0], accum: sp[1], micro: sp[2], data: &batches{dataset: ds}}
		for step := int64(1); step <= 3; step++ {
			var got []int32
			for r := range e.n {
				for k := range e.accum {
					b, err := e.rows(step, r, k)
					if err != nil {
						t.Fatal(err)
					}
					for i := range b.Rows {
						got = append(got, b.IDs[i*testSeq:(i+1)*testSeq]...)
						got = append(got, b.Targets[i*testSeq:(i+1)*testSeq]...)
					}
				}
			}
			want, err := ds.Rows((step-1)*g, g)
			if err != nil {
				t.Fatal(err)
			}
			var w []int32
			for i := range g {
				w = append(w, want.IDs[i*testSeq:(i+1)*testSeq]...)
				w = append(w, want.Targets[i*testSeq:(i+1)*testSeq]...)
			}
			if !slices.Equal(got, w) {
				t.Fatalf("N=%d A=%d B=%d step %d: the ranks' rows are not the global batch's", sp[0], sp[1], sp[2], step)
			}
		}
	}
}

// TestDatasetStages: training on packed JSONL rows (positions restarting
// per example, masked targets) ends bit-identical at stages 0-3 and with
// the optimizer on the host, as on raw windows (one micro-batch per step:
// with more, stages 2-3 reduce each micro-batch's gradient and 0-1 their
// sum, in another order).
func TestDatasetStages(t *testing.T) {
	var ref result
	for i, s := range []runSpec{
		{stage: 0, n: 2, micro: 4, accum: 1, clip: 1},
		{stage: 1, n: 2, micro: 4, accum: 1, clip: 1},
		{stage: 2, n: 2, micro: 4, accum: 1, clip: 1},
		{stage: 3, n: 2, micro: 4, accum: 1, clip: 1},
		{stage: 3, n: 2, offload: true, micro: 4, accum: 1, clip: 1},
	} {
		devs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: 256 << 20})
		if err != nil {
			t.Fatal(err)
		}
		e, err := startEngine(t, testConfig(t, s.configJSON()), cpu.Devices(devs), comms, Options{Dataset: packedRows(t, testSeed), OptimizerThreads: 2})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := evalRun(t, e, 6, nil)
		if i == 0 {
			ref = got
			if !(got.losses[5] < got.losses[0]) {
				t.Errorf("loss did not fall on packed rows: %v", got.losses)
			}
			continue
		}
		sameResult(t, s.String()+" on packed rows", got, ref)
	}
}
