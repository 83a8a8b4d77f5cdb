//! The ISA paths ([`Isa`]) and the handle that runs one of them
//! ([`Kernel`]): the only place that selects a `#[target_feature]` path, and
//! only after checking that the CPU has it.

use super::batch;
use super::job::{BlockJob, ALL_TILES, BLOCK_COLS, BLOCK_TILES};
use super::scalar;
use crate::transform::output_transform;
use half::slice::HalfFloatSliceExt;
use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use super::{amx, avx2, avx512};
#[cfg(target_arch = "aarch64")]
use super::neon;

/// An instruction-set path of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
    /// AVX-512 F, BW, VBMI and VBMI2 without FP16 (Ice Lake, Zen 4 and 5):
    /// the GEMV hashes in 16-bit lanes and adds in f32.
    Avx512Vbmi,
    /// AVX-512F with the codebook's f16 add in AVX-512 FP16.
    Avx512Fp16,
    /// [`Isa::Avx512Fp16`] with the batched product on AMX-BF16 tiles
    /// (Sapphire Rapids and later, where the OS grants tile data).
    Amx,
    Neon,
    /// NEON with the codebook's f16 add in ARMv8.2-A FP16 arithmetic.
    NeonFp16,
}

impl Isa {
    pub const ALL: [Isa; 8] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Vbmi, Isa::Avx512Fp16, Isa::Amx, Isa::Neon, Isa::NeonFp16];

    /// Whether this machine can run the path.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vbmi => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vbmi")
                    && is_x86_feature_detected!("avx512vbmi2")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Fp16 => Isa::Avx512Vbmi.available() && is_x86_feature_detected!("avx512fp16"),
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => Isa::Avx512Fp16.available() && amx::available(),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonFp16 => std::arch::is_aarch64_feature_detected!("neon") && std::arch::is_aarch64_feature_detected!("fp16"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every path this machine can run.
    pub fn all_available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.available()).collect()
    }

    /// The best available path, optionally capped by the environment
    /// variable `ESCHA_CPU_ISA` (`scalar`, `avx2`, `avx512`, `avx512vbmi`, `avx512fp16`, `amx`, `neon`, `neonfp16`).
    pub fn detect() -> Isa {
        if let Ok(name) = std::env::var("ESCHA_CPU_ISA") {
            if let Some(isa) = Isa::from_name(&name).filter(|i| i.available()) {
                return isa;
            }
        }
        [Isa::Amx, Isa::Avx512Fp16, Isa::Avx512Vbmi, Isa::Avx512, Isa::Avx2, Isa::NeonFp16, Isa::Neon].into_iter().find(|i| i.available()).unwrap_or(Isa::Scalar)
    }

    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == name.trim().to_ascii_lowercase())
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vbmi => "avx512vbmi",
            Isa::Avx512Fp16 => "avx512fp16",
            Isa::Amx => "amx",
            Isa::Neon => "neon",
            Isa::NeonFp16 => "neonfp16",
        }
    }
}

/// f32 scratch each caller of a block kernel must provide for `m` rows:
/// `mid [m, 128]` plus the batched path's decoded tiles.
pub fn scratch_floats(m: usize) -> usize {
    m * BLOCK_COLS + batch::DECODED_FLOATS
}

/// A dispatching handle over one ISA path. It can only be made by
/// [`Kernel::best`] or [`Kernel::with_isa`], which check the CPU, so safe
/// code never reaches a `#[target_feature]` path this machine lacks:
///
/// ```compile_fail
/// use escha_ggml::cpu::{Isa, Kernel};
/// let k = Kernel { isa: Isa::Avx512 }; // private field: does not compile
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel {
    isa: Isa,
}

impl Kernel {
    /// The path this handle runs.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The best path of this machine.
    pub fn best() -> Self {
        Kernel { isa: Isa::detect() }
    }

    /// A specific path; `None` if this machine cannot run it.
    pub fn with_isa(isa: Isa) -> Option<Self> {
        isa.available().then_some(Kernel { isa })
    }

