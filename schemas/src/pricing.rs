//! The pricing catalog and cost arithmetic, all in `rust_decimal` (never floats).
//!
//! Prices are USD per 1,000,000 tokens. A request's tokens are split into billing types that never
//! overlap: new input = prompt − cached − cache-write; cached input; cache write; output =
//! completion − reasoning; reasoning (priced as output unless the card says otherwise). This follows
//! the providers' own definitions: OpenAI's `prompt_tokens` includes `cached_tokens` and
//! `completion_tokens` includes `reasoning_tokens` (OpenAI API reference, usage object); Anthropic's
//! cache reads and writes are priced separately from base input (Anthropic docs, "Prompt caching").

use crate::Usage;
use rust_decimal::Decimal;
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::HashMap;

/// The catalog bundled with the binary.
pub const BUNDLED_CATALOG: &str = include_str!("../pricing/catalog.yaml");

/// One million, the unit prices are quoted per.
const PER: Decimal = Decimal::from_parts(1_000_000, 0, 0, false, 0);

/// Reads a price written as a YAML/JSON number or string, exactly as written (`0.15` stays 0.15).
fn price<'de, D: Deserializer<'de>>(d: D) -> Result<Decimal, D::Error> {
    decimal_as_written(d, "price ")
}

/// Reads a non-negative decimal written as a YAML/JSON number or string, exactly as written;
/// errors start with `label` (e.g. "price "). Shared with the budget amounts of
/// [`crate::tenancy`].
pub(crate) fn decimal_as_written<'de, D: Deserializer<'de>>(
    d: D,
    label: &str,
) -> Result<Decimal, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        S(String),
        F(f64),
        I(i64),
    }
    let text = match Raw::deserialize(d)? {
        Raw::S(s) => s,
        // Rust prints the shortest decimal that round-trips, i.e. what the author typed.
        Raw::F(f) => format!("{f}"),
        Raw::I(i) => i.to_string(),
    };
    let v: Decimal = text
        .trim()
        .parse()
        .map_err(|e| serde::de::Error::custom(format!("{label}`{text}`: {e}")))?;
    if v.is_sign_negative() {
        return Err(serde::de::Error::custom(format!(
            "{label}`{text}` is negative"
        )));
    }
    Ok(v)
}

fn opt_price<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Decimal>, D::Error> {
    price(d).map(Some)
}

/// Prices of one model, USD per 1M tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceCard {
    /// New (uncached) input.
    #[serde(deserialize_with = "price")]
    pub input: Decimal,
    /// Output (non-reasoning) tokens.
    #[serde(deserialize_with = "price")]
    pub output: Decimal,
    /// Input read from the provider's prompt cache; default `input`.
    #[serde(default, deserialize_with = "opt_price")]
    pub cached_input: Option<Decimal>,
    /// Input written to the provider's prompt cache; default `input`.
    #[serde(default, deserialize_with = "opt_price")]
    pub cache_write: Option<Decimal>,
    /// Reasoning tokens, when priced apart from output; default `output`.
    #[serde(default, deserialize_with = "opt_price")]
    pub reasoning: Option<Decimal>,
    /// Fraction taken off for batch jobs, e.g. 0.5.
    #[serde(default, deserialize_with = "opt_price")]
    pub batch_discount: Option<Decimal>,
    /// Prices above a prompt size (e.g. Gemini's > 200k tier); the highest matching tier applies.
    #[serde(default)]
    pub tiers: Vec<Tier>,
    /// The date this price was taken (ISO 8601).
    #[serde(default)]
    pub as_of: Option<String>,
}

/// Prices that replace the base ones when `prompt_tokens > above_prompt_tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    /// Threshold, tokens.
    pub above_prompt_tokens: u64,
    /// New input.
    #[serde(deserialize_with = "price")]
    pub input: Decimal,
    /// Output.
    #[serde(deserialize_with = "price")]
    pub output: Decimal,
    /// Cached input; default this tier's `input`.
    #[serde(default, deserialize_with = "opt_price")]
    pub cached_input: Option<Decimal>,
    /// Cache write; default this tier's `input`.
    #[serde(default, deserialize_with = "opt_price")]
    pub cache_write: Option<Decimal>,
}

/// The billing type of a ledger line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BillingType {
    /// Uncached input.
    NewInput,
    /// Input read from cache.
    CachedInput,
    /// Input written to cache.
    CacheWrite,
    /// Output excluding reasoning.
    Output,
    /// Reasoning output.
    Reasoning,
}

