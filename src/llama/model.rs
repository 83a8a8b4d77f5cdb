//! A loaded model: its facts, vocabulary and tokenizer.

use super::{log, Backend, LlamaError};
use crate::ffi::llama_sys as sys;
use std::ffi::{c_char, CStr, CString};
use std::ptr::NonNull;

/// A token id of the model's vocabulary.
pub type Token = i32;

/// A metadata override (llama.cpp's `--override-kv`), e.g.
/// `("escha.apply_bias", KvOverride::Bool(false))`.
#[derive(Clone, Debug, PartialEq)]
pub enum KvOverride {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

/// How a model is loaded.
#[derive(Clone, Debug)]
pub struct ModelParams {
    /// Layers offloaded to the GPU (0: CPU only; -1: all).
    pub n_gpu_layers: i32,
    /// How layers are split over several GPUs (llama.cpp's `llama_split_mode`: 0 none, 1 layer, 2 row).
    pub split_mode: u32,
    /// Map the file (llama.cpp's default loading); false reads it into memory.
    pub use_mmap: bool,
    /// Metadata overrides, by key.
    pub kv_overrides: Vec<(String, KvOverride)>,
}

impl Default for ModelParams {
    fn default() -> Self {
        Self { n_gpu_layers: 0, split_mode: 1, use_mmap: true, kv_overrides: Vec::new() }
    }
}

/// A model loaded by libllama; freed on drop.
pub struct Model {
    ptr: NonNull<sys::llama_model>,
    vocab: NonNull<sys::llama_vocab>,
}

// SAFETY: a llama_model is not modified after loading; llama.cpp shares one
// model between contexts on several threads (its server does), and every
// method here only reads it.
unsafe impl Send for Model {}
// SAFETY: as above: only reads, which llama.cpp allows from any thread.
unsafe impl Sync for Model {}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: ptr came from llama_model_load_from_file and is freed once;
        // contexts borrow the model, so none outlives it.
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) };
    }
}

/// The progress callback handed to llama.cpp.
///
/// # Safety
/// `user` must be the `(&mut &mut dyn FnMut(f32) -> bool, &mut bool)` that
/// [`Model::load_with_progress`] passes, live and not otherwise borrowed for
/// the call (llama.cpp calls it only inside `llama_model_load_from_file`).
unsafe extern "C" fn on_progress(progress: f32, user: *mut std::ffi::c_void) -> bool {
    // SAFETY: `user` is the state Model::load_with_progress passed, on its
    // stack until llama_model_load_from_file returns; llama.cpp calls this
    // only during that call, on the calling thread.
    let (f, cancelled) = unsafe { &mut *(user as *mut (&mut &mut dyn FnMut(f32) -> bool, &mut bool)) };
    // A panic must not cross into C: it cancels the load instead.
    let go = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(progress))).unwrap_or(false);
    if !go {
        **cancelled = true;
    }
    go
}

/// Reads a string a llama.cpp function writes into a buffer (it returns the
/// length it needs, or a negative value for none).
fn read_string(f: impl Fn(*mut c_char, usize) -> i32) -> Option<String> {
    let mut buf = vec![0u8; 256];
    loop {
        let n = f(buf.as_mut_ptr() as *mut c_char, buf.len());
        if n < 0 {
            return None;
        }
        if (n as usize) < buf.len() {
            return Some(String::from_utf8_lossy(&buf[..n as usize]).into_owned());
        }
        buf.resize(n as usize + 1, 0);
    }
}

impl Model {
    /// Loads a GGUF. Fails with llama.cpp's own message (which names a
    /// refused escha tensor) when the file cannot be loaded, or when a path
    /// or an override cannot be passed to C.
    pub fn load(backend: &Backend, path: impl AsRef<std::path::Path>, params: &ModelParams) -> Result<Model, LlamaError> {
        Self::load_with_progress(backend, path, params, &mut |_| true)
    }

