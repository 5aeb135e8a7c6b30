//! In-process gateway for integration tests: a real nats-server on a random port with a temp
//! JetStream dir, the mock upstream, a worker, ingress and (optionally) billing on SQLite and the
//! cache service with the real embedding model (`Options::cache`).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub(crate) mod fanout;
pub(crate) mod http;
pub(crate) mod otlp;
pub(crate) mod procs;
pub(crate) mod up;

pub(crate) use fanout::{Answer, assert_admitted, chat_fan_out, fan_out, prompt_tokens};
pub(crate) use http::{call, cli_ok, get_as, patch_as, post_as, post_empty};

use std::time::Duration;
use switchyard_mock::MockUpstream;
use switchyard_schemas::config::{ConfigHandle, GatewayConfig};
use switchyard_schemas::subjects::Subjects;
use tokio_util::sync::CancellationToken;

pub(crate) struct Gateway {
    pub base: String,
    pub nats: switchyard_natsd::NatsServer,
    pub mock: MockUpstream,
    pub ledger: Option<switchyard_billing::Ledger>,
    pub shutdown: CancellationToken,
    pub worker_shutdown: CancellationToken,
    /// Stops the cache instance started by `Options::cache` (start another with `spawn_cache`).
    pub cache_shutdown: CancellationToken,
    /// The live config shared by ingress and the worker (reload it with `config.set`).
    pub config: ConfigHandle,
    /// The ingress state (health view, target stats, capability table, metrics).
    pub ingress: std::sync::Arc<switchyard_ingress::AppState>,
    /// The per-identity NATS passwords when started with `Options::auth` (each component then
    /// connects as its own identity; `None`: an open server).
    pub creds: Option<switchyard::nats_auth::Credentials>,
    /// The usage spool of the gateway's ingress and worker (drained until `shutdown`), under
    /// its temp dir: a gateway's spooled events never reach another test's NATS.
    pub spool: std::sync::Arc<switchyard_publish::Spool>,
    /// The services' wiring (`switchyard::topology`), shared with `spawn_ingress`.
    topology: std::sync::Arc<tokio::sync::Mutex<switchyard::topology::Topology>>,
    /// Stops billing, the cache and the spool drainer (on drop).
    services_shutdown: CancellationToken,
    _tmp: tempfile::TempDir,
}

impl Gateway {
    /// A new client of the gateway's NATS as `id` (anonymous on an open server).
    pub(crate) async fn nats_as(&self, id: switchyard::nats_auth::Identity) -> async_nats::Client {
        connect_as(&self.nats.url(), self.creds.as_ref(), id).await
    }
}

/// Connects to `url` as `id` with `creds` (plain anonymous connect without).
pub(crate) async fn connect_as(
    url: &str,
    creds: Option<&switchyard::nats_auth::Credentials>,
    id: switchyard::nats_auth::Identity,
) -> async_nats::Client {
    match creds {
        Some(c) => switchyard::nats::connect(url, id.name(), &c.config_for(id))
            .await
            .unwrap(),
        None => async_nats::connect(url).await.unwrap(),
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.worker_shutdown.cancel();
        self.cache_shutdown.cancel();
        self.services_shutdown.cancel();
    }
}

/// Targets: `mock` (the mock upstream), `dead` (a closed port); models: `demo/mock` → [mock],
/// `demo/fallback` → [dead, mock], `demo/dead` → [dead]; `claude` (Anthropic wire format on the
/// mock) → `demo/claude`.
pub(crate) fn test_config(extra: serde_json::Value) -> GatewayConfig {
    let mut v = serde_json::json!({
        "targets": [
            {"id": "mock", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "mock"},
            {"id": "dead", "provider": "openai", "base_url": "http://127.0.0.1:9/v1", "upstream_model": "mock"},
            {"id": "claude", "provider": "anthropic", "base_url": "builtin:mock", "upstream_model": "claude-test"},
            {"id": "claude-sonnet", "provider": "anthropic", "base_url": "builtin:mock", "upstream_model": "claude-sonnet-4-20250514"}
        ],
        "models": [
            {"id": "demo/mock", "targets": ["mock"]},
            {"id": "demo/fallback", "targets": ["dead", "mock"]},
            {"id": "demo/dead", "targets": ["dead"]},
            {"id": "demo/claude", "targets": ["claude"]},
            {"id": "anthropic/claude-sonnet-4", "targets": ["claude-sonnet"]},
            {"id": "demo/mock-then-claude", "targets": ["mock", "claude"]}
        ],
        "timeouts": {"first_frame_ms": 2000, "worker_silence_ms": 3000, "heartbeat_ms": 200}
    });
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        for (k, val) in e {
            o.insert(k.clone(), val.clone());
        }
    }
    let c: GatewayConfig = serde_json::from_value(v).unwrap();
    c.validate().unwrap();
    c
}

