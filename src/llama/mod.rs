//! Escha models through the patched libllama, safely (feature `llama`):
//! load a GGUF ([`Model`]), tokenize, evaluate batches ([`Context`]),
//! sample with llama.cpp's own samplers ([`Sampler`]) and stream text
//! ([`Generation`]).
//!
//! ```no_run
//! use escha_ggml::llama::{Backend, Context, ContextParams, Model, ModelParams, Sampler};
//! let backend = Backend::init();
//! let model = Model::load(&backend, "model-escha.gguf", &ModelParams::default())?;
//! let mut ctx = Context::new(&model, &ContextParams::default())?;
//! let mut sampler = Sampler::greedy();
//! for piece in ctx.generate(&model.tokenize("The capital of France is", true)?, &mut sampler, 32)? {
//!     print!("{}", piece?);
//! }
//! # Ok::<(), escha_ggml::llama::LlamaError>(())
//! ```
//!
//! Every call into libllama goes through `crate::ffi::llama_sys`; each
//! `unsafe` block says why it holds. Handles are owned (`NonNull`) and
//! freed in `Drop`. llama.cpp's log goes to [`LogSink`] (silent by default)
//! and its error lines are kept, so a failed load reports llama.cpp's own
//! message (an escha tensor the loader refuses is named there).

mod context;
mod generate;
mod log;
mod model;
mod observe;
mod sampler;

pub use context::{Context, ContextParams};
pub use generate::Generation;
pub use log::LogSink;
pub use model::{KvOverride, Model, ModelParams, Token};
pub use observe::{Observer, Tensor};
pub use sampler::{Sampler, Stage};

use crate::ffi::llama_sys as sys;
use std::sync::OnceLock;

/// Errors of the model API; the messages are llama.cpp's where it gave one.
#[derive(Debug, thiserror::Error)]
pub enum LlamaError {
    #[error("{path}: {message}")]
    Load { path: String, message: String },
    #[error("creating a context failed: {0}")]
    Context(String),
    #[error("tokenizing failed: {0}")]
    Tokenize(String),
    #[error("decode failed (llama_decode returned {code}): {message}")]
    Decode { code: i32, message: String },
    #[error("{0}")]
    Invalid(String),
}

/// Proof that libllama's backends are initialised (once per process); every
/// model is loaded through it.
#[derive(Clone, Copy, Debug)]
pub struct Backend(());

static BACKEND: OnceLock<()> = OnceLock::new();

impl Backend {
    /// Initialises libllama once, with its log silent (error lines kept).
    pub fn init() -> Backend {
        Self::init_with_log(LogSink::Silent)
    }

    /// Initialises libllama once and routes its log to `sink` (later calls
    /// only change the sink).
    pub fn init_with_log(sink: LogSink) -> Backend {
        log::set_sink(sink);
        BACKEND.get_or_init(|| {
            log::install();
            // SAFETY: llama_backend_init takes no arguments and is made to run
            // once per process by the OnceLock.
            unsafe { sys::llama_backend_init() };
        });
        Backend(())
    }
}
