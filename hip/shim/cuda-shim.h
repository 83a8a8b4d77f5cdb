// cuda-shim.h: just enough CUDA for hip/escha-kernels.cuh to compile as
// C++17 on any host; the executor (cuda-executor.cpp) runs each hardware
// warp (wavefront) of a block as a group of fibers (tests/shim/fibers.h),
// and what needs more than one lane meets at a barrier: shuffles here, the
// mma.m16n8k16 there.
//
// With GGML_USE_HIP (the executor's second build) it stands in for HIP as
// ggml-hip compiles the kernels: their HIP branches, no mma, and
// __shfl_xor_sync mapped to AMD's __shfl_xor as ggml's vendors/hip.h maps
// it, on wavefronts of 32 (RDNA) or 64 (CDNA) lanes, chosen at run time.
//
// Modelled exactly: `half` as IEEE binary16 (the compiler's _Float16, round
// to nearest even), f16 adds as one rounding of the exact f32 sum, the
// integer intrinsics, f32 arithmetic (compiled with -ffp-contract=off, as
// __fmul_rn keeps nvcc from fusing). The mma sums its f32 products in k
// order; the hardware's order is unspecified and the tests allow for any.
#ifndef ESCHA_CUDA_SHIM_H
#define ESCHA_CUDA_SHIM_H

#define ESCHA_CUDA_SHIM 1
#define GGML_CUDA_CC_AMPERE 800
#ifndef GGML_USE_HIP
#define __CUDA_ARCH__ 800 // hipcc defines no __CUDA_ARCH__
#endif

#include <cstdint>
#include <cstdlib>
#include <cmath>
#include <cstring>

#include "fibers.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define GGML_UNUSED(x) (void) (x)
#define NO_DEVICE_CODE abort()

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3() = default;
    dim3(unsigned a, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

// The block being run (blocks run one after another, and the wavefronts of
// a block one after another: no kernel here synchronises a block), the
// lanes of a wavefront (32, or 64 on HIP), the first thread of the
// wavefront being run, and the calling thread: a fiber of
// tests/shim/fibers.h, whose group is the wavefront.
extern thread_local dim3 blockIdx, blockDim, gridDim;
extern thread_local int escha_shim_wave, escha_shim_wave_base;
extern thread_local unsigned char escha_shim_slots[64 * escha_fibers::kSlotBytes]; // the wavefront's exchange area
#define threadIdx (dim3((unsigned) (escha_shim_wave_base + escha_fibers::thread_index()), 0, 0))

// ---- half --------------------------------------------------------------------
struct half {
    uint16_t bits;
};
static_assert(sizeof(half) == 2, "half is 16 bits");

struct half2 {
    half x, y;
};
static_assert(sizeof(half2) == 4, "half2 is 32 bits");

static inline float __half2float(half h) {
    _Float16 f;
    std::memcpy(&f, &h.bits, 2);
    return (float) f;
}

static inline half __float2half_rn(float v) {
    const _Float16 f = (_Float16) v;
    half h;
    std::memcpy(&h.bits, &f, 2);
    return h;
}

struct float2 {
    float x, y;
};

struct float4 {
    float x, y, z, w;
};

static inline float4 make_float4(float a, float b, float c, float d) {
    return float4{ a, b, c, d };
}

struct alignas(16) uint4 {
    uint32_t x, y, z, w;
};

// Block shared memory: the blocks of a grid and the wavefronts of a block
// run one after another on the test's own OS thread, so a per-thread static
// array serves each block in turn (the decode-once kernel's staging is warp
// private: nothing here relies on another wavefront's writes).
#define __shared__ static thread_local
#define __align__(n) __attribute__((aligned(n)))

// The lanes of the calling 32-lane warp meet here, so each sees what the
// others stored before it.
static inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) {
    (void) mask;
    escha_fibers::warp_sync();
}

static inline float2 __half22float2(half2 h) {
    return float2{ __half2float(h.x), __half2float(h.y) };
}

static inline half2 __low2half2(half2 h) {
    return half2{ h.x, h.x };
}

static inline half2 __high2half2(half2 h) {
    return half2{ h.y, h.y };
}

