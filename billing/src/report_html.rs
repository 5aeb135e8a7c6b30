//! The HTML form of the [`DailyReport`]: one self-contained page (inline CSS, inline SVG charts
//! drawn here, no script, no external resource), safe to mail or archive.
//!
//! Charts: spend by model and by tenant (horizontal bars, charge and cost side by side) and by UTC
//! hour (vertical bars). Bar lengths are the only place money becomes `f64`, for pixel geometry;
//! every printed amount comes from the exact [`Decimal`](rust_decimal::Decimal).

use crate::reconcile::DiscrepancyClass;
use crate::report::{
    Amounts, DailyReport, GroupStats, MONEY_DP, NO_TENANT, REPORT_DISCREPANCY_ROWS, money,
};
use rust_decimal::Decimal;
use rust_decimal::prelude::ToPrimitive;
use std::fmt::Write as _;

/// Colour of charge (sale price) bars.
const CHARGE_COLOUR: &str = "#2b6cb0";
/// Colour of cost (upstream price) bars.
const COST_COLOUR: &str = "#dd6b20";
/// Chart width, px.
const CHART_W: f64 = 720.0;
/// Categories drawn in a bar chart (the rest are summed into "other"), categories.
const MAX_BARS: usize = 15;

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1a202c}\
h1{font-size:20px}h2{font-size:16px;margin-top:28px}\
table{border-collapse:collapse;margin:8px 0;width:100%;font-size:13px}\
th,td{padding:3px 5px;border-bottom:1px solid #e2e8f0;overflow-wrap:break-word}\
th{text-align:left;background:#f7fafc;vertical-align:bottom}\
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}\
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{border:1px solid #e2e8f0;border-radius:6px;\
padding:8px 14px}.card b{display:block;font-size:18px}svg{display:block;margin:8px 0;max-width:100%}\
.legend span{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px}";

/// Escapes text for HTML element content and attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn px(v: Decimal, max: Decimal, width: f64) -> f64 {
    if max <= Decimal::ZERO || v <= Decimal::ZERO {
        return 0.0;
    }
    (v / max).to_f64().unwrap_or(0.0).clamp(0.0, 1.0) * width
}

/// Horizontal paired bars (charge above cost) per category, with exact values as labels.
fn bar_chart(title: &str, items: &[Amounts]) -> String {
    let mut items: Vec<Amounts> = items.to_vec();
    if items.len() > MAX_BARS {
        let rest = items.split_off(MAX_BARS - 1);
        items.push(Amounts {
            name: format!("other ({})", rest.len()),
            requests: rest.iter().map(|a| a.requests).sum(),
            cost_usd: rest.iter().map(|a| a.cost_usd).sum(),
            charge_usd: rest.iter().map(|a| a.charge_usd).sum(),
        });
    }
    let max = items
        .iter()
        .flat_map(|a| [a.charge_usd, a.cost_usd])
        .max()
        .unwrap_or_default();
    let (label_w, value_w, row_h, top) = (200.0, 110.0, 30.0, 28.0);
    let bar_w = CHART_W - label_w - value_w;
    let height = top + row_h * items.len().max(1) as f64 + 8.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_W}" height="{height}" viewBox="0 0 {CHART_W} {height}" role="img" aria-label="{t}"><text x="0" y="16" font-size="14" font-weight="bold">{t}</text>"#,
        t = esc(title)
    );
    if items.is_empty() {
        let _ = write!(
            s,
            r##"<text x="0" y="{}" fill="#718096">no data</text>"##,
            top + 16.0
        );
    }
    for (i, a) in items.iter().enumerate() {
        let y = top + row_h * i as f64;
        let name: String = a.name.chars().take(28).collect();
        let _ = write!(
            s,
            r#"<text x="0" y="{:.1}" font-size="12">{}</text>"#,
            y + 16.0,
            esc(&name)
        );
        for (j, (v, colour, what)) in [
            (a.charge_usd, CHARGE_COLOUR, "charge"),
            (a.cost_usd, COST_COLOUR, "cost"),
        ]
        .into_iter()
        .enumerate()
        {
            let by = y + 3.0 + 12.0 * j as f64;
            let w = px(v, max, bar_w);
            let _ = write!(
                s,
                r#"<rect x="{label_w}" y="{by:.1}" width="{w:.1}" height="10" fill="{colour}"><title>{} {what} {} USD ({} requests)</title></rect><text x="{:.1}" y="{:.1}" font-size="10">{}</text>"#,
                esc(&a.name),
                v.normalize(),
                a.requests,
                label_w + w + 4.0,
                by + 9.0,
                money(v)
            );
        }
    }
    s.push_str("</svg>");
    s
}

