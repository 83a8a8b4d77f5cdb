//! The coded-linear engine on the CPU kernels, expert-indexed in general
//! (a dense linear is the one-expert case, see [`super::CpuLinear`]).
//!
//! A call works on *slots*: each slot is one input row, the expert it uses
//! and one output row (`y [slots, OC]`). Slots are grouped by expert so each
//! used expert's tiles are decoded once per call and applied to all of its
//! rows. Scales are folded on the fly (per slot on the input side, per
//! 128-column block on the output side), so nothing per expert is stored.

use super::job::{split, BlockJob, ALL_TILES, BLOCK_COLS, BLOCK_TILES};
use super::dispatch::finish_block;
use super::{input_transform_row, scratch_floats, Kernel};
use crate::format::TILE;
use crate::error::Result;
use crate::reference::{Moe, Routing};
use crate::transform::fold_into;
use crate::validate::{check_len, MoeShape};

/// A validated expert-stacked linear, ready to run.
pub struct CpuEngine<'a> {
    pub name: &'a str,
    pub shape: MoeShape,
    moe: Moe<'a>,
    kernel: Kernel,
}

/// The inputs of one call: per slot, its expert and its input row (`IC`
/// values).
pub struct Slots<'a> {
    pub experts: Vec<u32>,
    pub x: Vec<&'a [f32]>,
}

impl<'a> Slots<'a> {
    /// Slots of a routing over `x [T, nx, IC]` (validated routing).
    pub fn from_routing(r: &Routing, x: &'a [f32], ic: usize) -> Self {
        let n = r.tokens * r.n_used;
        let mut s = Slots { experts: Vec::with_capacity(n), x: Vec::with_capacity(n) };
        for t in 0..r.tokens {
            for u in 0..r.n_used {
                let (e, xr) = r.slot(t, u);
                s.experts.push(e as u32);
                s.x.push(&x[xr * ic..(xr + 1) * ic]);
            }
        }
        s
    }

    pub fn len(&self) -> usize {
        self.experts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.experts.is_empty()
    }
}

/// Slots grouped by expert: `slots[start[e]..start[e+1]]` use expert `e`,
/// in ascending slot order.
pub struct ExpertGroups {
    pub start: Vec<usize>,
    pub slots: Vec<usize>,
}

impl ExpertGroups {
    /// Counting sort of per-slot experts (already validated against `n_expert`).
    pub fn new(experts: &[u32], n_expert: usize) -> Self {
        let mut start = vec![0usize; n_expert + 1];
        for &e in experts {
            start[e as usize + 1] += 1;
        }
        for e in 0..n_expert {
            start[e + 1] += start[e];
        }
        let mut fill = start.clone();
        let mut slots = vec![0usize; experts.len()];
        for (s, &e) in experts.iter().enumerate() {
            slots[fill[e as usize]] = s;
            fill[e as usize] += 1;
        }
        Self { start, slots }
    }

    pub fn of(&self, e: usize) -> &[usize] {
        &self.slots[self.start[e]..self.start[e + 1]]
    }

    /// Most slots any one expert has (sizes the scratch).
    pub fn max_rows(&self) -> usize {
        self.start.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
    }
}

impl<'a> CpuEngine<'a> {
    /// Validates `p` (lengths, finite scales).
    ///
    /// # Errors
    /// [`crate::EschaError::BadLength`] or [`crate::EschaError::NonFinite`]
    /// from [`Moe::validate`].
    pub fn new(p: &Moe<'a>, kernel: Kernel) -> Result<Self> {
        p.validate()?;
        Ok(Self::new_unchecked(p, kernel))
    }

    /// Without validation, for callers that validated the weights once at
    /// load time (ggml). Lengths must still be right: slices are indexed
    /// with bounds checks, so a wrong length panics instead of reading
    /// out of bounds.
    pub fn new_unchecked(p: &Moe<'a>, kernel: Kernel) -> Self {
        Self { name: p.name, shape: p.shape, moe: *p, kernel }
    }