pub(crate) struct Options {
    pub config: GatewayConfig,
    pub billing: bool,
    pub worker: bool,
    /// Start a cache instance (real embedding model, see `embedder`) and give ingress a lookup
    /// timeout of 2 s, so a loaded test machine never turns a lookup into a bypass.
    pub cache: bool,
    /// Ledger URL for billing (default: SQLite in the temp dir), e.g. [`PgSchema::url`].
    pub billing_url: Option<String>,
    /// Start the server with `up`'s identities and permissions (`switchyard::nats_auth`) and
    /// connect every component as its own identity.
    pub auth: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            config: test_config(serde_json::json!({})),
            billing: false,
            worker: true,
            cache: false,
            billing_url: None,
            auth: false,
        }
    }
}

pub(crate) async fn start(opts: Options) -> Gateway {
    use switchyard::nats_auth::{Credentials, Identity};
    use switchyard::topology::{
        BillingLedger, IngressSpec, NatsIdentities, Topology, TopologyOptions,
    };
    let tmp = tempfile::tempdir().unwrap();
    let creds = opts.auth.then(Credentials::generate);
    let nats = match &creds {
        Some(c) => {
            let users = switchyard::nats_auth::users(c, &opts.config.subject_prefix);
            switchyard_natsd::NatsServer::start_temp_with_users(&users).unwrap()
        }
        None => switchyard_natsd::NatsServer::start_temp().unwrap(),
    };
    let mock = MockUpstream::start().await.unwrap();
    let config = ConfigHandle::new(opts.config);
    let subjects = Subjects::new(config.get().subject_prefix.clone());
    // The wiring of `switchyard up` (one spool and one registry for the worker and ingress),
    // without stopping the rest when a test stops one service.
    let mut topology = Topology::start(TopologyOptions {
        url: nats.url(),
        nats: match &creds {
            Some(c) => NatsIdentities::PerIdentity(c.clone()),
            None => NatsIdentities::Shared(Default::default()),
        },
        subjects: subjects.clone(),
        spool_dir: Some(tmp.path().join("spool").join("gw")),
        usage_stream: true,
        shutdown: CancellationToken::new(),
        stop_all_when_one_ends: false,
    })
    .await
    .unwrap();
    let spool = topology.spool().unwrap().clone();
    let mut ledger = None;
    if opts.billing {
        let url = opts
            .billing_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}/ledger.db?mode=rwc", tmp.path().display()));
        let catalog =
            switchyard_schemas::pricing::Catalog::load(config.get().pricing_file.as_deref())
                .unwrap();
        let l = switchyard_billing::Ledger::connect(&url)
            .await
            .unwrap()
            .with_catalog(catalog)
            .with_unpriced(config.get().unpriced.clone());
        ledger = Some(l.clone());
        topology
            .start_billing(BillingLedger::Given(l), &config)
            .await
            .unwrap();
    }
    let worker_shutdown = if opts.worker {
        let spec = worker_spec(&mock, config.clone(), "worker-a", true);
        topology.start_worker(spec).await.unwrap().stop
    } else {
        CancellationToken::new()
    };
    let cache_shutdown = if opts.cache {
        let probe = connect_as(&nats.url(), creds.as_ref(), Identity::Ingress).await;
        start_cache(&mut topology, &probe, &subjects, true).await
    } else {
        CancellationToken::new()
    };
    let ingress = topology
        .start_ingress(IngressSpec {
            config: config.clone(),
            listen: "127.0.0.1:0".to_owned(),
            admin_writer: None,
            startup_text: None,
            shared: true,
        })
        .await
        .unwrap();
    if opts.cache {
        ingress.state.cache.set_timeout(Duration::from_secs(2));
    }
    Gateway {
        base: format!("http://{}", ingress.addr),
        nats,
        mock,
        ledger,
        shutdown: topology.shutdown_token().clone(),
        worker_shutdown,
        cache_shutdown,
        config,
        ingress: ingress.state,
        creds,
        spool,
        services_shutdown: topology.services_token().clone(),
        topology: std::sync::Arc::new(tokio::sync::Mutex::new(topology)),
        _tmp: tmp,
    }
}

