//! `switchyard`: the CLI wiring Switchyard's services. `up` runs everything in one process; the
//! other subcommands run one service each against a shared NATS (the distributed topology).

use switchyard::nats::NatsArgs;
use switchyard::nats_auth::{Credentials, Identity};
use switchyard::{config, reload};
mod balance_cmd;
mod batch_cmd;
mod bench;
mod bench_billing;
mod cache_cmd;
mod key_cmd;
mod local_model;
mod log_format;
mod pricing_cmd;
mod report_cmd;
mod requests_cmd;
mod secret_cmd;
mod telemetry;

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use switchyard_schemas::config::{BUILTIN_MOCK_URL, ConfigHandle, GatewayConfig, ProviderKind};
use switchyard_schemas::ready::{Readiness, ReadyFlag};
use switchyard_schemas::subjects::Subjects;
use tokio_util::sync::CancellationToken;

// jemalloc for the whole process, ONNX Runtime's C++ allocations included (unprefixed `malloc`):
// glibc kept ~57 MB freed while the embedding model loaded, and its per-thread arenas held on to
// memory after load; jemalloc returns freed pages to the OS (docs/BENCHMARKS.md, Memory).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "switchyard", version, about = "An LLM API gateway on NATS")]
struct Cli {
    /// Log lines on stderr: `text` (default) or `json` (one object per line: ts, level,
    /// target, message, fields, spans).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        env = "SWITCHYARD_LOG_FORMAT"
    )]
    log_format: log_format::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct Common {
    /// YAML config file (default: the built-in demo config).
    #[arg(long, env = "SWITCHYARD_CONFIG")]
    config: Option<PathBuf>,
    /// NATS URL; overrides the config's `nats_url`.
    #[arg(long, env = "SWITCHYARD_NATS_URL")]
    nats_url: Option<String>,
    /// NATS credentials and TLS (override the config's `nats:` section).
    #[command(flatten)]
    nats: NatsArgs,
}

