//! Live config: every replica switches atomically to a new validated snapshot, without restart.
//!
//! The YAML text lives in the NATS KV bucket [`BUCKET`] under key [`KEY`]; its revision is the
//! config version. Every service watches the key, re-parses the text with its own environment
//! (so secrets stay `${ENV}` references in KV and never travel), validates it, and swaps its
//! [`ConfigHandle`]. An invalid push is rejected by `switchyard config push` before it reaches KV,
//! and ignored with an error log by any replica that still cannot load it. For one box,
//! [`watch_file`] pushes the config file to KV whenever it changes.
//!
//! Precedence (docs/deploy.md, "Which config wins"): the process-local settings
//! ([`keep_local`]: listen address, data dir, NATS URL and credentials) come from this process's
//! flags and local file only and are never taken from KV; everything else (models, targets,
//! keys, prices, ...) is shared and comes from the live KV config. `switchyard up --config FILE`
//! makes FILE the live config when its text differs from the stored one ([`startup`]).

use crate::config;
use futures::StreamExt;
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};
use switchyard_schemas::config::{ConfigHandle, GatewayConfig};
use switchyard_schemas::config_text::{self, PrepareError};
use switchyard_schemas::sealed::{MASTER_KEY_ENV, MasterKey};
use tokio_util::sync::CancellationToken;

pub use switchyard_schemas::config_text::{BUCKET, KEY};

/// How often a watcher that cannot open the config bucket looks again.
const BUCKET_RETRY: Duration = Duration::from_secs(2);
/// How often the watcher confirms, by reading the latest revision, that it holds it (a broken
/// watch is noticed and healed within this; `admin.stale_after_ms` must be larger).
pub const CONFIRM_EVERY: Duration = Duration::from_millis(250);
/// Shortest gap between two confirmations asked for by ingress (unknown keys).
const CONFIRM_MIN_GAP: Duration = Duration::from_millis(20);

/// Adjusts a loaded config to this process before it is installed (e.g. `up` removes the local
/// model's target when no local model server runs; workers resolve `env:`/`enc:v1:` provider
/// credentials). An error rejects the revision (logged; the current config stays).
/// `Arc::new(|_| Ok(()))` for none.
pub type Fixup = std::sync::Arc<dyn Fn(&mut GatewayConfig) -> Result<(), String> + Send + Sync>;

