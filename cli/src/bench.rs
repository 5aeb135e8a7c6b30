//! `switchyard bench`: open-loop load through a full `switchyard up` and, in the same run,
//! straight to the same mock upstream, so the difference is what Switchyard adds.
//!
//! Set-up: the mock upstream runs as its own process (`switchyard mock-upstream`), and
//! `switchyard up` as another, with billing, the cache service (exact lookups on every request:
//! each prompt is unique, so every lookup is a miss), a key whose tenant has a USD budget (every
//! request reserves and settles) and RPM/TPM/concurrency limits on the target (all far above the
//! load, but evaluated). The load generator is this process.
//!
//! Open loop: request *i* of a phase is scheduled at `start + i / rate` and sent then whether or
//! not earlier ones have finished; its latency is measured from the *scheduled* time, so a stall
//! of the system under test shows up in the latency of every request it delayed (no coordinated
//! omission). Each phase alternates slices on the direct and the gateway path at the same rate,
//! so machine noise hits both alike. **Added latency** at a percentile is the gateway path's
//! value minus the direct path's value at the same percentile, from the same run.
//!
//! Streams: each stream is 20 chunks spread over `--stream-ms`; the arrival rate is chosen so
//! that `N` streams are open at once. TTFT is measured to the first content chunk; every gap
//! between two content chunks goes into the inter-chunk histogram.

pub(crate) mod floor;

use crate::proc_stat::{TICKS_PER_S, cpu_ticks, stat_field};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The API key the bench's gateway is configured with.
const KEY: &str = "sk-bench-0123456789abcdef";
/// Chunks per streamed answer (the mock's `chunks`).
const CHUNKS: u64 = 20;

/// Options of one run.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BenchArgs {
    /// Another benchmark instead of the added latency (`billing`: usage rows/s into the ledger).
    #[command(subcommand)]
    pub what: Option<BenchWhat>,
    /// Arrival rates of the non-streaming phases, requests/s (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1000, 2000, 5000])]
    pub rates: Vec<u64>,
    /// Concurrent streams of the streaming phases (comma-separated; `0`: none).
    #[arg(long, value_delimiter = ',', default_values_t = [500, 2000])]
    pub streams: Vec<u64>,
    /// Seconds of load per path and phase.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Each phase alternates direct and gateway in this many slices per path.
    #[arg(long, default_value_t = 2)]
    pub slices: u32,
    /// Length of one streamed answer, ms (20 chunks spread over it).
    #[arg(long, default_value_t = 1000)]
    pub stream_ms: u64,
    /// Where the run's config, data and logs go (default: a temporary directory, removed).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Batch phase: interactive JSON latency at the first `--rates` value without and with a
    /// batch of this many items running (0: skip). Each item waits `--batch-item-ms` upstream.
    #[arg(long, default_value_t = 0)]
    pub batch_items: u64,
    /// Upstream time of one batch item, ms (so the batch runs through the whole phase).
    #[arg(long, default_value_t = 200)]
    pub batch_item_ms: u64,
    /// Run ingress with its exact-cache replica (`cache_replica: {enabled: true}`).
    #[arg(long)]
    pub cache_replica: bool,
    /// Run ingress without its cache key set (`cache_replica: {key_set: false}`): every lookup
    /// asks the cache service, as before the key set (an A/B switch).
    #[arg(long)]
    pub no_cache_key_set: bool,
    /// Give the bench routes the semantic cache layer (`cache: {semantic: true}`): `up` loads
    /// the embedding model, and every stored answer and every lookup of the routes' one scope
    /// is embedded (the prompts differ only in a number, so the verification rules reject every
    /// candidate and each request is still a miss).
    #[arg(long)]
    pub semantic: bool,
    /// Turn the answer cache off on the bench routes (no lookup, no store): an A/B switch for
    /// what the cache costs per request.
    #[arg(long)]
    pub no_cache: bool,
    /// Make each request the second turn of a conversation of its own (a first question, its
    /// answer, then the request's question): no two requests share a cache scope, so a semantic
    /// lookup has nothing to compare with and every stored answer is embedded — a chat
    /// workload's later turns.
    #[arg(long)]
    pub own_conversations: bool,
    /// Also run two minimal gateways in each phase, at the same rate and in the same run:
    /// a bare HTTP proxy, and the same proxy with one NATS request/reply hop (see
    /// `bench/floor.rs`): the floor the design itself puts under the added latency and CPU.
    #[arg(long)]
    pub floors: bool,
}

