//! Daily report, reconciliation and usage-export import against a real ledger (SQLite in a
//! tempdir, and PostgreSQL in a fresh schema), priced with the bundled catalog.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::d;

use rust_decimal::Decimal;
use switchyard_billing::reconcile::DiscrepancyClass;
use switchyard_billing::report::{CSV_HEADER, GroupRow, GroupStats, utc_day_bounds};
use switchyard_billing::report_import::DiffStatus;
use switchyard_billing::{
    DailyReport, Ledger, daily_report, import_usage_diff, parse_usage_export, reconcile,
};
use switchyard_schemas::ErrorClass;
use switchyard_schemas::usage::{Usage, UsageEvent, UsageKind, UsageStatus};
use uuid::Uuid;

/// 2025-11-05T00:00:00Z, ms.
const DAY: u64 = 1_762_300_800_000;
const HOUR: u64 = 3_600_000;

fn usage(prompt: u64, cached: u64, write: u64, completion: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        cached_tokens: cached,
        cache_write_tokens: write,
        completion_tokens: completion,
        reasoning_tokens: 0,
        ..Default::default()
    }
}

/// A charge event (`ts` = when ingress finished) on `target`.
fn charge(id: Uuid, ts: u64, tenant: &str, model: &str, target: &str, up: &str) -> UsageEvent {
    UsageEvent {
        request_id: id,
        tenant: Some(tenant.into()),
        model: model.into(),
        target: Some(target.into()),
        upstream_model: Some(up.into()),
        ..common::event(UsageKind::Charge, ts)
    }
}

/// The ok upstream event of attempt `attempt`, 5 ms before the charge (estimated copied).
fn upstream(c: &UsageEvent, attempt: u32, target: &str, up: &str, u: Usage) -> UsageEvent {
    UsageEvent {
        kind: UsageKind::Upstream,
        attempt,
        ts_ms: c.ts_ms - 5,
        target: Some(target.into()),
        upstream_model: Some(up.into()),
        usage: u,
        status: UsageStatus::Ok,
        error_class: None,
        fallbacks: 0,
        ..c.clone()
    }
}

/// Pushes a clean request: its ok upstream call (attempt 0, on the charge's target and upstream
/// model) and the charge `c`, both with usage `u`.
fn served(ev: &mut Vec<UsageEvent>, c: UsageEvent, u: Usage) {
    served_with(ev, c, u, u);
}

/// [`served`] with the charge's usage `charged` and the upstream call's `used`.
fn served_with(ev: &mut Vec<UsageEvent>, mut c: UsageEvent, charged: Usage, used: Usage) {
    c.usage = charged;
    let (target, up) = (c.target.clone().unwrap(), c.upstream_model.clone().unwrap());
    ev.push(upstream(&c, 0, &target, &up, used));
    ev.push(c);
}

