//! Budgets and token quotas per key and per tenant: admission *reserves* the estimated charge,
//! completion *settles* with the actual charge and releases the rest.
//!
//! # Storage
//! One JetStream KV entry per scope (`key.<id>`, `tenant.<id>`) in the bucket
//! [`BUDGETS_BUCKET`], written by group commit: see [`switchyard_budgets::store`] for the
//! protocol and why it is exact across any number of ingress replicas.
//!
//! # Admission
//! A request is admitted when, for every limit of its key and of its tenant,
//! `settled + held + this request's estimate ≤ limit`. The estimate is the sale price
//! (`standard:` in the pricing catalog) of the tokenizer-estimated input plus `max_tokens` (or
//! `budgets.default_max_tokens`) output, times `1 + budgets.safety_margin`. Over a limit → 429
//! `insufficient_quota` naming the budget. The key is reserved first, then the tenant; a failed
//! tenant reservation releases the key's. Reservations of an ingress that died lapse at the
//! latest of its requests' deadlines plus `budgets.hold_grace_ms`.
//!
//! # Settlement
//! With the charge of the tokens the upstream reported (0 for cache hits and failures before
//! any upstream usage), added to the windows current at settlement time. A settlement that
//! cannot be written (the store is unreachable for [`switchyard_budgets::store::MAX_CONTENTION`])
//! travels in the request's `charge` usage event, which is durable, and billing applies it
//! ([`switchyard_budgets::BudgetStore::settle_late`]). The billing ledger stays the record of
//! truth; these entries are admission state.
//!
//! # Prepaid balances
//! A tenant with `balance: {enabled: true}` also has the scope `balance.<tenant>`, whose limit is
//! the sum of its top-ups kept in the entry itself ([`switchyard_budgets::Prepaid`]), and whose
//! settled spend never resets: reserved and settled through the same group commit, so it is as
//! exact across replicas as the budgets.
//!
//! Fail-closed: when the KV store cannot be reached or an entry is unreadable, a caller with
//! budgets gets 503 rather than unmetered spend.

use crate::AppState;
use crate::context::Caller;
use crate::error::ApiError;
use axum::http::StatusCode;
use rust_decimal::Decimal;
use switchyard_budgets::{BudgetStore, Limit, ReserveError};
use switchyard_schemas::config::{GatewayConfig, ModelConfig};
use switchyard_schemas::now_ms;
use switchyard_schemas::pricing::{Catalog, Cost, UnpricedPolicy};
use switchyard_schemas::tenancy::{Budget, KeyConfig, OnLowBalance, TenantConfig};
use switchyard_schemas::usage::Usage;

pub use switchyard_budgets::{BUDGETS_BUCKET, Demand, Exceeded, Spend};

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
    /// Key `k`'s own budget.
    pub fn key(k: &KeyConfig) -> Self {
        Self {
            kind: "key",
            id: k.id.clone(),
            budget: k.budget.clone(),
        }
    }

    /// Tenant `t`'s budget.
    pub fn tenant(t: &TenantConfig) -> Self {
        Self {
            kind: "tenant",
            id: t.id.clone(),
            budget: t.budget.clone(),
        }
    }

    /// The prepaid balance of tenant `tenant` (limit: its top-ups, kept in the entry).
    pub fn balance(tenant: &str) -> Self {
        Self {
            kind: "balance",
            id: tenant.to_owned(),
            budget: Budget::default(),
        }
    }

    /// What a reservation in this scope must fit in.
    fn limit(&self) -> Limit {
        match self.kind {
            "balance" => Limit::Balance,
            _ => Limit::Budget(self.budget.clone()),
        }
    }

    /// Whether the scope limits USD spend (an unpriced model cannot be counted against it).
    fn limits_usd(&self) -> bool {
        self.kind == "balance"
            || self.budget.daily_usd.is_some()
            || self.budget.monthly_usd.is_some()
    }

    /// The scope's KV key, `key.<id>`, `tenant.<id>` or `balance.<tenant>`.
    pub fn kv_key(&self) -> String {
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
                    usd(used),
                    limit.normalize(),
                    usd(need)
                ),
                None,
            ),
            Exceeded::Balance {
                balance,
                reserved,
                need,
            } => (
                format!(
                    "The prepaid balance of tenant `{}` is insufficient: ${} left, ${} of it \
                     reserved by requests in flight, this request needs up to ${}. Top it up \
                     (POST /admin/tenants/{}/balance/topups).",
                    self.id,
                    usd(balance),
                    usd(reserved),
                    usd(need),
                    self.id
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
        insufficient_quota(message, retry)
    }
}