// Parsed once at start-up: the size of the largest variant (flags of `up`) does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Everything in one process: private nats-server (unless a NATS URL is set), built-in mock
    /// upstream, ingress, workers, cache and billing (SQLite under the data dir).
    Up {
        #[command(flatten)]
        common: Common,
        /// HTTP listen address (overrides the config's `listen`).
        #[arg(long)]
        listen: Option<String>,
        /// Data directory for the embedded nats-server and the ledger (overrides `data_dir`).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Port for the private nats-server (default: a free port).
        #[arg(long)]
        nats_port: Option<u16>,
        /// Do not start the local model server (SmolLM2-135M on llama.cpp) for
        /// `builtin:local-model` targets; their models are then not served.
        #[arg(long)]
        no_local_model: bool,
        /// The cache's embedding model (default: found under `.tools/venv`).
        #[command(flatten)]
        embedding: cache_cmd::ModelArgs,
    },
    /// The HTTP front door only.
    Ingress {
        #[command(flatten)]
        common: Common,
        /// HTTP listen address (overrides the config's `listen`).
        #[arg(long)]
        listen: Option<String>,
        /// NATS user the admin API writes the live config as (the `admin` identity; default:
        /// the ingress connection, which an authenticated NATS refuses).
        #[arg(long, env = "SWITCHYARD_ADMIN_NATS_USER")]
        admin_nats_user: Option<String>,
        /// Password of --admin-nats-user.
        #[arg(long, env = "SWITCHYARD_ADMIN_NATS_PASSWORD", hide_env_values = true)]
        admin_nats_password: Option<String>,
    },
    /// A provider worker (joins the queue groups of the given providers; default all configured).
    Worker {
        #[command(flatten)]
        common: Common,
        /// Provider queue to serve (repeatable): openai, openai_compatible, anthropic, gemini, azure_openai, bedrock.
        #[arg(long = "provider", value_parser = parse_provider)]
        providers: Vec<ProviderKind>,
        /// Base URL (with `/v1`) that `builtin:mock` targets resolve to.
        #[arg(long)]
        mock_url: Option<String>,
        /// Base URL (with `/v1`) that `builtin:local-model` targets resolve to, e.g. the address
        /// `scripts/local_model.py` prints plus `/v1`.
        #[arg(long)]
        local_model_url: Option<String>,
        /// Serve this worker's metrics at `http://ADDR/metrics` (docs/metrics.md).
        #[arg(long)]
        metrics_listen: Option<SocketAddr>,
    },
    /// The billing consumer (durable JetStream consumer → SQL ledger).
    Billing {
        #[command(flatten)]
        common: Common,
        /// sqlx database URL (default: SQLite under the data dir).
        #[arg(long, env = "SWITCHYARD_DATABASE_URL")]
        database_url: Option<String>,
        /// Serve the billing metrics (lag, pending usage) at `http://ADDR/metrics`.
        #[arg(long)]
        metrics_listen: Option<SocketAddr>,
    },
    /// Budget state: `budgets rebuild` recomputes every key's and tenant's spend of the current
    /// windows from the ledger into `SY_BUDGETS` (scopes without an entry; `--overwrite` replaces
    /// existing ones and drops their open reservations — run it with ingress stopped).
    Budgets {
        #[command(flatten)]
        common: Common,
        /// sqlx database URL of the ledger (default: SQLite under the data dir).
        #[arg(long, env = "SWITCHYARD_DATABASE_URL")]
        database_url: Option<String>,
        /// Replace entries that exist.
        #[arg(long)]
        overwrite: bool,
        /// `rebuild`.
        #[arg(value_parser = ["rebuild"])]
        action: String,
    },
    /// The cache service; `cache eval PAIRS.jsonl`, `cache purge …` and `cache bench` are its
    /// admin actions.
    Cache(cache_cmd::CacheArgs),
    /// A wire-accurate mock of the OpenAI, Anthropic, Gemini, Azure OpenAI and Bedrock APIs for
    /// tests, demos and benchmarks.
    MockUpstream {
        /// Listen address.
        #[arg(long, default_value = "127.0.0.1:9090")]
        listen: SocketAddr,
    },
    /// Reports from the usage ledger: `daily` (per tenant/model/target, cost, charge and margin in
    /// USD, reconciliation) and `import-usage` (a provider's usage export vs the ledger).
    Report(report_cmd::ReportArgs),
    /// The pricing catalog: `check` lists configured targets and models without a price or a
    /// priced component; `import FILE` converts a LiteLLM `model_prices_and_context_window.json`
    /// into a catalog YAML (offline).
    Pricing(pricing_cmd::PricingArgs),
    /// Measures the latency Switchyard adds (p50/p99, direct to the mock vs through the gateway).
    Bench(bench::BenchArgs),
    /// Batch jobs on a running gateway: `submit FILE.jsonl [--wait]` (progress bar), `status ID`,
    /// `list`, `cancel ID`, `results ID --out FILE`.
    Batch(batch_cmd::BatchArgs),
    /// API keys: `create`, `list`, `get`, `revoke`, `rotate`, `expire`, `delete` through a
    /// running gateway's admin API (`--admin-key` / `SWITCHYARD_ADMIN_KEY`); offline, `new`
    /// mints one and prints its config entry and `hash` prints the SHA-256 of a key from stdin.
    Key {
        #[command(subcommand)]
        action: key_cmd::KeyAction,
    },
    /// A tenant's prepaid balance through a running gateway's admin API (`--admin-key` /
    /// `SWITCHYARD_ADMIN_KEY`): `topup --tenant T --amount-usd 25 [--id INV]`, `show --tenant T`.
    Balance {
        #[command(subcommand)]
        action: balance_cmd::BalanceAction,
    },
    /// The audit log through a running gateway's admin API (`--admin-key` /
    /// `SWITCHYARD_ADMIN_KEY`): `tail [-n N] [-f]` and `export [--out FILE]`, with the filters
    /// `--from --to --key --tenant --model --status`; one JSON record per line.
    Requests {
        #[command(subcommand)]
        action: requests_cmd::RequestsAction,
    },
    /// Credentials in config: `keygen` (a master key), `encrypt` (stdin → `enc:v1:…` under
    /// `SWITCHYARD_MASTER_KEY`), `rotate --old-key-env A --new-key-env B --file F / --live`.
    Secret {
        #[command(subcommand)]
        action: secret_cmd::SecretAction,
    },
    /// Prints a nats-server config with Switchyard's identities and subject permissions, the
    /// passwords read from `SWITCHYARD_NATS_PASSWORD_<ID>` (compose.yaml mounts it);
    /// `--passwords` prints fresh random values for those variables (a `.env` file) instead.
    NatsConfig {
        /// Subject prefix.
        #[arg(long, default_value = "sy")]
        prefix: String,
        /// Print `.env` lines with new random passwords instead of the config.
        #[arg(long)]
        passwords: bool,
    },
    /// Live config: `push FILE` validates a YAML config and stores it in the NATS KV bucket every
    /// running service watches (they switch atomically, no restart); `show` prints the stored one.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
        /// NATS URL.
        #[arg(long, env = "SWITCHYARD_NATS_URL", global = true)]
        nats_url: Option<String>,
    },
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Validate FILE and make it the live config of every service.
    Push {
        /// The YAML file.
        file: PathBuf,
        /// NATS credentials and TLS: the `admin` identity (the embedded server's password is in
        /// `<data_dir>/nats-credentials.json`).
        #[command(flatten)]
        nats: NatsArgs,
    },
    /// Print the live config text (literal credentials redacted) and its version.
    Show {
        /// NATS credentials and TLS.
        #[command(flatten)]
        nats: NatsArgs,
    },
    /// List the stored versions of the live config (the bucket keeps the last 10): version,
    /// time stored (UTC), size, and which one is live.
    History {
        /// NATS credentials and TLS.
        #[command(flatten)]
        nats: NatsArgs,
    },
    /// Make the text of VERSION the live config again (stored as a new version).
    Rollback {
        /// The version to return to (from `config history`).
        version: u64,
        /// NATS credentials and TLS: the `admin` identity.
        #[command(flatten)]
        nats: NatsArgs,
    },
}

