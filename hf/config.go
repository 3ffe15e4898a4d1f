package hf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/strata-ai/strata/dtype"
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
	"LlamaForCausalLM":    model.ArchLlama,
	"MistralForCausalLM":  model.ArchLlama,
	"Qwen2ForCausalLM":    model.ArchQwen2,
	"Qwen3ForCausalLM":    model.ArchQwen3,
	"Phi3ForCausalLM":     model.ArchPhi3,
	"Gemma2ForCausalLM":   model.ArchGemma2,
	"Gemma3ForCausalLM":   model.ArchGemma3,
	"MixtralForCausalLM":  model.ArchMixtral,
	"Qwen3MoeForCausalLM": model.ArchQwen3MoE,
	"GPT2LMHeadModel":     model.ArchGPT2,
	"llama":               model.ArchLlama,
	"mistral":             model.ArchLlama,
	"qwen2":               model.ArchQwen2,
	"qwen3":               model.ArchQwen3,
	"phi3":                model.ArchPhi3,
	"gemma2":              model.ArchGemma2,
	"gemma3_text":         model.ArchGemma3,
	"mixtral":             model.ArchMixtral,
	"qwen3_moe":           model.ArchQwen3MoE,
	"gpt2":                model.ArchGPT2,
}

// unbuiltMoE names what is not built of the mixtures of experts Strata
// does not read, for their one error.
var unbuiltMoE = map[string]string{
	"Qwen2MoeForCausalLM":   "Qwen2-MoE's shared expert (shared_expert_intermediate_size, its sigmoid gate) is not built",
	"qwen2_moe":             "Qwen2-MoE's shared expert (shared_expert_intermediate_size, its sigmoid gate) is not built",
	"DeepseekV2ForCausalLM": "DeepSeek's shared experts (n_shared_experts) and group-limited routing (topk_group) are not built",
	"DeepseekV3ForCausalLM": "DeepSeek's shared experts (n_shared_experts) and its sigmoid, bias-corrected group router are not built",
	"deepseek_v2":           "DeepSeek's shared experts (n_shared_experts) and group-limited routing (topk_group) are not built",
	"deepseek_v3":           "DeepSeek's shared experts (n_shared_experts) and its sigmoid, bias-corrected group router are not built",
	"GptOssForCausalLM":     "gpt-oss's router (biased top-k, softmax after it) and clamped SwiGLU experts with biases are not built",
	"gpt_oss":               "gpt-oss's router (biased top-k, softmax after it) and clamped SwiGLU experts with biases are not built",
	"PhimoeForCausalLM":     "Phi-MoE's sparsemixer router is not built",
	"phimoe":                "Phi-MoE's sparsemixer router is not built",
	"OlmoeForCausalLM":      "OLMoE's full-width q/k norms are not built",
	"olmoe":                 "OLMoE's full-width q/k norms are not built",
	"DbrxForCausalLM":       "DBRX's fused experts and clipped attention are not built",
	"JambaForCausalLM":      "Jamba's Mamba layers are not built",
	"Llama4ForCausalLM":     "Llama 4's shared expert and sigmoid top-1 router are not built",
	"Qwen3NextForCausalLM":  "Qwen3-Next's shared expert and linear-attention layers are not built",
}

// readArchs lists the architectures ParseConfig reads, for its error.
const readArchs = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM (gemma3_text), MixtralForCausalLM, Qwen3MoeForCausalLM and GPT2LMHeadModel"

// Config is what Strata reads of a Hugging Face config.json.
type Config struct {
	Shape        model.Shape
	Architecture string // architectures[0] ("LlamaForCausalLM"), else model_type
	TorchDType   string // torch_dtype as written ("bfloat16"); "" when absent
	// EOS are the ids of eos_token_id (one id or a list), the tokens that
	// end a generation as transformers' generate stops at them; nil when
	// absent or null.
	EOS []int32
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
	"sliding_window": true, "rope_scaling": true, "rope_parameters": true, "torch_dtype": true, "architectures": true, "model_type": true,
	"attn_logit_softcapping": true, "final_logit_softcapping": true, "layer_types": true, "sliding_window_pattern": true,
	"original_max_position_embeddings": true, "partial_rotary_factor": true, "max_window_layers": true, "query_pre_attn_scalar": true}

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

