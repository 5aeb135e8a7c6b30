//! The OpenAI Files and Batch APIs (OpenAI API reference, "Files" and "Batch"):
//! `POST/GET /v1/files`, `GET/DELETE /v1/files/{id}`, `GET /v1/files/{id}/content`,
//! `POST/GET /v1/batches`, `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`.
//! Everything is scoped to the caller's tenant: another tenant's id is a 404.

use super::records::{
    Api, BatchRecord, Counts, FileRecord, ItemResult, Outcome, file_key, file_list, valid_id,
};
use super::store::BatchStore;
use super::{Cursor, FileSlot, new_id, not_found, openai_list, parse_window, store_error, submit};
use crate::AppState;
use crate::context::Caller;
use crate::error::ApiError;
use axum::Json;
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use switchyard_schemas::now_ms;

fn file_json(f: &FileRecord) -> Value {
    json!({
        "id": f.id, "object": "file", "bytes": f.bytes, "created_at": f.created_at,
        "filename": f.filename, "purpose": f.purpose, "status": "processed",
        "expires_at": null, "status_details": null,
    })
}

/// The OpenAI batch object.
pub fn batch_json(b: &BatchRecord, c: &Counts) -> Value {
    let errors = if b.errors.is_empty() {
        Value::Null
    } else {
        json!({"object": "list", "data": b.errors})
    };
    let usage = &b.usage;
    json!({
        "id": b.id, "object": "batch", "endpoint": b.endpoint, "errors": errors,
        "input_file_id": b.input_file_id, "completion_window": b.completion_window,
        "status": b.status, "output_file_id": b.output_file_id, "error_file_id": b.error_file_id,
        "created_at": b.created_at(), "in_progress_at": b.in_progress_at,
        "expires_at": b.expires_at, "finalizing_at": b.finalizing_at,
        "completed_at": b.completed_at, "failed_at": b.failed_at, "expired_at": b.expired_at,
        "cancelling_at": b.cancelling_at, "cancelled_at": b.cancelled_at,
        "request_counts": {
            "total": c.total,
            "completed": c.succeeded,
            "failed": c.errored + c.expired + c.canceled,
        },
        "metadata": b.metadata,
        "usage": {
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.input_tokens.saturating_add(usage.output_tokens),
        },
    })
}

/// `POST /v1/files` (multipart: `file`, `purpose`).
pub async fn upload(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    mut form: Multipart,
) -> Response {
    let store = match super::store_of(&app) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let (mut content, mut filename, mut purpose) = (None, None, None);
    loop {
        match form.next_field().await {
            Ok(Some(field)) => {
                let name = field.name().unwrap_or("").to_owned();
                match name.as_str() {
                    "file" => {
                        filename = Some(field.file_name().unwrap_or("upload.jsonl").to_owned());
                        match field.bytes().await {
                            Ok(b) => content = Some(b),
                            Err(e) => {
                                return ApiError::invalid(format!("`file` unreadable: {e}"), None)
                                    .into_response();
                            }
                        }
                    }
                    "purpose" => purpose = field.text().await.ok(),
                    _ => {}
                }
            }
            Ok(None) => break,
            Err(e) => {
                return ApiError::invalid(format!("Invalid multipart body: {e}"), None)
                    .into_response();
            }
        }
    }
    let Some(content) = content else {
        return ApiError::invalid("Missing required parameter: 'file'.", Some("file".into()))
            .into_response();
    };
    let Some(purpose) = purpose else {
        return ApiError::invalid(
            "Missing required parameter: 'purpose'.",
            Some("purpose".into()),
        )
        .into_response();
    };
    const PURPOSES: &[&str] = &[
        "batch",
        "assistants",
        "fine-tune",
        "vision",
        "user_data",
        "evals",
    ];
    if !PURPOSES.contains(&purpose.as_str()) {
        return ApiError::invalid(
            format!("'{purpose}' is not one of {PURPOSES:?} - 'purpose'"),
            Some("purpose".into()),
        )
        .into_response();
    }
    if content.len() > super::validate::MAX_FILE_BYTES {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "file_too_large",
            format!(
                "File of {} bytes exceeds the limit of {} bytes.",
                content.len(),
                super::validate::MAX_FILE_BYTES
            ),
        )
        .with_param("file")
        .into_response();
    }
    let record = FileRecord {
        id: new_id("file-"),
        bytes: content.len() as u64,
        created_at: now_ms() / 1000,
        filename: filename.unwrap_or_default(),
        purpose,
        tenant: caller.tenant.clone(),
        list_seq: 0,
    };
    let key = file_key(caller.tenant.as_deref(), &record.id);
    match store.put_file(&key, &record, &content).await {
        Ok(()) => Json(file_json(&record)).into_response(),
        Err(e) => store_error(e).into_response(),
    }
}

