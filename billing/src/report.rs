//! The daily report: one UTC day of the ledger grouped by tenant, model and target, with the day's
//! [reconciliation](mod@crate::reconcile) attached, rendered as an aligned table, CSV, JSON or a
//! self-contained HTML page ([`DailyReport::to_html`]).
//!
//! **What is counted where.** Requests are filed under the day and hour of their anchor time
//! (see [`reconcile`](mod@crate::reconcile)). Each ledger row is added to the group of its own
//! (tenant, model, target): a `charge` row to the target that served (or was tried last), each
//! `upstream` row to the target it called, so the cost of a failed attempt lands on the target that failed. `requests`,
//! `tokens`, `charge_usd`, cache hits, fallbacks, errors and cancellations come from `charge` rows
//! (what tenants were billed for); `cost_usd`, `upstream_calls`, `upstream_tokens` and
//! `upstream_errors` from `upstream` rows (what upstream calls cost us).
//!
//! Money is summed exactly in [`Decimal`] from the ledger's decimal text; the table, CSV and HTML
//! print it rounded to [`MONEY_DP`] places, JSON as strings with [`JSON_MONEY_DP`] places (exact
//! for every price written with up to 6 decimals per 1M tokens). Within a format every amount
//! has the same number of decimals, so `"0.023900"` never sits beside `"0.0478"`.

