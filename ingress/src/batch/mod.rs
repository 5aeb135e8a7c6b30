//! Batch jobs: the OpenAI Files + Batch APIs ([`openai`]) and Anthropic Message Batches
//! ([`anthropic`]) on one machinery.
//!
//! Submit → [`validate`] every line (one rule for both APIs; an invalid input fails at once and
//! costs no upstream call) → the items go on a JetStream work queue ([`store`]) → every ingress's
//! [`runner`] executes them through the live pipeline at lower priority, exactly once per
//! `custom_id`, billed at the batch rate to the key that created the batch → the sweeper ends
//! the batch (completed, expired or cancelled) and writes its result files. State lives in
//! JetStream only, so any ingress answers any poll and restarts lose nothing.

pub mod anthropic;
pub mod openai;
pub mod records;
pub mod runner;
pub mod store;
pub mod validate;

use crate::AppState;
use crate::context::Caller;
use crate::error::ApiError;
use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use records::{BatchRecord, Counts, Item, LineError, Outcome, Status};
use std::sync::Arc;
use store::{BatchStore, StoreError};
use switchyard_schemas::now_ms;
use uuid::Uuid;

/// Which file of a finished batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileSlot {
    /// Succeeded items (OpenAI `output_file_id`; Anthropic's one results file).
    Output,
    /// Everything else (OpenAI `error_file_id`).
    Error,
}

/// The batch routes (merged into the ingress router; authentication applies as for `/v1/*`).
/// Input files may be up to [`validate::MAX_FILE_BYTES`].
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/v1/files",
            post(openai::upload).get(openai::list_files).layer(
                axum::extract::DefaultBodyLimit::max(validate::MAX_FILE_BYTES + 64 * 1024),
            ),
        )
        .route(
            "/v1/files/{id}",
            get(openai::get_file).delete(openai::delete_file),
        )
        .route("/v1/files/{id}/content", get(openai::file_content))
        .route("/v1/batches", post(openai::create).get(openai::list))
        .route("/v1/batches/{id}", get(openai::retrieve))
        .route("/v1/batches/{id}/cancel", post(openai::cancel))
        .route(
            "/v1/messages/batches",
            post(anthropic::create).get(anthropic::list),
        )
        .route(
            "/v1/messages/batches/{id}",
            get(anthropic::retrieve).delete(anthropic::delete),
        )
        .route("/v1/messages/batches/{id}/cancel", post(anthropic::cancel))
        .route("/v1/messages/batches/{id}/results", get(anthropic::results))
}

/// A new id: `prefix` + a UUIDv7 in hex (so ids sort by creation time).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", Uuid::now_v7().simple())
}

/// The batch store, or 503 when this ingress has no JetStream.
pub fn store_of(app: &AppState) -> Result<Arc<BatchStore>, ApiError> {
    app.batches.clone().ok_or_else(|| ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: "Batch jobs need JetStream, which this gateway could not open.".into(),
        kind: "api_error",
        param: None,
        code: Some("batch_store_unavailable"),
        retry_after_s: Some(5),
        request_id: None,
    })
}

/// A store failure as the client sees it: 503, retryable.
pub fn store_error(e: StoreError) -> ApiError {
    tracing::error!(error = %e, "batch store");
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: "The batch store is unavailable; retry shortly.".into(),
        kind: "api_error",
        param: None,
        code: Some("batch_store_unavailable"),
        retry_after_s: Some(1),
        request_id: None,
    }
}

/// 404 for a file or batch the caller cannot see (another tenant's included).
pub fn not_found(what: &str, id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        None,
        format!("No such {what}: '{id}'"),
    )
    .with_param("id")
}

/// The caller's batch `id` of front door `api` with its KV revision and key; 404 naming `what`
/// (`batch`, `message batch`) for a malformed id, another tenant's batch or the other API's.
pub async fn owned(
    app: &AppState,
    caller: &Caller,
    api: records::Api,
    what: &str,
    id: &str,
) -> Result<(BatchRecord, u64, String), ApiError> {
    let store = store_of(app)?;
    if !records::valid_id(id) {
        return Err(not_found(what, id));
    }
    let key = records::batch_key(caller.tenant.as_deref(), id);
    match store.batch(&key).await.map_err(store_error)? {
        Some((b, rev)) if b.api == api => Ok((b, rev, key)),
        _ => Err(not_found(what, id)),
    }
}

