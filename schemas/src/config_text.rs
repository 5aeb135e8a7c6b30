//! The YAML text of a config: parsing with `${VAR}` / `${VAR:-default}` interpolation (serde
//! errors name the field, serde_path_to_error), what is stored in the live config bucket
//! ([`prepare_for_store`]: literal client keys become hashes, literal provider credentials are
//! encrypted when a master key is present) and what is shown ([`redact_text`]).
//!
//! Shared by `switchyard config push|show` and the admin API (`/admin/config`), so both store
//! and show exactly the same thing.

use crate::config::{ConfigError, GatewayConfig};
use crate::sealed::{MasterKey, is_reference};
use crate::secret::REDACTED;
use crate::tenancy::sha256_hex;
use serde_yaml_ng::{Mapping, Value};

/// The live config bucket (NATS JetStream KV).
pub const BUCKET: &str = "SY_CONFIG";
/// The key of the gateway config in [`BUCKET`]; its revision is the config version.
pub const KEY: &str = "gateway";

/// Config loading failures; each names the file and the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigLoadError {
    /// Reading the file failed.
    #[error("reading config {path}: {source}")]
    Read {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// YAML syntax or a field of the wrong shape.
    #[error("config {path}: {message}")]
    Parse {
        /// File.
        path: String,
        /// What and where.
        message: String,
    },
    /// A rule from [`GatewayConfig::validate`].
    #[error("config {path}: {source}")]
    Invalid {
        /// File.
        path: String,
        /// The broken rule.
        source: ConfigError,
    },
}

impl ConfigLoadError {
    /// The offending field (`targets[0].provider`) when the error names one.
    pub fn field(&self) -> Option<String> {
        match self {
            Self::Invalid { source, .. } => Some(source.field.clone()),
            Self::Parse { message, .. } => message
                .strip_prefix("field `")
                .and_then(|m| m.split_once('`'))
                .map(|(f, _)| f.to_owned()),
            Self::Read { .. } => None,
        }
    }
}

/// Parses YAML text with `env` as the variable source (no validation).
pub fn parse(
    name: &str,
    text: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<GatewayConfig, ConfigLoadError> {
    let perr = |message: String| ConfigLoadError::Parse {
        path: name.to_owned(),
        message,
    };
    let mut value: Value = serde_yaml_ng::from_str(text).map_err(|e| perr(e.to_string()))?;
    interpolate(&mut value, &env).map_err(perr)?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        perr(format!("field `{path}`: {}", e.into_inner()))
    })
}

