//! Flow control end to end (issue 10, deliver 2): clients that open large streams and never read
//! slow only their own upstream calls. Ingress runs as its own process (`switchyard ingress`) so
//! its RSS is measured alone; nats-server, the mock upstream, a worker and billing run here.

use crate::common::{eventually, test_config};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use switchyard_billing::Ledger;
use switchyard_mock::MockUpstream;
use switchyard_schemas::config::ConfigHandle;
use switchyard_schemas::subjects::Subjects;
use switchyard_schemas::usage::UsageStatus;
use switchyard_schemas::{UsageEvent, UsageKind};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};
use tokio_util::sync::CancellationToken;

const NON_READERS: usize = 200;
const ORDINARY: usize = 50;
/// The large stream: 1,024 chunks of 32 bytes (about 200 kB of SSE), many times what the kernel
/// buffers for a client with a small MSS and receive buffer plus the flow-control window.
const BIG_LEN: usize = 32_768;
const BIG_CHUNKS: usize = 1_024;
const SMALL_LEN: usize = 4_000;
const STALL_MS: u64 = 3_000;

/// The mock's `text_len=N` text.
fn lorem(len: usize) -> String {
    "lorem ipsum dolor sit amet "
        .chars()
        .cycle()
        .take(len)
        .collect()
}

/// VmRSS of `pid`, bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

const MB: u64 = 1_048_576;

fn mb(bytes: u64) -> f64 {
    bytes as f64 / MB as f64
}

/// Starts the mock upstream on a runtime of its own; dropping the sender stops it.
fn mock_on_own_thread() -> (String, tokio::sync::oneshot::Sender<()>) {
    let (url_tx, url_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mock = MockUpstream::start().await.unwrap();
            url_tx.send(mock.base_url()).unwrap();
            let _ = stop_rx.await;
        });
    });
    (url_rx.recv().unwrap(), stop_tx)
}

/// The ingress child process and what its log said.
struct Ingress {
    child: tokio::process::Child,
    base: String,
    addr: String,
    slow_consumer_lines: Arc<AtomicUsize>,
}

async fn start_ingress(config_path: &std::path::Path, nats_url: &str) -> Ingress {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("ingress")
        .arg("--config")
        .arg(config_path)
        .args(["--nats-url", nats_url, "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.split("ingress listening on http://").nth(1) {
                return rest.trim().to_owned();
            }
        }
        panic!("ingress exited before listening");
    })
    .await
    .expect("ingress did not start within 30 s");
    let slow = Arc::new(AtomicUsize::new(0));
    let counter = slow.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("slow consumer") {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    Ingress {
        child,
        base: format!("http://{addr}"),
        addr,
        slow_consumer_lines: slow,
    }
}

/// Sends a streaming request for the big model over a socket with a small receive buffer, reads
/// the response headers only and returns the socket (never read again) and the request id.
async fn non_reader(addr: &str) -> (TcpStream, uuid::Uuid) {
    // A small MSS keeps the server's send buffer small (Linux sizes it from the peer's MSS), so
    // the kernel cannot absorb the stream on the client's behalf.
    let raw = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .unwrap();
    raw.set_tcp_mss(536).unwrap();
    raw.set_recv_buffer_size(4096).unwrap();
    raw.set_nonblocking(true).unwrap();
    let socket = TcpSocket::from_std_stream(std::net::TcpStream::from(raw));
    let mut stream = socket.connect(addr.parse().unwrap()).await.unwrap();
    let body = serde_json::json!({"model": "flow/big", "stream": true,
        "messages": [{"role": "user", "content": "never read"}]})
    .to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer sk-test\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    // Byte by byte up to the blank line: nothing of the body is consumed.
    let mut headers = Vec::new();
    while !headers.ends_with(b"\r\n\r\n") {
        headers.push(stream.read_u8().await.unwrap());
    }
    let text = String::from_utf8(headers).unwrap();
    if !text.starts_with("HTTP/1.1 200") {
        let mut body = vec![0; 4096];
        let n = stream.read(&mut body).await.unwrap_or(0);
        panic!("{text}{}", String::from_utf8_lossy(&body[..n]));
    }
    let id = text
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("x-request-id:")
                .map(|v| v.trim().to_owned())
        })
        .unwrap()
        .parse()
        .unwrap();
    (stream, id)
}

/// One ordinary client: a streamed and a non-streamed request, both checked to the byte.
async fn ordinary(http: reqwest::Client, base: String) -> Result<(), String> {
    let want = lorem(SMALL_LEN);
    for stream in [true, false] {
        let body = serde_json::json!({"model": "flow/small", "stream": stream,
            "messages": [{"role": "user", "content": "hello"}]});
        let resp = http
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth("sk-test")
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("{e:?}"))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| format!("{e:?}"))?;
        if status != 200 {
            return Err(format!("status {status}: {text}"));
        }
        let got: String = if stream {
            text.split("\n\n")
                .filter_map(|b| b.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .filter_map(|d| {
                    let v: serde_json::Value = serde_json::from_str(d).ok()?;
                    v.pointer("/choices/0/delta/content")?
                        .as_str()
                        .map(str::to_owned)
                })
                .collect()
        } else {
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            v.pointer("/choices/0/message/content")
                .and_then(|c| c.as_str())
                .unwrap_or_default()
                .to_owned()
        };
        if got != want {
            return Err(format!(
                "stream={stream}: content differs ({} bytes)",
                got.len()
            ));
        }
    }
    Ok(())
}

