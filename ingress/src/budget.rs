//! Budgets and token quotas per key and per tenant: admission *reserves* the estimated charge,
//! completion *settles* with the actual charge and releases the rest.
//!
//! # Storage
//! One JetStream KV entry per scope (`key.<id>`, `tenant.<id>`) in the bucket
//! [`BUDGETS_BUCKET`] (file storage, so spend survives a NATS restart), holding a [`Spend`]: the
//! settled spend and tokens of the current UTC day, month and clock minute, plus the open
//! reservations (`held`, by request id). Every change is a compare-and-set on the entry's
//! revision, retried on conflict, so any number of ingress replicas share one exact view: two
//! replicas can never both admit the last dollar.
//!
//! # Admission
//! A request is admitted when, for every limit of its key and of its tenant,
//! `settled + held + this request's estimate ≤ limit`. The estimate is the sale price
//! (`standard:` in the pricing catalog) of the tokenizer-estimated input plus `max_tokens` (or
//! `budgets.default_max_tokens`) output, times `1 + budgets.safety_margin`. Over a limit → 429
//! `insufficient_quota` naming the budget. The key is reserved first, then the tenant; a failed
//! tenant reservation releases the key's. A reservation not settled by its request's deadline
//! plus `budgets.hold_grace_ms` (an ingress that died) expires on the next write to the entry.
//!
//! # Settlement
//! With the charge of the tokens the upstream reported (0 for cache hits and failures before
//! any upstream usage), added to the windows current at settlement time. The billing ledger
//! stays the record of truth; these entries are admission state.
//!
//! Fail-closed: when the KV store cannot be reached, a caller with budgets gets 503 rather than
//! unmetered spend.

use crate::AppState;
use crate::charge::Caller;
use crate::error::ApiError;
use async_nats::jetstream::kv;
use axum::http::StatusCode;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use switchyard_schemas::config::{GatewayConfig, ModelConfig};
use switchyard_schemas::now_ms;
use switchyard_schemas::pricing::Catalog;
use switchyard_schemas::request::{Message, Tool};
use switchyard_schemas::tenancy::Budget;
use switchyard_schemas::usage::Usage;

/// The KV bucket holding one [`Spend`] per key and tenant.
pub const BUDGETS_BUCKET: &str = "SY_BUDGETS";

/// Compare-and-set attempts before giving up (each conflict means another replica wrote).
const MAX_CAS_ATTEMPTS: usize = 64;

/// What one request consumes: charge in USD and tokens (input + output).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Demand {
    /// Sale-price charge, USD.
    pub usd: Decimal,
    /// Input + output tokens.
    pub tokens: u64,
}

/// An open reservation (value of [`Spend::held`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// Reserved charge, USD.
    pub usd: Decimal,
    /// Reserved tokens.
    pub tokens: u64,
    /// Expiry, ms since the epoch.
    pub until_ms: u64,
}

/// The stored state of one scope (JSON value of its KV entry). Windows are UTC.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spend {
    /// The day `day_usd` / `day_tokens` count, `YYYY-MM-DD`.
    pub day: String,
    /// Settled charge today, USD.
    pub day_usd: Decimal,
    /// Settled tokens today.
    pub day_tokens: u64,
    /// The month `month_usd` counts, `YYYY-MM`.
    pub month: String,
    /// Settled charge this month, USD.
    pub month_usd: Decimal,
    /// The clock minute `minute_tokens` counts (minutes since the epoch).
    pub minute: u64,
    /// Settled tokens this minute.
    pub minute_tokens: u64,
    /// Open reservations by request id.
    pub held: BTreeMap<String, Held>,
}

/// `(YYYY-MM-DD, YYYY-MM, minute since epoch)` of `ms`.
fn windows(ms: u64) -> (String, String, u64) {
    let t = time::OffsetDateTime::from_unix_timestamp((ms / 1000) as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let (y, m, d) = (t.year(), u8::from(t.month()), t.day());
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{y:04}-{m:02}"),
        ms / 60_000,
    )
}

impl Spend {
    /// The state at `now_ms`: past windows reset, expired reservations dropped.
    fn at(mut self, now_ms: u64) -> Self {
        let (day, month, minute) = windows(now_ms);
        if self.day != day {
            self.day = day;
            self.day_usd = Decimal::ZERO;
            self.day_tokens = 0;
        }
        if self.month != month {
            self.month = month;
            self.month_usd = Decimal::ZERO;
        }
        if self.minute != minute {
            self.minute = minute;
            self.minute_tokens = 0;
        }
        self.held.retain(|_, h| h.until_ms > now_ms);
        self
    }

