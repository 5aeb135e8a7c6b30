//! `switchyard pricing import FILE`: reads a price list in LiteLLM's
//! `model_prices_and_context_window.json` shape (offline, from a file) into a [`Catalog`], and
//! writes a catalog as YAML ([`to_yaml`]).
//!
//! LiteLLM's shape is one JSON object keyed by model id; each entry has per-**token** USD prices
//! (floats such as `3e-06`) and a `mode`. Read here (LiteLLM docs, "Add a model to the model cost
//! map", and the keys of the file itself):
//!
//! | LiteLLM key | card field |
//! |---|---|
//! | `input_cost_per_token`, `output_cost_per_token` | `input`, `output` (both required) |
//! | `cache_read_input_token_cost` | `cached_input` |
//! | `cache_creation_input_token_cost` | `cache_write` (5-minute) |
//! | `cache_creation_input_token_cost_above_1hr` | `cache_write_1h` |
//! | `output_cost_per_reasoning_token` | `reasoning` |
//! | `input_cost_per_audio_token`, `output_cost_per_audio_token` | `audio_input`, `audio_output` |
//! | `input_cost_per_token_batches` (with `input_cost_per_token`) | `batch_discount` = 1 − batch/input |
//! | `*_priority`, `*_flex` (input, output, cache read) | `priority`, `flex` |
//! | `*_above_<N>k_tokens` (input, output, cache read, cache write) | `tiers` above N × 1000 |
//!
//! Entries whose `mode` is set and is not `chat`, `completion` or `responses` (embeddings,
//! images, audio transcription, …) and entries without both token prices (including LiteLLM's
//! `sample_spec`) are skipped. Prices are converted to USD per 1M tokens exactly from the
//! shortest decimal that round-trips each float, rounded to 9 decimal places.

use crate::pricing::{Catalog, PriceCard, Rates, Tier};
use rust_decimal::Decimal;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// A price list that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// Not JSON, or not a JSON object at the top.
    #[error("not a LiteLLM price list: {0}")]
    Shape(String),
}

/// What an import read: the catalog and the number of entries skipped (not chat models or
/// without token prices).
#[derive(Debug, Clone)]
pub struct Imported {
    /// The upstream cost prices read, with `as_of` set to the import date given.
    pub catalog: Catalog,
    /// Entries not imported, count.
    pub skipped: usize,
}

/// Per-token float → USD per 1M tokens, exact from its shortest round-trip decimal.
fn per_million(v: &Value) -> Option<Decimal> {
    let f = v.as_f64().filter(|f| f.is_finite() && *f >= 0.0)?;
    let d: Decimal = format!("{f}").parse().ok()?;
    let m = d.checked_mul(Decimal::from(1_000_000))?;
    Some(m.round_dp(9).normalize())
}

/// Parses LiteLLM's JSON `text` into upstream cost prices, each carrying `as_of`.
pub fn import_litellm(text: &str, as_of: Option<&str>) -> Result<Imported, ImportError> {
    let v: Value = serde_json::from_str(text).map_err(|e| ImportError::Shape(e.to_string()))?;
    let obj = v
        .as_object()
        .ok_or_else(|| ImportError::Shape("the top level is not a JSON object".into()))?;
    let mut upstream = HashMap::new();
    let mut skipped = 0;
    for (model, entry) in obj {
        match card(entry, as_of) {
            Some(c) if model != "sample_spec" => {
                upstream.insert(model.clone(), c);
            }
            _ => skipped += 1,
        }
    }
    Ok(Imported {
        catalog: Catalog {
            currency: "USD".into(),
            as_of: as_of.map(str::to_owned),
            upstream,
            standard: HashMap::new(),
        },
        skipped,
    })
}

