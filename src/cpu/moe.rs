//! Expert-indexed coded linear on the CPU kernels: slots are grouped by
//! expert so each used expert's tiles are decoded once per call and
//! applied to all of its rows.

use super::{input_transform_row, scratch_floats, split, BlockJob, Kernel, BLOCK_COLS};
use crate::error::Result;
use crate::reference::{fold, Moe, Routing};
use crate::validate::{check_len, MoeShape};

/// A validated expert-stacked linear with folded per-expert scales.
pub struct CpuMoe<'a> {
    pub name: &'a str,
    pub shape: MoeShape,
    /// `[E, IC]` and `[E, OC]`.
    rin_eff: Vec<f32>,
    rout_eff: Vec<f32>,
    moe: Moe<'a>,
    kernel: Kernel,
}

/// Slots grouped by expert: `slots[start[e]..start[e+1]]` use expert `e`,
/// in ascending slot order.
pub struct ExpertGroups {
    pub start: Vec<usize>,
    pub slots: Vec<usize>,
}

impl ExpertGroups {
    /// Counting sort of `ids` (already validated against `n_expert`).
    pub fn new(ids: &[i32], n_expert: usize) -> Self {
        let mut start = vec![0usize; n_expert + 1];
        for &e in ids {
            start[e as usize + 1] += 1;
        }
        for e in 0..n_expert {
            start[e + 1] += start[e];
        }
        let mut fill = start.clone();
        let mut slots = vec![0usize; ids.len()];
        for (s, &e) in ids.iter().enumerate() {
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

impl<'a> CpuMoe<'a> {
    pub fn new(p: &Moe<'a>, kernel: Kernel) -> Result<Self> {
        p.validate()?;
        let s = p.shape;
        let mut rin_eff = Vec::with_capacity(s.e * s.ic);
        let mut rout_eff = Vec::with_capacity(s.e * s.oc);
        for e in 0..s.e {
            let l = p.expert(e);
            rin_eff.extend(fold(l.rin, l.s_in));
            rout_eff.extend(fold(l.rout, l.s_out));
        }
        Ok(Self { name: p.name, shape: s, rin_eff, rout_eff, moe: *p, kernel })
    }

    fn blocks(&self) -> usize {
        self.shape.oc / BLOCK_COLS
    }

    /// Scratch floats one thread needs in phase 2.
    pub fn scratch_floats(&self, groups: &ExpertGroups) -> usize {
        scratch_floats(groups.max_rows())
    }

    /// Whole forward on the calling thread: `y [T, n_used, OC]`.
    pub fn forward(&self, x: &[f32], r: &Routing) -> Result<Vec<f32>> {
        r.validate(self.name, self.shape.e)?;
        check_len(self.name, "x", x.len(), r.tokens * r.nx * self.shape.ic)?;
        let n = r.tokens * r.n_used;
        let mut xh = vec![0f32; n * self.shape.ic];
        self.transform_input(x, r, &mut xh, 0, 1);
        let groups = ExpertGroups::new(r.ids, self.shape.e);
        let mut y = vec![0f32; n * self.shape.oc];
        let mut scratch = vec![0f32; self.scratch_floats(&groups)];
        // SAFETY: y holds every slot's OC outputs and this is the only writer.
        unsafe { self.compute_shared(&xh, &groups, y.as_mut_ptr(), 0, 1, &mut scratch) };
        Ok(y)
    }

    /// Phase 1 on the calling thread, share `ith` of `nth` of the slots:
    /// `xh [T*n_used * IC]` (tile-row major), each slot's input transformed
    /// with its expert's `rin_eff`. `r` must be validated.
    pub fn transform_input(&self, x: &[f32], r: &Routing, xh: &mut [f32], ith: usize, nth: usize) {
        assert!(xh.len() >= r.tokens * r.n_used * self.shape.ic, "{}: xh too short", self.name);
        // SAFETY: xh is large enough and exclusively borrowed.
        unsafe { self.transform_input_shared(x, r, xh.as_mut_ptr(), ith, nth) }
    }

    /// Phase 1 for concurrent callers.
    ///
    /// # Safety
    /// `xh` must be valid for writes of `slots * IC` floats; concurrent
    /// callers must use the same `nth`, distinct `ith`, and nothing else may
    /// access `xh` until all have finished.
    pub unsafe fn transform_input_shared(&self, x: &[f32], r: &Routing, xh: *mut f32, ith: usize, nth: usize) {
        let ic = self.shape.ic;
        let n = r.tokens * r.n_used;
        assert!(x.len() >= r.tokens * r.nx * ic, "{}: x too short", self.name);
        let mut tmp = vec![0f32; ic];
        for slot in split(n, ith, nth) {
            let (e, xr) = r.slot(slot / r.n_used, slot % r.n_used);
            input_transform_row(&x[xr * ic..(xr + 1) * ic], &self.rin_eff[e * ic..(e + 1) * ic], xh, n, slot, &mut tmp);
        }
    }

    /// Phase 2, share `ith` of `nth` of the (used expert, output block) units.
    ///
    /// # Safety
    /// `y` must be valid for writes of `slots * OC` floats; concurrent
    /// callers must use the same `nth`, distinct `ith`, and nothing else may
    /// access `y` meanwhile.
    pub unsafe fn compute_shared(&self, xh: &[f32], groups: &ExpertGroups, y: *mut f32, ith: usize, nth: usize, scratch: &mut [f32]) {
        let MoeShape { k, e: n_exp, ic, oc } = self.shape;
        let nb = self.blocks();
        let used: Vec<usize> = (0..n_exp).filter(|&e| !groups.of(e).is_empty()).collect();
        let mine = split(used.len() * nb, ith, nth);
        let mut unit = mine.start;
        while unit < mine.end {
            let e = used[unit / nb];
            let b0 = unit % nb;
            let b1 = nb.min(b0 + (mine.end - unit));
            let lin = self.moe.expert(e);
            let job = BlockJob { k, ic, oc, code: lin.code, xh, n_xrows: groups.slots.len(), rows: groups.of(e), block: 0 };
            let rout = &self.rout_eff[e * oc..(e + 1) * oc];
            self.kernel.run_blocks(job, b0..b1, rout, lin.bias, scratch, |row, c0, v| {
                // SAFETY: row is a slot index < slots and c0 + 128 <= OC.
                unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), y.add(row * oc + c0), v.len()) }
            });
            unit += b1 - b0;
        }
    }
}
