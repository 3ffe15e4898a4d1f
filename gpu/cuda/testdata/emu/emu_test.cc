// emu_test runs the kernels of kernels.cu on the CPU through emu.h and
// checks them against float64 references written here, launched with the
// shapes and arguments gpu/cuda's Go code uses (ops_attn.go, ops_nn.go;
// the Go tests check those against kernels.cu). The float64 references of
// the backward passes are themselves checked by finite differences.
// Prints one line per failure and "N passed, M failed"; exits 1 on any
// failure. TestKernelsOnCPU builds and runs it.
#include "emu.h"

#include "../../kernels.cu"

#include <climits>
#include <functional>
#include <string>

static int passed, failed;

static void check(bool ok, const std::string& what) {
    if (ok) {
        passed++;
    } else {
        failed++;
        std::fprintf(stderr, "FAIL %s\n", what.c_str());
    }
}

static size_t dtsize(int dt) { return dt == DT_BF16 || dt == DT_F16 ? 2 : dt == DT_F64 ? 8 : 4; }

// Buf is a device buffer: n elements of a storage type, read and written
// with the kernels' own ld/st.
struct Buf {
    int dt;
    size_t n;
    std::vector<unsigned char> m;
    Buf(int dt_, size_t n_) : dt(dt_), n(n_), m(n_ * dtsize(dt_)) {}
    void* p() { return n ? (void*)m.data() : nullptr; }
    float get(size_t i) const { return ld(m.data(), dt, (i64)i); }
    void set(size_t i, float v) { st(m.data(), dt, (i64)i, v); }
    int* ip() { return (int*)m.data(); }
    float* fp() { return (float*)m.data(); }
    void poison() {
        for (size_t i = 0; i < n; i++) set(i, NAN);
    }
};

static std::mt19937_64 rng(12345);
static double normal() { return std::normal_distribution<double>(0, 1)(rng); }

static void randomize(Buf& b, double sd) {
    for (size_t i = 0; i < b.n; i++) b.set(i, (float)(normal() * sd));
}

// near: |got - want| <= tol * max(1, scale) for every element, where scale
// is the largest |want| (errors of fp32 sums scale with the magnitudes).
template <class B>
static void near(const std::string& what, const B& got, const std::vector<double>& want, double tol) {
    double scale = 1, worst = 0;
    size_t at = 0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    bool ok = got.n == want.size();
    for (size_t i = 0; ok && i < want.size(); i++) {
        double g = got.get(i), e = std::fabs(g - want[i]);
        if (!(e <= worst)) { // NaN too
            worst = std::isnan(e) ? INFINITY : e;
            at = i;
        }
    }
    ok = ok && worst <= tol * scale;
    char buf[256];
    std::snprintf(buf, sizeof buf, " (worst error %.3g at %zu: got %.7g want %.7g, tolerance %.3g)", worst, at,
                  at < got.n ? got.get(at) : 0.0, at < want.size() ? want[at] : 0.0, tol * scale);
    check(ok, what + buf);
}

static bool sameBits(const Buf& a, const Buf& b) { return a.m == b.m; }

static unsigned gridFor(i64 n) { return (unsigned)std::min<i64>((n + 255) / 256, 3); } // 3 blocks: the stride loops run

static const char* dtName(int dt) { return dt == DT_BF16 ? "bf16" : dt == DT_F16 ? "f16" : "f32"; }

#include "emu_attn.inc"
#include "emu_cached.inc"
#include "emu_ops.inc"
#include "emu_tc.inc"
#include "emu_vec.inc"
#include "emu_variants.inc"
#include "emu_wide.inc"

// main runs every test, or those whose names contain argv[1], twice: with
// the blocks in order and shuffled.
int main(int argc, char** argv) {
    auto want = [&](const char* name) { return argc < 2 || std::strstr(name, argv[1]); };
    for (unsigned seed : {0u, 7u}) {
        emu_seed = seed;
        if (want("attention")) {
            if (!seed) {
                testAttentionReference(AttnCfg{2, 9, 4, 2, 4, 3});
                testAttentionReference(AttnCfg{2, 9, 4, 2, 4, 2, 0.3f, 3, 1.5f}); // window, soft cap, scale
            }
            testAttention(seed);
            testAttentionBadPositions();
        }
        if (want("attention-variants")) testAttentionVariants(seed);
        if (want("attention-cached")) testAttentionCached();
        if (want("attention-wide")) testAttentionWide();
        if (want("attention-tc")) {
            if (!seed) testMMA();
            testAttentionTC();
        }
        if (want("rmsnorm")) {
            testRMSNorm();
            if (seed) testVecRMSNorm(); // once, blocks shuffled: the rows are independent
        }
        if (want("layernorm") && seed) testVecLayerNorm(); // once, blocks shuffled: the rows are independent
        if (want("bias-gelu") && seed) testVecBiasGelu();
        if (want("rope")) testRope();
        if (want("glu")) testGLU();
        if (want("swiglu")) {
            if (seed) testVecSwiGLU();
        }
        if (want("embedding")) testEmbedding();
        if (want("cross-entropy")) testCrossEntropy();
        if (want("add-columns")) testAddColumns();
        if (want("column-sums")) testColumnSums();
        if (want("dropout")) testDropout();
        if (want("dequant-nf4")) testDequantNF4();
        if (want("dequant-int8")) testDequantInt8();
        if (want("f16") && !seed) testHalf();
        if (want("scale-rows") && !seed) testScaleRowsDots();
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