// ParseConfig reads a Hugging Face config.json (b, read from path) of
// one of the architectures hfArchs lists into a shape, with the keys of
// each family (llamaConfig: head_dim, rope scaling, partial rotary,
// sliding windows, Gemma's scale and soft caps). What Strata does not
// compute is refused, every problem listed in one error naming the file
// and each key: an unknown rope_type or a rope key its type does not
// read, hidden_act other than silu (Gemma's other than gelu_pytorch_tanh,
// GPT-2's activation_function other than gelu_new), biases a family does
// not have (attention_bias, mlp_bias), a layer type other than sliding and
// full attention, GPT-2 without scaled attention or with an untied head,
// and an unknown architecture.
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
	if why, moe := unbuiltMoE[c.Architecture]; moe {
		return nil, fmt.Errorf("hf: %s: %s is a mixture of experts Strata does not build: %s (Strata reads Mixtral's and Qwen3-MoE's)", path, c.Architecture, why)
	}
	if !ok || len(archs) > 1 {
		return nil, fmt.Errorf("hf: %s: \"architectures\" %s: Strata reads %s",
			path, orString(k.raw["architectures"], c.Architecture), readArchs)
	}
	if arch == model.ArchGPT2 {
		c.Shape = gpt2Config(k)
	} else {
		c.Shape = llamaConfig(k, arch, c)
	}
	c.EOS = k.ids("eos_token_id")
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

// ids reads key as one token id or a list of them (eos_token_id); nil
// when absent or null.
func (k *hfKeys) ids(key string) []int32 {
	if k.null(key) {
		return nil
	}
	var one int32
	if json.Unmarshal(k.raw[key], &one) == nil {
		return []int32{one}
	}
	var list []int32
	if err := json.Unmarshal(k.raw[key], &list); err != nil {
		k.bad(key, "%s is neither a token id nor a list of them", k.raw[key])
		return nil
	}
	return list
}

func orString(raw json.RawMessage, s string) string {
	if len(raw) > 0 {
		return string(raw)
	}
	return fmt.Sprintf("(none; model_type %q)", s)
}

// llamaConfig reads the Llama family's members (LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM,
// Gemma2ForCausalLM, Gemma3ForCausalLM), with transformers' defaults for
// absent keys as each family's configuration class sets them.
func llamaConfig(k *hfKeys, arch string, c *Config) model.Shape {
	gemma := arch == model.ArchGemma2 || arch == model.ArchGemma3
	s := model.Shape{Arch: arch,
		Dim:    k.int(0, true, "hidden_size"),
		Layers: k.int(0, true, "num_hidden_layers"),
		Heads:  k.int(0, true, "num_attention_heads"),
		FFN:    k.int(0, true, "intermediate_size"),
		Vocab:  k.int(0, true, "vocab_size"),
		MaxSeq: k.int(0, true, "max_position_embeddings"),
	}
	s.KVHeads = k.int(s.Heads, false, "num_key_value_heads")
	s.NormEps = k.float("rms_norm_eps", 1e-6)
	s.TieEmbeddings = k.bool("tie_word_embeddings", gemma)
	defHead := 0
	switch {
	case gemma:
		defHead = 256 // Gemma2Config's and Gemma3TextConfig's head_dim
	case arch == model.ArchQwen3:
		defHead = 128 // Qwen3Config's
	}
	if arch != model.ArchPhi3 { // Phi3Config has no head_dim: its heads are hidden_size / num_attention_heads
		if hd := k.int(defHead, false, "head_dim"); hd != 0 && (s.Heads == 0 || hd*s.Heads != s.Dim) {
			s.HeadDimension = hd
		}
	}
	act, actKey := k.str("hidden_act", "silu"), "hidden_act"
	if gemma {
		act, actKey = k.str("hidden_activation", k.str("hidden_act", "gelu_pytorch_tanh")), "hidden_activation"
		if act != "gelu_pytorch_tanh" {
			k.bad(actKey, "%q: Gemma's MLP is built with gelu_pytorch_tanh (GeGLU) only", act)
		}
	} else if act != "silu" {
		k.bad(actKey, "%q: the Llama family's MLP is built with silu (SwiGLU) only", act)
	}
	if arch != model.ArchQwen2 && k.bool("attention_bias", false) {
		k.bad("attention_bias", "true: biases on q, k, v and o are not built for %s (Qwen2's q, k, v biases are)", c.Architecture)
	}
	if k.bool("mlp_bias", false) {
		k.bad("mlp_bias", "true: MLP biases are not built")
	}
	s.RopeTheta = k.float("rope_theta", 10000)
	ropeConfig(k, &s)
	if f, ok := k.number("partial_rotary_factor", "a number in (0, 1]"); ok {
		if !(f > 0 && f <= 1) {
			k.bad("partial_rotary_factor", "%v must be in (0, 1]", f)
		} else if f != 1 {
			s.RotaryFraction = f
		}
	}
	windowConfig(k, &s, arch, c.Architecture == "MistralForCausalLM" || c.Architecture == "mistral")
	moeConfig(k, &s)
	if gemma {
		s.QueryScale = k.float("query_pre_attn_scalar", 256)
		if s.QueryScale == float64(s.HeadDim()) {
			s.QueryScale = 0
		}
		capDef := 0.0
		if arch == model.ArchGemma2 {
			capDef = 50
		}
		s.AttnSoftCap = k.float("attn_logit_softcapping", capDef)
		if arch == model.ArchGemma2 {
			capDef = 30
		}
		s.FinalSoftCap = k.float("final_logit_softcapping", capDef)
		if arch == model.ArchGemma3 {
			s.RopeLocalTheta = k.float("rope_local_base_freq", 10000)
		}
	} else {
		for _, key := range []string{"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar", "rope_local_base_freq"} {
			if !k.null(key) {
				k.bad(key, "%s: only Gemma's attention has it", k.raw[key])
			}
		}
	}
	return s
}

