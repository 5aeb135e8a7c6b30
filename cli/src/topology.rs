//! The one wiring of Switchyard's services into a process, shared by `switchyard up`, the
//! one-service commands (`ingress`, `worker`, `billing`, `cache`) and the integration tests:
//! [`Topology::start`] creates what the services share (the usage stream, the
//! usage spool and its drainer, one metrics registry, one [`TaskTracker`], the readiness
//! components of `/readyz`), its `start_*` methods start billing, cache, workers and ingress
//! (each optional, any number of workers and ingress), and [`Topology::shutdown`] stops them in
//! order: ingress drains first, then the workers, then the spool is flushed, billing catches up,
//! and billing, cache and every other task on [`Topology::services_token`] stop last.

use crate::nats::NatsConnectError;
use crate::nats_auth::{Credentials, Identity};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use switchyard_publish::Spool;
use switchyard_schemas::config::{ConfigHandle, GatewayConfig, ProviderKind};
use switchyard_schemas::metrics::Registry;
use switchyard_schemas::nats_config::NatsConfig;
use switchyard_schemas::ready::{Readiness, ReadyFlag};
use switchyard_schemas::subjects::Subjects;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why a part of the topology could not be started, or how a service ended.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// A service's NATS connection could not be made.
    #[error(transparent)]
    Connect(#[from] NatsConnectError),
    /// A service could not start, or ended with an error (shown as `billing: …`).
    #[error("{service}: {error}")]
    Service {
        /// Which service: `billing`, `cache`, `worker` or `ingress`.
        service: &'static str,
        /// What failed, described.
        error: String,
    },
    /// Anything else, described.
    #[error("{0}")]
    Msg(String),
}

fn msg(e: impl std::fmt::Display) -> TopologyError {
    TopologyError::Msg(e.to_string())
}

/// The NATS credentials each service connects with.
#[derive(Debug, Clone)]
pub enum NatsIdentities {
    /// Every service connects with this one `nats:` section (an external NATS).
    Shared(Box<NatsConfig>),
    /// Each service connects as its own identity ([`Credentials::config_for`]): the private
    /// server of `up`, whose permissions are `crate::nats_auth::users`.
    PerIdentity(Credentials),
}

impl NatsIdentities {
    /// The connection settings of identity `id`.
    pub fn config_for(&self, id: Identity) -> NatsConfig {
        match self {
            NatsIdentities::Shared(c) => (**c).clone(),
            NatsIdentities::PerIdentity(creds) => creds.config_for(id),
        }
    }
}

/// What [`Topology::start`] needs.
pub struct TopologyOptions {
    /// NATS URL (several, comma-separated, for a cluster; see [`crate::nats::connect`]).
    pub url: String,
    /// How each service authenticates.
    pub nats: NatsIdentities,
    /// The subject prefix every service uses.
    pub subjects: Subjects,
    /// Directory of this process's usage spool (created if missing), for a process whose
    /// ingress or workers publish usage; the registry then has the spool and publish-error
    /// metrics. `None`: no spool and no such metrics (a lone billing or cache).
    pub spool_dir: Option<PathBuf>,
    /// `true`: creates the usage stream (as billing) before any service starts, and the
    /// registry reports billing's lag (`up`, the tests, `switchyard billing`); `false`: neither
    /// (a lone ingress, worker or cache, whose NATS identity may not create streams).
    pub usage_stream: bool,
    /// Stops the ingress (a signal); [`Topology::shutdown`] fires it too.
    pub shutdown: CancellationToken,
    /// `true`: any service ending on its own fires `shutdown` (one failing stops the rest in
    /// order, as `up` wants); `false`: the others keep running (tests stopping one service).
    pub stop_all_when_one_ends: bool,
}

type ServiceTask = JoinHandle<Result<(), TopologyError>>;

