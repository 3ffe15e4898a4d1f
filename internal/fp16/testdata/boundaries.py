# Writes to stdout, as little-endian uint32 pairs, float32 inputs and the
# binary16 bits numpy rounds them to: every binary16 value widened, every
# midpoint between two neighbours and the float32 on either side of it,
# the overflow and underflow edges, and random float32 bit patterns.
import sys
import numpy as np

h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
f = h.astype(np.float32)
f = f[np.isfinite(f)]
f = np.unique(f)
mid = (f[:-1].astype(np.float64) + f[1:].astype(np.float64)) / 2
mid = mid.astype(np.float32)  # exact: binary16 neighbours differ in 11 bits
bits = [f.view(np.uint32), mid.view(np.uint32), mid.view(np.uint32) + 1, mid.view(np.uint32) - 1]
edge = np.array([65504, 65519.996, 65520, 65536, 3e38, 2**-24, 2**-25, 2**-25 * 1.0000001, 2**-26, 1e-30], dtype=np.float32)
bits += [edge.view(np.uint32), (-edge).view(np.uint32)]
rng = np.random.default_rng(7)
bits.append(rng.integers(0, 1 << 32, size=1 << 20, dtype=np.uint64).astype(np.uint32))
x = np.concatenate(bits).view(np.float32)
x = x[~np.isnan(x)]
with np.errstate(over="ignore"):
    y = x.astype(np.float16).view(np.uint16).astype(np.uint32)
sys.stdout.buffer.write(np.stack([x.view(np.uint32), y], axis=1).astype("<u4").tobytes())
