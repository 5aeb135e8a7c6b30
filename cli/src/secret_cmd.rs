//! `switchyard secret keygen|encrypt|rotate`: the master key and `enc:v1:` values
//! (`switchyard_schemas::sealed`, docs/security.md "Secrets").

use clap::Subcommand;
use std::io::Read as _;
use std::path::PathBuf;
use switchyard::nats::NatsArgs;
use switchyard::reload;
use switchyard_schemas::sealed::{MASTER_KEY_ENV, MasterKey, rotate_text};

/// `switchyard secret …` (parsed once: variant sizes do not matter).
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub(crate) enum SecretAction {
    /// Print a new random master key (32 bytes, base64) for `SWITCHYARD_MASTER_KEY`.
    Keygen,
    /// Encrypt the credential read from standard input under `SWITCHYARD_MASTER_KEY`; prints
    /// the `enc:v1:…` value to put in the config (e.g. a target's `api_key`).
    Encrypt,
    /// Re-encrypt every `enc:v1:` value from the old master key to the new one, in a config
    /// file (rewritten in place, layout kept) and/or the live config (`--live`).
    Rotate {
        /// Environment variable holding the current master key.
        #[arg(long)]
        old_key_env: String,
        /// Environment variable holding the new master key.
        #[arg(long)]
        new_key_env: String,
        /// Config file to rewrite.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Also rewrite the live config in NATS KV (compare-and-set on its revision).
        #[arg(long)]
        live: bool,
        /// NATS URL (with --live).
        #[arg(long, env = "SWITCHYARD_NATS_URL")]
        nats_url: Option<String>,
        /// NATS credentials (the `admin` identity) for --live.
        #[command(flatten)]
        nats: NatsArgs,
    },
}

fn key_from(var: &str) -> Result<MasterKey, String> {
    MasterKey::from_env(var)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{var} is not set"))
}

/// Runs the action.
pub(crate) async fn run(action: SecretAction) -> Result<(), String> {
    match action {
        SecretAction::Keygen => {
            let (_, text) = MasterKey::generate();
            println!("{}", text.expose());
            Ok(())
        }
        SecretAction::Encrypt => {
            let key = key_from(MASTER_KEY_ENV)?;
            let mut input = String::new();
            std::io::stdin()
                .read_to_string(&mut input)
                .map_err(|e| format!("reading the credential from stdin: {e}"))?;
            let value = input.trim_end_matches(['\n', '\r']);
            if value.is_empty() {
                return Err("no credential on standard input".into());
            }
            println!("{}", key.encrypt(value));
            Ok(())
        }
        SecretAction::Rotate {
            old_key_env,
            new_key_env,
            file,
            live,
            nats_url,
            nats,
        } => {
            let old = key_from(&old_key_env)?;
            let new = key_from(&new_key_env)?;
            if file.is_none() && !live {
                return Err("name what to rotate: --file FILE and/or --live".into());
            }
            if let Some(path) = file {
                let text = crate::read_text(&path)?;
                let (rotated, n) = rotate_text(&text, &old, &new)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                std::fs::write(&path, rotated)
                    .map_err(|e| format!("writing {}: {e}", path.display()))?;
                println!("{}: {n} values re-encrypted", path.display());
            }
            if live {
                let url = nats_url.ok_or("--live needs --nats-url (or SWITCHYARD_NATS_URL)")?;
                let client =
                    switchyard::nats::connect(&url, "switchyard-secret-rotate", &nats.to_config())
                        .await
                        .map_err(|e| e.to_string())?;
                let (version, n) = reload::rotate_live(&client, &old, &new)
                    .await
                    .map_err(|e| e.to_string())?;
                println!("live config: {n} values re-encrypted (version {version})");
            }
            Ok(())
        }
    }
}
