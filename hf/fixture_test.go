package hf

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/strata-ai/strata/safetensors"
)

// Tiny Hugging Face model directories written the way transformers writes
// them, from the tests' own tables of names and shapes (not from the
// package's naming code), with their own safetensors writer.

// fileEntry is a tensor of a fixture file as stored: its name, dtype,
// shape and little-endian bytes.
type fileEntry struct {
	name  string
	dtype string // "F32", "BF16", "F16", "I64"
	shape []int
	data  []byte
}

// writeRaw writes tensors to a safetensors file at path: a JSON header
// (metadata, then every tensor with its data_offsets in the order given),
// padded with spaces to 8 bytes, then the data.
func writeRaw(t testing.TB, path string, tensors []fileEntry, metadata map[string]string) {
	t.Helper()
	hdr := map[string]any{}
	if metadata != nil {
		hdr["__metadata__"] = metadata
	}
	off := 0
	for _, r := range tensors {
		hdr[r.name] = map[string]any{"dtype": r.dtype, "shape": r.shape, "data_offsets": []int{off, off + len(r.data)}}
		off += len(r.data)
	}
	h, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	b = append(b, h...)
	for _, r := range tensors {
		b = append(b, r.data...)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// fixture is a Hugging Face model the tests write.
type fixture struct {
	arch    string // "gpt2", "llama", "qwen2", "mistral"
	layers  int
	dim     int
	heads   int
	kvHeads int
	ffn     int
	vocab   int
	maxSeq  int
	tied    bool
	dtype   string // the tensors' dtype
	prefix  bool   // names with "model." / "transformer."
	shards  int    // weight files (1: model.safetensors)
	extra   map[string]any
}

// tensors are the fixture's tensors as transformers names and shapes them.
func (f fixture) tensors() []fileEntry {
	var out []fileEntry
	add := func(name string, shape ...int) {
		out = append(out, fileEntry{name: name, dtype: f.dtype, shape: shape})
	}
	c, ff := f.dim, f.ffn
	if f.arch == "gpt2" {
		p := ""
		if f.prefix {
			p = "transformer."
		}
		add(p+"wte.weight", f.vocab, c)
		add(p+"wpe.weight", f.maxSeq, c)
		for i := range f.layers {
			h := fmt.Sprintf("%sh.%d.", p, i)
			add(h+"ln_1.weight", c)
			add(h+"ln_1.bias", c)
			add(h+"attn.c_attn.weight", c, 3*c) // Conv1D: in×out
			add(h+"attn.c_attn.bias", 3*c)
			add(h+"attn.c_proj.weight", c, c)
			add(h+"attn.c_proj.bias", c)
			add(h+"ln_2.weight", c)
			add(h+"ln_2.bias", c)
			add(h+"mlp.c_fc.weight", c, ff)
			add(h+"mlp.c_fc.bias", ff)
			add(h+"mlp.c_proj.weight", ff, c)
			add(h+"mlp.c_proj.bias", c)
		}
		add(p+"ln_f.weight", c)
		add(p+"ln_f.bias", c)
		return out
	}
	p := ""
	if f.prefix {
		p = "model."
	}
	kv := f.kvHeads * (c / f.heads)
	add(p+"embed_tokens.weight", f.vocab, c)
	for i := range f.layers {
		l := fmt.Sprintf("%slayers.%d.", p, i)
		add(l+"input_layernorm.weight", c)
		add(l+"self_attn.q_proj.weight", c, c)
		add(l+"self_attn.k_proj.weight", kv, c)
		add(l+"self_attn.v_proj.weight", kv, c)
		if f.arch == "qwen2" {
			add(l+"self_attn.q_proj.bias", c)
			add(l+"self_attn.k_proj.bias", kv)
			add(l+"self_attn.v_proj.bias", kv)
		}
		add(l+"self_attn.o_proj.weight", c, c)
		add(l+"post_attention_layernorm.weight", c)
		add(l+"mlp.gate_proj.weight", ff, c)
		add(l+"mlp.up_proj.weight", ff, c)
		add(l+"mlp.down_proj.weight", c, ff)
	}
	add(p+"norm.weight", c)
	if !f.tied {
		add("lm_head.weight", f.vocab, c)
	}
	return out
}

// config is the fixture's config.json, as transformers writes it.
func (f fixture) config() map[string]any {
	torchDType := map[string]string{"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[f.dtype]
	var m map[string]any
	switch f.arch {
	case "gpt2":
		m = map[string]any{"architectures": []string{"GPT2LMHeadModel"}, "model_type": "gpt2", "n_embd": f.dim, "n_layer": f.layers,
			"n_head": f.heads, "n_positions": f.maxSeq, "n_ctx": f.maxSeq, "vocab_size": f.vocab, "n_inner": nil,
			"layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "bos_token_id": 50256, "eos_token_id": 50256,
			"resid_pdrop": 0.1, "scale_attn_weights": true, "transformers_version": "4.40.0"}
		if f.ffn != 4*f.dim {
			m["n_inner"] = f.ffn
		}
	default:
		arch := map[string]string{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}[f.arch]
		m = map[string]any{"architectures": []string{arch}, "model_type": f.arch, "hidden_size": f.dim, "num_hidden_layers": f.layers,
			"num_attention_heads": f.heads, "num_key_value_heads": f.kvHeads, "intermediate_size": f.ffn, "vocab_size": f.vocab,
			"max_position_embeddings": f.maxSeq, "rope_theta": 500000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": f.tied,
			"hidden_act": "silu", "rope_scaling": nil, "bos_token_id": 1, "eos_token_id": 2, "attention_dropout": 0.0,
			"initializer_range": 0.02, "transformers_version": "4.40.0"}
		if f.arch == "qwen2" {
			m["use_sliding_window"], m["sliding_window"], m["max_window_layers"] = false, 4096, f.layers
		}
		if f.arch == "mistral" {
			m["sliding_window"] = nil
		}
	}
	m["torch_dtype"] = torchDType
	for k, v := range f.extra {
		if v == nil {
			delete(m, k)
			continue
		}
		m[k] = v
	}
	return m
}

// fill gives every tensor random values in its dtype.
func fill(ts []fileEntry, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := range ts {
		n := 1
		for _, d := range ts[i].shape {
			n *= d
		}
		switch ts[i].dtype {
		case "F32":
			ts[i].data = make([]byte, 4*n)
			for j := range n {
				binary.LittleEndian.PutUint32(ts[i].data[4*j:], math.Float32bits(float32(rng.NormFloat64())))
			}
		case "BF16", "F16":
			ts[i].data = make([]byte, 2*n)
			for j := range n {
				// Any bit pattern but NaN/Inf, so that both are values.
				h := uint16(rng.Uint32())
				exp := map[string]uint16{"BF16": 0x7f80, "F16": 0x7c00}[ts[i].dtype]
				if h&exp == exp {
					h &^= 0x4000
				}
				binary.LittleEndian.PutUint16(ts[i].data[2*j:], h)
			}
		default:
			ts[i].data = make([]byte, 8*n)
		}
	}
}

// write writes the fixture into dir (config.json, the weights, with an
// index when sharded, tokenizer files) and returns its tensors.
func (f fixture) write(t testing.TB, dir string, seed uint64) []fileEntry {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.MarshalIndent(f.config(), "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	ts := f.tensors()
	fill(ts, seed)
	writeFixtureWeights(t, dir, ts, f.shards)
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(`{"fixture": "`+name+`"}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return ts
}

// writeFixtureWeights writes ts as model.safetensors, or over shards files
// with model.safetensors.index.json (tensors dealt round-robin, so that a
// chunk's tensors lie in several files).
func writeFixtureWeights(t testing.TB, dir string, ts []fileEntry, shards int) {
	t.Helper()
	if shards <= 1 {
		writeRaw(t, filepath.Join(dir, "model.safetensors"), ts, map[string]string{"format": "pt"})
		return
	}
	files := make([][]fileEntry, shards)
	weightMap := map[string]string{}
	total := 0
	for i, r := range ts {
		files[i%shards] = append(files[i%shards], r)
		weightMap[r.name] = fmt.Sprintf("model-%05d-of-%05d.safetensors", i%shards+1, shards)
		total += len(r.data)
	}
	for i, fts := range files {
		writeRaw(t, filepath.Join(dir, fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, shards)), fts, map[string]string{"format": "pt"})
	}
	b, _ := json.MarshalIndent(map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap}, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// readHFDir reads every tensor of a Hugging Face directory through the
// index (or model.safetensors) with safetensors.ReadFile, keyed by name.
func readHFDir(t testing.TB, dir string) map[string]fileEntry {
	t.Helper()
	files := []string{"model.safetensors"}
	var index struct {
		Metadata  map[string]int64  `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	if b, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json")); err == nil {
		if err := json.Unmarshal(b, &index); err != nil {
			t.Fatal(err)
		}
		files = files[:0]
		for _, f := range index.WeightMap {
			files = append(files, f)
		}
		sort.Strings(files)
		files = compactStrings(files)
	}
	out := map[string]fileEntry{}
	for _, name := range files {
		h, data, err := safetensors.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range h.Tensors {
			shape := make([]int, len(ti.Shape))
			for i, d := range ti.Shape {
				shape[i] = int(d)
			}
			if index.WeightMap != nil && index.WeightMap[ti.Name] != name {
				t.Errorf("%s: %s is in %s, the index says %q", dir, ti.Name, name, index.WeightMap[ti.Name])
			}
			out[ti.Name] = fileEntry{name: ti.Name, dtype: ti.DType, shape: shape, data: data[ti.Name]}
		}
	}
	if index.WeightMap != nil && len(index.WeightMap) != len(out) {
		t.Errorf("%s: the index lists %d tensors, the files hold %d", dir, len(index.WeightMap), len(out))
	}
	return out
}

func compactStrings(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