/// How the bench config sets up the answer cache (see [`BenchArgs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CacheSetup {
    /// `cache_replica.enabled`.
    replica: bool,
    /// `cache_replica.key_set`.
    key_set: bool,
    /// The routes' `cache.semantic`.
    semantic: bool,
    /// The routes' `cache.enabled`.
    enabled: bool,
}

/// The other benchmarks of `switchyard bench`.
#[derive(Debug, Clone, clap::Subcommand)]
pub(crate) enum BenchWhat {
    /// Usage rows/s into the billing ledger: raw `Ledger::insert_batch`, then end to end (JetStream
    /// publish → billing consumer → ledger commit). PostgreSQL runs in a throwaway schema.
    Billing(crate::bench_billing::BillingBenchArgs),
}

/// A child process stopped when dropped: SIGTERM first, so `up` shuts down in order and stops
/// its own nats-server (a SIGKILL would orphan it), then SIGKILL after 30 s.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

fn spawn(args: &[&str], log: &Path, monitor: Option<u16>) -> Result<Proc, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = std::fs::File::create(log).map_err(|e| e.to_string())?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut command = Command::new(exe);
    // A bench stopped by a signal takes its mock, `up` and floors with it (SIGTERM: `up` then
    // stops its own nats-server). Called from the main thread, which the death signal follows.
    switchyard_natsd::sys::die_with_parent(&mut command);
    let child = command
        .args(args)
        .env("RUST_LOG", "warn")
        .envs(monitor.map(|p| ("SWITCHYARD_NATS_MONITOR_PORT", p.to_string())))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| e.to_string())?;
    Ok(Proc(child))
}

/// `in_msgs` and `out_msgs` of the `up` tree's nats-server (its `/varz` monitoring endpoint):
/// every message a client published to it and every message it delivered, JetStream
/// acknowledgements and KV operations included.
async fn nats_counts(http: &reqwest::Client, monitor: u16) -> Option<(u64, u64)> {
    let v = monitor_json(http, monitor, "varz").await?;
    Some((v["in_msgs"].as_u64()?, v["out_msgs"].as_u64()?))
}

