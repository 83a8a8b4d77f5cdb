//! Every validation error of the shape and checkpoint-leaf contract.

use escha_ggml::validate::{validate_leaves, Leaf, LeafDtype};
use escha_ggml::{EschaError, LinearShape, MoeShape};
use std::collections::BTreeMap;

#[test]
fn k_comes_from_the_last_dim() {
    assert_eq!(LinearShape::from_code_dims("c", &[16, 8, 32]).unwrap(), LinearShape { k: 2, ic: 256, oc: 128 });
    assert_eq!(LinearShape::from_code_dims("c", &[8, 16, 48]).unwrap().k, 3);
    assert!(matches!(LinearShape::from_code_dims("c", &[8, 8, 64]), Err(EschaError::BadK { k: 4, .. })));
    assert!(matches!(LinearShape::from_code_dims("c", &[8, 8, 16]), Err(EschaError::BadK { k: 1, .. })));
    assert!(matches!(LinearShape::from_code_dims("c", &[8, 8, 40]), Err(EschaError::BadLastDim { last_dim: 40, .. })));
    let e = LinearShape::from_code_dims("blk.0.ffn_up.escha_code", &[8, 8, 64]).unwrap_err();
    assert!(e.to_string().contains("blk.0.ffn_up.escha_code") && e.to_string().contains("K"), "{e}");
}

#[test]
fn dims_must_be_multiples_of_128() {
    assert!(matches!(LinearShape::from_code_dims("c", &[12, 8, 32]), Err(EschaError::NotMultipleOf128 { what: "IC", value: 192, .. })));
    assert!(matches!(LinearShape::from_code_dims("c", &[8, 4, 32]), Err(EschaError::NotMultipleOf128 { what: "OC", value: 64, .. })));
    assert!(matches!(LinearShape::new("c", 2, 128, 100), Err(EschaError::NotMultipleOf128 { what: "OC", .. })));
    assert!(matches!(LinearShape::from_code_dims("c", &[8, 32]), Err(EschaError::Shape { .. })));
    assert!(matches!(MoeShape::from_code_dims("c", &[0, 8, 8, 32]), Err(EschaError::Shape { .. })));
    assert_eq!(MoeShape::from_code_dims("c", &[4, 8, 16, 48]).unwrap(), MoeShape { k: 3, e: 4, ic: 128, oc: 256 });
}

fn leaf(dtype: LeafDtype, shape: &[i64]) -> Leaf {
    Leaf { dtype, shape: shape.to_vec(), ints: None }
}

fn dense_leaves() -> BTreeMap<String, Leaf> {
    let mut m = BTreeMap::new();
    m.insert("escha_code".into(), leaf(LeafDtype::I16, &[16, 8, 32]));
    m.insert("escha_rin".into(), leaf(LeafDtype::F16, &[256]));
    m.insert("escha_rout".into(), leaf(LeafDtype::F16, &[128]));
    m.insert("escha_s_in".into(), leaf(LeafDtype::F32, &[256]));
    m.insert("escha_s_out".into(), leaf(LeafDtype::F32, &[128]));
    m.insert("bias".into(), leaf(LeafDtype::F16, &[128]));
    m.insert("escha_config".into(), Leaf { dtype: LeafDtype::I32, shape: vec![6], ints: Some(vec![16, 2, 2, 1, 256, 128]) });
    m
}

const P: &str = "model.layers.3.mlp.up_proj";

#[test]
fn a_complete_dense_linear_validates() {
    let v = validate_leaves(P, &dense_leaves()).unwrap();
    assert_eq!(v.shape, LinearShape { k: 2, ic: 256, oc: 128 });
    assert!(v.has_s_in && v.has_s_out && v.has_bias && v.experts.is_none());
}

