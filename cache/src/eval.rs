//! `switchyard cache eval PAIRS.jsonl`: how the semantic layer decides on labelled pairs.
//!
//! Each line is `{"a": "...", "b": "...", "same": true|false}` (optional `"lang"` and `"kind"`
//! group the report). A pair counts as a predicted hit when the cosine similarity of the two
//! embeddings is at least the threshold **and** the verification rules pass ([`crate::verify`]);
//! with `verify: false` the similarity alone decides. For each threshold:
//!
//! * precision = hits on `same` pairs / all hits (1 when nothing hits),
//! * recall = hits on `same` pairs / `same` pairs,
//! * hit rate = hits / pairs.

use crate::embed::{Embed, EmbedError, cosine};
use crate::verify::{self, Rejection};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One labelled pair.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pair {
    /// First text.
    pub a: String,
    /// Second text.
    pub b: String,
    /// Whether one answer serves both.
    pub same: bool,
    /// `en` or `zh`.
    pub lang: Option<String>,
    /// What the pair tests, e.g. `paraphrase`, `negation`, `number`.
    pub kind: Option<String>,
}

/// Reads a JSONL file of pairs; errors name the line.
pub fn load(text: &str) -> Result<Vec<Pair>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

/// A scored pair.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// The pair.
    pub pair: Pair,
    /// Cosine similarity.
    pub similarity: f32,
    /// The verification outcome.
    pub verified: Result<(), Rejection>,
}

/// Embeds every text (in batches) and verifies every pair.
pub fn score(embedder: &dyn Embed, pairs: &[Pair]) -> Result<Vec<Scored>, EmbedError> {
    let mut out = Vec::with_capacity(pairs.len());
    for chunk in pairs.chunks(32) {
        let texts: Vec<&str> = chunk
            .iter()
            .flat_map(|p| [p.a.as_str(), p.b.as_str()])
            .collect();
        let vectors = embedder.embed(&texts)?;
        for (i, p) in chunk.iter().enumerate() {
            let (Some(va), Some(vb)) = (vectors.get(2 * i), vectors.get(2 * i + 1)) else {
                return Err(EmbedError::Model("fewer vectors than texts".into()));
            };
            out.push(Scored {
                pair: p.clone(),
                similarity: cosine(va, vb),
                verified: verify::verify(&p.a, &p.b),
            });
        }
    }
    Ok(out)
}

/// The counts at one threshold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Row {
    /// Similarity threshold.
    pub threshold: f32,
    /// Hits on `same` pairs.
    pub tp: usize,
    /// Hits on different pairs (wrong answers served).
    pub fp: usize,
    /// `same` pairs missed.
    pub fn_: usize,
    /// Different pairs missed.
    pub tn: usize,
    /// tp / (tp + fp), 1 when nothing hits.
    pub precision: f64,
    /// tp / (tp + fn).
    pub recall: f64,
    /// (tp + fp) / pairs.
    pub hit_rate: f64,
}

/// Counts for `threshold`; `verify` applies the rules.
pub fn row(scored: &[Scored], threshold: f32, verify: bool) -> Row {
    let (mut tp, mut fp, mut fn_, mut tn) = (0, 0, 0, 0);
    for s in scored {
        let hit = s.similarity >= threshold && (!verify || s.verified.is_ok());
        match (hit, s.pair.same) {
            (true, true) => tp += 1,
            (true, false) => fp += 1,
            (false, true) => fn_ += 1,
            (false, false) => tn += 1,
        }
    }
    let ratio = |a: usize, b: usize, empty: f64| if b == 0 { empty } else { a as f64 / b as f64 };
    Row {
        threshold,
        tp,
        fp,
        fn_,
        tn,
        precision: ratio(tp, tp + fp, 1.0),
        recall: ratio(tp, tp + fn_, 0.0),
        hit_rate: ratio(tp + fp, scored.len(), 0.0),
    }
}

/// The thresholds reported by default: 0.50 to 0.98 in steps of 0.02.
pub fn default_thresholds() -> Vec<f32> {
    (25..=49).map(|i| i as f32 * 0.02).collect()
}

/// The lowest threshold whose precision (with verification) is at least `min_precision`.
pub fn lowest_threshold(scored: &[Scored], min_precision: f64) -> Option<f32> {
    (0..=100)
        .map(|i| i as f32 / 100.0)
        .find(|t| row(scored, *t, true).precision >= min_precision)
}

