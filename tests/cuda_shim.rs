//! The CUDA/HIP kernels (hip/escha-kernels.cuh), compiled as C++ through
//! hip/shim/cuda-shim.h and executed block by block by the executor
//! (hip/shim/cuda-executor.cpp), against the C reference, stage by stage:
//! decode (with the tile order read as mma fragments), input transform,
//! the multiply kernels (token generation, prefill, SIMT as HIP runs it;
//! IC split or not) and output transform, then whole dense and MoE ops.
//! The same kernels run on the H200 in `test-backend-ops` (hip/README.md);
//! this gates their logic in every build, without a GPU.
#![cfg(escha_cuda_shim)]

mod common;

use common::shim::{check_decode, check_dense, check_moe, dense_problem, f16_ptr, opt, route, summarize, MoeData, Route, Stats};
use escha_ggml::transform::{fold, input_transform, output_transform};
use escha_ggml::testutil::Rng;
use half::f16;

extern "C" {
    fn escha_cuda_shim_decode(k: i32, ic: i64, oc: i64, code: *const i16, w: *mut u16) -> i32;
    fn escha_cuda_shim_xh(ic: i64, x: *const f32, m: i64, rin: *const u16, s_in: *const f32, xh: *mut u16) -> i32;
    fn escha_cuda_shim_out(
        oc: i64, mid: *const f32, m: i64, rout: *const u16, s_out: *const f32, bias: *const f32, y: *mut f32,
    ) -> i32;
    fn escha_cuda_shim_linear(
        k: i32, ic: i64, oc: i64, code: *const i16, x: *const f32, m: i64, rin: *const u16, rout: *const u16,
        s_in: *const f32, s_out: *const f32, bias: *const f32, y: *mut f32, path: i32, ksplit: i32,
    ) -> i32;
    fn escha_cuda_shim_moe(
        k: i32, n_expert: i64, ic: i64, oc: i64, code: *const i16, x: *const f32, nx: i64, ids: *const i32,
        ids_stride: i64, n_used: i64, n_tokens: i64, rin: *const u16, rout: *const u16, s_in: *const f32,
        s_in_rows: i64, s_out: *const f32, s_out_rows: i64, bias: *const f32, bias_rows: i64, y: *mut f32,
        grouped: i32, path: i32, ksplit: i32,
    ) -> i32;
}

/// escha_gemv_kernel (mma, up to 16 rows per weight)
const GEMV: i32 = 0;
/// escha_mm_kernel, 64-row blocks, mma
const PREFILL: i32 = 1;
/// escha_mm_kernel without mma, as HIP and pre-Ampere GPUs run it
const SIMT: i32 = 2;

/// Every value a lane decodes, placed by the mma fragment layout the
/// kernels assume, is the reference's weight at that position.
#[test]
fn decode_places_every_value_at_its_fragment_position() {
    check_decode("cuda decode", escha_cuda_shim_decode);
}

#[test]
fn input_transform_is_bit_exact() {
    for scales in [false, true] {
        let p = dense_problem(7, 2, 384, 128, scales, false);
        let m = 3;
        let x = p.input(8, m);
        let mut got = vec![0u16; m * 384];
        let rc = unsafe { escha_cuda_shim_xh(384, x.as_ptr(), m as i64, f16_ptr(&p.rin), opt(p.s_in.as_deref()), got.as_mut_ptr()) };
        assert_eq!(rc, 0);
        let rin_eff = fold(&p.rin, p.s_in.as_deref());
        for r in 0..m {
            let mut want = vec![0f32; 384];
            input_transform(&x[r * 384..(r + 1) * 384], &rin_eff, &mut want);
            for (c, w) in want.iter().enumerate() {
                let g = got[r * 384 + c];
                assert_eq!(g, f16::from_f32(*w).to_bits(), "input transform scales={scales} row {r} channel {c}");
            }
        }
    }
}

