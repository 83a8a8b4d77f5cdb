//! What the shim tests of the GPU kernels share (tests/metal_shim.rs,
//! tests/cuda_shim.rs): the comparison against the C reference within the
//! summation-order bound, and random MoE data and routings.

use super::{order_bound, Problem};
use escha_ggml::cref;
use escha_ggml::reference::Linear;
use escha_ggml::testutil::Rng;
use escha_ggml::LinearShape;
use half::f16;

/// An optional slice as the nullable pointer a C entry point takes.
pub fn opt<T>(v: Option<&[T]>) -> *const T {
    v.map_or(std::ptr::null(), |v| v.as_ptr())
}

/// f16 values as the u16 bits a C entry point takes.
pub fn f16_ptr(v: &[f16]) -> *const u16 {
    v.as_ptr() as *const u16
}

/// Worst |diff| and |diff|/bound of one comparison, and how many outputs are bit-identical.
#[derive(Default)]
pub struct Stats {
    pub max_diff: f64,
    pub max_ratio: f64,
    pub exact: usize,
    pub total: usize,
}

/// Checks `got` against the reference `want` within the summation-order
/// bound, and pruned channels (rout == 0) for exact zeros (or the exact bias).
pub fn check(what: &str, got: &[f32], want: &[f16], bound: &[f64], pruned_value: impl Fn(usize) -> Option<f32>) -> Stats {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut st = Stats { total: got.len(), ..Default::default() };
    for (i, ((&g, w), &b)) in got.iter().zip(want).zip(bound).enumerate() {
        let w = w.to_f32();
        assert!(!g.is_nan() && !w.is_nan(), "{what}[{i}]: NaN (got {g}, reference {w})");
        assert_eq!(g, f16::from_f32(g).to_f32(), "{what}[{i}]: {g} is not an f16 value");
        let d = (g as f64 - w as f64).abs();
        assert!(d <= b, "{what}[{i}]: got {g}, reference {w}, |diff| {d:e} > bound {b:e}");
        if let Some(p) = pruned_value(i) {
            // Exactly zero (or exactly the bias), with the reference's sign of zero.
            assert!(g == p && g.to_bits() == w.to_bits(), "{what}[{i}]: pruned channel must be exactly {w:?}, got {g:?}");
        }
        st.max_diff = st.max_diff.max(d);
        st.max_ratio = st.max_ratio.max(d / b);
        st.exact += (g.to_bits() == w.to_bits()) as usize;
    }
    eprintln!(
        "{what}: max |diff| {:.3e}, max |diff|/bound {:.3}, bit-identical {}/{}",
        st.max_diff, st.max_ratio, st.exact, st.total
    );
    st
}

pub fn summarize(name: &str, all: &[Stats]) {
    let n: usize = all.iter().map(|s| s.total).sum();
    let exact: usize = all.iter().map(|s| s.exact).sum();
    let md = all.iter().map(|s| s.max_diff).fold(0.0, f64::max);
    let mr = all.iter().map(|s| s.max_ratio).fold(0.0, f64::max);
    eprintln!("{name}: {} cases, {n} outputs, max |diff| {md:.3e}, max |diff|/bound {mr:.3}, bit-identical {exact}/{n}", all.len());
    // Only the f32 summation order differs from the C reference, which
    // moves an f16 output across a rounding boundary rarely: the kernels
    // are 99.92-99.97% bit-identical. A decode or rounding slip too small
    // for the per-output bound (one ulp in 1/256 of the states) flips far
    // more outputs than 0.2%.
    assert!(exact * 1000 >= n * 998, "{name}: only {exact} of {n} outputs bit-identical to the C reference (want 99.8%)");
}


/// `got` (m rows of a dense op on x) against the C reference within the
/// bound; pruned channels exactly zero (or exactly the bias).
pub fn check_dense(what: &str, p: &Problem, x: &[f32], m: usize, got: &[f32]) -> Stats {
    let oc = p.shape.oc;
    let l = p.linear();
    let want = cref::linear(&l, x, m).unwrap();
    let bound = order_bound(&l, x, m);
    check(what, got, &want, &bound, |i| (p.rout[i % oc] == f16::ZERO).then(|| p.bias.as_ref().map_or(0.0, |b| b[i % oc])))
}

