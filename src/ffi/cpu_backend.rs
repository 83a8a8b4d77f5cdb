//! The functions ggml-cpu calls for `GGML_OP_ESCHA_LINEAR` and
//! `GGML_OP_ESCHA_MOE` (declared in `ggml-escha/cpu/escha_ffi.h`).
//!
//! Every entry point catches panics: nothing unwinds into C. The
//! descriptor's pointers are ggml tensor data, valid for the call; the
//! shapes were asserted by the op constructors, and are checked again here
//! before any slice is formed.

use super::huge_pages;
use crate::cpu::engine::one_row_tail;
use crate::cpu::{scratch_floats, CpuEngine, ExpertGroups, Kernel, Slots, BLOCK_COLS};
use crate::reference::Moe;
use crate::validate::MoeShape;
use half::f16;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

/// Mirror of `escha_op_desc`.
#[repr(C)]
pub struct EschaOpDesc {
    pub k: i32,
    pub flags: i32,
    pub ic: i64,
    pub oc: i64,
    pub n_expert: i64,
    pub code: *const i16,
    pub code_nb_e: usize,
    pub rin: *const u16,
    pub rin_nb_e: usize,
    pub rout: *const u16,
    pub rout_nb_e: usize,
    pub s_in: *const f32,
    pub s_in_nb_e: usize,
    pub s_out: *const f32,
    pub s_out_nb_e: usize,
    pub bias: *const f32,
    pub bias_nb_e: usize,
    pub x: *const u8,
    pub x_ne: [i64; 4],
    pub x_nb: [usize; 4],
    pub ids: *const u8,
    pub ids_ne: [i64; 2],
    pub ids_nb: [usize; 2],
    pub dst: *mut f32,
}

pub const OK: i32 = 0;
pub const BAD_DESC: i32 = 1;
pub const BAD_EXPERT: i32 = 2;
pub const WORK_SIZE: i32 = 3;
pub const PANIC: i32 = 4;

const ALIGN: usize = 64;

fn align_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// Calls with at most this many slots run in one pass (phase 0): every
/// thread transforms all the inputs itself, so the op needs no barrier
/// between its two phases. One row (token generation) is a few microseconds
/// of transform, less than what the barrier and the idle threads of a
/// one-row phase 1 cost.
const SINGLE_PASS_MAX_SLOTS: usize = 1;

/// Whether a call with `n_slots` slots runs in one pass (phase 0).
#[no_mangle]
pub extern "C" fn escha_rs_single_pass(n_slots: i64) -> bool {
    (0..=SINGLE_PASS_MAX_SLOTS as i64).contains(&n_slots)
}

/// Whether a one-pass call also takes phase 3 (after a barrier): its
/// output blocks do not divide evenly over the threads, and the leftover
/// blocks' tiles are split over them ([`CpuEngine::compute_shared_with_tail`]).
#[no_mangle]
pub extern "C" fn escha_rs_one_row_tail(oc: i64, n_slots: i64, n_threads: i32) -> bool {
    one_row_tail_blocks(oc, n_slots, n_threads) > 0
}

fn one_row_tail_blocks(oc: i64, n_slots: i64, n_threads: i32) -> usize {
    if oc <= 0 || n_threads <= 0 || !escha_rs_single_pass(n_slots) || n_slots == 0 {
        return 0;
    }
    one_row_tail(oc as usize / BLOCK_COLS, n_threads as usize)
}

/// Work buffer layout, in bytes: a shared `xh [slots, IC]` (none in one
/// pass), the one-row tail's shared sums (one pass only), then per thread
/// its own `xh` (one pass only) and its scratch.
struct Layout {
    shared_xh: usize,
    tail_bytes: usize,
    own_xh: usize,
    scratch: usize,
    total: usize,
}

impl Layout {
    fn new(ic: usize, oc: usize, n_slots: usize, n_threads: usize) -> Self {
        let xh = align_up(n_slots * ic * 4);
        let scratch = align_up(scratch_floats(n_slots) * 4);
        let (shared_xh, own_xh) = if escha_rs_single_pass(n_slots as i64) { (0, xh) } else { (xh, 0) };
        let tail_bytes = align_up(one_row_tail_blocks(oc as i64, n_slots as i64, n_threads as i32) * BLOCK_COLS * 4);
        Layout { shared_xh, tail_bytes, own_xh, scratch, total: ALIGN + shared_xh + tail_bytes + n_threads * (own_xh + scratch) }
    }

