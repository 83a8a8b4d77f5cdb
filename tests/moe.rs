//! Expert-indexed forward: reference vs C (bit-exact), CPU kernels vs
//! reference, routing validation, SwiGLU.

mod common;

use common::*;
use escha_ggml::cpu::{CpuEngine, ExpertGroups, Isa, Kernel, Slots};
use escha_ggml::reference::{self, Moe, Routing};
use escha_ggml::testutil::Rng;
use escha_ggml::{cref, EschaError, MoeShape};
use half::f16;

struct MoeProblem {
    shape: MoeShape,
    code: Vec<i16>,
    rin: Vec<f16>,
    rout: Vec<f16>,
    s_in: Vec<f32>,
    s_out: Vec<f32>,
    bias: Vec<f32>,
}

impl MoeProblem {
    fn new(seed: u64, k: usize, e: usize, ic: usize, oc: usize) -> Self {
        let mut rng = Rng::new(seed);
        let shape = MoeShape::new("experts", k, e, ic, oc).unwrap();
        let mut rout = rng.f16s(e * oc, 0.02, 0.01);
        // Prune masks as in real MoE gate_up exports.
        for (i, v) in rout.iter_mut().enumerate() {
            if i % 7 == 3 {
                *v = f16::ZERO;
            }
        }
        MoeProblem {
            shape,
            code: rng.code(shape.code_len()),
            rin: rng.f16s(e * ic, 0.0, 1.0),
            rout,
            s_in: rng.f32s(e * ic, 1.0, 0.02),
            s_out: rng.f32s(e * oc, 1.0, 0.02),
            bias: rng.f16s(e * oc, 0.0, 0.01).into_iter().map(f16::to_f32).collect(),
        }
    }
    fn moe(&self, scales: bool) -> Moe<'_> {
        Moe {
            name: "experts",
            shape: self.shape,
            code: &self.code,
            rin: &self.rin,
            rout: &self.rout,
            s_in: scales.then_some(&self.s_in[..]),
            s_out: scales.then_some(&self.s_out[..]),
            bias: scales.then_some(&self.bias[..]),
        }
    }
}

fn ids(seed: u64, tokens: usize, n_used: usize, e: usize) -> Vec<i32> {
    let mut rng = Rng::new(seed);
    (0..tokens * n_used).map(|_| (rng.next_u32() as usize % e) as i32).collect()
}

#[test]
fn moe_reference_matches_c_and_dense() {
    for (k, e, ic, oc) in [(2, 4, 256, 384), (3, 3, 384, 256)] {
        let p = MoeProblem::new(1, k, e, ic, oc);
        for (nx, n_used, tokens) in [(1, 2, 17), (2, 2, 5), (1, 1, 1)] {
            let ids = ids(2, tokens, n_used, e);
            let r = Routing { ids: &ids, n_used, tokens, nx };
            let x = Rng::new(3).f32s(tokens * nx * ic, 0.0, 1.0);
            for scales in [false, true] {
                let y = reference::moe(&p.moe(scales), &x, &r).unwrap();
                let c = cref::moe(&p.moe(scales), &x, &r).unwrap();
                assert_eq!(bits(&y), bits(&c), "k={k} nx={nx} scales={scales}");
                // Each slot is the dense linear of its expert on its row.
                for t in 0..tokens {
                    for u in 0..n_used {
                        let (ex, xr) = r.slot(t, u);
                        let d = reference::linear(&p.moe(scales).expert(ex), &x[xr * ic..(xr + 1) * ic], 1).unwrap();
                        assert_eq!(bits(&d), bits(&y[(t * n_used + u) * oc..][..oc]));
                    }
                }
            }
        }
    }
}

#[test]
fn moe_kernels_match_reference() {
    for isa in Isa::all_available() {
        let kern = Kernel::with_isa(isa).unwrap();
        for (k, e, ic, oc) in [(2, 4, 256, 384), (3, 3, 384, 256)] {
            let p = MoeProblem::new(4, k, e, ic, oc);
            for (nx, n_used, tokens) in [(1, 2, 17), (2, 2, 33), (1, 1, 1)] {
                let ids = ids(5, tokens, n_used, e);
                let r = Routing { ids: &ids, n_used, tokens, nx };
                let x = Rng::new(6).f32s(tokens * nx * ic, 0.0, 1.0);
                let want = reference::moe(&p.moe(true), &x, &r).unwrap();
                let got = CpuEngine::new(&p.moe(true), kern).unwrap().forward(&x, &r).unwrap();
                if isa == Isa::Scalar {
                    assert_eq!(f32_bits_of(&got), bits(&want), "scalar k={k}");
                }
                // Pruned channels are exactly zero before the bias, so exactly
                // the bias after it, on every path.
                for s in 0..tokens * n_used {
                    let ex = ids[s] as usize;
                    for c in 0..oc {
                        if p.rout[ex * oc + c] == f16::ZERO {
                            assert_eq!(got[s * oc + c], p.bias[ex * oc + c], "{isa:?} slot {s} col {c}");
                        }
                    }
                }
                // Each slot within the summation-order bound of its expert.
                for t in 0..tokens {
                    for u in 0..n_used {
                        let (ex, xr) = r.slot(t, u);
                        let s = (t * n_used + u) * oc;
                        let bound = order_bound(&p.moe(true).expert(ex), &x[xr * ic..(xr + 1) * ic], 1);
                        assert_within(&format!("{isa:?} k={k} slot {t},{u}"), &got[s..s + oc], &want[s..s + oc], &bound);
                    }
                }
            }
        }
    }
}

