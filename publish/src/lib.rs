//! The one way Switchyard's producers (ingress and workers) publish usage events to the durable
//! usage stream billing consumes.
//!
//! - [`publish`]: one acknowledged, deduplicated JetStream publish with retries
//!   ([`publish_usage_event`]); what JetStream does not acknowledge is spooled.
//! - [`batch`]: [`UsagePublisher`], the group-committed publisher a process uses for every event
//!   it produces (one message per kind subject per batch, same guarantees).
//! - [`spool`]: the fsync'd local [`Spool`] and [`drain_spool`], which re-publishes spooled events
//!   once NATS answers again.
//! - [`metrics`]: [`add_process_collectors`], the spool-size gauges and publish-error counters
//!   (family names in [`switchyard_schemas::metrics`]).
//!
//! # Spool ownership
//!
//! A process opens its [`Spool`] ([`Spool::open`]) and hands it to its publishers and to one
//! [`drain_spool`] task (and to [`add_process_collectors`]); nothing here finds a spool by
//! itself. The only process-wide state is the publish-error counters ([`count_publish_error`],
//! [`publish_errors`]), which every registry of the process shows.
//!
//! The message types and subjects are those of [`switchyard_schemas`].

pub mod batch;
mod message;
pub mod metrics;
pub mod publish;
pub mod spool;
#[cfg(test)]
mod test_support;

pub use batch::UsagePublisher;
pub use metrics::add_process_collectors;
pub use publish::{
    PublishKind, count_publish_error, publish_errors, publish_usage_event, sync_with_server,
};
pub use spool::{DrainOutcome, Spool, SpoolStats, drain_spool};