use crate::reconcile::{self, LedgerRow, Reconciliation, RequestRows};
use crate::{BillingError, Ledger};
use rust_decimal::{Decimal, RoundingStrategy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Range;
use switchyard_schemas::usage::{Usage, UsageKind, UsageStatus};

/// Decimal places money is printed with in table, CSV and HTML output (USD).
pub const MONEY_DP: u32 = 6;
/// Decimal places of every amount in JSON output (USD strings): a per-1M-token price with up to
/// 6 decimals costs at most 12 decimals per token, so sums of such amounts stay exact.
pub const JSON_MONEY_DP: u32 = 12;
/// Discrepancy rows a daily report lists (all are counted), rows.
pub const REPORT_DISCREPANCY_ROWS: usize = 50;
/// Label of requests without a tenant (auth off) in every human format (table, CSV, HTML,
/// tenant breakdowns); JSON keeps `null` in typed fields.
pub const NO_TENANT: &str = "(none)";
/// One day, ms.
const DAY_MS: u64 = 86_400_000;
/// One hour, ms.
const HOUR_MS: u64 = 3_600_000;

/// The CSV header of [`DailyReport::to_csv`]; one row per group follows.
pub const CSV_HEADER: &str = "tenant,model,target,requests,upstream_calls,new_input_tokens,\
cached_input_tokens,cache_write_tokens,output_tokens,reasoning_tokens,upstream_tokens,cost_usd,\
charge_usd,margin_usd,cache_hits,fallbacks,errors,cancelled,upstream_errors,estimated_rows,\
unpriced_rows";

/// The columns of [`DailyReport::to_table`]'s group table (a subset of [`CSV_HEADER`]).
const TABLE_COLUMNS: &str = "tenant model target requests new_in cached_in cache_wr output \
reasoning cost_usd charge_usd margin_usd cache_hits fallbacks errors cancelled estimated";

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Reading the ledger failed.
    #[error(transparent)]
    Billing(#[from] BillingError),
    /// A date is not a valid `YYYY-MM-DD` (from 1970-01-01).
    #[error("invalid date `{0}`: expected YYYY-MM-DD")]
    InvalidDate(String),
    /// A provider usage export could not be read.
    #[error("usage export line {line}: {message}")]
    Import {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// JSON encoding failed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

/// Tokens by billing type, tokens. The parts never overlap (as in [`crate::pricing`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenBreakdown {
    /// Uncached input: prompt − cached − cache write, tokens.
    pub new_input: u64,
    /// Input read from the provider's cache, tokens.
    pub cached_input: u64,
    /// Input written to the provider's cache, tokens.
    pub cache_write: u64,
    /// Output excluding reasoning, tokens.
    pub output: u64,
    /// Reasoning output, tokens.
    pub reasoning: u64,
}

impl TokenBreakdown {
    /// Splits `u`, clamping parts exactly like the pricing does (cached ≤ prompt, etc.).
    pub fn from_usage(u: &Usage) -> Self {
        let cached = u.cached_tokens.min(u.prompt_tokens);
        let write = u.cache_write_tokens.min(u.prompt_tokens - cached);
        let reasoning = u.reasoning_tokens.min(u.completion_tokens);
        Self {
            new_input: u.prompt_tokens - cached - write,
            cached_input: cached,
            cache_write: write,
            output: u.completion_tokens - reasoning,
            reasoning,
        }
    }

    /// Adds `o` part by part (saturating).
    pub fn add(&mut self, o: &Self) {
        self.new_input = self.new_input.saturating_add(o.new_input);
        self.cached_input = self.cached_input.saturating_add(o.cached_input);
        self.cache_write = self.cache_write.saturating_add(o.cache_write);
        self.output = self.output.saturating_add(o.output);
        self.reasoning = self.reasoning.saturating_add(o.reasoning);
    }

    /// The parts in billing-type order (new input, cached input, cache write, output,
    /// reasoning), tokens: the token columns of every report format.
    pub fn parts(&self) -> [u64; 5] {
        [
            self.new_input,
            self.cached_input,
            self.cache_write,
            self.output,
            self.reasoning,
        ]
    }

    /// All parts, tokens.
    pub fn total(&self) -> u64 {
        self.parts().iter().fold(0u64, |a, b| a.saturating_add(*b))
    }
}

/// The figures of one group (or of the whole day).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStats {
    /// Charge rows, i.e. requests, requests.
    pub requests: u64,
    /// Upstream rows, i.e. upstream calls, calls.
    pub upstream_calls: u64,
    /// Charged tokens by billing type (charge rows), tokens.
    pub tokens: TokenBreakdown,
    /// Prompt + completion tokens of the upstream calls, tokens.
    pub upstream_tokens: u64,
    /// Sum of upstream `cost_usd` (cost price), USD, exact.
    #[serde(with = "json_money")]
    pub cost_usd: Decimal,
    /// Sum of charge `cost_usd` (sale price), USD, exact.
    #[serde(with = "json_money")]
    pub charge_usd: Decimal,
    /// `charge_usd − cost_usd`, USD, exact.
    #[serde(with = "json_money")]
    pub margin_usd: Decimal,
    /// Charge rows answered from the cache, requests.
    pub cache_hits: u64,
    /// Tokens of those cache hits (in `tokens`, but charged $0), tokens.
    #[serde(default)]
    pub cache_hit_tokens: u64,
    /// Sum of `fallbacks` on charge rows, fallbacks.
    pub fallbacks: u64,
    /// Charge rows with status `error`, requests.
    pub errors: u64,
    /// Charge rows with status `cancelled`, requests.
    pub cancelled: u64,
    /// Upstream rows with status `error`, calls (a call the client's disconnect cancelled is
    /// not an upstream error).
    pub upstream_errors: u64,
    /// Rows (either kind) with estimated counts, rows.
    pub estimated_rows: u64,
    /// Rows (either kind) with anything unpriced: the model (NULL `cost_usd`, counted as 0) or
    /// a component (charged by the `unpriced:` policy; the row's `unpriced` names it), rows.
    pub unpriced_rows: u64,
}

impl GroupStats {
    /// Cache hits, fallbacks, errors, cancelled and estimated rows: the outcome columns of the
    /// terminal and HTML tables (the CSV has every counter).
    pub(crate) fn table_outcomes(&self) -> [u64; 5] {
        [
            self.cache_hits,
            self.fallbacks,
            self.errors,
            self.cancelled,
            self.estimated_rows,
        ]
    }

    /// Adds one ledger row.
    pub fn add_row(&mut self, row: &LedgerRow) {
        let amount = row.cost_usd.unwrap_or_default();
        self.unpriced_rows += u64::from(row.cost_usd.is_none() || row.unpriced.is_some());
        self.estimated_rows += u64::from(row.estimated);
        match row.kind {
            UsageKind::Charge => {
                self.requests += 1;
                self.tokens.add(&TokenBreakdown::from_usage(&row.usage));
                self.charge_usd += amount;
                self.cache_hits += u64::from(row.cache_hit);
                if row.cache_hit {
                    self.cache_hit_tokens += TokenBreakdown::from_usage(&row.usage).total();
                }
                self.fallbacks += u64::from(row.fallbacks);
                self.errors += u64::from(row.status == UsageStatus::Error);
                self.cancelled += u64::from(row.status == UsageStatus::Cancelled);
            }
            UsageKind::Upstream => {
                self.upstream_calls += 1;
                self.upstream_tokens = self
                    .upstream_tokens
                    .saturating_add(row.usage.total_tokens());
                self.cost_usd += amount;
                self.upstream_errors += u64::from(row.status == UsageStatus::Error);
            }
            // Never a ledger row (audit_log only).
            UsageKind::Audit => {}
        }
        self.margin_usd = self.charge_usd - self.cost_usd;
    }

    /// Tokens tenants were charged for: charge rows' tokens without the cache hits', tokens.
    pub fn charged_tokens(&self) -> u64 {
        self.tokens.total().saturating_sub(self.cache_hit_tokens)
    }

    /// Adds another group's figures.
    pub fn merge(&mut self, o: &Self) {
        self.requests += o.requests;
        self.upstream_calls += o.upstream_calls;
        self.tokens.add(&o.tokens);
        self.upstream_tokens = self.upstream_tokens.saturating_add(o.upstream_tokens);
        self.cost_usd += o.cost_usd;
        self.charge_usd += o.charge_usd;
        self.margin_usd = self.charge_usd - self.cost_usd;
        self.cache_hits += o.cache_hits;
        self.cache_hit_tokens += o.cache_hit_tokens;
        self.fallbacks += o.fallbacks;
        self.errors += o.errors;
        self.cancelled += o.cancelled;
        self.upstream_errors += o.upstream_errors;
        self.estimated_rows += o.estimated_rows;
        self.unpriced_rows += o.unpriced_rows;
    }
}

/// One group of the report: a (tenant, model, target) triple and its figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRow {
    /// Tenant, `None` when auth is off.
    pub tenant: Option<String>,
    /// Standard model id or route tag the client asked for.
    pub model: String,
    /// Provider target, `None` when a charge row names none (e.g. rejected before routing).
    pub target: Option<String>,
    /// The figures.
    #[serde(flatten)]
    pub stats: GroupStats,
}

