//! How the services are wired into processes: `switchyard up` (all in one), `ingress`,
//! `billing`, and the parts they share (the usage spool, live reload, the metrics listener).

use super::*;
use switchyard_publish::Spool;

/// A registry with this process's `spool` and publish-error collectors.
pub(crate) fn process_registry(
    spool: Option<&Arc<Spool>>,
) -> switchyard_schemas::metrics::Registry {
    let registry = switchyard_schemas::metrics::Registry::new();
    switchyard_publish::add_process_collectors(&registry, spool.cloned());
    registry
}

/// Serves `registry` on `addr` (when set) until `stop`, in a task on `tasks` (wait on it at exit).
pub(crate) async fn listen_metrics(
    addr: Option<SocketAddr>,
    registry: &switchyard_schemas::metrics::Registry,
    stop: &CancellationToken,
    tasks: &TaskTracker,
) -> Result<(), CliError> {
    let Some(addr) = addr else {
        return Ok(());
    };
    switchyard::metrics_listen::serve(addr, registry.clone(), stop.clone(), tasks)
        .await
        .map_err(|e| msg(format!("binding --metrics-listen {addr}: {e}")))?;
    Ok(())
}

/// Opens `<data_dir>/spool/<id>` as this process's usage spool (usage events JetStream does not
/// acknowledge are kept there; its publishers are handed it) and drains it, and spools left by
/// earlier runs, in a task on `tasks`, until `shutdown`. `None` (logged) when it cannot be opened.
pub(crate) fn start_spool(
    nats: &async_nats::Client,
    c: &GatewayConfig,
    id: &str,
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
) -> Option<Arc<Spool>> {
    let dir = PathBuf::from(&c.data_dir).join("spool").join(id);
    let spool = match Spool::open(&dir) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            tracing::warn!(spool = %dir.display(), error = %e,
                "no usage spool: usage events are dropped when NATS stays unreachable");
            return None;
        }
    };
    let js = async_nats::jetstream::new(nats.clone());
    let subjects = Subjects::new(c.subject_prefix.clone());
    tasks.spawn(switchyard_publish::drain_spool(
        js,
        subjects,
        spool.clone(),
        shutdown.clone().cancelled_owned(),
    ));
    Some(spool)
}

/// Longest final spool pass at exit; what it cannot deliver stays on disk for the next start.
pub(crate) const SPOOL_FLUSH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);
/// Longest wait at exit of `up` for billing to store the usage events already in the stream.
pub(crate) const BILLING_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(10);

/// One last spool pass before exit (the drainer task may be sleeping between passes).
pub(crate) async fn flush_spool(
    nats: &async_nats::Client,
    subjects: &Subjects,
    spool: Option<&Arc<Spool>>,
) {
    let Some(spool) = spool else {
        return;
    };
    if spool.is_empty().unwrap_or(false) {
        return;
    }
    let js = async_nats::jetstream::new(nats.clone());
    match tokio::time::timeout(SPOOL_FLUSH_DEADLINE, spool.drain(&js, subjects)).await {
        Ok(Ok(out)) => tracing::info!(
            published = out.published,
            remaining = out.remaining,
            "usage spool flushed"
        ),
        Ok(Err(e)) => tracing::warn!(error = %e,
            "usage spool not flushed; its events stay on disk for the next start"),
        Err(_) => tracing::warn!("usage spool flush timed out; the rest stays on disk"),
    }
}

