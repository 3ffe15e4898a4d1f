"""One GPT-2 training step in PyTorch, for bench/cuda-verify.sh to put next
to Strata's `bench step --model gpt2` on the same GPU in the same script.

The model is GPT-2's shape (bench/cuda-verify.sh passes gpt2: 12 layers,
768 wide, 12 heads, vocab 50257, learned positions, LayerNorm, tanh GELU,
head tied to the token embedding), trained the way the fast frameworks do
it: fp32 master weights under torch.autocast(bfloat16), attention through
F.scaled_dot_product_attention(is_causal=True) (the flash kernel on sm_80+
where the shape allows it), fused AdamW. Steps on random token ids;
prints one JSON line: median step seconds over --steps timed steps after
--warmup, tokens per step, whether SDPA was used, the torch version and
device.

  python3 bench/tools/torch_gpt2_step.py --batch 16 --seq 1024 --steps 5 --warmup 2
"""
import argparse
import json
import math
import statistics
import sys
import time

SHAPES = {
    # name: (layers, dim, heads, vocab, max_seq), as model/shape.go
    "tiny": (2, 32, 4, 256, 64),
    "gpt2": (12, 768, 12, 50257, 1024),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2", choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-sdpa", action="store_true", help="explicit softmax attention instead of SDPA")
    a = p.parse_args(argv)
    layers, dim, heads, vocab, max_seq = SHAPES[a.model]
    if a.batch < 1 or a.seq < 1 or a.steps < 1 or a.warmup < 0:
        p.error("batch, seq and steps must be >= 1, warmup >= 0")
    if a.seq > max_seq:
        p.error(f"--seq {a.seq} exceeds {a.model}'s max_seq_len {max_seq}")
    return a


def build(torch, a):
    nn, F = torch.nn, torch.nn.functional
    layers, dim, heads, vocab, max_seq = SHAPES[a.model]
    sdpa = hasattr(F, "scaled_dot_product_attention") and not a.no_sdpa

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc, self.fc_proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-2, -1)) / math.sqrt(c // heads)
                mask = torch.ones(t, t, device=x.device, dtype=torch.bool).tril()
                y = s.masked_fill(~mask, float("-inf")).softmax(-1) @ v
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(max_seq, dim)
            self.h = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(dim)

        def forward(self, ids, targets):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
            for blk in self.h:
                x = blk(x)
            logits = self.ln_f(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))

    return GPT(), sdpa


def main(argv):
    a = parse_args(argv)
    import torch

    dev = torch.device(a.device)
    model, sdpa = build(torch, a)
    model.to(dev)
    kw = {"fused": True} if dev.type == "cuda" else {}
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)
    except TypeError:  # torch without fused AdamW
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = SHAPES[a.model][3]
    ids = torch.randint(0, vocab, (a.batch, a.seq), device=dev)
    tgt = torch.randint(0, vocab, (a.batch, a.seq), device=dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    times, loss = [], None
    for i in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            loss = model(ids, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({
        "torch_step_s_median": statistics.median(times), "step_s": times, "tokens_per_step": a.batch * a.seq,
        "params": params, "sdpa": sdpa, "torch": torch.__version__, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "final_loss": float(loss),
    }, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