/// The services of one process and what they share. Create with [`Topology::start`], add
/// services with the `start_*` methods, stop with [`Topology::shutdown`].
pub struct Topology {
    url: String,
    nats: NatsIdentities,
    subjects: Subjects,
    shutdown: CancellationToken,
    workers_stop: CancellationToken,
    services: CancellationToken,
    tasks: TaskTracker,
    stop_all_when_one_ends: bool,
    spool: Option<Arc<Spool>>,
    spool_nats: Option<async_nats::Client>,
    billing_js: Option<async_nats::jetstream::Context>,
    registry: Registry,
    readiness: Readiness,
    ingress: Vec<ServiceTask>,
    workers: Vec<ServiceTask>,
    billing: Option<ServiceTask>,
    caches: Vec<ServiceTask>,
}

/// A started service: stop it alone with its token (a child of the topology's, so
/// [`Topology::shutdown`] stops it too).
#[derive(Debug, Clone)]
pub struct ServiceHandle {
    /// Cancel to stop this service only.
    pub stop: CancellationToken,
}

/// A started ingress.
pub struct IngressHandle {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// Its state (health view, target stats, admin API, metrics).
    pub state: Arc<switchyard_ingress::AppState>,
    /// Cancel to stop this ingress only (it drains its connections first).
    pub stop: CancellationToken,
}

/// Which ledger billing writes.
pub enum BillingLedger {
    /// Opens (and migrates) the ledger at this URL (`None`: the config's, else SQLite under the
    /// data dir, see [`open_ledger`]), retrying until it can; priced with the live catalog.
    Open {
        /// The database URL, overriding the config's.
        database_url: Option<String>,
    },
    /// This ledger, as it is.
    Given(switchyard_billing::Ledger),
}

/// A worker to start.
pub struct WorkerSpec {
    /// Its id (in replies and metrics), e.g. `worker-<uuid>`.
    pub worker_id: String,
    /// The live config it reads targets and credentials from.
    pub config: ConfigHandle,
    /// Provider queues it serves; empty: every configured one.
    pub providers: Vec<ProviderKind>,
    /// Base URL (with `/v1`) that `builtin:mock` targets resolve to.
    pub builtin_mock_url: Option<String>,
    /// Base URL (with `/v1`) that `builtin:local-model` targets resolve to.
    pub builtin_local_model_url: Option<String>,
    /// `true`: records into the topology's registry, spools into its spool and is in its
    /// readiness (a worker of this process); `false`: its own registry, no spool, not in
    /// `/readyz` (another process's worker).
    pub shared: bool,
}

/// Work a cache instance does before it subscribes (e.g. loading the embedding model); its
/// error ends the cache service.
pub type CachePrepare =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// A cache instance to start.
pub struct CacheSpec {
    /// The service's settings.
    pub options: switchyard_cache::ServiceOptions,
    /// Runs first, while `/readyz` shows `detail`; then the index is rebuilt.
    pub prepare: Option<CachePrepare>,
    /// What `/readyz` shows until the cache is ready, e.g. `"loading embedding model"`.
    pub detail: String,
    /// `true`: in the topology's readiness (a cache of this process); `false`: not in
    /// `/readyz` (another process's cache).
    pub shared: bool,
}

/// An ingress to start.
pub struct IngressSpec {
    /// The live config it serves (a replica may have its own handle).
    pub config: ConfigHandle,
    /// Address to listen on, e.g. `0.0.0.0:8080` or `127.0.0.1:0` (any free port).
    pub listen: String,
    /// The connection config writes of the admin API go through (the `admin` identity);
    /// `None`: the ingress's own.
    pub admin_writer: Option<async_nats::Client>,
    /// The config text the process started from (admin API); `None`: not set.
    pub startup_text: Option<String>,
    /// `true`: shares the topology's registry, spool and readiness (an ingress of this process);
    /// `false`: its own registry and readiness and no spool (another process's ingress).
    pub shared: bool,
}

