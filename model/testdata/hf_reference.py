#!/usr/bin/env python3
"""An independent fp32 reference for Strata's decoders, in PyTorch.

Usage: hf_reference.py MODEL_DIR BATCH_JSON OUT_SAFETENSORS
       hf_reference.py --greedy N MODEL_DIR PROMPT_JSON OUT_JSON

MODEL_DIR is a Hugging Face model directory: config.json
(GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM or
Qwen2ForCausalLM) and model.safetensors (F32, BF16 or F16 tensors under
Hugging Face's names; GPT-2's with or without the "transformer." prefix).
BATCH_JSON holds "ids" and "targets" (rows of token ids; a target of -1 is
ignored) and optionally "pos" (each token's position within its example:
packed rows, positions restart at 0 and attention stays inside an example).

OUT_SAFETENSORS receives, in fp32: "logits" (rows, seq, vocab), "loss"
(1: the mean cross-entropy over the tokens with a target, natural log)
and "grad.NAME" for every parameter NAME of model.safetensors (the
gradient of that loss, in the tensor's own layout).

With a PEFT LoRA adapter in MODEL_DIR (adapter_config.json: peft_type
LORA, r, lora_alpha, use_rslora, target_modules; adapter_model.safetensors:
"base_model.model.MODULE.lora_A.weight" (r x in) and "...lora_B.weight"
(out x r)), every adapted linear computes y = x W^T (+ b) + scaling (x A^T)
B^T, scaling = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora), as
PEFT's LoraLayer; everything then runs in fp64, and the gradients of the
adapter's tensors are written as "grad.NAME" too, under their PEFT names.
With dropout_masks.safetensors beside it ("base_model.model.MODULE.dropout",
the (rows, seq, in) factor of each kept input element, 0 for a dropped one),
an adapter's input is multiplied by its module's mask first (lora_dropout
as nn.Dropout applies it, with the masks given).

With --greedy, PROMPT_JSON holds "ids" (one row of token ids) and
OUT_JSON receives {"tokens": [...]}: N tokens generated greedily by full
recomputation (the whole sequence through the model at every step, the
next token the first index of the largest logit, as torch.argmax picks).

The architectures are written here from Hugging Face's modeling code,
without transformers: LlamaRMSNorm, rotate_half / apply_rotary_pos_emb with
inv_freq = 1/theta^(arange(0, D, 2)/D) in fp32, repeat_kv, the SwiGLU MLP
down(silu(gate(x)) * up(x)), Qwen2's q/k/v biases; GPT-2 with Conv1D
weights (in x out: y = x @ W + b), gelu_new (the tanh approximation) and
learned positions. Everything runs in fp32 on the CPU, deterministically.
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def read_safetensors(path):
    """The tensors of a safetensors file as fp32 torch tensors."""
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
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(DTYPES[meta["dtype"]]).newbyteorder("<")).astype(np.float32)
        out[name] = torch.from_numpy(arr.copy().reshape(meta["shape"]))
    return out


def write_safetensors(path, tensors):
    """Writes fp32 tensors (name -> torch tensor) as safetensors."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        b = tensors[name].detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def attention_mask(pos, seq):
    """allowed[b, i, j]: key j is in query i's example and not after it."""
    i = torch.arange(seq).view(1, seq, 1)
    j = torch.arange(seq).view(1, 1, seq)
    return (j <= i) & (j >= i - pos.view(-1, seq, 1))


