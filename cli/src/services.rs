//! How the services are wired into processes (each a [`Topology`]): `switchyard up` (all in
//! one), the one-service commands `ingress`, `worker`, `billing` and `cache`, and the parts they
//! share (live reload, the metrics listener).

use super::*;
use switchyard::topology::{
    BillingLedger, CacheSpec, IngressSpec, NatsIdentities, Topology, TopologyError,
    TopologyOptions, WorkerSpec,
};

/// Serves the registry of `topology` on `addr` (when set) until its services stop, in a task on
/// its tracker (waited on at exit).
async fn listen_metrics(topology: &Topology, addr: Option<SocketAddr>) -> Result<(), CliError> {
    let Some(addr) = addr else {
        return Ok(());
    };
    let (registry, stop) = (topology.registry(), topology.services_token());
    switchyard::metrics_listen::serve(addr, registry.clone(), stop.clone(), topology.tasks())
        .await
        .map_err(|e| msg(format!("binding --metrics-listen {addr}: {e}")))?;
    Ok(())
}

/// Applies live config pushes (NATS KV) to `handle`, in a task on `tasks`, until `shutdown`.
fn spawn_reload(
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
fn startup_text(common: &Common) -> Result<String, CliError> {
    match &common.config {
        Some(p) => read_text(p).map_err(msg),
        None => Ok(config::DEFAULT_CONFIG.to_owned()),
    }
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
        Some(p) => Some((p.clone(), read_text(p).map_err(msg)?)),
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
        usage_stream: true,
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
            shared: true,
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
            shared: true,
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

/// Runs a process of one service (`ingress`, `worker`, `billing`, `cache`) against `c`'s
/// NATS, every connection with `c`'s `nats:` settings: `start` adds the service to its
/// [`Topology`] (with `spool`, for `ingress` and `worker`, the usage spool is
/// `<data_dir>/spool/<spool>-<id>`; with `usage_stream`, the usage stream is created and
/// billing's lag reported); then it runs until a signal or the service's end, and stops in the
/// topology's order ([`Topology::shutdown`]). The start's error, else the service's.
async fn one_service(
    c: &GatewayConfig,
    spool: Option<&str>,
    usage_stream: bool,
    start: impl AsyncFnOnce(&mut Topology) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let mut topology = Topology::start(TopologyOptions {
        url: require_nats(c)?,
        nats: NatsIdentities::Shared(Box::new(c.nats.clone())),
        subjects: Subjects::new(c.subject_prefix.clone()),
        spool_dir: spool.map(|kind| PathBuf::from(&c.data_dir).join("spool").join(new_id(kind))),
        usage_stream,
        shutdown: shutdown_token(),
        stop_all_when_one_ends: true,
    })
    .await
    .map_err(service_error)?;
    let started = start(&mut topology).await;
    if started.is_ok() {
        topology.shutdown_token().cancelled().await;
    }
    let stopped = topology.shutdown().await.map_err(service_error);
    started.and(stopped)
}

/// Applies live config pushes to `handle` until the services of `topology` stop, on a
/// connection of its own as `id` (`switchyard-config`).
async fn reload_as(
    topology: &Topology,
    id: Identity,
    handle: &ConfigHandle,
    fixup: reload::Fixup,
) -> Result<(), CliError> {
    let nats = topology
        .connect(id, "switchyard-config")
        .await
        .map_err(msg)?;
    spawn_reload(
        &nats,
        handle,
        topology.services_token(),
        fixup,
        topology.tasks(),
    );
    Ok(())
}

/// The error of a one-service process: a service's own description, without its name.
fn service_error(e: TopologyError) -> CliError {
    match e {
        TopologyError::Service { error, .. } => CliError::Msg(error),
        e => msg(e),
    }
}

/// `switchyard ingress`: the config's `listen` (or `listen`), the spool and live reload; the
/// admin API writes as `admin_user` when given. Reload and the spool drainer outlive the HTTP
/// drain; the spool is flushed last.
pub(crate) async fn ingress(
    common: Common,
    listen: Option<String>,
    admin_user: Option<String>,
    admin_password: Option<String>,
) -> Result<(), CliError> {
    let mut c = load(&common)?;
    if let Some(l) = listen {
        c.listen = l;
    }
    let handle = ConfigHandle::new(c);
    one_service(&handle.get(), Some("ingress"), false, async |topology| {
        reload_as(topology, Identity::Ingress, &handle, Arc::new(|_| Ok(()))).await?;
        let config = handle.get();
        let admin_writer = match admin_user {
            Some(user) => {
                let mut n = config.nats.clone();
                n.user = Some(user);
                n.password = admin_password.map(switchyard_schemas::Secret::new);
                n.inbox_prefix = Some(Identity::Admin.inbox_prefix());
                let url = require_nats(&config)?;
                Some(connect(&url, "switchyard-ingress-admin", &n).await?)
            }
            None => None,
        };
        topology
            .start_ingress(IngressSpec {
                config: handle.clone(),
                listen: config.listen.clone(),
                admin_writer,
                startup_text: Some(startup_text(&common)?),
                shared: true,
            })
            .await
            .map_err(service_error)?;
        Ok(())
    })
    .await
}

/// `switchyard worker`: one worker serving `providers` (all configured when empty), with the
/// spool, live reload (credentials decrypted here, in the process that uses them only) and its
/// metrics on `metrics_listen`; it stops after its in-flight requests and their usage
/// publications finished.
pub(crate) async fn worker(
    common: Common,
    providers: Vec<ProviderKind>,
    builtin_mock_url: Option<String>,
    builtin_local_model_url: Option<String>,
    metrics_listen: Option<SocketAddr>,
) -> Result<(), CliError> {
    let mut c = load(&common)?;
    config::resolve_secrets(&mut c).map_err(msg)?;
    let handle = ConfigHandle::new(c);
    one_service(&handle.get(), Some("worker"), false, async |topology| {
        let resolve = Arc::new(config::resolve_secrets);
        reload_as(topology, Identity::Worker, &handle, resolve).await?;
        listen_metrics(topology, metrics_listen).await?;
        topology
            .start_worker(WorkerSpec {
                worker_id: new_id("worker"),
                config: handle.clone(),
                providers,
                builtin_mock_url,
                builtin_local_model_url,
                shared: true,
            })
            .await
            .map_err(service_error)?;
        Ok(())
    })
    .await
}

/// `switchyard billing`: the billing consumer on the ledger at `database_url` (else the
/// config's), with live reload (a pushed `pricing_file` prices the next usage row) and the
/// billing metrics on `metrics_listen`.
pub(crate) async fn billing(
    common: Common,
    database_url: Option<String>,
    metrics_listen: Option<SocketAddr>,
) -> Result<(), CliError> {
    let c = load(&common)?;
    let handle = ConfigHandle::new(c);
    one_service(&handle.get(), None, true, async |topology| {
        reload_as(topology, Identity::Billing, &handle, Arc::new(|_| Ok(()))).await?;
        listen_metrics(topology, metrics_listen).await?;
        topology
            .start_billing(BillingLedger::Open { database_url }, &handle)
            .await
            .map_err(service_error)?;
        Ok(())
    })
    .await
}

/// `switchyard cache` (no action): loads the embedding model when a route uses the semantic
/// cache (a reload that turns it on loads it then), then serves lookups with live reload.
pub(crate) async fn cache(args: cache_cmd::CacheArgs) -> Result<(), CliError> {
    let c = load(&args.common)?;
    let handle = ConfigHandle::new(c);
    one_service(&handle.get(), None, false, async |topology| {
        let semantic = args.model.on_demand();
        args.model
            .load_if_wanted(semantic.as_ref(), &handle.get())
            .await
            .map_err(msg)?;
        let options = args
            .service
            .options_on_demand(topology.subjects().clone(), semantic.clone());
        let fixup: reload::Fixup = Arc::new(move |c| {
            cache_cmd::semantic_reloaded(semantic.as_ref(), c);
            Ok(())
        });
        reload_as(topology, Identity::Cache, &handle, fixup).await?;
        topology
            .start_cache(CacheSpec {
                options,
                prepare: None,
                detail: "starting".to_owned(),
                shared: true,
            })
            .await
            .map_err(service_error)?;
        Ok(())
    })
    .await
}
