//! How a service authenticates to NATS and secures the connection: the `nats:` section of the
//! gateway config. The `switchyard` binary turns it into async-nats `ConnectOptions`
//! (`switchyard::nats::connect`); CLI flags and `SWITCHYARD_NATS_*` variables override each field.
//!
//! Authentication methods follow nats-server's (docs.nats.io, "Authentication"): user and
//! password, a token, an NKey seed (`SU…`), or a `.creds` file (user JWT + NKey seed, decentralised
//! auth). At most one of them may be given.

use crate::secret::Secret;
use serde::{Deserialize, Serialize};

/// The `nats:` section. Every field is optional; empty = anonymous, plain TCP (the embedded
/// server of `switchyard up` hands each of its services its own generated credentials instead).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsConfig {
    /// User name (with `password`).
    pub user: Option<String>,
    /// Password of `user`.
    pub password: Option<Secret>,
    /// Authentication token.
    pub token: Option<Secret>,
    /// NKey seed (`SU…`, 58 characters) whose public key the server lists.
    pub nkey_seed: Option<Secret>,
    /// Path of a `.creds` file (user JWT and NKey seed, as `nsc` writes them).
    pub credentials_file: Option<String>,
    /// Prefix of this connection's reply subjects (default `_INBOX`); a server that limits each
    /// user to its own `_INBOX.<user>.>` needs the matching prefix here.
    pub inbox_prefix: Option<String>,
    /// TLS to the server.
    #[serde(default)]
    pub tls: NatsTls,
    /// Copies JetStream keeps of each stream and KV bucket this process creates (default 1;
    /// 3 on a three-node cluster; at most 5). See [`crate::replicas`].
    pub replicas: Option<usize>,
}

/// TLS settings of the NATS connection (async-nats uses rustls).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsTls {
    /// Refuse a server that does not offer TLS (a `tls://` URL implies it).
    pub required: bool,
    /// PEM file of the CA(s) that signed the server certificate (default: the system roots).
    pub ca_file: Option<String>,
    /// PEM client certificate for mutual TLS (with `key_file`).
    pub cert_file: Option<String>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<String>,
}

/// A `nats:` section that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NatsConfigError {
    /// More than one authentication method.
    #[error("nats: give one of user/password, token, nkey_seed or credentials_file (got {0})")]
    ManyMethods(String),
    /// `user` without `password` or the other way round.
    #[error("nats: `user` and `password` go together")]
    HalfUser,
    /// A client certificate without its key or the other way round.
    #[error("nats.tls: `cert_file` and `key_file` go together")]
    HalfClientCert,
    /// `replicas` outside 1..=5.
    #[error("nats.replicas must be 1 to 5 (got {0})")]
    Replicas(usize),
}

impl NatsConfig {
    /// Checks that at most one authentication method is set and pairs are complete.
    pub fn validate(&self) -> Result<(), NatsConfigError> {
        if self.user.is_some() != self.password.is_some() {
            return Err(NatsConfigError::HalfUser);
        }
        if self.tls.cert_file.is_some() != self.tls.key_file.is_some() {
            return Err(NatsConfigError::HalfClientCert);
        }
        if let Some(n) = self.replicas
            && !(1..=crate::replicas::MAX_REPLICAS).contains(&n)
        {
            return Err(NatsConfigError::Replicas(n));
        }
        let methods: Vec<&str> = [
            ("user", self.user.is_some()),
            ("token", self.token.is_some()),
            ("nkey_seed", self.nkey_seed.is_some()),
            ("credentials_file", self.credentials_file.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        if methods.len() > 1 {
            return Err(NatsConfigError::ManyMethods(methods.join(", ")));
        }
        Ok(())
    }

    /// Whether the section holds a secret value (password, token or seed) itself, rather than
    /// a file path.
    pub fn holds_secret(&self) -> bool {
        self.password.is_some() || self.token.is_some() || self.nkey_seed.is_some()
    }

    /// `self` with every field `over` sets replacing ours (CLI flags and environment over the
    /// file). Setting an authentication method in `over` clears the others of `self`.
    pub fn overridden_by(mut self, over: NatsConfig) -> NatsConfig {
        if over.user.is_some()
            || over.token.is_some()
            || over.nkey_seed.is_some()
            || over.credentials_file.is_some()
        {
            self.user = None;
            self.password = None;
            self.token = None;
            self.nkey_seed = None;
            self.credentials_file = None;
        }
        macro_rules! take {
            ($($f:ident).+) => {
                if over.$($f).+.is_some() {
                    self.$($f).+ = over.$($f).+;
                }
            };
        }
        take!(user);
        take!(password);
        take!(token);
        take!(nkey_seed);
        take!(credentials_file);
        take!(inbox_prefix);
        take!(replicas);
        take!(tls.ca_file);
        take!(tls.cert_file);
        take!(tls.key_file);
        self.tls.required |= over.tls.required;
        self
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn one_method_only_and_pairs() {
        let c: NatsConfig =
            serde_json::from_value(serde_json::json!({"user": "u", "password": "p"})).unwrap();
        assert_eq!(c.validate(), Ok(()));
        assert!(c.holds_secret());
        let c: NatsConfig =
            serde_json::from_value(serde_json::json!({"user": "u", "password": "p", "token": "t"}))
                .unwrap();
        assert_eq!(
            c.validate(),
            Err(NatsConfigError::ManyMethods("user, token".into()))
        );
        let c: NatsConfig = serde_json::from_value(serde_json::json!({"user": "u"})).unwrap();
        assert_eq!(c.validate(), Err(NatsConfigError::HalfUser));
        let c: NatsConfig =
            serde_json::from_value(serde_json::json!({"tls": {"cert_file": "c.pem"}})).unwrap();
        assert_eq!(c.validate(), Err(NatsConfigError::HalfClientCert));
        let c: NatsConfig = serde_json::from_value(serde_json::json!({"replicas": 3})).unwrap();
        assert_eq!((c.validate(), c.replicas), (Ok(()), Some(3)));
        let c: NatsConfig = serde_json::from_value(serde_json::json!({"replicas": 6})).unwrap();
        assert_eq!(c.validate(), Err(NatsConfigError::Replicas(6)));
        let c: NatsConfig = serde_json::from_value(serde_json::json!({"replicas": 0})).unwrap();
        assert_eq!(c.validate(), Err(NatsConfigError::Replicas(0)));
        assert!(serde_json::from_value::<NatsConfig>(serde_json::json!({"pasword": "x"})).is_err());
    }

    #[test]
    fn secrets_never_serialise_and_overrides_replace_the_method() {
        let c: NatsConfig = serde_json::from_value(
            serde_json::json!({"token": "s3cret", "tls": {"required": true}}),
        )
        .unwrap();
        let text = serde_json::to_string(&c).unwrap();
        assert!(!text.contains("s3cret"), "{text}");
        let over = NatsConfig {
            user: Some("ingress".into()),
            password: Some(Secret::new("pw")),
            ..Default::default()
        };
        let merged = c.overridden_by(over);
        assert_eq!(merged.token, None);
        assert_eq!(merged.user.as_deref(), Some("ingress"));
        assert!(merged.tls.required);
    }
}