/// A decode entry point (code -> W [ic][oc] as f16 bits, 0 on success)
/// against `cref::reconstruct`, bit for bit, K = 2/3 on two shapes.
pub fn check_decode(what: &str, decode: unsafe extern "C" fn(i32, i64, i64, *const i16, *mut u16) -> i32) {
    for k in [2, 3] {
        for (ic, oc) in [(256, 384), (384, 256)] {
            let p = Problem::new(100 + k as u64, k, ic, oc, false, false);
            let mut w = vec![0u16; ic * oc];
            assert_eq!(unsafe { decode(k as i32, ic as i64, oc as i64, p.code.as_ptr(), w.as_mut_ptr()) }, 0);
            let want = cref::reconstruct(&p.code, LinearShape::new("t", k, ic, oc).unwrap());
            let bad = w.iter().zip(&want).filter(|(a, b)| **a != b.to_bits()).count();
            assert_eq!(bad, 0, "{what} K={k} {ic}x{oc}: {bad} decoded weights differ from the C reference");
        }
    }
}

/// A dense problem with prune masks on every 5th output channel.
pub fn dense_problem(seed: u64, k: usize, ic: usize, oc: usize, scales: bool, bias: bool) -> Problem {
    let mut p = Problem::new(seed, k, ic, oc, scales, bias);
    for (i, r) in p.rout.iter_mut().enumerate() {
        if i % 5 == 2 {
            *r = f16::ZERO;
        }
    }
    p
}


/// Expert-stacked data with prune masks; s_in/s_out/bias with `rows` rows (1 = shared).
pub struct MoeData {
    pub k: usize,
    pub e: usize,
    pub ic: usize,
    pub oc: usize,
    pub code: Vec<i16>,
    pub rin: Vec<f16>,
    pub rout: Vec<f16>,
    pub s_in: Option<Vec<f32>>,
    pub s_out: Option<Vec<f32>>,
    pub bias: Option<Vec<f32>>,
    pub vec_rows: usize,
}

impl MoeData {
    pub fn new(seed: u64, k: usize, e: usize, ic: usize, oc: usize, scales: bool, shared: bool) -> Self {
        let mut rng = Rng::new(seed);
        let rows = if shared { 1 } else { e };
        let mut rout = rng.f16s(e * oc, 0.02, 0.01);
        for (i, v) in rout.iter_mut().enumerate() {
            if i % 5 == 2 {
                *v = f16::ZERO; // prune masks, as in MoE gate_up exports
            }
        }
        MoeData {
            k,
            e,
            ic,
            oc,
            code: rng.code(e * (ic / 16) * (oc / 16) * 16 * k),
            rin: rng.f16s(e * ic, 0.0, 1.0),
            rout,
            s_in: scales.then(|| rng.f32s(rows * ic, 1.0, 0.02)),
            s_out: scales.then(|| rng.f32s(rows * oc, 1.0, 0.02)),
            bias: scales.then(|| rng.f16s(rows * oc, 0.0, 0.05).into_iter().map(f16::to_f32).collect()),
            vec_rows: rows,
        }
    }

    /// Expert e as a dense linear (the reference of one slot).
    pub fn expert(&self, e: usize) -> Linear<'_> {
        let n = (self.ic / 16) * (self.oc / 16) * 16 * self.k;
        let shared = self.vec_rows == 1;
        fn row(v: &Option<Vec<f32>>, shared: bool, e: usize, n: usize) -> Option<&[f32]> {
            v.as_ref().map(|v| if shared { &v[..] } else { &v[e * n..(e + 1) * n] })
        }
        Linear {
            name: "expert",
            shape: LinearShape::new("expert", self.k, self.ic, self.oc).unwrap(),
            code: &self.code[e * n..(e + 1) * n],
            rin: &self.rin[e * self.ic..(e + 1) * self.ic],
            rout: &self.rout[e * self.oc..(e + 1) * self.oc],
            s_in: row(&self.s_in, shared, e, self.ic),
            s_out: row(&self.s_out, shared, e, self.oc),
            bias: row(&self.bias, shared, e, self.oc),
        }
    }
}

