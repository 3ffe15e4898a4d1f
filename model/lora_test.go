package model

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/hosttest"
)

// TestLoRAAgainstTorch: the forward and the adapters' gradients of tiny
// GPT-2, Llama and Qwen2 models with LoRA (random, non-zero A and B, so
// every term counts) against hf_reference.py, which reads the adapters as
// a PEFT adapter directory and computes in fp64. The base runs twice here:
// frozen (no weight gradient computed; the adapters' must not change,
// bit for bit) and trainable (the base's gradients with the adapters in
// place, against the reference's too).
//
// Tolerances, relative to the largest magnitude of the reference tensor:
// 2e-6 for the logits and the loss (fp32 against fp64: sums of at most 64
// terms a few layers deep, about 1e-7 relative each) and 1e-5 for every
// gradient (the bound; a gradient crosses every layer back).
func TestLoRAAgainstTorch(t *testing.T) {
	hosttest.RequireTorch(t)
	script, err := filepath.Abs("testdata/hf_reference.py")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		s Shape
		o LoRA
	}{
		{Shape{Name: "gpt2-test", Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 16},
			LoRA{R: 4, Alpha: 8, Targets: []string{"c_attn", "c_proj", "c_fc"}}},
		{Shape{Name: "llama-test", Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 16, Arch: ArchLlama, KVHeads: 2, FFN: 48, RopeTheta: 10000},
			LoRA{R: 4, Alpha: 16, RSLoRA: true, Targets: []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}}},
		{Shape{Name: "qwen2-test", Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 16, Arch: ArchQwen2, KVHeads: 1, FFN: 48, RopeTheta: 1e6, NormEps: 1e-6, TieEmbeddings: true},
			LoRA{R: 2, Alpha: 4, Targets: []string{"v_proj", "q_proj", "up_proj"}}},
		// Dropout 0.25 on the adapters' inputs: the reference multiplies
		// each input by the mask gpu.DropoutKeep gives the module.
		{Shape{Name: "llama-test", Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 16, Arch: ArchLlama, KVHeads: 2, FFN: 48, RopeTheta: 10000},
			LoRA{R: 4, Alpha: 8, Dropout: 0.25, Targets: []string{"all-linear"}}},
		{Shape{Name: "gpt2-test", Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 16},
			LoRA{R: 4, Alpha: 8, Dropout: 0.25, Targets: []string{"c_attn", "c_proj", "c_fc"}}},
		// Mixtures of experts: every linear (PEFT's all-linear: the router
		// and each expert's w1, w3, w2 too), and the experts' names only
		// with a dense layer between sparse ones.
		{Shape{Name: "mixtral-test", Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 16, Arch: ArchMixtral, KVHeads: 2, FFN: 24, RopeTheta: 1e6,
			Experts: 4, TopK: 2, RouterAux: true, RouterAuxCoef: 0.05},
			LoRA{R: 4, Alpha: 8, Targets: []string{"all-linear"}}},
		{Shape{Name: "qwen3moe-test", Layers: 3, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 16, Arch: ArchQwen3MoE, KVHeads: 2, FFN: 40, RopeTheta: 1e6,
			HeadDimension: 8, Experts: 5, TopK: 2, ExpertFFN: 12, MLPLayers: "ede", RouterAux: true, RouterAuxCoef: 0.05},
			LoRA{R: 2, Alpha: 4, Targets: []string{"q_proj", "gate_proj", "up_proj", "down_proj"}}},
	}
	for i, tc := range cases {
		name := tc.s.ArchName()
		if tc.o.Dropout > 0 {
			name += "/dropout"
		}
		t.Run(name, func(t *testing.T) {
			base, err := NewLayout(tc.s)
			if err != nil {
				t.Fatal(err)
			}
			l, err := base.WithLoRA(tc.o)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(i), 78))
			params := perturbedParams(l, uint64(20+i))
			b := torchBatch(rng, tc.s.Vocab)
			if tc.o.Dropout > 0 {
				b.Dropout = &DropoutKey{Seed: 77, FirstRow: 5}
			}
			dir := t.TempDir()
			writeLoRAReference(t, dir, l, params, b)
			outPath := filepath.Join(dir, "torch.safetensors")
			if out, err := exec.Command(hosttest.TorchPython, script, dir, filepath.Join(dir, "batch.json"), outPath).CombinedOutput(); err != nil {
				t.Fatalf("hf_reference.py: %v\n%s", err, out)
			}
			ref, err := readSafetensors(outPath)
			if err != nil {
				t.Fatal(err)
			}
			check := func(what string, got, want []float32, tol float64) {
				t.Helper()
				if len(got) != len(want) {
					t.Fatalf("%s: %d values, reference %d", what, len(got), len(want))
				}
				if e := maxRelErr(got, want); !(e <= tol) {
					t.Errorf("%s: max relative error %.3g, tolerance %g", what, e, tol)
				}
			}
			frozen := func(c int) bool { return !l.IsAdapter(c) }
			logits, loss, grads := runLoRA(t, l, params, b, frozen)
			check("logits", logits, ref["logits"].data, 2e-6)
			if e := math.Abs(loss-float64(ref["loss"].data[0])) / math.Abs(float64(ref["loss"].data[0])); !(e <= 2e-6) {
				t.Errorf("loss %.9g, reference %.9g: relative error %.3g", loss, ref["loss"].data[0], e)
			}
			_, _, all := runLoRA(t, l, params, b, func(int) bool { return false })
			hf := toHF(l, grads)
			hfAll := toHF(l, all)
			var worst float64
			for c, ch := range l.Chunks {
				for _, tn := range ch.Tensors {
					name, _ := hfName(l.Shape, tn.Name)
					if l.IsAdapter(c) {
						name = "base_model.model." + name
					}
					want, ok := ref["grad."+name]
					if !ok {
						t.Fatalf("no reference gradient of %s", name)
					}
					key, _ := hfName(l.Shape, tn.Name)
					if !l.IsAdapter(c) {
						// Frozen: no GEMM's weight gradient and no bias
						// gradient is computed (the norms' gains still
						// accumulate into the frozen chunk's Grad, a
						// reduction over the rows).
						norm := strings.Contains(tn.Name, "ln_") || strings.Contains(tn.Name, "norm")
						if !norm && slices.ContainsFunc(hf[key].data, func(x float32) bool { return x != 0 }) {
							t.Errorf("frozen %s: a gradient was written", tn.Name)
						}
						check("grad "+tn.Name+" (base trainable)", hfAll[key].data, want.data, 1e-5)
						continue
					}
					if !slices.Equal(hf[key].data, hfAll[key].data) {
						t.Errorf("grad %s: freezing the base changed the adapter's gradient", tn.Name)
					}
					check("grad "+tn.Name, hf[key].data, want.data, 1e-5)
					worst = max(worst, maxRelErr(hf[key].data, want.data))
				}
			}
			t.Logf("%s: logits %.2e, adapter gradients %.2e (max relative error against fp64)", tc.s.ArchName(), maxRelErr(logits, ref["logits"].data), worst)
		})
	}
}

