//! The request context: what one request carries from the front door to settlement, created
//! once by the gate ([`crate::gate`], or the batch runner for a batch item) and passed down
//! explicitly as `&RequestContext` to admission, planning, attempts and the charge. It replaces
//! the task-locals the pipeline used to read from anywhere (docs/architecture.md, "Layers").
//!
//! A leaf of ingress: it names no module of this crate but [`crate::metrics`] (the overhead
//! clock's series), so every layer above can use it.

use crate::metrics::Clock;
use axum::http::HeaderMap;
use parking_lot::Mutex;
use std::sync::Arc;
use switchyard_schemas::UsageEvent;
use uuid::Uuid;

/// Who is calling (empty while authentication is off).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// Tenant.
    pub tenant: Option<String>,
    /// Key id.
    pub key_id: Option<String>,
    /// The key may read every tenant's usage.
    pub admin: bool,
}

impl Caller {
    /// This caller's key and tenant entries in `config` (`None` where it has no such id, or
    /// `config` lists none).
    pub fn entries<'a>(
        &self,
        config: &'a switchyard_schemas::config::GatewayConfig,
    ) -> (
        Option<&'a switchyard_schemas::tenancy::KeyConfig>,
        Option<&'a switchyard_schemas::tenancy::TenantConfig>,
    ) {
        let key = self
            .key_id
            .as_deref()
            .and_then(|id| config.keys.iter().find(|k| k.id == id));
        let tenant = self
            .tenant
            .as_deref()
            .and_then(|id| config.tenants.iter().find(|t| t.id == id));
        (key, tenant)
    }
}

/// A handler extractor: the caller of the request (from its context; anonymous when the gate
/// did not run, as with authentication off).
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Arc<RequestContext>>()
            .map(|c| c.caller.clone())
            .unwrap_or_default())
    }
}

/// Header: route by this model id or route tag instead of the body's `model`.
pub const HEADER_ROUTE: &str = "x-switchyard-route";
/// Header: only these target ids.
pub const HEADER_ONLY: &str = "x-switchyard-only";
/// Header: never these target ids.
pub const HEADER_IGNORE: &str = "x-switchyard-ignore";
/// Header: these target ids first, in order.
pub const HEADER_ORDER: &str = "x-switchyard-order";
/// Header: the user id for canary hashing.
pub const HEADER_USER: &str = "x-switchyard-user";

/// The routing headers of one request (`x-switchyard-*`, see [`crate::route`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestHints {
    /// `x-switchyard-route`.
    pub route: Option<String>,
    /// `x-switchyard-user`.
    pub user: Option<String>,
    /// `x-switchyard-only`.
    pub only: Option<Vec<String>>,
    /// `x-switchyard-ignore`.
    pub ignore: Vec<String>,
    /// `x-switchyard-order`.
    pub order: Vec<String>,
}

impl RequestHints {
    /// Reads the `x-switchyard-*` routing headers (values that are not UTF-8 are ignored).
    pub fn from_headers(h: &HeaderMap) -> Self {
        let text = |name: &str| {
            h.get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let list = |name: &str| -> Vec<String> {
            h.get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let only = list(HEADER_ONLY);
        Self {
            route: text(HEADER_ROUTE),
            user: text(HEADER_USER),
            only: (!only.is_empty()).then_some(only),
            ignore: list(HEADER_IGNORE),
            order: list(HEADER_ORDER),
        }
    }
}

/// The audit log's view of the caller's HTTP request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientInfo {
    /// The front door by path: `openai` (`/v1/chat/completions`, `/v1/completions`),
    /// `anthropic` (`/v1/messages`), `responses`, `embeddings`; `batch` for batch items.
    pub front_door: Option<&'static str>,
    /// The TCP peer's IP address.
    pub client_ip: Option<String>,
    /// `user-agent`, at most 256 bytes.
    pub user_agent: Option<String>,
    /// `x-request-id` when well-formed
    /// ([`switchyard_schemas::trace::well_formed_request_id`]).
    pub request_id: Option<String>,
}

/// Longest `user-agent` kept in the audit log, bytes.
const MAX_USER_AGENT_BYTES: usize = 256;

impl ClientInfo {
    /// Reads the front door from `req`'s path, the peer from its `ConnectInfo` and the
    /// `user-agent` and `x-request-id` headers.
    pub fn of(req: &axum::extract::Request) -> Self {
        let front_door = match req.uri().path() {
            "/v1/chat/completions" | "/v1/completions" => Some("openai"),
            "/v1/messages" => Some("anthropic"),
            "/v1/responses" => Some("responses"),
            "/v1/embeddings" => Some("embeddings"),
            _ => None,
        };
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
        Self {
            front_door,
            client_ip: req
                .extensions()
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip().to_string()),
            user_agent: header("user-agent")
                .map(|ua| switchyard_schemas::audit::clip(ua, MAX_USER_AGENT_BYTES)),
            request_id: header("x-request-id")
                .and_then(switchyard_schemas::audit::well_formed_request_id)
                .map(str::to_owned),
        }
    }
}