/// The day's events; comments give each request's cost (upstream) and charge at bundled prices.
fn events() -> (Vec<UsageEvent>, Vec<Uuid>) {
    let ids: Vec<Uuid> = (0..13).map(|_| Uuid::now_v7()).collect();
    let mut ev = Vec::new();
    let (gpt, sonnet, mini) = (
        "openai/gpt-4o",
        "anthropic/claude-sonnet-4",
        "openai/gpt-4o-mini",
    );
    let claude = "claude-sonnet-4-20250514";

    // R1 clean (FC-11): cost 0.005615, charge 0.005615.
    served(
        &mut ev,
        charge(
            ids[1],
            DAY + HOUR + 1000,
            "acme",
            gpt,
            "openai-east",
            "gpt-4o",
        ),
        usage(2006, 1920, 0, 300),
    );
    // R2 fallback: attempt 0 fails on openai-east (cost 0), attempt 1 served by gpt-4o-mini
    // (cost 0.00045) and charged at gpt-4o prices (0.0075).
    let mut c = charge(
        ids[2],
        DAY + 2 * HOUR,
        "acme",
        gpt,
        "openai-mini",
        "gpt-4o-mini",
    );
    c.usage = usage(1000, 0, 0, 500);
    c.fallbacks = 1;
    let mut a0 = upstream(&c, 0, "openai-east", "gpt-4o", Usage::default());
    a0.status = UsageStatus::Error;
    a0.error_class = Some(ErrorClass::RateLimited);
    ev.push(a0);
    ev.push(upstream(&c, 1, "openai-mini", "gpt-4o-mini", c.usage));
    ev.push(c);
    // R3 clean (FC-10): cost and charge 0.03055725.
    served(
        &mut ev,
        charge(
            ids[3],
            DAY + 10 * HOUR,
            "globex",
            sonnet,
            "anthropic",
            claude,
        ),
        usage(9033, 0, 4511, 5),
    );
    // R4 cache hit, no upstream call: charged 0 (cache pricing policy), usage kept.
    let mut c = charge(
        ids[4],
        DAY + 10 * HOUR + 1,
        "globex",
        sonnet,
        "anthropic",
        claude,
    );
    c.usage = usage(100, 0, 0, 10);
    c.cache_hit = true;
    ev.push(c);
    // R5 upstream_without_charge: cost 0.00035.
    let c = charge(ids[5], DAY + 3 * HOUR, "acme", gpt, "openai-east", "gpt-4o");
    ev.push(upstream(
        &c,
        0,
        "openai-east",
        "gpt-4o",
        usage(100, 0, 0, 10),
    ));
    // R6 admitted_not_settled: upstream ok, charge cancelled; cost and charge 0.0007.
    let mut c = charge(ids[6], DAY + 4 * HOUR, "acme", gpt, "openai-east", "gpt-4o");
    c.status = UsageStatus::Cancelled;
    c.error_class = Some(ErrorClass::Cancelled);
    served(&mut ev, c, usage(200, 0, 0, 20));
    // R7 charge_without_upstream: charge 0.0000105.
    let mut c = charge(
        ids[7],
        DAY + 5 * HOUR,
        "globex",
        mini,
        "openai-mini",
        "gpt-4o-mini",
    );
    c.usage = usage(50, 0, 0, 5);
    ev.push(c);
    // R8 usage_mismatch: upstream 30 completion tokens (cost 0.00105), charge 31 (0.00106).
    let c = charge(ids[8], DAY + 6 * HOUR, "acme", gpt, "openai-east", "gpt-4o");
    served_with(&mut ev, c, usage(300, 0, 0, 31), usage(300, 0, 0, 30));
    // R9 estimated on both sides (cancelled mid-stream): cost and charge 0.00024.
    let mut c = charge(
        ids[9],
        DAY + 7 * HOUR,
        "globex",
        sonnet,
        "anthropic",
        claude,
    );
    c.usage = usage(40, 0, 0, 8);
    c.status = UsageStatus::Cancelled;
    c.estimated = true;
    let mut u = upstream(&c, 0, "anthropic", claude, c.usage);
    u.status = UsageStatus::Cancelled;
    ev.push(u);
    ev.push(c);
    // R10 failed request, every attempt failed: cost 0, charge 0, one error.
    let mut c = charge(
        ids[10],
        DAY + 8 * HOUR,
        "acme",
        gpt,
        "openai-east",
        "gpt-4o",
    );
    c.status = UsageStatus::Error;
    c.error_class = Some(ErrorClass::Overloaded);
    let mut u = upstream(&c, 0, "openai-east", "gpt-4o", Usage::default());
    u.status = UsageStatus::Error;
    ev.push(u);
    ev.push(c);
    // R11 the previous day: not in the report.
    served(
        &mut ev,
        charge(ids[11], DAY - 10_000, "acme", gpt, "openai-east", "gpt-4o"),
        usage(1_000_000, 0, 0, 0),
    );
    // R12 straddles midnight: upstream row on the previous day, charge 2 ms into the day; filed
    // under the charge's day, clean. Cost and charge 0.15.
    served(
        &mut ev,
        charge(
            ids[12],
            DAY + 2,
            "globex",
            mini,
            "openai-mini",
            "gpt-4o-mini",
        ),
        usage(1_000_000, 0, 0, 0),
    );
    (ev, ids)
}

/// Every string under a `*_usd` key of `v`, recursively.
fn money_strings(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match x {
                    serde_json::Value::String(s) if k.ends_with("_usd") => out.push(s.clone()),
                    _ => money_strings(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| money_strings(x, out)),
        _ => {}
    }
}

/// `by_origin` as (name, requests, cost, charge).
fn origins(r: &DailyReport) -> Vec<(&str, u64, Decimal, Decimal)> {
    r.by_origin
        .iter()
        .map(|o| (o.name.as_str(), o.requests, o.cost_usd, o.charge_usd))
        .collect()
}

