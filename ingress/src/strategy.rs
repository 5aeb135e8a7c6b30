//! Candidate ordering: which of a model's targets to try, and in which order.
//!
//! [`plan`] is a pure function of the config snapshot, what the request needs ([`Needs`]), the
//! client's preferences ([`Preferences`]) and what this ingress observes about each target
//! ([`Observed`]). It works in four steps:
//!
//! 1. **Client filters**: `x-switchyard-only` keeps only the listed targets, `x-switchyard-ignore`
//!    drops the listed ones.
//! 2. **Eligibility**, first failing check wins: the target is `enabled`; its provider has every
//!    capability the request uses ([`Capabilities`]: tools, vision, JSON mode, embeddings,
//!    several choices); the
//!    estimated prompt plus `max_tokens` fits its `context_window` (with `trim_context`, the part
//!    trimming can never drop must fit); it is not `unhealthy`.
//! 3. **Strategy** of the model's policy orders the eligible targets (ties always go to the lower
//!    `priority`, then to the order in the model's `targets` list). `degraded` targets then move
//!    behind the others, and `x-switchyard-order` finally puts the listed targets first, in the
//!    listed order.
//! 4. The list is cut to the policy's `max_attempts`.
//!
//! When nothing is eligible the error says why. If the request itself is what no target can take,
//! it is a 400: `context_length_exceeded` when every target was too small, `invalid_request_error`
//! naming the parameter (`response_format`, `messages`, `tools`, `n`, or `model` for embeddings) when
//! every enabled target lacks a capability the request uses. Otherwise (some target unhealthy)
//! it is a 503 `no_capacity` listing each target's reason.

use rand::Rng;
use rand::distr::Distribution;
use rand::distr::weighted::WeightedIndex;
use rust_decimal::Decimal;
use rust_decimal::prelude::ToPrimitive;
use std::collections::HashMap;
use switchyard_schemas::config::{
    GatewayConfig, ModelConfig, OpenAiApi, ProviderKind, TargetConfig,
};
use switchyard_schemas::health::HealthState;
use switchyard_schemas::request::{ContentPart, Message, Role, SamplingParams, Tool};
use switchyard_schemas::routing::{Policy, Strategy};
use switchyard_schemas::{ErrorClass, ErrorInfo};

pub use switchyard_schemas::capabilities::Capabilities;

/// The first capability in `needs` that `caps` lacks.
fn missing(caps: Capabilities, needs: &Needs) -> Option<&'static str> {
    [
        (needs.tools && !caps.tools, "tools"),
        (needs.vision && !caps.vision, "vision"),
        (needs.json_mode && !caps.json_mode, "json_mode"),
        (needs.embeddings && !caps.embeddings, "embeddings"),
        (needs.choices && !caps.choices, "n"),
    ]
    .into_iter()
    .find_map(|(lacks, name)| lacks.then_some(name))
}

/// The capability table of one ingress: [`Capabilities::of`] unless overridden (for a deployment
/// whose provider lacks a feature, and for tests).
#[derive(Debug, Default)]
pub struct CapabilityTable {
    overrides: parking_lot::RwLock<HashMap<ProviderKind, Capabilities>>,
}

impl CapabilityTable {
    /// The capabilities of `kind`.
    pub fn get(&self, kind: ProviderKind) -> Capabilities {
        self.overrides
            .read()
            .get(&kind)
            .copied()
            .unwrap_or(Capabilities::of(kind))
    }

    /// Replaces the capabilities of `kind` for this process.
    pub fn set(&self, kind: ProviderKind, caps: Capabilities) {
        self.overrides.write().insert(kind, caps);
    }
}

/// What a request needs from a target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    /// Tools are declared, or the conversation holds tool calls or results.
    pub tools: bool,
    /// A message holds an image.
    pub vision: bool,
    /// `response_format` is `json_object` or `json_schema`.
    pub json_mode: bool,
    /// An embeddings request.
    pub embeddings: bool,
    /// Several choices (`n > 1`).
    pub choices: bool,
    /// Estimated prompt tokens; `None` when not measured because the prompt fits every window.
    pub prompt_tokens: Option<u64>,
    /// With `trim_context`: the estimated tokens trimming can never drop (system prompts and the
    /// latest turn).
    pub min_prompt_tokens: Option<u64>,
    /// Tokens reserved for the answer (`max_tokens`, 0 when unset).
    pub max_tokens: u64,
}