    /// Offset of the one-row tail's sums (after the shared `xh`).
    fn tail_offset(&self) -> usize {
        self.shared_xh
    }

    /// Offset of thread `ith`'s share (its own `xh`, then its scratch).
    fn thread(&self, ith: usize) -> usize {
        self.shared_xh + self.tail_bytes + ith * (self.own_xh + self.scratch)
    }
}

fn kernel() -> Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    *K.get_or_init(Kernel::best)
}

#[no_mangle]
pub extern "C" fn escha_rs_work_size(ic: i64, oc: i64, n_slots: i64, n_threads: i32) -> usize {
    if ic <= 0 || oc <= 0 || n_slots < 0 || n_threads <= 0 {
        return 0;
    }
    Layout::new(ic as usize, oc as usize, n_slots as usize, n_threads as usize).total
}

/// Runs phase `phase` (1: input transform, 2: products and output
/// transform; 0: both, on this thread's own transformed inputs, for a call
/// [`escha_rs_single_pass`] accepts) of the op `desc` for thread `ith` of
/// `nth`; returns [`OK`] or
/// an error code ([`BAD_DESC`], [`BAD_EXPERT`], [`WORK_SIZE`], [`PANIC`]).
///
/// # Safety
/// 1. `desc` is non-null, aligned and points to a descriptor whose non-null
///    pointers are aligned and valid for the extents it describes (`dst` for
///    writes of `slots * OC` floats), and nothing writes its inputs during
///    the call.
/// 2. `wdata` is valid for reads and writes of `wsize` bytes.
/// 3. `wdata` and `dst` are shared by the `nth` threads of this op and
///    nothing else: each calls phase 1 with its own `ith`, all synchronise,
///    then each calls phase 2 (or each calls phase 0 alone).
#[no_mangle]
pub unsafe extern "C" fn escha_rs_forward(desc: *const EschaOpDesc, phase: i32, ith: i32, nth: i32, wdata: *mut u8, wsize: usize) -> i32 {
    // SAFETY: `&*desc` by 1.; `forward`'s 1. to 3. are our 1. to 3.
    let r = catch_unwind(AssertUnwindSafe(|| forward(&*desc, phase, ith, nth, wdata, wsize)));
    match r {
        Ok(Ok(())) => OK,
        Ok(Err(code)) => code,
        Err(_) => PANIC,
    }
}

/// The op's weights and slots viewed as slices.
struct View<'a> {
    moe: Moe<'a>,
    slots: Slots<'a>,
}

/// `n` values at `p` as a slice; [`BAD_DESC`] for a null `p`.
///
/// # Safety
/// 1. A non-null `p` is aligned and valid for reads of `n` values of `T`
///    for `'a`.
/// 2. Nothing writes those values during `'a`.
unsafe fn slice<'a, T>(p: *const T, n: usize) -> Result<&'a [T], i32> {
    if p.is_null() {
        return Err(BAD_DESC);
    }
    Ok(std::slice::from_raw_parts(p, n))
}

/// Per-expert vector: stacked `[E, n]` (stride `nb_e` bytes) or shared (`nb_e == 0`).
/// Returned as one contiguous slice the way `reference::Moe` expects it.
///
/// # Safety
/// 1. A non-null `p` is aligned and valid for reads of `n` values of `T`
///    (`nb_e == 0`) or `n * e` values (`nb_e == n * size_of::<T>()`) for `'a`.
/// 2. Nothing writes those values during `'a`.
unsafe fn per_expert<'a, T>(p: *const T, nb_e: usize, n: usize, e: usize) -> Result<&'a [T], i32> {
    let sz = std::mem::size_of::<T>();
    match nb_e {
        0 => slice(p, n),
        s if s == n * sz => slice(p, n * e),
        _ => Err(BAD_DESC),
    }
}

