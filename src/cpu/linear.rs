//! Dense coded linear on the CPU kernels: the one-expert case of
//! [`CpuEngine`], one slot per input row.

use super::engine::{CpuEngine, ExpertGroups, Slots};
use super::Kernel;
use crate::error::Result;
use crate::reference::{Linear, Moe};
use crate::validate::{check_len, LinearShape, MoeShape};

/// A validated dense linear, ready to run.
pub struct CpuLinear<'a> {
    pub name: &'a str,
    pub shape: LinearShape,
    engine: CpuEngine<'a>,
}

impl<'a> CpuLinear<'a> {
    /// Validates `l` (lengths, finite scales).
    ///
    /// # Errors
    /// [`crate::EschaError::BadLength`] or [`crate::EschaError::NonFinite`]
    /// from [`Linear::validate`].
    pub fn new(l: &Linear<'a>, kernel: Kernel) -> Result<Self> {
        l.validate()?;
        let s = l.shape;
        let moe = Moe {
            name: l.name,
            shape: MoeShape { k: s.k, e: 1, ic: s.ic, oc: s.oc },
            code: l.code,
            rin: l.rin,
            rout: l.rout,
            s_in: l.s_in,
            s_out: l.s_out,
            bias: l.bias,
        };
        Ok(Self { name: l.name, shape: s, engine: CpuEngine::new_unchecked(&moe, kernel) })
    }

    /// Output blocks of 128 columns: the unit of work of phase 2.
    pub fn blocks(&self) -> usize {
        self.shape.oc / super::BLOCK_COLS
    }

    /// Scratch floats one thread needs for `m` rows in phase 2.
    pub fn scratch_floats(&self, m: usize) -> usize {
        super::scratch_floats(m)
    }

    fn slots<'x>(&self, x: &'x [f32], m: usize) -> Slots<'x> {
        let ic = self.shape.ic;
        assert!(x.len() >= m * ic, "{}: x shorter than {m} rows", self.name);
        Slots { experts: vec![0; m], x: x.chunks_exact(ic).take(m).collect() }
    }

    /// Whole forward on the calling thread: `x [m, IC]` -> `y [m, OC]`
    /// (f32 holding the contract's f16-rounded values).
    ///
    /// # Errors
    /// [`crate::EschaError::BadLength`] when `x` does not hold `m * IC`
    /// values.
    pub fn forward(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        check_len(self.name, "x", x.len(), m * self.shape.ic)?;
        Ok(self.engine.forward_slots(&self.slots(x, m)))
    }

    /// Whole forward on the calling thread into caller-owned buffers (no
    /// allocation of activations): `xh [m * IC]`, `y [m * OC]` and
    /// `scratch` of [`Self::scratch_floats`]`(m)`.
    pub fn forward_into(&self, x: &[f32], m: usize, xh: &mut [f32], y: &mut [f32], scratch: &mut [f32]) {
        assert!(y.len() >= m * self.shape.oc, "{}: y shorter than {m} rows", self.name);
        self.transform_input(x, m, xh, 0, 1);
        // SAFETY: 1. y holds m * OC floats (asserted); 2. and 3. the only
        // caller (0 of 1), and y is exclusively borrowed; 4. phase 1 done.
        unsafe { self.compute_shared(xh, m, y.as_mut_ptr(), 0, 1, scratch) };
    }

    /// Phase 1 on the calling thread, share `ith` of `nth` of the rows:
    /// `xh [m * IC]` in the kernels' tile-row-major layout.
    pub fn transform_input(&self, x: &[f32], m: usize, xh: &mut [f32], ith: usize, nth: usize) {
        assert!(xh.len() >= m * self.shape.ic, "{}: xh shorter than {m} rows", self.name);
        // SAFETY: 1. xh holds m * IC floats (asserted); 2. and 3. xh is
        // exclusively borrowed, so no other caller shares it.
        unsafe { self.engine.transform_input_shared(&self.slots(x, m), xh.as_mut_ptr(), ith, nth) }
    }

    /// Phase 2, share `ith` of `nth` of the output blocks, for all `m` rows
    /// of `xh` (complete, i.e. after every thread's phase 1).
    ///
    /// # Safety
    /// 1. `y` is valid for writes of `m * OC` floats.
    /// 2. Concurrent callers pass the same `m` and `nth` and distinct `ith`
    ///    (they then write disjoint columns).
    /// 3. Nothing else reads or writes `y` until every caller has finished.
    /// 4. `xh` is complete: every caller's phase 1 has finished.
    pub unsafe fn compute_shared(&self, xh: &[f32], m: usize, y: *mut f32, ith: usize, nth: usize, scratch: &mut [f32]) {
        let groups = ExpertGroups::new(&vec![0; m], 1);
        // SAFETY: `CpuEngine::compute_shared`'s 1. to 4. are ours, with
        // one group of the m slots built by `ExpertGroups::new`.
        self.engine.compute_shared(xh, &groups, y, ith, nth, scratch)
    }
}
