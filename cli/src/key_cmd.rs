//! `switchyard key new|hash`: mint an API key and print the config entry that admits it.

use clap::Subcommand;
use rand::Rng as _;
use rand::distr::Alphanumeric;
use switchyard_schemas::tenancy::{sha256_hex, valid_id};

/// `switchyard key …`.
#[derive(Subcommand)]
pub enum KeyAction {
    /// Print a new random key (`sk-sy-` + 40 letters/digits) and the `keys:` entry for it. Only
    /// its SHA-256 goes in the config; the key itself is shown once.
    New {
        /// Key id (`[A-Za-z0-9_-]`, ≤ 64), recorded on usage and naming budgets.
        #[arg(long)]
        id: String,
        /// Tenant the key belongs to.
        #[arg(long)]
        tenant: String,
    },
    /// Print the SHA-256 (`key_sha256`) of the key read from standard input.
    Hash,
}

/// Runs the action; the output goes to stdout.
pub fn run(action: KeyAction) -> Result<(), String> {
    match action {
        KeyAction::New { id, tenant } => {
            for (name, v) in [("--id", &id), ("--tenant", &tenant)] {
                if !valid_id(v) {
                    return Err(format!("{name} `{v}` must be 1-64 of [A-Za-z0-9_-]"));
                }
            }
            let secret: String = rand::rng()
                .sample_iter(Alphanumeric)
                .take(40)
                .map(char::from)
                .collect();
            let key = format!("sk-sy-{secret}");
            println!("key (shown once): {key}\n");
            println!("keys:");
            println!("  - id: {id}");
            println!("    tenant: {tenant}");
            println!("    key_sha256: {}", sha256_hex(&key));
            println!(
                "    # budget: {{daily_usd: 50, monthly_usd: 1000, tokens_per_minute: 200000}}"
            );
            Ok(())
        }
        KeyAction::Hash => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .map_err(|e| format!("reading the key from stdin: {e}"))?;
            let key = line.trim();
            if key.is_empty() {
                return Err("no key on standard input".into());
            }
            println!("{}", sha256_hex(key));
            Ok(())
        }
    }
}
