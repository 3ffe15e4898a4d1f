// Kernels of the Strata CUDA backend, compiled at run time by NVRTC for the
// device's architecture (see nvrtc.go for the options: no contraction into
// FMAs, IEEE division and square root, denormals kept). Every kernel is
// extern "C" so that cuModuleGetFunction finds it by its plain name.
//
// Storage types are passed as codes (internal/dtype): 1 f32, 2 bf16, 3 i32,
// 4 f64, 9 f16. Floats are loaded as fp32 (bf16 and f16 widened exactly),
// computed in fp32 (reductions and transcendentals in double, as gpu/cpu
// does) and rounded once on store (bf16 and f16: nearest even, NaN kept
// quiet; f16 past 65504 is infinite).
//
// Every reduction has a fixed shape (fixed block size, fixed tree, loops in
// index order), so results are bit-identical run to run.

typedef unsigned short u16;
typedef long long i64;

#define DT_F32 1
#define DT_BF16 2
#define DT_I32 3
#define DT_F64 4
#define DT_F16 9

#define NT 256 // threads of the row-wise kernels; a power of two

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((unsigned)h) << 16); }

// f2bf rounds to nearest even as internal/bf16.FromFloat32 does.
__device__ __forceinline__ u16 f2bf(float f) {
    unsigned b = __float_as_uint(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (u16)((b >> 16) | 0x40u);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (u16)(b >> 16);
}

// h2f widens an IEEE binary16 exactly (internal/fp16.ToFloat32).
__device__ __forceinline__ float h2f(u16 h) {
    unsigned s = ((unsigned)h & 0x8000u) << 16, e = ((unsigned)h >> 10) & 0x1fu, m = (unsigned)h & 0x3ffu;
    if (e == 0) return __uint_as_float(__float_as_uint((float)m * 5.9604644775390625e-8f) | s); // m·2^-24, exact
    if (e == 31) return __uint_as_float(s | 0x7f800000u | (m << 13));                         // Inf, NaN (payload kept)
    return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
}

// f2h rounds to the nearest binary16, ties to even, as
// internal/fp16.FromFloat32 does: 65520 and above are infinite, values
// under 2^-14 round to a multiple of 2^-24 (the subnormals), NaN stays a
// quiet NaN with its top payload bits.
__device__ __forceinline__ u16 f2h(float f) {
    unsigned b = __float_as_uint(f), s = (b >> 16) & 0x8000u, a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return (u16)(s | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (u16)(s | 0x7c00u);
    if (a < 0x38800000u) return (u16)(s | __float2uint_rn(__uint_as_float(a) * 16777216.0f)); // |f|·2^24, exact; 1024 is 2^-14
    unsigned r = a - 0x38000000u;                                                                  // exponent 127 → 15 bias
    return (u16)(s | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}

// half2f and f2half are the 16-bit floats of dt (DT_BF16 or DT_F16).
__device__ __forceinline__ float half2f(int dt, u16 h) { return dt == DT_F16 ? h2f(h) : bf2f(h); }
__device__ __forceinline__ u16 f2half(int dt, float f) { return dt == DT_F16 ? f2h(f) : f2bf(f); }

__device__ __forceinline__ float ld(const void* p, int dt, i64 i) {
    switch (dt) {
    case DT_F32: return ((const float*)p)[i];
    case DT_BF16: return bf2f(((const u16*)p)[i]);
    case DT_F16: return h2f(((const u16*)p)[i]);
    case DT_I32: return (float)((const int*)p)[i];
    default: return (float)((const double*)p)[i];
    }
}

__device__ __forceinline__ double ldd(const void* p, int dt, i64 i) {
    switch (dt) {
    case DT_F32: return (double)((const float*)p)[i];
    case DT_BF16: return (double)bf2f(((const u16*)p)[i]);
    case DT_F16: return (double)h2f(((const u16*)p)[i]);
    case DT_I32: return (double)((const int*)p)[i];
    default: return ((const double*)p)[i];
    }
}

__device__ __forceinline__ void st(void* p, int dt, i64 i, float v) {
    switch (dt) {
    case DT_F32: ((float*)p)[i] = v; break;
    case DT_BF16: ((u16*)p)[i] = f2bf(v); break;
    case DT_F16: ((u16*)p)[i] = f2h(v); break;
    case DT_I32: ((int*)p)[i] = (int)v; break;
    default: ((double*)p)[i] = (double)v; break;
    }
}

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// ---- chunks of 8 in 16-byte vectors --------------------------------------
//
// The row kernels (rmsnorm_fwd, rmsnorm_bwd_dx) and SwiGLU work on chunks
// of VEC = 8 consecutive elements: thread t of a row's block takes the
// chunks starting at columns 8t, 8(t+NT), ...; the last chunk of a row may
// be short (the tail). ld8/st8 move a full chunk of bf16 or f16 as one 16-byte
// vector (ld.global.v4) when its address is 16-byte aligned, and element by
// element otherwise (a short chunk, an f32 tensor, a row or a slice that
// starts off a 16-byte boundary). Both ways give the same values, and the
// chunks, not the addresses, fix which thread sums what in which order: the
// bits do not depend on alignment. ld_v16/st_v16 are the only vector
// accesses; the CPU emulator (testdata/emu) replaces them to count them and
// to check their alignment.
#define VEC 8

#ifndef STRATA_EMU
__device__ __forceinline__ uint4 ld_v16(const void* p) { return *(const uint4*)p; }
__device__ __forceinline__ void st_v16(void* p, uint4 v) { *(uint4*)p = v; }
#endif

// chunk_len: the elements of the chunk at c in a row of cols (1..VEC).
__device__ __forceinline__ int chunk_len(i64 c, i64 cols) { return cols - c < VEC ? (int)(cols - c) : VEC; }

__device__ __forceinline__ bool vec_ok(const void* p, int dt, i64 i, int n) {
    return (dt == DT_BF16 || dt == DT_F16) && n == VEC && (((unsigned long long)((const u16*)p + i)) & 15) == 0;
}

// ld8 loads elements i..i+n-1 (n <= VEC) of p, widened to fp32, into v[0..n).
__device__ __forceinline__ void ld8(const void* p, int dt, i64 i, int n, float* v) {
    if (vec_ok(p, dt, i, n)) {
        uint4 q = ld_v16((const u16*)p + i);
        unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[2 * k] = half2f(dt, (u16)(w[k] & 0xffffu));
            v[2 * k + 1] = half2f(dt, (u16)(w[k] >> 16));
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < VEC; k++)
        if (k < n) v[k] = ld(p, dt, i + k);
}

// st8 stores v[0..n) to elements i..i+n-1 of p, each rounded once.
__device__ __forceinline__ void st8(void* p, int dt, i64 i, int n, const float* v) {
    if (vec_ok(p, dt, i, n)) {
        unsigned w[4];
#pragma unroll
        for (int k = 0; k < 4; k++) w[k] = (unsigned)f2half(dt, v[2 * k]) | ((unsigned)f2half(dt, v[2 * k + 1]) << 16);
        uint4 q;
        q.x = w[0], q.y = w[1], q.z = w[2], q.w = w[3];
        st_v16((u16*)p + i, q);
        return;
    }
#pragma unroll
    for (int k = 0; k < VEC; k++)
        if (k < n) st(p, dt, i + k, v[k]);
}

// stored: v as st(dt) stores it and ld reads it back (bf16, f16: rounded).
__device__ __forceinline__ float stored(int dt, float v) {
    return dt == DT_BF16 ? bf2f(f2bf(v)) : dt == DT_F16 ? h2f(f2h(v)) : v;
}

// add_st8 adds w to v[0..n) in fp32, stores the sums at i of p (st8) and
// leaves in v the values stored.
__device__ __forceinline__ void add_st8(void* p, int dt, i64 i, int n, float* v, const float* w) {
#pragma unroll
    for (int k = 0; k < VEC; k++)
        if (k < n) v[k] = v[k] + w[k];
    st8(p, dt, i, n, v);
#pragma unroll
    for (int k = 0; k < VEC; k++)
        if (k < n) v[k] = stored(dt, v[k]);
}

// ld8_residual loads the chunk at i (n elements) of a into v; with b (the
// norms' residual form) it adds b's chunk in fp32, stores the sums once
// into sum (Add's bits; sum may be a or b) and leaves in v the stored
// values, which the norm is of.
__device__ __forceinline__ void ld8_residual(const void* a, int da, const void* b, int db, void* sum, int dsum, i64 i,
                                             int n, float* v) {
    ld8(a, da, i, n, v);
    if (!b) return;
    float w[VEC];
    ld8(b, db, i, n, w);
    add_st8(sum, dsum, i, n, v, w);
}

// Block reductions over NT threads with a fixed tree.
__device__ double block_sum_d(double v, double* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = NT / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

__device__ float block_max_f(float v, float* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = NT / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

// ---- runtime checks ------------------------------------------------------
//
// A stream's error slot (int[8]): [0] code of the first error since the host
// last read it, [1] the bad value, [2] its position, [3] the limit, [4] 1 when
// the latest checked op found bad data (its compute kernels then skip).

// slot_report, by thread 0 after the scan: first < n is the index of the
// first bad value (n: none). It sets [4] (or, with accumulate, ORs into it)
// and, when no error is pending, fills [0..3].
__device__ void slot_report(int* slot, unsigned long long first, i64 n, int value, int limit, int code, int accumulate) {
    int bad = first < (unsigned long long)n;
    slot[4] = accumulate ? (slot[4] | bad) : bad;
    if (bad && slot[0] == 0) {
        slot[0] = code;
        slot[1] = value;
        slot[2] = (int)first;
        slot[3] = limit;
    }
}

// check_ids: every ids[i] must lie in [lo, limit). An op that checks two
// arrays runs it twice, the second time with accumulate = 1 so that [4]
// says whether either was bad.
extern "C" __global__ void check_ids(const int* ids, i64 n, int lo, int limit, int code, int* slot, int accumulate) {
    __shared__ unsigned long long first;
    if (threadIdx.x == 0) first = (unsigned long long)n;
    __syncthreads();
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
        int id = ids[i];
        if (id < lo || id >= limit) {
            atomicMin(&first, (unsigned long long)i);
            break;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int v = first < (unsigned long long)n ? ids[first] : 0;
        slot_report(slot, first, n, v, limit, code, accumulate);
    }
}

// check_pos: the positions of an attention op (pos, n = B·T of them): the
// token at column t = i % T must have 0 <= pos[i] <= t, or its window
// [t-pos, t] would reach outside its row. [3] receives T, from which the
// host names the row and column of the token.
extern "C" __global__ void check_pos(const int* pos, i64 n, int T, int code, int* slot) {
    __shared__ unsigned long long first;
    if (threadIdx.x == 0) first = (unsigned long long)n;
    __syncthreads();
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
        int p = pos[i];
        if (p < 0 || p > (int)(i % T)) {
            atomicMin(&first, (unsigned long long)i);
            break;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int v = first < (unsigned long long)n ? pos[first] : 0;
        slot_report(slot, first, n, v, T, code, 0);
    }
}

// ---- elementwise ---------------------------------------------------------

#define GELU_S 0.7978845608028654

// gelu_f is GPT-2's gelu (tanh approximation) in double, rounded once.
__device__ __forceinline__ float gelu_f(float x) {
    double v = (double)x;
    return (float)(0.5 * v * (1.0 + tanh(GELU_S * (v + 0.044715 * v * v * v))));
}

extern "C" __global__ void gelu_fwd(const void* x, int dx, void* y, int dy, i64 n) {
    GRID_STRIDE(i, n) { st(y, dy, i, gelu_f(ld(x, dx, i))); }
}

extern "C" __global__ void gelu_bwd(const void* x, int dtx, const void* dy, int dtdy, void* dx, int dtdx, i64 n) {
    GRID_STRIDE(i, n) {
        double v = (double)ld(x, dtx, i);
        double u = GELU_S * (v + 0.044715 * v * v * v);
        double th = tanh(u);
        double sech2 = 1.0 - th * th;
        float g = (float)(0.5 * (1.0 + th) + 0.5 * v * sech2 * GELU_S * (1.0 + 3.0 * 0.044715 * v * v));
        st(dx, dtdx, i, ld(dy, dtdy, i) * g);
    }
}

extern "C" __global__ void add(const void* a, int da, const void* b, int db, void* out, int dout, i64 n) {
    GRID_STRIDE(i, n) { st(out, dout, i, ld(a, da, i) + ld(b, db, i)); }
}

extern "C" __global__ void add_columns(void* dst, int dd, const void* src, int ds, i64 rows, i64 cols,
                                       i64 dst_ld, i64 dst_off, i64 src_ld, i64 src_off, float beta) {
    GRID_STRIDE(i, rows * cols) {
        i64 r = i / cols, j = i % cols;
        float v = ld(src, ds, r * src_ld + src_off + j);
        i64 at = r * dst_ld + dst_off + j;
        if (beta != 0.0f) v = beta * ld(dst, dd, at) + v;
        st(dst, dd, at, v);
    }
}

// dropout: gpu.DropoutKeep's counter-based decision (SplitMix64's finaliser).
extern "C" __global__ void dropout(const void* x, int dx, void* y, int dy, i64 n, i64 seed, i64 offset,
                                   unsigned int threshold, float scale) {
    GRID_STRIDE(i, n) {
        unsigned long long z = (unsigned long long)seed + (unsigned long long)(offset + i + 1) * 0x9e3779b97f4a7c15ULL;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        float v = ld(x, dx, i);
        st(y, dy, i, (unsigned int)(z >> 40) >= threshold ? v * scale : 0.0f);
    }
}

// dequant_nf4: internal/nf4's layout (the fp32 absmax of every 64 values,
// then two codes a byte, the earlier value in the high nibble), the NF4
// table's entry times the absmax.
__device__ __constant__ float nf4_values[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

extern "C" __global__ void dequant_nf4(const void* src, void* dst, int dd, i64 n) {
    const float* absmax = (const float*)src;
    const unsigned char* codes = (const unsigned char*)src + 4 * ((n + 63) / 64);
    GRID_STRIDE(i, n) {
        unsigned char b = codes[i / 2];
        unsigned int c = (i % 2 == 0) ? (b >> 4) : (b & 0xf);
        st(dst, dd, i, nf4_values[c] * absmax[i / 64]);
    }
}

// dequant_int8: internal/absmax8's layout (the fp32 step of every 64
// values, then one signed byte each), code times step.
extern "C" __global__ void dequant_int8(const void* src, void* dst, int dd, i64 n) {
    const float* step = (const float*)src;
    const signed char* codes = (const signed char*)src + 4 * ((n + 63) / 64);
    GRID_STRIDE(i, n) { st(dst, dd, i, (float)codes[i] * step[i / 64]); }
}

extern "C" __global__ void scale(void* x, int dt, float alpha, i64 n) {
    GRID_STRIDE(i, n) {
        if (dt == DT_F64) ((double*)x)[i] *= (double)alpha;
        else st(x, dt, i, ld(x, dt, i) * alpha);
    }
}

// scale_rows: x[r,:] *= scale[r] (x rows×cols).
extern "C" __global__ void scale_rows(void* x, int dt, const float* scale, i64 rows, i64 cols) {
    GRID_STRIDE(i, rows * cols) st(x, dt, i, ld(x, dt, i) * scale[i / cols]);
}

// row_dots: out[r] = sum over c of a[r,c]*b[r,c], one thread per row; each
// product of two floats is exact in double, so fused or not the double sum
// in column order is gpu/cpu's.
extern "C" __global__ void row_dots(const void* a, int da, const void* b, int db, float* out, i64 rows, i64 cols) {
    GRID_STRIDE(r, rows) {
        double sum = 0;
        for (i64 c = 0; c < cols; c++) sum += (double)ld(a, da, r * cols + c) * (double)ld(b, db, r * cols + c);
        out[r] = (float)sum;
    }
}

extern "C" __global__ void axpy(float alpha, const void* x, int dx, void* y, int dy, i64 n) {
    GRID_STRIDE(i, n) {
        if (dx == DT_F64 && dy == DT_F64) ((double*)y)[i] += (double)alpha * ((const double*)x)[i];
        else st(y, dy, i, ld(y, dy, i) + alpha * ld(x, dx, i));
    }
}

extern "C" __global__ void fill(void* x, int dt, float value, i64 n) {
    GRID_STRIDE(i, n) {
        switch (dt) {
        case DT_F32: ((float*)x)[i] = value; break;
        case DT_BF16: ((u16*)x)[i] = f2bf(value); break;
        case DT_F16: ((u16*)x)[i] = f2h(value); break;
        case DT_I32: ((int*)x)[i] = (int)value; break;
        default: ((double*)x)[i] = (double)value; break;
        }
    }
}

extern "C" __global__ void cast(void* dst, int dd, const void* src, int ds, i64 n) {
    GRID_STRIDE(i, n) {
        if (dd == DT_F64 && ds == DT_I32) ((double*)dst)[i] = (double)((const int*)src)[i];
        else if (dd == DT_I32 && ds == DT_F64) ((int*)dst)[i] = (int)((const double*)src)[i];
        else st(dst, dd, i, ld(src, ds, i));
    }
}

// ---- bias ----------------------------------------------------------------

extern "C" __global__ void bias_add(void* y, int dy, const void* bias, int db, i64 rows, i64 cols) {
    GRID_STRIDE(i, rows * cols) { st(y, dy, i, ld(y, dy, i) + ld(bias, db, i % cols)); }
}

// ---- column sums over the rows (gpu.ColumnBlockRows) ----------------------
//
// bias_gelu (BiasGeluForward): one thread per chunk of VEC columns of a
// row (ld8/st8: 16-byte vectors where aligned): y += bias, added in fp32
// and stored once (bias_add's bits), then act = gelu_f of the stored y
// (gelu_fwd's bits). y is read once instead of twice and written once.
extern "C" __global__ void bias_gelu(void* y, int dy, const void* bias, int db, void* act, int da, i64 rows, i64 cols) {
    const i64 per = (cols + VEC - 1) / VEC;
    GRID_STRIDE(x, rows * per) {
        const i64 r = x / per, c = (x % per) * VEC, at = r * cols + c;
        const int n = chunk_len(c, cols);
        float v[VEC], w[VEC];
        ld8(y, dy, at, n, v);
        ld8(bias, db, c, n, w);
        add_st8(y, dy, at, n, v, w);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k < n) v[k] = gelu_f(v[k]);
        st8(act, da, at, n, v);
    }
}

// dbias[c] += sum_r dy[r,c], and the norms' gamma and beta gradients, in
// two passes: a *_part kernel has one thread per (block of COL_BLOCK rows,
// column) add its rows in order into part[b*cols + c] (fp32, from 0), and
// colsum_final one thread per column add the blocks' sums in order and
// store old + total. gpu/cpu sums in the same order, so the bits agree; a
// thread walks COL_BLOCK rows, not all of them (one thread a column over
// R rows waits on R loads in turn: README's table).

#define COL_BLOCK 256 // gpu.ColumnBlockRows

// col_blocks: the blocks of COL_BLOCK rows of rows.
__device__ __forceinline__ i64 col_blocks(i64 rows) { return (rows + COL_BLOCK - 1) / COL_BLOCK; }

extern "C" __global__ void bias_grad_part(const void* dy, int ddy, float* part, i64 rows, i64 cols) {
    GRID_STRIDE(j, col_blocks(rows) * cols) {
        i64 b = j / cols, c = j % cols, end = b * COL_BLOCK + COL_BLOCK < rows ? b * COL_BLOCK + COL_BLOCK : rows;
        float acc = 0;
        for (i64 r = b * COL_BLOCK; r < end; r++) acc += ld(dy, ddy, r * cols + c);
        part[j] = acc;
    }
}

// colsum_final: dst[c] = dst[c] + (part[0,c] + part[1,c] + ...), in order.
extern "C" __global__ void colsum_final(const float* part, i64 nblocks, i64 cols, void* dst, int dd) {
    GRID_STRIDE(c, cols) {
        float acc = 0;
        for (i64 b = 0; b < nblocks; b++) acc += part[b * cols + c];
        st(dst, dd, c, ld(dst, dd, c) + acc);
    }
}

// ---- gated MLP (SwiGLU, GeGLU) -------------------------------------------
//
// gateUp is rows×2F: gate in columns [0,F), up in [F,2F); act is
// gpu.GLUAct: GLU_SILU (x·sigmoid(x), SwiGLU) or GLU_GELU_TANH (GELU's
// tanh approximation, GeGLU). Computed in double, products in gpu/cpu's
// order (glu64), and rounded once on store, so the two differ only where
// CUDA's exp and tanh and Go's do.

#define GLU_SILU 0      // gpu.Silu
#define GLU_GELU_TANH 1 // gpu.GeluTanh

// One thread per chunk of VEC columns of gate (q < rows·ceil(F/VEC)):
// gate, up and y move in 16-byte vectors where aligned (F a multiple of 8
// and the buffers 16-byte aligned); the arithmetic is per element, so the
// bits are those of one thread per element.

// glu_at: the row and first column of chunk q, and its length.
__device__ __forceinline__ void glu_at(i64 q, i64 F, i64* r, i64* f, int* n) {
    i64 per = (F + VEC - 1) / VEC;
    *r = q / per;
    *f = (q % per) * VEC;
    *n = chunk_len(*f, F);
}

// glu_act returns act(g) and stores act'(g) in *da, in double (gpu/cpu's
// glu64): silu' = s·(1 + g·(1-s)) with s = sigmoid(g); gelu_tanh' =
// 0.5·(1+th) + 0.5·g·(1-th²)·S·(1 + 3·0.044715·g²) with th = tanh(S·(g +
// 0.044715·g³)).
__device__ __forceinline__ double glu_act(int act, double g, double* da) {
    if (act == GLU_GELU_TANH) {
        double u = GELU_S * (g + 0.044715 * g * g * g);
        double th = tanh(u);
        *da = 0.5 * (1 + th) + 0.5 * g * (1 - th * th) * GELU_S * (1 + 3 * 0.044715 * g * g);
        return 0.5 * g * (1 + th);
    }
    double sg = 1.0 / (1.0 + exp(-g));
    *da = sg * (1 + g * (1 - sg));
    return g * sg;
}

extern "C" __global__ void glu_fwd(const void* gu, int dgu, void* y, int dy, i64 F, int act, i64 nchunks) {
    GRID_STRIDE(q, nchunks) {
        i64 r, f;
        int n;
        glu_at(q, F, &r, &f, &n);
        float g[VEC], u[VEC], o[VEC];
        ld8(gu, dgu, r * 2 * F + f, n, g);
        ld8(gu, dgu, r * 2 * F + F + f, n, u);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            if (k >= n) break;
            double da;
            double a = glu_act(act, (double)g[k], &da);
            o[k] = (float)(a * (double)u[k]);
        }
        st8(y, dy, r * F + f, n, o);
    }
}

// glu_bwd: d gate = dy·up·act'(gate), d up = dy·act(gate). dgo may not
// alias gu (the front end refuses it).
extern "C" __global__ void glu_bwd(const void* gu, int dgu, const void* dy, int ddy, void* dgo, int ddgo, i64 F, int act,
                                   i64 nchunks) {
    GRID_STRIDE(q, nchunks) {
        i64 r, f;
        int n;
        glu_at(q, F, &r, &f, &n);
        float g[VEC], u[VEC], d[VEC], dg[VEC], du[VEC];
        ld8(gu, dgu, r * 2 * F + f, n, g);
        ld8(gu, dgu, r * 2 * F + F + f, n, u);
        ld8(dy, ddy, r * F + f, n, d);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            if (k >= n) break;
            double ud = (double)u[k], dd = (double)d[k], da;
            double a = glu_act(act, (double)g[k], &da);
            dg[k] = (float)(dd * ud * da);
            du[k] = (float)(dd * a);
        }
        st8(dgo, ddgo, r * 2 * F + f, n, dg);
        st8(dgo, ddgo, r * 2 * F + F + f, n, du);
    }
}

// ---- rotary embedding ----------------------------------------------------
//
// rope rotates, in place, the first dims values of the q and k heads of
// packed qkv rows (the first (H+KV)·D values of each row of W =
// (H+2·KV)·D): for k < dims/2 the pair (x_k, x_{k+dims/2}) by angle
// pos·inv.f[k] (double, from the fp32 inverse frequency), c = cos·rscale
// and s = sin·rscale from double math rounded to fp32 (no table), the
// rotation in fp32; values dims..D-1 are untouched. inverse applies the
// transpose (RopeBackward). One thread per (token, head, pair); n =
// B·T·(H+KV)·(dims/2). The inverse frequencies travel by value, as a
// kernel argument of ROPE_MAX_FREQS floats (1 KiB of the 4 KiB of
// parameters a launch may pass): no upload, no scratch, and the host's
// slice may change as soon as the op is enqueued.

#define ROPE_MAX_FREQS 256 // gpu.MaxRopeDims / 2
struct RopeFreqs {
    float f[ROPE_MAX_FREQS];
};

extern "C" __global__ void rope(void* qkv, int dt, const int* pos, int T, int H, int KV, int D, RopeFreqs inv,
                                float rscale, int dims, int inverse, i64 n) {
    int half = dims / 2;
    i64 W = (i64)(H + 2 * KV) * D;
    GRID_STRIDE(x, n) {
        int k = (int)(x % half);
        i64 rest = x / half;
        int hh = (int)(rest % (H + KV));
        i64 bt = rest / (H + KV);
        int p = pos ? pos[bt] : (int)(bt % T);
        double ang = (double)p * (double)inv.f[k];
        float c = (float)(cos(ang) * (double)rscale), s = (float)(sin(ang) * (double)rscale);
        i64 i1 = bt * W + (i64)hh * D + k, i2 = i1 + half;
        float x1 = ld(qkv, dt, i1), x2 = ld(qkv, dt, i2);
        if (inverse) {
            st(qkv, dt, i1, x1 * c + x2 * s);
            st(qkv, dt, i2, x2 * c - x1 * s);
        } else {
            st(qkv, dt, i1, x1 * c - x2 * s);
            st(qkv, dt, i2, x2 * c + x1 * s);
        }
    }
}

// ---- layernorm -----------------------------------------------------------

// layernorm_fwd: one block per row, in chunks of VEC columns (ld8/st8:
// 16-byte vectors where aligned), as rmsnorm_fwd. With b
// (AddLayerNormForward) x = a + b, added in fp32 and stored once into sum
// (Add's bits; sum may be a or b), and the norm is of the stored sum;
// without b, x = a and sum is unused. The mean, then the biased variance
// from x - mean, in double: each thread's chunks in column order, then a
// fixed tree; y = (x-mean)*rstd*gamma + beta in fp32 with the fp32 mean
// and rstd. The later passes read x again (from L1/L2), each thread its
// own chunks, which it stored itself.
extern "C" __global__ void layernorm_fwd(const void* a, int da, const void* b, int db, void* sum, int dsum,
                                         const void* gamma, int dg, const void* beta, int dbt, void* y, int dy,
                                         float* mean, float* rstd, i64 cols, float eps) {
    __shared__ double sh[NT];
    const i64 r = blockIdx.x, base = r * cols;
    const void* x = b ? sum : a;
    const int dx = b ? dsum : da;
    double s = 0;
    for (i64 c = (i64)threadIdx.x * VEC; c < cols; c += (i64)NT * VEC) {
        int n = chunk_len(c, cols);
        float v[VEC];
        ld8_residual(a, da, b, db, sum, dsum, base + c, n, v);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k < n) s += (double)v[k];
    }
    const double m = block_sum_d(s, sh) / (double)cols;
    double ss = 0;
    for (i64 c = (i64)threadIdx.x * VEC; c < cols; c += (i64)NT * VEC) {
        int n = chunk_len(c, cols);
        float v[VEC];
        ld8(x, dx, base + c, n, v);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k < n) {
                double d = (double)v[k] - m;
                ss += d * d;
            }
    }
    ss = block_sum_d(ss, sh);
    const float mf = (float)m, rf = (float)(1.0 / sqrt(ss / (double)cols + (double)eps));
    for (i64 c = (i64)threadIdx.x * VEC; c < cols; c += (i64)NT * VEC) {
        int n = chunk_len(c, cols);
        float v[VEC], g[VEC], bt[VEC];
        ld8(x, dx, base + c, n, v);
        ld8(gamma, dg, c, n, g);
        ld8(beta, dbt, c, n, bt);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k < n) v[k] = (v[k] - mf) * rf * g[k] + bt[k];
        st8(y, dy, base + c, n, v);
    }
    if (threadIdx.x == 0) {
        mean[r] = mf;
        rstd[r] = rf;
    }
}