/// A dollar amount as the refusals print it: at most 6 decimals, no trailing zeros.
fn usd(d: Decimal) -> Decimal {
    d.round_dp(6).normalize()
}

/// The 429 `insufficient_quota` (type and code) refusal with `message`, `Retry-After: retry`
/// seconds when given.
fn insufficient_quota(message: String, retry: Option<u64>) -> ApiError {
    ApiError {
        retry_after_s: retry,
        ..ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "insufficient_quota",
            "insufficient_quota",
            message,
        )
    }
}

/// The scopes with limits that apply to `caller` under `config` (key first, then tenant).
pub fn scopes(config: &GatewayConfig, caller: &Caller) -> Vec<Scope> {
    let mut out = Vec::new();
    let (key, tenant) = caller.entries(config);
    if let Some(k) = key
        && k.budget.is_limited()
    {
        out.push(Scope::key(k));
    }
    if let Some(t) = tenant {
        if t.budget.is_limited() {
            out.push(Scope::tenant(t));
        }
        if t.prepaid().is_some() {
            out.push(Scope::balance(&t.id));
        }
    }
    out
}

/// The charge of `usage` on `model` at sale price, USD (zero when the model is unpriced); `batch`
/// applies the model's batch rate and `policy` prices what has no price (the same
/// [`Catalog::charge_with`] billing's ledger writes).
pub fn charge_of(
    catalog: Option<&Catalog>,
    model: &str,
    usage: &Usage,
    batch: bool,
    policy: Option<&UnpricedPolicy>,
) -> Decimal {
    priced(catalog, model, usage, batch, policy).map_or(Decimal::ZERO, |c| c.total)
}

/// [`Catalog::charge_with`] on an optional catalog.
pub fn priced(
    catalog: Option<&Catalog>,
    model: &str,
    usage: &Usage,
    batch: bool,
    policy: Option<&UnpricedPolicy>,
) -> Option<Cost> {
    catalog.and_then(|c| c.charge_with(model, usage, batch, policy))
}

/// Admission's unpriced check (docs/pricing.md): a request to a model without a sale price (and
/// no `charge_at` fallback) is refused when the policy is `reject`, or when no policy is set and
/// one of `scopes` has a USD budget (whose spend could not be counted). A 400
/// `invalid_request_error`, code `model_not_priced`, naming the model; the front door renders it
/// in its own error shape.
pub fn check_priced(
    catalog: Option<&Catalog>,
    config: &GatewayConfig,
    model: &str,
    scopes: &[Scope],
) -> Result<(), ApiError> {
    let policy = config.unpriced.as_ref();
    let usd_budget = scopes.iter().any(Scope::limits_usd);
    let refuse = match policy {
        Some(UnpricedPolicy::Reject) => true,
        None => usd_budget,
        Some(UnpricedPolicy::Zero | UnpricedPolicy::ChargeAt(_)) => false,
    };
    let priced = catalog.is_some_and(|c| c.sale_priced(model, policy));
    if !refuse || priced {
        return Ok(());
    }
    let why = if usd_budget {
        "a USD budget cannot count its spend"
    } else {
        "the `unpriced: reject` policy refuses it"
    };
    Err(ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "model_not_priced",
        format!(
            "The model `{model}` has no price in the pricing catalog, and {why}. Add it to the \
             catalog (`standard:` in the pricing file), or set `unpriced: {{charge_at: <model>}}`."
        ),
    )
    .with_param("model"))
}

