//! `switchyard batch submit|status|list|cancel|results`: the OpenAI Batch API of a running
//! gateway from the command line (the same HTTP calls the `openai` SDK makes).

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// `switchyard batch …`.
#[derive(Args)]
pub(crate) struct BatchArgs {
    /// The gateway's base URL.
    #[arg(
        long,
        env = "SWITCHYARD_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    url: String,
    /// API key (sent as `Authorization: Bearer`).
    #[arg(long, env = "SWITCHYARD_API_KEY", global = true)]
    api_key: Option<String>,
    #[command(subcommand)]
    action: BatchAction,
}

/// The actions.
#[derive(Subcommand)]
pub(crate) enum BatchAction {
    /// Upload FILE.jsonl (one `{"custom_id","method","url","body"}` per line) and start a batch.
    Submit {
        /// The input file.
        file: PathBuf,
        /// `/v1/chat/completions`, `/v1/embeddings` or `/v1/messages`.
        #[arg(long, default_value = "/v1/chat/completions")]
        endpoint: String,
        /// Completion window (`24h`; `<n>s|m|h` up to 168 h).
        #[arg(long, default_value = "24h")]
        window: String,
        /// Wait for the end, with a progress bar (done / failed / total, rate, ETA).
        #[arg(long)]
        wait: bool,
    },
    /// Print a batch as JSON.
    Status {
        /// Batch id.
        id: String,
    },
    /// List recent batches.
    List {
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Cancel a batch (in-flight items finish; the rest do not run).
    Cancel {
        /// Batch id.
        id: String,
    },
    /// Write a finished batch's output (and error lines, if any) to FILE.
    Results {
        /// Batch id.
        id: String,
        /// Where to write the JSONL.
        #[arg(long)]
        out: PathBuf,
    },
}

struct Api {
    http: reqwest::Client,
    url: String,
    key: Option<String>,
}

impl Api {
    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.url));
        match &self.key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    async fn json(&self, r: reqwest::RequestBuilder) -> Result<Value, String> {
        let resp = r.send().await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body: Value = resp.json().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!(
                "{status}: {}",
                body["error"]["message"].as_str().unwrap_or("")
            ));
        }
        Ok(body)
    }

    async fn text(&self, path: &str) -> Result<String, String> {
        let resp = self
            .req(reqwest::Method::GET, path)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("GET {path}: {}", resp.status()));
        }
        resp.text().await.map_err(|e| e.to_string())
    }
}

/// Runs the action; JSON objects go to stdout.
pub(crate) async fn run(args: BatchArgs) -> Result<(), String> {
    let api = Api {
        http: reqwest::Client::new(),
        url: args.url.trim_end_matches('/').to_owned(),
        key: args.api_key,
    };
    let print = |v: &Value| println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    match args.action {
        BatchAction::Submit {
            file,
            endpoint,
            window,
            wait,
        } => {
            let bytes = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let name = file
                .file_name()
                .map_or("input.jsonl".into(), |n| n.to_string_lossy().into_owned());
            let form = reqwest::multipart::Form::new()
                .text("purpose", "batch")
                .part(
                    "file",
                    reqwest::multipart::Part::bytes(bytes).file_name(name),
                );
            let uploaded = api
                .json(api.req(reqwest::Method::POST, "/v1/files").multipart(form))
                .await?;
            let batch = api
                .json(api.req(reqwest::Method::POST, "/v1/batches").json(&serde_json::json!({
                    "input_file_id": uploaded["id"], "endpoint": endpoint, "completion_window": window,
                })))
                .await?;
            if !wait {
                print(&batch);
                return Ok(());
            }
            let id = batch["id"].as_str().unwrap_or_default().to_owned();
            let end = watch(&api, &id).await?;
            print(&end);
        }
        BatchAction::Status { id } => print(
            &api.json(api.req(reqwest::Method::GET, &format!("/v1/batches/{id}")))
                .await?,
        ),
        BatchAction::List { limit } => print(
            &api.json(api.req(reqwest::Method::GET, &format!("/v1/batches?limit={limit}")))
                .await?,
        ),
        BatchAction::Cancel { id } => print(
            &api.json(api.req(reqwest::Method::POST, &format!("/v1/batches/{id}/cancel")))
                .await?,
        ),
        BatchAction::Results { id, out } => {
            let b = api
                .json(api.req(reqwest::Method::GET, &format!("/v1/batches/{id}")))
                .await?;
            let mut text = String::new();
            for field in ["output_file_id", "error_file_id"] {
                if let Some(f) = b[field].as_str() {
                    text.push_str(&api.text(&format!("/v1/files/{f}/content")).await?);
                }
            }
            if text.is_empty() {
                return Err(format!(
                    "batch {id} has no results yet (status {})",
                    b["status"]
                ));
            }
            std::fs::write(&out, &text).map_err(|e| format!("{}: {e}", out.display()))?;
            eprintln!(
                "{} lines written to {}",
                text.lines().count(),
                out.display()
            );
        }
    }
    Ok(())
}

/// Polls a batch until it ends, drawing done / failed / total with rate and ETA.
async fn watch(api: &Api, id: &str) -> Result<Value, String> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} done {msg} ({per_sec}, ETA {eta})",
        )
        .map_err(|e| e.to_string())?,
    );
    loop {
        let b = api
            .json(api.req(reqwest::Method::GET, &format!("/v1/batches/{id}")))
            .await?;
        let c = &b["request_counts"];
        let n = |k: &str| c[k].as_u64().unwrap_or(0);
        bar.set_length(n("total"));
        bar.set_position(n("completed") + n("failed"));
        bar.set_message(format!(
            "{} failed, {}",
            n("failed"),
            b["status"].as_str().unwrap_or("")
        ));
        if matches!(
            b["status"].as_str(),
            Some("completed" | "failed" | "expired" | "cancelled")
        ) {
            bar.finish();
            return Ok(b);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
