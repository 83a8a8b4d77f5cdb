//! Where llama.cpp's log goes, and the error lines kept for messages.

use crate::ffi::llama_sys as sys;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Mutex;

/// A destination for llama.cpp's log lines (level, text).
pub enum LogSink {
    /// Nothing printed (errors are still kept for [`super::LlamaError`]).
    Silent,
    /// Everything to stderr, as llama.cpp's tools print it.
    Stderr,
    /// A callback (called from any thread llama.cpp logs on).
    Callback(Box<dyn Fn(Level, &str) + Send + Sync>),
}

/// llama.cpp's log levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

struct State {
    sink: LogSink,
    errors: Vec<String>,
    last: Option<Level>,
}

static STATE: Mutex<State> = Mutex::new(State { sink: LogSink::Silent, errors: Vec::new(), last: None });

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn set_sink(sink: LogSink) {
    state().sink = sink;
}

pub(super) fn install() {
    // SAFETY: `on_log` is a plain function with the callback's signature that
    // never unwinds (it only appends to a mutex-guarded buffer); user_data is
    // unused.
    unsafe { sys::llama_log_set(Some(on_log), std::ptr::null_mut()) };
}

/// Forgets the error lines so far (before a call whose failure should
/// report only its own).
pub(super) fn clear_errors() {
    state().errors.clear();
}

/// The error lines since [`clear_errors`], joined; `fallback` if none.
pub(super) fn errors_or(fallback: &str) -> String {
    let s = state();
    if s.errors.is_empty() {
        fallback.to_string()
    } else {
        s.errors.join("; ")
    }
}

/// llama.cpp's log callback.
///
/// # Safety
/// Called by llama.cpp only: `text` is NULL or a NUL-terminated string valid
/// for the call; `_user` is unused.
unsafe extern "C" fn on_log(level: sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for this call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let level = match level {
        sys::ggml_log_level_GGML_LOG_LEVEL_ERROR => Some(Level::Error),
        sys::ggml_log_level_GGML_LOG_LEVEL_WARN => Some(Level::Warn),
        sys::ggml_log_level_GGML_LOG_LEVEL_INFO => Some(Level::Info),
        sys::ggml_log_level_GGML_LOG_LEVEL_DEBUG => Some(Level::Debug),
        _ => None, // CONT (continues the previous line) or NONE
    };
    // A panic must not cross into C: catch it and drop the line.
    let _ = std::panic::catch_unwind(|| {
        let mut s = state();
        let s = &mut *s;
        // CONT continues the previous line's level.
        let effective = level.or(s.last);
        s.last = effective;
        if effective == Some(Level::Error) {
            match (level, s.errors.last_mut()) {
                (None, Some(e)) => e.push_str(text.trim_end()),
                _ => {
                    if s.errors.len() >= 64 {
                        s.errors.remove(0); // only the latest matter for a message
                    }
                    s.errors.push(text.trim().to_string())
                }
            }
        }
        match &s.sink {
            LogSink::Silent => {}
            LogSink::Stderr => eprint!("{text}"),
            LogSink::Callback(f) => f(effective.unwrap_or(Level::Info), text.trim_end()),
        }
    });
}
