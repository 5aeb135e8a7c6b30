//! Credentials that never sit in config in clear: `env:NAME` references and values encrypted
//! with AES-256-GCM (`enc:v1:…`) under a master key from the environment.
//!
//! - `env:NAME`: the value of environment variable `NAME`, read only by the process that uses
//!   the credential (a worker), unlike `${NAME}`, which every service expands when it parses.
//! - `enc:v1:<base64(nonce || ciphertext || tag)>`: AES-256-GCM (NIST SP 800-38D) with a random
//!   96-bit nonce and the 128-bit tag, no associated data; standard base64 with padding (RFC 4648
//!   §4). The key is [`MASTER_KEY_ENV`], 32 bytes in standard base64.
//!
//! Resolved values are [`Secret`]s: they never print.

use crate::secret::Secret;
use aes_gcm::aead::{Aead, KeyInit, OsRng, rand_core::RngCore as _};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

/// Prefix of an encrypted value.
pub const ENC_PREFIX: &str = "enc:v1:";
/// Prefix of an environment reference.
pub const ENV_PREFIX: &str = "env:";
/// The environment variable holding the master key (32 bytes, standard base64).
pub const MASTER_KEY_ENV: &str = "SWITCHYARD_MASTER_KEY";
/// AES-GCM nonce length, bytes (96 bits, NIST SP 800-38D §8.2 recommendation).
const NONCE_LEN: usize = 12;

/// Why a credential could not be resolved or sealed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The master key variable is not 32 bytes of base64.
    #[error("{var} must be 32 bytes in standard base64 (`openssl rand -base64 32`): {reason}")]
    BadMasterKey {
        /// The variable.
        var: String,
        /// What is wrong (never the value).
        reason: String,
    },
    /// An `enc:v1:` value but no master key.
    #[error("an encrypted value (enc:v1:…) needs the master key in {MASTER_KEY_ENV}")]
    NoMasterKey,
    /// The value does not decrypt under this master key (wrong key or altered value).
    #[error("cannot decrypt the enc:v1 value: wrong master key or corrupted value")]
    Decrypt,
    /// Not `enc:v1:` + base64 of at least nonce and tag.
    #[error("malformed enc:v1 value")]
    Malformed,
    /// An `env:NAME` reference to an unset or empty variable.
    #[error("environment variable `{0}` (env: reference) is not set")]
    EnvUnset(String),
}

/// The AES-256 master key. Never prints.
#[derive(Clone)]
pub struct MasterKey(Box<Aes256Gcm>);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey([redacted])")
    }
}

impl MasterKey {
    /// Decodes a 32-byte key from standard base64; `var` names its source in errors.
    pub fn from_base64(var: &str, text: &str) -> Result<Self, SealError> {
        let bad = |reason: &str| SealError::BadMasterKey {
            var: var.to_owned(),
            reason: reason.to_owned(),
        };
        let bytes = B64
            .decode(text.trim())
            .map_err(|_| bad("not valid base64"))?;
        if bytes.len() != 32 {
            return Err(bad(&format!("decodes to {} bytes, not 32", bytes.len())));
        }
        let cipher = Aes256Gcm::new_from_slice(&bytes).map_err(|_| bad("wrong length"))?;
        Ok(Self(Box::new(cipher)))
    }

    /// The key in environment variable `var`; `Ok(None)` when it is unset or empty.
    pub fn from_env(var: &str) -> Result<Option<Self>, SealError> {
        match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => Self::from_base64(var, &v).map(Some),
            _ => Ok(None),
        }
    }

    /// A new random key and its base64 text (for `switchyard secret keygen` and tests).
    pub fn generate() -> (Self, Secret) {
        let mut bytes = [0u8; 32];
        OsRng.fill_bytes(&mut bytes);
        let text = B64.encode(bytes);
        match Self::from_base64("generated", &text) {
            Ok(k) => (k, Secret::new(text)),
            // 32 bytes always make a key.
            Err(_) => unreachable!("a 32-byte key is valid"),
        }
    }

    /// `enc:v1:…` of `plaintext` under a fresh random nonce.
    pub fn encrypt(&self, plaintext: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        OsRng.fill_bytes(&mut nonce);
        // Encryption fails only for plaintexts over 64 GiB (SP 800-38D): not a credential.
        let ct = self
            .0
            .encrypt(Nonce::from_slice(&nonce), plaintext.as_bytes())
            .unwrap_or_default();
        let mut out = nonce.to_vec();
        out.extend_from_slice(&ct);
        format!("{ENC_PREFIX}{}", B64.encode(out))
    }

    /// The plaintext of an `enc:v1:…` value.
    pub fn decrypt(&self, value: &str) -> Result<Secret, SealError> {
        let body = value
            .trim()
            .strip_prefix(ENC_PREFIX)
            .ok_or(SealError::Malformed)?;
        let bytes = B64.decode(body).map_err(|_| SealError::Malformed)?;
        // Nonce plus the 16-byte tag at least.
        if bytes.len() < NONCE_LEN + 16 {
            return Err(SealError::Malformed);
        }
        let (nonce, ct) = bytes.split_at(NONCE_LEN);
        let pt = self
            .0
            .decrypt(Nonce::from_slice(nonce), ct)
            .map_err(|_| SealError::Decrypt)?;
        String::from_utf8(pt)
            .map(Secret::new)
            .map_err(|_| SealError::Decrypt)
    }
}