/// [`start`] of the default test config ([`test_config`] of `{}`) with billing.
pub(crate) async fn billed_gateway() -> Gateway {
    start_billed(test_config(serde_json::json!({}))).await
}

/// [`start`] on `config`, everything else as by default (a worker; no billing, cache or auth).
pub(crate) async fn start_config(config: GatewayConfig) -> Gateway {
    start(Options {
        config,
        ..Options::default()
    })
    .await
}

/// [`start`] on `config` with billing (SQLite ledger) and everything else as by default.
pub(crate) async fn start_billed(config: GatewayConfig) -> Gateway {
    start(Options {
        config,
        billing: true,
        ..Options::default()
    })
    .await
}

/// Starts another ingress process's worth of state (own NATS connection, own id, own budget
/// holder) on the gateway's NATS and config; returns its base URL and state.
pub(crate) async fn spawn_ingress(
    gw: &Gateway,
) -> (String, std::sync::Arc<switchyard_ingress::AppState>) {
    spawn_ingress_with(gw, gw.config.clone()).await
}

/// [`spawn_ingress`] with its own config handle (a replica with its own live-config watch).
pub(crate) async fn spawn_ingress_with(
    gw: &Gateway,
    config: ConfigHandle,
) -> (String, std::sync::Arc<switchyard_ingress::AppState>) {
    let ingress = gw
        .topology
        .lock()
        .await
        .start_ingress(switchyard::topology::IngressSpec {
            config,
            listen: "127.0.0.1:0".to_owned(),
            admin_writer: None,
            startup_text: None,
            shared: false,
        })
        .await
        .unwrap();
    (format!("http://{}", ingress.addr), ingress.state)
}

/// The real embedding model (loaded once per test binary).
pub(crate) fn embedder() -> std::sync::Arc<dyn switchyard_cache::embed::Embed> {
    static MODEL: std::sync::OnceLock<std::sync::Arc<dyn switchyard_cache::embed::Embed>> =
        std::sync::OnceLock::new();
    MODEL
        .get_or_init(|| {
            let paths = switchyard_cache::embed::ModelPaths::locate()
                .unwrap_or_else(|e| panic!("embedding model: {e}"));
            let m = switchyard_cache::embed::FastEmbedder::load(&paths, 1)
                .unwrap_or_else(|e| panic!("embedding model: {e}"));
            std::sync::Arc::new(m)
        })
        .clone()
}

/// Starts another cache instance (another process's: not in the gateway's `/readyz`) on the
/// gateway's NATS, serving `subjects`, and waits until it answers lookups; it stops when
/// `shutdown` fires.
pub(crate) async fn spawn_cache(gw: &Gateway, subjects: &Subjects, shutdown: CancellationToken) {
    let probe = async_nats::connect(gw.nats.url()).await.unwrap();
    let mut topology = gw.topology.lock().await;
    let stop = start_cache(&mut topology, &probe, subjects, false).await;
    stop_with(&topology, stop, shutdown);
}

