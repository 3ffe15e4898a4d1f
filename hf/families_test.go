package hf

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/hosttest"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
)

// The families people fine-tune today, each a tiny random model in
// Hugging Face's layout with every feature switched on and sized so that
// it matters (model/testdata/make_tiny_hf.py: rope scaling whose factors
// change the frequencies within the sequence, windows of 5 tokens over
// 24, head_dim unequal to hidden / heads, q/k norms, soft caps, fused
// tensors), read by Open and run by Strata's fp32 CPU backend against
// model/testdata/hf_reference.py, an independent float64 transcription of
// transformers' modeling code.
var families = []string{"llama31", "mistral", "nemo", "qwen2sw", "qwen3", "gemma2", "gemma3", "phi3", "phi3partial",
	"llama_dynamic", "qwen2_yarn", "llama_linear", "mixtral", "qwen3_moe", "qwen3_moe_step"}

// familyDir writes family's tiny model into a temporary directory.
func familyDir(t *testing.T, family string, seed int) string {
	t.Helper()
	dir := t.TempDir()
	script, err := filepath.Abs("../model/testdata/make_tiny_hf.py")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(hosttest.TorchPython, script, family, dir, "--seed", fmt.Sprint(seed)).CombinedOutput(); err != nil {
		t.Fatalf("make_tiny_hf.py %s: %v\n%s", family, err, out)
	}
	return dir
}

