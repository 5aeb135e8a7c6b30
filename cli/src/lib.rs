//! The `switchyard` binary's reusable parts: config loading, live config reload, NATS
//! connections and the embedded server's permissions. The binary (`main.rs`) wires the services;
//! tests use these directly.

pub mod config;
pub mod data_lock;
pub mod metrics_listen;
pub mod nats;
pub mod nats_auth;
pub mod reload;
