//! The usage stream sized for production: per-kind subjects (bounded subject count), work-queue
//! retention (stored events leave the stream), and the migration of a legacy `SY_USAGE` stream.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods, reason = "tasks end with their test")]

mod common;

use async_nats::jetstream::{self, stream::Stream};
use common::{NatsServer, wait_until};
use std::time::Duration;
use switchyard_billing::{BillingService, Ledger, ensure_usage_stream};
use switchyard_publish::UsagePublisher;
use switchyard_publish::publish_usage_event;
use switchyard_schemas::subjects::{BILLING_CONSUMER, LEGACY_USAGE_STREAM, Subjects, USAGE_STREAM};
use switchyard_schemas::usage::{Usage, UsageEvent, UsageKind};
use tokio::sync::oneshot;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

fn event(kind: UsageKind, request_id: Uuid, i: u64) -> UsageEvent {
    UsageEvent {
        request_id,
        key_id: Some("key-1".into()),
        model: "demo/mock".into(),
        target: Some("mock".into()),
        upstream_model: Some("mock".into()),
        usage: Usage {
            prompt_tokens: 10 + i % 7,
            completion_tokens: 1 + i % 5,
            ..Usage::default()
        },
        ttft_ms: Some(3),
        latency_ms: 5,
        ..common::event(kind, 1_750_000_000_000 + i)
    }
}

/// `n` requests' events: a charge and an upstream event each.
fn events(n: u64) -> Vec<UsageEvent> {
    (0..n)
        .flat_map(|i| {
            let id = Uuid::now_v7();
            [
                event(UsageKind::Charge, id, i),
                event(UsageKind::Upstream, id, i),
            ]
        })
        .collect()
}

/// Publishes every event through the producers' publisher, 64 at a time.
async fn publish_all(js: &jetstream::Context, subjects: &Subjects, events: &[UsageEvent]) {
    for chunk in events.chunks(64) {
        let stored = futures::future::join_all(
            chunk
                .iter()
                .map(|e| publish_usage_event(js, None, subjects, e)),
        )
        .await;
        assert!(stored.iter().all(|s| *s), "every event acknowledged");
    }
}

/// Runs billing until the ledger holds `rows` and the stream is empty, then stops it.
async fn bill_until_drained(
    client: async_nats::Client,
    ledger: &Ledger,
    stream: &Stream,
    rows: u64,
) {
    let (stop, stopped) = oneshot::channel::<()>();
    let service = BillingService::new(client, Subjects::default(), ledger.clone());
    let task = tokio::spawn(service.run(async move {
        let _ = stopped.await;
    }));
    wait_until(&format!("{rows} ledger rows"), WAIT, || async {
        ledger.count().await.unwrap() == rows
    })
    .await;
    // Acks follow the commit; the work queue removes each acked event.
    wait_until("the usage stream to empty", WAIT, || async {
        let mut stream = stream.clone();
        stream.info().await.unwrap().state.messages == 0
    })
    .await;
    let _ = stop.send(());
    tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// N requests' events leave 2 subjects (one per kind) in the stream, whatever N; once billing
/// stored them they are gone from the stream (messages 0, bytes 0) and the ledger holds each once.
#[tokio::test]
async fn subjects_stay_bounded_and_stored_events_leave_the_stream() {
    const N: u64 = 1_000;
    let (_nats, client, js, subjects, mut stream) = common::usage_stream().await;

    let all = events(N);
    publish_all(&js, &subjects, &all).await;
    let state = stream.info().await.unwrap().state.clone();
    assert_eq!(state.messages, 2 * N);
    assert!(
        state.subjects_count <= 2,
        "{} subjects for {N} requests",
        state.subjects_count
    );
    // A re-publish (a producer retry) is dropped by the Nats-Msg-Id de-duplication.
    publish_all(&js, &subjects, &all[..10]).await;
    assert_eq!(stream.info().await.unwrap().state.messages, 2 * N);

    let (_dir, ledger) = common::sqlite_ledger().await;
    bill_until_drained(client, &ledger, &stream, 2 * N).await;
    let state = stream.info().await.unwrap().state.clone();
    assert_eq!((state.messages, state.bytes), (0, 0));
    assert_eq!(state.last_sequence, 2 * N);
    let info = stream.consumer_info(BILLING_CONSUMER).await.unwrap();
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));
}

