//! Switchyard billing: consumes the durable usage stream and keeps an idempotent usage ledger.
//!
//! Ingress and workers publish JSON [`UsageEvent`](switchyard_schemas::UsageEvent)s on
//! `<prefix>.usage.<kind>`; the JetStream work-queue stream `SY_USAGE_WQ` holds them until billing
//! has stored them ([`ensure_usage_stream`], which also migrates a legacy `SY_USAGE`). [`BillingService`] reads them through the durable pull consumer
//! `billing` in batches and writes each batch to the [`Ledger`] (SQLite or PostgreSQL) with
//! multi-row inserts in one transaction (on PostgreSQL, one per [`ServiceConfig::writers`] part),
//! keyed by (`request_id`, `kind`, `attempt`), acking only after the commit: replay and
//! redelivery never double count.
//!
//! Pricing, budgets and reports build on the ledger's `usage_events` table: [`reconcile`](mod@reconcile) matches
//! each request's `charge` row against its `upstream` rows, [`report`] builds the daily report
//! (table, CSV, JSON, HTML), [`report_import`] compares a provider's usage export with the
//! ledger, and [`query`] answers usage queries over NATS (the billing side of `GET /v1/usage`,
//! served beside the consumer by [`run`], as are the audit and balance queries: [`Query`]).

pub mod audit;
pub mod balance;
pub mod budget_rebuild;
mod decode;
mod error;
pub mod lag;
pub mod ledger;
mod ledger_url;
mod ledger_write;
mod multi_row;
pub use switchyard_schemas::pricing;
pub mod query;
pub mod reconcile;
pub mod report;
mod report_html;
pub mod report_import;
mod row;
mod serve;
pub mod service;
pub mod stream;

pub use error::BillingError;
pub use ledger::Ledger;
pub use reconcile::{DiscrepancyClass, Reconciliation, reconcile};
pub use report::{DailyReport, ReportError, daily_report};
pub use report_import::{ImportDiff, import_usage_diff, parse_usage_export};
pub use row::Backend;
pub use serve::{MAX_CONCURRENT_QUERIES, QUERY_QUEUE_GROUP, Query, serve_queries};
pub use service::{BillingService, BillingStats, ServiceConfig, run};
pub use stream::{ensure_billing_consumer, ensure_usage_stream};