/// The hand-over of a batch item's `charge` event: the request's charge takes the sender when
/// it starts and, once settled, sends the event here instead of publishing it; the batch runner
/// publishes it when the try is the item's last and drops it when the item is retried (so a
/// retried item leaves one `charge` row, its last try's, under its one request id).
#[derive(Clone, Default)]
pub struct ChargeSlot(Arc<Mutex<Option<tokio::sync::oneshot::Sender<UsageEvent>>>>);

impl ChargeSlot {
    /// A new slot and the receiver of the event its charge sends.
    pub fn new() -> (Self, tokio::sync::oneshot::Receiver<UsageEvent>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Self(Arc::new(Mutex::new(Some(tx)))), rx)
    }

    /// Takes the sender (`None` once taken).
    pub fn take(&self) -> Option<tokio::sync::oneshot::Sender<UsageEvent>> {
        self.0.lock().take()
    }
}

impl std::fmt::Debug for ChargeSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChargeSlot")
    }
}

/// The batch item a request executes.
#[derive(Debug, Clone)]
pub struct BatchItem {
    /// The batch id (`batch_…` or `msgbatch_…`).
    pub batch_id: String,
    /// The item's request id, derived from the batch id and the `custom_id` (the same for every
    /// run of the item), so a re-run writes the same `charge` key (the ledger keeps one).
    pub request_id: Uuid,
    /// Added to the wire attempt numbers of this run of the item (its run number ×
    /// `crate::batch::records::ATTEMPTS_PER_RUN`), so each run's `upstream` rows keep their own
    /// ledger keys under the item's one request id.
    pub attempt_base: u32,
    /// Where the request's `charge` event goes instead of JetStream: the runner publishes it
    /// once it knows this try is the item's last.
    pub charge: ChargeSlot,
}

/// The `x-ratelimit-*` values of one answer (the caller's key); made and applied by
/// [`crate::rate_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateHeaders {
    /// `(limit, remaining)` requests, with `rpm`.
    pub requests: Option<(u64, u64)>,
    /// `(limit, remaining)` tokens, with `tpm`.
    pub tokens: Option<(u64, u64)>,
    /// Time until the counts reset, ms.
    pub reset_ms: u64,
}

/// What the request learnt before it was refused, for its refusal audit record
/// ([`crate::refusal_audit`]).
#[derive(Debug, Default)]
pub struct Seen {
    /// A charge was started: the charge event carries the record.
    pub admitted: bool,
    /// The `model` the body named (cut to 256 bytes).
    pub model: Option<String>,
}

/// The handler extractor of the request's context, which the gate put in its extensions.
pub type Ctx = axum::Extension<Arc<RequestContext>>;

/// One request's context (module docs). Shared by reference (`&RequestContext`, or an `Arc` in
/// the HTTP request's extensions); the few fields the pipeline writes are behind locks no one
/// holds across an await.
#[derive(Debug)]
pub struct RequestContext {
    /// The authenticated caller.
    pub caller: Caller,
    /// The routing headers.
    pub hints: RequestHints,
    /// Who is calling from where, for the audit log.
    pub client: ClientInfo,
    /// Set when a batch job runs this request as one of its items ([`crate::batch`]); never
    /// from a client header.
    pub batch: Option<BatchItem>,
    /// The gateway's id of this HTTP request (UUIDv7): the ledger key of the one request it
    /// admits. A batch item uses its own ([`BatchItem::request_id`]).
    pub gateway_id: Uuid,
    /// The request's server span ([`tracing::Span::none`] for batch items and with export off).
    pub span: tracing::Span,
    /// The gateway-overhead clock and the request's metrics route label.
    pub clock: Clock,
    /// Shared with contexts derived by [`RequestContext::with_hints`], like `rates`.
    seen: Arc<Mutex<Seen>>,
    rates: Arc<Mutex<Option<RateHeaders>>>,
}