// ropeConfig reads rope_scaling (or transformers 5's rope_parameters,
// which also carries rope_theta) and Phi-3's top-level
// original_max_position_embeddings into s.Rope: every key of the types
// modeling_rope_utils computes; an unknown type or key is a problem.
func ropeConfig(k *hfKeys, s *model.Shape) {
	key := "rope_scaling"
	if k.null(key) && !k.null("rope_parameters") {
		key = "rope_parameters"
	}
	if k.null(key) {
		return
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(k.raw[key], &raw); err != nil {
		k.bad(key, "%s is not a JSON object", k.raw[key])
		return
	}
	sub := &hfKeys{raw: raw}
	rs := model.RopeScaling{Type: sub.str("rope_type", sub.str("type", model.RopeDefault))}
	if _, ok := raw["rope_theta"]; ok {
		s.RopeTheta = sub.float("rope_theta", s.RopeTheta)
	}
	known := map[string]bool{"rope_type": true, "type": true, "rope_theta": true}
	num := func(name string, dst *float64) {
		known[name] = true
		if f, ok := sub.number(name, "a number"); ok {
			*dst = f
		}
	}
	switch rs.Type {
	case model.RopeDefault:
		rs.Type = ""
	case model.RopeLinear:
		num("factor", &rs.Factor)
	case model.RopeDynamic:
		num("factor", &rs.Factor)
		known["original_max_position_embeddings"] = true // listed by transformers, not read by its dynamic type
	case model.RopeLlama3:
		num("factor", &rs.Factor)
		num("low_freq_factor", &rs.LowFreqFactor)
		num("high_freq_factor", &rs.HighFreqFactor)
	case model.RopeYaRN:
		num("factor", &rs.Factor)
		num("attention_factor", &rs.AttentionFactor)
		num("beta_fast", &rs.BetaFast)
		num("beta_slow", &rs.BetaSlow)
		num("mscale", &rs.Mscale)
		num("mscale_all_dim", &rs.MscaleAllDim)
		known["truncate"] = true
		rs.NoTruncate = !sub.bool("truncate", true)
	case model.RopeLongRoPE:
		num("factor", &rs.Factor)
		num("attention_factor", &rs.AttentionFactor)
		for _, name := range []string{"short_factor", "long_factor"} {
			known[name] = true
			var f []float64
			if err := json.Unmarshal(raw[name], &f); err != nil || len(f) == 0 {
				k.bad(key, "%q: %s is not a list of numbers", name, raw[name])
				continue
			}
			if name == "short_factor" {
				rs.ShortFactor = model.FormatFactors(f)
			} else {
				rs.LongFactor = model.FormatFactors(f)
			}
		}
	default:
		k.bad(key, "rope_type %q is not built (default, linear, dynamic, yarn, llama3 and longrope are)", rs.Type)
		return
	}
	if rs.Type == model.RopeLlama3 || rs.Type == model.RopeYaRN || rs.Type == model.RopeLongRoPE {
		known["original_max_position_embeddings"] = true
		if f, ok := sub.number("original_max_position_embeddings", "a whole number"); ok {
			rs.OriginalMax = int(f)
		}
	}
	if rs.Type == model.RopeLongRoPE && !k.null("original_max_position_embeddings") {
		rs.OriginalMax = k.int(0, false, "original_max_position_embeddings") // Phi-3 keeps it at the top level
	}
	for _, name := range slices.Sorted(maps.Keys(raw)) { // sorted: one input, one message
		if !known[name] {
			k.bad(key, "%q: %s: not read for rope_type %q (Strata would compute the frequencies without it)", name, raw[name], orDefault(rs.Type))
		}
	}
	for _, p := range sub.problems {
		k.problems = append(k.problems, key+": "+p)
	}
	s.Rope = rs
}

func orDefault(t string) string {
	if t == "" {
		return model.RopeDefault
	}
	return t
}

// windowConfig reads the sliding-window keys of each family into s:
// Mistral's and Phi-3's sliding_window (every layer), Qwen2's and Qwen3's
// use_sliding_window with max_window_layers (the layers from it on),
// Gemma 2's alternating layers, Gemma 3's sliding_window_pattern, or an
// explicit layer_types list.
func windowConfig(k *hfKeys, s *model.Shape, arch string, mistral bool) {
	def := 0
	if arch != model.ArchLlama && arch != model.ArchPhi3 && arch != model.ArchMixtral || mistral {
		def = 4096 // MistralConfig's, Qwen2Config's, Qwen3Config's, Qwen3MoeConfig's, Gemma2Config's and Gemma3TextConfig's
	}
	w := def
	if _, present := k.raw["sliding_window"]; present {
		w = k.int(0, false, "sliding_window") // null: none
	}
	if (arch == model.ArchQwen2 || arch == model.ArchQwen3 || arch == model.ArchQwen3MoE) && !k.bool("use_sliding_window", false) {
		w = 0
	}
	if w == 0 {
		return
	}
	s.SlidingWindow = w
	types := make([]byte, s.Layers)
	switch arch {
	case model.ArchQwen2, model.ArchQwen3, model.ArchQwen3MoE:
		from := k.int(28, false, "max_window_layers") // Qwen2Config's and Qwen3Config's default
		for i := range types {
			types[i] = "fs"[b2i(i >= from)]
		}
	case model.ArchGemma2:
		for i := range types {
			types[i] = "fs"[b2i((i+1)%2 != 0)]
		}
	case model.ArchGemma3:
		p := k.int(6, false, "sliding_window_pattern")
		for i := range types {
			types[i] = "fs"[b2i((i+1)%p != 0)]
		}
	default:
		for i := range types {
			types[i] = 's'
		}
	}
	if !k.null("layer_types") {
		var lt []string
		if err := json.Unmarshal(k.raw["layer_types"], &lt); err != nil || len(lt) != s.Layers {
			k.bad("layer_types", "%s is not a list of %d layer types", k.raw["layer_types"], s.Layers)
			return
		}
		for i, t := range lt {
			switch t {
			case "sliding_attention":
				types[i] = 's'
			case "full_attention":
				types[i] = 'f'
			default:
				k.bad("layer_types", "%q: not built (sliding_attention and full_attention are)", t)
				return
			}
		}
	}
	if !strings.Contains(string(types), "s") {
		s.SlidingWindow = 0
		return
	}
	if strings.Contains(string(types), "f") {
		s.LayerTypes = string(types)
	}
}

// moeConfig reads a mixture of experts' keys (MixtralConfig's and
// Qwen3MoeConfig's, with their defaults): the experts, the top k, the
// experts' width and renormalisation, which layers are sparse
// (decoder_sparse_step, mlp_only_layers) and the router loss; Mixtral's
// router_jitter_noise is refused.
func moeConfig(k *hfKeys, s *model.Shape) {
	switch s.Arch {
	case model.ArchMixtral:
		s.Experts = k.int(8, false, "num_local_experts")
		s.TopK = k.int(2, false, "num_experts_per_tok")
		s.NormTopK = true
		if j, ok := k.number("router_jitter_noise", "a number"); ok && j != 0 {
			k.bad("router_jitter_noise", "%v: the router's input noise in training is not built", j)
		}
	case model.ArchQwen3MoE:
		s.Experts = k.int(128, false, "num_experts")
		s.TopK = k.int(8, false, "num_experts_per_tok")
		s.ExpertFFN = k.int(768, false, "moe_intermediate_size")
		s.NormTopK = k.bool("norm_topk_prob", false)
		step := k.int(1, false, "decoder_sparse_step")
		if step < 1 {
			k.bad("decoder_sparse_step", "%d must be >= 1", step)
			return
		}
		var only []int
		if !k.null("mlp_only_layers") {
			if err := json.Unmarshal(k.raw["mlp_only_layers"], &only); err != nil {
				k.bad("mlp_only_layers", "%s is not a list of layer indices", k.raw["mlp_only_layers"])
				return
			}
		}
		layers := []byte(strings.Repeat("e", max(s.Layers, 0)))
		for l := range layers {
			if (l+1)%step != 0 {
				layers[l] = 'd'
			}
		}
		for _, l := range only {
			if l < 0 || l >= len(layers) {
				k.bad("mlp_only_layers", "layer %d is not one of the %d layers", l, len(layers))
				return
			}
			layers[l] = 'd'
		}
		if !strings.Contains(string(layers), "e") {
			k.bad("mlp_only_layers", "no layer is sparse (decoder_sparse_step %d, mlp_only_layers %v): read it as Qwen3ForCausalLM", step, only)
			return
		}
		if strings.Contains(string(layers), "d") {
			s.MLPLayers = string(layers)
		}
	default:
		return
	}
	s.RouterAux = k.bool("output_router_logits", false)
	s.RouterAuxCoef = 0.001
	if f, ok := k.number("router_aux_loss_coef", "a number >= 0"); ok {
		if !(f >= 0) {
			k.bad("router_aux_loss_coef", "%v must be >= 0", f)
		}
		s.RouterAuxCoef = f
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
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
		if s.SlidingWindow > 0 && s.LayerTypes == "" { // Llama has no window; Mistral is Llama with one
			return "MistralForCausalLM", "mistral"
		}
		return "LlamaForCausalLM", "llama"
	case model.ArchQwen2:
		return "Qwen2ForCausalLM", "qwen2"
	case model.ArchQwen3:
		return "Qwen3ForCausalLM", "qwen3"
	case model.ArchPhi3:
		return "Phi3ForCausalLM", "phi3"
	case model.ArchGemma2:
		return "Gemma2ForCausalLM", "gemma2"
	case model.ArchGemma3:
		return "Gemma3ForCausalLM", "gemma3_text"
	case model.ArchMixtral:
		return "MixtralForCausalLM", "mixtral"
	case model.ArchQwen3MoE:
		return "Qwen3MoeForCausalLM", "qwen3_moe"
	}
	return "GPT2LMHeadModel", "gpt2"
}

// ropeJSON is rope_scaling as transformers writes it for s (nil: none).
func ropeJSON(s model.Shape) any {
	rs := s.Rope
	if rs.Type == "" {
		return nil
	}
	out := map[string]any{"rope_type": rs.Type}
	put := func(key string, v float64) {
		if v != 0 {
			out[key] = v
		}
	}
	put("factor", rs.Factor)
	put("low_freq_factor", rs.LowFreqFactor)
	put("high_freq_factor", rs.HighFreqFactor)
	put("attention_factor", rs.AttentionFactor)
	put("beta_fast", rs.BetaFast)
	put("beta_slow", rs.BetaSlow)
	put("mscale", rs.Mscale)
	put("mscale_all_dim", rs.MscaleAllDim)
	if rs.NoTruncate {
		out["truncate"] = false
	}
	if rs.OriginalMax != 0 && rs.Type != model.RopeLongRoPE {
		out["original_max_position_embeddings"] = rs.OriginalMax
	}
	for key, f := range map[string]string{"short_factor": rs.ShortFactor, "long_factor": rs.LongFactor} {
		if f != "" {
			v, _ := model.ParseFactors(f)
			out[key] = v
		}
	}
	return out
}

// layerTypesJSON is layer_types as transformers writes it.
func layerTypesJSON(s model.Shape) []string {
	out := make([]string, s.Layers)
	for i := range out {
		out[i] = "full_attention"
		if s.Sliding(i) {
			out[i] = "sliding_attention"
		}
	}
	return out
}

// TorchDType is config.json's torch_dtype for dt: "float32" or "bfloat16".
func TorchDType(dt dtype.DType) string {
	switch dt {
	case dtype.BF16:
		return "bfloat16"
	case dtype.F16:
		return "float16"
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
	sameShape := false // the base describes s: its keys stay as written
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
			sameShape = sameShape || c.Shape.Canonical() == withoutName(s).Canonical()
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
	} else if !sameShape {
		for key, v := range map[string]any{"hidden_size": s.Dim, "num_hidden_layers": s.Layers, "num_attention_heads": s.Heads,
			"num_key_value_heads": s.KVHeadCount(), "intermediate_size": s.FFNDim(), "max_position_embeddings": s.MaxSeq,
			"rope_theta": s.Theta(), "rms_norm_eps": s.Eps(), "tie_word_embeddings": s.TieEmbeddings, "hidden_act": "silu",
			"rope_scaling": ropeJSON(s), "head_dim": s.HeadDim(), "mlp_bias": false} {
			out[key] = v
		}
		delete(out, "rope_parameters")
		if s.Arch == model.ArchPhi3 {
			delete(out, "head_dim")
		}
		if s.RotaryFraction != 0 {
			out["partial_rotary_factor"] = s.RotaryFraction
		}
		if s.Rope.Type == model.RopeLongRoPE && s.Rope.OriginalMax != 0 {
			out["original_max_position_embeddings"] = s.Rope.OriginalMax
		}
		moeJSON(s, out)
		switch s.Arch {
		case model.ArchQwen2, model.ArchQwen3, model.ArchQwen3MoE:
			out["use_sliding_window"] = s.SlidingWindow > 0
			out["sliding_window"] = nil
			if s.SlidingWindow > 0 {
				out["sliding_window"], out["layer_types"] = s.SlidingWindow, layerTypesJSON(s)
				delete(out, "max_window_layers")
			}
		case model.ArchGemma2, model.ArchGemma3:
			delete(out, "hidden_act")
			out["hidden_activation"] = "gelu_pytorch_tanh"
			out["query_pre_attn_scalar"] = float64(s.HeadDim())
			if s.QueryScale != 0 {
				out["query_pre_attn_scalar"] = s.QueryScale
			}
			caps := map[string]float64{"attn_logit_softcapping": s.AttnSoftCap, "final_logit_softcapping": s.FinalSoftCap}
			for key, v := range caps {
				out[key] = nil
				if v != 0 {
					out[key] = v
				}
			}
			out["sliding_window"], out["layer_types"] = s.SlidingWindow, layerTypesJSON(s)
			delete(out, "sliding_window_pattern")
			if s.Arch == model.ArchGemma3 {
				out["rope_local_base_freq"] = s.RopeLocalTheta
			}
		default:
			out["sliding_window"] = nil
			if s.SlidingWindow > 0 {
				out["sliding_window"] = s.SlidingWindow
				if s.LayerTypes != "" {
					out["layer_types"] = layerTypesJSON(s)
				}
			}
		}
		if s.Arch != model.ArchQwen2 {
			out["attention_bias"] = false
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("hf: config.json: %w", err)
	}
	return append(b, '\n'), nil
}

// moeJSON writes a mixture of experts' keys as its configuration class
// names them.
func moeJSON(s model.Shape, out map[string]any) {
	switch s.Arch {
	case model.ArchMixtral:
		out["num_local_experts"], out["router_jitter_noise"] = s.Experts, 0.0
	case model.ArchQwen3MoE:
		out["num_experts"], out["moe_intermediate_size"], out["norm_topk_prob"] = s.Experts, s.ExpertFFNDim(), s.NormTopK
		only := []int{}
		for l := range s.Layers {
			if !s.SparseLayer(l) {
				only = append(only, l)
			}
		}
		out["decoder_sparse_step"], out["mlp_only_layers"] = 1, only
	default:
		return
	}
	out["num_experts_per_tok"], out["output_router_logits"], out["router_aux_loss_coef"] = s.TopK, s.RouterAux, s.RouterAuxCoef
}

func withoutName(s model.Shape) model.Shape {
	s.Name = ""
	return s
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
