package cmd

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/internal/hosttest"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
)

// familyShapes are tiny byte-level members of each family with their
// features switched on and sized to matter at 32 tokens: a window of 5,
// head_dim unequal to hidden / heads, Llama 3.1's rope with its bands
// inside the head's frequencies, LongRoPE past its original 16 tokens,
// Gemma's soft caps and scale, Gemma 3's local rope base.
var familyShapes = map[string]model.Shape{ // vocabulary: 256 bytes and "</s>"
	"llama31": {Arch: model.ArchLlama, Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, FFN: 48, Vocab: 257, MaxSeq: 512, RopeTheta: 10000, HeadDimension: 16,
		Rope: model.RopeScaling{Type: model.RopeLlama3, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMax: 16}},
	"mistral": {Arch: model.ArchLlama, Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, FFN: 48, Vocab: 257, MaxSeq: 128, RopeTheta: 10000, SlidingWindow: 5},
	"qwen3": {Arch: model.ArchQwen3, Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, FFN: 48, Vocab: 257, MaxSeq: 128, RopeTheta: 10000, HeadDimension: 16,
		SlidingWindow: 5, LayerTypes: "fs", NormEps: 1e-6},
	"gemma2": {Arch: model.ArchGemma2, Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, FFN: 48, Vocab: 257, MaxSeq: 128, RopeTheta: 10000, HeadDimension: 16,
		TieEmbeddings: true, SlidingWindow: 5, LayerTypes: "sf", QueryScale: 24, AttnSoftCap: 20, FinalSoftCap: 30, NormEps: 1e-6},
	"gemma3": {Arch: model.ArchGemma3, Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, FFN: 48, Vocab: 257, MaxSeq: 128, RopeTheta: 1e6, HeadDimension: 16,
		TieEmbeddings: true, SlidingWindow: 5, LayerTypes: "sf", RopeLocalTheta: 10000, QueryScale: 24, NormEps: 1e-6,
		Rope: model.RopeScaling{Type: model.RopeLinear, Factor: 4}},
	"phi3": {Arch: model.ArchPhi3, Layers: 2, Dim: 48, Heads: 4, KVHeads: 4, FFN: 64, Vocab: 257, MaxSeq: 128, RopeTheta: 10000, SlidingWindow: 5,
		Rope: model.RopeScaling{Type: model.RopeLongRoPE, OriginalMax: 16, ShortFactor: "1,1.1,1.3,1.6,2,2.5", LongFactor: "1,1.5,2.5,4,6,8"}},
	// Mixtures of experts: LoRA on the routers and every expert too.
	"mixtral": {Arch: model.ArchMixtral, Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, FFN: 32, Vocab: 257, MaxSeq: 128, RopeTheta: 1e6, SlidingWindow: 5,
		Experts: 4, TopK: 2, RouterAux: true, RouterAuxCoef: 0.02},
	"qwen3_moe": {Arch: model.ArchQwen3MoE, Layers: 3, Dim: 32, Heads: 4, KVHeads: 2, FFN: 48, Vocab: 257, MaxSeq: 128, RopeTheta: 10000, HeadDimension: 16,
		NormEps: 1e-6, Experts: 6, TopK: 2, ExpertFFN: 16, MLPLayers: "ede", NormTopK: true},
}

// familyTemplates are the real chat templates of data/testdata/templates
// each family ships.
var familyTemplates = map[string]string{"llama31": "llama31.jinja", "mistral": "mistral.jinja", "qwen3": "qwen3.jinja",
	"gemma2": "gemma2.jinja", "gemma3": "gemma3.jinja", "phi3": "phi3.jinja", "mixtral": "mixtral-8x7b.jinja", "qwen3_moe": "qwen3.jinja"}