    fn held_total(&self) -> Demand {
        self.held.values().fold(Demand::default(), |a, h| Demand {
            usd: a.usd + h.usd,
            tokens: a.tokens + h.tokens,
        })
    }

    /// Share of `budget.daily_usd` spent or reserved (None without a daily budget).
    pub fn daily_share(&self, budget: &Budget) -> Option<Decimal> {
        let limit = budget.daily_usd?;
        if limit.is_zero() {
            return Some(Decimal::ONE);
        }
        Some((self.day_usd + self.held_total().usd) / limit)
    }

    /// The first limit of `budget` that `demand` would exceed.
    fn exceeded(&self, budget: &Budget, demand: Demand) -> Option<Exceeded> {
        let held = self.held_total();
        let usd = |limit: Option<Decimal>, used: Decimal, period| {
            limit
                .filter(|l| used + held.usd + demand.usd > *l)
                .map(|limit| Exceeded::Usd {
                    period,
                    limit,
                    used: used + held.usd,
                    need: demand.usd,
                })
        };
        let tokens = |limit: Option<u64>, used: u64, period| {
            limit
                .filter(|l| used + held.tokens + demand.tokens > *l)
                .map(|limit| Exceeded::Tokens {
                    period,
                    limit,
                    used: used + held.tokens,
                    need: demand.tokens,
                })
        };
        usd(budget.daily_usd, self.day_usd, "daily")
            .or_else(|| usd(budget.monthly_usd, self.month_usd, "monthly"))
            .or_else(|| tokens(budget.tokens_per_minute, self.minute_tokens, "per-minute"))
            .or_else(|| tokens(budget.tokens_per_day, self.day_tokens, "daily"))
    }
}

/// Which limit a request would exceed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Exceeded {
    Usd {
        period: &'static str,
        limit: Decimal,
        used: Decimal,
        need: Decimal,
    },
    Tokens {
        period: &'static str,
        limit: u64,
        used: u64,
        need: u64,
    },
}

/// A key or a tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct Scope {
    /// `key` or `tenant`.
    pub kind: &'static str,
    /// Its id.
    pub id: String,
    /// Its limits.
    pub budget: Budget,
}

impl Scope {
    fn kv_key(&self) -> String {
        format!("{}.{}", self.kind, self.id)
    }

    fn over(&self, e: Exceeded) -> ApiError {
        let (message, retry) = match e {
            Exceeded::Usd {
                period,
                limit,
                used,
                need,
            } => (
                format!(
                    "The {period} budget of {} `{}` would be exceeded: ${} of ${} spent or reserved, \
                     this request needs up to ${}.",
                    self.kind,
                    self.id,
                    used.round_dp(6).normalize(),
                    limit.normalize(),
                    need.round_dp(6).normalize()
                ),
                None,
            ),
            Exceeded::Tokens {
                period,
                limit,
                used,
                need,
            } => (
                format!(
                    "The {period} token quota of {} `{}` would be exceeded: {used} of {limit} tokens \
                     used or reserved, this request needs up to {need}.",
                    self.kind, self.id
                ),
                (period == "per-minute").then(|| 60 - (now_ms() / 1000) % 60),
            ),
        };
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message,
            kind: "insufficient_quota",
            param: None,
            code: Some("insufficient_quota"),
            retry_after_s: retry,
        }
    }
}

/// The scopes with limits that apply to `caller` under `config` (key first, then tenant).
pub fn scopes(config: &GatewayConfig, caller: &Caller) -> Vec<Scope> {
    let mut out = Vec::new();
    if let Some(k) = caller
        .key_id
        .as_deref()
        .and_then(|id| config.keys.iter().find(|k| k.id == id))
        && k.budget.is_limited()
    {
        out.push(Scope {
            kind: "key",
            id: k.id.clone(),
            budget: k.budget.clone(),
        });
    }
    if let Some(t) = caller
        .tenant
        .as_deref()
        .and_then(|id| config.tenants.iter().find(|t| t.id == id))
        && t.budget.is_limited()
    {
        out.push(Scope {
            kind: "tenant",
            id: t.id.clone(),
            budget: t.budget.clone(),
        });
    }
    out
}

