//! A context: the KV cache and the evaluation of token batches.

use super::observe::{eval_callback, Observer, ObserverSlot};
use super::{log, LlamaError, Model, Token};
use crate::ffi::llama_sys as sys;
use std::ptr::NonNull;

/// How a context is made.
#[derive(Clone, Debug)]
pub struct ContextParams {
    /// Context length in tokens (0: the model's).
    pub n_ctx: u32,
    /// Most tokens handed to one `decode` call.
    pub n_batch: u32,
    /// Threads (token generation and batches alike); 0: llama.cpp's default.
    pub n_threads: i32,
    /// Sequences evaluated side by side at most.
    pub n_seq_max: u32,
    /// Also keep embeddings (pooled per sequence where the model pools).
    pub embeddings: bool,
}

impl Default for ContextParams {
    fn default() -> Self {
        Self { n_ctx: 4096, n_batch: 512, n_threads: 0, n_seq_max: 1, embeddings: false }
    }
}

/// A context on a model (which it borrows); freed on drop.
pub struct Context<'m> {
    ptr: NonNull<sys::llama_context>,
    pub(super) model: &'m Model,
    n_batch: usize,
    /// One token's entry of a batch: (token, position, sequence, wants logits).
    scratch: Vec<(Token, i32, i32, bool)>,
    /// The observer libllama calls back (boxed: a fixed address for C);
    /// dropped after the context is freed.
    observer: Option<Box<ObserverSlot>>,
}

// SAFETY: a llama_context has no thread affinity; this type gives access
// only through &mut self (not Sync), so one thread uses it at a time.
unsafe impl Send for Context<'_> {}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: ptr came from llama_init_from_model and is freed once.
        unsafe { sys::llama_free(self.ptr.as_ptr()) };
    }
}

impl<'m> Context<'m> {
    pub fn new(model: &'m Model, params: &ContextParams) -> Result<Context<'m>, LlamaError> {
        Self::make(model, params, None)
    }

    /// A context whose evaluations call `observer` for the graph tensors it
    /// picks (llama.cpp's eval callback; see [`Observer`]).
    pub fn with_observer(model: &'m Model, params: &ContextParams, observer: impl Observer + 'static) -> Result<Context<'m>, LlamaError> {
        Self::make(model, params, Some(Box::new(ObserverSlot::new(Box::new(observer)))))
    }