/// The reservation for a request: `prompt_tokens` estimated input, `max_output` output tokens,
/// priced at `model`'s sale price, plus `margin` (a share).
pub fn estimate(
    catalog: Option<&Catalog>,
    model: &str,
    prompt_tokens: u64,
    max_output: u64,
    margin: Decimal,
    policy: Option<&UnpricedPolicy>,
) -> Demand {
    let usage = Usage {
        prompt_tokens,
        completion_tokens: max_output,
        ..Usage::default()
    };
    let base = charge_of(catalog, model, &usage, false, policy);
    Demand {
        usd: base * (Decimal::ONE + margin),
        tokens: prompt_tokens + max_output,
    }
}

/// The shared budget store of this ingress process (a handle to [`BUDGETS_BUCKET`]).
#[derive(Clone, Debug)]
pub struct Budgets {
    store: BudgetStore,
}

/// Open reservations of one request, settled exactly once ([`Reservation::settle`]).
#[derive(Debug)]
pub struct Reservation {
    store: BudgetStore,
    scopes: Vec<Scope>,
    /// What was reserved in each scope.
    pub demand: Demand,
}

/// A settlement the store did not take: the scopes still owed `actual` (their KV keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsettled {
    /// `key.<id>` / `tenant.<id>`.
    pub scopes: Vec<String>,
    /// The charge still to add.
    pub actual: Demand,
}

impl Budgets {
    /// Opens (or creates) [`BUDGETS_BUCKET`] for this process, `holder` being its ingress id.
    /// Without JetStream the store is absent and callers with budgets are refused (fail-closed).
    pub async fn connect(js: &async_nats::jetstream::Context, holder: &str) -> Self {
        Self {
            store: BudgetStore::connect(js, holder).await,
        }
    }

    /// The underlying store (billing-side late settlement, shutdown).
    pub fn store(&self) -> &BudgetStore {
        &self.store
    }

    /// The current state of a scope (for cost-priority routing, diagnostics and tests).
    pub async fn peek(&self, scope: &Scope) -> Result<Spend, ApiError> {
        self.store
            .peek(&scope.kv_key())
            .await
            .map_err(|_| unavailable())
    }

    /// Reserves `demand` in every scope until `until_ms`, or returns the 429 naming the first
    /// budget it would exceed (nothing stays reserved then).
    pub async fn reserve(
        &self,
        scopes: Vec<Scope>,
        demand: Demand,
        until_ms: u64,
    ) -> Result<Reservation, ApiError> {
        for (i, scope) in scopes.iter().enumerate() {
            let result = self
                .store
                .reserve_within(&scope.kv_key(), scope.limit(), demand, until_ms)
                .await;
            if let Err(e) = result {
                for done in &scopes[..i] {
                    if self
                        .store
                        .settle(&done.kv_key(), demand, Demand::default())
                        .await
                        .is_err()
                    {
                        self.store.forget(&done.kv_key(), demand).await;
                    }
                }
                return Err(match e {
                    ReserveError::Exceeded(x) => scope.over(x),
                    ReserveError::Unavailable(_) => unavailable(),
                });
            }
        }
        Ok(Reservation {
            store: self.store.clone(),
            scopes,
            demand,
        })
    }
}

impl Reservation {
    /// Settles with the actual consumption and releases the reservation. Scopes the store could
    /// not write are returned, for the durable late settlement carried by the charge event.
    pub async fn settle(self, actual: Demand) -> Option<Unsettled> {
        let mut owed = Vec::new();
        for s in &self.scopes {
            let key = s.kv_key();
            if let Err(e) = self.store.settle(&key, self.demand, actual).await {
                tracing::warn!(scope = %key, error = %e, "budget settlement not written; billing applies it from the charge event");
                self.store.forget(&key, self.demand).await;
                owed.push(key);
            }
        }
        (!owed.is_empty()).then_some(Unsettled {
            scopes: owed,
            actual,
        })
    }
}

fn unavailable() -> ApiError {
    ApiError::unavailable(
        "budget_store_unavailable",
        "The budget store is unavailable; requests with budgets cannot be admitted right now. \
         Retry shortly.",
    )
}

