//! The whole configuration file ([`GatewayConfig`]) and its small service sections.

use super::server::{ServerConfig, Timeouts};
use super::target::{ModelConfig, TargetConfig};
use crate::routing::Policy;
use serde::{Deserialize, Serialize};

/// The whole configuration file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// HTTP listen address of ingress, default `127.0.0.1:8080`.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// NATS server URL. `None` makes `switchyard up` start a private nats-server.
    pub nats_url: Option<String>,
    /// NATS credentials and TLS (`nats:`); CLI flags and `SWITCHYARD_NATS_*` override it.
    #[serde(default)]
    pub nats: crate::nats_config::NatsConfig,
    /// Subject prefix (one NATS token), default `sy`.
    #[serde(default = "default_prefix")]
    pub subject_prefix: String,
    /// Where the embedded nats-server and the SQLite ledger keep data, default `./data`.
    #[serde(default = "default_data_dir")]
    pub data_dir: String,
    /// Upstream targets.
    #[serde(default)]
    pub targets: Vec<TargetConfig>,
    /// Models clients can name, each mapped to ordered targets.
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    /// Routing policies models refer to.
    #[serde(default)]
    pub policies: Vec<Policy>,
    /// Timeouts.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Billing ledger.
    #[serde(default)]
    pub billing: BillingConfig,
    /// Pricing catalog file (same shape as the bundled `schemas/pricing/catalog.yaml`); `None` =
    /// the bundled catalog. Read by ingress (budget reservations, cost routing) and billing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing_file: Option<String>,
    /// What a request whose model, or a component of whose usage, has no price is charged
    /// (`reject`, `zero` or `{charge_at: <standard model>}`); `None`: `reject` for callers with a
    /// USD budget, `zero` (with the `unpriced_component` alarm) otherwise. See docs/pricing.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unpriced: Option<crate::pricing::UnpricedPolicy>,
    /// API keys. Empty = no authentication (every request is anonymous and unlimited).
    #[serde(default)]
    pub keys: Vec<crate::tenancy::KeyConfig>,
    /// Tenants with budgets shared by their keys.
    #[serde(default)]
    pub tenants: Vec<crate::tenancy::TenantConfig>,
    /// Admin API keys and the replica staleness limit (`/admin/…`, docs/security.md).
    #[serde(default)]
    pub admin: crate::tenancy::AdminConfig,
    /// How admission estimates the cost it reserves against budgets.
    #[serde(default)]
    pub budgets: crate::tenancy::BudgetSettings,
    /// Ingress HTTP server limits and the shutdown drain (read at start; a reload does not
    /// change them).
    #[serde(default)]
    pub server: ServerConfig,
    /// Batch jobs (OpenAI Batch API, Anthropic Message Batches): how each ingress runs items.
    #[serde(default)]
    pub batch: BatchConfig,
    /// Stored responses of the OpenAI Responses front door (`store`, `previous_response_id`).
    #[serde(default)]
    pub responses: ResponsesConfig,
    /// The audit log: retention and body capture (docs/audit.md).
    #[serde(default)]
    pub audit: crate::audit::AuditConfig,
    /// OpenTelemetry span export over OTLP, off by default (docs/tracing.md).
    #[serde(default)]
    pub tracing: crate::trace::TracingConfig,
    /// An exact-layer copy of the response cache in each ingress (read at start), off by
    /// default: see [`crate::cache::CacheReplica`].
    #[serde(default)]
    pub cache_replica: crate::cache::CacheReplica,
}

/// How batch items share an ingress with live traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Run batch items in this process (every ingress does by default; the items stream is a
    /// work queue, so they spread over the replicas).
    pub run: bool,
    /// Items one ingress runs at once. Default 8.
    pub max_in_flight: usize,
    /// A new item waits while this ingress has more than this many live requests in flight, so
    /// interactive traffic goes first (its bursts are what make the p99). Default 4.
    pub yield_above: u64,
    /// How long a runner may hold an item without acknowledging it before JetStream hands it to
    /// another runner (the items consumer's `ack_wait`, set when the consumer is created),
    /// seconds. A running item reports progress every third of it, so only a dead runner's items
    /// move. Default 60.
    pub ack_wait_s: u64,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            run: true,
            max_in_flight: 8,
            yield_above: 4,
            ack_wait_s: 60,
        }
    }
}

/// The stored responses of `POST /v1/responses` (JetStream KV bucket `SY_RESPONSES`), read at
/// ingress start: the bucket's age limit (`max_age`) is set to `ttl_s` then, also on an existing bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResponsesConfig {
    /// How long a stored response (and its input items) stays retrievable and continuable,
    /// seconds. Default 2,592,000 (30 days, as OpenAI keeps stored responses).
    pub ttl_s: u64,
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        Self {
            ttl_s: 30 * 24 * 3600,
        }
    }
}

/// Billing ledger settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BillingConfig {
    /// sqlx URL, `sqlite://…` or `postgres://…`. `None` = SQLite at `<data_dir>/ledger.db`.
    pub database_url: Option<String>,
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_prefix() -> String {
    "sy".into()
}
fn default_data_dir() -> String {
    "./data".into()
}

impl GatewayConfig {
    /// The target with this id.
    pub fn target(&self, id: &str) -> Option<&TargetConfig> {
        self.targets.iter().find(|t| t.id == id)
    }

    /// The policy with this id.
    pub fn policy(&self, id: &str) -> Option<&Policy> {
        self.policies.iter().find(|p| p.id == id)
    }

    /// The model with this id.
    pub fn model(&self, id: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.id == id)
    }
}
