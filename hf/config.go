package hf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/strata-ai/strata/internal/dtype"
	"github.com/strata-ai/strata/model"
)

// Hugging Face model directories: the files of one, and config.json read
// into a model.Shape and written back from one.

// The files of a Hugging Face model directory that Strata reads or writes.
const (
	ConfigName  = "config.json"
	WeightsName = "model.safetensors"            // one file of weights
	IndexName   = "model.safetensors.index.json" // sharded weights: weight_map name -> file
)

// TokenizerFiles are the tokenizer files of a Hugging Face directory
// that a run records (Source.Tokenizer) and `strata export --format hf`
// copies: tokenizer.json first (what Strata's tokenizer reads), then the
// files transformers' tokenizers and generation read beside it.
var TokenizerFiles = []string{
	"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
	"vocab.json", "merges.txt", "tokenizer.model", "generation_config.json", "chat_template.jinja",
}

// hfArchs maps the architectures Strata reads (config.json's
// "architectures", or else "model_type") to a model.Shape's Arch.
var hfArchs = map[string]string{
	"LlamaForCausalLM":   model.ArchLlama,
	"MistralForCausalLM": model.ArchLlama,
	"Qwen2ForCausalLM":   model.ArchQwen2,
	"GPT2LMHeadModel":    model.ArchGPT2,
	"llama":              model.ArchLlama,
	"mistral":            model.ArchLlama,
	"qwen2":              model.ArchQwen2,
	"gpt2":               model.ArchGPT2,
}

// Config is what Strata reads of a Hugging Face config.json.
type Config struct {
	Shape        model.Shape
	Architecture string // architectures[0] ("LlamaForCausalLM"), else model_type
	// SlidingWindow is Mistral's sliding_window (0: none). Attention
	// within a window at least as long as the sequence is full causal
	// attention, so a run is refused only when its sequence is longer
	// (CheckSeq).
	SlidingWindow int
	TorchDType    string // torch_dtype as written ("bfloat16"); "" when absent
}

// CheckSeq refuses a run of seq tokens that the model's sliding window
// would cut (Strata's attention has no sliding window).
func (c *Config) CheckSeq(seq int) error {
	if c.SlidingWindow > 0 && seq > c.SlidingWindow {
		return fmt.Errorf("hf: %s has sliding_window %d, shorter than the run's sequence of %d tokens: Strata's attention has no sliding window; train with strata.seq_len <= %d",
			c.Architecture, c.SlidingWindow, seq, c.SlidingWindow)
	}
	return nil
}

// hfKeys reads the keys of one config.json, collecting every problem.
type hfKeys struct {
	raw      map[string]json.RawMessage
	problems []string
}

func (k *hfKeys) bad(key, format string, args ...any) {
	k.problems = append(k.problems, fmt.Sprintf("%q: %s", key, fmt.Sprintf(format, args...)))
}

// null says whether key is absent or null.
func (k *hfKeys) null(key string) bool {
	v, ok := k.raw[key]
	return !ok || string(bytes.TrimSpace(v)) == "null"
}

// nullable are the keys whose null transformers reads as a meaning of its
// own (n_inner: 4·n_embd, head_dim: hidden/heads, num_key_value_heads:
// the heads, sliding_window and rope_scaling: none, torch_dtype: unsaid).
// Any other key written null is refused: transformers would keep None
// where it needs a value (an rms_norm_eps of None fails in the model).
var nullable = map[string]bool{"n_inner": true, "head_dim": true, "num_key_value_heads": true,
	"sliding_window": true, "rope_scaling": true, "torch_dtype": true, "architectures": true, "model_type": true}

// value is key's JSON value, false when absent or null (a null where
// transformers needs a value is a problem: want says what it needs).
func (k *hfKeys) value(key, want string) (json.RawMessage, bool) {
	v, ok := k.raw[key]
	if !ok {
		return nil, false
	}
	v = bytes.TrimSpace(v)
	if string(v) == "null" {
		if !nullable[key] {
			k.bad(key, "null: want %s", want)
		}
		return nil, false
	}
	return v, true
}

// wrongType is the problem of a value of another JSON type than want.
func (k *hfKeys) wrongType(key string, v json.RawMessage, want string) {
	kind := "value"
	switch v[0] {
	case '"':
		kind = "string"
	case 't', 'f':
		kind = "boolean"
	case '[':
		kind = "list"
	case '{':
		kind = "object"
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		kind = "number"
	}
	k.bad(key, "%s is a JSON %s: want %s", v, kind, want)
}