static inline half2 __hadd2(half2 a, half2 b) {
    return half2{ __float2half_rn(__half2float(a.x) + __half2float(b.x)), __float2half_rn(__half2float(a.y) + __half2float(b.y)) };
}

// ---- integer and float intrinsics ----------------------------------------------
template <typename A, typename B>
static inline auto min(A a, B b) -> decltype(a + b) {
    return b < a ? b : a;
}

template <typename T>
static inline T __ldg(const T * p) {
    return *p;
}

// One OS thread runs every block, in order: memory is always coherent.
template <typename T>
static inline T __ldcg(const T * p) {
    return *p;
}

static inline void __threadfence() {}

static inline float __uint_as_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

static inline float __fmul_rn(float a, float b) {
    return a * b;
}

// The GPU's is approximate (MUFU.RSQ); tests of a kernel that takes it
// check its output against its own scale, not these bits.
static inline float rsqrtf(float v) {
    return 1.0f / std::sqrt(v);
}

// Top 32 bits of (hi:lo) << (s & 31).
static inline uint32_t __funnelshift_l(uint32_t lo, uint32_t hi, uint32_t s) {
    return (uint32_t) (((((uint64_t) hi) << 32) | lo) << (s & 31) >> 32);
}

// Byte i of the result is byte (s >> 4i) & 7 of the 8 bytes (y:x).
static inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    const uint64_t v = ((uint64_t) y << 32) | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) {
        r |= (uint32_t) ((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    }
    return r;
}

// ---- cross-thread operations (cuda-executor.cpp) -------------------------------
float atomicAdd(float * p, float v);
unsigned atomicAdd(unsigned * p, unsigned v);

// Every lane of the calling wavefront hands in v and gets lane src's v.
// local: every lane's src is in its own 32 lanes, which then are all that
// must meet (on a 64-lane wavefront one half may have returned already, as
// on the GPU); otherwise the whole wavefront must.
template <typename T>
static inline T escha_shim_exchange(T v, int src, bool local) {
    static_assert(sizeof(T) <= escha_fibers::kSlotBytes, "a slot holds kSlotBytes");
    const int lane = escha_fibers::thread_index();
    std::memcpy(escha_shim_slots + escha_fibers::kSlotBytes * lane, &v, sizeof v);
    local ? escha_fibers::warp_sync() : escha_fibers::group_sync();
    T r;
    std::memcpy(&r, escha_shim_slots + escha_fibers::kSlotBytes * src, sizeof r);
    local ? escha_fibers::warp_sync() : escha_fibers::group_sync(); // nobody overwrites a slot before every lane read it
    return r;
}

#ifdef GGML_USE_HIP
#define warpSize escha_shim_wave

static inline int __lane_id() {
    return escha_fibers::thread_index();
}

// AMD's __shfl_xor (hip/amd_detail/amd_warp_functions.h): a source at or
// past the end of the caller's width-lane segment gives the caller's own
// value; ds_bpermute takes the lane modulo the wavefront. A lane mask below
// 32 keeps every source in the caller's 32 lanes, whatever the width.
template <typename T>
static inline T __shfl_xor(T var, int lane_mask, int width = warpSize) {
    const int self = __lane_id();
    int index = self ^ lane_mask;
    index = index >= ((self + width) & ~(width - 1)) ? self : index;
    return escha_shim_exchange(var, index & (warpSize - 1), (unsigned) lane_mask < 32);
}

// As ggml's vendors/hip.h has it (mask dropped, width required).
#define __shfl_xor_sync(mask, var, laneMask, width) __shfl_xor(var, laneMask, width)
#else
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    (void) mask;
    const int lane = escha_fibers::thread_index();
    return escha_shim_exchange(v, (lane & ~(width - 1)) | ((lane ^ lane_mask) & (width - 1)), true);
}

template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    (void) mask;
    const int lane = escha_fibers::thread_index();
    return escha_shim_exchange(v, (lane & ~(width - 1)) | (src & (width - 1)), true);
}
#endif

#ifndef GGML_USE_HIP
// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 with c as accumulator,
// every lane of the warp at once (PTX ISA fragment layouts).
void escha_shim_mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
#endif

#endif // ESCHA_CUDA_SHIM_H
