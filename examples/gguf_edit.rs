//! Writes a modified copy of a GGUF through ggml's GGUF API, for checking
//! how loaders react to incomplete or inconsistent files.
//!
//! ```sh
//! cargo run --release --example gguf_edit -- IN.gguf OUT.gguf \
//!     [--drop NAME]... [--resize NAME NE0,NE1,..]... [--add NAME TYPE NE0,..]...
//!     [--set NAME INDEX VALUE]...
//! ```
//! `--resize` replaces a tensor by zeros of the same type and a new shape;
//! `--add` appends a zero tensor (`TYPE`: f32, f16 or i16); `--set` writes
//! one element of an f32 / f16 tensor, added ones too (`nan` and `inf` parse).
use escha_ggml::gguf::{row_bytes, GgmlType, GgufFile, GgufWriter};

fn shape(s: &str) -> Vec<i64> {
    s.split(',').map(|d| d.parse().expect("shape: comma-separated integers")).collect()
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(args.len() >= 2, "usage: gguf_edit IN.gguf OUT.gguf [--drop NAME] [--resize NAME NE] [--add NAME TYPE NE]");
    let src = GgufFile::open(&args[0])?;
    let (mut drop, mut resize, mut add, mut set) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut i = 2;
    while i < args.len() {
        match args[i].as_str() {
            "--drop" => (drop.push(args[i + 1].clone()), i += 2).1,
            "--resize" => (resize.push((args[i + 1].clone(), shape(&args[i + 2]))), i += 3).1,
            "--add" => {
                let ty = match args[i + 2].as_str() {
                    "f32" => GgmlType::GGML_TYPE_F32,
                    "f16" => GgmlType::GGML_TYPE_F16,
                    "i16" => GgmlType::GGML_TYPE_I16,
                    t => anyhow::bail!("--add: unknown type {t}"),
                };
                add.push((args[i + 1].clone(), ty, shape(&args[i + 3])));
                i += 4;
            }
            "--set" => {
                let idx: usize = args[i + 2].parse()?;
                let v: f32 = args[i + 3].parse()?;
                set.push((args[i + 1].clone(), idx, v));
                i += 4;
            }
            a => anyhow::bail!("unknown argument {a}"),
        }
    }
    for n in drop.iter().chain(resize.iter().map(|r| &r.0)) {
        anyhow::ensure!(src.tensor(n).is_some(), "{n}: no such tensor");
    }
    let mut w = GgufWriter::new();
    w.copy_kv(&src);
    let mut plan = Vec::new(); // (name, type, None = copy | Some(bytes of zeros))
    for t in src.tensors().iter().filter(|t| !drop.contains(&t.name)) {
        if let Some((_, ne)) = resize.iter().find(|r| r.0 == t.name) {
            w.add_tensor(&t.name, t.ty, ne)?;
            let n = row_bytes(t.ty, ne[0]).expect("whole blocks") * ne[1..].iter().product::<i64>() as usize;
            plan.push((t.name.clone(), t.ty, Some(vec![0u8; n])));
        } else {
            w.add_tensor(&t.name, t.ty, &t.ne[..t.n_dims()])?;
            plan.push((t.name.clone(), t.ty, None));
        }
    }
    for (name, ty, ne) in &add {
        w.add_tensor(name, *ty, ne)?;
        let n = row_bytes(*ty, ne[0]).expect("whole blocks") * ne[1..].iter().product::<i64>() as usize;
        plan.push((name.clone(), *ty, Some(vec![0u8; n])));
    }
    let mut out = w.create(&args[1])?;
    for (name, ty, zeros) in plan {
        let mut bytes = match zeros {
            Some(z) => z,
            None => src.read(src.tensor(&name).unwrap())?,
        };
        for (_, idx, v) in set.iter().filter(|s| s.0 == name) {
            match ty {
                GgmlType::GGML_TYPE_F32 => bytes[4 * idx..4 * idx + 4].copy_from_slice(&v.to_le_bytes()),
                GgmlType::GGML_TYPE_F16 => bytes[2 * idx..2 * idx + 2].copy_from_slice(&half::f16::from_f32(*v).to_le_bytes()),
                _ => anyhow::bail!("--set: {name} is not f32 or f16"),
            }
        }
        out.write_tensor(&name, &bytes)?
    }
    out.finish()?;
    Ok(())
}