// layernorm_bwd_dx: per row, with xhat = (x-mean)*rstd and g = dy*gamma,
// dx += (g - mean(g) - xhat*mean(g*xhat)) * rstd.
extern "C" __global__ void layernorm_bwd_dx(const void* dy, int ddy, const void* x, int dx_, const void* gamma, int dg,
                                            const float* mean, const float* rstd, void* dx, int ddx, i64 cols) {
    __shared__ double sh[NT];
    i64 r = blockIdx.x;
    i64 base = r * cols;
    float mr = mean[r], rr = rstd[r];
    double sg = 0, sgx = 0;
    for (i64 c = threadIdx.x; c < cols; c += NT) {
        float xh = (ld(x, dx_, base + c) - mr) * rr;
        float gh = ld(dy, ddy, base + c) * ld(gamma, dg, c);
        sg += (double)gh;
        sgx += (double)gh * (double)xh;
    }
    sg = block_sum_d(sg, sh);
    sgx = block_sum_d(sgx, sh);
    float mg = (float)(sg / (double)cols), mgx = (float)(sgx / (double)cols);
    for (i64 c = threadIdx.x; c < cols; c += NT) {
        float xh = (ld(x, dx_, base + c) - mr) * rr;
        float gh = ld(dy, ddy, base + c) * ld(gamma, dg, c);
        st(dx, ddx, base + c, ld(dx, ddx, base + c) + (gh - mg - xh * mgx) * rr);
    }
}

