//! What the shim tests of the GPU kernels share (tests/metal_shim.rs,
//! tests/cuda_shim.rs, tests/hip_shim.rs): the comparison against the C
//! reference within the summation-order bound, random MoE data and
//! routings, and the cases both builds of the CUDA/HIP executor run.

use super::{order_bound, Problem};
use escha_ggml::cref;
use escha_ggml::reference::Linear;
use escha_ggml::testutil::Rng;
use escha_ggml::transform::{fold, input_transform, output_transform};
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

/// Which layout a decode entry point writes: [ic][oc] (`cref::reconstruct`'s) or [oc][ic].
pub enum Layout {
    InputMajor,
    OutputMajor,
}

/// A decode entry point (code -> W as f16 bits in `layout`, 0 on success)
/// against `cref::reconstruct`, bit for bit, K = 2/3 on two shapes; the
/// output starts as NaN bits.
pub fn check_decode(what: &str, decode: DecodeFn, layout: Layout) {
    for k in [2, 3] {
        for (ic, oc) in [(256, 384), (384, 256)] {
            let p = Problem::new(100 + k as u64, k, ic, oc, false, false);
            let mut w = vec![0xFFFFu16; ic * oc];
            assert_eq!(unsafe { decode(k as i32, ic as i64, oc as i64, p.code.as_ptr(), w.as_mut_ptr()) }, 0);
            if let Layout::OutputMajor = layout {
                w = (0..ic * oc).map(|i| w[(i % oc) * ic + i / oc]).collect();
            }
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

/// As `route`, but every token's first choice is expert 0: that expert gets
/// all `t` rows, more than the average a grouped block is sized for.
pub fn route_hot(seed: u64, t: usize, n_used: usize, nx: usize, e: usize, stride: usize) -> Route {
    let mut r = route(seed, t, n_used, nx, e, stride);
    for tok in 0..t {
        let row = &mut r.ids[tok * stride..tok * stride + n_used];
        if let Some(i) = row.iter().position(|&id| id == 0) {
            row.swap(0, i);
        } else {
            row[0] = 0;
        }
    }
    r
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

// ---- the CUDA/HIP executor (hip/shim/cuda-executor.cpp) ---------------------

pub type DecodeFn = unsafe extern "C" fn(k: i32, ic: i64, oc: i64, code: *const i16, w: *mut u16) -> i32;
pub type XhFn = unsafe extern "C" fn(ic: i64, x: *const f32, m: i64, rin: *const u16, s_in: *const f32, xh: *mut u16) -> i32;
pub type NormXhFn = unsafe extern "C" fn(
    ic: i64, x: *const f32, stride: i64, m: i64, w: *const f32, eps: f32, n_ops: i32, rin: *const *const u16,
    s_in: *const *const f32, y: *mut f32, xh: *mut u16, mid: *mut f32,
) -> i32;
pub type OutFn = unsafe extern "C" fn(
    oc: i64, mid: *const f32, m: i64, rout: *const u16, s_out: *const f32, bias: *const f32, y: *mut f32,
) -> i32;
pub type LinearFn = unsafe extern "C" fn(
    k: i32, ic: i64, oc: i64, code: *const i16, x: *const f32, m: i64, rin: *const u16, rout: *const u16,
    s_in: *const f32, s_out: *const f32, bias: *const f32, y: *mut f32, path: i32, ksplit: i32,
) -> i32;
/// A later op of `LinearAheadFn` (hip/shim/cuda-executor.cpp's
/// escha_shim_later): next = 1 when its x is the first op's output.
#[repr(C)]
pub struct LaterOp {
    pub k: i32,
    pub next: i32,
    pub oc: i64,
    pub code: *const i16,
    pub rin: *const u16,
    pub rout: *const u16,
    pub s_in: *const f32,
    pub s_out: *const f32,
    pub bias: *const f32,
    pub y: *mut f32,
}

/// Op p as a later op writing its outputs to y; next: its x is the first
/// op's output.
fn later_op(p: &Problem, next: bool, y: &mut [f32]) -> LaterOp {
    LaterOp {
        k: p.shape.k as i32,
        next: next as i32,
        oc: p.shape.oc as i64,
        code: p.code.as_ptr(),
        rin: f16_ptr(&p.rin),
        rout: f16_ptr(&p.rout),
        s_in: opt(p.s_in.as_deref()),
        s_out: opt(p.s_out.as_deref()),
        bias: opt(p.bias.as_deref()),
        y: y.as_mut_ptr(),
    }
}
pub type LinearAheadFn = unsafe extern "C" fn(
    k: i32, ic: i64, oc: i64, code: *const i16, x: *const f32, m: i64, rin: *const u16, rout: *const u16,
    s_in: *const f32, s_out: *const f32, bias: *const f32, k1: i32, code1: *const i16, rin1: *const u16,
        rout1: *const u16,
    s_in1: *const f32, s_out1: *const f32, bias1: *const f32, add: *const f32, silu_mul: i32, y: *mut f32,
        path: i32, ksplit: i32, later: *const LaterOp, n_later: i32,
) -> i32;
pub type MoeFn = unsafe extern "C" fn(
    k: i32, n_expert: i64, ic: i64, oc: i64, code: *const i16, x: *const f32, nx: i64, ids: *const i32,
    ids_stride: i64, n_used: i64, n_tokens: i64, rin: *const u16, rout: *const u16, s_in: *const f32,
    s_in_rows: i64, s_out: *const f32, s_out_rows: i64, bias: *const f32, bias_rows: i64, y: *mut f32,
    grouped: i32, path: i32, ksplit: i32,
) -> i32;

/// escha_gemv_kernel (mma, up to 16 rows per weight)
pub const GEMV: i32 = 0;
/// escha_mm_kernel, 64-row blocks, mma
pub const PREFILL: i32 = 1;
/// escha_mm_kernel without mma, as HIP and pre-Ampere GPUs run it
pub const SIMT: i32 = 2;
/// the weight decoded once (escha_decode_kernel), then a BLAS product
/// (dense; CUDA and HIP alike)
pub const BLAS: i32 = 3;
/// the fused token-generation kernel: escha_gemv_kernel computing its own
/// xh and applying the output transform (one launch, up to 4 rows a group,
/// not grouped by expert), on state that must start and end at zero
pub const FUSED: i32 = 4;
/// the fused kernel at 2 output tiles a warp (GGML_ESCHA_FUSED_NTW=2)
pub const FUSED2: i32 = 5;
/// escha_gemv_kernel as a large dense op takes it (escha_cuda_gemv_wide):
/// 8 output tiles a warp for one 8-row block, 4 for more rows
pub const GEMV_WIDE: i32 = 6;
/// What the executor returns when the fused kernel left its state nonzero.
const FUSED_STATE_LEFT: i32 = -2;

/// The entry points of one build of the executor: as CUDA, or with
/// GGML_USE_HIP (whose only multiply kernel is the SIMT one, so there every
/// case runs on it: the same batch sizes, splits and groupings).
pub struct CudaShim {
    pub name: &'static str,
    pub decode: DecodeFn,
    pub decode_weight: DecodeFn,
    pub xh: XhFn,
    pub norm_xh: NormXhFn,
    pub out: OutFn,
    pub linear: LinearFn,
    pub linear_ahead: LinearAheadFn,
    pub moe: MoeFn,
    pub simt_only: bool,
}

impl CudaShim {
    fn path(&self, path: i32) -> i32 {
        if self.simt_only && path != BLAS {
            SIMT
        } else {
            path
        }
    }

    /// Every value a lane decodes, placed by the mma fragment layout the
    /// kernels assume, is the reference's weight at that position.
    pub fn decode_places_every_value_at_its_fragment_position(&self) {
        check_decode(&format!("{} decode", self.name), self.decode, Layout::InputMajor);
    }

    /// The BLAS path's decode kernel writes every weight, bit for bit the
    /// reference's, at w[oc][ic] (the transpose of `cref::reconstruct`'s
    /// [ic][oc]); its scratch starts as NaN, so a tile it skips shows.
    pub fn decode_weight_is_bit_exact(&self) {
        check_decode(&format!("{} decode-once", self.name), self.decode_weight, Layout::OutputMajor);
    }

    pub fn input_transform_is_bit_exact(&self) {
        for scales in [false, true] {
            let p = dense_problem(7, 2, 384, 128, scales, false);
            let m = 3;
            let x = p.input(8, m);
            let mut got = vec![0u16; m * 384];
            let rc = unsafe { (self.xh)(384, x.as_ptr(), m as i64, f16_ptr(&p.rin), opt(p.s_in.as_deref()), got.as_mut_ptr()) };
            assert_eq!(rc, 0);
            let rin_eff = fold(&p.rin, p.s_in.as_deref());
            for r in 0..m {
                let mut want = vec![0f32; 384];
                input_transform(&x[r * 384..(r + 1) * 384], &rin_eff, &mut want);
                for (c, w) in want.iter().enumerate() {
                    let g = got[r * 384 + c];
                    assert_eq!(g, f16::from_f32(*w).to_bits(), "{} input transform scales={scales} row {r} channel {c}", self.name);
                }
            }
        }
    }

    /// escha.cu's norm fusion: the RMS norm of x's rows times w, written as
    /// the norm's output y, and the input transforms of the escha ops that
    /// read y, in one kernel. y must be the kernel's documented order
    /// (escha_norm_scale: lane l's four f32 partials of channels 4l + 128i
    /// + q by FMAs, paired, then the butterfly; 1/sqrt(mean + eps)) bit
    /// for bit, and each op's xh the C reference's input transform of that
    /// y; each op's mid comes back zeroed. Rows lie a stride apart (a view).
    pub fn norm_transform_is_bit_exact(&self) {
        let (ic, m, stride) = (384, 16, 392);
        let mut rng = Rng::new(21);
        let x = rng.f32s(m * stride, 0.0, 3.0);
        let w = rng.f32s(ic, 1.0, 0.5);
        let eps = 1e-6f32;
        let ops = [dense_problem(22, 2, ic, 128, true, false), dense_problem(23, 3, ic, 256, false, false)];
        let rin: Vec<*const u16> = ops.iter().map(|p| f16_ptr(&p.rin)).collect();
        let s_in: Vec<*const f32> = ops.iter().map(|p| opt(p.s_in.as_deref())).collect();
        let mut y = vec![f32::NAN; m * ic];
        let mut xh = vec![0xFFFFu16; ops.len() * m * ic];
        let mut mid = vec![f32::NAN; ops.len() * m * ic];
        let rc = unsafe {
            (self.norm_xh)(
                ic as i64, x.as_ptr(), stride as i64, m as i64, w.as_ptr(), eps, ops.len() as i32, rin.as_ptr(), s_in.as_ptr(),
                y.as_mut_ptr(), xh.as_mut_ptr(), mid.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0);
        assert!(mid.iter().all(|v| v.to_bits() == 0), "{} norm fusion: every op's mid zeroed", self.name);
        for r in 0..m {
            let xr = &x[r * stride..r * stride + ic];
            let mut lanes = [0f32; 32];
            for (l, lane) in lanes.iter_mut().enumerate() {
                let mut p = [0f32; 4];
                for c in (4 * l..ic).step_by(128) {
                    for (q, pq) in p.iter_mut().enumerate() {
                        *pq = xr[c + q].mul_add(xr[c + q], *pq);
                    }
                }
                *lane = (p[0] + p[1]) + (p[2] + p[3]);
            }
            for h in [16, 8, 4, 2, 1] {
                let prev = lanes;
                for (l, lane) in lanes.iter_mut().enumerate() {
                    *lane = prev[l] + prev[l ^ h];
                }
            }
            let scale = 1.0f32 / (lanes[0] / ic as f32 + eps).sqrt();
            let want_y: Vec<f32> = (0..ic).map(|c| (xr[c] * scale) * w[c]).collect();
            for c in 0..ic {
                assert_eq!(y[r * ic + c].to_bits(), want_y[c].to_bits(), "{} norm fusion: y row {r} channel {c}", self.name);
            }
            for (j, p) in ops.iter().enumerate() {
                let mut want = vec![0f32; ic];
                input_transform(&want_y, &fold(&p.rin, p.s_in.as_deref()), &mut want);
                for (c, v) in want.iter().enumerate() {
                    let g = xh[(j * m + r) * ic + c];
                    assert_eq!(g, f16::from_f32(*v).to_bits(), "{} norm fusion: op {j} xh row {r} channel {c}", self.name);
                }
            }
        }
    }

    pub fn output_transform_is_bit_exact(&self) {
        for (scales, bias) in [(false, false), (true, false), (true, true)] {
            let p = dense_problem(9, 2, 128, 384, scales, bias);
            let m = 2;
            let mid = Rng::new(10).f32s(m * 384, 0.0, 3.0);
            let mut got = vec![f32::NAN; m * 384];
            let rc = unsafe {
                (self.out)(
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
                    assert_eq!(
                        g.to_bits(),
                        w.to_f32().to_bits(),
                        "{} output transform scales={scales} bias={bias} row {r} channel {c}",
                        self.name
                    );
                }
            }
        }
    }

    fn dense_case(&self, p: &Problem, m: usize, path: i32, ksplit: i32, seed: u64) -> Stats {
        let (k, ic, oc) = (p.shape.k, p.shape.ic, p.shape.oc);
        let path = self.path(path);
        let x = p.input(seed, m);
        let mut got = vec![f32::NAN; m * oc];
        let rc = unsafe {
            (self.linear)(
                k as i32, ic as i64, oc as i64, p.code.as_ptr(), x.as_ptr(), m as i64, f16_ptr(&p.rin), f16_ptr(&p.rout),
                opt(p.s_in.as_deref()), opt(p.s_out.as_deref()), opt(p.bias.as_deref()), got.as_mut_ptr(), path, ksplit,
            )
        };
        assert_ne!(rc, FUSED_STATE_LEFT, "{}: the fused kernel left mid or its arrival counts nonzero (m={m})", self.name);
        assert_eq!(rc, 0, "{}: the executor rejected a valid dense case", self.name);
        let what = format!(
            "{} multiply K={k} {ic}x{oc} m={m} path={path} ksplit={ksplit} scales={} bias={}",
            self.name,
            p.s_in.is_some(),
            p.bias.is_some()
        );
        check_dense(&what, p, &x, m, &got)
    }

    pub fn dense_matches_reference_on_every_kernel(&self) {
        let mut all = Vec::new();
        for k in [2, 3] {
            for (ic, oc) in [(256, 384), (384, 256), (128, 128)] {
                let p = dense_problem(7 * k as u64 + ic as u64, k, ic, oc, true, true);
                // Token generation: one and two 8-row blocks, a partial block.
                for m in [1, 5, 8, 9, 16] {
                    all.push(self.dense_case(&p, m, GEMV, 1, 100 + m as u64));
                }
                // IC split over blocks: partial sums meet in f32 atomics.
                all.push(self.dense_case(&p, 3, GEMV, 3, 203));
                all.push(self.dense_case(&p, 16, GEMV, 16, 216));
                // A large op's one 8-row block at 8 tiles a warp (the 128x128
                // case: one block, its warps 1-3 past the edge), split or not.
                for (m, ksplit) in [(1, 1), (5, 1), (8, 3), (3, 4)] {
                    all.push(self.dense_case(&p, m, GEMV_WIDE, ksplit, 250 + m as u64));
                }
                // Prefill: one 64-row block, two (the second partial), a split.
                for (m, ksplit) in [(1, 1), (17, 1), (70, 1), (33, 4)] {
                    all.push(self.dense_case(&p, m, PREFILL, ksplit, 300 + m as u64));
                }
                // Parallel sequences: 32-row GEMV blocks, partial and split;
                // 40 and 64 rows as two row groups of them.
                for (m, ksplit) in [(17, 1), (32, 2), (40, 1), (64, 3)] {
                    all.push(self.dense_case(&p, m, GEMV, ksplit, 150 + m as u64));
                }
                // SIMT, 16 rows per block.
                for (m, ksplit) in [(1, 1), (17, 1), (9, 5)] {
                    all.push(self.dense_case(&p, m, SIMT, ksplit, 400 + m as u64));
                }
                // Decoded once, then BLAS: one block looping over every tile, and
                // the grid escha.cu launches (ksplit > 1).
                for (m, ksplit) in [(1, 1), (33, 2), (70, 2)] {
                    all.push(self.dense_case(&p, m, BLAS, ksplit, 600 + m as u64));
                }
                // Fused, one launch: 1-4 rows, one split or several (whole
                // 128-blocks: a split of 6 tile rows becomes 8).
                for (m, ksplit) in [(1, 1), (1, 3), (2, 2), (3, 1), (4, 5)] {
                    all.push(self.dense_case(&p, m, FUSED, ksplit, 700 + m as u64));
                    all.push(self.dense_case(&p, m, FUSED2, ksplit, 750 + m as u64));
                }
                let p = dense_problem(11 * k as u64 + oc as u64, k, ic, oc, false, false);
                all.push(self.dense_case(&p, 2, GEMV, 2, 502));
                all.push(self.dense_case(&p, 2, SIMT, 1, 503));
                all.push(self.dense_case(&p, 1, FUSED, 2, 504));
            }
            // 8 tiles a warp with two blocks along the outputs (64 tiles).
            let p = dense_problem(17 * k as u64, k, 256, 1024, true, true);
            all.push(self.dense_case(&p, 1, GEMV_WIDE, 2, 261));
            all.push(self.dense_case(&p, 7, GEMV_WIDE, 1, 267));
            // Fused with more tile rows than one split's staging holds (40 > 32).
            let p = dense_problem(13 * k as u64, k, 640, 256, true, true);
            all.push(self.dense_case(&p, 1, FUSED, 1, 801));
            all.push(self.dense_case(&p, 4, FUSED, 3, 804));
        }
        summarize(&format!("{} dense", self.name), &all);
    }

    /// One dense op run alone (`linear`), its outputs checked against the C
    /// reference within the bound.
    fn dense_alone(&self, what: &str, p: &Problem, x: &[f32], m: usize, path: i32, ksplit: i32) -> Vec<f32> {
        let (k, ic, oc) = (p.shape.k, p.shape.ic, p.shape.oc);
        let mut y = vec![f32::NAN; m * oc];
        let rc = unsafe {
            (self.linear)(
                k as i32, ic as i64, oc as i64, p.code.as_ptr(), x.as_ptr(), m as i64, f16_ptr(&p.rin), f16_ptr(&p.rout),
                opt(p.s_in.as_deref()), opt(p.s_out.as_deref()), opt(p.bias.as_deref()), y.as_mut_ptr(), path, ksplit,
            )
        };
        assert_eq!(rc, 0, "{what}: the executor rejected a valid dense case");
        check_dense(what, p, x, m, &y);
        y
    }

    /// escha.cu's graph fusions, run as escha_forward runs them, give
    /// exactly what their nodes give one after another: a gate and up pair
    /// in shared launches with the SWIGLU in the output transform, silu(g)
    /// * u bit for bit with g and u from the ops run alone (each within the
    /// bound of the C reference), computed here in f32 as ggml-cuda's
    /// SILU and SWIGLU kernels do; an op with a residual ADD in its output
    /// transform, y + r bit for bit; with a SILU and a MUL, silu(y) * r.
    /// Every multiply family, IC split or not, one row to two 32-row groups;
    /// the pair with both code widths alike and as the published 27B's FFN
    /// has them (gate K=2, up K=3: a multiply each).
    pub fn graph_fusions_match_their_nodes(&self) {
        let mut n = 0;
        for (k, k1) in [(2, 2), (3, 3), (2, 3)] {
            for (ic, oc) in [(256, 384), (384, 256)] {
                let gate = dense_problem(31 * k as u64 + ic as u64, k, ic, oc, true, true);
                let up = dense_problem(37 * k1 as u64 + ic as u64, k1, ic, oc, true, false);
                for (path, m, ksplit) in
                    [(GEMV, 1, 1), (GEMV, 3, 4), (GEMV_WIDE, 2, 3), (GEMV, 40, 2), (PREFILL, 17, 1), (PREFILL, 70, 3), (SIMT, 9, 2), (BLAS, 33, 2)]
                {
                    let path = self.path(path);
                    let what = format!("{} fusion K={k}/{k1} {ic}x{oc} m={m} path={path} ksplit={ksplit}", self.name);
                    let x = gate.input(900 + m as u64, m);
                    let g = self.dense_alone(&format!("{what} gate"), &gate, &x, m, path, ksplit);
                    let u = self.dense_alone(&format!("{what} up"), &up, &x, m, path, ksplit);
                    let r = Rng::new(950 + m as u64).f32s(m * oc, -2.0, 2.0);
                    let (mut glu, mut sum, mut prod) = (vec![f32::NAN; m * oc], vec![f32::NAN; m * oc], vec![f32::NAN; m * oc]);
                    let run = |code1: *const i16, p1: &Problem, add: *const f32, silu_mul: i32, y: &mut [f32]| unsafe {
                        (self.linear_ahead)(
                            k as i32, ic as i64, oc as i64, gate.code.as_ptr(), x.as_ptr(), m as i64, f16_ptr(&gate.rin),
                            f16_ptr(&gate.rout), opt(gate.s_in.as_deref()), opt(gate.s_out.as_deref()), opt(gate.bias.as_deref()),
                            k1 as i32, code1, f16_ptr(&p1.rin), f16_ptr(&p1.rout), opt(p1.s_in.as_deref()), opt(p1.s_out.as_deref()),
                            opt(p1.bias.as_deref()), add, silu_mul, y.as_mut_ptr(), path, ksplit, std::ptr::null(), 0,
                        )
                    };
                    assert_eq!(run(up.code.as_ptr(), &up, std::ptr::null(), 0, &mut glu), 0, "{what}: SWIGLU pair rejected");
                    assert_eq!(run(std::ptr::null(), &up, r.as_ptr(), 0, &mut sum), 0, "{what}: ADD rejected");
                    assert_eq!(run(std::ptr::null(), &up, r.as_ptr(), 1, &mut prod), 0, "{what}: SILU and MUL rejected");
                    let silu = |v: f32| v / (1.0 + (-v).exp());
                    for i in 0..m * oc {
                        let want = silu(g[i]) * u[i];
                        assert_eq!(glu[i].to_bits(), want.to_bits(), "{what}: SWIGLU output {i}: {} against {want}", glu[i]);
                        let want = g[i] + r[i];
                        assert_eq!(sum[i].to_bits(), want.to_bits(), "{what}: ADD output {i}: {} against {want}", sum[i]);
                        let want = silu(g[i]) * r[i];
                        assert_eq!(prod[i].to_bits(), want.to_bits(), "{what}: SILU and MUL output {i}: {} against {want}", prod[i]);
                    }
                    n += 1;
                }
            }
        }
        eprintln!("{} graph fusions: {n} cases, every output bit for bit its nodes'", self.name);
    }

    /// escha.cu's input transforms run ahead give exactly what the ops give
    /// run alone: later ops of the same x take their xh and zeroed mid from
    /// the first op's input transform (grid z), and the next op, whose x is
    /// the first op's output, from its output transform, after each of the
    /// graph fusions (none, residual ADD, SILU and MUL, SWIGLU pair). Each
    /// later op's outputs bit for bit its run alone on its input; the first
    /// op's bit for bit its run without them. Every family the ahead path
    /// takes (not the one-launch kernel), split or not, 1 to 40 rows; the
    /// later ops' scratch starts NaN, so one left unwritten shows.
    pub fn ahead_transforms_match_their_ops(&self) {
        let mut n = 0;
        for (k, k2) in [(2, 3), (3, 2)] {
            let (ic, oc) = (256, 384);
            let first = dense_problem(61 * k as u64, k, ic, oc, true, true);
            let up = dense_problem(67 * k as u64, k, ic, oc, true, false);
            let share_a = dense_problem(71 * k2 as u64, k2, ic, 128, true, false);
            let share_b = dense_problem(73 * k as u64, k, ic, 256, false, true);
            let next = dense_problem(79 * k2 as u64, k2, oc, 256, true, true);
            for (path, m, ksplit) in
                [(GEMV, 1, 1), (GEMV, 3, 4), (GEMV_WIDE, 1, 2), (GEMV, 40, 2), (PREFILL, 17, 1), (SIMT, 9, 2), (BLAS, 33, 2)]
            {
                let path = self.path(path);
                let x = first.input(960 + m as u64, m);
                let r = Rng::new(970 + m as u64).f32s(m * oc, -2.0, 2.0);
                for (kind, add, silu_mul, pair) in
                    [("alone", false, 0, false), ("add", true, 0, false), ("silu_mul", true, 1, false), ("swiglu", false, 0, true)]
                {
                    let what = format!("{} ahead K={k}/{k2} m={m} path={path} ksplit={ksplit} after {kind}", self.name);
                    // Shares ride in the input transform's spare grid z: two
                    // beside one op, one beside a pair.
                    let shares: Vec<&Problem> = if pair { vec![&share_a] } else { vec![&share_a, &share_b] };
                    let mut ys: Vec<Vec<f32>> = shares.iter().map(|p| vec![f32::NAN; m * p.shape.oc]).collect();
                    let mut yn = vec![f32::NAN; m * next.shape.oc];
                    let mut later: Vec<LaterOp> = shares.iter().zip(ys.iter_mut()).map(|(p, y)| later_op(p, false, y)).collect();
                    later.push(later_op(&next, true, &mut yn));
                    let (mut y, mut y_plain) = (vec![f32::NAN; m * oc], vec![f32::NAN; m * oc]);
                    let code1 = if pair { up.code.as_ptr() } else { std::ptr::null() };
                    let addp = if add { r.as_ptr() } else { std::ptr::null() };
                    let (rc, rc_plain) = unsafe {
                        let run = |y: &mut [f32], later: &[LaterOp]| {
                            (self.linear_ahead)(
                                k as i32, ic as i64, oc as i64, first.code.as_ptr(), x.as_ptr(), m as i64, f16_ptr(&first.rin),
                                f16_ptr(&first.rout), opt(first.s_in.as_deref()), opt(first.s_out.as_deref()),
                                opt(first.bias.as_deref()), k as i32, code1, f16_ptr(&up.rin), f16_ptr(&up.rout),
                                opt(up.s_in.as_deref()), opt(up.s_out.as_deref()), opt(up.bias.as_deref()), addp, silu_mul,
                                y.as_mut_ptr(), path, ksplit, later.as_ptr(), later.len() as i32,
                            )
                        };
                        (run(&mut y, &later), run(&mut y_plain, &[]))
                    };
                    assert_eq!(rc, 0, "{what}: rejected");
                    assert_eq!(rc_plain, 0, "{what}: rejected without later ops");
                    for i in 0..m * oc {
                        assert_eq!(y[i].to_bits(), y_plain[i].to_bits(), "{what}: first op output {i} changed by the later ops");
                    }
                    for (j, p) in shares.iter().enumerate() {
                        let want = self.dense_alone(&format!("{what} share {j}"), p, &x, m, path, ksplit);
                        for i in 0..want.len() {
                            assert_eq!(ys[j][i].to_bits(), want[i].to_bits(), "{what}: share {j} output {i}: {} against {}", ys[j][i], want[i]);
                        }
                    }
                    let want = self.dense_alone(&format!("{what} next"), &next, &y, m, path, ksplit);
                    for i in 0..want.len() {
                        assert_eq!(yn[i].to_bits(), want[i].to_bits(), "{what}: next op output {i}: {} against {}", yn[i], want[i]);
                    }
                    n += 1;
                }
            }
        }
        eprintln!("{} input transforms run ahead: {n} cases, every later op bit for bit its run alone", self.name);
    }

    fn run_moe(&self, d: &MoeData, x: &[f32], r: &Route, grouped: bool, path: i32, ksplit: i32) -> Vec<f32> {
        let mut y = vec![f32::NAN; r.t * r.n_used * d.oc];
        let rows = d.vec_rows as i64;
        let rc = unsafe {
            (self.moe)(
                d.k as i32, d.e as i64, d.ic as i64, d.oc as i64, d.code.as_ptr(), x.as_ptr(), r.nx as i64, r.ids.as_ptr(),
                r.stride as i64, r.n_used as i64, r.t as i64, f16_ptr(&d.rin), f16_ptr(&d.rout), opt(d.s_in.as_deref()), rows,
                opt(d.s_out.as_deref()), rows, opt(d.bias.as_deref()), rows, y.as_mut_ptr(), grouped as i32, self.path(path), ksplit,
            )
        };
        assert_ne!(rc, FUSED_STATE_LEFT, "{}: the fused kernel left mid or its arrival counts nonzero", self.name);
        assert_eq!(rc, 0, "{}: the executor rejected a valid MoE case", self.name);
        y
    }

    fn moe_case(&self, d: &MoeData, r: &Route, grouped: bool, path: i32, ksplit: i32, seed: u64) -> Stats {
        let x = Rng::new(seed).f32s(r.t * r.nx * d.ic, 0.0, 1.0);
        let got = self.run_moe(d, &x, r, grouped, path, ksplit);
        let what = format!(
            "{} moe K={} E={} {}x{} T={} n_used={} nx={} grouped={grouped} path={} ksplit={ksplit} shared={}",
            self.name,
            d.k,
            d.e,
            d.ic,
            d.oc,
            r.t,
            r.n_used,
            r.nx,
            self.path(path),
            d.vec_rows == 1
        );
        check_moe(&what, d, r, &x, &got)
    }

    pub fn moe_matches_reference_on_every_kernel(&self) {
        let mut all = Vec::new();
        for k in [2, 3] {
            let d = MoeData::new(40 + k as u64, k, 4, 256, 384, true, false);
            for nx in [1, 2] {
                // Decode sizes: one block row per slot (expert read on the device).
                all.push(self.moe_case(&d, &route(1, 1, 2, nx, 4, 2), false, GEMV, 1, 501));
                all.push(self.moe_case(&d, &route(5, 5, 2, nx, 4, 2), false, GEMV, 3, 505));
                all.push(self.moe_case(&d, &route(6, 5, 2, nx, 4, 2), false, SIMT, 1, 506));
                all.push(self.moe_case(&d, &route(1, 1, 2, nx, 4, 2), false, FUSED, 1, 511));
                all.push(self.moe_case(&d, &route(7, 5, 2, nx, 4, 2), false, FUSED, 3, 515));
                all.push(self.moe_case(&d, &route(1, 1, 2, nx, 4, 2), false, FUSED2, 1, 521));
                all.push(self.moe_case(&d, &route(7, 5, 2, nx, 4, 2), false, FUSED2, 3, 525));
                // Grouped by expert: GEMV blocks sized for twice the rows an
                // expert gets on average, at most 32 (16 rows at 9 and 16
                // tokens, 32 at 40 and 70), an expert that every token picks
                // taking two and three 32-row blocks; prefill, SIMT.
                all.push(self.moe_case(&d, &route(9, 9, 2, nx, 4, 2), true, GEMV, 1, 509));
                all.push(self.moe_case(&d, &route(16, 16, 2, nx, 4, 2), true, GEMV, 2, 516));
                all.push(self.moe_case(&d, &route_hot(40, 40, 2, nx, 4, 2), true, GEMV, 2, 540));
                all.push(self.moe_case(&d, &route_hot(70, 70, 2, nx, 4, 2), true, GEMV, 1, 580));
                all.push(self.moe_case(&d, &route(33, 33, 2, nx, 4, 2), true, PREFILL, 1, 533));
                all.push(self.moe_case(&d, &route(70, 70, 2, nx, 4, 2), true, PREFILL, 3, 570));
                all.push(self.moe_case(&d, &route(17, 17, 2, nx, 4, 2), true, SIMT, 2, 517));
            }
            // ids as a view of a wider tensor; scales and bias shared by all experts.
            let d = MoeData::new(70 + k as u64, k, 8, 128, 256, true, true);
            all.push(self.moe_case(&d, &route(71, 5, 3, 3, 8, 8), false, GEMV, 1, 705));
            all.push(self.moe_case(&d, &route(74, 3, 3, 3, 8, 8), false, FUSED, 2, 706));
            all.push(self.moe_case(&d, &route(74, 3, 3, 3, 8, 8), false, FUSED2, 2, 707));
            all.push(self.moe_case(&d, &route(72, 20, 3, 1, 8, 8), true, PREFILL, 1, 720));
            all.push(self.moe_case(&d, &route(73, 12, 3, 1, 8, 8), true, GEMV, 1, 712));
            // 8- and 16-row blocks (27 and 60 slots over 8 experts), expert 0 taking two.
            all.push(self.moe_case(&d, &route_hot(75, 9, 3, 1, 8, 8), true, GEMV, 1, 709));
            all.push(self.moe_case(&d, &route_hot(76, 20, 3, 1, 8, 8), true, GEMV, 2, 721));
        }
        summarize(&format!("{} moe", self.name), &all);
    }

    /// An expert id outside [0, E) cannot stop a GPU kernel: its slot must
    /// come out NaN (never another expert's result, nothing read out of
    /// bounds) and every other slot must still match the reference, on
    /// every kernel.
    pub fn moe_invalid_id_gives_nan(&self) {
        let d = MoeData::new(90, 2, 4, 128, 128, true, false);
        for (t, grouped, path) in
            [(9, false, GEMV), (9, false, SIMT), (9, false, FUSED), (9, true, GEMV), (33, true, PREFILL), (17, true, SIMT)]
        {
            let mut r = route(91, t, 2, 1, 4, 2);
            r.ids[5] = 4; // token 2, slot 1: one past the last expert
            r.ids[8] = -3; // token 4, slot 0
            let x = Rng::new(92).f32s(r.t * d.ic, 0.0, 1.0);
            let y = self.run_moe(&d, &x, &r, grouped, path, 2);
            let path = self.path(path);
            for (slot, out) in y.chunks(d.oc).enumerate() {
                let bad = slot == 5 || slot == 8;
                assert!(out.iter().all(|v| v.is_nan() == bad), "{} grouped={grouped} path={path}: slot {slot}", self.name);
            }
            // The good slots against the reference (routing with the bad slots
            // pointed at expert 0; those two slots taken from a run of it).
            let mut fixed = route(91, t, 2, 1, 4, 2);
            fixed.ids[5] = 0;
            fixed.ids[8] = 0;
            let yf = self.run_moe(&d, &x, &fixed, grouped, path, 2);
            let mut g = y.clone();
            for s in [5, 8] {
                g[s * d.oc..(s + 1) * d.oc].copy_from_slice(&yf[s * d.oc..(s + 1) * d.oc]);
            }
            check_moe(&format!("{} moe with bad ids, grouped={grouped} path={path}", self.name), &d, &fixed, &x, &g);
        }
    }
}
