//! Billing under faults (the "Billing" acceptance): the billing consumer killed while 10,000
//! requests flow, the ledger's PostgreSQL stopped for 60 s mid-run, the NATS server restarted.
//! Afterwards every admitted request has exactly one charge row, upstream rows match what the
//! (mock) upstream reported, token totals are exact and reconciliation finds nothing it cannot
//! explain.
//!
//! Each request carries `#mock prompt_tokens=P completion_tokens=C` with P and C derived from its
//! index ([`tokens`]), so every expected total is known exactly; the mock's recorded request
//! bodies say which upstream calls were really made.

use crate::common::{Gateway, metric_value, start_config, test_config};
use futures::StreamExt as _;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use switchyard_billing::reconcile::{RequestRows, load_requests};
use switchyard_billing::{BillingService, DiscrepancyClass, Ledger, ServiceConfig};
use switchyard_schemas::subjects::{BILLING_CONSUMER, Subjects, USAGE_STREAM};
use switchyard_schemas::usage::UsageStatus;
use tokio::sync::watch;
use uuid::Uuid;

/// The token counts request `i` asks the mock to report.
fn tokens(i: u64) -> (u64, u64) {
    (5 + i % 50, 1 + i % 20)
}

/// The chat body of request `i`: a marker the mock records, and the usage it should report.
fn body(i: u64) -> serde_json::Value {
    let (p, c) = tokens(i);
    crate::common::chat(
        "demo/mock",
        &format!("req-{i}-end\n#mock prompt_tokens={p} completion_tokens={c} text=ok"),
        false,
    )
}

/// What one request got.
#[derive(Debug)]
struct Sent {
    i: u64,
    /// HTTP status; 0 when the request itself failed (e.g. the client timeout: a hang).
    status: u16,
    /// `x-request-id` of a 200 answer.
    id: Option<Uuid>,
    error: Option<String>,
}

fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(128)
        .build()
        .unwrap()
}

async fn send(client: &reqwest::Client, base: &str, i: u64) -> Sent {
    let resp = client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth("sk-test")
        .json(&body(i))
        .send()
        .await;
    let resp = match resp {
        Ok(r) => r,
        Err(e) => {
            return Sent {
                i,
                status: 0,
                id: None,
                error: Some(e.to_string()),
            };
        }
    };
    let status = resp.status().as_u16();
    let id = resp
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let text = resp.text().await;
    let error = match (status, text) {
        (200, Ok(t)) => {
            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
            let (p, c) = tokens(i);
            assert_eq!(v["usage"]["prompt_tokens"], p, "{t}");
            assert_eq!(v["usage"]["completion_tokens"], c, "{t}");
            None
        }
        (_, Ok(t)) => Some(t),
        (_, Err(e)) => Some(e.to_string()),
    };
    Sent {
        i,
        status: if error.is_some() && status == 200 {
            0
        } else {
            status
        },
        id: if status == 200 { id } else { None },
        error,
    }
}

/// A SQLite ledger in `dir`.
async fn sqlite_ledger(dir: &std::path::Path) -> Ledger {
    Ledger::connect(&format!("sqlite://{}/ledger.db", dir.display()))
        .await
        .unwrap()
}

/// Requests `0..n`, 32 in flight, sent in the background: their answers to come and the count
/// of those done so far.
fn load(base: &str, n: u64) -> (tokio::task::JoinHandle<Vec<Sent>>, watch::Receiver<u64>) {
    let (done, progress) = watch::channel(0u64);
    (
        tokio::spawn(drive(base.to_owned(), 0..n, 32, None, done)),
        progress,
    )
}