/// The charge of `usage` on `model` at sale price (zero when the model is unpriced).
pub fn charge_of(catalog: Option<&Catalog>, model: &str, usage: &Usage) -> Decimal {
    catalog
        .and_then(|c| c.charge(model, usage, false))
        .map_or(Decimal::ZERO, |c| c.total)
}

/// The reservation for a request: `prompt_tokens` estimated input, `max_output` output tokens,
/// priced at `model`'s sale price, plus `margin` (a share).
pub fn estimate(
    catalog: Option<&Catalog>,
    model: &str,
    prompt_tokens: u64,
    max_output: u64,
    margin: Decimal,
) -> Demand {
    let usage = Usage {
        prompt_tokens,
        completion_tokens: max_output,
        ..Usage::default()
    };
    let base = charge_of(catalog, model, &usage);
    Demand {
        usd: base * (Decimal::ONE + margin),
        tokens: prompt_tokens + max_output,
    }
}

/// The shared budget store (a handle to [`BUDGETS_BUCKET`]).
#[derive(Clone)]
pub struct Budgets {
    kv: Option<kv::Store>,
}

impl std::fmt::Debug for Budgets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budgets")
            .field("shared", &self.kv.is_some())
            .finish()
    }
}

/// Open reservations of one request, released or settled exactly once.
#[derive(Debug)]
pub struct Reservation {
    budgets: Budgets,
    scopes: Vec<Scope>,
    request_id: String,
    /// What was reserved.
    pub demand: Demand,
}