// layernorm_bwd_params: dgamma[c] += sum_r dy*xhat, dbeta[c] += sum_r dy, fp32 in row order.
// layernorm_bwd_params_part: the block sums of dgamma (dy*xhat) into
// partg and of dbeta (dy) into partb; colsum_final adds each up.
extern "C" __global__ void layernorm_bwd_params_part(const void* dy, int ddy, const void* x, int dx_, const float* mean,
                                                     const float* rstd, float* partg, float* partb, i64 rows, i64 cols) {
    GRID_STRIDE(j, col_blocks(rows) * cols) {
        i64 b = j / cols, c = j % cols, end = b * COL_BLOCK + COL_BLOCK < rows ? b * COL_BLOCK + COL_BLOCK : rows;
        float ag = 0, ab = 0;
        for (i64 r = b * COL_BLOCK; r < end; r++) {
            float d = ld(dy, ddy, r * cols + c);
            ag += d * ((ld(x, dx_, r * cols + c) - mean[r]) * rstd[r]);
            ab += d;
        }
        partg[j] = ag;
        partb[j] = ab;
    }
}

// ---- RMSNorm -------------------------------------------------------------

// rmsnorm_fwd: one block per row of x, in chunks of VEC columns (ld8/st8:
// 16-byte vectors where aligned). With b (AddRMSNormForward) x = a + b,
// added in fp32 and stored once into sum (Add's bits; sum may be a or b),
// and the norm is of the stored sum; without b, x = a and sum is unused.
// The sum of squares in double, each thread's chunks in column order, then
// a fixed tree; rstd = 1/sqrt(mean(x^2)+eps); y = x*rstd*gamma in fp32.
// The second pass reads x again (from L1/L2: the block has just read it).
extern "C" __global__ void rmsnorm_fwd(const void* a, int da, const void* b, int db, void* sum, int dsum,
                                       const void* gamma, int dg, void* y, int dy, float* rstd, i64 cols, float eps) {
    __shared__ double sh[NT];
    i64 base = (i64)blockIdx.x * cols;
    const void* x = b ? sum : a;
    int dx = b ? dsum : da;
    double ss = 0;
    for (i64 c = (i64)threadIdx.x * VEC; c < cols; c += (i64)NT * VEC) {
        int n = chunk_len(c, cols);
        float v[VEC];
        ld8_residual(a, da, b, db, sum, dsum, base + c, n, v);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k < n) ss += (double)v[k] * (double)v[k];
    }
    ss = block_sum_d(ss, sh);
    float rf = (float)(1.0 / sqrt(ss / (double)cols + (double)eps));
    for (i64 c = (i64)threadIdx.x * VEC; c < cols; c += (i64)NT * VEC) {
        int n = chunk_len(c, cols);
        float v[VEC], g[VEC];
        ld8(x, dx, base + c, n, v);
        ld8(gamma, dg, c, n, g);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k < n) v[k] = v[k] * rf * g[k];
        st8(y, dy, base + c, n, v);
    }
    if (threadIdx.x == 0) rstd[blockIdx.x] = rf;
}

// rmsnorm_bwd_dx: per row, with xhat = x*rstd and g = dy*gamma,
// dx += (g - xhat*mean(g*xhat)) * rstd; chunks of VEC columns as
// rmsnorm_fwd, the row's sum in double, chunks in column order, then the
// fixed tree.
extern "C" __global__ void rmsnorm_bwd_dx(const void* dy, int ddy, const void* x, int dx_, const void* gamma, int dg,
                                          const float* rstd, void* dx, int ddx, i64 cols) {
    __shared__ double sh[NT];
    i64 base = (i64)blockIdx.x * cols;
    float rr = rstd[blockIdx.x];
    double sgx = 0;
    for (i64 c = (i64)threadIdx.x * VEC; c < cols; c += (i64)NT * VEC) {
        int n = chunk_len(c, cols);
        float xv[VEC], dv[VEC], gv[VEC];
        ld8(x, dx_, base + c, n, xv);
        ld8(dy, ddy, base + c, n, dv);
        ld8(gamma, dg, c, n, gv);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k < n) sgx += (double)(dv[k] * gv[k]) * (double)(xv[k] * rr);
    }
    sgx = block_sum_d(sgx, sh);
    float mgx = (float)(sgx / (double)cols);
    for (i64 c = (i64)threadIdx.x * VEC; c < cols; c += (i64)NT * VEC) {
        int n = chunk_len(c, cols);
        float xv[VEC], dv[VEC], gv[VEC], ov[VEC];
        ld8(x, dx_, base + c, n, xv);
        ld8(dy, ddy, base + c, n, dv);
        ld8(gamma, dg, c, n, gv);
        ld8(dx, ddx, base + c, n, ov);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k < n) ov[k] = ov[k] + (dv[k] * gv[k] - (xv[k] * rr) * mgx) * rr;
        st8(dx, ddx, base + c, n, ov);
    }
}

// rmsnorm_bwd_gamma_part: the block sums of dgamma (dy*x*rstd) into part
// (as layernorm_bwd_params_part); colsum_final adds them up.
extern "C" __global__ void rmsnorm_bwd_gamma_part(const void* dy, int ddy, const void* x, int dx_, const float* rstd,
                                                  float* part, i64 rows, i64 cols) {
    GRID_STRIDE(j, col_blocks(rows) * cols) {
        i64 b = j / cols, c = j % cols, end = b * COL_BLOCK + COL_BLOCK < rows ? b * COL_BLOCK + COL_BLOCK : rows;
        float ag = 0;
        for (i64 r = b * COL_BLOCK; r < end; r++) ag += ld(dy, ddy, r * cols + c) * (ld(x, dx_, r * cols + c) * rstd[r]);
        part[j] = ag;
    }
}

// ---- attention (flash-attention algorithm, fp32 tiles) -------------------
//
// Packed qkv: token (b,t) holds W = (H+2·KV)·D values: q heads 0..H-1, k
// heads 0..KV-1, v heads 0..KV-1. Query head h reads key/value head
// h / (H/KV). out is (B, T, H·D); lse and the backward's row dots are
// (B, H, T). Query (b,i) sees keys j with lo_i <= j <= i, lo_i = i -
// pos[b,i] (pos null: pos[b,i] = i, so lo_i = 0). check_pos has refused a
// pos outside [0, i] before the kernels run (bad set: they return at
// once), so every query sees at least its own key. With a sliding window
// (window > 0, gpu.AttnOptions.Window) lo_i is at least i - window + 1;
// the forward and dQ kernels start at the first key tile any of their
// queries sees and the dK/dV kernels stop at the last query tile that sees
// any of their keys, so a call costs O(T·window), not O(T²). Scores s =
// (q·k)·scale, or with a soft cap (cap > 0) cap·tanh((q·k)·scale/cap)
// (tanhf, fp32); the backward multiplies dS by 1 - (s/cap)². q·k summed
// in fp32 in index order. scale, window and cap 0 give the plain
// attention's bits. No B×H×T×T storage: tiles of q, k, v
// (widened to fp32) go through shared memory, rows padded to the kernel's
// largest head dimension + 1 floats against bank conflicts. Every sum has a fixed order and every output
// element one writer: no atomics, bit-identical run to run.

#define ATT_D 128   // the largest head dimension of attn_fwd, attn_bwd_dkv, attn_bwd_dq (and the _tc kernels)
#define AF_BQ 32    // forward: query rows of a block
#define AF_BK 32    // forward: key rows of a tile
#define AF_NT 128   // forward: threads of a block
#define AB_BQ 16    // backward: query rows of a tile
#define AB_BK 16    // backward: key rows of a tile
#define AB_NT 128   // backward: threads of a block
// The wide kernels (attn_fwd_wide, attn_bwd_dkv_wide, attn_bwd_dq_wide)
// take head dimensions up to 256 (Gemma 2 and 3): rows of 257 floats,
// so half the rows a tile (a quarter of the backward's area) to stay
// within the 48 KiB of static shared memory; the same code as the
// narrow kernels (the templates below), so the same order of every sum.
#define ATT_WD 256  // the largest head dimension of the wide kernels
#define AFW_BQ 16   // wide forward: query rows of a block
#define AFW_BK 16   // wide forward: key rows of a tile
#define AFW_NT 128  // wide forward: threads of a block
#define ABW_BQ 8    // wide backward: query rows of a tile
#define ABW_BK 8    // wide backward: key rows of a tile
#define ABW_NT 64   // wide backward: threads of a block