impl Topology {
    /// Connects to NATS; opens the usage spool (when `opts.spool_dir` is set; one that cannot
    /// be opened is logged and skipped) and drains it until [`Self::services_token`] stops;
    /// creates the usage stream (with `opts.usage_stream`); creates the metrics registry (with
    /// the process collectors when there is a spool dir, the billing-lag collector with the
    /// usage stream). Errors: a connection refused, the stream not creatable.
    pub async fn start(opts: TopologyOptions) -> Result<Self, TopologyError> {
        let services = CancellationToken::new();
        let tasks = TaskTracker::new();
        // One registry for every service of this process: ingress's `/metrics` shows them all.
        let registry = Registry::new();
        // The spool holds the usage events of this process's ingress and workers.
        let (spool_nats, spool) = match &opts.spool_dir {
            Some(dir) => {
                let nats = crate::nats::connect(
                    &opts.url,
                    "switchyard-spool",
                    &opts.nats.config_for(Identity::Ingress),
                )
                .await?;
                let spool = start_spool(&nats, dir, &opts.subjects, &services, &tasks);
                switchyard_publish::add_process_collectors(&registry, spool.clone());
                (Some(nats), spool)
            }
            None => (None, None),
        };
        // Billing's identity creates the usage stream the others publish to.
        let billing_js = if opts.usage_stream {
            let nats = crate::nats::connect(
                &opts.url,
                "switchyard-billing",
                &opts.nats.config_for(Identity::Billing),
            )
            .await?;
            let js = async_nats::jetstream::new(nats);
            switchyard_billing::ensure_usage_stream(&js, &opts.subjects)
                .await
                .map_err(msg)?;
            switchyard_billing::lag::add_lag_collector(&registry, js.clone());
            Some(js)
        } else {
            None
        };
        Ok(Self {
            url: opts.url,
            nats: opts.nats,
            subjects: opts.subjects,
            shutdown: opts.shutdown,
            workers_stop: CancellationToken::new(),
            services,
            tasks,
            stop_all_when_one_ends: opts.stop_all_when_one_ends,
            spool,
            spool_nats,
            billing_js,
            registry,
            readiness: Readiness::default(),
            ingress: Vec::new(),
            workers: Vec::new(),
            billing: None,
            caches: Vec::new(),
        })
    }

    /// A new connection to the topology's NATS as `id`, named `name` in the server's list.
    pub async fn connect(
        &self,
        id: Identity,
        name: &str,
    ) -> Result<async_nats::Client, TopologyError> {
        Ok(crate::nats::connect(&self.url, name, &self.nats.config_for(id)).await?)
    }

    /// The subjects every service uses.
    pub fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    /// The usage spool, if one is open.
    pub fn spool(&self) -> Option<&Arc<Spool>> {
        self.spool.as_ref()
    }

    /// The metrics registry the services of this topology record into.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The readiness components `/readyz` of a shared ingress reports.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// The tracker [`Self::shutdown`] waits on: spawn the process's other tasks here.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Fired first at shutdown: stops the ingress.
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Fired after the workers stopped and billing caught up: billing, cache, the spool drainer
    /// and whatever else the process put on it (reload, a mock upstream) stop.
    pub fn services_token(&self) -> &CancellationToken {
        &self.services
    }

    /// The topology's readiness for a `shared` service, else a readiness of its own (not shown).
    fn readiness_of(&self, shared: bool) -> Readiness {
        match shared {
            true => self.readiness.clone(),
            false => Readiness::default(),
        }
    }

    /// Runs `fut` as service `name` on the tracker; it stops on `stop` (its own business). Its
    /// error is logged and prefixed with `name`; with `stop_all_when_one_ends` its end fires
    /// the shutdown.
    fn spawn_service(
        &self,
        name: &'static str,
        fut: impl std::future::Future<Output = Result<(), String>> + Send + 'static,
    ) -> ServiceTask {
        let (stop_all, all) = (self.stop_all_when_one_ends, self.shutdown.clone());
        self.tasks.spawn(async move {
            let r = fut.await;
            if let Err(e) = &r {
                tracing::error!(service = name, error = %e, "service failed; shutting down");
            }
            if stop_all {
                all.cancel();
            }
            r.map_err(|error| TopologyError::Service {
                service: name,
                error,
            })
        })
    }

