//! `switchyard`: the CLI wiring Switchyard's services. `up` runs everything in one process; the
//! other subcommands run one service each against a shared NATS (the distributed topology).

use switchyard::nats::NatsArgs;
use switchyard::nats_auth::{Credentials, Identity};
use switchyard::topology;
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
mod proc_stat;
mod report_cmd;
mod requests_cmd;
mod secret_cmd;
mod services;
mod telemetry;

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use switchyard_schemas::config::{BUILTIN_MOCK_URL, ConfigHandle, GatewayConfig, ProviderKind};
use switchyard_schemas::subjects::Subjects;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
    /// A minimal gateway for `switchyard bench --floors` (see `bench/floor.rs`).
    #[command(hide = true)]
    BenchFloor(bench::floor::FloorArgs),
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

/// The text of the file at `path`; the error names it (`reading PATH: …`).
fn read_text(path: &std::path::Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let (tracing, service) = tracing_section(&cli.command);
    // Services log their progress; one-shot commands (`config show`, `key new`, …) print
    // their answer and only warnings (not the NATS client's connection notices).
    let level = if serves(&cli.command) { "info" } else { "warn" };
    let telemetry = telemetry::init(cli.log_format, level, tracing.as_ref(), service);
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

/// Whether `command` runs until stopped (a service, the mock upstream, the bench) rather than
/// answering once.
fn serves(command: &Command) -> bool {
    match command {
        Command::Up { .. }
        | Command::Ingress { .. }
        | Command::Worker { .. }
        | Command::Billing { .. }
        | Command::MockUpstream { .. }
        | Command::Bench(_)
        | Command::BenchFloor(_) => true,
        Command::Cache(args) => args.action.is_none(),
        _ => false,
    }
}

/// Fires on Ctrl-C or SIGTERM.
#[expect(
    clippy::disallowed_methods,
    reason = "the signal listener holds nothing to flush: it ends with the process or a signal"
)]
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
            services::up(
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
        } => services::ingress(common, listen, admin_nats_user, admin_nats_password).await,
        Command::Worker {
            common,
            providers,
            mock_url,
            local_model_url,
            metrics_listen,
        } => services::worker(common, providers, mock_url, local_model_url, metrics_listen).await,
        Command::Billing {
            common,
            database_url,
            metrics_listen,
        } => services::billing(common, database_url, metrics_listen).await,
        Command::Budgets {
            common,
            database_url,
            overwrite,
            action: _,
        } => {
            let c = load(&common)?;
            let nats = connect(&require_nats(&c)?, "switchyard-budgets", &c.nats).await?;
            let ledger = topology::open_ledger(&c, database_url).await.map_err(msg)?;
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
            for k in &done.merged {
                println!("merged  {k} (the ledger's spend from before the bucket added)");
            }
            for k in &done.kept {
                println!("kept    {k} (rebuilt already; --overwrite replaces it)");
            }
            Ok(())
        }
        Command::Cache(mut args) => match args.action.take() {
            Some(action) => cache_cmd::run_action(action).await.map_err(msg),
            None => services::cache(args).await,
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
        Command::BenchFloor(args) => bench::floor::run(args, shutdown_token()).await.map_err(msg),
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
                    let text = read_text(&file).map_err(msg)?;
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