static_assert(AF_NT <= NT && AB_NT <= NT && AFW_NT <= NT && ABW_NT <= NT, "attention blocks are at most NT threads");
static_assert(ATT_WD <= NT, "attn_cached: thread d < D owns output dim d");

#define NEG_INF __int_as_float(0xff800000)

// attn_lo is the first key query i of batch row b (bT = b·T) sees, in
// [0, i] (check_pos refused any other pos): the first of its example and,
// with a sliding window (window > 0), of the window's keys
// i-window+1..i.
__device__ __forceinline__ int attn_lo(const int* pos, i64 bT, int i, int window) {
    int lo = pos ? i - pos[bT + i] : 0;
    return window > 0 ? max(lo, i - window + 1) : lo;
}

// attn_qend is one past the last query that sees a key at or before kend:
// T, or with a sliding window kend + window (the backward's dK/dV loops
// stop there, so a key tile costs O(window), not O(T)).
__device__ __forceinline__ int attn_qend(int kend, int T, int window) {
    return window > 0 && kend + window < T ? kend + window : T;
}

// attn_score is the score of the product a of a query and a key: a·scale,
// with a soft cap (cap > 0) cap·tanh(a·scale/cap) (fp32, Gemma 2).
__device__ __forceinline__ float attn_score(float a, float scale, float cap) {
    float x = a * scale;
    return cap > 0 ? cap * tanhf(x / cap) : x;
}

// attn_dcap is the soft cap's derivative at the capped score z: 1 -
// (z/cap)² (1 without a cap). dS of the backward is multiplied by it.
__device__ __forceinline__ float attn_dcap(float z, float cap) {
    if (!(cap > 0)) return 1.0f;
    float t = z / cap;
    return 1.0f - t * t;
}

// attn_los fills los[0..n) with the first key each of the n queries from
// q0 sees (T for a row past the sequence: it sees none); threads < n.
__device__ __forceinline__ void attn_los(int* los, const int* pos, i64 bT, int q0, int n, int T, int window) {
    if ((int)threadIdx.x < n) {
        int t = q0 + (int)threadIdx.x;
        los[threadIdx.x] = t < T ? attn_lo(pos, bT, t, window) : T;
    }
}

// attn_jmin is the first key any of los[0..n) sees (after a barrier).
__device__ __forceinline__ int attn_jmin(const int* los, int n, int T) {
    int j = T;
    for (int rr = 0; rr < n; rr++) j = min(j, los[rr]);
    return j;
}

// attn_tile loads rows [r0, r0+n) of one head of qkv (column offset col =
// head·D within a row) into tile (n rows of DP floats); rows past T
// read as zeros. nt threads share the work.
template <int DP>
__device__ __forceinline__ void attn_tile(float* tile, const void* qkv, int dq, i64 bT, int r0, int n, int T, i64 W,
                                          i64 col, int D, int nt) {
    for (int e = threadIdx.x; e < n * D; e += nt) {
        int rr = e / D, d = e % D;
        int t = r0 + rr;
        tile[rr * DP + d] = t < T ? ld(qkv, dq, (bT + t) * W + col + d) : 0.0f;
    }
}

// attn_fwd: one block of NTH threads per (b, h, query tile of BQ rows),
// longest tiles first; thread (r, part) owns query row r, the scores of
// key columns part + TPR·k, and output dims part + TPR·k (TPR = NTH/BQ).
// Per key tile: S = Q·Kᵀ·scale (masked: -inf), the row max m, P =
// exp(S - m) in fp32, l = l·exp(m_old - m) + rowsum(P), O = O·exp(m_old - m)
// + P·V. At the end out = O / l and lse = m + log(l). bad: check_pos's
// flag (null when pos is null and nothing was checked).
//
// attn_fwd (D <= ATT_D: AF_BQ, AF_BK, AF_NT) and attn_fwd_wide (D <=
// ATT_WD: AFW_BQ, AFW_BK, AFW_NT) are this template: DM the largest head
// dimension, BQ query rows a block, BK key rows a tile, NTH threads.
template <int DM, int BQ, int BK, int NTH>
__device__ __forceinline__ void attn_fwd_tiles(const void* qkv, int dq, void* out, int dout, float* lse, const int* pos,
                                               int T, int H, int KV, int D, int nqt, float scale, int window, float cap,
                                               const int* bad) {
    constexpr int DP = DM + 1;    // row stride of the tiles (no bank conflicts on the row-wise reads)
    constexpr int TPR = NTH / BQ; // threads per query row
    constexpr int CPT = BK / TPR; // scores per thread per tile
    constexpr int DPT = DM / TPR; // output dims per thread
    static_assert(NTH % BQ == 0 && BK % TPR == 0 && DM % TPR == 0 && NTH <= NT, "forward tile shape");
    __shared__ float Qs[BQ * DP];
    __shared__ float KVs[BK * DP];
    __shared__ float Ps[BQ * (BK + 1)];
    __shared__ int los[BQ];
    if (bad && *bad) return; // the same for every thread
    const i64 W = (i64)(H + 2 * KV) * D;
    const i64 blk = blockIdx.x;
    const int qt = nqt - 1 - (int)(blk % nqt);
    const int h = (int)((blk / nqt) % H);
    const int b = (int)(blk / nqt / H);
    const int g = h / (H / KV);
    const int q0 = qt * BQ;
    const int r = threadIdx.x / TPR, part = threadIdx.x % TPR;
    const int i = q0 + r;
    const bool rowOK = i < T;
    const i64 bT = (i64)b * T;
    attn_tile<DP>(Qs, qkv, dq, bT, q0, BQ, T, W, (i64)h * D, D, NTH);
    attn_los(los, pos, bT, q0, BQ, T, window);
    __syncthreads();
    const int lo = los[r];
    const int jmin = attn_jmin(los, BQ, T);
    const int jmax = min(q0 + BQ, T) - 1;
    float m = NEG_INF, l = 0;
    float o[DPT];
#pragma unroll
    for (int k = 0; k < DPT; k++) o[k] = 0;
    const float* q = Qs + r * DP;
    float* prow = Ps + r * (BK + 1);
    for (int k0 = (jmin / BK) * BK; k0 <= jmax; k0 += BK) {
        __syncthreads(); // the previous tile's reads of KVs and Ps are done
        attn_tile<DP>(KVs, qkv, dq, bT, k0, BK, T, W, (i64)(H + g) * D, D, NTH);
        __syncthreads();
        float s[CPT];
#pragma unroll
        for (int kk = 0; kk < CPT; kk++) {
            int c = part + TPR * kk, j = k0 + c;
            float v = NEG_INF;
            if (rowOK && j >= lo && j <= i) {
                const float* kr = KVs + c * DP;
                float a = 0;
                for (int d = 0; d < D; d++) a += q[d] * kr[d];
                v = attn_score(a, scale, cap);
            }
            s[kk] = v;
            prow[c] = v;
        }
        __syncthreads(); // the scores are in Ps; K is no longer read
        attn_tile<DP>(KVs, qkv, dq, bT, k0, BK, T, W, (i64)(H + KV + g) * D, D, NTH);
        float mt = m;
        for (int c = 0; c < BK; c++) mt = fmaxf(mt, prow[c]);
#pragma unroll
        for (int kk = 0; kk < CPT; kk++) s[kk] = s[kk] == NEG_INF ? 0.0f : expf(s[kk] - mt);
        __syncthreads(); // every thread has read its row's scores; V is loaded
#pragma unroll
        for (int kk = 0; kk < CPT; kk++) prow[part + TPR * kk] = s[kk];
        __syncthreads();
        if (mt != NEG_INF) {
            float alpha = m == NEG_INF ? 0.0f : expf(m - mt);
            float rs = 0;
            for (int c = 0; c < BK; c++) rs += prow[c];
            l = l * alpha + rs;
            m = mt;
#pragma unroll
            for (int k = 0; k < DPT; k++) {
                int d = part + TPR * k;
                if (d < D) {
                    float a = o[k] * alpha;
                    for (int c = 0; c < BK; c++) a += prow[c] * KVs[c * DP + d];
                    o[k] = a;
                }
            }
        }
    }
    if (!rowOK) return;
#pragma unroll
    for (int k = 0; k < DPT; k++) {
        int d = part + TPR * k;
        if (d < D) st(out, dout, (bT + i) * ((i64)H * D) + (i64)h * D + d, l > 0 ? o[k] / l : 0.0f);
    }
    if (part == 0) lse[((i64)b * H + h) * T + i] = l > 0 ? m + logf(l) : NEG_INF;
}

extern "C" __global__ void __launch_bounds__(AF_NT) attn_fwd(const void* qkv, int dq, void* out, int dout, float* lse,
                                                             const int* pos, int T, int H, int KV, int D, int nqt,
                                                             float scale, int window, float cap, const int* bad) {
    attn_fwd_tiles<ATT_D, AF_BQ, AF_BK, AF_NT>(qkv, dq, out, dout, lse, pos, T, H, KV, D, nqt, scale, window, cap, bad);
}

extern "C" __global__ void __launch_bounds__(AFW_NT) attn_fwd_wide(const void* qkv, int dq, void* out, int dout,
                                                                   float* lse, const int* pos, int T, int H, int KV,
                                                                   int D, int nqt, float scale, int window, float cap,
                                                                   const int* bad) {
    attn_fwd_tiles<ATT_WD, AFW_BQ, AFW_BK, AFW_NT>(qkv, dq, out, dout, lse, pos, T, H, KV, D, nqt, scale, window, cap,
                                                   bad);
}

// attn_bwd_rowdot: drow[(b,h,t)] = sum_d dout·out over the head's D values,
// fp32 in index order (FlashAttention-2's D_i). n = B·H·T.
extern "C" __global__ void attn_bwd_rowdot(const void* dout, int ddo, const void* out, int dto, float* drow, int T,
                                           int H, int D, i64 n) {
    GRID_STRIDE(x, n) {
        i64 t = x % T, bh = x / T;
        i64 h = bh % H, b = bh / H;
        i64 base = (b * T + t) * ((i64)H * D) + h * D;
        float a = 0;
        for (int d = 0; d < D; d++) a += ld(dout, ddo, base + d) * ld(out, dto, base + d);
        drow[x] = a;
    }
}

// attn_bwd_p recomputes, for query row rr of the tile at q0 and key c of
// the tile at k0, P = exp(S - lse) and dS = P·(dO·V - drow), or zeros
// outside the mask. DP: the tiles' row stride.
template <int DP>
__device__ __forceinline__ void attn_bwd_p(const float* Qs, const float* Os, const float* Ks, const float* Vs, int rr,
                                           int c, int i, int j, int lo, float lsev, float drv, int T, int D,
                                           float scale, float cap, float* p, float* ds) {
    *p = 0;
    *ds = 0;
    if (i >= T || j < lo || j > i) return;
    const float *q = Qs + rr * DP, *k = Ks + c * DP, *go = Os + rr * DP, *v = Vs + c * DP;
    float a = 0;
    for (int d = 0; d < D; d++) a += q[d] * k[d];
    const float z = attn_score(a, scale, cap);
    float pv = expf(z - lsev);
    float dp = 0;
    for (int d = 0; d < D; d++) dp += go[d] * v[d];
    *p = pv;
    *ds = cap > 0 ? pv * (dp - drv) * attn_dcap(z, cap) : pv * (dp - drv);
}