    /// Starts the billing consumer (readiness component `billing`) on its own connection;
    /// it stores the usage events of the stream in `ledger` until the services stop.
    /// `config` gives the database URL, pricing and subject prefix. One billing per topology
    /// (a second replaces the first in [`Self::shutdown`]'s order).
    pub async fn start_billing(
        &mut self,
        ledger: BillingLedger,
        config: &ConfigHandle,
    ) -> Result<ServiceHandle, TopologyError> {
        let nats = self
            .connect(Identity::Billing, "switchyard-billing")
            .await?;
        let stop = self.services.child_token();
        let ready = self.readiness.register("billing", "opening database");
        let token = stop.clone();
        let task = match ledger {
            BillingLedger::Open { database_url } => {
                let handle = config.clone();
                self.spawn_service("billing", async move {
                    run_billing(nats, handle, database_url, token, Some(ready)).await
                })
            }
            BillingLedger::Given(ledger) => {
                let subjects = self.subjects.clone();
                self.spawn_service("billing", async move {
                    ready.ready();
                    switchyard_billing::run(nats, subjects, ledger, token.cancelled_owned())
                        .await
                        .map_err(|e| e.to_string())
                })
            }
        };
        self.billing = Some(task);
        Ok(ServiceHandle { stop })
    }

    /// Starts a cache instance (readiness component `cache`) on its own connection, until the
    /// services stop. Returns at once (see [`CacheSpec::prepare`]).
    pub async fn start_cache(&mut self, spec: CacheSpec) -> Result<ServiceHandle, TopologyError> {
        let nats = self.connect(Identity::Cache, "switchyard-cache").await?;
        let stop = self.services.child_token();
        let ready = self
            .readiness_of(spec.shared)
            .register("cache", &spec.detail);
        let token = stop.clone();
        let task = self.spawn_service("cache", async move {
            if let Some(prepare) = spec.prepare {
                prepare.await?;
            }
            ready.waiting("rebuilding index");
            switchyard_cache::run_with_ready(nats, spec.options, token.cancelled_owned(), || {
                ready.ready()
            })
            .await
            .map_err(|e| e.to_string())
        });
        self.caches.push(task);
        Ok(ServiceHandle { stop })
    }

    /// Starts a worker (readiness component `worker`) on its own connection, recording into the
    /// registry and spooling into the spool; returns once it is subscribed, and it serves until
    /// the workers stop. Errors: the connection or the subscription failed.
    pub async fn start_worker(&mut self, spec: WorkerSpec) -> Result<ServiceHandle, TopologyError> {
        let ready = self
            .readiness_of(spec.shared)
            .register("worker", "subscribing");
        let nats = self.connect(Identity::Worker, "switchyard-worker").await?;
        let (metrics, spool) = match spec.shared {
            true => (self.registry.clone(), self.spool.clone()),
            false => (Registry::new(), None),
        };
        let opts = switchyard_workers::worker::WorkerOptions {
            worker_id: spec.worker_id,
            subjects: self.subjects.clone(),
            config: spec.config,
            providers: spec.providers,
            builtin_mock_url: spec.builtin_mock_url,
            builtin_local_model_url: spec.builtin_local_model_url,
            metrics,
            spool,
        };
        let worker = switchyard_workers::worker::Worker::subscribe(nats, opts)
            .await
            .map_err(|e| TopologyError::Service {
                service: "worker",
                error: e.to_string(),
            })?;
        ready.ready();
        let stop = self.workers_stop.child_token();
        let token = stop.clone();
        let task = self.spawn_service("worker", async move {
            worker.serve(token).await;
            Ok(())
        });
        self.workers.push(task);
        Ok(ServiceHandle { stop })
    }

