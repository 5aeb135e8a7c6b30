//! Tracing end to end (issue 15, deliver 2; docs/tracing.md): `switchyard ingress`,
//! `switchyard worker` and `switchyard cache` run as separate processes connected by NATS, each
//! exporting spans over OTLP/HTTP to a collector stand-in ([`Collector`]). Every request is one
//! trace with the GenAI attributes and its spans (cache lookup, admission, one per attempt, the
//! worker, the upstream call); the request id is adopted or generated and is the same in the
//! response header, the audit record and the spans. The processes' batch exporters are set to
//! export only every 60 s, so every span checked here was sent by the flush at shutdown.
//! Also the `/metrics` of `switchyard worker` and `switchyard billing` processes
//! (`--metrics-listen`).

use crate::common::otlp::{Collector, Received};
use crate::common::procs::{Service, config_file};
use crate::common::{self, Options};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use serde_json::{Value, json};
use std::time::Duration;

/// `OTEL_BSP_SCHEDULE_DELAY` of the children, ms: longer than the test, so only the shutdown
/// flush exports.
const EXPORT_DELAY_MS: &str = "60000";

/// The client's trace context of the fallback request (W3C `traceparent`).
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

struct Answer {
    status: u16,
    /// `x-request-id`.
    request_id: String,
    /// `x-switchyard-request-id`.
    gateway_id: String,
    /// `x-switchyard-cache`.
    cache: Option<String>,
}

async fn send(base: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
    let resp = common::post_request(base, "/v1/chat/completions", headers, body).await;
    let header = |n: &str| resp.headers()[n].to_str().unwrap().to_owned();
    let answer = Answer {
        status: resp.status().as_u16(),
        request_id: header("x-request-id"),
        gateway_id: header("x-switchyard-request-id"),
        cache: resp
            .headers()
            .get("x-switchyard-cache")
            .map(|v| v.to_str().unwrap().to_owned()),
    };
    // Read to the end: a stream's charge (and its server span) ends with the body.
    resp.text().await.unwrap();
    answer
}

fn uuid_v7(s: &str) -> uuid::Uuid {
    let id: uuid::Uuid = s.parse().unwrap();
    assert_eq!(id.get_version_num(), 7, "{s}");
    id
}

/// The spans of the trace whose server span has `switchyard.request_id` = `id`.
fn trace_of<'a>(spans: &'a [Received], id: &str) -> (Received, Vec<&'a Received>) {
    let server = spans
        .iter()
        .find(|s| s.span.kind == SpanKind::Server as i32 && s.attr("switchyard.request_id") == id)
        .unwrap_or_else(|| panic!("no server span for {id}"))
        .clone();
    let trace = server.trace_id();
    (
        server,
        spans.iter().filter(|s| s.trace_id() == trace).collect(),
    )
}

fn named<'a>(spans: &[&'a Received], name: &str) -> Vec<&'a Received> {
    let mut v: Vec<&Received> = spans.iter().copied().filter(|s| s.name() == name).collect();
    v.sort_by_key(|s| s.span.start_time_unix_nano);
    v
}

fn one<'a>(spans: &[&'a Received], name: &str) -> &'a Received {
    let v = named(spans, name);
    assert_eq!(v.len(), 1, "{name}: {v:?}");
    v[0]
}

/// The test's half of a gateway whose worker and ingress run as processes: `config` written to a
/// file under `dir` ([`config_file`]), then NATS, the mock upstream and, with `billing`, the
/// ledger in this process (no worker). Returns the gateway, the config file's path, the NATS URL
/// and the mock upstream's `/v1` URL.
async fn in_process_half(
    dir: &std::path::Path,
    config: switchyard_schemas::config::GatewayConfig,
    billing: bool,
) -> (common::Gateway, String, String, String) {
    let (config, path) = config_file(dir, config);
    let gw = common::start(Options {
        config,
        billing,
        worker: false,
        ..Options::default()
    })
    .await;
    let nats = gw.nats.url();
    let mock = format!("{}/v1", gw.mock.base_url());
    (gw, path, nats, mock)
}

