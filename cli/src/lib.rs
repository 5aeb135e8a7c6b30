//! The `switchyard` binary's reusable parts: config loading, live config reload, NATS
//! connections, the embedded server's permissions and the wiring of the services into a process
//! ([`topology`], used by `switchyard up` and the integration tests).

pub mod config;
pub mod data_lock;
pub mod metrics_listen;
pub mod nats;
pub mod nats_auth;
pub mod reload;
pub mod topology;
