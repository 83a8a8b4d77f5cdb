//! The CUDA/HIP kernels (hip/escha-kernels.cuh), compiled as C++ through
//! hip/shim/cuda-shim.h and executed block by block by the executor
//! (hip/shim/cuda-executor.cpp), against the C reference, stage by stage:
//! decode (with the tile order read as mma fragments), input transform,
//! the multiply kernels (token generation, prefill, SIMT as HIP runs it;
//! IC split or not) and output transform, then whole dense and MoE ops.
//! The cases live in tests/common/shim.rs; tests/hip_shim.rs runs them on
//! the kernels' HIP branches. The same kernels run on the H200 in
//! `test-backend-ops` (hip/README.md); this gates their logic in every
//! build, without a GPU.
#![cfg(escha_cuda_shim)]

mod common;

use common::shim::{CudaShim, DecodeFn, LinearFn, LaterOp, LinearAheadFn, MoeFn, NormXhFn, OutFn, XhFn};

extern "C" {
    fn escha_cuda_shim_decode(k: i32, ic: i64, oc: i64, code: *const i16, w: *mut u16) -> i32;
    fn escha_cuda_shim_decode_weight(k: i32, ic: i64, oc: i64, code: *const i16, w: *mut u16) -> i32;
    fn escha_cuda_shim_xh(ic: i64, x: *const f32, m: i64, rin: *const u16, s_in: *const f32, xh: *mut u16) -> i32;
    fn escha_cuda_shim_norm_xh(
        ic: i64, x: *const f32, stride: i64, m: i64, w: *const f32, eps: f32, n_ops: i32, rin: *const *const u16,
        s_in: *const *const f32, y: *mut f32, xh: *mut u16, mid: *mut f32,
    ) -> i32;
    fn escha_cuda_shim_out(
        oc: i64, mid: *const f32, m: i64, rout: *const u16, s_out: *const f32, bias: *const f32, y: *mut f32,
    ) -> i32;
    fn escha_cuda_shim_linear(
        k: i32, ic: i64, oc: i64, code: *const i16, x: *const f32, m: i64, rin: *const u16, rout: *const u16,
        s_in: *const f32, s_out: *const f32, bias: *const f32, y: *mut f32, path: i32, ksplit: i32,
    ) -> i32;
    fn escha_cuda_shim_linear_ahead(
        k: i32, ic: i64, oc: i64, code: *const i16, x: *const f32, m: i64, rin: *const u16, rout: *const u16,
        s_in: *const f32, s_out: *const f32, bias: *const f32, k1: i32, code1: *const i16, rin1: *const u16,
        rout1: *const u16,
        s_in1: *const f32, s_out1: *const f32, bias1: *const f32, add: *const f32, silu_mul: i32, y: *mut f32,
        path: i32, ksplit: i32, later: *const LaterOp, n_later: i32,
    ) -> i32;
    fn escha_cuda_shim_moe(
        k: i32, n_expert: i64, ic: i64, oc: i64, code: *const i16, x: *const f32, nx: i64, ids: *const i32,
        ids_stride: i64, n_used: i64, n_tokens: i64, rin: *const u16, rout: *const u16, s_in: *const f32,
        s_in_rows: i64, s_out: *const f32, s_out_rows: i64, bias: *const f32, bias_rows: i64, y: *mut f32,
        grouped: i32, path: i32, ksplit: i32,
    ) -> i32;
}

const CUDA: CudaShim = CudaShim {
    name: "cuda",
    decode: escha_cuda_shim_decode as DecodeFn,
        decode_weight: escha_cuda_shim_decode_weight as DecodeFn,
    xh: escha_cuda_shim_xh as XhFn,
    norm_xh: escha_cuda_shim_norm_xh as NormXhFn,
    out: escha_cuda_shim_out as OutFn,
    linear: escha_cuda_shim_linear as LinearFn,
        linear_ahead: escha_cuda_shim_linear_ahead as LinearAheadFn,
    moe: escha_cuda_shim_moe as MoeFn,
    simt_only: false,
};

#[test]
fn decode_places_every_value_at_its_fragment_position() {
    CUDA.decode_places_every_value_at_its_fragment_position();
}

#[test]
fn decode_weight_is_bit_exact() {
    CUDA.decode_weight_is_bit_exact();
}

#[test]
fn input_transform_is_bit_exact() {
    CUDA.input_transform_is_bit_exact();
}

#[test]
fn norm_transform_is_bit_exact() {
    CUDA.norm_transform_is_bit_exact();
}

#[test]
fn output_transform_is_bit_exact() {
    CUDA.output_transform_is_bit_exact();
}

#[test]
fn dense_matches_reference_on_every_kernel() {
    CUDA.dense_matches_reference_on_every_kernel();
}

#[test]
fn moe_matches_reference_on_every_kernel() {
    CUDA.moe_matches_reference_on_every_kernel();
}

#[test]
fn moe_invalid_id_gives_nan() {
    CUDA.moe_invalid_id_gives_nan();
}

#[test]
fn graph_fusions_match_their_nodes() {
    CUDA.graph_fusions_match_their_nodes();
}

#[test]
fn ahead_transforms_match_their_ops() {
    CUDA.ahead_transforms_match_their_ops();
}
