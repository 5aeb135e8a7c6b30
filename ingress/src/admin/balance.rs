//! Prepaid tenant balances (docs/budgets.md, "Prepaid balances"):
//! `GET /admin/tenants/{id}/balance` and `POST /admin/tenants/{id}/balance/topups`.
//!
//! The ledger (billing, over `<prefix>.billing.balance`) records every top-up, keyed by its id so
//! a repeat records nothing; the admission state is the `SY_BUDGETS` entry `balance.<tenant>`,
//! whose top-ups are then raised to the ledger's sum by compare-and-set (only ever raised, so a
//! stale sum cannot lower it, and a top-up whose entry write was lost is applied by the next
//! top-up or balance read). No billing running → 503; the budget store unreachable → 503.

use super::keys::tenant_map;
use super::{AdminCaller, json_body, not_found, unavailable};
use crate::AppState;
use crate::billing_rpc::{self, Purpose};
use crate::budget::Scope;
use crate::error::ApiError;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use rust_decimal::Decimal;
use serde_json::{Value as Json, json};
use std::sync::Arc;
use switchyard_budgets::Spend;
use switchyard_schemas::balance::{
    BalanceAnswer, BalanceRequest, LedgerBalance, MAX_MOVEMENTS, Movement, TopUpBody,
    valid_topup_id,
};
use switchyard_schemas::config::GatewayConfig;

/// How balance calls name themselves in billing errors.
const BALANCE: Purpose = Purpose {
    what: "record balances",
    unavailable_code: "admin_unavailable",
    failed_code: "balance_failed",
};
/// Movements a balance read returns unless `limit` says otherwise.
const DEFAULT_MOVEMENTS: u32 = 20;
/// The largest single top-up, USD (a typo guard: $1,000,000,000).
const MAX_TOPUP_USD: i64 = 1_000_000_000;

/// `GET /admin/tenants/{id}/balance?limit=N`: the balance (top-ups minus settled charges), what
/// requests in flight hold, what is available, the tenant's settings and its `limit` (1..=1000,
/// default 20) most recent movements from the ledger.
pub(super) async fn show(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    Path(id): Path<String>,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    known(&app, &admin, &id)?;
    let limit = limit(uri.query().unwrap_or(""))?;
    let ledger = match ask(
        &app,
        BalanceRequest::Show {
            tenant: id.clone(),
            limit,
        },
    )
    .await?
    {
        BalanceAnswer::Show(b) => b,
        other => return Err(unexpected(other)),
    };
    let spend = raise(&app, &id, ledger.topped_up_usd, ledger.charged_usd).await?;
    Ok(axum::Json(view(&app.config.get(), &id, &spend, Some(&ledger))).into_response())
}

/// `POST /admin/tenants/{id}/balance/topups` with a [`TopUpBody`]: 201 with the recorded top-up
/// and the balance after it, or 200 for a repeat of a recorded id (nothing added); 409 when the
/// id was used with another amount. Gateway-wide admin keys only (a tenant key cannot credit
/// itself).
pub(super) async fn top_up(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    admin.require_global()?;
    known(&app, &admin, &id)?;
    let req: TopUpBody = json_body(&body)?;
    if req.amount_usd <= Decimal::ZERO || req.amount_usd > Decimal::from(MAX_TOPUP_USD) {
        return Err(ApiError::invalid(
            format!("amount_usd must be > 0 and at most {MAX_TOPUP_USD}."),
            Some("amount_usd".into()),
        ));
    }
    if req
        .note
        .as_ref()
        .is_some_and(|n| n.chars().count() > 500 || n.contains('\0'))
    {
        return Err(ApiError::invalid(
            "note must be at most 500 characters, without NUL.",
            Some("note".into()),
        ));
    }
    let header = headers
        .get("idempotency-key")
        .map(|v| v.to_str().map(str::to_owned));
    let topup_id = match (req.id, header) {
        (Some(i), _) => i,
        (None, Some(Ok(h))) => h,
        (None, Some(Err(_))) => String::new(),
        (None, None) => format!("topup_{}", uuid::Uuid::now_v7().simple()),
    };
    if !valid_topup_id(&topup_id) {
        return Err(ApiError::invalid(
            "The top-up id (`id` or the Idempotency-Key header) must be 1 to 128 of \
             A-Z a-z 0-9 _ . : -",
            Some("id".into()),
        ));
    }
    let answer = ask(
        &app,
        BalanceRequest::TopUp {
            id: topup_id,
            tenant: id.clone(),
            amount_usd: req.amount_usd,
            note: req.note,
            ts_ms: switchyard_schemas::now_ms(),
        },
    )
    .await?;
    let (topup, created, topped_up) = match answer {
        BalanceAnswer::TopUp {
            topup,
            created,
            topped_up_usd,
            charged_usd,
        } => (topup, created, (topped_up_usd, charged_usd)),
        BalanceAnswer::Conflict { error } => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "invalid_request_error",
                "topup_id_conflict",
                error,
            )
            .with_param("id"));
        }
        other => return Err(unexpected(other)),
    };
    let spend = raise(&app, &id, topped_up.0, topped_up.1).await?;
    tracing::info!(tenant = %id, topup = %topup.id, amount_usd = %topup.amount_usd, created,
        admin = %admin.id, "balance top-up");
    let body = json!({
        "object": "balance.topup",
        "id": topup.id,
        "tenant": topup.tenant,
        "amount_usd": topup.amount_usd.normalize(),
        "note": topup.note,
        "created_at": topup.ts_ms / 1000,
        "created": created,
        "balance": view(&app.config.get(), &id, &spend, None),
    });
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(body)).into_response())
}