    /// Binds `spec.listen` and starts an ingress (id `ingress-<uuid>`) on its own connection,
    /// serving until the shutdown. Logs its authentication and admin API state. Errors: the
    /// connection, the bind or the ingress state failed (prefixed `ingress: `).
    pub async fn start_ingress(
        &mut self,
        spec: IngressSpec,
    ) -> Result<IngressHandle, TopologyError> {
        let nats = self
            .connect(Identity::Ingress, "switchyard-ingress")
            .await?;
        let wiring = if spec.shared {
            switchyard_ingress::Wiring {
                readiness: self.readiness.clone(),
                registry: Some(self.registry.clone()),
                spool: self.spool.clone(),
            }
        } else {
            switchyard_ingress::Wiring::default()
        };
        let admin = AdminWiring {
            writer: spec.admin_writer,
            startup_text: spec.startup_text,
        };
        let ingress = BoundIngress::bind(nats, spec.config, &spec.listen, admin, wiring)
            .await
            .map_err(|error| TopologyError::Service {
                service: "ingress",
                error,
            })?;
        let (addr, state) = (ingress.addr, ingress.state.clone());
        let stop = self.shutdown.child_token();
        let token = stop.clone();
        let task = self.spawn_service("ingress", ingress.serve(token));
        self.ingress.push(task);
        Ok(IngressHandle { addr, state, stop })
    }

    /// Stops everything in order and waits for every task: fires the shutdown and waits for
    /// each ingress to drain (its usage publications finished), stops the workers and waits for
    /// them, flushes the spool (at most [`SPOOL_FLUSH_DEADLINE`]), waits for billing to store
    /// what is in the stream (at most [`BILLING_CATCH_UP`]; only when this topology ran an
    /// ingress or a worker, and created the usage stream), stops billing, cache and the rest
    /// of [`Self::services_token`]. Returns the first service error (ingress, workers, billing,
    /// cache in that order).
    pub async fn shutdown(self) -> Result<(), TopologyError> {
        let mut result = Ok(());
        let mut record = |joined: Result<Result<(), TopologyError>, tokio::task::JoinError>| {
            let r = joined.unwrap_or_else(|e| Err(msg(format!("service task failed: {e}"))));
            if let (Err(e), true) = (r, result.is_ok()) {
                result = Err(e);
            }
        };
        // Billing catches up with what this process's ingress and workers published.
        let published = !self.ingress.is_empty() || !self.workers.is_empty();
        self.shutdown.cancel();
        // Ingress returns once its connections drained and its usage publications finished.
        for task in self.ingress {
            record(task.await);
        }
        // In-flight streams needed their worker until then.
        self.workers_stop.cancel();
        for task in self.workers {
            record(task.await);
        }
        if let Some(nats) = &self.spool_nats {
            flush_spool(nats, &self.subjects, self.spool.as_ref()).await;
        }
        if let (Some(billing), Some(js), true) = (&self.billing, &self.billing_js, published)
            && !billing.is_finished()
        {
            billing_caught_up(js, BILLING_CATCH_UP).await;
        }
        self.services.cancel();
        if let Some(billing) = self.billing {
            record(billing.await);
        }
        for task in self.caches {
            record(task.await);
        }
        self.tasks.close();
        self.tasks.wait().await;
        result
    }
}

/// What the admin API of an ingress needs from its process.
struct AdminWiring {
    /// The connection config writes go through (the `admin` identity), if not the ingress's.
    writer: Option<async_nats::Client>,
    /// The config text the process started from, if known.
    startup_text: Option<String>,
}

/// An ingress bound to its address, not serving yet.
struct BoundIngress {
    listener: tokio::net::TcpListener,
    /// The address it listens on.
    addr: SocketAddr,
    /// Its state.
    state: Arc<switchyard_ingress::AppState>,
}

