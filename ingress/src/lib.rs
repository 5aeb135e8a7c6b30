//! Ingress: the HTTP/SSE front doors. It validates requests, picks targets, publishes normalised
//! requests on NATS, and turns the worker's frame stream back into the client's wire format.
//!
//! Routes: `POST /v1/chat/completions` (OpenAI, stream and non-stream), `POST /v1/completions`
//! (legacy text completions over chat), `POST /v1/messages` (Anthropic Messages, stream and
//! non-stream), `POST /v1/messages/count_tokens`, any other `/v1/messages/…` (404 in
//! Anthropic's shape), `POST /v1/responses` and the stored-response routes under
//! `/v1/responses/{id}` (OpenAI Responses, see [`responses`]), the batch routes ([`batch`]),
//! `POST /v1/embeddings`, `GET /v1/models`, `GET /v1/models/{id}`,
//! `GET /v1/usage` (ledger queries, see [`usage_api`]), `GET /healthz` (liveness), `GET /readyz`
//! (readiness of this process's services), `GET /metrics` (Prometheus text, see [`metrics`]),
//! `GET /openapi.json` (OpenAPI 3.1 of the public and admin routes, [`OPENAPI`]), and the admin
//! API under `/admin/…` ([`admin`]) with the live dashboard at `GET /dashboard`. API keys, budgets and rate limits: [`auth`], [`budget`],
//! [`rate_limit`].
//!
//! Candidate ordering is in [`strategy`], target health and load in [`health`], prompt estimates
//! and context trimming in [`trim`]; [`route`] ties them together.

pub mod admin;
pub mod anthropic;
pub mod auth;
pub mod batch;
mod billing_rpc;
pub mod budget;
pub mod cache_client;
pub mod charge;
pub mod chat;
pub mod context;
pub mod dispatch;
pub mod embeddings;
pub mod error;
pub mod front_door;
pub mod gate;
pub mod metrics;
pub mod openai;
mod query_string;
pub mod rate_limit;
pub mod refusal_audit;
pub mod responses;
pub mod route;
pub mod server;
pub mod spans;
pub mod strategy;
pub mod target_health;
pub mod trim;
pub mod usage_api;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::sync::Arc;
use switchyard_schemas::config::ConfigHandle;
use switchyard_schemas::pricing::Catalog;
use switchyard_schemas::ready::Readiness;
use switchyard_schemas::subjects::Subjects;

/// Everything a handler needs.
pub struct AppState {
    /// The live config; take one snapshot per request with `config.get()`.
    pub config: ConfigHandle,
    /// Request publisher and reply demultiplexer.
    pub dispatcher: dispatch::Dispatcher,
    /// JetStream, for usage events.
    pub js: async_nats::jetstream::Context,
    /// Subject names.
    pub subjects: Subjects,
    /// The NATS connection (health).
    pub nats: async_nats::Client,
    /// Latest target health (events on `<prefix>.health.>` plus passive failure counts).
    pub health: Arc<target_health::HealthView>,
    /// In-flight counts and TTFT averages per target.
    pub stats: Arc<target_health::TargetStats>,
    /// Provider capabilities used to filter candidates.
    pub capabilities: strategy::CapabilityTable,
    /// Prometheus metrics.
    pub metrics: metrics::Metrics,
    /// The answer cache client (lookup timeout).
    pub cache: cache_client::CacheClient,
    /// API keys by hash (authentication).
    pub keys: auth::KeyTable,
    /// The shared budget store (reservations and settlement).
    pub budgets: budget::Budgets,
    /// The shared key and tenant rate limits ([`rate_limit`]).
    pub rates: rate_limit::Rates,
    /// Share of requests that probe a degraded target first, in per mille (default 50 = 5 %,
    /// [`strategy::PROBE_SHARE`]); tests set 0 to make routing order deterministic.
    pub probe_per_mille: std::sync::atomic::AtomicU32,
    /// Background work a shutdown must wait for (budget settlements, usage publications): spawn
    /// it here instead of `tokio::spawn`; [`serve`] waits on it after the HTTP drain.
    pub tasks: tokio_util::task::TaskTracker,
    /// Batch jobs' files, records and queues (`None` when JetStream could not open them: the
    /// batch routes answer 503).
    pub batches: Option<Arc<batch::store::BatchStore>>,
    /// Stored responses of `POST /v1/responses` (KV bucket `SY_RESPONSES`).
    pub responses: responses::store::ResponseStore,
    /// Usage events (`charge`), batched into few JetStream messages; closed after `tasks`.
    pub usage: switchyard_publish::UsagePublisher,
    /// This process's services for `GET /readyz` (ingress itself is component `ingress`,
    /// ready once [`serve`] accepts connections).
    pub readiness: Readiness,
    ingress_ready: switchyard_schemas::ready::ReadyFlag,
    /// The admin API's config-writer connection, start-up text and admin key table.
    pub admin: admin::AdminState,
    /// The caps on audit records of refused requests ([`refusal_audit`]).
    pub refusals: refusal_audit::Limiter,
    /// Loops that live as long as the ingress (reply demultiplexers, the health subscriber):
    /// [`serve`] fires `stop_background` and waits on them last.
    background: tokio_util::task::TaskTracker,
    stop_background: tokio_util::sync::CancellationToken,
}