/// Reload failures.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The text does not load (YAML, field or rule error).
    #[error(transparent)]
    Invalid(#[from] config::ConfigLoadError),
    /// NATS KV failed.
    #[error("config KV: {0}")]
    Kv(String),
    /// The text holds a NATS credential itself (`nats.password`, `nats.token`,
    /// `nats.nkey_seed` not written as `${ENV}`): every service may read the bucket.
    #[error(
        "`nats.{0}` is written literally: the pushed text is readable by every service; use \
         ${{ENV}} or SWITCHYARD_NATS_* variables"
    )]
    LiteralNatsSecret(&'static str),
    /// `config rollback` to a version the bucket does not hold.
    #[error("config version {0} is not in the history (`switchyard config history` lists them)")]
    NoSuchVersion(u64),
    /// `SWITCHYARD_MASTER_KEY` (or a rotation key) is unusable.
    #[error(transparent)]
    Seal(#[from] switchyard_schemas::sealed::SealError),
}

impl From<PrepareError> for ReloadError {
    fn from(e: PrepareError) -> Self {
        match e {
            PrepareError::Invalid(e) => Self::Invalid(e),
            PrepareError::LiteralNatsSecret(f) => Self::LiteralNatsSecret(f),
        }
    }
}

fn kv_err(e: impl std::fmt::Display) -> ReloadError {
    ReloadError::Kv(e.to_string())
}

/// Gets or creates the config bucket (10 revisions of history).
pub async fn bucket(
    nats: &async_nats::Client,
) -> Result<async_nats::jetstream::kv::Store, ReloadError> {
    switchyard_ingress::admin::config_bucket(nats.clone())
        .await
        .map_err(kv_err)
}

/// A pushed config: its version and what was done with literal credentials.
#[derive(Debug)]
pub struct Pushed {
    /// The new version (KV revision).
    pub version: u64,
    /// One line per literal credential (hashed, encrypted, or stored in clear).
    pub warnings: Vec<String>,
}

/// Validates `yaml` with this process's environment and stores it (literal keys as hashes,
/// literal provider credentials encrypted under `SWITCHYARD_MASTER_KEY` when set); returns the
/// new version.
pub async fn push(nats: &async_nats::Client, yaml: &str) -> Result<u64, ReloadError> {
    push_reporting(nats, yaml).await.map(|p| p.version)
}

/// [`push`], also returning the warnings about literal credentials.
pub async fn push_reporting(nats: &async_nats::Client, yaml: &str) -> Result<Pushed, ReloadError> {
    let master = MasterKey::from_env(MASTER_KEY_ENV)?;
    let prepared =
        config_text::prepare_for_store("<push>", yaml, |k| std::env::var(k).ok(), master.as_ref())?;
    let kv = bucket(nats).await?;
    let version = kv.put(KEY, prepared.text.into()).await.map_err(kv_err)?;
    Ok(Pushed {
        version,
        warnings: prepared.warnings,
    })
}

/// Re-encrypts every `enc:v1:` value of the live config from `old` to `new` (compare-and-set
/// on the revision; the text is otherwise unchanged). Returns the new version and the count.
pub async fn rotate_live(
    nats: &async_nats::Client,
    old: &MasterKey,
    new: &MasterKey,
) -> Result<(u64, usize), ReloadError> {
    let kv = bucket(nats).await?;
    let entry = kv
        .entry(KEY)
        .await
        .map_err(kv_err)?
        .ok_or_else(|| ReloadError::Kv("no live config pushed yet".into()))?;
    let text = String::from_utf8_lossy(&entry.value);
    let (rotated, n) = switchyard_schemas::sealed::rotate_text(&text, old, new)?;
    if n == 0 {
        return Ok((entry.revision, 0));
    }
    let version = kv
        .update(KEY, rotated.into(), entry.revision)
        .await
        .map_err(kv_err)?;
    Ok((version, n))
}

/// The live config text with every literal credential redacted, and its version (`None` when
/// nothing was pushed): what `switchyard config show` prints.
pub async fn show(nats: &async_nats::Client) -> Result<Option<(u64, String)>, ReloadError> {
    let kv = bucket(nats).await?;
    Ok(kv.entry(KEY).await.map_err(kv_err)?.map(|e| {
        let text = String::from_utf8_lossy(&e.value);
        (e.revision, config_text::redact_text(&text))
    }))
}

/// Whether `e` says the stream does not exist (an authoritative "no live config").
fn is_not_found(e: &async_nats::jetstream::context::GetStreamError) -> bool {
    use async_nats::jetstream::context::GetStreamErrorKind;
    matches!(e.kind(), GetStreamErrorKind::JetStream(je)
        if je.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND)
}

/// Applies the stored config (if any) and then every later push to `handle`, until `shutdown`.
///
/// It also confirms, every [`CONFIRM_EVERY`] and whenever ingress asks
/// ([`switchyard_schemas::config::LiveStatus::request_check`]), that the revision it holds is
/// the bucket's latest, reading the latest entry directly: a newer one the watch did not
/// deliver is applied from that read. Ingress fails closed when confirmations stop.
pub async fn watch_kv(
    nats: async_nats::Client,
    handle: ConfigHandle,
    shutdown: CancellationToken,
    fixup: Fixup,
) -> Result<(), ReloadError> {
    handle.live().mark_watched();
    // A service identity may read the bucket but not create it (docs/security.md): until an
    // admin has pushed a config, keep looking for it.
    let js = async_nats::jetstream::new(nats.clone());
    let mut warned = false;
    let kv = loop {
        match js.get_stream(format!("KV_{BUCKET}")).await {
            Ok(_) => {
                if let Ok(kv) = js.get_key_value(BUCKET).await {
                    break kv;
                }
            }
            Err(e) => {
                if is_not_found(&e) {
                    // No live config exists: the start-up file is the latest.
                    handle.live().confirm(0);
                }
                if !warned {
                    tracing::info!(error = %e, "no live config bucket yet; waiting for a push");
                    warned = true;
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(BUCKET_RETRY.min(CONFIRM_EVERY)) => {}
            _ = handle.live().check_requested() => {}
        }
    };
    let mut updates = kv.watch_with_history(KEY).await.map_err(kv_err)?;
    let mut tick = tokio::time::interval(CONFIRM_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_check = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            entry = updates.next() => {
                let Some(entry) = entry else {
                    // The watch ended: keep confirming by reads (they heal and apply).
                    updates = match kv.watch_with_history(KEY).await {
                        Ok(w) => w,
                        Err(e) => {
                            tracing::warn!(error = %e, "config watch ended and cannot restart");
                            confirm_loop(&kv, &handle, &shutdown, &fixup).await;
                            return Ok(());
                        }
                    };
                    continue;
                };
                let entry = match entry {
                    Ok(e) => e,
                    Err(e) => {
                        tracing::warn!(error = %e, "config watch error");
                        continue;
                    }
                };
                if entry.operation != async_nats::jetstream::kv::Operation::Put {
                    continue;
                }
                let latest = entry.delta == 0;
                install(&handle, entry.revision, &entry.value, &fixup);
                // Delivered with no pending newer ones: this is the latest.
                if latest {
                    handle.live().confirm(entry.revision);
                }
            }
            _ = tick.tick() => {
                confirm(&kv, &handle, &fixup).await;
                last_check = tokio::time::Instant::now();
            }
            _ = handle.live().check_requested() => {
                tokio::time::sleep_until(last_check + CONFIRM_MIN_GAP).await;
                confirm(&kv, &handle, &fixup).await;
                last_check = tokio::time::Instant::now();
            }
        }
    }
}

/// Confirms by reads only, until `shutdown` (when the watch cannot be restarted).
async fn confirm_loop(
    kv: &async_nats::jetstream::kv::Store,
    handle: &ConfigHandle,
    shutdown: &CancellationToken,
    fixup: &Fixup,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(CONFIRM_EVERY) => {}
            _ = handle.live().check_requested() => {}
        }
        confirm(kv, handle, fixup).await;
    }
}