    /// Scratch floats one thread needs in phase 2.
    pub fn scratch_floats(&self, groups: &ExpertGroups) -> usize {
        scratch_floats(groups.max_rows())
    }

    /// Whole forward on the calling thread: `y [T, n_used, OC]`.
    ///
    /// # Errors
    /// Those of [`Routing::validate`] against this engine's expert count, and
    /// [`crate::EschaError::BadLength`] when `x` does not hold
    /// `tokens * nx * IC` values.
    pub fn forward(&self, x: &[f32], r: &Routing) -> Result<Vec<f32>> {
        r.validate(self.name, self.shape.e)?;
        check_len(self.name, "x", x.len(), r.tokens * r.nx * self.shape.ic)?;
        Ok(self.forward_slots(&Slots::from_routing(r, x, self.shape.ic)))
    }

    /// Whole forward of prepared slots on the calling thread: `y [slots, OC]`.
    pub fn forward_slots(&self, slots: &Slots) -> Vec<f32> {
        let mut xh = vec![0f32; slots.len() * self.shape.ic];
        // SAFETY: 1. xh holds slots * IC floats; 2. and 3. the only caller
        // (0 of 1), and xh is exclusively borrowed.
        unsafe { self.transform_input_shared(slots, xh.as_mut_ptr(), 0, 1) };
        let groups = ExpertGroups::new(&slots.experts, self.shape.e);
        let mut y = vec![0f32; slots.len() * self.shape.oc];
        let mut scratch = vec![0f32; self.scratch_floats(&groups)];
        // SAFETY: 1. y holds slots * OC floats; 2. groups from
        // `ExpertGroups::new`, the only caller (0 of 1); 3. y is exclusively
        // borrowed; 4. phase 1 finished above.
        unsafe { self.compute_shared(&xh, &groups, y.as_mut_ptr(), 0, 1, &mut scratch) };
        y
    }

    /// Phase 1, share `ith` of `nth` of the slots: `xh [slots * IC]` in the
    /// kernels' tile-row-major layout, each slot's row scaled by its expert's
    /// folded `rin * s_in`.
    ///
    /// # Safety
    /// 1. `xh` is valid for writes of `slots.len() * IC` floats.
    /// 2. Concurrent callers pass the same `slots` and `nth` and distinct
    ///    `ith` (they then write disjoint rows of `xh`).
    /// 3. Nothing else reads or writes `xh` until every caller has finished.
    pub unsafe fn transform_input_shared(&self, slots: &Slots, xh: *mut f32, ith: usize, nth: usize) {
        let ic = self.shape.ic;
        let n = slots.len();
        let mut rin_eff = vec![0f32; ic];
        let mut tmp = vec![0f32; ic];
        let mut folded_for = usize::MAX;
        for s in split(n, ith, nth) {
            let e = slots.experts[s] as usize;
            if e != folded_for {
                let l = self.moe.expert(e);
                fold_into(l.rin, l.s_in, &mut rin_eff);
                folded_for = e;
            }
            // SAFETY (input_transform_row's list): 1. row s < n of an
            // `n * IC` buffer (our 1.); 2. slot s is this caller's alone
            // (our 2. and 3.).
            input_transform_row(slots.x[s], &rin_eff, xh, n, s, &mut tmp);
        }
    }

    /// Phase 2, share `ith` of `nth` of the (used expert, output block)
    /// units (and of the rows of a dense batch's blocks left over after an
    /// even split): products and output transforms into `y [slots, OC]`.
    ///
    /// # Safety
    /// 1. `y` is valid for writes of `groups.slots.len() * OC` floats (one
    ///    row per slot).
    /// 2. Concurrent callers pass the same `groups` and `nth` and distinct
    ///    `ith`, and `groups` lists each slot once (as [`ExpertGroups::new`]
    ///    builds it): they then write disjoint (expert, block) units of `y`,
    ///    or disjoint rows of one (a dense batch's blocks left over after an
    ///    even split).
    /// 3. Nothing else reads or writes `y` until every caller has finished.
    /// 4. `xh` is complete: every caller's phase 1 has finished.
    pub unsafe fn compute_shared(&self, xh: &[f32], groups: &ExpertGroups, y: *mut f32, ith: usize, nth: usize, scratch: &mut [f32]) {
        // SAFETY: our 1. to 4.; no one-row tail.
        unsafe { self.compute_shared_with_tail(xh, groups, y, ith, nth, scratch, None) }
    }