fn group<'a>(r: &'a DailyReport, tenant: &str, model: &str, target: &str) -> &'a GroupStats {
    &r.groups
        .iter()
        .find(|g: &&GroupRow| {
            g.tenant.as_deref() == Some(tenant)
                && g.model == model
                && g.target.as_deref() == Some(target)
        })
        .unwrap_or_else(|| panic!("no group {tenant}/{model}/{target}"))
        .stats
}

async fn scenario(url: &str) {
    let ledger = Ledger::connect(url).await.unwrap();
    let (events, ids) = events();
    assert_eq!(ledger.insert_batch(&events).await.unwrap(), 22);
    let r = daily_report(&ledger, "2025-11-05").await.unwrap();
    assert_eq!((r.from_ms, r.to_ms), utc_day_bounds("2025-11-05").unwrap());

    // Exact totals, beyond the cent.
    let t = &r.totals;
    assert_eq!(t.cost_usd, d("0.18896225"));
    assert_eq!(t.charge_usd, d("0.19568275"));
    assert_eq!(t.margin_usd, d("0.0067205"));
    assert_eq!(t.margin_usd, t.charge_usd - t.cost_usd);
    assert_eq!((t.requests, t.upstream_calls), (10, 10));
    assert_eq!(
        (t.cache_hits, t.fallbacks, t.errors, t.cancelled),
        (1, 1, 1, 2)
    );
    // The upstream call cancelled by the client's disconnect is not an upstream error.
    assert_eq!(
        (t.upstream_errors, t.estimated_rows, t.unpriced_rows),
        (2, 2, 0)
    );
    // "Tokens charged" leaves the cache hit's tokens out.
    assert!(t.cache_hit_tokens > 0);
    assert_eq!(t.charged_tokens(), t.tokens.total() - t.cache_hit_tokens);
    assert_eq!(t.tokens.cached_input, 1920);
    assert_eq!(t.tokens.cache_write, 4511);

    // Groups: the failed attempt's row lands on the target it called.
    assert_eq!(r.groups.len(), 4);
    let east = group(&r, "acme", "openai/gpt-4o", "openai-east");
    assert_eq!((east.requests, east.upstream_calls), (4, 6));
    assert_eq!(east.cost_usd, d("0.007715"));
    assert_eq!(east.charge_usd, d("0.007375"));
    assert_eq!(east.margin_usd, d("-0.00034"));
    assert_eq!(
        (
            east.tokens.new_input,
            east.tokens.cached_input,
            east.tokens.output
        ),
        (586, 1920, 351)
    );
    assert_eq!(
        (east.errors, east.cancelled, east.upstream_errors),
        (1, 1, 2)
    );
    let fallback = group(&r, "acme", "openai/gpt-4o", "openai-mini");
    assert_eq!(fallback.margin_usd, d("0.00705"));
    assert_eq!(fallback.fallbacks, 1);
    let sonnet = group(&r, "globex", "anthropic/claude-sonnet-4", "anthropic");
    assert_eq!((sonnet.requests, sonnet.cache_hits), (3, 1));
    assert_eq!(sonnet.cost_usd, d("0.03079725"));
    assert_eq!(sonnet.charge_usd, d("0.03079725"));
    let mini = group(&r, "globex", "openai/gpt-4o-mini", "openai-mini");
    assert_eq!(mini.charge_usd, d("0.1500105"));
    assert_eq!(r.by_hour[0].cost_usd, d("0.15"));
    assert_eq!(r.by_hour[10].charge_usd, d("0.03055725"));
    assert_eq!(r.by_tenant[0].name, "globex");
    assert_eq!(r.by_model[0].name, "openai/gpt-4o-mini");

    // Every discrepancy class, once, on the expected request.
    let rec = &r.reconciliation;
    assert_eq!((rec.requests, rec.clean_requests), (11, 6));
    let expected = [
        (DiscrepancyClass::UpstreamWithoutCharge, ids[5]),
        (DiscrepancyClass::AdmittedNotSettled, ids[6]),
        (DiscrepancyClass::ChargeWithoutUpstream, ids[7]),
        (DiscrepancyClass::UsageMismatch, ids[8]),
        (DiscrepancyClass::Estimated, ids[9]),
    ];
    for (class, id) in expected {
        assert_eq!(rec.counts.get(class), 1, "{class:?}");
        let row = rec.rows.iter().find(|x| x.class == class).unwrap();
        assert_eq!(row.request_id, id.to_string(), "{class:?}");
    }
    assert_eq!(rec.rows.len(), 5);
    // The standalone reconciliation agrees.
    let (from, to) = utc_day_bounds("2025-11-05").unwrap();
    assert_eq!(&reconcile(&ledger, from, to, 50).await.unwrap(), rec);

    // CSV: exact header and one exact row.
    let csv = r.to_csv();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some(CSV_HEADER));
    assert!(CSV_HEADER.starts_with("tenant,model,target,requests,upstream_calls,new_input_tokens"));
    assert_eq!(csv.lines().count(), 5);
    assert!(
        csv.lines().any(|l| l
            == "acme,openai/gpt-4o,openai-mini,1,1,1000,0,0,500,0,1500,0.000450,0.007500,0.007050,0,1,0,0,0,0,0"),
        "{csv}"
    );

    // JSON round trip, exact money as strings, every amount with 12 decimals.
    let json = r.to_json().unwrap();
    assert!(
        json.contains("\"charge_usd\": \"0.195682750000\""),
        "{json}"
    );
    assert!(
        json.contains("\"margin_usd\": \"-0.000340000000\""),
        "{json}"
    );
    assert_eq!(serde_json::from_str::<DailyReport>(&json).unwrap(), r);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let mut amounts = Vec::new();
    money_strings(&v, &mut amounts);
    assert_eq!(amounts.len(), 77);
    for a in &amounts {
        let (_, decimals) = a.split_once('.').unwrap_or_else(|| panic!("{a}"));
        assert_eq!(decimals.len(), 12, "{a}");
    }

    // Live traffic and the cache hit apart (no batch items, no probes that day).
    assert_eq!(
        origins(&r),
        vec![
            ("live", 9, d("0.18896225"), d("0.19568275")),
            ("cache", 1, d("0"), d("0")),
        ]
    );

    // HTML: four charts and the rounded totals.
    let html = r.to_html();
    assert_eq!(html.matches("<svg").count(), 4);
    for total in ["0.195683", "0.188962", "0.006721"] {
        assert!(html.contains(total), "{total}");
    }
    let table = r.to_table();
    assert!(table.contains("TOTAL") && table.contains("usage_mismatch"));
    assert!(
        table.contains("live: 9 requests, cost 0.188962, charge 0.195683\n"),
        "{table}"
    );
    assert!(
        table.contains("cache: 1 requests, cost 0.000000, charge 0.000000\n"),
        "{table}"
    );

    // The previous day holds R11 only (R12 is filed under its charge's day).
    let prev = daily_report(&ledger, "2025-11-04").await.unwrap();
    assert_eq!(prev.totals.requests, 1);
    assert_eq!(prev.totals.cost_usd, d("2.5"));
    assert_eq!(prev.reconciliation.counts.total(), 0);

    // Provider export vs ledger upstream rows (by each row's own day).
    let export = parse_usage_export(
        "date,model,input_tokens,output_tokens,cost_usd\n\
         2025-11-05,gpt-4o,2606,360,0.007715\n\
         2025-11-05,gpt-4o-mini,1000,520,0.00046\n\
         2025-11-05,claude-sonnet-4-20250514,9073,13,0.030797\n\
         2025-11-06,gpt-4o,5,5,0.01\n",
    )
    .unwrap();
    let diff = import_usage_diff(&ledger, &export, Some("2025-11-05"), Some("2025-11-05"))
        .await
        .unwrap();
    let by_model = |m: &str| diff.rows.iter().find(|r| r.model == m).unwrap();
    assert_eq!(by_model("gpt-4o").status, DiffStatus::Match);
    let m = by_model("gpt-4o-mini");
    assert_eq!(m.status, DiffStatus::Mismatch);
    assert_eq!((m.input_tokens_diff, m.output_tokens_diff), (0, 20));
    assert_eq!(m.cost_usd_diff, d("0.00001"));
    let c = by_model("claude-sonnet-4-20250514");
    assert_eq!(c.ledger.cost_usd, d("0.03079725"));
    assert_eq!(c.cost_usd_diff, d("-0.00000025"));
    assert_eq!(diff.cost_usd_diff, d("0.00000975"));
    assert_eq!(diff.skipped_export_rows, 1);
    assert_eq!(diff.rows.len(), 3);
    ledger.close().await;
}