/// Reads the latest entry: applies it when newer than what `handle` holds, then records the
/// confirmation (and the keys a revision this process cannot apply would change). A failed read
/// records nothing, so ingress's staleness limit runs.
async fn confirm(kv: &async_nats::jetstream::kv::Store, handle: &ConfigHandle, fixup: &Fixup) {
    let entry = match tokio::time::timeout(CONFIRM_EVERY * 4, kv.entry(KEY)).await {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "cannot confirm the live config");
            return;
        }
        Err(_) => {
            tracing::debug!("confirming the live config timed out");
            return;
        }
    };
    let Some(entry) = entry else {
        handle.live().confirm(0);
        return;
    };
    if entry.revision > handle.version() {
        install(handle, entry.revision, &entry.value, fixup);
    }
    handle.live().confirm(entry.revision);
}

/// [`apply`]; a revision newer than the current one that does not load here makes the keys it
/// changes unconfirmed (ingress refuses them until a later revision loads).
fn install(handle: &ConfigHandle, revision: u64, value: &[u8], fixup: &Fixup) {
    if !apply(handle, revision, value, fixup) {
        let text = String::from_utf8_lossy(value);
        handle
            .live()
            .set_unconfirmed(changed_keys(&handle.get(), &text));
    }
}

/// Hashes of the keys whose entry differs between `current` and the stored `text` (added,
/// removed, re-hashed, disabled, expiry or tenant changed), read leniently from `text`'s `keys`.
fn changed_keys(current: &GatewayConfig, text: &str) -> HashSet<String> {
    let state = |k: &switchyard_schemas::tenancy::KeyConfig| {
        (k.sha256(), k.enabled, k.expires_at, k.tenant.clone())
    };
    let mut out = HashSet::new();
    let keys = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text)
        .map_err(|e| e.to_string())
        .map(|v| v.get("keys").cloned())
        .and_then(|k| {
            k.map(serde_yaml_ng::from_value)
                .transpose()
                .map_err(|e| e.to_string())
        });
    let new: Vec<switchyard_schemas::tenancy::KeyConfig> = match keys {
        Ok(k) => k.unwrap_or_default(),
        // Nothing to compare against: no key is marked. Said loudly, since a key that revision
        // disables or expires stays usable here until a revision loads.
        Err(e) => {
            tracing::warn!(error = %e, "unloadable config revision: its keys are unreadable too, so no key is refused");
            Vec::new()
        }
    };
    let old: std::collections::HashMap<String, _> = current
        .keys
        .iter()
        .map(|k| (k.id.clone(), state(k)))
        .collect();
    for k in &new {
        if old.get(&k.id) != Some(&state(k)) {
            out.extend(k.sha256());
            if let Some((Some(h), ..)) = old.get(&k.id) {
                out.insert(h.clone());
            }
        }
    }
    for k in &current.keys {
        if !new.iter().any(|n| n.id == k.id) {
            out.extend(k.sha256());
        }
    }
    out
}

