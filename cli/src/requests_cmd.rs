//! `switchyard requests tail|export`: the audit log (docs/audit.md) through a running gateway's
//! admin API (`GET /admin/requests`), one JSON record per line.

use crate::key_cmd::{AdminApi, call};
use clap::{Args, Subcommand};
use serde_json::Value;
use std::collections::HashSet;
use std::io::Write;

/// The filters of `GET /admin/requests`.
#[derive(Args, Clone, Default)]
pub(crate) struct Filters {
    /// Records at or after this time (RFC 3339 or YYYY-MM-DD).
    #[arg(long)]
    from: Option<String>,
    /// Records before this time (RFC 3339, or YYYY-MM-DD meaning its next midnight).
    #[arg(long)]
    to: Option<String>,
    /// Key id.
    #[arg(long)]
    key: Option<String>,
    /// Tenant id.
    #[arg(long)]
    tenant: Option<String>,
    /// Standard model id.
    #[arg(long)]
    model: Option<String>,
    /// `ok`, `error`, `cancelled` or an HTTP status (`429`).
    #[arg(long)]
    status: Option<String>,
}

/// `switchyard requests …`.
#[derive(Subcommand)]
pub(crate) enum RequestsAction {
    /// Print the latest `--lines` records (oldest first); with `--follow`, keep printing new
    /// ones (polling every `--interval-ms`) until interrupted.
    Tail {
        /// Records printed first.
        #[arg(long, short = 'n', default_value_t = 20)]
        lines: u32,
        /// Keep printing new records.
        #[arg(long, short = 'f')]
        follow: bool,
        /// Poll interval with `--follow`, ms.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        #[command(flatten)]
        filters: Filters,
        #[command(flatten)]
        api: AdminApi,
    },
    /// Print every matching record (newest first), following the cursor to the last page.
    Export {
        /// Write to this file instead of stdout.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        #[command(flatten)]
        filters: Filters,
        #[command(flatten)]
        api: AdminApi,
    },
}

/// Runs one action; the error is printed by the caller.
pub(crate) async fn run(action: RequestsAction) -> Result<(), String> {
    match action {
        RequestsAction::Export { out, filters, api } => {
            let mut sink: Box<dyn Write> = match &out {
                Some(p) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?,
                )),
                None => Box::new(std::io::stdout().lock()),
            };
            let mut cursor: Option<String> = None;
            loop {
                let page = fetch(&api, &filters, cursor.as_deref(), 1000).await?;
                for r in records(&page) {
                    writeln!(sink, "{r}").map_err(|e| e.to_string())?;
                }
                match page["next_cursor"].as_str() {
                    Some(c) => cursor = Some(c.to_owned()),
                    None => break,
                }
            }
            sink.flush().map_err(|e| e.to_string())
        }
        RequestsAction::Tail {
            lines,
            follow,
            interval_ms,
            filters,
            api,
        } => {
            let page = fetch(&api, &filters, None, lines.clamp(1, 1000)).await?;
            let mut seen: HashSet<String> = HashSet::new();
            let mut latest: Option<u64> = None;
            let mut show = |batch: Vec<Value>, latest: &mut Option<u64>| {
                for r in batch.into_iter().rev() {
                    let id = r["request_id"].as_str().unwrap_or_default().to_owned();
                    if seen.insert(id) {
                        *latest = (*latest).max(r["ts_ms"].as_u64());
                        println!("{r}");
                    }
                }
            };
            show(records(&page), &mut latest);
            if !follow {
                return Ok(());
            }
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(interval_ms)).await;
                let mut f = filters.clone();
                if let Some(ts) = latest {
                    f.from = Some(switchyard_ingress::usage_api::rfc3339(ts));
                }
                let page = fetch(&api, &f, None, 1000).await?;
                show(records(&page), &mut latest);
            }
        }
    }
}

fn records(page: &Value) -> Vec<Value> {
    page["data"].as_array().cloned().unwrap_or_default()
}

/// One page.
async fn fetch(
    api: &AdminApi,
    f: &Filters,
    cursor: Option<&str>,
    limit: u32,
) -> Result<Value, String> {
    let mut url = reqwest::Url::parse("http://x/admin/requests").map_err(|e| e.to_string())?;
    {
        let mut q = url.query_pairs_mut();
        for (name, value) in [
            ("from", &f.from),
            ("to", &f.to),
            ("key", &f.key),
            ("tenant", &f.tenant),
            ("model", &f.model),
            ("status", &f.status),
        ] {
            if let Some(v) = value {
                q.append_pair(name, v);
            }
        }
        if let Some(c) = cursor {
            q.append_pair("cursor", c);
        }
        q.append_pair("limit", &limit.to_string());
    }
    let path = format!("/admin/requests?{}", url.query().unwrap_or_default());
    call(api, reqwest::Method::GET, &path, None).await
}
