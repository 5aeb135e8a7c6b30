//! The error of a configuration rule that does not hold.

/// A configuration rule that does not hold, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config field `{field}`: {message}")]
pub struct ConfigError {
    /// Dotted path of the offending field, e.g. `models[0].targets[1]`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// A [`ConfigError`] at `field`.
pub(super) fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}
