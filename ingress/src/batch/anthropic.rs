//! Anthropic Message Batches (Anthropic API reference, "Message Batches"):
//! `POST/GET /v1/messages/batches`, `GET/DELETE /v1/messages/batches/{id}`,
//! `POST /v1/messages/batches/{id}/cancel`, `GET /v1/messages/batches/{id}/results` (JSONL).
//! Same machinery as the OpenAI Batch API; any configured provider serves the items. Errors in
//! Anthropic's envelope.

use super::records::{Api, BatchRecord, Counts, FileRecord, ItemResult, Outcome, Status};
use super::{FileSlot, store_error, store_of, submit};
use crate::AppState;
use crate::context::Caller;
use crate::error::ApiError;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use switchyard_schemas::now_ms;

/// Anthropic batches end within 24 hours.
const WINDOW_S: u64 = 24 * 3600;

/// Seconds since the epoch as Anthropic's RFC 3339 timestamps (the usage API's formatter).
fn rfc3339(secs: Option<u64>) -> Value {
    secs.map_or(Value::Null, |s| {
        Value::String(crate::usage_api::rfc3339(s.saturating_mul(1000)))
    })
}

/// The `message_batch` object; `base` is the gateway's URL as the client reached it (for
/// `results_url`, which the SDKs fetch as given).
pub fn batch_json(b: &BatchRecord, c: &Counts, base: &str) -> Value {
    let ended = b.status.is_terminal();
    let processing_status = match b.status {
        _ if ended => "ended",
        Status::Cancelling => "canceling",
        _ => "in_progress",
    };
    let ended_at = b.cancelled_at.or(b.expired_at).or(b.completed_at);
    json!({
        "id": b.id, "type": "message_batch", "processing_status": processing_status,
        "request_counts": {
            "processing": if ended { 0 } else { c.processing() },
            "succeeded": c.succeeded, "errored": c.errored,
            "canceled": c.canceled, "expired": c.expired,
        },
        "ended_at": rfc3339(ended_at),
        "created_at": rfc3339(Some(b.created_at())),
        "expires_at": rfc3339(Some(b.expires_at)),
        "archived_at": null,
        "cancel_initiated_at": rfc3339(b.cancelling_at),
        "results_url": if ended {
            Value::String(format!("{base}/v1/messages/batches/{}/results", b.id))
        } else {
            Value::Null
        },
    })
}

fn base_url(headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost");
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("http");
    format!("{scheme}://{host}")
}

fn fail(e: ApiError) -> Response {
    e.into_anthropic_response()
}

/// `r` as a 200 JSON body, or its error in Anthropic's envelope.
fn reply(r: Result<Value, ApiError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => fail(e),
    }
}

/// `POST /v1/messages/batches` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBatch {
    requests: Vec<Value>,
}

/// `POST /v1/messages/batches`: every request is validated first; any invalid one is a 400
/// naming each (`requests[i]`) and nothing runs.
pub async fn create(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let de = &mut serde_json::Deserializer::from_slice(&body);
    let req: CreateBatch = match serde_path_to_error::deserialize(de) {
        Ok(r) => r,
        Err(e) => {
            let path = e.path().to_string();
            return fail(ApiError::invalid(
                format!("{path}: {}", e.into_inner()),
                Some(path),
            ));
        }
    };
    let store = match store_of(&app) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let checked = match super::validate::anthropic_requests(&app, &req.requests) {
        Ok(c) => c,
        Err(errors) => {
            let message = errors
                .iter()
                .map(|e| match e.line {
                    Some(l) => format!("requests.{}: {}", l - 1, e.message),
                    None => e.message.clone(),
                })
                .collect::<Vec<_>>()
                .join("; ");
            return fail(ApiError::invalid(message, Some("requests".into())));
        }
    };
    let record = BatchRecord::new(
        Api::Anthropic,
        "msgbatch_",
        "/v1/messages".into(),
        (caller.tenant, caller.key_id),
        None,
        "24h".into(),
        WINDOW_S,
        None,
    );
    match submit(&app, &store, record, Ok(checked)).await {
        Ok(rec) => Json(batch_json(&rec, &rec.counts, &base_url(&headers))).into_response(),
        Err(e) => fail(e),
    }
}

async fn owned(
    app: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<(BatchRecord, u64, String), ApiError> {
    super::owned(app, caller, Api::Anthropic, "message batch", id).await
}

/// `GET /v1/messages/batches/{id}`.
pub async fn retrieve(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let r = async {
        let (b, _, _) = owned(&app, &caller, &id).await?;
        let c = super::live_counts(&app, &b).await?;
        Ok::<_, ApiError>(batch_json(&b, &c, &base_url(&headers)))
    }
    .await;
    reply(r)
}

/// `?limit&after_id&before_id` of the list.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    limit: Option<usize>,
    after_id: Option<String>,
    before_id: Option<String>,
}

