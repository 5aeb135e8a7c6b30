//! Measures the process memory the embedding model costs: RSS (anonymous and file-backed, from
//! `/proc/self/status`) before and after each loading step, and after embedding a batch of texts.
//!
//! `cargo run --release -p switchyard-cache --example embed_mem` loads the model as the cache
//! does. `EMBED_MEM_DIRECT=1` builds the ONNX Runtime session by hand instead, with the options
//! from `EMBED_MEM_ARENA` (0/1), `EMBED_MEM_PATTERN` (0/1), `EMBED_MEM_OPT` (0–3),
//! `EMBED_MEM_PREPACK` (0/1) and `EMBED_MEM_THREADS`, to try one option at a time;
//! `EMBED_MEM_SHIPPED=1` loads the graph without the [`switchyard_cache::onnx_rows`] rewrite.

use std::error::Error;
use switchyard_cache::embed::{Embed, FastEmbedder, ModelPaths, load_runtime};

fn status() -> String {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let get = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            / 1024
    };
    format!(
        "rss {:>4} MB (anon {:>4}, file {:>3}), threads {}",
        get("VmRSS:"),
        get("RssAnon:"),
        get("RssFile:"),
        s.lines()
            .find(|l| l.starts_with("Threads:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("?")
    )
}

fn flag(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn direct(paths: &ModelPaths) -> Result<(), Box<dyn Error>> {
    use ort::session::{Session, builder::GraphOptimizationLevel};
    load_runtime(&paths.ort_lib)?;
    eprintln!("runtime loaded:   {}", status());
    let onnx = std::fs::read(&paths.model)?;
    let level = match flag("EMBED_MEM_OPT", "3").as_str() {
        "0" => GraphOptimizationLevel::Disable,
        "1" => GraphOptimizationLevel::Level1,
        "2" => GraphOptimizationLevel::Level2,
        _ => GraphOptimizationLevel::Level3,
    };
    let arena = flag("EMBED_MEM_ARENA", "1") == "1";
    let env = ort::init().build()?;
    let mut session = Session::builder(&env)?
        .with_execution_providers([ort::ep::CPU::default().with_arena_allocator(arena).build()])?
        .with_optimization_level(level)?
        .with_intra_threads(flag("EMBED_MEM_THREADS", "1").parse()?)?
        .with_memory_pattern(flag("EMBED_MEM_PATTERN", "1") == "1")?
        .with_prepacking(flag("EMBED_MEM_PREPACK", "1") == "1")?
        .commit_from_memory(&onnx)?;
    drop(onnx);
    eprintln!("session:          {}", status());
    for len in [16usize, 16, 64, 16] {
        let ids = ort::value::Tensor::from_array(([1usize, len], vec![101i64; len]))?;
        let mask = ort::value::Tensor::from_array(([1usize, len], vec![1i64; len]))?;
        let types = ort::value::Tensor::from_array(([1usize, len], vec![0i64; len]))?;
        let out = session.run(ort::inputs![
            "input_ids" => ids,
            "attention_mask" => mask,
            "token_type_ids" => types,
        ])?;
        drop(out);
        eprintln!("run len {len:>3}:      {}", status());
    }
    Ok(())
}

/// Loads the model and prints the memory after each step.
pub(crate) fn main() -> Result<(), Box<dyn Error>> {
    eprintln!("start:            {}", status());
    let paths = ModelPaths::locate()?;
    if std::env::var("EMBED_MEM_DIRECT").is_ok_and(|v| v == "1") {
        return direct(&paths);
    }
    let model = if std::env::var("EMBED_MEM_SHIPPED").is_ok_and(|v| v == "1") {
        FastEmbedder::load_as_shipped(&paths, 1, switchyard_cache::embed::DEFAULT_WINDOW)?
    } else {
        FastEmbedder::load(&paths, 1)?
    };
    eprintln!("loaded + probe:   {}", status());
    let texts: Vec<String> = (0..200)
        .map(|i| format!("How do I reset the password of account number {i} on the web site?"))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let mut sum = 0f64;
    for chunk in refs.chunks(1) {
        for v in model.embed(chunk)? {
            sum += v.iter().map(|x| f64::from(*x)).sum::<f64>();
        }
    }
    eprintln!("200 embeds:       {} (checksum {sum:.6})", status());
    Ok(())
}
