//! Reads and writes the live config bucket for the admin API: the same stored form as
//! `switchyard config push` ([`prepare_for_store`]), written compare-and-set on the revision so
//! two admins editing keys at once never lose a change.

use super::{AdminState, unavailable};
use crate::AppState;
use crate::error::ApiError;
use async_nats::jetstream::kv::{CreateErrorKind, Store, UpdateErrorKind};
use serde_yaml_ng::Value;
use std::time::{Duration, Instant};
use switchyard_schemas::config_text::{BUCKET, KEY, Prepared, prepare_for_store};
use switchyard_schemas::sealed::{MASTER_KEY_ENV, MasterKey};

/// Attempts of a read-modify-write before giving up (each loses only to another writer).
const CAS_ATTEMPTS: usize = 8;
/// Longest wait for this replica to apply a change it wrote, before answering.
const APPLY_WAIT: Duration = Duration::from_secs(1);

/// A stored change.
#[derive(Debug)]
pub(super) struct Written {
    /// The new config version (KV revision).
    pub version: u64,
    /// Warnings about literal credentials (see [`prepare_for_store`]).
    pub warnings: Vec<String>,
}

/// Gets or creates the live config bucket ([`BUCKET`], 10 revisions of history), as the admin
/// API and `switchyard config push` open it; the create error when it neither exists nor can
/// be made.
pub async fn config_bucket(
    nats: async_nats::Client,
) -> Result<Store, async_nats::jetstream::context::CreateKeyValueError> {
    let js = async_nats::jetstream::new(nats);
    if let Ok(kv) = js.get_key_value(BUCKET).await {
        return Ok(kv);
    }
    js.create_key_value(switchyard_schemas::replicas::kv(
        async_nats::jetstream::kv::Config {
            bucket: BUCKET.to_owned(),
            history: 10,
            description: "Switchyard live gateway config (YAML)".to_owned(),
            ..Default::default()
        },
    ))
    .await
}

impl AdminState {
    async fn bucket(&self, app: &AppState) -> Result<Store, ApiError> {
        config_bucket(self.writer(app).clone())
            .await
            .map_err(|e| unavailable(format!("The live config bucket cannot be opened: {e}")))
    }

    /// The stored text and its revision, or this process's start-up text as revision 0 when
    /// nothing was pushed yet.
    pub(super) async fn current(&self, app: &AppState) -> Result<(u64, String), ApiError> {
        let kv = self.bucket(app).await?;
        match kv.entry(KEY).await {
            Ok(Some(e)) if e.operation == async_nats::jetstream::kv::Operation::Put => {
                Ok((e.revision, String::from_utf8_lossy(&e.value).into_owned()))
            }
            Ok(_) => match self.startup_text.get() {
                Some(t) => Ok((0, t.clone())),
                None => Err(unavailable(
                    "No live config has been pushed yet (switchyard config push) and this \
                     ingress has no start-up text to base the change on.",
                )),
            },
            Err(e) => Err(unavailable(format!("The live config cannot be read: {e}"))),
        }
    }

    /// Applies `edit` to the stored YAML and writes the result compare-and-set, retrying when
    /// another writer got there first; returns `edit`'s value (of the attempt that was written).
    pub(super) async fn edit<T>(
        &self,
        app: &AppState,
        edit: impl Fn(&mut Value) -> Result<T, ApiError>,
    ) -> Result<(T, Written), ApiError> {
        let kv = self.bucket(app).await?;
        for _ in 0..CAS_ATTEMPTS {
            let (revision, text) = self.current(app).await?;
            let mut value: Value = serde_yaml_ng::from_str(&text)
                .map_err(|e| unavailable(format!("The stored config is not YAML: {e}")))?;
            if value.is_null() {
                value = Value::Mapping(Default::default());
            }
            let out = edit(&mut value)?;
            let text = serde_yaml_ng::to_string(&value)
                .map_err(|e| unavailable(format!("The edited config cannot be written: {e}")))?;
            let prepared = prepare(&text)?;
            let written = if revision == 0 {
                kv.create(KEY, prepared.text.into())
                    .await
                    .map_err(|e| (e.kind() == CreateErrorKind::AlreadyExists, e.to_string()))
            } else {
                kv.update(KEY, prepared.text.into(), revision)
                    .await
                    .map_err(|e| {
                        (
                            e.kind() == UpdateErrorKind::WrongLastRevision,
                            e.to_string(),
                        )
                    })
            };
            match written {
                Ok(version) => {
                    wait_applied(app, version).await;
                    let w = Written {
                        version,
                        warnings: prepared.warnings,
                    };
                    return Ok((out, w));
                }
                Err((true, _)) => continue,
                Err((false, e)) => {
                    return Err(unavailable(format!(
                        "The live config cannot be written: {e}"
                    )));
                }
            }
        }
        Err(unavailable(
            "The live config kept changing under this edit; retry.",
        ))
    }

    /// Stores `text` as the new live config (what `config push` does).
    pub(super) async fn put(&self, app: &AppState, text: &str) -> Result<Written, ApiError> {
        let prepared = prepare(text)?;
        let kv = self.bucket(app).await?;
        let version = kv
            .put(KEY, prepared.text.into())
            .await
            .map_err(|e| unavailable(format!("The live config cannot be written: {e}")))?;
        wait_applied(app, version).await;
        Ok(Written {
            version,
            warnings: prepared.warnings,
        })
    }
}

/// Validates `text` as `config push` does (this process's environment and master key); a 400
/// naming the field otherwise.
pub(super) fn prepare(text: &str) -> Result<Prepared, ApiError> {
    let master = MasterKey::from_env(MASTER_KEY_ENV)
        .map_err(|e| unavailable(format!("The master key is unusable: {e}")))?;
    prepare_for_store("<admin>", text, |k| std::env::var(k).ok(), master.as_ref())
        .map_err(|e| ApiError::invalid(e.to_string(), e.field()))
}

/// Waits (up to [`APPLY_WAIT`]) until this replica holds `version`, so the answer and the next
/// request through it see the change.
async fn wait_applied(app: &AppState, version: u64) {
    let live = app.config.live();
    if !live.is_watched() {
        return;
    }
    let deadline = Instant::now() + APPLY_WAIT;
    while app.config.version() < version {
        let now = Instant::now();
        if now >= deadline {
            tracing::warn!(
                version,
                "this replica has not applied its own admin change yet"
            );
            return;
        }
        live.request_check();
        live.wait_confirmed_after(now, deadline - now).await;
    }
}
