//! What the batch machinery stores: file and batch records (JSON in the `SY_BATCHES` KV bucket),
//! queue items (`SY_BATCH_WQ`) and item results (`SY_BATCH_RESULTS`). One neutral shape for both
//! APIs; `openai.rs` and `anthropic.rs` render it in their wire format.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use switchyard_schemas::Usage;
use uuid::Uuid;

/// An uploaded file (OpenAI Files API object, without the content).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// `file-<32 hex>`.
    pub id: String,
    /// Size, bytes.
    pub bytes: u64,
    /// Upload time, seconds since the Unix epoch.
    pub created_at: u64,
    /// The uploaded file name.
    pub filename: String,
    /// `batch` for inputs, `batch_output` for the files a batch writes.
    pub purpose: String,
    /// Owning tenant (`None` while authentication is off).
    pub tenant: Option<String>,
    /// Position in the tenant's file listing (1, 2, …; set by the store when it is written).
    #[serde(default)]
    pub list_seq: u64,
}

/// Which API created a batch, and so how it is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// OpenAI Batch API (`/v1/batches`).
    OpenAi,
    /// Anthropic Message Batches (`/v1/messages/batches`).
    Anthropic,
}

/// The OpenAI batch status lifecycle (OpenAI API reference, "The batch object"): validating →
/// in_progress → finalizing → completed, or failed / expired / cancelling → cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Lines are being checked.
    Validating,
    /// The input file failed validation (see `errors`).
    Failed,
    /// Items are running.
    InProgress,
    /// Every item ended; the result files are being written.
    Finalizing,
    /// Done; results in `output_file_id` / `error_file_id`.
    Completed,
    /// The completion window passed; what ran is in the files, the rest reported as expired.
    Expired,
    /// Cancel asked; in-flight items finish, the rest are not dispatched.
    Cancelling,
    /// Cancelled; partial results in the files.
    Cancelled,
}

impl Status {
    /// No further change.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Failed | Self::Completed | Self::Expired | Self::Cancelled
        )
    }
}

/// One validation failure of an input line (OpenAI batch `errors.data[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineError {
    /// Machine code, e.g. `duplicate_custom_id`.
    pub code: String,
    /// What is wrong.
    pub message: String,
    /// The offending field, when one.
    pub param: Option<String>,
    /// 1-based line number (Anthropic: 1-based index in `requests`).
    pub line: Option<u64>,
}

/// Token totals of a batch (OpenAI batch `usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchUsage {
    /// Input tokens.
    pub input_tokens: u64,
    /// Of which read from the provider's prompt cache.
    pub cached_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Of which reasoning.
    pub reasoning_tokens: u64,
}

impl BatchUsage {
    /// Adds one item's usage.
    pub fn add(&mut self, u: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(u.prompt_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(u.cached_tokens);
        self.output_tokens = self.output_tokens.saturating_add(u.completion_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(u.reasoning_tokens);
    }
}

/// Item counts by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Items in the batch.
    pub total: u64,
    /// Answered with 200.
    pub succeeded: u64,
    /// Answered with an error.
    pub errored: u64,
    /// Not run: the batch was cancelled first.
    pub canceled: u64,
    /// Not run: the completion window passed first.
    pub expired: u64,
}

impl Counts {
    /// Items still to end.
    pub fn processing(&self) -> u64 {
        self.total
            .saturating_sub(self.succeeded + self.errored + self.canceled + self.expired)
    }
}

/// A batch job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchRecord {
    /// `batch_<32 hex>` (OpenAI) or `msgbatch_<32 hex>` (Anthropic).
    pub id: String,
    /// The API that created it.
    pub api: Api,
    /// `/v1/chat/completions`, `/v1/embeddings` or `/v1/messages`.
    pub endpoint: String,
    /// Owning tenant and key (the items are charged to them).
    pub tenant: Option<String>,
    /// Calling key id.
    pub key_id: Option<String>,
    /// The input file (OpenAI).
    pub input_file_id: Option<String>,
    /// E.g. `24h`.
    pub completion_window: String,
    /// Client metadata, echoed.
    pub metadata: Option<Value>,
    /// Lifecycle status.
    pub status: Status,
    /// Creation, ms since the Unix epoch (item request ids derive from it).
    pub created_ms: u64,
    /// Timestamps, seconds since the Unix epoch.
    pub in_progress_at: Option<u64>,
    /// When the completion window ends.
    pub expires_at: u64,
    /// Entered `finalizing`.
    pub finalizing_at: Option<u64>,
    /// Entered `completed`.
    pub completed_at: Option<u64>,
    /// Entered `failed`.
    pub failed_at: Option<u64>,
    /// Entered `expired`.
    pub expired_at: Option<u64>,
    /// Cancel asked.
    pub cancelling_at: Option<u64>,
    /// Entered `cancelled`.
    pub cancelled_at: Option<u64>,
    /// The window passed: remaining items are reported as expired, then the batch ends.
    #[serde(default)]
    pub expiring: bool,
    /// Item counts (final once terminal; live progress is read from the results stream).
    pub counts: Counts,
    /// Output file (successful items).
    pub output_file_id: Option<String>,
    /// Error file (failed, expired, cancelled items).
    pub error_file_id: Option<String>,
    /// Validation errors (status `failed`).
    #[serde(default)]
    pub errors: Vec<LineError>,
    /// Token totals of the items that ran.
    #[serde(default)]
    pub usage: BatchUsage,
    /// Position in the tenant's batch listing of its API (1, 2, …; set by the store when it is
    /// created).
    #[serde(default)]
    pub list_seq: u64,
}

