//! Batch jobs under restarts and load: nats-server restarted in the middle of a batch (each
//! item billed once, provider calls bounded by the in-flight window), the ingress running a
//! batch restarted in the middle of it (every item run and billed once), a finished batch read
//! 1,000 times at once through two ingress processes (never billed again), concurrent creates
//! from two ingress processes for two tenants (each sees only its own), and list pages with exact
//! cursors (`after`, `limit`, `has_more`, `first_id` / `last_id`, `before_id`, `order=asc`).

use crate::batch::{
    KEY_A, KEY_B, assert_billed_once, call, content, create_batch, file_lines, finished, gateway,
    items, line, lines, submit, try_retrieve, upload, wait_completed,
};
use crate::common::{Gateway, eventually, get_as, spawn_ingress};
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::str::FromStr;
use std::time::Duration;

/// A batch of `n` items (custom ids `{prefix}0…`, 20 ms each, 10 + 2 tokens) of tenant A, once
/// 100 of them have completed (reads failing meanwhile count as not yet): its id.
async fn submit_and_run_100(base: &str, prefix: &str, n: usize) -> String {
    let input = items(
        prefix,
        n,
        "#mock ttft_ms=20 prompt_tokens=10 completion_tokens=2\nhi",
    );
    let batch = submit(base, KEY_A, &input, "24h").await;
    let id = batch["id"].as_str().unwrap().to_owned();
    wait_completed(base, KEY_A, &id, 100, true, Duration::from_secs(60)).await;
    id
}

async fn get(base: &str, key: &str, path: &str) -> Value {
    let (status, v) = get_as(format!("{base}{path}"), key).await;
    assert_eq!(status, 200, "{path}: {v}");
    v
}

/// Asserts that `GET {path}` (200) lists exactly `want`, newest first unless asked otherwise, with
/// `first_id` / `last_id` naming its ends and `has_more` = `more`.
async fn page(base: &str, key: &str, path: &str, want: &[&String], more: bool) {
    let list = get(base, key, path).await;
    assert_eq!(
        ids(&list),
        want.iter().map(|s| (*s).clone()).collect::<Vec<_>>(),
        "{path}"
    );
    assert_eq!(list["first_id"], json!(want.first()));
    assert_eq!(list["last_id"], json!(want.last()));
    assert_eq!(list["has_more"], more);
}

fn ids(list: &Value) -> Vec<String> {
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect()
}

