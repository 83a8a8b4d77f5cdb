//! The Metal kernels (metal/escha.metal), compiled as C++ through
//! metal/shim/metal-shim.h and executed threadgroup by threadgroup by the
//! fiber executor (metal/shim/executor.cpp), against the C reference: the
//! same cases as test-backend-ops (K = 2/3, rectangular multi-block shapes,
//! batches 1/17/33, MoE with prune masks, broadcast and per-slot inputs),
//! plus the host-side plan (kernels, grids, argument struct, scratch) that
//! ggml-metal encodes. Built with the `shims` feature (build/shims.rs).
#![cfg(escha_metal_shim)]

mod common;

use common::shim::{check, check_decode, check_dense, check_moe, dense_problem, f16_ptr, opt, route, summarize, Layout, MoeData, Route, Stats};
use common::{order_bound, Problem};
use escha_ggml::testutil::Rng;
use escha_ggml::cref;
use half::f16;

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
struct Args {
    k: i32,
    ic: i32,
    oc: i32,
    nrows: i32,
    ne11: i32,
    ne12: i32,
    nb11: u64,
    nb12: u64,
    nb13: u64,
    n_used: i32,
    n_expert: i32,
    nbi1: u64,
    code_es: u64,
    rin_es: i32,
    rout_es: i32,
    s_in_es: i32,
    s_out_es: i32,
    bias_es: i32,
    has_s_in: i32,
    has_s_out: i32,
    has_bias: i32,
    slot_cap: i32,
}

extern "C" {
    fn escha_metal_shim_plan(
        moe: i32, k: i32, ic: i64, oc: i64, n_expert: i64, rows: i64, n_used: i64, nx: i64, path: i32, out: *mut i64,
        names: *mut u8, scratch: *mut u64, args: *mut Args,
    ) -> i32;
    fn escha_metal_shim_linear(
        k: i32, ic: i64, oc: i64, code: *const i16, x: *const f32, ne11: i64, ne12: i64, nb11: u64, nb12: u64,
        rin: *const u16, rout: *const u16, s_in: *const f32, s_out: *const f32, bias: *const f32, y: *mut f32, path: i32,
    ) -> i32;
    fn escha_metal_shim_moe(
        k: i32, n_expert: i64, ic: i64, oc: i64, code: *const i16, x: *const f32, nx: i64, ids: *const i32,
        ids_stride: i64, n_used: i64, n_tokens: i64, rin: *const u16, rout: *const u16, s_in: *const f32,
        s_in_rows: i64, s_out: *const f32, s_out_rows: i64, bias: *const f32, bias_rows: i64, y: *mut f32, path: i32,
    ) -> i32;
    fn escha_metal_shim_decode(k: i32, ic: i64, oc: i64, code: *const i16, w: *mut u16) -> i32;
    fn escha_metal_shim_ggml_linear(
        k: i32, ic: i64, oc: i64, code: *const i16, x: *const f32, m: i64, pad: i64, rin: *const u16, rout: *const u16,
        s_in: *const f32, s_out: *const f32, bias: *const f32, y: *mut f32, log: *mut u8, log_len: usize,
    ) -> i32;
    fn escha_metal_shim_ggml_moe(
        k: i32, n_expert: i64, ic: i64, oc: i64, code: *const i16, x: *const f32, nx: i64, ids: *const i32,
        ids_stride: i64, n_used: i64, n_tokens: i64, rin: *const u16, rout: *const u16, s_in: *const f32,
        s_in_rows: i64, s_out: *const f32, s_out_rows: i64, bias: *const f32, bias_rows: i64, y: *mut f32,
        log: *mut u8, log_len: usize,
    ) -> i32;
}

const AUTO: i32 = -1;
const GEMV: i32 = 0;
const PREFILL: i32 = 1;
const MMA: i32 = 2;

/// y of the dense kernels; x rows at row stride `ld` (>= ic) in `ne12` groups of `ne11`.
fn run_dense(p: &Problem, x: &[f32], ne11: usize, ne12: usize, ld: usize, path: i32) -> Vec<f32> {
    let (ic, oc) = (p.shape.ic, p.shape.oc);
    assert!(x.len() >= ld * ne11 * ne12);
    let mut y = vec![f32::NAN; ne11 * ne12 * oc];
    let rc = unsafe {
        escha_metal_shim_linear(
            p.shape.k as i32, ic as i64, oc as i64, p.code.as_ptr(), x.as_ptr(), ne11 as i64, ne12 as i64,
            (ld * 4) as u64, (ld * 4 * ne11) as u64, f16_ptr(&p.rin), f16_ptr(&p.rout), opt(p.s_in.as_deref()),
            opt(p.s_out.as_deref()), opt(p.bias.as_deref()), y.as_mut_ptr(), path,
        )
    };
    assert_eq!(rc, 0, "the plan rejected a valid dense shape");
    y
}