impl RequestContext {
    /// The context of a request of `caller` on metrics route `route`
    /// ([`crate::metrics::route_of`]; `None` for batch items and other routes).
    pub fn new(
        caller: Caller,
        hints: RequestHints,
        client: ClientInfo,
        route: Option<&'static str>,
    ) -> Self {
        Self {
            caller,
            hints,
            client,
            batch: None,
            gateway_id: Uuid::now_v7(),
            span: tracing::Span::none(),
            clock: Clock::new(route),
            seen: Arc::default(),
            rates: Arc::default(),
        }
    }

    /// The same request with other routing `hints` (the Responses door pins a conversation to
    /// one target); what either notes is seen by both.
    pub fn with_hints(&self, hints: RequestHints) -> Self {
        Self {
            caller: self.caller.clone(),
            hints,
            client: self.client.clone(),
            batch: self.batch.clone(),
            gateway_id: self.gateway_id,
            span: self.span.clone(),
            clock: self.clock.clone(),
            seen: self.seen.clone(),
            rates: self.rates.clone(),
        }
    }

    /// This context for a batch item `item`.
    pub fn for_batch(mut self, item: BatchItem) -> Self {
        self.batch = Some(item);
        self
    }

    /// This context with the HTTP request's `gateway_id` and server `span`.
    pub fn for_http(mut self, gateway_id: Uuid, span: tracing::Span) -> Self {
        self.gateway_id = gateway_id;
        self.span = span;
        self
    }

    /// A context with no caller, hints or client (tests, internal calls).
    pub fn detached() -> Self {
        Self::new(
            Caller::default(),
            RequestHints::default(),
            ClientInfo::default(),
            None,
        )
    }

    /// The id of the request this context admits: the batch item's own, else the gateway id.
    pub fn new_request_id(&self) -> Uuid {
        self.batch
            .as_ref()
            .map_or(self.gateway_id, |b| b.request_id)
    }

    /// The request id the client sees and the NATS headers carry (`X-Request-Id`): the client's
    /// own when well-formed, else the gateway's `id`.
    pub fn shown_request_id(&self, id: Uuid) -> String {
        self.client
            .request_id
            .clone()
            .unwrap_or_else(|| id.to_string())
    }

    /// The batch id (`None` for live traffic).
    pub fn batch_id(&self) -> Option<String> {
        self.batch.as_ref().map(|b| b.batch_id.clone())
    }

    /// The offset of the wire attempt numbers (0 for live traffic; [`BatchItem::attempt_base`]).
    pub fn attempt_base(&self) -> u32 {
        self.batch.as_ref().map_or(0, |b| b.attempt_base)
    }

    /// Takes the batch item's charge sender (`None` for live traffic, or once taken).
    pub fn take_batch_charge(&self) -> Option<tokio::sync::oneshot::Sender<UsageEvent>> {
        self.batch.as_ref().and_then(|b| b.charge.take())
    }

    /// Marks the request as admitted (its charge started).
    pub fn note_admitted(&self) {
        self.seen.lock().admitted = true;
    }

    /// Notes the `model` the body named (cut to 256 bytes).
    pub fn note_model(&self, model: &str) {
        self.seen.lock().model = Some(switchyard_schemas::audit::clip(model, 256));
    }

    /// What was noted so far (taken: the refusal record reads it once).
    pub fn take_seen(&self) -> Seen {
        std::mem::take(&mut *self.seen.lock())
    }

    /// Records the `x-ratelimit-*` values admission computed.
    pub fn report_rates(&self, h: RateHeaders) {
        *self.rates.lock() = Some(h);
    }

    /// The `x-ratelimit-*` values admission recorded, if any.
    pub fn rates(&self) -> Option<RateHeaders> {
        *self.rates.lock()
    }
}
