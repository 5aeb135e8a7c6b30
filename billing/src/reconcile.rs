//! Reconciliation: the `charge` row ingress wrote for a request against the `upstream` rows the
//! workers wrote for its upstream calls, classified into [`DiscrepancyClass`]es.
//!
//! **Which requests a range holds.** A request belongs to the half-open range
//! `[from_ms, to_ms)` when its *anchor* time is in it: the `ts_ms` of its charge row, or, without a
//! charge row, the earliest `ts_ms` of its upstream rows ([`RequestRows::anchor_ts_ms`]). All rows
//! of such a request are read, even those a few ms across the boundary, so a request that
//! straddles midnight is neither split nor reported as a discrepancy on both days.
//!
//! **The serving attempt** of a request is its highest-attempt upstream row with status `ok` whose
//! `target` equals the charge row's `target` ([`RequestRows::serving_attempt`]): the upstream call
//! whose answer the tenant got, and whose usage the charge should repeat.
//!
//! Money (`cost_usd`) is read as exact decimal text into [`Decimal`]; nothing here sums in SQL.

use crate::row::{from_usage_row, parse_decimal, status_str, usage_row_columns};
use crate::{BillingError, Ledger};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::any::AnyRow;
use std::collections::BTreeMap;
use switchyard_schemas::usage::{Usage, UsageEvent, UsageKind, UsageStatus};

/// One `usage_events` row as reports and reconciliation read it.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerRow {
    /// The request (UUIDv7 text).
    pub request_id: String,
    /// `upstream` or `charge`.
    pub kind: UsageKind,
    /// Upstream call number (0 for `charge`).
    pub attempt: u32,
    /// Event time, ms since the Unix epoch.
    pub ts_ms: u64,
    /// Tenant, when auth is on.
    pub tenant: Option<String>,
    /// Calling key id, when auth is on.
    pub key_id: Option<String>,
    /// Standard model id or route tag the client asked for.
    pub model: String,
    /// Target called (`upstream`) or that served / was tried last (`charge`).
    pub target: Option<String>,
    /// Model id sent upstream.
    pub upstream_model: Option<String>,
    /// Token counts, tokens.
    pub usage: Usage,
    /// Counts are an estimate.
    pub estimated: bool,
    /// Outcome.
    pub status: UsageStatus,
    /// Fallbacks before the serving target (`charge` only), count.
    pub fallbacks: u32,
    /// Answered from the cache (`charge` only).
    pub cache_hit: bool,
    /// Cost price (`upstream`) or charge (`charge`), USD, exact; `None` = model not priced.
    pub cost_usd: Option<Decimal>,
    /// The batch job the request was an item of (`None` for live traffic).
    pub batch_id: Option<String>,
    /// What had no price when billing priced the row (comma-separated components: `model`,
    /// `cache_write_1h`, `audio_input`, `audio_output`, `service_tier`); `None` = all priced.
    pub unpriced: Option<String>,
}

impl LedgerRow {
    /// Where the row comes from, as reports label it: `probe` (a health probe's upstream call,
    /// tenant [`PROBE_TENANT`](switchyard_schemas::usage::PROBE_TENANT)), `batch` (an item of a
    /// batch job), `cache` (a charge answered from the answer cache) or `live`.
    pub fn origin(&self) -> &'static str {
        if self.tenant.as_deref() == Some(switchyard_schemas::usage::PROBE_TENANT) {
            "probe"
        } else if self.batch_id.is_some() {
            "batch"
        } else if self.cache_hit {
            "cache"
        } else {
            "live"
        }
    }

    /// The row `event` becomes, with `cost_usd` as given (the ledger prices at insert time).
    pub fn from_event(event: &UsageEvent, cost_usd: Option<Decimal>) -> Self {
        Self {
            request_id: event.request_id.to_string(),
            kind: event.kind,
            attempt: event.attempt,
            ts_ms: event.ts_ms,
            tenant: event.tenant.clone(),
            key_id: event.key_id.clone(),
            model: event.model.clone(),
            target: event.target.clone(),
            upstream_model: event.upstream_model.clone(),
            usage: event.usage,
            estimated: event.estimated,
            status: event.status,
            fallbacks: event.fallbacks,
            cache_hit: event.cache_hit,
            cost_usd,
            batch_id: event.batch_id.clone(),
            unpriced: None,
        }
    }
}