    /// [`Model::load`], calling `progress` with the fraction loaded (0 to
    /// 1) as llama.cpp reports it; returning false cancels the load, which
    /// then fails.
    pub fn load_with_progress(
        _backend: &Backend, path: impl AsRef<std::path::Path>, params: &ModelParams, progress: &mut dyn FnMut(f32) -> bool,
    ) -> Result<Model, LlamaError> {
        let shown = path.as_ref().display().to_string();
        let invalid = |m: String| LlamaError::Load { path: shown.clone(), message: m };
        let cpath = CString::new(path.as_ref().as_os_str().as_encoded_bytes()).map_err(|_| invalid("the path contains a NUL byte".into()))?;
        if !path.as_ref().is_file() {
            return Err(invalid("no such file".into()));
        }
        // The overrides, as llama.cpp takes them: an array ended by an empty key.
        let mut kv: Vec<sys::llama_model_kv_override> = Vec::with_capacity(params.kv_overrides.len() + 1);
        for (key, value) in &params.kv_overrides {
            // SAFETY: an all-zero llama_model_kv_override is a valid value of
            // the plain C struct (tag 0, empty key, zero union).
            let mut o: sys::llama_model_kv_override = unsafe { std::mem::zeroed() };
            if key.len() >= o.key.len() || key.bytes().any(|b| b == 0) {
                return Err(invalid(format!("override key {key:?} is empty, too long or contains a NUL byte")));
            }
            for (d, s) in o.key.iter_mut().zip(key.bytes()) {
                *d = s as c_char;
            }
            match value {
                KvOverride::Int(v) => {
                    o.tag = sys::llama_model_kv_override_type_LLAMA_KV_OVERRIDE_TYPE_INT;
                    o.__bindgen_anon_1.val_i64 = *v;
                }
                KvOverride::Float(v) => {
                    o.tag = sys::llama_model_kv_override_type_LLAMA_KV_OVERRIDE_TYPE_FLOAT;
                    o.__bindgen_anon_1.val_f64 = *v;
                }
                KvOverride::Bool(v) => {
                    o.tag = sys::llama_model_kv_override_type_LLAMA_KV_OVERRIDE_TYPE_BOOL;
                    o.__bindgen_anon_1.val_bool = *v;
                }
                KvOverride::Str(v) => {
                    // SAFETY: reading the union's string member to fill it (it is a plain char array).
                    let dst = unsafe { &mut o.__bindgen_anon_1.val_str };
                    if v.len() >= dst.len() || v.bytes().any(|b| b == 0) {
                        return Err(invalid(format!("override {key}: the string is too long or contains a NUL byte")));
                    }
                    for (d, s) in dst.iter_mut().zip(v.bytes()) {
                        *d = s as c_char;
                    }
                    o.tag = sys::llama_model_kv_override_type_LLAMA_KV_OVERRIDE_TYPE_STR;
                }
            }
            kv.push(o);
        }
        // SAFETY: zeroed terminator, as above.
        kv.push(unsafe { std::mem::zeroed() });
        // SAFETY: llama_model_default_params returns a value struct.
        let mut p = unsafe { sys::llama_model_default_params() };
        p.n_gpu_layers = params.n_gpu_layers;
        p.split_mode = params.split_mode as _;
        if !params.use_mmap {
            p.load_mode = sys::llama_load_mode_LLAMA_LOAD_MODE_NONE;
        }
        if !params.kv_overrides.is_empty() {
            p.kv_overrides = kv.as_ptr();
        }
        let mut progress = progress;
        let mut cancelled = false;
        let mut state = (&mut progress, &mut cancelled);
        p.progress_callback = Some(on_progress);
        p.progress_callback_user_data = &mut state as *mut _ as *mut std::ffi::c_void;
        log::clear_errors();
        // SAFETY: cpath is NUL-terminated; p and the overrides it points to
        // live until the call returns (llama.cpp copies what it keeps).
        let ptr = unsafe { sys::llama_model_load_from_file(cpath.as_ptr(), p) };
        if cancelled {
            if let Some(m) = NonNull::new(ptr) {
                // SAFETY: a model llama.cpp returned after all is freed once, here.
                unsafe { sys::llama_model_free(m.as_ptr()) };
            }
            return Err(invalid("loading cancelled by the progress callback".into()));
        }
        let ptr = NonNull::new(ptr).ok_or_else(|| invalid(log::errors_or("llama.cpp could not load the model")))?;
        // SAFETY: ptr is a loaded model; its vocabulary lives as long as it does.
        let vocab = NonNull::new(unsafe { sys::llama_model_get_vocab(ptr.as_ptr()) } as *mut sys::llama_vocab);
        let Some(vocab) = vocab else {
            // SAFETY: ptr is freed once, here, as no Model owns it.
            unsafe { sys::llama_model_free(ptr.as_ptr()) };
            return Err(invalid("the model has no vocabulary".into()));
        };
        Ok(Model { ptr, vocab })
    }

    pub(super) fn as_ptr(&self) -> *mut sys::llama_model {
        self.ptr.as_ptr()
    }

    pub(super) fn vocab(&self) -> *const sys::llama_vocab {
        self.vocab.as_ptr()
    }

    /// llama.cpp's description (architecture, size, type: `qwen35 ?B Escha-W2 + Q8_0`).
    pub fn desc(&self) -> String {
        // SAFETY: the model is loaded; the buffer and its length are passed together.
        read_string(|b, n| unsafe { sys::llama_model_desc(self.as_ptr(), b, n) }).unwrap_or_default()
    }