/// The lookup's client span (ingress) and its server span (the cache process, its child).
fn cache_spans<'a>(trace: &[&'a Received]) -> (&'a Received, &'a Received) {
    let lookups = named(trace, "switchyard.cache.lookup");
    assert_eq!(lookups.len(), 2, "{lookups:?}");
    let client = lookups
        .iter()
        .find(|s| s.span.kind == SpanKind::Client as i32)
        .unwrap();
    let server = lookups
        .iter()
        .find(|s| s.span.kind == SpanKind::Server as i32)
        .unwrap();
    assert_eq!(
        (client.service.as_str(), server.service.as_str()),
        ("switchyard-ingress", "switchyard-cache")
    );
    assert_eq!(server.parent_id(), client.span_id());
    (client, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_per_request_across_ingress_and_worker_processes() {
    let collector = Collector::start().await;
    let tmp = tempfile::tempdir().unwrap();
    // NATS, the mock upstream and billing (the audit log) in this process; no worker here.
    let (gw, path, nats, mock) = in_process_half(
        tmp.path(),
        common::test_config(json!({"tracing": {"endpoint": collector.url}})),
        true,
    )
    .await;
    let envs = [("OTEL_BSP_SCHEDULE_DELAY", EXPORT_DELAY_MS)];
    let worker = Service::worker(&path, &nats, &mock, &envs).await;
    // The cache service (exact layer only): its lookups continue the ingress's traces.
    let cache = Service::start(
        &[
            "cache",
            "--config",
            &path,
            "--nats-url",
            &nats,
            "--no-semantic",
        ],
        &envs,
        "cache service ready",
    )
    .await;
    // JSON log lines: those inside a request's spans carry its trace id.
    let ingress = Service::ingress(&["--log-format", "json"], &path, &nats, &envs).await;
    let ready: Value = serde_json::from_str(&ingress.ready_line).unwrap();
    let base = ready["message"]
        .as_str()
        .unwrap()
        .trim_start_matches("ingress listening on ")
        .to_owned();
    let ingress_log = ingress.log.clone();

    // Adopted: a well-formed client id is the request id; the gateway's UUIDv7 keys the ledger.
    let adopted = send(
        &base,
        &common::chat(
            "demo/mock",
            "#mock text=hello prompt_tokens=12 completion_tokens=3",
            false,
        ),
        &[("x-request-id", "client-trace.42:a_b")],
    )
    .await;
    assert_eq!(adopted.status, 200);
    assert_eq!(adopted.request_id, "client-trace.42:a_b");
    uuid_v7(&adopted.gateway_id);
    // The worker sent it upstream (the mock records what it received); never the traceparent.
    let upstream: Vec<_> = gw
        .mock
        .requests()
        .into_iter()
        .filter(|r| r.header("x-request-id") == Some("client-trace.42:a_b"))
        .collect();
    assert_eq!(upstream.len(), 1);
    assert_eq!(upstream[0].header("traceparent"), None);
    // Generated, streamed, a fallback (`dead` refuses the connection, `mock` serves), inside the
    // client's own trace.
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let fallback = send(
        &base,
        &common::chat(
            "demo/fallback",
            "#mock text=ok prompt_tokens=5 completion_tokens=2",
            true,
        ),
        &[("traceparent", &traceparent)],
    )
    .await;
    assert_eq!(fallback.status, 200);
    assert_eq!(fallback.request_id, fallback.gateway_id);
    uuid_v7(&fallback.request_id);
    // Malformed: replaced by the gateway's id.
    let malformed = send(
        &base,
        &common::chat(
            "demo/mock",
            "#mock text=x prompt_tokens=1 completion_tokens=1",
            false,
        ),
        &[("x-request-id", "not well formed!")],
    )
    .await;
    assert_eq!(malformed.status, 200);
    assert_eq!(malformed.request_id, malformed.gateway_id);
    uuid_v7(&malformed.request_id);
    // Refused before admission: the ids are on the error too.
    let refused = send(
        &base,
        &common::chat("no/such-model", "hi", false),
        &[("x-request-id", "err-1")],
    )
    .await;
    assert_eq!(refused.status, 404);
    assert_eq!(refused.request_id, "err-1");
    uuid_v7(&refused.gateway_id);
    // The adopted request's prompt again: answered by the cache once its store landed.
    let mut tries = 0;
    let hit = loop {
        tries += 1;
        let a = send(
            &base,
            &common::chat(
                "demo/mock",
                "#mock text=hello prompt_tokens=12 completion_tokens=3",
                false,
            ),
            &[("x-request-id", &format!("repeat-{tries}"))],
        )
        .await;
        assert_eq!(a.status, 200);
        if a.cache.as_deref() == Some("hit") {
            eprintln!("cache hit after {tries} repeats");
            break a;
        }
        assert!(tries < 50, "no cache hit after {tries} repeats");
    };

    // The audit log: keyed by the gateway's id, the client's id beside it.
    let ledger = gw.ledger.clone().unwrap();
    let records = common::eventually(Duration::from_secs(20), || {
        let ledger = ledger.clone();
        async move {
            let q = switchyard_schemas::audit::AuditQuery::default();
            let page = switchyard_billing::audit::page(&ledger, &q).await.ok()?;
            // The 404 refused before admission has its record too (docs/audit.md).
            (page.data.len() == 4 + tries).then_some(page.data)
        }
    })
    .await;
    let record = |id: &str| {
        let r = records.iter().find(|r| r.request_id == id).unwrap();
        (r.client_request_id.clone(), r.fallbacks)
    };
    assert_eq!(
        record(&adopted.gateway_id),
        (Some("client-trace.42:a_b".to_owned()), 0)
    );
    assert_eq!(record(&fallback.request_id), (None, 1));
    assert_eq!(record(&malformed.request_id), (None, 0));
    assert_eq!(record(&refused.gateway_id), (Some("err-1".to_owned()), 0));

    // SIGTERM: each process flushes its queued spans before it exits.
    assert_eq!(ingress.stop().await, Some(0));
    assert_eq!(worker.stop().await, Some(0));
    assert_eq!(cache.stop().await, Some(0));
    let spans = collector
        .wait_until(Duration::from_secs(10), |s| {
            s.iter().any(|s| s.service == "switchyard-ingress")
                && s.iter().any(|s| s.service == "switchyard-worker")
        })
        .await;
    // One trace per request, nothing outside them.
    let traces: std::collections::BTreeSet<String> = spans.iter().map(|s| s.trace_id()).collect();
    assert_eq!(traces.len(), 4 + tries, "{traces:?}");

    // The adopted request: server → admit, attempt → worker → upstream call.
    let (server, trace) = trace_of(&spans, "client-trace.42:a_b");
    let mut names: Vec<&str> = trace.iter().map(|s| s.name()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "POST /v1/chat/completions",
            "chat mock",
            "switchyard.admit",
            "switchyard.attempt",
            "switchyard.cache.lookup",
            "switchyard.cache.lookup",
            "switchyard.worker"
        ]
    );
    assert_eq!(server.service, "switchyard-ingress");
    assert_eq!(server.parent_id(), "");
    let expected = json!({
        "http.request.method": "POST", "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "demo/mock",
        "gen_ai.response.model": "mock", "gen_ai.provider.name": "openai",
        "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 3,
        "gen_ai.response.finish_reasons": ["stop"],
        "switchyard.request_id": "client-trace.42:a_b",
        "switchyard.gateway_request_id": adopted.gateway_id,
        "switchyard.target": "mock", "switchyard.fallbacks": 0, "switchyard.cache_hit": false,
        "switchyard.status": "ok",
    });
    assert_eq!(serde_json::to_value(server.attrs()).unwrap(), expected);
    // The cache lookup: a NATS request from ingress, served in the cache process.
    let (lookup, served_lookup) = cache_spans(&trace);
    assert_eq!(lookup.parent_id(), server.span_id());
    assert_eq!(lookup.attr("switchyard.cache.outcome"), "miss");
    assert_eq!(served_lookup.attr("switchyard.cache.outcome"), "miss");
    assert_eq!(
        served_lookup.attr("switchyard.request_id"),
        "client-trace.42:a_b"
    );
    let admit = one(&trace, "switchyard.admit");
    assert_eq!(admit.parent_id(), server.span_id());
    let attempt = one(&trace, "switchyard.attempt");
    assert_eq!(attempt.parent_id(), server.span_id());
    assert_eq!(
        serde_json::to_value(attempt.attrs()).unwrap(),
        json!({"switchyard.attempt": 0, "switchyard.target": "mock",
               "gen_ai.provider.name": "openai", "gen_ai.request.model": "mock"})
    );
    let worker_span = one(&trace, "switchyard.worker");
    assert_eq!(worker_span.service, "switchyard-worker");
    assert_eq!(worker_span.parent_id(), attempt.span_id());
    assert_eq!(
        worker_span.attr("switchyard.request_id"),
        "client-trace.42:a_b"
    );
    let call = one(&trace, "chat mock");
    assert_eq!(call.service, "switchyard-worker");
    assert_eq!(call.span.kind, SpanKind::Client as i32);
    assert_eq!(call.parent_id(), worker_span.span_id());
    let mock_port = reqwest::Url::parse(&mock).unwrap().port().unwrap();
    assert_eq!(
        serde_json::to_value(call.attrs()).unwrap(),
        json!({
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "mock", "gen_ai.response.model": "mock",
            "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 3,
            "gen_ai.response.finish_reasons": ["stop"],
            "server.address": "127.0.0.1", "server.port": mock_port,
            "switchyard.target": "mock", "switchyard.attempt": 0,
        })
    );

    // The fallback: in the client's trace, two attempts, the first failed.
    let (server, trace) = trace_of(&spans, &fallback.request_id);
    assert_eq!(server.trace_id(), CLIENT_TRACE);
    assert_eq!(server.parent_id(), CLIENT_SPAN);
    assert_eq!(server.attr("switchyard.fallbacks"), 1);
    assert_eq!(server.attr("gen_ai.usage.input_tokens"), 5);
    assert_eq!(server.attr("gen_ai.usage.output_tokens"), 2);
    let attempts = named(&trace, "switchyard.attempt");
    let summary: Vec<(Value, Value, Value)> = attempts
        .iter()
        .map(|a| {
            (
                a.attr("switchyard.attempt"),
                a.attr("switchyard.target"),
                a.attr("error.type"),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (json!(0), json!("dead"), json!("network")),
            (json!(1), json!("mock"), Value::Null)
        ]
    );
    // Each attempt reached a worker; the served one's upstream call carries the tokens.
    let workers = named(&trace, "switchyard.worker");
    let parents: Vec<String> = workers.iter().map(|w| w.parent_id()).collect();
    assert_eq!(parents, [attempts[0].span_id(), attempts[1].span_id()]);
    let served: Vec<&Received> = named(&trace, "chat mock")
        .into_iter()
        .filter(|c| c.parent_id() == workers[1].span_id())
        .collect();
    assert_eq!(served.len(), 1);
    assert_eq!(served[0].attr("gen_ai.usage.input_tokens"), 5);
    assert_eq!(served[0].attr("gen_ai.usage.output_tokens"), 2);
    assert_eq!(served[0].attr("error.type"), Value::Null);
    let failed: Vec<Value> = named(&trace, "chat mock")
        .into_iter()
        .filter(|c| c.parent_id() == workers[0].span_id())
        .map(|c| c.attr("error.type"))
        .collect();
    assert!(
        !failed.is_empty() && failed.iter().all(|e| e == "network"),
        "{failed:?}"
    );
    // The ingress's log line about the failed attempt names the client's trace.
    let fell_back: Vec<Value> = ingress_log
        .lock()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["message"] == "attempt failed, trying next target")
        .collect();
    assert_eq!(fell_back.len(), 1, "{fell_back:?}");
    assert_eq!(fell_back[0]["trace_id"], CLIENT_TRACE);
    assert_eq!(fell_back[0]["span_id"], server.span_id());

    // The malformed id: the generated one everywhere.
    let (_, trace) = trace_of(&spans, &malformed.request_id);
    assert_eq!(
        one(&trace, "switchyard.worker").attr("switchyard.request_id"),
        malformed.request_id.as_str()
    );
    // The cache hit: lookup spans in both processes, no attempt.
    let (server, trace) = trace_of(&spans, &hit.request_id);
    assert_eq!(server.attr("switchyard.cache_hit"), true);
    assert_eq!(server.attr("gen_ai.request.model"), "demo/mock");
    let (lookup, served_lookup) = cache_spans(&trace);
    assert_eq!(lookup.parent_id(), server.span_id());
    assert_eq!(lookup.attr("switchyard.cache.outcome"), "hit");
    assert_eq!(served_lookup.attr("switchyard.cache.outcome"), "hit");
    assert!(named(&trace, "switchyard.attempt").is_empty());
    // The refusal: its server span, no attempt.
    let (server, trace) = trace_of(&spans, "err-1");
    assert_eq!(server.attr("http.response.status_code"), 404);
    assert!(named(&trace, "switchyard.attempt").is_empty());
    // Never a prompt or an answer in any attribute.
    for s in &spans {
        let text = serde_json::to_string(&s.attrs()).unwrap();
        assert!(!text.contains("#mock") && !text.contains("hello"), "{text}");
    }
}

/// A client that sends one `X-Request-Id` on 1,000 concurrent requests through two ingresses
/// gets it back on every answer, and the ledger still keeps 1,000 requests: each its own gateway
/// id (the charge row's key and the audit record's), the shared id beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_client_request_id_never_merges_requests_through_two_ingresses() {
    const REQUESTS: usize = 1_000;
    let config = common::test_config(json!({
        "timeouts": {"first_frame_ms": 30000, "worker_silence_ms": 30000, "heartbeat_ms": 1000,
                     "total_ms": 120000}
    }));
    let gw = common::start_billed(config).await;
    let (second, _) = common::spawn_ingress(&gw).await;
    let bases = [gw.base.clone(), second];
    let results = common::fan_out(REQUESTS, |http, i| {
        let base = bases[i % 2].clone();
        async move {
            let resp = http
                .post(format!("{base}/v1/chat/completions"))
                .header("x-request-id", "same-id-for-all")
                .json(&common::chat(
                    "demo/mock",
                    "#mock text=hi prompt_tokens=2 completion_tokens=1",
                    false,
                ))
                .send()
                .await
                .unwrap();
            let h = |n: &str| resp.headers()[n].to_str().unwrap().to_owned();
            let got = (
                resp.status().as_u16(),
                h("x-request-id"),
                h("x-switchyard-request-id"),
            );
            resp.bytes().await.unwrap();
            got
        }
    })
    .await;
    let mut gateway_ids = std::collections::BTreeSet::new();
    for (status, shown, gateway) in &results {
        assert_eq!((*status, shown.as_str()), (200, "same-id-for-all"));
        uuid_v7(gateway);
        gateway_ids.insert(gateway.clone());
    }
    assert_eq!(gateway_ids.len(), REQUESTS);
    // 1,000 audit records (one per charge row), each under its own gateway id.
    let ledger = gw.ledger.clone().unwrap();
    let records = common::eventually(Duration::from_secs(60), || {
        let ledger = ledger.clone();
        async move {
            let q = switchyard_schemas::audit::AuditQuery {
                limit: Some(1000),
                ..Default::default()
            };
            let page = switchyard_billing::audit::page(&ledger, &q).await.ok()?;
            (page.data.len() == REQUESTS).then_some(page.data)
        }
    })
    .await;
    let recorded: std::collections::BTreeSet<String> =
        records.iter().map(|r| r.request_id.clone()).collect();
    assert_eq!(recorded, gateway_ids);
    assert!(
        records
            .iter()
            .all(|r| r.client_request_id.as_deref() == Some("same-id-for-all"))
    );
    let charges = ledger
        .usage_for(records[0].request_id.parse().unwrap())
        .await
        .unwrap();
    assert_eq!(
        charges
            .iter()
            .filter(|e| e.kind == switchyard_schemas::UsageKind::Charge)
            .count(),
        1
    );
}