// TestFamiliesLoRA is the LoRA walkthrough for each family: train --init
// of its Hugging Face directory with every linear adapted (Phi-3's fused
// qkv_proj and gate_up_proj one adapter each, as PEFT puts it) lowers the
// held-out loss; the PEFT export, merged into the base by the float64
// transcription (hf_reference.py --merge), evaluates as the run does
// (within 1e-5: the run adds x·Aᵀ·Bᵀ in fp32 beside the frozen W, the
// merged file holds W + s·B·A rounded once to fp32); Strata's own merged
// export too; and import then export gives the base's tensors and
// config.json keys back.
func TestFamiliesLoRA(t *testing.T) {
	hosttest.RequireTorch(t)
	script, err := filepath.Abs("../model/testdata/hf_reference.py")
	if err != nil {
		t.Fatal(err)
	}
	train := writeFile(t, "train.txt", strings.Repeat("The cat sat on the mat. The dog ate the bread. A bird sang on the tree. ", 30))
	held := writeFile(t, "held.txt", strings.Repeat("The dog sat on the tree. A cat ate the bread. The bird sang on the mat. ", 4))
	cfg := writeFile(t, "lora.json", strings.Replace(loraConfig, "%s", "0.01", 1))
	for _, family := range []string{"llama31", "mistral", "qwen3", "gemma2", "gemma3", "phi3", "mixtral", "qwen3_moe"} {
		t.Run(family, func(t *testing.T) {
			s := familyShapes[family]
			s.Name = family
			dir := t.TempDir()
			base := filepath.Join(dir, "base")
			// bf16, as the run holds its frozen base; the special token is
			// BOS and EOS, which the chat templates name.
			writeHFEvalModel(t, base, s, 7, dtype.BF16, testTokenizer{special: []string{"</s>"}})
			tmpl, _ := filepath.Abs(filepath.Join("../data/testdata/templates", familyTemplates[family]))
			copyFile(t, tmpl, filepath.Join(base, "chat_template.jinja")) // the family's real template, as transformers saves it
			run := filepath.Join(dir, "run")
			if out, errOut, err := runApp(t, "train", "--init", base, "--config", cfg, "--data", train, "--steps", "30", "--out", run, "--no-progress"); err != nil {
				t.Fatalf("train --init: %v\n%s\n%s", err, out, errOut)
			}
			before, _ := evalJSON(t, "--model", base, "--data", held, "--seq", "32")
			after, _ := evalJSON(t, "--model", run, "--data", held, "--seq", "32")
			if !(after.Loss < before.Loss-0.3) {
				t.Errorf("held-out loss %.4f after 30 LoRA steps, %.4f before: want it lower by more than 0.3", after.Loss, before.Loss)
			}

			peft := filepath.Join(dir, "peft")
			if out, errOut, err := runApp(t, "export", "--format", "peft", run, peft); err != nil {
				t.Fatalf("export --format peft: %v\n%s\n%s", err, out, errOut)
			}
			// The transcription merges base + adapter as PEFT does.
			withAdapter := filepath.Join(dir, "with-adapter")
			if err := os.MkdirAll(withAdapter, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{filepath.Join(base, "config.json"), filepath.Join(base, "model.safetensors"),
				filepath.Join(peft, hf.PEFTConfigFile), filepath.Join(peft, hf.PEFTWeightsFile)} {
				copyFile(t, f, filepath.Join(withAdapter, filepath.Base(f)))
			}
			torchMerged := filepath.Join(dir, "torch-merged")
			if out, err := exec.Command(hosttest.TorchPython, script, "--merge", torchMerged, withAdapter).CombinedOutput(); err != nil {
				t.Fatalf("hf_reference.py --merge: %v\n%s", err, out)
			}
			copyFile(t, filepath.Join(base, "tokenizer.json"), filepath.Join(torchMerged, "tokenizer.json"))
			m, _ := evalJSON(t, "--model", torchMerged, "--data", held, "--seq", "32")
			if e := math.Abs(m.Loss-after.Loss) / after.Loss; !(e <= 1e-5) {
				t.Errorf("the transcription's merge of the PEFT export evaluates to %.9g, the run to %.9g: relative %.3g, tolerance 1e-5", m.Loss, after.Loss, e)
			}
			merged := filepath.Join(dir, "merged")
			if out, errOut, err := runApp(t, "export", "--format", "hf", "--merge", run, merged); err != nil {
				t.Fatalf("export --merge: %v\n%s\n%s", err, out, errOut)
			}
			// The merged weights keep the base's dtype (bf16), as PEFT's merge
			// into a bf16 model: rounded once, they evaluate close to the run.
			if mm, _ := evalJSON(t, "--model", merged, "--data", held, "--seq", "32"); math.Abs(mm.Loss-after.Loss)/after.Loss > 1e-3 {
				t.Errorf("Strata's merged export evaluates to %.9g, the run to %.9g", mm.Loss, after.Loss)
			}

			// Import then export: every tensor and config.json key back.
			back := filepath.Join(dir, "back")
			if out, errOut, err := runApp(t, "train", "--init", base, "--steps", "1", "--out", filepath.Join(dir, "plain"), "--config",
				writeFile(t, "lr0.json", strings.Replace(strings.Replace(loraConfig, "%s", "0", 1),
					`, "lora": {"r": 8, "alpha": 16, "target_modules": "all-linear"}`, "", 1)), "--data", train, "--no-progress"); err != nil {
				t.Fatalf("train at lr 0: %v\n%s\n%s", err, out, errOut)
			}
			if out, errOut, err := runApp(t, "export", "--format", "hf", "--dtype", "bf16", filepath.Join(dir, "plain"), back); err != nil {
				t.Fatalf("export: %v\n%s\n%s", err, out, errOut)
			}
			want, got := readHFTensors(t, base), readHFTensors(t, back)
			if len(want) != len(got) {
				t.Errorf("%d tensors back, %d in the base", len(got), len(want))
			}
			for name, w := range want {
				g, ok := got[name]
				if !ok || g.dtype != w.dtype || string(g.data) != string(w.data) {
					t.Errorf("%s: not given back byte for byte (%v)", name, ok)
				}
			}
			wc, gc := readJSONMap(t, filepath.Join(base, "config.json")), readJSONMap(t, filepath.Join(back, "config.json"))
			for k, v := range wc {
				if string(gc[k]) != string(v) {
					t.Errorf("config.json %q: %s back, %s in the base", k, gc[k], v)
				}
			}
			// The run resumes (its config.json records the family's shape).
			if out, errOut, err := runApp(t, "train", "--resume", run, "--out", filepath.Join(dir, "resumed"), "--steps", "31", "--no-progress"); err != nil {
				t.Fatalf("train --resume: %v\n%s\n%s", err, out, errOut)
			}

			// Continue from the PEFT adapter (--adapter): a step at learning
			// rate 0 evaluates as the run.
			again := filepath.Join(dir, "again")
			cfg0 := writeFile(t, "lora0.json", strings.Replace(strings.Replace(loraConfig, "%s", "0", 1), `, "lora": {"r": 8, "alpha": 16, "target_modules": "all-linear"}`, "", 1))
			if out, errOut, err := runApp(t, "train", "--init", base, "--adapter", peft, "--config", cfg0, "--data", train, "--steps", "1", "--out", again, "--no-progress"); err != nil {
				t.Fatalf("train --adapter: %v\n%s\n%s", err, out, errOut)
			}
			if r, _ := evalJSON(t, "--model", again, "--data", held, "--seq", "32"); r.Loss != after.Loss {
				t.Errorf("continued from the exported adapter: %.17g, the run %.17g", r.Loss, after.Loss)
			}

			// Downstream: the estimate of the directory, the run streamed
			// from host RAM, generation, and a QLoRA run over an nf4 base
			// (the base's codes in host RAM) that learns too.
			if out, errOut, err := runApp(t, "estimate", "--model", base, "--devices", "1", "--stage", "3", "--offload-param", "cpu", "--lora", "r=8,base=nf4"); err != nil || !strings.Contains(out, s.Arch) {
				t.Errorf("estimate --model: %v\n%s\n%s", err, out, errOut)
			}
			if family == "gemma2" { // the planner measures a step of the family and predicts each placement
				if out, errOut, err := runApp(t, "plan", "--model", base, "--batch", "1", "--seq", "32"); err != nil || !strings.Contains(out, "stage") {
					t.Errorf("plan --model: %v\n%s\n%s", err, out, errOut)
				}
			}
			streamed, _ := evalJSON(t, "--model", run, "--data", held, "--seq", "32", "--offload", "cpu")
			if math.Abs(streamed.Loss-after.Loss)/after.Loss > 1e-2 && !s.MoE() {
				t.Errorf("the run streamed from host RAM (bf16) evaluates to %.6g, resident to %.6g", streamed.Loss, after.Loss)
			}
			if s.MoE() { // bf16 weights move tokens whose top k is close to another expert: against the resident bf16 run
				if bf, _ := evalJSON(t, "--model", run, "--data", held, "--seq", "32", "--dtype", "bf16"); math.Abs(streamed.Loss-bf.Loss)/bf.Loss > 1e-3 {
					t.Errorf("the run streamed from host RAM (bf16) evaluates to %.6g, resident in bf16 to %.6g (fp32 %.6g)", streamed.Loss, bf.Loss, after.Loss)
				} else {
					t.Logf("%s: streamed (bf16) %.6g, resident bf16 %.6g, fp32 %.6g", family, streamed.Loss, bf.Loss, after.Loss)
				}
			}
			if out, errOut, err := runApp(t, "generate", "--model", run, "--prompt", "The cat", "--max-new-tokens", "8"); err != nil || out == "" {
				t.Errorf("generate: %v\n%s\n%s", err, out, errOut)
			}
			// generate with the conversation rendered by the family's real
			// chat template (the base's, which the run goes back to).
			msgs := writeFile(t, "m.json", `[{"role": "user", "content": "Where did the cat sit?"}]`)
			if out, errOut, err := runApp(t, "generate", "--model", run, "--messages", msgs, "--max-new-tokens", "8"); err != nil || !strings.Contains(errOut, "chat_template.jinja") {
				t.Errorf("generate --messages with %s: %v\n%s\n%s", familyTemplates[family], err, out, errOut)
			}
			q := strings.Replace(strings.Replace(loraConfig, "%s", "0.01", 1), `"target_modules": "all-linear"}`, `"target_modules": "all-linear", "base_dtype": "nf4"}, "seed": 3`, 1)
			qcfg := writeFile(t, "qlora.json", strings.Replace(q, `"stage": 3,`, `"stage": 3, "offload_param": {"device": "cpu"},`, 1))
			qrun := filepath.Join(dir, "qlora")
			if out, errOut, err := runApp(t, "train", "--init", base, "--config", qcfg, "--data", train, "--steps", "30", "--out", qrun, "--no-progress"); err != nil {
				t.Fatalf("train --init with an nf4 base: %v\n%s\n%s", err, out, errOut)
			}
			if q, _ := evalJSON(t, "--model", qrun, "--data", held, "--seq", "32"); !(q.Loss < before.Loss-0.3) {
				t.Errorf("QLoRA (nf4 base): held-out loss %.4f, %.4f before", q.Loss, before.Loss)
			}
			t.Logf("%s: held-out loss %.4f -> %.4f; the transcription's merge evaluates to %.9g", family, before.Loss, after.Loss, m.Loss)
		})
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// hfTensor is one tensor of a safetensors file as stored.
type hfTensor struct {
	dtype string
	data  []byte
}

// readHFTensors reads dir/model.safetensors by name.
func readHFTensors(t *testing.T, dir string) map[string]hfTensor {
	t.Helper()
	h, data, err := safetensors.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]hfTensor{}
	for _, ti := range h.Tensors {
		out[ti.Name] = hfTensor{ti.DType, data[ti.Name]}
	}
	return out
}

// readJSONMap reads a JSON object's keys with their values as written
// (re-encoded compactly).
func readJSONMap(t *testing.T, path string) map[string]json.RawMessage {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range m {
		var x any
		json.Unmarshal(v, &x)
		m[k], _ = json.Marshal(x)
	}
	return m
}
