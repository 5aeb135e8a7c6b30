//! Provider usage-export import: compares what a provider says we used (its usage export, CSV)
//! with the ledger's `upstream` rows, per UTC day and upstream model.
//!
//! The export is CSV (RFC 4180 quoting) with a header naming at least the columns
//! [`EXPORT_COLUMNS`] in any order (others are ignored): `date` (`YYYY-MM-DD`, UTC), `model` (the
//! provider's model id, i.e. the ledger's `upstream_model`), `input_tokens` (all input, cached
//! included, like `prompt_tokens`), `output_tokens` (all output, reasoning included, like
//! `completion_tokens`) and `cost_usd` (exact decimal). Rows with the same (date, model) are summed.
//!
//! Ledger side: every `upstream` row whose own `ts_ms` falls in the compared days, grouped by its
//! UTC date and `upstream_model`; `cost_usd` summed exactly (NULL = unpriced, counted as 0 and
//! reported). Differences are export − ledger.

use crate::reconcile::ms_param;
use crate::report::{ReportError, money, parse_utc_date, render_table, utc_date};
use crate::row::parse_decimal;
use crate::{BillingError, Ledger};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sqlx::Row;
use std::collections::BTreeMap;

/// The columns an export must have.
pub const EXPORT_COLUMNS: [&str; 5] =
    ["date", "model", "input_tokens", "output_tokens", "cost_usd"];
/// Label of ledger rows without an `upstream_model`.
pub const UNKNOWN_MODEL: &str = "(unknown)";
/// One day, ms.
const DAY_MS: u64 = 86_400_000;

/// One row of a provider usage export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportRow {
    /// UTC day, `YYYY-MM-DD`.
    pub date: String,
    /// Provider model id.
    pub model: String,
    /// Input tokens (cached included), tokens.
    pub input_tokens: u64,
    /// Output tokens (reasoning included), tokens.
    pub output_tokens: u64,
    /// What the provider billed, USD, exact.
    pub cost_usd: Decimal,
}

/// Splits CSV text into records with the 1-based line each starts on (RFC 4180: quoted fields
/// may hold commas, doubled quotes and line breaks). Blank lines are skipped.
fn csv_records(text: &str) -> Result<Vec<(usize, Vec<String>)>, ReportError> {
    let mut records = Vec::new();
    let (mut field, mut fields) = (String::new(), Vec::new());
    let (mut line, mut start, mut quoted, mut was_quoted) = (1usize, 1usize, false, false);
    let mut chars = text.trim_start_matches('\u{feff}').chars().peekable();
    let mut end_record = |fields: &mut Vec<String>, field: &mut String, start: usize| {
        fields.push(std::mem::take(field));
        let rec = std::mem::take(fields);
        if !(rec.len() == 1 && rec[0].trim().is_empty()) {
            records.push((start, rec));
        }
    };
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => {
                line += usize::from(c == '\n');
                field.push(c);
            }
            (false, '"') if field.trim().is_empty() && !was_quoted => {
                field.clear();
                quoted = true;
                was_quoted = true;
            }
            (false, ',') => {
                fields.push(std::mem::take(&mut field));
                was_quoted = false;
            }
            (false, '\r') if chars.peek() == Some(&'\n') => {}
            (false, '\n') => {
                end_record(&mut fields, &mut field, start);
                line += 1;
                start = line;
                was_quoted = false;
            }
            (false, c) if was_quoted && !c.is_whitespace() => {
                return Err(ReportError::Import {
                    line,
                    message: format!("character `{c}` after a closing quote"),
                });
            }
            (false, c) => field.push(c),
        }
    }
    if quoted {
        return Err(ReportError::Import {
            line: start,
            message: "unterminated quoted field".into(),
        });
    }
    end_record(&mut fields, &mut field, start);
    Ok(records)
}

