//! Active health probes: a target that fails its probes is marked unhealthy on NATS without any
//! client traffic, is probed faster while unhealthy, and recovers once its probes succeed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::*;
use futures::StreamExt;
use serde_json::json;
use std::time::Duration;
use switchyard_schemas::health::{HealthEvent, HealthState};

fn config(spec: &str) -> switchyard_schemas::config::GatewayConfig {
    let c: switchyard_schemas::config::GatewayConfig = serde_json::from_value(json!({
        "targets": [{
            "id": "probed", "provider": "openai", "base_url": format!("builtin:mock/x/{spec}"), "upstream_model": "mock",
            "probe": {"interval_ms": 2000, "unhealthy_interval_ms": 100, "max_latency_ms": 2000},
            "breaker": {"min_calls": 2, "failure_rate": 0.5, "open_ms": 300, "window_ms": 10000},
            "retry": {"max_attempts": 1}
        }],
        "models": [{"id": "demo/probed", "targets": ["probed"]}],
        "timeouts": {"first_frame_ms": 2000, "worker_silence_ms": 3000, "heartbeat_ms": 200}
    }))
    .unwrap();
    c.validate().unwrap();
    c
}

async fn next_state(events: &mut async_nats::Subscriber, want: HealthState) -> HealthEvent {
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(m) = events.next().await {
            let e: HealthEvent = serde_json::from_slice(&m.payload).unwrap();
            if e.target == "probed" && e.state == want {
                return e;
            }
        }
        panic!("health subscription ended");
    })
    .await
    .unwrap_or_else(|_| panic!("no {want:?} event within 10 s"))
}

#[tokio::test]
async fn probes_find_an_outage_and_the_recovery_without_traffic() {
    let client;
    let mut events;
    let gw = {
        // Subscribe to health events before the worker starts probing.
        let gw = start(Options {
            config: config("status=503"),
            worker: false,
            ..Options::default()
        })
        .await;
        client = async_nats::connect(gw.nats.url()).await.unwrap();
        events = client.subscribe("sy.health.>").await.unwrap();
        client.flush().await.unwrap();
        spawn_worker(&gw, gw.config.clone(), "prober", gw.worker_shutdown.clone()).await;
        gw
    };
    // No client request at all: the probes alone open the breaker.
    next_state(&mut events, HealthState::Unhealthy).await;
    assert!(calls_naming(&gw, "status=503") >= 2);
    // The upstream recovers (a live config change points the target at a healthy mock path);
    // the next half-open probe succeeds and closes the breaker.
    let mut healthy = config("text=ok");
    healthy.targets[0].probe.as_mut().unwrap().interval_ms = 60_000;
    gw.config.set(1, healthy);
    next_state(&mut events, HealthState::Healthy).await;
    assert!(calls_naming(&gw, "text=ok") >= 1);
    // Every probe is a real upstream call with a usage event; none reached a client.
    assert_eq!(
        gw.mock.state().count_matching(
            |r| r.body["messages"][0]["content"] == "Reply with the single word: ok"
        ),
        gw.mock.request_count()
    );
}

/// Probe calls in the ledger: each an `upstream` row of the probe tenant with no charge, which
/// reconciliation does not count as `upstream_without_charge` and the daily report shows under
/// the origin `probe`.
#[tokio::test]
async fn probe_calls_are_billed_as_probes_not_as_discrepancies() {
    let mut c = config("text=ok");
    c.targets[0].probe.as_mut().unwrap().interval_ms = 100;
    let gw = start_billed(c).await;
    let ledger = gw.ledger.as_ref().unwrap();
    let rows = eventually(Duration::from_secs(20), || async {
        let n = ledger.count().await.unwrap();
        (n >= 3).then_some(n)
    })
    .await;
    let now = switchyard_schemas::now_ms();
    let rec = switchyard_billing::reconcile(ledger, 0, now + 60_000, 100)
        .await
        .unwrap();
    assert_eq!(rec.counts.upstream_without_charge, 0, "{:?}", rec.rows);
    assert_eq!(rec.counts.total(), 0, "{:?}", rec.rows);
    assert!(
        rec.requests >= rows,
        "{} requests, {rows} rows",
        rec.requests
    );
    let today = switchyard_budgets::spend::windows(now).0;
    let report = switchyard_billing::daily_report(ledger, &today)
        .await
        .unwrap();
    let origins: Vec<_> = report.by_origin.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(origins, ["probe"], "{:?}", report.by_origin);
    assert_eq!(report.by_origin[0].requests, 0);
    assert_eq!(
        report.totals.upstream_calls,
        report.totals.upstream_calls.max(rows)
    );
}