pub struct Route {
    pub t: usize,
    pub n_used: usize,
    pub nx: usize,
    pub stride: usize, // int32 per token row of ids (a view of a wider argsort)
    pub ids: Vec<i32>,
}

/// Distinct experts per token, as top-k routing gives; `stride` >= n_used.
pub fn route(seed: u64, t: usize, n_used: usize, nx: usize, e: usize, stride: usize) -> Route {
    let mut rng = Rng::new(seed);
    let mut ids = vec![-7i32; t * stride];
    for tok in 0..t {
        let mut perm: Vec<i32> = (0..e as i32).collect();
        for i in (1..e).rev() {
            perm.swap(i, rng.next_u32() as usize % (i + 1));
        }
        ids[tok * stride..tok * stride + n_used].copy_from_slice(&perm[..n_used]);
    }
    Route { t, n_used, nx, stride, ids }
}


/// `got` against the reference of every slot, within the bound.
pub fn check_moe(what: &str, d: &MoeData, r: &Route, x: &[f32], got: &[f32]) -> Stats {
    // Reference of slot (t, u): expert ids[t][u] as a dense linear on
    // x[t][u % nx]. Rows of one expert go through the C reference together
    // (each row's arithmetic is independent of the others').
    let slots = r.t * r.n_used;
    let (mut want, mut bound) = (vec![f16::ZERO; slots * d.oc], vec![0f64; slots * d.oc]);
    let mut pruned = vec![None; slots * d.oc];
    for e in 0..d.e {
        let mine: Vec<usize> = (0..slots).filter(|&s| r.ids[s / r.n_used * r.stride + s % r.n_used] as usize == e).collect();
        if mine.is_empty() {
            continue;
        }
        let xs: Vec<f32> =
            mine.iter().flat_map(|&s| x[(s / r.n_used * r.nx + s % r.n_used % r.nx) * d.ic..][..d.ic].to_vec()).collect();
        let l = d.expert(e);
        let y = cref::linear(&l, &xs, mine.len()).unwrap();
        let b = order_bound(&l, &xs, mine.len());
        for (j, &s) in mine.iter().enumerate() {
            let o = s * d.oc;
            want[o..o + d.oc].copy_from_slice(&y[j * d.oc..(j + 1) * d.oc]);
            bound[o..o + d.oc].copy_from_slice(&b[j * d.oc..(j + 1) * d.oc]);
            for c in 0..d.oc {
                pruned[o + c] = (l.rout[c] == f16::ZERO).then(|| l.bias.map_or(0.0, |b| b[c]));
            }
        }
    }
    // That is the contract's definition of the MoE op; the C MoE entry point
    // (per-expert vectors only) must agree with it (checked on small batches).
    if d.vec_rows == d.e && r.stride == r.n_used && (r.nx == 1 || r.nx == r.n_used) && r.t <= 9 {
        let moe = escha_ggml::reference::Moe {
            name: "experts",
            shape: escha_ggml::MoeShape::new("experts", d.k, d.e, d.ic, d.oc).unwrap(),
            code: &d.code,
            rin: &d.rin,
            rout: &d.rout,
            s_in: d.s_in.as_deref(),
            s_out: d.s_out.as_deref(),
            bias: d.bias.as_deref(),
        };
        let routing = escha_ggml::reference::Routing { ids: &r.ids, n_used: r.n_used, tokens: r.t, nx: r.nx };
        assert_eq!(cref::moe(&moe, x, &routing).unwrap(), want, "per-slot reference vs escha_moe");
    }
    check(what, got, &want, &bound, |i| pruned[i])
}

