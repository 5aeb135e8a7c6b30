//! `switchyard balance topup|show`: a tenant's prepaid balance (docs/budgets.md, "Prepaid
//! balances") through a running gateway's admin API; prints the JSON answer.

use crate::key_cmd::{AdminApi, call};
use clap::Subcommand;
use serde_json::json;

/// `switchyard balance …`.
#[derive(Subcommand)]
pub(crate) enum BalanceAction {
    /// Top up a tenant's balance (`POST /admin/tenants/{id}/balance/topups`); repeating it with
    /// the same `--id` records it once.
    Topup {
        /// The tenant.
        #[arg(long)]
        tenant: String,
        /// The amount, USD (exact decimal, e.g. `25.00`).
        #[arg(long)]
        amount_usd: String,
        /// The top-up id (e.g. the invoice number; default generated).
        #[arg(long)]
        id: Option<String>,
        /// A note kept with the ledger row.
        #[arg(long)]
        note: Option<String>,
        #[command(flatten)]
        api: AdminApi,
    },
    /// Show a tenant's balance, reservations and latest movements
    /// (`GET /admin/tenants/{id}/balance`).
    Show {
        /// The tenant.
        #[arg(long)]
        tenant: String,
        /// Movements shown (1..=1000).
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[command(flatten)]
        api: AdminApi,
    },
}

/// Runs one action; the error is printed by the caller.
pub(crate) async fn run(action: BalanceAction) -> Result<(), String> {
    let v = match action {
        BalanceAction::Topup {
            tenant,
            amount_usd,
            id,
            note,
            api,
        } => {
            let mut body = json!({"amount_usd": amount_usd});
            if let Some(id) = id {
                body["id"] = json!(id);
            }
            if let Some(note) = note {
                body["note"] = json!(note);
            }
            let path = format!("/admin/tenants/{}/balance/topups", segment(&tenant));
            call(&api, reqwest::Method::POST, &path, Some(body)).await?
        }
        BalanceAction::Show { tenant, limit, api } => {
            let path = format!("/admin/tenants/{}/balance?limit={limit}", segment(&tenant));
            call(&api, reqwest::Method::GET, &path, None).await?
        }
    };
    println!("{v:#}");
    Ok(())
}

/// `s` as one URL path segment (tenant ids are `[A-Za-z0-9_-]`; anything else is escaped).
fn segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}