/// One LiteLLM entry → a card, `None` when it is not a chat model with token prices.
fn card(e: &Value, as_of: Option<&str>) -> Option<PriceCard> {
    let mode = e.get("mode").and_then(Value::as_str);
    if mode.is_some_and(|m| !matches!(m, "chat" | "completion" | "responses")) {
        return None;
    }
    let p = |k: &str| e.get(k).and_then(per_million);
    let (input, output) = (p("input_cost_per_token")?, p("output_cost_per_token")?);
    let batch_discount = p("input_cost_per_token_batches")
        .filter(|_| !input.is_zero())
        .map(|b| (Decimal::ONE - b / input).round_dp(6).normalize())
        .filter(|d| *d > Decimal::ZERO && *d < Decimal::ONE);
    let service = |suffix: &str| {
        Some(Rates {
            input: p(&format!("input_cost_per_token_{suffix}"))?,
            output: p(&format!("output_cost_per_token_{suffix}"))?,
            cached_input: p(&format!("cache_read_input_token_cost_{suffix}")),
            cache_write: None,
            cache_write_1h: None,
        })
    };
    let mut thresholds: Vec<u64> = e
        .as_object()
        .into_iter()
        .flat_map(|o| o.keys())
        .filter_map(|k| {
            let rest = k.strip_prefix("input_cost_per_token_above_")?;
            rest.strip_suffix("k_tokens")?.parse::<u64>().ok()
        })
        .collect();
    thresholds.sort_unstable();
    let tiers = thresholds
        .into_iter()
        .filter_map(|n| {
            let at = |k: &str| p(&format!("{k}_above_{n}k_tokens"));
            Some(Tier {
                above_prompt_tokens: n * 1000,
                input: at("input_cost_per_token")?,
                output: at("output_cost_per_token").unwrap_or(output),
                cached_input: at("cache_read_input_token_cost"),
                cache_write: at("cache_creation_input_token_cost"),
                cache_write_1h: p(&format!(
                    "cache_creation_input_token_cost_above_1hr_above_{n}k_tokens"
                )),
            })
        })
        .collect();
    Some(PriceCard {
        input,
        output,
        cached_input: p("cache_read_input_token_cost"),
        cache_write: p("cache_creation_input_token_cost"),
        cache_write_1h: p("cache_creation_input_token_cost_above_1hr"),
        reasoning: p("output_cost_per_reasoning_token"),
        audio_input: p("input_cost_per_audio_token"),
        audio_output: p("output_cost_per_audio_token"),
        batch_discount,
        priority: service("priority"),
        flex: service("flex"),
        tiers,
        as_of: as_of.map(str::to_owned),
    })
}

/// `catalog` as YAML in the bundled catalog's layout (one flow mapping per model, models sorted,
/// prices as plain decimals); [`Catalog::parse`] reads it back unchanged.
pub fn to_yaml(catalog: &Catalog, header: &str) -> String {
    let mut out = String::new();
    for line in header.lines() {
        let _ = writeln!(out, "# {line}");
    }
    let _ = writeln!(out, "currency: {}", catalog.currency);
    if let Some(d) = &catalog.as_of {
        let _ = writeln!(out, "as_of: {}", quote(d));
    }
    for (name, section) in [
        ("upstream", &catalog.upstream),
        ("standard", &catalog.standard),
    ] {
        if section.is_empty() {
            let _ = writeln!(out, "{name}: {{}}");
            continue;
        }
        let _ = writeln!(out, "{name}:");
        let sorted: BTreeMap<&String, &PriceCard> = section.iter().collect();
        for (model, card) in sorted {
            let _ = writeln!(out, "  {}: {}", quote(model), card_yaml(card));
        }
    }
    out
}

/// A YAML double-quoted scalar (JSON string syntax is valid YAML).
fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

fn fields(out: &mut Vec<String>, pairs: &[(&str, Option<Decimal>)]) {
    for (k, v) in pairs {
        if let Some(v) = v {
            out.push(format!("{k}: {}", v.normalize()));
        }
    }
}

fn rates_yaml(r: &Rates) -> String {
    let mut f = Vec::new();
    fields(&mut f, &r.by_name());
    format!("{{{}}}", f.join(", "))
}