impl BillingType {
    /// The snake_case name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NewInput => "new_input",
            Self::CachedInput => "cached_input",
            Self::CacheWrite => "cache_write",
            Self::Output => "output",
            Self::Reasoning => "reasoning",
        }
    }
}

/// One priced line: tokens × unit price.
#[derive(Debug, Clone, PartialEq)]
pub struct CostLine {
    /// What kind of tokens.
    pub billing_type: BillingType,
    /// How many.
    pub tokens: u64,
    /// USD per 1M tokens applied (after tier and batch discount).
    pub unit_price: Decimal,
    /// USD, exact.
    pub amount: Decimal,
}

/// A priced usage.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Cost {
    /// Non-zero lines, in billing-type order.
    pub lines: Vec<CostLine>,
    /// Sum of the lines, USD.
    pub total: Decimal,
}

impl PriceCard {
    /// Prices `usage`. `batch` applies the batch discount. Token parts are clamped so a malformed
    /// usage (cached > prompt) can never produce a negative line.
    pub fn cost(&self, usage: &Usage, batch: bool) -> Cost {
        let tier = self
            .tiers
            .iter()
            .filter(|t| usage.prompt_tokens > t.above_prompt_tokens)
            .max_by_key(|t| t.above_prompt_tokens);
        let (input, output, cached, write) = match tier {
            Some(t) => (
                t.input,
                t.output,
                t.cached_input.unwrap_or(t.input),
                t.cache_write.unwrap_or(t.input),
            ),
            None => (
                self.input,
                self.output,
                self.cached_input.unwrap_or(self.input),
                self.cache_write.unwrap_or(self.input),
            ),
        };
        let reasoning_price = self.reasoning.unwrap_or(output);
        let factor = match (batch, self.batch_discount) {
            (true, Some(d)) => Decimal::ONE - d,
            _ => Decimal::ONE,
        };
        let cached_tokens = usage.cached_tokens.min(usage.prompt_tokens);
        let write_tokens = usage
            .cache_write_tokens
            .min(usage.prompt_tokens - cached_tokens);
        let new_input = usage.prompt_tokens - cached_tokens - write_tokens;
        let reasoning = usage.reasoning_tokens.min(usage.completion_tokens);
        let parts = [
            (BillingType::NewInput, new_input, input),
            (BillingType::CachedInput, cached_tokens, cached),
            (BillingType::CacheWrite, write_tokens, write),
            (
                BillingType::Output,
                usage.completion_tokens - reasoning,
                output,
            ),
            (BillingType::Reasoning, reasoning, reasoning_price),
        ];
        let mut cost = Cost::default();
        for (billing_type, tokens, unit) in parts {
            if tokens == 0 {
                continue;
            }
            let unit_price = unit * factor;
            let amount = Decimal::from(tokens) * unit_price / PER;
            cost.total += amount;
            cost.lines.push(CostLine {
                billing_type,
                tokens,
                unit_price,
                amount,
            });
        }
        cost.total = cost.total.normalize();
        cost
    }
}

/// The whole catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    /// ISO 4217 code; only `USD` today.
    pub currency: String,
    /// When the catalog was compiled.
    #[serde(default)]
    pub as_of: Option<String>,
    /// Cost prices by upstream model id.
    #[serde(default)]
    pub upstream: HashMap<String, PriceCard>,
    /// Sale prices by standard model id.
    #[serde(default)]
    pub standard: HashMap<String, PriceCard>,
}

/// A catalog that cannot be read, naming the field.
#[derive(Debug, thiserror::Error)]
#[error("pricing catalog {source_name}: {message}")]
pub struct CatalogError {
    /// File name or `<bundled>`.
    pub source_name: String,
    /// What and where.
    pub message: String,
}

impl Catalog {
    /// A catalog that prices nothing (costs stay NULL).
    pub fn empty() -> Self {
        Self {
            currency: "USD".into(),
            as_of: None,
            upstream: HashMap::new(),
            standard: HashMap::new(),
        }
    }

    /// The bundled catalog.
    pub fn bundled() -> Result<Self, CatalogError> {
        Self::parse("<bundled>", BUNDLED_CATALOG)
    }

    /// The catalog in file `path` (the config's `pricing_file`), or the bundled one for `None`.
    pub fn load(path: Option<&str>) -> Result<Self, CatalogError> {
        let Some(p) = path else {
            return Self::bundled();
        };
        let text = std::fs::read_to_string(p).map_err(|e| CatalogError {
            source_name: p.to_owned(),
            message: e.to_string(),
        })?;
        Self::parse(p, &text)
    }

