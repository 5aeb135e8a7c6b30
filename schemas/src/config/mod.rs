//! Gateway configuration types, shared by every service so they read one file the same way.
//!
//! Every struct rejects unknown fields (a typo is an error naming the field, not a silent default);
//! [`GatewayConfig::validate`] checks cross-field rules at start-up. Parsing YAML and `${ENV}`
//! interpolation happen in the `switchyard` binary.

mod error;
mod gateway;
mod secrets;
mod server;
mod target;
#[cfg(test)]
mod tests;
mod validate;

pub use crate::config_handle::{ConfigHandle, Confirmation, LiveStatus, Versioned};
pub use error::ConfigError;
pub use gateway::{BatchConfig, BillingConfig, GatewayConfig, ResponsesConfig};
pub use secrets::resolve_provider_secrets;
pub use server::{ServerConfig, Timeouts};
pub use target::{
    AwsTarget, BUILTIN_LOCAL_MODEL_URL, BUILTIN_MOCK_URL, ModelConfig, OpenAiApi, ProviderKind,
    TargetConfig, is_mock_path_prefix,
};