/// Declares a struct of the requests, cost and charge of one key field (a name, an hour), with a
/// constructor at zero and [`add`](Amounts::add) for one ledger row.
macro_rules! amounts {
    ($(#[$doc:meta])* $name:ident { $(#[$key_doc:meta])* $key:ident: $key_ty:ty }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        pub struct $name {
            $(#[$key_doc])*
            pub $key: $key_ty,
            /// Charge rows, requests.
            pub requests: u64,
            /// Upstream cost, USD, exact.
            #[serde(with = "json_money")]
            pub cost_usd: Decimal,
            /// Charge, USD, exact.
            #[serde(with = "json_money")]
            pub charge_usd: Decimal,
        }

        impl $name {
            /// Nothing counted yet for `key` (the name or hour).
            fn zero($key: $key_ty) -> Self {
                Self {
                    $key,
                    requests: 0,
                    cost_usd: Decimal::ZERO,
                    charge_usd: Decimal::ZERO,
                }
            }

            /// Adds `row`: a charge row is a request and its amount a charge, an upstream
            /// row's amount a cost.
            fn add(&mut self, row: &LedgerRow) {
                let amount = row.cost_usd.unwrap_or_default();
                match row.kind {
                    UsageKind::Charge => {
                        self.requests += 1;
                        self.charge_usd += amount;
                    }
                    UsageKind::Upstream => self.cost_usd += amount,
                    UsageKind::Audit => {}
                }
            }
        }
    };
}

amounts! {
    /// Requests, cost and charge of one model or tenant (the bar charts' data).
    Amounts {
        /// Model id, or tenant ([`NO_TENANT`] when none).
        name: String
    }
}

amounts! {
    /// Requests, cost and charge of one UTC hour of the day.
    HourAmounts {
        /// Hour of the day, 0–23 (UTC).
        hour: u32
    }
}

/// The daily report, also its JSON form (`--format json`; money as decimal strings with
/// [`JSON_MONEY_DP`] places).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DailyReport {
    /// The UTC day, `YYYY-MM-DD`.
    pub date: String,
    /// Day start (inclusive), ms since the Unix epoch.
    pub from_ms: u64,
    /// Day end (exclusive), ms since the Unix epoch.
    pub to_ms: u64,
    /// Currency of every amount: `USD`.
    pub currency: String,
    /// Groups by (tenant, model, target), ascending (no tenant/target first).
    pub groups: Vec<GroupRow>,
    /// The whole day.
    pub totals: GroupStats,
    /// Per model, by descending charge then cost then name.
    pub by_model: Vec<Amounts>,
    /// Per tenant, by descending charge then cost then name.
    pub by_tenant: Vec<Amounts>,
    /// Live traffic, cache hits, batch jobs and health probes apart (`live`, `cache`, `batch`,
    /// `probe`; see [`LedgerRow::origin`]: batch items are priced at the batch rate, cache hits
    /// are charged $0, probes are upstream cost only). Only origins with rows are listed;
    /// `requests` counts charge rows.
    #[serde(default)]
    pub by_origin: Vec<Amounts>,
    /// Per UTC hour, 24 entries.
    pub by_hour: Vec<HourAmounts>,
    /// The day's reconciliation, with the first [`REPORT_DISCREPANCY_ROWS`] findings.
    pub reconciliation: Reconciliation,
}