// number reads key as a JSON number (not a string holding one, which
// encoding/json's json.Number would take).
func (k *hfKeys) number(key, want string) (float64, bool) {
	v, ok := k.value(key, want)
	if !ok {
		return 0, false
	}
	var n json.Number
	if v[0] == '"' || json.Unmarshal(v, &n) != nil {
		k.wrongType(key, v, want)
		return 0, false
	}
	f, err := n.Float64()
	if err != nil {
		k.bad(key, "%s is out of range: want %s", v, want)
		return 0, false
	}
	return f, true
}

// int reads the first of keys present (aliases, as GPT-2's n_positions and
// n_ctx); def when none is (required: a problem then).
func (k *hfKeys) int(def int, required bool, keys ...string) int {
	const want = "a positive whole number"
	before := len(k.problems)
	for _, key := range keys {
		f, ok := k.number(key, want)
		if !ok {
			if len(k.problems) > before {
				return def
			}
			continue
		}
		if f != math.Trunc(f) || f < 1 || f > math.MaxInt32 {
			k.bad(key, "%s is not %s", k.raw[key], want)
			return def
		}
		return int(f)
	}
	if required {
		k.bad(keys[0], "missing")
	}
	return def
}

func (k *hfKeys) float(key string, def float64) float64 {
	f, ok := k.number(key, "a positive number")
	if !ok {
		return def
	}
	if !(f > 0) {
		k.bad(key, "%s must be positive", k.raw[key])
		return def
	}
	return f
}

func (k *hfKeys) bool(key string, def bool) bool {
	const want = "true or false"
	v, ok := k.value(key, want)
	if !ok {
		return def
	}
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		k.wrongType(key, v, want)
		return def
	}
	return b
}

func (k *hfKeys) str(key, def string) string {
	const want = "a string"
	v, ok := k.value(key, want)
	if !ok {
		return def
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		k.wrongType(key, v, want)
		return def
	}
	return s
}

// ReadConfig reads the config.json of the Hugging Face model directory
// dir (see ParseConfig).
func ReadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, ConfigName)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	c, err := ParseConfig(path, b)
	if err != nil {
		return nil, err
	}
	c.Shape.Name = filepath.Base(filepath.Clean(dir))
	return c, nil
}

// ParseConfig reads a Hugging Face config.json (b, read from path) of a
// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or GPT2LMHeadModel
// into a shape. What Strata does not compute is refused, every problem
// listed in one error naming the file and each key: rope_scaling other
// than null (Llama-3.1's "llama3" scaling is not built), a head_dim other
// than hidden_size / num_attention_heads, hidden_act other than silu
// (GPT-2's activation_function other than gelu_new), biases Llama does not
// have (attention_bias, mlp_bias), Qwen2's use_sliding_window, GPT-2
// without scaled attention or with an untied head, and an unknown
// architecture. Mistral's sliding_window is kept for CheckSeq.
func ParseConfig(path string, b []byte) (*Config, error) {
	k := &hfKeys{}
	if err := json.Unmarshal(b, &k.raw); err != nil {
		return nil, jsonError(path, b, err)
	}
	c := &Config{TorchDType: k.str("torch_dtype", "")}
	var archs []string
	if !k.null("architectures") {
		if err := json.Unmarshal(k.raw["architectures"], &archs); err != nil || len(archs) == 0 {
			return nil, fmt.Errorf("hf: %s: \"architectures\": %s is not a list of names", path, k.raw["architectures"])
		}
		c.Architecture = archs[0]
	} else if c.Architecture = k.str("model_type", ""); c.Architecture == "" {
		return nil, fmt.Errorf("hf: %s: neither \"architectures\" nor \"model_type\" says what model it is", path)
	}
	arch, ok := hfArchs[c.Architecture]
	if !ok || len(archs) > 1 {
		return nil, fmt.Errorf("hf: %s: \"architectures\" %s: Strata reads LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and GPT2LMHeadModel",
			path, orString(k.raw["architectures"], c.Architecture))
	}
	if arch == model.ArchGPT2 {
		c.Shape = gpt2Config(k)
	} else {
		c.Shape = llamaConfig(k, arch, c)
	}
	if len(k.problems) == 0 {
		if err := c.Shape.Validate(); err != nil {
			k.problems = append(k.problems, fmt.Sprintf("the shape it describes: %v", err))
		}
	}
	if len(k.problems) > 0 {
		return nil, fmt.Errorf("hf: %s (%s): %s", path, c.Architecture, strings.Join(k.problems, "; "))
	}
	return c, nil
}

func orString(raw json.RawMessage, s string) string {
	if len(raw) > 0 {
		return string(raw)
	}
	return fmt.Sprintf("(none; model_type %q)", s)
}

