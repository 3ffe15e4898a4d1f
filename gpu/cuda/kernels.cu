// Kernels of the Strata CUDA backend, compiled at run time by NVRTC for the
// device's architecture (see nvrtc.go for the options: no contraction into
// FMAs, IEEE division and square root, denormals kept). Every kernel is
// extern "C" so that cuModuleGetFunction finds it by its plain name.
//
// Storage types are passed as codes (internal/dtype): 1 f32, 2 bf16, 3 i32,
// 4 f64. Floats are loaded as fp32 (bf16 widened exactly), computed in
// fp32 (reductions and transcendentals in double, as gpu/cpu does) and
// rounded once on store (bf16: nearest even, NaN kept quiet).
//
// Every reduction has a fixed shape (fixed block size, fixed tree, loops in
// index order), so results are bit-identical run to run.

typedef unsigned short u16;
typedef long long i64;

#define DT_F32 1
#define DT_BF16 2
#define DT_I32 3
#define DT_F64 4

#define NT 256 // threads of the row-wise kernels; a power of two

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((unsigned)h) << 16); }

// f2bf rounds to nearest even as internal/bf16.FromFloat32 does.
__device__ __forceinline__ u16 f2bf(float f) {
    unsigned b = __float_as_uint(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (u16)((b >> 16) | 0x40u);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (u16)(b >> 16);
}

__device__ __forceinline__ float ld(const void* p, int dt, i64 i) {
    switch (dt) {
    case DT_F32: return ((const float*)p)[i];
    case DT_BF16: return bf2f(((const u16*)p)[i]);
    case DT_I32: return (float)((const int*)p)[i];
    default: return (float)((const double*)p)[i];
    }
}

__device__ __forceinline__ double ldd(const void* p, int dt, i64 i) {
    switch (dt) {
    case DT_F32: return (double)((const float*)p)[i];
    case DT_BF16: return (double)bf2f(((const u16*)p)[i]);
    case DT_I32: return (double)((const int*)p)[i];
    default: return ((const double*)p)[i];
    }
}

__device__ __forceinline__ void st(void* p, int dt, i64 i, float v) {
    switch (dt) {
    case DT_F32: ((float*)p)[i] = v; break;
    case DT_BF16: ((u16*)p)[i] = f2bf(v); break;
    case DT_I32: ((int*)p)[i] = (int)v; break;
    default: ((double*)p)[i] = (double)v; break;
    }
}

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

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

extern "C" __global__ void check_ids(const int* ids, i64 n, int limit, int code, int* slot) {
    __shared__ unsigned long long first;
    if (threadIdx.x == 0) first = (unsigned long long)n;
    __syncthreads();
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
        int id = ids[i];
        if (id < 0 || id >= limit) {
            atomicMin(&first, (unsigned long long)i);
            break;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int bad = first < (unsigned long long)n;
        slot[4] = bad;
        if (bad && slot[0] == 0) {
            slot[0] = code;
            slot[1] = ids[first];
            slot[2] = (int)first;
            slot[3] = limit;
        }
    }
}

// ---- elementwise ---------------------------------------------------------

#define GELU_S 0.7978845608028654

extern "C" __global__ void gelu_fwd(const void* x, int dx, void* y, int dy, i64 n) {
    GRID_STRIDE(i, n) {
        double v = (double)ld(x, dx, i);
        st(y, dy, i, (float)(0.5 * v * (1.0 + tanh(GELU_S * (v + 0.044715 * v * v * v)))));
    }
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

extern "C" __global__ void scale(void* x, int dt, float alpha, i64 n) {
    GRID_STRIDE(i, n) {
        if (dt == DT_F64) ((double*)x)[i] *= (double)alpha;
        else st(x, dt, i, ld(x, dt, i) * alpha);
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

// bias_grad: dbias[c] += sum_r dy[r,c], the sum in fp32 in row order.
extern "C" __global__ void bias_grad(const void* dy, int ddy, void* db, int ddb, i64 rows, i64 cols) {
    GRID_STRIDE(c, cols) {
        float acc = 0;
        for (i64 r = 0; r < rows; r++) acc += ld(dy, ddy, r * cols + c);
        st(db, ddb, c, ld(db, ddb, c) + acc);
    }
}

// ---- layernorm -----------------------------------------------------------

extern "C" __global__ void layernorm_fwd(const void* x, int dx, const void* gamma, int dg, const void* beta, int db,
                                         void* y, int dy, float* mean, float* rstd, i64 cols, float eps) {
    __shared__ double sh[NT];
    i64 r = blockIdx.x;
    i64 base = r * cols;
    double s = 0;
    for (i64 c = threadIdx.x; c < cols; c += NT) s += (double)ld(x, dx, base + c);
    double m = block_sum_d(s, sh) / (double)cols;
    double ss = 0;
    for (i64 c = threadIdx.x; c < cols; c += NT) {
        double d = (double)ld(x, dx, base + c) - m;
        ss += d * d;
    }
    ss = block_sum_d(ss, sh);
    float mf = (float)m, rf = (float)(1.0 / sqrt(ss / (double)cols + (double)eps));
    for (i64 c = threadIdx.x; c < cols; c += NT)
        st(y, dy, base + c, (ld(x, dx, base + c) - mf) * rf * ld(gamma, dg, c) + ld(beta, db, c));
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
extern "C" __global__ void layernorm_bwd_params(const void* dy, int ddy, const void* x, int dx_, const float* mean,
                                                const float* rstd, void* dgamma, int ddg, void* dbeta, int ddb,
                                                i64 rows, i64 cols) {
    GRID_STRIDE(c, cols) {
        float ag = 0, ab = 0;
        for (i64 r = 0; r < rows; r++) {
            float d = ld(dy, ddy, r * cols + c);
            ag += d * ((ld(x, dx_, r * cols + c) - mean[r]) * rstd[r]);
            ab += d;
        }
        st(dgamma, ddg, c, ld(dgamma, ddg, c) + ag);
        st(dbeta, ddb, c, ld(dbeta, ddb, c) + ab);
    }
}

// ---- attention -----------------------------------------------------------
//
// qkv[b,t,:] = [q heads | k heads | v heads], C = heads*hd; att[b,h,t,t2].

#define QKV(b, t, part, h, i) ((((i64)(b) * T + (t)) * 3 + (part)) * C + (i64)(h) * hd + (i))

// attn_fwd: one block per (b, h, t) query row.
extern "C" __global__ void attn_fwd(const void* qkv, int dq, void* out, int dout, float* att, int T, int H, int hd,
                                    float scale) {
    __shared__ double shd[NT];
    __shared__ float shf[NT];
    int C = H * hd;
    i64 row = blockIdx.x; // (b*H + h)*T + t
    int t = (int)(row % T);
    int h = (int)((row / T) % H);
    int b = (int)(row / ((i64)T * H));
    float* a = att + row * T;
    float mx = __int_as_float(0xff800000);
    for (int t2 = threadIdx.x; t2 < T; t2 += NT) {
        if (t2 > t) {
            a[t2] = 0;
            continue;
        }
        float s = 0;
        for (int i = 0; i < hd; i++) s += ld(qkv, dq, QKV(b, t, 0, h, i)) * ld(qkv, dq, QKV(b, t2, 1, h, i));
        s *= scale;
        a[t2] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_max_f(mx, shf);
    double sum = 0;
    for (int t2 = threadIdx.x; t2 <= t; t2 += NT) {
        double e = exp((double)(a[t2] - mx));
        a[t2] = (float)e;
        sum += e;
    }
    sum = block_sum_d(sum, shd);
    float inv = (float)(1.0 / sum);
    for (int t2 = threadIdx.x; t2 <= t; t2 += NT) a[t2] *= inv;
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += NT) {
        float o = 0;
        for (int t2 = 0; t2 <= t; t2++) o += a[t2] * ld(qkv, dq, QKV(b, t2, 2, h, i));
        st(out, dout, ((i64)b * T + t) * C + (i64)h * hd + i, o);
    }
}

// attn_bwd_ds: one block per (b, h, t): dP = dO·V, dS = P ⊙ (dP - rowsum(P ⊙ dP)) * scale.
extern "C" __global__ void attn_bwd_ds(const void* dout, int ddo, const void* qkv, int dq, const float* att, float* ds,
                                       int T, int H, int hd, float scale) {
    __shared__ double shd[NT];
    int C = H * hd;
    i64 row = blockIdx.x;
    int t = (int)(row % T);
    int h = (int)((row / T) % H);
    int b = (int)(row / ((i64)T * H));
    const float* p = att + row * T;
    float* d = ds + row * T;
    double sum = 0;
    for (int t2 = threadIdx.x; t2 <= t; t2 += NT) {
        float dp = 0;
        for (int i = 0; i < hd; i++)
            dp += ld(dout, ddo, ((i64)b * T + t) * C + (i64)h * hd + i) * ld(qkv, dq, QKV(b, t2, 2, h, i));
        d[t2] = dp;
        sum += (double)p[t2] * (double)dp;
    }
    sum = block_sum_d(sum, shd);
    float sf = (float)sum;
    for (int t2 = threadIdx.x; t2 <= t; t2 += NT) d[t2] = p[t2] * (d[t2] - sf) * scale;
}

// attn_bwd_dq: one thread per (b, h, t, i): dQ[t,i] = sum_{t2<=t} dS[t,t2] K[t2,i].
extern "C" __global__ void attn_bwd_dq(const void* qkv, int dq, const float* ds, void* dqkv, int ddq, int B, int T,
                                       int H, int hd) {
    int C = H * hd;
    GRID_STRIDE(j, (i64)B * H * T * hd) {
        int i = (int)(j % hd);
        i64 row = j / hd;
        int t = (int)(row % T);
        int h = (int)((row / T) % H);
        int b = (int)(row / ((i64)T * H));
        const float* d = ds + row * T;
        float acc = 0;
        for (int t2 = 0; t2 <= t; t2++) acc += d[t2] * ld(qkv, dq, QKV(b, t2, 1, h, i));
        st(dqkv, ddq, QKV(b, t, 0, h, i), acc);
    }
}

// attn_bwd_dkv: one thread per (b, h, t2, i): dK[t2,i] = sum_{t>=t2} dS[t,t2] Q[t,i],
// dV[t2,i] = sum_{t>=t2} P[t,t2] dO[t,i].
extern "C" __global__ void attn_bwd_dkv(const void* dout, int ddo, const void* qkv, int dq, const float* att,
                                        const float* ds, void* dqkv, int ddq, int B, int T, int H, int hd) {
    int C = H * hd;
    GRID_STRIDE(j, (i64)B * H * T * hd) {
        int i = (int)(j % hd);
        i64 row = j / hd;
        int t2 = (int)(row % T);
        i64 bh = row / T;
        int h = (int)(bh % H);
        int b = (int)(bh / H);
        float dk = 0, dv = 0;
        for (int t = t2; t < T; t++) {
            i64 at = (bh * T + t) * T + t2;
            dk += ds[at] * ld(qkv, dq, QKV(b, t, 0, h, i));
            dv += att[at] * ld(dout, ddo, ((i64)b * T + t) * C + (i64)h * hd + i);
        }
        st(dqkv, ddq, QKV(b, t2, 1, h, i), dk);
        st(dqkv, ddq, QKV(b, t2, 2, h, i), dv);
    }
}

// ---- cross-entropy -------------------------------------------------------

extern "C" __global__ void xent_fwd(const void* logits, int dl, const int* targets, void* losses, int dlo, i64 vocab,
                                    const int* bad) {
    __shared__ double shd[NT];
    __shared__ float shf[NT];
    if (*bad) return;
    i64 r = blockIdx.x;
    i64 base = r * vocab;
    float mx = __int_as_float(0xff800000);
    for (i64 c = threadIdx.x; c < vocab; c += NT) mx = fmaxf(mx, ld(logits, dl, base + c));
    mx = block_max_f(mx, shf);
    double s = 0;
    for (i64 c = threadIdx.x; c < vocab; c += NT) s += exp((double)(ld(logits, dl, base + c) - mx));
    s = block_sum_d(s, shd);
    if (threadIdx.x == 0)
        st(losses, dlo, r, (float)(log(s) + (double)mx - (double)ld(logits, dl, base + targets[r])));
}

// xent_bwd: dlogits = (softmax - onehot) * scale; dlogits may be logits.
extern "C" __global__ void xent_bwd(const void* logits, int dl, const int* targets, void* dlogits, int ddl, i64 vocab,
                                    float scale, const int* bad) {
    __shared__ double shd[NT];
    __shared__ float shf[NT];
    if (*bad) return;
    i64 r = blockIdx.x;
    i64 base = r * vocab;
    float mx = __int_as_float(0xff800000);
    for (i64 c = threadIdx.x; c < vocab; c += NT) mx = fmaxf(mx, ld(logits, dl, base + c));
    mx = block_max_f(mx, shf);
    double s = 0;
    for (i64 c = threadIdx.x; c < vocab; c += NT) s += exp((double)(ld(logits, dl, base + c) - mx));
    s = block_sum_d(s, shd);
    int tg = targets[r];
    for (i64 c = threadIdx.x; c < vocab; c += NT) {
        float p = (float)(exp((double)(ld(logits, dl, base + c) - mx)) / s);
        if (c == tg) p -= 1.0f;
        st(dlogits, ddl, base + c, p * scale);
    }
}

// ---- embedding -----------------------------------------------------------

extern "C" __global__ void emb_fwd(const int* ids, const void* wte, int dte, const void* wpe, int dpe, void* out,
                                   int dout, i64 BT, int T, i64 dim, const int* bad) {
    if (*bad) return;
    GRID_STRIDE(j, BT * dim) {
        i64 bt = j / dim, c = j % dim;
        i64 t = bt % T;
        st(out, dout, j, ld(wte, dte, (i64)ids[bt] * dim + c) + ld(wpe, dpe, t * dim + c));
    }
}

// emb_links: next[bt] is the next position with the same id (-1: none);
// first[bt] is 1 when no earlier position has it.
extern "C" __global__ void emb_links(const int* ids, i64 BT, int* next, int* first, const int* bad) {
    if (*bad) return;
    GRID_STRIDE(bt, BT) {
        int id = ids[bt];
        int nx = -1;
        for (i64 j = bt + 1; j < BT; j++)
            if (ids[j] == id) {
                nx = (int)j;
                break;
            }
        int f = 1;
        for (i64 j = 0; j < bt; j++)
            if (ids[j] == id) {
                f = 0;
                break;
            }
        next[bt] = nx;
        first[bt] = f;
    }
}

// emb_bwd_wte: for each first occurrence, dwte[id,c] += dout[bt,c] over the
// positions holding id, in position order, from the old value, in fp32.
extern "C" __global__ void emb_bwd_wte(const int* ids, const void* dout, int ddo, void* dwte, int dte, const int* next,
                                       const int* first, i64 BT, i64 dim, const int* bad) {
    if (*bad) return;
    GRID_STRIDE(j, BT * dim) {
        i64 bt = j / dim, c = j % dim;
        if (!first[bt]) continue;
        i64 w = (i64)ids[bt] * dim + c;
        float acc = ld(dwte, dte, w);
        for (i64 k = bt; k >= 0; k = next[k]) acc += ld(dout, ddo, k * dim + c);
        st(dwte, dte, w, acc);
    }
}

// emb_bwd_wpe: dwpe[t,c] += dout[b,t,c] for b in order.
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

extern "C" __global__ void adam_step(float* param, const void* grad, int dg, float* m, float* v, u16* out, i64 n,
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
        if (out) out[i] = f2bf(x);
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