/// The rows of one request: at most one charge row and its upstream rows by ascending attempt.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RequestRows {
    /// The request (UUIDv7 text).
    pub request_id: String,
    /// What ingress charged, if its event is stored.
    pub charge: Option<LedgerRow>,
    /// One row per upstream call, ascending `attempt`.
    pub upstream: Vec<LedgerRow>,
}

impl RequestRows {
    /// Groups `rows` by request id (ascending), upstream rows by ascending attempt.
    pub fn group(rows: impl IntoIterator<Item = LedgerRow>) -> Vec<Self> {
        let mut by_id: BTreeMap<String, Self> = BTreeMap::new();
        for row in rows {
            let entry = by_id.entry(row.request_id.clone()).or_insert_with(|| Self {
                request_id: row.request_id.clone(),
                ..Self::default()
            });
            match row.kind {
                UsageKind::Charge => entry.charge = Some(row),
                UsageKind::Upstream => entry.upstream.push(row),
                // Never a ledger row (audit_log only).
                UsageKind::Audit => {}
            }
        }
        let mut out: Vec<Self> = by_id.into_values().collect();
        for r in &mut out {
            r.upstream.sort_by_key(|u| u.attempt);
        }
        out
    }

    /// The time the request is filed under, ms since the Unix epoch: the charge row's `ts_ms`, or
    /// the earliest upstream `ts_ms` when there is no charge row (0 for an empty request).
    pub fn anchor_ts_ms(&self) -> u64 {
        match &self.charge {
            Some(c) => c.ts_ms,
            None => self.upstream.iter().map(|u| u.ts_ms).min().unwrap_or(0),
        }
    }

    /// The upstream call whose answer the tenant got: the highest-attempt `ok` upstream row on the
    /// charge row's `target`. `None` without a charge row or without such an upstream row.
    pub fn serving_attempt(&self) -> Option<&LedgerRow> {
        let target = self.charge.as_ref()?.target.as_deref()?;
        self.upstream
            .iter()
            .filter(|u| u.status == UsageStatus::Ok && u.target.as_deref() == Some(target))
            .max_by_key(|u| u.attempt)
    }
}

/// The kinds of disagreement between a request's charge row and its upstream rows. A request can
/// fall into several classes at once (e.g. [`Self::UsageMismatch`] and [`Self::Estimated`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiscrepancyClass {
    /// At least one upstream row and no charge row: an upstream call we pay for was never
    /// charged (the charge event is lost or still in flight).
    UpstreamWithoutCharge,
    /// A charge row whose status is not `ok` (`error` / `cancelled`) while at least one upstream
    /// row is `ok`: an upstream call completed but the request was not settled as served (its
    /// usage differences are part of this finding, not a separate [`Self::UsageMismatch`]).
    AdmittedNotSettled,
    /// A charge row with status `ok`, not a cache hit, and no serving attempt (no `ok` upstream row
    /// on the charge's target; usually no upstream row at all): a charge with no upstream call
    /// behind it.
    ChargeWithoutUpstream,
    /// A charge row with status `ok` whose usage differs, in any token count, from the serving
    /// attempt's usage.
    UsageMismatch,
    /// The charge row or any upstream row of the request has `estimated = true`.
    Estimated,
    /// The charge row or an upstream row had tokens with no price: the model has no card, or
    /// the card lacks a component the usage has (1-hour cache writes, audio, a service tier).
    /// What was charged for them follows the `unpriced:` policy (docs/pricing.md).
    UnpricedComponent,
}

impl DiscrepancyClass {
    /// Every class, in the order reports list them.
    pub const ALL: [Self; 6] = [
        Self::UpstreamWithoutCharge,
        Self::AdmittedNotSettled,
        Self::ChargeWithoutUpstream,
        Self::UsageMismatch,
        Self::Estimated,
        Self::UnpricedComponent,
    ];