/// `completion_window` in seconds: OpenAI's `24h`; any `<n>s|m|h` from 1 s to 168 h is accepted
/// too (short windows are how tests and operators bound a batch).
pub fn parse_window(w: &str) -> Result<u64, ApiError> {
    let bad = || {
        ApiError::invalid(
            format!(
                "Invalid 'completion_window': '{w}'. Use '24h' (or <n>s, <n>m, <n>h up to 168h)."
            ),
            Some("completion_window".into()),
        )
    };
    // By characters, not bytes: any input must get the 400, never a panic (fuzzed by
    // schemathesis with non-ASCII windows).
    let unit = w.chars().last().ok_or_else(bad)?;
    let n: u64 = w[..w.len() - unit.len_utf8()].parse().map_err(|_| bad())?;
    let per = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        _ => return Err(bad()),
    };
    let secs = n.checked_mul(per).ok_or_else(bad)?;
    if secs == 0 || secs > 168 * 3600 {
        return Err(bad());
    }
    Ok(secs)
}

/// Stores a new batch: `failed` with `errors` when validation found any, else queued and
/// `in_progress`.
pub async fn submit(
    app: &AppState,
    store: &BatchStore,
    mut record: BatchRecord,
    checked: Result<Vec<validate::Checked>, Vec<LineError>>,
) -> Result<BatchRecord, ApiError> {
    let key = records::batch_key(record.tenant.as_deref(), &record.id);
    let items = match checked {
        Err(errors) => {
            record.status = Status::Failed;
            record.failed_at = Some(now_ms() / 1000);
            record.errors = errors;
            store
                .create_batch(&key, &record)
                .await
                .map_err(store_error)?;
            app.metrics.batch_submitted("failed");
            return Ok(record);
        }
        Ok(items) => items,
    };
    record.counts.total = items.len() as u64;
    let rev = store
        .create_batch(&key, &record)
        .await
        .map_err(store_error)?;
    store
        .mark_active(&record.id, &key)
        .await
        .map_err(store_error)?;
    let items: Vec<Item> = items
        .into_iter()
        .enumerate()
        .map(|(index, c)| Item {
            batch_id: record.id.clone(),
            batch_key: key.clone(),
            index: index as u64,
            custom_id: c.custom_id,
            body: c.body,
            try_no: 0,
            failures: 0,
            not_before_ms: 0,
        })
        .collect();
    store.enqueue_all(&items).await.map_err(store_error)?;
    // Runners may already be working on it: change only the status, by compare-and-set.
    let mut rev = rev;
    loop {
        let (mut current, r) = match store.batch(&key).await.map_err(store_error)? {
            Some(b) => b,
            None => return Err(not_found("batch", &record.id)),
        };
        if current.status != Status::Validating {
            return Ok(current);
        }
        current.status = Status::InProgress;
        current.in_progress_at = Some(now_ms() / 1000);
        rev = r.max(rev);
        if store
            .update_batch(&key, &current, rev)
            .await
            .map_err(store_error)?
            .is_some()
        {
            app.metrics.batch_submitted("in_progress");
            return Ok(current);
        }
    }
}

/// The counts to show now: final ones once terminal, else read from the results stream.
pub async fn live_counts(app: &AppState, b: &BatchRecord) -> Result<Counts, ApiError> {
    if b.status.is_terminal() || b.status == Status::Finalizing {
        return Ok(b.counts);
    }
    let store = store_of(app)?;
    let p = store.progress(&b.id).await.map_err(store_error)?;
    let n = |o| p.get(&o).copied().unwrap_or(0);
    Ok(Counts {
        total: b.counts.total,
        succeeded: n(Outcome::Succeeded),
        errored: n(Outcome::Errored),
        canceled: n(Outcome::Canceled),
        expired: n(Outcome::Expired),
    })
}

/// Asks a batch to stop: `cancelling` (the sweeper ends it `cancelled` once its in-flight items
/// finished). Cancelling an ended batch is a 409, an already cancelling one a no-op.
pub async fn cancel(
    app: &AppState,
    key: &str,
    mut b: BatchRecord,
    mut rev: u64,
) -> Result<BatchRecord, ApiError> {
    let store = store_of(app)?;
    loop {
        match b.status {
            Status::Cancelling | Status::Cancelled => return Ok(b),
            s if s.is_terminal() || s == Status::Finalizing => {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "invalid_request_error",
                    None,
                    format!("Cannot cancel a batch with status '{}'.", status_name(s)),
                ));
            }
            _ => {}
        }
        b.status = Status::Cancelling;
        b.cancelling_at = Some(now_ms() / 1000);
        if store
            .update_batch(key, &b, rev)
            .await
            .map_err(store_error)?
            .is_some()
        {
            return Ok(b);
        }
        match store.batch(key).await.map_err(store_error)? {
            Some((fresh, r)) => (b, rev) = (fresh, r),
            None => return Err(not_found("batch", &b.id)),
        }
    }
}

fn status_name(s: Status) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{s:?}"))
}

