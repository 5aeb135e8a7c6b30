//! How the services are wired into processes: `switchyard up` (all in one), `ingress`,
//! `billing`, and the parts they share (the usage spool, live reload, the metrics listener).

use super::*;
use switchyard::topology::{
    BillingLedger, CacheSpec, IngressSpec, NatsIdentities, Topology, TopologyOptions, WorkerSpec,
};
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

/// Opens `<data_dir>/spool/<id>` as this process's usage spool and drains it until
/// `shutdown` ([`topology::start_spool`]).
pub(crate) fn start_spool(
    nats: &async_nats::Client,
    c: &GatewayConfig,
    id: &str,
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
) -> Option<Arc<Spool>> {
    let dir = PathBuf::from(&c.data_dir).join("spool").join(id);
    let subjects = Subjects::new(c.subject_prefix.clone());
    topology::start_spool(nats, &dir, &subjects, shutdown, tasks)
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

/// The text of the start-up config file (or the built-in default).
pub(crate) fn startup_text(common: &Common) -> Result<String, CliError> {
    match &common.config {
        Some(p) => {
            std::fs::read_to_string(p).map_err(|e| msg(format!("reading {}: {e}", p.display())))
        }
        None => Ok(config::DEFAULT_CONFIG.to_owned()),
    }
}

/// Binds the config's `listen` and serves an ingress on `nats` until `shutdown`.
pub(crate) async fn run_ingress(
    nats: async_nats::Client,
    handle: ConfigHandle,
    admin: AdminWiring,
    shutdown: CancellationToken,
    wiring: switchyard_ingress::Wiring,
) -> Result<(), CliError> {
    let listen = handle.get().listen.clone();
    let ingress = topology::BoundIngress::bind(nats, handle, &listen, admin, wiring)
        .await
        .map_err(msg)?;
    ingress.serve(shutdown).await.map_err(msg)
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
    let nats = match creds {
        Some(creds) => NatsIdentities::PerIdentity(creds),
        None => NatsIdentities::Shared(Box::new(c.nats.clone())),
    };
    let admin_nats = nats.config_for(Identity::Admin);
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
    // Shutdown order (`Topology::shutdown`): `shutdown` (a signal, or any service stopping)
    // stops ingress accepting and drains it; then the workers stop, the spool is flushed,
    // billing catches up, and the services token stops billing, cache, reload and the drainer.
    let shutdown = shutdown_token();
    // The spool holds the usage events of this process's ingress and worker.
    let mut topology = Topology::start(TopologyOptions {
        url: url.clone(),
        nats,
        subjects: Subjects::new(c.subject_prefix.clone()),
        spool_dir: Some(PathBuf::from(&c.data_dir).join("spool").join(new_id("up"))),
        shutdown: shutdown.clone(),
        stop_all_when_one_ends: true,
    })
    .await
    .map_err(msg)?;
    let services = topology.services_token().clone();
    let tasks = topology.tasks().clone();
    // The local model server for `builtin:local-model` targets (removed from `c` when unavailable).
    let local_model = local_model::start(&mut c, local_model, services.clone()).await;
    let handle = ConfigHandle::new_at(version, c);
    let config = handle.get();
    // The embedding model loads only when a route uses the semantic cache (now or after a reload).
    let semantic = embedding.on_demand();
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

    let started = start_services(
        &mut topology,
        &common,
        &handle,
        embedding,
        semantic,
        mock_url,
        local_model.as_ref().map(local_model::LocalModel::api_url),
        &url,
        &admin_nats,
    )
    .await;
    match &started {
        Ok(()) => {
            for m in &config.models {
                tracing::info!(model = %m.id, targets = ?m.targets, "model available");
            }
            shutdown.cancelled().await;
        }
        Err(e) => tracing::error!(error = %e, "cannot start the services; shutting down"),
    }
    let stopped = topology.shutdown().await.map_err(msg);
    if let Some(m) = local_model {
        m.stopped().await;
    }
    tracing::info!("stopped");
    started.and(stopped)
}

/// Starts `up`'s billing, cache, worker and ingress on `topology` (billing first, ingress last).
#[allow(clippy::too_many_arguments)]
async fn start_services(
    topology: &mut Topology,
    common: &Common,
    handle: &ConfigHandle,
    embedding: cache_cmd::ModelArgs,
    semantic: Option<Arc<switchyard_cache::embed::OnDemand>>,
    mock_url: Option<String>,
    local_model_url: Option<String>,
    url: &str,
    admin_nats: &switchyard_schemas::nats_config::NatsConfig,
) -> Result<(), CliError> {
    let config = handle.get();
    topology
        .start_billing(BillingLedger::Open { database_url: None }, handle)
        .await
        .map_err(msg)?;
    let wanted = semantic.is_some() && switchyard_cache::semantic_wanted(&config);
    let options = cache_cmd::ServiceArgs::default()
        .options_on_demand(topology.subjects().clone(), semantic.clone());
    let prepare = {
        let config = config.clone();
        Box::pin(async move { embedding.load_if_wanted(semantic.as_ref(), &config).await })
    };
    topology
        .start_cache(CacheSpec {
            options,
            prepare: Some(prepare),
            detail: if wanted {
                "loading embedding model"
            } else {
                "starting"
            }
            .to_owned(),
        })
        .await
        .map_err(msg)?;
    topology
        .start_worker(WorkerSpec {
            worker_id: new_id("worker"),
            config: handle.clone(),
            providers: Vec::new(),
            builtin_mock_url: mock_url,
            builtin_local_model_url: local_model_url,
        })
        .await
        .map_err(msg)?;
    topology
        .start_ingress(IngressSpec {
            config: handle.clone(),
            listen: config.listen.clone(),
            admin_writer: Some(connect(url, "switchyard-ingress-admin", admin_nats).await?),
            startup_text: Some(startup_text(common)?),
            shared: true,
        })
        .await
        .map_err(msg)?;
    Ok(())
}
