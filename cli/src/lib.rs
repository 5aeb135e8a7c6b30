//! The `switchyard` binary's reusable parts: config loading and live config reload. The binary
//! (`main.rs`) wires the services; tests use these directly.

pub mod config;
pub mod reload;
