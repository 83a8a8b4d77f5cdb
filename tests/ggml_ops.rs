//! The escha ops through the patched ggml: ggml's CPU backend (Rust
//! kernels) and its reference path (C reference) against the crate's
//! reference, and the safe API's error handling.
#![cfg(feature = "ggml")]

mod common;

use common::*;
use escha_ggml::cpu::{CpuLinear, Kernel};
use escha_ggml::ggml::{Backend, GgmlError, Graph};
use escha_ggml::reference::{self, Moe, Routing};
use escha_ggml::testutil::Rng;
use escha_ggml::MoeShape;
use half::f16;

/// y of a dense problem through ggml on `backend`.
fn ggml_linear(backend: &Backend, p: &Problem, x: &[f32], m: usize) -> Result<Vec<f32>, GgmlError> {
    let (k, ic, oc) = (p.shape.k as i64, p.shape.ic as i64, p.shape.oc as i64);
    let g = Graph::new(backend)?;
    let code = g.tensor("code", &[16 * k, oc / 16, ic / 16], &p.code)?;
    let xt = g.tensor("x", &[ic, m as i64], x)?;
    let rin = g.tensor("rin", &[ic], &p.rin)?;
    let rout = g.tensor("rout", &[oc], &p.rout)?;
    let s_in = p.s_in.as_ref().map(|v| g.tensor("s_in", &[ic], v)).transpose()?;
    let s_out = p.s_out.as_ref().map(|v| g.tensor("s_out", &[oc], v)).transpose()?;
    let bias = p.bias.as_ref().map(|v| g.tensor("bias", &[oc], v)).transpose()?;
    let y = g.escha_linear(code, xt, rin, rout, s_in, s_out, bias)?;
    g.compute(y)
}

#[test]
fn linear_through_ggml_matches_references() {
    let rust = Backend::cpu(2).unwrap();
    let cref = Backend::cpu_reference(2).unwrap();
    for (i, (k, ic, oc)) in [(2, 256, 384), (3, 384, 256), (2, 128, 128)].into_iter().enumerate() {
        for (scales, bias) in [(true, true), (false, false)] {
            let p = Problem::new(900 + i as u64, k, ic, oc, scales, bias);
            for m in [1, 17, 33] {
                let x = p.input(3, m);
                let want = reference::linear(&p.linear(), &x, m).unwrap();
                let via_ref = ggml_linear(&cref, &p, &x, m).unwrap();
                assert_eq!(f32_bits_of(&via_ref), bits(&want), "ggml reference path k={k} {ic}x{oc} m={m}");
                let via_rust = ggml_linear(&rust, &p, &x, m).unwrap();
                let bound = order_bound(&p.linear(), &x, m);
                assert_within(&format!("ggml CPU k={k} {ic}x{oc} m={m}"), &via_rust, &want, &bound);
                // The same kernels on one thread of the crate's own driver
                // give the same bits, whatever the op's phases (one pass for
                // m = 1, where each thread transforms the input itself).
                let lin = CpuLinear::new(&p.linear(), Kernel::best()).unwrap();
                let (mut xh, mut y, mut scratch) = (vec![0f32; m * ic], vec![0f32; m * oc], vec![0f32; lin.scratch_floats(m)]);
                lin.forward_into(&x, m, &mut xh, &mut y, &mut scratch);
                assert_eq!(f32_bits_of(&via_rust), f32_bits_of(&y), "ggml CPU k={k} {ic}x{oc} m={m}: other bits than CpuLinear");
            }
        }
    }
}

/// ggml's CPU backend on 1 to 6 threads where the output blocks do not
/// divide evenly over them (640 outputs are 5 blocks, 128 one): at one row
/// the leftover blocks are split by tiles (a barrier, then their output
/// transforms), at 24 rows by rows; every thread count gives the bits of
/// the crate's own driver on one thread.
#[test]
fn linear_through_ggml_on_many_threads() {
    for (i, (k, ic, oc)) in [(2, 256, 640), (3, 128, 128)].into_iter().enumerate() {
        let p = Problem::new(950 + i as u64, k, ic, oc, true, true);
        let lin = CpuLinear::new(&p.linear(), Kernel::best()).unwrap();
        for m in [1, 24] {
            let x = p.input(5, m);
            let (mut xh, mut y, mut scratch) = (vec![0f32; m * ic], vec![0f32; m * oc], vec![0f32; lin.scratch_floats(m)]);
            lin.forward_into(&x, m, &mut xh, &mut y, &mut scratch);
            for threads in 1..=6 {
                let got = ggml_linear(&Backend::cpu(threads).unwrap(), &p, &x, m).unwrap();
                assert_eq!(f32_bits_of(&got), f32_bits_of(&y), "k={k} {ic}x{oc} m={m} on {threads} threads: other bits than one thread");
            }
        }
    }
}

#[test]
fn moe_through_ggml_matches_references() {
    moe_through_ggml(2);
}

/// ggml's CPU backend with more threads than experts and than (expert,
/// output block) units, and with thread shares that start inside an expert:
/// the same bounds, and the same bits as two threads.
#[test]
fn moe_through_ggml_on_many_threads() {
    let two = moe_through_ggml(2);
    for n in [3, 5, 13] {
        assert!(moe_through_ggml(n) == two, "{n} threads gave other bits than 2");
    }
}

