#!/usr/bin/env python3
"""Writes a tiny random Hugging Face model directory for one family.

Usage: make_tiny_hf.py FAMILY OUT_DIR [--seed N] [--dtype F32|BF16]

OUT_DIR receives config.json and model.safetensors (Hugging Face's tensor
names and shapes; a tied head is not stored). Every feature of the family is
switched on and sized to matter at sequence lengths 16 to 32: windows of 5,
rope scaling whose factors change the frequencies there, head_dim unequal to
hidden_size / num_attention_heads. FAMILIES below lists the configs. Prints
nothing on success.

Weights: embeddings N(0, 1); projections N(0, 1/in); the head N(0, 9/in) so
that logits differ by units and greedy choices are far from ties; norm
weights 1 + N(0, 0.1) (Gemma, whose norms compute x * (1 + w): N(0, 0.1));
biases N(0, 0.1). BF16 rounds these to nearest even.
"""
import json
import os
import struct
import sys

import numpy as np

BASE = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "torch_dtype": "float32"}

FAMILIES = {
    # Llama 3.1: llama3 rope (frequencies in all three bands: wavelengths 6.3, 20, 63, 200... against
    # 64/4 = 16 and 64/1 = 64), head_dim 16, untied head (no biases, as the released models).
    "llama31": dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama", head_dim=16, rope_theta=10000.0,
                    max_position_embeddings=512, tie_word_embeddings=False,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    # Mistral: a window of 5 on every layer.
    "mistral": dict(BASE, architectures=["MistralForCausalLM"], model_type="mistral", rope_theta=10000.0,
                    max_position_embeddings=512, sliding_window=5, tie_word_embeddings=False),
    # Mistral NeMo: head_dim 12 with hidden 32 and 4 heads, no window.
    "nemo": dict(BASE, architectures=["MistralForCausalLM"], model_type="mistral", head_dim=12, rope_theta=1000000.0,
                 max_position_embeddings=512, sliding_window=None, tie_word_embeddings=False),
    # Qwen2 with use_sliding_window: layers 1 and 2 (>= max_window_layers 1) slide with window 5.
    "qwen2sw": dict(BASE, architectures=["Qwen2ForCausalLM"], model_type="qwen2", rope_theta=10000.0,
                    max_position_embeddings=512, use_sliding_window=True, sliding_window=5, max_window_layers=1,
                    tie_word_embeddings=True),
    # Qwen3: head_dim 16, q_norm/k_norm, sliding layers 1 and 2 (no biases, as the released models).
    "qwen3": dict(BASE, architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=16, rope_theta=10000.0,
                  max_position_embeddings=512, use_sliding_window=True, sliding_window=5,
                  max_window_layers=1, tie_word_embeddings=False),
    # Gemma 2: layers 0 and 2 slide (window 5), head_dim 16, query_pre_attn_scalar 24, both soft caps.
    "gemma2": dict(BASE, architectures=["Gemma2ForCausalLM"], model_type="gemma2", head_dim=16, rope_theta=10000.0,
                   max_position_embeddings=512, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
                   sliding_window=5, attn_logit_softcapping=2.0, final_logit_softcapping=5.0, tie_word_embeddings=True),
    # Gemma 3: sliding_window_pattern 3 (layers 0, 1 slide with rope_local_base_freq 10000; layer 2 global
    # with theta 1e6 and linear factor 4), q_norm/k_norm, soft caps, query_pre_attn_scalar 24.
    "gemma3": dict(BASE, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", head_dim=16,
                   rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 4.0},
                   max_position_embeddings=512, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
                   sliding_window=5, sliding_window_pattern=3, attn_logit_softcapping=2.0, final_logit_softcapping=5.0,
                   tie_word_embeddings=True),
    # Phi-3: fused qkv_proj and gate_up_proj, longrope (original 8, max 32: long factors past 8 tokens,
    # attention factor sqrt(1 + ln 4 / ln 8)), window 5, hidden 48 / 4 heads = head_dim 12.
    "phi3": dict(BASE, architectures=["Phi3ForCausalLM"], model_type="phi3", hidden_size=48, rope_theta=10000.0,
                 max_position_embeddings=32, original_max_position_embeddings=8, sliding_window=5,
                 rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
                 rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                               "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 8.0]}),
    # Phi-3 with partial_rotary_factor 0.5: 6 of each head's 12 dims rotate, no window.
    "phi3partial": dict(BASE, architectures=["Phi3ForCausalLM"], model_type="phi3", hidden_size=48, rope_theta=10000.0,
                        max_position_embeddings=32, original_max_position_embeddings=8, partial_rotary_factor=0.5,
                        sliding_window=None, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
                        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.2, 1.5],
                                      "long_factor": [1.0, 2.0, 4.0]}),
    # Llama with dynamic NTK: max_position_embeddings 8, factor 4 (the base grows with every call past 8).
    "llama_dynamic": dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama", rope_theta=10000.0,
                          max_position_embeddings=8, tie_word_embeddings=False,
                          rope_scaling={"rope_type": "dynamic", "factor": 4.0}),
    # Qwen2 with YaRN: factor 4 = 32 / original 8, mscale 1 / mscale_all_dim 0.7 for the attention factor.
    "qwen2_yarn": dict(BASE, architectures=["Qwen2ForCausalLM"], model_type="qwen2", rope_theta=10000.0,
                       max_position_embeddings=32, tie_word_embeddings=False, use_sliding_window=False,
                       rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                                     "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.7}),
    # Mixtral: 4 experts of intermediate_size 48, top 2 renormalised, a window of 5, the router loss in
    # the loss at a coefficient large enough to matter.
    "mixtral": dict(BASE, architectures=["MixtralForCausalLM"], model_type="mixtral", rope_theta=1000000.0,
                    max_position_embeddings=512, sliding_window=5, tie_word_embeddings=False, num_local_experts=4,
                    num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.05),
    # Qwen3-MoE: q_norm/k_norm, head_dim 16, 6 experts of 20, top 2 not renormalised, layer 1 dense
    # (mlp_only_layers) with intermediate_size 48, the router loss in the loss.
    "qwen3_moe": dict(BASE, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", head_dim=16,
                      rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=False, num_experts=6,
                      num_experts_per_tok=2, moe_intermediate_size=20, norm_topk_prob=False, mlp_only_layers=[1],
                      decoder_sparse_step=1, output_router_logits=True, router_aux_loss_coef=0.05),
    # Qwen3-MoE with decoder_sparse_step 2 (only layer 1 sparse), top 3 of 5 renormalised, no router loss.
    "qwen3_moe_step": dict(BASE, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", rope_theta=10000.0,
                           max_position_embeddings=512, tie_word_embeddings=True, num_experts=5,
                           num_experts_per_tok=3, moe_intermediate_size=24, norm_topk_prob=True,
                           decoder_sparse_step=2),
    # Llama with linear scaling, factor 2, and a tied head.
    "llama_linear": dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama", rope_theta=10000.0,
                         max_position_embeddings=512, tie_word_embeddings=True,
                         rope_scaling={"type": "linear", "factor": 2.0}),
}


