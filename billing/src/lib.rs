//! Switchyard billing: consumes the durable usage stream and keeps an idempotent usage ledger.
//!
//! Ingress and workers publish JSON [`UsageEvent`](switchyard_schemas::UsageEvent)s on
//! `<prefix>.usage.<kind>.<request_id>`; the JetStream stream `SY_USAGE` keeps them
//! ([`ensure_usage_stream`]). [`BillingService`] reads them through the durable pull consumer
//! `billing` in batches and writes each batch to the [`Ledger`] (SQLite or PostgreSQL) in one
//! transaction, keyed by (`request_id`, `kind`, `attempt`), acking only after the commit: replay
//! and redelivery never double count.
//!
//! Pricing, budgets and reports build on the ledger's `usage_events` table.

mod error;
pub mod ledger;
pub mod pricing;
pub mod service;
pub mod stream;

pub use error::BillingError;
pub use ledger::{Backend, Ledger};
pub use service::{BillingService, BillingStats, ServiceConfig, run};
pub use stream::{ensure_billing_consumer, ensure_usage_stream};
