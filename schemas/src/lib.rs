//! Switchyard's shared vocabulary: the types every service exchanges over NATS.
//!
//! Data flows one way: ingress publishes a [`request::ChatRequest`] on a capability-keyed subject
//! ([`subjects::Subjects::request`]); a provider worker answers with an ordered stream of
//! [`frame::Frame`]s on the request's reply subject; both sides publish [`usage::UsageEvent`]s to the
//! durable usage stream that billing consumes. Config types live in [`config`], the pricing catalog
//! (cost and sale prices, shared by billing and cost-aware routing) in [`pricing`], target health
//! events in [`health`].
//!
//! Wire encoding is JSON (serde_json) for every payload.

pub mod audit;
pub mod balance;
pub mod cache;
pub mod capabilities;
pub mod config;
pub mod config_handle;
pub mod config_text;
pub mod count;
pub mod embed;
pub mod error;
pub mod finish;
pub mod frame;
pub mod health;
pub mod input;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod nats_config;
pub mod pricing;
pub mod pricing_import;
pub mod ready;
pub mod replicas;
pub mod request;
pub mod routing;
pub mod sealed;
pub mod secret;
pub mod subjects;
pub mod tenancy;
#[cfg(feature = "tokens")]
pub mod tokens;
pub mod trace;
pub mod usage;
pub mod usage_query;

pub use error::{Disposition, ErrorClass, ErrorInfo, TargetHealth};
pub use finish::FinishReason;
pub use frame::{Frame, FrameBody};
pub use request::ChatRequest;
pub use secret::Secret;
pub use usage::{Usage, UsageEvent, UsageKind};

/// Milliseconds since the Unix epoch, the time unit of every timestamp in these types.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