    fn make(model: &'m Model, params: &ContextParams, mut observer: Option<Box<ObserverSlot>>) -> Result<Context<'m>, LlamaError> {
        if params.n_batch == 0 || params.n_seq_max == 0 {
            return Err(LlamaError::Context("n_batch and n_seq_max must be positive".into()));
        }
        // SAFETY: a value struct.
        let mut p = unsafe { sys::llama_context_default_params() };
        p.n_ctx = params.n_ctx;
        p.n_batch = params.n_batch;
        p.n_ubatch = params.n_batch.min(p.n_ubatch.max(1));
        p.n_seq_max = params.n_seq_max;
        if params.n_threads > 0 {
            p.n_threads = params.n_threads;
            p.n_threads_batch = params.n_threads;
        }
        p.embeddings = params.embeddings;
        if let Some(o) = observer.as_mut() {
            p.cb_eval = Some(eval_callback);
            p.cb_eval_user_data = &mut **o as *mut ObserverSlot as *mut std::ffi::c_void;
        }
        log::clear_errors();
        // SAFETY: the model is loaded and outlives the context (borrowed for 'm).
        let ptr = unsafe { sys::llama_init_from_model(model.as_ptr(), p) };
        let ptr = NonNull::new(ptr).ok_or_else(|| LlamaError::Context(log::errors_or("llama_init_from_model failed")))?;
        Ok(Context { ptr, model, n_batch: params.n_batch as usize, scratch: Vec::new(), observer })
    }

    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// The context length in tokens.
    pub fn n_ctx(&self) -> u32 {
        // SAFETY: the context is live.
        unsafe { sys::llama_n_ctx(self.ptr.as_ptr()) }
    }

    pub(super) fn as_ptr(&self) -> *mut sys::llama_context {
        self.ptr.as_ptr()
    }

    /// Evaluates `tokens` of sequence `seq` from position `pos0` (in
    /// `n_batch` pieces), keeping the logits of the last one
    /// (`logits(-1)` afterwards).
    pub fn eval(&mut self, tokens: &[Token], seq: i32, pos0: i32) -> Result<(), LlamaError> {
        if tokens.is_empty() {
            return Err(LlamaError::Invalid("no tokens to evaluate".into()));
        }
        let n_batch = self.n_batch;
        for (i, chunk) in tokens.chunks(n_batch).enumerate() {
            let last = (i + 1) * n_batch >= tokens.len();
            let entries: Vec<_> = chunk
                .iter()
                .enumerate()
                .map(|(j, &t)| (t, pos0 + (i * n_batch + j) as i32, seq, last && j + 1 == chunk.len()))
                .collect();
            self.decode(&entries)?;
        }
        Ok(())
    }

    /// Evaluates one batch of tokens of any sequences: `(token, position,
    /// sequence, keep logits)`; [`Context::logits`] then takes a token's
    /// index in this batch.
    pub fn decode(&mut self, entries: &[(Token, i32, i32, bool)]) -> Result<(), LlamaError> {
        if entries.is_empty() || entries.len() > self.n_batch {
            return Err(LlamaError::Invalid(format!("a batch holds 1 to {} tokens, got {}", self.n_batch, entries.len())));
        }
        let n_vocab = self.model.n_vocab() as i32;
        if let Some((t, ..)) = entries.iter().find(|(t, ..)| *t < 0 || *t >= n_vocab) {
            return Err(LlamaError::Invalid(format!("token {t} is outside the vocabulary (0..{n_vocab})")));
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(entries);
        let n = entries.len() as i32;
        // SAFETY: llama_batch_init allocates n token slots with one sequence id each; freed below.
        let batch = unsafe { sys::llama_batch_init(n, 0, 1) };
        for (i, &(t, pos, seq, logits)) in self.scratch.iter().enumerate() {
            // SAFETY: i < n, the sizes llama_batch_init allocated (seq_id[i] holds one id).
            unsafe {
                *batch.token.add(i) = t;
                *batch.pos.add(i) = pos;
                *batch.n_seq_id.add(i) = 1;
                *(*batch.seq_id.add(i)) = seq;
                *batch.logits.add(i) = logits as i8;
            }
        }
        let mut b = batch;
        b.n_tokens = n;
        log::clear_errors();
        // SAFETY: the batch is filled for n tokens; the context is live.
        let rc = unsafe { sys::llama_decode(self.as_ptr(), b) };
        // SAFETY: frees what llama_batch_init allocated (n_tokens is not used by it).
        unsafe { sys::llama_batch_free(batch) };
        if let Some(msg) = self.observer.as_mut().and_then(|o| o.take_panic()) {
            return Err(LlamaError::Decode { code: rc, message: msg });
        }
        if rc != 0 {
            return Err(LlamaError::Decode { code: rc, message: log::errors_or("no message") });
        }
        Ok(())
    }

    /// The logits of token `i` of the last batch (its index there; -1: the
    /// last token whose logits were kept).
    pub fn logits(&self, i: i32) -> Result<&[f32], LlamaError> {
        // SAFETY: the context is live; llama.cpp checks i and returns NULL when the token kept no logits.
        let p = unsafe { sys::llama_get_logits_ith(self.as_ptr(), i) };
        if p.is_null() {
            return Err(LlamaError::Invalid(format!("no logits for row {i} of the last batch")));
        }
        // SAFETY: a kept token has n_vocab floats, valid until the next decode (which needs &mut self).
        Ok(unsafe { std::slice::from_raw_parts(p, self.model.n_vocab()) })
    }

    /// The pooled embedding of a sequence (a context made with `embeddings`).
    pub fn embeddings_seq(&self, seq: i32) -> Result<&[f32], LlamaError> {
        // SAFETY: the context is live; NULL when there is no pooled embedding.
        let p = unsafe { sys::llama_get_embeddings_seq(self.as_ptr(), seq) };
        if p.is_null() {
            return Err(LlamaError::Invalid(format!("no pooled embedding of sequence {seq} (embeddings off, or no pooling)")));
        }
        // SAFETY: n_embd floats, valid until the next decode.
        Ok(unsafe { std::slice::from_raw_parts(p, self.model.n_embd()) })
    }

    /// The embedding of token `i` of the last batch (no pooling).
    pub fn embeddings(&self, i: i32) -> Result<&[f32], LlamaError> {
        // SAFETY: as for logits.
        let p = unsafe { sys::llama_get_embeddings_ith(self.as_ptr(), i) };
        if p.is_null() {
            return Err(LlamaError::Invalid(format!("no embedding for row {i} (embeddings off?)")));
        }
        // SAFETY: n_embd floats, valid until the next decode.
        Ok(unsafe { std::slice::from_raw_parts(p, self.model.n_embd()) })
    }

    /// Forgets every sequence (the KV cache and recurrent state).
    pub fn clear(&mut self) {
        // SAFETY: the context is live; its memory lives with it.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.as_ptr()), true) };
    }

    /// Removes positions `[p0, p1)` of sequence `seq` (-1: all sequences /
    /// to the end); false when the memory cannot (a recurrent model's state
    /// cannot be cut in the middle).
    pub fn remove(&mut self, seq: i32, p0: i32, p1: i32) -> bool {
        // SAFETY: the context is live.
        unsafe { sys::llama_memory_seq_rm(sys::llama_get_memory(self.as_ptr()), seq, p0, p1) }
    }
}