fn dense_case(p: &Problem, m: usize, path: i32, seed: u64) -> Stats {
    let (ic, oc) = (p.shape.ic, p.shape.oc);
    let x = p.input(seed, m);
    let got = run_dense(p, &x, m, 1, ic, path);
    let what = format!(
        "linear K={} {}x{} m={m} path={path} scales={} bias={}",
        p.shape.k, ic, oc, p.s_in.is_some(), p.bias.is_some()
    );
    check_dense(&what, p, &x, m, &got)
}

#[test]
fn decode_kernel_is_bit_exact() {
    check_decode("metal decode", escha_metal_shim_decode, Layout::InputMajor);
}

#[test]
fn dense_matches_reference() {
    let mut all = Vec::new();
    for k in [2, 3] {
        for (ic, oc) in [(256, 384), (384, 256), (128, 128)] {
            let p = dense_problem(7 * k as u64 + ic as u64, k, ic, oc, true, true);
            for m in [1, 17, 33] {
                all.push(dense_case(&p, m, AUTO, 1000 + m as u64));
            }
            // The other kernels for the same batches (auto: GEMV below 8 rows,
            // prefill below 32, simdgroup matrices from 32).
            all.push(dense_case(&p, 17, GEMV, 2017));
            all.push(dense_case(&p, 1, PREFILL, 2001));
            all.push(dense_case(&p, 33, PREFILL, 2033));
            all.push(dense_case(&p, 1, MMA, 3001));
            all.push(dense_case(&p, 17, MMA, 3017));
            let p = dense_problem(11 * k as u64 + oc as u64, k, ic, oc, false, false);
            all.push(dense_case(&p, 2, AUTO, 3002));
            let p = dense_problem(13 * k as u64 + oc as u64, k, ic, oc, true, false);
            all.push(dense_case(&p, 5, AUTO, 3005));
        }
    }
    summarize("dense", &all);
}

/// x as a strided 3-D tensor (rows padded, ne11 x ne12): the kernels must
/// follow nb11/nb12, as for a view.
#[test]
fn dense_follows_input_strides() {
    for path in [GEMV, PREFILL, MMA] {
        let p = dense_problem(77, 2, 256, 384, true, true);
        let (ic, ne11, ne12, ld) = (256, 5, 3, 256 + 40);
        let m = ne11 * ne12;
        let mut rng = Rng::new(5);
        let xs: Vec<f32> = (0..m * ld).map(|_| rng.uniform() * 2.0 - 1.0).collect();
        let dense: Vec<f32> = (0..m).flat_map(|r| xs[r * ld..r * ld + ic].to_vec()).collect();
        let got = run_dense(&p, &xs, ne11, ne12, ld, path);
        let l = p.linear();
        check(
            &format!("strided x path={path}"),
            &got,
            &cref::linear(&l, &dense, m).unwrap(),
            &order_bound(&l, &dense, m),
            |_| None,
        );
    }
}

fn run_moe(d: &MoeData, x: &[f32], r: &Route, path: i32) -> Vec<f32> {
    let mut y = vec![f32::NAN; r.t * r.n_used * d.oc];
    let rows = d.vec_rows as i64;
    let rc = unsafe {
        escha_metal_shim_moe(
            d.k as i32, d.e as i64, d.ic as i64, d.oc as i64, d.code.as_ptr(), x.as_ptr(), r.nx as i64, r.ids.as_ptr(),
            r.stride as i64, r.n_used as i64, r.t as i64, f16_ptr(&d.rin), f16_ptr(&d.rout), opt(d.s_in.as_deref()), rows,
            opt(d.s_out.as_deref()), rows, opt(d.bias.as_deref()), rows, y.as_mut_ptr(), path,
        )
    };
    assert_eq!(rc, 0, "the plan rejected a valid MoE shape");
    y
}