// llamaConfig reads LlamaForCausalLM, MistralForCausalLM and
// Qwen2ForCausalLM, with transformers' defaults for absent keys.
func llamaConfig(k *hfKeys, arch string, c *Config) model.Shape {
	s := model.Shape{Arch: arch,
		Dim:    k.int(0, true, "hidden_size"),
		Layers: k.int(0, true, "num_hidden_layers"),
		Heads:  k.int(0, true, "num_attention_heads"),
		FFN:    k.int(0, true, "intermediate_size"),
		Vocab:  k.int(0, true, "vocab_size"),
		MaxSeq: k.int(0, true, "max_position_embeddings"),
	}
	s.KVHeads = k.int(s.Heads, false, "num_key_value_heads")
	s.RopeTheta = k.float("rope_theta", 10000)
	s.NormEps = k.float("rms_norm_eps", 1e-6)
	s.TieEmbeddings = k.bool("tie_word_embeddings", false)
	if act := k.str("hidden_act", "silu"); act != "silu" {
		k.bad("hidden_act", "%q: the Llama family's MLP is built with silu (SwiGLU) only", act)
	}
	if !k.null("rope_scaling") {
		var rs struct {
			Type     string `json:"type"`
			RopeType string `json:"rope_type"`
		}
		json.Unmarshal(k.raw["rope_scaling"], &rs)
		what := "rope scaling is not built (only plain rotary embeddings with rope_theta)"
		if rs.RopeType == "llama3" || rs.Type == "llama3" {
			what = "Llama-3.1's \"llama3\" rope scaling is not built (only plain rotary embeddings with rope_theta)"
		}
		k.bad("rope_scaling", "%s: %s", k.raw["rope_scaling"], what)
	}
	if hd := k.int(0, false, "head_dim"); hd != 0 && s.Heads > 0 && hd*s.Heads != s.Dim {
		k.bad("head_dim", "%d differs from hidden_size / num_attention_heads = %d / %d: Strata's heads are hidden_size / num_attention_heads wide", hd, s.Dim, s.Heads)
	}
	if arch == model.ArchLlama && k.bool("attention_bias", false) {
		k.bad("attention_bias", "true: biases on q, k, v and o are not built for Llama (Qwen2's q, k, v biases are)")
	}
	if k.bool("mlp_bias", false) {
		k.bad("mlp_bias", "true: MLP biases are not built")
	}
	if arch == model.ArchQwen2 {
		if k.bool("use_sliding_window", false) {
			k.bad("use_sliding_window", "true: sliding-window attention is not built")
		}
	} else if w := k.int(0, false, "sliding_window"); w > 0 {
		c.SlidingWindow = w
	}
	return s
}

// gpt2Config reads GPT2LMHeadModel, with transformers' defaults.
func gpt2Config(k *hfKeys) model.Shape {
	s := model.Shape{Arch: model.ArchGPT2,
		Dim:    k.int(0, true, "n_embd", "hidden_size"),
		Layers: k.int(0, true, "n_layer", "num_hidden_layers"),
		Heads:  k.int(0, true, "n_head", "num_attention_heads"),
		Vocab:  k.int(0, true, "vocab_size"),
		MaxSeq: k.int(0, true, "n_positions", "n_ctx", "max_position_embeddings"),
	}
	s.FFN = k.int(0, false, "n_inner")
	s.NormEps = k.float("layer_norm_epsilon", 1e-5)
	if act := k.str("activation_function", "gelu_new"); act != "gelu_new" && act != "gelu_pytorch_tanh" {
		k.bad("activation_function", "%q: GPT-2's MLP is built with gelu_new (the tanh approximation) only", act)
	}
	if !k.bool("tie_word_embeddings", true) {
		k.bad("tie_word_embeddings", "false: GPT-2's output head is its token embedding (wte) in Strata")
	}
	if !k.bool("scale_attn_weights", true) {
		k.bad("scale_attn_weights", "false: attention scores are always scaled by 1/sqrt(head dim)")
	}
	if k.bool("scale_attn_by_inverse_layer_idx", false) {
		k.bad("scale_attn_by_inverse_layer_idx", "true: not built")
	}
	if k.bool("add_cross_attention", false) {
		k.bad("add_cross_attention", "true: cross-attention is not built")
	}
	return s
}

// hfArchitecture is the architecture and model_type config.json gets for
// a shape's Arch.
func hfArchitecture(s model.Shape) (arch, modelType string) {
	switch s.ArchName() {
	case model.ArchLlama:
		return "LlamaForCausalLM", "llama"
	case model.ArchQwen2:
		return "Qwen2ForCausalLM", "qwen2"
	}
	return "GPT2LMHeadModel", "gpt2"
}

