//! A string that never prints: API keys and other credentials.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A credential. `Debug` and `Display` print `[redacted]`; only [`Secret::expose`] reveals it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The credential itself, for the one place that sends it (an upstream header).
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// True when no credential was given.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// Serialises as `[redacted]` so a config dump can never leak a key.
impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints() {
        let s = Secret::new("sk-live-123");
        assert_eq!(format!("{s:?} {s}"), "[redacted] [redacted]");
        assert_eq!(
            serde_json::to_string(&s).ok().as_deref(),
            Some("\"[redacted]\"")
        );
        assert_eq!(s.expose(), "sk-live-123");
    }
}