/// A collector that accepts connections and never answers: span export stalls for its whole
/// timeout, requests do not (they only queue spans), and SIGTERM still ends the processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_collector_never_slows_requests() {
    const EXPORT_TIMEOUT_MS: u64 = 8_000;
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", hung.local_addr().unwrap());
    let (held_tx, mut held_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((socket, _)) = hung.accept().await {
            // Held open, never read or answered.
            if held_tx.send(socket).is_err() {
                return;
            }
        }
    });
    let tmp = tempfile::tempdir().unwrap();
    let (_gw, path, nats, mock) = in_process_half(
        tmp.path(),
        common::test_config(json!({
            "tracing": {"endpoint": endpoint, "export_timeout_ms": EXPORT_TIMEOUT_MS}
        })),
        false,
    )
    .await;
    // Export every 100 ms: the first export reaches the collector (and hangs) at once.
    let envs = [("OTEL_BSP_SCHEDULE_DELAY", "100")];
    let worker = Service::worker(&path, &nats, &mock, &envs).await;
    let ingress = Service::ingress(&[], &path, &nats, &envs).await;
    let base = ingress.base_url();
    let body = common::chat("demo/mock", "#mock text=hi", false);
    // The first request's spans open the first (hanging) export of each process.
    assert_eq!(send(&base, &body, &[]).await.status, 200);
    let _first = tokio::time::timeout(Duration::from_secs(10), held_rx.recv())
        .await
        .expect("no export reached the collector")
        .unwrap();
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let started = std::time::Instant::now();
        assert_eq!(send(&base, &body, &[]).await.status, 200);
        slowest = slowest.max(started.elapsed());
    }
    eprintln!("slowest of 20 requests while the collector hangs: {slowest:?}");
    // An export on the request path would cost its 8 s timeout.
    assert!(
        slowest < Duration::from_millis(EXPORT_TIMEOUT_MS / 2),
        "slowest request {slowest:?}"
    );
    // The shutdown flush gives up after the export timeout; the processes exit cleanly.
    let stopping = std::time::Instant::now();
    assert_eq!(ingress.stop().await, Some(0));
    assert_eq!(worker.stop().await, Some(0));
    eprintln!(
        "both processes stopped {:?} after SIGTERM",
        stopping.elapsed()
    );
}

