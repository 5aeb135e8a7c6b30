//! Compare-and-set on JetStream KV entries, shared by the budget store (`switchyard-budgets`)
//! and the workers' RPM/TPM limits: [`cas`] reads and writes one JSON entry by revision with
//! conflict detection and a jittered backoff; [`combine`] group-commits the concurrent
//! operations of one process on one key (one leader applies a batch in arrival order, writes
//! once, answers everyone), so writers contending for an entry are processes, not requests;
//! [`bucket`] opens a bucket, creating it if no replica has yet.
//!
//! Policy stays with the caller: what an absent or unreadable entry means (budgets fail closed,
//! limits substitute a full bucket), how long conflicts are retried, what a failure answers.

pub mod bucket;
pub mod cas;
pub mod combine;

pub use bucket::get_or_create;
pub use cas::{KvError, Stored, WriteError, backoff, load, write};
pub use combine::{Aborted, Batch, Combiner, Combiners, Plan};
