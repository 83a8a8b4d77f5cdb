//! Which tensors are coded, with which K, and why others are not.
//!
//! Patterns are globs over the full tensor name (`*` any run, `?` one
//! character). A tensor is a candidate when it is a 2-D projection
//! `[OC, IC]` or a 3-D expert stack `[E, OC, IC]` named `*.weight`; 1-D
//! tensors (norms, biases) are always copied. A candidate matching an
//! exclude pattern is copied; else the first matching `--k3` pattern gives
//! K=3, else a matching `--k2` pattern K=2, else it is copied. A matched
//! candidate whose dims are not multiples of 128 is copied and reported.
//!
//! Towers (the MTP head: HF `mtp.*`, a GGUF's nextn blocks) are shipped
//! uncoded by the export: a tensor under a tower's name prefix is coded
//! only by a `--k2`/`--k3` pattern that itself starts with that prefix
//! (`--k2 'mtp.*_proj.weight'`, `--k2 'blk.64.*'`), never by the default
//! mix or a pattern for the trunk.

/// K=3 by default: the up and down projections, as in the published 27B
/// export (the rest is K=2).
pub const DEFAULT_K3: &[&str] = &["blk.*.ffn_up*.weight", "blk.*.ffn_down*.weight"];
/// K=2 by default: every other projection in a block.
pub const DEFAULT_K2: &[&str] = &["blk.*.attn_*.weight", "blk.*.ffn_*.weight", "blk.*.ssm_out.weight"];
/// Never coded by default: MoE routers stay exact.
pub const DEFAULT_EXCLUDE: &[&str] = &["*.ffn_gate_inp*"];

/// The same mix for HF checkpoint names (`model.layers.N.mlp.up_proj.weight`,
/// fused experts `mlp.experts.gate_up_proj` / `down_proj` as `[E, OC, IC]`).
pub const HF_K3: &[&str] = &["*layers.*.up_proj.weight", "*layers.*.down_proj.weight", "*layers.*.experts.down_proj", "*layers.*.experts.up_proj"];
pub const HF_K2: &[&str] = &["*layers.*_proj.weight", "*layers.*.in_proj_*.weight", "*layers.*.experts.gate_up_proj", "*layers.*.experts.gate_proj"];
/// Routers, gates and vision towers are not coded.
pub const HF_EXCLUDE: &[&str] = &["*.mlp.gate.weight", "*shared_expert_gate*", "*visual*"];
/// The MTP head of an HF checkpoint (in its main shards or its `mtp/` folder).
pub const HF_MTP_TOWER: &str = "mtp.";

/// `*` / `?` glob match.
pub fn glob(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// The K selection rules.
#[derive(Clone, Debug)]
pub struct Rules {
    pub k3: Vec<String>,
    pub k2: Vec<String>,
    pub exclude: Vec<String>,
    /// Name prefixes of towers: coded only by patterns starting with the prefix.
    pub towers: Vec<String>,
}

impl Default for Rules {
    fn default() -> Self {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        Self { k3: own(DEFAULT_K3), k2: own(DEFAULT_K2), exclude: own(DEFAULT_EXCLUDE), towers: Vec::new() }
    }
}

impl Rules {
    /// The default mix for HF checkpoint names.
    pub fn hf() -> Self {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        Self { k3: own(HF_K3), k2: own(HF_K2), exclude: own(HF_EXCLUDE), towers: vec![HF_MTP_TOWER.to_string()] }
    }

    /// The GGUF blocks `first..first + n` as towers (a GGUF's nextn layers:
    /// `blk.N.` for N from `block_count - nextn_predict_layers`).
    pub fn with_gguf_towers(mut self, first: u32, n: u32) -> Self {
        self.towers.extend((first..first + n).map(|b| format!("blk.{b}.")));
        self
    }

    /// User patterns replace the default K lists of `base` (given either
    /// list, only the given patterns code anything); excludes add to it.
    pub fn with_args(base: Self, k2: Vec<String>, k3: Vec<String>, exclude: Vec<String>) -> Self {
        let mut r = base;
        if !k2.is_empty() || !k3.is_empty() {
            r.k2 = k2;
            r.k3 = k3;
        }
        r.exclude.extend(exclude);
        r
    }

    /// K for a tensor name, or None when no rule codes it.
    pub fn k_for(&self, name: &str) -> Option<usize> {
        let tower = self.towers.iter().find(|t| name.starts_with(t.as_str()));
        // Under a tower, only a pattern naming the tower counts.
        let codes = |p: &String| tower.is_none_or(|t| p.starts_with(t.as_str())) && glob(p, name);
        if self.exclude.iter().any(|p| glob(p, name)) {
            None
        } else if self.k3.iter().any(codes) {
            Some(3)
        } else if self.k2.iter().any(codes) {
            Some(2)
        } else {
            None
        }
    }
}

/// What happens to one tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Copied byte for byte.
    Copy,
    /// Coded with K bits: `ic`, `oc`, and `experts` (1 for a dense weight).
    Code { k: usize, ic: usize, oc: usize, experts: usize },
    /// Matched by a rule but not codable; copied, and reported with the reason.
    Skip(String),
}

