package cmd

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/safetensors"
)

// loraConfig is a LoRA fine-tune of every linear of a tiny Llama.
const loraConfig = `{
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": %s, "weight_decay": 0}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
  "strata": {"devices": 2, "seq_len": 32, "lora": {"r": 8, "alpha": 16, "target_modules": "all-linear"}}
}`

// TestLoRATrainExportEval is LoRA from a user's side on a tiny Llama in a
// Hugging Face directory: train --init with strata.lora lowers the loss
// on held-out text; export --format peft writes PEFT's files and names;
// export --format hf --merge writes W + scaling·B·A (within 1e-6 of a
// float64 computation from the base file's W and the exported adapter),
// every other tensor the base file's bytes, which evaluates within 1e-3
// of the run (which held W in bf16); train --init BASE
// --adapter PEFT_DIR continues from the adapter (a step at learning rate
// 0 evaluates as the first run); a bad adapter is refused by name.
func TestLoRATrainExportEval(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	s := model.Shape{Arch: model.ArchLlama, Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, FFN: 48, Vocab: 256, MaxSeq: 64, RopeTheta: 10000}
	writeHFEvalModel(t, base, s, 7, dtype.F32, testTokenizer{})
	train, heldOut := filepath.Join(dir, "train.txt"), filepath.Join(dir, "held.txt")
	if err := os.WriteFile(train, []byte(strings.Repeat("The cat sat on the mat. The dog ate the bread. A bird sang on the tree. ", 30)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(heldOut, []byte(strings.Repeat("The dog sat on the tree. A cat ate the bread. The bird sang on the mat. ", 4)), 0o644); err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(dir, "run")
	if out, errOut, err := runApp(t, "train", "--init", base, "--config", writeFile(t, "lora.json", strings.Replace(loraConfig, "%s", "0.01", 1)),
		"--data", train, "--steps", "30", "--out", run, "--save-every", "30", "--no-progress"); err != nil {
		t.Fatalf("train --init with strata.lora: %v\n%s\n%s", err, out, errOut)
	} else if !strings.Contains(errOut, "strata.lora (r 8, alpha 16, all-linear): the base frozen") {
		t.Errorf("train does not say what LoRA froze:\n%s", errOut)
	}
	before, _ := evalJSON(t, "--model", base, "--data", heldOut, "--seq", "64")
	after, _ := evalJSON(t, "--model", run, "--data", heldOut, "--seq", "64")
	if !(after.Loss < before.Loss-0.3) {
		t.Errorf("held-out loss %.4f after 30 LoRA steps, %.4f before: want it lower by more than 0.3", after.Loss, before.Loss)
	}
	t.Logf("held-out loss: base %.4f, after 30 LoRA steps %.4f", before.Loss, after.Loss)

	peft := filepath.Join(dir, "peft")
	if out, errOut, err := runApp(t, "export", "--format", "peft", run, peft); err != nil {
		t.Fatalf("export --format peft: %v\n%s\n%s", err, out, errOut)
	}
	var acfg map[string]any
	js, err := os.ReadFile(filepath.Join(peft, hf.PEFTConfigFile))
	if err != nil || json.Unmarshal(js, &acfg) != nil {
		t.Fatalf("adapter_config.json: %v\n%s", err, js)
	}
	abs, _ := filepath.Abs(base)
	if acfg["peft_type"] != "LORA" || acfg["r"] != 8.0 || acfg["lora_alpha"] != 16.0 || acfg["target_modules"] != "all-linear" ||
		acfg["task_type"] != "CAUSAL_LM" || acfg["base_model_name_or_path"] != abs || acfg["use_rslora"] != false || acfg["bias"] != "none" {
		t.Errorf("adapter_config.json:\n%s", js)
	}
	af, err := safetensors.Open(filepath.Join(peft, hf.PEFTWeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer af.Close()
	if len(af.Header.Tensors) != 2*7*s.Layers {
		t.Errorf("%d adapter tensors, want A and B of 7 modules in %d blocks", len(af.Header.Tensors), s.Layers)
	}
	qa, okA := af.Header.Tensor("base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight")
	qb, okB := af.Header.Tensor("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight")
	if !okA || !okB || !qa.HasShape([]int{8, 32}) || !qb.HasShape([]int{16, 8}) {
		t.Fatalf("k_proj's adapter: %+v %+v", qa, qb)
	}

	// The merged model: W + (alpha/r)·B·A, and the run's own loss.
	merged := filepath.Join(dir, "merged")
	if _, errOut, err := runApp(t, "export", "--format", "hf", run, merged); err == nil || !strings.Contains(errOut+err.Error(), "--format hf --merge writes the merged model, --format peft the adapters") {
		t.Errorf("export --format hf of a LoRA run without --merge: %v", err)
	}
	if out, errOut, err := runApp(t, "export", "--format", "hf", "--merge", run, merged); err != nil {
		t.Fatalf("export --merge: %v\n%s\n%s", err, out, errOut)
	}
	w := readTensor(t, filepath.Join(base, "model.safetensors"), "model.layers.1.self_attn.k_proj.weight")
	got := readTensor(t, filepath.Join(merged, "model.safetensors"), "model.layers.1.self_attn.k_proj.weight")
	a := readTensorFrom(t, af, qa)
	b := readTensorFrom(t, af, qb)
	// W is the base directory's, as PEFT merges an adapter into its base
	// (not the run's frozen copy of it, rounded to bf16), and the merged
	// weight keeps its dtype there (fp32).
	var worst, biggest float64
	want := make([]float64, len(got))
	for i := range 16 {
		for j := range 32 {
			var d float64
			for k := range 8 {
				d += float64(b[i*8+k]) * float64(a[k*32+j])
			}
			want[i*32+j] = float64(w[i*32+j]) + 2*d
			biggest = max(biggest, math.Abs(want[i*32+j]))
		}
	}
	for i := range want {
		worst = max(worst, math.Abs(float64(got[i])-want[i])/biggest)
	}
	if !(worst <= 1e-6) {
		t.Errorf("merged k_proj: max error %.3g of its largest weight against W + 2·B·A, want <= 1e-6", worst)
	}
	// Every tensor the adapters leave alone is the base file's, byte for
	// byte (not rounded to the run's bf16).
	baseT, mergedT := readHFTensors(t, base), readHFTensors(t, merged)
	for name, bt := range baseT {
		mt, ok := mergedT[name]
		switch {
		case !ok:
			t.Errorf("the merged export has no %s", name)
		case mt.dtype != bt.dtype:
			t.Errorf("%s: %s in the merged export, %s in the base", name, mt.dtype, bt.dtype)
		case !strings.HasSuffix(name, "_proj.weight") && string(mt.data) != string(bt.data):
			t.Errorf("%s: not the base's bytes", name)
		}
	}
	// The run held its base in bf16: the merged model of the base's own
	// weights evaluates close to the run, not bit for bit.
	m, _ := evalJSON(t, "--model", merged, "--data", heldOut, "--seq", "64")
	if e := math.Abs(m.Loss-after.Loss) / after.Loss; !(e <= 1e-3) {
		t.Errorf("the merged export evaluates to %.17g, the run to %.17g: relative %.3g, want <= 1e-3", m.Loss, after.Loss, e)
	}
	// Streamed (bf16) and resident in bf16, and generation: the merged model too.
	streamed, _ := evalJSON(t, "--model", run, "--data", heldOut, "--seq", "64", "--offload", "cpu")
	if r, _ := evalJSON(t, "--model", merged, "--data", heldOut, "--seq", "64", "--dtype", "bf16"); math.Abs(streamed.Loss-r.Loss)/r.Loss > 1e-3 {
		t.Errorf("the run streamed evaluates to %.17g, its merged export in bf16 to %.17g", streamed.Loss, r.Loss)
	}
	g1, _, err := runApp(t, "generate", "--model", run, "--prompt", "The cat", "--max-new-tokens", "12")
	if err != nil {
		t.Fatalf("generate from the LoRA run: %v", err)
	}
	if g2, _, err := runApp(t, "generate", "--model", merged, "--prompt", "The cat", "--max-new-tokens", "12"); err != nil || g1 != g2 {
		t.Errorf("generate: the run says %q, its merged export %q (%v)", g1, g2, err)
	}

	// Continue from the PEFT adapter: one step at learning rate 0 leaves
	// the adapters and the base as imported.
	again := filepath.Join(dir, "again")
	if out, errOut, err := runApp(t, "train", "--init", base, "--adapter", peft, "--config", writeFile(t, "lora0.json", strings.Replace(strings.Replace(loraConfig, "%s", "0", 1), `, "lora": {"r": 8, "alpha": 16, "target_modules": "all-linear"}`, "", 1)),
		"--data", train, "--steps", "1", "--out", again, "--save-every", "1", "--no-progress"); err != nil {
		t.Fatalf("train --adapter: %v\n%s\n%s", err, out, errOut)
	}
	if r, _ := evalJSON(t, "--model", again, "--data", heldOut, "--seq", "64"); r.Loss != after.Loss {
		t.Errorf("the run continued from the exported adapter evaluates to %.17g, the first run to %.17g", r.Loss, after.Loss)
	}

	// A DoRA adapter, and one whose base shape differs, are refused by name.
	bad := filepath.Join(dir, "dora")
	if err := os.MkdirAll(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(bad, hf.PEFTConfigFile), []byte(strings.Replace(string(js), `"use_dora": false`, `"use_dora": true`, 1)), 0o644)
	if _, errOut, err := runApp(t, "train", "--init", base, "--adapter", bad, "--steps", "1", "--no-progress"); err == nil || !strings.Contains(errOut+err.Error(), "use_dora true: DoRA is not built") {
		t.Errorf("a DoRA adapter: %v\n%s", err, errOut)
	}
	other := filepath.Join(dir, "other")
	s2 := s
	s2.Dim, s2.Heads, s2.KVHeads = 64, 8, 4
	writeHFEvalModel(t, other, s2, 8, dtype.F32, testTokenizer{})
	if _, errOut, err := runApp(t, "train", "--init", other, "--adapter", peft, "--steps", "1", "--no-progress"); err == nil || !strings.Contains(errOut+err.Error(), "an adapter of another base shape") {
		t.Errorf("an adapter of another base: %v\n%s", err, errOut)
	}
}

// readTensor reads one F32 tensor of a safetensors file.
func readTensor(t *testing.T, path, name string) []float32 {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ti, ok := f.Header.Tensor(name)
	if !ok {
		t.Fatalf("%s has no %s", path, name)
	}
	return readTensorFrom(t, f, ti)
}

func readTensorFrom(t *testing.T, f *safetensors.File, ti safetensors.TensorInfo) []float32 {
	t.Helper()
	if ti.DType != "F32" {
		t.Fatalf("%s is %s", ti.Name, ti.DType)
	}
	raw := make([]byte, ti.SizeBytes())
	if err := f.ReadTensor(ti, raw); err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), dtype.Float32s(raw)...)
}

// TestEstimateLoRA: estimate --lora counts the base frozen (params only)
// and the adapters apart: Ψ = base + adapters, the host holds the
// adapters' 14 B per parameter (master, m, v, gradient) and nothing of the
// base; a target that matches nothing is one error naming the linears.
func TestEstimateLoRA(t *testing.T) {
	out, errOut, err := runApp(t, "estimate", "--model", "tiny-llama", "--lora", "r=8,alpha=16,targets=q_proj+v_proj", "--devices", "2", "--stage", "3", "--offload-optimizer", "cpu", "--json")
	if err != nil {
		t.Fatalf("estimate --lora: %v\n%s", err, errOut)
	}
	var r struct {
		Params int64 `json:"params"`
		Frozen int64 `json:"frozen_params"`
		Stages []struct {
			HostBytes int64 `json:"host_bytes"`
		} `json:"stages"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	s, _ := model.Lookup("tiny-llama")
	base := s.ParamCount()
	adapters := int64(s.Layers * 8 * (s.Dim + s.Dim + s.Dim + s.KVHeadCount()*s.HeadDim())) // q: r·(C+C), v: r·(C+KV·D)
	if r.Params != base+adapters || r.Frozen != base || len(r.Stages) != 1 || r.Stages[0].HostBytes != 14*adapters {
		t.Errorf("params %d (want %d + %d adapters), frozen %d, stages %+v (host want %d)", r.Params, base, adapters, r.Frozen, r.Stages, 14*adapters)
	}
	if _, errOut, err := runApp(t, "estimate", "--model", "tiny-llama", "--lora", "r=8,targets=qproj"); err == nil || !strings.Contains(errOut+err.Error(), `"qproj" matches no linear of a llama block (its linears: q_proj, k_proj`) {
		t.Errorf("a target that matches nothing: %v\n%s", err, errOut)
	}
	// The base in NF4 on NVMe: each frozen rank shard at dtype.NF4's size,
	// the adapters' in bf16.
	out, errOut, err = runApp(t, "estimate", "--model", "tiny-llama", "--lora", "r=8,alpha=16,targets=q_proj+v_proj", "--base-dtype", "nf4",
		"--devices", "2", "--stage", "3", "--offload-param", "nvme", "--offload-optimizer", "cpu", "--json")
	if err != nil {
		t.Fatalf("estimate --base-dtype nf4: %v\n%s", err, errOut)
	}
	var q struct {
		Stages []struct {
			NVMe int64 `json:"nvme_bytes"`
		} `json:"stages"`
	}
	if err := json.Unmarshal([]byte(out), &q); err != nil {
		t.Fatal(err)
	}
	bl, _ := model.NewLayout(s)
	l, _ := bl.WithLoRA(model.LoRA{R: 8, Alpha: 16, Targets: []string{"q_proj", "v_proj"}})
	var want int64
	for c, ch := range l.Chunks {
		sh := int(estimate.ShardElems(int64(ch.Len), 2, estimate.DefaultShardAlignElems))
		if l.IsAdapter(c) {
			want += 2 * 2 * int64(sh)
		} else {
			want += 2 * dtype.NF4.Bytes(sh)
		}
	}
	if len(q.Stages) != 1 || q.Stages[0].NVMe != want {
		t.Errorf("the NF4 base's NVMe bytes %+v, want %d", q.Stages, want)
	}
}

// TestEvalStreamed: eval --offload streams a model four times the device's
// memory from NVMe (and from host RAM) through the device, in bf16, to
// the resident evaluation's loss of the same bf16 weights bit for bit (the
// CPU backend: one window's forward is the same arithmetic in the decoder
// and the training model), over the same tokens; the resident path
// refuses the model, naming --offload.
func TestEvalStreamed(t *testing.T) {
	nvmetest.Require(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	s := model.Shape{Arch: model.ArchLlama, Layers: 64, Dim: 32, Heads: 4, KVHeads: 2, FFN: 64, Vocab: 256, MaxSeq: 64, RopeTheta: 10000}
	writeHFEvalModel(t, base, s, 9, dtype.F32, testTokenizer{})
	text := filepath.Join(dir, "text.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat("The cat sat on the mat. The dog ate the bread. ", 12)), 0o644); err != nil {
		t.Fatal(err)
	}
	l, _ := model.NewLayout(s)
	weights := model.WeightsBytes(l, gpu.BF16)
	hbm := fmt.Sprint(weights / 4)
	resident, _ := evalJSON(t, "--model", base, "--data", text, "--seq", "32", "--dtype", "bf16")
	nvme, errOut := evalJSON(t, "--model", base, "--data", text, "--seq", "32", "--batch", "1", "--offload", "nvme", "--nvme-path", nvmetest.Dir(t), "--hbm", hbm)
	host, _ := evalJSON(t, "--model", base, "--data", text, "--seq", "32", "--batch", "1", "--offload", "cpu", "--hbm", hbm)
	if nvme.Loss != host.Loss || nvme.Tokens != resident.Tokens || host.Tokens != resident.Tokens {
		t.Errorf("streamed from NVMe %.17g (%d tokens), from host RAM %.17g (%d); resident %d tokens", nvme.Loss, nvme.Tokens, host.Loss, host.Tokens, resident.Tokens)
	}
	if nvme.Loss != resident.Loss {
		t.Errorf("streamed loss %.17g, resident %.17g", nvme.Loss, resident.Loss)
	}
	if !strings.Contains(errOut, "streamed from NVMe") {
		t.Errorf("eval --offload nvme does not say where the weights stream from:\n%s", errOut)
	}
	if _, errOut, err := runApp(t, "eval", "--model", base, "--data", text, "--seq", "32", "--dtype", "bf16", "--hbm", hbm); err == nil || !strings.Contains(errOut+err.Error(), "--offload nvme --nvme-path DIR") {
		t.Errorf("a model larger than the device, resident: %v\n%s", err, errOut)
	}
	t.Logf("weights %d B, --hbm %s: loss %.17g streamed, %.17g resident", weights, hbm, nvme.Loss, resident.Loss)
}