impl Needs {
    /// The capabilities a chat request uses (token counts are left for the caller).
    pub fn chat(messages: &[Message], tools: &[Tool], params: &SamplingParams) -> Self {
        let tools = !tools.is_empty()
            || messages
                .iter()
                .any(|m| !m.tool_calls.is_empty() || m.role == Role::Tool);
        let vision = messages.iter().any(|m| {
            matches!(&m.content, Some(switchyard_schemas::request::Content::Parts(parts))
                if parts.iter().any(|p| matches!(p, ContentPart::ImageUrl { .. })))
        });
        let json_mode = params
            .response_format
            .as_ref()
            .and_then(|f| f.get("type"))
            .and_then(|t| t.as_str())
            .is_some_and(|t| t == "json_object" || t == "json_schema");
        Self {
            tools,
            vision,
            json_mode,
            choices: params.n.is_some_and(|n| n > 1),
            max_tokens: params.max_tokens.map(u64::from).unwrap_or(0),
            ..Self::default()
        }
    }

    /// An embeddings request.
    pub fn embeddings() -> Self {
        Self {
            embeddings: true,
            ..Self::default()
        }
    }
}

/// The client's routing preferences, from request headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preferences {
    /// `x-switchyard-only`: only these target ids.
    pub only: Option<Vec<String>>,
    /// `x-switchyard-ignore`: never these target ids.
    pub ignore: Vec<String>,
    /// `x-switchyard-order`: these target ids first, in this order.
    pub order: Vec<String>,
    /// The user id the canary split hashes (`x-switchyard-user`, else the body's `user`).
    pub user: Option<String>,
}

/// Default share of requests that try a degraded target first (see [`probe_first`]).
pub const PROBE_SHARE: f64 = 0.05;

/// With probability `share` (normally [`PROBE_SHARE`]), moves the first degraded target to the
/// front: the probes a half-open breaker needs to close again. A failed probe still falls back
/// before any content, so the client only sees the extra latency.
pub fn probe_first<R: Rng + ?Sized>(
    targets: &mut Vec<&TargetConfig>,
    health: impl Fn(&str) -> HealthState,
    share: f64,
    rng: &mut R,
) {
    if targets.len() < 2 || rng.random::<f64>() >= share {
        return;
    }
    if let Some(i) = targets
        .iter()
        .position(|t| health(&t.id) == HealthState::Degraded)
    {
        let probe = targets.remove(i);
        targets.insert(0, probe);
    }
}

/// What this ingress knows about one target when planning.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observed {
    /// Latest health.
    pub health: HealthState,
    /// EWMA of recent time to first content, ms; `None` = never measured (counts as 0).
    pub ttft_ms: Option<f64>,
    /// Requests in flight to it from this ingress.
    pub in_flight: u64,
    /// Cost price, USD per 1M input + 1M output tokens; `None` = not in the catalog.
    pub cost: Option<Decimal>,
    /// Its provider's capabilities.
    pub capabilities: Capabilities,
}

impl Observed {
    /// A healthy, idle, never-measured, unpriced target of `kind`.
    pub fn fresh(kind: ProviderKind) -> Self {
        Self {
            health: HealthState::Healthy,
            ttft_ms: None,
            in_flight: 0,
            cost: None,
            capabilities: Capabilities::of(kind),
        }
    }
}

/// The ordered targets to try.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    /// In order; never empty.
    pub targets: Vec<&'a TargetConfig>,
    /// The model's policy, if it names one.
    pub policy: Option<&'a Policy>,
    /// Under `canary`: whether this request fell in the canary share.
    pub canary: Option<bool>,
}

/// Why a target was left out.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Exclusion {
    Disabled,
    Lacks(ProviderKind, &'static str),
    Context { needed: u64, window: u64 },
    Unhealthy,
}

impl std::fmt::Display for Exclusion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Disabled => f.write_str("disabled"),
            Self::Lacks(kind, what) => write!(f, "provider {} lacks {what}", kind.as_str()),
            Self::Context { needed, window } => {
                write!(f, "needs ~{needed} tokens, context window is {window}")
            }
            Self::Unhealthy => f.write_str("unhealthy"),
        }
    }
}