// referenceRun runs hf_reference.py in fp64 with args and returns its
// safetensors output as float64 tensors.
func referenceRun(t *testing.T, args ...string) map[string][]float64 {
	t.Helper()
	script, err := filepath.Abs("../model/testdata/hf_reference.py")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "ref.safetensors")
	cmd := exec.Command(hosttest.TorchPython, append(append([]string{script, "--fp64"}, args...), out)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hf_reference.py %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	h, data, err := safetensors.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	ref := map[string][]float64{}
	for _, ti := range h.Tensors {
		b := data[ti.Name]
		switch ti.DType {
		case "F64":
			v := make([]float64, len(b)/8)
			for i := range v {
				v[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
			}
			ref[ti.Name] = v
		case "F32":
			v := make([]float64, len(b)/4)
			for i := range v {
				v[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
			}
			ref[ti.Name] = v
		default:
			t.Fatalf("reference tensor %s is %s", ti.Name, ti.DType)
		}
	}
	return ref
}

// relErr is the largest |got - want| over the largest |want|.
func relErr(got []float32, want []float64) float64 {
	var d, m float64
	for i, w := range want {
		d = math.Max(d, math.Abs(float64(got[i])-w))
		m = math.Max(m, math.Abs(w))
	}
	if m == 0 {
		return d
	}
	return d / m
}

// TestFamiliesAgainstTorch: for each family, the logits (through the
// decoder's Score, what strata eval runs) and the loss (through the
// training model) of a batch of two rows of 24 tokens, and the gradient
// of every parameter, against the float64 transcription.
//
// Tolerances, relative to the largest magnitude of the reference tensor:
// logits and loss 1e-5 (Strata computes in fp32, about 6e-8 relative per
// operation, a few hundred operations deep in these three-layer models;
// a wrong rotation, window, norm or scale is off by 1e-2 or more), the
// gradients 1e-4 (one more pass through the same fp32 arithmetic).
func TestFamiliesAgainstTorch(t *testing.T) {
	hosttest.RequireTorch(t)
	for i, family := range families {
		t.Run(family, func(t *testing.T) {
			dir := familyDir(t, family, 10+i)
			m, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			l, s := m.Layout, m.Config.Shape
			chunks := make([][]float32, len(l.Chunks))
			for c := range l.Chunks {
				chunks[c] = make([]float32, l.Chunks[c].Len)
				if err := m.ReadChunk(c, chunks[c]); err != nil {
					t.Fatal(err)
				}
			}
			const rows, seq = 2, 24
			rng := rand.New(rand.NewPCG(uint64(i), 39))
			b := model.Batch{Rows: rows, Seq: seq, IDs: make([]int32, rows*seq), Targets: make([]int32, rows*seq)}
			for k := range b.IDs {
				b.IDs[k], b.Targets[k] = int32(rng.IntN(s.Vocab)), int32(rng.IntN(s.Vocab))
			}
			b.Targets[3] = model.IgnoreTarget
			ids2, tg2 := make([][]int32, rows), make([][]int32, rows)
			for r := range rows {
				ids2[r], tg2[r] = b.IDs[r*seq:(r+1)*seq], b.Targets[r*seq:(r+1)*seq]
			}
			bj, _ := json.Marshal(map[string]any{"ids": ids2, "targets": tg2})
			batch := filepath.Join(t.TempDir(), "batch.json")
			if err := os.WriteFile(batch, bj, 0o644); err != nil {
				t.Fatal(err)
			}
			ref := referenceRun(t, dir, batch)

			devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: units.GiB})
			if err != nil {
				t.Fatal(err)
			}
			dev := devs[0]
			st := dev.DefaultStream()
			ignore := make([]int32, seq)
			for k := range ignore {
				ignore[k] = model.IgnoreTarget
			}

			// Logits through the decoder, one row at a time.
			w, err := model.NewWeights(dev, l, gpu.F32)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Free()
			for c := range l.Chunks {
				w.LoadChunk(st, c, chunks[c])
			}
			d, err := model.NewDecoder(dev, l, model.DecoderOptions{Capacity: seq})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Free()
			defer st.Synchronize() // before the frees
			logits := make([]float32, rows*seq*s.Vocab)
			for r := range rows {
				d.Reset()
				_, _, err := d.Score(st, w, ids2[r], ignore, func(row int, v []float32) {
					copy(logits[(r*seq+row)*s.Vocab:], v)
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if e := relErr(logits, ref["logits"]); !(e <= 1e-5) {
				t.Errorf("logits: max relative error %.3g, tolerance 1e-5", e)
			}

			// Loss and gradients through the training model.
			res, err := model.NewResident(dev, l, gpu.F32)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Free()
			res.Load(st, chunks)
			res.ZeroGrads(st)
			mm, err := model.New(dev, l, rows, seq)
			if err != nil {
				t.Fatal(err)
			}
			defer mm.Free()
			defer st.Synchronize()
			if err := mm.Forward(st, res, b); err != nil {
				t.Fatal(err)
			}
			if err := mm.Backward(st, res, 1); err != nil {
				t.Fatal(err)
			}
			loss, err := mm.Loss(st)
			if err != nil {
				t.Fatal(err)
			}
			loss = s.Objective(loss, mm.RouterLoss()) // transformers' loss: the router's in it
			if e := math.Abs(loss-ref["loss"][0]) / math.Abs(ref["loss"][0]); !(e <= 1e-5) {
				t.Errorf("loss %.9g, reference %.9g: relative error %.3g, tolerance 1e-5", loss, ref["loss"][0], e)
			}
			if want, ok := ref["aux_loss"]; ok != s.MoE() {
				t.Errorf("a router loss in the reference: %t; a mixture of experts: %t", ok, s.MoE())
			} else if ok {
				if e := math.Abs(mm.RouterLoss()-want[0]) / math.Abs(want[0]); !(e <= 1e-5) {
					t.Errorf("router loss %.9g, reference %.9g: relative error %.3g, tolerance 1e-5", mm.RouterLoss(), want[0], e)
				}
				t.Logf("router loss %.9g, reference %.9g", mm.RouterLoss(), want[0])
			}
			grads, err := res.ReadGrads(st)
			if err != nil {
				t.Fatal(err)
			}
			worst, worstName := 0.0, ""
			for c, ch := range l.Chunks {
				for _, tn := range ch.Tensors {
					want, ok := ref["grad.model."+tn.Name]
					if !ok {
						want, ok = ref["grad."+tn.Name]
					}
					if !ok {
						t.Fatalf("no reference gradient of %s", tn.Name)
					}
					e := relErr(grads[c][tn.Offset:tn.Offset+tn.Len], want)
					if !(e <= 1e-4) {
						t.Errorf("grad %s: max relative error %.3g, tolerance 1e-4", tn.Name, e)
					}
					if e > worst {
						worst, worstName = e, tn.Name
					}
				}
			}
			t.Logf("%s: logits %.2e, loss %.2e, worst gradient %.2e (%s)", family, relErr(logits, ref["logits"]),
				math.Abs(loss-ref["loss"][0])/math.Abs(ref["loss"][0]), worst, worstName)
		})
	}
}

// TestFamiliesGenerate: greedy generation with the key/value cache (a
// prompt of 6 tokens, then 14 tokens one at a time: past every window and,
// for dynamic and longrope, across the length where the frequencies
// change) equals the transcription's cached greedy tokens, as
// generate(use_cache=True) makes them.
func TestFamiliesGenerate(t *testing.T) {
	hosttest.RequireTorch(t)
	for i, family := range families {
		t.Run(family, func(t *testing.T) {
			dir := familyDir(t, family, 20+i)
			m, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			l, s := m.Layout, m.Config.Shape
			rng := rand.New(rand.NewPCG(uint64(i), 40))
			prompt := make([]int32, 6)
			for k := range prompt {
				prompt[k] = int32(rng.IntN(s.Vocab))
			}
			const steps = 14
			pj, _ := json.Marshal(map[string]any{"ids": prompt})
			tmp := t.TempDir()
			pf, out := filepath.Join(tmp, "prompt.json"), filepath.Join(tmp, "greedy.json")
			if err := os.WriteFile(pf, pj, 0o644); err != nil {
				t.Fatal(err)
			}
			script, _ := filepath.Abs("../model/testdata/hf_reference.py")
			if b, err := exec.Command(hosttest.TorchPython, script, "--fp64", "--greedy", fmt.Sprint(steps), "--cache", dir, pf, out).CombinedOutput(); err != nil {
				t.Fatalf("hf_reference.py --greedy: %v\n%s", err, b)
			}
			var ref struct{ Tokens []int32 }
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &ref); err != nil {
				t.Fatal(err)
			}

			devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: units.GiB})
			if err != nil {
				t.Fatal(err)
			}
			st := devs[0].DefaultStream()
			w, err := model.NewWeights(devs[0], l, gpu.F32)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Free()
			buf := make([]float32, 0)
			for c := range l.Chunks {
				buf = append(buf[:0], make([]float32, l.Chunks[c].Len)...)
				if err := m.ReadChunk(c, buf); err != nil {
					t.Fatal(err)
				}
				w.LoadChunk(st, c, buf)
				if err := st.Synchronize(); err != nil {
					t.Fatal(err)
				}
			}
			d, err := model.NewDecoder(devs[0], l, model.DecoderOptions{Capacity: len(prompt) + steps})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Free()
			defer st.Synchronize()
			var got []int32
			next := prompt
			for range steps {
				logits, err := d.Step(st, w, next)
				if err != nil {
					t.Fatal(err)
				}
				best := 0
				for v, x := range logits {
					if x > logits[best] {
						best = v
					}
				}
				got = append(got, int32(best))
				next = []int32{int32(best)}
			}
			if fmt.Sprint(got) != fmt.Sprint(ref.Tokens) {
				t.Errorf("greedy tokens %v, the transcription's %v", got, ref.Tokens)
			}
			if s.SeqDependentRope() {
				return // cached and recomputed logits differ by design (as in transformers) once the frequencies change
			}
			// Teacher-forced: the logits of each cached step (the window
			// read from the cache) equal those of the whole sequence in
			// one call, which TestFamiliesAgainstTorch checks against the
			// transcription; tolerance 1e-5 of the row's largest logit.
			seq := append(append([]int32(nil), prompt...), got[:steps-1]...)
			ignore := make([]int32, len(seq))
			for k := range ignore {
				ignore[k] = model.IgnoreTarget
			}
			whole := make([][]float32, len(seq))
			d.Reset()
			if _, _, err := d.Score(st, w, seq, ignore, func(row int, v []float32) { whole[row] = append([]float32(nil), v...) }); err != nil {
				t.Fatal(err)
			}
			d.Reset()
			for k, id := range seq {
				logits, err := d.Step(st, w, []int32{id})
				if err != nil {
					t.Fatal(err)
				}
				want := make([]float64, len(logits))
				for v, x := range whole[k] {
					want[v] = float64(x)
				}
				if e := relErr(logits, want); !(e <= 1e-5) {
					t.Fatalf("step %d: cached logits differ from the whole sequence's by %.3g of the largest", k, e)
				}
			}
		})
	}
}