/// One JSON page of the nats-server monitoring endpoint (`varz`, `jsz?…`).
async fn monitor_json(
    http: &reqwest::Client,
    monitor: u16,
    page: &str,
) -> Option<serde_json::Value> {
    http.get(format!("http://127.0.0.1:{monitor}/{page}"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}

/// Last sequence number per JetStream stream of the `up` tree's nats-server (its `/jsz`
/// endpoint): the stored writes so far, by stream (`KV_SY_BUDGETS`, `KV_SY_LIMITS`, the usage
/// stream, …).
async fn js_writes(
    http: &reqwest::Client,
    monitor: u16,
) -> Option<std::collections::BTreeMap<String, u64>> {
    let v = monitor_json(http, monitor, "jsz?streams=true").await?;
    let mut out = std::collections::BTreeMap::new();
    for account in v["account_details"].as_array()? {
        for stream in account["stream_detail"].as_array().into_iter().flatten() {
            if let (Some(name), Some(seq)) = (
                stream["name"].as_str(),
                stream["state"]["last_seq"].as_u64(),
            ) {
                out.insert(name.to_owned(), seq);
            }
        }
    }
    Some(out)
}

/// The gateway's config: one JSON and one streaming model on the mock, a budgeted key, limits.
fn config_yaml(dir: &Path, listen: u16, mock: u16, stream_ms: u64, cache: CacheSetup) -> String {
    let CacheSetup {
        replica,
        key_set,
        semantic,
        enabled,
    } = cache;
    let delay = stream_ms / CHUNKS;
    let limits = "{rpm: 100000000, tpm: 100000000000, max_concurrency: 100000}";
    format!(
        "listen: 127.0.0.1:{listen}\n\
         data_dir: {data}\n\
         pricing_file: {prices}\n\
         targets:\n\
         \x20 - {{id: json, provider: openai, base_url: \"http://127.0.0.1:{mock}/v1\", upstream_model: mock, limits: {limits}}}\n\
         \x20 - {{id: stream, provider: openai, base_url: \"http://127.0.0.1:{mock}/x/chunks={CHUNKS},chunk_delay_ms={delay}/v1\", upstream_model: mock, limits: {limits}}}\n\
         models:\n\
         \x20 - {{id: bench/json, targets: [json], cache: {{enabled: {enabled}, semantic: {semantic}}}}}\n\
         \x20 - {{id: bench/stream, targets: [stream], cache: {{enabled: {enabled}, semantic: {semantic}}}}}\n\
         keys:\n\
         \x20 - {{id: bench, tenant: bench, key: {KEY}}}\n\
         tenants:\n\
         \x20 - {{id: bench, budget: {{daily_usd: 1000000}}}}\n\
         timeouts: {{first_frame_ms: 10000, worker_silence_ms: 10000}}\n\
         cache_replica: {{enabled: {replica}, key_set: {key_set}}}\n",
        data = dir.join("data").display(),
        prices = dir.join("prices.yaml").display(),
    )
}

const PRICES: &str = "currency: USD\nas_of: 2026-12-01\n\
    upstream:\n  mock: {input: 0.15, output: 0.6}\n\
    standard:\n  bench/json: {input: 0.15, output: 0.6}\n  bench/stream: {input: 0.15, output: 0.6}\n";

/// Resident set size (KiB) and CPU time (clock ticks) of `pid` and its descendants.
fn tree_usage(pid: u32) -> (u64, u64) {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(ppid) = stat_field(p, 1) {
                parents.push((p, ppid as u32));
            }
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    let mut rss = 0;
    let mut cpu = 0;
    for p in tree {
        rss += std::fs::read_to_string(format!("/proc/{p}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .unwrap_or(0);
        cpu += cpu_ticks(p);
    }
    (rss, cpu)
}

/// The processes that share the machine in a phase, for the split of its CPU: the `up` process
/// (ingress, worker, billing, cache service), its nats-server, the mock upstream and the load
/// generator (this process).
struct Cores {
    up: u32,
    nats: Option<u32>,
    mock: u32,
    generator: u32,
}

impl Cores {
    /// CPU time (clock ticks) of each process alone: up, nats-server, mock, generator.
    fn ticks(&self) -> [u64; 4] {
        [
            cpu_ticks(self.up),
            self.nats.map_or(0, cpu_ticks),
            cpu_ticks(self.mock),
            cpu_ticks(self.generator),
        ]
    }

    /// `ticks` over `wall` as cores busy, e.g. `up 0.91, nats-server 0.42, mock 0.10, load
    /// generator 0.31 of 2`.
    fn describe(ticks: &[u64; 4], wall: Duration) -> String {
        let wall = wall.as_secs_f64().max(1e-9);
        let c = |t: u64| t as f64 / TICKS_PER_S / wall;
        format!(
            "up {:.2}, nats-server {:.2}, mock {:.2}, load generator {:.2} of {}",
            c(ticks[0]),
            c(ticks[1]),
            c(ticks[2]),
            c(ticks[3]),
            std::thread::available_parallelism().map_or(0, |n| n.get())
        )
    }
}

/// The first child of `pid` whose command name is `name`.
fn child_named(pid: u32, name: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let p = e.file_name().to_str()?.parse::<u32>().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).ok()?;
        (stat_field(p, 1)? == u64::from(pid) && comm.trim() == name).then_some(p)
    })
}

/// What one path recorded in one phase.
struct PathStats {
    latency: Histogram<u64>,
    gap: Histogram<u64>,
    ok: u64,
    errors: u64,
    first_error: Option<String>,
    busy: Duration,
}

impl PathStats {
    fn new() -> Result<Self, String> {
        let h = |digits| {
            Histogram::<u64>::new_with_bounds(1, 120_000_000, digits).map_err(|e| e.to_string())
        };
        Ok(Self {
            latency: h(3)?,
            // 4 significant digits: a gap is ≈ 333 ms in the 300 streams/s phase, where 3 digits
            // resolve only 256 µs steps, coarser than the 200 µs the gap target asks about; 4
            // resolve 16 µs.
            gap: h(4)?,
            ok: 0,
            errors: 0,
            first_error: None,
            busy: Duration::ZERO,
        })
    }
}

#[derive(Clone)]
struct Path2 {
    url: String,
    model: &'static str,
    key: bool,
    /// See [`BenchArgs::own_conversations`].
    own_conversations: bool,
}

/// One request scheduled at `at`; latency (µs, from `at`) to the full body or, when `stream`,
/// to the first content chunk, plus the gaps between content chunks (µs).
async fn one(
    http: &reqwest::Client,
    path: &Path2,
    n: u64,
    stream: bool,
    at: Instant,
) -> Result<(u64, Vec<u64>), String> {
    let question = serde_json::json!({"role": "user", "content": format!("bench request {n}")});
    let messages = if path.own_conversations {
        serde_json::json!([
            {"role": "user", "content": format!("bench conversation {n}")},
            {"role": "assistant", "content": "Go on."},
            question,
        ])
    } else {
        serde_json::json!([question])
    };
    let body = serde_json::json!({"model": path.model, "stream": stream, "max_tokens": 64,
        "messages": messages});
    let mut req = http.post(&path.url).json(&body);
    if path.key {
        req = req.bearer_auth(KEY);
    }
    let mut resp = req.send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        return Err(format!(
            "{status}: {}",
            text.chars().take(200).collect::<String>()
        ));
    }
    if !stream {
        resp.bytes().await.map_err(|e| e.to_string())?;
        return Ok((at.elapsed().as_micros() as u64, Vec::new()));
    }
    let mut first = None;
    let mut last = None;
    let mut gaps = Vec::new();
    let mut pending = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        pending.extend_from_slice(&chunk);
        let now = Instant::now();
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            if !has_content(&event) {
                continue;
            }
            if first.is_none() {
                first = Some(now.duration_since(at).as_micros() as u64);
            }
            if let Some(prev) = last {
                gaps.push(now.duration_since(prev).as_micros() as u64);
            }
            last = Some(now);
        }
    }
    first
        .map(|f| (f, gaps))
        .ok_or_else(|| "stream without content".to_owned())
}