/// Parses a usage export (see the module docs). Errors name the line and column.
pub fn parse_usage_export(text: &str) -> Result<Vec<ExportRow>, ReportError> {
    let records = csv_records(text)?;
    let Some((_, header)) = records.first() else {
        return Err(ReportError::Import {
            line: 1,
            message: format!("empty file; expected header {}", EXPORT_COLUMNS.join(",")),
        });
    };
    let mut index = [0usize; 5];
    for (slot, name) in index.iter_mut().zip(EXPORT_COLUMNS) {
        *slot = header
            .iter()
            .position(|h| h.trim().eq_ignore_ascii_case(name))
            .ok_or_else(|| ReportError::Import {
                line: 1,
                message: format!(
                    "header lacks column `{name}`; expected {}",
                    EXPORT_COLUMNS.join(",")
                ),
            })?;
    }
    let mut rows = Vec::with_capacity(records.len().saturating_sub(1));
    for (line, rec) in records.iter().skip(1) {
        let err = |message: String| ReportError::Import {
            line: *line,
            message,
        };
        let get = |i: usize| -> Result<&str, ReportError> {
            let name = EXPORT_COLUMNS.get(i).copied().unwrap_or("?");
            let col = index.get(i).copied().unwrap_or(usize::MAX);
            rec.get(col)
                .map(|s| s.trim())
                .ok_or_else(|| err(format!("missing column `{name}`")))
        };
        let int = |i: usize| -> Result<u64, ReportError> {
            let v = get(i)?;
            v.parse().map_err(|_| {
                err(format!(
                    "`{}` = `{v}` is not a token count",
                    EXPORT_COLUMNS[i]
                ))
            })
        };
        let date = get(0)?.to_owned();
        parse_utc_date(&date).map_err(|e| err(e.to_string()))?;
        let cost_text = get(4)?;
        let cost_usd: Decimal = cost_text
            .parse()
            .map_err(|e| err(format!("`cost_usd` = `{cost_text}`: {e}")))?;
        rows.push(ExportRow {
            date,
            model: get(1)?.to_owned(),
            input_tokens: int(2)?,
            output_tokens: int(3)?,
            cost_usd,
        });
    }
    Ok(rows)
}

/// Usage of one (day, model) on one side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageSide {
    /// Rows summed, rows.
    pub rows: u64,
    /// Input tokens, tokens.
    pub input_tokens: u64,
    /// Output tokens, tokens.
    pub output_tokens: u64,
    /// Cost, USD, exact.
    #[serde(with = "crate::report::json_money")]
    pub cost_usd: Decimal,
    /// Ledger rows without a price (counted as 0 in `cost_usd`), rows; 0 on the export side.
    pub unpriced_rows: u64,
}

impl UsageSide {
    fn add(&mut self, input: u64, output: u64, cost: Option<Decimal>) {
        self.rows += 1;
        self.input_tokens = self.input_tokens.saturating_add(input);
        self.output_tokens = self.output_tokens.saturating_add(output);
        self.cost_usd += cost.unwrap_or_default();
        self.unpriced_rows += u64::from(cost.is_none());
    }
}

/// How one (day, model) compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiffStatus {
    /// Same tokens and the same cost to the last digit.
    Match,
    /// On both sides, but tokens or cost differ.
    Mismatch,
    /// In the export, no ledger row.
    MissingInLedger,
    /// Ledger rows, not in the export.
    MissingInExport,
}

/// The comparison of one (day, upstream model).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportDiffRow {
    /// UTC day, `YYYY-MM-DD`.
    pub date: String,
    /// Upstream model id.
    pub model: String,
    /// What the provider reports.
    pub export: UsageSide,
    /// What the ledger holds.
    pub ledger: UsageSide,
    /// Export − ledger input tokens, tokens.
    pub input_tokens_diff: i128,
    /// Export − ledger output tokens, tokens.
    pub output_tokens_diff: i128,
    /// Export − ledger cost, USD, exact.
    #[serde(with = "crate::report::json_money")]
    pub cost_usd_diff: Decimal,
    /// The verdict.
    pub status: DiffStatus,
}