/// nats-server is killed and restarted (same port, same JetStream store) a quarter of the way
/// through a 400-item batch: the batch completes with 400 results, the ledger holds exactly one
/// `ok` charge per item (the one its result names) summing to the exact batch-rate cost, and the
/// provider saw at most the items plus twice the in-flight window (`batch.max_in_flight` = 16):
/// an item whose result was stored before the restart is not dispatched again when its message
/// is redelivered; only items in flight across the restart run again (a lost answer retried,
/// and a try that finished while NATS was away redelivered), and each of its calls left exactly
/// one `upstream` ledger row (a run again numbers its attempts after the earlier runs').
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nats_restart_mid_batch_bills_once_and_reruns_at_most_the_window() {
    const ITEMS: usize = 400;
    let (mut gw, _dir) = gateway(json!({"batch": {"max_in_flight": 16, "ack_wait_s": 3}})).await;
    let id = submit_and_run_100(&gw.base, "n", ITEMS).await;
    gw.nats.restart().unwrap();
    let done = eventually(Duration::from_secs(90), || {
        let (base, id) = (gw.base.clone(), id.clone());
        async move {
            let b = try_retrieve(&base, KEY_A, &id).await?;
            (b["status"] == "completed").then_some(b)
        }
    })
    .await;
    assert_eq!(
        done["request_counts"],
        json!({"total": ITEMS, "completed": ITEMS, "failed": 0})
    );
    let out = file_lines(&gw.base, KEY_A, &done, "output_file_id").await;
    assert_one_line_per_item(&out, ITEMS);
    // 400 × (10 × 2.5 + 2 × 10) / 1M × 50 %.
    assert_billed_once(&gw, &id, &out, "0.009").await;
    // Every upstream row (the lost answers' included) joins its item's one charge row:
    // reconciliation finds nothing.
    let ledger = gw.ledger.clone().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let r = loop {
        let r = switchyard_billing::reconcile(&ledger, 0, u64::MAX, 1000)
            .await
            .unwrap();
        if r.counts.total() == 0 || tokio::time::Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(r.rows, Vec::new(), "reconciliation findings after 30 s");
    assert_eq!(r.requests, ITEMS as u64);
    let calls = gw.mock.request_count();
    assert!(
        (ITEMS..=ITEMS + 2 * 16).contains(&calls),
        "{calls} upstream calls for {ITEMS} items"
    );
    assert_one_usage_row_per_call(&gw).await;
}

/// Every call the mock upstream received left exactly one `upstream` ledger row: per request id
/// (the `X-Request-Id` the worker sends), the calls equal the rows, within 30 s (a row spooled
/// while NATS was away arrives at the spool's next retry).
async fn assert_one_usage_row_per_call(gw: &Gateway) {
    let mut calls: std::collections::BTreeMap<String, i64> = Default::default();
    for r in gw.mock.requests() {
        let id = r.header("x-request-id").expect("X-Request-Id").to_owned();
        *calls.entry(id).or_default() += 1;
    }
    let ledger = gw.ledger.clone().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let rows: std::collections::BTreeMap<String, i64> = sqlx::query_as(
            "SELECT request_id, COUNT(*) FROM usage_events WHERE kind = 'upstream' \
             GROUP BY request_id",
        )
        .fetch_all(ledger.pool())
        .await
        .unwrap()
        .into_iter()
        .collect();
        if rows == calls {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let differ: Vec<_> = calls
                .iter()
                .filter(|(id, n)| rows.get(*id) != Some(*n))
                .map(|(id, n)| (id, *n, rows.get(id).copied().unwrap_or(0)))
                .collect();
            panic!("(request, calls, upstream rows) that differ after 30 s: {differ:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// 200 concurrent run claims of one item, from two connections (two ingress processes' worth),
/// get the numbers 0‥199 once each; 1,000 concurrent claims over 250 items get 0‥3 per item; an
/// item first run at try 3 starts at run 3; the run counters
/// are not results (progress and results read none) and go with the batch's purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_claims_are_unique_across_replicas() {
    use switchyard_ingress::batch::store::BatchStore;
    let (gw, _dir) = gateway(json!({})).await;
    let prefix = gw.config.get().subject_prefix.clone();
    let mut stores = Vec::new();
    for _ in 0..2 {
        let client = gw.nats_as(switchyard::nats_auth::Identity::Ingress).await;
        let js = async_nats::jetstream::new(client);
        stores.push(BatchStore::open(&js, &prefix).await.unwrap());
    }
    let claims = futures::future::join_all((0..200).map(|i| {
        let store = stores[i % 2].clone();
        async move { store.claim_run("batch_claims", 7, 0).await.unwrap() }
    }))
    .await;
    let got: BTreeSet<u32> = claims.iter().copied().collect();
    assert_eq!(got, (0..200).collect::<BTreeSet<u32>>());
    assert_eq!(claims.len(), 200);
    // 1,000 claims at once over 250 items, four each, from both connections: each item's
    // claimants get 0‥3.
    let claims = futures::future::join_all((0..1000u64).map(|i| {
        let store = stores[(i % 2) as usize].clone();
        async move {
            (
                i / 4,
                store.claim_run("batch_many", i / 4, 0).await.unwrap(),
            )
        }
    }))
    .await;
    let mut per_item: std::collections::BTreeMap<u64, BTreeSet<u32>> = Default::default();
    for (item, run) in claims {
        assert!(
            per_item.entry(item).or_default().insert(run),
            "run {run} of item {item} twice"
        );
    }
    assert_eq!(per_item.len(), 250);
    assert!(per_item.values().all(|runs| *runs == (0..4).collect()));
    assert_eq!(stores[0].claim_run("batch_claims", 8, 3).await.unwrap(), 3);
    assert_eq!(stores[1].claim_run("batch_claims", 8, 0).await.unwrap(), 4);
    assert!(stores[0].progress("batch_claims").await.unwrap().is_empty());
    assert!(stores[0].results("batch_claims").await.unwrap().is_empty());
    stores[0].purge_results("batch_claims").await.unwrap();
    assert_eq!(stores[1].claim_run("batch_claims", 7, 0).await.unwrap(), 0);
}

/// Starts an ingress process's worth of state that runs batch items (its own config handle
/// with `batch.run` on, while the gateway's own ingress has it off), served until `stop`; the
/// handle ends once its drain (and its runner's items in flight) finished.
async fn spawn_runner_ingress(
    gw: &Gateway,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let mut config = (*gw.config.get()).clone();
    config.batch.run = true;
    let client = gw.nats_as(switchyard::nats_auth::Identity::Ingress).await;
    let state = switchyard_ingress::state_with(
        client,
        switchyard_schemas::config::ConfigHandle::new(config),
        &format!("ingress-{}", uuid::Uuid::now_v7().simple()),
        switchyard_ingress::Wiring {
            spool: Some(gw.spool.clone()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    tokio::spawn(async move {
        switchyard_ingress::serve(listener, state, stop.cancelled_owned())
            .await
            .unwrap();
    })
}

/// The only ingress running a 300-item batch is restarted (drained and replaced by a new one)
/// a third of the way through: the batch completes with 300 results, each item billed exactly
/// once, and the provider saw exactly 300 calls — a drain lets the items in flight finish and
/// leaves the rest on the queue for the next runner. (A SIGKILLed ingress: the e2e chaos test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ingress_restart_mid_batch_runs_every_item_once() {
    const ITEMS: usize = 300;
    let (gw, _dir) =
        gateway(json!({"batch": {"run": false, "max_in_flight": 16, "ack_wait_s": 3}})).await;
    let first = tokio_util::sync::CancellationToken::new();
    let runner = spawn_runner_ingress(&gw, first.clone()).await;
    let id = submit_and_run_100(&gw.base, "g", ITEMS).await;
    first.cancel();
    tokio::time::timeout(Duration::from_secs(60), runner)
        .await
        .unwrap()
        .unwrap();
    let stopped = crate::batch::retrieve(&gw.base, KEY_A, &id).await;
    assert_eq!(stopped["status"], "in_progress");
    let second = tokio_util::sync::CancellationToken::new();
    let _runner = spawn_runner_ingress(&gw, second.clone()).await;
    let (_, out) = finished(&gw.base, KEY_A, &id, ITEMS).await;
    assert_one_line_per_item(&out, ITEMS);
    // 300 × (10 × 2.5 + 2 × 10) / 1M × 50 %.
    assert_billed_once(&gw, &id, &out, "0.00675").await;
    assert_eq!(gw.mock.request_count(), ITEMS);
    second.cancel();
}

/// Asserts the output `out` has `items` lines, each of its own item (custom id).
fn assert_one_line_per_item(out: &[Value], items: usize) {
    let cids: BTreeSet<&str> = out
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    assert_eq!((out.len(), cids.len()), (items, items));
}

async fn key_spend(gw: &Gateway, key_id: &str) -> Decimal {
    crate::common::settled_budget(gw, "key", key_id)
        .await
        .day_usd
}

/// FC-33 at scale: a finished 3-item batch is read 1,000 times at once — the batch object and
/// its output file's content, half through each of two ingress processes — and every read is a
/// 200 with the same body; the key's spend stays exactly what the three items cost and the
/// ledger gains no row. Then 2 tenants × 20 one-item batches are created at once, alternating
/// ingress processes: each tenant's list pages through exactly its own 20, the other tenant's
/// ids are 404 for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_and_creates_at_scale_through_two_ingress() {
    let (gw, _dir) = gateway(json!({
        "keys": [
            {"id": "ka", "tenant": "a", "key": KEY_A, "budget": {"daily_usd": "100"}},
            {"id": "kb", "tenant": "b", "key": KEY_B}
        ]
    }))
    .await;
    let (second, _) = spawn_ingress(&gw).await;
    let input: Vec<String> = (0..3)
        .map(|i| {
            line(
                &format!("r{i}"),
                "#mock prompt_tokens=10 completion_tokens=2\nhi",
            )
        })
        .collect();
    let file = upload(&gw.base, KEY_A, &input.join("\n")).await;
    let batch = create_batch(&second, KEY_A, file["id"].as_str().unwrap(), "24h").await;
    let id = batch["id"].as_str().unwrap().to_owned();
    let done = crate::batch::wait_status(&gw.base, KEY_A, &id, "completed").await;
    let out_id = done["output_file_id"].as_str().unwrap().to_owned();
    let out = lines(&content(&gw.base, KEY_A, &out_id).await);
    // 3 × (10 × 2.5 + 2 × 10) / 1M × 50 %.
    assert_billed_once(&gw, &id, &out, "0.0000675").await;
    let spend = key_spend(&gw, "ka").await;
    assert_eq!(spend, Decimal::from_str("0.0000675").unwrap());
    let ledger_rows = || async {
        sqlx::query_as::<_, (i64,)>("SELECT COUNT(*) FROM usage_events")
            .fetch_one(gw.ledger.as_ref().unwrap().pool())
            .await
            .unwrap()
            .0
    };
    let rows_before = ledger_rows().await;

    let client = reqwest::Client::new();
    let reads = (0..1000).map(|i| {
        let base = if i % 2 == 0 { &gw.base } else { &second };
        let url = if i % 4 < 2 {
            format!("{base}/v1/batches/{id}")
        } else {
            format!("{base}/v1/files/{out_id}/content")
        };
        let req = client.get(url).bearer_auth(KEY_A);
        async move {
            let resp = req.send().await.unwrap();
            (
                i % 4 < 2,
                resp.status().as_u16(),
                resp.text().await.unwrap(),
            )
        }
    });
    let answers = futures::future::join_all(reads).await;
    let mut bodies = (BTreeSet::new(), BTreeSet::new());
    for (is_batch, status, body) in &answers {
        assert_eq!(*status, 200, "{body}");
        if *is_batch {
            bodies.0.insert(body.clone());
        } else {
            bodies.1.insert(body.clone());
        }
    }
    assert_eq!((bodies.0.len(), bodies.1.len()), (1, 1));
    let read: Value = serde_json::from_str(bodies.0.first().unwrap()).unwrap();
    assert_eq!(read["status"], "completed");
    assert_eq!(
        read["request_counts"],
        json!({"total": 3, "completed": 3, "failed": 0})
    );
    assert_eq!(lines(bodies.1.first().unwrap()).len(), 3);
    assert_eq!(key_spend(&gw, "ka").await, spend);
    assert_eq!(ledger_rows().await, rows_before);

    // Concurrent creates: 2 tenants × 20, alternating ingress processes.
    let creates = (0..40).map(|i| {
        let (key, base) = (
            if i % 2 == 0 { KEY_A } else { KEY_B },
            if i % 4 < 2 {
                gw.base.clone()
            } else {
                second.clone()
            },
        );
        async move {
            let f = upload(&base, key, &line(&format!("c{i}"), "hello")).await;
            let b = create_batch(&base, key, f["id"].as_str().unwrap(), "24h").await;
            (key, b["id"].as_str().unwrap().to_owned())
        }
    });
    let created = futures::future::join_all(creates).await;
    for (key, other, base) in [(KEY_A, KEY_B, &gw.base), (KEY_B, KEY_A, &second)] {
        let own: BTreeSet<String> = created
            .iter()
            .filter(|c| c.0 == key)
            .map(|c| c.1.clone())
            .collect();
        let mut seen = Vec::new();
        let mut after = String::new();
        loop {
            let page = get(base, key, &format!("/v1/batches?limit=7{after}")).await;
            let page_ids = ids(&page);
            assert_eq!(page["first_id"], json!(page_ids.first()));
            assert_eq!(page["last_id"], json!(page_ids.last()));
            seen.extend(page_ids.clone());
            if !page["has_more"].as_bool().unwrap() {
                break;
            }
            after = format!("&after={}", page_ids.last().unwrap());
        }
        let mut want: Vec<String> = own.iter().cloned().collect();
        if key == KEY_A {
            want.push(id.clone());
        }
        // Every own batch once (A also has the read batch above), nothing else.
        assert_eq!(seen.len(), want.len());
        assert_eq!(
            seen.iter().cloned().collect::<BTreeSet<_>>(),
            want.into_iter().collect::<BTreeSet<_>>()
        );
        let foreign = created.iter().find(|c| c.0 == other).unwrap();
        let (status, _) = get_as(format!("{base}/v1/batches/{}", foreign.1), key).await;
        assert_eq!(status, 404);
    }
}

/// Lists page from a per-tenant index, newest first, with exact cursors: five batches and
/// their five input files of tenant A, three Anthropic message batches; tenant B sees none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_page_with_exact_cursors() {
    let (gw, _dir) = gateway(json!({})).await;
    let (mut files, mut batches) = (Vec::new(), Vec::new());
    for i in 0..5 {
        let f = upload(
            &gw.base,
            KEY_A,
            &line(&format!("p{i}"), "#mock ttft_ms=5000\nslow"),
        )
        .await;
        let id = f["id"].as_str().unwrap().to_owned();
        let b = create_batch(&gw.base, KEY_A, &id, "24h").await;
        files.push(id);
        batches.push(b["id"].as_str().unwrap().to_owned());
    }
    let b = &batches;
    for (key, path, want, more) in [
        (
            KEY_A,
            "/v1/batches?limit=2".to_owned(),
            vec![&b[4], &b[3]],
            true,
        ),
        (
            KEY_A,
            format!("/v1/batches?limit=2&after={}", b[3]),
            vec![&b[2], &b[1]],
            true,
        ),
        (
            KEY_A,
            format!("/v1/batches?limit=2&after={}", b[1]),
            vec![&b[0]],
            false,
        ),
        (
            KEY_A,
            format!("/v1/batches?limit=2&after={}", b[0]),
            vec![],
            false,
        ),
        (
            KEY_A,
            "/v1/batches".to_owned(),
            vec![&b[4], &b[3], &b[2], &b[1], &b[0]],
            false,
        ),
        // Another tenant's cursor and list: nothing.
        (KEY_B, format!("/v1/batches?after={}", b[3]), vec![], false),
        (KEY_B, "/v1/batches".to_owned(), vec![], false),
        (KEY_B, "/v1/files".to_owned(), vec![], false),
    ] {
        page(&gw.base, key, &path, &want, more).await;
    }

    let f = &files;
    let asc_after =
        |after: &String| format!("/v1/files?purpose=batch&order=asc&limit=2&after={after}");
    for (path, want, more) in [
        (
            "/v1/files?purpose=batch&limit=2".to_owned(),
            vec![&f[4], &f[3]],
            true,
        ),
        (
            "/v1/files?purpose=batch&order=asc&limit=2".to_owned(),
            vec![&f[0], &f[1]],
            true,
        ),
        (asc_after(&f[1]), vec![&f[2], &f[3]], true),
        (asc_after(&f[3]), vec![&f[4]], false),
    ] {
        page(&gw.base, KEY_A, &path, &want, more).await;
    }
    // A deleted file leaves the listing; the pages around it close up.
    let (status, _) = call(
        reqwest::Method::DELETE,
        format!("{}/v1/files/{}", gw.base, f[2]),
        KEY_A,
        None,
    )
    .await;
    assert_eq!(status, 200);
    page(&gw.base, KEY_A, &asc_after(&f[1]), &[&f[3], &f[4]], false).await;

    // Anthropic message batches: their own listing, `after_id` and `before_id`.
    let mut m = Vec::new();
    for i in 0..3 {
        let (status, v) = call(
            reqwest::Method::POST,
            format!("{}/v1/messages/batches", gw.base),
            KEY_A,
            Some(
                json!({"requests": [{"custom_id": format!("m{i}"), "params": {
                "model": "demo/claude", "max_tokens": 16,
                "messages": [{"role": "user", "content": "#mock ttft_ms=5000\nslow"}]}}]}),
            ),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        m.push(v["id"].as_str().unwrap().to_owned());
    }
    let messages = "/v1/messages/batches";
    for (path, want, more) in [
        (format!("{messages}?limit=2"), vec![&m[2], &m[1]], true),
        (
            format!("{messages}?limit=2&after_id={}", m[1]),
            vec![&m[0]],
            false,
        ),
        (
            format!("{messages}?limit=1&before_id={}", m[0]),
            vec![&m[1]],
            true,
        ),
        (
            format!("{messages}?limit=5&before_id={}", m[0]),
            vec![&m[2], &m[1]],
            false,
        ),
    ] {
        page(&gw.base, KEY_A, &path, &want, more).await;
    }
    // Each API lists only its own batches.
    let l = get(&gw.base, KEY_A, "/v1/batches?limit=100").await;
    assert_eq!(ids(&l).len(), 5);
}