/// Parses, validates and installs one stored revision (keeping this process's local settings);
/// a bad one is logged and skipped. Returns whether this process now holds `revision` (or a
/// newer one).
fn apply(handle: &ConfigHandle, revision: u64, value: &[u8], fixup: &Fixup) -> bool {
    let name = format!("{BUCKET}/{KEY}@{revision}");
    let loaded = load_stored(revision, &String::from_utf8_lossy(value))
        .map_err(|e| e.to_string())
        .and_then(|mut c| {
            keep_local(&mut c, &handle.get());
            fixup(&mut c).map_err(|e| format!("{name}: {e}"))?;
            Ok(c)
        });
    match loaded {
        Ok(c) => {
            if handle.set(revision, c) {
                tracing::info!(version = revision, "config reloaded");
                handle.live().set_unconfirmed(HashSet::new());
            }
            true
        }
        Err(e) => {
            tracing::error!(error = %e, "ignoring invalid config revision; keeping the current one");
            handle.version() >= revision
        }
    }
}

/// Copies the process-local settings from `local` (this process's flags and file) over `c` (a
/// config read from KV): `listen`, `data_dir`, `nats_url` and `nats` (credentials and TLS).
pub fn keep_local(c: &mut GatewayConfig, local: &GatewayConfig) {
    c.listen.clone_from(&local.listen);
    c.data_dir.clone_from(&local.data_dir);
    c.nats_url.clone_from(&local.nats_url);
    c.nats = local.nats.clone();
}

/// The config's `pricing_file` must load: a revision whose prices cannot be read is refused
/// rather than pricing everything at $0.
fn check_catalog(name: &str, c: &GatewayConfig) -> Result<(), config::ConfigLoadError> {
    switchyard_schemas::pricing::Catalog::load(c.pricing_file.as_deref())
        .map(|_| ())
        .map_err(|e| config::ConfigLoadError::Invalid {
            path: name.to_owned(),
            source: switchyard_schemas::config::ConfigError {
                field: "pricing_file".into(),
                message: e.to_string(),
            },
        })
}

/// Parses and validates stored text `yaml` (revision `revision`) with this process's environment.
fn load_stored(revision: u64, yaml: &str) -> Result<GatewayConfig, config::ConfigLoadError> {
    let name = format!("{BUCKET}/{KEY}@{revision}");
    let c = config_text::parse_valid(&name, yaml, |k| std::env::var(k).ok())?;
    check_catalog(&name, &c)?;
    Ok(c)
}

/// The config `switchyard up` starts with, and its version:
/// - `file` given (its path and text) and different from the stored text: FILE is pushed and
///   becomes the live config (logged, with both versions);
/// - `file` given and equal to the stored text: the stored version;
/// - no `file` and a stored config: the stored one, with `local`'s process-local settings
///   ([`keep_local`]);
/// - nothing stored (or the stored text no longer loads): `local`, version 0.
///
/// Errors: KV failures, or FILE's text failing validation.
pub async fn startup(
    nats: &async_nats::Client,
    local: GatewayConfig,
    file: Option<(&std::path::Path, &str)>,
) -> Result<(u64, GatewayConfig), ReloadError> {
    let kv = bucket(nats).await?;
    let stored = kv.entry(KEY).await.map_err(kv_err)?;
    let stored = stored.filter(|e| e.operation == async_nats::jetstream::kv::Operation::Put);
    if let Some((path, text)) = file {
        if let Some(e) = &stored
            && e.value == text.as_bytes()
        {
            tracing::info!(file = %path.display(), version = e.revision,
                "config file is the live config");
            return Ok((e.revision, local));
        }
        let version = push(nats, text).await?;
        match &stored {
            Some(e) => tracing::info!(file = %path.display(), was = e.revision, version,
                "config file differs from the live config in KV; made it the live config"),
            None => tracing::info!(file = %path.display(), version,
                "no live config in KV yet; pushed the config file"),
        }
        return Ok((version, local));
    }
    let Some(e) = stored else {
        return Ok((0, local));
    };
    match load_stored(e.revision, &String::from_utf8_lossy(&e.value)) {
        Ok(mut c) => {
            keep_local(&mut c, &local);
            tracing::info!(
                version = e.revision,
                "using the live config from KV (`up --config FILE` replaces it; `switchyard config history` lists versions)"
            );
            Ok((e.revision, c))
        }
        Err(err) => {
            tracing::error!(error = %err, "the live config in KV does not load; starting with the local one");
            Ok((0, local))
        }
    }
}

