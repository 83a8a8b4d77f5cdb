//! Small GGUF and safetensors files written for tests.
#![allow(dead_code)]

use escha_ggml::gguf::{GgmlType, GgufWriter};
use half::f16;

/// A source tensor: name, type, ne, bytes.
pub struct Src {
    pub name: &'static str,
    pub ty: GgmlType,
    pub ne: Vec<i64>,
    pub bytes: Vec<u8>,
}

pub fn f16_tensor(name: &'static str, ne: &[i64], v: &[f32]) -> Src {
    let b = v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect();
    Src { name, ty: GgmlType::GGML_TYPE_F16, ne: ne.to_vec(), bytes: b }
}

pub fn f32_tensor(name: &'static str, ne: &[i64], v: &[f32]) -> Src {
    Src { name, ty: GgmlType::GGML_TYPE_F32, ne: ne.to_vec(), bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect() }
}

pub fn write_gguf(path: &str, tensors: &[Src]) {
    write_gguf_with(path, &[("llama.block_count", 1)], tensors)
}

/// A `llama` GGUF with these u32 keys.
pub fn write_gguf_with(path: &str, keys: &[(&str, u32)], tensors: &[Src]) {
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", "llama");
    w.set_str("general.name", "escha-quantize-test");
    for (k, v) in keys {
        w.set_u32(k, *v);
    }
    for t in tensors {
        w.add_tensor(t.name, t.ty, &t.ne).unwrap();
    }
    let mut s = w.create(path).unwrap();
    for t in tensors {
        s.write_tensor(t.name, &t.bytes).unwrap();
    }
    s.finish().unwrap();
}

/// A safetensors file written by hand (independent of the crate's writer).
pub fn write_safetensors(path: &std::path::Path, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) {
    let mut header = String::from("{");
    let mut off = 0;
    for (i, (name, dtype, shape, bytes)) in tensors.iter().enumerate() {
        let sep = if i > 0 { "," } else { "" };
        header += &format!("{sep}\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[{off},{}]}}", off + bytes.len());
        off += bytes.len();
    }
    header += "}";
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend(header.as_bytes());
    for t in tensors {
        f.extend(&t.3);
    }
    std::fs::write(path, f).unwrap();
}

