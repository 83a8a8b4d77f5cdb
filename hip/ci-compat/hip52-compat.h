// Force-included (-include) by the CI compile check of the escha kernels
// with Debian's HIP 5.x: device functions ggml-cuda's common header expects
// from newer HIP releases. Compile-only; not part of any real build.
#pragma once
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
static __device__ __forceinline__ __half __hmax(const __half a, const __half b) {
    return __half2float(a) > __half2float(b) ? a : b;
}
static __device__ __forceinline__ __half2 __shfl_xor(const __half2 v, const int m, const int w) {
    unsigned u; __builtin_memcpy(&u, &v, 4); u = __shfl_xor((int) u, m, w);
    __half2 r; __builtin_memcpy(&r, &u, 4); return r;
}
static __device__ __forceinline__ __half2 __shfl_up(const __half2 v, const unsigned d, const int w) {
    unsigned u; __builtin_memcpy(&u, &v, 4); u = __shfl_up((int) u, d, w);
    __half2 r; __builtin_memcpy(&r, &u, 4); return r;
}