fn moe_case(d: &MoeData, r: &Route, path: i32, seed: u64) -> Stats {
    let x = Rng::new(seed).f32s(r.t * r.nx * d.ic, 0.0, 1.0);
    let got = run_moe(d, &x, r, path);
    let what = format!(
        "moe K={} E={} {}x{} T={} n_used={} nx={} path={path} scales={} shared={}",
        d.k, d.e, d.ic, d.oc, r.t, r.n_used, r.nx, d.s_in.is_some(), d.vec_rows == 1
    );
    check_moe(&what, d, r, &x, &got)
}

#[test]
fn moe_matches_reference() {
    let mut all = Vec::new();
    for k in [2, 3] {
        let d = MoeData::new(40 + k as u64, k, 4, 256, 384, true, false);
        for nx in [1, 2] {
            for t in [1, 17, 33] {
                all.push(moe_case(&d, &route(t as u64, t, 2, nx, 4, 2), AUTO, 500 + t as u64));
            }
            // The other kernel: GEMV for 17 tokens, prefill (map + grouped) for one.
            all.push(moe_case(&d, &route(9, 17, 2, nx, 4, 2), GEMV, 517));
            all.push(moe_case(&d, &route(8, 1, 2, nx, 4, 2), PREFILL, 501));
        }
        // No scales or bias, 8 experts, 3 used, ids as a view of a wider tensor.
        let d = MoeData::new(50 + k as u64, k, 8, 384, 256, false, false);
        for nx in [1, 3] {
            all.push(moe_case(&d, &route(60, 9, 3, nx, 8, 8), AUTO, 609));
        }
        // Two input rows per token for four slots (slot u reads row u % 2).
        let d4 = MoeData::new(80 + k as u64, k, 5, 128, 128, true, false);
        all.push(moe_case(&d4, &route(81, 3, 4, 2, 5, 4), GEMV, 803));
        all.push(moe_case(&d4, &route(82, 9, 4, 2, 5, 4), PREFILL, 809));
        // Scales and bias shared by all experts ([n] instead of [E, n]).
        let d = MoeData::new(70 + k as u64, k, 3, 128, 256, true, true);
        all.push(moe_case(&d, &route(71, 5, 3, 3, 3, 3), GEMV, 705));
        all.push(moe_case(&d, &route(72, 9, 3, 1, 3, 3), PREFILL, 709));
    }
    summarize("moe", &all);
}

/// A NaN input must reach every output of its row (nothing is skipped, not
/// even pruned channels: 0 * NaN is NaN) and no other row, on every kernel,
/// exactly as in the C reference.
#[test]
fn nan_input_reaches_its_row() {
    let p = dense_problem(60, 2, 256, 384, true, false);
    for (m, path) in [(3, GEMV), (9, PREFILL), (33, MMA)] {
        let mut x = p.input(61, m);
        x[256 + 200] = f32::NAN; // row 1, second 128-block
        let got = run_dense(&p, &x, m, 1, 256, path);
        let want = cref::linear(&p.linear(), &x, m).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.is_nan(), w.is_nan(), "path {path} output {i}");
            assert_eq!(g.is_nan(), i / 384 == 1, "path {path} output {i}");
        }
    }
}

/// An expert id outside [0, E) cannot stop a GPU kernel: its slot must come
/// out NaN (never another expert's result), on both paths.
#[test]
fn moe_invalid_id_gives_nan() {
    let d = MoeData::new(90, 2, 4, 128, 128, false, false);
    for path in [GEMV, PREFILL] {
        let mut r = route(91, 9, 2, 1, 4, 2);
        r.ids[5] = 4; // token 2, slot 1
        let x = Rng::new(92).f32s(r.t * d.ic, 0.0, 1.0);
        let y = run_moe(&d, &x, &r, path);
        for (slot, out) in y.chunks(d.oc).enumerate() {
            assert_eq!(out.iter().all(|v| v.is_nan()), slot == 5, "path {path}: slot {slot}");
        }
    }
}

struct Plan {
    n: i32,
    grid: [[i64; 7]; 2],
    names: [String; 2],
    scratch: u64,
    args: Args,
}

