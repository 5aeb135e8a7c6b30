//! The pricing catalog and cost arithmetic, all in `rust_decimal` (never floats).
//!
//! Prices are USD per 1,000,000 tokens. A request's tokens are split into billing types that never
//! overlap: new input = prompt − cached − cache-write; cached input; cache write; output =
//! completion − reasoning; reasoning (priced as output unless the card says otherwise). This follows
//! the providers' own definitions: OpenAI's `prompt_tokens` includes `cached_tokens` and
//! `completion_tokens` includes `reasoning_tokens` (OpenAI API reference, usage object); Anthropic's
//! cache reads and writes are priced separately from base input (Anthropic docs, "Prompt caching").

use crate::Usage;
use crate::usage::ServiceTier;
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

/// Declares a price struct: the fields given before `..rates`, the five prices every card and
/// tier has (`input`, `output`, `cached_input`, `cache_write`, `cache_write_1h`, USD per 1M
/// tokens, in that order on the wire), then the fields given after it. One list for
/// [`PriceCard`], [`Rates`] and [`Tier`] (`#[serde(flatten)]` would share it too, but serde
/// does not support it with `deny_unknown_fields`). `None` fields are left out of the JSON.
macro_rules! price_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($(#[$before_meta:meta])* pub $before:ident: $before_ty:ty,)*
            ..rates,
            $($(#[$after_meta:meta])* pub $after:ident: $after_ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        #[serde_with::skip_serializing_none]
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$before_meta])* pub $before: $before_ty,)*
            /// New (uncached) input.
            #[serde(deserialize_with = "price")]
            pub input: Decimal,
            /// Output (non-reasoning) tokens.
            #[serde(deserialize_with = "price")]
            pub output: Decimal,
            /// Input read from the provider's prompt cache; default this card's or tier's
            /// `input`.
            #[serde(default, deserialize_with = "opt_price")]
            pub cached_input: Option<Decimal>,
            /// Input written to the provider's prompt cache with the 5-minute TTL (Anthropic's
            /// default write; every other provider's only one); default this card's or tier's
            /// `input`.
            #[serde(default, deserialize_with = "opt_price")]
            pub cache_write: Option<Decimal>,
            /// Input written to the prompt cache with the 1-hour TTL (Anthropic `ttl: "1h"`). A
            /// tier without it takes the card's; on a card without it, 1-hour writes are an
            /// unpriced component (no default).
            #[serde(default, deserialize_with = "opt_price")]
            pub cache_write_1h: Option<Decimal>,
            $($(#[$after_meta])* pub $after: $after_ty,)*
        }

        impl $name {
            /// The five prices every card and tier has, as [`Rates`].
            pub(crate) fn rates(&self) -> Rates {
                Rates {
                    input: self.input,
                    output: self.output,
                    cached_input: self.cached_input,
                    cache_write: self.cache_write,
                    cache_write_1h: self.cache_write_1h,
                }
            }
        }
    };
}

price_struct! {
    /// Prices of one model, USD per 1M tokens.
    pub struct PriceCard {
        ..rates,
        /// Reasoning tokens, when priced apart from output; default `output`.
        #[serde(default, deserialize_with = "opt_price")]
        pub reasoning: Option<Decimal>,
        /// Audio input tokens (OpenAI audio models). No default: audio input on a card without
        /// it is an unpriced component.
        #[serde(default, deserialize_with = "opt_price")]
        pub audio_input: Option<Decimal>,
        /// Audio output tokens. No default (unpriced component when missing).
        #[serde(default, deserialize_with = "opt_price")]
        pub audio_output: Option<Decimal>,
        /// Fraction taken off for batch jobs, e.g. 0.5.
        #[serde(default, deserialize_with = "opt_price")]
        pub batch_discount: Option<Decimal>,
        /// Prices of the `priority` service tier (OpenAI "Priority processing"); a priority call
        /// on a card without them is an unpriced component (`service_tier`), billed at the base
        /// prices.
        pub priority: Option<Rates>,
        /// Prices of the `flex` service tier (OpenAI "Flex processing"); as `priority`.
        pub flex: Option<Rates>,
        /// Prices above a prompt size (e.g. Gemini's > 200k tier); the highest matching tier
        /// applies.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub tiers: Vec<Tier>,
        /// The date this price was taken (ISO 8601).
        pub as_of: Option<String>,
    }
}

