//! Batch jobs (OpenAI Files + Batch API, Anthropic Message Batches) through real ingress, worker,
//! billing and nats-server processes' code: FC-33 (one charge per item at the batch rate however
//! often and wherever a batch is polled), validation before any upstream call, tenant isolation,
//! cancellation, expiry, and a worker restart in the middle of a 1,000-item batch.

use crate::common::{
    Gateway, catalog_file, eventually, get_as, post_empty, spawn_ingress, spawn_worker,
    start_billed, test_config,
};
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::str::FromStr;
use std::time::Duration;

pub(crate) const KEY_A: &str = "sk-batch-tenant-a-0001";
pub(crate) const KEY_B: &str = "sk-batch-tenant-b-0002";

pub(crate) fn write_catalog(dir: &std::path::Path) -> String {
    catalog_file(
        dir,
        "currency: USD\nas_of: 2026-12-01\n\
         upstream:\n  gpt-t-upstream: {input: 2.5, output: 10, batch_discount: 0.5}\n\
         standard:\n  gpt-t: {input: 2.5, output: 10, batch_discount: 0.5}\n",
    )
}

pub(crate) async fn gateway(extra: Value) -> (Gateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = json!({
        "pricing_file": write_catalog(dir.path()),
        "targets": [
            {"id": "t", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "gpt-t-upstream"},
            {"id": "claude", "provider": "anthropic", "base_url": "builtin:mock", "upstream_model": "claude-test"}
        ],
        "models": [
            {"id": "gpt-t", "targets": ["t"]},
            {"id": "demo/claude", "targets": ["claude"]}
        ],
        "keys": [
            {"id": "ka", "tenant": "a", "key": KEY_A},
            {"id": "kb", "tenant": "b", "key": KEY_B}
        ],
        "timeouts": {"first_frame_ms": 2000, "worker_silence_ms": 3000, "heartbeat_ms": 200}
    });
    if let (Some(o), Some(e)) = (cfg.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            o.insert(k.clone(), v.clone());
        }
    }
    let gw = start_billed(test_config(cfg)).await;
    (gw, dir)
}

pub(crate) fn line(custom_id: &str, content: &str) -> String {
    json!({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "gpt-t", "messages": [{"role": "user", "content": content}]}})
    .to_string()
}

/// `POST /v1/files` as multipart/form-data (the SDKs' encoding), returns the file object.
pub(crate) async fn upload(base: &str, key: &str, content: &str) -> Value {
    let boundary = "sybatchboundary42";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{content}\r\n--{boundary}--\r\n"
    );
    crate::common::json_ok(
        reqwest::Client::new()
            .post(format!("{base}/v1/files"))
            .bearer_auth(key)
            .header(
                "content-type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body),
    )
    .await
}

/// [`crate::common::call`] with bearer `key`.
pub(crate) async fn call(
    method: reqwest::Method,
    url: String,
    key: &str,
    body: Option<Value>,
) -> (u16, Value) {
    crate::common::call(method, url, Some(key), body).await
}

pub(crate) async fn create_batch(base: &str, key: &str, file_id: &str, window: &str) -> Value {
    create_batch_for(base, key, file_id, window, "/v1/chat/completions").await
}

async fn create_batch_for(
    base: &str,
    key: &str,
    file_id: &str,
    window: &str,
    endpoint: &str,
) -> Value {
    let (status, b) = call(
        reqwest::Method::POST,
        format!("{base}/v1/batches"),
        key,
        Some(json!({"input_file_id": file_id, "endpoint": endpoint,
                    "completion_window": window, "metadata": {"job": "nightly"}})),
    )
    .await;
    assert_eq!(status, 200, "{b}");
    b
}