#[allow(clippy::too_many_arguments)]
fn plan(moe: bool, k: i32, ic: i64, oc: i64, e: i64, rows: i64, n_used: i64, nx: i64, path: i32) -> Plan {
    let (mut out, mut names, mut scratch, mut args) = ([0i64; 14], [0u8; 96], 0u64, Args::default());
    let n = unsafe {
        escha_metal_shim_plan(
            moe as i32, k, ic, oc, e, rows, n_used, nx, path, out.as_mut_ptr(), names.as_mut_ptr(), &mut scratch, &mut args,
        )
    };
    let name = |i: usize| {
        let b = &names[48 * i..48 * (i + 1)];
        String::from_utf8_lossy(&b[..b.iter().position(|&c| c == 0).unwrap_or(48)]).into_owned()
    };
    let mut grid = [[0i64; 7]; 2];
    grid[0].copy_from_slice(&out[..7]);
    grid[1].copy_from_slice(&out[7..]);
    Plan { n, grid, names: [name(0), if n > 1 { name(1) } else { String::new() }], scratch, args }
}

fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// One dispatch as the plan should make it: kernel name, threadgroups
/// per grid, threads per threadgroup, threadgroup memory bytes.
#[derive(Debug, PartialEq)]
struct Want {
    name: String,
    grid: [i64; 7],
}

/// The rules metal/README.md states for the kernels, written out on their
/// own: a threadgroup is 4 simdgroups of 32 threads and owns one 128-block
/// of outputs; dense GEMV below 8 rows (grid OC/128 x rows), prefill for 8
/// to 31 rows (OC/128 x ceil(rows/8), 8 rows per threadgroup), simdgroup
/// matrices from 32 rows (OC/128 x ceil(rows/32)). Threadgroup memory, as
/// each kernel in escha.metal lays it out: GEMV 4 simdgroups x 128 input
/// floats + 4 x 128 partial sums; prefill 8 rows x 128 inputs + 8 x 128
/// sums; matrices 32 rows x 128 inputs + a 16-row strip of 128 weights.
fn want_dense(k: i32, oc: i64, rows: i64, path: i32) -> Want {
    let f = 4; // sizeof(float)
    let path = if path != AUTO { path } else if rows < 8 { GEMV } else if rows < 32 { PREFILL } else { MMA };
    let (kind, y, smem) = match path {
        GEMV => ("gemv", rows, (4 * 128 + 4 * 128) * f),
        PREFILL => ("prefill", ceil_div(rows, 8), (8 * 128 + 8 * 128) * f),
        _ => ("mma", ceil_div(rows, 32), (32 * 128 + 16 * 128) * f),
    };
    Want { name: format!("kernel_escha_linear_{kind}_k{k}"), grid: [oc / 128, y, 1, 32, 4, 1, smem] }
}

/// MoE (README): below 8 tokens the GEMV over (OC/128, n_used, T); from 8
/// tokens a map kernel, one thread per expert list (E + 1 lists, the last
/// for invalid ids) in threadgroups of 32 and no threadgroup memory, then
/// the grouped prefill over (OC/128, ceil(T/8), E+1) with the dense
/// prefill's memory.
fn want_moe(k: i32, oc: i64, e: i64, t: i64, n_used: i64, path: i32) -> Vec<Want> {
    let f = 4;
    let path = if path != AUTO { path } else if t < 8 { GEMV } else { PREFILL };
    if path == GEMV {
        return vec![Want { name: format!("kernel_escha_moe_gemv_k{k}"), grid: [oc / 128, n_used, t, 32, 4, 1, (4 * 128 + 4 * 128) * f] }];
    }
    vec![
        Want { name: "kernel_escha_moe_map".into(), grid: [ceil_div(e + 1, 32), 1, 1, 32, 1, 1, 0] },
        Want { name: format!("kernel_escha_moe_prefill_k{k}"), grid: [oc / 128, ceil_div(t, 8), e + 1, 32, 4, 1, (8 * 128 + 8 * 128) * f] },
    ]
}

fn got(p: &Plan) -> Vec<Want> {
    (0..p.n.max(0) as usize).map(|i| Want { name: p.names[i].clone(), grid: p.grid[i] }).collect()
}