fn card_yaml(c: &PriceCard) -> String {
    let mut f = Vec::new();
    fields(&mut f, &c.rates().by_name());
    fields(
        &mut f,
        &[
            ("reasoning", c.reasoning),
            ("audio_input", c.audio_input),
            ("audio_output", c.audio_output),
            ("batch_discount", c.batch_discount),
        ],
    );
    for (k, r) in [("priority", &c.priority), ("flex", &c.flex)] {
        if let Some(r) = r {
            f.push(format!("{k}: {}", rates_yaml(r)));
        }
    }
    if !c.tiers.is_empty() {
        let tiers: Vec<String> = c
            .tiers
            .iter()
            .map(|t| {
                let mut tf = vec![format!("above_prompt_tokens: {}", t.above_prompt_tokens)];
                fields(&mut tf, &t.rates().by_name());
                format!("{{{}}}", tf.join(", "))
            })
            .collect();
        f.push(format!("tiers: [{}]", tiers.join(", ")));
    }
    if let Some(d) = &c.as_of {
        f.push(format!("as_of: {}", quote(d)));
    }
    format!("{{{}}}", f.join(", "))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const SAMPLE: &str = r#"{
      "sample_spec": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0, "mode": "chat"},
      "claude-sonnet-4-20250514": {"litellm_provider": "anthropic", "mode": "chat",
        "input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05,
        "cache_read_input_token_cost": 3e-07, "cache_creation_input_token_cost": 3.75e-06,
        "cache_creation_input_token_cost_above_1hr": 6e-06,
        "input_cost_per_token_above_200k_tokens": 6e-06,
        "output_cost_per_token_above_200k_tokens": 2.25e-05,
        "cache_read_input_token_cost_above_200k_tokens": 6e-07,
        "cache_creation_input_token_cost_above_200k_tokens": 7.5e-06,
        "input_cost_per_token_batches": 1.5e-06},
      "gpt-5": {"mode": "chat", "input_cost_per_token": 1.25e-06, "output_cost_per_token": 1e-05,
        "cache_read_input_token_cost": 1.25e-07,
        "input_cost_per_token_priority": 2.5e-06, "output_cost_per_token_priority": 2e-05,
        "input_cost_per_token_flex": 6.25e-07, "output_cost_per_token_flex": 5e-06},
      "gpt-4o-audio-preview": {"mode": "chat", "input_cost_per_token": 2.5e-06,
        "output_cost_per_token": 1e-05, "input_cost_per_audio_token": 4e-05,
        "output_cost_per_audio_token": 8e-05},
      "text-embedding-3-small": {"mode": "embedding", "input_cost_per_token": 2e-08,
        "output_cost_per_token": 0.0},
      "dall-e-3": {"mode": "image_generation", "output_cost_per_image": 0.04}
    }"#;

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    #[test]
    fn reads_every_dimension_and_round_trips() {
        let imported = import_litellm(SAMPLE, Some("2026-11-01")).unwrap();
        assert_eq!(imported.skipped, 3);
        let c = &imported.catalog.upstream["claude-sonnet-4-20250514"];
        assert_eq!(
            (
                c.input,
                c.output,
                c.cached_input,
                c.cache_write,
                c.cache_write_1h
            ),
            (
                d("3"),
                d("15"),
                Some(d("0.3")),
                Some(d("3.75")),
                Some(d("6"))
            )
        );
        assert_eq!(c.batch_discount, Some(d("0.5")));
        assert_eq!(c.tiers.len(), 1);
        assert_eq!(c.tiers[0].above_prompt_tokens, 200_000);
        assert_eq!(c.tiers[0].output, d("22.5"));
        assert_eq!(c.tiers[0].cache_write, Some(d("7.5")));
        let g = &imported.catalog.upstream["gpt-5"];
        assert_eq!(g.priority.as_ref().unwrap().input, d("2.5"));
        assert_eq!(g.flex.as_ref().unwrap().output, d("5"));
        assert_eq!(g.cached_input, Some(d("0.125")));
        let a = &imported.catalog.upstream["gpt-4o-audio-preview"];
        assert_eq!(
            (a.audio_input, a.audio_output),
            (Some(d("40")), Some(d("80")))
        );
        let yaml = to_yaml(&imported.catalog, "imported");
        let back = Catalog::parse("<import>", &yaml).unwrap();
        assert_eq!(back, imported.catalog);
    }

    #[test]
    fn not_an_object_is_an_error() {
        assert!(import_litellm("[]", None).is_err());
        assert!(import_litellm("nope", None).is_err());
    }
}