/// Whether an SSE event carries a non-empty `"content":"…"` delta (OpenAI chunk shape).
fn has_content(event: &[u8]) -> bool {
    const PAT: &[u8] = b"\"content\":\"";
    event
        .windows(PAT.len() + 1)
        .any(|w| w.starts_with(PAT) && w[PAT.len()] != b'"')
}

/// Sends at `rate` per second for `length` on `path`, open loop, into `stats`.
async fn slice(
    http: &reqwest::Client,
    path: &Path2,
    rate: u64,
    length: Duration,
    stream: bool,
    counter: &Arc<AtomicU64>,
    stats: &Arc<Mutex<PathStats>>,
) {
    let start = Instant::now() + Duration::from_millis(5);
    let total = (rate as f64 * length.as_secs_f64()) as u64;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        let at = start + Duration::from_secs_f64(i as f64 / rate as f64);
        tokio::time::sleep_until(at.into()).await;
        let (http, path, stats) = (http.clone(), path.clone(), stats.clone());
        let n = counter.fetch_add(1, Ordering::Relaxed);
        tasks.spawn(async move {
            let r = tokio::time::timeout(Duration::from_secs(30), one(&http, &path, n, stream, at))
                .await
                .unwrap_or_else(|_| Err("timed out after 30 s".into()));
            let mut s = stats.lock();
            match r {
                Ok((latency, gaps)) => {
                    s.ok += 1;
                    let _ = s.latency.record(latency.max(1));
                    for g in gaps {
                        let _ = s.gap.record(g.max(1));
                    }
                }
                Err(e) => {
                    s.errors += 1;
                    s.first_error.get_or_insert(e);
                }
            }
        });
        // Reap finished tasks as we go so the set does not grow with the run.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    stats.lock().busy += start.elapsed();
}