/// An eligible target with what the strategy ranks it by.
#[derive(Debug, Clone, Copy)]
struct Cand<'a> {
    target: &'a TargetConfig,
    /// Position in the model's `targets` list.
    index: usize,
    obs: Observed,
}

impl Cand<'_> {
    fn base_key(&self) -> (i32, usize) {
        (self.target.priority, self.index)
    }
}

/// FNV-1a, 64 bit: a hash every replica and every release computes alike (std's `DefaultHasher`
/// promises neither), so a user stays on the same side of a canary split everywhere.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The user's stable position in 0–100 (two decimals) for canary splits.
pub fn canary_bucket(user: &str) -> f64 {
    (fnv1a64(user.as_bytes()) % 10_000) as f64 / 100.0
}

/// Orders `model`'s targets for one request (see the module docs).
pub fn plan<'a, R: Rng + ?Sized>(
    config: &'a GatewayConfig,
    model: &'a ModelConfig,
    needs: &Needs,
    prefs: &Preferences,
    observe: impl Fn(&TargetConfig) -> Observed,
    rng: &mut R,
) -> Result<Plan<'a>, ErrorInfo> {
    let policy = model.policy.as_deref().and_then(|p| config.policy(p));
    let all: Vec<(usize, &TargetConfig)> = model
        .targets
        .iter()
        .filter_map(|id| config.target(id))
        .enumerate()
        .collect();
    let preferred: Vec<(usize, &TargetConfig)> = all
        .iter()
        .copied()
        .filter(|(_, t)| {
            prefs.only.as_ref().is_none_or(|only| only.contains(&t.id))
                && !prefs.ignore.contains(&t.id)
        })
        .collect();
    if preferred.is_empty() && !all.is_empty() {
        let header = if prefs.only.is_some() {
            "x-switchyard-only"
        } else {
            "x-switchyard-ignore"
        };
        let ids: Vec<&str> = all.iter().map(|(_, t)| t.id.as_str()).collect();
        return Err(ErrorInfo::new(
            ErrorClass::InvalidRequest,
            format!(
                "Header `{header}` leaves none of the targets of model `{}` ({}).",
                model.id,
                ids.join(", ")
            ),
        )
        .with_param(header));
    }

    let mut eligible = Vec::new();
    let mut excluded = Vec::new();
    for (index, target) in preferred {
        let obs = observe(target);
        match exclusion(target, &obs, needs) {
            Some(why) => excluded.push((target.id.as_str(), why)),
            None => eligible.push(Cand { target, index, obs }),
        }
    }
    if eligible.is_empty() {
        return Err(nothing_eligible(model, needs, &excluded));
    }

    let mut canary = None;
    let strategy = policy.map(|p| p.strategy).unwrap_or_default();
    let mut ordered = match strategy {
        Strategy::Priority => by_priority(eligible),
        Strategy::Weighted => weighted(eligible, rng),
        Strategy::LowestCost => {
            let mut v = eligible;
            v.sort_by(|a, b| {
                let (ca, cb) = (a.obs.cost, b.obs.cost);
                // Unpriced targets go after every priced one.
                (ca.is_none(), ca)
                    .cmp(&(cb.is_none(), cb))
                    .then(a.base_key().cmp(&b.base_key()))
            });
            v
        }
        Strategy::LowestLatency => {
            let mut v = eligible;
            v.sort_by(|a, b| {
                let (la, lb) = (a.obs.ttft_ms.unwrap_or(0.0), b.obs.ttft_ms.unwrap_or(0.0));
                la.total_cmp(&lb).then(a.base_key().cmp(&b.base_key()))
            });
            v
        }
        Strategy::LeastBusy => {
            let mut v = eligible;
            v.sort_by_key(|c| (c.obs.in_flight, c.base_key()));
            v
        }
        Strategy::Canary => {
            let (v, hit) = canary_order(eligible, policy, prefs, rng);
            canary = hit;
            v
        }
        Strategy::Composite => composite(eligible, policy),
    };
    // Degraded targets last (stable: the strategy's order holds within each group).
    ordered.sort_by_key(|c| c.obs.health == HealthState::Degraded);
    // The client's explicit order wins.
    if !prefs.order.is_empty() {
        ordered.sort_by_key(|c| {
            prefs
                .order
                .iter()
                .position(|id| *id == c.target.id)
                .unwrap_or(usize::MAX)
        });
    }
    let mut targets: Vec<&TargetConfig> = ordered.into_iter().map(|c| c.target).collect();
    if let Some(max) = policy.and_then(|p| p.max_attempts) {
        targets.truncate(max.max(1) as usize);
    }
    Ok(Plan {
        targets,
        policy,
        canary,
    })
}