    /// Parses YAML; errors name the field (e.g. `upstream.gpt-4o.input`).
    pub fn parse(source_name: &str, text: &str) -> Result<Self, CatalogError> {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        let c: Catalog = serde_path_to_error::deserialize(de).map_err(|e| CatalogError {
            source_name: source_name.to_owned(),
            message: format!("field `{}`: {}", e.path(), e.inner()),
        })?;
        if c.currency != "USD" {
            return Err(CatalogError {
                source_name: source_name.to_owned(),
                message: format!("currency `{}` is not supported (USD only)", c.currency),
            });
        }
        Ok(c)
    }

    /// Cost price of `usage` on `upstream_model`, if the model is priced.
    pub fn upstream_cost(&self, upstream_model: &str, usage: &Usage, batch: bool) -> Option<Cost> {
        self.upstream
            .get(upstream_model)
            .map(|c| c.cost(usage, batch))
    }

    /// Sale price (charge) of `usage` on the standard model, if priced.
    pub fn charge(&self, model: &str, usage: &Usage, batch: bool) -> Option<Cost> {
        self.standard.get(model).map(|c| c.cost(usage, batch))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::str::FromStr;

    fn d(s: &str) -> Decimal {
        Decimal::from_str(s).unwrap()
    }

    #[test]
    fn bundled_catalog_parses() {
        let c = Catalog::bundled().unwrap();
        assert_eq!(c.upstream["gpt-4o-mini"].input, d("0.15"));
        assert_eq!(c.upstream["gpt-4o-mini"].cached_input, Some(d("0.075")));
    }

    /// FC-11: $2.50 input, $1.25 cached, $10 output; 2006 prompt (1920 cached) + 300 completion.
    #[test]
    fn fc11_cached_tokens_billed_at_cached_price() {
        let card: PriceCard =
            serde_yaml_ng::from_str("{input: 2.50, cached_input: 1.25, output: 10}").unwrap();
        let usage = Usage {
            prompt_tokens: 2006,
            cached_tokens: 1920,
            completion_tokens: 300,
            ..Usage::default()
        };
        let cost = card.cost(&usage, false);
        assert_eq!(cost.total, d("0.005615"));
        assert_eq!(cost.total.to_string(), "0.005615");
        let lines: Vec<(BillingType, u64)> = cost
            .lines
            .iter()
            .map(|l| (l.billing_type, l.tokens))
            .collect();
        assert_eq!(
            lines,
            vec![
                (BillingType::NewInput, 86),
                (BillingType::CachedInput, 1920),
                (BillingType::Output, 300)
            ]
        );
    }

    /// FC-10: Anthropic $3 input, $3.75 cache write, $0.30 cache read, $15 output; 4522 new input,
    /// 4511 cache-write, 5 output → $0.03055725.
    #[test]
    fn fc10_cache_write_priced_apart() {
        let c = Catalog::bundled().unwrap();
        let usage = Usage {
            prompt_tokens: 9033,
            cache_write_tokens: 4511,
            completion_tokens: 5,
            ..Usage::default()
        };
        let cost = c
            .upstream_cost("claude-sonnet-4-20250514", &usage, false)
            .unwrap();
        assert_eq!(cost.total.to_string(), "0.03055725");
    }

    #[test]
    fn tiers_batch_and_reasoning() {
        let c = Catalog::bundled().unwrap();
        let small = Usage {
            prompt_tokens: 1000,
            completion_tokens: 1000,
            ..Usage::default()
        };
        assert_eq!(
            c.upstream_cost("gemini-2.5-pro", &small, false)
                .unwrap()
                .total,
            d("0.01125")
        );
        let big = Usage {
            prompt_tokens: 200_001,
            completion_tokens: 1000,
            ..Usage::default()
        };
        // 200001 × 2.50 + 1000 × 15 per 1M.
        assert_eq!(
            c.upstream_cost("gemini-2.5-pro", &big, false)
                .unwrap()
                .total,
            d("0.5150025")
        );
        let u = Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 1_000_000,
            reasoning_tokens: 400_000,
            ..Usage::default()
        };
        assert_eq!(
            c.upstream_cost("gpt-4o-mini", &u, true).unwrap().total,
            d("0.375")
        );
    }

    #[test]
    fn errors_name_the_field() {
        let e = Catalog::parse(
            "f.yaml",
            "currency: USD\nupstream:\n  m: {input: x, output: 1}\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("upstream.m.input"), "{e}");
        let e = Catalog::parse(
            "f.yaml",
            "currency: USD\nupstream:\n  m: {input: 1, output: 1, inptu: 2}\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("inptu"), "{e}");
    }
}
