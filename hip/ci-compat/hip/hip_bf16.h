// Compile-only stand-in for <hip/hip_bf16.h> on HIP 5.x (Debian's hipcc),
// which has only hip_bfloat16. The escha kernels use no bf16.
#pragma once
#include <hip/hip_bfloat16.h>
typedef hip_bfloat16 __hip_bfloat16;
struct __hip_bfloat162 { hip_bfloat16 x, y; };