/// Whether a tensor could be a coded weight at all: a 2-D `*.weight` or a
/// 3-D expert stack.
pub fn is_candidate(name: &str, n_dims: usize) -> bool {
    n_dims == 3 || (n_dims == 2 && name.ends_with(".weight"))
}

/// Decides the action for a tensor of ggml shape `ne` (`ne[0]` = IC).
pub fn action(rules: &Rules, name: &str, ne: &[i64; 4], n_dims: usize) -> Action {
    if !is_candidate(name, n_dims) {
        return Action::Copy;
    }
    let Some(k) = rules.k_for(name) else { return Action::Copy };
    let (ic, oc, e) = (ne[0], ne[1], ne[2]);
    let bad: Vec<String> = [("IC (ne[0])", ic), ("OC (ne[1])", oc)]
        .iter()
        .filter(|(_, v)| v % 128 != 0)
        .map(|(w, v)| format!("{w} = {v}"))
        .collect();
    if !bad.is_empty() {
        return Action::Skip(format!("{} not a multiple of 128", bad.join(", ")));
    }
    Action::Code { k, ic: ic as usize, oc: oc as usize, experts: e as usize }
}

/// The stem of a coded weight (`blk.0.attn_q.weight` -> `blk.0.attn_q`).
pub fn stem(name: &str) -> &str {
    name.strip_suffix(".weight").unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("blk.*.ffn_up*.weight", "blk.12.ffn_up.weight"));
        assert!(glob("blk.*.ffn_up*.weight", "blk.3.ffn_up_exps.weight"));
        assert!(!glob("blk.*.ffn_up*.weight", "blk.3.ffn_gate_up_exps.weight"));
        assert!(glob("*", ""));
        assert!(glob("a?c", "abc") && !glob("a?c", "ac"));
        assert!(!glob("blk.*", "token_embd.weight"));
    }

    #[test]
    fn default_mix_and_skips() {
        let r = Rules::default();
        let two = |ic, oc| [ic, oc, 1, 1];
        assert_eq!(action(&r, "blk.0.ffn_up.weight", &two(640, 2048), 2), Action::Code { k: 3, ic: 640, oc: 2048, experts: 1 });
        assert_eq!(action(&r, "blk.0.ffn_down.weight", &two(2048, 640), 2), Action::Code { k: 3, ic: 2048, oc: 640, experts: 1 });
        assert_eq!(action(&r, "blk.0.attn_q.weight", &two(640, 1024), 2), Action::Code { k: 2, ic: 640, oc: 1024, experts: 1 });
        assert_eq!(action(&r, "blk.0.ffn_gate_up_exps.weight", &[2048, 1024, 8, 1], 3), Action::Code { k: 2, ic: 2048, oc: 1024, experts: 8 });
        assert_eq!(action(&r, "blk.0.ffn_gate_inp.weight", &two(2048, 256), 2), Action::Copy);
        assert_eq!(action(&r, "blk.0.attn_norm.weight", &[640, 1, 1, 1], 1), Action::Copy);
        assert_eq!(action(&r, "token_embd.weight", &two(640, 262144), 2), Action::Copy);
        assert!(matches!(action(&r, "blk.0.attn_k.weight", &two(576, 192), 2), Action::Skip(s) if s.contains("576") && s.contains("192")));
        let h = Rules::hf();
        assert_eq!(h.k_for("model.layers.3.mlp.down_proj.weight"), Some(3));
        assert_eq!(h.k_for("model.language_model.layers.3.linear_attn.in_proj_qkv.weight"), Some(2));
        assert_eq!(h.k_for("model.layers.0.mlp.experts.gate_up_proj"), Some(2));
        assert_eq!(h.k_for("model.layers.0.linear_attn.in_proj_z.weight"), Some(2));
        assert_eq!(h.k_for("model.layers.0.mlp.gate.weight"), None);
        assert_eq!(h.k_for("model.embed_tokens.weight"), None);
        let all2 = Rules::with_args(Rules::default(), vec!["*".into()], vec![], vec!["blk.1.*".into()]);
        assert_eq!(all2.k_for("blk.0.ffn_up.weight"), Some(2));
        assert_eq!(all2.k_for("blk.1.ffn_up.weight"), None);
        assert_eq!(all2.k_for("blk.0.ffn_gate_inp.weight"), None);
    }

    #[test]
    fn towers_only_by_patterns_that_name_them() {
        // The MTP head is uncoded by default, though the default K patterns match its names.
        let h = Rules::hf();
        assert!(glob(HF_K2[0], "mtp.layers.0.self_attn.q_proj.weight"), "the default K=2 pattern matches the MTP names");
        assert_eq!(h.k_for("mtp.layers.0.self_attn.q_proj.weight"), None);
        assert_eq!(h.k_for("mtp.layers.0.mlp.up_proj.weight"), None);
        assert_eq!(h.k_for("mtp.fc.weight"), None);
        // A trunk pattern does not reach it; one starting with the tower's prefix does.
        let trunk = Rules::with_args(Rules::hf(), vec!["*_proj.weight".into()], vec![], vec![]);
        assert_eq!(trunk.k_for("model.layers.1.mlp.up_proj.weight"), Some(2));
        assert_eq!(trunk.k_for("mtp.layers.0.mlp.up_proj.weight"), None);
        let mtp = Rules::with_args(Rules::hf(), vec!["mtp.*_proj.weight".into(), "*layers.*_proj.weight".into()], vec![], vec![]);
        assert_eq!(mtp.k_for("mtp.layers.0.mlp.up_proj.weight"), Some(2));
        assert_eq!(mtp.k_for("mtp.fc.weight"), None);
        assert_eq!(mtp.k_for("model.layers.1.mlp.up_proj.weight"), Some(2));
        // A GGUF's nextn block (blk.4 of 5 with one nextn layer), and blk.40 is not blk.4.
        let g = Rules::default().with_gguf_towers(4, 1);
        assert_eq!(g.k_for("blk.4.attn_q.weight"), None);
        assert_eq!(g.k_for("blk.40.attn_q.weight"), Some(2));
        assert_eq!(g.k_for("blk.3.ffn_up.weight"), Some(3));
        let g = Rules::with_args(Rules::default(), vec!["blk.4.*".into()], vec![], vec![]).with_gguf_towers(4, 1);
        assert_eq!(g.k_for("blk.4.attn_q.weight"), Some(2));
    }
}