/// The whole comparison (`--format json` prints it; money as decimal strings with
/// [`JSON_MONEY_DP`](crate::report::JSON_MONEY_DP) places).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportDiff {
    /// First compared day, `YYYY-MM-DD` (UTC).
    pub date_from: String,
    /// Last compared day (inclusive), `YYYY-MM-DD` (UTC).
    pub date_to: String,
    /// One row per (day, model) present on either side, ascending.
    pub rows: Vec<ImportDiffRow>,
    /// Export total over the compared days.
    pub export_total: UsageSide,
    /// Ledger total over the compared days.
    pub ledger_total: UsageSide,
    /// Export − ledger cost over the compared days, USD, exact.
    #[serde(with = "crate::report::json_money")]
    pub cost_usd_diff: Decimal,
    /// Export rows outside the compared days, ignored, rows.
    pub skipped_export_rows: u64,
}

/// One ledger `upstream` row as the import compares it: (UTC date, model, input, output, cost).
pub type LedgerUsage = (String, String, u64, u64, Option<Decimal>);

/// Compares `export` with `ledger` rows over `date_from..=date_to` (both `YYYY-MM-DD`).
pub fn diff_usage(
    export: &[ExportRow],
    ledger: &[LedgerUsage],
    date_from: &str,
    date_to: &str,
) -> ImportDiff {
    type Sides = (Option<UsageSide>, Option<UsageSide>);
    let mut by_key: BTreeMap<(String, String), Sides> = BTreeMap::new();
    let in_range = |d: &str| d >= date_from && d <= date_to;
    let mut skipped = 0;
    for r in export {
        if !in_range(&r.date) {
            skipped += 1;
            continue;
        }
        let e = by_key.entry((r.date.clone(), r.model.clone())).or_default();
        e.0.get_or_insert_default()
            .add(r.input_tokens, r.output_tokens, Some(r.cost_usd));
    }
    for (date, model, input, output, cost) in ledger.iter().filter(|r| in_range(&r.0)) {
        let e = by_key.entry((date.clone(), model.clone())).or_default();
        e.1.get_or_insert_default().add(*input, *output, *cost);
    }
    let (mut export_total, mut ledger_total) = (UsageSide::default(), UsageSide::default());
    let rows: Vec<ImportDiffRow> = by_key
        .into_iter()
        .map(|((date, model), (ex, le))| {
            let status = match (&ex, &le) {
                (Some(_), None) => DiffStatus::MissingInLedger,
                (None, Some(_)) => DiffStatus::MissingInExport,
                (Some(a), Some(b))
                    if (a.input_tokens, a.output_tokens, a.cost_usd)
                        == (b.input_tokens, b.output_tokens, b.cost_usd) =>
                {
                    DiffStatus::Match
                }
                _ => DiffStatus::Mismatch,
            };
            let (ex, le) = (ex.unwrap_or_default(), le.unwrap_or_default());
            for (total, side) in [(&mut export_total, &ex), (&mut ledger_total, &le)] {
                total.rows += side.rows;
                total.input_tokens = total.input_tokens.saturating_add(side.input_tokens);
                total.output_tokens = total.output_tokens.saturating_add(side.output_tokens);
                total.cost_usd += side.cost_usd;
                total.unpriced_rows += side.unpriced_rows;
            }
            ImportDiffRow {
                input_tokens_diff: i128::from(ex.input_tokens) - i128::from(le.input_tokens),
                output_tokens_diff: i128::from(ex.output_tokens) - i128::from(le.output_tokens),
                cost_usd_diff: ex.cost_usd - le.cost_usd,
                date,
                model,
                export: ex,
                ledger: le,
                status,
            }
        })
        .collect();
    ImportDiff {
        date_from: date_from.to_owned(),
        date_to: date_to.to_owned(),
        rows,
        cost_usd_diff: export_total.cost_usd - ledger_total.cost_usd,
        export_total,
        ledger_total,
        skipped_export_rows: skipped,
    }
}