price_struct! {
    /// The prices of a service tier, USD per 1M tokens; the optional ones default as on the card
    /// (`cached_input`, `cache_write` → this tier's `input`).
    pub struct Rates {
        ..rates,
    }
}

impl Rates {
    /// The prices by wire name, in wire order (`input` and `output` always set).
    pub(crate) fn by_name(&self) -> [(&'static str, Option<Decimal>); 5] {
        [
            ("input", Some(self.input)),
            ("output", Some(self.output)),
            ("cached_input", self.cached_input),
            ("cache_write", self.cache_write),
            ("cache_write_1h", self.cache_write_1h),
        ]
    }
}

price_struct! {
    /// Prices that replace the base ones when `prompt_tokens > above_prompt_tokens`.
    pub struct Tier {
        /// Threshold, tokens.
        pub above_prompt_tokens: u64,
        ..rates,
    }
}

/// The billing type of a ledger line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BillingType {
    /// Uncached text input.
    NewInput,
    /// Input read from cache.
    CachedInput,
    /// Input written to cache, 5-minute TTL.
    CacheWrite,
    /// Input written to cache, 1-hour TTL.
    CacheWrite1h,
    /// Audio input.
    AudioInput,
    /// Output excluding reasoning and audio.
    Output,
    /// Reasoning output.
    Reasoning,
    /// Audio output.
    AudioOutput,
}

impl BillingType {
    /// The snake_case name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NewInput => "new_input",
            Self::CachedInput => "cached_input",
            Self::CacheWrite => "cache_write",
            Self::CacheWrite1h => "cache_write_1h",
            Self::AudioInput => "audio_input",
            Self::Output => "output",
            Self::Reasoning => "reasoning",
            Self::AudioOutput => "audio_output",
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
    /// What had no price (empty when everything was priced): the billing types (`as_str`) with
    /// tokens but no price on the card, `service_tier` when the serving tier has no prices on
    /// the card (billed at the base prices), `model` when the whole card came from the
    /// [`UnpricedPolicy::ChargeAt`] fallback. Unpriced lines are priced by the fallback card,
    /// else at $0.
    pub unpriced: Vec<&'static str>,
}

/// What to charge for a request whose model, or a component of whose usage, has no price
/// (config `unpriced:`). Absent: [`UnpricedPolicy::Reject`] for callers with a USD budget,
/// [`UnpricedPolicy::Zero`] for the others; either way billing records the gap (ledger column
/// `unpriced`, reconciliation finding `unpriced_component`, metric).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PolicyRepr", into = "PolicyRepr")]
pub enum UnpricedPolicy {
    /// Refuse requests to a model without a sale price at admission (400 naming the model).
    /// Components found unpriced after the call are recorded at $0.
    Reject,
    /// Price what has no price with this standard model's card (`charge_at: openai/gpt-4o`).
    ChargeAt(String),
    /// Admit, and record what has no price at $0 (with the alarm).
    Zero,
}

/// How [`UnpricedPolicy`] is written: `reject`, `zero` or `{charge_at: <model>}`.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum PolicyRepr {
    Word(String),
    ChargeAt(ChargeAt),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChargeAt {
    charge_at: String,
}