def attend(q, k, v, allowed):
    """Softmax attention of q (B, H, T, D) over k, v (B, H, T, D)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed.unsqueeze(1), float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=scores.dtype) @ v


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


# --- GPT-2 (transformers' modeling_gpt2) ---

def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gpt2_forward(cfg, p, ids, pos):
    B, T = ids.shape
    C, H = cfg["n_embd"], cfg["n_head"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    pre = "transformer." if "transformer.wte.weight" in p else ""
    w = lambda n: p[pre + n]
    x = w("wte.weight")[ids] + w("wpe.weight")[pos]
    allowed = attention_mask(pos, T)
    for l in range(cfg["n_layer"]):
        b = "h.%d." % l
        h = F.layer_norm(x, (C,), w(b + "ln_1.weight"), w(b + "ln_1.bias"), eps)
        m = pre + b
        qkv = h @ w(b + "attn.c_attn.weight") + w(b + "attn.c_attn.bias") + lora_delta(h, m + "attn.c_attn")  # Conv1D
        q, k, v = qkv.split(C, dim=2)
        heads = lambda t: t.view(B, T, H, C // H).transpose(1, 2)
        a = attend(heads(q), heads(k), heads(v), allowed).transpose(1, 2).reshape(B, T, C)
        x = x + a @ w(b + "attn.c_proj.weight") + w(b + "attn.c_proj.bias") + lora_delta(a, m + "attn.c_proj")
        h = F.layer_norm(x, (C,), w(b + "ln_2.weight"), w(b + "ln_2.bias"), eps)
        h = gelu_new(h @ w(b + "mlp.c_fc.weight") + w(b + "mlp.c_fc.bias") + lora_delta(h, m + "mlp.c_fc"))
        x = x + h @ w(b + "mlp.c_proj.weight") + w(b + "mlp.c_proj.bias") + lora_delta(h, m + "mlp.c_proj")
    x = F.layer_norm(x, (C,), w("ln_f.weight"), w("ln_f.bias"), eps)
    head = p["lm_head.weight"] if "lm_head.weight" in p else w("wte.weight")
    return x @ head.t()


# --- Llama, Mistral, Qwen2 (transformers' modeling_llama, modeling_qwen2) ---

def rms_norm(x, weight, eps):  # LlamaRMSNorm
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotary_cos_sin(pos, dim, theta):  # LlamaRotaryEmbedding
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = pos.float().unsqueeze(-1) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)  # (B, 1, T, D)


def apply_rotary_pos_emb(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def repeat_kv(x, n_rep):
    B, KV, T, D = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(B, KV, n_rep, T, D).reshape(B, KV * n_rep, T, D)


def llama_forward(cfg, p, ids, pos):
    B, T = ids.shape
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", H)
    D = C // H
    eps = cfg.get("rms_norm_eps", 1e-6)
    x = p["model.embed_tokens.weight"][ids]
    cos, sin = rotary_cos_sin(pos, D, cfg.get("rope_theta", 10000.0))
    allowed = attention_mask(pos, T)

    def linear(h, name):
        y = h @ p[name + ".weight"].t() + lora_delta(h, name)
        return y + p[name + ".bias"] if name + ".bias" in p else y

    for l in range(cfg["num_hidden_layers"]):
        b = "model.layers.%d." % l
        h = rms_norm(x, p[b + "input_layernorm.weight"], eps)
        q = linear(h, b + "self_attn.q_proj").view(B, T, H, D).transpose(1, 2)
        k = linear(h, b + "self_attn.k_proj").view(B, T, KV, D).transpose(1, 2)
        v = linear(h, b + "self_attn.v_proj").view(B, T, KV, D).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        a = attend(q, repeat_kv(k, H // KV), repeat_kv(v, H // KV), allowed)
        x = x + linear(a.transpose(1, 2).reshape(B, T, C), b + "self_attn.o_proj")
        h = rms_norm(x, p[b + "post_attention_layernorm.weight"], eps)
        h = F.silu(linear(h, b + "mlp.gate_proj")) * linear(h, b + "mlp.up_proj")
        x = x + linear(h, b + "mlp.down_proj")
    x = rms_norm(x, p["model.norm.weight"], eps)
    tied = cfg.get("tie_word_embeddings", False) or "lm_head.weight" not in p
    head = p["model.embed_tokens.weight"] if tied else p["lm_head.weight"]
    return x @ head.t()


FORWARD = {
    "GPT2LMHeadModel": gpt2_forward,
    "LlamaForCausalLM": llama_forward,
    "MistralForCausalLM": llama_forward,
    "Qwen2ForCausalLM": llama_forward,
}


def main(model_dir, batch_path, out_path):
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    arch = cfg["architectures"][0]
    if arch not in FORWARD:
        sys.exit("hf_reference.py: architecture %s is not one of %s" % (arch, ", ".join(FORWARD)))
    params = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    adapter_cfg = os.path.join(model_dir, "adapter_config.json")
    if os.path.exists(adapter_cfg):
        with open(adapter_cfg) as f:
            acfg = json.load(f)
        if acfg.get("peft_type") != "LORA":
            sys.exit("hf_reference.py: adapter peft_type %r is not LORA" % acfg.get("peft_type"))
        r, alpha = acfg["r"], acfg["lora_alpha"]
        LORA["scaling"] = alpha / math.sqrt(r) if acfg.get("use_rslora") else alpha / r
        LORA["adapters"] = read_safetensors(os.path.join(model_dir, "adapter_model.safetensors"))
        params.update(LORA["adapters"])
        for name in params:
            params[name] = params[name].double()
        LORA["adapters"] = {n: params[n] for n in LORA["adapters"]}
        masks = os.path.join(model_dir, "dropout_masks.safetensors")
        if os.path.exists(masks):
            LORA["masks"] = {n: t.double() for n, t in read_safetensors(masks).items()}
    for t in params.values():
        t.requires_grad_(True)
    with open(batch_path) as f:
        batch = json.load(f)
    ids = torch.tensor(batch["ids"], dtype=torch.int64)
    targets = torch.tensor(batch["targets"], dtype=torch.int64)
    B, T = ids.shape
    pos = torch.tensor(batch["pos"], dtype=torch.int64) if batch.get("pos") else torch.arange(T).expand(B, T)

    logits = FORWARD[arch](cfg, params, ids, pos)
    V = logits.shape[-1]
    if (targets >= 0).any():
        loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1)
    else:
        loss = logits.sum() * 0.0
    loss.backward()
    out = {"logits": logits, "loss": loss.reshape(1)}
    for name, t in params.items():
        out["grad." + name] = t.grad if t.grad is not None else torch.zeros_like(t)
    write_safetensors(out_path, out)


def greedy(n, model_dir, prompt_path, out_path):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    arch = cfg["architectures"][0]
    params = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    with open(prompt_path) as f:
        seq = list(json.load(f)["ids"])
    out = []
    with torch.no_grad():
        for _ in range(int(n)):
            ids = torch.tensor([seq], dtype=torch.int64)
            logits = FORWARD[arch](cfg, params, ids, torch.arange(len(seq)).expand(1, len(seq)))
            nxt = int(torch.argmax(logits[0, -1]))
            out.append(nxt)
            seq.append(nxt)
    with open(out_path, "w") as f:
        json.dump({"tokens": out}, f)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--greedy":
        greedy(*sys.argv[2:])
    elif len(sys.argv) == 4:
        main(*sys.argv[1:])
    else:
        sys.exit(__doc__)