/// Where a page starts, from the client's cursor id (`after`, `after_id`, `before_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cursor {
    /// No cursor: from the newest (or the oldest).
    Start,
    /// After the record at this listing position.
    At(u64),
    /// The id is not one of the caller's records (another tenant's, deleted, malformed): an
    /// empty page.
    Unknown,
}

impl Cursor {
    /// The listing position of the caller's record `id` (KV key `key_of(id)`).
    pub async fn of(
        store: &BatchStore,
        id: Option<&str>,
        key_of: impl Fn(&str) -> String,
    ) -> Result<Self, ApiError> {
        let Some(id) = id else {
            return Ok(Self::Start);
        };
        if !records::valid_id(id) {
            return Ok(Self::Unknown);
        }
        match store.list_seq_of(&key_of(id)).await.map_err(store_error)? {
            Some(n) => Ok(Self::At(n)),
            None => Ok(Self::Unknown),
        }
    }

    /// One page of `list` from this cursor ([`BatchStore::page`]); empty for [`Self::Unknown`].
    pub async fn page<T: serde::de::DeserializeOwned>(
        self,
        store: &BatchStore,
        list: &str,
        ascending: bool,
        limit: usize,
        seq_of: impl Fn(&T) -> u64,
        keep: impl Fn(&T) -> bool,
    ) -> Result<(Vec<T>, bool), ApiError> {
        let after = match self {
            Self::Start => None,
            Self::At(n) => Some(n),
            Self::Unknown => return Ok((Vec::new(), false)),
        };
        store
            .page(list, after, ascending, limit, seq_of, keep)
            .await
            .map_err(store_error)
    }
}

/// One page of the caller's `api` batches (tenant `tenant`) from the cursor id `from`: newest
/// first, or oldest first when `ascending`; at most `limit`, with whether more follow. An id
/// that is not the caller's gives an empty page; a store failure is its [`store_error`].
pub async fn batch_page(
    store: &BatchStore,
    tenant: Option<&str>,
    api: records::Api,
    from: Option<&str>,
    ascending: bool,
    limit: usize,
) -> Result<(Vec<BatchRecord>, bool), ApiError> {
    let cursor = Cursor::of(store, from, |id| records::batch_key(tenant, id)).await?;
    cursor
        .page::<BatchRecord>(
            store,
            &records::batch_list(tenant, api),
            ascending,
            limit,
            |b| b.list_seq,
            |b| b.api == api,
        )
        .await
}

/// `json(batch, counts)` of each of `batches`, with [`live_counts`] (the stored counts when
/// those cannot be read, so one unreadable batch does not fail the listing).
pub async fn with_live_counts(
    app: &AppState,
    batches: &[BatchRecord],
    json: impl Fn(&BatchRecord, &Counts) -> serde_json::Value,
) -> Vec<serde_json::Value> {
    let mut data = Vec::with_capacity(batches.len());
    for b in batches {
        let c = live_counts(app, b).await.unwrap_or(b.counts);
        data.push(json(b, &c));
    }
    data
}

/// The `id` of the first and of the last object of a listing's `data` (`first_id`, `last_id`).
pub fn end_ids(
    data: &[serde_json::Value],
) -> (Option<serde_json::Value>, Option<serde_json::Value>) {
    (
        data.first().map(|d| d["id"].clone()),
        data.last().map(|d| d["id"].clone()),
    )
}

/// The OpenAI list object around `data` (`first_id` / `last_id` from its ends).
pub fn openai_list(data: Vec<serde_json::Value>, has_more: bool) -> serde_json::Value {
    let (first, last) = end_ids(&data);
    serde_json::json!({
        "object": "list", "data": data, "first_id": first, "last_id": last,
        "has_more": has_more,
    })
}

/// Starts the batch runner of this ingress (on [`AppState::tasks`]) when `batch.run` is on and
/// the store opened.
pub fn start_runner(
    app: &Arc<AppState>,
    stop: tokio_util::sync::CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let store = app.batches.clone()?;
    if !app.config.get().batch.run {
        return None;
    }
    Some(app.tasks.spawn(runner::run(app.clone(), store, stop)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn windows() {
        assert_eq!(parse_window("24h").unwrap(), 86_400);
        assert_eq!(parse_window("90s").unwrap(), 90);
        assert!(parse_window("0h").is_err());
        assert!(parse_window("24").is_err());
        assert!(parse_window("200h").is_err());
        // Any input is a 400, never a panic: non-ASCII, empty, overflowing.
        for w in [
            "\u{8f}",
            "\u{8d}\u{b3}",
            "",
            "h",
            "18446744073709551615h",
            "1é",
        ] {
            assert_eq!(parse_window(w).unwrap_err().status, 400, "{w:?}");
        }
    }
}