// writeLoRAReference writes l's base as a Hugging Face model directory and
// its adapters as a PEFT adapter beside it, with the batch, for
// hf_reference.py.
func writeLoRAReference(t *testing.T, dir string, l *Layout, params [][]float32, b Batch) {
	t.Helper()
	baseT, adapters := map[string]stTensor{}, map[string]stTensor{}
	for name, v := range toHF(l, params) {
		if strings.Contains(name, ".lora_") {
			adapters["base_model.model."+name] = v
		} else {
			baseT[name] = v
		}
	}
	o := l.LoRA
	files := map[string]any{
		"config.json": hfConfig(l.Shape),
		"batch.json":  map[string]any{"ids": rows2D(b.IDs, b.Rows, b.Seq), "targets": rows2D(b.Targets, b.Rows, b.Seq), "pos": rows2D(b.Pos, b.Rows, b.Seq)},
		"adapter_config.json": map[string]any{"peft_type": "LORA", "r": o.R, "lora_alpha": o.Alpha, "use_rslora": o.RSLoRA,
			"target_modules": o.Targets, "lora_dropout": 0.0, "bias": "none"},
	}
	for name, v := range files {
		js, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), js, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeSafetensors(filepath.Join(dir, "model.safetensors"), baseT); err != nil {
		t.Fatal(err)
	}
	if err := writeSafetensors(filepath.Join(dir, "adapter_model.safetensors"), adapters); err != nil {
		t.Fatal(err)
	}
	if b.Dropout == nil {
		return
	}
	// Each adapted module's mask, as the model draws it (gpu.DropoutKeep of
	// the module's stream, element indices from the batch's global first row).
	thr, scale := gpu.DropoutThreshold(o.Dropout)
	mods, err := o.modules(l.Shape, 0)
	if err != nil {
		t.Fatal(err)
	}
	masks := map[string]stTensor{}
	for layer := range l.Shape.Layers {
		for _, md := range mods {
			n := b.Rows * b.Seq * md.in
			v := make([]float32, n)
			seed, off := dropoutSeed(b.Dropout.Seed, layer, md.index), b.Dropout.FirstRow*int64(b.Seq*md.in)
			for i := range v {
				if gpu.DropoutKeep(seed, off+int64(i), thr) {
					v[i] = scale
				}
			}
			name, _ := hfName(l.Shape, blockPrefix(l.Shape, layer)+md.path)
			masks["base_model.model."+name+".dropout"] = stTensor{[]int{b.Rows, b.Seq, md.in}, v}
		}
	}
	if err := writeSafetensors(filepath.Join(dir, "dropout_masks.safetensors"), masks); err != nil {
		t.Fatal(err)
	}
}

// runLoRA runs one Forward and Backward (scale 1) of the fp32 model of
// layout l (with its LoRA adapters, if any), the chunks frozen says
// frozen, and returns the logits, the loss and the gradients.
func runLoRA(t *testing.T, l *Layout, params [][]float32, b Batch, frozen func(int) bool) ([]float32, float64, [][]float32) {
	t.Helper()
	dev := newDevice(t)
	s := dev.DefaultStream()
	res, err := NewResident(dev, l, gpu.F32)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Free()
	for c := range l.Chunks {
		if frozen(c) {
			res.Freeze(c)
		}
	}
	res.Load(s, params)
	res.ZeroGrads(s)
	m, err := NewWith(dev, l, b.Rows, b.Seq, ActivationOptions{LoRA: l.LoRA})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	if err := m.Forward(s, res, b); err != nil {
		t.Fatal(err)
	}
	logits, err := download(dev, s, []gpu.Buffer{m.a.logits})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Backward(s, res, 1); err != nil {
		t.Fatal(err)
	}
	loss, err := m.Loss(s)
	if err != nil {
		t.Fatal(err)
	}
	loss = l.Shape.Objective(loss, m.RouterLoss()) // transformers' loss: a mixture of experts' router loss in it
	grads, err := res.ReadGrads(s)
	if err != nil {
		t.Fatal(err)
	}
	return logits[0], loss, grads
}