    /// The snake_case name used in every output format.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UpstreamWithoutCharge => "upstream_without_charge",
            Self::AdmittedNotSettled => "admitted_not_settled",
            Self::ChargeWithoutUpstream => "charge_without_upstream",
            Self::UsageMismatch => "usage_mismatch",
            Self::Estimated => "estimated",
            Self::UnpricedComponent => "unpriced_component",
        }
    }

    /// The rule that puts a request into this class, in one sentence.
    pub fn rule(self) -> &'static str {
        match self {
            Self::UpstreamWithoutCharge => "upstream row(s) and no charge row",
            Self::AdmittedNotSettled => "charge status error/cancelled while an upstream row is ok",
            Self::ChargeWithoutUpstream => {
                "charge ok, not a cache hit, and no ok upstream row on the charge's target"
            }
            Self::UsageMismatch => {
                "charge ok, its usage differs from the serving upstream attempt's usage"
            }
            Self::Estimated => "charge or upstream row has estimated = true",
            Self::UnpricedComponent => "charge or upstream row has tokens without a price",
        }
    }
}

/// One finding: a request in one class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discrepancy {
    /// The request (UUIDv7 text).
    pub request_id: String,
    /// What is wrong.
    pub class: DiscrepancyClass,
    /// The request's anchor time, ms since the Unix epoch.
    pub ts_ms: u64,
    /// Tenant of the request, when known.
    pub tenant: Option<String>,
    /// Standard model id or route tag.
    pub model: String,
    /// Charge target, else the last upstream target.
    pub target: Option<String>,
    /// The request's origin ([`LedgerRow::origin`] of its charge row, else of its last upstream
    /// row): `live`, `batch`, `cache` or `probe`.
    #[serde(default)]
    pub origin: String,
    /// Human-readable specifics (statuses, attempts, token counts).
    pub details: String,
}

/// Number of requests per [`DiscrepancyClass`], requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DiscrepancyCounts {
    /// [`DiscrepancyClass::UpstreamWithoutCharge`], requests.
    pub upstream_without_charge: u64,
    /// [`DiscrepancyClass::AdmittedNotSettled`], requests.
    pub admitted_not_settled: u64,
    /// [`DiscrepancyClass::ChargeWithoutUpstream`], requests.
    pub charge_without_upstream: u64,
    /// [`DiscrepancyClass::UsageMismatch`], requests.
    pub usage_mismatch: u64,
    /// [`DiscrepancyClass::Estimated`], requests.
    pub estimated: u64,
    /// [`DiscrepancyClass::UnpricedComponent`], requests.
    #[serde(default)]
    pub unpriced_component: u64,
}

impl DiscrepancyCounts {
    fn slot(&mut self, class: DiscrepancyClass) -> &mut u64 {
        match class {
            DiscrepancyClass::UpstreamWithoutCharge => &mut self.upstream_without_charge,
            DiscrepancyClass::AdmittedNotSettled => &mut self.admitted_not_settled,
            DiscrepancyClass::ChargeWithoutUpstream => &mut self.charge_without_upstream,
            DiscrepancyClass::UsageMismatch => &mut self.usage_mismatch,
            DiscrepancyClass::Estimated => &mut self.estimated,
            DiscrepancyClass::UnpricedComponent => &mut self.unpriced_component,
        }
    }

    /// The count of `class`, requests.
    pub fn get(&self, class: DiscrepancyClass) -> u64 {
        let mut copy = *self;
        *copy.slot(class)
    }

    /// Sum over all classes, findings (a request in two classes counts twice).
    pub fn total(&self) -> u64 {
        DiscrepancyClass::ALL.iter().map(|c| self.get(*c)).sum()
    }
}

/// The outcome of reconciling a time range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconciliation {
    /// Range start (inclusive), ms since the Unix epoch.
    pub from_ms: u64,
    /// Range end (exclusive), ms since the Unix epoch.
    pub to_ms: u64,
    /// Requests examined (distinct request ids anchored in the range), requests.
    pub requests: u64,
    /// Requests with no finding at all, requests.
    pub clean_requests: u64,
    /// Findings per class, requests.
    pub counts: DiscrepancyCounts,
    /// The findings, by anchor time then request id then class; at most the row limit asked for.
    pub rows: Vec<Discrepancy>,
    /// True when findings beyond the row limit were left out of `rows` (they are in `counts`).
    pub truncated: bool,
}