/// Starts a cache instance (the real embedding model) on `topology`, `shared` in its readiness
/// or not, and waits until `probe` gets lookup answers; returns the token stopping it.
async fn start_cache(
    topology: &mut switchyard::topology::Topology,
    probe: &async_nats::Client,
    subjects: &Subjects,
    shared: bool,
) -> CancellationToken {
    let model = tokio::task::spawn_blocking(embedder).await.unwrap();
    let cache = topology
        .start_cache(switchyard::topology::CacheSpec {
            options: switchyard_cache::ServiceOptions::new(subjects.clone(), Some(model)),
            prepare: None,
            detail: "starting".to_owned(),
            shared,
        })
        .await
        .unwrap();
    cache_answers(probe, subjects).await;
    cache.stop
}

/// Stops `service` (a service's token) when `shutdown` fires: a task on `topology`'s tracker,
/// ending with the service.
fn stop_with(
    topology: &switchyard::topology::Topology,
    service: CancellationToken,
    shutdown: CancellationToken,
) {
    topology.tasks().spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => service.cancel(),
            _ = service.cancelled() => {}
        }
    });
}

/// Waits until `probe` gets lookup answers from a cache instance (not "no responders").
async fn cache_answers(probe: &async_nats::Client, subjects: &Subjects) {
    // Ready when a lookup gets an answer (not "no responders").
    let body = serde_json::to_vec(&switchyard_schemas::cache::LookupRequest {
        key: switchyard_schemas::cache::CacheKey {
            route: "probe".into(),
            messages: vec![],
            tools: vec![],
            tool_choice: None,
            params: Default::default(),
            tenant: None,
        },
        semantic: false,
        threshold: 1.0,
    })
    .unwrap();
    let subject = subjects.cache_lookup();
    eventually(Duration::from_secs(20), || {
        let (probe, subject, body) = (probe.clone(), subject.clone(), body.clone());
        async move { probe.request(subject, body.into()).await.ok() }
    })
    .await;
}

/// Starts another worker `id` (another process's: its own registry, no spool, not in the
/// gateway's `/readyz`) on the gateway's NATS, serving `config` (the gateway's mock upstream for
/// `builtin:mock` targets) until `shutdown` fires.
pub(crate) async fn spawn_worker(
    gw: &Gateway,
    config: ConfigHandle,
    id: &str,
    shutdown: CancellationToken,
) {
    let mut topology = gw.topology.lock().await;
    let spec = worker_spec(&gw.mock, config, id, false);
    let worker = topology.start_worker(spec).await.unwrap();
    stop_with(&topology, worker.stop, shutdown);
}

/// A worker `id` of every provider serving `config`, `builtin:mock` targets on `mock`.
fn worker_spec(
    mock: &MockUpstream,
    config: ConfigHandle,
    id: &str,
    shared: bool,
) -> switchyard::topology::WorkerSpec {
    switchyard::topology::WorkerSpec {
        worker_id: id.to_owned(),
        config,
        providers: Vec::new(),
        builtin_mock_url: Some(format!("{}/v1", mock.base_url())),
        builtin_local_model_url: None,
        shared,
    }
}

/// Polls `f` until it returns Some, or panics after `limit`.
/// Sends `req` to the cache service on the gateway's NATS (what `switchyard cache purge` sends)
/// and returns its answer.
pub(crate) async fn purge_cache(
    gw: &Gateway,
    req: switchyard_schemas::cache::PurgeRequest,
) -> switchyard_schemas::cache::PurgeReply {
    let nats = async_nats::connect(gw.nats.url()).await.unwrap();
    let msg = nats
        .request(
            switchyard_schemas::cache::purge_subject(&Subjects::default()),
            serde_json::to_vec(&req).unwrap().into(),
        )
        .await
        .unwrap();
    serde_json::from_slice(&msg.payload).unwrap()
}