impl BatchRecord {
    /// A new batch (status `validating`) created now by `tenant`/`key_id`, ending its window
    /// `window_s` seconds from now; `prefix` is `batch_` (OpenAI) or `msgbatch_` (Anthropic).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        api: Api,
        prefix: &str,
        endpoint: String,
        caller: (Option<String>, Option<String>),
        input_file_id: Option<String>,
        completion_window: String,
        window_s: u64,
        metadata: Option<Value>,
    ) -> Self {
        let now = switchyard_schemas::now_ms();
        Self {
            id: format!("{prefix}{}", Uuid::now_v7().simple()),
            api,
            endpoint,
            tenant: caller.0,
            key_id: caller.1,
            input_file_id,
            completion_window,
            metadata,
            status: Status::Validating,
            created_ms: now,
            in_progress_at: None,
            expires_at: now / 1000 + window_s,
            finalizing_at: None,
            completed_at: None,
            failed_at: None,
            expired_at: None,
            cancelling_at: None,
            cancelled_at: None,
            expiring: false,
            counts: Counts::default(),
            output_file_id: None,
            error_file_id: None,
            errors: Vec::new(),
            usage: BatchUsage::default(),
            list_seq: 0,
        }
    }

    /// Seconds since the Unix epoch of creation.
    pub fn created_at(&self) -> u64 {
        self.created_ms / 1000
    }
}

/// One request of a batch on the work queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Item {
    /// The batch.
    pub batch_id: String,
    /// KV key of the batch record.
    pub batch_key: String,
    /// 0-based position in the input.
    pub index: u64,
    /// The client's `custom_id`.
    pub custom_id: String,
    /// The request body as the live endpoint takes it.
    pub body: Value,
    /// 0 for the first run; a retry after a retryable error is a new queue message with `try_no + 1`.
    #[serde(default)]
    pub try_no: u32,
    /// Retryable failures so far other than rate limits (429 waits as long as the window
    /// allows; these count toward `runner::MAX_TRIES`).
    #[serde(default)]
    pub failures: u32,
    /// Not before this time, ms since the Unix epoch (retry backoff).
    #[serde(default)]
    pub not_before_ms: u64,
}

/// Wire attempt numbers reserved per run of an item (one execution of one try, from one
/// delivery): run `r` ([`super::store::BatchStore::claim_run`]) numbers its attempts (one per
/// target it tries, plus a worker retry) from `r × ATTEMPTS_PER_RUN`, so every upstream call of
/// every run keeps its own `upstream` ledger key (request id, kind, attempt) under the item's
/// one request id. The ledger keeps the first row of a key: two calls sharing one would leave
/// one of them without its usage record.
pub const ATTEMPTS_PER_RUN: u32 = 100;

impl Item {
    /// The item's request id: a UUIDv7 at the batch's creation time whose random bits are a hash
    /// of (batch id, `custom_id`) — the same for every try and every redelivery, so the item has
    /// one `charge` ledger key (request id, `charge`, 0) and so at most one charge row.
    pub fn request_id(&self, batch_created_ms: u64) -> Uuid {
        let mut h = Sha256::new();
        h.update(self.batch_id.as_bytes());
        h.update([0]);
        h.update(self.custom_id.as_bytes());
        let digest = h.finalize();
        let mut random = [0u8; 10];
        random.copy_from_slice(&digest[..10]);
        uuid::Builder::from_unix_timestamp_millis(batch_created_ms, &random).into_uuid()
    }
}

/// How an item ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// HTTP 200 from the live endpoint.
    Succeeded,
    /// An error response (after retries for retryable ones).
    Errored,
    /// Not run: cancelled.
    Canceled,
    /// Not run: the completion window passed.
    Expired,
}

impl Outcome {
    /// Subject token in the results stream.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Errored => "errored",
            Self::Canceled => "canceled",
            Self::Expired => "expired",
        }
    }
}

/// The end of one item.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ItemResult {
    /// 0-based position in the input.
    pub index: u64,
    /// The client's `custom_id`.
    pub custom_id: String,
    /// The request id of the run that produced it (`x-request-id` of a live request).
    pub request_id: Option<Uuid>,
    /// How it ended.
    pub outcome: Outcome,
    /// HTTP status of the live endpoint's answer (0 when not run).
    pub status_code: u16,
    /// The live endpoint's response body (an error body for failures; `null` when not run).
    pub body: Value,
    /// Token counts read from the body.
    #[serde(default)]
    pub usage: Usage,
}