/// Waits (up to `limit`) until the billing consumer has stored and acknowledged every usage
/// event in the stream, so a stopping `up` leaves a complete ledger.
pub(crate) async fn billing_caught_up(
    js: &async_nats::jetstream::Context,
    limit: std::time::Duration,
) {
    use async_nats::jetstream::consumer::pull;
    use switchyard_schemas::subjects::{BILLING_CONSUMER, USAGE_STREAM};
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let pending = match js.get_stream(USAGE_STREAM).await {
            Ok(stream) => match stream.get_consumer::<pull::Config>(BILLING_CONSUMER).await {
                Ok(consumer) => consumer
                    .get_info()
                    .await
                    .ok()
                    .map(|i| i.num_pending + i.num_ack_pending as u64),
                Err(_) => None,
            },
            Err(_) => None,
        };
        if pending == Some(0) {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                ?pending,
                "billing has not stored every usage event yet; the next start will"
            );
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Applies live config pushes (NATS KV) to `handle`, in a task on `tasks`, until `shutdown`.
pub(crate) fn spawn_reload(
    nats: &async_nats::Client,
    handle: &ConfigHandle,
    shutdown: &CancellationToken,
    fixup: reload::Fixup,
    tasks: &TaskTracker,
) {
    let (nats, handle, shutdown) = (nats.clone(), handle.clone(), shutdown.clone());
    tasks.spawn(async move {
        if let Err(e) = reload::watch_kv(nats, handle, shutdown, fixup).await {
            tracing::warn!(error = %e, "live config reload is off");
        }
    });
}

/// What the admin API of an ingress needs from its process.
pub(crate) struct AdminWiring {
    /// The connection config writes go through (the `admin` identity), if not the ingress's.
    pub(crate) writer: Option<async_nats::Client>,
    /// The config text the process started from.
    pub(crate) startup_text: String,
}

/// The text of the start-up config file (or the built-in default).
pub(crate) fn startup_text(common: &Common) -> Result<String, CliError> {
    match &common.config {
        Some(p) => {
            std::fs::read_to_string(p).map_err(|e| msg(format!("reading {}: {e}", p.display())))
        }
        None => Ok(config::DEFAULT_CONFIG.to_owned()),
    }
}

pub(crate) async fn run_ingress(
    nats: async_nats::Client,
    handle: ConfigHandle,
    admin: AdminWiring,
    shutdown: CancellationToken,
    wiring: switchyard_ingress::Wiring,
) -> Result<(), CliError> {
    let c = handle.get();
    let listener = switchyard_ingress::server::bind(&c.listen)
        .await
        .map_err(|e| msg(format!("binding {}: {e}", c.listen)))?;
    let addr = listener.local_addr().map_err(msg)?;
    let id = new_id("ingress");
    let state = switchyard_ingress::state_with(nats, handle, &id, wiring)
        .await
        .map_err(msg)?;
    if let Some(w) = admin.writer {
        state.admin.set_writer(w);
    }
    state.admin.set_startup_text(admin.startup_text);
    if c.admin.keys.is_empty() {
        tracing::info!("admin API off: no `admin.keys` configured (docs/security.md)");
    }
    let env = |k: &str| std::env::var(k).ok();
    for k in c.admin.keys.iter().filter(|k| k.sha256(&env).is_none()) {
        tracing::warn!(admin_key = %k.id,
            "admin key unusable: its `key` reference resolves to nothing (an unset or empty environment variable); requests with it get 401");
    }
    if c.keys.is_empty() {
        tracing::warn!(
            "authentication is off: no `keys` configured, any bearer token is accepted (docs/budgets.md)"
        );
    } else {
        tracing::info!(
            keys = c.keys.len(),
            tenants = c.tenants.len(),
            "API keys required"
        );
    }
    tracing::info!("ingress listening on http://{addr}");
    switchyard_ingress::serve(listener, state, shutdown.cancelled_owned())
        .await
        .map_err(msg)
}

/// The ledger at `database_url` (else the config's, else SQLite under the data dir), priced with
/// the config's catalog.
pub(crate) async fn open_ledger(
    c: &GatewayConfig,
    database_url: Option<String>,
) -> Result<switchyard_billing::Ledger, CliError> {
    let url = database_url
        .or_else(|| c.billing.database_url.clone())
        .unwrap_or_else(|| {
            format!(
                "sqlite://{}/ledger.db?mode=rwc",
                c.data_dir.trim_end_matches('/')
            )
        });
    let mut ledger = switchyard_billing::Ledger::connect(&url)
        .await
        .map_err(msg)?;
    if c.pricing_file.is_some() {
        let catalog =
            switchyard_schemas::pricing::Catalog::load(c.pricing_file.as_deref()).map_err(msg)?;
        ledger = ledger.with_catalog(catalog);
    }
    Ok(ledger.with_unpriced(c.unpriced.clone()))
}

/// Longest pause between attempts to open the ledger database.
pub(crate) const LEDGER_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// The billing consumer: opens (and migrates) the ledger, retrying until it can (`ready` says
/// what it waits for), then stores usage events priced with `handle`'s live catalog until
/// `shutdown`.
pub(crate) async fn run_billing(
    nats: async_nats::Client,
    handle: ConfigHandle,
    database_url: Option<String>,
    shutdown: CancellationToken,
    ready: Option<ReadyFlag>,
) -> Result<(), CliError> {
    let c = handle.get();
    let mut pause = std::time::Duration::from_millis(100);
    let ledger = loop {
        match open_ledger(&c, database_url.clone()).await {
            Ok(l) => break l,
            Err(e) => {
                tracing::error!(error = %e, retry_ms = pause.as_millis() as u64,
                    "billing cannot open its database; retrying");
                if let Some(r) = &ready {
                    r.waiting(format!("waiting for database: {e}"));
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(LEDGER_RETRY_MAX);
            }
        }
    };
    let ledger = ledger.with_live_catalog(handle);
    if let Some(r) = &ready {
        r.ready();
    }
    switchyard_billing::run(
        nats,
        Subjects::new(c.subject_prefix.clone()),
        ledger,
        shutdown.cancelled_owned(),
    )
    .await
    .map_err(msg)
}

pub(crate) async fn up(
    common: Common,
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    nats_port: Option<u16>,
    local_model: bool,
    embedding: cache_cmd::ModelArgs,
) -> Result<(), CliError> {
    let mut c = load(&common)?;
    config::resolve_secrets(&mut c).map_err(msg)?;
    if let Some(l) = listen {
        c.listen = l;
    }
    if let Some(d) = data_dir {
        c.data_dir = d.display().to_string();
    }
    std::fs::create_dir_all(&c.data_dir)
        .map_err(|e| msg(format!("creating {}: {e}", c.data_dir)))?;
    // One `up` per data dir, held until this process exits (even on kill -9).
    let _lock = switchyard::data_lock::DataDirLock::acquire(std::path::Path::new(&c.data_dir))
        .map_err(msg)?;
    // The private nats-server lives as long as this binding (killed on drop).
    let mut _natsd = None;
    // With the private server each service connects as its own identity; with an external one
    // all use the configured credentials.
    let mut creds = None;
    let url = match c.nats_url.clone() {
        Some(u) => u,
        None => {
            let store = PathBuf::from(&c.data_dir).join("nats");
            let (generated, file) =
                Credentials::load_or_create(std::path::Path::new(&c.data_dir)).map_err(msg)?;
            let users = switchyard::nats_auth::users(&generated, &c.subject_prefix);
            // Stops a server an old crash left on this store; the new one dies with us.
            let server = switchyard_natsd::NatsServer::start_owned(&store, nats_port, &users)
                .map_err(msg)?;
            tracing::info!(url = %server.url(), store = %store.display(),
                credentials = %file.display(), "started private nats-server (authentication on)");
            let url = server.url();
            _natsd = Some(server);
            creds = Some(generated);
            url
        }
    };
    c.nats_url = Some(url.clone());
    let nats_as = |id: Identity| match &creds {
        Some(creds) => creds.config_for(id),
        None => c.nats.clone(),
    };
    let (ingress_nats, worker_nats, billing_nats, cache_nats, admin_nats) = (
        nats_as(Identity::Ingress),
        nats_as(Identity::Worker),
        nats_as(Identity::Billing),
        nats_as(Identity::Cache),
        nats_as(Identity::Admin),
    );
    // Which config is live: `--config FILE` when it differs from KV's (pushed), else KV's, with
    // this process's local settings (listen, data dir, NATS) kept (docs/deploy.md).
    let admin = connect(&url, "switchyard-config", &admin_nats).await?;
    let file = match &common.config {
        Some(p) => Some((
            p.clone(),
            std::fs::read_to_string(p).map_err(|e| msg(format!("reading {}: {e}", p.display())))?,
        )),
        None => None,
    };
    let file_ref = file.as_ref().map(|(p, t)| (p.as_path(), t.as_str()));
    let (version, mut c) = match reload::startup(&admin, c.clone(), file_ref).await {
        Ok(v) => v,
        Err(e) => {
            // On an external NATS whose user may not create the bucket.
            tracing::warn!(error = %e, "cannot read or write the live config bucket");
            (0, c)
        }
    };
    // Shutdown order: `shutdown` (a signal, or any service stopping) stops ingress accepting and
    // drains it; only then `workers_stop` (in-flight streams need their worker), then the spool is
    // flushed, billing catches up, and `services` stops billing, cache, reload and the drainer.
    let shutdown = shutdown_token();
    let workers_stop = CancellationToken::new();
    let services = CancellationToken::new();
    // Every task of this process; the last step of the shutdown waits for them.
    let tasks = TaskTracker::new();
    // The spool holds the usage events of this process's ingress and worker.
    let spool_nats = connect(&url, "switchyard-spool", &ingress_nats).await?;
    let spool = start_spool(&spool_nats, &c, &new_id("up"), &services, &tasks);
    // The local model server for `builtin:local-model` targets (removed from `c` when unavailable).
    let local_model = local_model::start(&mut c, local_model, services.clone()).await;
    let handle = ConfigHandle::new_at(version, c);
    let config = handle.get();
    let subjects = Subjects::new(config.subject_prefix.clone());
    // The embedding model loads only when a route uses the semantic cache (now or after a reload).
    let semantic = embedding.on_demand();
    // `/readyz` is 200 once every service below has reported ready.
    let readiness = Readiness::default();
    {
        let nats = admin;
        // Without a running local model server, reloaded configs must not route to it either.
        let local_running = local_model.is_some();
        let semantic = semantic.clone();
        let fixup: reload::Fixup = Arc::new(move |c| {
            if !local_running {
                local_model::remove_from_config(c);
            }
            cache_cmd::semantic_reloaded(semantic.as_ref(), c);
            // `up` runs a worker: it needs the provider credentials in clear.
            config::resolve_secrets(c)
        });
        spawn_reload(&nats, &handle, &services, fixup, &tasks);
        if let Some(file) = common.config.clone() {
            tasks.spawn(reload::watch_file(
                nats,
                file,
                std::time::Duration::from_secs(1),
                services.clone(),
            ));
        }
    }

    // Built-in mock upstream for `builtin:mock` targets (until `services` stops: after the worker).
    let mut mock_url = None;
    if config
        .targets
        .iter()
        .any(|t| t.base_url.starts_with(BUILTIN_MOCK_URL))
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(msg)?;
        let addr = listener.local_addr().map_err(msg)?;
        mock_url = Some(format!("http://{addr}/v1"));
        let stop = services.clone();
        tasks.spawn(async move {
            let serve = switchyard_mock::serve(listener, switchyard_mock::MockState::new());
            tokio::select! {
                _ = serve => {}
                _ = stop.cancelled() => {}
            }
        });
        tracing::info!("built-in mock upstream on http://{addr}");
    }

    // Each service task fires `shutdown` when it ends, so one failing stops the rest in order.
    let spawn = |name: &'static str,
                 fut: std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<(), CliError>> + Send>,
    >| {
        let stop = shutdown.clone();
        tasks.spawn(async move {
            let r = fut.await;
            if let Err(e) = &r {
                tracing::error!(service = name, error = %e, "service failed; shutting down");
            }
            stop.cancel();
            r.map_err(|e| msg(format!("{name}: {e}")))
        })
    };
    // Billing first: it creates the usage stream the others publish to.
    let billing_js = {
        let nats = connect(&url, "switchyard-billing", &billing_nats).await?;
        let js = async_nats::jetstream::new(nats.clone());
        switchyard_billing::ensure_usage_stream(&js, &subjects)
            .await
            .map_err(msg)?;
        js
    };
    // One registry for every service of this process: ingress's `/metrics` shows them all.
    let registry = process_registry(spool.as_ref());
    switchyard_billing::lag::add_lag_collector(&registry, billing_js.clone());
    let billing = {
        let nats = connect(&url, "switchyard-billing", &billing_nats).await?;
        let handle = handle.clone();
        let token = services.clone();
        let ready = readiness.register("billing", "opening database");
        spawn(
            "billing",
            Box::pin(async move { run_billing(nats, handle, None, token, Some(ready)).await }),
        )
    };
    let cache = {
        let nats = connect(&url, "switchyard-cache", &cache_nats).await?;
        let subjects = subjects.clone();
        let token = services.clone();
        let config = config.clone();
        let wanted = semantic.is_some() && switchyard_cache::semantic_wanted(&config);
        let ready = readiness.register(
            "cache",
            if wanted {
                "loading embedding model"
            } else {
                "starting"
            },
        );
        spawn(
            "cache",
            Box::pin(async move {
                embedding
                    .load_if_wanted(semantic.as_ref(), &config)
                    .await
                    .map_err(msg)?;
                ready.waiting("rebuilding index");
                let opts = cache_cmd::ServiceArgs::default().options_on_demand(subjects, semantic);
                switchyard_cache::run_with_ready(nats, opts, token.cancelled_owned(), || {
                    ready.ready()
                })
                .await
                .map_err(msg)
            }),
        )
    };
    let worker = {
        let nats = connect(&url, "switchyard-worker", &worker_nats).await?;
        let opts = switchyard_workers::worker::WorkerOptions {
            worker_id: new_id("worker"),
            subjects: subjects.clone(),
            config: handle.clone(),
            providers: Vec::new(),
            builtin_mock_url: mock_url,
            builtin_local_model_url: local_model.as_ref().map(local_model::LocalModel::api_url),
            metrics: registry.clone(),
            spool: spool.clone(),
        };
        let token = workers_stop.clone();
        let ready = readiness.register("worker", "subscribing");
        spawn(
            "worker",
            Box::pin(async move {
                let worker = switchyard_workers::worker::Worker::subscribe(nats, opts)
                    .await
                    .map_err(msg)?;
                ready.ready();
                worker.serve(token).await;
                Ok(())
            }),
        )
    };
    let ingress = {
        let nats = connect(&url, "switchyard-ingress", &ingress_nats).await?;
        let admin = AdminWiring {
            writer: Some(connect(&url, "switchyard-ingress-admin", &admin_nats).await?),
            startup_text: startup_text(&common)?,
        };
        let handle = handle.clone();
        let token = shutdown.clone();
        let wiring = switchyard_ingress::Wiring {
            readiness: readiness.clone(),
            registry: Some(registry),
            spool: spool.clone(),
        };
        spawn(
            "ingress",
            Box::pin(async move { run_ingress(nats, handle, admin, token, wiring).await }),
        )
    };
    for m in &config.models {
        tracing::info!(model = %m.id, targets = ?m.targets, "model available");
    }
    shutdown.cancelled().await;
    let mut result = Ok(());
    let mut record = |joined: Result<Result<(), CliError>, tokio::task::JoinError>| {
        let r = joined.unwrap_or_else(|e| Err(msg(format!("service task failed: {e}"))));
        if let (Err(e), true) = (r, result.is_ok()) {
            result = Err(e);
        }
    };
    // Ingress returns once its connections drained and its usage publications finished.
    record(ingress.await);
    workers_stop.cancel();
    record(worker.await);
    flush_spool(&spool_nats, &subjects, spool.as_ref()).await;
    if !billing.is_finished() {
        billing_caught_up(&billing_js, BILLING_CATCH_UP).await;
    }
    services.cancel();
    record(billing.await);
    record(cache.await);
    if let Some(m) = local_model {
        m.stopped().await;
    }
    tasks.close();
    tasks.wait().await;
    tracing::info!("stopped");
    result
}