impl TryFrom<PolicyRepr> for UnpricedPolicy {
    type Error = String;
    fn try_from(r: PolicyRepr) -> Result<Self, String> {
        match r {
            PolicyRepr::Word(w) if w == "reject" => Ok(Self::Reject),
            PolicyRepr::Word(w) if w == "zero" => Ok(Self::Zero),
            PolicyRepr::Word(w) => Err(format!(
                "unpriced: `{w}` is not `reject`, `zero` or `{{charge_at: <model>}}`"
            )),
            PolicyRepr::ChargeAt(c) => Ok(Self::ChargeAt(c.charge_at)),
        }
    }
}

impl From<UnpricedPolicy> for PolicyRepr {
    fn from(p: UnpricedPolicy) -> Self {
        match p {
            UnpricedPolicy::Reject => Self::Word("reject".into()),
            UnpricedPolicy::Zero => Self::Word("zero".into()),
            UnpricedPolicy::ChargeAt(m) => Self::ChargeAt(ChargeAt { charge_at: m }),
        }
    }
}

/// The unit prices one call is billed at, after tier selection; `None` = no price.
struct Applied {
    input: Decimal,
    output: Decimal,
    cached: Decimal,
    write: Decimal,
    write_1h: Option<Decimal>,
    reasoning: Decimal,
    audio_in: Option<Decimal>,
    audio_out: Option<Decimal>,
    /// The serving service tier has no prices on the card.
    tier_unpriced: bool,
}

impl PriceCard {
    /// A card of just input and output prices (everything else at its default).
    pub fn flat(input: Decimal, output: Decimal) -> Self {
        Self {
            input,
            output,
            cached_input: None,
            cache_write: None,
            cache_write_1h: None,
            reasoning: None,
            audio_input: None,
            audio_output: None,
            batch_discount: None,
            priority: None,
            flex: None,
            tiers: Vec::new(),
            as_of: None,
        }
    }

    /// The prices applying to `usage`: a long-context tier (the highest `above_prompt_tokens`
    /// below `prompt_tokens`) wins, else the service tier's [`Rates`], else the base prices.
    fn applied(&self, usage: &Usage) -> Applied {
        let long = self
            .tiers
            .iter()
            .filter(|t| usage.prompt_tokens > t.above_prompt_tokens)
            .max_by_key(|t| t.above_prompt_tokens);
        let service = match usage.service_tier {
            Some(ServiceTier::Priority) => Some(self.priority.as_ref()),
            Some(ServiceTier::Flex) => Some(self.flex.as_ref()),
            None => None,
        };
        let mut tier_unpriced = false;
        let rates = match (long, service) {
            (Some(t), _) => t.rates(),
            (None, Some(Some(r))) => r.rates(),
            (None, service) => {
                tier_unpriced = service.is_some();
                self.rates()
            }
        };
        let (input, output) = (rates.input, rates.output);
        Applied {
            input,
            output,
            cached: rates.cached_input.unwrap_or(input),
            write: rates.cache_write.unwrap_or(input),
            write_1h: rates.cache_write_1h.or(self.cache_write_1h),
            reasoning: self.reasoning.unwrap_or(output),
            audio_in: self.audio_input,
            audio_out: self.audio_output,
            tier_unpriced,
        }
    }

    /// Prices `usage`. `batch` applies the batch discount. Token parts are clamped so a malformed
    /// usage (cached > prompt) can never produce a negative line.
    pub fn cost(&self, usage: &Usage, batch: bool) -> Cost {
        self.cost_with(usage, batch, None)
    }

