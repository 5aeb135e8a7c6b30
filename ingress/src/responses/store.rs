//! Stored responses: JetStream KV bucket [`RESPONSES_BUCKET`], one entry per response id, shared
//! by every ingress replica and kept across restarts (file storage), expiring after
//! `responses.ttl_s` (the bucket's `max_age`, set at ingress start).
//!
//! An entry is [`StoredResponse`] as JSON: the owning tenant (reads by another tenant answer 404),
//! the final `response` object, this request's input items (for `GET …/input_items`) and the
//! whole conversation as normalised messages (instructions excluded, output included), so a
//! `previous_response_id` follow-up reads one entry and may go to any provider — unless the
//! conversation holds encrypted reasoning, when the entry names the one target that can read it
//! (`pinned_target`). An entry is
//! bounded by the NATS server's `max_payload`; a larger one is not stored (logged), and a
//! follow-up naming it gets `previous_response_not_found`.

use async_nats::jetstream::{self, kv};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;
use switchyard_schemas::request::Message;

/// The KV bucket of stored responses.
pub const RESPONSES_BUCKET: &str = "SY_RESPONSES";

/// One stored response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredResponse {
    /// Tenant of the key that created it (`None` without authentication).
    #[serde(default)]
    pub tenant: Option<String>,
    /// The final `response` object, as returned.
    pub response: Value,
    /// This request's input items (`input_items` list shape, each with an `id`).
    pub input_items: Vec<Value>,
    /// The conversation so far: predecessors' turns, this input, this output.
    pub history: Vec<Message>,
    /// The target a `previous_response_id` follow-up must go to: set when `history` holds
    /// encrypted reasoning (readable by one upstream deployment only), to the target that
    /// accepted it. Absent in older entries and in conversations any target can continue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_target: Option<String>,
}

/// Why a store operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No JetStream (the bucket could not be opened at start).
    #[error("the response store is unavailable (no JetStream KV)")]
    Unavailable,
    /// A KV round trip failed.
    #[error("response store: {0}")]
    Kv(String),
}

/// The bucket handle (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct ResponseStore {
    kv: Option<kv::Store>,
}

/// Longest wait for one KV round trip.
const KV_TIMEOUT: Duration = Duration::from_secs(5);

impl ResponseStore {
    /// Opens, or creates in file storage with `max_age` = `ttl_s`, [`RESPONSES_BUCKET`]. Without
    /// JetStream the store is absent: `store: true` requests are still answered (not stored,
    /// logged) and reads answer 404.
    pub async fn connect(js: &jetstream::Context, ttl_s: u64) -> Self {
        let kv = match js.get_key_value(RESPONSES_BUCKET).await {
            Ok(kv) => {
                apply_ttl(js, ttl_s).await;
                Some(kv)
            }
            Err(_) => {
                let created = js
                    .create_key_value(switchyard_schemas::replicas::kv(kv::Config {
                        bucket: RESPONSES_BUCKET.to_owned(),
                        description:
                            "Switchyard stored responses (POST /v1/responses, store: true)"
                                .to_owned(),
                        history: 1,
                        max_age: Duration::from_secs(ttl_s.max(1)),
                        storage: jetstream::stream::StorageType::File,
                        ..Default::default()
                    }))
                    .await;
                match created {
                    Ok(kv) => Some(kv),
                    // Another replica may have created it in between.
                    Err(e) => js.get_key_value(RESPONSES_BUCKET).await.ok().or_else(|| {
                        tracing::warn!(error = %e, "no JetStream KV for stored responses: store and previous_response_id are unavailable");
                        None
                    }),
                }
            }
        };
        Self { kv }
    }

    /// Whether the bucket could be opened.
    pub fn is_available(&self) -> bool {
        self.kv.is_some()
    }

    fn kv(&self) -> Result<&kv::Store, StoreError> {
        self.kv.as_ref().ok_or(StoreError::Unavailable)
    }

    /// Writes `entry` under `id` (acknowledged by the server before this returns).
    pub async fn put(&self, id: &str, entry: &StoredResponse) -> Result<(), StoreError> {
        let kv = self.kv()?;
        let bytes = serde_json::to_vec(entry).map_err(|e| StoreError::Kv(e.to_string()))?;
        match tokio::time::timeout(KV_TIMEOUT, kv.put(id, bytes.into())).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(StoreError::Kv(e.to_string())),
            Err(_) => Err(StoreError::Kv("timed out".into())),
        }
    }

    /// The entry `id` if it exists and belongs to `tenant`; another tenant's entry is `None`.
    pub async fn get(
        &self,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<Option<StoredResponse>, StoreError> {
        if !valid_id(id) {
            return Ok(None);
        }
        let kv = self.kv()?;
        let got = match tokio::time::timeout(KV_TIMEOUT, kv.get(id)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return Err(StoreError::Kv(e.to_string())),
            Err(_) => return Err(StoreError::Kv("timed out".into())),
        };
        let Some(bytes) = got else { return Ok(None) };
        let entry: StoredResponse = match serde_json::from_slice(&bytes) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(id, error = %e, "unreadable stored response ignored");
                return Ok(None);
            }
        };
        Ok((entry.tenant.as_deref() == tenant).then_some(entry))
    }

    /// Deletes `id` when it belongs to `tenant`; `false` when there was nothing to delete.
    pub async fn delete(&self, id: &str, tenant: Option<&str>) -> Result<bool, StoreError> {
        if self.get(id, tenant).await?.is_none() {
            return Ok(false);
        }
        let kv = self.kv()?;
        match tokio::time::timeout(KV_TIMEOUT, kv.purge(id)).await {
            Ok(Ok(())) => Ok(true),
            Ok(Err(e)) => Err(StoreError::Kv(e.to_string())),
            Err(_) => Err(StoreError::Kv("timed out".into())),
        }
    }
}

/// Sets an existing bucket's `max_age` to `ttl_s` when the config changed it (the bucket keeps
/// the age limit it was created with otherwise). A failure is logged: the old TTL stays.
async fn apply_ttl(js: &jetstream::Context, ttl_s: u64) {
    let want = Duration::from_secs(ttl_s.max(1));
    let stream = format!("KV_{RESPONSES_BUCKET}");
    let Ok(s) = js.get_stream(&stream).await else {
        return;
    };
    let mut config = s.cached_info().config.clone();
    if config.max_age == want {
        return;
    }
    config.max_age = want;
    match js.update_stream(&config).await {
        Ok(_) => tracing::info!(ttl_s, "stored responses: bucket TTL updated"),
        Err(e) => tracing::warn!(error = %e, ttl_s, "stored responses: bucket TTL not updated"),
    }
}

/// Response ids are `resp_` + hex; anything else cannot be a KV key of ours.
fn valid_id(id: &str) -> bool {
    id.strip_prefix("resp_").is_some_and(|h| {
        !h.is_empty() && h.len() <= 64 && h.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}