/// The host-side encode decisions that ggml-metal-escha.cpp turns into
/// Metal calls: kernel names, grids, threadgroup sizes and memory, args,
/// against the rules above over a sweep of batch sizes (the thresholds and
/// the ceil divisions show at 7/8, 31/32, 33) and the 27B/35B shapes.
#[test]
fn host_plan() {
    for k in [2, 3] {
        for (ic, oc) in [(5120i64, 17408i64), (17408, 5120), (256, 384)] {
            for rows in (1..=40).chain([63, 64, 65, 512]) {
                for path in [AUTO, GEMV, PREFILL, MMA] {
                    let p = plan(false, k, ic, oc, 1, rows, 1, 1, path);
                    let what = format!("dense K={k} {ic}x{oc} rows={rows} path={path}");
                    assert_eq!(p.n, 1, "{what}");
                    assert_eq!(got(&p), vec![want_dense(k, oc, rows, path)], "{what}");
                    // x rows contiguous: nb11 = IC floats; a code expert (the
                    // whole code here) is IC/16 x OC/16 tiles of 16K int16.
                    let a = p.args;
                    assert_eq!((a.k, a.ic as i64, a.oc as i64, a.nrows as i64, a.nb11), (k, ic, oc, rows, ic as u64 * 4), "{what}");
                    assert_eq!((a.ne11 as i64, a.ne12, a.n_used, a.n_expert), (rows, 1, 1, 1), "{what}");
                    assert_eq!(a.code_es, (ic / 16 * (oc / 16) * 16 * k as i64 * 2) as u64, "{what}");
                    assert_eq!(p.scratch, 0, "{what}");
                }
            }
        }
    }
    for k in [2, 3] {
        // (E, IC, OC, n_used, NX): the 35B expert shapes, and small ones.
        for (e, ic, oc, n_used, nx) in [(256i64, 2048i64, 1024i64, 8i64, 1i64), (256, 512, 2048, 8, 8), (4, 256, 384, 2, 2), (8, 384, 256, 3, 1)] {
            for t in (1..=20).chain([31, 32, 33, 512]) {
                for path in [AUTO, GEMV, PREFILL] {
                    let p = plan(true, k, ic, oc, e, t, n_used, nx, path);
                    let what = format!("moe K={k} E={e} {ic}x{oc} T={t} n_used={n_used} nx={nx} path={path}");
                    let want = want_moe(k, oc, e, t, n_used, path);
                    assert_eq!(p.n as usize, want.len(), "{what}");
                    assert_eq!(got(&p), want, "{what}");
                    let a = p.args;
                    assert_eq!((a.ic as i64, a.oc as i64, a.nrows as i64, a.n_used as i64, a.n_expert as i64), (ic, oc, t, n_used, e), "{what}");
                    // x [T][NX][IC] and ids [T][n_used] int32, both contiguous.
                    assert_eq!((a.ne11 as i64, a.nb11, a.nb12), (nx, ic as u64 * 4, (nx * ic * 4) as u64), "{what}");
                    assert_eq!(a.nbi1, n_used as u64 * 4, "{what}");
                    assert_eq!(a.code_es, (ic / 16 * (oc / 16) * 16 * k as i64 * 2) as u64, "{what}");
                    // Prefill scratch after the result: E+1 counts, then E+1
                    // slot lists of T*n_used int32 each.
                    let prefill = want.len() == 2;
                    let (cap, scratch) = if prefill { (t * n_used, (e + 1) + (e + 1) * t * n_used) } else { (0, 0) };
                    assert_eq!((a.slot_cap as i64, p.scratch), (cap, scratch as u64 * 4), "{what}");
                }
            }
        }
    }
    // Shapes the kernels do not take.
    assert_eq!(plan(false, 2, 200, 384, 1, 1, 1, 1, AUTO).n, -1, "IC not a multiple of 128");
    assert_eq!(plan(false, 2, 256, 200, 1, 1, 1, 1, AUTO).n, -1, "OC not a multiple of 128");
    assert_eq!(plan(false, 4, 256, 384, 1, 1, 1, 1, AUTO).n, -1, "K = 4");
    assert_eq!(plan(true, 2, 256, 384, 4, 3, 3, 2, AUTO).n, -1, "NX must divide n_used");
    assert_eq!(plan(true, 2, 256, 384, 4, 64, 2, 1, MMA).n, -1, "no simdgroup-matrix MoE kernel");
}

fn log_text(buf: &[u8]) -> String {
    String::from_utf8_lossy(&buf[..buf.iter().position(|&c| c == 0).unwrap_or(buf.len())]).into_owned()
}