fn parse_provider(s: &str) -> Result<ProviderKind, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned()))
        .map_err(|_| format!("unknown provider `{s}` (openai, openai_compatible, anthropic, gemini, azure_openai, bedrock)"))
}

#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Config(#[from] config::ConfigLoadError),
    #[error("{0}")]
    Msg(String),
}

fn msg(e: impl std::fmt::Display) -> CliError {
    CliError::Msg(e.to_string())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let (tracing, service) = tracing_section(&cli.command);
    let telemetry = telemetry::init(cli.log_format, tracing.as_ref(), service);
    // jemalloc purges freed pages only when a thread allocates again, so an idle process kept
    // what a burst of load freed (~50 MB after 2,000 streams); its background thread purges them.
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::debug!(error = %e, "jemalloc background purging not available");
    }
    // Every service holds sockets and spool files: use the whole hard limit, not the default 1,024.
    switchyard_ingress::server::raise_fd_limit();
    let result = run(cli).await;
    // The services have stopped: export the spans still queued.
    telemetry.shutdown();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchyard: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The `tracing:` section of the config a service command will run with, and the service's
/// default `service.name`; `None` for the other commands (and for a config that does not load:
/// the command itself reports that).
fn tracing_section(
    command: &Command,
) -> (
    Option<switchyard_schemas::trace::TracingConfig>,
    &'static str,
) {
    let (common, service) = match command {
        Command::Up { common, .. } => (common, "switchyard"),
        Command::Ingress { common, .. } => (common, "switchyard-ingress"),
        Command::Worker { common, .. } => (common, "switchyard-worker"),
        Command::Cache(args) if args.action.is_none() => (&args.common, "switchyard-cache"),
        _ => return (None, "switchyard"),
    };
    (load(common).ok().map(|c| c.tracing), service)
}

/// Fires on Ctrl-C or SIGTERM.
fn shutdown_token() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => {
                        let _ = ctrl_c.await;
                        t.cancel();
                        return;
                    }
                };
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        t.cancel();
    });
    token
}

