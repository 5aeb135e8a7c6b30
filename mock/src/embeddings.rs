//! `POST /v1/embeddings` in OpenAI's shape (OpenAI API reference, "Create embeddings").
//!
//! Vectors are deterministic: the same text always gets the same unit-length vector, so tests can
//! compare exact values. Dimensions: the request's `dimensions`, default [`DEFAULT_DIMENSIONS`].
//! Usage: `prompt_tokens` = whitespace-separated words over all inputs (token-id inputs count their
//! ids). `x-mock-status` (+ `x-mock-retry-after`) makes it fail like the chat routes.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// Vector length when the request gives no `dimensions`.
pub const DEFAULT_DIMENSIONS: usize = 8;

/// The deterministic vector the mock returns for `text` (FNV-1a per component, L2-normalised).
pub fn mock_vector(text: &str, dims: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..dims)
        .map(|i| {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ (i as u64);
            for b in text.as_bytes() {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            ((h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
        })
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// Builds the answer (or the configured error) for one request body.
pub(crate) fn respond(headers: &HeaderMap, body: &Value) -> Response {
    if let Some(status) = headers
        .get("x-mock-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u16>().ok())
        .filter(|s| *s >= 400)
    {
        let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (code, axum::Json(super::openai::error_body(status, None))).into_response();
        if let Some(v) = headers.get("x-mock-retry-after") {
            resp.headers_mut().insert("retry-after", v.clone());
        }
        return resp;
    }
    let dims = body
        .get("dimensions")
        .and_then(Value::as_u64)
        .map_or(DEFAULT_DIMENSIONS, |d| d as usize);
    let inputs: Vec<String> = match body.get("input") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => vec![ids_text(items)],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_array().map(|a| ids_text(a)).unwrap_or_default())
            .collect(),
        _ => {
            let err = super::openai::error_body(400, Some("'input' is a required property"));
            return (StatusCode::BAD_REQUEST, axum::Json(err)).into_response();
        }
    };
    let tokens: usize = inputs.iter().map(|t| t.split_whitespace().count()).sum();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": mock_vector(t, dims)}))
        .collect();
    let model = body.get("model").cloned().unwrap_or(Value::Null);
    axum::Json(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response()
}

/// Token-id input rendered as words, so each id counts as one token.
fn ids_text(ids: &[Value]) -> String {
    ids.iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}