/// The first eligibility check `target` fails.
fn exclusion(target: &TargetConfig, obs: &Observed, needs: &Needs) -> Option<Exclusion> {
    if !target.enabled {
        return Some(Exclusion::Disabled);
    }
    if let Some(what) = missing(obs.capabilities, needs) {
        return Some(Exclusion::Lacks(target.provider, what));
    }
    // The Responses API has no `n`, whatever the provider's Chat Completions API has.
    if needs.choices && target.api == OpenAiApi::Responses {
        return Some(Exclusion::Lacks(target.provider, "n"));
    }
    if let (Some(window), Some(prompt)) = (target.context_window, needs.prompt_tokens) {
        let needed = needs.min_prompt_tokens.unwrap_or(prompt) + needs.max_tokens;
        if needed > window {
            return Some(Exclusion::Context { needed, window });
        }
    }
    if obs.health == HealthState::Unhealthy {
        return Some(Exclusion::Unhealthy);
    }
    None
}

/// The error when no target is eligible.
fn nothing_eligible(
    model: &ModelConfig,
    needs: &Needs,
    excluded: &[(&str, Exclusion)],
) -> ErrorInfo {
    let every = |f: fn(&Exclusion) -> bool| excluded.iter().all(|(_, e)| f(e));
    if every(|e| matches!(e, Exclusion::Context { .. })) {
        let largest = excluded
            .iter()
            .filter_map(|(_, e)| match e {
                Exclusion::Context { window, .. } => Some(*window),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let prompt = needs.min_prompt_tokens.or(needs.prompt_tokens).unwrap_or(0);
        return ErrorInfo::new(
            ErrorClass::ContextLengthExceeded,
            format!(
                "This request needs about {} tokens ({prompt} in the prompt + {} max_tokens), \
                 more than the context window of any target of model `{}` (largest {largest}).",
                prompt + needs.max_tokens,
                needs.max_tokens,
                model.id
            ),
        )
        .with_param("messages");
    }
    // Every enabled target lacks a capability the request uses: this model can never serve the
    // request, so it is the caller's to change — a 400 naming the parameter, as the worker's own
    // answer would be.
    let lacking = excluded.iter().find_map(|(_, e)| match e {
        Exclusion::Lacks(_, what) => Some(*what),
        _ => None,
    });
    if let Some(what) = lacking
        && every(|e| matches!(e, Exclusion::Lacks(..) | Exclusion::Disabled))
    {
        let param = match what {
            "json_mode" => "response_format",
            "vision" => "messages",
            "tools" => "tools",
            "n" => "n",
            _ => "model",
        };
        let reasons: Vec<String> = excluded
            .iter()
            .filter(|(_, e)| matches!(e, Exclusion::Lacks(..)))
            .map(|(id, why)| format!("{id}: {why}"))
            .collect();
        return ErrorInfo::new(
            ErrorClass::InvalidRequest,
            format!(
                "Model `{}` has no target that supports {what} ({}).",
                model.id,
                reasons.join("; ")
            ),
        )
        .with_param(param);
    }
    if every(|e| matches!(e, Exclusion::Disabled)) {
        return ErrorInfo::new(ErrorClass::NoCapacity, "no enabled target for this model");
    }
    let summary = if every(|e| matches!(e, Exclusion::Unhealthy | Exclusion::Disabled)) {
        "every target is unhealthy"
    } else {
        "no target can serve this request"
    };
    let reasons: Vec<String> = excluded
        .iter()
        .map(|(id, why)| format!("{id}: {why}"))
        .collect();
    ErrorInfo::new(
        ErrorClass::NoCapacity,
        format!("Model `{}`: {summary} ({}).", model.id, reasons.join("; ")),
    )
}

fn by_priority(mut v: Vec<Cand<'_>>) -> Vec<Cand<'_>> {
    v.sort_by_key(Cand::base_key);
    v
}

/// One target drawn by `weight`, then the rest by priority.
fn weighted<'a, R: Rng + ?Sized>(v: Vec<Cand<'a>>, rng: &mut R) -> Vec<Cand<'a>> {
    let mut rest = by_priority(v);
    let weights: Vec<f64> = rest.iter().map(|c| c.target.weight.max(0.0)).collect();
    // All weights zero (or invalid): plain priority.
    if let Ok(dist) = WeightedIndex::new(&weights) {
        let first = rest.remove(dist.sample(rng));
        rest.insert(0, first);
    }
    rest
}

/// Canary first for users in the share, last for the others.
fn canary_order<'a, R: Rng + ?Sized>(
    v: Vec<Cand<'a>>,
    policy: Option<&Policy>,
    prefs: &Preferences,
    rng: &mut R,
) -> (Vec<Cand<'a>>, Option<bool>) {
    let mut v = by_priority(v);
    let Some(canary) = policy.and_then(|p| p.canary.as_ref()) else {
        return (v, None);
    };
    let Some(pos) = v.iter().position(|c| c.target.id == canary.target) else {
        return (v, None);
    };
    // Without a user id the request itself is the unit: a random draw keeps the traffic share.
    let bucket = match &prefs.user {
        Some(user) => canary_bucket(user),
        None => rng.random_range(0.0..100.0),
    };
    let hit = bucket < canary.percent;
    let c = v.remove(pos);
    if hit {
        v.insert(0, c);
    } else {
        v.push(c);
    }
    (v, Some(hit))
}