    /// Rows up to which this path's block product takes its GEMV, which
    /// sums in another order than the batched product: a row's outputs are
    /// the same bits whatever rows share its call only where both calls
    /// take the same side of this (0: one order for every row count).
    pub(crate) fn gemv_rows(&self) -> usize {
        use batch::TileOps;
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::Avx2::GEMV_ROWS,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512::Avx512::GEMV_ROWS,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vbmi => avx512::Avx512Vbmi::GEMV_ROWS,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Fp16 => avx512::Avx512Fp16::GEMV_ROWS,
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => amx::GEMV_ROWS,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => neon::Neon::GEMV_ROWS,
            #[cfg(target_arch = "aarch64")]
            Isa::NeonFp16 => neon::NeonFp16::GEMV_ROWS,
            _ => 0,
        }
    }

    /// `mid [rows, 128]` of one block (scratch from [`scratch_floats`]).
    pub(crate) fn block_mid(&self, job: &BlockJob, mid: &mut [f32], scratch: &mut [f32]) {
        check_job(job, job.block..job.block + 1);
        assert!(
            job.tiles == ALL_TILES || self.isa == Isa::Scalar || job.rows.len() <= self.gemv_rows(),
            "a part of a block's tiles goes to the GEMV only"
        );
        mid.fill(0.0);
        match self.isa {
            // SAFETY (batch::block_mid's list): 1. a Kernel of a SIMD ISA
            // only exists when the CPU has it (`best`, `with_isa`); 2. the
            // job was checked above; 3. `mid` holds rows * 128 floats and
            // `scratch` the rest of `scratch_floats` (run_blocks' split).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { batch::block_mid::<avx2::Avx2>(job, mid, scratch) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { batch::block_mid::<avx512::Avx512>(job, mid, scratch) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vbmi => unsafe { batch::block_mid::<avx512::Avx512Vbmi>(job, mid, scratch) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Fp16 => unsafe { batch::block_mid::<avx512::Avx512Fp16>(job, mid, scratch) },
            // SAFETY: as above, and a Kernel of Isa::Amx exists only where
            // amx::available() said yes (Isa::available).
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => unsafe { amx::block_mid::<avx512::Avx512Fp16>(job, mid, scratch) },
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => unsafe { batch::block_mid::<neon::Neon>(job, mid, scratch) },
            #[cfg(target_arch = "aarch64")]
            Isa::NeonFp16 => unsafe { batch::block_mid::<neon::NeonFp16>(job, mid, scratch) },
            _ => scalar::block_mid(job, mid),
        }
    }

    /// Phase 2 for output blocks `blocks`: for each, the product and the
    /// output transform of every row in `rows`; `write(row, col0, vals)`
    /// receives the 128 finished f16-valued outputs of one row.
    pub(crate) fn run_blocks(
        &self,
        job: BlockJob,
        blocks: Range<usize>,
        rout_eff: &[f32],
        bias: Option<&[f32]>,
        scratch: &mut [f32],
        mut write: impl FnMut(usize, usize, &[f32]),
    ) {
        let m = job.rows.len();
        #[cfg(target_arch = "x86_64")]
        if self.isa == Isa::Amx && job.tiles == ALL_TILES && m > self.gemv_rows() {
            // AMX: up to amx::NB blocks a call, so that each row group's
            // split inputs serve them all.
            if blocks.is_empty() {
                return;
            }
            check_job(&job, blocks.clone());
            let mut start = blocks.start;
            while start < blocks.end {
                let end = blocks.end.min(start + amx::NB);
                AMX_MIDS.with(|mids| {
                    let mids = &mut *mids.borrow_mut();
                    mids.clear();
                    mids.resize((end - start) * m * BLOCK_COLS, 0.0);
                    // SAFETY (blocks_mid's list): 1. a Kernel of Isa::Amx
                    // exists only where the CPU and OS allow AMX, and
                    // check_job passed for these blocks; 2. `mids` holds
                    // every block's rows, `scratch` the decoded tiles.
                    unsafe { amx::blocks_mid::<avx512::Avx512Fp16>(&job, start..end, mids, scratch) };
                    for (bi, block) in (start..end).enumerate() {
                        let mid = &mut mids[bi * m * BLOCK_COLS..(bi + 1) * m * BLOCK_COLS];
                        finish_rows(job.rows, block, mid, rout_eff, bias, &mut write);
                    }
                });
                start = end;
            }
            return;
        }
        let (mid, rest) = scratch.split_at_mut(m * BLOCK_COLS);
        for block in blocks {
            self.block_mid(&BlockJob { block, ..job }, mid, rest);
            finish_rows(job.rows, block, mid, rout_eff, bias, &mut write);
        }
    }
}

/// Output block `block` of `rows` from their sums `mid [rows, 128]`
/// (consumed): each row's output transform (+ bias) to `write(row, col0,
/// vals)`; `rout_eff` and `bias` are all OC columns'.
fn finish_rows(rows: &[usize], block: usize, mid: &mut [f32], rout_eff: &[f32], bias: Option<&[f32]>, write: &mut impl FnMut(usize, usize, &[f32])) {
    let c0 = block * BLOCK_COLS;
    let cols = c0..c0 + BLOCK_COLS;
    let (rout_blk, bias_blk) = (&rout_eff[cols.clone()], bias.map(|b| &b[cols]));
    let mut out = [0f32; BLOCK_COLS];
    for (i, &row) in rows.iter().enumerate() {
        finish_block(&mut mid[i * BLOCK_COLS..(i + 1) * BLOCK_COLS], rout_blk, bias_blk, &mut out);
        write(row, c0, &out);
    }
}

/// The checks every kernel's safety rests on: IC is whole Hadamard blocks,
/// output blocks `blocks` lie inside OC, the code holds every tile, the
/// rows lie inside `xh`, and the tiles are a range of a block.
fn check_job(job: &BlockJob, blocks: Range<usize>) {
    assert!(job.ic > 0 && job.ic % BLOCK_COLS == 0, "IC {} is not a multiple of 128", job.ic);
    assert!(blocks.start < blocks.end && blocks.end * BLOCK_TILES <= job.nt_n());
    assert!(job.code.len() >= job.tile_offset(job.kt_n() - 1, job.nt_n() - 1) + 16 * job.k);
    assert!(job.rows.iter().all(|&r| r < job.n_xrows) && job.xh.len() >= job.n_xrows * job.ic);
    assert!(job.tiles.0 < job.tiles.1 && job.tiles.1 <= BLOCK_TILES);
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// The AMX path's sums of up to `amx::NB` blocks (`Kernel::run_blocks`).
    static AMX_MIDS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The output transform (+ bias) of one row's `mid` of one output block
/// (consumed as scratch), widened to f32 in `out`; `rout_eff` and `bias`
/// are the block's 128 columns'.
pub(crate) fn finish_block(mid: &mut [f32], rout_eff: &[f32], bias: Option<&[f32]>, out: &mut [f32; BLOCK_COLS]) {
    let mut y16 = [half::f16::ZERO; BLOCK_COLS];
    output_transform(mid, rout_eff, bias, &mut y16);
    y16.convert_to_f32_slice(out);
}