/// Waits (at most 60 s) until a single request through the gateway takes under 20 ms again.
async fn cool_down(http: &reqwest::Client, via: &Path2, counter: &Arc<AtomicU64>) {
    let limit = Instant::now() + Duration::from_secs(60);
    while Instant::now() < limit {
        let at = Instant::now();
        let n = counter.fetch_add(1, Ordering::Relaxed);
        if one(http, via, n, false, at).await.is_ok() && at.elapsed() < Duration::from_millis(20) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One table row: the percentiles of `h` (ms), `s`'s achieved rate and errors.
fn print_row(phase: &str, path: &str, s: &PathStats, h: &Histogram<u64>) {
    let ms = |us: u64| us as f64 / 1000.0;
    println!(
        "| {phase} | {path} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} | {} |",
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.9)),
        ms(h.value_at_quantile(0.99)),
        ms(h.value_at_quantile(0.999)),
        ms(h.max()),
        s.ok as f64 / s.busy.as_secs_f64().max(1e-9),
        s.errors
    );
}

/// Added latency at quantile `q`, ms: `h`'s value minus `base`'s (same run, same percentile).
fn added_ms(q: f64, base: &Histogram<u64>, h: &Histogram<u64>) -> f64 {
    (h.value_at_quantile(q) as f64 - base.value_at_quantile(q) as f64) / 1000.0
}

impl PathStats {
    /// CPU `ticks` spent on this path's requests, as ms per request.
    fn ms_per_request(&self, ticks: u64) -> f64 {
        ticks as f64 / TICKS_PER_S * 1000.0 / (self.ok + self.errors).max(1) as f64
    }

    /// ` (first: …)` after an error count, or nothing without errors.
    fn first_error_note(&self) -> String {
        self.first_error
            .as_ref()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default()
    }
}