/// Sends requests `range` with `concurrency` in flight, at most one start per `pace` when given;
/// counts completions in `done`.
async fn drive(
    base: String,
    range: std::ops::Range<u64>,
    concurrency: usize,
    pace: Option<Duration>,
    done: watch::Sender<u64>,
) -> Vec<Sent> {
    let client = http_client();
    let ticker = pace.map(tokio::time::interval);
    let starts = futures::stream::unfold((range, ticker), |(mut range, mut ticker)| async move {
        let i = range.next()?;
        if let Some(t) = ticker.as_mut() {
            t.tick().await;
        }
        Some((i, (range, ticker)))
    });
    starts
        .map(|i| {
            let (client, base, done) = (client.clone(), base.clone(), done.clone());
            async move {
                let s = send(&client, &base, i).await;
                done.send_modify(|n| *n += 1);
                s
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

/// Waits until `done` reaches `n`.
async fn reached(done: &mut watch::Receiver<u64>, n: u64) {
    tokio::time::timeout(Duration::from_secs(120), done.wait_for(|d| *d >= n))
        .await
        .unwrap_or_else(|_| panic!("{n} requests not completed within 120 s"))
        .unwrap();
}

/// The consumer tuning for these tests: unacked events of a killed consumer come back after 2 s
/// (not 30 s), failed batches are retried after 200 ms.
fn service_config() -> ServiceConfig {
    ServiceConfig {
        ack_wait: Duration::from_secs(2),
        retry_delay: Duration::from_millis(200),
        ..ServiceConfig::default()
    }
}

/// Starts a billing consumer (the durable consumer `billing`) on its own NATS connection.
fn spawn_billing(url: String, subjects: Subjects, ledger: Ledger) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let c = async_nats::connect(url).await.unwrap();
        BillingService::new(c, subjects, ledger)
            .with_config(service_config())
            .run(std::future::pending::<()>())
            .await
            .unwrap();
    })
}

/// A gateway without the harness's billing (the tests run their own consumer) on `prefix`.
async fn gateway(prefix: &str) -> (Gateway, Subjects) {
    let gw = start_config(test_config(serde_json::json!({"subject_prefix": prefix}))).await;
    (gw, Subjects::new(prefix))
}

/// The request indexes of the upstream calls the mock received (from the recorded bodies).
fn upstream_calls(gw: &Gateway) -> Vec<u64> {
    gw.mock
        .requests()
        .iter()
        .filter_map(|r| {
            let text = r.body.to_string();
            let start = text.find("req-")? + 4;
            let len = text[start..].find("-end")?;
            text[start..start + len].parse().ok()
        })
        .collect()
}

/// Waits until the ledger holds `rows` usage rows and the billing consumer has nothing pending.
async fn settled(gw: &Gateway, ledger: &Ledger, rows: u64, limit: Duration) {
    let js = async_nats::jetstream::new(async_nats::connect(gw.nats.url()).await.unwrap());
    let deadline = Instant::now() + limit;
    loop {
        let count = ledger.count().await.unwrap_or(0);
        let pending = match js.get_stream(USAGE_STREAM).await {
            Ok(s) => s
                .consumer_info(BILLING_CONSUMER)
                .await
                .map(|i| (i.num_pending, i.num_ack_pending))
                .ok(),
            Err(_) => None,
        };
        if count == rows && pending == Some((0, 0)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "ledger not settled within {limit:?}: {count} of {rows} rows, consumer (pending, ack pending) {pending:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The exact-ledger checks. `sent`: every request and its outcome (all of them were admitted:
/// valid model, no auth). `calls`: request indexes of the upstream calls the mock served.
/// Returns the ledger's requests for further checks.
async fn check_ledger(ledger: &Ledger, sent: &[Sent], calls: &[u64]) -> Vec<RequestRows> {
    let requests = load_requests(ledger, 0, u64::MAX).await.unwrap();
    let charges: Vec<_> = requests.iter().filter_map(|r| r.charge.as_ref()).collect();
    let upstream: Vec<_> = requests.iter().flat_map(|r| &r.upstream).collect();
    // Exactly one charge row per admitted request (the primary key forbids a second one).
    assert_eq!(
        charges.len(),
        sent.len(),
        "charge rows vs admitted requests"
    );
    // Every upstream call the mock served has its upstream row, none more.
    assert_eq!(
        upstream.len(),
        calls.len(),
        "upstream rows vs upstream calls"
    );
    // The ok charges must match what the answered requests reported, request by request.
    let answered: HashMap<String, u64> = sent
        .iter()
        .filter_map(|s| s.id.map(|id| (id.to_string(), s.i)))
        .collect();
    // Upstream rows: each carries exactly what the mock reported for its call (matched as
    // (prompt, completion) pairs), except a call the gateway aborted before its answer: when
    // ingress gives up on a request during the NATS outage (an explicit error to the client)
    // while the client library still buffers its publish, the request and its cancel reach
    // the worker together on reconnect; the mock records the call and the worker drops it
    // before reading an answer: a `cancelled` row with no usage, of an unanswered request.
    let mut want: HashMap<(u64, u64), i64> = HashMap::new();
    for i in calls {
        *want.entry(tokens(*i)).or_default() += 1;
    }
    let mut aborted = 0i64;
    for u in &upstream {
        let pair = (u.usage.prompt_tokens, u.usage.completion_tokens);
        match want.get_mut(&pair) {
            Some(n) if *n > 0 => *n -= 1,
            _ => {
                assert!(
                    u.status == UsageStatus::Cancelled
                        && pair == (0, 0)
                        && !answered.contains_key(&u.request_id),
                    "an upstream row no call reported: {u:?}"
                );
                aborted += 1;
            }
        }
    }
    let unmatched: i64 = want.values().sum();
    assert_eq!(
        unmatched, aborted,
        "calls the mock reported without their row vs aborted calls"
    );
    let mut charged = (0, 0);
    for r in &requests {
        let Some(c) = &r.charge else { continue };
        if c.status != UsageStatus::Ok {
            assert!(
                !answered.contains_key(&r.request_id),
                "an answered request is charged as {:?}",
                c.status
            );
            continue;
        }
        let i = answered
            .get(&r.request_id)
            .unwrap_or_else(|| panic!("ok charge for a request the client did not get: {r:?}"));
        let (p, cc) = tokens(*i);
        assert_eq!(
            (c.usage.prompt_tokens, c.usage.completion_tokens),
            (p, cc),
            "charge of request {i}"
        );
        assert!(!c.estimated);
        charged = (charged.0 + p, charged.1 + cc);
    }
    let ok_charges = charges
        .iter()
        .filter(|c| c.status == UsageStatus::Ok)
        .count();
    assert_eq!(
        ok_charges,
        answered.len(),
        "ok charges vs answered requests"
    );
    let expected = sent
        .iter()
        .filter(|s| s.id.is_some())
        .fold((0, 0), |(p, c), s| {
            let (dp, dc) = tokens(s.i);
            (p + dp, c + dc)
        });
    assert_eq!(
        charged, expected,
        "charged token totals (prompt, completion)"
    );
    requests
}

/// Reconciliation over everything must find nothing it cannot explain. The one explanation
/// accepted: the request failed and its client got an error (its charge row is not `ok`; the
/// ledger checks tie those to the failed HTTP answers) while the upstream call behind it completed,
/// its answer lost with the fault: `admitted_not_settled` (one finding per such request). Returns the number of
/// explained findings; `failed` bounds how many requests may have them.
/// Every one of the `n` requests `sent` was answered 200 and called the upstream once; the
/// ledger settles (up to 60 s) at their `2 × n` rows, each request's rows check out
/// ([`check_ledger`]) and reconciliation finds nothing.
async fn assert_all_billed_once(gw: &Gateway, ledger: &Ledger, sent: &[Sent], n: u64) {
    let bad: Vec<_> = sent.iter().filter(|s| s.status != 200).take(5).collect();
    assert!(bad.is_empty(), "failed requests: {bad:?}");
    let calls = upstream_calls(gw);
    assert_eq!(calls.len() as u64, n);
    settled(gw, ledger, 2 * n, Duration::from_secs(60)).await;
    let requests = check_ledger(ledger, sent, &calls).await;
    assert_eq!(requests.len() as u64, n);
    assert_eq!(check_reconciliation(ledger, &requests, 0).await, 0);
}

async fn check_reconciliation(ledger: &Ledger, requests: &[RequestRows], failed: u64) -> u64 {
    let r = switchyard_billing::reconcile(ledger, 0, u64::MAX, 100_000)
        .await
        .unwrap();
    assert_eq!(r.requests, requests.len() as u64);
    assert!(!r.truncated);
    let unsettled: HashSet<&str> = requests
        .iter()
        .filter(|q| {
            q.charge
                .as_ref()
                .is_some_and(|c| c.status != UsageStatus::Ok)
        })
        .map(|q| q.request_id.as_str())
        .collect();
    let (explained, unexplained): (Vec<_>, Vec<_>) = r.rows.iter().partition(|d| {
        unsettled.contains(d.request_id.as_str()) && d.class == DiscrepancyClass::AdmittedNotSettled
    });
    assert!(
        unexplained.is_empty(),
        "unexplained reconciliation rows: {unexplained:#?}"
    );
    let requests_explained: HashSet<&str> =
        explained.iter().map(|d| d.request_id.as_str()).collect();
    assert!(
        requests_explained.len() as u64 <= failed,
        "{} requests with findings, {failed} failed",
        requests_explained.len()
    );
    explained.len() as u64
}

/// (a) 10,000 requests; the billing consumer is aborted (a crash: mid-batch, nothing acked) a
/// third of the way in and a new one on the same durable consumer started at two thirds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn billing_consumer_killed_under_load_loses_and_doubles_nothing() {
    const N: u64 = 10_000;
    let t0 = Instant::now();
    let (gw, subjects) = gateway("fa").await;
    let tmp = tempfile::tempdir().unwrap();
    let ledger = sqlite_ledger(tmp.path()).await;
    let billing = spawn_billing(gw.nats.url(), subjects.clone(), ledger.clone());
    let (load, mut progress) = load(&gw.base, N);

    reached(&mut progress, N / 3).await;
    billing.abort();
    assert!(billing.await.unwrap_err().is_cancelled());
    let at_kill = ledger.count().await.unwrap();
    reached(&mut progress, 2 * N / 3).await;
    let restarted = spawn_billing(gw.nats.url(), subjects.clone(), ledger.clone());
    let sent = load.await.unwrap();
    let load_s = t0.elapsed().as_secs_f64();

    assert_all_billed_once(&gw, &ledger, &sent, N).await;
    restarted.abort();
    eprintln!(
        "billing consumer kill: {N} requests in {load_s:.1} s, {at_kill} rows at the kill, settled after {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

/// A private PostgreSQL cluster (initdb into a temp dir, `pg_ctl` on a free port), stopped with
/// `-m immediate` on drop. As root it runs as the `postgres` user (PostgreSQL refuses root).
struct PgCluster {
    bin: PathBuf,
    data: PathBuf,
    sockets: PathBuf,
    port: u16,
    /// `runuser -u postgres --` prefix when running as root.
    as_user: Option<String>,
    _tmp: tempfile::TempDir,
}

impl PgCluster {
    /// The server binaries: `$SWITCHYARD_PG_BIN`, Debian's newest `/usr/lib/postgresql/*/bin`,
    /// or `pg_ctl` on `PATH`.
    fn find_bin() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("SWITCHYARD_PG_BIN") {
            return Some(PathBuf::from(p));
        }
        let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let v = e.file_name().to_string_lossy().parse().ok()?;
                let bin = e.path().join("bin");
                bin.join("pg_ctl").is_file().then_some((v, bin))
            })
            .collect();
        debian.sort();
        if let Some((_, bin)) = debian.pop() {
            return Some(bin);
        }
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .find(|d| d.join("pg_ctl").is_file() && d.join("initdb").is_file())
        })
    }

    /// Creates and starts the cluster; `None` (after saying why) when the binaries are absent
    /// and `SWITCHYARD_REQUIRE_POSTGRES` is not set.
    async fn start() -> Option<Self> {
        let Some(bin) = Self::find_bin() else {
            assert!(
                std::env::var_os("SWITCHYARD_REQUIRE_POSTGRES").is_none(),
                "PostgreSQL server binaries (initdb, pg_ctl) not found and SWITCHYARD_REQUIRE_POSTGRES is set"
            );
            eprintln!(
                "SKIPPED: PostgreSQL server binaries (initdb, pg_ctl) not found under /usr/lib/postgresql/*/bin or PATH"
            );
            return None;
        };
        let tmp = tempfile::tempdir().unwrap();
        use std::os::unix::fs::MetadataExt as _;
        let root = tmp.path().metadata().unwrap().uid() == 0;
        let as_user = if root {
            let (uid, gid) = postgres_ids().expect("running as root but no `postgres` user");
            std::os::unix::fs::chown(tmp.path(), Some(uid), Some(gid)).unwrap();
            Some("postgres".to_owned())
        } else {
            None
        };
        let mut pg = Self {
            bin,
            data: tmp.path().join("data"),
            sockets: tmp.path().to_path_buf(),
            port: 0,
            as_user,
            _tmp: tmp,
        };
        let data = pg.data.display().to_string();
        pg.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )
        .await
        .unwrap();
        // A free port can be taken between the probe and the start: try a few.
        for attempt in 0..5 {
            pg.port = switchyard_natsd::free_port().unwrap();
            match pg.pg_start().await {
                Ok(()) => return Some(pg),
                Err(e) if attempt < 4 => eprintln!("pg_ctl start failed, retrying: {e}"),
                Err(e) => panic!("pg_ctl start: {e}"),
            }
        }
        None
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server binary `tool`, to run as the cluster's owner (`runuser` when root).
    fn command(&self, tool: &str) -> std::process::Command {
        let exe = self.bin.join(tool);
        match &self.as_user {
            Some(user) => {
                let mut c = std::process::Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&exe);
                c
            }
            None => std::process::Command::new(&exe),
        }
    }

    async fn run(&self, tool: &str, args: &[&str]) -> Result<(), String> {
        let exe = self.bin.join(tool);
        let out = tokio::process::Command::from(self.command(tool))
            .args(args)
            .current_dir(&self.sockets)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .map_err(|e| format!("{}: {e}", exe.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{tool} {args:?}: {}\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    async fn pg_start(&self) -> Result<(), String> {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.sockets.display()
        );
        let log = self.sockets.join("postgres.log").display().to_string();
        let data = self.data.display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D", &data, "-l", &log, "-o", &opts, "-w", "-t", "60", "start",
            ],
        )
        .await
    }

    async fn pg_stop(&self) -> Result<(), String> {
        let data = self.data.display().to_string();
        self.run("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"])
            .await
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// The uid and gid of the `postgres` user, from /etc/passwd.
fn postgres_ids() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string(Path::new("/etc/passwd")).ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&"postgres") && f.len() > 3)
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .flatten()
    })
}

