// cuda-shim.h: just enough CUDA for hip/escha-kernels.cuh to compile as
// C++17 on any host; the executor (cuda-executor.cpp) runs each thread of a
// block as a fiber (tests/shim/fibers.h), and what needs more than one lane
// meets at a warp barrier: shuffles here, the mma.m16n8k16 there.
//
// Modelled exactly: `half` as IEEE binary16 (the compiler's _Float16, round
// to nearest even), f16 adds as one rounding of the exact f32 sum, the
// integer intrinsics, f32 arithmetic (compiled with -ffp-contract=off, as
// __fmul_rn keeps nvcc from fusing). The mma sums its f32 products in k
// order; the hardware's order is unspecified and the tests allow for any.
#ifndef ESCHA_CUDA_SHIM_H
#define ESCHA_CUDA_SHIM_H

#define ESCHA_CUDA_SHIM 1
#define __CUDA_ARCH__ 800
#define GGML_CUDA_CC_AMPERE 800

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "fibers.h"

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define GGML_UNUSED(x) (void) (x)
#define NO_DEVICE_CODE abort()

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3() = default;
    dim3(unsigned a, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

// The block being run (blocks run one after another) and the calling
// thread: a fiber of tests/shim/fibers.h.
extern thread_local dim3 blockIdx, blockDim, gridDim;
#define threadIdx (dim3((unsigned) escha_fibers::thread_index(), 0, 0))

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

static inline float __uint_as_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

static inline float __fmul_rn(float a, float b) {
    return a * b;
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

template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    static_assert(sizeof(T) <= escha_fibers::kSlotBytes, "a slot holds kSlotBytes");
    (void) mask;
    unsigned char * slots = escha_fibers::warp_slots();
    const int lane = escha_fibers::lane();
    std::memcpy(slots + escha_fibers::kSlotBytes * lane, &v, sizeof v);
    escha_fibers::warp_sync();
    const int src = (lane & ~(width - 1)) | ((lane ^ lane_mask) & (width - 1));
    T r;
    std::memcpy(&r, slots + escha_fibers::kSlotBytes * src, sizeof r);
    escha_fibers::warp_sync(); // nobody overwrites a slot before every lane read it
    return r;
}

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 with c as accumulator,
// every lane of the warp at once (PTX ISA fragment layouts).
void escha_shim_mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);

#endif // ESCHA_CUDA_SHIM_H
