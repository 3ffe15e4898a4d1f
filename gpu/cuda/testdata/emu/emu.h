// emu.h runs kernels.cu on the CPU, for tests on machines without a GPU
// (TestKernelsOnCPU builds emu_test.cc with it). It is a model of the CUDA
// execution, not a simulator of the hardware:
//
//   - a launch runs its blocks one after the other, in an order the test
//     chooses (a shuffled order shows a kernel that depends on it, or that
//     reads shared memory another block left behind);
//   - the threads of a block are OS threads; __syncthreads is a barrier
//     over them, and a block whose threads reach different numbers of
//     barriers aborts the test (divergent __syncthreads);
//   - __shared__ variables are function statics, shared by the block's
//     threads (one block runs at a time);
//   - the threads of a block form warps of 32 (threadIdx.x / 32); the
//     warp-collective operations (__shfl_xor_sync, the mma.sync helpers)
//     meet at a barrier over the warp's threads and exchange values
//     through the warp's slots, so a warp acts in lock step at each of
//     them as on the GPU; a warp whose threads reach different numbers of
//     them aborts the test (the GPU's behaviour is undefined there);
//   - device math is the C library's (expf, exp, pow, ... round differently
//     from CUDA's in the last bits; compile with -ffp-contract=off as NVRTC
//     runs with --fmad=false).
//
// Built with -fsanitize=thread it reports data races between the threads
// of a block (a missing __syncthreads); with -fsanitize=address, reads and
// writes outside the buffers.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <condition_variable>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

struct emu_dim3 {
    unsigned x, y, z;
};
inline thread_local emu_dim3 threadIdx, blockIdx;
inline emu_dim3 blockDim, gridDim;
inline std::barrier<>* emu_bar;
inline thread_local long emu_syncs;

// Warps: a barrier and two sets of slots each (a collective writes the
// set of its parity, meets the others, reads; a thread writes that set
// again two collectives later, when every thread of the warp has reached
// the next one's barrier and so has done its reads). The barriers are
// made anew for each block; a thread leaving the kernel drops out of its
// warp's, so that a warp-mate that went on alone finishes (and the count
// check names it) instead of waiting forever.
struct emu_warp {
    std::unique_ptr<std::barrier<>> bar;
    alignas(64) unsigned char slot[2][32][64];
};
inline std::vector<emu_warp> emu_warps;
inline thread_local long emu_warp_ops;
inline thread_local int emu_warp_parity;

inline void emu_new_warps(unsigned block) {
    emu_warps = std::vector<emu_warp>((block + 31) / 32);
    for (unsigned w = 0; w < emu_warps.size(); w++)
        emu_warps[w].bar = std::make_unique<std::barrier<>>(std::min(32u, block - 32 * w));
}

// emu_exchange publishes this thread's value (at most 64 bytes) to its
// warp and returns the slots of the warp's lanes: slots[lane].
template <class V> const unsigned char (*emu_exchange(const V& v))[64] {
    static_assert(sizeof(V) <= 64, "a warp slot holds 64 bytes");
    emu_warp& w = emu_warps[threadIdx.x / 32];
    int par = emu_warp_parity;
    emu_warp_parity ^= 1;
    std::memcpy(w.slot[par][threadIdx.x % 32], &v, sizeof(V));
    emu_warp_ops++;
    w.bar->arrive_and_wait();
    return w.slot[par];
}

template <class V> V emu_slot(const unsigned char (*slots)[64], unsigned lane) {
    V v;
    std::memcpy(&v, slots[lane], sizeof(V));
    return v;
}

inline float __shfl_xor_sync(unsigned mask, float v, int laneMask) {
    if (mask != 0xffffffffu) {
        std::fprintf(stderr, "emu: __shfl_xor_sync with mask %#x: the kernels use whole warps\n", mask);
        std::abort();
    }
    auto s = emu_exchange(v);
    return emu_slot<float>(s, (threadIdx.x % 32) ^ (unsigned)laneMask);
}

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __constant__
#define __launch_bounds__(n)

inline void __syncthreads() {
    emu_syncs++;
    emu_bar->arrive_and_wait();
}
inline float __int_as_float(int v) {
    float f;
    std::memcpy(&f, &v, 4);
    return f;
}
inline float __uint_as_float(unsigned v) {
    float f;
    std::memcpy(&f, &v, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned v;
    std::memcpy(&v, &f, 4);
    return v;
}
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline unsigned __float2uint_rn(float a) { return (unsigned)std::nearbyint(a); } // the default rounding: to nearest even
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline void __nanosleep(unsigned) {}
inline void __threadfence_system() {}
inline std::mutex emu_atomic_mu;
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
    std::lock_guard<std::mutex> l(emu_atomic_mu);
    unsigned long long old = *p;
    if (v < old) *p = v;
    return old;
}

