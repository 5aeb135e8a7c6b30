//! `GET /admin/dashboard.json`: every figure the dashboard page (`GET /dashboard`,
//! docs/dashboard.md) draws, in one answer, gathered from what the gateway already has:
//!
//! | section | source |
//! |---|---|
//! | `spend`, `traffic`, `cache.today` | the usage query (billing's ledger, as `GET /v1/usage`) |
//! | `latency`, `cache.window`, `recent` | the audit log (as `GET /admin/requests`), the last `window_minutes` |
//! | `targets` | this replica's target health view (worker breaker reports + passive failures) |
//! | `budgets` | the shared budget store (`SY_BUDGETS`), every key and tenant with limits |
//!
//! Query parameters: `days` (1..=62, default 14: the spend charts' range, UTC days ending today)
//! and `window_minutes` (1..=1440, default 60: the latency, cache-savings and recent-records
//! window). Money is USD as exact decimal strings (as the usage API), times are ms or RFC 3339
//! UTC, rates are shares in [0, 1]. A section whose source cannot answer (billing down, budget
//! store unreachable) is left empty and named in `errors` (section → message); the rest still
//! answers, so a billing outage does not blank the health view. Gateway-wide admin keys only
//! (a tenant admin key gets 403). The spend history may be a few seconds old on a large ledger
//! ([`SPEND_REUSE_FACTOR`]).

use super::{AdminCaller, requests};
use crate::AppState;
use crate::error::ApiError;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use rust_decimal::Decimal;
use rust_decimal::prelude::ToPrimitive;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use switchyard_schemas::audit::{AuditQuery, AuditRecord};
use switchyard_schemas::usage::Usage;
use switchyard_schemas::usage_query::{GroupBy, UsageQuery, UsageReply};

/// Default spend range, UTC days (today included).
pub(super) const DEFAULT_DAYS: u32 = 14;
/// Longest spend range, days.
pub(super) const MAX_DAYS: u32 = 62;
/// Default latency / savings window, minutes.
pub(super) const DEFAULT_WINDOW_MINUTES: u32 = 60;
/// Longest window, minutes (one day).
pub(super) const MAX_WINDOW_MINUTES: u32 = 1440;
/// Audit records read per page for the window.
const WINDOW_PAGE: u32 = 500;
/// Most audit records the window reads (the newest ones; `latency.window.truncated` says when
/// more exist), records.
pub(super) const WINDOW_RECORDS: usize = 2000;
/// Latest audit records shown.
pub(super) const RECENT_RECORDS: usize = 20;
/// A limit counts as "near" from this share of it used or reserved.
pub(super) const NEAR_SHARE: f64 = 0.8;
/// Most budget scopes read per answer (each one KV read), scopes.
pub(super) const MAX_BUDGET_SCOPES: usize = 500;
/// Budget limits listed (highest share first).
pub(super) const BUDGET_ROWS: usize = 20;
/// Budget scopes read at once.
const BUDGET_READS_AT_ONCE: usize = 16;
const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 86_400_000;

/// The spend history (the `day × model` and `day × tenant` ledger queries over `days`, the
/// heavy part of an answer when the ledger is large) is reused for this many times as long as it
/// took to build, so every browser polling every 5 s keeps billing busy at most about a tenth of
/// the time; a small ledger is asked afresh each time.
pub(super) const SPEND_REUSE_FACTOR: u64 = 10;
/// Longest reuse of the spend history, ms.
pub(super) const SPEND_MAX_REUSE_MS: u64 = 30_000;

/// The last spend history built, per `days`: `(days, built at ms, reusable until ms, section)`.
#[derive(Debug, Default)]
pub(super) struct SpendCache(parking_lot::Mutex<Vec<(u32, u64, u64, Value)>>);

impl SpendCache {
    /// The section for `days`, while reusable and built on the same UTC day as `now`.
    fn get(&self, days: u32, now: u64) -> Option<Value> {
        self.0
            .lock()
            .iter()
            .find(|(d, at, until, _)| *d == days && now < *until && at / DAY_MS == now / DAY_MS)
            .map(|(_, _, _, v)| v.clone())
    }

    /// Keeps `section` for `days`, built at `now` in `took_ms` (one entry per `days` value).
    fn put(&self, days: u32, now: u64, took_ms: u64, section: Value) {
        let until = now + (took_ms * SPEND_REUSE_FACTOR).min(SPEND_MAX_REUSE_MS);
        let mut held = self.0.lock();
        held.retain(|(d, _, _, _)| *d != days);
        held.push((days, now, until, section));
    }
}