/// Builds the report of `date` (`YYYY-MM-DD`, UTC) from the ledger.
pub async fn daily_report(ledger: &Ledger, date: &str) -> Result<DailyReport, ReportError> {
    let (from_ms, to_ms) = utc_day_bounds(date)?;
    let requests = reconcile::load_requests(ledger, from_ms, to_ms).await?;
    Ok(build_daily(date, from_ms, to_ms, &requests))
}

/// Builds the report from requests already anchored in `[from_ms, to_ms)`.
pub fn build_daily(date: &str, from_ms: u64, to_ms: u64, requests: &[RequestRows]) -> DailyReport {
    type Key = (Option<String>, String, Option<String>);
    let mut groups: BTreeMap<Key, GroupStats> = BTreeMap::new();
    let mut models: BTreeMap<String, Amounts> = BTreeMap::new();
    let mut tenants: BTreeMap<String, Amounts> = BTreeMap::new();
    let mut origins: BTreeMap<String, Amounts> = BTreeMap::new();
    let mut hours: Vec<HourAmounts> = (0..24).map(HourAmounts::zero).collect();
    for req in requests {
        let hour = (req.anchor_ts_ms().saturating_sub(from_ms) / HOUR_MS).min(23) as usize;
        for row in req.charge.iter().chain(req.upstream.iter()) {
            groups
                .entry((row.tenant.clone(), row.model.clone(), row.target.clone()))
                .or_default()
                .add_row(row);
            let tenant = row.tenant.clone().unwrap_or_else(|| NO_TENANT.to_owned());
            // A request's upstream rows go with its charge row's origin (a batch item's or a
            // live request's call), so only probes and cache hits are told apart by their rows.
            let origin = match &req.charge {
                Some(c) if row.kind == UsageKind::Upstream => c.origin(),
                _ => row.origin(),
            };
            for (map, name) in [
                (&mut models, row.model.clone()),
                (&mut tenants, tenant),
                (&mut origins, origin.to_owned()),
            ] {
                map.entry(name.clone())
                    .or_insert_with(|| Amounts::zero(name))
                    .add(row);
            }
            if let Some(h) = hours.get_mut(hour) {
                h.add(row);
            }
        }
    }
    let mut totals = GroupStats::default();
    let groups: Vec<GroupRow> = groups
        .into_iter()
        .map(|((tenant, model, target), stats)| {
            totals.merge(&stats);
            GroupRow {
                tenant,
                model,
                target,
                stats,
            }
        })
        .collect();
    DailyReport {
        date: date.to_owned(),
        from_ms,
        to_ms,
        currency: "USD".to_owned(),
        groups,
        totals,
        by_model: ranked(models),
        by_tenant: ranked(tenants),
        by_origin: ranked(origins),
        by_hour: hours,
        reconciliation: reconcile::reconcile_requests(
            requests,
            from_ms,
            to_ms,
            REPORT_DISCREPANCY_ROWS,
        ),
    }
}