#[test]
fn missing_required_leaf() {
    for req in ["escha_code", "escha_rin", "escha_rout"] {
        let mut m = dense_leaves();
        m.remove(req);
        match validate_leaves(P, &m) {
            Err(e @ EschaError::MissingLeaf { .. }) => {
                assert!(e.to_string().contains(P) && e.to_string().contains(req), "{e}")
            }
            other => panic!("{req}: {other:?}"),
        }
    }
    // Optional leaves may be absent.
    let mut m = dense_leaves();
    for opt in ["escha_s_in", "escha_s_out", "bias", "escha_config"] {
        m.remove(opt);
    }
    assert!(!validate_leaves(P, &m).unwrap().has_bias);
}

#[test]
fn unknown_escha_leaf() {
    let mut m = dense_leaves();
    m.insert("escha_rot_seed".into(), leaf(LeafDtype::I32, &[1]));
    match validate_leaves(P, &m) {
        Err(EschaError::UnknownLeaf { leaf, .. }) => assert_eq!(leaf, "escha_rot_seed"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn sidecar_lengths() {
    for (name, bad) in [("escha_rin", 255i64), ("escha_rout", 256), ("escha_s_in", 128), ("escha_s_out", 127), ("bias", 129)] {
        let mut m = dense_leaves();
        let dt = m[name].dtype;
        m.insert(name.into(), leaf(dt, &[bad]));
        match validate_leaves(P, &m) {
            Err(e @ EschaError::BadLength { .. }) => assert!(e.to_string().contains(name), "{e}"),
            other => panic!("{name}: {other:?}"),
        }
    }
    let mut m = dense_leaves();
    m.insert("escha_rin".into(), leaf(LeafDtype::F32, &[256]));
    assert!(matches!(validate_leaves(P, &m), Err(EschaError::Shape { .. })));
}

#[test]
fn config_disagreement_and_codebook() {
    let cases: [(&[i64], &str); 6] = [
        (&[16, 3, 2, 1, 256, 128], "K=3"),
        (&[16, 2, 2, 1, 128, 256], "in/out"),
        (&[8, 2, 2, 1, 256, 128], "tile"),
        (&[16, 2, 2, 1, 256], "entries"),
        (&[16, 2, 3, 1, 256, 128], "entry 2"),
        (&[16, 2, 2, 2, 256, 128], "codebook"),
    ];
    for (cfg, what) in cases {
        let mut m = dense_leaves();
        m.insert("escha_config".into(), Leaf { dtype: LeafDtype::I32, shape: vec![cfg.len() as i64], ints: Some(cfg.to_vec()) });
        let e = validate_leaves(P, &m).unwrap_err();
        if what == "codebook" {
            assert!(matches!(e, EschaError::BadCodebook { id: 2, .. }), "{e}");
        } else {
            assert!(matches!(e, EschaError::ConfigDisagrees { .. }), "{what}: {e}");
            assert!(e.to_string().contains("disagrees"), "{e}");
        }
    }
}

#[test]
fn moe_leaves_and_config() {
    let mut m = BTreeMap::new();
    m.insert("escha_code".to_string(), leaf(LeafDtype::I16, &[4, 8, 16, 32]));
    m.insert("escha_rin".into(), leaf(LeafDtype::F16, &[4, 128]));
    m.insert("escha_rout".into(), leaf(LeafDtype::F16, &[4, 256]));
    m.insert("escha_config".into(), Leaf { dtype: LeafDtype::I32, shape: vec![9], ints: Some(vec![16, 2, 2, 1, 4, 128, 256, 128, 256]) });
    let v = validate_leaves("model.layers.0.mlp.experts.gate_up_proj", &m).unwrap();
    assert_eq!(v.experts, Some(4));
    for (i, bad) in [(4usize, 5i64), (7, 256), (8, 128)] {
        let mut c = m.clone();
        let mut ints = vec![16, 2, 2, 1, 4, 128, 256, 128, 256];
        ints[i] = bad;
        c.insert("escha_config".into(), Leaf { dtype: LeafDtype::I32, shape: vec![9], ints: Some(ints) });
        assert!(matches!(validate_leaves("x", &c), Err(EschaError::ConfigDisagrees { .. })), "entry {i}");
    }
    let mut c = m.clone();
    c.insert("escha_rout".into(), leaf(LeafDtype::F16, &[3, 256]));
    assert!(validate_leaves("x", &c).is_err());
}