/// 404 unless the caller sees a tenant `id` of the config (`tenants:` or a key's tenant).
fn known(app: &AppState, admin: &AdminCaller, id: &str) -> Result<(), ApiError> {
    match tenant_map(app, admin).contains_key(id) {
        true => Ok(()),
        false => Err(not_found("id", format!("No tenant with id `{id}`."))),
    }
}

fn limit(query: &str) -> Result<u32, ApiError> {
    use crate::query_string::{int, params};
    let p = params(query, "/admin/tenants/{id}/balance", &["limit"], &[])?;
    Ok(int(&p, "limit", MAX_MOVEMENTS)?.unwrap_or(DEFAULT_MOVEMENTS))
}

/// Raises the entry's top-ups to the ledger's sum (a no-op when it holds them already); an entry
/// without a balance starts from the ledger's `charged` spend.
async fn raise(
    app: &AppState,
    tenant: &str,
    topped_up: Decimal,
    charged: Decimal,
) -> Result<Spend, ApiError> {
    app.budgets
        .store()
        .raise_balance(&Scope::balance(tenant).kv_key(), topped_up, charged)
        .await
        .map_err(|e| unavailable(format!("The budget store cannot be written: {}", e.0)))
}

/// The balance object: admission state from `spend`, settings from the config, the ledger's
/// totals and movements when read.
fn view(
    config: &GatewayConfig,
    tenant: &str,
    spend: &Spend,
    ledger: Option<&LedgerBalance>,
) -> Json {
    let p = spend.prepaid.unwrap_or_default();
    let reserved = spend.reserved_total().usd;
    let settings = config
        .tenants
        .iter()
        .find(|t| t.id == tenant)
        .and_then(|t| t.balance.as_ref());
    let mut out = json!({
        "object": "tenant.balance",
        "tenant": tenant,
        "enabled": settings.is_some_and(|b| b.enabled),
        "balance_usd": p.balance().normalize(),
        "reserved_usd": reserved.normalize(),
        "available_usd": (p.balance() - reserved).normalize(),
        "topped_up_usd": p.topped_up_usd.normalize(),
        "spent_usd": p.spent_usd.normalize(),
        "low_balance_usd": settings.and_then(|b| b.low_balance_usd).map(|d| d.normalize()),
        "on_low": settings.map(|b| b.on_low),
    });
    if !settings.is_some_and(|b| b.enabled) {
        // A top-up to such a tenant is kept, but admission does not draw on it: say so.
        out["warning"] = json!(format!(
            "tenant `{tenant}` has no enabled `balance:` section in the config: this balance is \
             recorded but not enforced or drawn on at admission"
        ));
    }
    if let Some(l) = ledger {
        out["ledger"] = json!({
            "topped_up_usd": l.topped_up_usd.normalize(),
            "charged_usd": l.charged_usd.normalize(),
            "since": l.since_ms.map(|ms| ms / 1000),
        });
        out["movements"] = l.movements.iter().map(movement).collect();
    }
    out
}

fn movement(m: &Movement) -> Json {
    let mut out = json!({
        "type": m.kind,
        "id": m.id,
        "amount_usd": m.amount_usd.normalize(),
        "created_at": m.ts_ms / 1000,
    });
    if let Some(model) = &m.model {
        out["model"] = json!(model);
    }
    if let Some(note) = &m.note {
        out["note"] = json!(note);
    }
    out
}

/// Sends `req` to billing and decodes its answer; billing's own errors are 503.
async fn ask(app: &AppState, req: BalanceRequest) -> Result<BalanceAnswer, ApiError> {
    match billing_rpc::ask(&app.nats, app.subjects.balance(), &req, BALANCE).await? {
        BalanceAnswer::Err { error } => Err(unavailable(format!(
            "The billing service could not record or read the balance: {error}"
        ))),
        a => Ok(a),
    }
}

fn unexpected(a: BalanceAnswer) -> ApiError {
    unavailable(format!("Unexpected answer from billing: {a:?}"))
}