/// The `same` pairs missed at `threshold` and the different pairs caught only by the rules, with
/// the reason: for tuning the rules.
pub fn misses(scored: &[Scored], threshold: f32) -> String {
    let mut s = String::new();
    for x in scored {
        let why = if x.similarity < threshold {
            format!("similarity {:.3}", x.similarity)
        } else if let Err(r) = x.verified {
            format!("{} ({:.3})", r.as_str(), x.similarity)
        } else {
            continue;
        };
        if x.pair.same {
            s.push_str(&format!(
                "missed  {why:<22} {:?} / {:?}\n",
                x.pair.a, x.pair.b
            ));
        }
    }
    s
}

/// A plain-text report: per threshold with and without verification, then per language and the
/// rules' rejections.
pub fn report(scored: &[Scored], thresholds: &[f32], marks: &[(f32, &str)]) -> String {
    let mut s = String::new();
    let same = scored.iter().filter(|x| x.pair.same).count();
    s.push_str(&format!(
        "{} pairs: {} same, {} different\n\n",
        scored.len(),
        same,
        scored.len() - same
    ));
    s.push_str("threshold  precision  recall  hit_rate   tp   fp   fn   tn | embedding only: precision  recall  hit_rate\n");
    for &t in thresholds {
        let v = row(scored, t, true);
        let raw = row(scored, t, false);
        let mark = marks
            .iter()
            .filter(|(m, _)| (m - t).abs() < 1e-4)
            .map(|(_, n)| format!("  <- {n}"))
            .collect::<String>();
        s.push_str(&format!(
            "{t:>9.2}  {:>9.3}  {:>6.3}  {:>8.3} {:>4} {:>4} {:>4} {:>4} |                 {:>9.3}  {:>6.3}  {:>8.3}{mark}\n",
            v.precision, v.recall, v.hit_rate, v.tp, v.fp, v.fn_, v.tn, raw.precision, raw.recall, raw.hit_rate
        ));
    }
    for &(t, name) in marks {
        s.push_str(&format!("\nat {name} ({t:.2}), by language:\n"));
        let mut langs: BTreeMap<String, Vec<Scored>> = BTreeMap::new();
        for x in scored {
            langs
                .entry(x.pair.lang.clone().unwrap_or_else(|| "-".into()))
                .or_default()
                .push(x.clone());
        }
        for (lang, xs) in &langs {
            let r = row(xs, t, true);
            s.push_str(&format!(
                "  {lang:<3} pairs {:>4}  precision {:.3}  recall {:.3}  hit rate {:.3}  (tp {} fp {} fn {} tn {})\n",
                xs.len(),
                r.precision,
                r.recall,
                r.hit_rate,
                r.tp,
                r.fp,
                r.fn_,
                r.tn
            ));
        }
        let fps: Vec<&Scored> = scored
            .iter()
            .filter(|x| !x.pair.same && x.similarity >= t && x.verified.is_ok())
            .collect();
        for x in fps {
            s.push_str(&format!(
                "  wrong hit {:.3}: {:?} / {:?}\n",
                x.similarity, x.pair.a, x.pair.b
            ));
        }
    }
    // What the rules reject, over all pairs.
    let mut by_rule: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
    for x in scored {
        if let Err(r) = x.verified {
            let e = by_rule.entry(r.as_str()).or_default();
            if x.pair.same {
                e.1 += 1;
            } else {
                e.0 += 1;
            }
        }
    }
    s.push_str("\nverification rejections (different pairs caught / same pairs lost):\n");
    for r in Rejection::ALL {
        let (caught, lost) = by_rule.get(r.as_str()).copied().unwrap_or_default();
        s.push_str(&format!("  {:<10} {caught:>4} / {lost}\n", r.as_str()));
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::embed::TrigramEmbedder;

    #[test]
    fn counts_and_ratios() {
        let pairs = load(
            "{\"a\":\"How do I reset my password?\",\"b\":\"how do I reset my password\",\"same\":true}\n\n\
             {\"a\":\"How do I turn on dark mode?\",\"b\":\"How do I turn off dark mode?\",\"same\":false,\"lang\":\"en\"}\n",
        )
        .unwrap();
        let scored = score(&TrigramEmbedder, &pairs).unwrap();
        let r = row(&scored, 0.3, true);
        assert_eq!((r.tp, r.fp, r.fn_, r.tn), (1, 0, 0, 1));
        assert_eq!((r.precision, r.recall, r.hit_rate), (1.0, 1.0, 0.5));
        let raw = row(&scored, 0.3, false);
        assert_eq!(raw.fp, 1);
        assert!(report(&scored, &[0.3], &[(0.3, "default")]).contains("polarity"));
        assert!(load("{\"a\": 1}").unwrap_err().starts_with("line 1"));
        assert_eq!(lowest_threshold(&scored, 0.99), Some(0.0));
    }
}
