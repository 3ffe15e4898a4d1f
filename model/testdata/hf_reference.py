#!/usr/bin/env python3
"""An independent fp32/fp64 reference for the decoders people fine-tune, in PyTorch.

Usage:
  hf_reference.py [--fp64] MODEL_DIR BATCH_JSON OUT_SAFETENSORS
  hf_reference.py [--fp64] --greedy N [--cache] MODEL_DIR PROMPT_JSON OUT_JSON
  hf_reference.py [--fp64] --merge OUT_DIR MODEL_DIR
  hf_reference.py --selfcheck [FAMILY ...]

MODEL_DIR is a Hugging Face model directory: config.json and
model.safetensors (F32, BF16, F16 or F64 tensors under Hugging Face's
names; GPT-2's with or without the "transformer." prefix). Architectures:
GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM (model_type
gemma3_text), Phi3ForCausalLM. They are written here from transformers'
modeling code (the 4.5x releases: modeling_llama, _mistral, _qwen2, _qwen3,
_gemma2, _gemma3, _phi3, _gpt2, masking_utils, modeling_rope_utils), without
transformers.

Loss mode. BATCH_JSON holds "ids" and "targets" (rows of token ids; a
target of -1 is ignored) and optionally "pos" (each token's position within
its example: packed rows, positions restart at 0 and attention stays inside
an example). OUT_SAFETENSORS receives "logits" (rows, seq, vocab), "loss"
(1: the mean cross-entropy over the tokens with a target, natural log) and
"grad.NAME" for every tensor NAME of model.safetensors (the gradient of
that loss, in the tensor's own layout), all F32, or all F64 with --fp64.

Precision. Without --fp64 and without an adapter everything runs in fp32,
as transformers does for an fp32 model. With --fp64 (and, as before, with
a LoRA adapter) the parameters are read as float64 and every operation runs
in float64: the norms, softmax and rotary cos/sin that transformers upcasts
to fp32 stay in fp64 here (transformers itself would round them to fp32 in
an fp64 model). The one exception: rotary inverse frequencies are computed
in fp32 exactly as modeling_rope_utils computes them (including the fp32
tensor arithmetic of dynamic NTK's per-call base), then promoted; positions
times frequencies, cos and sin are then fp64. (With an adapter but without
--fp64, cos and sin are computed in fp32 and then widened, as transformers
computes them and as this script always has.) Outputs are F32 without
--fp64 (whatever ran inside) and F64 with it.

Greedy mode. PROMPT_JSON holds "ids" (one row). OUT_JSON receives
{"tokens": [...]}: N tokens, each the torch.argmax (first index of the
largest) of the last position's logits after final soft-capping. Without
--cache every step runs the whole sequence through the model (full
recomputation). A LoRA adapter in MODEL_DIR
applies (in fp64, without dropout). With --cache the prompt runs once and each new token then
runs alone against a key/value cache, as generate(use_cache=True) does: the
cache holds keys after rope (and after k_norm); a sliding layer's cache
keeps only its last sliding_window-1 keys before a step (what transformers'
sliding-window cache layer keeps); dynamic and longrope frequencies are
recomputed for each call from that call's largest position + 1, so cached
keys keep the rotation they were given (transformers does the same, which
is why cached and recomputed generation differ for dynamic NTK past
max_position_embeddings and for longrope once the length crosses
original_max_position_embeddings; they agree otherwise).

Merge mode. With a PEFT adapter in MODEL_DIR, OUT_DIR receives config.json
(copied) and model.safetensors: every base tensor under its own name, an
adapted module's weight replaced by W + scaling * (B @ A) (GPT-2's Conv1D
weights, stored in x out, by W + scaling * (B @ A)^T), computed in fp64 and
written F32, or F64 with --fp64. PEFT's merge_and_unload gives the same.

Self-check mode (FAMILY: make_tiny_hf.py's families, all by default) builds
each tiny model in fp64 and checks the transcription against itself, one
line a check, exiting non-zero on a failure: (a) autograd against central
differences (h 1e-6, three elements of every tensor, packed rows of 20
tokens: within 1e-6 of the tensor's largest gradient); (b) cached against
recomputed generation, logits teacher-forced on the same 24 tokens (within
1e-10, tokens equal), and for dynamic NTK and for longrope crossing
original_max_position_embeddings that they do differ (> 1e-6); (c) configs
with every feature off (Mistral without a window, Qwen2 with zero biases,
Phi-3 fused without longrope, rope_type default/linear 1/dynamic within
max_position_embeddings; yarn and llama3 at factor 1 within 1e-6) against
the Llama path; (d) a window of 20 or 25 over 20 tokens equal to no window,
bit for bit, and 19 not; Phi-3 with LoRA on its fused modules: gradients,
and the merge against the adapter (within 1e-12).

LoRA (PEFT's tuners/lora/layer.py). adapter_config.json: peft_type LORA,
r, lora_alpha, use_rslora; adapter_model.safetensors:
"base_model.model.MODULE.lora_A.weight" (r x in) and "...lora_B.weight"
(out x r). Every adapted linear computes y = x W^T (+ b) + scaling (x A^T)
B^T, scaling = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora). A
fused module (Phi-3's qkv_proj, gate_up_proj) carries one adapter over its
whole output, as PEFT puts it. Gradients of the adapter tensors are written
as "grad.NAME" under their PEFT names. With dropout_masks.safetensors
("base_model.model.MODULE.dropout", the (rows, seq, in) factor of each kept
input element, 0 for a dropped one) an adapter's input is multiplied by its
module's mask first. use_dora, rank_pattern, alpha_pattern, modules_to_save
and a bias other than "none" are refused.

config.json is read as transformers reads it: a missing key takes the
config class's default (Mistral: sliding_window 4096; Qwen3: head_dim 128;
Gemma 2/3: head_dim 256, query_pre_attn_scalar 256, tie_word_embeddings
true, Gemma 2's soft caps 50 and 30; Phi-3: original_max_position_embeddings
4096...; see DEFAULTS). A key this script does not know, set to anything
but null/false/0, and a known key with a value it does not implement, make
it exit non-zero naming the key. Dropout probabilities are read as inactive
(evaluation). A bias tensor present where the config has none, or missing
where it has one, is an error too.

Attention. Key j is visible to query i (indices within a row) when j <= i,
j is in i's example (packed rows), and, on a sliding layer with window W,
i - j < W (masking_utils: causal_mask_function and sliding_window_overlay).
Sliding layers: Mistral and Phi-3, every layer when sliding_window is not
null; Qwen2/Qwen3, layer l when use_sliding_window and l >= max_window_layers
(sliding_window is null otherwise); Gemma 2, even layers (0, 2, ...);
Gemma 3, layer l when (l+1) % sliding_window_pattern != 0 (pattern default
6); a "layer_types" list in config.json overrides all of these. Scores are
(q k^T) * scaling, scaling = head_dim^-0.5 (Gemma: query_pre_attn_scalar^-0.5),
then tanh(s / cap) * cap when attn_logit_softcapping is set, then the mask.

Rope (modeling_rope_utils, ROPE_INIT_FUNCTIONS and dynamic_rope_update).
rope_scaling, or transformers 5's rope_parameters (rope_theta may sit in
it; Gemma 3's may be keyed by layer type), with rope_type ("type" wins when
both are given, as LlamaConfig copies it): default; linear (inv_freq /
factor); dynamic (base * (factor * L / M - (factor - 1))^(d/(d-2)), M =
max_position_embeddings, L = the call's largest position + 1 when it grows
past the largest seen so far and M, reset to the original frequencies when a
call's L < M after growth); yarn (factor, attention_factor or 0.1 ln(factor)
+ 1, or the mscale / mscale_all_dim ratio, beta_fast 32, beta_slow 1,
original_max_position_embeddings, truncate); llama3 (factor, low_freq_factor,
high_freq_factor, original_max_position_embeddings); longrope (short_factor
when L <= original_max_position_embeddings, long_factor past it; attention
factor sqrt(1 + ln(s) / ln(original)), s = max_position_embeddings /
original_max_position_embeddings, or attention_factor). cos and sin are
multiplied by the attention factor. d = int(head_dim * partial_rotary_factor);
only the first d dims of each head rotate (Phi-3; any other family refuses
a partial_rotary_factor other than 1). Gemma 3's sliding layers use
rope_local_base_freq with default rope. Where transformers 4.5x and 5 read a
config differently (yarn's factor beside an original_max_position_embeddings
that disagrees with it; dynamic with an original_max_position_embeddings
other than max_position_embeddings) the script refuses the key.

Blocks. Llama/Mistral/Qwen2/Qwen3/Phi-3: x + attn(rms(x)), then + mlp(rms(x)),
RMSNorm w * x / sqrt(mean(x^2) + eps), mlp down(act(gate(x)) * up(x)) with
act silu. Qwen2 has q/k/v biases; Llama attention_bias (q, k, v, o) and
mlp_bias; Qwen3 attention_bias and q_norm/k_norm (RMSNorm over head_dim per
head, before rope). Phi-3 fuses qkv_proj (q rows, then k, then v) and
gate_up_proj (gate rows, then up). Gemma 2/3: embeddings times
sqrt(hidden_size) (a tensor of the compute dtype), RMSNorm x * (1 + w),
input, post_attention, pre_feedforward and post_feedforward norms
(x + post(attn(in(x))), then x + post_ff(mlp(pre_ff(x)))), GeGLU with
gelu's tanh approximation, Gemma 3's q_norm/k_norm, logits tanh(z / cap) * cap
when final_logit_softcapping is set. GPT-2: Conv1D weights (in x out),
gelu_new, learned positions, layer norms.
"""
import json
import math
import os
import shutil
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def fail(msg):
    sys.exit("hf_reference.py: " + msg)


