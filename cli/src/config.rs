//! Loads the YAML config: `${VAR}` / `${VAR:-default}` interpolation in string values (for secrets),
//! serde errors that name the field (serde_path_to_error), then start-up validation.

use std::path::Path;
use switchyard_schemas::config::GatewayConfig;

/// The built-in default: the `demo/mock` model on the built-in mock upstream, plus real provider
/// routes added at start-up when `OPENAI_API_KEY` / `ANTHROPIC_API_KEY` are set.
pub const DEFAULT_CONFIG: &str = include_str!("../../config/default.yaml");

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
        source: switchyard_schemas::config::ConfigError,
    },
}

/// Loads `path`, or the built-in default when `None`.
pub fn load(path: Option<&Path>) -> Result<GatewayConfig, ConfigLoadError> {
    let (name, text) = match path {
        Some(p) => {
            let name = p.display().to_string();
            let text = std::fs::read_to_string(p).map_err(|source| ConfigLoadError::Read {
                path: name.clone(),
                source,
            })?;
            (name, text)
        }
        None => ("<built-in default>".to_owned(), DEFAULT_CONFIG.to_owned()),
    };
    let mut config = parse(&name, &text, |k| std::env::var(k).ok())?;
    if path.is_none() {
        add_env_provider_routes(&mut config);
    }
    config
        .validate()
        .map_err(|source| ConfigLoadError::Invalid {
            path: name.clone(),
            source,
        })?;
    if let Some(p) = &config.pricing_file {
        // Fail at start-up, not on the first priced request.
        switchyard_schemas::pricing::Catalog::load(Some(p)).map_err(|e| {
            ConfigLoadError::Invalid {
                path: name,
                source: switchyard_schemas::config::ConfigError {
                    field: "pricing_file".into(),
                    message: e.to_string(),
                },
            }
        })?;
    }
    Ok(config)
}

/// Parses YAML text with `env` as the variable source.
pub fn parse(
    name: &str,
    text: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<GatewayConfig, ConfigLoadError> {
    let perr = |message: String| ConfigLoadError::Parse {
        path: name.to_owned(),
        message,
    };
    let mut value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(text).map_err(|e| perr(e.to_string()))?;
    interpolate(&mut value, &env).map_err(perr)?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        perr(format!("field `{path}`: {}", e.into_inner()))
    })
}

fn interpolate(
    v: &mut serde_yaml_ng::Value,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<(), String> {
    use serde_yaml_ng::Value;
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
fn expand(s: &str, env: &impl Fn(&str) -> Option<String>) -> Result<String, String> {
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

fn add_env_provider_routes(config: &mut GatewayConfig) {
    let extra = [
        ("OPENAI_API_KEY", include_str!("../../config/openai.yaml")),
        (
            "ANTHROPIC_API_KEY",
            include_str!("../../config/anthropic.yaml"),
        ),
    ];
    for (var, yaml) in extra {
        if std::env::var(var).map(|v| v.is_empty()).unwrap_or(true) {
            continue;
        }
        match parse(var, yaml, |k| std::env::var(k).ok()) {
            Ok(more) => {
                config.targets.extend(more.targets);
                config.models.extend(more.models);
            }
            Err(e) => tracing::warn!(error = %e, "skipping provider routes for {var}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn default_parses_and_validates() {
        let c = parse("d", DEFAULT_CONFIG, |_| None).unwrap();
        c.validate().unwrap();
        assert!(c.model("demo/mock").is_some());
    }

    #[test]
    fn env_interpolation() {
        let env = |k: &str| (k == "KEY").then(|| "sk-1".to_string());
        assert_eq!(expand("a ${KEY} b", &env).unwrap(), "a sk-1 b");
        assert_eq!(expand("${NOPE:-x}", &env).unwrap(), "x");
        assert!(expand("${NOPE}", &env).unwrap_err().contains("NOPE"));
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse(
            "f.yaml",
            "targets:\n  - id: a\n    provider: nope\n",
            |_| None,
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("targets[0].provider"), "{msg}");
        let e = parse("f.yaml", "listne: x\n", |_| None).unwrap_err();
        assert!(e.to_string().contains("listne"), "{e}");
    }
}
