//! Ingress asking the billing service over NATS request/reply: `GET /v1/usage`, the audit log
//! (`GET /admin/requests`), the dashboard and prepaid balances all go through [`ask`], so "no
//! billing running", "billing too slow" and "billing's answer unreadable" read the same on every
//! route.

use crate::error::ApiError;
use axum::http::StatusCode;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::time::Duration;

/// How long ingress waits for billing's answer (one billing instance of the queue group).
pub(crate) const BILLING_RPC_TIMEOUT: Duration = Duration::from_secs(5);

/// What a call is for, as its errors name it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Purpose {
    /// Completes "No billing service is running to …", e.g. `answer usage queries`.
    pub what: &'static str,
    /// The `code` of the 503 when billing cannot be asked (no responders, timeout).
    pub unavailable_code: &'static str,
    /// The `code` of the 500 when billing's answer is unreadable or an error.
    pub failed_code: &'static str,
}

/// Sends `query` (JSON) to `subject` and decodes billing's JSON answer.
///
/// Errors: 503 `purpose.unavailable_code` with `Retry-After: 1` when no billing instance listens
/// or none answers within [`BILLING_RPC_TIMEOUT`]; 500 `purpose.failed_code` when the answer does
/// not decode as `A`. An answer that decodes but reports an error is the caller's to map.
pub(crate) async fn ask<Q: Serialize, A: DeserializeOwned>(
    nats: &async_nats::Client,
    subject: String,
    query: &Q,
    purpose: Purpose,
) -> Result<A, ApiError> {
    use async_nats::RequestErrorKind::{NoResponders, TimedOut};
    let payload = serde_json::to_vec(query).map_err(|e| failed(purpose, e.to_string()))?;
    let request = async_nats::Request::new()
        .payload(payload.into())
        .timeout(Some(BILLING_RPC_TIMEOUT));
    let reply = nats
        .send_request(subject, request)
        .await
        .map_err(|e| match e.kind() {
            NoResponders => unavailable(
                purpose,
                format!("No billing service is running to {}.", purpose.what),
            ),
            TimedOut => unavailable(
                purpose,
                format!(
                    "The billing service did not answer within {} s; narrow the query or retry.",
                    BILLING_RPC_TIMEOUT.as_secs()
                ),
            ),
            _ => unavailable(purpose, format!("Asking the billing service failed: {e}")),
        })?;
    serde_json::from_slice(&reply.payload)
        .map_err(|e| failed(purpose, format!("unreadable answer from billing: {e}")))
}

/// The 500 of `purpose` for billing's own error (`billing could not answer: …`).
pub(crate) fn billing_error(purpose: Purpose, error: &str) -> ApiError {
    failed(purpose, format!("billing could not answer: {error}"))
}

fn unavailable(purpose: Purpose, message: String) -> ApiError {
    ApiError::unavailable(purpose.unavailable_code, message)
}

fn failed(purpose: Purpose, message: String) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        purpose.failed_code,
        message,
    )
}