/// The weights and slots of `d`; [`BAD_DESC`] or [`BAD_EXPERT`] for a
/// descriptor that disagrees with itself.
///
/// # Safety
/// 1. Every non-null pointer of `d` is aligned and valid for reads of what
///    `d` describes for `'a`: `E` codes, `rin` / `rout` / `s_in` / `s_out` /
///    `bias` as their `*_nb_e` say, the `x` rows at their `x_nb` offsets and
///    the i32 `ids` at their `ids_nb` offsets.
/// 2. Nothing writes those inputs during `'a`.
unsafe fn view<'a>(d: &'a EschaOpDesc) -> Result<View<'a>, i32> {
    let (k, ic, oc, e) = (d.k as usize, d.ic as usize, d.oc as usize, d.n_expert as usize);
    let shape = MoeShape::new("escha op", k, e, ic, oc).map_err(|_| BAD_DESC)?;
    let code_len = shape.linear().code_len();
    if d.code_nb_e != code_len * 2 && e > 1 {
        return Err(BAD_DESC);
    }
    let opt = |p: *const f32, nb: usize, n: usize| -> Result<Option<&'a [f32]>, i32> {
        if p.is_null() {
            Ok(None)
        } else {
            per_expert(p, nb, n, e).map(Some)
        }
    };
    let moe = Moe {
        name: "escha op",
        shape,
        code: slice(d.code, code_len * e)?,
        rin: std::slice::from_raw_parts(per_expert(d.rin, d.rin_nb_e, ic, e)?.as_ptr() as *const f16, ic * e),
        rout: std::slice::from_raw_parts(per_expert(d.rout, d.rout_nb_e, oc, e)?.as_ptr() as *const f16, oc * e),
        s_in: opt(d.s_in, d.s_in_nb_e, ic)?,
        s_out: opt(d.s_out, d.s_out_nb_e, oc)?,
        bias: opt(d.bias, d.bias_nb_e, oc)?,
    };
    if e > 1 && (d.rin_nb_e == 0 || d.rout_nb_e == 0) {
        return Err(BAD_DESC); // rin/rout are always per expert
    }
    if d.x.is_null() || d.x_ne[0] as usize != ic || d.x_nb[0] != 4 {
        return Err(BAD_DESC);
    }
    let row = |off: usize| std::slice::from_raw_parts(d.x.add(off) as *const f32, ic);
    let mut slots = Slots { experts: Vec::new(), x: Vec::new() };
    if d.ids.is_null() {
        let (n1, n2, n3) = (d.x_ne[1] as usize, d.x_ne[2] as usize, d.x_ne[3] as usize);
        for i3 in 0..n3 {
            for i2 in 0..n2 {
                for i1 in 0..n1 {
                    slots.experts.push(0);
                    slots.x.push(row(i1 * d.x_nb[1] + i2 * d.x_nb[2] + i3 * d.x_nb[3]));
                }
            }
        }
    } else {
        let (n_used, tokens) = (d.ids_ne[0] as usize, d.ids_ne[1] as usize);
        let nx = d.x_ne[1] as usize;
        if nx == 0 || n_used % nx != 0 || d.x_ne[2] as usize != tokens {
            return Err(BAD_DESC);
        }
        for t in 0..tokens {
            for u in 0..n_used {
                let id = *(d.ids.add(u * d.ids_nb[0] + t * d.ids_nb[1]) as *const i32);
                if id < 0 || id as usize >= e {
                    return Err(BAD_EXPERT);
                }
                slots.experts.push(id as u32);
                slots.x.push(row((u % nx) * d.x_nb[1] + t * d.x_nb[2]));
            }
        }
    }
    Ok(View { moe, slots })
}