pub(crate) async fn eventually<T, F, Fut>(limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A chat body with one user message.
pub(crate) fn chat(model: &str, content: &str, stream: bool) -> serde_json::Value {
    serde_json::json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": content}]})
}

/// Parsed SSE response: the `data:` payloads in order.
pub(crate) struct SseBody {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub events: Vec<String>,
}

impl SseBody {
    pub(crate) fn content(&self) -> String {
        self.json_events()
            .iter()
            .filter_map(|v| {
                v.pointer("/choices/0/delta/content")
                    .and_then(|c| c.as_str())
                    .map(str::to_owned)
            })
            .collect()
    }
    pub(crate) fn json_events(&self) -> Vec<serde_json::Value> {
        self.events
            .iter()
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap())
            .collect()
    }
    pub(crate) fn finish_reason(&self) -> Option<String> {
        self.json_events().iter().rev().find_map(|v| {
            v.pointer("/choices/0/finish_reason")
                .and_then(|c| c.as_str())
                .map(str::to_owned)
        })
    }
    /// How many chunks carry a non-empty piece of content.
    pub(crate) fn content_pieces(&self) -> usize {
        self.json_events()
            .iter()
            .filter(|e| {
                e.pointer("/choices/0/delta/content")
                    .and_then(|c| c.as_str())
                    .is_some_and(|c| !c.is_empty())
            })
            .count()
    }
    /// Every tool-call delta of the first choice, in stream order.
    pub(crate) fn tool_call_deltas(&self) -> Vec<serde_json::Value> {
        self.json_events()
            .iter()
            .filter_map(|e| {
                e.pointer("/choices/0/delta/tool_calls")?
                    .as_array()
                    .cloned()
            })
            .flatten()
            .collect()
    }
    pub(crate) fn done_count(&self) -> usize {
        self.events.iter().filter(|e| *e == "[DONE]").count()
    }
}

/// A `POST {base}/v1/chat/completions` of JSON `body` with bearer `key` on `client`, not sent.
pub(crate) fn chat_request(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    body: &serde_json::Value,
) -> reqwest::RequestBuilder {
    client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(body)
}

/// POSTs chat `body` with bearer `sk-test` and the extra `headers`: the response, not read.
pub(crate) async fn send_with(
    base: &str,
    headers: &[(&str, &str)],
    body: &serde_json::Value,
) -> reqwest::Response {
    let mut req = chat_request(&reqwest::Client::new(), base, "sk-test", body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// POSTs chat `body` with bearer `sk-test`: the response, not read.
pub(crate) async fn post(base: &str, body: &serde_json::Value) -> reqwest::Response {
    send_with(base, &[], body).await
}

/// POSTs chat `body` to `{base}/v1/chat/completions` without credentials: the response, not read.
pub(crate) async fn post_keyless(base: &str, body: &serde_json::Value) -> reqwest::Response {
    post_request(base, "/v1/chat/completions", &[], body).await
}

/// POSTs chat `body` with bearer `key`: the response, not read.
pub(crate) async fn post_keyed(
    base: &str,
    key: &str,
    body: &serde_json::Value,
) -> reqwest::Response {
    chat_request(&reqwest::Client::new(), base, key, body)
        .send()
        .await
        .unwrap()
}

/// POSTs JSON `body` to `{base}{path}` with the `headers` given and no others (no bearer): the
/// response, not read.
pub(crate) async fn post_request(
    base: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &serde_json::Value,
) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// [`post_request`], read: the status, headers and body text.
pub(crate) async fn post_to(
    base: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &serde_json::Value,
) -> (u16, reqwest::header::HeaderMap, String) {
    let resp = post_request(base, path, headers, body).await;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.text().await.unwrap())
}

/// The budget store's entry of scope `kind` `id` (a key or tenant), once no reservation is open
/// (every request settled), waiting up to 10 s.
pub(crate) async fn settled_budget(
    gw: &Gateway,
    kind: &'static str,
    id: &str,
) -> switchyard_ingress::budget::Spend {
    let scope = switchyard_ingress::budget::Scope {
        kind,
        id: id.into(),
        budget: switchyard_schemas::tenancy::Budget::default(),
    };
    eventually(Duration::from_secs(10), || {
        let (app, scope) = (gw.ingress.clone(), scope.clone());
        async move {
            let s = app.budgets.peek(&scope).await.unwrap();
            s.held.is_empty().then_some(s)
        }
    })
    .await
}

/// Waits until the ledger holds `n` usage rows for `id` and returns them.
pub(crate) async fn ledger_rows(
    ledger: &switchyard_billing::Ledger,
    id: uuid::Uuid,
    n: usize,
) -> Vec<switchyard_schemas::UsageEvent> {
    eventually(Duration::from_secs(10), || {
        let ledger = ledger.clone();
        async move {
            let rows = ledger.usage_for(id).await.unwrap();
            (rows.len() == n).then_some(rows)
        }
    })
    .await
}

/// Waits (up to `limit`) until the ledger holds a `charge` row for `id`, whatever else it holds.
pub(crate) async fn wait_charged(
    ledger: &switchyard_billing::Ledger,
    id: uuid::Uuid,
    limit: Duration,
) {
    eventually(limit, || {
        let ledger = ledger.clone();
        async move {
            let rows = ledger.usage_for(id).await.ok()?;
            rows.iter()
                .any(|r| r.kind == switchyard_schemas::UsageKind::Charge)
                .then_some(())
        }
    })
    .await;
}

pub(crate) async fn post_sse(base: &str, body: &serde_json::Value) -> SseBody {
    let resp = post(base, body).await;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    let events = text
        .split("\n\n")
        .filter_map(|block| block.strip_prefix("data: ").map(str::to_owned))
        .collect();
    SseBody {
        status,
        headers,
        events,
    }
}

/// A response read as JSON: its status, headers and body.
pub(crate) async fn read_json(
    resp: reqwest::Response,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.json().await.unwrap())
}