/// The classes `req` falls into, each with its details, in [`DiscrepancyClass::ALL`] order.
pub fn classify(req: &RequestRows) -> Vec<Discrepancy> {
    let mut found: Vec<(DiscrepancyClass, String)> = Vec::new();
    let ok_upstream: Vec<&LedgerRow> = req
        .upstream
        .iter()
        .filter(|u| u.status == UsageStatus::Ok)
        .collect();
    let serving = req.serving_attempt();
    // Health probes call upstream with no client request behind them: no charge row is expected.
    let probe = req
        .upstream
        .iter()
        .all(|u| u.tenant.as_deref() == Some(switchyard_schemas::usage::PROBE_TENANT));
    match &req.charge {
        None if !req.upstream.is_empty() && !probe => found.push((
            DiscrepancyClass::UpstreamWithoutCharge,
            format!(
                "{} upstream row(s), {} ok, no charge row; attempts: {}",
                req.upstream.len(),
                ok_upstream.len(),
                attempts(&req.upstream)
            ),
        )),
        None => {}
        Some(charge) => {
            if charge.status != UsageStatus::Ok
                && let Some(u) = ok_upstream.last()
            {
                found.push((
                    DiscrepancyClass::AdmittedNotSettled,
                    format!(
                        "charge status {} while upstream attempt {} on {} is ok",
                        status_str(charge.status),
                        u.attempt,
                        u.target.as_deref().unwrap_or("-")
                    ),
                ));
            }
            if charge.status == UsageStatus::Ok && !charge.cache_hit && serving.is_none() {
                found.push((
                    DiscrepancyClass::ChargeWithoutUpstream,
                    format!(
                        "charge ok on target {}, no ok upstream row on it; upstream rows: [{}]",
                        charge.target.as_deref().unwrap_or("-"),
                        attempts(&req.upstream)
                    ),
                ));
            }
            // Only for a charge settled as served: an unsettled one is `AdmittedNotSettled`.
            if charge.status == UsageStatus::Ok
                && let Some(s) = serving
                && s.usage != charge.usage
            {
                found.push((
                    DiscrepancyClass::UsageMismatch,
                    format!(
                        "charge {} vs upstream attempt {} {}",
                        usage_str(&charge.usage),
                        s.attempt,
                        usage_str(&s.usage)
                    ),
                ));
            }
        }
    }
    let estimated_upstream: Vec<&LedgerRow> = req.upstream.iter().filter(|u| u.estimated).collect();
    let charge_estimated = req.charge.as_ref().is_some_and(|c| c.estimated);
    if charge_estimated || !estimated_upstream.is_empty() {
        let charge_side = charge_estimated.then(|| "charge".to_owned());
        let sides: Vec<String> = (charge_side.into_iter())
            .chain(
                estimated_upstream
                    .iter()
                    .map(|u| format!("upstream attempt {}", u.attempt)),
            )
            .collect();
        let mut details = format!("estimated: {}", sides.join(", "));
        // Estimate error where one side is exact: later work aggregates these.
        if let (Some(c), Some(s)) = (&req.charge, serving)
            && c.estimated != s.estimated
        {
            let (est, exact) = if c.estimated { (c, s) } else { (s, c) };
            let delta =
                i128::from(est.usage.total_tokens()) - i128::from(exact.usage.total_tokens());
            details.push_str(&format!(
                "; estimate {} vs exact {} tokens ({delta:+})",
                est.usage.total_tokens(),
                exact.usage.total_tokens()
            ));
        }
        found.push((DiscrepancyClass::Estimated, details));
    }
    let unpriced: Vec<String> = (req.charge.iter())
        .chain(&req.upstream)
        .filter_map(|r| {
            let what = r.unpriced.as_deref()?;
            let side = match r.kind {
                UsageKind::Charge | UsageKind::Audit => "charge".to_owned(),
                UsageKind::Upstream => format!(
                    "upstream attempt {} ({})",
                    r.attempt,
                    r.upstream_model.as_deref().unwrap_or("-")
                ),
            };
            Some(format!("{side}: {what}"))
        })
        .collect();
    if !unpriced.is_empty() {
        found.push((
            DiscrepancyClass::UnpricedComponent,
            format!("no price for {}", unpriced.join("; ")),
        ));
    }
    let (tenant, model, target, origin) = match (&req.charge, req.upstream.last()) {
        (Some(c), _) => (
            c.tenant.clone(),
            c.model.clone(),
            c.target.clone(),
            c.origin(),
        ),
        (None, Some(u)) => (
            u.tenant.clone(),
            u.model.clone(),
            u.target.clone(),
            u.origin(),
        ),
        (None, None) => (None, String::new(), None, "live"),
    };
    let ts_ms = req.anchor_ts_ms();
    found
        .into_iter()
        .map(|(class, details)| Discrepancy {
            request_id: req.request_id.clone(),
            class,
            ts_ms,
            tenant: tenant.clone(),
            model: model.clone(),
            target: target.clone(),
            origin: origin.to_owned(),
            details,
        })
        .collect()
}