impl BoundIngress {
    /// Builds the state of an ingress `ingress-<uuid>` on `nats`, serving `handle`, then binds
    /// `listen`; logs whether API keys and the admin API are on. Errors (described): the bind
    /// or the state (its KV buckets) failed.
    async fn bind(
        nats: async_nats::Client,
        handle: ConfigHandle,
        listen: &str,
        admin: AdminWiring,
        wiring: switchyard_ingress::Wiring,
    ) -> Result<Self, String> {
        let c = handle.get();
        let id = format!("ingress-{}", uuid::Uuid::now_v7().simple());
        let state = switchyard_ingress::state_with(nats, handle, &id, wiring)
            .await
            .map_err(|e| e.to_string())?;
        // Bound only once the state is built (its KV buckets can take seconds on a loaded
        // cluster): until then a balancer's connection is refused and goes to another ingress,
        // instead of waiting unaccepted in the backlog.
        let listener = switchyard_ingress::server::bind(listen)
            .await
            .map_err(|e| format!("binding {listen}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        if let Some(w) = admin.writer {
            state.admin.set_writer(w);
        }
        if let Some(text) = admin.startup_text {
            state.admin.set_startup_text(text);
        }
        log_auth(&c);
        tracing::info!("ingress listening on http://{addr}");
        Ok(Self {
            listener,
            addr,
            state,
        })
    }

    /// Serves until `shutdown`, then drains the open connections. Errors: the server failed.
    async fn serve(self, shutdown: CancellationToken) -> Result<(), String> {
        switchyard_ingress::serve(self.listener, self.state, shutdown.cancelled_owned())
            .await
            .map_err(|e| e.to_string())
    }
}

/// Logs whether the admin API is on, admin keys that resolve to nothing, and whether API keys
/// are required.
fn log_auth(c: &GatewayConfig) {
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
}

/// Opens `dir` as a usage spool (usage events JetStream does not acknowledge are kept there;
/// its publishers are handed it) and drains it, and spools left by earlier runs, in a task on
/// `tasks`, until `stop`. `None` (logged) when it cannot be opened.
fn start_spool(
    nats: &async_nats::Client,
    dir: &std::path::Path,
    subjects: &Subjects,
    stop: &CancellationToken,
    tasks: &TaskTracker,
) -> Option<Arc<Spool>> {
    let spool = match Spool::open(dir) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            tracing::warn!(spool = %dir.display(), error = %e,
                "no usage spool: usage events are dropped when NATS stays unreachable");
            return None;
        }
    };
    tasks.spawn(switchyard_publish::drain_spool(
        async_nats::jetstream::new(nats.clone()),
        subjects.clone(),
        spool.clone(),
        stop.clone().cancelled_owned(),
    ));
    Some(spool)
}

/// Longest final spool pass at exit; what it cannot deliver stays on disk for the next start.
pub const SPOOL_FLUSH_DEADLINE: Duration = Duration::from_secs(10);
/// Longest wait at shutdown for billing to store the usage events already in the stream.
pub const BILLING_CATCH_UP: Duration = Duration::from_secs(10);

/// One last spool pass before exit (the drainer task may be sleeping between passes), at most
/// [`SPOOL_FLUSH_DEADLINE`]; the outcome is logged.
async fn flush_spool(nats: &async_nats::Client, subjects: &Subjects, spool: Option<&Arc<Spool>>) {
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
/// event in the stream, so a stopping process leaves a complete ledger (logged when not).
async fn billing_caught_up(js: &async_nats::jetstream::Context, limit: Duration) {
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
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The ledger at `database_url` (else the config's, else SQLite `<data_dir>/ledger.db`),
/// priced with the config's catalog. Errors (described): the database or the pricing file.
pub async fn open_ledger(
    c: &GatewayConfig,
    database_url: Option<String>,
) -> Result<switchyard_billing::Ledger, String> {
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
        .map_err(|e| e.to_string())?;
    if c.pricing_file.is_some() {
        let catalog = switchyard_schemas::pricing::Catalog::load(c.pricing_file.as_deref())
            .map_err(|e| e.to_string())?;
        ledger = ledger.with_catalog(catalog);
    }
    Ok(ledger.with_unpriced(c.unpriced.clone()))
}

/// Longest pause between attempts to open the ledger database.
pub const LEDGER_RETRY_MAX: Duration = Duration::from_secs(5);

/// The billing consumer: opens (and migrates) the ledger ([`open_ledger`]), retrying with
/// backoff up to [`LEDGER_RETRY_MAX`] until it can (`ready` says what it waits for), then
/// stores usage events priced with `handle`'s live catalog until `shutdown`. Errors
/// (described): the consumer failed.
async fn run_billing(
    nats: async_nats::Client,
    handle: ConfigHandle,
    database_url: Option<String>,
    shutdown: CancellationToken,
    ready: Option<ReadyFlag>,
) -> Result<(), String> {
    let c = handle.get();
    let mut pause = Duration::from_millis(100);
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
    .map_err(|e| e.to_string())
}
