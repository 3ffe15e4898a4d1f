package model

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/strata-ai/strata/internal/hosttest"
)

// The independent check of the architectures: tiny random GPT-2, Llama
// (grouped-query attention, untied head) and Qwen2 (biases, tied head)
// models are written in Hugging Face's layout (config.json,
// model.safetensors), a batch with a packed row and ignored targets beside
// them, and testdata/hf_reference.py — the architectures written in
// PyTorch from Hugging Face's modeling code, sharing nothing with this
// package — computes the logits, the loss and every parameter's gradient
// in fp32. Debian's python3-torch is the reference (.ci/run installs it).

// hfName is a Strata tensor's Hugging Face name, and whether Hugging Face
// stores its transpose (GPT-2's Conv1D weights are in×out).
func hfName(s Shape, name string) (string, bool) {
	if !s.IsLlama() {
		conv := strings.HasSuffix(name, "attn.c_attn.weight") || strings.HasSuffix(name, "attn.c_proj.weight") ||
			strings.HasSuffix(name, "mlp.c_fc.weight") || strings.HasSuffix(name, "mlp.c_proj.weight")
		if name == "wte" || name == "wpe" {
			name += ".weight"
		}
		return "transformer." + name, conv
	}
	if name == "lm_head.weight" {
		return name, false
	}
	return "model." + name, false
}

// hfConfig is the config.json of s.
func hfConfig(s Shape) map[string]any {
	if !s.IsLlama() {
		return map[string]any{"architectures": []string{"GPT2LMHeadModel"}, "model_type": "gpt2", "n_embd": s.Dim, "n_layer": s.Layers,
			"n_head": s.Heads, "n_positions": s.MaxSeq, "vocab_size": s.Vocab, "layer_norm_epsilon": s.Eps(), "n_inner": s.FFNDim()}
	}
	arch, typ := "LlamaForCausalLM", "llama"
	switch s.Arch {
	case ArchQwen2:
		arch, typ = "Qwen2ForCausalLM", "qwen2"
	case ArchMixtral:
		arch, typ = "MixtralForCausalLM", "mixtral"
	case ArchQwen3MoE:
		arch, typ = "Qwen3MoeForCausalLM", "qwen3_moe"
	}
	c := map[string]any{"architectures": []string{arch}, "model_type": typ, "hidden_size": s.Dim, "num_hidden_layers": s.Layers,
		"num_attention_heads": s.Heads, "num_key_value_heads": s.KVHeadCount(), "intermediate_size": s.FFNDim(), "vocab_size": s.Vocab,
		"max_position_embeddings": s.MaxSeq, "rope_theta": s.Theta(), "rms_norm_eps": s.Eps(), "tie_word_embeddings": s.TiedHead()}
	switch s.Arch {
	case ArchMixtral:
		c["num_local_experts"], c["num_experts_per_tok"] = s.Experts, s.TopK
	case ArchQwen3MoE:
		var only []int
		for l := range s.Layers {
			if !s.SparseLayer(l) {
				only = append(only, l)
			}
		}
		c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"], c["norm_topk_prob"], c["mlp_only_layers"], c["head_dim"] =
			s.Experts, s.TopK, s.ExpertFFNDim(), s.NormTopK, only, s.HeadDim()
	}
	if s.MoE() {
		c["output_router_logits"], c["router_aux_loss_coef"] = s.RouterAux, s.RouterAuxCoef
	}
	return c
}

// stTensor is one fp32 tensor of a safetensors file.
type stTensor struct {
	shape []int
	data  []float32
}

// writeSafetensors writes fp32 tensors in the safetensors format: an
// 8-byte little-endian header length, the JSON header (names, dtype,
// shape, byte offsets), padded to 8 bytes, then the data.
func writeSafetensors(path string, tensors map[string]stTensor) error {
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	header := map[string]any{}
	off := 0
	for _, n := range names {
		b := 4 * len(tensors[n].data)
		header[n] = map[string]any{"dtype": "F32", "shape": tensors[n].shape, "data_offsets": []int{off, off + b}}
		off += b
	}
	h, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(out, h...)
	for _, n := range names {
		for _, v := range tensors[n].data {
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
		}
	}
	return os.WriteFile(path, out, 0o644)
}

