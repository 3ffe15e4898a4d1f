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
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
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
    std::vector<long> counts(block);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < block; t++) {
        threads.emplace_back([&, t] {
            threadIdx = {t, 0, 0};
            for (unsigned k = 0; k < grid; k++) {
                blockIdx = {order[k], 0, 0};
                emu_syncs = 0;
                kernel(((P)args)...);
                counts[t] = emu_syncs;
                bar.arrive_and_wait();
                if (t == 0)
                    for (unsigned u = 1; u < block; u++)
                        if (counts[u] != counts[0]) {
                            std::fprintf(stderr, "emu: block %u: thread %u reached %ld barriers, thread 0 %ld\n",
                                         order[k], u, counts[u], counts[0]);
                            std::abort();
                        }
                bar.arrive_and_wait();
            }
        });
    }
    for (auto& th : threads) th.join();
}