// TorchDType is config.json's torch_dtype for dt: "float32" or "bfloat16".
func TorchDType(dt dtype.DType) string {
	if dt == dtype.BF16 {
		return "bfloat16"
	}
	return "float32"
}

// ConfigJSON returns the config.json of shape s with weights stored in
// dt: the architecture's keys as transformers writes them, sorted, indented
// by 2. base, when not nil, is a config.json (the model the run started
// from, see Source) whose other keys (token ids, generation settings,
// transformers_version) are kept, and whose architectures and model_type
// are kept when they read as the same Arch (MistralForCausalLM stays
// Mistral); the keys of the shape replace its own.
func ConfigJSON(s model.Shape, dt dtype.DType, base []byte) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	out := map[string]any{}
	keepArch := false
	if len(base) > 0 {
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(base, &raw); err != nil {
			return nil, fmt.Errorf("hf: the source's config.json is not a JSON object: %v", err)
		}
		for key, v := range raw {
			out[key] = v
		}
		if c, err := ParseConfig(ConfigName, base); err == nil && c.Shape.ArchName() == s.ArchName() {
			keepArch = true
		}
	}
	arch, modelType := hfArchitecture(s)
	if !keepArch {
		out["architectures"], out["model_type"] = []string{arch}, modelType
	}
	out["torch_dtype"] = TorchDType(dt)
	out["vocab_size"] = s.Vocab
	if !s.IsLlama() {
		ffn := any(nil) // transformers' n_inner null is 4·n_embd
		if s.FFNDim() != 4*s.Dim {
			ffn = s.FFNDim()
		}
		for key, v := range map[string]any{"n_embd": s.Dim, "n_layer": s.Layers, "n_head": s.Heads, "n_positions": s.MaxSeq,
			"n_ctx": s.MaxSeq, "n_inner": ffn, "layer_norm_epsilon": s.Eps(), "activation_function": "gelu_new",
			"tie_word_embeddings": true, "scale_attn_weights": true} {
			out[key] = v
		}
	} else {
		for key, v := range map[string]any{"hidden_size": s.Dim, "num_hidden_layers": s.Layers, "num_attention_heads": s.Heads,
			"num_key_value_heads": s.KVHeadCount(), "intermediate_size": s.FFNDim(), "max_position_embeddings": s.MaxSeq,
			"rope_theta": s.Theta(), "rms_norm_eps": s.Eps(), "tie_word_embeddings": s.TieEmbeddings, "hidden_act": "silu",
			"rope_scaling": nil, "head_dim": s.HeadDim(), "mlp_bias": false} {
			out[key] = v
		}
		if s.Arch == model.ArchLlama {
			out["attention_bias"] = false
		} else {
			out["use_sliding_window"] = false
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("hf: config.json: %w", err)
	}
	return append(b, '\n'), nil
}

// IsDir says whether path is a directory holding a Hugging Face
// config.json: one with "architectures" or "model_type" (a Strata run
// directory's config.json is a training config, with neither).
func IsDir(path string) bool {
	ok, _ := ProbeDir(path)
	return ok
}

// ProbeDir is IsDir, with the reason a config.json that path holds could
// not be read: not JSON (the error names file:line:col and what
// encoding/json found), not an object, unreadable. No config.json, or
// one of another kind (a training config), is false without an error.
func ProbeDir(path string) (bool, error) {
	file := filepath.Join(path, ConfigName)
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("hf: %w", err)
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil {
		return false, jsonError(file, b, err)
	}
	_, a := probe["architectures"]
	_, m := probe["model_type"]
	return a || m, nil
}

// jsonError is encoding/json's error for file (its bytes b): a syntax
// error at file:line:col, anything else (valid JSON that is not an
// object) as "is not a JSON object".
func jsonError(file string, b []byte, err error) error {
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		return fmt.Errorf("hf: %s is not a JSON object: %v", file, err)
	}
	off := int(se.Offset) - 1 // the byte that was refused
	if se.Error() == "unexpected end of JSON input" {
		off = len(bytes.TrimRight(b, " \t\r\n"))
	}
	off = max(0, min(off, len(b)))
	line := 1 + bytes.Count(b[:off], []byte{'\n'})
	col := 1 + utf8.RuneCount(b[bytes.LastIndexByte(b[:off], '\n')+1:off])
	return fmt.Errorf("hf: %s:%d:%d: invalid JSON: %v", file, line, col, err)
}