/// What one round of load showed.
struct Round {
    /// Completion tokens billed per non-reader (estimated).
    billed: Vec<u64>,
    /// Ingress RSS with every non-reader stalled and billed, bytes.
    stalled_rss: u64,
    /// Until the last ordinary client had its answers.
    ordinary_took: Duration,
}

/// [`NON_READERS`] non-readers and [`ORDINARY`] ordinary clients at once. Returns once every
/// non-reader was billed for a stalled upstream call, its socket closed and ingress done with it
/// (its charge row is written when ingress drops the request).
async fn round(ingress: &Ingress, http: &reqwest::Client, ledger: &Ledger) -> Round {
    let started = Instant::now();
    let readers: Vec<_> = (0..NON_READERS)
        .map(|_| {
            let addr = ingress.addr.clone();
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_secs(60), non_reader(&addr))
                    .await
                    .expect("non-reader got no response headers within 60 s")
            })
        })
        .collect();
    let ordinaries: Vec<_> = (0..ORDINARY)
        .map(|_| tokio::spawn(ordinary(http.clone(), ingress.base.clone())))
        .collect();
    let mut errors = Vec::new();
    for o in ordinaries {
        let done = tokio::time::timeout(Duration::from_secs(60), o).await;
        if let Err(e) = done.expect("ordinary client took over 60 s").unwrap() {
            errors.push(e);
        }
    }
    let ordinary_took = started.elapsed();
    let mut held = Vec::new();
    for r in readers {
        held.push(r.await.unwrap());
    }
    assert!(
        errors.is_empty(),
        "{} ordinary clients failed: {errors:?}",
        errors.len()
    );

    // Every non-reader's upstream call ends after the stall deadline, billed for what was sent.
    let full = (BIG_LEN / 4) as u64;
    let mut billed = Vec::new();
    for (_, id) in &held {
        let row = usage_row(ledger, *id, UsageKind::Upstream).await;
        assert!(
            matches!(row.status, UsageStatus::Cancelled | UsageStatus::Error),
            "{row:?}"
        );
        assert!(row.estimated, "{row:?}");
        let c = row.usage.completion_tokens;
        assert!(
            c > 0 && c < full,
            "completion_tokens {c} of {full}: {row:?}"
        );
        assert!(row.latency_ms >= STALL_MS, "{row:?}");
        billed.push(c);
    }
    let stalled_rss = rss(ingress.child.id().unwrap());
    let ids: Vec<_> = held.iter().map(|(_, id)| *id).collect();
    drop(held);
    for id in ids {
        usage_row(ledger, id, UsageKind::Charge).await;
    }
    Round {
        billed,
        stalled_rss,
        ordinary_took,
    }
}