/// The OpenAPI 3.1 document served at `GET /openapi.json`: hand-written (one file,
/// `ingress/src/openapi.json`), covering every public and admin route; a unit test checks that
/// it parses and lists every route the router serves.
pub const OPENAPI: &str = include_str!("openapi.json");

impl AppState {
    /// The pricing catalog of the live config (for `lowest_cost`, `composite` and budget
    /// reservations; `None` if its `pricing_file` did not load): read per request, so a pushed
    /// price change applies to the next one.
    pub fn catalog(&self) -> Option<Arc<Catalog>> {
        self.config.catalog()
    }

    /// [`Self::probe_per_mille`] as a share in [0, 1].
    pub fn probe_share(&self) -> f64 {
        f64::from(
            self.probe_per_mille
                .load(std::sync::atomic::Ordering::Relaxed),
        ) / 1000.0
    }
}

/// Ingress start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum IngressError {
    /// Subscribing the reply inbox failed.
    #[error("NATS subscribe failed: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
    /// Serving HTTP failed.
    #[error("HTTP server: {0}")]
    Io(#[from] std::io::Error),
}

/// What a process hands its ingress besides NATS and the config.
#[derive(Default)]
pub struct Wiring {
    /// `/readyz` reports these (the process's other services) plus component `ingress`.
    pub readiness: Readiness,
    /// Where metrics are recorded (`switchyard up` shares one between its services, and the
    /// caller adds its collectors); `None`: a registry of its own with the process collectors.
    pub registry: Option<switchyard_schemas::metrics::Registry>,
    /// Where usage events JetStream does not acknowledge are kept (the caller drains it);
    /// `None`: they are dropped, logged.
    pub spool: Option<Arc<switchyard_publish::Spool>>,
}

/// Builds the state: subscribes this process's reply inbox (`ingress_id` must be unique per
/// process) and the target health subjects. `/readyz` reports ingress alone; no usage spool.
pub async fn state(
    nats: async_nats::Client,
    config: ConfigHandle,
    ingress_id: &str,
) -> Result<Arc<AppState>, IngressError> {
    state_with(nats, config, ingress_id, Wiring::default()).await
}