/// (b) The ledger's PostgreSQL is stopped (`pg_ctl stop -m fast`) for 60 s while requests keep
/// flowing (a few hundred during the outage), then started again: the consumer naks and retries,
/// nothing is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_of_60s_loses_and_doubles_nothing() {
    const BEFORE: u64 = 1_000;
    const DURING: u64 = 300;
    const AFTER: u64 = 1_000;
    const OUTAGE: Duration = Duration::from_secs(60);
    let Some(pg) = PgCluster::start().await else {
        return;
    };
    let t0 = Instant::now();
    let (gw, subjects) = gateway("fb").await;
    let ledger = Ledger::connect(&pg.url()).await.unwrap();
    let _billing = spawn_billing(gw.nats.url(), subjects.clone(), ledger.clone());
    let (done, _) = watch::channel(0u64);

    let mut sent = drive(gw.base.clone(), 0..BEFORE, 32, None, done.clone()).await;
    pg.pg_stop().await.unwrap();
    let stopped = Instant::now();
    // (The pool gives up after its 10 s acquire timeout.)
    assert!(ledger.count().await.is_err(), "PostgreSQL is down");
    // A few hundred requests spread over the rest of the outage (one every 150 ms: 45 s).
    sent.extend(
        drive(
            gw.base.clone(),
            BEFORE..BEFORE + DURING,
            4,
            Some(Duration::from_millis(150)),
            done.clone(),
        )
        .await,
    );
    // The outage lasts 60 s (mandated by the acceptance), not a synchronisation wait.
    tokio::time::sleep(OUTAGE.saturating_sub(stopped.elapsed())).await;
    pg.pg_start().await.unwrap();
    let outage_s = stopped.elapsed().as_secs_f64();
    sent.extend(
        drive(
            gw.base.clone(),
            BEFORE + DURING..BEFORE + DURING + AFTER,
            32,
            None,
            done,
        )
        .await,
    );

    let n = BEFORE + DURING + AFTER;
    assert_all_billed_once(&gw, &ledger, &sent, n).await;
    eprintln!(
        "postgres outage: {n} requests, outage {outage_s:.1} s, total {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

/// (c) The NATS server (JetStream store and all) is killed and started again on the same port
/// while requests flow. Requests caught in flight fail with an explicit error, never hang;
/// afterwards every admitted request has exactly one charge row, no upstream usage is lost (the
/// usage spool covers publishes the outage outlasts), totals are exact, and the only
/// reconciliation findings are requests whose client saw the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_restart_loses_and_doubles_nothing() {
    const N: u64 = 3_000;
    let t0 = Instant::now();
    // The gateway's ingress and worker spool into its own spool (drained by its own task).
    let (mut gw, subjects) = gateway("fc").await;
    let tmp = tempfile::tempdir().unwrap();
    let ledger = sqlite_ledger(tmp.path()).await;
    let _billing = spawn_billing(gw.nats.url(), subjects.clone(), ledger.clone());
    let (load, mut progress) = load(&gw.base, N);

    reached(&mut progress, N / 3).await;
    let spool = gw.spool.clone();
    let stopped = Instant::now();
    tokio::task::block_in_place(|| gw.nats.stop()).unwrap();
    // Down until usage events publishes could not store went to the spool (a few seconds: failed
    // requests' charges after the first-frame timeout, in-flight upstream calls' usage at once).
    let deadline = Instant::now() + Duration::from_secs(30);
    while spool.stats().spooled < 10 {
        assert!(
            Instant::now() < deadline,
            "nothing spooled while NATS is down"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::task::block_in_place(|| gw.nats.restart()).unwrap();
    let down_ms = stopped.elapsed().as_millis();
    let sent = load.await.unwrap();
    let load_s = t0.elapsed().as_secs_f64();

    // Never a hang: every request got an HTTP answer, errors explicit (5xx with a JSON error).
    let hung: Vec<_> = sent.iter().filter(|s| s.status == 0).take(5).collect();
    assert!(hung.is_empty(), "requests without an answer: {hung:?}");
    let failed: Vec<&Sent> = sent.iter().filter(|s| s.status != 200).collect();
    for f in &failed {
        let e: serde_json::Value =
            serde_json::from_str(f.error.as_deref().unwrap_or_default()).unwrap();
        assert!(
            e["error"]["type"].is_string() || e["error"]["message"].is_string(),
            "{f:?}"
        );
    }
    let calls = upstream_calls(&gw);
    // Retries of a request are separate upstream calls; each has its own upstream row.
    settled(
        &gw,
        &ledger,
        N + calls.len() as u64,
        Duration::from_secs(90),
    )
    .await;
    let requests = check_ledger(&ledger, &sent, &calls).await;
    let explained = check_reconciliation(&ledger, &requests, failed.len() as u64).await;
    // Everything spooled for this prefix is delivered (the ledger checks above prove it landed).
    let js = async_nats::jetstream::new(async_nats::connect(gw.nats.url()).await.unwrap());
    assert_eq!(spool.drain(&js, &subjects).await.unwrap().remaining, 0);
    let stats = spool.stats();
    assert!(stats.drained >= 10, "{stats:?}");
    let distinct: HashSet<&str> = requests.iter().map(|r| r.request_id.as_str()).collect();
    assert_eq!(distinct.len() as u64, N);
    eprintln!(
        "nats restart: {N} requests in {load_s:.1} s (NATS down {down_ms} ms), {} failed, {} upstream calls, {explained} unsettled-but-explained, spool {stats:?}, total {:.1} s",
        failed.len(),
        calls.len(),
        t0.elapsed().as_secs_f64()
    );
}

/// (d) `/metrics` during a NATS outage: the one request sent while the server is down leaves its
/// usage event in the spool (`switchyard_usage_spool_events` 1, `switchyard_usage_spool_bytes` the
/// spool files' size) after its failed publish attempts (`switchyard_nats_publish_errors_total`
/// up by at least 5, one per attempt; process-wide, so other tests may add more); once NATS is
/// back the spool drains (0 and 0) and the event reaches the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_outage_shows_publish_errors_and_spool_on_metrics() {
    let mut gw = crate::common::billed_gateway().await;
    let base = gw.base.clone();
    let errors = "switchyard_nats_publish_errors_total{subject=\"usage\"}";
    let (events, bytes) = (
        "switchyard_usage_spool_events",
        "switchyard_usage_spool_bytes",
    );
    let before = crate::common::metrics_text(&base).await;
    assert_eq!(metric_value(&before, events), Some(0.0), "{before}");
    assert_eq!(metric_value(&before, bytes), Some(0.0), "{before}");
    let errors_before = metric_value(&before, errors).unwrap();

    tokio::task::block_in_place(|| gw.nats.stop()).unwrap();
    let r = crate::common::post(
        &base,
        &crate::common::chat("demo/mock", "#mock text=ok", false),
    )
    .await;
    assert!(r.status().is_server_error(), "{}", r.status());
    let id: Uuid = r.headers()["x-switchyard-request-id"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    r.bytes().await.unwrap();
    let spool = gw.spool.clone();
    let during = crate::common::wait_metrics(&base, Duration::from_secs(20), |t| {
        metric_value(t, events) == Some(1.0)
    })
    .await;
    let spooled = tokio::task::spawn_blocking(move || spool.size())
        .await
        .unwrap();
    assert_eq!(spooled.0, 1);
    assert!(spooled.1 > 0);
    assert_eq!(
        metric_value(&during, bytes),
        Some(spooled.1 as f64),
        "{during}"
    );
    let errors_during = metric_value(&during, errors).unwrap();
    assert!(
        // One per acknowledged publish attempt (`PUBLISH_ATTEMPTS` = 5) before the spool.
        errors_during >= errors_before + 5.0,
        "{errors_before} → {errors_during}"
    );

    tokio::task::block_in_place(|| gw.nats.restart()).unwrap();
    let after = crate::common::wait_metrics(&base, Duration::from_secs(30), |t| {
        metric_value(t, events) == Some(0.0)
    })
    .await;
    assert_eq!(metric_value(&after, bytes), Some(0.0), "{after}");
    crate::common::wait_charged(gw.ledger.as_ref().unwrap(), id, Duration::from_secs(30)).await;
}