fn ranked(map: BTreeMap<String, Amounts>) -> Vec<Amounts> {
    let mut v: Vec<Amounts> = map.into_values().collect();
    v.sort_by(|a, b| {
        (b.charge_usd, b.cost_usd)
            .cmp(&(a.charge_usd, a.cost_usd))
            .then_with(|| a.name.cmp(&b.name))
    });
    v
}

impl DailyReport {
    /// Aligned plain text for terminals: groups, totals, discrepancy counts and rows.
    pub fn to_table(&self) -> String {
        let head: Vec<&str> = TABLE_COLUMNS.split(' ').collect();
        let cells = |tenant: &str, model: &str, target: &str, s: &GroupStats| {
            let mut row = vec![tenant.to_owned(), model.to_owned(), target.to_owned()];
            row.push(s.requests.to_string());
            row.extend(s.tokens.parts().map(|n| n.to_string()));
            row.extend([s.cost_usd, s.charge_usd, s.margin_usd].map(money));
            row.extend(s.table_outcomes().map(|n| n.to_string()));
            row
        };
        let mut rows: Vec<Vec<String>> = self
            .groups
            .iter()
            .map(|g| {
                cells(
                    g.tenant.as_deref().unwrap_or(NO_TENANT),
                    &g.model,
                    g.target.as_deref().unwrap_or("-"),
                    &g.stats,
                )
            })
            .collect();
        rows.push(cells("TOTAL", "", "", &self.totals));
        let mut out = format!(
            "Switchyard daily report {} (UTC; ts_ms {}..{}; USD)\n\n",
            self.date, self.from_ms, self.to_ms
        );
        out.push_str(&render_table(&head, &rows, 3..usize::MAX));
        out.push_str(&format!(
            "\nupstream calls {}, upstream errors {}, upstream tokens {}, unpriced rows {}\n",
            self.totals.upstream_calls,
            self.totals.upstream_errors,
            self.totals.upstream_tokens,
            self.totals.unpriced_rows
        ));
        for o in &self.by_origin {
            out.push_str(&format!(
                "{}: {} requests, cost {}, charge {}\n",
                o.name,
                o.requests,
                money(o.cost_usd),
                money(o.charge_usd),
            ));
        }
        out.push('\n');
        out.push_str(&self.discrepancy_table());
        out
    }

