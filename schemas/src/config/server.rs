//! Timeouts and the ingress HTTP server's limits.

use super::error::{ConfigError, err};
use serde::{Deserialize, Serialize};

/// Timeouts, all in milliseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Ingress: no frame at all from a worker within this → try the next target.
    pub first_frame_ms: u64,
    /// Ingress: no frame (heartbeats count) within this after the start → the worker is gone.
    pub worker_silence_ms: u64,
    /// Worker: heartbeat interval while the upstream is silent. Must be < `worker_silence_ms`.
    pub heartbeat_ms: u64,
    /// Worker: TCP/TLS connect timeout.
    pub connect_ms: u64,
    /// Worker: time to the first upstream byte of the body (TTFT bound).
    pub first_byte_ms: u64,
    /// Worker: longest gap between two upstream body reads.
    pub idle_ms: u64,
    /// Whole request, admission to last byte.
    pub total_ms: u64,
    /// Worker: longest wait for flow-control credit from ingress (the client stopped reading its
    /// stream). Then the worker cancels the upstream call, ends the attempt with an error frame and
    /// bills what it delivered. Must be ≥ 1.
    pub stall_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            first_frame_ms: 2_000,
            worker_silence_ms: 5_000,
            heartbeat_ms: 1_000,
            connect_ms: 5_000,
            first_byte_ms: 60_000,
            idle_ms: 60_000,
            total_ms: 600_000,
            stall_ms: 30_000,
        }
    }
}

/// Ingress HTTP server limits (HTTP/1.1), durations in milliseconds. Every value must be > 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// A request head (request line and headers) must arrive within this, else the connection is
    /// closed without an answer (slowloris). The same timer runs while a keep-alive connection
    /// waits for its next request, so it also bounds the idle time. Default 10,000.
    pub header_read_timeout_ms: u64,
    /// The whole request body must arrive within this after its head, else 408. Default 30,000.
    pub body_read_timeout_ms: u64,
    /// A keep-alive connection with no request in flight is closed after this (the effective
    /// limit is the smaller of this and `header_read_timeout_ms`). Default 10,000.
    pub idle_timeout_ms: u64,
    /// A connection whose socket writes make no progress for this long (a client that stopped
    /// reading) is closed, ending its stream. Default 30,000.
    pub write_stall_ms: u64,
    /// Open client connections; one more is answered 503 with `Retry-After` and closed. Lowered
    /// at start to the process's file-descriptor limit minus a reserve of 1,024. Default 10,000.
    pub max_connections: usize,
    /// Requests in flight (a stream counts until its last byte); one more gets 503
    /// `server_overloaded` with `Retry-After: 1`. `/healthz` and `/metrics` are not counted.
    /// Default 5,000.
    pub max_in_flight: usize,
    /// On SIGTERM/SIGINT, how long in-flight requests and streams may take to finish before
    /// their connections are closed. Default 30,000.
    pub drain_timeout_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            idle_timeout_ms: 10_000,
            write_stall_ms: 30_000,
            max_connections: 10_000,
            max_in_flight: 5_000,
            drain_timeout_ms: 30_000,
        }
    }
}

impl ServerConfig {
    /// Checks that every value is > 0.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let fields = [
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("write_stall_ms", self.write_stall_ms),
            ("max_connections", self.max_connections as u64),
            ("max_in_flight", self.max_in_flight as u64),
            ("drain_timeout_ms", self.drain_timeout_ms),
        ];
        match fields.iter().find(|(_, v)| *v == 0) {
            Some((name, _)) => Err(err(format!("server.{name}"), "must be > 0")),
            None => Ok(()),
        }
    }
}
