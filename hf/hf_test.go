package hf

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
)

// The fixtures of the round trip: GPT-2 (fp32, transformers' prefix, the
// mask buffers saved too), Llama with grouped-query attention and an
// untied head (bf16, over three files), Qwen2 with q/k/v biases and a
// tied head (fp32), Mistral (bf16).
var (
	gpt2Fixture    = fixture{arch: "gpt2", layers: 2, dim: 16, heads: 4, ffn: 64, vocab: 40, maxSeq: 24, dtype: "F32", prefix: true, shards: 1}
	llamaFixture   = fixture{arch: "llama", layers: 3, dim: 16, heads: 4, kvHeads: 2, ffn: 40, vocab: 50, maxSeq: 32, dtype: "BF16", prefix: true, shards: 3}
	qwen2Fixture   = fixture{arch: "qwen2", layers: 2, dim: 24, heads: 6, kvHeads: 2, ffn: 36, vocab: 30, maxSeq: 32, tied: true, dtype: "F32", prefix: true, shards: 1}
	mistralFixture = fixture{arch: "mistral", layers: 2, dim: 16, heads: 4, kvHeads: 1, ffn: 32, vocab: 20, maxSeq: 64, dtype: "BF16", prefix: true, shards: 2}
)

// importExport opens the Hugging Face directory src and exports it to dst
// with opts, one chunk at a time through one buffer.
func importExport(t *testing.T, src, dst string, opts DirOptions) (*Model, *DirExport) {
	t.Helper()
	m, err := Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	out, err := ExportDir(dst, m.Layout, opts, func(w *ExportWriter) error {
		for c, ch := range m.Layout.Chunks {
			buf := make([]float32, ch.Len)
			if err := m.ReadChunk(c, buf); err != nil {
				return err
			}
			if err := w.F32(c, buf); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m, out
}

// hfShapeKeys are the config.json keys that decide the shape, per
// architecture.
var hfShapeKeys = map[string][]string{
	"gpt2":  {"architectures", "model_type", "n_embd", "n_layer", "n_head", "n_positions", "vocab_size", "n_inner", "layer_norm_epsilon", "activation_function"},
	"llama": {"architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size", "max_position_embeddings", "rope_theta", "rms_norm_eps", "tie_word_embeddings", "hidden_act", "rope_scaling"},
}

func readJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

// TestHFRoundTrip imports tiny GPT-2, Llama, Qwen2 and Mistral models
// written in Hugging Face layout and exports them again in their dtype:
// every tensor comes back with the same name, dtype, shape and bytes, and
// no other; config.json keeps every key of the source's (and, exported
// without the source, the keys of the shape are the source's); the
// tokenizer files are copied.
func TestHFRoundTrip(t *testing.T) {
	for _, f := range []fixture{gpt2Fixture, llamaFixture, qwen2Fixture, mistralFixture} {
		t.Run(f.arch, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(dir, "src")
			want := f.write(t, src, 1)
			if f.arch == "gpt2" { // buffers transformers may save; import skips them
				ts := append(append([]fileEntry(nil), want...),
					fileEntry{name: "transformer.h.0.attn.bias", dtype: "F32", shape: []int{1, 1, f.maxSeq, f.maxSeq}, data: make([]byte, 4*f.maxSeq*f.maxSeq)},
					fileEntry{name: "transformer.h.1.attn.masked_bias", dtype: "F32", shape: []int{}, data: make([]byte, 4)})
				writeFixtureWeights(t, src, ts, 1)
			}
			dt := dtype.F32
			if f.dtype == "BF16" {
				dt = dtype.BF16
			}
			m, err := Open(src)
			if err != nil {
				t.Fatal(err)
			}
			source := m.Source()
			m.Close()
			if !reflect.DeepEqual(source.Tokenizer, []string{"tokenizer.json", "tokenizer_config.json"}) || source.TokenizerPath() != filepath.Join(src, "tokenizer.json") {
				t.Errorf("source %+v", source)
			}
			out := filepath.Join(dir, "out")
			_, res := importExport(t, src, out, DirOptions{DType: dt, Source: source, MaxShardBytes: 2000})
			got := readHFDir(t, out)
			if len(got) != len(want) {
				t.Errorf("exported %d tensors, the source holds %d", len(got), len(want))
			}
			for _, w := range want {
				g, ok := got[w.name]
				switch {
				case !ok:
					t.Errorf("%s not exported", w.name)
				case g.dtype != w.dtype || !reflect.DeepEqual(g.shape, w.shape):
					t.Errorf("%s: exported %s %v, the source is %s %v", w.name, g.dtype, g.shape, w.dtype, w.shape)
				case !bytes.Equal(g.data, w.data):
					t.Errorf("%s: the exported bytes differ from the source's", w.name)
				}
			}
			if len(res.Files) < 2 || !reflect.DeepEqual(res.Tokenizer, []string{"tokenizer.json", "tokenizer_config.json"}) {
				t.Errorf("export wrote %v, tokenizer %v (want several shards and both tokenizer files)", res.Files, res.Tokenizer)
			}
			for _, name := range res.Tokenizer {
				a, _ := os.ReadFile(filepath.Join(src, name))
				b, _ := os.ReadFile(filepath.Join(out, name))
				if !bytes.Equal(a, b) {
					t.Errorf("%s differs from the source's", name)
				}
			}
			srcCfg, outCfg := readJSON(t, filepath.Join(src, "config.json")), readJSON(t, filepath.Join(out, "config.json"))
			for k, v := range srcCfg {
				if !reflect.DeepEqual(outCfg[k], v) {
					t.Errorf("config.json %q: exported %v, the source has %v", k, outCfg[k], v)
				}
			}
			// Without the source: the keys of the shape alone.
			bare := filepath.Join(dir, "bare")
			importExport(t, src, bare, DirOptions{DType: dt})
			bareCfg := readJSON(t, filepath.Join(bare, "config.json"))
			keys := hfShapeKeys["llama"]
			if f.arch == "gpt2" {
				keys = hfShapeKeys["gpt2"]
			}
			for _, k := range append(keys, "torch_dtype") {
				if f.arch == "mistral" && (k == "architectures" || k == "model_type") {
					continue // a Mistral without sliding window is written as Llama
				}
				if !reflect.DeepEqual(bareCfg[k], srcCfg[k]) {
					t.Errorf("config.json %q without the source: %v, the source has %v", k, bareCfg[k], srcCfg[k])
				}
			}
			back, err := Open(bare)
			if err != nil {
				t.Fatal(err)
			}
			back.Close()
			if back.Shape().Canonical() != m.Shape().Canonical() {
				t.Errorf("the exported config reads as %v, the source as %v", back.Shape(), m.Shape())
			}
		})
	}
}

// TestHFShards checks the files of a sharded export: at most the given
// tensor bytes each (a larger tensor alone), named model-0000N-of-0000M,
// the index's total_size the tensors' bytes; one file is model.safetensors
// without an index.
func TestHFShards(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	llamaFixture.write(t, src, 2)
	const maxBytes = 3000
	_, res := importExport(t, src, filepath.Join(dir, "out"), DirOptions{MaxShardBytes: maxBytes})
	var total int64
	for i, name := range res.Files {
		if want := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(res.Files)); name != want {
			t.Errorf("file %d is %s", i, name)
		}
		h, _, err := safetensors.ReadFile(filepath.Join(dir, "out", name))
		if err != nil {
			t.Fatal(err)
		}
		if h.DataBytes > maxBytes && len(h.Tensors) > 1 {
			t.Errorf("%s holds %d bytes of %d tensors, more than %d", name, h.DataBytes, len(h.Tensors), maxBytes)
		}
		if h.Metadata["format"] != "pt" {
			t.Errorf("%s: metadata %v", name, h.Metadata)
		}
		total += h.DataBytes
	}
	idx := readJSON(t, filepath.Join(dir, "out", IndexName))
	if got := idx["metadata"].(map[string]any)["total_size"].(float64); int64(got) != total || total != res.TotalBytes {
		t.Errorf("total_size %v, files hold %d, export says %d", got, total, res.TotalBytes)
	}
	if len(res.Files) < 3 {
		t.Errorf("%d files at %d bytes each", len(res.Files), maxBytes)
	}
	_, one := importExport(t, src, filepath.Join(dir, "one"), DirOptions{})
	if !reflect.DeepEqual(one.Files, []string{"model.safetensors"}) {
		t.Errorf("default shard size wrote %v", one.Files)
	}
	if _, err := os.Stat(filepath.Join(dir, "one", IndexName)); err == nil {
		t.Error("one file, and an index written")
	}
	// A directory that is not empty is refused, and nothing is written.
	if _, err := ExportDir(filepath.Join(dir, "one"), tinyLayout(t), DirOptions{}, nil); err == nil || !strings.Contains(err.Error(), "is not empty") {
		t.Errorf("export into a full directory: %v", err)
	}
	for _, s := range []struct {
		in   string
		want int64
	}{{"5GB", 5e9}, {"2GiB", 2 << 30}, {"500MB", 5e8}, {"1000", 1000}, {"1.5KB", 1500}} {
		if got, err := ParseShardSize(s.in); err != nil || got != s.want {
			t.Errorf("ParseShardSize(%q) = %d, %v; want %d", s.in, got, err, s.want)
		}
	}
	if _, err := ParseShardSize("lots"); err == nil {
		t.Error("ParseShardSize(lots): no error")
	}
}

// rneBF16 rounds f to bfloat16 by its definition: of the two bfloat16s
// around f, the nearer, and at a tie the one with an even last bit.
func rneBF16(f float32) uint16 {
	b := math.Float32bits(f)
	lo := uint16(b >> 16) // truncated toward zero
	rest := b & 0xffff
	switch {
	case rest < 0x8000:
		return lo
	case rest > 0x8000:
		return lo + 1
	case lo%2 == 0:
		return lo
	}
	return lo + 1
}

// TestHFExportBF16RoundsNearestEven exports an fp32 model as bf16 and
// checks every value against the definition, ties included.
func TestHFExportBF16RoundsNearestEven(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f := qwen2Fixture
	f.prefix = true
	f.write(t, src, 3)
	m, err := Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	chunks := make([][]float32, len(m.Layout.Chunks))
	for c, ch := range m.Layout.Chunks {
		chunks[c] = make([]float32, ch.Len)
		if err := m.ReadChunk(c, chunks[c]); err != nil {
			t.Fatal(err)
		}
	}
	ties := []uint32{0x3f808000, 0x3f818000, 0xbf808000, 0x40490fdb, 0x00008000, 0x00018000, 0x7f7fffff}
	for i, b := range ties { // ties to even both ways, rounding up across the exponent, near the top
		chunks[1][i] = math.Float32frombits(b)
	}
	out := filepath.Join(dir, "out")
	if _, err := ExportDir(out, m.Layout, DirOptions{DType: dtype.BF16}, func(w *ExportWriter) error {
		for c := range chunks {
			if err := w.F32(c, chunks[c]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got := readHFDir(t, out)
	if cfg := readJSON(t, filepath.Join(out, "config.json")); cfg["torch_dtype"] != "bfloat16" {
		t.Errorf("torch_dtype %v", cfg["torch_dtype"])
	}
	checked := 0
	for c, ch := range m.Layout.Chunks {
		for _, tn := range ch.Tensors {
			g := got[hfPrefixed(m.Layout.Shape, tn.Name)]
			if g.dtype != "BF16" {
				t.Fatalf("%s: dtype %s", tn.Name, g.dtype)
			}
			for i := range tn.Len {
				want := rneBF16(chunks[c][tn.Offset+i])
				if h := binary.LittleEndian.Uint16(g.data[2*i:]); h != want {
					t.Fatalf("%s[%d] = %#04x from %#08x, want %#04x", tn.Name, i, h, math.Float32bits(chunks[c][tn.Offset+i]), want)
				}
				checked++
			}
		}
	}
	if checked != int(m.Layout.ParamCount()) {
		t.Errorf("checked %d values of %d", checked, m.Layout.ParamCount())
	}
}

// TestF16ToFloat32 checks every binary16 against its definition.
func TestF16ToFloat32(t *testing.T) {
	for h := range 1 << 16 {
		sign, exp, mant := h>>15, (h>>10)&0x1f, h&0x3ff
		var want float64
		switch {
		case exp == 0x1f && mant == 0:
			want = math.Inf(1)
		case exp == 0x1f:
			got := math.Float32bits(F16ToFloat32(uint16(h)))
			if wantBits := uint32(sign)<<31 | 0x7f800000 | uint32(mant)<<13; got != wantBits {
				t.Fatalf("NaN %#04x -> %#08x, want %#08x (sign and payload kept)", h, got, wantBits)
			}
			continue
		case exp == 0:
			want = math.Ldexp(float64(mant), -24)
		default:
			want = math.Ldexp(1+float64(mant)/1024, exp-15)
		}
		if sign == 1 {
			want = -want
		}
		if got := F16ToFloat32(uint16(h)); math.Float32bits(got) != math.Float32bits(float32(want)) {
			t.Fatalf("%#04x -> %v, want %v", h, got, want)
		}
	}
}

// TestHFImportF16 reads a model stored in F16 (with one tensor in F32 and
// one in BF16), named without the "transformer." prefix as
// openai-community/gpt2 is: every value widened exactly.
func TestHFImportF16(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	f := gpt2Fixture
	f.dtype, f.prefix = "F16", false
	ts := f.tensors()
	ts[0].dtype, ts[3].dtype = "F32", "BF16"
	fill(ts, 4)
	f.write(t, src, 4)
	writeFixtureWeights(t, src, ts, 1)
	m, err := Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	byName := map[string]fileEntry{}
	for _, r := range ts {
		byName[strings.TrimPrefix(r.name, "transformer.")] = r
	}
	for c, ch := range m.Layout.Chunks {
		got := make([]float32, ch.Len)
		if err := m.ReadChunk(c, got); err != nil {
			t.Fatal(err)
		}
		for _, tn := range ch.Tensors {
			name, transposed := hfName(tn)
			r := byName[name]
			for i := range tn.Len {
				j := i
				if transposed { // element (row, col) of Strata's out×in is (col, row) of the file
					rows, cols := tn.Shape[0], tn.Shape[1]
					j = (i%cols)*rows + i/cols
				}
				var want float32
				switch r.dtype {
				case "F32":
					want = math.Float32frombits(binary.LittleEndian.Uint32(r.data[4*j:]))
				case "BF16":
					want = math.Float32frombits(uint32(binary.LittleEndian.Uint16(r.data[2*j:])) << 16)
				default:
					want = F16ToFloat32(binary.LittleEndian.Uint16(r.data[2*j:]))
				}
				if math.Float32bits(got[tn.Offset+i]) != math.Float32bits(want) {
					t.Fatalf("%s[%d] (%s) = %v, want %v", tn.Name, i, r.dtype, got[tn.Offset+i], want)
				}
			}
		}
	}
}

// TestHFConfigRefuses checks each refusal of ParseConfig names
// config.json and the key.
func TestHFConfigRefuses(t *testing.T) {
	cases := []struct {
		f     fixture
		extra map[string]any
		want  string
	}{
		{llamaFixture, map[string]any{"rope_scaling": map[string]any{"rope_type": "llama3", "factor": 8.0}}, `rope_scaling (llama3) original_max_position_embeddings 0, low_freq_factor 0, high_freq_factor 0`},
		{llamaFixture, map[string]any{"rope_scaling": map[string]any{"rope_type": "su", "factor": 8.0}}, `"rope_scaling": rope_type "su" is not built`},
		{llamaFixture, map[string]any{"rope_scaling": map[string]any{"type": "linear", "factor": 2.0, "beta_fast": 4}}, `"rope_scaling": "beta_fast": 4: not read for rope_type "linear"`},
		{llamaFixture, map[string]any{"rope_scaling": map[string]any{"type": "linear", "factor": 0.5}}, `rope_scaling factor 0.5: must be a number >= 1`},
		{llamaFixture, map[string]any{"partial_rotary_factor": 0.1}, `partial_rotary_factor 0.1: rotates 0 values of each head of 4`},
		{llamaFixture, map[string]any{"layer_types": []string{"sliding_attention", "chunked_attention", "full_attention"}, "sliding_window": 4}, `"layer_types": "chunked_attention": not built`},
		{llamaFixture, map[string]any{"architectures": []string{"Gemma2ForCausalLM"}, "hidden_activation": "gelu"}, `"hidden_activation": "gelu": Gemma's MLP is built with gelu_pytorch_tanh (GeGLU) only`},
		{llamaFixture, map[string]any{"attn_logit_softcapping": 30.0}, `"attn_logit_softcapping": 30: only Gemma's attention has it`},
		{llamaFixture, map[string]any{"hidden_act": "gelu"}, `"hidden_act": "gelu"`},
		{gpt2Fixture, map[string]any{"activation_function": "relu"}, `"activation_function": "relu"`},
		{llamaFixture, map[string]any{"architectures": []string{"FalconForCausalLM"}}, `"architectures" ["FalconForCausalLM"]: Strata reads LlamaForCausalLM`},
		{llamaFixture, map[string]any{"attention_bias": true}, `"attention_bias": true`},
		{llamaFixture, map[string]any{"hidden_size": nil}, `"hidden_size": missing`},
		{llamaFixture, map[string]any{"num_hidden_layers": 2.5}, `"num_hidden_layers": 2.5 is not a positive whole number`},
		{gpt2Fixture, map[string]any{"tie_word_embeddings": false}, `"tie_word_embeddings": false`},
		{llamaFixture, map[string]any{"num_key_value_heads": 3}, "n_head 4 is not a multiple of n_kv_head 3"},
		// Mixtures of experts: the routers and layouts not built, one error each.
		{llamaFixture, map[string]any{"architectures": []string{"Qwen2MoeForCausalLM"}}, "Qwen2MoeForCausalLM is a mixture of experts Strata does not build: Qwen2-MoE's shared expert"},
		{llamaFixture, map[string]any{"architectures": []string{"DeepseekV3ForCausalLM"}}, "DeepSeek's shared experts (n_shared_experts)"},
		{llamaFixture, map[string]any{"architectures": []string{"GptOssForCausalLM"}}, "gpt-oss's router"},
		{llamaFixture, map[string]any{"architectures": []string{"MixtralForCausalLM"}, "router_jitter_noise": 0.1}, `"router_jitter_noise": 0.1: the router's input noise in training is not built`},
		{llamaFixture, map[string]any{"architectures": []string{"Qwen3MoeForCausalLM"}, "num_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok 5 must be in [1, num_experts 4]"},
		{llamaFixture, map[string]any{"architectures": []string{"Qwen3MoeForCausalLM"}, "num_experts": 4, "mlp_only_layers": []int{7}}, `"mlp_only_layers": layer 7 is not one of the 3 layers`},
		{llamaFixture, map[string]any{"architectures": []string{"Qwen3MoeForCausalLM"}, "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 4}, `no layer is sparse (decoder_sparse_step 4`},
	}
	for _, tc := range cases {
		f := tc.f
		f.extra = tc.extra
		b, _ := json.Marshal(f.config())
		_, err := ParseConfig("m/config.json", b)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "m/config.json") {
			t.Errorf("%v: %v, want an error naming m/config.json and saying %s", tc.extra, err, tc.want)
		}
	}
	// Mistral's sliding window: every layer slides.
	f := mistralFixture
	f.extra = map[string]any{"sliding_window": 16}
	b, _ := json.Marshal(f.config())
	c, err := ParseConfig("config.json", b)
	if err != nil {
		t.Fatal(err)
	}
	if s := c.Shape; s.Arch != model.ArchLlama || s.KVHeads != 1 || s.RopeTheta != 500000 || s.NormEps != 1e-6 || s.SlidingWindow != 16 || s.LayerTypes != "" || !s.Sliding(1) {
		t.Errorf("mistral read as %+v", s)
	}
}

// TestHFImportRefuses breaks one thing at a time in a sharded Llama and
// checks that the error names the file and the tensor.
func TestHFImportRefuses(t *testing.T) {
	f := llamaFixture
	for _, tc := range []struct {
		name   string
		break_ func(ts []fileEntry) []fileEntry
		want   []string
	}{
		{"missing", func(ts []fileEntry) []fileEntry { return ts[1:] }, []string{"1 missing: model.embed_tokens.weight"}},
		{"misshaped", func(ts []fileEntry) []fileEntry {
			ts[3].shape = []int{ts[3].shape[1], ts[3].shape[0]}
			return ts
		}, []string{"model-00001-of-00003.safetensors: model.layers.0.self_attn.k_proj.weight has shape [16 8], the layout wants [8 16]"}},
		{"dtype", func(ts []fileEntry) []fileEntry {
			ts[4] = fileEntry{name: ts[4].name, dtype: "I64", shape: ts[4].shape, data: make([]byte, 4*len(ts[4].data))}
			return ts
		}, []string{"model-00002-of-00003.safetensors: model.layers.0.self_attn.v_proj.weight has dtype I64"}},
		{"unexpected", func(ts []fileEntry) []fileEntry {
			return append(ts[:len(ts)-1], fileEntry{name: "model.layers.0.self_attn.o_proj.bias", dtype: "BF16", shape: []int{16}, data: make([]byte, 32)}, ts[len(ts)-1])
		}, []string{fmt.Sprintf("1 unexpected: model-%05d-of-00003.safetensors: model.layers.0.self_attn.o_proj.bias", (len(llamaFixture.tensors())-1)%3+1)}},
		{"twice", func(ts []fileEntry) []fileEntry {
			d := ts[1]
			d.name = strings.TrimPrefix(d.name, "model.")
			return append(ts, d)
		}, []string{"layers.0.input_layernorm.weight and ", "layers.0.input_layernorm.weight are the same tensor"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "m")
			ts := f.write(t, src, 5)
			writeFixtureWeights(t, src, tc.break_(ts), 3)
			_, err := Open(src)
			for _, want := range append(tc.want, "import Hugging Face model "+src) {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("error %v does not say %q", err, want)
				}
			}
		})
	}
	// An index entry whose file does not hold the tensor.
	src := filepath.Join(t.TempDir(), "m")
	f.write(t, src, 6)
	idx := readJSON(t, filepath.Join(src, IndexName))
	wm := idx["weight_map"].(map[string]any)
	wm["model.norm.weight"] = "model-00001-of-00003.safetensors"
	if wm["model.norm.weight"] == "" {
		t.Fatal("no model.norm.weight in the index")
	}
	b, _ := json.Marshal(idx)
	os.WriteFile(filepath.Join(src, IndexName), b, 0o644)
	if _, err := Open(src); err == nil || !strings.Contains(err.Error(), "model.norm.weight (in model-00001-of-00003.safetensors)") {
		t.Errorf("index pointing at the wrong file: %v", err)
	}
	// No safetensors at all.
	empty := t.TempDir()
	os.WriteFile(filepath.Join(empty, "config.json"), must(json.Marshal(f.config())), 0o644)
	os.WriteFile(filepath.Join(empty, "pytorch_model.bin"), nil, 0o644)
	if _, err := Open(empty); err == nil || !strings.Contains(err.Error(), "it holds pytorch_model.bin: Strata reads safetensors only") {
		t.Errorf("a directory with pytorch_model.bin: %v", err)
	}
	if IsDir(t.TempDir()) || !IsDir(src) {
		t.Error("IsDir")
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// TestHFReadChunkMemory checks that reading a model chunk by chunk
// allocates a read block (and, for a transposed non-F32 tensor, its
// widened copy), not the model: GPT-2 in bf16, 2.4 MB of weights.
func TestHFReadChunkMemory(t *testing.T) {
	src := filepath.Join(t.TempDir(), "m")
	f := fixture{arch: "gpt2", layers: 4, dim: 256, heads: 4, ffn: 1024, vocab: 256, maxSeq: 64, dtype: "BF16", prefix: true, shards: 2}
	f.write(t, src, 7)
	m, err := Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	largest := 0
	for _, ch := range m.Layout.Chunks {
		largest = max(largest, ch.Len)
	}
	buf := make([]float32, largest)
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	for c, ch := range m.Layout.Chunks {
		if err := m.ReadChunk(c, buf[:ch.Len]); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&b)
	alloc := b.TotalAlloc - a.TotalAlloc
	// The largest tensor is 1024×256 bf16 (512 KiB, under one read
	// block): its bytes and its widened copy (1 MiB), plus 64 KiB for
	// errors and bookkeeping.
	bound := uint64(3<<19 + 64<<10)
	t.Logf("read %d params (%d bytes in bf16) allocating %d bytes (bound %d)", m.Layout.ParamCount(), 2*m.Layout.ParamCount(), alloc, bound)
	if alloc > bound {
		t.Errorf("reading the model allocated %d bytes, bound %d", alloc, bound)
	}
}