/// A KV-key-safe token for a tenant: records are keyed under their tenant, so a lookup with
/// another tenant's id finds nothing (404, never 403).
pub fn tenant_token(tenant: Option<&str>) -> String {
    match tenant {
        None => "_".into(),
        Some(t) => {
            let d = Sha256::digest(t.as_bytes());
            hex::encode(&d[..8])
        }
    }
}

/// The listing index of `tenant`'s files ([`super::store::BatchStore::page`]).
pub fn file_list(tenant: Option<&str>) -> String {
    format!("{}.f", tenant_token(tenant))
}

/// The listing index of `tenant`'s batches of `api` (each API lists only its own).
pub fn batch_list(tenant: Option<&str>, api: Api) -> String {
    let kind = match api {
        Api::OpenAi => "batch",
        Api::Anthropic => "msgbatch",
    };
    format!("{}.{kind}", tenant_token(tenant))
}

/// KV key of a batch record.
pub fn batch_key(tenant: Option<&str>, id: &str) -> String {
    format!("b.{}.{id}", tenant_token(tenant))
}

/// KV key of a file record.
pub fn file_key(tenant: Option<&str>, id: &str) -> String {
    format!("f.{}.{id}", tenant_token(tenant))
}

/// True when `id` is safe as a KV key token and NATS subject token (`[A-Za-z0-9_-]`).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 80
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Token counts in a live endpoint's response body: OpenAI Responses (`input_tokens` with
/// `input_tokens_details.cached_tokens`, `output_tokens` with
/// `output_tokens_details.reasoning_tokens`), OpenAI chat (`prompt_tokens`,
/// `completion_tokens`, `prompt_tokens_details.cached_tokens`,
/// `completion_tokens_details.reasoning_tokens`), OpenAI embeddings (`prompt_tokens`), Anthropic
/// (`input_tokens` + `cache_read_input_tokens` + `cache_creation_input_tokens`, `output_tokens`).
pub fn usage_of(body: &Value) -> Usage {
    let u = &body["usage"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    if u.get("input_tokens_details").is_some() || u.get("output_tokens_details").is_some() {
        // OpenAI Responses: `input_tokens` includes the cached ones.
        return Usage {
            prompt_tokens: n(&u["input_tokens"]),
            cached_tokens: n(&u["input_tokens_details"]["cached_tokens"]),
            cache_write_tokens: 0,
            completion_tokens: n(&u["output_tokens"]),
            reasoning_tokens: n(&u["output_tokens_details"]["reasoning_tokens"]),
            ..Default::default()
        };
    }
    if u.get("input_tokens").is_some() {
        let cached = n(&u["cache_read_input_tokens"]);
        let written = n(&u["cache_creation_input_tokens"]);
        return Usage {
            prompt_tokens: n(&u["input_tokens"]) + cached + written,
            cached_tokens: cached,
            cache_write_tokens: written,
            completion_tokens: n(&u["output_tokens"]),
            reasoning_tokens: 0,
            ..Default::default()
        };
    }
    Usage {
        prompt_tokens: n(&u["prompt_tokens"]),
        cached_tokens: n(&u["prompt_tokens_details"]["cached_tokens"]),
        cache_write_tokens: 0,
        completion_tokens: n(&u["completion_tokens"]),
        reasoning_tokens: n(&u["completion_tokens_details"]["reasoning_tokens"]),
        ..Default::default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_stable_across_tries() {
        let item = |try_no| Item {
            batch_id: "batch_1".into(),
            batch_key: "b._.batch_1".into(),
            index: 0,
            custom_id: "a".into(),
            body: serde_json::json!({}),
            try_no,
            failures: 0,
            not_before_ms: 0,
        };
        let t = 1_764_000_000_000;
        assert_eq!(item(0).request_id(t), item(0).request_id(t));
        assert_eq!(item(0).request_id(t), item(1).request_id(t));
        assert_eq!(item(0).request_id(t).get_version_num(), 7);
    }

    #[test]
    fn usage_from_both_shapes() {
        let openai = serde_json::json!({"usage": {"prompt_tokens": 13, "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 2}}});
        let u = usage_of(&openai);
        assert_eq!(
            (u.prompt_tokens, u.cached_tokens, u.completion_tokens),
            (13, 2, 4)
        );
        let anthropic = serde_json::json!({"usage": {"input_tokens": 10, "output_tokens": 3,
            "cache_read_input_tokens": 5}});
        let u = usage_of(&anthropic);
        assert_eq!(
            (u.prompt_tokens, u.cached_tokens, u.completion_tokens),
            (15, 5, 3)
        );
    }
}
