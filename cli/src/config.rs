//! Loads the YAML config: `${VAR}` / `${VAR:-default}` interpolation in string values and serde
//! errors that name the field ([`switchyard_schemas::config_text`]), then start-up validation;
//! [`resolve_secrets`] turns `env:`/`enc:v1:` provider credentials into usable ones.

use std::path::Path;
use switchyard_schemas::config::GatewayConfig;

/// The built-in default: the `demo/mock` model on the built-in mock upstream, plus real provider
/// routes added at start-up when `OPENAI_API_KEY` / `ANTHROPIC_API_KEY` are set.
pub const DEFAULT_CONFIG: &str = include_str!("../../config/default.yaml");

pub use switchyard_schemas::config_text::{ConfigLoadError, parse};

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

/// Resolves the provider credentials of `config` (`env:NAME`, `enc:v1:` under
/// `SWITCHYARD_MASTER_KEY`) in place: done only by processes that call upstreams (workers,
/// `up`). A wrong or missing master key is an error naming the field.
pub fn resolve_secrets(config: &mut GatewayConfig) -> Result<(), String> {
    use switchyard_schemas::config::resolve_provider_secrets;
    use switchyard_schemas::sealed::{MASTER_KEY_ENV, MasterKey};
    let master = MasterKey::from_env(MASTER_KEY_ENV).map_err(|e| e.to_string())?;
    resolve_provider_secrets(config, &|k| std::env::var(k).ok(), master.as_ref())
        .map_err(|e| e.to_string())
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
