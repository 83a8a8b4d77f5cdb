//! The CUDA/HIP kernels (hip/escha-kernels.cuh) as ggml-hip compiles them:
//! the executor built with GGML_USE_HIP (hip/shim/cuda-executor.cpp), so
//! their HIP branches (the decode's shifts and immediates, the SIMT kernel,
//! AMD's __shfl_xor) run, on wavefronts of 32 lanes (RDNA) and of 64
//! (CDNA), where two logical 32-lane warps share a wavefront and every
//! shuffle must stay in its half. The same cases and bounds as
//! tests/cuda_shim.rs (tests/common/shim.rs), every multiply on the SIMT
//! kernel, the only one HIP launches.
#![cfg(escha_cuda_shim)]

mod common;

use common::shim::{CudaShim, DecodeFn, LinearFn, LaterOp, LinearAheadFn, MoeFn, NormXhFn, OutFn, XhFn, BLAS, GEMV, PREFILL, SIMT};
use escha_ggml::testutil::RandomLinear as Problem;

extern "C" {
    fn escha_hip_shim_set_wave(lanes: i32) -> i32;
    fn escha_hip_shim_decode(k: i32, ic: i64, oc: i64, code: *const i16, w: *mut u16) -> i32;
    fn escha_hip_shim_decode_weight(k: i32, ic: i64, oc: i64, code: *const i16, w: *mut u16) -> i32;
    fn escha_hip_shim_xh(ic: i64, x: *const f32, m: i64, rin: *const u16, s_in: *const f32, xh: *mut u16) -> i32;
    fn escha_hip_shim_norm_xh(
        ic: i64, x: *const f32, stride: i64, m: i64, w: *const f32, eps: f32, n_ops: i32, rin: *const *const u16,
        s_in: *const *const f32, y: *mut f32, xh: *mut u16, mid: *mut f32,
    ) -> i32;
    fn escha_hip_shim_out(
        oc: i64, mid: *const f32, m: i64, rout: *const u16, s_out: *const f32, bias: *const f32, y: *mut f32,
    ) -> i32;
    fn escha_hip_shim_linear(
        k: i32, ic: i64, oc: i64, code: *const i16, x: *const f32, m: i64, rin: *const u16, rout: *const u16,
        s_in: *const f32, s_out: *const f32, bias: *const f32, y: *mut f32, path: i32, ksplit: i32,
    ) -> i32;
    fn escha_hip_shim_linear_ahead(
        k: i32, ic: i64, oc: i64, code: *const i16, x: *const f32, m: i64, rin: *const u16, rout: *const u16,
        s_in: *const f32, s_out: *const f32, bias: *const f32, k1: i32, code1: *const i16, rin1: *const u16,
        rout1: *const u16,
        s_in1: *const f32, s_out1: *const f32, bias1: *const f32, add: *const f32, silu_mul: i32, y: *mut f32,
        path: i32, ksplit: i32, later: *const LaterOp, n_later: i32,
    ) -> i32;
    fn escha_hip_shim_moe(
        k: i32, n_expert: i64, ic: i64, oc: i64, code: *const i16, x: *const f32, nx: i64, ids: *const i32,
        ids_stride: i64, n_used: i64, n_tokens: i64, rin: *const u16, rout: *const u16, s_in: *const f32,
        s_in_rows: i64, s_out: *const f32, s_out_rows: i64, bias: *const f32, bias_rows: i64, y: *mut f32,
        grouped: i32, path: i32, ksplit: i32,
    ) -> i32;
}

/// The HIP build on wavefronts of `lanes` lanes. The width is the calling
/// thread's setting (each test runs on its own thread), for the calls that follow.
fn hip(lanes: i32) -> CudaShim {
    assert_eq!(unsafe { escha_hip_shim_set_wave(lanes) }, 0);
    CudaShim {
        name: if lanes == 32 { "hip wave32" } else { "hip wave64" },
        decode: escha_hip_shim_decode as DecodeFn,
        decode_weight: escha_hip_shim_decode_weight as DecodeFn,
        xh: escha_hip_shim_xh as XhFn,
        norm_xh: escha_hip_shim_norm_xh as NormXhFn,
        out: escha_hip_shim_out as OutFn,
        linear: escha_hip_shim_linear as LinearFn,
        linear_ahead: escha_hip_shim_linear_ahead as LinearAheadFn,
        moe: escha_hip_shim_moe as MoeFn,
        simt_only: true,
    }
}

macro_rules! hip_tests {
    ($wave:ident, $lanes:expr) => {
        mod $wave {
            use super::hip;

            #[test]
            fn decode_places_every_value_at_its_fragment_position() {
                hip($lanes).decode_places_every_value_at_its_fragment_position();
            }

            #[test]
            fn decode_weight_is_bit_exact() {
                hip($lanes).decode_weight_is_bit_exact();
            }

            #[test]
            fn input_transform_is_bit_exact() {
                hip($lanes).input_transform_is_bit_exact();
            }

            #[test]
            fn norm_transform_is_bit_exact() {
                hip($lanes).norm_transform_is_bit_exact();
            }

            #[test]
            fn output_transform_is_bit_exact() {
                hip($lanes).output_transform_is_bit_exact();
            }

            #[test]
            fn dense_matches_reference_on_every_kernel() {
                hip($lanes).dense_matches_reference_on_every_kernel();
            }

            #[test]
            fn moe_matches_reference_on_every_kernel() {
                hip($lanes).moe_matches_reference_on_every_kernel();
            }

            #[test]
            fn graph_fusions_match_their_nodes() {
                hip($lanes).graph_fusions_match_their_nodes();
            }

            #[test]
            fn ahead_transforms_match_their_ops() {
                hip($lanes).ahead_transforms_match_their_ops();
            }

            #[test]
            fn moe_invalid_id_gives_nan() {
                hip($lanes).moe_invalid_id_gives_nan();
            }
        }
    };
}

hip_tests!(wave32, 32);
hip_tests!(wave64, 64);

/// The HIP build has no mma kernels (escha.cu launches the SIMT one there,
/// or for large dense batches the decode-once kernel and hipBLAS), and
/// wavefronts of 32 or 64 lanes only.
#[test]
fn only_the_simt_kernel_and_real_wave_widths() {
    assert_eq!(unsafe { escha_hip_shim_set_wave(16) }, -1);
    assert_eq!(unsafe { escha_hip_shim_set_wave(128) }, -1);
    let p = Problem::new(5, 2, 128, 128, false, false);
    let x = p.input(6, 1);
    let mut y = vec![f32::NAN; 128];
    let run = |path: i32, y: &mut [f32]| unsafe {
        escha_hip_shim_linear(
            2, 128, 128, p.code.as_ptr(), x.as_ptr(), 1, p.rin.as_ptr() as *const u16, p.rout.as_ptr() as *const u16,
            std::ptr::null(), std::ptr::null(), std::ptr::null(), y.as_mut_ptr(), path, 1,
        )
    };
    assert_eq!(run(GEMV, &mut y), -1);
    assert_eq!(run(PREFILL, &mut y), -1);
    assert_eq!(run(SIMT, &mut y), 0);
    assert_eq!(run(BLAS, &mut y), 0);
}