/// `(max - x) / (max - min)` over `values` (1 when all are equal): lower is better.
fn lower_is_better(x: f64, values: impl Iterator<Item = f64> + Clone) -> f64 {
    let max = values.clone().fold(f64::NEG_INFINITY, f64::max);
    let min = values.fold(f64::INFINITY, f64::min);
    // All equal (or no values): every candidate is as good as the best.
    if max.partial_cmp(&min) != Some(std::cmp::Ordering::Greater) {
        return 1.0;
    }
    ((max - x) / (max - min)).clamp(0.0, 1.0)
}

/// The composite score of each candidate, highest first.
fn composite<'a>(v: Vec<Cand<'a>>, policy: Option<&Policy>) -> Vec<Cand<'a>> {
    let w = policy.map(|p| p.weights.clone()).unwrap_or_default();
    let priorities = v.iter().map(|c| f64::from(c.target.priority));
    let costs = v.iter().filter_map(|c| c.obs.cost.and_then(|d| d.to_f64()));
    let latencies = v.iter().map(|c| c.obs.ttft_ms.unwrap_or(0.0));
    let mut scored: Vec<(f64, Cand<'a>)> = v
        .iter()
        .map(|c| {
            let health = match c.obs.health {
                HealthState::Healthy => 1.0,
                HealthState::Degraded => 0.5,
                HealthState::Unhealthy => 0.0,
            };
            let cost = match c.obs.cost.and_then(|d| d.to_f64()) {
                Some(x) => lower_is_better(x, costs.clone()),
                None => 0.0,
            };
            let headroom = match c.target.limits.max_concurrency {
                Some(m) if m > 0 => (1.0 - c.obs.in_flight as f64 / f64::from(m)).clamp(0.0, 1.0),
                _ => 1.0 / (1.0 + c.obs.in_flight as f64),
            };
            let score = w.priority
                * lower_is_better(f64::from(c.target.priority), priorities.clone())
                + w.health * health
                + w.cost * cost
                + w.latency * lower_is_better(c.obs.ttft_ms.unwrap_or(0.0), latencies.clone())
                + w.headroom * headroom;
            (score, *c)
        })
        .collect();
    scored.sort_by(|(sa, a), (sb, b)| sb.total_cmp(sa).then(a.base_key().cmp(&b.base_key())));
    scored.into_iter().map(|(_, c)| c).collect()
}

/// Cost price of `upstream_model` per 1M input + 1M output tokens, from `catalog`.
pub fn cost_per_million(
    catalog: &switchyard_schemas::pricing::Catalog,
    upstream_model: &str,
) -> Option<Decimal> {
    catalog
        .upstream
        .get(upstream_model)
        .map(|card| card.input + card.output)
}

#[cfg(test)]
#[path = "strategy_tests.rs"]
mod tests;