/// The parsed query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Params {
    /// Spend range, days.
    pub days: u32,
    /// Latency window, minutes.
    pub window_minutes: u32,
}

/// Parses `days` and `window_minutes`; a 400 naming the parameter otherwise.
pub(super) fn parse(query: &str) -> Result<Params, ApiError> {
    use crate::query_string::{int, params};
    let p = params(
        query,
        "/admin/dashboard.json",
        &["days", "window_minutes"],
        &[],
    )?;
    Ok(Params {
        days: int(&p, "days", MAX_DAYS)?.unwrap_or(DEFAULT_DAYS),
        window_minutes: int(&p, "window_minutes", MAX_WINDOW_MINUTES)?
            .unwrap_or(DEFAULT_WINDOW_MINUTES),
    })
}

/// The handler.
pub(super) async fn json(
    State(app): State<Arc<AppState>>,
    admin: AdminCaller,
    uri: axum::http::Uri,
) -> Response {
    let answer = async {
        admin.require_global()?;
        let params = parse(uri.query().unwrap_or(""))?;
        Ok::<_, ApiError>(build(&app, params, switchyard_schemas::now_ms()).await)
    };
    match answer.await {
        Ok(body) => (
            [(axum::http::header::CACHE_CONTROL, "no-store")],
            axum::Json(body),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

async fn build(app: &AppState, p: Params, now: u64) -> Value {
    let today = now - now % DAY_MS;
    let from_day = today - u64::from(p.days - 1) * DAY_MS;
    let from_hour = now - now % HOUR_MS - 23 * HOUR_MS;
    let usage = |from_ms, group_by: Vec<GroupBy>| UsageQuery {
        from_ms,
        to_ms: now,
        group_by,
        tenant: None,
        key_id: None,
        providers: BTreeMap::new(),
    };
    let hourly = usage(from_hour, vec![GroupBy::Hour]);
    let window_from = now.saturating_sub(u64::from(p.window_minutes) * 60_000);
    let days: Vec<String> = (0..p.days)
        .map(|i| day_of(from_day + u64::from(i) * DAY_MS))
        .collect();
    let spend_history = async {
        if let Some(v) = app.admin.spend.get(p.days, now) {
            return Ok(v);
        }
        let started = std::time::Instant::now();
        let by_model = usage(from_day, vec![GroupBy::Day, GroupBy::Model]);
        let by_tenant = usage(from_day, vec![GroupBy::Day, GroupBy::Tenant]);
        let (m, t) = tokio::join!(
            crate::usage_api::ask_billing(app, &by_model),
            crate::usage_api::ask_billing(app, &by_tenant),
        );
        let v = spend(&days, &m?, &t?);
        let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        app.admin.spend.put(p.days, now, took_ms, v.clone());
        Ok::<_, ApiError>(v)
    };
    let (spend_history, hourly, window, budgets) = tokio::join!(
        spend_history,
        crate::usage_api::ask_billing(app, &hourly),
        window_records(app, window_from),
        budgets(app, now),
    );
    let mut errors = serde_json::Map::new();
    let mut keep = |section: &str, e: ApiError| {
        errors.insert(section.to_owned(), json!(e.message));
    };
    let hours: Vec<String> = (0..24).map(|i| hour_of(from_hour + i * HOUR_MS)).collect();
    let spend = match spend_history {
        Ok(v) => v,
        Err(e) => {
            keep("spend", e);
            Value::Null
        }
    };
    let (traffic, cache_today) = match hourly {
        Ok(h) => traffic(&hours, &h, &day_of(today)),
        Err(e) => {
            keep("traffic", e);
            (Value::Null, Value::Null)
        }
    };
    let (latency, cache_window, recent) = match window {
        Ok((records, truncated)) => {
            let latency = json!({
                "window": {"from": crate::usage_api::rfc3339(window_from),
                    "to": crate::usage_api::rfc3339(now), "minutes": p.window_minutes,
                    "records": records.len(), "truncated": truncated},
                "targets": per_target(&records),
            });
            let recent: Vec<Value> = records.iter().take(RECENT_RECORDS).map(brief).collect();
            (latency, savings(app, &records), Value::Array(recent))
        }
        Err(e) => {
            keep("latency", e);
            (Value::Null, Value::Null, Value::Array(Vec::new()))
        }
    };
    let budgets = match budgets {
        Ok(b) => b,
        Err(e) => {
            keep("budgets", e);
            Value::Null
        }
    };
    json!({
        "object": "dashboard",
        "generated_at": crate::usage_api::rfc3339(now),
        "currency": "USD",
        "spend": spend,
        "traffic": traffic,
        "latency": latency,
        "targets": targets(app),
        "cache": {"today": cache_today, "window": cache_window},
        "budgets": budgets,
        "recent": recent,
        "errors": errors,
    })
}

fn day_of(ms: u64) -> String {
    crate::usage_api::rfc3339(ms)
        .get(..10)
        .unwrap_or_default()
        .to_owned()
}

fn hour_of(ms: u64) -> String {
    crate::usage_api::rfc3339(ms)
        .get(..13)
        .unwrap_or_default()
        .to_owned()
}

/// Charge, cost (USD) and requests, one figure per day.
type Daily = (Vec<Decimal>, Vec<Decimal>, Vec<u64>);

/// Per-day series by `dim` (`model` or `tenant`): one entry per value, each with one figure per
/// day of `days`, largest total charge first.
fn series(days: &[String], reply: &UsageReply, dim: &str) -> Vec<Value> {
    let mut by: BTreeMap<String, Daily> = BTreeMap::new();
    for row in &reply.rows {
        let (Some(day), Some(name)) = (row.group.get("day"), row.group.get(dim)) else {
            continue;
        };
        let Some(i) = days.iter().position(|d| d == day) else {
            continue;
        };
        let e = by.entry(name.clone()).or_insert_with(|| {
            (
                vec![Decimal::ZERO; days.len()],
                vec![Decimal::ZERO; days.len()],
                vec![0; days.len()],
            )
        });
        e.0[i] += row.charge_usd;
        e.1[i] += row.cost_usd;
        e.2[i] += row.requests;
    }
    let mut out: Vec<(Decimal, Value)> = by
        .into_iter()
        .map(|(name, (charge, cost, requests))| {
            let total: Decimal = charge.iter().sum();
            let v = json!({
                dim: name,
                "charge_usd": charge.iter().map(|d| d.normalize().to_string()).collect::<Vec<_>>(),
                "cost_usd": cost.iter().map(|d| d.normalize().to_string()).collect::<Vec<_>>(),
                "requests": requests,
                "total_charge_usd": total.normalize().to_string(),
            });
            (total, v)
        })
        .collect();
    out.sort_by_key(|b| std::cmp::Reverse(b.0));
    out.into_iter().map(|(_, v)| v).collect()
}

fn spend(days: &[String], by_model: &UsageReply, by_tenant: &UsageReply) -> Value {
    let today = days.last().cloned().unwrap_or_default();
    let mut t = switchyard_schemas::usage_query::UsageRow::default();
    for row in by_model
        .rows
        .iter()
        .filter(|r| r.group.get("day") == Some(&today))
    {
        t.requests += row.requests;
        t.errors += row.errors;
        t.charge_usd += row.charge_usd;
        t.cost_usd += row.cost_usd;
    }
    json!({
        "days": days,
        "today": {"day": today, "charge_usd": t.charge_usd.normalize().to_string(),
            "cost_usd": t.cost_usd.normalize().to_string(),
            "margin_usd": (t.charge_usd - t.cost_usd).normalize().to_string(),
            "requests": t.requests, "errors": t.errors},
        "range": {"charge_usd": by_model.totals.charge_usd.normalize().to_string(),
            "cost_usd": by_model.totals.cost_usd.normalize().to_string(),
            "requests": by_model.totals.requests},
        "by_model": series(days, by_model, "model"),
        "by_tenant": series(days, by_tenant, "tenant"),
    })
}

fn rate(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The last 24 hours' requests and errors per hour, and today's cache hit rate (`today` is the
/// UTC day whose hours count).
fn traffic(hours: &[String], reply: &UsageReply, today: &str) -> (Value, Value) {
    let mut requests = vec![0u64; hours.len()];
    let mut errors = vec![0u64; hours.len()];
    let (mut day_requests, mut day_errors, mut day_hits) = (0, 0, 0);
    for row in &reply.rows {
        let Some(hour) = row.group.get("hour") else {
            continue;
        };
        if let Some(i) = hours.iter().position(|h| h == hour) {
            requests[i] += row.requests;
            errors[i] += row.errors;
        }
        if hour.starts_with(today) {
            day_requests += row.requests;
            day_errors += row.errors;
            day_hits += row.cache_hits;
        }
    }
    let error_rate: Vec<f64> = requests
        .iter()
        .zip(&errors)
        .map(|(r, e)| rate(*e, *r))
        .collect();
    let traffic = json!({
        "hours": hours, "requests": requests, "errors": errors, "error_rate": error_rate,
        "last_24h": {"requests": reply.totals.requests, "errors": reply.totals.errors,
            "error_rate": rate(reply.totals.errors, reply.totals.requests)},
        "today": {"requests": day_requests, "errors": day_errors,
            "error_rate": rate(day_errors, day_requests)},
    });
    let cache = json!({"requests": day_requests, "hits": day_hits,
        "hit_rate": rate(day_hits, day_requests)});
    (traffic, cache)
}

/// The newest audit records since `from_ms` (at most [`WINDOW_RECORDS`]), newest first, and
/// whether older ones in the window were left out.
async fn window_records(
    app: &AppState,
    from_ms: u64,
) -> Result<(Vec<AuditRecord>, bool), ApiError> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let q = AuditQuery {
            from_ms: Some(from_ms),
            limit: Some(WINDOW_PAGE),
            cursor: cursor.take(),
            ..AuditQuery::default()
        };
        let page = requests::page(app, &q).await?;
        let empty = page.data.is_empty();
        out.extend(page.data);
        match page.next_cursor {
            // An empty page with a cursor would never end the loop.
            Some(c) if out.len() < WINDOW_RECORDS && !empty => cursor = Some(c),
            Some(_) => return Ok((out, true)),
            None => return Ok((out, false)),
        }
    }
}

/// Nearest-rank percentile `p` (0..=1) of `sorted` (ascending, not empty).
fn percentile(sorted: &[u64], p: f64) -> u64 {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.clamp(1, sorted.len()) - 1)
        .copied()
        .unwrap_or_default()
}

fn quantiles(mut v: Vec<u64>) -> Value {
    if v.is_empty() {
        return Value::Null;
    }
    v.sort_unstable();
    json!({"p50": percentile(&v, 0.50), "p95": percentile(&v, 0.95),
        "p99": percentile(&v, 0.99), "max": v.last().copied().unwrap_or_default()})
}

/// Latency and TTFT percentiles per serving target over `records` (cache hits excluded: no
/// target served them), ms.
fn per_target(records: &[AuditRecord]) -> Vec<Value> {
    let mut by: BTreeMap<&str, (Vec<u64>, Vec<u64>, u64)> = BTreeMap::new();
    for r in records.iter().filter(|r| !r.cache_hit) {
        let Some(target) = r.target.as_deref() else {
            continue;
        };
        let e = by.entry(target).or_default();
        e.0.push(r.latency_ms);
        e.1.extend(r.ttft_ms);
        e.2 += u64::from(r.status == "error");
    }
    by.into_iter()
        .map(|(target, (latency, ttft, errors))| {
            let n = latency.len() as u64;
            json!({"target": target, "requests": n, "errors": errors,
                "error_rate": rate(errors, n), "latency_ms": quantiles(latency),
                "ttft_ms": quantiles(ttft)})
        })
        .collect()
}

/// Cache hits in the window and what they saved: the upstream cost price of the answer's
/// original usage on the record's upstream model or, for a hit (which names none), on the
/// upstream model of the model's first target; the model's sale price when neither has a cost
/// price.
fn savings(app: &AppState, records: &[AuditRecord]) -> Value {
    let catalog = app.catalog();
    let config = app.config.get();
    let primary = |model: &str| {
        let target = config
            .models
            .iter()
            .find(|m| m.id == model)?
            .targets
            .first()?;
        Some(
            config
                .targets
                .iter()
                .find(|t| &t.id == target)?
                .upstream_model
                .clone(),
        )
    };
    let (mut saved, mut unpriced, mut hits) = (Decimal::ZERO, 0u64, 0u64);
    for r in records.iter().filter(|r| r.cache_hit) {
        hits += 1;
        let usage = Usage {
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
            cached_tokens: r.cached_tokens,
            ..Usage::default()
        };
        let cost = catalog.as_deref().and_then(|c| {
            r.upstream_model
                .clone()
                .or_else(|| primary(&r.model))
                .and_then(|m| c.upstream_cost(&m, &usage, false))
                .or_else(|| c.charge(&r.model, &usage, false))
        });
        match cost {
            Some(c) => saved += c.total,
            None => unpriced += 1,
        }
    }
    let n = records.len() as u64;
    json!({"requests": n, "hits": hits, "hit_rate": rate(hits, n),
        "savings_usd": saved.normalize().to_string(), "unpriced_hits": unpriced})
}

/// The fields of an audit record the dashboard's table shows (never the captured bodies).
fn brief(r: &AuditRecord) -> Value {
    json!({
        "request_id": r.request_id, "time": crate::usage_api::rfc3339(r.ts_ms),
        "key": r.key_id, "tenant": r.tenant, "model": r.model, "target": r.target,
        "status": r.status, "http_status": r.http_status, "error_class": r.error_class,
        "fallbacks": r.fallbacks, "latency_ms": r.latency_ms, "ttft_ms": r.ttft_ms,
        "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
        "charge_usd": r.charge_usd, "cache_hit": r.cache_hit,
    })
}

/// The breaker state a worker's report stands for: `closed`, `half_open`, `open`, or
/// `cooldown` (the provider answered 429 to the whole account).
fn breaker(reason: &str, state: switchyard_schemas::health::HealthState) -> &'static str {
    use switchyard_schemas::health::HealthState;
    match (reason, state) {
        ("provider_cooldown", _) => "cooldown",
        ("breaker_half_open", _) | (_, HealthState::Degraded) => "half_open",
        ("breaker_open", _) | (_, HealthState::Unhealthy) => "open",
        _ => "closed",
    }
}

fn targets(app: &AppState) -> Vec<Value> {
    let config = app.config.get();
    config
        .targets
        .iter()
        .map(|t| {
            let workers: Vec<Value> = app
                .health
                .worker_reports(&t.id)
                .into_iter()
                .map(|w| {
                    json!({"worker": w.worker, "state": w.state.as_str(),
                        "breaker": breaker(&w.reason, w.state), "reason": w.reason,
                        "since": crate::usage_api::rfc3339(w.ts_ms)})
                })
                .collect();
            json!({
                "target": t.id, "provider": t.provider.as_str(), "enabled": t.enabled,
                "state": app.health.state(&t.id).as_str(),
                "passive_degraded": app.health.passively_degraded(&t.id),
                "in_flight": app.stats.in_flight(&t.id),
                "ttft_ewma_ms": app.stats.ttft_ms(&t.id),
                "breakers": workers,
            })
        })
        .collect()
}

/// One limit's use: `(limit name, limit, used or reserved)`, in USD or tokens.
fn limits(
    b: &switchyard_schemas::tenancy::Budget,
    s: &crate::budget::Spend,
) -> Vec<(&'static str, Decimal, Decimal)> {
    let held = s.reserved_total();
    let mut out = Vec::new();
    if let Some(l) = b.daily_usd {
        out.push(("daily_usd", l, s.day_usd + held.usd));
    }
    if let Some(l) = b.monthly_usd {
        out.push(("monthly_usd", l, s.month_usd + held.usd));
    }
    if let Some(l) = b.tokens_per_day {
        out.push((
            "tokens_per_day",
            l.into(),
            (s.day_tokens + held.tokens).into(),
        ));
    }
    if let Some(l) = b.tokens_per_minute {
        out.push((
            "tokens_per_minute",
            l.into(),
            (s.minute_tokens + held.tokens).into(),
        ));
    }
    out
}

/// Every key's and tenant's limits (at most [`MAX_BUDGET_SCOPES`] scopes), highest share used
/// first, [`BUDGET_ROWS`] of them.
async fn budgets(app: &AppState, now: u64) -> Result<Value, ApiError> {
    let config = app.config.get();
    let scopes: Vec<crate::budget::Scope> = config
        .keys
        .iter()
        .filter(|k| k.budget.is_limited())
        .map(crate::budget::Scope::key)
        .chain(
            config
                .tenants
                .iter()
                .filter(|t| t.budget.is_limited())
                .map(crate::budget::Scope::tenant),
        )
        .collect();
    let total = scopes.len();
    let read: Vec<_> = futures::stream::iter(scopes.into_iter().take(MAX_BUDGET_SCOPES))
        .map(|scope| async move {
            let spend = app.budgets.peek(&scope).await;
            (scope, spend)
        })
        .buffer_unordered(BUDGET_READS_AT_ONCE)
        .collect()
        .await;
    let mut unavailable = 0u64;
    let mut rows: Vec<(f64, Value)> = Vec::new();
    for (scope, spend) in read {
        let Ok(spend) = spend else {
            unavailable += 1;
            continue;
        };
        let spend = spend.at(now);
        for (name, limit, used) in limits(&scope.budget, &spend) {
            let share = if limit.is_zero() {
                1.0
            } else {
                (used / limit).to_f64().unwrap_or(1.0)
            };
            let v = json!({"scope": scope.kind, "id": scope.id, "limit": name,
                "limit_value": limit.normalize().to_string(), "used": used.normalize().to_string(),
                "share": share, "near": share >= NEAR_SHARE});
            rows.push((share, v));
        }
    }
    if unavailable > 0 && rows.is_empty() {
        return Err(super::unavailable(
            "The budget store (KV bucket SY_BUDGETS) could not be read.",
        ));
    }
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    let near = rows.iter().filter(|(s, _)| *s >= NEAR_SHARE).count();
    Ok(json!({
        "near_share": NEAR_SHARE, "scopes": total, "truncated": total > MAX_BUDGET_SCOPES,
        "unavailable": unavailable, "near": near,
        "data": rows.into_iter().take(BUDGET_ROWS).map(|(_, v)| v).collect::<Vec<_>>(),
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn parses_and_bounds_the_parameters() {
        assert_eq!(
            parse("").unwrap(),
            Params {
                days: 14,
                window_minutes: 60
            }
        );
        assert_eq!(
            parse("days=1&window_minutes=1440").unwrap(),
            Params {
                days: 1,
                window_minutes: 1440
            }
        );
        for (bad, param) in [
            ("days=0", "days"),
            ("days=63", "days"),
            ("days=x", "days"),
            ("window_minutes=1441", "window_minutes"),
            ("days=2&days=3", "days"),
            ("limit=5", "limit"),
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
            assert_eq!(e.param.as_deref(), Some(param), "{bad}");
        }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.50), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[1, 2], 0.5), 1);
        assert_eq!(
            quantiles(vec![30, 10, 20]),
            json!({"p50": 20, "p95": 30, "p99": 30, "max": 30})
        );
        assert_eq!(quantiles(Vec::new()), Value::Null);
    }

    #[test]
    fn daily_series_align_with_the_days() {
        use switchyard_schemas::usage_query::UsageRow;
        let row = |day: &str, model: &str, charge: i64| UsageRow {
            group: BTreeMap::from([
                ("day".to_owned(), day.to_owned()),
                ("model".to_owned(), model.to_owned()),
            ]),
            requests: 1,
            charge_usd: Decimal::new(charge, 4),
            ..UsageRow::default()
        };
        let reply = UsageReply {
            rows: vec![
                row("2026-12-01", "a", 5),
                row("2026-11-30", "b", 20),
                row("2026-12-01", "b", 1),
            ],
            totals: UsageRow::default(),
        };
        let days = vec!["2026-11-30".to_owned(), "2026-12-01".to_owned()];
        let s = series(&days, &reply, "model");
        assert_eq!(s[0]["model"], "b");
        assert_eq!(s[0]["charge_usd"], json!(["0.002", "0.0001"]));
        assert_eq!(s[0]["total_charge_usd"], "0.0021");
        assert_eq!(s[1]["charge_usd"], json!(["0", "0.0005"]));
        assert_eq!(s[1]["requests"], json!([0, 1]));
    }

    #[test]
    fn spend_history_is_reused_ten_times_as_long_as_it_took() {
        let c = SpendCache::default();
        let now = 20 * DAY_MS + 1000;
        c.put(14, now, 100, json!("built"));
        assert_eq!(c.get(14, now + 999), Some(json!("built")));
        assert_eq!(c.get(14, now + 1000), None);
        assert_eq!(c.get(7, now), None);
        c.put(14, now, 0, json!("fast"));
        assert_eq!(c.get(14, now), None, "a fast ledger is asked every time");
        c.put(14, now, 1_000_000, json!("slow"));
        assert_eq!(c.get(14, now + SPEND_MAX_REUSE_MS - 1), Some(json!("slow")));
        // Never across midnight: today's bar must not be yesterday's.
        let late = 21 * DAY_MS - 10;
        c.put(14, late, 1000, json!("late"));
        assert_eq!(c.get(14, 21 * DAY_MS + 5), None);
    }

    #[test]
    fn breaker_names() {
        use switchyard_schemas::health::HealthState::*;
        assert_eq!(breaker("breaker_open", Unhealthy), "open");
        assert_eq!(breaker("breaker_open", Degraded), "half_open");
        assert_eq!(breaker("breaker_half_open", Degraded), "half_open");
        assert_eq!(breaker("breaker_closed", Healthy), "closed");
        assert_eq!(breaker("provider_cooldown", Unhealthy), "cooldown");
        assert_eq!(breaker("cooldown_over", Healthy), "closed");
    }
}