/// Measurement (ignored; `-- --ignored --nocapture`): median and p99 latency of 300 sequential
/// requests through an ingress and a worker process, span export off and on (to the collector
/// stand-in, every span sampled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_span_export_overhead() {
    let collector = Collector::start().await;
    for export in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let tracing = if export {
            json!({"endpoint": collector.url})
        } else {
            json!({})
        };
        let (_gw, path, nats, mock) = in_process_half(
            tmp.path(),
            common::test_config(json!({ "tracing": tracing })),
            false,
        )
        .await;
        let worker = Service::worker(&path, &nats, &mock, &[]).await;
        let ingress = Service::ingress(&[], &path, &nats, &[]).await;
        let base = ingress.base_url();
        let mut ms: Vec<f64> = Vec::new();
        for i in 0..320 {
            let body = common::chat("demo/mock", &format!("#mock text=hi n{i}"), false);
            let started = std::time::Instant::now();
            assert_eq!(send(&base, &body, &[]).await.status, 200);
            if i >= 20 {
                ms.push(started.elapsed().as_secs_f64() * 1000.0);
            }
        }
        ms.sort_by(f64::total_cmp);
        eprintln!(
            "span export {}: p50 {:.2} ms, p99 {:.2} ms over {} requests",
            if export { "on" } else { "off" },
            ms[ms.len() / 2],
            ms[ms.len() * 99 / 100],
            ms.len()
        );
        ingress.stop().await;
        worker.stop().await;
    }
}

