// metal-shim.h: just enough of the Metal Shading Language for escha.metal to
// compile as C++17 on any host, with the executor (executor.cpp) providing
// the parts that need more than one thread: simd_shuffle_xor, simdgroup and
// threadgroup barriers.
//
// What is modelled exactly: `half` as IEEE binary16 with round-to-nearest-even
// arithmetic (an f32 operation on two halves is exact enough that one RNE
// rounding to f16 equals the f16 operation), float<->half conversions (RNE),
// as_type bit casts, the f32 arithmetic (the shim is compiled with
// -ffp-contract=off, which Metal's `fp contract(off)` pragma mirrors).
// Address-space qualifiers and attributes are dropped.
#ifndef ESCHA_METAL_SHIM_H
#define ESCHA_METAL_SHIM_H

#define ESCHA_METAL_SHIM 1

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

// ---- address spaces and function qualifiers --------------------------------
#define kernel
#define device
#define constant
#define thread
#define threadgroup

typedef unsigned int   uint;
typedef unsigned short ushort;
typedef unsigned char  uchar;
typedef unsigned long  ulong;

// ---- half ------------------------------------------------------------------
namespace escha_shim {
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
} // namespace escha_shim

struct half {
    uint16_t bits;
    half() = default;
    half(float f) : bits(escha_shim::f32_to_f16(f)) {}
    explicit operator float() const { return escha_shim::f16_to_f32(bits); }
    friend half operator+(half a, half b) { return half(float(a) + float(b)); }
    friend half operator-(half a, half b) { return half(float(a) - float(b)); }
    friend half operator*(half a, half b) { return half(float(a) * float(b)); }
};
static_assert(sizeof(half) == 2, "half is 16 bits");

struct half2 {
    half x, y;
};
static_assert(sizeof(half2) == 4, "half2 is 32 bits");

// ---- float vectors ---------------------------------------------------------
struct float2 {
    float x, y;
    float2() = default;
    explicit float2(float s) : x(s), y(s) {}
    float2(float a, float b) : x(a), y(b) {}
    float & operator[](int i) { return i == 0 ? x : y; }
    float operator[](int i) const { return i == 0 ? x : y; }
    float2 & operator+=(float2 o) { x += o.x; y += o.y; return *this; }
    friend float2 operator+(float2 a, float2 b) { return float2(a.x + b.x, a.y + b.y); }
    friend float2 operator-(float2 a, float2 b) { return float2(a.x - b.x, a.y - b.y); }
};

struct float4 {
    float x, y, z, w;
    float4() = default;
    explicit float4(float s) : x(s), y(s), z(s), w(s) {}
    float4(float a, float b, float c, float d) : x(a), y(b), z(c), w(d) {}
    float & operator[](int i) { return i == 0 ? x : i == 1 ? y : i == 2 ? z : w; }
    float operator[](int i) const { return i == 0 ? x : i == 1 ? y : i == 2 ? z : w; }
    float4 & operator+=(float4 o) { x += o.x; y += o.y; z += o.z; w += o.w; return *this; }
    friend float4 operator+(float4 a, float4 b) { return float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }
    friend float4 operator-(float4 a, float4 b) { return float4(a.x - b.x, a.y - b.y, a.z - b.z, a.w - b.w); }
};

struct uint3 {
    uint x, y, z;
};

// ---- metal::min / max ----------------------------------------------------------
template <typename T>
static inline T min(T a, T b) {
    return b < a ? b : a;
}

template <typename T>
static inline T max(T a, T b) {
    return a < b ? b : a;
}

// ---- bit casts -------------------------------------------------------------
template <typename To, typename From>
static inline To as_type(From v) {
    static_assert(sizeof(To) == sizeof(From), "as_type needs equal sizes");
    To r;
    std::memcpy(&r, &v, sizeof r);
    return r;
}

// ---- cross-thread operations (executor.cpp) --------------------------------
namespace escha_shim {
// The calling simdgroup's exchange area: one 16-byte slot per lane.
unsigned char * simd_slots();
ushort simd_lane();
// Every lane of the calling simdgroup reaches this point before any leaves.
void simd_sync();
// Every thread of the calling threadgroup reaches this point before any leaves.
void threadgroup_sync();
} // namespace escha_shim

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2 };

static inline void simdgroup_barrier(mem_flags) {
    escha_shim::simd_sync();
}

static inline void threadgroup_barrier(mem_flags) {
    escha_shim::threadgroup_sync();
}

// Value of `v` in lane (this lane ^ mask), for every lane at once.
template <typename T>
static inline T simd_shuffle_xor(T v, ushort mask) {
    static_assert(sizeof(T) <= 16 && std::is_trivially_copyable<T>::value, "simd slot holds 16 bytes");
    unsigned char * slots = escha_shim::simd_slots();
    const ushort lane = escha_shim::simd_lane();
    std::memcpy(slots + 16 * lane, &v, sizeof v);
    escha_shim::simd_sync();
    T r;
    std::memcpy(&r, slots + 16 * ((lane ^ mask) & 31), sizeof r);
    escha_shim::simd_sync(); // nobody overwrites a slot before every lane read it
    return r;
}

// ---- simdgroup matrices -------------------------------------------------------
// On the GPU an 8x8 simdgroup matrix is spread over the 32 lanes and every
// operation on it is collective. Here each lane holds the whole matrix and
// performs the whole operation: the same values, as long as all lanes of
// the simdgroup execute the operation (the kernels only use them uniformly).
struct simdgroup_float8x8 {
    float m[64]; // row-major
};

template <typename T, int N>
static inline simdgroup_float8x8 make_filled_simdgroup_matrix(T v) {
    static_assert(N == 8, "8x8 only");
    simdgroup_float8x8 r;
    for (float & e : r.m) {
        e = v;
    }
    return r;
}

static inline void simdgroup_load(simdgroup_float8x8 & d, const float * src, ulong elements_per_row = 8) {
    for (int i = 0; i < 8; i++) {
        for (int j = 0; j < 8; j++) {
            d.m[8 * i + j] = src[i * elements_per_row + j];
        }
    }
}

static inline void simdgroup_store(const simdgroup_float8x8 & a, float * dst, ulong elements_per_row = 8) {
    for (int i = 0; i < 8; i++) {
        for (int j = 0; j < 8; j++) {
            dst[i * elements_per_row + j] = a.m[8 * i + j];
        }
    }
}

// d = a * b + c, f32 products summed in k order (the hardware's order is
// unspecified; the tests allow for any order).
static inline void simdgroup_multiply_accumulate(simdgroup_float8x8 & d, const simdgroup_float8x8 & a,
                                                 const simdgroup_float8x8 & b, const simdgroup_float8x8 & c) {
    simdgroup_float8x8 r;
    for (int i = 0; i < 8; i++) {
        for (int j = 0; j < 8; j++) {
            float s = c.m[8 * i + j];
            for (int k = 0; k < 8; k++) {
                s += a.m[8 * i + k] * b.m[8 * k + j];
            }
            r.m[8 * i + j] = s;
        }
    }
    d = r;
}

#endif // ESCHA_METAL_SHIM_H