/// 24 vertical paired bars, one pair per UTC hour.
fn hour_chart(report: &DailyReport) -> String {
    let max = report
        .by_hour
        .iter()
        .flat_map(|h| [h.charge_usd, h.cost_usd])
        .max()
        .unwrap_or_default();
    let (left, top, plot_h, bottom) = (90.0, 28.0, 160.0, 24.0);
    let slot = (CHART_W - left) / 24.0;
    let height = top + plot_h + bottom;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_W}" height="{height}" viewBox="0 0 {CHART_W} {height}" role="img" aria-label="Spend by hour (UTC)"><text x="0" y="16" font-size="14" font-weight="bold">Spend by hour (UTC)</text>"#
    );
    let base = top + plot_h;
    let _ = write!(
        s,
        r##"<line x1="{left}" y1="{base}" x2="{CHART_W}" y2="{base}" stroke="#a0aec0"/><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">{}</text><text x="{:.1}" y="{base}" font-size="10" text-anchor="end">0</text>"##,
        left - 4.0,
        top + 8.0,
        money(max),
        left - 4.0
    );
    for h in &report.by_hour {
        let x = left + slot * f64::from(h.hour);
        for (j, (v, colour, what)) in [
            (h.charge_usd, CHARGE_COLOUR, "charge"),
            (h.cost_usd, COST_COLOUR, "cost"),
        ]
        .into_iter()
        .enumerate()
        {
            let bh = px(v, max, plot_h);
            let bx = x + 2.0 + (slot - 4.0) / 2.0 * j as f64;
            let _ = write!(
                s,
                r#"<rect x="{bx:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{colour}"><title>{:02}:00 {what} {} USD ({} requests)</title></rect>"#,
                base - bh,
                (slot - 4.0) / 2.0,
                h.hour,
                v.normalize(),
                h.requests
            );
        }
        if h.hour % 3 == 0 {
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{:02}</text>"#,
                x + slot / 2.0,
                base + 14.0,
                h.hour
            );
        }
    }
    s.push_str("</svg>");
    s
}

fn td(s: &str) -> String {
    format!("<td>{}</td>", esc(s))
}

fn tdn(s: impl std::fmt::Display) -> String {
    format!("<td class=\"n\">{s}</td>")
}

fn stats_cells(s: &GroupStats) -> String {
    let mut out = String::new();
    for n in [s.requests, s.upstream_calls]
        .into_iter()
        .chain(s.tokens.parts())
    {
        out.push_str(&tdn(n));
    }
    for m in [s.cost_usd, s.charge_usd, s.margin_usd] {
        out.push_str(&tdn(money(m)));
    }
    for n in s.table_outcomes() {
        out.push_str(&tdn(n));
    }
    out
}