/// Reconciles `requests` (already restricted to the range) keeping at most `row_limit` findings
/// in [`Reconciliation::rows`]; counts always cover all of them.
pub fn reconcile_requests(
    requests: &[RequestRows],
    from_ms: u64,
    to_ms: u64,
    row_limit: usize,
) -> Reconciliation {
    let mut ordered: Vec<&RequestRows> = requests.iter().collect();
    ordered
        .sort_by(|a, b| (a.anchor_ts_ms(), &a.request_id).cmp(&(b.anchor_ts_ms(), &b.request_id)));
    let mut out = Reconciliation {
        from_ms,
        to_ms,
        requests: requests.len() as u64,
        clean_requests: 0,
        counts: DiscrepancyCounts::default(),
        rows: Vec::new(),
        truncated: false,
    };
    for req in ordered {
        let found = classify(req);
        if found.is_empty() {
            out.clean_requests += 1;
        }
        for d in found {
            *out.counts.slot(d.class) += 1;
            if out.rows.len() < row_limit {
                out.rows.push(d);
            } else {
                out.truncated = true;
            }
        }
    }
    out
}

/// Reads every request anchored in `[from_ms, to_ms)` with all of its rows, in memory (meant for
/// ranges of about a day; the rows are compact, no raw JSON).
pub async fn load_requests(
    ledger: &Ledger,
    from_ms: u64,
    to_ms: u64,
) -> Result<Vec<RequestRows>, BillingError> {
    load_requests_of(ledger, from_ms, to_ms, None).await
}

/// [`load_requests`], restricted to the requests with a row of `tenant` in the range when given
/// (served by the `(tenant, ts_ms)` index). The caller still filters rows by tenant: this only
/// narrows what is read.
pub async fn load_requests_of(
    ledger: &Ledger,
    from_ms: u64,
    to_ms: u64,
    tenant: Option<&str>,
) -> Result<Vec<RequestRows>, BillingError> {
    let (from, to) = (ms_param(from_ms), ms_param(to_ms));
    let query = match tenant {
        None => sqlx::query(LOAD_SQL).bind(from).bind(to),
        Some(tenant) => sqlx::query(LOAD_TENANT_SQL)
            .bind(from)
            .bind(to)
            .bind(tenant.to_owned()),
    };
    let rows = query.fetch_all(ledger.pool()).await?;
    let rows = rows
        .iter()
        .map(row_from_sql)
        .collect::<Result<Vec<_>, _>>()?;
    let mut requests = RequestRows::group(rows);
    requests.retain(|r| (from_ms..to_ms).contains(&r.anchor_ts_ms()));
    Ok(requests)
}

/// [`load_requests`] then [`reconcile_requests`].
pub async fn reconcile(
    ledger: &Ledger,
    from_ms: u64,
    to_ms: u64,
    row_limit: usize,
) -> Result<Reconciliation, BillingError> {
    let requests = load_requests(ledger, from_ms, to_ms).await?;
    Ok(reconcile_requests(&requests, from_ms, to_ms, row_limit))
}

/// The columns [`row_from_sql`] reads, from `usage_events`.
macro_rules! load_columns {
    () => {
        concat!(
            "SELECT ",
            usage_row_columns!(),
            ", cost_usd, unpriced FROM usage_events "
        )
    };
}

/// Every row of every request with at least one row in `[$1, $2)`; anchoring is done in Rust.
const LOAD_SQL: &str = concat!(
    load_columns!(),
    "WHERE request_id IN (SELECT request_id FROM usage_events WHERE ts_ms >= $1 AND ts_ms < $2)"
);

/// [`LOAD_SQL`] for the requests with a row of tenant `$3` in `[$1, $2)`.
const LOAD_TENANT_SQL: &str = concat!(
    load_columns!(),
    "WHERE request_id IN (SELECT request_id FROM usage_events \
     WHERE tenant = $3 AND ts_ms >= $1 AND ts_ms < $2)"
);