/// One thread's share of phase 1 or 2 of the op `d` (see
/// [`escha_rs_forward`]).
///
/// # Safety
/// 1. `d` satisfies [`view`]'s 1. and 2., and a non-null `d.dst` is valid for
///    writes of `slots * OC` floats.
/// 2. A non-null `wdata` is valid for reads and writes of `wsize` bytes.
/// 3. `wdata` and `dst` are shared by the `nth` threads of this op and
///    nothing else: each calls phase 1 with its own `ith`, all synchronise,
///    then each calls phase 2 (or each calls phase 0 alone).
unsafe fn forward(d: &EschaOpDesc, phase: i32, ith: i32, nth: i32, wdata: *mut u8, wsize: usize) -> Result<(), i32> {
    if nth <= 0 || ith < 0 || ith >= nth || d.dst.is_null() {
        return Err(BAD_DESC);
    }
    let (ith, nth) = (ith as usize, nth as usize);
    // SAFETY: view's 1. and 2. are our 1.
    let v = view(d)?;
    if ith == 0 && phase <= 1 {
        // Once per weight; the other threads read it meanwhile (same bytes).
        huge_pages::advise_once(bytemuck::cast_slice(v.moe.code));
    }
    let engine = CpuEngine::new_unchecked(&v.moe, kernel());
    let n = v.slots.len();
    let ic = d.ic as usize;
    let lay = Layout::new(ic, d.oc as usize, n, nth);
    if wdata.is_null() || wsize < lay.total {
        return Err(WORK_SIZE);
    }
    let base = wdata.add(wdata.align_offset(ALIGN));
    let xh = base as *mut f32;
    let single = escha_rs_single_pass(n as i64);
    if (phase == 0 || phase == 3) != single || (phase == 3 && !escha_rs_one_row_tail(d.oc, n as i64, nth as i32)) {
        return Err(BAD_DESC);
    }
    let tail_mid = base.add(lay.tail_offset()) as *mut f32;
    if phase == 3 {
        let groups = ExpertGroups::new(&v.slots.experts, d.n_expert as usize);
        // SAFETY (finish_one_row_shared's list): 1. `dst` holds one row of
        // OC floats (our 1.), the same groups and nth as phase 0; every
        // thread's phase 0 has finished (our 3.); 2. `tail_mid` is the
        // region phase 0 wrote, inside `wdata`.
        engine.finish_one_row_shared(&groups, d.dst, ith, nth, tail_mid);
        return Ok(());
    }
    if phase == 0 {
        // This thread's share: its own xh of all slots, then its scratch.
        let own = base.add(lay.thread(ith));
        let xh_own = own as *mut f32;
        // SAFETY (transform_input_shared's list, as one thread of one): 1.
        // `xh_own` holds n * IC floats inside this thread's share of
        // `wdata` (`wsize >= lay.total`); 2. and 3. nothing else uses that
        // share.
        engine.transform_input_shared(&v.slots, xh_own, 0, 1);
        let groups = ExpertGroups::new(&v.slots.experts, d.n_expert as usize);
        let xh = std::slice::from_raw_parts(xh_own as *const f32, n * ic);
        let scratch = std::slice::from_raw_parts_mut(own.add(lay.own_xh) as *mut f32, lay.scratch / 4);
        if escha_rs_one_row_tail(d.oc, n as i64, nth as i32) {
            // SAFETY (compute_shared_with_tail's list): as in phase 2, with
            // this thread's own transformed inputs; 5. `tail_mid` holds the
            // tail's blocks inside `wdata` (`lay`), shared only by this
            // op's threads, which run phase 3 after a barrier (our 3.).
            engine.compute_shared_with_tail(xh, &groups, d.dst, ith, nth, scratch, Some(tail_mid));
        } else {
            // SAFETY (compute_shared's list): as in phase 2, with this
            // thread's own transformed inputs.
            engine.compute_shared(xh, &groups, d.dst, ith, nth, scratch);
        }
        return Ok(());
    }
    match phase {
        // SAFETY (transform_input_shared's list): 1. `xh` is the first
        // `n * IC` floats of `wdata` (`wsize >= lay.total`, checked); 2. and 3. by
        // our 3.
        1 => engine.transform_input_shared(&v.slots, xh, ith, nth),
        2 => {
            let groups = ExpertGroups::new(&v.slots.experts, d.n_expert as usize);
            // SAFETY: phase 1 wrote these floats on every thread (our 3.) and
            // phase 2 only reads them; the scratch of thread `ith` lies past
            // `xh` inside `wdata` and is its own.
            let xh = std::slice::from_raw_parts(xh as *const f32, n * ic);
            let scratch = std::slice::from_raw_parts_mut(base.add(lay.thread(ith)) as *mut f32, lay.scratch / 4);
            // SAFETY (compute_shared's list): 1. `dst` holds slots * OC
            // floats (our 1.); 2. the same groups on every thread, from
            // `ExpertGroups::new`; 3. and 4. by our 3.
            engine.compute_shared(xh, &groups, d.dst, ith, nth, scratch);
        }
        _ => return Err(BAD_DESC),
    }
    Ok(())
}
