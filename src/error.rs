//! Typed errors. Every variant names the tensor it is about, so a user with
//! a malformed file learns which tensor and what is wrong with it.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum EschaError {
    #[error("{tensor}: K must be 2 or 3 (code last dim {last_dim} = 16*K), got K={k}")]
    BadK { tensor: String, k: i64, last_dim: i64 },
    #[error("{tensor}: code last dimension must be 16*K (32 or 48), got {last_dim}")]
    BadLastDim { tensor: String, last_dim: i64 },
    #[error("{tensor}: dimensions must be multiples of 128, got {what} = {value}")]
    NotMultipleOf128 { tensor: String, what: &'static str, value: i64 },
    #[error("{tensor}: {what} has {got} elements, expected {expected}")]
    BadLength { tensor: String, what: &'static str, got: usize, expected: usize },
    #[error("{tensor}: {what} holds a non-finite value ({value}) at index {index}")]
    NonFinite { tensor: String, what: &'static str, index: usize, value: f32 },
    #[error("{tensor}: escha_config {detail} disagrees with the code shape")]
    ConfigDisagrees { tensor: String, detail: String },
    #[error("{tensor}: escha_config codebook id is {id}, only codebook 1 (cbA) is defined")]
    BadCodebook { tensor: String, id: i64 },
    #[error("{prefix}: missing required leaf {leaf}")]
    MissingLeaf { prefix: String, leaf: String },
    #[error("{prefix}: unknown escha leaf {leaf} (a newer format feature? refusing to guess)")]
    UnknownLeaf { prefix: String, leaf: String },
    #[error("{tensor}: expert id {id} at token {token} slot {slot} is outside [0, {n_expert})")]
    BadExpertId { tensor: String, id: i64, token: usize, slot: usize, n_expert: usize },
    #[error("{tensor}: {detail}")]
    Shape { tensor: String, detail: String },
}

pub type Result<T> = std::result::Result<T, EschaError>;
