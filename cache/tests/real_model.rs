//! The real embedding model (all-MiniLM-L6-v2 from the PyPI packages `scripts/bootstrap`
//! installs, run by ONNX Runtime from PyPI `onnxruntime`): loads it and embeds text.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use switchyard_cache::embed::{self, Embed, EmbedError, FastEmbedder, ModelPaths, cosine};

fn model() -> FastEmbedder {
    let paths = ModelPaths::locate().unwrap_or_else(|e| panic!("{e}"));
    FastEmbedder::load(&paths, 1).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn embeds_text_with_the_real_model() {
    let paths = ModelPaths::locate().unwrap();
    let bytes = std::fs::read(&paths.model).unwrap();
    use sha2::Digest;
    let digest: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        digest,
        embed::MODEL_SHA256,
        "unexpected model file {}",
        paths.model.display()
    );
    let m = model();
    assert_eq!(m.dims(), 384);
    let texts = [
        "How do I reset my password?",
        "How can I change my password if I forgot it?",
        "What is the boiling point of water?",
        "Hello world",
        "What is 1+1?",
    ];
    let v = m.embed(&texts).unwrap();
    assert_eq!(v.len(), 5);
    for x in &v {
        let norm: f32 = x.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-3, "not unit length: {norm}");
    }
    let para = cosine(&v[0], &v[1]);
    let unrelated = cosine(&v[0], &v[2]);
    let fc25 = cosine(&v[3], &v[4]);
    eprintln!("paraphrase {para:.3}, unrelated {unrelated:.3}, hello/1+1 {fc25:.3}");
    assert!(para > 0.6, "paraphrase similarity {para}");
    assert!(unrelated < 0.3, "unrelated similarity {unrelated}");
    // FC-25: similarity, not distance: unrelated texts are far below 0.8.
    assert!(fc25 < 0.5, "hello/1+1 similarity {fc25}");
    // Deterministic.
    assert_eq!(m.embed(&[texts[0]]).unwrap()[0], v[0]);
}

#[test]
fn a_missing_runtime_is_an_error_not_a_panic() {
    let mut paths = ModelPaths::locate().unwrap();
    paths.ort_lib = PathBuf::from("/nonexistent/libonnxruntime.so");
    match FastEmbedder::load(&paths, 1) {
        Err(EmbedError::Missing { what, path }) => {
            assert_eq!(what, "ONNX Runtime library");
            assert!(path.contains("/nonexistent/"));
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("loaded without a runtime"),
    }
    let mut paths = ModelPaths::locate().unwrap();
    paths.model = PathBuf::from("/nonexistent/model.onnx");
    assert!(matches!(
        FastEmbedder::load(&paths, 1),
        Err(EmbedError::Missing { .. })
    ));
}

#[test]
fn the_int8_table_rewrite_changes_no_embedding() {
    // Every text of both eval sets, bit for bit, with and without the graph rewrite.
    let paths = ModelPaths::locate().unwrap();
    let onnx = std::fs::read(&paths.model).unwrap();
    assert!(
        switchyard_cache::onnx_rows::gather_rows_first(&onnx).is_some(),
        "the default model has an int8 word-embedding table"
    );
    let rewritten = model();
    let shipped = FastEmbedder::load_as_shipped(&paths, 1, embed::DEFAULT_WINDOW).unwrap();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/data/");
    let mut texts = Vec::new();
    for file in ["pairs.jsonl", "pairs_holdout.jsonl"] {
        for line in std::fs::read_to_string(format!("{root}{file}"))
            .unwrap()
            .lines()
        {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            for k in ["a", "b"] {
                if let Some(t) = v[k].as_str() {
                    texts.push(t.to_owned());
                }
            }
        }
    }
    assert!(texts.len() > 100, "{} texts", texts.len());
    for t in &texts {
        let a = rewritten.embed(&[t.as_str()]).unwrap();
        let b = shipped.embed(&[t.as_str()]).unwrap();
        assert_eq!(a, b, "{t}");
    }
    let long = "why ".repeat(300);
    assert_eq!(
        rewritten.embed(&[long.as_str(), "x"]).unwrap(),
        shipped.embed(&[long.as_str(), "x"]).unwrap()
    );
}