/// `?purpose&limit&after&order` of `GET /v1/files`, `?after&limit` of `GET /v1/batches`.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    purpose: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
    order: Option<String>,
}

/// `GET /v1/files` (newest first; `order=asc` oldest first; `purpose` filters).
pub async fn list_files(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> Response {
    let result = async {
        let store = super::store_of(&app)?;
        let tenant = caller.tenant.clone();
        let cursor = Cursor::of(&store, q.after.as_deref(), |id| {
            file_key(tenant.as_deref(), id)
        })
        .await?;
        let (files, has_more) = cursor
            .page::<FileRecord>(
                &store,
                &file_list(tenant.as_deref()),
                q.order.as_deref() == Some("asc"),
                q.limit.unwrap_or(20).clamp(1, 10_000),
                |f| f.list_seq,
                |f| q.purpose.as_deref().is_none_or(|p| p == f.purpose),
            )
            .await?;
        Ok::<_, ApiError>(openai_list(files.iter().map(file_json).collect(), has_more))
    }
    .await;
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The caller's file `id` and the store it is in: 503 without a store, 404 when the id is
/// malformed or not the caller's, the store's error when it cannot be read.
async fn owned_file(
    app: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<(FileRecord, Arc<BatchStore>), ApiError> {
    let store = super::store_of(app)?;
    if !valid_id(id) {
        return Err(not_found("file", id));
    }
    let file = store
        .file(&file_key(caller.tenant.as_deref(), id))
        .await
        .map_err(store_error)?
        .ok_or_else(|| not_found("file", id))?;
    Ok((file, store))
}

/// `GET /v1/files/{id}`.
pub async fn get_file(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Response {
    match owned_file(&app, &caller, &id).await {
        Ok((f, _)) => Json(file_json(&f)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/files/{id}/content`: the raw bytes.
pub async fn file_content(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Response {
    let (f, store) = match owned_file(&app, &caller, &id).await {
        Ok(found) => found,
        Err(e) => return e.into_response(),
    };
    match store.file_content(&f.id).await {
        Ok(bytes) => {
            let mut resp = bytes.into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            resp
        }
        Err(e) => store_error(e).into_response(),
    }
}

/// `DELETE /v1/files/{id}`.
pub async fn delete_file(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Response {
    let (f, store) = match owned_file(&app, &caller, &id).await {
        Ok(found) => found,
        Err(e) => return e.into_response(),
    };
    let key = file_key(f.tenant.as_deref(), &f.id);
    match store.delete_file(&key, &f.id).await {
        Ok(()) => Json(json!({"id": f.id, "object": "file", "deleted": true})).into_response(),
        Err(e) => store_error(e).into_response(),
    }
}

/// `POST /v1/batches` body (OpenAI API reference, "Create batch").
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBatch {
    input_file_id: String,
    endpoint: String,
    completion_window: String,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default, rename = "output_expires_after")]
    _output_expires_after: Option<Value>,
}

/// `POST /v1/batches`: validates every line of the input file first; an invalid file gives a
/// batch in status `failed` with `errors.data` naming each bad line, and costs no upstream call.
pub async fn create(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    body: axum::body::Bytes,
) -> Response {
    let de = &mut serde_json::Deserializer::from_slice(&body);
    let req: CreateBatch = match serde_path_to_error::deserialize(de) {
        Ok(r) => r,
        Err(e) => {
            let path = e.path().to_string();
            return ApiError::invalid(
                format!("Invalid request body at `{path}`: {}", e.into_inner()),
                Some(path),
            )
            .into_response();
        }
    };
    if !super::validate::ENDPOINTS.contains(&req.endpoint.as_str()) {
        return ApiError::invalid(
            format!(
                "Invalid value for 'endpoint': `{}`. Supported: /v1/chat/completions, /v1/embeddings, /v1/responses.",
                req.endpoint
            ),
            Some("endpoint".into()),
        )
        .into_response();
    }
    let window = match parse_window(&req.completion_window) {
        Ok(w) => w,
        Err(e) => return e.into_response(),
    };
    let (file, store) = match owned_file(&app, &caller, &req.input_file_id).await {
        Ok(found) => found,
        Err(e) => return e.into_response(),
    };
    let content = match store.file_content(&file.id).await {
        Ok(c) => c,
        Err(e) => return store_error(e).into_response(),
    };
    let checked = super::validate::openai_file(&app, &req.endpoint, &content);
    let record = BatchRecord::new(
        Api::OpenAi,
        "batch_",
        req.endpoint,
        (caller.tenant, caller.key_id),
        Some(file.id),
        req.completion_window,
        window,
        req.metadata,
    );
    match submit(&app, &store, record, checked).await {
        Ok(rec) => Json(batch_json(&rec, &rec.counts)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn owned_batch(
    app: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<(BatchRecord, u64, String), ApiError> {
    super::owned(app, caller, Api::OpenAi, "batch", id).await
}

/// `GET /v1/batches/{id}`.
pub async fn retrieve(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Response {
    match owned_batch(&app, &caller, &id).await {
        Ok((b, _, _)) => match super::live_counts(&app, &b).await {
            Ok(c) => Json(batch_json(&b, &c)).into_response(),
            Err(e) => e.into_response(),
        },
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/batches?after&limit` (newest first).
pub async fn list(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> Response {
    let result = async {
        let store = super::store_of(&app)?;
        let tenant = caller.tenant.clone();
        let (batches, has_more) = super::batch_page(
            &store,
            tenant.as_deref(),
            Api::OpenAi,
            q.after.as_deref(),
            false,
            q.limit.unwrap_or(20).clamp(1, 100),
        )
        .await?;
        let data = super::with_live_counts(&app, &batches, batch_json).await;
        Ok::<_, ApiError>(openai_list(data, has_more))
    }
    .await;
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/batches/{id}/cancel`: status `cancelling`; in-flight items finish, the rest are
/// not run; the batch then ends `cancelled` with partial results.
pub async fn cancel(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Response {
    let result = async {
        let (b, rev, key) = owned_batch(&app, &caller, &id).await?;
        let b = super::cancel(&app, &key, b, rev).await?;
        let c = super::live_counts(&app, &b).await?;
        Ok::<_, ApiError>(batch_json(&b, &c))
    }
    .await;
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The output file (one line per succeeded item) and the error file (one line per errored,
/// expired or cancelled item) of a finished batch (OpenAI API reference, "The request output
/// object": `{"id","custom_id","response":{"status_code","request_id","body"},"error"}`).
pub fn result_files(
    b: &BatchRecord,
    results: &[ItemResult],
) -> Vec<(FileSlot, FileRecord, Vec<u8>)> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for r in results {
        let id = format!(
            "batch_req_{}",
            r.request_id.map_or_else(
                || format!("{}_{}", b.id, r.index),
                |u| u.simple().to_string()
            )
        );
        let line = match r.outcome {
            Outcome::Succeeded | Outcome::Errored => json!({
                "id": id, "custom_id": r.custom_id,
                "response": {
                    "status_code": r.status_code,
                    "request_id": r.request_id.map(|u| u.to_string()),
                    "body": r.body,
                },
                "error": null,
            }),
            Outcome::Expired => json!({
                "id": id, "custom_id": r.custom_id, "response": null,
                "error": {"code": "batch_expired", "message": "This request could not be executed before the completion window expired."},
            }),
            Outcome::Canceled => json!({
                "id": id, "custom_id": r.custom_id, "response": null,
                "error": {"code": "batch_cancelled", "message": "This request was not executed because the batch was cancelled."},
            }),
        };
        let target = if r.outcome == Outcome::Succeeded {
            &mut out
        } else {
            &mut err
        };
        target.extend_from_slice(line.to_string().as_bytes());
        target.push(b'\n');
    }
    let hex = b.id.trim_start_matches("batch_");
    let file = |suffix: &str, content: &Vec<u8>| FileRecord {
        id: format!("file-{hex}{suffix}"),
        bytes: content.len() as u64,
        created_at: now_ms() / 1000,
        filename: format!(
            "{}_{}.jsonl",
            b.id,
            if suffix == "o" { "output" } else { "error" }
        ),
        purpose: "batch_output".into(),
        tenant: b.tenant.clone(),
        list_seq: 0,
    };
    let mut files = Vec::new();
    if !out.is_empty() {
        files.push((FileSlot::Output, file("o", &out), out));
    }
    if !err.is_empty() {
        files.push((FileSlot::Error, file("e", &err), err));
    }
    files
}