# --- safetensors ---

def read_safetensors(path, dtype=torch.float32):
    """The tensors of a safetensors file as torch tensors of dtype."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        lo, hi = meta["data_offsets"]
        raw = data[base + lo:base + hi]
        if meta["dtype"] == "BF16":
            u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u16.view(np.float32)
        elif meta["dtype"] in DTYPES:
            arr = np.frombuffer(raw, dtype=np.dtype(DTYPES[meta["dtype"]]).newbyteorder("<"))
        else:
            fail("%s: %s has dtype %s" % (path, name, meta["dtype"]))
        out[name] = torch.from_numpy(arr.astype(np.float64).reshape(meta["shape"])).to(dtype)
    return out


def write_safetensors(path, tensors, dtype=torch.float32):
    """Writes tensors (name -> torch tensor) as F32 (or F64) safetensors."""
    st, np_type = ("F64", "<f8") if dtype == torch.float64 else ("F32", "<f4")
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        b = tensors[name].detach().to(dtype).contiguous().numpy().astype(np_type).tobytes()
        header[name] = {"dtype": st, "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# --- PEFT LoRA (peft's tuners/lora/layer.py, Linear.forward) ---

LORA = {"adapters": {}, "scaling": 0.0, "masks": {}}


def lora_delta(h, module):
    """scaling * (h A^T) B^T for an adapted module (its full name), else 0."""
    a = LORA["adapters"].get("base_model.model." + module + ".lora_A.weight")
    if a is None:
        return 0.0
    b = LORA["adapters"]["base_model.model." + module + ".lora_B.weight"]
    mask = LORA["masks"].get("base_model.model." + module + ".dropout")
    if mask is not None:
        h = h * mask.view(h.shape)
    return LORA["scaling"] * ((h @ a.t()) @ b.t())


def read_adapter(model_dir, dtype):
    """Reads MODEL_DIR's PEFT adapter into LORA; returns whether there is one."""
    path = os.path.join(model_dir, "adapter_config.json")
    if not os.path.exists(path):
        return False
    with open(path) as f:
        acfg = json.load(f)
    if acfg.get("peft_type") != "LORA":
        fail("adapter peft_type %r is not LORA" % acfg.get("peft_type"))
    for key in ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save", "lora_bias"):
        if acfg.get(key):
            fail("adapter_config.json: %s %r is not implemented" % (key, acfg[key]))
    if acfg.get("bias", "none") != "none":
        fail("adapter_config.json: bias %r is not implemented" % acfg["bias"])
    r, alpha = acfg["r"], acfg["lora_alpha"]
    LORA["scaling"] = alpha / math.sqrt(r) if acfg.get("use_rslora") else alpha / r
    LORA["adapters"] = read_safetensors(os.path.join(model_dir, "adapter_model.safetensors"), dtype)
    for name in LORA["adapters"]:
        if not (name.startswith("base_model.model.") and name.endswith((".lora_A.weight", ".lora_B.weight"))):
            fail("adapter tensor %s is not a LoRA A or B weight" % name)
    masks = os.path.join(model_dir, "dropout_masks.safetensors")
    if os.path.exists(masks):
        LORA["masks"] = read_safetensors(masks, dtype)
    return True


# --- config.json, read as transformers' configuration classes read it ---

ROPE_KEYS = {"rope_theta": 10000.0, "rope_scaling": None, "max_position_embeddings": 2048}
DEFAULTS = {
    "llama": dict(ROPE_KEYS, num_key_value_heads=None, hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False,
                  attention_bias=False, mlp_bias=False, head_dim=None),
    "mistral": dict(ROPE_KEYS, num_key_value_heads=8, hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False,
                    sliding_window=4096, head_dim=None, max_position_embeddings=4096 * 32),
    "qwen2": dict(ROPE_KEYS, num_key_value_heads=32, hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False,
                  use_sliding_window=False, sliding_window=4096, max_window_layers=28, layer_types=None,
                  head_dim=None, max_position_embeddings=32768),
    "qwen3": dict(ROPE_KEYS, num_key_value_heads=32, hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False,
                  use_sliding_window=False, sliding_window=4096, max_window_layers=28, layer_types=None,
                  head_dim=128, attention_bias=False, max_position_embeddings=32768),
    "gemma2": dict(ROPE_KEYS, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                   hidden_act="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
                   query_pre_attn_scalar=256, sliding_window=4096, layer_types=None, final_logit_softcapping=30.0,
                   attn_logit_softcapping=50.0, max_position_embeddings=8192),
    "gemma3_text": dict(ROPE_KEYS, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                        hidden_act="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
                        attention_bias=False, query_pre_attn_scalar=256, sliding_window=4096, layer_types=None,
                        final_logit_softcapping=None, attn_logit_softcapping=None, rope_theta=1000000.0,
                        rope_local_base_freq=10000.0, sliding_window_pattern=6, use_bidirectional_attention=False,
                        max_position_embeddings=131072),
    "phi3": dict(ROPE_KEYS, num_key_value_heads=None, hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=False,
                 original_max_position_embeddings=4096, partial_rotary_factor=1.0, sliding_window=None,
                 max_position_embeddings=4096),
    # modeling_mixtral / modeling_qwen3_moe's configuration classes (4.5x): the
    # mixtures of experts.
    "mixtral": dict(ROPE_KEYS, num_key_value_heads=8, hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=False,
                    sliding_window=None, head_dim=None, max_position_embeddings=4096 * 32, rope_theta=1e6,
                    num_experts_per_tok=2, num_local_experts=8, output_router_logits=False, router_aux_loss_coef=0.001,
                    router_jitter_noise=0.0),
    "qwen3_moe": dict(ROPE_KEYS, num_key_value_heads=4, hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False,
                      use_sliding_window=False, sliding_window=4096, max_window_layers=28, head_dim=None,
                      attention_bias=False, max_position_embeddings=32768, decoder_sparse_step=1,
                      moe_intermediate_size=768, num_experts_per_tok=8, num_experts=128, norm_topk_prob=False,
                      output_router_logits=False, router_aux_loss_coef=0.001, mlp_only_layers=None),
    "gpt2": dict(n_inner=None, layer_norm_epsilon=1e-5, activation_function="gelu_new", scale_attn_weights=True,
                 scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False, tie_word_embeddings=True,
                 n_positions=1024, n_ctx=None, add_cross_attention=False),
}
FAMILY = {
    "GPT2LMHeadModel": "gpt2", "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text", "Phi3ForCausalLM": "phi3",
    "MixtralForCausalLM": "mixtral", "Qwen3MoeForCausalLM": "qwen3_moe",
}
REQUIRED = {
    "gpt2": ("n_embd", "n_layer", "n_head", "vocab_size"),
}
REQUIRED_DECODER = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
# Keys with no effect on the forward pass (ids, bookkeeping, dropout read as inactive).
INERT = {
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "bos_token_id", "eos_token_id",
    "pad_token_id", "use_cache", "initializer_range", "attention_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
    "_name_or_path", "tokenizer_class", "task_specific_params", "pretraining_tp", "cache_implementation",
    "output_attentions", "output_hidden_states", "return_dict", "is_decoder", "sep_token_id", "decoder_start_token_id",
    "id2label", "label2id", "_attn_implementation", "attn_implementation", "final_logit_softcapping_", "auto_map",
}


