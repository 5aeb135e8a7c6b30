//! The provider credentials of a loaded config, resolved where they are used (a worker).

use super::error::ConfigError;
use super::gateway::GatewayConfig;
use crate::sealed::{MasterKey, SealError, resolve};

/// Resolves every provider credential of `config` in place (`targets[i].api_key`,
/// `targets[i].aws.*`): what a worker does before it calls upstreams. The error names the field.
pub fn resolve_provider_secrets(
    config: &mut GatewayConfig,
    env: &impl Fn(&str) -> Option<String>,
    master: Option<&MasterKey>,
) -> Result<(), ConfigError> {
    let wrap = |field: String| {
        move |e: SealError| ConfigError {
            field,
            message: e.to_string(),
        }
    };
    for (i, t) in config.targets.iter_mut().enumerate() {
        t.api_key =
            resolve(&t.api_key, env, master).map_err(wrap(format!("targets[{i}].api_key")))?;
        if let Some(aws) = &mut t.aws {
            aws.access_key_id = resolve(&aws.access_key_id, env, master)
                .map_err(wrap(format!("targets[{i}].aws.access_key_id")))?;
            aws.secret_access_key = resolve(&aws.secret_access_key, env, master)
                .map_err(wrap(format!("targets[{i}].aws.secret_access_key")))?;
            if let Some(tok) = &aws.session_token {
                aws.session_token = Some(
                    resolve(tok, env, master)
                        .map_err(wrap(format!("targets[{i}].aws.session_token")))?,
                );
            }
        }
    }
    Ok(())
}