/// Two producers' [`UsagePublisher`]s (as two ingress or worker processes) publishing 2,000
/// events each, 4,000 at once: the stream holds far fewer messages than events (JSON arrays of
/// up to 256), billing stores every event exactly once, and a closed publisher still stores.
#[tokio::test]
async fn batched_publishers_store_every_event_once_in_few_messages() {
    const N: u64 = 1_000;
    let (_nats, client, js, subjects, mut stream) = common::usage_stream().await;
    let producers = [
        UsagePublisher::start(js.clone(), subjects.clone(), None),
        UsagePublisher::start(js.clone(), subjects.clone(), None),
    ];
    let all = events(2 * N);
    let stored = futures::future::join_all(
        all.iter()
            .enumerate()
            .map(|(i, e)| producers[i % 2].publish(e.clone())),
    )
    .await;
    assert!(stored.iter().all(|s| *s), "every event stored");
    let messages = stream.info().await.unwrap().state.messages;
    assert!(
        messages <= 4 * N / 20,
        "{messages} messages for {} events",
        4 * N
    );
    for p in &producers {
        p.close().await;
    }
    // After close an event is published on its own, still stored.
    let late = events(1);
    assert!(producers[0].publish(late[0].clone()).await);

    let (_dir, ledger) = common::sqlite_ledger().await;
    bill_until_drained(client, &ledger, &stream, 4 * N + 1).await;
    let info = stream.consumer_info(BILLING_CONSUMER).await.unwrap();
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));
    for e in all.iter().step_by(397) {
        let rows = ledger.usage_for(e.request_id).await.unwrap();
        assert_eq!(rows.len(), 2, "charge and upstream of {}", e.request_id);
    }
}