/// Reads the ledger's `upstream` rows of `date_from..=date_to` and compares them with `export`.
/// Without dates, the export's first and last dates are used.
pub async fn import_usage_diff(
    ledger: &Ledger,
    export: &[ExportRow],
    date_from: Option<&str>,
    date_to: Option<&str>,
) -> Result<ImportDiff, ReportError> {
    let first = export.iter().map(|r| r.date.as_str()).min();
    let last = export.iter().map(|r| r.date.as_str()).max();
    let (Some(from), Some(to)) = (date_from.or(first), date_to.or(last)) else {
        return Err(ReportError::InvalidDate(
            "no --date-from/--date-to and an export without rows".into(),
        ));
    };
    let from_ms = parse_utc_date(from)? * DAY_MS;
    let to_ms = (parse_utc_date(to)? + 1) * DAY_MS;
    let rows = sqlx::query(
        "SELECT request_id, ts_ms, upstream_model, prompt_tokens, completion_tokens, cost_usd \
         FROM usage_events WHERE kind = 'upstream' AND ts_ms >= $1 AND ts_ms < $2",
    )
    .bind(ms_param(from_ms))
    .bind(ms_param(to_ms))
    .fetch_all(ledger.pool())
    .await
    .map_err(BillingError::from)?;
    let mut usage = Vec::with_capacity(rows.len());
    for row in &rows {
        let request_id: String = row.try_get("request_id").map_err(BillingError::from)?;
        let count = |c: &str| -> Result<u64, BillingError> {
            let v: i64 = row.try_get(c)?;
            u64::try_from(v).map_err(|_| BillingError::CorruptRow(format!("{c} = {v}")))
        };
        let cost: Option<String> = row.try_get("cost_usd").map_err(BillingError::from)?;
        let model: Option<String> = row.try_get("upstream_model").map_err(BillingError::from)?;
        usage.push((
            utc_date(count("ts_ms")?),
            model.unwrap_or_else(|| UNKNOWN_MODEL.to_owned()),
            count("prompt_tokens")?,
            count("completion_tokens")?,
            cost.map(|c| parse_decimal(&request_id, &c)).transpose()?,
        ));
    }
    Ok(diff_usage(export, &usage, from, to))
}

