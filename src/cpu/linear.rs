//! Dense coded linear on the CPU kernels.

use super::{input_transform_row, scratch_floats, split, BlockJob, Kernel, BLOCK_COLS};
use crate::error::Result;
use crate::reference::Linear;
use crate::validate::{check_len, LinearShape};

/// A validated dense linear with its scales folded, ready to run.
pub struct CpuLinear<'a> {
    pub name: &'a str,
    pub shape: LinearShape,
    code: &'a [i16],
    rin_eff: Vec<f32>,
    rout_eff: Vec<f32>,
    bias: Option<&'a [f32]>,
    kernel: Kernel,
}

impl<'a> CpuLinear<'a> {
    /// Validates `l` (lengths, finite scales) and folds its scales.
    pub fn new(l: &Linear<'a>, kernel: Kernel) -> Result<Self> {
        l.validate()?;
        let (rin_eff, rout_eff) = l.folded();
        Ok(Self { name: l.name, shape: l.shape, code: l.code, rin_eff, rout_eff, bias: l.bias, kernel })
    }

    /// Output blocks of 128 columns: the unit of work of phase 2.
    pub fn blocks(&self) -> usize {
        self.shape.oc / BLOCK_COLS
    }

    /// Scratch floats one thread needs for `m` rows in phase 2.
    pub fn scratch_floats(&self, m: usize) -> usize {
        scratch_floats(m)
    }

    /// Whole forward on the calling thread: `x [m, IC]` -> `y [m, OC]`
    /// (f32 holding the contract's f16-rounded values).
    pub fn forward(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        check_len(self.name, "x", x.len(), m * self.shape.ic)?;
        let mut xh = vec![0f32; m * self.shape.ic];
        self.transform_input(x, m, &mut xh, 0, 1);
        let mut y = vec![0f32; m * self.shape.oc];
        let mut scratch = vec![0f32; self.scratch_floats(m)];
        // SAFETY: y holds m*OC floats and this is the only writer.
        unsafe { self.compute_shared(&xh, m, y.as_mut_ptr(), 0, 1, &mut scratch) };
        Ok(y)
    }

    /// Phase 1 on the calling thread, share `ith` of `nth` of the rows:
    /// `xh [m * IC]` in the kernels' tile-row-major layout.
    pub fn transform_input(&self, x: &[f32], m: usize, xh: &mut [f32], ith: usize, nth: usize) {
        assert!(xh.len() >= m * self.shape.ic, "{}: xh shorter than {m} rows", self.name);
        // SAFETY: xh holds m*IC floats and is exclusively borrowed.
        unsafe { self.transform_input_shared(x, m, xh.as_mut_ptr(), ith, nth) }
    }

    /// Phase 1 for concurrent callers.
    ///
    /// # Safety
    /// `xh` must be valid for writes of `m * IC` floats; concurrent callers
    /// must use the same `nth`, distinct `ith`, and nothing else may access
    /// `xh` until all have finished.
    pub unsafe fn transform_input_shared(&self, x: &[f32], m: usize, xh: *mut f32, ith: usize, nth: usize) {
        let ic = self.shape.ic;
        assert!(x.len() >= m * ic, "{}: x shorter than {m} rows", self.name);
        let mut tmp = vec![0f32; ic];
        for r in split(m, ith, nth) {
            input_transform_row(&x[r * ic..(r + 1) * ic], &self.rin_eff, xh, m, r, &mut tmp);
        }
    }

    /// Phase 2, share `ith` of `nth`: the output blocks of this thread, for
    /// all `m` rows of `xh` (complete, i.e. after every thread's phase 1).
    ///
    /// # Safety
    /// `y` must be valid for writes of `m * OC` floats. Concurrent callers
    /// must use the same `nth` and distinct `ith` (they then write disjoint
    /// columns) and nothing else may access `y` meanwhile.
    pub unsafe fn compute_shared(&self, xh: &[f32], m: usize, y: *mut f32, ith: usize, nth: usize, scratch: &mut [f32]) {
        let LinearShape { k, ic, oc } = self.shape;
        assert!(xh.len() >= m * ic, "{}: xh shorter than {m} rows", self.name);
        assert!(scratch.len() >= self.scratch_floats(m), "{}: scratch too small", self.name);
        let rows: Vec<usize> = (0..m).collect();
        let job = BlockJob { k, ic, oc, code: self.code, xh, n_xrows: m, rows: &rows, block: 0 };
        self.kernel.run_blocks(job, split(self.blocks(), ith, nth), &self.rout_eff, self.bias, scratch, |row, c0, v| {
            // SAFETY: row < m and c0 + 128 <= OC; columns are this thread's.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), y.add(row * oc + c0), v.len()) }
        });
    }
}