// TestFamiliesConfigRoundTrip: each family's config.json read and written
// back with its source (ConfigJSON with the base, what an export of an
// imported model writes) gives every key back as written; written from the
// shape alone (a model defined in Strata) it reads back as the same shape.
func TestFamiliesConfigRoundTrip(t *testing.T) {
	hosttest.RequireTorch(t)
	for i, family := range families {
		t.Run(family, func(t *testing.T) {
			dir := familyDir(t, family, 30+i)
			base, err := os.ReadFile(filepath.Join(dir, ConfigName))
			if err != nil {
				t.Fatal(err)
			}
			c, err := ParseConfig(ConfigName, base)
			if err != nil {
				t.Fatal(err)
			}
			back, err := ConfigJSON(c.Shape, dtype.F32, base)
			if err != nil {
				t.Fatal(err)
			}
			var want, got map[string]any
			if err := json.Unmarshal(base, &want); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(back, &got); err != nil {
				t.Fatal(err)
			}
			for k, v := range want {
				if fmt.Sprint(got[k]) != fmt.Sprint(v) {
					t.Errorf("%s: %v written back, %v in the source", k, got[k], v)
				}
			}
			alone, err := ConfigJSON(c.Shape, dtype.F32, nil)
			if err != nil {
				t.Fatal(err)
			}
			c2, err := ParseConfig(ConfigName, alone)
			if err != nil {
				t.Fatalf("the config written from the shape does not read back: %v\n%s", err, alone)
			}
			if c2.Shape.Canonical() != c.Shape.Canonical() {
				t.Errorf("written from the shape and read back:\n%+v\nwant\n%+v\n%s", c2.Shape.Canonical(), c.Shape.Canonical(), alone)
			}
			// And the transcription reads it as the source: the same logits.
			other := t.TempDir()
			if err := os.WriteFile(filepath.Join(other, ConfigName), alone, 0o644); err != nil {
				t.Fatal(err)
			}
			weights, err := os.ReadFile(filepath.Join(dir, WeightsName))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(other, WeightsName), weights, 0o644); err != nil {
				t.Fatal(err)
			}
			bj, _ := json.Marshal(map[string]any{"ids": [][]int{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}}, "targets": [][]int{{2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}}})
			batch := filepath.Join(other, "batch.json")
			if err := os.WriteFile(batch, bj, 0o644); err != nil {
				t.Fatal(err)
			}
			a, b := referenceRun(t, dir, batch)["logits"], referenceRun(t, other, batch)["logits"]
			for k := range a {
				if a[k] != b[k] {
					t.Fatalf("the transcription reads the config written from the shape otherwise: logit %d %v, the source's %v\n%s", k, b[k], a[k], alone)
				}
			}
		})
	}
}