/// Like [`state`], wired into its process by `wiring`.
pub async fn state_with(
    nats: async_nats::Client,
    config: ConfigHandle,
    ingress_id: &str,
    wiring: Wiring,
) -> Result<Arc<AppState>, IngressError> {
    let Wiring {
        readiness,
        registry,
        spool,
    } = wiring;
    let registry = registry.unwrap_or_else(|| {
        let r = switchyard_schemas::metrics::Registry::new();
        switchyard_publish::add_process_collectors(&r, spool.clone());
        r
    });
    let ingress_ready = readiness.register("ingress", "starting");
    let subjects = Subjects::new(config.get().subject_prefix.clone());
    let background = tokio_util::task::TaskTracker::new();
    let stop_background = tokio_util::sync::CancellationToken::new();
    let dispatcher = dispatch::Dispatcher::start(
        nats.clone(),
        subjects.clone(),
        ingress_id,
        &background,
        stop_background.clone(),
    )
    .await?;
    let health = Arc::new(target_health::HealthView::new(
        target_health::HealthSettings::default(),
    ));
    health
        .subscribe(&nats, &subjects, &background, stop_background.clone())
        .await?;
    if let Err(e) = Catalog::load(config.get().pricing_file.as_deref()) {
        tracing::error!(error = %e, "pricing catalog unreadable; lowest_cost cannot rank targets and budgets reserve $0");
    }
    let js = async_nats::jetstream::new(nats.clone());
    let budgets = budget::Budgets::connect(&js, ingress_id).await;
    let rates = rate_limit::Rates::connect(&js, ingress_id).await;
    let batches = match batch::store::BatchStore::open(&js, subjects.prefix()).await {
        Ok(s) => Some(Arc::new(s)),
        Err(e) => {
            tracing::error!(error = %e, "batch store unavailable; /v1/batches answers 503");
            None
        }
    };
    let responses =
        responses::store::ResponseStore::connect(&js, config.get().responses.ttl_s).await;
    let cache = cache_client::CacheClient::start(
        &nats,
        &config.get(),
        &subjects,
        &background,
        stop_background.clone(),
    )
    .await;
    // Loading the tokenizer takes a moment: do it now, off the request path.
    tokio::task::spawn_blocking(trim::warm_up);
    let usage = switchyard_publish::UsagePublisher::start(js.clone(), subjects.clone(), spool);
    Ok(Arc::new(AppState {
        usage,
        config,
        dispatcher,
        js,
        subjects,
        nats,
        health,
        stats: Arc::new(target_health::TargetStats::default()),
        capabilities: strategy::CapabilityTable::default(),
        metrics: metrics::Metrics::with_registry(registry),
        cache,
        keys: auth::KeyTable::default(),
        budgets,
        rates,
        probe_per_mille: std::sync::atomic::AtomicU32::new((strategy::PROBE_SHARE * 1000.0) as u32),
        tasks: tokio_util::task::TaskTracker::new(),
        batches,
        responses,
        readiness,
        ingress_ready,
        admin: admin::AdminState::default(),
        refusals: refusal_audit::Limiter::default(),
        background,
        stop_background,
    }))
}

/// The HTTP router.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        )
        .route(
            "/v1/messages/count_tokens",
            post(anthropic::count::count_tokens),
        )
        .route(
            "/v1/messages/{*rest}",
            axum::routing::any(anthropic::unknown_path),
        )
        .route("/v1/completions", post(openai::completions::completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/v1/usage", get(usage))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/openapi.json", get(openapi))
        .merge(batch::routes())
        .merge(admin::routes(state.clone()))
        .merge(admin::dashboard_routes())
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            gate::gate,
        ))
        // A memory guard only: the real limit is the NATS server's max_payload (413 in chat.rs).
        .layer(axum::extract::DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(state)
}

/// Longest wait for [`AppState::tasks`] after the drain; they are bounded by the usage publish
/// retries (about 1 s, then the spool), so this only guards against a hung one.
const TASKS_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves with the config's `server:` limits (see [`server`]) until `shutdown` resolves, then
/// drains: stops accepting, lets in-flight requests and streams finish within
/// `server.drain_timeout_ms`, and waits for [`AppState::tasks`] (pending budget settlements and usage publications).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), IngressError> {
    let limits = server::Limits::from(&state.config.get().server);
    // The batch runner stops taking items when the drain starts and is waited for below.
    let stop = tokio_util::sync::CancellationToken::new();
    let runner = batch::start_runner(&state, stop.clone());
    let drain = stop.clone();
    let shutdown = async move {
        shutdown.await;
        drain.cancel();
    };
    state.ingress_ready.ready();
    server::run(listener, router(state.clone()), limits, shutdown).await;
    stop.cancel();
    if let Some(r) = runner
        && tokio::time::timeout(TASKS_DEADLINE, r).await.is_err()
    {
        tracing::error!("batch runner still running after the drain; its items are redelivered");
    }
    state.tasks.close();
    if tokio::time::timeout(TASKS_DEADLINE, state.tasks.wait())
        .await
        .is_err()
    {
        tracing::error!(
            pending = state.tasks.len(),
            "background tasks still running after the drain; exiting without them"
        );
    }
    state.usage.close().await;
    state.budgets.store().close().await;
    state.rates.store().close().await;
    state.stop_background.cancel();
    state.background.close();
    state.background.wait().await;
    Ok(())
}

/// An OpenAI `model` object (OpenAI API reference, "Models" → "The model object").
fn model_object(m: &switchyard_schemas::config::ModelConfig) -> serde_json::Value {
    let owner = m
        .owned_by
        .clone()
        .unwrap_or_else(|| m.id.split('/').next().unwrap_or("switchyard").to_owned());
    serde_json::json!({"id": m.id, "object": "model", "created": 0, "owned_by": owner})
}