def shapes(cfg):
    """Hugging Face's tensor names and shapes for cfg, with what kind of tensor each is."""
    t = cfg["model_type"]
    C, H, KV, F, V = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                      cfg["intermediate_size"], cfg["vocab_size"])
    D = cfg.get("head_dim") or C // H
    gemma = t in ("gemma2", "gemma3_text")
    out = {"model.embed_tokens.weight": ((V, C), "embed"), "model.norm.weight": ((C,), "norm")}
    if not cfg.get("tie_word_embeddings"):
        out["lm_head.weight"] = ((V, C), "head")
    qkv_bias = t == "qwen2" or cfg.get("attention_bias")
    for l in range(cfg["num_hidden_layers"]):
        b, a = "model.layers.%d." % l, "model.layers.%d.self_attn." % l
        for n in ["input_layernorm", "post_attention_layernorm"] + (
                ["pre_feedforward_layernorm", "post_feedforward_layernorm"] if gemma else []):
            out[b + n + ".weight"] = ((C,), "norm")
        if t == "phi3":
            out[a + "qkv_proj.weight"] = (((H + 2 * KV) * D, C), "proj")
            out[b + "mlp.gate_up_proj.weight"] = ((2 * F, C), "proj")
        else:
            for n, rows in (("q_proj", H * D), ("k_proj", KV * D), ("v_proj", KV * D)):
                out[a + n + ".weight"] = ((rows, C), "proj")
                if qkv_bias:
                    out[a + n + ".bias"] = ((rows,), "bias")
            if sparse(cfg, l):
                E = cfg.get("num_local_experts") or cfg.get("num_experts")
                FE = cfg.get("moe_intermediate_size") or F
                m = b + ("block_sparse_moe." if t == "mixtral" else "mlp.")
                out[m + "gate.weight"] = ((E, C), "proj")
                names = ("w1", "w3", "w2") if t == "mixtral" else ("gate_proj", "up_proj", "down_proj")
                for e in range(E):
                    x = m + "experts.%d." % e
                    out[x + names[0] + ".weight"] = ((FE, C), "proj")
                    out[x + names[1] + ".weight"] = ((FE, C), "proj")
                    out[x + names[2] + ".weight"] = ((C, FE), "proj")
            for n in ("gate_proj", "up_proj") if not sparse(cfg, l) else ():
                out[b + "mlp." + n + ".weight"] = ((F, C), "proj")
                if cfg.get("mlp_bias"):
                    out[b + "mlp." + n + ".bias"] = ((F,), "bias")
        out[a + "o_proj.weight"] = ((C, H * D), "proj")
        if cfg.get("attention_bias"):
            out[a + "o_proj.bias"] = ((C,), "bias")
        if not sparse(cfg, l):
            out[b + "mlp.down_proj.weight"] = ((C, F), "proj")
        if cfg.get("mlp_bias"):
            out[b + "mlp.down_proj.bias"] = ((C,), "bias")
        if t in ("qwen3", "gemma3_text", "qwen3_moe"):
            out[a + "q_norm.weight"] = ((D,), "norm")
            out[a + "k_norm.weight"] = ((D,), "norm")
    return out