fn load(common: &Common) -> Result<GatewayConfig, CliError> {
    let mut c = config::load(common.config.as_deref())?;
    if let Some(url) = &common.nats_url {
        c.nats_url = Some(url.clone());
    }
    c.nats = common.nats.over(&c.nats);
    c.nats.validate().map_err(msg)?;
    switchyard_schemas::replicas::set(c.nats.replicas.unwrap_or(1));
    Ok(c)
}

/// Connects as `name` with `nats`'s credentials and TLS (`switchyard::nats::connect`).
async fn connect(
    url: &str,
    name: &str,
    nats: &switchyard_schemas::nats_config::NatsConfig,
) -> Result<async_nats::Client, CliError> {
    switchyard::nats::connect(url, name, nats)
        .await
        .map_err(msg)
}

fn require_nats(c: &GatewayConfig) -> Result<String, CliError> {
    c.nats_url
        .clone()
        .ok_or_else(|| msg("no NATS URL: pass --nats-url or set nats_url in the config"))
}

fn new_id(kind: &str) -> String {
    format!("{kind}-{}", uuid::Uuid::now_v7().simple())
}

async fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Up {
            common,
            listen,
            data_dir,
            nats_port,
            no_local_model,
            embedding,
        } => {
            up(
                common,
                listen,
                data_dir,
                nats_port,
                !no_local_model,
                embedding,
            )
            .await
        }
        Command::Ingress {
            common,
            listen,
            admin_nats_user,
            admin_nats_password,
        } => {
            let mut c = load(&common)?;
            if let Some(l) = listen {
                c.listen = l;
            }
            let nats = connect(&require_nats(&c)?, "switchyard-ingress", &c.nats).await?;
            let subjects = Subjects::new(c.subject_prefix.clone());
            // Reload and the spool drainer outlive the HTTP drain; the spool is flushed last.
            let services = CancellationToken::new();
            start_spool(&nats, &c, &new_id("ingress"), &services);
            let handle = ConfigHandle::new(c);
            spawn_reload(&nats, &handle, &services, Arc::new(|_| Ok(())));
            let writer = match &admin_nats_user {
                Some(user) => {
                    let mut n = handle.get().nats.clone();
                    n.user = Some(user.clone());
                    n.password = admin_nats_password
                        .clone()
                        .map(switchyard_schemas::Secret::new);
                    n.inbox_prefix = Some(Identity::Admin.inbox_prefix());
                    Some(
                        connect(
                            &require_nats(&handle.get())?,
                            "switchyard-ingress-admin",
                            &n,
                        )
                        .await?,
                    )
                }
                None => None,
            };
            let admin = AdminWiring {
                writer,
                startup_text: startup_text(&common)?,
            };
            let result = run_ingress(
                nats.clone(),
                handle,
                admin,
                shutdown_token(),
                Readiness::default(),
                None,
            )
            .await;
            flush_spool(&nats, &subjects).await;
            services.cancel();
            result
        }
        Command::Worker {
            common,
            providers,
            mock_url,
            local_model_url,
            metrics_listen,
        } => {
            let mut c = load(&common)?;
            // Provider credentials are decrypted here, in the process that uses them only.
            config::resolve_secrets(&mut c).map_err(msg)?;
            let nats = connect(&require_nats(&c)?, "switchyard-worker", &c.nats).await?;
            let subjects = Subjects::new(c.subject_prefix.clone());
            let services = CancellationToken::new();
            start_spool(&nats, &c, &new_id("worker"), &services);
            let handle = ConfigHandle::new(c);
            spawn_reload(&nats, &handle, &services, Arc::new(config::resolve_secrets));
            let registry = process_registry();
            let metrics = listen_metrics(metrics_listen, &registry, &services).await?;
            let opts = switchyard_workers::worker::WorkerOptions {
                worker_id: new_id("worker"),
                subjects: subjects.clone(),
                config: handle,
                providers,
                builtin_mock_url: mock_url,
                builtin_local_model_url: local_model_url,
                metrics: registry,
            };
            // Returns after in-flight requests and their usage publications finished.
            let result = switchyard_workers::worker::run(nats.clone(), opts, shutdown_token())
                .await
                .map_err(msg);
            flush_spool(&nats, &subjects).await;
            services.cancel();
            if let Some(task) = metrics {
                let _ = task.await;
            }
            result
        }
        Command::Billing {
            common,
            database_url,
            metrics_listen,
        } => {
            let c = load(&common)?;
            let nats = connect(&require_nats(&c)?, "switchyard-billing", &c.nats).await?;
            // Live config: a pushed `pricing_file` prices the next usage row.
            let handle = ConfigHandle::new(c);
            let services = CancellationToken::new();
            spawn_reload(&nats, &handle, &services, Arc::new(|_| Ok(())));
            let registry = switchyard_schemas::metrics::Registry::new();
            switchyard_billing::lag::add_lag_collector(
                &registry,
                async_nats::jetstream::new(nats.clone()),
            );
            let metrics = listen_metrics(metrics_listen, &registry, &services).await?;
            let result = run_billing(nats, handle, database_url, shutdown_token(), None).await;
            services.cancel();
            if let Some(task) = metrics {
                let _ = task.await;
            }
            result
        }
        Command::Budgets {
            common,
            database_url,
            overwrite,
            action: _,
        } => {
            let c = load(&common)?;
            let nats = connect(&require_nats(&c)?, "switchyard-budgets", &c.nats).await?;
            let ledger = open_ledger(&c, database_url).await?;
            let js = async_nats::jetstream::new(nats);
            let store = switchyard_budgets::BudgetStore::connect(&js, "budgets-rebuild").await;
            let done = switchyard_billing::budget_rebuild::rebuild(
                &ledger,
                &store,
                switchyard_schemas::now_ms(),
                overwrite,
            )
            .await
            .map_err(msg)?;
            for k in &done.written {
                println!("rebuilt {k}");
            }
            for k in &done.kept {
                println!("kept    {k} (exists; --overwrite replaces it)");
            }
            Ok(())
        }
        Command::Cache(args) => match args.action {
            Some(action) => cache_cmd::run_action(action).await.map_err(msg),
            None => {
                let c = load(&args.common)?;
                let nats = connect(&require_nats(&c)?, "switchyard-cache", &c.nats).await?;
                let semantic = args.model.on_demand();
                args.model
                    .load_if_wanted(semantic.as_ref(), &c)
                    .await
                    .map_err(msg)?;
                let opts = args
                    .service
                    .options_on_demand(Subjects::new(c.subject_prefix.clone()), semantic.clone());
                let token = shutdown_token();
                // A reload that turns semantic caching on loads the model then.
                let fixup: reload::Fixup = Arc::new(move |c| {
                    cache_cmd::semantic_reloaded(semantic.as_ref(), c);
                    Ok(())
                });
                spawn_reload(&nats, &ConfigHandle::new(c), &token, fixup);
                switchyard_cache::run(nats, opts, token.cancelled_owned())
                    .await
                    .map_err(msg)
            }
        },
        Command::MockUpstream { listen } => {
            let listener = tokio::net::TcpListener::bind(listen).await.map_err(msg)?;
            eprintln!(
                "switchyard mock upstream on http://{listen} (OpenAI: /v1/chat/completions, Anthropic: /v1/messages)"
            );
            let token = shutdown_token();
            tokio::select! {
                r = switchyard_mock::serve(listener, switchyard_mock::MockState::new()) => r.map_err(msg),
                _ = token.cancelled() => Ok(()),
            }
        }
        Command::Report(args) => report_cmd::run(args).await.map_err(msg),
        Command::Pricing(args) => pricing_cmd::run(args).map_err(msg),
        Command::Key { action } => key_cmd::run(action).await.map_err(msg),
        Command::Requests { action } => requests_cmd::run(action).await.map_err(msg),
        Command::Balance { action } => balance_cmd::run(action).await.map_err(msg),
        Command::Secret { action } => secret_cmd::run(action).await.map_err(msg),
        Command::Bench(args) => bench::run(args).await.map_err(msg),
        Command::Batch(args) => batch_cmd::run(args).await.map_err(msg),
        Command::NatsConfig { prefix, passwords } => {
            if passwords {
                print!("{}", switchyard::nats_auth::env_passwords());
            } else {
                print!(
                    "{}",
                    switchyard::nats_auth::server_config_with_env_passwords(&prefix)
                );
            }
            Ok(())
        }
        Command::Config { action, nats_url } => {
            let url = nats_url.ok_or_else(|| msg("pass --nats-url (or SWITCHYARD_NATS_URL)"))?;
            let (ConfigAction::Push { nats, .. }
            | ConfigAction::Show { nats }
            | ConfigAction::History { nats }
            | ConfigAction::Rollback { nats, .. }) = &action;
            let nats = connect(&url, "switchyard-config", &nats.to_config()).await?;
            match action {
                ConfigAction::Push { file, .. } => {
                    let text = std::fs::read_to_string(&file)
                        .map_err(|e| msg(format!("reading {}: {e}", file.display())))?;
                    let pushed = reload::push_reporting(&nats, &text).await.map_err(msg)?;
                    for w in &pushed.warnings {
                        eprintln!("warning: {w}");
                    }
                    println!("config version {} is live", pushed.version);
                }
                ConfigAction::Show { .. } => match reload::show(&nats).await.map_err(msg)? {
                    Some((version, text)) => println!("# version {version}\n{text}"),
                    None => println!("# no live config pushed yet"),
                },
                ConfigAction::History { .. } => {
                    let revisions = reload::history(&nats).await.map_err(msg)?;
                    if revisions.is_empty() {
                        println!("# no live config pushed yet");
                    }
                    let live = revisions.last().map(|r| r.version);
                    for r in &revisions {
                        let mark = if Some(r.version) == live {
                            "  (live)"
                        } else {
                            ""
                        };
                        println!(
                            "{:>6}  {}  {:>6} bytes{mark}",
                            r.version,
                            r.created,
                            r.text.len()
                        );
                    }
                }
                ConfigAction::Rollback { version, .. } => {
                    let new = reload::rollback(&nats, version).await.map_err(msg)?;
                    println!("config version {new} is live (the text of version {version})");
                }
            }
            Ok(())
        }
    }
}

