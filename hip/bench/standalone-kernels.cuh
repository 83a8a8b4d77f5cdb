// What a standalone nvcc program needs to include hip/escha-kernels.cuh
// without ggml's headers (the macros common.cuh would define), and a CUDA
// call check that exits with status 2 naming the call.
#pragma once

#include <cuda_fp16.h>

#include <cstdio>
#include <cstdlib>

#define GGML_UNUSED(x) (void) (x)
#define NO_DEVICE_CODE __trap()
#define GGML_CUDA_CC_AMPERE 800

#include "../escha-kernels.cuh"

#define CHECK(x)                                                                                 \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(2);                                                                             \
        }                                                                                        \
    } while (0)
