// Compile-only stand-in for hipBLAS (which Debian does not package): the
// declarations ggml-cuda's common header names. CI compiles the escha
// kernels against it and links nothing; a real ROCm build uses hipBLAS.
#pragma once
typedef struct hipblasContext * hipblasHandle_t;
typedef enum {
    HIPBLAS_STATUS_SUCCESS, HIPBLAS_STATUS_NOT_INITIALIZED, HIPBLAS_STATUS_ALLOC_FAILED, HIPBLAS_STATUS_INVALID_VALUE,
    HIPBLAS_STATUS_MAPPING_ERROR, HIPBLAS_STATUS_EXECUTION_FAILED, HIPBLAS_STATUS_INTERNAL_ERROR,
    HIPBLAS_STATUS_NOT_SUPPORTED, HIPBLAS_STATUS_ARCH_MISMATCH
} hipblasStatus_t;
typedef enum { HIPBLAS_OP_N, HIPBLAS_OP_T } hipblasOperation_t;
typedef enum { HIPBLAS_R_16F, HIPBLAS_R_16B, HIPBLAS_R_32F } hipblasDatatype_t;
typedef enum { HIPBLAS_COMPUTE_16F, HIPBLAS_COMPUTE_32F, HIPBLAS_COMPUTE_32F_FAST_16F } hipblasComputeType_t;
typedef enum { HIPBLAS_GEMM_DEFAULT } hipblasGemmAlgo_t;
hipblasStatus_t hipblasCreate(hipblasHandle_t * handle);
hipblasStatus_t hipblasDestroy(hipblasHandle_t handle);
hipblasStatus_t hipblasSetStream(hipblasHandle_t handle, hipStream_t stream);
// HIP before 6.5 takes the compute type as a hipblasDatatype_t (vendors/hip.h).
hipblasStatus_t hipblasGemmEx(hipblasHandle_t handle, hipblasOperation_t transA, hipblasOperation_t transB, int m, int n, int k,
                              const void * alpha, const void * A, hipblasDatatype_t aType, int lda, const void * B,
                              hipblasDatatype_t bType, int ldb, const void * beta, void * C, hipblasDatatype_t cType, int ldc,
                              hipblasDatatype_t computeType, hipblasGemmAlgo_t algo);