/// A registry with this process's spool and publish-error collectors.
fn process_registry() -> switchyard_schemas::metrics::Registry {
    let registry = switchyard_schemas::metrics::Registry::new();
    switchyard_schemas::metrics::add_process_collectors(&registry);
    registry
}

/// Serves `registry` on `addr` (when set) until `stop`; await the task at exit.
async fn listen_metrics(
    addr: Option<SocketAddr>,
    registry: &switchyard_schemas::metrics::Registry,
    stop: &CancellationToken,
) -> Result<Option<tokio::task::JoinHandle<()>>, CliError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let (_, task) = switchyard::metrics_listen::serve(addr, registry.clone(), stop.clone())
        .await
        .map_err(|e| msg(format!("binding --metrics-listen {addr}: {e}")))?;
    Ok(Some(task))
}

/// Makes `<data_dir>/spool/<id>` this process's usage spool (usage events JetStream does not
/// acknowledge are kept there) and drains it, and spools left by earlier runs, until `shutdown`.
fn start_spool(
    nats: &async_nats::Client,
    c: &GatewayConfig,
    id: &str,
    shutdown: &CancellationToken,
) {
    use switchyard_schemas::publish::{drain_spool, set_spool_dir};
    let dir = PathBuf::from(&c.data_dir).join("spool").join(id);
    if let Err(e) = set_spool_dir(&dir) {
        tracing::warn!(spool = %dir.display(), error = %e,
            "no usage spool: usage events are dropped when NATS stays unreachable");
        return;
    }
    let js = async_nats::jetstream::new(nats.clone());
    let subjects = Subjects::new(c.subject_prefix.clone());
    tokio::spawn(drain_spool(
        js,
        subjects,
        shutdown.clone().cancelled_owned(),
    ));
}

