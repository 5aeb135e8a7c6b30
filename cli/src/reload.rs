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
use std::path::PathBuf;
use std::time::{Duration, SystemTime};
use switchyard_schemas::config::{ConfigHandle, GatewayConfig};
use tokio_util::sync::CancellationToken;

/// The KV bucket holding the live config.
pub const BUCKET: &str = "SY_CONFIG";
/// The key of the gateway config in [`BUCKET`].
pub const KEY: &str = "gateway";

/// How often a watcher that cannot open the config bucket looks again.
const BUCKET_RETRY: Duration = Duration::from_secs(2);

/// Adjusts a loaded config to this process before it is installed (e.g. `up` removes the local
/// model's target when no local model server runs). `Arc::new(|_| {})` for none.
pub type Fixup =
    std::sync::Arc<dyn Fn(&mut switchyard_schemas::config::GatewayConfig) + Send + Sync>;

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
}

/// The first `nats:` credential field of `yaml` given as a literal value rather than a
/// `${ENV}` reference.
fn literal_nats_secret(yaml: &str) -> Option<&'static str> {
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).ok()?;
    let nats = v.get("nats")?;
    ["password", "token", "nkey_seed"].into_iter().find(|k| {
        nats.get(*k)
            .is_some_and(|s| !s.as_str().is_some_and(|s| s.contains("${")))
    })
}

fn kv_err(e: impl std::fmt::Display) -> ReloadError {
    ReloadError::Kv(e.to_string())
}

/// Gets or creates the config bucket (10 revisions of history).
pub async fn bucket(
    nats: &async_nats::Client,
) -> Result<async_nats::jetstream::kv::Store, ReloadError> {
    let js = async_nats::jetstream::new(nats.clone());
    match js.get_key_value(BUCKET).await {
        Ok(kv) => Ok(kv),
        Err(_) => js
            .create_key_value(async_nats::jetstream::kv::Config {
                bucket: BUCKET.to_owned(),
                history: 10,
                description: "Switchyard live gateway config (YAML)".to_owned(),
                ..Default::default()
            })
            .await
            .map_err(kv_err),
    }
}

/// Validates `yaml` with this process's environment and stores it; returns the new version.
pub async fn push(nats: &async_nats::Client, yaml: &str) -> Result<u64, ReloadError> {
    let c = config::parse("<push>", yaml, |k| std::env::var(k).ok())?;
    if let Some(field) = literal_nats_secret(yaml) {
        return Err(ReloadError::LiteralNatsSecret(field));
    }
    c.validate()
        .map_err(|source| config::ConfigLoadError::Invalid {
            path: "<push>".into(),
            source,
        })?;
    let kv = bucket(nats).await?;
    kv.put(KEY, yaml.to_owned().into()).await.map_err(kv_err)
}

/// Applies the stored config (if any) and then every later push to `handle`, until `shutdown`.
pub async fn watch_kv(
    nats: async_nats::Client,
    handle: ConfigHandle,
    shutdown: CancellationToken,
    fixup: Fixup,
) -> Result<(), ReloadError> {
    // A service identity may read the bucket but not create it (docs/security.md): until an
    // admin has pushed a config, keep looking for it.
    let js = async_nats::jetstream::new(nats.clone());
    let mut warned = false;
    let kv = loop {
        match js.get_key_value(BUCKET).await.map_err(kv_err) {
            Ok(kv) => break kv,
            Err(e) => {
                if !warned {
                    tracing::info!(error = %e, "no live config bucket yet; waiting for a push");
                    warned = true;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(BUCKET_RETRY) => {}
                }
            }
        }
    };
    let mut updates = kv.watch_with_history(KEY).await.map_err(kv_err)?;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            entry = updates.next() => {
                let Some(entry) = entry else { return Ok(()) };
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
                apply(&handle, entry.revision, &entry.value, &fixup);
            }
        }
    }
}

/// Parses, validates and installs one stored revision (keeping this process's local settings);
/// a bad one is logged and skipped.
fn apply(handle: &ConfigHandle, revision: u64, value: &[u8], fixup: &Fixup) {
    match load_stored(revision, &String::from_utf8_lossy(value)) {
        Ok(mut c) => {
            keep_local(&mut c, &handle.get());
            fixup(&mut c);
            if handle.set(revision, c) {
                tracing::info!(version = revision, "config reloaded");
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "ignoring invalid config revision; keeping the current one")
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
    let c = config::parse(&name, yaml, |k| std::env::var(k).ok())?;
    c.validate()
        .map_err(|source| config::ConfigLoadError::Invalid {
            path: name.clone(),
            source,
        })?;
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
/// `shutdown`. The first check records the current time without pushing.
pub async fn watch_file(
    nats: async_nats::Client,
    path: PathBuf,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mtime = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut last: Option<SystemTime> = mtime(&path);
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
        match std::fs::read_to_string(&path) {
            Ok(text) => match push(&nats, &text).await {
                Ok(v) => {
                    tracing::info!(file = %path.display(), version = v, "config file changed; pushed")
                }
                Err(e) => {
                    tracing::error!(file = %path.display(), error = %e, "config file changed but is invalid; not applied")
                }
            },
            Err(e) => tracing::warn!(file = %path.display(), error = %e, "cannot read config file"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_credentials_are_pushed_only_as_references() {
        assert_eq!(
            literal_nats_secret("nats: {user: a, password: hunter2}\n"),
            Some("password")
        );
        assert_eq!(literal_nats_secret("nats: {token: \"${T}\"}\n"), None);
        assert_eq!(
            literal_nats_secret("nats: {nkey_seed: SUABC}\n"),
            Some("nkey_seed")
        );
        assert_eq!(literal_nats_secret("models: []\n"), None);
        assert_eq!(
            ReloadError::LiteralNatsSecret("token").to_string(),
            "`nats.token` is written literally: the pushed text is readable by every service; \
             use ${ENV} or SWITCHYARD_NATS_* variables"
        );
    }
}