/// A ms timestamp as the `BIGINT` it is compared with (saturating).
pub(crate) fn ms_param(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn row_from_sql(row: &AnyRow) -> Result<LedgerRow, BillingError> {
    let request_id: String = row.try_get("request_id")?;
    let cost: Option<String> = row.try_get("cost_usd")?;
    let cost_usd = cost.map(|s| parse_decimal(&request_id, &s)).transpose()?;
    Ok(from_usage_row!(LedgerRow, row, {
        cost_usd,
        unpriced: row.try_get("unpriced")?,
        request_id,
    }))
}

fn attempts(rows: &[LedgerRow]) -> String {
    rows.iter()
        .map(|u| {
            format!(
                "{}@{}={}",
                u.attempt,
                u.target.as_deref().unwrap_or("-"),
                status_str(u.status)
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn usage_str(u: &Usage) -> String {
    let mut s = format!(
        "prompt={} cached={} cache_write={} completion={} reasoning={}",
        u.prompt_tokens,
        u.cached_tokens,
        u.cache_write_tokens,
        u.completion_tokens,
        u.reasoning_tokens
    );
    for (name, v) in [
        ("cache_write_1h", u.cache_write_1h_tokens),
        ("audio_input", u.audio_input_tokens),
        ("audio_output", u.audio_output_tokens),
    ] {
        if v > 0 {
            s.push_str(&format!(" {name}={v}"));
        }
    }
    if let Some(t) = u.service_tier {
        s.push_str(&format!(" service_tier={}", t.as_str()));
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    const ID: &str = "0190a000-0000-7000-8000-000000000001";

    fn row(kind: UsageKind, attempt: u32, target: &str, status: UsageStatus) -> LedgerRow {
        LedgerRow {
            request_id: ID.into(),
            kind,
            attempt,
            ts_ms: 1_000 + u64::from(attempt),
            tenant: Some("acme".into()),
            key_id: None,
            model: "openai/gpt-4o".into(),
            target: Some(target.into()),
            upstream_model: Some("gpt-4o".into()),
            usage: Usage {
                prompt_tokens: 100,
                completion_tokens: 20,
                ..Usage::default()
            },
            estimated: false,
            status,
            fallbacks: 0,
            cache_hit: false,
            cost_usd: None,
            batch_id: None,
            unpriced: None,
        }
    }

    fn charge(target: &str, status: UsageStatus) -> LedgerRow {
        row(UsageKind::Charge, 0, target, status)
    }

    fn up(attempt: u32, target: &str, status: UsageStatus) -> LedgerRow {
        row(UsageKind::Upstream, attempt, target, status)
    }

    fn classes(charge: Option<LedgerRow>, upstream: Vec<LedgerRow>) -> Vec<DiscrepancyClass> {
        let req = RequestRows {
            request_id: ID.into(),
            charge,
            upstream,
        };
        classify(&req).into_iter().map(|d| d.class).collect()
    }

    use DiscrepancyClass as C;
    use UsageStatus::{Cancelled, Error, Ok};

    #[test]
    fn clean_request_and_fallback_have_no_findings() {
        assert!(classes(Some(charge("a", Ok)), vec![up(0, "a", Ok)]).is_empty());
        // Attempt 0 failed on `a`, attempt 1 served on `b`; the charge names `b`.
        let mut c = charge("b", Ok);
        c.fallbacks = 1;
        assert!(classes(Some(c), vec![up(0, "a", Error), up(1, "b", Ok)]).is_empty());
        // A failed request whose every upstream call failed is consistent too.
        assert!(classes(Some(charge("a", Error)), vec![up(0, "a", Error)]).is_empty());
    }

    #[test]
    fn upstream_without_charge() {
        assert_eq!(
            classes(None, vec![up(0, "a", Ok)]),
            [C::UpstreamWithoutCharge]
        );
        assert_eq!(
            classes(None, vec![up(0, "a", Error)]),
            [C::UpstreamWithoutCharge]
        );
        assert!(classes(None, vec![]).is_empty());
        // A health probe's call has no charge row by design.
        let mut probe = up(0, "a", Ok);
        probe.tenant = Some(switchyard_schemas::usage::PROBE_TENANT.into());
        assert!(classes(None, vec![probe]).is_empty());
    }

    #[test]
    fn admitted_not_settled() {
        for status in [Cancelled, Error] {
            assert_eq!(
                classes(Some(charge("a", status)), vec![up(0, "a", Ok)]),
                [C::AdmittedNotSettled]
            );
            // The failed charge carries none of the upstream's tokens: still one finding, not
            // also a usage mismatch.
            let mut c = charge("a", status);
            c.usage = Usage::default();
            assert_eq!(
                classes(Some(c), vec![up(0, "a", Ok)]),
                [C::AdmittedNotSettled]
            );
        }
        // Not when no upstream call completed.
        assert!(classes(Some(charge("a", Cancelled)), vec![up(0, "a", Cancelled)]).is_empty());
    }

    #[test]
    fn charge_without_upstream() {
        assert_eq!(
            classes(Some(charge("a", Ok)), vec![]),
            [C::ChargeWithoutUpstream]
        );
        // An ok upstream row on another target does not serve this charge.
        assert_eq!(
            classes(Some(charge("b", Ok)), vec![up(0, "a", Ok)]),
            [C::ChargeWithoutUpstream]
        );
        // Cache hits have no upstream call by design.
        let mut hit = charge("a", Ok);
        hit.cache_hit = true;
        assert!(classes(Some(hit), vec![]).is_empty());
    }

    #[test]
    fn usage_mismatch_uses_highest_ok_attempt_on_charge_target() {
        let mut c = charge("a", Ok);
        c.usage.completion_tokens = 21;
        let d = classify(&RequestRows {
            request_id: ID.into(),
            charge: Some(c.clone()),
            upstream: vec![up(0, "a", Ok)],
        });
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].class, C::UsageMismatch);
        assert!(d[0].details.contains("completion=21"), "{}", d[0].details);
        // Attempt 2 (same usage as the charge) serves, not attempt 0.
        let mut u2 = up(2, "a", Ok);
        u2.usage.completion_tokens = 21;
        let req = RequestRows {
            request_id: ID.into(),
            charge: Some(c),
            upstream: vec![up(0, "a", Ok), up(1, "b", Ok), u2],
        };
        assert_eq!(req.serving_attempt().map(|u| u.attempt), Some(2));
        assert!(classify(&req).is_empty());
    }

    #[test]
    fn estimated_on_either_side() {
        let mut c = charge("a", Cancelled);
        c.estimated = true;
        assert_eq!(
            classes(Some(c), vec![up(0, "a", Cancelled)]),
            [C::Estimated]
        );
        let mut u = up(0, "a", Ok);
        u.estimated = true;
        let d = classify(&RequestRows {
            request_id: ID.into(),
            charge: Some(charge("a", Ok)),
            upstream: vec![u],
        });
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].class, C::Estimated);
        assert!(
            d[0].details
                .contains("estimate 120 vs exact 120 tokens (+0)")
        );
    }

    #[test]
    fn anchoring_grouping_and_counts() {
        let mut other = charge("a", Ok);
        other.request_id = "0190a000-0000-7000-8000-000000000002".into();
        other.ts_ms = 5;
        let reqs = RequestRows::group(vec![
            up(1, "a", Ok),
            charge("a", Ok),
            up(0, "a", Error),
            other,
        ]);
        assert_eq!(reqs.len(), 2);
        assert_eq!(reqs[0].anchor_ts_ms(), 1_000);
        let attempts: Vec<u32> = reqs[0].upstream.iter().map(|u| u.attempt).collect();
        assert_eq!(attempts, [0, 1]);
        assert_eq!(
            RequestRows {
                upstream: vec![up(3, "a", Ok), up(1, "a", Ok)],
                ..RequestRows::default()
            }
            .anchor_ts_ms(),
            1_001
        );
        let r = reconcile_requests(&reqs, 0, 2_000, 0);
        assert_eq!((r.requests, r.clean_requests), (2, 1));
        assert_eq!(r.counts.charge_without_upstream, 1);
        assert_eq!(r.counts.total(), 1);
        assert!(r.rows.is_empty() && r.truncated);
        let names = DiscrepancyClass::ALL.map(|c| c.as_str()).join(",");
        let expected = "upstream_without_charge,admitted_not_settled,charge_without_upstream,";
        assert_eq!(
            names,
            format!("{expected}usage_mismatch,estimated,unpriced_component")
        );
    }
}