impl Budgets {
    /// Opens (or creates, in file storage) [`BUDGETS_BUCKET`]. Without JetStream the store is
    /// absent and callers with budgets are refused (fail-closed).
    pub async fn connect(js: &async_nats::jetstream::Context) -> Self {
        let open = async {
            if let Ok(kv) = js.get_key_value(BUDGETS_BUCKET).await {
                return Some(kv);
            }
            let created = js
                .create_key_value(kv::Config {
                    bucket: BUDGETS_BUCKET.to_owned(),
                    description: "Switchyard budgets: spend and reservations per key and tenant"
                        .to_owned(),
                    history: 1,
                    // Monthly windows must outlive a quiet month's last write.
                    max_age: std::time::Duration::from_secs(40 * 24 * 3600),
                    storage: async_nats::jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await;
            match created {
                Ok(kv) => Some(kv),
                // Another replica may have created it in between.
                Err(e) => js.get_key_value(BUDGETS_BUCKET).await.ok().or_else(|| {
                    tracing::warn!(error = %e, "no JetStream KV for budgets: callers with budgets are refused");
                    None
                }),
            }
        };
        Self { kv: open.await }
    }

    /// The current state of a scope (for cost-priority routing, diagnostics and tests).
    pub async fn peek(&self, scope: &Scope) -> Result<Spend, ApiError> {
        let kv = self.store()?;
        let (_, s) = load(kv, &scope.kv_key()).await?;
        Ok(s.at(now_ms()))
    }

    /// Reserves `demand` in every scope until `until_ms`, or returns the 429 naming the first
    /// budget it would exceed (nothing stays reserved then).
    pub async fn reserve(
        &self,
        scopes: Vec<Scope>,
        request_id: &str,
        demand: Demand,
        until_ms: u64,
    ) -> Result<Reservation, ApiError> {
        let mut done: Vec<Scope> = Vec::new();
        for scope in &scopes {
            let held = Held {
                usd: demand.usd,
                tokens: demand.tokens,
                until_ms,
            };
            let result = self
                .modify(&scope.kv_key(), |s| {
                    match s.exceeded(&scope.budget, demand) {
                        Some(e) => Err(scope.over(e)),
                        None => {
                            s.held.insert(request_id.to_owned(), held);
                            Ok(())
                        }
                    }
                })
                .await;
            if let Err(e) = result {
                for s in &done {
                    self.finish(s, request_id, Demand::default()).await;
                }
                return Err(e);
            }
            done.push(scope.clone());
        }
        Ok(Reservation {
            budgets: self.clone(),
            scopes,
            request_id: request_id.to_owned(),
            demand,
        })
    }

    /// Removes the reservation of `request_id` from `scope` and adds `actual` (logged on failure:
    /// the reservation then expires on its own).
    async fn finish(&self, scope: &Scope, request_id: &str, actual: Demand) {
        let r = self
            .modify(&scope.kv_key(), |s| {
                s.held.remove(request_id);
                s.day_usd += actual.usd;
                s.month_usd += actual.usd;
                s.day_tokens += actual.tokens;
                s.minute_tokens += actual.tokens;
                Ok(())
            })
            .await;
        if let Err(e) = r {
            tracing::warn!(scope = %scope.kv_key(), request = request_id, error = %e.message,
                "budget settlement failed; the reservation expires on its own");
        }
    }

    fn store(&self) -> Result<&kv::Store, ApiError> {
        self.kv.as_ref().ok_or_else(unavailable)
    }

    /// Read-modify-CAS loop on one entry; `f` may refuse with an error (nothing is written).
    async fn modify(
        &self,
        key: &str,
        mut f: impl FnMut(&mut Spend) -> Result<(), ApiError>,
    ) -> Result<(), ApiError> {
        let kv = self.store()?;
        for _ in 0..MAX_CAS_ATTEMPTS {
            let (revision, stored) = load(kv, key).await?;
            let mut s = stored.at(now_ms());
            f(&mut s)?;
            let bytes = serde_json::to_vec(&s).map_err(|_| unavailable())?;
            match kv.update(key, bytes.into(), revision).await {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(e) => {
                    tracing::warn!(key, error = %e, "budget store write failed");
                    return Err(unavailable());
                }
            }
        }
        tracing::warn!(key, "budget store: too many compare-and-set conflicts");
        Err(unavailable())
    }
}

impl Reservation {
    /// Settles with the actual consumption and releases the rest of the reservation.
    pub async fn settle(self, actual: Demand) {
        for s in &self.scopes {
            self.budgets.finish(s, &self.request_id, actual).await;
        }
    }
}

/// `(revision, state)` of `key`; revision 0 = absent (then `update` creates it).
async fn load(kv: &kv::Store, key: &str) -> Result<(u64, Spend), ApiError> {
    match kv.entry(key).await {
        Ok(Some(e)) if e.operation == kv::Operation::Put => {
            // An unreadable value restarts from zero rather than blocking the scope forever.
            Ok((
                e.revision,
                serde_json::from_slice(&e.value).unwrap_or_default(),
            ))
        }
        Ok(Some(e)) => Ok((e.revision, Spend::default())),
        Ok(None) => Ok((0, Spend::default())),
        Err(e) => {
            tracing::warn!(key, error = %e, "budget store read failed");
            Err(unavailable())
        }
    }
}

fn unavailable() -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: "The budget store is unavailable; requests with budgets cannot be admitted \
                  right now. Retry shortly."
            .into(),
        kind: "service_unavailable_error",
        param: None,
        code: Some("budget_store_unavailable"),
        retry_after_s: Some(1),
    }
}

/// Cost-priority routing: the model to serve for a caller with `scopes`. When `model` names a
/// `cheaper` alternative and some scope has spent or reserved at least its `downgrade_at` share of
/// its daily budget, the cheaper model (and the id it replaces); otherwise `model` itself.
pub async fn choose_model<'a>(
    app: &AppState,
    config: &'a GatewayConfig,
    model: &'a ModelConfig,
    scopes: &[Scope],
) -> Result<(&'a ModelConfig, Option<String>), ApiError> {
    let Some(cheaper) = model.cheaper.as_deref().and_then(|c| config.model(c)) else {
        return Ok((model, None));
    };
    for scope in scopes {
        let Some(at) = scope.budget.downgrade_at else {
            continue;
        };
        let spend = app.budgets.peek(scope).await?;
        if spend.daily_share(&scope.budget).is_some_and(|s| s >= at) {
            tracing::info!(scope = %scope.kv_key(), from = %model.id, to = %cheaper.id,
                "budget share reached downgrade_at: serving the cheaper model");
            return Ok((cheaper, Some(model.id.clone())));
        }
    }
    Ok((model, None))
}

