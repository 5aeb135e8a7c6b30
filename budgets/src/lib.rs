//! Budgets and token quotas shared by every ingress replica: admission *reserves* a request's
//! estimated charge, completion *settles* it with the actual charge. State lives in one
//! JetStream KV entry per scope (`key.<id>`, `tenant.<id>` in [`BUDGETS_BUCKET`]); see
//! [`store`] for the group-commit protocol and its exactness argument, docs/budgets.md for the
//! user-facing rules. The request-rate limits of keys and tenants (RPM, TPM, concurrency) use
//! the same machinery in [`rate`] (docs/limits.md).

pub mod rate;
pub mod rebuild;
pub mod spend;
pub mod store;

pub use rate::{RATES_BUCKET, RateError, RateStore, Refusal, Window};
pub use rebuild::{REBUILT_KEY, Seeded};
pub use spend::{Demand, Exceeded, Held, Prepaid, Spend};
pub use store::{BUDGETS_BUCKET, BudgetStore, Limit, ReserveError, Unavailable};
