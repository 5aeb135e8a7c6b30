//! The audit log end to end (real nats-server, mock upstream, billing on SQLite): one record per
//! request with its exact fields for a plain, a fallback, a streamed (bodies captured, secrets
//! redacted) and a refused-upstream (400) request; `GET /admin/requests` filters and cursor
//! pagination; `switchyard requests export`; a mixed run (success, fallback, refusals before
//! admission — malformed body, unknown model, bad key —, an upstream 400, a cache hit, a
//! cancelled stream) leaving exactly one record per request, bodies only for the captured key
//! and no secret anywhere; and 1,000 concurrent requests (100 of them refused before admission)
//! through two ingress instances leaving exactly 1,000 audit rows, the 900 admitted ones the
//! `charge` rows' ids; capture by model and each request's cache outcome; `requests tail -f`
//! printing records as they are stored.

use crate::common::{self, Options, cli_ok, eventually, get_as};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::Duration;
use switchyard_schemas::tenancy::sha256_hex;

const ADMIN: &str = "sk-admin-audit-0123456789abcdef";
const PLAIN: &str = "sk-audit-plain-0123456789abcdef";
const CAPTURED: &str = "sk-audit-capture-0123456789abcd";

fn config() -> switchyard_schemas::config::GatewayConfig {
    let mut c = common::test_config(json!({
        "keys": [
            {"id": "k-plain", "tenant": "acme", "key_sha256": sha256_hex(PLAIN)},
            {"id": "k-cap", "tenant": "globex", "key_sha256": sha256_hex(CAPTURED)}
        ],
        "admin": {"keys": [{"id": "ops", "key_sha256": sha256_hex(ADMIN)}]},
        "audit": {"capture": {"keys": ["k-cap"], "max_bytes": 64}}
    }));
    c.targets.push(
        serde_json::from_value(json!({"id": "gpt", "provider": "openai",
            "base_url": "builtin:mock", "upstream_model": "gpt-4o"}))
        .unwrap(),
    );
    c.models
        .push(serde_json::from_value(json!({"id": "openai/gpt-4o", "targets": ["gpt"]})).unwrap());
    c.validate().unwrap();
    c
}

async fn send(
    base: &str,
    key: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    // The gateway's own id keys the record (`x-request-id` echoes a client's well-formed one).
    let id = resp.headers()["x-switchyard-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    (status, id, resp.text().await.unwrap())
}

async fn admin_get(base: &str, query: &str) -> (u16, Value) {
    get_as(format!("{base}/admin/requests?{query}"), ADMIN).await
}

/// Waits until `/admin/requests?{query}` lists `n` records.
async fn records(base: &str, query: &str, n: usize) -> Vec<Value> {
    eventually(Duration::from_secs(20), || async move {
        let (s, v) = admin_get(base, query).await;
        assert_eq!(s, 200, "{v}");
        let data = v["data"].as_array().cloned().unwrap_or_default();
        (data.len() == n).then_some(data)
    })
    .await
}

fn by_id<'a>(recs: &'a [Value], id: &str) -> &'a Value {
    recs.iter()
        .find(|r| r["request_id"] == id)
        .unwrap_or_else(|| panic!("no record {id}"))
}

/// Drops the fields that vary run to run (times, client port-free values stay).
fn stable(r: &Value) -> Value {
    let mut r = r.clone();
    let o = r.as_object_mut().unwrap();
    for k in ["ts_ms", "ttft_ms", "latency_ms", "overhead_ms"] {
        assert!(o.remove(k).is_some(), "{k} missing");
    }
    r
}

