import torch, sys
n = 8192
a = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) * 2 - 1
b = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) * 2 - 1
for _ in range(3):
    c = a @ b
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
iters = 50
s.record()
for _ in range(iters):
    c = a @ b
e.record()
torch.cuda.synchronize()
ms = s.elapsed_time(e) / iters
print(f"torch bf16 {n}^3: {2*n**3/ms/1e9:.1f} TFLOP/s ({ms:.3f} ms/product, {iters} products)")
