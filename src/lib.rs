//! escha-ggml: the Escha-W2 trellis weight format (2/3-bit, QTIP family)
//! for the llama.cpp / ggml ecosystem.
//!
//! Layers, from the contract outwards:
//! - [`format`](mod@format): the format's numeric constants (tile, block, RS, codebook);
//! - [`codec`]: codebook, bitstream, tile order, `reconstruct`;
//! - [`hadamard`]: the 128-point Walsh-Hadamard transform and its scale;
//! - [`transform`]: the scale fold and the input / output transforms;
//! - [`reference`](mod@reference): the linear / MoE forward exactly as the contract states;
//! - [`validate`]: shape and checkpoint-leaf validation with named errors;
//! - [`contract`]: the GGUF tensor contract, checked as llama.cpp's loader does;
//! - [`cpu`]: fast decode-and-multiply kernels (runtime SIMD dispatch);
//! - [`cref`]: the C reference in `ggml-escha/`, linked for cross-checks;
//! - [`encode`]: the encoder (Viterbi over the trellis, per-channel scales);
//! - [`quantize`]: `escha quantize` / `escha decode` on GGUFs and HF checkpoints;
//! - [`ggml`]: safe bindings to build and compute graphs with the escha ops;
//! - [`gguf`], [`safetensors`]: readers and streaming writers of both formats;
//! - [`rawio`]: the raw little-endian golden-file convention of the CLI;
//! - [`output`]: outputs written beside their target and renamed when complete;
//! - [`rng`]: the deterministic random numbers of the encoder and the tests.
//!
//! The format is specified in `docs/FORMAT.md`.

pub mod codec;
#[cfg(feature = "ggml")]
pub mod contract;
pub mod cpu;
pub mod cref;
pub mod encode;
pub mod error;
pub mod ffi;
pub mod format;
#[cfg(feature = "ggml")]
pub mod ggml;
#[cfg(feature = "ggml")]
pub mod gguf;
#[cfg(feature = "llama")]
pub mod llama;
#[cfg(feature = "ggml")]
pub mod quantize;
#[cfg(feature = "ggml")]
pub mod safetensors;
pub mod hadamard;
pub mod output;
pub mod rawio;
pub mod reference;
pub mod rng;
pub mod transform;
pub mod validate;
#[doc(hidden)]
pub mod testutil;

pub use error::{EschaError, Result};
pub use validate::{LinearShape, MoeShape};