    fn discrepancy_table(&self) -> String {
        let r = &self.reconciliation;
        let mut out = format!(
            "Discrepancies: {} finding(s); {} of {} request(s) clean\n\n",
            r.counts.total(),
            r.clean_requests,
            r.requests
        );
        let counts: Vec<Vec<String>> = reconcile::DiscrepancyClass::ALL
            .iter()
            .map(|c| {
                vec![
                    c.as_str().to_owned(),
                    r.counts.get(*c).to_string(),
                    c.rule().to_owned(),
                ]
            })
            .collect();
        out.push_str(&render_table(&["class", "count", "rule"], &counts, 1..2));
        if !r.rows.is_empty() {
            out.push('\n');
            let rows: Vec<Vec<String>> = r
                .rows
                .iter()
                .map(|d| {
                    vec![
                        d.request_id.clone(),
                        d.class.as_str().to_owned(),
                        d.tenant.clone().unwrap_or_else(|| NO_TENANT.to_owned()),
                        d.model.clone(),
                        d.target.clone().unwrap_or_else(|| "-".to_owned()),
                        d.origin.clone(),
                        d.details.clone(),
                    ]
                })
                .collect();
            let head: Vec<&str> = "request_id class tenant model target origin details"
                .split(' ')
                .collect();
            out.push_str(&render_table(&head, &rows, 0..0));
            if r.truncated {
                out.push_str(&format!(
                    "(first {} findings shown)\n",
                    REPORT_DISCREPANCY_ROWS
                ));
            }
        }
        out
    }

    /// CSV: the [`CSV_HEADER`] line, then one line per group (money rounded to [`MONEY_DP`]).
    pub fn to_csv(&self) -> String {
        let mut out = String::from(CSV_HEADER);
        out.push('\n');
        for g in &self.groups {
            let s = &g.stats;
            let mut fields = vec![
                csv_field(g.tenant.as_deref().unwrap_or(NO_TENANT)),
                csv_field(&g.model),
                csv_field(g.target.as_deref().unwrap_or("")),
            ];
            fields.extend([s.requests, s.upstream_calls].map(|n| n.to_string()));
            fields.extend(s.tokens.parts().map(|n| n.to_string()));
            fields.push(s.upstream_tokens.to_string());
            fields.extend([s.cost_usd, s.charge_usd, s.margin_usd].map(money));
            fields.extend(
                [
                    s.cache_hits,
                    s.fallbacks,
                    s.errors,
                    s.cancelled,
                    s.upstream_errors,
                    s.estimated_rows,
                    s.unpriced_rows,
                ]
                .map(|n| n.to_string()),
            );
            out.push_str(&fields.join(","));
            out.push('\n');
        }
        out
    }

    /// Pretty JSON of the whole report (money as decimal strings with [`JSON_MONEY_DP`] places).
    pub fn to_json(&self) -> Result<String, ReportError> {
        Ok(serde_json::to_string_pretty(self)?)
    }
}

/// `v` rounded half away from zero to [`MONEY_DP`] places, always printed with that many.
pub fn money(v: Decimal) -> String {
    let mut r = v.round_dp_with_strategy(MONEY_DP, RoundingStrategy::MidpointAwayFromZero);
    if r.is_zero() {
        r.set_sign_positive(true);
    }
    format!("{r:.prec$}", prec = MONEY_DP as usize)
}

/// Serde for JSON money: a string with exactly [`JSON_MONEY_DP`] decimals (rounded half away from
/// zero beyond that); reads any decimal string or number back.
pub mod json_money {
    use super::JSON_MONEY_DP;
    use rust_decimal::{Decimal, RoundingStrategy};

    /// `v` as a string with [`JSON_MONEY_DP`] decimals (no negative zero).
    pub fn text(v: Decimal) -> String {
        let mut r = v.round_dp_with_strategy(JSON_MONEY_DP, RoundingStrategy::MidpointAwayFromZero);
        if r.is_zero() {
            r.set_sign_positive(true);
        }
        format!("{r:.prec$}", prec = JSON_MONEY_DP as usize)
    }

    /// Serialises `v` as [`text`].
    pub fn serialize<S: serde::Serializer>(v: &Decimal, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&text(*v))
    }

    /// Reads a decimal string (or number).
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Decimal, D::Error> {
        <Decimal as serde::Deserialize>::deserialize(d)
    }
}