#[tokio::test]
async fn one_record_per_request_with_exact_fields() {
    let gw = common::start_billed(config()).await;
    let base = &gw.base;

    // Plain, non-streamed: priced gpt-4o, 1000 in + 100 out = $0.0035 cost and charge.
    let (s, plain, _) = send(
        base,
        PLAIN,
        &common::chat(
            "openai/gpt-4o",
            "#mock text=hello prompt_tokens=1000 completion_tokens=100",
            false,
        ),
        &[("user-agent", "audit-it/1"), ("x-request-id", "trace-123")],
    )
    .await;
    assert_eq!(s, 200);
    // Fallback: `dead` refuses the connection, `mock` serves.
    let (s, fallback, _) = send(
        base,
        PLAIN,
        &common::chat("demo/fallback", "#mock text=ok", false),
        &[("x-request-id", "not a valid id because spaces")],
    )
    .await;
    assert_eq!(s, 200);
    // Streamed with capture on (key k-cap): bodies kept, redacted, cut to 64 bytes.
    let (s, streamed, text) = send(
        base,
        CAPTURED,
        &common::chat(
            "openai/gpt-4o",
            "Authorization: Bearer sk-live-secret-value\n#mock text=streamed+answer prompt_tokens=10 completion_tokens=2",
            true,
        ),
        &[],
    )
    .await;
    assert_eq!(s, 200);
    assert!(text.contains("streamed"), "{text}");
    // Refused by the upstream after admission: 400.
    let (s, refused, _) = send(
        base,
        PLAIN,
        &common::chat(
            "openai/gpt-4o",
            "#mock status=400 error_message=bad+input",
            false,
        ),
        &[],
    )
    .await;
    assert_eq!(s, 400);

    let recs = records(base, "", 4).await;
    let plain_rec = by_id(&recs, &plain);
    assert!(
        plain_rec["overhead_ms"].as_u64().unwrap() <= plain_rec["latency_ms"].as_u64().unwrap()
    );
    assert_eq!(
        stable(plain_rec),
        json!({
            "request_id": plain, "front_door": "openai", "key_id": "k-plain", "tenant": "acme",
            "model": "openai/gpt-4o", "target": "gpt", "upstream_model": "gpt-4o",
            "status": "ok", "http_status": 200, "error_class": null, "error_code": null,
            "finish_reason": "stop", "fallbacks": 0, "attempts": [], "prompt_tokens": 1000, "completion_tokens": 100,
            "cached_tokens": 0, "cost_usd": "0.0035", "charge_usd": "0.0035",
            // No cache service runs: a caching route's lookup finds none and bypasses.
            "cache_hit": false, "cache_outcome": "bypass", "client_ip": "127.0.0.1",
            "user_agent": "audit-it/1",
            "client_request_id": "trace-123", "request_body": null, "response_body": null
        })
    );
    let fb = stable(by_id(&recs, &fallback));
    let attempts = fb["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{fb}");
    assert_eq!(attempts[0]["target"], "dead");
    assert_eq!(attempts[0]["upstream_model"], "mock");
    assert_eq!(attempts[0]["error_class"], "network");
    assert_eq!(
        attempts[0]["error"],
        "upstream request failed: error sending request for url \
         (http://127.0.0.1:9/v1/chat/completions)"
    );
    let mut fb_rest = fb.clone();
    fb_rest.as_object_mut().unwrap().remove("attempts");
    assert_eq!(
        fb_rest,
        json!({
            "request_id": fallback, "front_door": "openai", "key_id": "k-plain",
            "tenant": "acme", "model": "demo/fallback", "target": "mock",
            "upstream_model": "mock", "status": "ok", "http_status": 200, "error_class": null,
            "error_code": null, "finish_reason": "stop", "fallbacks": 1, "prompt_tokens": 2,
            "completion_tokens": 1, "cached_tokens": 0,
            // `mock`'s demo cost price: 2 × $0.50/M + 1 × $1.50/M; `demo/fallback` has no
            // sale price.
            "cost_usd": "0.0000025", "charge_usd": null, "cache_hit": false,
            "cache_outcome": "bypass", "client_ip": "127.0.0.1",
            "user_agent": null, "client_request_id": null, "request_body": null,
            "response_body": null
        })
    );
    let st = stable(by_id(&recs, &streamed));
    let req_body = st["request_body"].as_str().unwrap();
    assert!(!req_body.contains("sk-live-secret-value"), "{req_body}");
    assert!(
        req_body.len() <= 64 && req_body.contains("Authorization"),
        "{req_body}"
    );
    assert_eq!(st["response_body"], "streamed answer");
    assert_eq!(st["key_id"], "k-cap");
    assert_eq!(st["prompt_tokens"], 10);
    assert_eq!(st["completion_tokens"], 2);
    // 10 × $2.50/M + 2 × $10/M.
    assert_eq!(st["charge_usd"], "0.000045");
    assert_eq!(st["http_status"], 200);
    let rf = stable(by_id(&recs, &refused));
    assert_eq!(rf["status"], "error");
    assert_eq!(rf["http_status"], 400);
    assert_eq!(rf["error_class"], "invalid_request");
    assert_eq!(rf["finish_reason"], Value::Null);
    assert_eq!(rf["attempts"][0]["target"], "gpt");
    assert_eq!(rf["attempts"][0]["error_class"], "invalid_request");
    assert!(
        rf["attempts"][0]["error"]
            .as_str()
            .unwrap()
            .contains("bad input"),
        "{rf}"
    );

    // Filters.
    let ids = |recs: Vec<Value>| -> BTreeSet<String> {
        recs.iter()
            .map(|r| r["request_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let set = |v: &[&String]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(ids(records(base, "key=k-cap", 1).await), set(&[&streamed]));
    assert_eq!(
        ids(records(base, "tenant=acme", 3).await),
        set(&[&plain, &fallback, &refused])
    );
    assert_eq!(
        ids(records(base, "model=demo/fallback", 1).await),
        set(&[&fallback])
    );
    assert_eq!(ids(records(base, "status=400", 1).await), set(&[&refused]));
    assert_eq!(
        ids(records(base, "status=error", 1).await),
        set(&[&refused])
    );
    assert_eq!(ids(records(base, "to=2000-01-01", 0).await), set(&[]));
    // Cursor pagination: pages of 3 then 1, the same order as one page of 4.
    let (_, p1) = admin_get(base, "limit=3").await;
    assert_eq!(p1["has_more"], true);
    let cursor = p1["next_cursor"].as_str().unwrap().to_owned();
    let (_, p2) = admin_get(base, &format!("limit=3&cursor={cursor}")).await;
    assert_eq!(p2["has_more"], false);
    assert_eq!(p2["next_cursor"], Value::Null);
    let walked: Vec<Value> = p1["data"]
        .as_array()
        .unwrap()
        .iter()
        .chain(p2["data"].as_array().unwrap())
        .map(|r| r["request_id"].clone())
        .collect();
    let one: Vec<Value> = recs.iter().map(|r| r["request_id"].clone()).collect();
    assert_eq!(walked, one);
    // Bad parameters and keys.
    assert_eq!(admin_get(base, "limit=0").await.0, 400);
    assert_eq!(admin_get(base, "cursor=zzz").await.0, 400);
    let anon = reqwest::get(format!("{base}/admin/requests"))
        .await
        .unwrap();
    assert_eq!(anon.status().as_u16(), 401);
    let client = reqwest::Client::new()
        .get(format!("{base}/admin/requests"))
        .bearer_auth(PLAIN)
        .send()
        .await
        .unwrap();
    assert_eq!(client.status().as_u16(), 401);

    // The CLI's export follows the cursor: 4 JSON lines, newest first.
    let lines: Vec<Value> = cli_ok(&["requests", "export", "--url", base], ADMIN)
        .await
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, recs);
    let tail_args = [
        "requests", "tail", "-n", "2", "--key", "k-plain", "--url", base,
    ];
    let tail: Vec<String> = cli_ok(&tail_args, ADMIN)
        .await
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["request_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    // The two newest of k-plain, oldest first.
    let newest: Vec<String> = records(base, "key=k-plain&limit=2", 2)
        .await
        .iter()
        .rev()
        .map(|r| r["request_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(tail, newest);
}

#[tokio::test]
async fn thousand_requests_through_two_ingresses_leave_a_thousand_records() {
    let c = common::test_config(json!({
        "admin": {"keys": [{"id": "ops", "key_sha256": sha256_hex(ADMIN)}]},
        // 1,000 requests queue at one debug-build worker; on a loaded machine the last wait longer
        // than the default 2 s pickup bound, which this test is not about.
        "timeouts": {"first_frame_ms": 30000, "worker_silence_ms": 30000, "heartbeat_ms": 200}
    }));
    let gw = common::start_billed(c).await;
    let (second, _) = common::spawn_ingress(&gw).await;
    let bases = [gw.base.clone(), second];
    let client = reqwest::Client::new();
    // Every 10th request names an unknown model: refused before admission (404).
    let results: Vec<(bool, String)> = futures::future::join_all((0..1000).map(|i| {
        let client = client.clone();
        let base = bases[i % 2].clone();
        let refused = i % 10 == 9;
        let model = if refused { "demo/nope" } else { "demo/mock" };
        async move {
            let resp = client
                .post(format!("{base}/v1/chat/completions"))
                .json(&common::chat(model, "#mock text=hi", false))
                .send()
                .await
                .unwrap();
            let id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
            let status = resp.status().as_u16();
            let want = if refused { 404 } else { 200 };
            assert_eq!(status, want, "{}", resp.text().await.unwrap());
            (refused, id)
        }
    }))
    .await;
    let all: BTreeSet<String> = results.iter().map(|(_, id)| id.clone()).collect();
    let sent: BTreeSet<String> = results
        .iter()
        .filter(|(refused, _)| !refused)
        .map(|(_, id)| id.clone())
        .collect();
    assert_eq!((all.len(), sent.len()), (1000, 900));
    let ledger = gw.ledger.clone().unwrap();
    let audited: BTreeSet<String> = eventually(Duration::from_secs(60), || {
        let ledger = ledger.clone();
        async move {
            let ids: Vec<String> = sqlx::query_scalar("SELECT request_id FROM audit_log")
                .fetch_all(ledger.pool())
                .await
                .unwrap();
            (ids.len() >= 1000).then(|| ids.into_iter().collect())
        }
    })
    .await;
    let charged: Vec<String> =
        sqlx::query_scalar("SELECT request_id FROM usage_events WHERE kind = 'charge'")
            .fetch_all(ledger.pool())
            .await
            .unwrap();
    let charged: BTreeSet<String> = charged.into_iter().collect();
    assert_eq!(audited.len(), 1000);
    assert_eq!(audited, all);
    // Refused requests leave no usage row.
    assert_eq!(charged, sent);
    let refused_rows: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM usage_events WHERE model = 'demo/nope'")
            .fetch_one(ledger.pool())
            .await
            .unwrap();
    assert_eq!(refused_rows, 0);
    // Both ingresses' records are served by the admin API of either ingress.
    let (s, page) = admin_get(&bases[1], "limit=1000").await;
    assert_eq!(s, 200);
    assert_eq!(page["data"].as_array().unwrap().len(), 1000);
    assert_eq!(page["has_more"], false);
    let (s, refused) = admin_get(&bases[0], "status=404&limit=1000").await;
    assert_eq!(s, 200);
    assert_eq!(refused["data"].as_array().unwrap().len(), 100);
    assert_eq!(refused["has_more"], false);
}

const UPSTREAM: &str = "sk-upstream-audit-0123456789abcd";
const WRONG: &str = "sk-audit-wrong-0123456789abcdefg";

/// [`config`]'s keys and capture, the `gpt` target with an upstream credential, and an
/// exact-cache route `demo/cached` (the other routes do not cache, so no request of the run
/// is answered from the cache by accident).
fn mixed_config() -> switchyard_schemas::config::GatewayConfig {
    let mut c = config();
    let no_cache = json!({"enabled": false});
    c.targets.retain(|t| t.id != "gpt");
    c.targets.push(
        serde_json::from_value(json!({"id": "gpt", "provider": "openai",
            "base_url": "builtin:mock", "upstream_model": "gpt-4o", "api_key": UPSTREAM}))
        .unwrap(),
    );
    for m in &mut c.models {
        m.cache = Some(serde_json::from_value(no_cache.clone()).unwrap());
    }
    c.models.push(
        serde_json::from_value(json!({"id": "demo/cached", "targets": ["mock"],
            "cache": {"semantic": false}}))
        .unwrap(),
    );
    c.validate().unwrap();
    c
}

/// POSTs raw `body` to `path` with `key` (as `x-api-key` on `/v1/messages`, else bearer);
/// returns (status, `x-request-id`, `x-switchyard-cache`).
async fn post_raw(base: &str, path: &str, key: &str, body: &str) -> (u16, String, String) {
    let req = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .header("user-agent", "audit-mixed/1")
        .body(body.to_owned());
    let req = if path.starts_with("/v1/messages") {
        req.header("x-api-key", key)
    } else {
        req.bearer_auth(key)
    };
    let resp = req.send().await.unwrap();
    let header = |n: &str| {
        resp.headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let out = (
        resp.status().as_u16(),
        header("x-request-id"),
        header("x-switchyard-cache"),
    );
    assert!(!out.1.is_empty(), "no x-request-id on a {} answer", out.0);
    out
}

/// The exact record of a request refused before admission.
#[allow(clippy::too_many_arguments)]
fn refusal(
    id: &str,
    door: &str,
    key: Option<(&str, &str)>,
    model: &str,
    http: u16,
    class: &str,
    code: &str,
) -> Value {
    json!({
        "request_id": id, "front_door": door, "key_id": key.map(|k| k.0),
        "tenant": key.map(|k| k.1), "model": model, "target": null, "upstream_model": null,
        "status": "error", "http_status": http, "error_class": class, "error_code": code,
        "finish_reason": null, "fallbacks": 0, "attempts": [], "prompt_tokens": 0,
        "completion_tokens": 0, "cached_tokens": 0, "cost_usd": null, "charge_usd": null,
        "cache_hit": false, "cache_outcome": null, "client_ip": "127.0.0.1",
        "user_agent": "audit-mixed/1",
        "client_request_id": null, "request_body": null, "response_body": null
    })
}

/// Issue #15's acceptance run: one record per request whatever its outcome, bodies only for
/// the captured key, no secret in any record.
#[tokio::test]
async fn mixed_run_leaves_one_record_per_request_and_no_secret() {
    let gw = common::start(Options {
        config: mixed_config(),
        billing: true,
        cache: true,
        // Every component as its own NATS identity: `usage.audit` is within ingress's rights.
        auth: true,
        ..Options::default()
    })
    .await;
    let base = &gw.base;
    let chat =
        |model: &str, content: &str, stream: bool| common::chat(model, content, stream).to_string();
    let completions = "/v1/chat/completions";
    let no_max = json!({"model": "openai/gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    // Sent in this order, each answered `status`: two answers, then refusals before admission
    // (malformed body, unknown model also for the captured key: a refusal never keeps a body, bad
    // key, an Anthropic body without `max_tokens`), then one refused by the upstream.
    let cases = [
        (
            completions,
            PLAIN,
            chat("openai/gpt-4o", "#mock text=hello", false),
            200,
        ),
        (
            completions,
            PLAIN,
            chat("demo/fallback", "#mock text=ok", false),
            200,
        ),
        (
            completions,
            PLAIN,
            r#"{"model": "openai/gpt-4o", "messages": "#.to_owned(),
            400,
        ),
        (completions, PLAIN, chat("nope/unknown", "hi", false), 404),
        (
            completions,
            CAPTURED,
            chat("nope/unknown", "hi", false),
            404,
        ),
        (completions, WRONG, chat("openai/gpt-4o", "hi", false), 401),
        ("/v1/messages", PLAIN, no_max.to_string(), 400),
        (
            completions,
            PLAIN,
            chat(
                "openai/gpt-4o",
                "#mock status=400 error_message=bad+input",
                false,
            ),
            400,
        ),
    ];
    let mut ids = Vec::new();
    for (path, key, body, status) in &cases {
        let (got, id, _) = post_raw(base, path, key, body).await;
        assert_eq!(got, *status, "{body}");
        ids.push(id);
    }
    let [
        ok,
        fallback,
        malformed,
        unknown,
        unknown_cap,
        bad_key,
        anthropic_400,
        upstream_400,
    ] = <[String; 8]>::try_from(ids).unwrap();
    // A miss, then the same request answered from the cache.
    let question = chat("demo/cached", "Name a prime number.", false);
    let miss = post_raw(base, completions, PLAIN, &question).await;
    let hit = post_raw(base, completions, PLAIN, &question).await;
    assert_eq!(
        (miss.0, miss.2.as_str(), hit.0, hit.2.as_str()),
        (200, "miss", 200, "hit")
    );
    // A stream of the captured key the client leaves after its first chunk.
    let resp = reqwest::Client::new()
        .post(format!("{base}{completions}"))
        .bearer_auth(CAPTURED)
        .json(&common::chat(
            "openai/gpt-4o",
            "Authorization: Bearer sk-live-secret-value\n#mock text_len=2000 chunk_delay_ms=100",
            true,
        ))
        .send()
        .await
        .unwrap();
    let cancelled = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
    let mut stream = resp.bytes_stream();
    use futures::StreamExt as _;
    assert!(!stream.next().await.unwrap().unwrap().is_empty());
    drop(stream);

    let sent = [
        &ok,
        &fallback,
        &malformed,
        &unknown,
        &unknown_cap,
        &bad_key,
        &anthropic_400,
        &upstream_400,
        &miss.1,
        &hit.1,
        &cancelled,
    ];
    // Exactly one record per request: as many records as requests, and every request's id.
    let recs = records(base, "limit=1000", sent.len()).await;
    let got: BTreeSet<String> = recs
        .iter()
        .map(|r| r["request_id"].as_str().unwrap().to_owned())
        .collect();
    let want: BTreeSet<String> = sent.iter().map(|s| s.to_string()).collect();
    assert_eq!((got.len(), &got), (sent.len(), &want));

    let plain = Some(("k-plain", "acme"));
    for (id, expected) in [
        (
            &malformed,
            refusal(
                &malformed,
                "openai",
                plain,
                "",
                400,
                "invalid_request",
                "invalid_request_error",
            ),
        ),
        (
            &unknown,
            refusal(
                &unknown,
                "openai",
                plain,
                "nope/unknown",
                404,
                "not_found",
                "model_not_found",
            ),
        ),
        (
            &unknown_cap,
            refusal(
                &unknown_cap,
                "openai",
                Some(("k-cap", "globex")),
                "nope/unknown",
                404,
                "not_found",
                "model_not_found",
            ),
        ),
        (
            &bad_key,
            refusal(&bad_key, "openai", None, "", 401, "auth", "invalid_api_key"),
        ),
        (
            &anthropic_400,
            refusal(
                &anthropic_400,
                "anthropic",
                plain,
                "",
                400,
                "invalid_request",
                "invalid_request_error",
            ),
        ),
    ] {
        assert_eq!(stable(by_id(&recs, id)), expected);
    }
    let outcome = |id: &str| {
        let r = by_id(&recs, id);
        (
            r["status"].as_str().unwrap().to_owned(),
            r["http_status"].as_u64().unwrap(),
            r["error_class"].clone(),
            r["cache_hit"].as_bool().unwrap(),
            r["cache_outcome"].as_str().unwrap().to_owned(),
        )
    };
    // Only `demo/cached` caches: the others' outcome is `off`.
    let off = || "off".to_owned();
    let ok_outcome = ("ok".to_owned(), 200, Value::Null, false, off());
    assert_eq!(outcome(&ok), ok_outcome);
    assert_eq!(outcome(&fallback), ok_outcome);
    assert_eq!(by_id(&recs, &fallback)["fallbacks"], 1);
    assert_eq!(
        outcome(&miss.1),
        ("ok".to_owned(), 200, Value::Null, false, "miss".to_owned())
    );
    assert_eq!(
        outcome(&hit.1),
        ("ok".to_owned(), 200, Value::Null, true, "hit".to_owned())
    );
    assert_eq!(
        outcome(&upstream_400),
        (
            "error".to_owned(),
            400,
            json!("invalid_request"),
            false,
            off()
        )
    );
    assert_eq!(
        outcome(&cancelled),
        (
            "cancelled".to_owned(),
            499,
            json!("cancelled"),
            false,
            off()
        )
    );
    // Bodies only for the captured key's admitted request, redacted.
    for r in &recs {
        let captured = r["request_id"] == cancelled.as_str();
        assert_eq!(!r["request_body"].is_null(), captured, "{r}");
        assert!(captured || r["response_body"].is_null(), "{r}");
    }
    let body = by_id(&recs, &cancelled)["request_body"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(body.contains("Authorization"), "{body}");
    // No secret anywhere: the whole page as text.
    let (_, page) = admin_get(base, "limit=1000").await;
    let text = page.to_string();
    for secret in [
        ADMIN,
        PLAIN,
        CAPTURED,
        WRONG,
        UPSTREAM,
        "sk-live-secret-value",
    ] {
        assert!(!text.contains(secret), "{secret} in the audit log: {text}");
    }
    // Refused requests left no usage row; the admitted ones their charge row.
    let ledger = gw.ledger.clone().unwrap();
    for id in sent {
        let rows: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM usage_events WHERE request_id = $1 AND kind = 'charge'",
        )
        .bind(id.as_str())
        .fetch_one(ledger.pool())
        .await
        .unwrap();
        let refused = [&malformed, &unknown, &unknown_cap, &bad_key, &anthropic_400].contains(&id);
        assert_eq!(rows, i64::from(!refused), "{id}");
    }
}

/// A flood of refused requests over `audit.refused_per_second` (5): the first 5 of each second
/// are recorded, the rest dropped and counted in `switchyard_audit_dropped_total`; every
/// client still gets its 404 with an `x-request-id`.
#[tokio::test]
async fn refusal_flood_is_capped_and_counted() {
    let c = common::test_config(json!({
        "admin": {"keys": [{"id": "ops", "key_sha256": sha256_hex(ADMIN)}]},
        "audit": {"refused_per_second": 5}
    }));
    let gw = common::start_billed(c).await;
    let base = &gw.base;
    let started = std::time::Instant::now();
    let body = common::chat("demo/nope", "hi", false).to_string();
    let answers = futures::future::join_all(
        (0..30).map(|_| post_raw(base, "/v1/chat/completions", "", &body)),
    )
    .await;
    let seconds = started.elapsed().as_secs();
    assert!(answers.iter().all(|a| a.0 == 404), "{answers:?}");
    // Dropping is decided before the answer goes out: the counter is final now.
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let dropped: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("switchyard_audit_dropped_total "))
        .map_or(0, |v| v.parse::<f64>().unwrap() as usize);
    let kept = 30 - dropped;
    // At least the first second's 5; at most 5 per second the burst spanned.
    assert!(
        (5..=5 * (seconds as usize + 2)).contains(&kept),
        "kept {kept} in {seconds} s"
    );
    let recs = records(base, "status=404&limit=1000", kept).await;
    let ids: BTreeSet<&str> = answers.iter().map(|a| a.1.as_str()).collect();
    assert!(
        recs.iter()
            .all(|r| ids.contains(r["request_id"].as_str().unwrap()))
    );
}

/// Capture by model (`audit.capture.models`) and the cache outcome: a request to the captured
/// `demo/mock` (no cache: `off`) keeps both bodies, redacted and cut to 64 bytes; requests to
/// `demo/cached` (not captured) keep none, `bypass` with `cache-control: no-cache, no-store`
/// (nothing stored either), then `miss`.
#[tokio::test]
async fn capture_by_model_and_cache_outcomes() {
    let mut c = common::test_config(json!({
        "keys": [{"id": "k-plain", "tenant": "acme", "key_sha256": sha256_hex(PLAIN)}],
        "admin": {"keys": [{"id": "ops", "key_sha256": sha256_hex(ADMIN)}]},
        "audit": {"capture": {"models": ["demo/mock"], "max_bytes": 64}}
    }));
    for m in c.models.iter_mut().filter(|m| m.id == "demo/mock") {
        m.cache = Some(serde_json::from_value(json!({"enabled": false})).unwrap());
    }
    c.models.push(
        serde_json::from_value(json!({"id": "demo/cached", "targets": ["mock"],
            "cache": {"semantic": false}}))
        .unwrap(),
    );
    c.validate().unwrap();
    let gw = common::start(Options {
        config: c,
        billing: true,
        cache: true,
        ..Options::default()
    })
    .await;
    let base = &gw.base;
    let content = "Authorization: Bearer sk-live-secret-value\n#mock text_len=100";
    let (s, captured, _) = send(base, PLAIN, &common::chat("demo/mock", content, false), &[]).await;
    assert_eq!(s, 200);
    let other = common::chat("demo/cached", content, false);
    let (s, bypass, _) = send(
        base,
        PLAIN,
        &other,
        &[("cache-control", "no-cache, no-store")],
    )
    .await;
    assert_eq!(s, 200);
    let (s, miss, _) = send(base, PLAIN, &other, &[]).await;
    assert_eq!(s, 200);

    let recs = records(base, "", 3).await;
    let fields = |id: &str| {
        let r = by_id(&recs, id);
        (
            r["model"].clone(),
            r["cache_outcome"].clone(),
            r["request_body"].clone(),
            r["response_body"].clone(),
        )
    };
    assert_eq!(
        fields(&captured),
        (
            json!("demo/mock"),
            json!("off"),
            // 64 bytes each: the messages JSON with the credential redacted, the text cut.
            json!(r#"[{"role":"user","content":"Authorization: Bearer [redacted]\n#mo"#),
            json!("lorem ipsum dolor sit amet lorem ipsum dolor sit amet lorem ipsu")
        )
    );
    for (id, outcome) in [(&bypass, "bypass"), (&miss, "miss")] {
        assert_eq!(
            fields(id),
            (
                json!("demo/cached"),
                json!(outcome),
                Value::Null,
                Value::Null
            )
        );
    }
    let text = admin_get(base, "").await.1.to_string();
    assert!(!text.contains("sk-live-secret-value"), "{text}");
}

/// The `request_id` of the next JSON line of `switchyard requests tail -f` (within 20 s).
async fn next_id(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) -> String {
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("no line from `requests tail -f` within 20 s")
        .unwrap()
        .expect("`requests tail -f` ended");
    let r: Value = serde_json::from_str(&line).unwrap();
    r["request_id"].as_str().unwrap().to_owned()
}

/// `switchyard requests tail -f` prints the latest record, then each new one as it is stored.
#[tokio::test]
async fn requests_tail_follow_prints_new_records() {
    use tokio::io::AsyncBufReadExt as _;
    let gw = common::start_billed(config()).await;
    let base = &gw.base;
    let body = common::chat("demo/mock", "#mock text=ok", false);
    let (s, first, _) = send(base, PLAIN, &body, &[]).await;
    assert_eq!(s, 200);
    records(base, "", 1).await;
    let mut tail = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args([
            "requests",
            "tail",
            "-f",
            "-n",
            "5",
            "--interval-ms",
            "100",
            "--url",
            base,
        ])
        .env("SWITCHYARD_ADMIN_KEY", ADMIN)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(tail.stdout.take().unwrap()).lines();
    assert_eq!(next_id(&mut lines).await, first);
    let (s, second, _) = send(base, CAPTURED, &body, &[]).await;
    assert_eq!(s, 200);
    assert_eq!(next_id(&mut lines).await, second);
    let (s, third, _) = send(base, PLAIN, &body, &[]).await;
    assert_eq!(s, 200);
    assert_eq!(next_id(&mut lines).await, third);
    tail.kill().await.unwrap();
}
