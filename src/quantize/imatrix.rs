//! llama.cpp importance matrices (`llama-imatrix` output): per weight
//! tensor, the mean squared activation of each input channel (per expert
//! for expert stacks). Both formats are read: GGUF (`<name>.in_sum2` and
//! `<name>.counts`, the default of the pinned tree) and the legacy `.dat`.

use crate::gguf::GgufFile;
use std::collections::HashMap;
use std::path::Path;

/// Mean squared activations by weight name: `experts * IC` values.
#[derive(Clone, Debug, Default)]
pub struct Imatrix {
    pub entries: HashMap<String, Vec<f32>>,
}

fn err(path: &Path, detail: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("imatrix {}: {detail}", path.display())
}

impl Imatrix {
    /// Reads an imatrix file, GGUF or legacy `.dat` (by its magic).
    ///
    /// # Errors
    /// Fails when the file cannot be read; for a GGUF, when it cannot be
    /// opened or read ([`GgufFile::open`]), an `.in_sum2` has no `.counts` or
    /// sizes that disagree with it, or there is no `.in_sum2` at all; for a
    /// legacy file, when it is truncated or has an implausible entry count,
    /// name length or value count.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| err(path, e))?;
        if bytes.starts_with(b"GGUF") {
            Self::load_gguf(path)
        } else {
            Self::parse_legacy(path, &bytes)
        }
    }

    /// The importance of expert `e` of `name` (`ic` values), if present.
    ///
    /// # Errors
    /// Fails when the entry's length is not a multiple of `ic`, or when it
    /// holds several expert sets and none for `e`.
    pub fn get(&self, name: &str, e: usize, ic: usize) -> anyhow::Result<Option<&[f32]>> {
        let Some(v) = self.entries.get(name) else { return Ok(None) };
        if v.len() % ic != 0 {
            anyhow::bail!("imatrix entry {name} has {} values, not a multiple of IC = {ic}", v.len());
        }
        let n = v.len() / ic;
        // One set for all experts (a dense-collected matrix) is shared.
        Ok(Some(if n == 1 { v } else if e < n { &v[e * ic..(e + 1) * ic] } else {
            anyhow::bail!("imatrix entry {name} has {n} expert sets, expert {e} requested")
        }))
    }

    fn load_gguf(path: &Path) -> anyhow::Result<Self> {
        let f = GgufFile::open(path)?;
        let mut entries = HashMap::new();
        for t in f.tensors() {
            let Some(name) = t.name.strip_suffix(".in_sum2") else { continue };
            let counts_name = format!("{name}.counts");
            let c = f.tensor(&counts_name).ok_or_else(|| err(path, format!("{} has no {counts_name}", t.name)))?;
            let sums = f.read_f32(t)?;
            let counts = f.read_f32(c)?;
            if counts.is_empty() || sums.len() % counts.len() != 0 {
                return Err(err(path, format!("{}: {} sums for {} counts", t.name, sums.len(), counts.len())));
            }
            let ne0 = sums.len() / counts.len();
            // As llama-quantize: divide by each matrix's count; never seen -> 1.
            let v = sums
                .chunks_exact(ne0)
                .zip(&counts)
                .flat_map(|(row, &n)| row.iter().map(move |&s| if n > 0.0 { s / n } else { 1.0 }))
                .collect();
            entries.insert(name.to_string(), v);
        }
        if entries.is_empty() {
            return Err(err(path, "no <name>.in_sum2 tensors (not an imatrix GGUF?)"));
        }
        Ok(Self { entries })
    }

    /// Legacy: i32 count, then per entry i32 name length, name, i32 ncall,
    /// i32 nval, nval f32 (holding mean * ncall).
    fn parse_legacy(path: &Path, b: &[u8]) -> anyhow::Result<Self> {
        let mut r = Cursor { b, pos: 0, path };
        let n = r.i32()?;
        if !(1..=1_000_000).contains(&n) {
            return Err(err(path, format!("entry count {n} (not an imatrix file?)")));
        }
        let mut entries = HashMap::new();
        for _ in 0..n {
            let len = r.i32()?;
            if !(1..=4096).contains(&len) {
                return Err(err(path, format!("bad name length {len}")));
            }
            let name = String::from_utf8_lossy(r.take(len as usize)?).into_owned();
            let ncall = r.i32()?;
            let nval = r.i32()?;
            if nval < 1 {
                return Err(err(path, format!("{name}: {nval} values")));
            }
            let div = if ncall > 0 { ncall as f32 } else { 1.0 };
            let v = r.take(4 * nval as usize)?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) / div).collect();
            entries.insert(name, v);
        }
        Ok(Self { entries })
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> anyhow::Result<&'a [u8]> {
        let s = self.b.get(self.pos..self.pos + n).ok_or_else(|| err(self.path, format!("truncated at byte {}", self.pos)))?;
        self.pos += n;
        Ok(s)
    }
    fn i32(&mut self) -> anyhow::Result<i32> {
        let s = self.take(4)?;
        Ok(i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_roundtrip_and_truncation() {
        let values: Vec<f32> = (0..256).map(|i| 4.0 * i as f32).collect();
        let b = crate::testutil::legacy_imatrix(&[("blk.0.ffn_up.weight", 4, &values)]);
        let p = Path::new("x.dat");
        let m = Imatrix::parse_legacy(p, &b).unwrap();
        let v = m.get("blk.0.ffn_up.weight", 0, 128).unwrap().unwrap();
        assert_eq!((v[0], v[3]), (0.0, 3.0));
        assert_eq!(m.get("blk.0.ffn_up.weight", 1, 128).unwrap().unwrap()[0], 128.0);
        assert!(m.get("blk.0.ffn_up.weight", 2, 128).is_err());
        assert!(m.get("blk.0.ffn_up.weight", 0, 100).is_err());
        let e = Imatrix::parse_legacy(p, &b[..b.len() - 3]).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
    }
}