class Config:
    """A config.json with its class's defaults; get() of an unknown key fails."""

    def __init__(self, raw, family):
        self.raw, self.family = raw, family
        self.defaults = DEFAULTS[family]
        for key, value in raw.items():
            if key in self.defaults or key in INERT or key in REQUIRED.get(family, REQUIRED_DECODER):
                continue
            if key in ("rope_parameters", "partial_rotary_factor", "original_max_position_embeddings",
                       "rope_local_base_freq", "sliding_window_pattern", "layer_types") and family != "gpt2":
                continue  # read (and checked) where the family reads them
            if value in (None, False, 0):
                continue  # cannot switch anything on
            fail("config.json: %r = %r is not implemented for model_type %s" % (key, value, family))
        for key in REQUIRED.get(family, REQUIRED_DECODER):
            if key not in raw:
                fail("config.json: %r is missing" % key)

    def __contains__(self, key):
        return key in self.raw

    def get(self, key):
        if key in self.raw:
            return self.raw[key]
        if key in self.defaults:
            return self.defaults[key]
        if key in REQUIRED_DECODER or key in REQUIRED.get(self.family, ()):
            fail("config.json: %r is missing" % key)
        return None

    def has_attr(self, key):
        """hasattr(config, key) on transformers' config object."""
        return key in self.raw or key in self.defaults


# --- rotary embeddings (modeling_rope_utils) ---

def rope_settings(cfg, layer_type):
    """(rope_type, theta, params) for the layers of layer_type."""
    fam = cfg.family
    theta = cfg.get("rope_theta")
    params = cfg.get("rope_scaling")
    if "rope_parameters" in cfg and cfg.get("rope_parameters") is not None:
        if cfg.raw.get("rope_scaling") is not None:
            fail("config.json: both rope_scaling and rope_parameters are set")
        params = dict(cfg.get("rope_parameters"))
        if set(params) <= {"full_attention", "sliding_attention"}:
            params = params.get(layer_type) or {"rope_type": "default"}
            params = dict(params)
        theta = params.pop("rope_theta", theta)
    if fam == "gemma3_text" and layer_type == "sliding_attention" and "rope_parameters" not in cfg:
        theta, params = cfg.get("rope_local_base_freq"), {"rope_type": "default"}
    if params is None:
        return "default", theta, {}
    if not isinstance(params, dict):
        fail("config.json: rope_scaling %r is not an object" % (params,))
    params = dict(params)
    rope_type = params.pop("type", None) or params.pop("rope_type", "default")
    params.pop("rope_type", None)
    if fam == "phi3":
        if rope_type in ("su", "yarn"):  # Phi3Config._rope_scaling_adjustment
            rope_type = "longrope"
        if rope_type not in ("longrope", "default"):
            fail("config.json: rope_scaling type %r: Phi-3 takes longrope only" % rope_type)
    return rope_type, theta, params