common::on_both_ledgers!(
    scenario,
    sqlite_daily_report_reconciliation_and_import,
    postgres_daily_report_reconciliation_and_import
);

/// Origins and the "no tenant" label: a live request without a tenant (auth off), a cache hit,
/// a batch item whose upstream reported one token more than its charge, and a health probe.
/// `by_origin` keeps them apart, the probe's upstream-only row is no `upstream_without_charge`,
/// the batch item's finding names its origin, and "no tenant" is `(none)` in every human format.
#[tokio::test]
async fn origins_and_the_no_tenant_label() {
    let (_dir, ledger) = common::sqlite_ledger().await;
    let gpt = "openai/gpt-4o";
    let ids: Vec<Uuid> = (0..4).map(|_| Uuid::now_v7()).collect();
    let mut ev = Vec::new();
    // Live, no tenant: 1,000 × $2.50 + 100 × $10 per 1M on both sides.
    let mut c = charge(ids[0], DAY + HOUR, "x", gpt, "openai-east", "gpt-4o");
    c.tenant = None;
    served(&mut ev, c, usage(1000, 0, 0, 100));
    // Cache hit: charged $0, no upstream call.
    let mut c = charge(ids[1], DAY + HOUR + 1, "acme", gpt, "openai-east", "gpt-4o");
    c.usage = usage(1000, 0, 0, 100);
    c.cache_hit = true;
    ev.push(c);
    // Batch item: cost at gpt-4o's batch discount (half of 1,000 × $2.50 + 101 × $10 per 1M);
    // the charge at the sale card's batch rate.
    let mut c = charge(ids[2], DAY + HOUR + 2, "acme", gpt, "openai-east", "gpt-4o");
    c.batch_id = Some("batch_1".into());
    served_with(&mut ev, c, usage(1000, 0, 0, 100), usage(1000, 0, 0, 101));
    // Health probe: one upstream row, no charge row by design.
    let mut p = charge(
        ids[3],
        DAY + HOUR + 3,
        "x",
        "demo/probe",
        "openai-east",
        "gpt-4o",
    );
    p.tenant = Some(switchyard_schemas::usage::PROBE_TENANT.into());
    ev.push(upstream(&p, 0, "openai-east", "gpt-4o", usage(10, 0, 0, 1)));
    assert_eq!(ledger.insert_batch(&ev).await.unwrap(), 6);

    let r = daily_report(&ledger, "2025-11-05").await.unwrap();
    assert_eq!(
        origins(&r),
        vec![
            ("live", 1, d("0.0035"), d("0.0035")),
            ("batch", 1, d("0.001755"), d("0.0035")),
            ("probe", 0, d("0.000035"), d("0")),
            ("cache", 1, d("0"), d("0")),
        ]
    );
    let rec = &r.reconciliation;
    assert_eq!(rec.counts.upstream_without_charge, 0);
    assert_eq!(rec.counts.usage_mismatch, 1);
    assert_eq!(rec.counts.total(), 1);
    assert_eq!(rec.rows[0].request_id, ids[2].to_string());
    assert_eq!(rec.rows[0].origin, "batch");
    // "Tokens charged" is the live and batch requests' 2 × 1,100, not the cache hit's.
    assert_eq!(r.totals.charged_tokens(), 2200);

    // One spelling of "no tenant": `(none)` in the table, CSV, HTML and tenant ranking; JSON null.
    assert!(r.by_tenant.iter().any(|t| t.name == "(none)"));
    let csv = r.to_csv();
    assert!(
        csv.lines().any(|l| l
            == "(none),openai/gpt-4o,openai-east,1,1,1000,0,0,100,0,1100,0.003500,0.003500,0.000000,0,0,0,0,0,0,0"),
        "{csv}"
    );
    let table = r.to_table();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("(none)") && l.contains("0.003500")),
        "{table}"
    );
    let html = r.to_html();
    assert!(html.contains("(none)"));
    assert!(
        html.contains("<div class=\"card\">Tokens charged<b>2200</b></div>"),
        "{html}"
    );
    let json: serde_json::Value = serde_json::from_str(&r.to_json().unwrap()).unwrap();
    let none_group = json["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["model"] == gpt && g["tenant"].is_null())
        .unwrap();
    assert_eq!(none_group["charge_usd"], "0.003500000000");
    for text in [csv, table] {
        for bad in ["null", "(no tenant)", ",-,"] {
            assert!(!text.contains(bad), "{bad} in {text}");
        }
    }
    ledger.close().await;
}
