//! Every gateway integration test in one binary: one link and one copy of the dependencies on
//! disk instead of one per file (CI once ran out of disk linking a dozen test binaries).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods, reason = "tasks end with their test")]

mod admin;
mod admin_secrets;
mod agents_compat;
mod anthropic_front_door;
mod audit;
mod balance;
mod batch;
mod batch_scale;
mod billing_faults;
mod budgets;
mod budgets_load;
mod cache;
mod cache_key_set;
mod cache_replica;
mod choices;
mod common;
mod config_precedence;
mod embeddings;
mod field_cases;
mod field_cases_billing;
mod field_cases_pricing;
mod field_cases_resilience;
mod field_cases_upstream;
mod flow_control;
mod front_door_audit;
mod fuzz;
mod hygiene;
mod input_hardening;
mod key_limits;
mod limits_load;
mod matrix;
mod metrics;
mod nats_auth;
mod otel_traces;
mod pipeline;
mod probes;
mod redaction;
mod reload;
mod resilience;
mod responses;
mod responses_pin;
mod responses_upstream;
mod routing;
mod server_limits;
mod structured_output;
mod tenant_isolation;