ROPE_PARAM_KEYS = {
    "default": set(), "linear": {"factor"}, "dynamic": {"factor", "original_max_position_embeddings"},
    "yarn": {"factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
             "original_max_position_embeddings", "truncate"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "longrope": {"short_factor", "long_factor", "factor", "attention_factor", "original_max_position_embeddings"},
}


class Rope:
    """One rotary embedding module (LlamaRotaryEmbedding with dynamic_rope_update).

    State, as transformers keeps it: inv_freq, max_seq_len_cached (dynamic)."""

    def __init__(self, cfg, layer_type, head_dim):
        self.rope_type, self.theta, self.p = rope_settings(cfg, layer_type)
        if self.rope_type not in ROPE_PARAM_KEYS:
            fail("config.json: rope_type %r is not implemented" % self.rope_type)
        for key in self.p:
            if key not in ROPE_PARAM_KEYS[self.rope_type]:
                fail("config.json: rope_scaling.%s is not implemented for rope_type %s" % (key, self.rope_type))
        prf = cfg.get("partial_rotary_factor") if cfg.has_attr("partial_rotary_factor") else 1.0
        if prf is None:
            prf = 1.0
        if cfg.family != "phi3" and prf != 1.0:
            fail("config.json: partial_rotary_factor %r: only Phi-3 rotates part of a head" % prf)
        self.dim = int(head_dim * prf)
        self.max_pos = cfg.get("max_position_embeddings")
        self.cfg = cfg
        if self.rope_type == "dynamic":
            omp = self.p.get("original_max_position_embeddings")
            if omp is not None and omp != self.max_pos:
                fail("config.json: rope_scaling.original_max_position_embeddings %r differs from max_position_embeddings %r:"
                     " transformers 4.5x and 5 read dynamic rope differently" % (omp, self.max_pos))
        self.inv_freq, self.attention_scaling = self.compute(None)
        self.original_inv_freq = self.inv_freq
        self.max_seq_len_cached = self.original_max_seq_len = self.max_pos

    def base_inv_freq(self, base):
        """1 / base^(arange(0, d, 2) / d) in fp32, base a float or an fp32 tensor."""
        return 1.0 / (base ** (torch.arange(0, self.dim, 2, dtype=torch.int64).float() / self.dim))

    def compute(self, seq_len):
        """(inv_freq fp32, attention_factor): ROPE_INIT_FUNCTIONS[rope_type](config, seq_len)."""
        t, p, d = self.rope_type, self.p, self.dim
        if t == "default":
            return self.base_inv_freq(self.theta), 1.0
        if t == "linear":
            return self.base_inv_freq(self.theta) / p["factor"], 1.0
        if t == "dynamic":
            m, factor = self.max_pos, p["factor"]
            if seq_len is None or not seq_len > m:
                base = self.theta * ((factor * m / m) - (factor - 1)) ** (d / (d - 2))
            else:  # seq_len is torch.max(position_ids) + 1, an int64 tensor: fp32 arithmetic
                base = self.theta * ((factor * torch.tensor(seq_len) / m) - (factor - 1)) ** (d / (d - 2))
            return self.base_inv_freq(base), 1.0
        if t == "yarn":
            return self.yarn()
        if t == "llama3":
            inv = self.base_inv_freq(self.theta)
            factor, lo, hi = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
            old = p["original_max_position_embeddings"]
            low_wavelen, high_wavelen = old / lo, old / hi
            wavelen = 2 * math.pi / inv
            scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
            smooth = (old / wavelen - lo) / (hi - lo)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
            return torch.where(medium, smoothed, scaled), 1.0
        if t == "longrope":
            orig = self.longrope_original()
            factor, attn = p.get("factor"), p.get("attention_factor")
            if self.cfg.has_attr("original_max_position_embeddings"):
                factor = self.max_pos / orig
            if attn is None:
                attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
            for key in ("short_factor", "long_factor"):
                if len(p[key]) != d // 2:
                    fail("config.json: rope_scaling.%s has %d entries, want %d" % (key, len(p[key]), d // 2))
            ext = torch.tensor(p["long_factor"] if seq_len and seq_len > orig else p["short_factor"], dtype=torch.float32)
            shape = torch.arange(0, d, 2, dtype=torch.int64).float() / d
            return 1.0 / (ext * self.theta ** shape), attn
        raise AssertionError(t)

    def longrope_original(self):
        if self.cfg.has_attr("original_max_position_embeddings"):
            orig = self.cfg.get("original_max_position_embeddings")
            inner = self.p.get("original_max_position_embeddings")
            if inner is not None and inner != orig:
                fail("config.json: rope_scaling.original_max_position_embeddings %r differs from the top-level %r" % (inner, orig))
            return orig
        return self.max_pos

    def yarn(self):
        p, d, base = self.p, self.dim, self.theta
        factor = p["factor"]
        if "original_max_position_embeddings" in p:
            orig = p["original_max_position_embeddings"]
            if factor != self.max_pos / orig:
                fail("config.json: rope_scaling.factor %r differs from max_position_embeddings / original_max_position_embeddings"
                     " = %r: transformers 4.5x uses the ratio, 5 the factor" % (factor, self.max_pos / orig))
        else:
            orig = self.max_pos

        def mscale_of(scale, m=1):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attn = p.get("attention_factor")
        if attn is None:
            if p.get("mscale") and p.get("mscale_all_dim"):
                attn = float(mscale_of(factor, p["mscale"]) / mscale_of(factor, p["mscale_all_dim"]))
            else:
                attn = mscale_of(factor)
        beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

        def correction_dim(rotations):
            return (d * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if p.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        pos_freqs = base ** (torch.arange(0, d, 2).float() / d)
        extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
        extra_factor = 1 - ramp
        return interpolation * (1 - extra_factor) + extrapolation * extra_factor, attn

    def update(self, seq_len):
        """dynamic_rope_update: the frequencies for a call whose largest position is seq_len - 1."""
        if self.rope_type == "dynamic":
            if seq_len > self.max_seq_len_cached:
                self.inv_freq, self.attention_scaling = self.compute(seq_len)
                self.max_seq_len_cached = seq_len
            if seq_len < self.original_max_seq_len and self.max_seq_len_cached > self.original_max_seq_len:
                self.inv_freq = self.original_inv_freq
                self.max_seq_len_cached = self.original_max_seq_len
        elif self.rope_type == "longrope":
            orig = self.longrope_original()
            if seq_len > orig:
                self.inv_freq = self.compute(orig + 1)[0]
            else:
                self.inv_freq = self.original_inv_freq

    def cos_sin(self, pos, rope_dtype, dtype):
        """cos, sin (B, 1, T, dim) of dtype for positions pos (B, T), times the
        attention factor, computed in rope_dtype (transformers: fp32)."""
        self.update(int(pos.max()) + 1)
        freqs = pos.to(rope_dtype).unsqueeze(-1) * self.inv_freq.to(rope_dtype)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x, cos, sin):
    """Rotates the first cos.shape[-1] dims of each head (all of them but for Phi-3's partial rotary)."""
    d = cos.shape[-1]
    if d == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rot, rest = x[..., :d], x[..., d:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


# --- attention (masking_utils, eager_attention_forward) ---

def visible(q_idx, k_idx, q_start, window):
    """allowed[b, i, j]: key index k_idx[b, j] <= q_idx[b, i], not before the
    query's example start q_start[b, i], and q - k < window when window is set."""
    q, k = q_idx.unsqueeze(-1), k_idx.unsqueeze(-2)
    ok = (k <= q) & (k >= q_start.unsqueeze(-1))
    if window is not None:
        ok = ok & (q - k < window)
    return ok


def attend(q, k, v, allowed, scaling, softcap):
    """Softmax attention of q (B, H, Tq, D) over k, v (B, H, Tk, D)."""
    scores = (q @ k.transpose(-1, -2)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed.unsqueeze(1), float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=scores.dtype) @ v


def repeat_kv(x, n_rep):
    B, KV, T, D = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(B, KV, n_rep, T, D).reshape(B, KV * n_rep, T, D)


# --- GPT-2 (transformers' modeling_gpt2) ---

def gelu_new(x):  # also gelu_pytorch_tanh: F.gelu(approximate="tanh") computes this formula
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2:
    def __init__(self, cfg, p, dtype, rope_dtype=None):
        self.cfg, self.p, self.dtype = cfg, p, dtype
        if cfg.get("activation_function") not in ("gelu_new",):
            fail("config.json: activation_function %r is not implemented" % cfg.get("activation_function"))
        for key, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                          ("reorder_and_upcast_attn", False), ("add_cross_attention", False)):
            if bool(cfg.get(key)) != want:
                fail("config.json: %s %r is not implemented" % (key, cfg.get(key)))

    def forward(self, ids, pos, cache=None):
        if cache is not None:
            fail("--cache is not implemented for GPT-2")
        p, cfg = self.p, self.cfg
        B, T = ids.shape
        C, H = cfg.get("n_embd"), cfg.get("n_head")
        eps = cfg.get("layer_norm_epsilon")
        pre = "transformer." if "transformer.wte.weight" in p else ""
        w = lambda n: p[pre + n]
        x = w("wte.weight")[ids] + w("wpe.weight")[pos]
        idx = torch.arange(T).expand(B, T)
        allowed = visible(idx, idx, idx - pos, None)
        for l in range(cfg.get("n_layer")):
            b = "h.%d." % l
            h = F.layer_norm(x, (C,), w(b + "ln_1.weight"), w(b + "ln_1.bias"), eps)
            m = pre + b
            qkv = h @ w(b + "attn.c_attn.weight") + w(b + "attn.c_attn.bias") + lora_delta(h, m + "attn.c_attn")  # Conv1D
            q, k, v = qkv.split(C, dim=2)
            heads = lambda t: t.view(B, T, H, C // H).transpose(1, 2)
            a = attend(heads(q), heads(k), heads(v), allowed, (C // H) ** -0.5, None).transpose(1, 2).reshape(B, T, C)
            x = x + a @ w(b + "attn.c_proj.weight") + w(b + "attn.c_proj.bias") + lora_delta(a, m + "attn.c_proj")
            h = F.layer_norm(x, (C,), w(b + "ln_2.weight"), w(b + "ln_2.bias"), eps)
            h = gelu_new(h @ w(b + "mlp.c_fc.weight") + w(b + "mlp.c_fc.bias") + lora_delta(h, m + "mlp.c_fc"))
            x = x + h @ w(b + "mlp.c_proj.weight") + w(b + "mlp.c_proj.bias") + lora_delta(h, m + "mlp.c_proj")
        x = F.layer_norm(x, (C,), w("ln_f.weight"), w("ln_f.bias"), eps)
        head = p["lm_head.weight"] if "lm_head.weight" in p else w("wte.weight")
        return x @ head.t()


# --- Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3 ---

class Decoder:
    """The RoPE decoders, configured once from config.json (its family's reading of it)."""

    def __init__(self, cfg, p, dtype, rope_dtype):
        self.cfg, self.p, self.dtype, self.rope_dtype = cfg, p, dtype, rope_dtype
        fam = self.family = cfg.family
        self.gemma = fam in ("gemma2", "gemma3_text")
        self.C, self.H = cfg.get("hidden_size"), cfg.get("num_attention_heads")
        self.KV = cfg.get("num_key_value_heads") or self.H
        self.L, self.eps = cfg.get("num_hidden_layers"), cfg.get("rms_norm_eps")
        self.D = cfg.get("head_dim") or self.C // self.H
        if self.H % self.KV:
            fail("config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d" % (self.H, self.KV))
        act = cfg.get("hidden_activation") if self.gemma else cfg.get("hidden_act")
        if self.gemma and act is None:
            act = "gelu_pytorch_tanh"
        self.act = {"silu": F.silu, "gelu_pytorch_tanh": gelu_new}.get(act)
        if self.act is None or (self.gemma != (act == "gelu_pytorch_tanh")):
            fail("config.json: activation %r is not implemented for %s" % (act, fam))
        self.scaling = cfg.get("query_pre_attn_scalar") ** -0.5 if self.gemma else self.D ** -0.5
        self.attn_softcap = cfg.get("attn_logit_softcapping") if self.gemma else None
        self.final_softcap = cfg.get("final_logit_softcapping") if self.gemma else None
        if fam == "gemma3_text" and cfg.get("use_bidirectional_attention"):
            fail("config.json: use_bidirectional_attention is not implemented")
        self.qk_norm = fam in ("qwen3", "gemma3_text", "qwen3_moe")
        ab = bool(cfg.get("attention_bias")) if fam in ("llama", "qwen3", "gemma2", "gemma3_text", "qwen3_moe") else False
        self.read_moe()
        self.bias = {"q_proj": ab or fam == "qwen2", "k_proj": ab or fam == "qwen2", "v_proj": ab or fam == "qwen2",
                     "o_proj": ab, "qkv_proj": False}
        self.mlp_bias = bool(cfg.get("mlp_bias")) if fam == "llama" else False
        self.tied = bool(cfg.get("tie_word_embeddings"))
        self.layer_types = self.read_layer_types()
        window = cfg.get("sliding_window")
        if fam in ("qwen2", "qwen3", "qwen3_moe") and not cfg.get("use_sliding_window"):
            window = None
        if "sliding_attention" in self.layer_types and window is None:
            fail("config.json: layer_types has sliding_attention but sliding_window is null")
        self.windows = [window if t == "sliding_attention" else None for t in self.layer_types]
        self.ropes = {t: Rope(cfg, t, self.D) for t in set(self.layer_types)}
        if fam != "gemma3_text":  # one rotary module for all layers
            shared = Rope(cfg, "full_attention", self.D)
            self.ropes = {t: shared for t in self.ropes}
        self.check_tensors()

    def read_layer_types(self):
        cfg, fam, L = self.cfg, self.family, self.L
        types = cfg.get("layer_types") if fam in ("qwen2", "qwen3", "gemma2", "gemma3_text") else None
        if types is not None:
            if len(types) != L or set(types) - {"full_attention", "sliding_attention"}:
                fail("config.json: layer_types %r is not %d of full_attention/sliding_attention" % (types, L))
            return list(types)
        if fam in ("qwen2", "qwen3", "qwen3_moe"):
            on = cfg.get("use_sliding_window") and cfg.get("sliding_window") is not None
            return ["sliding_attention" if on and i >= cfg.get("max_window_layers") else "full_attention" for i in range(L)]
        if fam == "gemma2":
            return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
        if fam == "gemma3_text":
            n = cfg.get("sliding_window_pattern")
            return ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(L)]
        if fam in ("mistral", "phi3", "mixtral") and cfg.get("sliding_window") is not None:
            return ["sliding_attention"] * L
        if fam == "llama" and cfg.get("sliding_window") is not None:
            fail("config.json: sliding_window is not read by Llama")
        return ["full_attention"] * L

    def read_moe(self):
        """The mixture of experts of Mixtral and Qwen3-MoE (None elsewhere): which layers
        are sparse, E, k, the experts' width, renormalisation and the router loss."""
        cfg, fam = self.cfg, self.family
        self.sparse = [False] * self.L
        if fam not in ("mixtral", "qwen3_moe"):
            return
        if fam == "mixtral":
            if cfg.get("router_jitter_noise"):
                fail("config.json: router_jitter_noise is not implemented")
            self.E, self.expert_ffn, self.norm_topk = cfg.get("num_local_experts"), cfg.get("intermediate_size"), True
            self.sparse = [True] * self.L
        else:
            self.E, self.expert_ffn, self.norm_topk = cfg.get("num_experts"), cfg.get("moe_intermediate_size"), bool(cfg.get("norm_topk_prob"))
            only, step = cfg.get("mlp_only_layers") or [], cfg.get("decoder_sparse_step")
            self.sparse = [l not in only and self.E > 0 and (l + 1) % step == 0 for l in range(self.L)]
        self.k = cfg.get("num_experts_per_tok")
        self.router_loss = bool(cfg.get("output_router_logits"))
        self.router_coef = cfg.get("router_aux_loss_coef")

    def moe_names(self, b):
        """Layer b's router and experts: (router, [(gate, up, down) per expert])."""
        if self.family == "mixtral":
            m = b + "block_sparse_moe."
            return m + "gate.weight", [tuple(m + "experts.%d.%s.weight" % (e, w) for w in ("w1", "w3", "w2")) for e in range(self.E)]
        m = b + "mlp."
        return m + "gate.weight", [tuple(m + "experts.%d.%s.weight" % (e, w) for w in ("gate_proj", "up_proj", "down_proj"))
                                   for e in range(self.E)]

    def moe(self, h, b):
        """MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock: (output, router logits)."""
        B, T, C = h.shape
        x = h.reshape(-1, C)
        router, experts = self.moe_names(b)
        logits = x @ self.p[router].t() + lora_delta(x, router[:-len(".weight")])
        probs = F.softmax(logits, dim=1, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
        weights, selected = torch.topk(probs, self.k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        mask = F.one_hot(selected, num_classes=self.E).permute(2, 1, 0)  # (E, k, tokens)
        for e in range(self.E):
            idx, top = torch.where(mask[e])
            if top.numel() == 0:
                continue
            gate, up, down = (self.p[n] for n in experts[e])
            gm, um, dm = (n[:-len(".weight")] for n in experts[e])
            xe = x[top]
            he = self.act(xe @ gate.t() + lora_delta(xe, gm)) * (xe @ up.t() + lora_delta(xe, um))
            ye = he @ down.t() + lora_delta(he, dm)
            out = out.index_add(0, top, ye * weights[top, idx, None])
        return out.reshape(B, T, C), logits

    def router_loss_of(self, logits):
        """load_balancing_loss_func without an attention mask, over the sparse layers' logits."""
        z = torch.cat(logits, dim=0)
        probs = F.softmax(z, dim=-1)
        _, selected = torch.topk(probs, self.k, dim=-1)
        mask = F.one_hot(selected, self.E)
        tokens_per_expert = torch.mean(mask.to(probs.dtype), dim=0)
        prob_per_expert = torch.mean(probs, dim=0)
        return torch.sum(tokens_per_expert * prob_per_expert.unsqueeze(0)) * self.E

    def names(self):
        """Every tensor name the model reads, with its expected shape."""
        C, H, KV, D, F_ = self.C, self.H, self.KV, self.D, self.cfg.get("intermediate_size")
        V = self.cfg.get("vocab_size")
        out = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
        if not self.tied:
            out["lm_head.weight"] = (V, C)
        for l in range(self.L):
            b = "model.layers.%d." % l
            norms = ["input_layernorm", "post_attention_layernorm"]
            if self.gemma:
                norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
            for n in norms:
                out[b + n + ".weight"] = (C,)
            a = b + "self_attn."
            if self.family == "phi3":
                out[a + "qkv_proj.weight"] = ((H + 2 * KV) * D, C)
                out[b + "mlp.gate_up_proj.weight"] = (2 * F_, C)
            else:
                for n, rows in (("q_proj", H * D), ("k_proj", KV * D), ("v_proj", KV * D)):
                    out[a + n + ".weight"] = (rows, C)
                    if self.bias[n]:
                        out[a + n + ".bias"] = (rows,)
                if self.sparse[l]:
                    router, experts = self.moe_names(b)
                    out[router] = (self.E, C)
                    for gate, up, down in experts:
                        out[gate], out[up], out[down] = (self.expert_ffn, C), (self.expert_ffn, C), (C, self.expert_ffn)
                for n in ("gate_proj", "up_proj") if not self.sparse[l] else ():
                    out[b + "mlp." + n + ".weight"] = (F_, C)
                    if self.mlp_bias:
                        out[b + "mlp." + n + ".bias"] = (F_,)
            out[a + "o_proj.weight"] = (C, H * D)
            if self.bias["o_proj"]:
                out[a + "o_proj.bias"] = (C,)
            if not self.sparse[l]:
                out[b + "mlp.down_proj.weight"] = (C, F_)
            if self.mlp_bias:
                out[b + "mlp.down_proj.bias"] = (C,)
            if self.qk_norm:
                out[a + "q_norm.weight"] = (D,)
                out[a + "k_norm.weight"] = (D,)
        return out

    def check_tensors(self):
        want = self.names()
        for name, shape in want.items():
            if name not in self.p:
                fail("model.safetensors: %s is missing (config: %s)" % (name, self.family))
            if tuple(self.p[name].shape) != shape:
                fail("model.safetensors: %s has shape %s, want %s" % (name, list(self.p[name].shape), list(shape)))
        for name in self.p:
            if name not in want and not name.startswith("base_model.model."):
                if self.tied and name == "lm_head.weight":
                    continue  # transformers ties it to the embeddings and ignores the stored copy
                fail("model.safetensors: %s is not read by %s with this config" % (name, self.family))

    def norm(self, x, w):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return h * (1.0 + w) if self.gemma else w * h

    def linear(self, h, name):
        y = h @ self.p[name + ".weight"].t() + lora_delta(h, name)
        return y + self.p[name + ".bias"] if name + ".bias" in self.p and self.bias_of(name) else y

    def bias_of(self, name):
        leaf = name.rsplit(".", 1)[1]
        return self.bias.get(leaf, self.mlp_bias)

    def forward(self, ids, pos, cache=None):
        """Logits (B, T, V). pos (B, T): positions. With cache (a list, one entry per
        layer, filled by the first call), ids continue the cached row."""
        p, B, T = self.p, ids.shape[0], ids.shape[1]
        H, KV, D = self.H, self.KV, self.D
        x = p["model.embed_tokens.weight"][ids]
        if self.gemma:
            x = x * torch.tensor(self.C ** 0.5, dtype=x.dtype)
        cos_sin = {t: r.cos_sin(pos, self.rope_dtype, self.dtype) for t, r in set((t, self.ropes[t]) for t in self.layer_types)}
        if cache is None:
            q_idx = torch.arange(T).expand(B, T)
            q_start = q_idx - pos
        else:
            q_idx, q_start = pos, torch.zeros_like(pos)
        self.router_logits = []
        for l in range(self.L):
            b = "model.layers.%d." % l
            a = b + "self_attn."
            h = self.norm(x, p[b + "input_layernorm.weight"])
            if self.family == "phi3":
                qkv = self.linear(h, a + "qkv_proj")
                q, k, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
            else:
                q, k, v = self.linear(h, a + "q_proj"), self.linear(h, a + "k_proj"), self.linear(h, a + "v_proj")
            q = q.view(B, T, H, D).transpose(1, 2)
            k = k.view(B, T, KV, D).transpose(1, 2)
            v = v.view(B, T, KV, D).transpose(1, 2)
            if self.qk_norm:
                q, k = self.norm(q, p[a + "q_norm.weight"]), self.norm(k, p[a + "k_norm.weight"])
            cos, sin = cos_sin[self.layer_types[l]]
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            k_idx = q_idx
            if cache is not None:
                if len(cache) > l:
                    ck, cv, ci = cache[l]
                    if self.windows[l] is not None:  # a sliding layer's cache keeps its last window - 1 keys
                        start = max(ci.shape[1] - (self.windows[l] - 1), 0)
                        ck, cv, ci = ck[:, :, start:], cv[:, :, start:], ci[:, start:]
                    k, v, k_idx = torch.cat((ck, k), 2), torch.cat((cv, v), 2), torch.cat((ci, q_idx), 1)
                    cache[l] = (k, v, k_idx)
                else:
                    cache.append((k, v, k_idx))
            allowed = visible(q_idx, k_idx, q_start, self.windows[l])
            o = attend(q, repeat_kv(k, H // KV), repeat_kv(v, H // KV), allowed, self.scaling, self.attn_softcap)
            o = self.linear(o.transpose(1, 2).reshape(B, T, H * D), a + "o_proj")
            if self.gemma:
                o = self.norm(o, p[b + "post_attention_layernorm.weight"])
                x = x + o
                h = self.norm(x, p[b + "pre_feedforward_layernorm.weight"])
            else:
                x = x + o
                h = self.norm(x, p[b + "post_attention_layernorm.weight"])
            if self.sparse[l]:
                h, z = self.moe(h, b)
                self.router_logits.append(z)
                x = x + h
                continue
            if self.family == "phi3":
                gate, up = self.linear(h, b + "mlp.gate_up_proj").chunk(2, dim=-1)
                h = up * self.act(gate)
            else:
                h = self.act(self.linear(h, b + "mlp.gate_proj")) * self.linear(h, b + "mlp.up_proj")
            h = self.linear(h, b + "mlp.down_proj")
            if self.gemma:
                h = self.norm(h, p[b + "post_feedforward_layernorm.weight"])
            x = x + h
        x = self.norm(x, p["model.norm.weight"])
        head = p["model.embed_tokens.weight"] if self.tied else p["lm_head.weight"]
        logits = x @ head.t()
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits


# --- the modes ---

def load(model_dir, dtype, fp64=False):
    """The model of MODEL_DIR (with its adapter, if any) and its parameters."""
    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    arch = (raw.get("architectures") or [None])[0]
    if arch not in FAMILY:
        fail("architecture %s is not one of %s" % (arch, ", ".join(FAMILY)))
    if "model_type" in raw and raw["model_type"] != FAMILY[arch]:
        fail("config.json: model_type %r is not %s's %r" % (raw["model_type"], arch, FAMILY[arch]))
    cfg = Config(raw, FAMILY[arch])
    params = read_safetensors(os.path.join(model_dir, "model.safetensors"), dtype)
    model = (GPT2 if cfg.family == "gpt2" else Decoder)(cfg, params, dtype, torch.float64 if fp64 else torch.float32)
    params.update(LORA["adapters"])
    return model, params


def compute_dtype(model_dir, fp64):
    """fp64 with --fp64 or an adapter (read here into LORA), else fp32."""
    adapter = read_adapter(model_dir, torch.float64)
    return torch.float64 if fp64 or adapter else torch.float32


def loss_and_grads(model, params, ids, targets, pos):
    """Logits, loss, and the gradient of every parameter (zeros where unused)."""
    for t in params.values():
        t.requires_grad_(True)
        t.grad = None
    logits = model.forward(ids, pos)
    V = logits.shape[-1]
    if (targets >= 0).any():
        loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1)
    else:
        loss = logits.sum() * 0.0
    aux = None
    if getattr(model, "router_logits", None):
        aux = model.router_loss_of(model.router_logits)
        if model.router_loss:
            loss = loss + model.router_coef * aux
    loss.backward()
    model.aux_loss = aux.detach() if aux is not None else None
    grads = {n: t.grad if t.grad is not None else torch.zeros_like(t) for n, t in params.items()}
    for t in params.values():
        t.requires_grad_(False)
    return logits.detach(), loss.detach(), grads


def main(model_dir, batch_path, out_path, fp64=False):
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    dtype = compute_dtype(model_dir, fp64)
    model, params = load(model_dir, dtype, fp64)
    with open(batch_path) as f:
        batch = json.load(f)
    ids = torch.tensor(batch["ids"], dtype=torch.int64)
    targets = torch.tensor(batch["targets"], dtype=torch.int64)
    B, T = ids.shape
    pos = torch.tensor(batch["pos"], dtype=torch.int64) if batch.get("pos") else torch.arange(T).expand(B, T)
    logits, loss, grads = loss_and_grads(model, params, ids, targets, pos)
    out = {"logits": logits, "loss": loss.reshape(1)}
    if model.__dict__.get("aux_loss") is not None:
        out["aux_loss"] = model.aux_loss.reshape(1)
    for name, g in grads.items():
        out["grad." + name] = g
    write_safetensors(out_path, out, torch.float64 if fp64 else torch.float32)


def generate(model, prompt, n, cache):
    """n greedy tokens after prompt (a list of ids), with or without a key/value cache."""
    seq, out = list(prompt), []
    kv = [] if cache else None
    with torch.no_grad():
        for step in range(n):
            if cache and step > 0:
                ids = torch.tensor([[seq[-1]]], dtype=torch.int64)
                pos = torch.tensor([[len(seq) - 1]], dtype=torch.int64)
            else:
                ids = torch.tensor([seq], dtype=torch.int64)
                pos = torch.arange(len(seq)).expand(1, len(seq))
            logits = model.forward(ids, pos, kv)
            nxt = int(torch.argmax(logits[0, -1]))
            out.append(nxt)
            seq.append(nxt)
    return out


def greedy(n, model_dir, prompt_path, out_path, fp64=False, cache=False):
    dtype = compute_dtype(model_dir, fp64)
    LORA["masks"] = {}  # generation is evaluation: no adapter dropout
    model, _ = load(model_dir, dtype, fp64)
    with open(prompt_path) as f:
        prompt = list(json.load(f)["ids"])
    with open(out_path, "w") as f:
        json.dump({"tokens": generate(model, prompt, int(n), cache)}, f)


def merged(model, params):
    """The base tensors with every adapter merged: W + scaling * B @ A (GPT-2's Conv1D: its transpose)."""
    out = {n: t for n, t in params.items() if not n.startswith("base_model.model.")}
    for name in LORA["adapters"]:
        if not name.endswith(".lora_A.weight"):
            continue
        module = name[len("base_model.model."):-len(".lora_A.weight")]
        a = LORA["adapters"][name]
        b = LORA["adapters"][name.replace(".lora_A.", ".lora_B.")]
        w = module + ".weight"
        if w not in out:
            fail("adapter module %s has no base weight %s" % (module, w))
        delta = LORA["scaling"] * (b @ a)
        out[w] = out[w] + (delta.t() if isinstance(model, GPT2) else delta)
    return out


def merge(out_dir, model_dir, fp64=False):
    if not read_adapter(model_dir, torch.float64):
        fail("--merge: %s has no adapter_config.json" % model_dir)
    model, params = load(model_dir, torch.float64, fp64)
    os.makedirs(out_dir, exist_ok=True)
    shutil.copyfile(os.path.join(model_dir, "config.json"), os.path.join(out_dir, "config.json"))
    write_safetensors(os.path.join(out_dir, "model.safetensors"), merged(model, params),
                      torch.float64 if fp64 else torch.float32)


# --- self-checks: the transcription against itself ---

def tiny_model(family, tmp, cfg=None, tensors=None, adapter=None, seed=0):
    """A fp64 model of make_tiny_hf's family (or cfg/tensors given), and its parameters."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_tiny_hf
    d = os.path.join(tmp, "m%d" % len(os.listdir(tmp)))
    cfg = make_tiny_hf.make(family, d, seed, "F32", cfg)
    if tensors is not None:
        make_tiny_hf.write(os.path.join(d, "model.safetensors"), tensors, "F32")
    if adapter is not None:
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "r": 2, "lora_alpha": 3, "use_rslora": False, "bias": "none"}, f)
        make_tiny_hf.write(os.path.join(d, "adapter_model.safetensors"), adapter, "F32")
    LORA.update(adapters={}, scaling=0.0, masks={})
    read_adapter(d, torch.float64)
    model, params = load(d, torch.float64, True)
    return model, params, cfg, d


def check_gradients(model, params, ids, targets, pos, rng):
    """max over sampled elements of |central difference - autograd| / max|autograd of the tensor|."""
    _, _, grads = loss_and_grads(model, params, ids, targets, pos)
    h, worst = 1e-6, 0.0
    with torch.no_grad():
        def loss_at():
            logits = model.forward(ids, pos)
            loss = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1))
            if getattr(model, "router_logits", None) and model.router_loss:
                loss += model.router_coef * float(model.router_loss_of(model.router_logits))
            return loss
        for name, t in sorted(params.items()):
            g = grads[name].reshape(-1)
            scale = float(g.abs().max())
            flat = t.view(-1)
            for i in rng.choice(flat.numel(), size=min(3, flat.numel()), replace=False):
                keep = float(flat[i])
                flat[i] = keep + h
                up = loss_at()
                flat[i] = keep - h
                down = loss_at()
                flat[i] = keep
                worst = max(worst, abs((up - down) / (2 * h) - float(g[i])) / max(scale, 1e-300))
    return worst


def step_logits(model, tokens, prompt_len, cache):
    """The last-position logits for each continuation of tokens[:prompt_len], the
    sequence fed in (teacher-forced), through the cache or by full recomputation."""
    out, kv = [], [] if cache else None
    with torch.no_grad():
        for end in range(prompt_len, len(tokens) + 1):
            if cache and end > prompt_len:
                ids, pos = torch.tensor([[tokens[end - 1]]]), torch.tensor([[end - 1]])
            else:
                ids, pos = torch.tensor([tokens[:end]]), torch.arange(end).expand(1, end)
            out.append(model.forward(ids, pos, kv)[0, -1])
    return torch.stack(out)


SLIDING = ("mistral", "qwen2sw", "qwen3", "gemma2", "gemma3", "phi3")


def selfcheck(families):
    """Checks each family's tiny model; prints one line a check; returns 1 on a failure."""
    import tempfile
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_tiny_hf
    families = families or list(make_tiny_hf.FAMILIES)
    rng = np.random.default_rng(7)
    failed = []

    def report(name, value, ok, what):
        print("%-34s %-9.3g %s  %s" % (name, value, "ok  " if ok else "FAIL", what))
        if not ok:
            failed.append(name)

    T = 20
    ids = torch.tensor(rng.integers(0, 96, (2, T)))
    targets = torch.tensor(rng.integers(-1, 96, (2, T)))
    pos = torch.stack([torch.arange(T), torch.cat([torch.arange(12), torch.arange(8)])])
    with tempfile.TemporaryDirectory() as tmp:
        for fam in families:
            # (a) autograd against central differences, fp64, packed rows past every window and original length.
            model, params, cfg, _ = tiny_model(fam, tmp)
            g = check_gradients(model, params, ids, targets, pos, rng)
            report("grad %s" % fam, g, g < 1e-6, "max |central difference - autograd| / max|grad|, 3 elements a tensor")
            # (b) cached greedy against full recomputation.
            full, _, _, _ = tiny_model(fam, tmp)
            prompt = [int(t) for t in ids[0, :10]]
            tokens = prompt + generate(full, prompt, 14, False)
            a = step_logits(tiny_model(fam, tmp)[0], tokens, 10, False)
            b = step_logits(tiny_model(fam, tmp)[0], tokens, 10, True)
            diff = float((a - b).abs().max())
            same_tokens = generate(tiny_model(fam, tmp)[0], prompt, 14, True) == tokens[10:]
            if fam == "llama_dynamic":
                report("cache %s (must differ)" % fam, diff, diff > 1e-6, "dynamic NTK past 8: cached keys keep older bases")
            else:
                report("cache %s" % fam, diff, diff < 1e-10 and same_tokens, "max |logit| difference, tokens %s" % ("equal" if same_tokens else "DIFFER"))
            if fam.startswith("phi3"):  # a prompt of 5 crosses original_max_position_embeddings 8 while generating
                a = step_logits(tiny_model(fam, tmp)[0], tokens[:20], 5, False)
                b = step_logits(tiny_model(fam, tmp)[0], tokens[:20], 5, True)
                d1, d2 = float((a[:4] - b[:4]).abs().max()), float((a[4:] - b[4:]).abs().max())
                report("cache %s crossing 8" % fam, d2, d1 < 1e-10 and d2 > 1e-6, "before the crossing %.3g, after it must differ" % d1)
            # (d) a window as long as the sequence is full attention, one shorter is not.
            if fam in SLIDING:
                results = {}
                for w in (T - 1, T, T + 5, None):
                    c = dict(cfg, sliding_window=w if w is not None else 5)
                    m, p, _, _ = tiny_model(None, tmp, c)
                    if w is None:
                        m.windows = [None] * m.L
                    with torch.no_grad():
                        results[w] = m.forward(ids, torch.arange(T).expand(2, T))
                eq = max(float((results[T] - results[None]).abs().max()), float((results[T + 5] - results[None]).abs().max()))
                ne = float((results[T - 1] - results[None]).abs().max())
                report("window>=seq %s" % fam, eq, eq == 0.0 and ne > 1e-6, "W=%d and %d equal no window; W=%d differs by %.3g" % (T, T + 5, T - 1, ne))
        check_llama_equivalents(tmp, ids, report)
        check_lora_phi3(tmp, ids, targets, pos, rng, report)
    return 1 if failed else 0


def check_llama_equivalents(tmp, ids, report):
    """Configs with every feature off give the Llama path's logits."""
    import make_tiny_hf
    base = dict(make_tiny_hf.BASE, architectures=["LlamaForCausalLM"], model_type="llama", rope_theta=10000.0,
                max_position_embeddings=512, tie_word_embeddings=False)
    w = make_tiny_hf.random_tensors(base, 3)
    T = ids.shape[1]
    pos = torch.arange(T).expand(2, T)

    def logits(cfg, tensors):
        m = tiny_model(None, tmp, cfg, tensors)[0]
        with torch.no_grad():
            return m.forward(ids, pos)

    ref = logits(base, w)
    qwen2 = dict(w)
    for name in list(w):
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            qwen2[name[:-len("weight")] + "bias"] = np.zeros(w[name].shape[0], np.float32)
    phi3 = {n: t for n, t in w.items() if not any(k in n for k in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))}
    for l in range(base["num_hidden_layers"]):
        b = "model.layers.%d." % l
        phi3[b + "self_attn.qkv_proj.weight"] = np.concatenate([w[b + "self_attn.%s_proj.weight" % x] for x in "qkv"])
        phi3[b + "mlp.gate_up_proj.weight"] = np.concatenate([w[b + "mlp.gate_proj.weight"], w[b + "mlp.up_proj.weight"]])
    variants = [
        ("mistral, no window", dict(base, architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None), w, 1e-12),
        ("qwen2, zero biases", dict(base, architectures=["Qwen2ForCausalLM"], model_type="qwen2", use_sliding_window=False), qwen2, 1e-12),
        ("phi3, fused, no longrope", dict(base, architectures=["Phi3ForCausalLM"], model_type="phi3", sliding_window=None,
                                           original_max_position_embeddings=512, partial_rotary_factor=1.0, hidden_act="silu"), phi3, 1e-12),
        ("llama rope default", dict(base, rope_scaling={"rope_type": "default"}), w, 0.0),
        ("llama linear 1", dict(base, rope_scaling={"type": "linear", "factor": 1.0}), w, 0.0),
        ("llama dynamic, within 512", dict(base, rope_scaling={"rope_type": "dynamic", "factor": 4.0}), w, 0.0),
        ("llama yarn 1", dict(base, rope_scaling={"rope_type": "yarn", "factor": 1.0}), w, 1e-6),
        ("llama llama3 1", dict(base, rope_scaling={"rope_type": "llama3", "factor": 1.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), w, 1e-6),
    ]
    for name, cfg, tensors, tol in variants:
        d = float((logits(cfg, tensors) - ref).abs().max())
        report("off=llama %s" % name, d, d <= tol, "max |logit difference| (fp32 inv_freq rounding allowed: %g)" % tol)


def check_lora_phi3(tmp, ids, targets, pos, rng, report):
    """One adapter on Phi-3's fused qkv_proj and gate_up_proj: gradients, and the merge."""
    import make_tiny_hf
    cfg = make_tiny_hf.FAMILIES["phi3"]
    C, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, Fi = C // H, cfg["intermediate_size"]
    adapter = {}
    for module, out in (("model.layers.0.self_attn.qkv_proj", (H + 2 * KV) * D), ("model.layers.1.mlp.gate_up_proj", 2 * Fi),
                        ("model.layers.2.self_attn.o_proj", C)):
        adapter["base_model.model.%s.lora_A.weight" % module] = rng.standard_normal((2, C)).astype(np.float32) * 0.3
        adapter["base_model.model.%s.lora_B.weight" % module] = rng.standard_normal((out, 2)).astype(np.float32) * 0.3
    model, params, _, d = tiny_model("phi3", tmp, adapter=adapter)
    g = check_gradients(model, params, ids, targets, pos, rng)
    report("grad phi3 + LoRA on fused", g, g < 1e-6, "adapter tensors included")
    with torch.no_grad():
        want = model.forward(ids, pos)
    out_dir = os.path.join(tmp, "merged")
    merge(out_dir, d, fp64=True)
    LORA.update(adapters={}, scaling=0.0, masks={})
    m, _ = load(out_dir, torch.float64, True)
    with torch.no_grad():
        diff = float((m.forward(ids, pos) - want).abs().max())
    report("merge phi3 fused", diff, diff < 1e-12, "merged weights without the adapter against the adapter")


def cli(argv):
    fp64 = "--fp64" in argv
    args = [a for a in argv if a != "--fp64"]
    if args[:1] == ["--selfcheck"]:
        sys.exit(selfcheck(args[1:]))
    if args[:1] == ["--greedy"] and len(args) >= 5:
        cache = "--cache" in args
        rest = [a for a in args[2:] if a != "--cache"]
        if len(rest) == 3:
            return greedy(args[1], *rest, fp64=fp64, cache=cache)
    if args[:1] == ["--merge"] and len(args) == 3:
        return merge(args[1], args[2], fp64=fp64)
    if len(args) == 3 and not args[0].startswith("--"):
        return main(*args, fp64=fp64)
    sys.exit(__doc__)


if __name__ == "__main__":
    cli(sys.argv[1:])