/// Whether `value` is a reference rather than a credential in clear: `${…}` interpolation,
/// `env:NAME`, `enc:v1:…`, the `[redacted]` placeholder, or empty.
pub fn is_reference(value: &str) -> bool {
    value.is_empty()
        || value.contains("${")
        || value.starts_with(ENV_PREFIX)
        || value.starts_with(ENC_PREFIX)
        || value == crate::secret::REDACTED
}

/// Resolves one credential: `env:NAME` from `env`, `enc:v1:` with `master`; anything else is
/// returned as given.
pub fn resolve(
    value: &Secret,
    env: &impl Fn(&str) -> Option<String>,
    master: Option<&MasterKey>,
) -> Result<Secret, SealError> {
    let v = value.expose();
    if let Some(name) = v.strip_prefix(ENV_PREFIX) {
        return match env(name) {
            Some(s) if !s.is_empty() => Ok(Secret::new(s)),
            _ => Err(SealError::EnvUnset(name.to_owned())),
        };
    }
    if v.starts_with(ENC_PREFIX) {
        return master.ok_or(SealError::NoMasterKey)?.decrypt(v);
    }
    Ok(value.clone())
}

/// Re-encrypts every `enc:v1:…` token of `text` from `old` to `new`, leaving everything else
/// (comments, layout) as it was. Returns the new text and how many values changed.
pub fn rotate_text(
    text: &str,
    old: &MasterKey,
    new: &MasterKey,
) -> Result<(String, usize), SealError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut n = 0;
    while let Some(at) = rest.find(ENC_PREFIX) {
        out.push_str(&rest[..at]);
        let token_end = rest[at + ENC_PREFIX.len()..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=')))
            .map_or(rest.len(), |e| at + ENC_PREFIX.len() + e);
        let token = &rest[at..token_end];
        let plain = old.decrypt(token)?;
        out.push_str(&new.encrypt(plain.expose()));
        n += 1;
        rest = &rest[token_end..];
    }
    out.push_str(rest);
    Ok((out, n))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trip_wrong_key_and_tampering() {
        let (k, text) = MasterKey::generate();
        let k2 = MasterKey::from_base64("K", text.expose()).unwrap();
        let enc = k.encrypt("sk-upstream-123");
        assert!(enc.starts_with(ENC_PREFIX));
        assert!(!enc.contains("sk-upstream"));
        assert_ne!(enc, k.encrypt("sk-upstream-123"), "fresh nonce each time");
        assert_eq!(k2.decrypt(&enc).unwrap().expose(), "sk-upstream-123");
        let (other, _) = MasterKey::generate();
        assert_eq!(other.decrypt(&enc).unwrap_err(), SealError::Decrypt);
        let mut bytes = B64.decode(&enc[ENC_PREFIX.len()..]).unwrap();
        bytes[20] ^= 1;
        let tampered = format!("{ENC_PREFIX}{}", B64.encode(bytes));
        assert_eq!(k.decrypt(&tampered).unwrap_err(), SealError::Decrypt);
        assert_eq!(k.decrypt("enc:v1:AAAA").unwrap_err(), SealError::Malformed);
        assert_eq!(format!("{k:?}"), "MasterKey([redacted])");
    }

    #[test]
    fn master_key_must_be_32_bytes() {
        let e =
            MasterKey::from_base64("SWITCHYARD_MASTER_KEY", &B64.encode([0u8; 16])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "SWITCHYARD_MASTER_KEY must be 32 bytes in standard base64 (`openssl rand -base64 \
             32`): decodes to 16 bytes, not 32"
        );
        assert!(MasterKey::from_base64("K", "not base64!").is_err());
    }

    #[test]
    fn references_resolve() {
        let (k, _) = MasterKey::generate();
        let env = |n: &str| (n == "OPENAI_KEY").then(|| "sk-env".to_owned());
        let r = |v: &str, m: Option<&MasterKey>| resolve(&Secret::new(v), &env, m);
        assert_eq!(r("env:OPENAI_KEY", None).unwrap().expose(), "sk-env");
        assert_eq!(
            r("env:NOPE", None).unwrap_err(),
            SealError::EnvUnset("NOPE".into())
        );
        let enc = k.encrypt("sk-sealed");
        assert_eq!(r(&enc, Some(&k)).unwrap().expose(), "sk-sealed");
        assert_eq!(r(&enc, None).unwrap_err(), SealError::NoMasterKey);
        assert_eq!(r("plain", None).unwrap().expose(), "plain");
        assert!(is_reference("env:X") && is_reference("${X}") && is_reference(&enc));
        assert!(!is_reference("sk-literal"));
    }

    #[test]
    fn rotation_keeps_the_text_around_the_values() {
        let (old, _) = MasterKey::generate();
        let (new, _) = MasterKey::generate();
        let text = format!(
            "# comment\ntargets:\n  - api_key: {}\n  - api_key: \"{}\"\n",
            old.encrypt("a"),
            old.encrypt("b")
        );
        let (rotated, n) = rotate_text(&text, &old, &new).unwrap();
        assert_eq!(n, 2);
        assert!(rotated.starts_with("# comment\ntargets:\n  - api_key: enc:v1:"));
        let values: Vec<String> = rotated
            .split(ENC_PREFIX)
            .skip(1)
            .map(|s| {
                let end = s.find(['\n', '"']).unwrap();
                new.decrypt(&format!("{ENC_PREFIX}{}", &s[..end]))
                    .unwrap()
                    .expose()
                    .to_owned()
            })
            .collect();
        assert_eq!(values, ["a", "b"]);
        assert_eq!(
            rotate_text(&rotated, &old, &new).unwrap_err(),
            SealError::Decrypt
        );
    }
}