    /// The one-row tail's output transforms (after every caller's
    /// [`Self::compute_shared_with_tail`]): thread `ith`'s share of the tail
    /// blocks, from `tail_mid` into `y`.
    ///
    /// # Safety
    /// 1. to 3. as [`Self::compute_shared_with_tail`]'s (the same `groups`,
    ///    `nth` and `y`), and every caller's `compute_shared_with_tail` has
    ///    finished.
    /// 2. `tail_mid` is what those calls wrote; callers of distinct `ith`
    ///    read and consume distinct blocks of it.
    pub unsafe fn finish_one_row_shared(&self, groups: &ExpertGroups, y: *mut f32, ith: usize, nth: usize, tail_mid: *mut f32) {
        let oc = self.shape.oc;
        let nb = oc / BLOCK_COLS;
        let tail = one_row_tail(nb, nth);
        let Some(e) = (0..self.shape.e).find(|&e| !groups.of(e).is_empty()) else {
            return;
        };
        let row = groups.of(e)[0];
        let lin = self.moe.expert(e);
        let (mut rout_eff, mut out) = ([0f32; BLOCK_COLS], [0f32; BLOCK_COLS]);
        for tb in split(tail, ith, nth) {
            let block = nb - tail + tb;
            let cols = block * BLOCK_COLS..(block + 1) * BLOCK_COLS;
            lin.rout_eff_into(cols.clone(), &mut rout_eff);
            // SAFETY: block tb of `tail_mid` is this caller's alone (2.).
            let mid = unsafe { std::slice::from_raw_parts_mut(tail_mid.add(tb * BLOCK_COLS), BLOCK_COLS) };
            finish_block(mid, &rout_eff, lin.bias.map(|b| &b[cols.clone()]), &mut out);
            // SAFETY: row < slots, the block's 128 columns are inside OC, and
            // no other caller writes them (1.).
            unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), y.add(row * oc + cols.start), BLOCK_COLS) };
        }
    }

    /// [`Self::compute_shared`], and with `tail_mid` for a call of one slot,
    /// each thread with its own `xh`, where the output blocks do not divide
    /// evenly over the threads: the last [`one_row_tail`] blocks are split
    /// by tiles, each thread's tiles summed into `tail_mid [tail, 128]`, and
    /// [`Self::finish_one_row_shared`] applies their output transform once
    /// every caller is done. A tile's sums are the same whichever thread
    /// takes it, so the outputs are the same bits at any thread count.
    ///
    /// # Safety
    /// [`Self::compute_shared`]'s 1. to 3., and:
    /// 4. `xh` is complete (with `tail_mid`: the slot's transformed inputs).
    /// 5. A `tail_mid` is valid for writes of `one_row_tail * 128` floats,
    ///    shared by the callers (each writes its own tiles' columns) and by
    ///    nothing else until [`Self::finish_one_row_shared`] has run.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn compute_shared_with_tail(
        &self,
        xh: &[f32],
        groups: &ExpertGroups,
        y: *mut f32,
        ith: usize,
        nth: usize,
        scratch: &mut [f32],
        tail_mid: Option<*mut f32>,
    ) {
        let MoeShape { k, e: n_exp, ic, oc } = self.shape;
        let nb = oc / BLOCK_COLS;
        let n_slots = groups.slots.len();
        assert!(xh.len() >= n_slots * ic, "{}: xh too short", self.name);
        assert!(scratch.len() >= self.scratch_floats(groups), "{}: scratch too small", self.name);
        let used: Vec<usize> = (0..n_exp).filter(|&e| !groups.of(e).is_empty()).collect();
        let n_units = used.len() * nb;
        // A dense batch whose blocks do not divide evenly over the threads:
        // the last n_units % nth blocks go to every thread, each with its
        // share of the rows; the rest go whole, as in every other call.
        // Each row's outputs are the same bits either way: every share is
        // above the rows the ISA path's GEMV takes, so the whole and each
        // share run the batched product, whose sums are per row (Gemma-3's
        // 640 outputs are 5 blocks: at 2 threads 3 against 2 before).
        let share_min = self.kernel.gemv_rows() + 1;
        let tail = if tail_mid.is_some() {
            assert_eq!(n_slots, 1, "{}: a one-row tail takes one slot", self.name);
            one_row_tail(n_units, nth)
        } else if used.len() == 1 && nth > 1 && n_slots >= share_min * nth {
            n_units % nth
        } else {
            0
        };
        let mine = split(n_units - tail, ith, nth);
        let mut rout_eff = vec![0f32; oc];
        let mut run = |units: std::ops::Range<usize>, row_share: bool| {
            let mut unit = units.start;
            while unit < units.end {
                let e = used[unit / nb];
                let b0 = unit % nb;
                let b1 = nb.min(b0 + (units.end - unit));
                unit += b1 - b0;
                let rows = groups.of(e);
                let rows = if row_share { &rows[split(rows.len(), ith, nth)] } else { rows };
                if rows.is_empty() {
                    continue;
                }
                let lin = self.moe.expert(e);
                let cols = b0 * BLOCK_COLS..b1 * BLOCK_COLS;
                lin.rout_eff_into(cols.clone(), &mut rout_eff[cols]);
                let job = BlockJob { k, ic, oc, code: lin.code, xh, n_xrows: n_slots, rows, block: 0, tiles: ALL_TILES };
                self.kernel.run_blocks(job, b0..b1, &rout_eff, lin.bias, scratch, |row, c0, v| {
                    // SAFETY: 1. row < slots (asserted by `Kernel::block_mid`)
                    // and c0 + 128 <= OC; 2. and 3. no one else writes these
                    // 128 floats of row `row` (whole units are one caller's;
                    // a tail unit's rows are split over the callers).
                    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), y.add(row * oc + c0), v.len()) }
                });
            }
        };
        run(mine, false);
        let Some(tail_mid) = tail_mid else {
            run(n_units - tail..n_units, true);
            return;
        };
        // One row: the tail blocks' 8 * tail tiles split over the callers.
        let (mid, rest) = scratch.split_at_mut(BLOCK_COLS);
        let mine = split(tail * BLOCK_TILES, ith, nth);
        let mut t = mine.start;
        while t < mine.end {
            let tb = t / BLOCK_TILES;
            let (lo, hi) = (t % BLOCK_TILES, BLOCK_TILES.min(t % BLOCK_TILES + (mine.end - t)));
            t += hi - lo;
            let e = used[0];
            let job = BlockJob {
                k,
                ic,
                oc,
                code: self.moe.expert(e).code,
                xh,
                n_xrows: n_slots,
                rows: groups.of(e),
                block: nb - tail + tb,
                tiles: (lo, hi),
            };
            self.kernel.block_mid(&job, mid, rest);
            // SAFETY: tiles lo..hi of tail block tb are this caller's alone,
            // inside `tail_mid` (5.).
            unsafe { std::ptr::copy_nonoverlapping(mid[lo * TILE..].as_ptr(), tail_mid.add(tb * BLOCK_COLS + lo * TILE), (hi - lo) * TILE) };
        }
    }
}

/// Output blocks of a one-slot call on `nth` threads that do not divide
/// evenly over them ([`CpuEngine::compute_shared_with_tail`] splits them by
/// tiles); 0 on one thread. The ggml op runs its second step, after a
/// barrier, only where this is not 0.
pub fn one_row_tail(n_blocks: usize, nth: usize) -> usize {
    if nth > 1 {
        n_blocks % nth
    } else {
        0
    }
}