/// Reserves the estimated charge of a request on `model` for `scopes` (none: `Ok(None)`, no
/// tokenizer work). `max_tokens` is the request's output cap; the hold lasts until
/// `deadline_ms` plus `budgets.hold_grace_ms`.
#[allow(clippy::too_many_arguments)]
pub async fn reserve_for(
    app: &AppState,
    config: &GatewayConfig,
    model: &ModelConfig,
    scopes: Vec<Scope>,
    request_id: &str,
    messages: &[Message],
    tools: &[Tool],
    max_tokens: Option<u32>,
    deadline_ms: u64,
) -> Result<Option<Reservation>, ApiError> {
    if scopes.is_empty() {
        return Ok(None);
    }
    let prompt = crate::trim::Estimate::of(messages, tools).total();
    let output = max_tokens.map_or(config.budgets.default_max_tokens, u64::from);
    reserve_tokens(
        app,
        config,
        model,
        scopes,
        request_id,
        prompt,
        output,
        deadline_ms,
    )
    .await
}

/// Reserves `prompt_tokens` input and `output_tokens` output on `model` for `scopes` (none:
/// `Ok(None)`); used directly where the input size is known without a tokenizer (embeddings).
#[allow(clippy::too_many_arguments)]
pub async fn reserve_tokens(
    app: &AppState,
    config: &GatewayConfig,
    model: &ModelConfig,
    scopes: Vec<Scope>,
    request_id: &str,
    prompt_tokens: u64,
    output_tokens: u64,
    deadline_ms: u64,
) -> Result<Option<Reservation>, ApiError> {
    if scopes.is_empty() {
        return Ok(None);
    }
    let settings = &config.budgets;
    let demand = estimate(
        app.catalog.as_deref(),
        &model.id,
        prompt_tokens,
        output_tokens,
        settings.safety_margin,
    );
    let until = deadline_ms + settings.hold_grace_ms;
    app.budgets
        .reserve(scopes, request_id, demand, until)
        .await
        .map(Some)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    #[test]
    fn windows_are_utc_calendar() {
        // 2026-11-29T23:59:59Z and one second later.
        assert_eq!(
            windows(1_795_996_799_000),
            ("2026-11-29".into(), "2026-11".into(), 29_933_279)
        );
        assert_eq!(windows(1_795_996_800_000).0, "2026-11-30");
    }

    #[test]
    fn held_reservations_count_until_they_expire() {
        let budget = Budget {
            daily_usd: Some(d("0.010")),
            ..Budget::default()
        };
        let now = 1_796_083_000_000;
        let mut s = Spend::default().at(now);
        let need = Demand {
            usd: d("0.0044"),
            tokens: 200,
        };
        for id in ["a", "b"] {
            assert_eq!(s.exceeded(&budget, need), None);
            s.held.insert(
                id.into(),
                Held {
                    usd: need.usd,
                    tokens: 200,
                    until_ms: now + 1000,
                },
            );
        }
        assert_eq!(
            s.exceeded(&budget, need),
            Some(Exceeded::Usd {
                period: "daily",
                limit: d("0.010"),
                used: d("0.0088"),
                need: d("0.0044"),
            })
        );
        assert_eq!(s.daily_share(&budget), Some(d("0.88")));
        let later = s.at(now + 1000);
        assert!(later.held.is_empty());
        assert_eq!(later.exceeded(&budget, need), None);
    }

    #[test]
    fn a_new_day_resets_the_day_but_not_the_month() {
        let mut s = Spend::default().at(1_795_996_799_000);
        s.day_usd = d("1.5");
        s.month_usd = d("2.5");
        s.day_tokens = 7;
        let next = s.at(1_795_996_800_000);
        assert_eq!(next.day_usd, Decimal::ZERO);
        assert_eq!(next.day_tokens, 0);
        assert_eq!(next.month_usd, d("2.5"));
    }

    #[test]
    fn the_message_names_the_budget() {
        let scope = Scope {
            kind: "key",
            id: "team-a".into(),
            budget: Budget::default(),
        };
        let e = scope.over(Exceeded::Usd {
            period: "daily",
            limit: d("0.010"),
            used: d("0.0088"),
            need: d("0.0044"),
        });
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.body()["error"]["type"], "insufficient_quota");
        assert_eq!(e.body()["error"]["code"], "insufficient_quota");
        assert_eq!(
            e.message,
            "The daily budget of key `team-a` would be exceeded: $0.0088 of $0.01 spent or reserved, \
             this request needs up to $0.0044."
        );
    }
}