// readSafetensors reads an fp32 safetensors file.
func readSafetensors(path string) (map[string]stTensor, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) < 8 {
		return nil, fmt.Errorf("%s: %d bytes", path, len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	var header map[string]struct {
		DType   string `json:"dtype"`
		Shape   []int  `json:"shape"`
		Offsets [2]int `json:"data_offsets"`
	}
	if err := json.Unmarshal(b[8:8+n], &header); err != nil {
		return nil, fmt.Errorf("%s: header: %w", path, err)
	}
	data := b[8+n:]
	out := map[string]stTensor{}
	for name, h := range header {
		if h.DType != "F32" {
			return nil, fmt.Errorf("%s: %s is %s", path, name, h.DType)
		}
		raw := data[h.Offsets[0]:h.Offsets[1]]
		v := make([]float32, len(raw)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		out[name] = stTensor{h.Shape, v}
	}
	return out, nil
}

// toHF returns chunk tensors (one []float32 per chunk, layout order) as
// Hugging Face's tensors.
func toHF(l *Layout, chunks [][]float32) map[string]stTensor {
	out := map[string]stTensor{}
	for c, ch := range l.Chunks {
		for _, tn := range ch.Tensors {
			v := chunks[c][tn.Offset : tn.Offset+tn.Len]
			name, tr := hfName(l.Shape, tn.Name)
			shape := append([]int(nil), tn.Shape...)
			data := append([]float32(nil), v...)
			if tr {
				rows, cols := tn.Shape[0], tn.Shape[1]
				shape = []int{cols, rows}
				for i := range rows {
					for j := range cols {
						data[j*rows+i] = v[i*cols+j]
					}
				}
			}
			out[name] = stTensor{shape, data}
		}
	}
	return out
}

// torchBatch is a batch with one plain row and one packed row (examples of
// 5 and 7 tokens) and three ignored targets.
func torchBatch(rng *rand.Rand, vocab int) Batch {
	const rows, seq = 2, 12
	b := Batch{Rows: rows, Seq: seq, IDs: randomTokens(rng, rows*seq, vocab), Targets: randomTokens(rng, rows*seq, vocab), Pos: make([]int32, rows*seq)}
	for t := range seq {
		b.Pos[t] = int32(t)
		b.Pos[seq+t] = int32(t)
		if t >= 5 {
			b.Pos[seq+t] = int32(t - 5)
		}
	}
	b.Targets[3], b.Targets[seq+4], b.Targets[seq+11] = IgnoreTarget, IgnoreTarget, IgnoreTarget
	return b
}

func rows2D(v []int32, rows, seq int) [][]int32 {
	out := make([][]int32, rows)
	for r := range out {
		out[r] = v[r*seq : (r+1)*seq]
	}
	return out
}

// maxRelErr is max|got-want| / max|want|.
func maxRelErr(got, want []float32) float64 {
	var d, m float64
	for i := range want {
		d = math.Max(d, math.Abs(float64(got[i])-float64(want[i])))
		m = math.Max(m, math.Abs(float64(want[i])))
	}
	if m == 0 {
		return d
	}
	return d / m
}

// TestAgainstTorch compares the logits, the loss and every parameter's
// gradient of the fp32 model with hf_reference.py's.
//
// Tolerances, relative to the largest magnitude of the reference tensor:
// logits and loss 1e-4 (both sides are fp32; the sums they differ in have
// at most 64 terms, about 1e-6 relative each, a few layers deep);
// gradients 1e-4 of the tensor's largest gradient. A wrong formula (a
// rotation convention, a head grouping, a mask, a missing bias) is off by
// more than 1e-2.
func TestAgainstTorch(t *testing.T) {
	hosttest.RequireTorch(t)
	script, err := filepath.Abs("testdata/hf_reference.py")
	if err != nil {
		t.Fatal(err)
	}
	shapes := []Shape{
		{Name: "gpt2-test", Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 16},
		{Name: "llama-test", Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 16, Arch: ArchLlama, KVHeads: 2, FFN: 48, RopeTheta: 10000},
		{Name: "qwen2-test", Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 16, Arch: ArchQwen2, KVHeads: 1, FFN: 48, RopeTheta: 1e6, NormEps: 1e-6, TieEmbeddings: true},
	}
	for i, s := range shapes {
		t.Run(s.ArchName(), func(t *testing.T) {
			l, err := NewLayout(s)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(i), 77))
			params := perturbedParams(l, uint64(10+i))
			b := torchBatch(rng, s.Vocab)
			dir := t.TempDir()
			cfg, _ := json.Marshal(hfConfig(s))
			batch, _ := json.Marshal(map[string]any{"ids": rows2D(b.IDs, b.Rows, b.Seq), "targets": rows2D(b.Targets, b.Rows, b.Seq), "pos": rows2D(b.Pos, b.Rows, b.Seq)})
			if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "batch.json"), batch, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := writeSafetensors(filepath.Join(dir, "model.safetensors"), toHF(l, params)); err != nil {
				t.Fatal(err)
			}
			outPath := filepath.Join(dir, "torch.safetensors")
			if out, err := exec.Command(hosttest.TorchPython, script, dir, filepath.Join(dir, "batch.json"), outPath).CombinedOutput(); err != nil {
				t.Fatalf("hf_reference.py: %v\n%s", err, out)
			}
			ref, err := readSafetensors(outPath)
			if err != nil {
				t.Fatal(err)
			}
			logits, loss, grads := runFP32(t, l, params, b)
			check := func(what string, got, want []float32, tol float64) {
				t.Helper()
				if len(got) != len(want) {
					t.Fatalf("%s: %d values, reference %d", what, len(got), len(want))
				}
				if e := maxRelErr(got, want); !(e <= tol) {
					t.Errorf("%s: max relative error %.3g, tolerance %g", what, e, tol)
				}
			}
			check("logits", logits, ref["logits"].data, 1e-4)
			lossErr := math.Abs(loss-float64(ref["loss"].data[0])) / math.Abs(float64(ref["loss"].data[0]))
			if !(lossErr <= 1e-4) {
				t.Errorf("loss %.7g, reference %.7g: relative error %.3g, tolerance 1e-4", loss, ref["loss"].data[0], lossErr)
			}
			hfGrads := toHF(l, grads)
			var worst float64
			worstName := ""
			for name, g := range hfGrads {
				want, ok := ref["grad."+name]
				if !ok {
					t.Fatalf("no reference gradient of %s", name)
				}
				check("grad "+name, g.data, want.data, 1e-4)
				if e := maxRelErr(g.data, want.data); e > worst {
					worst, worstName = e, name
				}
			}
			t.Logf("%s: max relative error: logits %.2e, loss %.2e, gradients %.2e (%s)", s.ArchName(),
				maxRelErr(logits, ref["logits"].data), lossErr, worst, worstName)
		})
	}
}

// runFP32 runs one Forward and Backward (scale 1) of the fp32 model with
// params on b, and returns the logits, the loss and the gradients.
func runFP32(t *testing.T, l *Layout, params [][]float32, b Batch) ([]float32, float64, [][]float32) {
	return runLoRA(t, l, params, b, func(int) bool { return false })
}