/// [`parse`], then [`GatewayConfig::validate`].
pub fn parse_valid(
    name: &str,
    text: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<GatewayConfig, ConfigLoadError> {
    let c = parse(name, text, env)?;
    c.validate().map_err(|source| ConfigLoadError::Invalid {
        path: name.to_owned(),
        source,
    })?;
    Ok(c)
}

fn interpolate(v: &mut Value, env: &impl Fn(&str) -> Option<String>) -> Result<(), String> {
    match v {
        Value::String(s) if s.contains("${") => *s = expand(s, env)?,
        Value::Sequence(items) => {
            for i in items {
                interpolate(i, env)?;
            }
        }
        Value::Mapping(m) => {
            for (_, val) in m.iter_mut() {
                interpolate(val, env)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Expands `${VAR}` (an error when unset) and `${VAR:-default}`.
pub fn expand(s: &str, env: &impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed `${{` in `{s}`"))?;
        let expr = &after[..end];
        let (var, default) = match expr.split_once(":-") {
            Some((v, d)) => (v, Some(d)),
            None => (expr, None),
        };
        match (env(var), default) {
            (Some(val), _) if !val.is_empty() => out.push_str(&val),
            (_, Some(d)) => out.push_str(d),
            (_, None) => return Err(format!("environment variable `{var}` is not set")),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The first `nats:` credential field of `yaml` given as a literal value rather than a
/// `${ENV}` reference (every service may read the bucket, so these are refused at push).
pub fn literal_nats_secret(yaml: &str) -> Option<&'static str> {
    let v: Value = serde_yaml_ng::from_str(yaml).ok()?;
    let nats = v.get("nats")?;
    ["password", "token", "nkey_seed"].into_iter().find(|k| {
        nats.get(*k)
            .is_some_and(|s| !s.as_str().is_some_and(|s| s.contains("${")))
    })
}

/// What kind of credential a config field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A provider credential (encrypted when stored).
    Provider,
    /// A client or admin API key (stored as its SHA-256).
    ApiKey,
    /// A NATS credential (refused at push when literal).
    Nats,
}

/// Calls `f(path, kind, mapping, field)` for every credential field present in `root`.
fn each_secret(root: &mut Value, f: &mut impl FnMut(String, Kind, &mut Mapping, &str)) {
    let Some(top) = root.as_mapping_mut() else {
        return;
    };
    if let Some(Value::Sequence(targets)) = top.get_mut("targets") {
        for (i, t) in targets.iter_mut().enumerate() {
            let Some(t) = t.as_mapping_mut() else {
                continue;
            };
            if t.contains_key("api_key") {
                f(
                    format!("targets[{i}].api_key"),
                    Kind::Provider,
                    t,
                    "api_key",
                );
            }
            if let Some(aws) = t.get_mut("aws").and_then(Value::as_mapping_mut) {
                for field in ["access_key_id", "secret_access_key", "session_token"] {
                    if aws.contains_key(field) {
                        f(
                            format!("targets[{i}].aws.{field}"),
                            Kind::Provider,
                            aws,
                            field,
                        );
                    }
                }
            }
        }
    }
    let mut keys = |list: Option<&mut Value>, prefix: &str| {
        if let Some(Value::Sequence(keys)) = list {
            for (i, k) in keys.iter_mut().enumerate() {
                if let Some(k) = k.as_mapping_mut()
                    && k.contains_key("key")
                {
                    f(format!("{prefix}[{i}].key"), Kind::ApiKey, k, "key");
                }
            }
        }
    };
    keys(top.get_mut("keys"), "keys");
    keys(
        top.get_mut("admin")
            .and_then(Value::as_mapping_mut)
            .and_then(|a| a.get_mut("keys")),
        "admin.keys",
    );
    if let Some(nats) = top.get_mut("nats").and_then(Value::as_mapping_mut) {
        for field in ["password", "token", "nkey_seed"] {
            if nats.contains_key(field) {
                f(format!("nats.{field}"), Kind::Nats, nats, field);
            }
        }
    }
}

/// The literal (non-reference) string value of `m[field]`, if it is one.
fn literal(m: &Mapping, field: &str) -> Option<String> {
    m.get(field)
        .and_then(Value::as_str)
        .filter(|s| !is_reference(s))
        .map(str::to_owned)
}

/// A config ready for the live config bucket.
#[derive(Debug)]
pub struct Prepared {
    /// The text to store: the input unchanged, or re-serialised YAML (comments dropped) when a
    /// literal key was hashed or a literal credential encrypted.
    pub text: String,
    /// The config as this process loads it.
    pub config: GatewayConfig,
    /// One line per literal credential: what was done with it.
    pub warnings: Vec<String>,
}

/// Why a text cannot be stored.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// It does not load.
    #[error(transparent)]
    Invalid(#[from] ConfigLoadError),
    /// A `nats:` credential is written literally.
    #[error(
        "`nats.{0}` is written literally: the pushed text is readable by every service; use \
         ${{ENV}} or SWITCHYARD_NATS_* variables"
    )]
    LiteralNatsSecret(&'static str),
}

impl PrepareError {
    /// The offending field, for a 400 naming it.
    pub fn field(&self) -> Option<String> {
        match self {
            Self::Invalid(e) => e.field(),
            Self::LiteralNatsSecret(f) => Some(format!("nats.{f}")),
        }
    }
}

/// Validates `text` with `env` and turns it into what the live config bucket stores: a literal
/// `key:` of a client or admin key becomes `key_sha256:` (the key is never stored); a literal
/// provider credential is encrypted (`enc:v1:`) under `master`, or kept with a warning when no
/// master key is set. A literal `nats:` credential is refused.
pub fn prepare_for_store(
    name: &str,
    text: &str,
    env: impl Fn(&str) -> Option<String>,
    master: Option<&MasterKey>,
) -> Result<Prepared, PrepareError> {
    let config = parse_valid(name, text, &env)?;
    if let Some(field) = literal_nats_secret(text) {
        return Err(PrepareError::LiteralNatsSecret(field));
    }
    let mut value: Value = serde_yaml_ng::from_str(text).map_err(|e| ConfigLoadError::Parse {
        path: name.to_owned(),
        message: e.to_string(),
    })?;
    let mut warnings = Vec::new();
    let mut changed = false;
    each_secret(&mut value, &mut |path, kind, m, field| {
        let Some(clear) = literal(m, field) else {
            return;
        };
        match kind {
            Kind::ApiKey => {
                m.remove(field);
                m.insert("key_sha256".into(), sha256_hex(&clear).into());
                warnings.push(format!(
                    "{path} is written literally: stored as its SHA-256 (key_sha256) only"
                ));
                changed = true;
            }
            Kind::Provider => match master {
                Some(k) => {
                    m.insert(field.into(), k.encrypt(&clear).into());
                    warnings.push(format!(
                        "{path} is written literally: stored encrypted (enc:v1) under \
                         SWITCHYARD_MASTER_KEY"
                    ));
                    changed = true;
                }
                None => warnings.push(format!(
                    "{path} is written literally and stored in clear (readable by every \
                     service): use env:NAME, or set SWITCHYARD_MASTER_KEY to store it encrypted"
                )),
            },
            Kind::Nats => {}
        }
    });
    let text = if changed {
        serde_yaml_ng::to_string(&value).map_err(|e| ConfigLoadError::Parse {
            path: name.to_owned(),
            message: e.to_string(),
        })?
    } else {
        text.to_owned()
    };
    Ok(Prepared {
        text,
        config,
        warnings,
    })
}

/// `text` with every literal credential replaced by `[redacted]` (references — `${ENV}`,
/// `env:NAME`, `enc:v1:…` — stay, they reveal nothing). Unchanged when nothing is literal; a text
/// that is not YAML is not shown at all.
pub fn redact_text(text: &str) -> String {
    let Ok(mut value) = serde_yaml_ng::from_str::<Value>(text) else {
        return format!("# {REDACTED}: the stored text is not valid YAML\n");
    };
    let mut changed = false;
    each_secret(&mut value, &mut |_, _, m, field| {
        if literal(m, field).is_some() || m.get(field).is_some_and(|v| !v.is_string()) {
            m.insert(field.into(), REDACTED.into());
            changed = true;
        }
    });
    if !changed {
        return text.to_owned();
    }
    serde_yaml_ng::to_string(&value)
        .unwrap_or_else(|_| format!("# {REDACTED}: the stored text could not be shown\n"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const BASE: &str = "targets:\n  - id: m\n    provider: openai\n    base_url: builtin:mock\n    upstream_model: m\n    api_key: sk-literal-provider-123\nmodels:\n  - id: demo/m\n    targets: [m]\n";

    #[test]
    fn env_interpolation() {
        let env = |k: &str| (k == "KEY").then(|| "sk-1".to_string());
        assert_eq!(expand("a ${KEY} b", &env).unwrap(), "a sk-1 b");
        assert_eq!(expand("${NOPE:-x}", &env).unwrap(), "x");
        assert!(expand("${NOPE}", &env).unwrap_err().contains("NOPE"));
    }

    #[test]
    fn literal_keys_are_hashed_and_credentials_sealed() {
        let text = format!(
            "{BASE}keys:\n  - id: a\n    tenant: t\n    key: sk-client-literal\n  - id: b\n    tenant: t\n    key: ${{B_KEY}}\n"
        );
        let env = |k: &str| (k == "B_KEY").then(|| "sk-from-env-b".to_string());
        let (master, _) = MasterKey::generate();
        let p = prepare_for_store("t", &text, env, Some(&master)).unwrap();
        assert!(!p.text.contains("sk-client-literal"), "{}", p.text);
        assert!(!p.text.contains("sk-literal-provider"), "{}", p.text);
        assert!(p.text.contains(&sha256_hex("sk-client-literal")));
        assert!(p.text.contains("${B_KEY}"), "references stay: {}", p.text);
        assert_eq!(p.warnings.len(), 2, "{:?}", p.warnings);
        let stored = parse_valid("s", &p.text, env).unwrap();
        assert_eq!(
            stored.keys[0].sha256(),
            Some(sha256_hex("sk-client-literal"))
        );
        let enc = stored.targets[0].api_key.expose();
        assert_eq!(
            master.decrypt(enc).unwrap().expose(),
            "sk-literal-provider-123"
        );

        // Without a master key the provider key stays (with a warning); the client key is hashed.
        let p = prepare_for_store("t", &text, env, None).unwrap();
        assert!(p.text.contains("sk-literal-provider-123"));
        assert!(
            p.warnings[0].contains("stored in clear"),
            "{:?}",
            p.warnings
        );
        assert!(!p.text.contains("sk-client-literal"));
    }

    #[test]
    fn show_redacts_literals_only() {
        let text = format!(
            "{BASE}admin:\n  keys:\n    - id: ops\n      key: hunter2hunter2\nnats:\n  token: tok-literal\n"
        );
        let shown = redact_text(&text);
        for secret in ["sk-literal-provider-123", "hunter2hunter2", "tok-literal"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert_eq!(shown.matches(REDACTED).count(), 3, "{shown}");
        let refs = "targets:\n  - id: m\n    api_key: env:OPENAI_KEY\n";
        assert_eq!(redact_text(refs), refs);
    }

    #[test]
    fn load_errors_name_the_field() {
        let e = parse("f", "targets:\n  - id: a\n    provider: nope\n", |_| None).unwrap_err();
        assert_eq!(e.field().as_deref(), Some("targets[0].provider"));
    }
}