// attn_bwd_dkv: one block of NTH threads per (b, key/value head g, key
// tile of BK rows); thread (c, part) owns key row c and dims part +
// TPR·k of dK and dV, accumulated in registers over the group's query
// heads in order and, for each, over the query tiles at or after the key
// tile in order (tiles no row of which sees a key of this tile are
// skipped): dV += Pᵀ·dO, dK += dSᵀ·Q; then dK·scale and dV are written.
//
// attn_bwd_dkv (D <= ATT_D: AB_BQ, AB_BK, AB_NT) and attn_bwd_dkv_wide (D <=
// ATT_WD: ABW_BQ, ABW_BK, ABW_NT) are this template, as attn_fwd_tiles.
template <int DM, int BQ, int BK, int NTH>
__device__ __forceinline__ void attn_bwd_dkv_tiles(const void* dout, int ddo, const void* qkv, int dq,
                                                   const float* lse, const float* drow, const int* pos, void* dqkv,
                                                   int ddq, int T, int H, int KV, int D, int nkt, float scale,
                                                   int window, float cap, const int* bad) {
    constexpr int DP = DM + 1;    // row stride of the tiles
    constexpr int TPR = NTH / BK; // threads per owned row
    constexpr int EPT = BQ / TPR; // score entries per thread per tile
    constexpr int DPT = DM / TPR; // owned dims per thread
    static_assert(BQ == BK && NTH % BK == 0 && BQ % TPR == 0 && DM % TPR == 0 && NTH <= NT, "backward tile shape");
    __shared__ float Ks[BK * DP];
    __shared__ float Vs[BK * DP];
    __shared__ float Qs[BQ * DP];
    __shared__ float Os[BQ * DP];
    __shared__ float Ps[BQ * (BK + 1)];
    __shared__ float lses[BQ], drs[BQ];
    __shared__ int los[BQ];
    if (bad && *bad) return; // the same for every thread
    const i64 W = (i64)(H + 2 * KV) * D;
    const i64 blk = blockIdx.x;
    const int kt = (int)(blk % nkt);
    const int g = (int)((blk / nkt) % KV);
    const int b = (int)(blk / nkt / KV);
    const int R = H / KV;
    const int k0 = kt * BK, kend = min(k0 + BK, T) - 1, qend = attn_qend(kend, T, window);
    const int c = threadIdx.x / TPR, part = threadIdx.x % TPR;
    const int j = k0 + c;
    const i64 bT = (i64)b * T;
    attn_tile<DP>(Ks, qkv, dq, bT, k0, BK, T, W, (i64)(H + g) * D, D, NTH);
    attn_tile<DP>(Vs, qkv, dq, bT, k0, BK, T, W, (i64)(H + KV + g) * D, D, NTH);
    float dk[DPT], dv[DPT];
#pragma unroll
    for (int k = 0; k < DPT; k++) dk[k] = dv[k] = 0;
    for (int h = g * R; h < (g + 1) * R; h++) {
        const i64 lrow = ((i64)b * H + h) * T;
        for (int q0 = (k0 / BQ) * BQ; q0 < qend; q0 += BQ) {
            __syncthreads(); // the previous tile's reads are done
            attn_tile<DP>(Qs, qkv, dq, bT, q0, BQ, T, W, (i64)h * D, D, NTH);
            for (int e = threadIdx.x; e < BQ * D; e += NTH) {
                int rr = e / D, d = e % D, t = q0 + rr;
                Os[rr * DP + d] = t < T ? ld(dout, ddo, (bT + t) * ((i64)H * D) + (i64)h * D + d) : 0.0f;
            }
            if (threadIdx.x < BQ) {
                int t = q0 + threadIdx.x;
                lses[threadIdx.x] = t < T ? lse[lrow + t] : 0.0f;
                drs[threadIdx.x] = t < T ? drow[lrow + t] : 0.0f;
                los[threadIdx.x] = t < T ? attn_lo(pos, bT, t, window) : T;
            }
            __syncthreads();
            bool any = false;
            for (int rr = 0; rr < BQ; rr++) {
                int t = q0 + rr;
                any = any || (t < T && max(los[rr], k0) <= min(t, kend));
            }
            if (!any) continue; // the same for every thread of the block
            float ds[EPT];
#pragma unroll
            for (int e = 0; e < EPT; e++) {
                int rr = part + TPR * e;
                float p;
                attn_bwd_p<DP>(Qs, Os, Ks, Vs, rr, c, q0 + rr, j, los[rr], lses[rr], drs[rr], T, D, scale, cap, &p,
                               &ds[e]);
                Ps[rr * (BK + 1) + c] = p;
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < DPT; k++) {
                int d = part + TPR * k;
                if (d < D) {
                    float a = dv[k];
                    for (int rr = 0; rr < BQ; rr++) a += Ps[rr * (BK + 1) + c] * Os[rr * DP + d];
                    dv[k] = a;
                }
            }
            __syncthreads(); // P is read; dS replaces it
#pragma unroll
            for (int e = 0; e < EPT; e++) Ps[(part + TPR * e) * (BK + 1) + c] = ds[e];
            __syncthreads();
#pragma unroll
            for (int k = 0; k < DPT; k++) {
                int d = part + TPR * k;
                if (d < D) {
                    float a = dk[k];
                    for (int rr = 0; rr < BQ; rr++) a += Ps[rr * (BK + 1) + c] * Qs[rr * DP + d];
                    dk[k] = a;
                }
            }
        }
    }
    if (j >= T) return;
#pragma unroll
    for (int k = 0; k < DPT; k++) {
        int d = part + TPR * k;
        if (d < D) {
            st(dqkv, ddq, (bT + j) * W + (i64)(H + g) * D + d, dk[k] * scale);
            st(dqkv, ddq, (bT + j) * W + (i64)(H + KV + g) * D + d, dv[k]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(AB_NT) attn_bwd_dkv(const void* dout, int ddo, const void* qkv, int dq,
                                                                 const float* lse, const float* drow, const int* pos,
                                                                 void* dqkv, int ddq, int T, int H, int KV, int D,
                                                                 int nkt, float scale, int window, float cap,
                                                                 const int* bad) {
    attn_bwd_dkv_tiles<ATT_D, AB_BQ, AB_BK, AB_NT>(dout, ddo, qkv, dq, lse, drow, pos, dqkv, ddq, T, H, KV, D, nkt,
                                                   scale, window, cap, bad);
}

extern "C" __global__ void __launch_bounds__(ABW_NT) attn_bwd_dkv_wide(const void* dout, int ddo, const void* qkv, int dq,
                                                                       const float* lse, const float* drow, const int* pos,
                                                                       void* dqkv, int ddq, int T, int H, int KV, int D,
                                                                       int nkt, float scale, int window, float cap,
                                                                       const int* bad) {
    attn_bwd_dkv_tiles<ATT_WD, ABW_BQ, ABW_BK, ABW_NT>(dout, ddo, qkv, dq, lse, drow, pos, dqkv, ddq, T, H, KV, D, nkt,
                                                       scale, window, cap, bad);
}

// attn_bwd_dq: one block of NTH threads per (b, h, query tile of BQ
// rows), longest tiles first; thread (r, part) owns query row r and dims
// part + TPR·k of dQ, accumulated over the key tiles in order: dQ +=
// dS·K; then dQ·scale is written.
//
// attn_bwd_dq (D <= ATT_D: AB_BQ, AB_BK, AB_NT) and attn_bwd_dq_wide (D <=
// ATT_WD: ABW_BQ, ABW_BK, ABW_NT) are this template, as attn_fwd_tiles.
template <int DM, int BQ, int BK, int NTH>
__device__ __forceinline__ void attn_bwd_dq_tiles(const void* dout, int ddo, const void* qkv, int dq,
                                                  const float* lse, const float* drow, const int* pos, void* dqkv,
                                                  int ddq, int T, int H, int KV, int D, int nqt, float scale,
                                                  int window, float cap, const int* bad) {
    constexpr int DP = DM + 1;    // row stride of the tiles
    constexpr int TPR = NTH / BK; // threads per owned row
    constexpr int EPT = BQ / TPR; // score entries per thread per tile
    constexpr int DPT = DM / TPR; // owned dims per thread
    static_assert(BQ == BK && NTH % BK == 0 && BQ % TPR == 0 && DM % TPR == 0 && NTH <= NT, "backward tile shape");
    __shared__ float Qs[BQ * DP];
    __shared__ float Os[BQ * DP];
    __shared__ float Ks[BK * DP];
    __shared__ float Vs[BK * DP];
    __shared__ float Ps[BQ * (BK + 1)];
    __shared__ int los[BQ];
    if (bad && *bad) return; // the same for every thread
    const i64 W = (i64)(H + 2 * KV) * D;
    const i64 blk = blockIdx.x;
    const int qt = nqt - 1 - (int)(blk % nqt);
    const int h = (int)((blk / nqt) % H);
    const int b = (int)(blk / nqt / H);
    const int g = h / (H / KV);
    const int q0 = qt * BQ;
    const int r = threadIdx.x / TPR, part = threadIdx.x % TPR;
    const int i = q0 + r;
    const bool rowOK = i < T;
    const i64 bT = (i64)b * T;
    const i64 lrow = ((i64)b * H + h) * T;
    attn_tile<DP>(Qs, qkv, dq, bT, q0, BQ, T, W, (i64)h * D, D, NTH);
    for (int e = threadIdx.x; e < BQ * D; e += NTH) {
        int rr = e / D, d = e % D, t = q0 + rr;
        Os[rr * DP + d] = t < T ? ld(dout, ddo, (bT + t) * ((i64)H * D) + (i64)h * D + d) : 0.0f;
    }
    attn_los(los, pos, bT, q0, BQ, T, window);
    const float lsev = rowOK ? lse[lrow + i] : 0.0f, drv = rowOK ? drow[lrow + i] : 0.0f;
    __syncthreads();
    const int lo = los[r];
    const int jmin = attn_jmin(los, BQ, T);
    const int jmax = min(q0 + BQ, T) - 1;
    float acc[DPT];
#pragma unroll
    for (int k = 0; k < DPT; k++) acc[k] = 0;
    for (int k0 = (jmin / BK) * BK; k0 <= jmax; k0 += BK) {
        __syncthreads(); // the previous tile's reads are done
        attn_tile<DP>(Ks, qkv, dq, bT, k0, BK, T, W, (i64)(H + g) * D, D, NTH);
        attn_tile<DP>(Vs, qkv, dq, bT, k0, BK, T, W, (i64)(H + KV + g) * D, D, NTH);
        __syncthreads();
#pragma unroll
        for (int e = 0; e < EPT; e++) {
            int c = part + TPR * e;
            float p, ds;
            attn_bwd_p<DP>(Qs, Os, Ks, Vs, r, c, i, k0 + c, lo, lsev, drv, T, D, scale, cap, &p, &ds);
            Ps[r * (BK + 1) + c] = ds;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < DPT; k++) {
            int d = part + TPR * k;
            if (d < D) {
                float a = acc[k];
                for (int c = 0; c < BK; c++) a += Ps[r * (BK + 1) + c] * Ks[c * DP + d];
                acc[k] = a;
            }
        }
    }
    if (!rowOK) return;
#pragma unroll
    for (int k = 0; k < DPT; k++) {
        int d = part + TPR * k;
        if (d < D) st(dqkv, ddq, (bT + i) * W + (i64)h * D + d, acc[k] * scale);
    }
}

extern "C" __global__ void __launch_bounds__(AB_NT) attn_bwd_dq(const void* dout, int ddo, const void* qkv, int dq,
                                                                const float* lse, const float* drow, const int* pos,
                                                                void* dqkv, int ddq, int T, int H, int KV, int D,
                                                                int nqt, float scale, int window, float cap,
                                                                const int* bad) {
    attn_bwd_dq_tiles<ATT_D, AB_BQ, AB_BK, AB_NT>(dout, ddo, qkv, dq, lse, drow, pos, dqkv, ddq, T, H, KV, D, nqt,
                                                  scale, window, cap, bad);
}

extern "C" __global__ void __launch_bounds__(ABW_NT) attn_bwd_dq_wide(const void* dout, int ddo, const void* qkv, int dq,
                                                                      const float* lse, const float* drow, const int* pos,
                                                                      void* dqkv, int ddq, int T, int H, int KV, int D,
                                                                      int nqt, float scale, int window, float cap,
                                                                      const int* bad) {
    attn_bwd_dq_tiles<ATT_WD, ABW_BQ, ABW_BK, ABW_NT>(dout, ddo, qkv, dq, lse, drow, pos, dqkv, ddq, T, H, KV, D, nqt,
                                                      scale, window, cap, bad);
}

// ---- attention on tensor cores (mma.sync) ---------------------------------
//
// With q, k and v in a 16-bit float (bf16 or f16, dt), a head dimension D
// that is a multiple of 16 and a device of sm_80 or later, ops_attn.go
// launches attn_fwd_tc, attn_bwd_dq_tc and attn_bwd_dkv_tc instead of the
// kernels above: the same algorithm (FlashAttention-2: online softmax,
// P recomputed from lse in the backward, dK/dV and dQ in separate
// kernels, no atomics, no B×H×T×T storage), with the products on tensor
// cores through mma.sync.m16n8k16 (fp32 accumulation). What differs in
// the numbers: P (forward: exp(S - m); backward: exp(S - lse)) and dS are
// rounded to dt before they multiply V, dO, K or Q, as FlashAttention-2
// does; and the sums of q·k are the tensor cores' (fp32, order not
// specified by the PTX ISA), not a loop in index order. Bit-identical run
// to run still: every output element has one writer and every loop a
// fixed order.
//
// A block is 4 warps; warp w owns rows 16w..16w+15 of the block's TC_BQ
// rows (forward and dQ: queries; dK/dV: keys), held as mma fragments in
// registers; tiles of TC_BK columns (keys; dK/dV: queries) go through
// shared memory as raw 16-bit values, row-major (stride TC_DP) for a B
// operand read along the head dimension and transposed (stride TC_TP) for
// one read along tokens. The fragment layouts are the PTX ISA's for
// m16n8k16 with .bf16/.f16 (groupID = lane/4, threadID_in_group = lane%4):
//
//	A (16×16, 4 regs of 2): a0,a1 row g, cols 2t, 2t+1; a2,a3 row g+8;
//	                        a4..a7 the same rows, cols 2t+8, 2t+9
//	B (16×8, 2 regs of 2):  b0,b1 rows 2t, 2t+1 of col g; b2,b3 rows 2t+8, 2t+9
//	C (16×8, 4 floats):     c0,c1 row g, cols 2t, 2t+1; c2,c3 row g+8
//
// so the C fragments of two neighbouring 16×8 tiles are, rounded, the A
// fragment of their 16×16 block (frag_p): P and dS never leave registers.
// The CPU emulator (testdata/emu) runs these kernels with a warp model of
// mma.sync and the shuffles.

#define TC_BQ 64           // rows of a block: 16 a warp
#define TC_BK 32           // columns of a tile
#define TC_NT 128          // threads of a block: 4 warps
#define TC_DP (ATT_D + 8)  // row stride (16-bit values) of a token-major tile
#define TC_TP (TC_BK + 8)  // row stride of a transposed (dimension-major) tile
#define FULL_WARP 0xffffffffu

static_assert(TC_NT == 128 && TC_BQ == 16 * (TC_NT / 32) && TC_BK % 16 == 0 && ATT_D % 16 == 0, "tensor-core tiles");

// ld_pair loads two neighbouring 16-bit values (p 4-byte aligned) as one
// register, the first in the low half, as the fragments hold them. The
// tiles are __align__(16) (a u16 array alone is only 2-byte aligned) with
// even strides, and every pair starts at an even column.
#ifndef STRATA_EMU
__device__ __forceinline__ unsigned ld_pair(const u16* p) { return *(const unsigned*)p; }

// mma16816: d += A·B for the warp's 16×16 A and 16×8 B of 16-bit floats
// of type dt (bf16 or f16) and its 16×8 fp32 d, in the fragment layouts
// above. The GPU instruction needs sm_80: ops_attn.go launches the _tc
// kernels only there (an older device traps).
__device__ __forceinline__ void mma16816(int dt, float* d, const unsigned* a, const unsigned* b) {
#if __CUDA_ARCH__ >= 800
    if (dt == DT_F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap();
#endif
}
#endif

__device__ __forceinline__ unsigned pack2(int dt, float lo, float hi) {
    return (unsigned)f2half(dt, lo) | ((unsigned)f2half(dt, hi) << 16);
}

// frag_a loads the A fragment of the 16×16 block of tile t (row stride
// ld) at row r0, column c0.
__device__ __forceinline__ void frag_a(unsigned* a, const u16* t, int ld, int r0, int c0) {
    const int g = (threadIdx.x % 32) / 4, c = c0 + (threadIdx.x % 4) * 2;
    a[0] = ld_pair(t + (r0 + g) * ld + c);
    a[1] = ld_pair(t + (r0 + g + 8) * ld + c);
    a[2] = ld_pair(t + (r0 + g) * ld + c + 8);
    a[3] = ld_pair(t + (r0 + g + 8) * ld + c + 8);
}

// frag_b loads the B fragment B[k][n] = t[(n0+n)·ld + k0+k] (t holds Bᵀ
// row-major: B column-major, the .col of the instruction).
__device__ __forceinline__ void frag_b(unsigned* b, const u16* t, int ld, int n0, int k0) {
    const int g = (threadIdx.x % 32) / 4, k = k0 + (threadIdx.x % 4) * 2;
    b[0] = ld_pair(t + (n0 + g) * ld + k);
    b[1] = ld_pair(t + (n0 + g) * ld + k + 8);
}

// frag_p rounds the C fragments of two neighbouring 16×8 tiles (c0:
// columns 0-7, c1: 8-15) to dt as the A fragment of their 16×16 block.
__device__ __forceinline__ void frag_p(int dt, unsigned* a, const float* c0, const float* c1) {
    a[0] = pack2(dt, c0[0], c0[1]);
    a[1] = pack2(dt, c0[2], c0[3]);
    a[2] = pack2(dt, c1[0], c1[1]);
    a[3] = pack2(dt, c1[2], c1[3]);
}

// tc_query_block is the block of attn_fwd_tc and attn_bwd_dq_tc: one per
// (batch row b, head h, tile of TC_BQ queries from q0), the longest tiles
// (the last) first; g is h's key/value head.
struct tc_query_block {
    int b, h, g, q0;
};
__device__ __forceinline__ tc_query_block tc_query_block_of(int nqt, int H, int KV) {
    const i64 blk = blockIdx.x;
    tc_query_block q;
    q.q0 = (nqt - 1 - (int)(blk % nqt)) * TC_BQ;
    q.h = (int)((blk / nqt) % H);
    q.b = (int)(blk / nqt / H);
    q.g = q.h / (H / KV);
    return q;
}

// tc_scores: c = A·Xᵀ for the warp's 16 rows (A as fragments a, nk
// k-steps of the head) against the TC_BK token rows of tile t (row-major,
// stride TC_DP): c[nt] is the 16×8 C fragment of tokens 8nt … 8nt+7.
__device__ __forceinline__ void tc_scores(int dt, float (*c)[4], const unsigned (*a)[4], const u16* t, int nk) {
#pragma unroll
    for (int nt = 0; nt < TC_BK / 8; nt++) {
        c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0;
#pragma unroll
        for (int ks = 0; ks < ATT_D / 16; ks++)
            if (ks < nk) {
                unsigned b[2];
                frag_b(b, t, TC_DP, nt * 8, ks * 16);
                mma16816(dt, c[nt], a[ks], b);
            }
    }
}

// tc_accumulate: acc += P·X for the warp's 16 rows, P the C fragments p
// over the tile's TC_BK tokens (rounded to dt), X those tokens' rows
// transposed in t (stride TC_TP): acc[n] holds head dims 8n … 8n+7.
__device__ __forceinline__ void tc_accumulate(int dt, float (*acc)[4], const float (*p)[4], const u16* t, int D) {
#pragma unroll
    for (int kk = 0; kk < TC_BK / 16; kk++) {
        unsigned pa[4];
        frag_p(dt, pa, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
        for (int n = 0; n < ATT_D / 8; n++)
            if (n < D / 8) {
                unsigned b[2];
                frag_b(b, t, TC_TP, n * 8, kk * 16);
                mma16816(dt, acc[n], pa, b);
            }
    }
}

// tc_tile loads rows [r0, r0+n) of the head at column col of x (rows of
// W values, batch row at bT) into tile as raw 16-bit values, row-major
// (stride TC_DP); tc_tile_t transposed (tile[d·TC_TP + row]). Rows past T
// are zeros.
__device__ __forceinline__ void tc_tile(u16* tile, const void* x, i64 bT, int r0, int n, int T, i64 W, i64 col, int D) {
    for (int e = threadIdx.x; e < n * D; e += TC_NT) {
        int rr = e / D, d = e % D, t = r0 + rr;
        tile[rr * TC_DP + d] = t < T ? ((const u16*)x)[(bT + t) * W + col + d] : (u16)0;
    }
}

__device__ __forceinline__ void tc_tile_t(u16* tile, const void* x, i64 bT, int r0, int n, int T, i64 W, i64 col, int D) {
    for (int e = threadIdx.x; e < n * D; e += TC_NT) {
        int rr = e / D, d = e % D, t = r0 + rr;
        tile[d * TC_TP + rr] = t < T ? ((const u16*)x)[(bT + t) * W + col + d] : (u16)0;
    }
}

// row_max4 and row_sum4: the max and the sum over the 4 lanes of a group
// (the threads holding one row of a C fragment); every lane gets the same
// bits (IEEE addition commutes).
__device__ __forceinline__ float row_max4(float v) {
    v = fmaxf(v, __shfl_xor_sync(FULL_WARP, v, 1));
    return fmaxf(v, __shfl_xor_sync(FULL_WARP, v, 2));
}
__device__ __forceinline__ float row_sum4(float v) {
    v += __shfl_xor_sync(FULL_WARP, v, 1);
    return v + __shfl_xor_sync(FULL_WARP, v, 2);
}

// attn_fwd_tc: attn_fwd on tensor cores. One block per (b, h, query tile
// of TC_BQ rows), longest first; warp w's rows i (C rows g and g+8 of its
// 16), per key tile: S = Q·Kᵀ (mma), scaled and masked, the row max m over
// the tile and the group's lanes, P = exp(S - m) and the lane's part of
// the row sum l, O = O·exp(m_old - m) + P·V (mma, P rounded to dt). At the
// end l is summed over the group, out = O / l and lse = m + log(l).
extern "C" __global__ void __launch_bounds__(TC_NT) attn_fwd_tc(const void* qkv, int dq, void* out, int dout, float* lse,
                                                                const int* pos, int T, int H, int KV, int D, int nqt,
                                                                float scale, int window, float cap, const int* bad) {
    __shared__ __align__(16) u16 Qs[TC_BQ * TC_DP];
    __shared__ __align__(16) u16 Ks[TC_BK * TC_DP];
    __shared__ __align__(16) u16 Vt[ATT_D * TC_TP];
    __shared__ int los[TC_BQ];
    if (bad && *bad) return; // the same for every thread
    const i64 W = (i64)(H + 2 * KV) * D;
    const tc_query_block qb = tc_query_block_of(nqt, H, KV);
    const int h = qb.h, b = qb.b, g = qb.g, q0 = qb.q0;
    const int w0 = (threadIdx.x / 32) * 16, gid = (threadIdx.x % 32) / 4, tig = threadIdx.x % 4;
    const i64 bT = (i64)b * T;
    tc_tile(Qs, qkv, bT, q0, TC_BQ, T, W, (i64)h * D, D);
    attn_los(los, pos, bT, q0, TC_BQ, T, window);
    __syncthreads();
    const int jmin = attn_jmin(los, TC_BQ, T);
    const int jmax = min(q0 + TC_BQ, T) - 1, nk = D / 16;
    const int row[2] = {q0 + w0 + gid, q0 + w0 + gid + 8}, lo[2] = {los[w0 + gid], los[w0 + gid + 8]};
    unsigned qa[ATT_D / 16][4];
#pragma unroll
    for (int ks = 0; ks < ATT_D / 16; ks++)
        if (ks < nk) frag_a(qa[ks], Qs, TC_DP, w0, ks * 16);
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0, 0};
    float o[ATT_D / 8][4];
#pragma unroll
    for (int dt = 0; dt < ATT_D / 8; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0;
    for (int k0 = (jmin / TC_BK) * TC_BK; k0 <= jmax; k0 += TC_BK) {
        __syncthreads(); // the previous tile's reads are done
        tc_tile(Ks, qkv, bT, k0, TC_BK, T, W, (i64)(H + g) * D, D);
        tc_tile_t(Vt, qkv, bT, k0, TC_BK, T, W, (i64)(H + KV + g) * D, D);
        __syncthreads();
        float s[TC_BK / 8][4];
        tc_scores(dq, s, qa, Ks, nk);
        float mt[2] = {m[0], m[1]}, rs[2] = {0, 0};
#pragma unroll
        for (int nt = 0; nt < TC_BK / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e / 2, i = row[r], j = k0 + nt * 8 + tig * 2 + (e & 1);
                s[nt][e] = i < T && j >= lo[r] && j <= i ? attn_score(s[nt][e], scale, cap) : NEG_INF;
                mt[r] = fmaxf(mt[r], s[nt][e]);
            }
        mt[0] = row_max4(mt[0]);
        mt[1] = row_max4(mt[1]);
#pragma unroll
        for (int nt = 0; nt < TC_BK / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e / 2;
                s[nt][e] = s[nt][e] == NEG_INF ? 0.0f : expf(s[nt][e] - mt[r]);
                rs[r] += s[nt][e];
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float alpha = m[r] == NEG_INF ? 0.0f : expf(m[r] - mt[r]);
            l[r] = l[r] * alpha + rs[r];
            m[r] = mt[r];
#pragma unroll
            for (int dt = 0; dt < ATT_D / 8; dt++) {
                o[dt][2 * r] *= alpha;
                o[dt][2 * r + 1] *= alpha;
            }
        }
        tc_accumulate(dq, o, s, Vt, D);
    }
    l[0] = row_sum4(l[0]);
    l[1] = row_sum4(l[1]);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = row[r];
        if (i >= T) continue;
        const i64 base = (bT + i) * ((i64)H * D) + (i64)h * D + tig * 2;
#pragma unroll
        for (int dt = 0; dt < ATT_D / 8; dt++)
            if (dt < D / 8) {
                st(out, dout, base + dt * 8, l[r] > 0 ? o[dt][2 * r] / l[r] : 0.0f);
                st(out, dout, base + dt * 8 + 1, l[r] > 0 ? o[dt][2 * r + 1] / l[r] : 0.0f);
            }
        if (tig == 0) lse[((i64)b * H + h) * T + i] = l[r] > 0 ? m[r] + logf(l[r]) : NEG_INF;
    }
}

// attn_bwd_dq_tc: attn_bwd_dq on tensor cores (dout of qkv's dtype). One
// block per (b, h, query tile of TC_BQ rows), longest first; warp w holds
// its 16 rows of Q and dO as A fragments; per key tile: S = Q·Kᵀ and dP =
// dO·Vᵀ (mma), P = exp(S·scale - lse) masked, dS = P·(dP - drow), dQ +=
// dS·K (mma, dS rounded to dt); then dQ·scale is written.
extern "C" __global__ void __launch_bounds__(TC_NT) attn_bwd_dq_tc(const void* dout, int ddo, const void* qkv, int dq,
                                                                   const float* lse, const float* drow, const int* pos,
                                                                   void* dqkv, int ddq, int T, int H, int KV, int D,
                                                                   int nqt, float scale, int window, float cap, const int* bad) {
    __shared__ __align__(16) u16 Xs[TC_BQ * TC_DP]; // Q, then dO, on their way into fragments
    __shared__ __align__(16) u16 Ks[TC_BK * TC_DP];
    __shared__ __align__(16) u16 Vs[TC_BK * TC_DP];
    __shared__ __align__(16) u16 Kt[ATT_D * TC_TP];
    __shared__ int los[TC_BQ];
    if (bad && *bad) return; // the same for every thread
    const i64 W = (i64)(H + 2 * KV) * D;
    const tc_query_block qb = tc_query_block_of(nqt, H, KV);
    const int h = qb.h, b = qb.b, g = qb.g, q0 = qb.q0;
    const int w0 = (threadIdx.x / 32) * 16, gid = (threadIdx.x % 32) / 4, tig = threadIdx.x % 4;
    const i64 bT = (i64)b * T, lrow = ((i64)b * H + h) * T;
    const int nk = D / 16;
    tc_tile(Xs, qkv, bT, q0, TC_BQ, T, W, (i64)h * D, D);
    attn_los(los, pos, bT, q0, TC_BQ, T, window);
    __syncthreads();
    unsigned qa[ATT_D / 16][4], oa[ATT_D / 16][4];
#pragma unroll
    for (int ks = 0; ks < ATT_D / 16; ks++)
        if (ks < nk) frag_a(qa[ks], Xs, TC_DP, w0, ks * 16);
    __syncthreads(); // Q is in registers; dO replaces it
    tc_tile(Xs, dout, bT, q0, TC_BQ, T, (i64)H * D, (i64)h * D, D);
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < ATT_D / 16; ks++)
        if (ks < nk) frag_a(oa[ks], Xs, TC_DP, w0, ks * 16);
    const int jmin = attn_jmin(los, TC_BQ, T);
    const int jmax = min(q0 + TC_BQ, T) - 1;
    const int row[2] = {q0 + w0 + gid, q0 + w0 + gid + 8}, lo[2] = {los[w0 + gid], los[w0 + gid + 8]};
    const float lsev[2] = {row[0] < T ? lse[lrow + row[0]] : 0.0f, row[1] < T ? lse[lrow + row[1]] : 0.0f};
    const float drv[2] = {row[0] < T ? drow[lrow + row[0]] : 0.0f, row[1] < T ? drow[lrow + row[1]] : 0.0f};
    float acc[ATT_D / 8][4];
#pragma unroll
    for (int dt = 0; dt < ATT_D / 8; dt++) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0;
    for (int k0 = (jmin / TC_BK) * TC_BK; k0 <= jmax; k0 += TC_BK) {
        __syncthreads(); // the previous tile's reads are done
        tc_tile(Ks, qkv, bT, k0, TC_BK, T, W, (i64)(H + g) * D, D);
        tc_tile(Vs, qkv, bT, k0, TC_BK, T, W, (i64)(H + KV + g) * D, D);
        tc_tile_t(Kt, qkv, bT, k0, TC_BK, T, W, (i64)(H + g) * D, D);
        __syncthreads();
        float s[TC_BK / 8][4], dp[TC_BK / 8][4];
        tc_scores(dq, s, qa, Ks, nk);
        tc_scores(dq, dp, oa, Vs, nk);
#pragma unroll
        for (int nt = 0; nt < TC_BK / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e / 2, i = row[r], j = k0 + nt * 8 + tig * 2 + (e & 1);
                const bool ok = i < T && j >= lo[r] && j <= i;
                const float z = attn_score(s[nt][e], scale, cap);
                const float p = ok ? expf(z - lsev[r]) : 0.0f;
                s[nt][e] = ok ? p * (dp[nt][e] - drv[r]) * attn_dcap(z, cap) : 0.0f; // dS
            }
        tc_accumulate(dq, acc, s, Kt, D);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = row[r];
        if (i >= T) continue;
        const i64 base = (bT + i) * W + (i64)h * D + tig * 2;
#pragma unroll
        for (int dt = 0; dt < ATT_D / 8; dt++)
            if (dt < D / 8) {
                st(dqkv, ddq, base + dt * 8, acc[dt][2 * r] * scale);
                st(dqkv, ddq, base + dt * 8 + 1, acc[dt][2 * r + 1] * scale);
            }
    }
}

// attn_bwd_dkv_tc: attn_bwd_dkv on tensor cores (dout of qkv's dtype).
// One block per (b, key/value head g, key tile of TC_BQ rows); warp w
// holds its 16 keys' K and V rows as A fragments and accumulates their dK
// and dV over the group's query heads in order and, for each, the query
// tiles of TC_BK rows at or after the key tile in order (tiles no row of
// which sees a key of the block are skipped): Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ
// (mma), Pᵀ = exp(Sᵀ·scale - lse) masked, dSᵀ = Pᵀ·(dPᵀ - drow), dV +=
// Pᵀ·dO and dK += dSᵀ·Q (mma, Pᵀ and dSᵀ rounded to dt); then dK·scale
// and dV are written.
extern "C" __global__ void __launch_bounds__(TC_NT) attn_bwd_dkv_tc(const void* dout, int ddo, const void* qkv, int dq,
                                                                    const float* lse, const float* drow, const int* pos,
                                                                    void* dqkv, int ddq, int T, int H, int KV, int D,
                                                                    int nkt, float scale, int window, float cap, const int* bad) {
    __shared__ __align__(16) u16 Xs[TC_BQ * TC_DP]; // K, then V, into fragments; then a query tile's Q (first half) and dO
    __shared__ __align__(16) u16 Qt[ATT_D * TC_TP];
    __shared__ __align__(16) u16 Ot[ATT_D * TC_TP];
    __shared__ float lses[TC_BK], drs[TC_BK];
    __shared__ int los[TC_BK];
    static_assert(2 * TC_BK <= TC_BQ, "a query tile's Q and dO fit where K was");
    if (bad && *bad) return; // the same for every thread
    u16* Qs = Xs;
    u16* Os = Xs + TC_BK * TC_DP;
    const i64 W = (i64)(H + 2 * KV) * D;
    const i64 blk = blockIdx.x;
    const int kt = (int)(blk % nkt);
    const int g = (int)((blk / nkt) % KV);
    const int b = (int)(blk / nkt / KV);
    const int R = H / KV;
    const int k0 = kt * TC_BQ, kend = min(k0 + TC_BQ, T) - 1, qend = attn_qend(kend, T, window);
    const int w0 = (threadIdx.x / 32) * 16, gid = (threadIdx.x % 32) / 4, tig = threadIdx.x % 4;
    const int key[2] = {k0 + w0 + gid, k0 + w0 + gid + 8};
    const i64 bT = (i64)b * T;
    const int nk = D / 16;
    unsigned ka[ATT_D / 16][4], va[ATT_D / 16][4];
    tc_tile(Xs, qkv, bT, k0, TC_BQ, T, W, (i64)(H + g) * D, D);
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < ATT_D / 16; ks++)
        if (ks < nk) frag_a(ka[ks], Xs, TC_DP, w0, ks * 16);
    __syncthreads(); // K is in registers; V replaces it
    tc_tile(Xs, qkv, bT, k0, TC_BQ, T, W, (i64)(H + KV + g) * D, D);
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < ATT_D / 16; ks++)
        if (ks < nk) frag_a(va[ks], Xs, TC_DP, w0, ks * 16);
    float dk[ATT_D / 8][4], dv[ATT_D / 8][4];
#pragma unroll
    for (int dt = 0; dt < ATT_D / 8; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[dt][e] = dv[dt][e] = 0;
    for (int h = g * R; h < (g + 1) * R; h++) {
        const i64 lrow = ((i64)b * H + h) * T;
        for (int q0 = (k0 / TC_BK) * TC_BK; q0 < qend; q0 += TC_BK) {
            __syncthreads(); // the previous tile's (and V's) reads are done
            tc_tile(Qs, qkv, bT, q0, TC_BK, T, W, (i64)h * D, D);
            tc_tile(Os, dout, bT, q0, TC_BK, T, (i64)H * D, (i64)h * D, D);
            tc_tile_t(Qt, qkv, bT, q0, TC_BK, T, W, (i64)h * D, D);
            tc_tile_t(Ot, dout, bT, q0, TC_BK, T, (i64)H * D, (i64)h * D, D);
            if (threadIdx.x < TC_BK) {
                int t = q0 + threadIdx.x;
                lses[threadIdx.x] = t < T ? lse[lrow + t] : 0.0f;
                drs[threadIdx.x] = t < T ? drow[lrow + t] : 0.0f;
                los[threadIdx.x] = t < T ? attn_lo(pos, bT, t, window) : T;
            }
            __syncthreads();
            bool any = false;
            for (int rr = 0; rr < TC_BK; rr++) {
                int t = q0 + rr;
                any = any || (t < T && max(los[rr], k0) <= min(t, kend));
            }
            if (!any) continue; // the same for every thread of the block
            // Sᵀ and dPᵀ in one pass, and below dV and dK in one pass:
            // tc_scores and tc_accumulate called twice each hold more
            // fragments live at once, and ptxas spills (~300-400 bytes a
            // thread, against 12 this way) in the kernel that already
            // holds K, V, dK and dV of its 16 keys.
            float s[TC_BK / 8][4], dp[TC_BK / 8][4];
#pragma unroll
            for (int nt = 0; nt < TC_BK / 8; nt++) {
                s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0;
                dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] = 0;
#pragma unroll
                for (int ks = 0; ks < ATT_D / 16; ks++)
                    if (ks < nk) {
                        unsigned fb[2];
                        frag_b(fb, Qs, TC_DP, nt * 8, ks * 16);
                        mma16816(dq, s[nt], ka[ks], fb);
                        frag_b(fb, Os, TC_DP, nt * 8, ks * 16);
                        mma16816(dq, dp[nt], va[ks], fb);
                    }
            }
#pragma unroll
            for (int nt = 0; nt < TC_BK / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int j = key[e / 2], c = nt * 8 + tig * 2 + (e & 1), i = q0 + c;
                    const bool ok = i < T && j >= los[c] && j <= i;
                    const float z = attn_score(s[nt][e], scale, cap);
                    const float p = ok ? expf(z - lses[c]) : 0.0f;
                    s[nt][e] = p;
                    dp[nt][e] = ok ? p * (dp[nt][e] - drs[c]) * attn_dcap(z, cap) : 0.0f; // dSᵀ
                }
#pragma unroll
            for (int kk = 0; kk < TC_BK / 16; kk++) {
                unsigned pa[4], da[4];
                frag_p(dq, pa, s[2 * kk], s[2 * kk + 1]);
                frag_p(dq, da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
                for (int n = 0; n < ATT_D / 8; n++)
                    if (n < D / 8) {
                        unsigned fb[2];
                        frag_b(fb, Ot, TC_TP, n * 8, kk * 16);
                        mma16816(dq, dv[n], pa, fb);
                        frag_b(fb, Qt, TC_TP, n * 8, kk * 16);
                        mma16816(dq, dk[n], da, fb);
                    }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int j = key[r];
        if (j >= T) continue;
        const i64 base = (bT + j) * W + tig * 2;
#pragma unroll
        for (int dt = 0; dt < ATT_D / 8; dt++)
            if (dt < D / 8)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    st(dqkv, ddq, base + (i64)(H + g) * D + dt * 8 + e, dk[dt][2 * r + e] * scale);
                    st(dqkv, ddq, base + (i64)(H + KV + g) * D + dt * 8 + e, dv[dt][2 * r + e]);
                }
    }
}

// ---- attention against a key/value cache (generation) --------------------
//
// kv_append copies the key and value heads of n packed qkv rows into rows
// start, start+1, ... of the caches (KV·D values a row); n counts values.
// attn_cached: one block of NT threads per (new token i, head h), the token
// at position start+i seeing cache rows 0..start+i (with a sliding window
// only the last window of them: the tiles start at its first key, so a
// decode step costs O(window)), in tiles of NT keys
// with one score per thread (q in shared memory, q·k in fp32 in index
// order, times scale, soft-capped by attn_score); the tile's maximum and its sum of exp(s - m)
// (double) by block_max_f's and block_sum_d's fixed trees, the running max
// m and sum l updated online as in attn_fwd; thread d < D owns output dim
// d (D <= ATT_WD <= NT): o = o·exp(m_old - m) + Σ_c p_c·v_c,d in key
// order; out = o / l.
// Deterministic. Keys are not shared between queries through shared
// memory: it is the kernel of one new token at a time (decode), and a
// call with start = 0 and caches of qkv's dtype runs attn_fwd instead
// (ops_attn.go).

extern "C" __global__ void kv_append(const void* qkv, int dq, void* kc, int dk, void* vc, int dv, int start, int H, int KV,
                                     int D, i64 n) {
    const i64 KW = (i64)KV * D, W = (i64)(H + 2 * KV) * D;
    GRID_STRIDE(x, n) {
        i64 row = x / KW, e = x % KW;
        i64 dst = ((i64)start + row) * KW + e;
        st(kc, dk, dst, ld(qkv, dq, row * W + (i64)H * D + e));
        st(vc, dv, dst, ld(qkv, dq, row * W + (i64)(H + KV) * D + e));
    }
}

extern "C" __global__ void __launch_bounds__(NT) attn_cached(const void* qkv, int dq, const void* kc, int dk,
                                                             const void* vc, int dv, void* out, int dout, int start,
                                                             int H, int KV, int D, float scale, int window, float cap) {
    __shared__ float qs[ATT_WD];
    __shared__ float ps[NT];
    __shared__ float shf[NT];
    __shared__ double shd[NT];
    const int h = (int)(blockIdx.x % H);
    const i64 i = blockIdx.x / H;
    const int g = h / (H / KV);
    const i64 W = (i64)(H + 2 * KV) * D, KW = (i64)KV * D;
    const i64 last = (i64)start + i;
    const i64 first = window > 0 && last + 1 > window ? last + 1 - window : 0; // the window's first key
    for (int d = threadIdx.x; d < D; d += NT) qs[d] = ld(qkv, dq, i * W + (i64)h * D + d);
    __syncthreads();
    float m = NEG_INF, o = 0;
    double l = 0;
    for (i64 k0 = first; k0 <= last; k0 += NT) {
        const i64 j = k0 + threadIdx.x;
        float sc = NEG_INF;
        if (j <= last) {
            float a = 0;
            for (int d = 0; d < D; d++) a += qs[d] * ld(kc, dk, j * KW + (i64)g * D + d);
            sc = attn_score(a, scale, cap);
        }
        const float mt = fmaxf(m, block_max_f(sc, shf)); // key k0 <= last: finite
        const float p = sc == NEG_INF ? 0.0f : expf(sc - mt);
        ps[threadIdx.x] = p;
        const double rs = block_sum_d((double)p, shd); // its barriers publish ps
        const float alpha = m == NEG_INF ? 0.0f : expf(m - mt);
        l = l * alpha + rs;
        m = mt;
        if (threadIdx.x < D) {
            const int nk = last + 1 - k0 < NT ? (int)(last + 1 - k0) : NT;
            float a = o * alpha;
            for (int c = 0; c < nk; c++) a += ps[c] * ld(vc, dv, (k0 + c) * KW + (i64)g * D + threadIdx.x);
            o = a;
        }
        __syncthreads(); // every thread has read ps before the next tile writes it
    }
    if (threadIdx.x < D) st(out, dout, i * ((i64)H * D) + (i64)h * D + threadIdx.x, (float)((double)o / l));
}

// ---- cross-entropy -------------------------------------------------------
//
// A row whose target is < 0 (model.IgnoreTarget) is ignored: loss 0,
// dlogits 0. Targets >= vocab were refused by check_ids. With softcap > 0
// every logit x is first made z = softcap·tanh(x/softcap) (double,
// rounded to fp32, as gpu/cpu's capLogits), recomputed from the stored
// logits wherever it is read (Gemma 2's final soft cap); softcap 0 reads
// the logits as they are.

__device__ __forceinline__ float xent_z(const void* logits, int dl, i64 i, float softcap) {
    float x = ld(logits, dl, i);
    return softcap > 0 ? (float)((double)softcap * tanh((double)x / (double)softcap)) : x;
}

extern "C" __global__ void xent_fwd(const void* logits, int dl, const int* targets, void* losses, int dlo, i64 vocab,
                                    float softcap, const int* bad) {
    __shared__ double shd[NT];
    __shared__ float shf[NT];
    if (*bad) return;
    i64 r = blockIdx.x;
    int tg = targets[r];
    if (tg < 0) { // the same for the whole block
        if (threadIdx.x == 0) st(losses, dlo, r, 0.0f);
        return;
    }
    i64 base = r * vocab;
    float mx = NEG_INF;
    for (i64 c = threadIdx.x; c < vocab; c += NT) mx = fmaxf(mx, xent_z(logits, dl, base + c, softcap));
    mx = block_max_f(mx, shf);
    double s = 0;
    for (i64 c = threadIdx.x; c < vocab; c += NT) s += exp((double)(xent_z(logits, dl, base + c, softcap) - mx));
    s = block_sum_d(s, shd);
    if (threadIdx.x == 0)
        st(losses, dlo, r, (float)(log(s) + (double)mx - (double)xent_z(logits, dl, base + tg, softcap)));
}

// xent_bwd: dlogits = (softmax(z) - onehot) · (1 - (z/softcap)²) · scale
// (the factor only with softcap > 0); dlogits may be logits (each thread
// reads a logit before it writes its gradient).
extern "C" __global__ void xent_bwd(const void* logits, int dl, const int* targets, void* dlogits, int ddl, i64 vocab,
                                    float scale, float softcap, const int* bad) {
    __shared__ double shd[NT];
    __shared__ float shf[NT];
    if (*bad) return;
    i64 r = blockIdx.x;
    i64 base = r * vocab;
    int tg = targets[r];
    if (tg < 0) { // the same for the whole block
        for (i64 c = threadIdx.x; c < vocab; c += NT) st(dlogits, ddl, base + c, 0.0f);
        return;
    }
    float mx = NEG_INF;
    for (i64 c = threadIdx.x; c < vocab; c += NT) mx = fmaxf(mx, xent_z(logits, dl, base + c, softcap));
    mx = block_max_f(mx, shf);
    double s = 0;
    for (i64 c = threadIdx.x; c < vocab; c += NT) s += exp((double)(xent_z(logits, dl, base + c, softcap) - mx));
    s = block_sum_d(s, shd);
    for (i64 c = threadIdx.x; c < vocab; c += NT) {
        float z = xent_z(logits, dl, base + c, softcap);
        float p = (float)(exp((double)(z - mx)) / s);
        if (c == tg) p -= 1.0f;
        if (softcap > 0) {
            double t = (double)z / (double)softcap;
            p = (float)((double)p * (1 - t * t));
        }
        st(dlogits, ddl, base + c, p * scale);
    }
}

// ---- embedding -----------------------------------------------------------
//
// The position of token (b,t) is pos[b,t], or t when pos is null; wpe
// null: no position table (the Llama family).

extern "C" __global__ void emb_fwd(const int* ids, const int* pos, const void* wte, int dte, const void* wpe, int dpe,
                                   void* out, int dout, i64 BT, int T, i64 dim, const int* bad) {
    if (*bad) return;
    GRID_STRIDE(j, BT * dim) {
        i64 bt = j / dim, c = j % dim;
        float v = ld(wte, dte, (i64)ids[bt] * dim + c);
        if (wpe) {
            i64 t = pos ? (i64)pos[bt] : bt % T;
            v += ld(wpe, dpe, t * dim + c);
        }
        st(out, dout, j, v);
    }
}

// emb_links: next[bt] is the next position with the same key (-1: none);
// first[bt] is 1 when no earlier position has it. keys are the token ids
// (or the positions, for dwpe with pos).
extern "C" __global__ void emb_links(const int* keys, i64 BT, int* next, int* first, const int* bad) {
    if (*bad) return;
    GRID_STRIDE(bt, BT) {
        int id = keys[bt];
        int nx = -1;
        for (i64 j = bt + 1; j < BT; j++)
            if (keys[j] == id) {
                nx = (int)j;
                break;
            }
        int f = 1;
        for (i64 j = 0; j < bt; j++)
            if (keys[j] == id) {
                f = 0;
                break;
            }
        next[bt] = nx;
        first[bt] = f;
    }
}

// emb_bwd_rows: for each first occurrence of a key, table[key,c] +=
// dout[bt,c] over the positions holding that key, in position order (b,
// then t), from the old value, in fp32.
extern "C" __global__ void emb_bwd_rows(const int* keys, const void* dout, int ddo, void* table, int dtt, const int* next,
                                        const int* first, i64 BT, i64 dim, const int* bad) {
    if (*bad) return;
    GRID_STRIDE(j, BT * dim) {
        i64 bt = j / dim, c = j % dim;
        if (!first[bt]) continue;
        i64 w = (i64)keys[bt] * dim + c;
        float acc = ld(table, dtt, w);
        for (i64 k = bt; k >= 0; k = next[k]) acc += ld(dout, ddo, k * dim + c);
        st(table, dtt, w, acc);
    }
}

// emb_bwd_wpe: dwpe[t,c] += dout[b,t,c] for b in order (pos null).
extern "C" __global__ void emb_bwd_wpe(const void* dout, int ddo, void* dwpe, int dpe, int B, int T, i64 dim,
                                       const int* bad) {
    if (*bad) return;
    GRID_STRIDE(j, (i64)T * dim) {
        i64 t = j / dim, c = j % dim;
        float acc = ld(dwpe, dpe, j);
        for (int b = 0; b < B; b++) acc += ld(dout, ddo, ((i64)b * T + t) * dim + c);
        st(dwpe, dpe, j, acc);
    }
}

// ---- sums of squares -----------------------------------------------------
//
// Two fixed-shape passes: SS_BLOCKS blocks of NT threads each sum a strided
// slice in double and reduce it with a fixed tree; one block adds the
// partials in order. The result does not depend on scheduling.

#define SS_BLOCKS 256

extern "C" __global__ void sumsq_partial(const void* x, int dt, i64 n, double* partial) {
    __shared__ double sh[NT];
    double s = 0;
    for (i64 i = (i64)blockIdx.x * NT + threadIdx.x; i < n; i += (i64)SS_BLOCKS * NT) {
        double v = ldd(x, dt, i);
        s += v * v;
    }
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

extern "C" __global__ void sumsq_final(const double* partial, double* out) {
    __shared__ double sh[NT];
    double s = threadIdx.x < SS_BLOCKS ? partial[threadIdx.x] : 0.0;
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0) *out = s;
}

// ---- Adam ----------------------------------------------------------------
//
// cpuadam's update, operation for operation (its ref.go): every line rounds
// once to fp32, FMAs where cpuadam fuses, so the bits equal cpuadam's.

extern "C" __global__ void adam_step(float* param, const void* grad, int dg, float* m, float* v, void* out, int dout, i64 n,
                                     float gs, float b1, float omb1, float b2, float omb2, float negStep,
                                     float invSqrtBC2, float eps, float decay, float l2, int useL2) {
    GRID_STRIDE(i, n) {
        float x = param[i];
        float g = __fmul_rn(ld(grad, dg, i), gs);
        if (useL2) g = __fmaf_rn(l2, x, g);
        float mi = __fmaf_rn(b1, m[i], __fmul_rn(omb1, g));
        float vi = __fmaf_rn(b2, v[i], __fmul_rn(__fmul_rn(omb2, g), g));
        float d = __fmaf_rn(__fsqrt_rn(vi), invSqrtBC2, eps);
        x = __fmaf_rn(negStep, __fdiv_rn(mi, d), __fmul_rn(x, decay));
        param[i] = x;
        m[i] = mi;
        v[i] = vi;
        if (out) st(out, dout, i, x); // the new params: bf16, or f16
    }
}

// ---- collectives ---------------------------------------------------------

// reduce_ranks: out[i] = tmp[0][i] + tmp[1][i] + ... in rank order, in fp32
// (double for f64), divided by nranks when avg, rounded once on store.
extern "C" __global__ void reduce_ranks(const void* tmp, int dt, i64 len, int nranks, void* out, int avg) {
    GRID_STRIDE(i, len) {
        if (dt == DT_F64) {
            const double* p = (const double*)tmp;
            double s = p[i];
            for (int q = 1; q < nranks; q++) s += p[(i64)q * len + i];
            if (avg) s /= (double)nranks;
            ((double*)out)[i] = s;
        } else {
            float s = ld(tmp, dt, i);
            for (int q = 1; q < nranks; q++) s += ld(tmp, dt, (i64)q * len + i);
            if (avg) s /= (float)nranks;
            st(out, dt, i, s);
        }
    }
}

// wait_flag spins until *flag - value >= 0 (wrap-safe); write_flag stores
// value. They stand in for cuStreamWaitValue32/cuStreamWriteValue32 where
// the driver lacks stream memory operations.
extern "C" __global__ void wait_flag(volatile unsigned* flag, unsigned value) {
    while ((int)(*flag - value) < 0) __nanosleep(1000);
}

extern "C" __global__ void write_flag(volatile unsigned* flag, unsigned value) {
    __threadfence_system();
    *flag = value;
    __threadfence_system();
}