/// `GET /v1/messages/batches` (newest first; `after_id` pages on, `before_id` pages back).
pub async fn list(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Response {
    let result = async {
        let store = store_of(&app)?;
        let tenant = caller.tenant.clone();
        let (id, ascending) = match &q.before_id {
            Some(before) => (Some(before.as_str()), true),
            None => (q.after_id.as_deref(), false),
        };
        let (mut batches, has_more) = super::batch_page(
            &store,
            tenant.as_deref(),
            Api::Anthropic,
            id,
            ascending,
            q.limit.unwrap_or(20).clamp(1, 1000),
        )
        .await?;
        if ascending {
            batches.reverse();
        }
        let base = base_url(&headers);
        let data = super::with_live_counts(&app, &batches, |b, c| batch_json(b, c, &base)).await;
        let (first, last) = super::end_ids(&data);
        Ok::<_, ApiError>(
            json!({"data": data, "has_more": has_more, "first_id": first, "last_id": last}),
        )
    }
    .await;
    reply(result)
}

/// `POST /v1/messages/batches/{id}/cancel`.
pub async fn cancel(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let r = async {
        let (b, rev, key) = owned(&app, &caller, &id).await?;
        let b = super::cancel(&app, &key, b, rev).await?;
        let c = super::live_counts(&app, &b).await?;
        Ok::<_, ApiError>(batch_json(&b, &c, &base_url(&headers)))
    }
    .await;
    reply(r)
}

/// `GET /v1/messages/batches/{id}/results`: one JSON line per request, once the batch ended.
pub async fn results(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Response {
    let r = async {
        let (b, _, _) = owned(&app, &caller, &id).await?;
        let Some(file) = b.output_file_id.clone().filter(|_| b.status.is_terminal()) else {
            return Err(ApiError::invalid(
                format!("Message batch {id} has not ended yet; results are not available."),
                None,
            ));
        };
        store_of(&app)?
            .file_content(&file)
            .await
            .map_err(store_error)
    }
    .await;
    match r {
        Ok(bytes) => {
            let mut resp = bytes.into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-jsonl"),
            );
            resp
        }
        Err(e) => fail(e),
    }
}

/// `DELETE /v1/messages/batches/{id}` (an ended batch only).
pub async fn delete(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Response {
    let r = async {
        let (b, _, key) = owned(&app, &caller, &id).await?;
        if !b.status.is_terminal() {
            return Err(ApiError::invalid(
                format!("Message batch {id} is still processing; cancel it first."),
                None,
            ));
        }
        let store = store_of(&app)?;
        if let Some(f) = &b.output_file_id {
            let fkey = super::records::file_key(b.tenant.as_deref(), f);
            store.delete_file(&fkey, f).await.map_err(store_error)?;
        }
        store.delete_record(&key).await.map_err(store_error)?;
        Ok(json!({"id": b.id, "type": "message_batch_deleted"}))
    }
    .await;
    reply(r)
}

/// The results file of a finished batch: `{"custom_id","result":{...}}` per request with
/// `succeeded` (+ `message`), `errored` (+ `error`), `canceled` or `expired` (Anthropic API
/// reference, "Retrieve Message Batch results").
pub fn result_files(
    b: &BatchRecord,
    results: &[ItemResult],
) -> Vec<(FileSlot, FileRecord, Vec<u8>)> {
    let mut out = Vec::new();
    for r in results {
        let result = match r.outcome {
            Outcome::Succeeded => json!({"type": "succeeded", "message": r.body}),
            Outcome::Errored => json!({"type": "errored", "error": r.body}),
            Outcome::Canceled => json!({"type": "canceled"}),
            Outcome::Expired => json!({"type": "expired"}),
        };
        out.extend_from_slice(
            json!({"custom_id": r.custom_id, "result": result})
                .to_string()
                .as_bytes(),
        );
        out.push(b'\n');
    }
    let file = FileRecord {
        id: format!("file-{}r", b.id.trim_start_matches("msgbatch_")),
        bytes: out.len() as u64,
        created_at: now_ms() / 1000,
        filename: format!("{}_results.jsonl", b.id),
        purpose: "batch_output".into(),
        tenant: b.tenant.clone(),
        list_seq: 0,
    };
    vec![(FileSlot::Output, file, out)]
}