/// The whole host path on Linux: ops built by ggml's constructors (x and
/// ids as views), `ggml_metal_escha_supports_op`, the extra buffer size and
/// `ggml_metal_escha_encode` of metal/ggml-metal-escha.cpp, against an
/// encoder that records the calls and runs each dispatch with the buffers
/// bound at that moment.
#[test]
fn ggml_glue_dense() {
    for (k, ic, oc, m, pad, kernel) in [
        (2, 256, 384, 1, 0, "kernel_escha_linear_gemv_k2"),
        (3, 384, 256, 17, 16, "kernel_escha_linear_prefill_k3"),
        (2, 128, 256, 33, 8, "kernel_escha_linear_mma_k2"),
    ] {
        let p = dense_problem(300 + m as u64, k, ic, oc, true, true);
        let x = p.input(301, m);
        let mut y = vec![f32::NAN; m * oc];
        let mut log = vec![0u8; 4096];
        let rc = unsafe {
            escha_metal_shim_ggml_linear(
                k as i32, ic as i64, oc as i64, p.code.as_ptr(), x.as_ptr(), m as i64, pad, f16_ptr(&p.rin),
                f16_ptr(&p.rout), opt(p.s_in.as_deref()), opt(p.s_out.as_deref()), opt(p.bias.as_deref()),
                y.as_mut_ptr(), log.as_mut_ptr(), log.len(),
            )
        };
        let log = log_text(&log);
        assert_eq!(rc, 0, "{log}");
        assert!(log.starts_with(&format!("batch {m} extra 0\n")), "{log}");
        assert!(log.contains(&format!("pipeline {kernel}\n")), "{log}");
        assert_eq!(log.matches("dispatch").count(), 1, "{log}");
        assert!(!log.contains("barrier") && !log.contains("error"), "{log}");
        let l = p.linear();
        let what = format!("ggml glue linear K={k} {ic}x{oc} m={m} x row pad {pad}");
        check(&what, &y, &cref::linear(&l, &x, m).unwrap(), &order_bound(&l, &x, m), |i| {
            (p.rout[i % oc] == f16::ZERO).then(|| p.bias.as_ref().unwrap()[i % oc])
        });
    }
}

#[test]
fn ggml_glue_moe() {
    // (data, route, kernels in order): decode-sized with a per-expert
    // layout; prefill-sized with vectors shared by all experts.
    let small = MoeData::new(400, 2, 4, 256, 384, true, false);
    let large = MoeData::new(401, 3, 8, 384, 256, true, true);
    for (d, r, kernels) in [
        (&small, route(402, 1, 2, 1, 4, 4), &["kernel_escha_moe_gemv_k2"][..]),
        (&large, route(403, 9, 3, 3, 8, 8), &["kernel_escha_moe_map", "kernel_escha_moe_prefill_k3"][..]),
    ] {
        let x = Rng::new(404).f32s(r.t * r.nx * d.ic, 0.0, 1.0);
        let mut y = vec![f32::NAN; r.t * r.n_used * d.oc];
        let mut log = vec![0u8; 4096];
        let rows = d.vec_rows as i64;
        let rc = unsafe {
            escha_metal_shim_ggml_moe(
                d.k as i32, d.e as i64, d.ic as i64, d.oc as i64, d.code.as_ptr(), x.as_ptr(), r.nx as i64,
                r.ids.as_ptr(), r.stride as i64, r.n_used as i64, r.t as i64, f16_ptr(&d.rin), f16_ptr(&d.rout),
                opt(d.s_in.as_deref()), rows, opt(d.s_out.as_deref()), rows, opt(d.bias.as_deref()), rows,
                y.as_mut_ptr(), log.as_mut_ptr(), log.len(),
            )
        };
        let log = log_text(&log);
        assert_eq!(rc, 0, "{log}");
        // The buffer type reserves the prefill slot lists after the result.
        let extra = (d.e + 1) * (1 + r.n_used * r.t) * 4;
        assert!(log.starts_with(&format!("batch {} extra {extra}\n", r.t)), "{log}");
        let order: Vec<&str> = log.lines().filter_map(|l| l.strip_prefix("pipeline ")).collect();
        assert_eq!(order, kernels, "{log}");
        assert_eq!(log.matches("barrier").count(), kernels.len() - 1, "a barrier between map and prefill: {log}");
        assert!(!log.contains("error"), "{log}");
        let what = format!("ggml glue moe K={} E={} T={} nx={} ids row stride {}", d.k, d.e, r.t, r.nx, r.stride);
        check_moe(&what, d, &r, &x, &y);
    }
}