/// `POST /v1/batches` as `key` of `file_id` for `/v1/chat/completions` in 24 h, no metadata: the
/// status and body, whatever the status.
pub(crate) async fn post_batch(base: &str, key: &str, file_id: &str) -> (u16, Value) {
    call(
        reqwest::Method::POST,
        format!("{base}/v1/batches"),
        key,
        Some(
            json!({"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                    "completion_window": "24h"}),
        ),
    )
    .await
}

pub(crate) async fn retrieve(base: &str, key: &str, id: &str) -> Value {
    let (status, b) = get_as(format!("{base}/v1/batches/{id}"), key).await;
    assert_eq!(status, 200, "{b}");
    b
}

/// The batch, or `None` while the gateway cannot answer (nats-server restarting).
pub(crate) async fn try_retrieve(base: &str, key: &str, id: &str) -> Option<Value> {
    let (status, b) = get_as(format!("{base}/v1/batches/{id}"), key).await;
    (status == 200).then_some(b)
}

pub(crate) async fn wait_status(base: &str, key: &str, id: &str, want: &str) -> Value {
    eventually(Duration::from_secs(60), || async move {
        let b = retrieve(base, key, id).await;
        (b["status"] == want).then_some(b)
    })
    .await
}

pub(crate) async fn content(base: &str, key: &str, file_id: &str) -> String {
    let resp = reqwest::Client::new()
        .get(format!("{base}/v1/files/{file_id}/content"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap()
}

/// `n` chat-completion lines as JSONL, custom ids `{prefix}0…`, each with user message `content`.
pub(crate) fn items(prefix: &str, n: usize, content: &str) -> String {
    (0..n)
        .map(|i| line(&format!("{prefix}{i}"), content))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Uploads `input` (JSONL) as `key` and creates a chat-completions batch of it within `window`:
/// the batch object.
pub(crate) async fn submit(base: &str, key: &str, input: &str, window: &str) -> Value {
    submit_for(base, key, input, window, "/v1/chat/completions").await
}

/// [`submit`] for the batch `endpoint`.
/// A 24 h batch as [`KEY_A`] on `endpoint` of one line per body of `bodies` (custom ids
/// `{prefix}0`, `{prefix}1`, …), run to its end: its id, the finished batch and its output lines.
async fn run_batch(
    base: &str,
    endpoint: &str,
    prefix: &str,
    bodies: &[Value],
) -> (String, Value, Vec<Value>) {
    let input = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            json!({"custom_id": format!("{prefix}{i}"), "method": "POST", "url": endpoint,
                   "body": body})
            .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n");
    let batch = submit_for(base, KEY_A, &input, "24h", endpoint).await;
    let id = batch["id"].as_str().unwrap().to_owned();
    let (done, out) = finished(base, KEY_A, &id, bodies.len()).await;
    (id, done, out)
}

pub(crate) async fn submit_for(
    base: &str,
    key: &str,
    input: &str,
    window: &str,
    endpoint: &str,
) -> Value {
    let file = upload(base, key, input).await;
    create_batch_for(base, key, file["id"].as_str().unwrap(), window, endpoint).await
}

/// Waits (at most `limit`) until batch `id` has completed at least `n` items. With `outage`, a
/// read that is not 200 (nats-server away) counts as not yet; without, it fails the test.
pub(crate) async fn wait_completed(
    base: &str,
    key: &str,
    id: &str,
    n: u64,
    outage: bool,
    limit: Duration,
) {
    eventually(limit, || async move {
        let b = if outage {
            try_retrieve(base, key, id).await?
        } else {
            retrieve(base, key, id).await
        };
        (b["request_counts"]["completed"].as_u64().unwrap() >= n).then_some(())
    })
    .await
}

/// Waits for batch `id` to complete with all its `total` items completed and none failed: the
/// batch and the lines of its output file.
pub(crate) async fn finished(base: &str, key: &str, id: &str, total: usize) -> (Value, Vec<Value>) {
    let done = wait_status(base, key, id, "completed").await;
    assert_eq!(
        done["request_counts"],
        json!({"total": total, "completed": total, "failed": 0})
    );
    let out = file_lines(base, key, &done, "output_file_id").await;
    (done, out)
}

/// The lines of the batch's JSONL file named by `field` (`output_file_id` or `error_file_id`).
pub(crate) async fn file_lines(base: &str, key: &str, batch: &Value, field: &str) -> Vec<Value> {
    lines(&content(base, key, batch[field].as_str().unwrap()).await)
}

pub(crate) fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// For a failed [`assert_billed_once`]: the answered request ids without a charge row, and every
/// ledger row of the first few of them (kind, attempt, status, batch id).
async fn missing_charges(
    gw: &Gateway,
    rows: &[(String, String, Option<String>)],
    out: &[Value],
) -> String {
    let charged: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    let missing: Vec<&str> = out
        .iter()
        .filter_map(|l| l["response"]["request_id"].as_str())
        .filter(|id| !charged.contains(id))
        .collect();
    let mut text = format!("{} answered without a charge row", missing.len());
    for id in missing.iter().take(5) {
        let found = sqlx::query_as::<_, (String, i64, String, Option<String>)>(
            "SELECT kind, attempt, status, batch_id FROM usage_events WHERE request_id = $1",
        )
        .bind(*id)
        .fetch_all(gw.ledger.as_ref().unwrap().pool())
        .await
        .unwrap();
        text.push_str(&format!("; {id}: {found:?}"));
    }
    text
}

/// Exactly one `charge` row per line of `out` (the output file's lines) for `batch_id`: every
/// charge row of the batch is `ok` and under the request id its line names, and they sum to
/// `total` USD. Waits for the rows to arrive, then checks no more than those exist.
pub(crate) async fn assert_billed_once(gw: &Gateway, batch_id: &str, out: &[Value], total: &str) {
    // 60 s: a charge spooled while NATS was away reaches the ledger at the spool's next retry.
    let limit = Duration::from_secs(60);
    let deadline = tokio::time::Instant::now() + limit;
    let rows = loop {
        let rows = sqlx::query_as::<_, (String, String, Option<String>)>(
            "SELECT request_id, status, cost_usd FROM usage_events \
             WHERE batch_id = $1 AND kind = 'charge'",
        )
        .bind(batch_id)
        .fetch_all(gw.ledger.as_ref().unwrap().pool())
        .await
        .unwrap();
        if rows.len() >= out.len() {
            break rows;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "{} of {} charge rows of {batch_id} within {limit:?}; {}",
                rows.len(),
                out.len(),
                missing_charges(gw, &rows, out).await
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(rows.len(), out.len(), "charge rows of {batch_id}");
    assert!(rows.iter().all(|r| r.1 == "ok"), "a charge row is not ok");
    let charged: std::collections::BTreeSet<uuid::Uuid> =
        rows.iter().map(|r| r.0.parse().unwrap()).collect();
    let answered: std::collections::BTreeSet<uuid::Uuid> = out
        .iter()
        .map(|l| {
            l["response"]["request_id"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(charged, answered);
    let sum: Decimal = rows
        .iter()
        .map(|r| Decimal::from_str(r.2.as_deref().unwrap()).unwrap())
        .sum();
    assert_eq!(sum, Decimal::from_str(total).unwrap());
}

/// Charges (USD) the ledger holds for `batch_id`, once it holds `n` charge rows.
pub(crate) async fn batch_charges(
    gw: &Gateway,
    batch_id: &str,
    n: usize,
) -> Vec<(String, String, Decimal)> {
    let ledger = gw.ledger.clone().unwrap();
    let batch_id = batch_id.to_owned();
    eventually(Duration::from_secs(20), || {
        let (ledger, batch_id) = (ledger.clone(), batch_id.clone());
        async move {
            let rows = sqlx::query_as::<_, (String, String, Option<String>)>(
                "SELECT request_id, status, cost_usd FROM usage_events \
                 WHERE batch_id = $1 AND kind = 'charge' ORDER BY request_id",
            )
            .bind(&batch_id)
            .fetch_all(ledger.pool())
            .await
            .unwrap();
            (rows.len() == n).then(|| {
                rows.into_iter()
                    .map(|(id, s, c)| {
                        (
                            id,
                            s,
                            c.map_or(Decimal::ZERO, |c| Decimal::from_str(&c).unwrap()),
                        )
                    })
                    .collect()
            })
        }
    })
    .await
}

/// FC-33 (BerriAI/litellm #12084, #35358, PR #37050): a two-line batch for `gpt-t` (input $2.50,
/// output $10 per 1M, batch rate 50 %), polled six times from two ingress processes (twice before
/// completion, four times after), 26 input / 9 output tokens in all: one charge per item, and the
/// key's spend is exactly $0.0000775 however often and wherever it is polled. Then the partial
/// failure: one item fails upstream → one output line, one error line, counts 1 / 1, only the
/// successful item billed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fc33_batch_is_billed_once_at_the_batch_rate_from_any_ingress() {
    let (gw, _dir) = gateway(json!({})).await;
    let (second, _) = spawn_ingress(&gw).await;
    let input = [
        line(
            "req-1",
            "#mock ttft_ms=1500 prompt_tokens=13 completion_tokens=4\nHello",
        ),
        line(
            "req-2",
            "#mock ttft_ms=1500 prompt_tokens=13 completion_tokens=5\nHi there",
        ),
    ]
    .join("\n");
    let file = upload(&gw.base, KEY_A, &input).await;
    assert_eq!(file["object"], "file");
    assert_eq!(file["purpose"], "batch");
    assert_eq!(file["bytes"], input.len());
    let batch = create_batch(&gw.base, KEY_A, file["id"].as_str().unwrap(), "24h").await;
    let id = batch["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("batch_"));
    assert_eq!(batch["object"], "batch");
    assert_eq!(batch["status"], "in_progress");
    assert_eq!(
        batch["request_counts"],
        json!({"total": 2, "completed": 0, "failed": 0})
    );
    assert_eq!(batch["metadata"], json!({"job": "nightly"}));
    // Two polls before completion (the mock holds each answer 1.5 s), one per ingress.
    for base in [&gw.base, &second] {
        let b = retrieve(base, KEY_A, &id).await;
        assert_eq!(b["status"], "in_progress");
    }
    let done = wait_status(&gw.base, KEY_A, &id, "completed").await;
    // Four polls after completion, alternating ingress processes.
    for base in [&gw.base, &second, &gw.base, &second] {
        let b = retrieve(base, KEY_A, &id).await;
        assert_eq!(b["status"], "completed");
        assert_eq!(
            b["request_counts"],
            json!({"total": 2, "completed": 2, "failed": 0})
        );
    }
    assert_eq!(done["usage"]["input_tokens"], 26);
    assert_eq!(done["usage"]["output_tokens"], 9);
    assert_eq!(done["usage"]["total_tokens"], 35);
    assert!(done["completed_at"].as_u64().unwrap() >= done["created_at"].as_u64().unwrap());
    assert!(done["error_file_id"].is_null());
    let out = file_lines(&second, KEY_A, &done, "output_file_id").await;
    assert_eq!(out.len(), 2);
    let by_id = |cid: &str| out.iter().find(|l| l["custom_id"] == cid).unwrap().clone();
    let r1 = by_id("req-1");
    assert_eq!(r1["response"]["status_code"], 200);
    assert_eq!(r1["response"]["body"]["object"], "chat.completion");
    assert_eq!(r1["response"]["body"]["model"], "gpt-t");
    assert_eq!(r1["response"]["body"]["usage"]["prompt_tokens"], 13);
    assert_eq!(r1["response"]["body"]["usage"]["completion_tokens"], 4);
    assert!(r1["error"].is_null());
    assert_eq!(
        by_id("req-2")["response"]["body"]["usage"]["completion_tokens"],
        5
    );

    let charges = batch_charges(&gw, &id, 2).await;
    let total: Decimal = charges.iter().map(|c| c.2).sum();
    assert_eq!(total, Decimal::from_str("0.0000775").unwrap());
    assert!(charges.iter().all(|c| c.1 == "ok"));
    // Polling more never bills again.
    for base in [&gw.base, &second] {
        retrieve(base, KEY_A, &id).await;
        content(base, KEY_A, done["output_file_id"].as_str().unwrap()).await;
    }
    assert_eq!(batch_charges(&gw, &id, 2).await.len(), 2);

    // Partial failure: the second item fails upstream with a 400 (not retried).
    let input = [
        line("ok", "#mock prompt_tokens=13 completion_tokens=4\nHello"),
        line("bad", "#mock status=400\nHello"),
    ]
    .join("\n");
    let file = upload(&second, KEY_A, &input).await;
    let batch = create_batch(&second, KEY_A, file["id"].as_str().unwrap(), "24h").await;
    let id2 = batch["id"].as_str().unwrap().to_owned();
    let done = wait_status(&gw.base, KEY_A, &id2, "completed").await;
    assert_eq!(
        done["request_counts"],
        json!({"total": 2, "completed": 1, "failed": 1})
    );
    let out = file_lines(&gw.base, KEY_A, &done, "output_file_id").await;
    let err = file_lines(&gw.base, KEY_A, &done, "error_file_id").await;
    assert_eq!(out.len(), 1);
    assert_eq!(out[0]["custom_id"], "ok");
    assert_eq!(err.len(), 1);
    assert_eq!(err[0]["custom_id"], "bad");
    assert_eq!(err[0]["response"]["status_code"], 400);
    assert_eq!(
        err[0]["response"]["body"]["error"]["type"],
        "invalid_request_error"
    );
    let charges = batch_charges(&gw, &id2, 2).await;
    let billed: Decimal = charges.iter().map(|c| c.2).sum();
    // 13 × 2.5 + 4 × 10 per 1M, halved.
    assert_eq!(billed, Decimal::from_str("0.00003625").unwrap());

    // The daily report shows batch spend apart: both batches, nothing live.
    let today = time::OffsetDateTime::now_utc().date().to_string();
    let report = switchyard_billing::report::daily_report(gw.ledger.as_ref().unwrap(), &today)
        .await
        .unwrap();
    assert_eq!(report.by_origin.len(), 1, "{:?}", report.by_origin);
    assert_eq!(report.by_origin[0].name, "batch");
    assert_eq!(report.by_origin[0].requests, 4);
    assert_eq!(
        report.by_origin[0].charge_usd,
        Decimal::from_str("0.00011375").unwrap()
    );
    assert!(report.to_table().contains("batch: 4 requests"));
}

/// A malformed input file: every bad line named (line number, code), status `failed`, and zero
/// upstream calls — one rule for every kind of bad line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_input_fails_fast_with_every_bad_line_and_no_upstream_call() {
    let (gw, _dir) = gateway(json!({})).await;
    let embeddings_body = json!({"custom_id": "e", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "gpt-t", "input": "embed me"}});
    let input = [
        line("a", "fine"),
        "{not json".to_owned(),
        line("a", "duplicate id"),
        json!({"custom_id": "g", "method": "GET", "url": "/v1/chat/completions", "body": {}}).to_string(),
        json!({"custom_id": "u", "method": "POST", "url": "/v1/embeddings",
               "body": {"model": "gpt-t", "input": "x"}}).to_string(),
        embeddings_body.to_string(),
        json!({"custom_id": "m", "method": "POST", "url": "/v1/chat/completions",
               "body": {"model": "nope", "messages": [{"role": "user", "content": "x"}]}}).to_string(),
        json!({"custom_id": "s", "method": "POST", "url": "/v1/chat/completions",
               "body": {"model": "gpt-t", "stream": true, "messages": [{"role": "user", "content": "x"}]}}).to_string(),
        "[1, 2]".to_owned(),
    ]
    .join("\n");
    let file = upload(&gw.base, KEY_A, &input).await;
    let batch = create_batch(&gw.base, KEY_A, file["id"].as_str().unwrap(), "24h").await;
    assert_eq!(batch["status"], "failed");
    assert!(batch["failed_at"].is_u64());
    let errors: Vec<(u64, String)> = batch["errors"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["line"].as_u64().unwrap(),
                e["code"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want: Vec<(u64, String)> = [
        (2, "invalid_json_line"),
        (3, "duplicate_custom_id"),
        (4, "invalid_method"),
        (5, "mismatched_url"),
        (6, "invalid_body"),
        (7, "model_not_found"),
        (8, "invalid_body"),
        (9, "invalid_json_line"),
    ]
    .iter()
    .map(|(l, c)| (*l, (*c).to_owned()))
    .collect();
    assert_eq!(errors, want);
    assert_eq!(batch["errors"]["object"], "list");
    assert_eq!(gw.mock.request_count(), 0);
    // A valid endpoint mismatch at create time is a 400, not a batch.
    let (status, e) = call(
        reqwest::Method::POST,
        format!("{}/v1/batches", gw.base),
        KEY_A,
        Some(json!({"input_file_id": file["id"], "endpoint": "/v1/nope", "completion_window": "24h"})),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(e["error"]["param"], "endpoint");
    assert_eq!(gw.mock.request_count(), 0);
}

/// Key A's files and batches are invisible to tenant B: 404 for the file, its content, the
/// batch and its cancel; B's lists do not show them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_never_see_each_others_files_or_batches() {
    let (gw, _dir) = gateway(json!({})).await;
    let file = upload(&gw.base, KEY_A, &line("x", "#mock ttft_ms=3000\nslow")).await;
    let fid = file["id"].as_str().unwrap();
    let batch = create_batch(&gw.base, KEY_A, fid, "24h").await;
    let bid = batch["id"].as_str().unwrap();
    let b = &gw.base;
    use reqwest::Method as M;
    for (method, url) in [
        (M::GET, format!("{b}/v1/files/{fid}")),
        (M::GET, format!("{b}/v1/files/{fid}/content")),
        (M::DELETE, format!("{b}/v1/files/{fid}")),
        (M::GET, format!("{b}/v1/batches/{bid}")),
        (M::POST, format!("{b}/v1/batches/{bid}/cancel")),
    ] {
        let (status, body) = call(method.clone(), url.clone(), KEY_B, None).await;
        assert_eq!(status, 404, "{method} {url}: {body}");
    }
    let (status, e) = post_batch(b, KEY_B, fid).await;
    assert_eq!(status, 404, "{e}");
    let (_, files) = get_as(format!("{b}/v1/files"), KEY_B).await;
    assert_eq!(files["data"], json!([]));
    let (_, batches) = get_as(format!("{b}/v1/batches"), KEY_B).await;
    assert_eq!(batches["data"], json!([]));
    let (_, mine) = get_as(format!("{b}/v1/batches?limit=1"), KEY_A).await;
    assert_eq!(mine["data"][0]["id"], bid);
    assert_eq!(mine["first_id"], bid);
    // Still A's: the cancel by B changed nothing.
    assert_eq!(retrieve(b, KEY_A, bid).await["status"], "in_progress");
}

/// A gateway running at most `in_flight` batch items at once, and tenant A's batch of `n` items
/// of `ms` ms each (custom ids `{prefix}0…`) within `window`: the gateway, its dir, the batch id.
async fn slow_batch(
    in_flight: u64,
    prefix: &str,
    n: usize,
    ms: u64,
    window: &str,
) -> (Gateway, tempfile::TempDir, String) {
    let (gw, dir) = gateway(json!({"batch": {"max_in_flight": in_flight}})).await;
    let input = items(prefix, n, &format!("#mock ttft_ms={ms}\nslow"));
    let batch = submit(&gw.base, KEY_A, &input, window).await;
    let id = batch["id"].as_str().unwrap().to_owned();
    (gw, dir, id)
}

/// Asserts the error file of the ended batch `done` holds `n` lines, each with error `code`.
async fn assert_errors(gw: &Gateway, done: &Value, n: u64, code: &str) {
    let err = file_lines(&gw.base, KEY_A, done, "error_file_id").await;
    assert_eq!(err.len() as u64, n);
    assert!(err.iter().all(|l| l["error"]["code"] == code));
}

/// Cancel: in-flight items finish, the rest never run and are reported `batch_cancelled`; the
/// batch ends `cancelled` with partial results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_dispatch_and_reports_partial_results() {
    let (gw, _dir, id) = slow_batch(2, "c", 20, 400, "24h").await;
    let id = id.as_str();
    let (status, c) = post_empty(format!("{}/v1/batches/{id}/cancel", gw.base), KEY_A).await;
    assert_eq!(status, 200);
    assert_eq!(c["status"], "cancelling");
    assert!(c["cancelling_at"].is_u64());
    let done = wait_status(&gw.base, KEY_A, id, "cancelled").await;
    let counts = &done["request_counts"];
    assert_eq!(counts["total"], 20);
    assert_eq!(
        counts["completed"].as_u64().unwrap() + counts["failed"].as_u64().unwrap(),
        20
    );
    let ran = counts["completed"].as_u64().unwrap();
    assert!(ran < 20, "cancel stopped nothing: {done}");
    assert_eq!(gw.mock.request_count() as u64, ran);
    assert_errors(&gw, &done, 20 - ran, "batch_cancelled").await;
    // Cancelling again is a no-op; billed items are the ones that ran.
    assert_eq!(batch_charges(&gw, id, ran as usize).await.len() as u64, ran);
}

/// `completion_window` passes: what ran is in the output, the rest is reported `batch_expired`,
/// the batch ends `expired`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_window_expires_the_rest() {
    let (gw, _dir, id) = slow_batch(1, "e", 30, 300, "2s").await;
    let id = id.as_str();
    let done = wait_status(&gw.base, KEY_A, id, "expired").await;
    assert!(done["expired_at"].is_u64());
    let completed = done["request_counts"]["completed"].as_u64().unwrap();
    assert!((1..30).contains(&completed), "{done}");
    assert_eq!(
        done["request_counts"]["failed"].as_u64().unwrap(),
        30 - completed
    );
    assert_errors(&gw, &done, 30 - completed, "batch_expired").await;
}

/// The worker is stopped a third of the way through a 1,000-item batch and a new one started:
/// the batch completes with 1,000 results, each item billed exactly once (exactly one charge
/// row per item in the ledger — none for the tries that failed meanwhile — at the batch rate).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_restart_mid_batch_loses_and_doubles_nothing() {
    let (mut gw, _dir) = gateway(json!({"batch": {"max_in_flight": 32}})).await;
    let batch = submit(
        &gw.base,
        KEY_A,
        &items("w", 1000, "#mock prompt_tokens=10 completion_tokens=2\nhi"),
        "24h",
    )
    .await;
    let id = batch["id"].as_str().unwrap().to_owned();
    wait_completed(&gw.base, KEY_A, &id, 300, false, Duration::from_secs(60)).await;
    gw.worker_shutdown.cancel();
    let fresh = tokio_util::sync::CancellationToken::new();
    spawn_worker(&gw, gw.config.clone(), "worker-b", fresh.clone()).await;
    gw.worker_shutdown = fresh;
    let (_, out) = finished(&gw.base, KEY_A, &id, 1000).await;
    let ids: std::collections::BTreeSet<String> = out
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!((out.len(), ids.len()), (1000, 1000));
    // Exactly one charge row per item (a try that failed while the worker was away left none),
    // the one its result names, at the batch rate: 1,000 × (10 × 2.5 + 2 × 10) / 1M × 50 %.
    assert_billed_once(&gw, &id, &out, "0.0225").await;
}

/// Anthropic Message Batches on the same machinery: create, retrieve, results as JSONL matched
/// by `custom_id`, served by an OpenAI-style target as well as an Anthropic one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_message_batches_round_trip() {
    let (gw, _dir) = gateway(json!({})).await;
    let req = |cid: &str, model: &str| {
        json!({"custom_id": cid, "params": {"model": model, "max_tokens": 64,
            "messages": [{"role": "user", "content": "#mock prompt_tokens=7 completion_tokens=3\nHello"}]}})
    };
    let (status, b) = call(
        reqwest::Method::POST,
        format!("{}/v1/messages/batches", gw.base),
        KEY_A,
        Some(json!({"requests": [req("one", "demo/claude"), req("two", "gpt-t")]})),
    )
    .await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["type"], "message_batch");
    assert_eq!(b["processing_status"], "in_progress");
    let id = b["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("msgbatch_"));
    let done = eventually(Duration::from_secs(30), || {
        let (base, id) = (gw.base.clone(), id.clone());
        async move {
            let (_, b) = get_as(format!("{base}/v1/messages/batches/{id}"), KEY_A).await;
            (b["processing_status"] == "ended").then_some(b)
        }
    })
    .await;
    assert_eq!(
        done["request_counts"],
        json!({"processing": 0, "succeeded": 2, "errored": 0, "canceled": 0, "expired": 0})
    );
    let url = done["results_url"].as_str().unwrap();
    let text = reqwest::Client::new()
        .get(url)
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let results = lines(&text);
    assert_eq!(results.len(), 2);
    for r in &results {
        assert_eq!(r["result"]["type"], "succeeded");
        assert_eq!(r["result"]["message"]["type"], "message");
        assert_eq!(r["result"]["message"]["usage"]["output_tokens"], 3);
    }
    // Invalid requests: a 400 in Anthropic's envelope naming each, nothing runs.
    let before = gw.mock.request_count();
    let (status, e) = call(
        reqwest::Method::POST,
        format!("{}/v1/messages/batches", gw.base),
        KEY_A,
        Some(json!({"requests": [req("dup", "demo/claude"), req("dup", "demo/claude"),
                                 {"custom_id": "nomax", "params": {"model": "demo/claude", "messages": []}}]})),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    let msg = crate::common::error_message(&e);
    assert!(
        msg.contains("requests.1") && msg.contains("requests.2"),
        "{msg}"
    );
    assert_eq!(gw.mock.request_count(), before);
    // Another tenant: 404 in Anthropic's envelope.
    let (status, e) = get_as(format!("{}/v1/messages/batches/{id}", gw.base), KEY_B).await;
    assert_eq!(status, 404);
    assert_eq!(e["error"]["type"], "not_found_error");
}

/// A batch against a target with `rpm: 10` uses at most half of it: while the batch waits for
/// its share, five live requests in the same minute all get 200 (none pushed into a 429), and
/// the batch ran at most 5 items.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_leaves_live_traffic_its_share_of_the_target_limits() {
    let (gw, _dir) = gateway(json!({
        "targets": [
            {"id": "t", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "gpt-t-upstream",
             "limits": {"rpm": 10}}
        ],
        "models": [{"id": "gpt-t", "targets": ["t"]}]
    }))
    .await;
    let batch = submit(&gw.base, KEY_A, &items("r", 30, "hi"), "24h").await;
    let id = batch["id"].as_str().unwrap().to_owned();
    // The batch takes its 5 RPM tokens, then waits (429s are retried, not results).
    wait_completed(&gw.base, KEY_A, &id, 5, false, Duration::from_secs(30)).await;
    for _ in 0..5 {
        let (status, body) = call(
            reqwest::Method::POST,
            format!("{}/v1/chat/completions", gw.base),
            KEY_B,
            Some(json!({"model": "gpt-t", "messages": [{"role": "user", "content": "live"}]})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let b = retrieve(&gw.base, KEY_A, &id).await;
    assert_eq!(b["status"], "in_progress");
    assert_eq!(b["request_counts"]["completed"], 5);
    assert_eq!(b["request_counts"]["failed"], 0);
}

/// An embeddings batch: the output lines carry the live `/v1/embeddings` body, and the usage
/// rows are the batch's, with the key's tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_batch_returns_live_bodies() {
    let (gw, _dir) = gateway(json!({})).await;
    let bodies = ["alpha beta", "gamma"]
        .map(|text| json!({"model": "gpt-t", "input": text, "dimensions": 4}));
    let (id, done, out) = run_batch(&gw.base, "/v1/embeddings", "e", &bodies).await;
    let id = id.as_str();
    let e0 = out.iter().find(|l| l["custom_id"] == "e0").unwrap();
    assert_eq!(e0["response"]["body"]["object"], "list");
    assert_eq!(
        e0["response"]["body"]["data"][0]["embedding"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    assert_eq!(e0["response"]["body"]["usage"]["prompt_tokens"], 2);
    assert_eq!(done["usage"]["input_tokens"], 3);
    assert_eq!(batch_charges(&gw, id, 2).await.len(), 2);
}

/// A Responses API batch (`endpoint: /v1/responses`): each output line is the live `response`
/// object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_batch_returns_response_objects() {
    let (gw, _dir) = gateway(json!({})).await;
    let bodies = [(); 3].map(|()| {
        json!({"model": "gpt-t", "input": "#mock prompt_tokens=5 completion_tokens=2\nhello",
               "store": false})
    });
    let (_, done, out) = run_batch(&gw.base, "/v1/responses", "r", &bodies).await;
    for l in &out {
        let body = &l["response"]["body"];
        assert_eq!(body["object"], "response");
        assert_eq!(body["status"], "completed");
        assert_eq!(body["usage"]["input_tokens"], 5);
        assert_eq!(body["usage"]["output_tokens"], 2);
    }
    assert_eq!(done["usage"]["input_tokens"], 15);
    assert_eq!(done["usage"]["output_tokens"], 6);
}