/// Longest final spool pass at exit; what it cannot deliver stays on disk for the next start.
const SPOOL_FLUSH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);
/// Longest wait at exit of `up` for billing to store the usage events already in the stream.
const BILLING_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(10);

/// One last spool pass before exit (the drainer task may be sleeping between passes).
async fn flush_spool(nats: &async_nats::Client, subjects: &Subjects) {
    let Some(spool) = switchyard_schemas::publish::current_spool() else {
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
async fn billing_caught_up(js: &async_nats::jetstream::Context, limit: std::time::Duration) {
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

/// Applies live config pushes (NATS KV) to `handle` until `shutdown`.
fn spawn_reload(
    nats: &async_nats::Client,
    handle: &ConfigHandle,
    shutdown: &CancellationToken,
    fixup: reload::Fixup,
) {
    let (nats, handle, shutdown) = (nats.clone(), handle.clone(), shutdown.clone());
    tokio::spawn(async move {
        if let Err(e) = reload::watch_kv(nats, handle, shutdown, fixup).await {
            tracing::warn!(error = %e, "live config reload is off");
        }
    });
}

/// What the admin API of an ingress needs from its process.
struct AdminWiring {
    /// The connection config writes go through (the `admin` identity), if not the ingress's.
    writer: Option<async_nats::Client>,
    /// The config text the process started from.
    startup_text: String,
}

/// The text of the start-up config file (or the built-in default).
fn startup_text(common: &Common) -> Result<String, CliError> {
    match &common.config {
        Some(p) => {
            std::fs::read_to_string(p).map_err(|e| msg(format!("reading {}: {e}", p.display())))
        }
        None => Ok(config::DEFAULT_CONFIG.to_owned()),
    }
}

async fn run_ingress(
    nats: async_nats::Client,
    handle: ConfigHandle,
    admin: AdminWiring,
    shutdown: CancellationToken,
    readiness: Readiness,
    registry: Option<switchyard_schemas::metrics::Registry>,
) -> Result<(), CliError> {
    let c = handle.get();
    let listener = switchyard_ingress::server::bind(&c.listen)
        .await
        .map_err(|e| msg(format!("binding {}: {e}", c.listen)))?;
    let addr = listener.local_addr().map_err(msg)?;
    let id = new_id("ingress");
    let state = match registry {
        Some(r) => switchyard_ingress::state_with_registry(nats, handle, &id, readiness, r).await,
        None => switchyard_ingress::state_with_readiness(nats, handle, &id, readiness).await,
    }
    .map_err(msg)?;
    if let Some(w) = admin.writer {
        state.admin.set_writer(w);
    }
    state.admin.set_startup_text(admin.startup_text);
    if c.admin.keys.is_empty() {
        tracing::info!("admin API off: no `admin.keys` configured (docs/security.md)");
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
async fn open_ledger(
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
const LEDGER_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// The billing consumer: opens (and migrates) the ledger, retrying until it can (`ready` says
/// what it waits for), then stores usage events priced with `handle`'s live catalog until
/// `shutdown`.
async fn run_billing(
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

async fn up(
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
    // The spool holds the usage events of this process's ingress and worker.
    let spool_nats = connect(&url, "switchyard-spool", &ingress_nats).await?;
    start_spool(&spool_nats, &c, &new_id("up"), &services);
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
        spawn_reload(&nats, &handle, &services, fixup);
        if let Some(file) = common.config.clone() {
            tokio::spawn(reload::watch_file(
                nats,
                file,
                std::time::Duration::from_secs(1),
                services.clone(),
            ));
        }
    }

    // Built-in mock upstream for `builtin:mock` targets (lives until the process exits).
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
        tokio::spawn(switchyard_mock::serve(
            listener,
            switchyard_mock::MockState::new(),
        ));
        tracing::info!("built-in mock upstream on http://{addr}");
    }

    // Each service task fires `shutdown` when it ends, so one failing stops the rest in order.
    let spawn = |name: &'static str,
                 fut: std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<(), CliError>> + Send>,
    >| {
        let stop = shutdown.clone();
        tokio::spawn(async move {
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
    let registry = process_registry();
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
        let readiness = readiness.clone();
        spawn(
            "ingress",
            Box::pin(async move {
                run_ingress(nats, handle, admin, token, readiness, Some(registry)).await
            }),
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
    flush_spool(&spool_nats, &subjects).await;
    if !billing.is_finished() {
        billing_caught_up(&billing_js, BILLING_CATCH_UP).await;
    }
    services.cancel();
    record(billing.await);
    record(cache.await);
    if let Some(m) = local_model {
        m.stopped().await;
    }
    tracing::info!("stopped");
    result
}