impl ImportDiff {
    /// Aligned plain text: one line per (day, model), then totals.
    pub fn to_table(&self) -> String {
        let head = [
            "date",
            "model",
            "status",
            "export_in",
            "ledger_in",
            "diff_in",
            "export_out",
            "ledger_out",
            "diff_out",
            "export_usd",
            "ledger_usd",
            "diff_usd",
        ];
        let mut rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                let status = serde_json::to_value(r.status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| format!("{:?}", r.status));
                vec![
                    r.date.clone(),
                    r.model.clone(),
                    status,
                    r.export.input_tokens.to_string(),
                    r.ledger.input_tokens.to_string(),
                    format!("{:+}", r.input_tokens_diff),
                    r.export.output_tokens.to_string(),
                    r.ledger.output_tokens.to_string(),
                    format!("{:+}", r.output_tokens_diff),
                    money(r.export.cost_usd),
                    money(r.ledger.cost_usd),
                    money(r.cost_usd_diff),
                ]
            })
            .collect();
        let (e, l) = (&self.export_total, &self.ledger_total);
        rows.push(vec![
            "TOTAL".into(),
            String::new(),
            String::new(),
            e.input_tokens.to_string(),
            l.input_tokens.to_string(),
            format!(
                "{:+}",
                i128::from(e.input_tokens) - i128::from(l.input_tokens)
            ),
            e.output_tokens.to_string(),
            l.output_tokens.to_string(),
            format!(
                "{:+}",
                i128::from(e.output_tokens) - i128::from(l.output_tokens)
            ),
            money(e.cost_usd),
            money(l.cost_usd),
            money(self.cost_usd_diff),
        ]);
        let mut out = format!(
            "Provider usage export vs ledger upstream rows, {} .. {} (UTC; diff = export - ledger; USD)\n\n",
            self.date_from, self.date_to
        );
        out.push_str(&render_table(&head, &rows, 3..usize::MAX));
        out.push_str(&format!(
            "\nexact cost difference: {} USD; export rows outside the range: {}; unpriced ledger rows: {}\n",
            self.cost_usd_diff.normalize(),
            self.skipped_export_rows,
            self.ledger_total.unpriced_rows
        ));
        out
    }

    /// Pretty JSON (money as exact decimal strings).
    pub fn to_json(&self) -> Result<String, ReportError> {
        Ok(serde_json::to_string_pretty(self)?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_quoted_reordered_and_rejects_bad_rows() {
        let text = "\u{feff}model,date,input_tokens,output_tokens,cost_usd,note\r\n\
                    \"gpt-4o\",2025-11-05,1000,200,0.0045,\"a, \"\"quoted\"\"\nnote\"\r\n\
                    \n\
                    gpt-4o-mini,2025-11-06,1,2,0.000001\n";
        let rows = parse_usage_export(text).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].model, "gpt-4o");
        assert_eq!(rows[0].cost_usd.to_string(), "0.0045");
        assert_eq!(rows[1].date, "2025-11-06");
        let e = parse_usage_export("date,model,input_tokens,output_tokens\n").unwrap_err();
        assert!(e.to_string().contains("cost_usd"), "{e}");
        let e = parse_usage_export(
            "date,model,input_tokens,output_tokens,cost_usd\n2025-11-05,m,1,2,0\n2025-11-05,m,x,2,0\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("line 3"), "{e}");
        let e = parse_usage_export(
            "date,model,input_tokens,output_tokens,cost_usd\n2025-02-30,m,1,2,0\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        assert!(parse_usage_export("\"date,model\n").is_err());
    }

    #[test]
    fn diff_statuses() {
        let ex = |date: &str, model: &str, i, o, c: &str| ExportRow {
            date: date.into(),
            model: model.into(),
            input_tokens: i,
            output_tokens: o,
            cost_usd: c.parse().unwrap(),
        };
        let export = vec![
            ex("2025-11-05", "a", 10, 5, "0.1"),
            ex("2025-11-05", "b", 10, 5, "0.1"),
            ex("2025-11-05", "c", 1, 1, "0.01"),
            ex("2025-11-07", "a", 1, 1, "1"),
        ];
        let d = |s: &str| Some(s.parse::<Decimal>().unwrap());
        let ledger = vec![
            ("2025-11-05".into(), "a".into(), 10, 5, d("0.1")),
            ("2025-11-05".into(), "b".into(), 9, 5, d("0.09")),
            ("2025-11-06".into(), "z".into(), 3, 3, None),
        ];
        let r = diff_usage(&export, &ledger, "2025-11-05", "2025-11-06");
        let got: Vec<(&str, DiffStatus)> = r
            .rows
            .iter()
            .map(|r| (r.model.as_str(), r.status))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", DiffStatus::Match),
                ("b", DiffStatus::Mismatch),
                ("c", DiffStatus::MissingInLedger),
                ("z", DiffStatus::MissingInExport)
            ]
        );
        assert_eq!(r.rows[1].input_tokens_diff, 1);
        assert_eq!(r.rows[1].cost_usd_diff.to_string(), "0.01");
        assert_eq!(r.skipped_export_rows, 1);
        assert_eq!(r.ledger_total.unpriced_rows, 1);
        assert_eq!(r.cost_usd_diff.to_string(), "0.02");
        assert!(r.to_table().contains("TOTAL"));
    }
}