/// `switchyard <service> … --metrics-listen 127.0.0.1:0` as a child process, once it serves:
/// the service and its metrics base URL (from its "metrics on http://ADDR/metrics" log line).
async fn with_metrics(args: &[&str], serving: &str) -> (Service, String) {
    let mut args = args.to_vec();
    args.extend(["--metrics-listen", "127.0.0.1:0"]);
    let service = Service::start(&args, &[], "metrics on http://").await;
    let url = format!(
        "http://{}",
        service
            .ready_line
            .split("http://")
            .nth(1)
            .unwrap()
            .trim()
            .trim_end_matches("/metrics")
    );
    let log = service.log.clone();
    common::eventually(Duration::from_secs(30), || {
        let seen = log.lock().iter().any(|l| l.contains(serving));
        async move { seen.then_some(()) }
    })
    .await;
    (service, url)
}

/// `switchyard worker --metrics-listen` and `switchyard billing --metrics-listen` in processes of
/// their own (ingress a third, NATS and the mock upstream in the test): after 3 requests whose
/// first upstream call fails with a 500, the worker's `/metrics` counts exactly 3 retries on the
/// target and no publish error or spooled event; once the ledger holds the 3 charges the billing
/// process's `/metrics` shows nothing pending (lag 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_and_billing_processes_serve_their_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::test_config(json!({}));
    config.targets.push(
        serde_json::from_value(json!({"id": "flaky", "provider": "openai",
            "base_url": "builtin:mock", "upstream_model": "mock",
            "retry": {"max_attempts": 2, "base_ms": 1}, "breaker": {"enabled": false}}))
        .unwrap(),
    );
    config.models.push(
        serde_json::from_value(json!({"id": "demo/flaky", "targets": ["flaky"],
            "cache": {"enabled": false}}))
        .unwrap(),
    );
    config.validate().unwrap();
    let (_gw, path, nats, mock) = in_process_half(tmp.path(), config, false).await;
    let db = format!("sqlite://{}/ledger.db?mode=rwc", tmp.path().display());
    let (worker, worker_url) = with_metrics(
        &[
            "worker",
            "--config",
            &path,
            "--nats-url",
            &nats,
            "--mock-url",
            &mock,
        ],
        "worker serving",
    )
    .await;
    let (billing, billing_url) = with_metrics(
        &[
            "billing",
            "--config",
            &path,
            "--nats-url",
            &nats,
            "--database-url",
            &db,
        ],
        "billing consumer started",
    )
    .await;
    let ingress = Service::ingress(&[], &path, &nats, &[]).await;
    let base = ingress.base_url();
    let mut ids = Vec::new();
    for i in 0..3 {
        let body = common::chat(
            "demo/flaky",
            &format!("#mock status=500 fail_times=1 text=ok\nq{i}"),
            false,
        );
        let a = send(&base, &body, &[]).await;
        assert_eq!(a.status, 200);
        ids.push(uuid::Uuid::parse_str(&a.gateway_id).unwrap());
    }
    let text = common::metrics_text(&worker_url).await;
    let exact = |text: &str, series: &str, want: f64| {
        assert_eq!(
            common::metric_value(text, series),
            Some(want),
            "{series} in\n{text}"
        );
    };
    exact(
        &text,
        "switchyard_provider_retries_total{target=\"flaky\"}",
        3.0,
    );
    exact(
        &text,
        "switchyard_nats_publish_errors_total{subject=\"usage\"}",
        0.0,
    );
    exact(&text, "switchyard_usage_spool_events", 0.0);

    let ledger = switchyard_billing::Ledger::connect(&db).await.unwrap();
    for id in ids {
        common::wait_charged(&ledger, id, Duration::from_secs(20)).await;
    }
    let text = common::wait_metrics(&billing_url, Duration::from_secs(20), |t| {
        common::metric_value(t, "switchyard_billing_pending_messages") == Some(0.0)
    })
    .await;
    exact(&text, "switchyard_billing_lag_seconds", 0.0);
    assert_eq!(ingress.stop().await, Some(0));
    assert_eq!(worker.stop().await, Some(0));
    assert_eq!(billing.stop().await, Some(0));
}
