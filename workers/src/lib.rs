//! Provider workers: pull normalised requests from NATS queue groups, call the upstream model API
//! and stream normalised frames back. One file per provider under [`providers`], all behind the
//! [`provider::Provider`] trait; [`worker`] owns timeouts, heartbeats, cancellation and usage events.

mod embed;
pub mod mock_upstream;
pub mod provider;
pub mod providers;
pub mod sse;
pub mod worker;