    /// Parameters as llama.cpp counts them (a coded weight as its decoded twin's).
    pub fn n_params(&self) -> u64 {
        // SAFETY: the model is loaded.
        unsafe { sys::llama_model_n_params(self.as_ptr()) }
    }

    /// A metadata value as a string (`general.architecture`, ...).
    pub fn meta(&self, key: &str) -> Option<String> {
        let k = CString::new(key).ok()?;
        // SAFETY: k is NUL-terminated; the buffer and its length are passed together.
        read_string(|b, n| unsafe { sys::llama_model_meta_val_str(self.as_ptr(), k.as_ptr(), b, n) })
    }

    /// The architecture (`general.architecture`).
    pub fn architecture(&self) -> String {
        self.meta("general.architecture").unwrap_or_default()
    }

    /// Tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        // SAFETY: the vocabulary lives with the model.
        unsafe { sys::llama_vocab_n_tokens(self.vocab()) }.max(0) as usize
    }

    /// The embedding width.
    pub fn n_embd(&self) -> usize {
        // SAFETY: the model is loaded.
        unsafe { sys::llama_model_n_embd(self.as_ptr()) }.max(0) as usize
    }

    /// The default chat template, if the model has one.
    pub fn chat_template(&self) -> Option<String> {
        // SAFETY: the model is loaded; the result is NULL or a string owned by the model.
        let t = unsafe { sys::llama_model_chat_template(self.as_ptr(), std::ptr::null()) };
        // SAFETY: non-NULL: a NUL-terminated string living with the model.
        (!t.is_null()).then(|| unsafe { CStr::from_ptr(t) }.to_string_lossy().into_owned())
    }

    /// Messages `(role, content)` in the model's chat template, ending with
    /// the assistant's turn opened.
    pub fn apply_chat_template(&self, messages: &[(&str, &str)]) -> Result<String, LlamaError> {
        let tmpl = self.chat_template().ok_or_else(|| LlamaError::Invalid("the model has no chat template".into()))?;
        let tmpl = CString::new(tmpl).map_err(|_| LlamaError::Invalid("chat template with a NUL byte".into()))?;
        let owned: Vec<(CString, CString)> = messages
            .iter()
            .map(|(r, c)| Ok((CString::new(*r)?, CString::new(*c)?)))
            .collect::<Result<_, std::ffi::NulError>>()
            .map_err(|_| LlamaError::Invalid("a message contains a NUL byte".into()))?;
        let msgs: Vec<sys::llama_chat_message> = owned.iter().map(|(r, c)| sys::llama_chat_message { role: r.as_ptr(), content: c.as_ptr() }).collect();
        // SAFETY: every pointer is NUL-terminated and outlives the call; the buffer and its length are passed together.
        read_string(|b, n| unsafe { sys::llama_chat_apply_template(tmpl.as_ptr(), msgs.as_ptr(), msgs.len(), true, b, n as i32) })
            .ok_or_else(|| LlamaError::Invalid("llama.cpp does not know the model's chat template".into()))
    }

    /// Text to tokens; `add_special` adds BOS and the like as the model
    /// asks; special tokens written in the text are parsed.
    pub fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<Token>, LlamaError> {
        let len = i32::try_from(text.len()).map_err(|_| LlamaError::Tokenize("text too long".into()))?;
        let mut out = vec![0 as Token; text.len() + 8];
        loop {
            // SAFETY: text and out are passed with their lengths.
            let n = unsafe {
                sys::llama_tokenize(self.vocab(), text.as_ptr() as *const c_char, len, out.as_mut_ptr(), out.len() as i32, add_special, true)
            };
            if n >= 0 {
                out.truncate(n as usize);
                return Ok(out);
            }
            if n == i32::MIN {
                return Err(LlamaError::Tokenize("the tokenized text is too long".into()));
            }
            out.resize((-n) as usize, 0);
        }
    }

    /// The bytes of one token (special tokens rendered when `special`).
    pub fn token_bytes(&self, token: Token, special: bool) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        loop {
            // SAFETY: the buffer and its length are passed together.
            let n = unsafe { sys::llama_token_to_piece(self.vocab(), token, buf.as_mut_ptr() as *mut c_char, buf.len() as i32, 0, special) };
            if n >= 0 {
                buf.truncate(n as usize);
                return buf;
            }
            buf.resize((-n) as usize, 0);
        }
    }

    /// Tokens back to text (invalid UTF-8 replaced).
    pub fn detokenize(&self, tokens: &[Token]) -> String {
        let bytes: Vec<u8> = tokens.iter().flat_map(|&t| self.token_bytes(t, false)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Whether a token ends generation (EOS, EOT, ...).
    pub fn is_eog(&self, token: Token) -> bool {
        // SAFETY: the vocabulary lives with the model.
        unsafe { sys::llama_vocab_is_eog(self.vocab(), token) }
    }
}