/// One stored revision of the live config.
#[derive(Debug, Clone)]
pub struct Revision {
    /// The config version (KV revision).
    pub version: u64,
    /// When it was stored, RFC 3339 UTC.
    pub created: String,
    /// The YAML text.
    pub text: String,
}

/// Every revision the bucket still holds (its `history`, oldest first).
pub async fn history(nats: &async_nats::Client) -> Result<Vec<Revision>, ReloadError> {
    let kv = bucket(nats).await?;
    let mut entries = kv.history(KEY).await.map_err(kv_err)?;
    let mut out = Vec::new();
    while let Some(e) = entries.next().await {
        let e = e.map_err(kv_err)?;
        if e.operation != async_nats::jetstream::kv::Operation::Put {
            continue;
        }
        let created = e
            .created
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        out.push(Revision {
            version: e.revision,
            created,
            text: String::from_utf8_lossy(&e.value).into_owned(),
        });
    }
    Ok(out)
}

/// Makes the text of `version` the live config again, as a new version (validated like a push);
/// returns the new version. Errors: [`ReloadError::NoSuchVersion`] when the bucket no longer
/// holds it, or the push's errors.
pub async fn rollback(nats: &async_nats::Client, version: u64) -> Result<u64, ReloadError> {
    let kv = bucket(nats).await?;
    let entry = kv
        .entry_for_revision(KEY, version)
        .await
        .map_err(kv_err)?
        .filter(|e| e.operation == async_nats::jetstream::kv::Operation::Put)
        .ok_or(ReloadError::NoSuchVersion(version))?;
    push(nats, &String::from_utf8_lossy(&entry.value)).await
}

/// Pushes `path` to KV whenever its modification time changes (checked every `every`), until
/// `shutdown`. The first check records the current time without pushing. An edit is not pushed
/// (an error is logged) when the live config is no longer the file's previous text: a key
/// created through the admin API, a `config push` or a rollback since then is kept, never
/// silently dropped by an unrelated edit of the file.
pub async fn watch_file(
    nats: async_nats::Client,
    path: PathBuf,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mtime = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut last: Option<SystemTime> = mtime(&path);
    // The file as it was when last looked at: the live config may be replaced only while it
    // still is this text (see [`file_still_live`]).
    let mut previous = std::fs::read_to_string(&path).ok();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let now = mtime(&path);
        if now == last {
            continue;
        }
        last = now;
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot read config file");
                continue;
            }
        };
        let live = match live_entry(&nats).await {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(file = %path.display(), error = %e, "config file changed but the live config cannot be read; not applied");
                continue;
            }
        };
        if let (Some(live), Some(before)) = (&live, &previous)
            && !file_still_live(&live.value, before)
        {
            // From now on the file as it is counts: a `config push FILE` makes it live again.
            previous = Some(text);
            tracing::error!(file = %path.display(), live_version = live.revision,
                "config file changed, but the live config was changed since the file was applied \
                 (`config push`, `config rollback`, `key create` or the admin API); not applied, so \
                 that change is kept. Fold it into the file (`switchyard config show`), then \
                 `switchyard config push FILE` to make the file live again");
            continue;
        }
        match push(&nats, &text).await {
            Ok(v) => {
                tracing::info!(file = %path.display(), version = v, "config file changed; pushed");
                previous = Some(text);
            }
            // The live config stays the previous text.
            Err(e) => {
                tracing::error!(file = %path.display(), error = %e, "config file changed but is invalid; not applied")
            }
        }
    }
}