impl DailyReport {
    /// A single self-contained HTML page: totals, three inline SVG charts (spend by model, by
    /// tenant, by hour), the group table and the discrepancy section.
    pub fn to_html(&self) -> String {
        let t = &self.totals;
        let mut h = String::new();
        let _ = write!(
            h,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Switchyard daily report {d}</title><style>{STYLE}</style></head><body>\n<h1>Switchyard daily report {d} (UTC)</h1>\n",
            d = esc(&self.date)
        );
        h.push_str("<div class=\"cards\">");
        for (label, value) in [
            ("Requests", t.requests.to_string()),
            ("Charge (USD)", money(t.charge_usd)),
            ("Cost (USD)", money(t.cost_usd)),
            ("Margin (USD)", money(t.margin_usd)),
            ("Tokens charged", t.charged_tokens().to_string()),
            ("Cache hits", t.cache_hits.to_string()),
            (
                "Errors / cancelled",
                format!("{} / {}", t.errors, t.cancelled),
            ),
            (
                "Discrepancies",
                self.reconciliation.counts.total().to_string(),
            ),
        ] {
            let _ = write!(
                h,
                "<div class=\"card\">{}<b>{}</b></div>",
                esc(label),
                esc(&value)
            );
        }
        h.push_str("</div>\n");
        let _ = writeln!(
            h,
            "<p class=\"legend\">Amounts in USD, rounded to {MONEY_DP} places.<span style=\"background:{CHARGE_COLOUR}\"></span>charge (sale price)<span style=\"background:{COST_COLOUR}\"></span>cost (upstream price)</p>"
        );
        h.push_str(&bar_chart("Spend by model", &self.by_model));
        h.push('\n');
        h.push_str(&bar_chart("Spend by tenant", &self.by_tenant));
        h.push('\n');
        h.push_str(&bar_chart("Live and batch", &self.by_origin));
        h.push('\n');
        h.push_str(&hour_chart(self));
        h.push_str("\n<h2>By tenant, model and target</h2>\n<table><thead><tr>");
        for c in [
            "tenant",
            "model",
            "target",
            "requests",
            "upstream calls",
            "new input",
            "cached input",
            "cache write",
            "output",
            "reasoning",
            "cost",
            "charge",
            "margin",
            "cache hits",
            "fallbacks",
            "errors",
            "cancelled",
            "estimated rows",
        ] {
            let _ = write!(h, "<th>{c}</th>");
        }
        h.push_str("</tr></thead><tbody>\n");
        for g in &self.groups {
            let _ = writeln!(
                h,
                "<tr>{}{}{}{}</tr>",
                td(g.tenant.as_deref().unwrap_or(NO_TENANT)),
                td(&g.model),
                td(g.target.as_deref().unwrap_or("-")),
                stats_cells(&g.stats)
            );
        }
        let _ = writeln!(
            h,
            "<tr><th>TOTAL</th><th></th><th></th>{}</tr></tbody></table>",
            stats_cells(t)
        );
        self.html_discrepancies(&mut h);
        h.push_str("</body></html>\n");
        h
    }

    fn html_discrepancies(&self, h: &mut String) {
        let r = &self.reconciliation;
        let _ = writeln!(
            h,
            "<h2>Discrepancies</h2>\n<p>{} finding(s); {} of {} request(s) clean.</p>\n<table><thead><tr><th>class</th><th>count</th><th>rule</th></tr></thead><tbody>",
            r.counts.total(),
            r.clean_requests,
            r.requests
        );
        for c in DiscrepancyClass::ALL {
            let _ = writeln!(
                h,
                "<tr>{}{}{}</tr>",
                td(c.as_str()),
                tdn(r.counts.get(c)),
                td(c.rule())
            );
        }
        h.push_str("</tbody></table>\n");
        if r.rows.is_empty() {
            return;
        }
        h.push_str("<table><thead><tr><th>request id</th><th>class</th><th>tenant</th><th>model</th><th>target</th><th>details</th></tr></thead><tbody>\n");
        for d in &r.rows {
            let _ = writeln!(
                h,
                "<tr>{}{}{}{}{}{}</tr>",
                td(&d.request_id),
                td(d.class.as_str()),
                td(d.tenant.as_deref().unwrap_or(NO_TENANT)),
                td(&d.model),
                td(d.target.as_deref().unwrap_or("-")),
                td(&d.details)
            );
        }
        h.push_str("</tbody></table>\n");
        if r.truncated {
            let _ = writeln!(h, "<p>First {REPORT_DISCREPANCY_ROWS} findings shown.</p>");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::report::build_daily;

    #[test]
    fn empty_day_renders_four_charts_and_escapes() {
        let mut r = build_daily("2025-11-05", 0, 86_400_000, &[]);
        r.by_model.push(Amounts {
            name: "<script>".into(),
            requests: 1,
            cost_usd: Decimal::ONE,
            charge_usd: Decimal::TWO,
        });
        let html = r.to_html();
        assert_eq!(html.matches("<svg").count(), 4);
        assert!(!html.contains("<script>"));
        assert!(html.contains("&lt;script&gt;"));
        for external in ["<script", "<link", "src=", "href=", "url("] {
            assert!(!html.contains(external), "{external}");
        }
    }
}
