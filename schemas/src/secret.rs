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

/// What a redacted credential is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Key prefixes of the providers Switchyard talks to (and of common secret formats): OpenAI
/// `sk-`/`sk-proj-`, Anthropic `sk-ant-`, Google `AIza`, AWS access key ids `AKIA`/`ASIA`, Groq
/// `gsk_`, xAI `xai-`, GitHub `ghp_`/`github_pat_`, Switchyard's own `sk-sy-`, JWTs `eyJ`.
const KEY_PREFIXES: &[&str] = &[
    "sk-",
    "sk_",
    "rk-",
    "AIza",
    "AKIA",
    "ASIA",
    "gsk_",
    "xai-",
    "ghp_",
    "github_pat_",
    "eyJ",
];

/// Header names whose value is a credential: the word after them is always redacted.
const CREDENTIAL_LABELS: &[&str] = &[
    "bearer",
    "basic",
    "authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "apikey",
    "api_key",
    "token",
    "password",
];

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+' | '/')
}

/// Whether `word` looks like a credential: a known key prefix followed by at least 8 more
/// characters, or a run of 32+ token characters mixing letters and digits (hex digests, base64
/// keys). Plain words, numbers and ids shorter than that stay.
fn looks_like_key(word: &str) -> bool {
    if KEY_PREFIXES
        .iter()
        .any(|p| word.starts_with(p) && word.len() >= p.len() + 8)
    {
        return true;
    }
    word.len() >= 32
        && word.chars().any(|c| c.is_ascii_digit())
        && word.chars().any(|c| c.is_ascii_alphabetic())
}

/// `text` with every credential replaced by [`REDACTED`]: anything shaped like an API key, and
/// the value after `Bearer`, `Authorization:`, `x-api-key:`, `api-key=` and the like. Used on
/// upstream error text before it reaches a client, a log line or the ledger (an upstream's 401
/// body may echo the key it was sent).
pub fn redact_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut redact_next = false;
    let mut rest = text;
    while !rest.is_empty() {
        let start = rest.find(is_token_char).unwrap_or(rest.len());
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        if rest.is_empty() {
            break;
        }
        let end = rest.find(|c: char| !is_token_char(c)).unwrap_or(rest.len());
        let word = &rest[..end];
        let bare = word.trim_end_matches('.');
        let is_label = CREDENTIAL_LABELS.contains(&bare.to_ascii_lowercase().as_str());
        if redact_next && !bare.is_empty() && !is_label {
            out.push_str(REDACTED);
            out.push_str(&word[bare.len()..]);
            redact_next = false;
        } else if looks_like_key(bare) {
            out.push_str(REDACTED);
            out.push_str(&word[bare.len()..]);
        } else {
            out.push_str(word);
            // `Authorization: Bearer X` redacts X (a label after a label passes the duty on).
            redact_next = is_label;
        }
        rest = &rest[end..];
    }
    out
}

#[cfg(test)]
mod redact_tests {
    use super::*;

    #[test]
    fn keys_and_credential_values_are_redacted() {
        let cases = [
            (
                "Incorrect API key provided: Bearer sk-upstream-abcdef1234567890.",
                "Incorrect API key provided: Bearer [redacted].",
            ),
            (
                "Authorization: Bearer abc123",
                "Authorization: Bearer [redacted]",
            ),
            (
                "x-api-key: hunter2 rejected",
                "x-api-key: [redacted] rejected",
            ),
            (
                "API key not valid: AIzaSyA1234567890abcdefghij",
                "API key not valid: [redacted]",
            ),
            (
                "The security token AKIAIOSFODNN7EXAMPLE is invalid",
                "The security token [redacted] is invalid",
            ),
            (
                "key sk-ant-api03-XXXXXXXXXXXX, id 0123456789abcdef0123456789abcdef01",
                "key [redacted], id [redacted]",
            ),
            (
                "{\"error\":{\"message\":\"api_key=sk-proj-zzzzzzzzzzzzzz\"}}",
                "{\"error\":{\"message\":\"api_key=[redacted]\"}}",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(redact_credentials(input), want, "{input}");
        }
    }

    #[test]
    fn ordinary_text_is_unchanged() {
        for text in [
            "This model's maximum context length is 128000 tokens. However, you requested 130000 tokens.",
            "Rate limit reached for gpt-4o-mini in organization org-123 on requests per min (RPM): Limit 500.",
            "model `claude-3-5-haiku-20241022` not found",
            "",
        ] {
            assert_eq!(redact_credentials(text), text);
        }
    }
}
