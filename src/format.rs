//! The numeric constants of the Escha-W2 format (`docs/FORMAT.md`), the one
//! home of each on the Rust side; the C side states the same values once, in
//! `ggml-escha/include/escha-format.h`, and `tests/codec.rs` checks that the
//! two agree.

/// Tile edge: a tile is 16 input rows x 16 output columns.
pub const TILE: usize = 16;
/// Values per tile.
pub const TILE_VALUES: usize = TILE * TILE;
/// Hadamard block: IC and OC are multiples of it, H128 acts on each block.
pub const HBLOCK: usize = 128;
/// 1/sqrt(128) as the f32 constant the format pins.
#[allow(clippy::excessive_precision)] // the literal the format pins
pub const RS: f32 = 0.088388347648;

/// The codebook id of cbA (`escha.codebook`, the op parameter), the only
/// codebook the format defines.
pub const CODEBOOK_CBA: i64 = 1;
/// cbA's hash: `r = ((state * MUL) mod 2^32 & MASK) ^ XOR`; the value is
/// `f16(lo16(r)) + f16(hi16(r))` with one round-to-nearest-even.
pub const CBA_MUL: u32 = 0xCBAC_1FED;
pub const CBA_MASK: u32 = 0x8FFF_8FFF;
pub const CBA_XOR: u32 = 0x3B60_3B60;

/// Index of the codebook id among an escha op's int32 parameters
/// (`ESCHA_PARAM_CODEBOOK` of `escha-op.h`).
pub const OP_PARAM_CODEBOOK: usize = 1;