#[test]
fn output_transform_is_bit_exact() {
    for (scales, bias) in [(false, false), (true, false), (true, true)] {
        let p = dense_problem(9, 2, 128, 384, scales, bias);
        let m = 2;
        let mid = Rng::new(10).f32s(m * 384, 0.0, 3.0);
        let mut got = vec![f32::NAN; m * 384];
        let rc = unsafe {
            escha_cuda_shim_out(
                384, mid.as_ptr(), m as i64, f16_ptr(&p.rout), opt(p.s_out.as_deref()), opt(p.bias.as_deref()), got.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0);
        let rout_eff = fold(&p.rout, p.s_out.as_deref());
        for r in 0..m {
            let mut scratch = mid[r * 384..(r + 1) * 384].to_vec();
            let mut want = vec![f16::ZERO; 384];
            output_transform(&mut scratch, &rout_eff, p.bias.as_deref(), &mut want);
            for (c, w) in want.iter().enumerate() {
                let g = got[r * 384 + c];
                assert_eq!(g.to_bits(), w.to_f32().to_bits(), "output transform scales={scales} bias={bias} row {r} channel {c}");
            }
        }
    }
}

fn dense_case(p: &common::Problem, m: usize, path: i32, ksplit: i32, seed: u64) -> Stats {
    let (k, ic, oc) = (p.shape.k, p.shape.ic, p.shape.oc);
    let x = p.input(seed, m);
    let mut got = vec![f32::NAN; m * oc];
    let rc = unsafe {
        escha_cuda_shim_linear(
            k as i32, ic as i64, oc as i64, p.code.as_ptr(), x.as_ptr(), m as i64, f16_ptr(&p.rin), f16_ptr(&p.rout),
            opt(p.s_in.as_deref()), opt(p.s_out.as_deref()), opt(p.bias.as_deref()), got.as_mut_ptr(), path, ksplit,
        )
    };
    assert_eq!(rc, 0, "the executor rejected a valid dense case");
    let what = format!(
        "multiply K={k} {ic}x{oc} m={m} path={path} ksplit={ksplit} scales={} bias={}",
        p.s_in.is_some(),
        p.bias.is_some()
    );
    check_dense(&what, p, &x, m, &got)
}

#[test]
fn dense_matches_reference_on_every_kernel() {
    let mut all = Vec::new();
    for k in [2, 3] {
        for (ic, oc) in [(256, 384), (384, 256), (128, 128)] {
            let p = dense_problem(7 * k as u64 + ic as u64, k, ic, oc, true, true);
            // Token generation: one and two 8-row blocks, a partial block.
            for m in [1, 5, 8, 9, 16] {
                all.push(dense_case(&p, m, GEMV, 1, 100 + m as u64));
            }
            // IC split over blocks: partial sums meet in f32 atomics.
            all.push(dense_case(&p, 3, GEMV, 3, 203));
            all.push(dense_case(&p, 16, GEMV, 16, 216));
            // Prefill: one 64-row block, two (the second partial), a split.
            for (m, ksplit) in [(1, 1), (17, 1), (70, 1), (33, 4)] {
                all.push(dense_case(&p, m, PREFILL, ksplit, 300 + m as u64));
            }
            // SIMT, 16 rows per block.
            for (m, ksplit) in [(1, 1), (17, 1), (9, 5)] {
                all.push(dense_case(&p, m, SIMT, ksplit, 400 + m as u64));
            }
            let p = dense_problem(11 * k as u64 + oc as u64, k, ic, oc, false, false);
            all.push(dense_case(&p, 2, GEMV, 2, 502));
            all.push(dense_case(&p, 2, SIMT, 1, 503));
        }
    }
    summarize("dense", &all);
}

fn run_moe(d: &MoeData, x: &[f32], r: &Route, grouped: bool, path: i32, ksplit: i32) -> Vec<f32> {
    let mut y = vec![f32::NAN; r.t * r.n_used * d.oc];
    let rows = d.vec_rows as i64;
    let rc = unsafe {
        escha_cuda_shim_moe(
            d.k as i32, d.e as i64, d.ic as i64, d.oc as i64, d.code.as_ptr(), x.as_ptr(), r.nx as i64, r.ids.as_ptr(),
            r.stride as i64, r.n_used as i64, r.t as i64, f16_ptr(&d.rin), f16_ptr(&d.rout), opt(d.s_in.as_deref()), rows,
            opt(d.s_out.as_deref()), rows, opt(d.bias.as_deref()), rows, y.as_mut_ptr(), grouped as i32, path, ksplit,
        )
    };
    assert_eq!(rc, 0, "the executor rejected a valid MoE case");
    y
}

fn moe_case(d: &MoeData, r: &Route, grouped: bool, path: i32, ksplit: i32, seed: u64) -> Stats {
    let x = Rng::new(seed).f32s(r.t * r.nx * d.ic, 0.0, 1.0);
    let got = run_moe(d, &x, r, grouped, path, ksplit);
    let what = format!(
        "moe K={} E={} {}x{} T={} n_used={} nx={} grouped={grouped} path={path} ksplit={ksplit} shared={}",
        d.k,
        d.e,
        d.ic,
        d.oc,
        r.t,
        r.n_used,
        r.nx,
        d.vec_rows == 1
    );
    check_moe(&what, d, r, &x, &got)
}

#[test]
fn moe_matches_reference_on_every_kernel() {
    let mut all = Vec::new();
    for k in [2, 3] {
        let d = MoeData::new(40 + k as u64, k, 4, 256, 384, true, false);
        for nx in [1, 2] {
            // Decode sizes: one block row per slot (expert read on the device).
            all.push(moe_case(&d, &route(1, 1, 2, nx, 4, 2), false, GEMV, 1, 501));
            all.push(moe_case(&d, &route(5, 5, 2, nx, 4, 2), false, GEMV, 3, 505));
            all.push(moe_case(&d, &route(6, 5, 2, nx, 4, 2), false, SIMT, 1, 506));
            // Grouped by expert: 8- and 16-row token-generation blocks, prefill, SIMT.
            all.push(moe_case(&d, &route(9, 9, 2, nx, 4, 2), true, GEMV, 1, 509));
            all.push(moe_case(&d, &route(16, 16, 2, nx, 4, 2), true, GEMV, 2, 516));
            all.push(moe_case(&d, &route(33, 33, 2, nx, 4, 2), true, PREFILL, 1, 533));
            all.push(moe_case(&d, &route(70, 70, 2, nx, 4, 2), true, PREFILL, 3, 570));
            all.push(moe_case(&d, &route(17, 17, 2, nx, 4, 2), true, SIMT, 2, 517));
        }
        // ids as a view of a wider tensor; scales and bias shared by all experts.
        let d = MoeData::new(70 + k as u64, k, 8, 128, 256, true, true);
        all.push(moe_case(&d, &route(71, 5, 3, 3, 8, 8), false, GEMV, 1, 705));
        all.push(moe_case(&d, &route(72, 20, 3, 1, 8, 8), true, PREFILL, 1, 720));
        all.push(moe_case(&d, &route(73, 12, 3, 1, 8, 8), true, GEMV, 1, 712));
    }
    summarize("moe", &all);
}

/// An expert id outside [0, E) cannot stop a GPU kernel: its slot must come
/// out NaN (never another expert's result, nothing read out of bounds) and
/// every other slot must still match the reference, on every kernel.
#[test]
fn moe_invalid_id_gives_nan() {
    let d = MoeData::new(90, 2, 4, 128, 128, true, false);
    for (t, grouped, path) in [(9, false, GEMV), (9, false, SIMT), (9, true, GEMV), (33, true, PREFILL), (17, true, SIMT)] {
        let mut r = route(91, t, 2, 1, 4, 2);
        r.ids[5] = 4; // token 2, slot 1: one past the last expert
        r.ids[8] = -3; // token 4, slot 0
        let x = Rng::new(92).f32s(r.t * d.ic, 0.0, 1.0);
        let y = run_moe(&d, &x, &r, grouped, path, 2);
        for (slot, out) in y.chunks(d.oc).enumerate() {
            let bad = slot == 5 || slot == 8;
            assert!(out.iter().all(|v| v.is_nan() == bad), "grouped={grouped} path={path}: slot {slot}");
        }
        // The good slots against the reference (routing with the bad slots
        // pointed at expert 0; those two slots taken from a run of it).
        let mut fixed = route(91, t, 2, 1, 4, 2);
        fixed.ids[5] = 0;
        fixed.ids[8] = 0;
        let yf = run_moe(&d, &x, &fixed, grouped, path, 2);
        let mut g = y.clone();
        for s in [5, 8] {
            g[s * d.oc..(s + 1) * d.oc].copy_from_slice(&yf[s * d.oc..(s + 1) * d.oc]);
        }
        check_moe(&format!("moe with bad ids, grouped={grouped} path={path}"), &d, &fixed, &x, &g);
    }
}