/// Waits until `path` answers a request, at most `limit`; `what` names it in the error.
async fn wait_answering(
    http: &reqwest::Client,
    path: &Path2,
    counter: &Arc<AtomicU64>,
    limit: Duration,
    what: &str,
) -> Result<(), String> {
    let ready = Instant::now();
    loop {
        let n = counter.fetch_add(1, Ordering::Relaxed);
        if one(http, path, n, false, Instant::now()).await.is_ok() {
            return Ok(());
        }
        if ready.elapsed() > limit {
            return Err(format!(
                "{what} did not answer within {} s",
                limit.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the benchmark and prints the report.
pub(crate) async fn run(args: BenchArgs) -> Result<(), String> {
    if let Some(BenchWhat::Billing(billing)) = args.what {
        return crate::bench_billing::run(billing).await;
    }
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_owned());
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let (mock_port, port, monitor) = (free_port()?, free_port()?, free_port()?);
    let mock_listen = format!("127.0.0.1:{mock_port}");
    let mock = spawn(
        &["mock-upstream", "--listen", &mock_listen],
        &dir.join("mock.log"),
        None,
    )?;
    std::fs::write(dir.join("prices.yaml"), PRICES).map_err(|e| e.to_string())?;
    let config = dir.join("bench.yaml");
    std::fs::write(
        &config,
        config_yaml(
            &dir,
            port,
            mock_port,
            args.stream_ms,
            CacheSetup {
                replica: args.cache_replica,
                key_set: !args.no_cache_key_set,
                semantic: args.semantic,
                enabled: !args.no_cache,
            },
        ),
    )
    .map_err(|e| e.to_string())?;
    let config_arg = config.display().to_string();
    let up = spawn(
        &["up", "--config", &config_arg, "--no-local-model"],
        &dir.join("up.log"),
        Some(monitor),
    )?;
    let up_pid = up.0.id();

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(20_000)
        // Below the gateway's 10 s keep-alive idle timeout: a pooled connection the server is
        // closing at that moment would fail a request that never reached it.
        .pool_idle_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .build()
        .map_err(|e| e.to_string())?;
    let gateway = format!("http://127.0.0.1:{port}");
    let direct_json = Path2 {
        url: format!("http://{mock_listen}/v1/chat/completions"),
        model: "mock",
        key: false,
        own_conversations: args.own_conversations,
    };
    let via_json = Path2 {
        url: format!("{gateway}/v1/chat/completions"),
        model: "bench/json",
        key: true,
        own_conversations: args.own_conversations,
    };
    let delay = args.stream_ms / CHUNKS;
    let direct_stream = Path2 {
        url: format!(
            "http://{mock_listen}/x/chunks={CHUNKS},chunk_delay_ms={delay}/v1/chat/completions"
        ),
        model: "mock",
        key: false,
        own_conversations: args.own_conversations,
    };
    let via_stream = Path2 {
        url: via_json.url.clone(),
        model: "bench/stream",
        key: true,
        own_conversations: args.own_conversations,
    };
    eprintln!(
        "switchyard bench: waiting for `switchyard up` (log: {})",
        dir.join("up.log").display()
    );
    let counter = Arc::new(AtomicU64::new(0));
    wait_answering(
        &http,
        &via_json,
        &counter,
        Duration::from_secs(120),
        "`switchyard up`",
    )
    .await?;
    let (idle_rss, _) = tree_usage(up_pid);
    let cores = Cores {
        up: up_pid,
        nats: child_named(up_pid, "nats-server"),
        mock: mock.0.id(),
        generator: std::process::id(),
    };
    println!(
        "`switchyard up` process tree RSS idle: {} MB\n",
        idle_rss / 1024
    );
    let mut floors = match args.floors {
        true => Some(
            floor::Floors::start(
                &dir,
                &direct_json.url,
                &direct_stream.url,
                &http,
                &counter,
                args.own_conversations,
            )
            .await?,
        ),
        false => None,
    };
    // Warm-up: connections, the cache's index, JIT-free but page-cache-warm.
    let warm = Arc::new(Mutex::new(PathStats::new()?));
    for p in [&direct_json, &via_json] {
        slice(
            &http,
            p,
            200,
            Duration::from_secs(2),
            false,
            &counter,
            &warm,
        )
        .await;
    }
    if let Some(f) = floors.as_mut() {
        f.slice(&http, 200, Duration::from_secs(2), false, &counter)
            .await;
    }

    println!(
        "| phase | path | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | achieved /s | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut summary = Vec::new();
    let phases: Vec<(String, u64, bool)> = args
        .rates
        .iter()
        .filter(|r| **r > 0)
        .map(|r| (format!("{r} rps JSON"), *r, false))
        .chain(args.streams.iter().filter(|n| **n > 0).map(|n| {
            (
                format!("{n} streams"),
                (n * 1000).div_ceil(args.stream_ms.max(1)),
                true,
            )
        }))
        .collect();
    for (name, rate, stream) in phases {
        // A saturated phase leaves a backlog in the gateway: let it drain before the next one.
        cool_down(&http, &via_json, &counter).await;
        let direct = Arc::new(Mutex::new(PathStats::new()?));
        let via = Arc::new(Mutex::new(PathStats::new()?));
        let length = Duration::from_secs_f64(args.seconds as f64 / f64::from(args.slices.max(1)));
        let mut peak_rss = 0;
        let mut cpu_ticks = 0;
        let mut split = [0u64; 4];
        let mut via_wall = Duration::ZERO;
        let mut nats_msgs = (0, 0);
        let mut writes: std::collections::BTreeMap<String, u64> = Default::default();
        let (dp, vp) = if stream {
            (&direct_stream, &via_stream)
        } else {
            (&direct_json, &via_json)
        };
        let mut phase_floors = floors.as_mut();
        if let Some(f) = phase_floors.as_deref_mut() {
            f.reset()?;
        }
        for _ in 0..args.slices.max(1) {
            slice(&http, dp, rate, length, stream, &counter, &direct).await;
            if let Some(f) = phase_floors.as_deref_mut() {
                f.slice(&http, rate, length, stream, &counter).await;
            }
            let (_, cpu0) = tree_usage(up_pid);
            let split0 = cores.ticks();
            let wall0 = Instant::now();
            let msgs0 = nats_counts(&http, monitor).await;
            let writes0 = js_writes(&http, monitor).await;
            let sampling = Arc::new(AtomicU64::new(0));
            #[expect(
                clippy::disallowed_methods,
                reason = "awaited right after the slice it samples"
            )]
            let sampler = {
                let sampling = sampling.clone();
                tokio::spawn(async move {
                    let mut peak = 0;
                    while sampling.load(Ordering::Relaxed) == 0 {
                        peak = peak.max(tree_usage(up_pid).0);
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    peak
                })
            };
            slice(&http, vp, rate, length, stream, &counter, &via).await;
            sampling.store(1, Ordering::Relaxed);
            peak_rss = peak_rss.max(sampler.await.unwrap_or(0));
            cpu_ticks += tree_usage(up_pid).1.saturating_sub(cpu0);
            via_wall += wall0.elapsed();
            for (sum, (after, before)) in split.iter_mut().zip(cores.ticks().iter().zip(split0)) {
                *sum += after.saturating_sub(before);
            }
            if let (Some(a), Some(b)) = (msgs0, nats_counts(&http, monitor).await) {
                nats_msgs.0 += b.0.saturating_sub(a.0);
                nats_msgs.1 += b.1.saturating_sub(a.1);
            }
            if let (Some(a), Some(b)) = (writes0, js_writes(&http, monitor).await) {
                for (stream, seq) in b {
                    let before = a.get(&stream).copied().unwrap_or(0);
                    *writes.entry(stream).or_default() += seq.saturating_sub(before);
                }
            }
        }
        let (d, v) = (direct.lock(), via.lock());
        let row = |path: &str, s: &PathStats, h: &Histogram<u64>| print_row(&name, path, s, h);
        let what = if stream { "TTFT" } else { "latency" };
        row(&format!("direct {what}"), &d, &d.latency);
        row(&format!("switchyard {what}"), &v, &v.latency);
        if stream {
            row("direct inter-chunk gap", &d, &d.gap);
            row("switchyard inter-chunk gap", &v, &v.gap);
        }
        let floor_summary = phase_floors.map(|f| f.report(&name, stream, &d));
        let added = added_ms;
        let requests = (v.ok + v.errors).max(1) as f64;
        let cpu_ms = v.ms_per_request(cpu_ticks);
        summary.push(format!(
            "{name}: added {what} p50 {:+.3} ms, p99 {:+.3} ms{}; CPU of the up tree {:.3} ms/request; \
             cores busy during its slices: {}; \
             NATS messages/request {:.1} in, {:.1} out; JetStream writes/request {}; peak RSS {} MB; errors direct {} / switchyard {}{}",
            added(0.5, &d.latency, &v.latency),
            added(0.99, &d.latency, &v.latency),
            if stream {
                format!(
                    ", inter-chunk gap p99 {:+.3} ms",
                    added(0.99, &d.gap, &v.gap)
                )
            } else {
                String::new()
            },
            cpu_ms,
            Cores::describe(&split, via_wall),
            nats_msgs.0 as f64 / requests,
            nats_msgs.1 as f64 / requests,
            writes
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(stream, n)| format!("{stream} {:.2}", *n as f64 / requests))
                .collect::<Vec<_>>()
                .join(", "),
            peak_rss / 1024,
            d.errors,
            v.errors,
            v.first_error_note()
        ));
        summary.extend(floor_summary);
    }
    if args.batch_items > 0 {
        let rate = args.rates.iter().copied().find(|r| *r > 0).unwrap_or(1000);
        cool_down(&http, &via_json, &counter).await;
        summary.push(batch_phase(&http, &gateway, &via_json, rate, &args, &counter).await?);
    }
    println!();
    for s in summary {
        println!("- {s}");
    }
    let (end_rss, _) = tree_usage(up_pid);
    println!(
        "- `switchyard up` process tree RSS after the run: {} MB",
        end_rss / 1024
    );
    Ok(())
}

/// The JSON body of `req`'s answer (any status); a transport or decoding failure as text.
async fn json_of(req: reqwest::RequestBuilder) -> Result<serde_json::Value, String> {
    req.send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())
}

/// Interactive latency without and with a batch running: a baseline slice, the batch submitted
/// (`--batch-items` items, each `--batch-item-ms` upstream), two slices while it runs, a
/// baseline slice after it ended; p50/p99 with the batch vs the baselines, as a ratio.
async fn batch_phase(
    http: &reqwest::Client,
    gateway: &str,
    via: &Path2,
    rate: u64,
    args: &BenchArgs,
    counter: &Arc<AtomicU64>,
) -> Result<String, String> {
    let length = Duration::from_secs(args.seconds.max(2) / 2);
    let before = Arc::new(Mutex::new(PathStats::new()?));
    slice(http, via, rate, length, false, counter, &before).await;
    let lines: Vec<String> = (0..args.batch_items)
        .map(|i| {
            serde_json::json!({"custom_id": format!("b{i}"), "method": "POST",
                "url": "/v1/chat/completions", "body": {"model": "bench/json", "max_tokens": 64,
                "messages": [{"role": "user", "content":
                    format!("#mock ttft_ms={}\nbatch item {i}", args.batch_item_ms)}]}})
            .to_string()
        })
        .collect();
    let form = reqwest::multipart::Form::new()
        .text("purpose", "batch")
        .part(
            "file",
            reqwest::multipart::Part::bytes(lines.join("\n").into_bytes()).file_name("bench.jsonl"),
        );
    let file = json_of(
        http.post(format!("{gateway}/v1/files"))
            .bearer_auth(KEY)
            .multipart(form),
    )
    .await?;
    let batch = json_of(
        http.post(format!("{gateway}/v1/batches"))
            .bearer_auth(KEY)
            .json(
                &serde_json::json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
                "completion_window": "24h"}),
            ),
    )
    .await?;
    let id = batch["id"]
        .as_str()
        .ok_or(format!("batch not created: {batch}"))?
        .to_owned();
    let status = |http: reqwest::Client, id: String| async move {
        json_of(
            http.get(format!("{gateway}/v1/batches/{id}"))
                .bearer_auth(KEY),
        )
        .await
    };
    let during = Arc::new(Mutex::new(PathStats::new()?));
    slice(http, via, rate, length, false, counter, &during).await;
    slice(http, via, rate, length, false, counter, &during).await;
    let mid = status(http.clone(), id.clone()).await?;
    let done_during = mid["request_counts"]["completed"].as_u64().unwrap_or(0)
        + mid["request_counts"]["failed"].as_u64().unwrap_or(0);
    let started = Instant::now();
    let end = loop {
        let b = status(http.clone(), id.clone()).await?;
        if matches!(
            b["status"].as_str(),
            Some("completed" | "failed" | "expired" | "cancelled")
        ) {
            break b;
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err(format!("batch {id} did not end within 600 s"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    slice(http, via, rate, length, false, counter, &before).await;
    let (b, d) = (before.lock(), during.lock());
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let row = |phase: &str, s: &PathStats| {
        println!(
            "| {phase} | switchyard latency | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | | {} |",
            ms(&s.latency, 0.5),
            ms(&s.latency, 0.9),
            ms(&s.latency, 0.99),
            ms(&s.latency, 0.999),
            s.latency.max() as f64 / 1000.0,
            s.errors
        );
    };
    row(&format!("{rate} rps JSON, no batch"), &b);
    row(
        &format!("{rate} rps JSON, {}-item batch running", args.batch_items),
        &d,
    );
    Ok(format!(
        "batch phase at {rate} rps: interactive p50 {:.3} → {:.3} ms, p99 {:.3} → {:.3} ms \
         (p99 ratio {:.2}); {done_during} of {} batch items done during the measured slices, \
         batch ended `{}` with {} completed / {} failed; errors {} / {}",
        ms(&b.latency, 0.5),
        ms(&d.latency, 0.5),
        ms(&b.latency, 0.99),
        ms(&d.latency, 0.99),
        ms(&d.latency, 0.99) / ms(&b.latency, 0.99).max(1e-9),
        args.batch_items,
        end["status"].as_str().unwrap_or(""),
        end["request_counts"]["completed"],
        end["request_counts"]["failed"],
        b.errors,
        d.errors,
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::CacheSetup;

    /// The bench config parses; `--cache-replica`, `--no-cache-key-set`, `--semantic` and
    /// `--no-cache` switch what they name, and the routes are exact-only without `--semantic`.
    #[test]
    fn the_bench_config_parses_with_each_cache_setup() {
        for (replica, key_set, semantic, enabled) in [
            (false, true, false, true),
            (true, true, false, true),
            (false, false, false, true),
            (false, true, true, true),
            (false, true, false, false),
        ] {
            let cache = CacheSetup {
                replica,
                key_set,
                semantic,
                enabled,
            };
            let dir = std::path::Path::new("/tmp/bench");
            let text = super::config_yaml(dir, 8080, 9090, 100, cache);
            let config = crate::config::parse("bench", &text, |_| None).unwrap();
            let c = &config.cache_replica;
            assert_eq!((c.enabled, c.key_set), (replica, key_set));
            assert!(config.models.iter().all(|m| {
                m.cache
                    .as_ref()
                    .is_some_and(|c| c.enabled == enabled && c.semantic == semantic)
            }));
        }
    }
}