    /// [`PriceCard::cost`], pricing components this card has no price for with `fallback`'s
    /// (the [`UnpricedPolicy::ChargeAt`] card), else at $0; either way they are named in
    /// [`Cost::unpriced`].
    ///
    /// Billing types never overlap: new input = prompt − cached − 5-minute writes − 1-hour
    /// writes − audio input; output = completion − reasoning − audio output. Reasoning is billed
    /// at `reasoning` (default `output`); OpenAI's accepted and rejected prediction tokens are
    /// part of `completion_tokens` and billed as output (OpenAI "Predicted Outputs": rejected
    /// tokens "are still billed at completion token rates").
    pub fn cost_with(&self, usage: &Usage, batch: bool, fallback: Option<&PriceCard>) -> Cost {
        let p = self.applied(usage);
        let fb = fallback.map(|f| f.applied(usage));
        let factor = match (batch, self.batch_discount) {
            (true, Some(d)) => Decimal::ONE - d,
            _ => Decimal::ONE,
        };
        let cached = usage.cached_tokens.min(usage.prompt_tokens);
        let mut left = usage.prompt_tokens - cached;
        let write = usage.cache_write_tokens.min(left);
        left -= write;
        let write_1h = usage.cache_write_1h_tokens.min(write);
        let audio_in = usage.audio_input_tokens.min(left);
        let new_input = left - audio_in;
        let reasoning = usage.reasoning_tokens.min(usage.completion_tokens);
        let audio_out = usage
            .audio_output_tokens
            .min(usage.completion_tokens - reasoning);
        let output = usage.completion_tokens - reasoning - audio_out;
        let parts = [
            (BillingType::NewInput, new_input, Some(p.input)),
            (BillingType::CachedInput, cached, Some(p.cached)),
            (BillingType::CacheWrite, write - write_1h, Some(p.write)),
            (BillingType::CacheWrite1h, write_1h, p.write_1h),
            (BillingType::AudioInput, audio_in, p.audio_in),
            (BillingType::Output, output, Some(p.output)),
            (BillingType::Reasoning, reasoning, Some(p.reasoning)),
            (BillingType::AudioOutput, audio_out, p.audio_out),
        ];
        let mut cost = Cost::default();
        if p.tier_unpriced {
            cost.unpriced.push("service_tier");
        }
        for (billing_type, tokens, unit) in parts {
            if tokens == 0 {
                continue;
            }
            let unit = match unit {
                Some(u) => u * factor,
                None => {
                    cost.unpriced.push(billing_type.as_str());
                    let from_fallback = fb.as_ref().and_then(|f| match billing_type {
                        BillingType::CacheWrite1h => f.write_1h,
                        BillingType::AudioInput => f.audio_in,
                        BillingType::AudioOutput => f.audio_out,
                        _ => None,
                    });
                    from_fallback.unwrap_or(Decimal::ZERO)
                }
            };
            let amount = Decimal::from(tokens) * unit / PER;
            cost.total += amount;
            cost.lines.push(CostLine {
                billing_type,
                tokens,
                unit_price: unit,
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

    /// Whether `model` has a sale price, or what `policy` charges in its place
    /// ([`UnpricedPolicy::ChargeAt`] a priced model).
    pub fn sale_priced(&self, model: &str, policy: Option<&UnpricedPolicy>) -> bool {
        self.standard.contains_key(model) || self.fallback(policy).is_some()
    }

    /// The [`UnpricedPolicy::ChargeAt`] card, when the policy names a priced standard model.
    fn fallback(&self, policy: Option<&UnpricedPolicy>) -> Option<&PriceCard> {
        match policy {
            Some(UnpricedPolicy::ChargeAt(m)) => self.standard.get(m),
            _ => None,
        }
    }

    /// The charge of `usage` on standard `model` under `policy`: the model's card with unpriced
    /// components at the fallback's prices (else $0), or, for a model without a sale price, the
    /// whole usage at the fallback's card with `model` in [`Cost::unpriced`]. `None` when neither
    /// prices it. The one function ingress (budgets) and billing (ledger) charge with.
    pub fn charge_with(
        &self,
        model: &str,
        usage: &Usage,
        batch: bool,
        policy: Option<&UnpricedPolicy>,
    ) -> Option<Cost> {
        let fallback = self.fallback(policy);
        match self.standard.get(model) {
            Some(card) => Some(card.cost_with(usage, batch, fallback)),
            None => fallback.map(|f| {
                let mut cost = f.cost(usage, batch);
                cost.unpriced.insert(0, "model");
                cost
            }),
        }
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

    /// The billing type and tokens of each line of `cost`.
    fn lines(cost: &Cost) -> Vec<(BillingType, u64)> {
        cost.lines
            .iter()
            .map(|l| (l.billing_type, l.tokens))
            .collect()
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
        assert_eq!(
            lines(&cost),
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
        const M: u64 = 1_000_000;
        let c = Catalog::bundled().unwrap();
        // (model, batch, [prompt, completion, reasoning] tokens, total)
        for (model, batch, [prompt_tokens, completion_tokens, reasoning_tokens], total) in [
            ("gemini-2.5-pro", false, [1000, 1000, 0], "0.01125"),
            // 200001 × 2.50 + 1000 × 15 per 1M.
            ("gemini-2.5-pro", false, [200_001, 1000, 0], "0.5150025"),
            ("gpt-4o-mini", true, [M, M, 400_000], "0.375"),
        ] {
            let u = Usage {
                prompt_tokens,
                completion_tokens,
                reasoning_tokens,
                ..Usage::default()
            };
            let cost = c.upstream_cost(model, &u, batch).unwrap();
            assert_eq!(cost.total, d(total), "{model} {u:?}");
        }
    }

    fn card(yaml: &str) -> PriceCard {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    fn claude_t() -> PriceCard {
        card("{input: 3, cache_write: 3.75, cache_write_1h: 6.00, cached_input: 0.30, output: 15}")
    }

    /// FC-34: 12 new input, 9628 one-hour writes, 20 output → $0.058104; 1000 (5 m) / 2000 (1 h)
    /// → $0.016086; without the 1-hour split all writes are 5-minute ones.
    #[test]
    fn fc34_cache_write_by_ttl() {
        let u = Usage {
            prompt_tokens: 12 + 9628,
            cache_write_tokens: 9628,
            cache_write_1h_tokens: 9628,
            completion_tokens: 20,
            ..Usage::default()
        };
        let cost = claude_t().cost(&u, false);
        assert_eq!(cost.total.to_string(), "0.058104");
        assert!(cost.unpriced.is_empty());
        assert_eq!(
            lines(&cost),
            vec![
                (BillingType::NewInput, 12),
                (BillingType::CacheWrite1h, 9628),
                (BillingType::Output, 20)
            ]
        );
        let split = Usage {
            prompt_tokens: 3012,
            cache_write_tokens: 3000,
            cache_write_1h_tokens: 2000,
            completion_tokens: 20,
            ..Usage::default()
        };
        assert_eq!(claude_t().cost(&split, false).total.to_string(), "0.016086");
        let all_5m = Usage {
            cache_write_1h_tokens: 0,
            ..split
        };
        // 12 × 3 + 3000 × 3.75 + 20 × 15.
        assert_eq!(
            claude_t().cost(&all_5m, false).total.to_string(),
            "0.011586"
        );
        // A card without a 1-hour price: the writes are an unpriced component, at $0 or at the
        // fallback card's price.
        let no_1h = card("{input: 3, cache_write: 3.75, output: 15}");
        let c = no_1h.cost(&split, false);
        assert_eq!(c.unpriced, vec!["cache_write_1h"]);
        assert_eq!(c.total.to_string(), "0.004086");
        let c = no_1h.cost_with(&split, false, Some(&claude_t()));
        assert_eq!(c.total.to_string(), "0.016086");
        assert_eq!(c.unpriced, vec!["cache_write_1h"]);
    }

    #[test]
    fn absent_prices_are_left_out_of_the_json() {
        let c = card("{input: 1.25, output: 10, flex: {input: 0.625, output: 5}}");
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!({"input": "1.25", "output": "10", "flex": {"input": "0.625", "output": "5"}})
        );
    }

    /// FC-35: Gemini 10000 prompt (8000 cached), 450 completion (400 thoughts) → $0.008.
    #[test]
    fn fc35_gemini_thoughts_and_implicit_cache() {
        let gem = card("{input: 1.25, cached_input: 0.125, output: 10}");
        let u = Usage {
            prompt_tokens: 10000,
            cached_tokens: 8000,
            completion_tokens: 450,
            reasoning_tokens: 400,
            ..Usage::default()
        };
        assert_eq!(gem.cost(&u, false).total.to_string(), "0.008");
    }

    #[test]
    fn service_tier_audio_and_policy() {
        let c = card(
            "{input: 1.25, output: 10, audio_input: 40, priority: {input: 2.5, output: 20}, \
             flex: {input: 0.625, output: 5}}",
        );
        let base = Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 1_000_000,
            ..Usage::default()
        };
        let prio = Usage {
            service_tier: Some(ServiceTier::Priority),
            ..base
        };
        let flex = Usage {
            service_tier: Some(ServiceTier::Flex),
            ..base
        };
        assert_eq!(c.cost(&base, false).total, d("11.25"));
        assert_eq!(c.cost(&prio, false).total, d("22.5"));
        assert_eq!(c.cost(&flex, false).total, d("5.625"));
        // No flex prices on the card: base prices, flagged.
        let plain = card("{input: 1.25, output: 10}");
        let cost = plain.cost(&flex, false);
        assert_eq!(
            (cost.total, cost.unpriced),
            (d("11.25"), vec!["service_tier"])
        );
        // 1M prompt of which 100k audio; 1M completion of which 10k audio (no audio_output).
        let audio = Usage {
            audio_input_tokens: 100_000,
            audio_output_tokens: 10_000,
            ..base
        };
        let cost = c.cost(&audio, false);
        assert_eq!(cost.unpriced, vec!["audio_output"]);
        // 900k × 1.25 + 100k × 40 + 990k × 10 per 1M.
        assert_eq!(cost.total, d("15.025"));
        // The catalog's charge under a policy: an unpriced model at the fallback's card.
        let mut cat = Catalog::empty();
        cat.standard.insert("std/priced".into(), plain.clone());
        let policy = UnpricedPolicy::ChargeAt("std/priced".into());
        let charged = cat
            .charge_with("std/unknown", &base, false, Some(&policy))
            .unwrap();
        assert_eq!(
            (charged.total, charged.unpriced),
            (d("11.25"), vec!["model"])
        );
        assert!(cat.charge_with("std/unknown", &base, false, None).is_none());
        assert!(cat.sale_priced("std/unknown", Some(&policy)));
        assert!(!cat.sale_priced("std/unknown", Some(&UnpricedPolicy::Zero)));
        let p: UnpricedPolicy = serde_yaml_ng::from_str("{charge_at: std/priced}").unwrap();
        assert_eq!(p, policy);
        let p: UnpricedPolicy = serde_yaml_ng::from_str("reject").unwrap();
        assert_eq!(p, UnpricedPolicy::Reject);
        assert!(serde_yaml_ng::from_str::<UnpricedPolicy>("{charge_at: x, y: 1}").is_err());
        assert!(serde_yaml_ng::from_str::<UnpricedPolicy>("rejected").is_err());
    }

    /// Long-context tiers apply per model: Sonnet 4 above 200k, Gemini 2.5 Pro above 200k, and
    /// not on a model without tiers.
    #[test]
    fn long_context_tiers_per_model() {
        let c = Catalog::bundled().unwrap();
        let big = Usage {
            prompt_tokens: 200_001,
            completion_tokens: 1000,
            ..Usage::default()
        };
        let total = |m: &str| c.upstream_cost(m, &big, false).unwrap().total;
        // 200001 × 6 + 1000 × 22.50.
        assert_eq!(total("claude-sonnet-4-20250514"), d("1.222506"));
        assert_eq!(total("gemini-2.5-pro"), d("0.5150025"));
        // gpt-4o: no tier, 200001 × 2.50 + 1000 × 10.
        assert_eq!(total("gpt-4o"), d("0.5100025"));
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