/// One CSV field, quoted (RFC 4180) when it holds a comma, quote or line break.
pub(crate) fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// Renders rows under `head` with columns padded to their widest cell; the `numeric` columns
/// are right-aligned. Trailing spaces are trimmed.
pub(crate) fn render_table(head: &[&str], rows: &[Vec<String>], numeric: Range<usize>) -> String {
    let mut widths: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            let pad = w.saturating_sub(cell.chars().count());
            if numeric.contains(&i) {
                s.push_str(&" ".repeat(pad));
                s.push_str(cell);
            } else {
                s.push_str(cell);
                s.push_str(&" ".repeat(pad));
            }
        }
        format!("{}\n", s.trim_end())
    };
    let mut out = line(head.to_vec());
    out.push_str(&line(
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect(),
    ));
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Days since 1970-01-01 of a strict `YYYY-MM-DD` date (1970-01-01 to 9999-12-31).
pub fn parse_utc_date(date: &str) -> Result<u64, ReportError> {
    let bad = || ReportError::InvalidDate(date.to_owned());
    let b = date.as_bytes();
    let digits = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = date.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())
            .flatten()
    };
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return Err(bad());
    }
    let (y, m, d) = match (digits(0..4), digits(5..7), digits(8..10)) {
        (Some(y), Some(m), Some(d)) => (y, m, d),
        _ => return Err(bad()),
    };
    if y < 1970 || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return Err(bad());
    }
    let days = days_from_civil(y, m, d);
    // Rejects 2025-02-30 and the like: the day count must map back to the same date.
    if civil_from_days(days) != (y, m, d) {
        return Err(bad());
    }
    u64::try_from(days).map_err(|_| bad())
}

/// The UTC day `date` (`YYYY-MM-DD`) as `[from_ms, to_ms)`, ms since the Unix epoch.
pub fn utc_day_bounds(date: &str) -> Result<(u64, u64), ReportError> {
    let from = parse_utc_date(date)? * DAY_MS;
    Ok((from, from + DAY_MS))
}

/// The UTC date (`YYYY-MM-DD`) of `ts_ms`, ms since the Unix epoch.
pub fn utc_date(ts_ms: u64) -> String {
    let days = i64::try_from(ts_ms / DAY_MS).unwrap_or(i64::MAX / 2);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::str::FromStr;

    #[test]
    fn dates() {
        assert_eq!(utc_day_bounds("1970-01-01").unwrap(), (0, DAY_MS));
        assert_eq!(parse_utc_date("2000-03-01").unwrap(), 11_017);
        assert_eq!(parse_utc_date("2024-02-29").unwrap(), 19_782);
        for bad in [
            "2025-02-29",
            "2025-13-01",
            "2025-1-01",
            "1969-12-31",
            "2025/01/01",
            "x",
        ] {
            assert!(parse_utc_date(bad).is_err(), "{bad}");
        }
        assert_eq!(utc_date(1_762_300_800_000), "2025-11-05");
        assert_eq!(utc_date(1_762_300_799_999), "2025-11-04");
        for days in [0u64, 59, 60, 10_956, 11_016, 11_017, 19_782, 2_932_896] {
            let date = utc_date(days * DAY_MS);
            assert_eq!(parse_utc_date(&date).unwrap(), days, "{date}");
        }
    }

    #[test]
    fn money_and_csv_fields() {
        let d = |s: &str| Decimal::from_str(s).unwrap();
        assert_eq!(money(d("0.005615")), "0.005615");
        assert_eq!(money(d("2.5")), "2.500000");
        assert_eq!(money(d("0.0000005")), "0.000001");
        assert_eq!(money(d("-0.0000004")), "0.000000");
        assert_eq!(money(d("-1.25")), "-1.250000");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("plain"), "plain");
    }

    #[test]
    fn token_breakdown_clamps_like_pricing() {
        let t = TokenBreakdown::from_usage(&Usage {
            prompt_tokens: 10,
            cached_tokens: 8,
            cache_write_tokens: 5,
            completion_tokens: 4,
            reasoning_tokens: 9,
            ..Default::default()
        });
        assert_eq!(
            t,
            TokenBreakdown {
                new_input: 0,
                cached_input: 8,
                cache_write: 2,
                output: 0,
                reasoning: 4
            }
        );
        assert_eq!(t.total(), 14);
    }
}