async fn models(State(app): State<Arc<AppState>>) -> Response {
    let config = app.config.get();
    let data: Vec<serde_json::Value> = config.models.iter().map(model_object).collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}` ("Retrieve model"; ids may contain `/`): the model object, or OpenAI's
/// 404 `model_not_found`.
async fn model(
    State(app): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    let config = app.config.get();
    match config.models.iter().find(|m| m.id == id) {
        Some(m) => axum::Json(model_object(m)).into_response(),
        None => error::ApiError::model_not_found(&id).into_response(),
    }
}

/// `GET /v1/usage?from&to&group_by&tenant&key`: the caller's usage from the ledger (see
/// [`usage_api`]).
async fn usage(
    State(app): State<Arc<AppState>>,
    ctx: context::Ctx,
    uri: axum::http::Uri,
) -> Response {
    usage_api::handle(&app, &ctx.caller, uri.query().unwrap_or("")).await
}

async fn healthz(State(app): State<Arc<AppState>>) -> Response {
    let connected = app.nats.connection_state() == async_nats::connection::State::Connected;
    let status = if connected {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body =
        serde_json::json!({"status": if connected { "ok" } else { "degraded" }, "nats": connected});
    (status, axum::Json(body)).into_response()
}

/// `GET /readyz`: 200 when every service of this process is ready (and NATS is connected), else
/// 503; the body is `{"ready": bool, "nats": bool, "components": {NAME: {"ready": bool,
/// "detail": "..."}}}`.
async fn readyz(State(app): State<Arc<AppState>>) -> Response {
    let connected = app.nats.connection_state() == async_nats::connection::State::Connected;
    let (all, components) = app.readiness.report();
    let ready = all && connected;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = serde_json::json!({"ready": ready, "nats": connected, "components": components});
    (status, axum::Json(body)).into_response()
}

async fn metrics_text(State(app): State<Arc<AppState>>) -> Response {
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    (
        [(axum::http::header::CONTENT_TYPE, content_type)],
        app.metrics.registry().scrape().await,
    )
        .into_response()
}

async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
        .into_response()
}

async fn not_found() -> Response {
    error::ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "unknown_url",
        "Unknown route. Switchyard serves /v1/chat/completions, /v1/completions, /v1/messages, \
         /v1/responses, /v1/embeddings, /v1/models, /v1/files, /v1/batches, \
         /v1/messages/batches and /v1/usage (admin: /admin/…, see /openapi.json).",
    )
    .into_response()
}

#[cfg(test)]
mod openapi_tests {
    #![allow(clippy::unwrap_used)]

    #[test]
    fn the_document_parses_and_lists_every_route() {
        let doc: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let routes = [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/responses",
            "/v1/responses/{id}",
            "/v1/responses/{id}/input_items",
            "/v1/embeddings",
            "/v1/models",
            "/v1/models/{id}",
            "/v1/usage",
            "/v1/files",
            "/v1/files/{id}",
            "/v1/files/{id}/content",
            "/v1/batches",
            "/v1/batches/{id}",
            "/v1/batches/{id}/cancel",
            "/v1/messages/batches",
            "/v1/messages/batches/{id}",
            "/v1/messages/batches/{id}/cancel",
            "/v1/messages/batches/{id}/results",
            "/healthz",
            "/metrics",
            "/openapi.json",
            "/admin/keys",
            "/admin/keys/{id}",
            "/admin/keys/{id}/revoke",
            "/admin/keys/{id}/rotate",
            "/admin/tenants",
            "/admin/tenants/{id}",
            "/admin/tenants/{id}/balance",
            "/admin/tenants/{id}/balance/topups",
            "/admin/config",
            "/admin/config/validate",
            "/admin/health",
            "/admin/cache/purge",
            "/admin/usage",
            "/admin/requests",
            "/admin/dashboard.json",
            "/dashboard",
            "/dashboard/login",
            "/dashboard/logout",
        ];
        let paths = doc["paths"].as_object().unwrap();
        for r in routes {
            assert!(paths.contains_key(r), "{r} missing from openapi.json");
        }
        assert_eq!(
            paths.len(),
            routes.len(),
            "a documented route the router does not serve"
        );
    }
}
