//! Raw bindings to the patched libllama (bindgen over `llama.h`, feature
//! `llama`), wrapped safely by [`crate::llama`]. Generated at build time
//! from the pinned tree.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/llama_sys.rs"));
