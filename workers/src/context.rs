//! What every part of a worker shares, at the bottom of the crate: the process options, the
//! per-worker [`Shared`] state, the provider adapter table, target base URLs and how one
//! upstream call ended. The worker loop (`worker.rs`), `count`, `embed`, `prober` and
//! `frame_sink` all build on it; it names none of them.

use crate::breaker::Breakers;
use crate::limits::Limiter;
use crate::provider::Provider;
use crate::providers::openai::OpenAiProvider;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use switchyard_publish::UsagePublisher;
use switchyard_schemas::ErrorInfo;
use switchyard_schemas::config::{
    BUILTIN_LOCAL_MODEL_URL, BUILTIN_MOCK_URL, ConfigHandle, ProviderKind, TargetConfig,
};
use switchyard_schemas::subjects::Subjects;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

/// What a worker process serves and how.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Unique id of this worker process (appears in `start` frames and its cancel subject).
    pub worker_id: String,
    /// Subject names.
    pub subjects: Subjects,
    /// The live gateway config (targets and timeouts); each request uses one snapshot.
    pub config: ConfigHandle,
    /// Providers whose queue groups this worker joins; empty = every provider with a target.
    pub providers: Vec<ProviderKind>,
    /// Resolved address of the built-in mock upstream (`builtin:mock` targets), e.g. `http://127.0.0.1:9000/v1`.
    pub builtin_mock_url: Option<String>,
    /// Resolved address of the local model server (`builtin:local-model` targets), e.g.
    /// `http://127.0.0.1:9001/v1`.
    pub builtin_local_model_url: Option<String>,
    /// Where this worker's metrics go (retries, breaker changes, target-limit refusals; see
    /// docs/metrics.md): `switchyard up` shares its ingress's, `switchyard worker` serves its
    /// own on `--metrics-listen`.
    pub metrics: switchyard_schemas::metrics::Registry,
    /// Where usage events JetStream does not acknowledge are kept (the process drains it);
    /// `None`: they are dropped, logged.
    pub spool: Option<Arc<switchyard_publish::Spool>>,
}

/// Returns the adapter for a provider family.
pub fn adapter(kind: ProviderKind) -> Arc<dyn Provider> {
    match kind {
        ProviderKind::Openai => Arc::new(OpenAiProvider::openai()),
        ProviderKind::OpenaiCompatible => Arc::new(OpenAiProvider::compatible()),
        ProviderKind::Anthropic => Arc::new(crate::providers::anthropic::AnthropicProvider),
        ProviderKind::Gemini => Arc::new(crate::providers::gemini::GeminiProvider),
        ProviderKind::AzureOpenai => Arc::new(crate::providers::azure::AzureOpenAiProvider),
        ProviderKind::Bedrock => Arc::new(crate::providers::bedrock::BedrockProvider),
    }
}

/// What every request task of one worker shares.
pub(crate) struct Shared {
    pub(crate) nats: async_nats::Client,
    pub(crate) opts: WorkerOptions,
    pub(crate) http: reqwest::Client,
    /// HTTP clients by connect timeout (ms), for targets overriding `timeouts.connect_ms`.
    pub(crate) clients: Mutex<HashMap<u64, reqwest::Client>>,
    pub(crate) cancels: Mutex<HashMap<Uuid, CancellationToken>>,
    /// Flow-controlled attempts by (request id, attempt): the latest grant (`seq < upto`).
    pub(crate) credits: Mutex<HashMap<(Uuid, u32), watch::Sender<u32>>>,
    pub(crate) limiter: Limiter,
    pub(crate) breakers: Breakers,
    /// Usage publications still running; [`Worker::serve`] waits for them before it returns.
    pub(crate) usage_tasks: TaskTracker,
    /// Batches usage events into few JetStream messages; closed after `usage_tasks`.
    pub(crate) usage: UsagePublisher,
}

impl Shared {
    /// The HTTP client whose connect timeout is `connect_ms` (built once per value).
    pub(crate) fn http_for(&self, connect_ms: u64) -> reqwest::Client {
        if let Some(c) = self.clients.lock().get(&connect_ms) {
            return c.clone();
        }
        match http_client(connect_ms) {
            Ok(c) => {
                self.clients.lock().insert(connect_ms, c.clone());
                c
            }
            Err(e) => {
                tracing::warn!(error = %e, connect_ms, "HTTP client build failed; using the default");
                self.http.clone()
            }
        }
    }
}

pub(crate) fn http_client(connect_ms: u64) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(connect_ms))
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
}

/// The target's base URL, with `builtin:` addresses resolved; `builtin:mock/x/<spec>` becomes
/// `<mock root>/x/<spec>/v1` (the path-prefix form of the `switchyard-mock` crate).
pub(crate) fn base_url(shared: &Shared, target: &TargetConfig) -> String {
    if target.base_url == BUILTIN_MOCK_URL {
        shared.opts.builtin_mock_url.clone().unwrap_or_default()
    } else if let Some(rest) = target.base_url.strip_prefix(BUILTIN_MOCK_URL)
        && rest.starts_with("/x/")
    {
        let mock = shared.opts.builtin_mock_url.as_deref().unwrap_or_default();
        let root = mock.trim_end_matches('/');
        let root = root.strip_suffix("/v1").unwrap_or(root);
        format!("{root}{rest}/v1")
    } else if target.base_url == BUILTIN_LOCAL_MODEL_URL {
        shared
            .opts
            .builtin_local_model_url
            .clone()
            .unwrap_or_default()
    } else {
        target.base_url.clone()
    }
}

/// How one upstream call ended.
pub(crate) enum CallEnd {
    /// `end` was sent.
    Done,
    /// Failed; nothing sent about it yet (the caller retries or sends the error).
    Failed(ErrorInfo),
    /// The client went away.
    Cancelled,
    /// The client stopped reading: no flow-control credit within `timeouts.stall_ms`.
    Stalled,
}