/// Waits (up to 60 s) for the ledger row of `kind` for request `id`.
async fn usage_row(ledger: &Ledger, id: uuid::Uuid, kind: UsageKind) -> UsageEvent {
    eventually(Duration::from_secs(60), || {
        let ledger = ledger.clone();
        async move {
            let rows = ledger.usage_for(id).await.unwrap();
            rows.into_iter().find(|r| r.kind == kind)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_readers_stall_only_their_own_upstream_calls() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = test_config(serde_json::json!({
        // Generous worker timeouts (a clean-clone CI run once saw 250 connects to the mock take
        // over the default 5 s): the machine is shared; only the stall deadline is under test.
        "timeouts": {"first_frame_ms": 20000, "worker_silence_ms": 20000, "heartbeat_ms": 200,
                     "connect_ms": 30000, "stall_ms": STALL_MS},
    }));
    config.data_dir = tmp.path().join("data").display().to_string();
    let mut value = serde_json::to_value(&config).unwrap();
    let targets = value["targets"].as_array_mut().unwrap();
    targets.push(
        serde_json::json!({"id": "big", "provider": "openai", "upstream_model": "mock",
        "base_url": format!("builtin:mock/x/text_len={BIG_LEN},chunks={BIG_CHUNKS}")}),
    );
    targets.push(
        serde_json::json!({"id": "small", "provider": "openai", "upstream_model": "mock",
        "base_url": format!("builtin:mock/x/text_len={SMALL_LEN},chunks=40")}),
    );
    let models = value["models"].as_array_mut().unwrap();
    models.push(serde_json::json!({"id": "flow/big", "targets": ["big"]}));
    models.push(serde_json::json!({"id": "flow/small", "targets": ["small"]}));
    let config: switchyard_schemas::config::GatewayConfig =
        serde_json::from_value(value.clone()).unwrap();
    config.validate().unwrap();
    let config_path = tmp.path().join("config.json");
    std::fs::write(&config_path, serde_json::to_vec_pretty(&value).unwrap()).unwrap();

    let nats = switchyard_natsd::NatsServer::start_temp().unwrap();
    // The mock builds each answer up front: on its own runtime it cannot starve the worker's.
    let (mock_url, _stop_mock) = mock_on_own_thread();
    let handle = ConfigHandle::new(config);
    // Billing and a worker (another process's: its own registry, no spool) run here.
    use switchyard::topology::{BillingLedger, NatsIdentities, Topology, TopologyOptions};
    let mut topology = Topology::start(TopologyOptions {
        url: nats.url(),
        nats: NatsIdentities::Shared(Default::default()),
        subjects: Subjects::new(handle.get().subject_prefix.clone()),
        spool_dir: None,
        usage_stream: true,
        shutdown: CancellationToken::new(),
        stop_all_when_one_ends: false,
    })
    .await
    .unwrap();
    let ledger = switchyard_billing::Ledger::connect(&format!(
        "sqlite://{}/ledger.db?mode=rwc",
        tmp.path().display()
    ))
    .await
    .unwrap();
    let billing = topology
        .start_billing(BillingLedger::Given(ledger.clone()), &handle)
        .await
        .unwrap();
    let _stop_billing = billing.stop.drop_guard();
    let worker = topology
        .start_worker(switchyard::topology::WorkerSpec {
            worker_id: "worker-flow".into(),
            config: handle.clone(),
            providers: Vec::new(),
            builtin_mock_url: Some(format!("{mock_url}/v1")),
            builtin_local_model_url: None,
            shared: false,
        })
        .await
        .unwrap();
    let _stop_worker = worker.stop.drop_guard();

    let mut ingress = start_ingress(&config_path, &nats.url()).await;
    let pid = ingress.child.id().unwrap();
    // Pooled connections are dropped by the client before ingress closes them as idle (10 s),
    // as httpx (5 s) and undici (4 s) do by default: a request written on a connection the
    // server is closing at that instant fails with no answer (the HTTP/1.1 keep-alive race), and
    // the pauses between rounds here are about that long.
    let http = reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    eventually(Duration::from_secs(20), || {
        let (http, base) = (http.clone(), ingress.base.clone());
        async move {
            let r = http.get(format!("{base}/healthz")).send().await.ok()?;
            r.status().is_success().then_some(())
        }
    })
    .await;
    // Warm up (lazy allocations, connection pools), then take the baseline.
    for _ in 0..5 {
        ordinary(http.clone(), ingress.base.clone()).await.unwrap();
    }
    let baseline = rss(pid);

    // Peak RSS while the load runs, sampled by a side task.
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(baseline));
    let sampling = CancellationToken::new();
    {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            while !sampling.is_cancelled() {
                tick.tick().await;
                peak.fetch_max(rss(pid), Ordering::Relaxed);
            }
        });
    }
    let first = round(&ingress, &http, &ledger).await;
    let after_first = rss(pid);
    // The same load again: memory freed by the first round must be reused, not added to.
    let second = round(&ingress, &http, &ledger).await;
    let after_second = rss(pid);
    sampling.cancel();
    let peak = peak
        .load(Ordering::Relaxed)
        .max(first.stalled_rss)
        .max(second.stalled_rss);
    // Still serving normally afterwards.
    ordinary(http.clone(), ingress.base.clone()).await.unwrap();

    let mut billed = first.billed;
    billed.extend(second.billed);
    billed.sort_unstable();
    eprintln!(
        "flow control: ingress RSS baseline {:.1} MB, peak {:.1} MB, with {NON_READERS} stalled \
         clients {:.1} / {:.1} MB, after each round {:.1} / {:.1} MB; ordinary clients done in \
         {:?} / {:?}; completion tokens billed per non-reader min {} median {} max {} of {}",
        mb(baseline),
        mb(peak),
        mb(first.stalled_rss),
        mb(second.stalled_rss),
        mb(after_first),
        mb(after_second),
        first.ordinary_took,
        second.ordinary_took,
        billed[0],
        billed[billed.len() / 2],
        billed[billed.len() - 1],
        BIG_LEN / 4
    );
    assert!(
        peak <= baseline + 100 * MB,
        "ingress RSS grew from {:.1} MB to {:.1} MB",
        mb(baseline),
        mb(peak)
    );
    // glibc keeps freed heap mapped, so RSS does not fall back by itself; what must hold is that
    // a second round finds that memory free again (nothing per client outlives the client).
    assert!(
        after_second <= after_first + 10 * MB,
        "ingress RSS kept growing: {:.1} MB after the first round, {:.1} MB after the second",
        mb(after_first),
        mb(after_second)
    );
    assert_eq!(
        ingress.slow_consumer_lines.load(Ordering::Relaxed),
        0,
        "ingress reported slow consumers"
    );
    ingress.child.start_kill().unwrap();
    let _ = ingress.child.wait().await;
}
