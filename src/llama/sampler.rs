//! A chain of llama.cpp's own samplers.

use super::{Context, LlamaError, Model, Token};
use crate::ffi::llama_sys as sys;
use std::ptr::NonNull;

/// One stage of a sampler chain, in llama.cpp's order of application.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stage {
    /// Repetition, frequency and presence penalties over the last `last_n` tokens.
    Penalties { last_n: i32, repeat: f32, freq: f32, present: f32 },
    TopK(i32),
    TopP(f32),
    MinP(f32),
    Temperature(f32),
    /// Picks the most likely token (ends a chain).
    Greedy,
    /// Draws from the distribution with this seed (ends a chain).
    Dist(u32),
}

/// A sampler chain; freed on drop.
pub struct Sampler {
    ptr: NonNull<sys::llama_sampler>,
}

// SAFETY: a sampler chain has no thread affinity; it is used through
// &mut self only (not Sync).
unsafe impl Send for Sampler {}

impl Drop for Sampler {
    fn drop(&mut self) {
        // SAFETY: the chain owns its stages and is freed once.
        unsafe { sys::llama_sampler_free(self.ptr.as_ptr()) };
    }
}

impl Sampler {
    /// Greedy decoding: always the most likely token.
    pub fn greedy() -> Sampler {
        Self::build(0, &[Stage::Greedy]).expect("a greedy chain is valid")
    }

    /// A chain of stages for `model`'s vocabulary; the last must pick a
    /// token (`Greedy` or `Dist`).
    pub fn chain(model: &Model, stages: &[Stage]) -> Result<Sampler, LlamaError> {
        Self::build(model.n_vocab() as i32, stages)
    }

    fn build(n_vocab: i32, stages: &[Stage]) -> Result<Sampler, LlamaError> {
        if !matches!(stages.last(), Some(Stage::Greedy | Stage::Dist(_))) {
            return Err(LlamaError::Invalid("a sampler chain must end with Greedy or Dist".into()));
        }
        for s in stages {
            let ok = match *s {
                Stage::Penalties { repeat, freq, present, .. } => repeat > 0.0 && freq.is_finite() && present.is_finite(),
                Stage::TopP(p) | Stage::MinP(p) => (0.0..=1.0).contains(&p),
                Stage::Temperature(t) => t.is_finite(),
                _ => true,
            };
            if !ok {
                return Err(LlamaError::Invalid(format!("sampler stage {s:?} is out of range")));
            }
        }
        // SAFETY: value struct, then a new empty chain (NULL only on allocation failure).
        let chain = unsafe { sys::llama_sampler_chain_init(sys::llama_sampler_chain_default_params()) };
        let ptr = NonNull::new(chain).ok_or_else(|| LlamaError::Invalid("llama_sampler_chain_init failed".into()))?;
        let sampler = Sampler { ptr };
        for s in stages {
            // SAFETY: each init returns a new sampler (arguments checked above).
            let stage = unsafe {
                match *s {
                    Stage::Penalties { last_n, repeat, freq, present } => sys::llama_sampler_init_penalties(n_vocab, last_n, repeat, freq, present),
                    Stage::TopK(k) => sys::llama_sampler_init_top_k(k),
                    Stage::TopP(p) => sys::llama_sampler_init_top_p(p, 1),
                    Stage::MinP(p) => sys::llama_sampler_init_min_p(p, 1),
                    Stage::Temperature(t) => sys::llama_sampler_init_temp(t),
                    Stage::Greedy => sys::llama_sampler_init_greedy(),
                    Stage::Dist(seed) => sys::llama_sampler_init_dist(seed),
                }
            };
            if stage.is_null() {
                return Err(LlamaError::Invalid(format!("llama.cpp refused sampler stage {s:?}")));
            }
            // SAFETY: the chain takes ownership of the stage.
            unsafe { sys::llama_sampler_chain_add(sampler.ptr.as_ptr(), stage) };
        }
        Ok(sampler)
    }

    /// Samples from the logits of token `i` of the context's last batch
    /// (-1: the last kept) and records the token in the chain's history
    /// (penalties).
    pub fn sample(&mut self, ctx: &Context<'_>, i: i32) -> Result<Token, LlamaError> {
        ctx.logits(i)?; // kept logits, checked before llama.cpp reads them
        // SAFETY: the chain and the context are live; token i kept its logits.
        Ok(unsafe { sys::llama_sampler_sample(self.ptr.as_ptr(), ctx.as_ptr(), i) })
    }

    /// Forgets the history (a new generation).
    pub fn reset(&mut self) {
        // SAFETY: the chain is live.
        unsafe { sys::llama_sampler_reset(self.ptr.as_ptr()) };
    }
}