/// An existing deployment's `SY_USAGE` (limits retention, a subject per request) whose
/// `billing` consumer acked the first K events: start-up retires it, copies the rest into the
/// work queue, deletes it; billing then stores exactly the events it had not stored before.
#[tokio::test]
async fn legacy_stream_is_migrated_without_loss_or_double_count() {
    const TOTAL: usize = 300;
    const ACKED: usize = 120;
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = jetstream::new(client.clone());
    let subjects = Subjects::default();

    // The old configuration, as earlier versions created it.
    let legacy = js
        .create_stream(jetstream::stream::Config {
            name: LEGACY_USAGE_STREAM.into(),
            subjects: vec![subjects.usage_all()],
            retention: jetstream::stream::RetentionPolicy::Limits,
            max_age: Duration::from_secs(7 * 86_400),
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .unwrap();
    let all = events(TOTAL as u64 / 2);
    for e in &all {
        let subject = subjects.usage(e.kind.as_str(), &e.request_id.to_string());
        let mut headers = async_nats::HeaderMap::new();
        let id = format!("{}:{}:{}", e.request_id, e.kind.as_str(), e.attempt);
        headers.insert("Nats-Msg-Id", id.as_str());
        let payload = serde_json::to_vec(e).unwrap().into();
        js.publish_with_headers(subject, headers, payload)
            .await
            .unwrap()
            .await
            .unwrap();
    }
    // The old billing stored (ledger) and acked the first ACKED events.
    let (_dir, ledger) = common::sqlite_ledger().await;
    ledger.insert_batch(&all[..ACKED]).await.unwrap();
    let old = legacy
        .create_consumer(switchyard_billing::stream::billing_consumer_config(
            10_000,
            Duration::from_secs(30),
        ))
        .await
        .unwrap();
    let mut batch = old.fetch().max_messages(ACKED).messages().await.unwrap();
    let mut acked = 0;
    while let Some(m) = futures::StreamExt::next(&mut batch).await {
        m.unwrap().ack().await.unwrap();
        acked += 1;
    }
    assert_eq!(acked, ACKED);
    wait_until("the old consumer's ack floor", WAIT, || async {
        legacy
            .consumer_info(BILLING_CONSUMER)
            .await
            .is_ok_and(|i| i.ack_floor.stream_sequence == ACKED as u64)
    })
    .await;

    let mut stream = ensure_usage_stream(&js, &subjects).await.unwrap();
    assert_eq!(stream.cached_info().config.name, USAGE_STREAM);
    assert!(
        js.get_stream(LEGACY_USAGE_STREAM).await.is_err(),
        "legacy deleted"
    );
    let state = stream.info().await.unwrap().state.clone();
    assert_eq!(
        state.messages,
        (TOTAL - ACKED) as u64,
        "only the unacked ones"
    );
    assert!(state.subjects_count <= 2, "copied onto per-kind subjects");
    // A second start-up finds nothing to migrate.
    ensure_usage_stream(&js, &subjects).await.unwrap();
    assert_eq!(
        stream.info().await.unwrap().state.messages,
        (TOTAL - ACKED) as u64
    );

    bill_until_drained(client, &ledger, &stream, TOTAL as u64).await;
    for e in &all {
        assert_eq!(
            ledger
                .usage_for(e.request_id)
                .await
                .unwrap()
                .iter()
                .filter(|s| s.kind == e.kind)
                .count(),
            1
        );
    }
}

/// VmRSS of the nats-server whose JetStream store is `store`, KiB (Linux `/proc`).
fn nats_rss_kib(store: &std::path::Path) -> Option<u64> {
    let needle = store.to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.starts_with(|c: char| c != '\0')
            && cmdline.contains("nats-server")
            && cmdline.contains(&needle)
        {
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            return status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
        }
    }
    None
}

/// Not a test (no timed or memory assertions): prints nats-server RSS before and after each of
/// 4 rounds of `SWITCHYARD_RSS_REQUESTS` (default 5,000) requests' events, for the legacy layout
/// (limits retention, a subject per request) and the current one (work queue, per-kind
/// subjects, billing running and catching up after each round).
/// `cargo test -p switchyard-billing --test stream -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement, run by hand"]
async fn measure_nats_rss() {
    let n: u64 = std::env::var("SWITCHYARD_RSS_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    // A short duplicate window (`SWITCHYARD_RSS_DUP_S`, with a pause of twice that before each
    // reading) separates the per-subject and message state from the de-duplication ids.
    let dup: Option<u64> = std::env::var("SWITCHYARD_RSS_DUP_S")
        .ok()
        .and_then(|v| v.parse().ok());
    for layout in ["legacy", "work-queue"] {
        let nats = switchyard_natsd::NatsServer::start_temp().unwrap();
        let client = async_nats::connect(nats.url()).await.unwrap();
        let js = jetstream::new(client.clone());
        let subjects = Subjects::default();
        let window = Duration::from_secs(dup.unwrap_or(120));
        let stream = if layout == "legacy" {
            js.create_stream(jetstream::stream::Config {
                name: LEGACY_USAGE_STREAM.into(),
                subjects: vec![subjects.usage_all()],
                max_age: Duration::from_secs(7 * 86_400),
                duplicate_window: window,
                ..Default::default()
            })
            .await
            .unwrap()
        } else {
            js.create_stream(jetstream::stream::Config {
                duplicate_window: window,
                ..switchyard_billing::stream::usage_stream_config(&subjects)
            })
            .await
            .unwrap()
        };
        let (_dir, ledger) = common::sqlite_ledger().await;
        let mut line = format!(
            "{layout}: RSS KiB {:?}",
            nats_rss_kib(nats.store_dir()).unwrap_or(0)
        );
        for round in 1..=4u64 {
            let all = events(n);
            if layout == "legacy" {
                for chunk in all.chunks(64) {
                    let acks = futures::future::join_all(chunk.iter().map(|e| {
                        let mut h = async_nats::HeaderMap::new();
                        let id = format!("{}:{}:{}", e.request_id, e.kind.as_str(), e.attempt);
                        h.insert("Nats-Msg-Id", id.as_str());
                        js.publish_with_headers(
                            subjects.usage(e.kind.as_str(), &e.request_id.to_string()),
                            h,
                            serde_json::to_vec(e).unwrap().into(),
                        )
                    }))
                    .await;
                    for a in acks {
                        a.unwrap().await.unwrap();
                    }
                }
            } else {
                publish_all(&js, &subjects, &all).await;
                bill_until_drained(client.clone(), &ledger, &stream, 2 * n * round).await;
            }
            if let Some(d) = dup {
                tokio::time::sleep(Duration::from_secs(2 * d)).await;
            }
            let mut s = stream.clone();
            let state = s.info().await.unwrap().state.clone();
            line.push_str(&format!(
                " -> {} ({} requests; {} messages, {} subjects)",
                nats_rss_kib(nats.store_dir()).unwrap_or(0),
                n * round,
                state.messages,
                state.subjects_count
            ));
        }
        println!("{line}");
    }
}

/// A JetStream store too small for the usage stream's 1 GiB reservation (a nearly full disk):
/// the stream is still created, bounded by the store instead, and events flow.
#[tokio::test]
async fn a_small_jetstream_store_still_gets_a_usage_stream() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            "jetstream {{ store_dir: \"{}\", max_file_store: 104857600 }}\n",
            dir.path().join("js").display()
        ),
    )
    .unwrap();
    // `-p -1` picks a free port; the ports file says which.
    let ports = dir.path().join("ports");
    std::fs::create_dir_all(&ports).unwrap();
    let mut child = std::process::Command::new(switchyard_natsd::find_binary().unwrap())
        .args([
            "-c",
            &conf.display().to_string(),
            "-a",
            "127.0.0.1",
            "-p",
            "-1",
        ])
        .arg("--ports_file_dir")
        .arg(&ports)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut url = None;
    wait_until("nats-server ports file", WAIT, || {
        let found = std::fs::read_dir(&ports)
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
            .and_then(|e| std::fs::read_to_string(e.path()).ok())
            .and_then(|t| {
                let v: serde_json::Value = serde_json::from_str(&t).ok()?;
                v["nats"][0].as_str().map(str::to_owned)
            });
        let ok = found.is_some();
        url = found;
        async move { ok }
    })
    .await;
    let client = async_nats::connect(url.unwrap()).await.unwrap();
    let js = jetstream::new(client);
    let subjects = Subjects::default();
    let mut stream = ensure_usage_stream(&js, &subjects).await.unwrap();
    assert_eq!(stream.info().await.unwrap().config.max_bytes, -1);
    let e = event(UsageKind::Charge, Uuid::now_v7(), 1);
    publish_usage_event(&js, None, &subjects, &e).await;
    assert_eq!(stream.info().await.unwrap().state.messages, 1);
    let _ = child.kill();
    let _ = child.wait();
}