// TestMoEImportRefuses: a Mixtral whose expert 2 of layer 1 is narrower
// than the others (experts of unequal shapes) is refused with one error
// naming the tensors whose shapes differ from the layout's.
func TestMoEImportRefuses(t *testing.T) {
	hosttest.RequireTorch(t)
	dir := familyDir(t, "mixtral", 50)
	h, data, err := safetensors.ReadFile(filepath.Join(dir, WeightsName))
	if err != nil {
		t.Fatal(err)
	}
	var ts []fileEntry
	for _, ti := range h.Tensors {
		e := fileEntry{name: ti.Name, dtype: ti.DType, data: data[ti.Name]}
		for _, d := range ti.Shape {
			e.shape = append(e.shape, int(d))
		}
		if strings.HasPrefix(ti.Name, "model.layers.1.block_sparse_moe.experts.2.") { // F_e 48 -> 40
			if e.shape[0] == 48 {
				e.shape = []int{40, e.shape[1]}
			} else {
				e.shape = []int{e.shape[0], 40}
			}
			e.data = make([]byte, 4*e.shape[0]*e.shape[1])
		}
		ts = append(ts, e)
	}
	writeFixtureWeights(t, dir, ts, 1)
	_, err = Open(dir)
	for _, want := range []string{"model.layers.1.block_sparse_moe.experts.2.w1.weight has shape [40 32], the layout wants [48 32]",
		"model.layers.1.block_sparse_moe.experts.2.w2.weight has shape [32 40], the layout wants [32 48]"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}
