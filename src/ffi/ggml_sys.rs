//! Raw bindings to the patched ggml (bindgen, limited to what
//! [`crate::ggml`] uses). Generated at build time from the pinned tree.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/ggml_sys.rs"));