/// Checks the MoE cases on `threads` CPU threads; the Rust path's outputs.
fn moe_through_ggml(threads: usize) -> Vec<Vec<u32>> {
    let rust = Backend::cpu(threads).unwrap();
    let mut outs = Vec::new();
    let cref = Backend::cpu_reference(1).unwrap();
    let (k, e, ic, oc) = (3usize, 4usize, 256usize, 384usize);
    let mut rng = Rng::new(5);
    let shape = MoeShape::new("experts", k, e, ic, oc).unwrap();
    let code = rng.code(shape.code_len());
    let rin = rng.f16s(e * ic, 0.0, 1.0);
    let mut rout = rng.f16s(e * oc, 0.02, 0.01);
    rout.iter_mut().step_by(7).for_each(|v| *v = f16::ZERO);
    let s_out = rng.f32s(e * oc, 1.0, 0.02);
    for (nx, n_used, tokens) in [(1usize, 2usize, 17usize), (2, 2, 5)] {
        let ids: Vec<i32> = (0..tokens * n_used).map(|i| ((i * 7 + i / n_used) % e) as i32).collect();
        let x = rng.f32s(tokens * nx * ic, 0.0, 1.0);
        let moe = Moe { name: "experts", shape, code: &code, rin: &rin, rout: &rout, s_in: None, s_out: Some(&s_out), bias: None };
        let want = reference::moe(&moe, &x, &Routing { ids: &ids, n_used, tokens, nx }).unwrap();
        for (backend, exact) in [(&cref, true), (&rust, false)] {
            let g = Graph::new(backend).unwrap();
            let ct = g.tensor("code", &[16 * k as i64, (oc / 16) as i64, (ic / 16) as i64, e as i64], &code).unwrap();
            let xt = g.tensor("x", &[ic as i64, nx as i64, tokens as i64], &x).unwrap();
            let it = g.tensor("ids", &[n_used as i64, tokens as i64], &ids).unwrap();
            let ri = g.tensor("rin", &[ic as i64, e as i64], &rin).unwrap();
            let ro = g.tensor("rout", &[oc as i64, e as i64], &rout).unwrap();
            let so = g.tensor("s_out", &[oc as i64, e as i64], &s_out).unwrap();
            let y = g.escha_moe(ct, xt, it, ri, ro, None, Some(so), None).unwrap();
            let got = g.compute(y).unwrap();
            if exact {
                assert_eq!(f32_bits_of(&got), bits(&want), "ggml reference path nx={nx}");
            } else {
                outs.push(got.iter().map(|v| v.to_bits()).collect());
                for s in 0..tokens * n_used {
                    let (t, u) = (s / n_used, s % n_used);
                    let ex = ids[s] as usize;
                    let xr = t * nx + u % nx;
                    let bound = order_bound(&moe.expert(ex), &x[xr * ic..(xr + 1) * ic], 1);
                    assert_within(&format!("ggml CPU MoE slot {s}"), &got[s * oc..(s + 1) * oc], &want[s * oc..(s + 1) * oc], &bound);
                }
            }
        }
    }
    outs
}

#[test]
fn bad_shapes_are_errors_not_aborts() {
    let b = Backend::cpu(1).unwrap();
    let g = Graph::new(&b).unwrap();
    let code = g.tensor("blk.0.ffn_up.escha_code", &[64, 8, 8], &vec![0i16; 64 * 64]).unwrap();
    let x = g.tensor("x", &[128, 1], &[0f32; 128]).unwrap();
    let rin = g.tensor("rin", &[128], &[f16::ONE; 128]).unwrap();
    let rout = g.tensor("rout", &[128], &[f16::ONE; 128]).unwrap();
    match g.escha_linear(code, x, rin, rout, None, None, None) {
        Err(GgmlError::Shape { name, detail }) => {
            assert_eq!(name, "blk.0.ffn_up.escha_code");
            assert!(detail.contains("16*K"), "{detail}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    let code = g.tensor("code", &[32, 8, 8], &vec![0i16; 32 * 64]).unwrap();
    let short = g.tensor("rin_short", &[64], &[f16::ONE; 64]).unwrap();
    assert!(matches!(g.escha_linear(code, x, short, rout, None, None, None), Err(GgmlError::Shape { .. })));
    assert!(matches!(g.tensor("bad", &[3, 3], &[0f32; 8]), Err(GgmlError::Shape { .. })));
}

/// The op parameters carry the codebook id; every backend refuses one it
/// does not implement instead of decoding it as cbA.
#[test]
fn a_codebook_no_backend_implements_is_refused() {
    let p = Problem::new(31, 2, 128, 128, false, false);
    let x = p.input(3, 1);
    for backend in [Backend::cpu(1).unwrap(), Backend::cpu_reference(1).unwrap()] {
        for (id, known) in [(escha_ggml::format::CODEBOOK_CBA as i32, true), (2, false), (0, false)] {
            let g = Graph::new(&backend).unwrap();
            let code = g.tensor("code", &[32, 8, 8], &p.code).unwrap();
            let xt = g.tensor("x", &[128, 1], &x).unwrap();
            let rin = g.tensor("rin", &[128], &p.rin).unwrap();
            let rout = g.tensor("rout", &[128], &p.rout).unwrap();
            let y = g.escha_linear(code, xt, rin, rout, None, None, None).unwrap();
            g.set_codebook(y, id).unwrap();
            match g.compute(y) {
                Ok(_) => assert!(known, "{}: codebook {id} was computed", backend.name()),
                Err(GgmlError::Unsupported { .. }) => assert!(!known, "{}: codebook {id} refused", backend.name()),
                Err(e) => panic!("{}: codebook {id}: {e}", backend.name()),
            }
        }
        let g = Graph::new(&backend).unwrap();
        let xt = g.tensor("x", &[128, 1], &x).unwrap();
        assert!(matches!(g.set_codebook(xt, 1), Err(GgmlError::Shape { .. })));
    }
}