pub(crate) async fn post_json(
    base: &str,
    body: &serde_json::Value,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    read_json(post(base, body).await).await
}

/// POSTs `body` to `/v1/chat/completions` with extra headers; returns status, headers and JSON.
pub(crate) async fn post_with(
    base: &str,
    headers: &[(&str, &str)],
    body: &serde_json::Value,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    read_json(send_with(base, headers, body).await).await
}

/// The `data:` JSON payloads of an OpenAI-style SSE body, without the closing `[DONE]`.
pub(crate) fn data_events(text: &str) -> Vec<serde_json::Value> {
    text.split("\n\n")
        .filter_map(|b| b.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// POSTs JSON `body` to `url` without credentials (the mock upstream, directly): the body text.
pub(crate) async fn post_text(url: String, body: &serde_json::Value) -> String {
    reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The `(event name, data)` pairs of an SSE body whose blocks are `event: …` then `data: …`
/// (the Anthropic and Responses streams).
pub(crate) fn named_events(text: &str) -> Vec<(String, serde_json::Value)> {
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let (head, data) = block.split_once('\n').unwrap();
            let name = head.strip_prefix("event: ").unwrap().to_owned();
            let data = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            (name, data)
        })
        .collect()
}

/// [`named_events`], asserting each event's name is its data's `type`.
pub(crate) fn typed_events(text: &str) -> Vec<(String, serde_json::Value)> {
    let events = named_events(text);
    for (name, data) in &events {
        assert_eq!(
            data["type"],
            name.as_str(),
            "event name and data type agree"
        );
    }
    events
}

/// POSTs `body` to `/v1/chat/completions` with bearer `key`; returns status, headers and JSON.
pub(crate) async fn post_chat_as(
    base: &str,
    key: &str,
    body: &serde_json::Value,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    read_json(post_keyed(base, key, body).await).await
}

/// Writes the pricing catalog `yaml` to `dir/catalog.yaml`: its path (for `pricing_file`).
pub(crate) fn catalog_file(dir: &std::path::Path, yaml: &str) -> String {
    let path = dir.join("catalog.yaml");
    std::fs::write(&path, yaml).unwrap();
    path.display().to_string()
}

/// Sends `req`, asserts the answer is 200 and returns its JSON body.
pub(crate) async fn json_ok(req: reqwest::RequestBuilder) -> serde_json::Value {
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// The `error.message` of an error body (OpenAI's or Anthropic's shape).
pub(crate) fn error_message(body: &serde_json::Value) -> &str {
    body["error"]["message"].as_str().unwrap()
}

/// Asserts `body` is an `insufficient_quota` refusal whose message starts with `prefix`.
pub(crate) fn assert_quota_refused(body: &serde_json::Value, prefix: &str) {
    assert_eq!(body["error"]["code"], "insufficient_quota");
    let msg = error_message(body);
    assert!(msg.starts_with(prefix), "{msg}");
}

/// The request id a response names in `x-request-id`.
pub(crate) fn request_id(h: &reqwest::header::HeaderMap) -> uuid::Uuid {
    h["x-request-id"].to_str().unwrap().parse().unwrap()
}

/// Percent-encodes everything but ASCII letters and digits (a `#mock` directive value).
pub(crate) fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A prompt making the mock report `usage` (a provider's usage JSON) verbatim.
pub(crate) fn mock_usage(usage: &str) -> String {
    format!("#mock usage={}", percent_encode(usage))
}

/// The `/metrics` text.
pub(crate) async fn metrics_text(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Asserts each of `lines` is a whole line of the `/metrics` text `text`.
pub(crate) fn assert_metric_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(
            text.lines().any(|l| l == *line),
            "missing `{line}` in\n{text}"
        );
    }
}

/// How many calls the gateway's mock upstream received whose path contains `needle` (a `#mock`
/// directive's text, e.g. `status=503`).
pub(crate) fn calls_naming(gw: &Gateway, needle: &str) -> usize {
    gw.mock.state().count_matching(|r| r.path.contains(needle))
}

/// Polls `{base}/metrics` (up to `limit`) until `ready` holds for its text; returns that text.
pub(crate) async fn wait_metrics(
    base: &str,
    limit: Duration,
    ready: impl Fn(&str) -> bool,
) -> String {
    let ready = &ready;
    eventually(limit, || async move {
        let t = metrics_text(base).await;
        ready(&t).then_some(t)
    })
    .await
}

/// The value of the series `series` (name and labels exactly, as exposed) in a `/metrics` text.
pub(crate) fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Two tests of one ledger scenario `$run` (an `async fn(Option<String>)` taking the billing
/// database URL): `$sqlite` on the default SQLite ledger (`None`) and `$postgres` on a fresh
/// PostgreSQL schema, dropped after (skipped with a notice when PostgreSQL is unreachable, see
/// [`pg_schema`]). Options for `#[tokio::test(…)]` may follow the names.
macro_rules! sqlite_and_postgres {
    ($run:ident: $sqlite:ident, $postgres:ident $(, $($opt:tt)+)?) => {
        #[tokio::test $(($($opt)+))?]
        async fn $sqlite() {
            $run(None).await;
        }

        #[tokio::test $(($($opt)+))?]
        async fn $postgres() {
            let Some(schema) = $crate::common::pg_schema().await else {
                return;
            };
            $run(Some(schema.url().to_owned())).await;
            schema.drop_schema().await.unwrap();
        }
    };
}
pub(crate) use sqlite_and_postgres;

/// The PostgreSQL server tests use: `$SWITCHYARD_TEST_POSTGRES_URL` or the local default.
pub(crate) fn postgres_base_url() -> String {
    std::env::var("SWITCHYARD_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A fresh PostgreSQL schema for one test's ledger. `None` (after printing a skip notice) when
/// PostgreSQL is unreachable, unless `SWITCHYARD_REQUIRE_POSTGRES` is set (then this panics).
pub(crate) async fn pg_schema() -> Option<switchyard_billing::ledger::ScratchSchema> {
    let base = postgres_base_url();
    let created = tokio::time::timeout(
        Duration::from_secs(10),
        switchyard_billing::ledger::ScratchSchema::create(&base, "gw_test"),
    )
    .await
    .map_err(|_| "connect timed out".to_owned())
    .and_then(|r| r.map_err(|e| e.to_string()));
    match created {
        Ok(s) => Some(s),
        Err(e) if std::env::var_os("SWITCHYARD_REQUIRE_POSTGRES").is_some() => {
            panic!("PostgreSQL at {base} unreachable and SWITCHYARD_REQUIRE_POSTGRES is set: {e}")
        }
        Err(e) => {
            eprintln!(
                "SKIPPED: PostgreSQL at {base} unreachable ({e}); \
                 set SWITCHYARD_REQUIRE_POSTGRES=1 to make this a failure"
            );
            None
        }
    }
}