// ld_pair (kernels.cu: one 32-bit shared-memory load of two 16-bit
// values) must be 4-byte aligned: a misaligned one aborts, as it would
// fault on the GPU.
inline unsigned ld_pair(const unsigned short* p) {
    if ((uintptr_t)p & 3) {
        std::fprintf(stderr, "emu: ld_pair at %p: not 4-byte aligned\n", (const void*)p);
        std::abort();
    }
    return (unsigned)p[0] | ((unsigned)p[1] << 16);
}

// emu_half is the value of a bf16 (dt 2) or IEEE binary16 (dt 9) bit
// pattern, decoded here independently of kernels.cu's bf2f and h2f.
inline double emu_half(int dt, unsigned short h) {
    if (dt == 2) {
        unsigned u = (unsigned)h << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
    if (dt != 9) {
        std::fprintf(stderr, "emu: mma16816 with dtype %d: only bf16 (2) and f16 (9)\n", dt);
        std::abort();
    }
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? std::ldexp((double)m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024.0 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

// mma16816 is mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: d += A·B
// for the warp's 16×16 A, 16×8 B and 16×8 fp32 D, each lane holding its
// fragments in the PTX ISA's layouts (groupID g = lane/4,
// threadID_in_group t = lane%4; element i of a fragment is half i%2 of
// register i/2, the lower half first):
//
//	A[row][k]: lane (row%8)·4 + (k%8)/2, element k%2 + 2·(row≥8) + 4·(k≥8)
//	B[k][n]:   lane n·4 + (k%8)/2,       element k%2 + 2·(k≥8)
//	D[row][n]: lane (row%8)·4 + n/2,     element n%2 + 2·(row≥8)
//
// Every lane must call it (a collective). The hardware's sum of the 16
// products and d has fp32 accumulation in an order the ISA leaves open;
// the model sums the exact products in double in k order, adds d and
// rounds once, so a kernel that passes here against a float64 reference
// with a tolerance for fp32 sums passes on the GPU.
struct emu_mma_in {
    unsigned a[4], b[2];
};
inline unsigned short emu_frag_elem(const unsigned* regs, int i) {
    return (unsigned short)(i % 2 ? regs[i / 2] >> 16 : regs[i / 2] & 0xffffu);
}
inline void mma16816(int dt, float* d, const unsigned* a, const unsigned* b) {
    emu_mma_in in;
    std::memcpy(in.a, a, sizeof in.a);
    std::memcpy(in.b, b, sizeof in.b);
    auto s = emu_exchange(in);
    const unsigned lane = threadIdx.x % 32;
    float out[4];
    for (unsigned i = 0; i < 4; i++) {
        unsigned row = lane / 4 + (i >= 2 ? 8 : 0), n = (lane % 4) * 2 + i % 2;
        double acc = 0;
        for (unsigned k = 0; k < 16; k++) {
            emu_mma_in x = emu_slot<emu_mma_in>(s, (row % 8) * 4 + (k % 8) / 2);
            emu_mma_in y = emu_slot<emu_mma_in>(s, n * 4 + (k % 8) / 2);
            acc += emu_half(dt, emu_frag_elem(x.a, k % 2 + (row >= 8 ? 2 : 0) + (k >= 8 ? 4 : 0))) *
                   emu_half(dt, emu_frag_elem(y.b, k % 2 + (k >= 8 ? 2 : 0)));
        }
        out[i] = (float)(acc + (double)d[i]);
    }
    std::memcpy(d, out, sizeof out);
}

// The 16-byte vector accesses of kernels.cu (ld_v16, st_v16): counted, so
// that a test can say the vector path ran, and checked for alignment (a
// misaligned one aborts, as it would fault on the GPU). memcpy, so that the
// bf16 buffers are not read through another type.
#define STRATA_EMU 1
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
inline std::atomic<long> emu_vec_loads, emu_vec_stores;
inline void emu_vec_check(const void* p, const char* what) {
    if ((uintptr_t)p & 15) {
        std::fprintf(stderr, "emu: %s at %p: not 16-byte aligned\n", what, p);
        std::abort();
    }
}
inline uint4 ld_v16(const void* p) {
    emu_vec_check(p, "ld_v16");
    emu_vec_loads++;
    uint4 v;
    std::memcpy(&v, p, 16);
    return v;
}
inline void st_v16(void* p, uint4 v) {
    emu_vec_check(p, "st_v16");
    emu_vec_stores++;
    std::memcpy(p, &v, 16);
}

// emu_seed chooses the block order of the following launches: 0 in order,
// otherwise a permutation drawn from it.
inline unsigned emu_seed;

// emu_pool keeps the OS threads of the launches: thread t of every block
// of every launch is the pool's worker t (its thread_local state is set
// anew for each block), so a launch starts no thread. Creating and ending
// a thread per thread of each launch (about 290,000 in the test) cost most
// of the run, under the sanitizers, in the kernel.
struct emu_pool {
    std::vector<std::thread> workers;
    std::mutex mu;
    std::condition_variable start, done;
    unsigned long gen = 0;  // the launch the workers below active take part in
    unsigned active = 0, running = 0;
    void (*job)(void*, unsigned) = nullptr;
    void* arg = nullptr;
    bool stop = false;

    void work(unsigned t) {
        unsigned long seen = 0;
        for (;;) {
            void (*f)(void*, unsigned);
            void* a;
            {
                std::unique_lock<std::mutex> l(mu);
                start.wait(l, [&] { return stop || (gen != seen && t < active); });
                if (stop) return;
                seen = gen;
                f = job;
                a = arg;
            }
            f(a, t);
            std::lock_guard<std::mutex> l(mu);
            if (--running == 0) done.notify_all();
        }
    }
    // run calls f(a, t) on workers t = 0 .. n-1 at once and waits for all.
    void run(unsigned n, void (*f)(void*, unsigned), void* a) {
        std::unique_lock<std::mutex> l(mu);
        while (workers.size() < n) {
            unsigned t = workers.size();
            workers.emplace_back([this, t] { work(t); });
        }
        job = f;
        arg = a;
        active = running = n;
        gen++;
        start.notify_all();
        done.wait(l, [&] { return running == 0; });
    }
    ~emu_pool() {
        {
            std::lock_guard<std::mutex> l(mu);
            stop = true;
        }
        start.notify_all();
        for (auto& w : workers) w.join();
    }
};
inline emu_pool emu_threads;

// emu_launch runs kernel<<<grid, block>>>(args...).
template <class... P, class... A>
void emu_launch(void (*kernel)(P...), unsigned grid, unsigned block, A... args) {
    static_assert(sizeof...(P) == sizeof...(A), "argument count");
    if (grid == 0) return;
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    std::vector<unsigned> order(grid);
    std::iota(order.begin(), order.end(), 0u);
    if (emu_seed) std::shuffle(order.begin(), order.end(), std::mt19937(emu_seed));
    std::barrier<> bar(block);
    emu_bar = &bar;
    std::vector<long> counts(block), wcounts(block);
    emu_new_warps(block);
    auto body = [&](unsigned t) {
        threadIdx = {t, 0, 0};
        for (unsigned k = 0; k < grid; k++) {
            blockIdx = {order[k], 0, 0};
            emu_syncs = 0;
            emu_warp_ops = 0;
            emu_warp_parity = 0;
            kernel(((P)args)...);
            counts[t] = emu_syncs;
            wcounts[t] = emu_warp_ops;
            emu_warps[t / 32].bar->arrive_and_drop();
            bar.arrive_and_wait();
            if (t == 0) {
                for (unsigned u = 1; u < block; u++) {
                    if (counts[u] != counts[0]) {
                        std::fprintf(stderr, "emu: block %u: thread %u reached %ld barriers, thread 0 %ld\n",
                                     order[k], u, counts[u], counts[0]);
                        std::abort();
                    }
                    if (wcounts[u] != wcounts[u / 32 * 32]) {
                        std::fprintf(stderr, "emu: block %u: thread %u took part in %ld warp operations, thread %u in %ld\n",
                                     order[k], u, wcounts[u], u / 32 * 32, wcounts[u / 32 * 32]);
                        std::abort();
                    }
                }
                emu_new_warps(block);
            }
            bar.arrive_and_wait();
        }
    };
    emu_threads.run(block, [](void* b, unsigned t) { (*static_cast<decltype(body)*>(b))(t); }, &body);
}