/// Cost-priority routing: the model to serve for a caller with `scopes`. When `model` names a
/// `cheaper` alternative and some scope has spent or reserved at least its `downgrade_at` share of
/// its daily budget, or a prepaid balance is below its `low_balance_usd` with `on_low:
/// downgrade`, the cheaper model (and the id it replaces); otherwise `model` itself. A balance
/// below its threshold with `on_low: refuse` is a 429 `insufficient_quota`.
pub async fn choose_model<'a>(
    app: &AppState,
    config: &'a GatewayConfig,
    model: &'a ModelConfig,
    scopes: &[Scope],
) -> Result<(&'a ModelConfig, Option<String>), ApiError> {
    let low = low_balance(app, config, scopes).await?;
    let Some(cheaper) = model.cheaper.as_deref().and_then(|c| config.model(c)) else {
        return Ok((model, None));
    };
    if low {
        tracing::info!(from = %model.id, to = %cheaper.id,
            "prepaid balance below low_balance_usd: serving the cheaper model");
        return Ok((cheaper, Some(model.id.clone())));
    }
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

/// Whether a prepaid balance among `scopes` is below its `low_balance_usd` (what is left after
/// the open reservations) with `on_low: downgrade`; with `on_low: refuse` that is the 429.
async fn low_balance(
    app: &AppState,
    config: &GatewayConfig,
    scopes: &[Scope],
) -> Result<bool, ApiError> {
    for scope in scopes.iter().filter(|s| s.kind == "balance") {
        let Some((threshold, on_low)) = config
            .tenants
            .iter()
            .find(|t| t.id == scope.id)
            .and_then(|t| t.prepaid())
            .and_then(|b| b.low_balance_usd.map(|l| (l, b.on_low)))
        else {
            continue;
        };
        let spend = app.budgets.peek(scope).await?;
        let left = spend.prepaid.unwrap_or_default().balance() - spend.reserved_total().usd;
        if left >= threshold {
            continue;
        }
        match on_low {
            OnLowBalance::Downgrade => return Ok(true),
            OnLowBalance::Refuse => {
                return Err(insufficient_quota(
                    format!(
                        "The prepaid balance of tenant `{}` is below its low-balance threshold: \
                         ${} left after requests in flight, threshold ${}. Top it up \
                         (POST /admin/tenants/{}/balance/topups).",
                        scope.id,
                        usd(left),
                        threshold.normalize(),
                        scope.id
                    ),
                    None,
                ));
            }
        }
    }
    Ok(false)
}

/// Reserves `prompt_tokens` input and `output_tokens` output on `model` for `scopes` (none:
/// `Ok(None)`). Chat admission passes the tokenizer's estimate; embeddings the input size.
/// Refuses an unpriced model first ([`check_priced`]).
pub async fn reserve_tokens(
    app: &AppState,
    config: &GatewayConfig,
    model: &ModelConfig,
    scopes: Vec<Scope>,
    prompt_tokens: u64,
    output_tokens: u64,
    deadline_ms: u64,
) -> Result<Option<Reservation>, ApiError> {
    check_priced(app.catalog().as_deref(), config, &model.id, &scopes)?;
    if scopes.is_empty() {
        return Ok(None);
    }
    let settings = &config.budgets;
    let demand = estimate(
        app.catalog().as_deref(),
        &model.id,
        prompt_tokens,
        output_tokens,
        settings.safety_margin,
        config.unpriced.as_ref(),
    );
    let until = deadline_ms + settings.hold_grace_ms;
    app.budgets.reserve(scopes, demand, until).await.map(Some)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
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

    #[test]
    fn the_balance_message_names_the_tenant_balance() {
        let e = Scope::balance("acme").over(Exceeded::Balance {
            balance: d("0.0100"),
            reserved: d("0.0088"),
            need: d("0.0044"),
        });
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.body()["error"]["code"], "insufficient_quota");
        assert_eq!(
            e.message,
            "The prepaid balance of tenant `acme` is insufficient: $0.01 left, $0.0088 of it \
             reserved by requests in flight, this request needs up to $0.0044. Top it up \
             (POST /admin/tenants/acme/balance/topups)."
        );
    }
}
