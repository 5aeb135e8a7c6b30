//! The one place NATS connections are made: every service (`up`'s in-process ones included),
//! `config push`/`show` and `cache purge` connect through [`connect`] with a
//! [`NatsConfig`] (the config's `nats:` section overridden by [`NatsArgs`]).

use std::path::PathBuf;
use switchyard_schemas::Secret;
use switchyard_schemas::nats_config::NatsConfig;

/// NATS credentials and TLS from flags or `SWITCHYARD_NATS_*` variables; each set field
/// overrides the config file's `nats:` section. Prefer the variables for secrets (flags show in
/// the process list); their values are never printed in `--help`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct NatsArgs {
    /// NATS user name (with --nats-password).
    #[arg(long, env = "SWITCHYARD_NATS_USER")]
    pub nats_user: Option<String>,
    /// NATS password.
    #[arg(long, env = "SWITCHYARD_NATS_PASSWORD", hide_env_values = true)]
    pub nats_password: Option<String>,
    /// NATS authentication token.
    #[arg(long, env = "SWITCHYARD_NATS_TOKEN", hide_env_values = true)]
    pub nats_token: Option<String>,
    /// NATS NKey seed (`SU…`).
    #[arg(long, env = "SWITCHYARD_NATS_NKEY", hide_env_values = true)]
    pub nats_nkey: Option<String>,
    /// NATS `.creds` file (user JWT + NKey seed).
    #[arg(long, env = "SWITCHYARD_NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,
    /// Reply-subject prefix of this connection (default `_INBOX`).
    #[arg(long, env = "SWITCHYARD_NATS_INBOX_PREFIX")]
    pub nats_inbox_prefix: Option<String>,
    /// Require TLS to the NATS server.
    #[arg(long, env = "SWITCHYARD_NATS_TLS")]
    pub nats_tls: bool,
    /// PEM CA file the NATS server's certificate is checked against.
    #[arg(long, env = "SWITCHYARD_NATS_TLS_CA")]
    pub nats_tls_ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (with --nats-tls-key).
    #[arg(long, env = "SWITCHYARD_NATS_TLS_CERT")]
    pub nats_tls_cert: Option<PathBuf>,
    /// PEM private key of --nats-tls-cert.
    #[arg(long, env = "SWITCHYARD_NATS_TLS_KEY")]
    pub nats_tls_key: Option<PathBuf>,
    /// JetStream replicas of the streams and KV buckets this process creates (1 to 5; 3 on a
    /// three-node cluster).
    #[arg(long, env = "SWITCHYARD_NATS_REPLICAS")]
    pub nats_replicas: Option<usize>,
}

impl NatsArgs {
    /// The flags as a `nats:` section (unset fields `None`).
    pub fn to_config(&self) -> NatsConfig {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let mut c = NatsConfig {
            user: self.nats_user.clone(),
            password: self.nats_password.clone().map(Secret::new),
            token: self.nats_token.clone().map(Secret::new),
            nkey_seed: self.nats_nkey.clone().map(Secret::new),
            credentials_file: path(&self.nats_creds),
            inbox_prefix: self.nats_inbox_prefix.clone(),
            replicas: self.nats_replicas,
            ..Default::default()
        };
        c.tls.required = self.nats_tls;
        c.tls.ca_file = path(&self.nats_tls_ca);
        c.tls.cert_file = path(&self.nats_tls_cert);
        c.tls.key_file = path(&self.nats_tls_key);
        c
    }

    /// `file` (the config's `nats:` section) with the flags set here replacing its fields.
    pub fn over(&self, file: &NatsConfig) -> NatsConfig {
        file.clone().overridden_by(self.to_config())
    }
}

/// Why a NATS connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NatsConnectError {
    /// The `nats:` settings are contradictory.
    #[error(transparent)]
    Config(#[from] switchyard_schemas::nats_config::NatsConfigError),
    /// The `.creds` file could not be read or parsed.
    #[error("NATS credentials file {path}: {source}")]
    Creds {
        /// The file.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
    /// The server refused or could not be reached (authorization failures included).
    #[error("connecting to NATS at {url}: {message}")]
    Connect {
        /// The URL.
        url: String,
        /// async-nats's description.
        message: String,
    },
}

/// async-nats options for `cfg` (credentials, TLS, inbox prefix), named `name` in the server's
/// connection list.
pub async fn options(
    name: &str,
    cfg: &NatsConfig,
) -> Result<async_nats::ConnectOptions, NatsConnectError> {
    cfg.validate()?;
    let mut o = async_nats::ConnectOptions::new().name(name);
    if let (Some(user), Some(password)) = (&cfg.user, &cfg.password) {
        o = o.user_and_password(user.clone(), password.expose().to_owned());
    }
    if let Some(token) = &cfg.token {
        o = o.token(token.expose().to_owned());
    }
    if let Some(seed) = &cfg.nkey_seed {
        o = o.nkey(seed.expose().to_owned());
    }
    if let Some(path) = &cfg.credentials_file {
        o = o
            .credentials_file(path)
            .await
            .map_err(|source| NatsConnectError::Creds {
                path: path.clone(),
                source,
            })?;
    }
    if let Some(prefix) = &cfg.inbox_prefix {
        o = o.custom_inbox_prefix(prefix);
    }
    if cfg.tls.required {
        o = o.require_tls(true);
    }
    if let Some(ca) = &cfg.tls.ca_file {
        o = o.add_root_certificates(PathBuf::from(ca));
    }
    if let (Some(cert), Some(key)) = (&cfg.tls.cert_file, &cfg.tls.key_file) {
        o = o.add_client_certificate(PathBuf::from(cert), PathBuf::from(key));
    }
    Ok(o)
}

/// Connects to `url` as `name` with `cfg`'s credentials and TLS. `url` may list several servers
/// separated by commas (`nats://127.0.0.1:4222,nats://127.0.0.1:4223`, the nodes of a cluster):
/// the client connects to one and reconnects to the others when it goes away (it also learns the
/// cluster's other nodes from the server's INFO).
pub async fn connect(
    url: &str,
    name: &str,
    cfg: &NatsConfig,
) -> Result<async_nats::Client, NatsConnectError> {
    let addrs = url
        .split(',')
        .map(|u| u.trim().parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| NatsConnectError::Connect {
            url: url.to_owned(),
            message: e.to_string(),
        })?;
    options(name, cfg)
        .await?
        .connect(addrs)
        .await
        .map_err(|e| NatsConnectError::Connect {
            url: url.to_owned(),
            message: e.to_string(),
        })
}
