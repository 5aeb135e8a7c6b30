//! Provider workers: pull normalised requests from NATS queue groups, call the upstream model API
//! and stream normalised frames back. One file per provider under [`providers`], all behind the
//! [`provider::Provider`] trait; [`worker`] owns timeouts, heartbeats, cancellation and usage events.
//! Per-target protection: [`limits`] (RPM/TPM shared across replicas through NATS KV, concurrency),
//! [`breaker`] (circuit breaker, provider 429 cooldown), [`retry`] (retries inside the worker);
//! state changes go out on the health subject ([`health`]).

pub mod breaker;
mod context;
mod count;
mod embed;
mod frame_sink;
pub mod health_events;
pub mod limits;
pub mod prober;
pub mod provider;
pub mod providers;
pub mod retry;
pub mod spans;
pub mod sse;
pub mod worker;