def sparse(cfg, l):
    """Whether layer l's MLP is a mixture of experts (Qwen3MoeDecoderLayer's rule; Mixtral: all)."""
    t = cfg["model_type"]
    if t == "mixtral":
        return True
    if t != "qwen3_moe":
        return False
    return l not in (cfg.get("mlp_only_layers") or []) and cfg["num_experts"] > 0 and (l + 1) % cfg.get("decoder_sparse_step", 1) == 0


def random_tensors(cfg, seed):
    """name -> float32 array, drawn in name order from seed."""
    rng = np.random.default_rng(seed)
    gemma = cfg["model_type"] in ("gemma2", "gemma3_text")
    out = {}
    for name, (shape, kind) in sorted(shapes(cfg).items()):
        z = rng.standard_normal(shape)
        fan_in = shape[-1]
        if kind == "embed":
            v = z
        elif kind == "proj":
            v = z / np.sqrt(fan_in)
        elif kind == "head":
            v = 3 * z / np.sqrt(fan_in)
        elif kind == "norm":
            v = 0.1 * z if gemma else 1 + 0.1 * z
        else:
            v = 0.1 * z
        out[name] = v.astype(np.float32)
    return out


def bf16_bits(a):
    """float32 array -> uint16 bfloat16 bits, rounded to nearest even."""
    u = a.astype("<f4").view("<u4").astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2")


def write(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = tensors[name]
        b = bf16_bits(a).tobytes() if dtype == "BF16" else a.astype("<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def make(family, out_dir, seed=0, dtype="F32", cfg=None):
    """Writes the tiny model of family (or of cfg, when given) to out_dir; returns its config."""
    if dtype not in ("F32", "BF16"):
        raise ValueError("make_tiny_hf.py: --dtype %r is not F32 or BF16" % dtype)
    cfg = dict(cfg if cfg is not None else FAMILIES[family])
    cfg["torch_dtype"] = {"F32": "float32", "BF16": "bfloat16"}[dtype]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write(os.path.join(out_dir, "model.safetensors"), random_tensors(cfg, seed), dtype)
    return cfg


def cli(argv):
    args, seed, dtype = [], 0, "F32"
    it = iter(argv)
    for a in it:
        if a == "--seed":
            seed = int(next(it, "x"))
        elif a == "--dtype":
            dtype = next(it, "")
        else:
            args.append(a)
    if len(args) != 2 or args[0] not in FAMILIES or dtype not in ("F32", "BF16"):
        sys.exit(__doc__ + "\nfamilies: " + ", ".join(FAMILIES))
    make(args[0], args[1], seed, dtype)


if __name__ == "__main__":
    cli(sys.argv[1:])
