//! Compiles `data/verify.yaml` (the verification step's word tables) into Rust constants, so the
//! tables are data a linguist can edit while the binary still holds them as `&'static` slices with
//! no parsing at run time. A malformed file fails the build, never a request.

use serde::Deserialize;
use std::fmt::Write as _;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Pole {
    pair: String,
    pole: char,
    words: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Tables {
    en_negation: Vec<String>,
    zh_not_negation: Vec<(String, String)>,
    zh_negation: Vec<char>,
    en_numbers: Vec<(String, String)>,
    en_dates: Vec<(String, String)>,
    zh_dates: Vec<(String, String)>,
    poles: Vec<Pole>,
    questions: Vec<(String, String)>,
    en_direction: Vec<String>,
    zh_direction: Vec<String>,
    en_synonyms: Vec<(String, String)>,
    en_phrases: Vec<(String, String)>,
    en_stop: Vec<String>,
    zh_phrases: Vec<(String, String)>,
    zh_stop: Vec<String>,
}

fn words(out: &mut String, name: &str, items: &[String]) {
    let _ = writeln!(out, "const {name}: &[&str] = &{items:?};");
}

fn pairs(out: &mut String, name: &str, items: &[(String, String)]) {
    let _ = writeln!(out, "const {name}: &[(&str, &str)] = &[");
    for (a, b) in items {
        let _ = writeln!(out, "    ({a:?}, {b:?}),");
    }
    let _ = writeln!(out, "];");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = "data/verify.yaml";
    println!("cargo:rerun-if-changed={path}");
    let t: Tables = serde_yaml_ng::from_str(&std::fs::read_to_string(path)?)
        .map_err(|e| format!("{path}: {e}"))?;
    let mut out = String::new();
    words(&mut out, "EN_NEGATION", &t.en_negation);
    pairs(&mut out, "ZH_NOT_NEGATION", &t.zh_not_negation);
    let _ = writeln!(out, "const ZH_NEGATION: &[char] = &{:?};", t.zh_negation);
    pairs(&mut out, "EN_NUMBERS", &t.en_numbers);
    pairs(&mut out, "EN_DATES", &t.en_dates);
    pairs(&mut out, "ZH_DATES", &t.zh_dates);
    let _ = writeln!(out, "const POLES: &[(&str, char, &[&str])] = &[");
    for p in &t.poles {
        let _ = writeln!(out, "    ({:?}, {:?}, &{:?}),", p.pair, p.pole, p.words);
    }
    let _ = writeln!(out, "];");
    pairs(&mut out, "QUESTIONS", &t.questions);
    words(&mut out, "EN_DIRECTION", &t.en_direction);
    words(&mut out, "ZH_DIRECTION", &t.zh_direction);
    pairs(&mut out, "EN_SYNONYMS", &t.en_synonyms);
    pairs(&mut out, "EN_PHRASES", &t.en_phrases);
    words(&mut out, "EN_STOP", &t.en_stop);
    pairs(&mut out, "ZH_PHRASES", &t.zh_phrases);
    words(&mut out, "ZH_STOP", &t.zh_stop);
    let dir = std::env::var("OUT_DIR")?;
    std::fs::write(format!("{dir}/verify_tables.rs"), out)?;
    Ok(())
}