/// The forward with both phases split `nth` ways, the shares run one after
/// another (the split is what is under test; the shares write disjoint
/// rows and units by construction).
fn forward_split(eng: &CpuEngine, p: &MoeProblem, x: &[f32], r: &Routing, nth: usize) -> Vec<f32> {
    let slots = Slots::from_routing(r, x, p.shape.ic);
    let groups = ExpertGroups::new(&slots.experts, p.shape.e);
    let mut xh = vec![f32::NAN; slots.len() * p.shape.ic];
    let mut y = vec![f32::NAN; slots.len() * p.shape.oc];
    let mut scratch = vec![0f32; eng.scratch_floats(&groups)];
    for ith in 0..nth {
        // SAFETY: xh holds slots * IC floats; the shares are distinct and
        // run one at a time.
        unsafe { eng.transform_input_shared(&slots, xh.as_mut_ptr(), ith, nth) };
    }
    for ith in 0..nth {
        // SAFETY: y holds slots * OC floats; groups from ExpertGroups::new;
        // distinct shares one at a time, after every phase-1 share.
        unsafe { eng.compute_shared(&xh, &groups, y.as_mut_ptr(), ith, nth, &mut scratch) };
    }
    y
}

#[test]
fn moe_thread_splits_cover_every_unit_once() {
    // 4 experts x 3 output blocks = 12 (expert, block) units; 5 shares start
    // inside experts (at units 3, 6, 8, 10), 13 and 40 leave shares empty,
    // and 7 slots under 13 or 40 shares leave phase-1 shares empty too.
    let (k, e, ic, oc) = (2, 4, 256, 384);
    let p = MoeProblem::new(11, k, e, ic, oc);
    for isa in Isa::all_available() {
        let eng = CpuEngine::new(&p.moe(true), Kernel::with_isa(isa).unwrap()).unwrap();
        for (n_used, tokens) in [(2, 17), (1, 7)] {
            let ids = ids(12, tokens, n_used, e);
            let r = Routing { ids: &ids, n_used, tokens, nx: 1 };
            let x = Rng::new(13).f32s(tokens * ic, 0.0, 1.0);
            let whole = eng.forward(&x, &r).unwrap();
            assert!(whole.iter().all(|v| !v.is_nan()));
            for nth in [2, 3, 5, 13, 40] {
                let got = forward_split(&eng, &p, &x, &r, nth);
                let diff = got.iter().zip(&whole).position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(diff.is_none(), "{isa:?} {nth} shares, {tokens} tokens: output {} is {} (one share: {})",
                    diff.unwrap(), got[diff.unwrap()], whole[diff.unwrap()]);
            }
        }
    }
}

#[test]
fn bad_expert_ids_are_named() {
    let p = MoeProblem::new(7, 2, 3, 128, 128);
    let ids = vec![0, 2, 3, 1];
    let r = Routing { ids: &ids, n_used: 2, tokens: 2, nx: 1 };
    let x = vec![0.5f32; 2 * 128];
    for res in [reference::moe(&p.moe(false), &x, &r).map(|_| ()), CpuEngine::new(&p.moe(false), Kernel::best()).unwrap().forward(&x, &r).map(|_| ())] {
        match res {
            Err(EschaError::BadExpertId { id: 3, token: 1, slot: 0, n_expert: 3, .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    let ids = vec![0, 1, 2];
    let r = Routing { ids: &ids, n_used: 3, tokens: 1, nx: 2 };
    assert!(matches!(reference::moe(&p.moe(false), &x, &r), Err(EschaError::Shape { .. })));
}

#[test]
fn swiglu_matches_c_and_definition() {
    let mut rng = Rng::new(8);
    let gu = rng.f16s(3 * 2 * 256, 0.0, 6.0);
    let a = reference::swiglu(&gu, 3, 256);
    assert_eq!(bits(&a), bits(&cref::swiglu(&gu, 3, 256)));
    for r in 0..3 {
        for i in 0..256 {
            let g = gu[r * 512 + i].to_f64();
            let u = gu[r * 512 + 256 + i].to_f64();
            let s = f16::from_f64(g / (1.0 + (-g).exp()));
            let want = f16::from_f64(s.to_f64() * u);
            let d = (a[r * 256 + i].to_f64() - want.to_f64()).abs();
            assert!(d <= 2.0 * ulp16(want.to_f64()), "row {r} [{i}]: {} vs {want}", a[r * 256 + i]);
        }
    }
}