/// The stored live config entry (`None`: nothing pushed, or deleted).
async fn live_entry(
    nats: &async_nats::Client,
) -> Result<Option<async_nats::jetstream::kv::Entry>, ReloadError> {
    let kv = bucket(nats).await?;
    let entry = kv.entry(KEY).await.map_err(kv_err)?;
    Ok(entry.filter(|e| e.operation == async_nats::jetstream::kv::Operation::Put))
}

/// Whether the stored live config `live` is what pushing the file text `previous` stored: the
/// same text once prepared for the store (keys hashed), encrypted values compared without their
/// ciphertext (each encryption draws a new nonce). A previous text that no longer prepares is
/// judged by the live config alone: not the file's.
fn file_still_live(live: &[u8], previous: &str) -> bool {
    let master = MasterKey::from_env(MASTER_KEY_ENV).ok().flatten();
    let Ok(prepared) = config_text::prepare_for_store(
        "<file>",
        previous,
        |k| std::env::var(k).ok(),
        master.as_ref(),
    ) else {
        return false;
    };
    let masked = |t: &str| {
        serde_yaml_ng::from_str::<serde_yaml_ng::Value>(t)
            .ok()
            .map(|mut v| {
                mask_ciphertext(&mut v);
                v
            })
    };
    match (
        masked(&String::from_utf8_lossy(live)),
        masked(&prepared.text),
    ) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// Every `enc:v1:…` string of `v` reduced to `enc:v1:`.
fn mask_ciphertext(v: &mut serde_yaml_ng::Value) {
    use serde_yaml_ng::Value;
    match v {
        Value::String(s) if s.starts_with("enc:v1:") => *s = "enc:v1:".to_owned(),
        Value::Sequence(items) => items.iter_mut().for_each(mask_ciphertext),
        Value::Mapping(m) => m.iter_mut().for_each(|(_, v)| mask_ciphertext(v)),
        Value::Tagged(t) => mask_ciphertext(&mut t.value),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A file edit replaces the live config only while the live config is still the file's
    /// previous text: a key added through the admin API (a later version) is not overwritten.
    #[test]
    fn a_file_edit_never_overwrites_a_change_made_since() {
        let file = "keys: [{id: a, tenant: t, key: aaaaaaaaaaaaaaaa}]\n";
        let stored = |text: &str| {
            config_text::prepare_for_store("<t>", text, |_| None, None)
                .unwrap()
                .text
        };
        assert!(file_still_live(stored(file).as_bytes(), file));
        let with_api_key = "keys: [{id: a, tenant: t, key: aaaaaaaaaaaaaaaa}, {id: b, tenant: t, key: bbbbbbbbbbbbbbbb}]\n";
        assert!(!file_still_live(stored(with_api_key).as_bytes(), file));
        assert!(!file_still_live(b"not: [valid", file));
    }

    #[test]
    fn changed_keys_are_found_by_id() {
        use switchyard_schemas::tenancy::sha256_hex;
        let cur: GatewayConfig = serde_yaml_ng::from_str(
            "keys: [{id: a, tenant: t, key: aaaaaaaaaa}, {id: b, tenant: t, key: bbbbbbbbbb}]",
        )
        .unwrap();
        let next = "keys: [{id: a, tenant: t, key: aaaaaaaaaa, enabled: false}, {id: c, tenant: t, key: cccccccccc}]";
        let got = changed_keys(&cur, next);
        let want: HashSet<String> = ["aaaaaaaaaa", "bbbbbbbbbb", "cccccccccc"]
            .iter()
            .map(|k| sha256_hex(k))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn nats_credentials_are_pushed_only_as_references() {
        assert_eq!(
            config_text::literal_nats_secret("nats: {user: a, password: hunter2}\n"),
            Some("password")
        );
        assert_eq!(
            config_text::literal_nats_secret("nats: {token: \"${T}\"}\n"),
            None
        );
        assert_eq!(
            config_text::literal_nats_secret("nats: {nkey_seed: SUABC}\n"),
            Some("nkey_seed")
        );
        assert_eq!(config_text::literal_nats_secret("models: []\n"), None);
        assert_eq!(
            ReloadError::LiteralNatsSecret("token").to_string(),
            "`nats.token` is written literally: the pushed text is readable by every service; \
             use ${ENV} or SWITCHYARD_NATS_* variables"
        );
    }
}
