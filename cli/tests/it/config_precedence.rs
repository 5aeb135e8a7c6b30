//! Which config wins (issue 14, Deliver 3; docs/deploy.md "Which config wins"): a config
//! pushed to KV does not override the next `up`'s `--listen` (process-local settings come from
//! flags and the local file only; a pushed `nats_url` is ignored too) and `up --config FILE`
//! makes FILE the live config when it differs; a pushed price change is charged on the next
//! request and used for the next budget reservation; `config history` and `config rollback`.

use crate::common::up::{self, admin_cli};
use crate::common::{post_keyed, post_keyless};
use rust_decimal::Decimal;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;
use switchyard_schemas::UsageKind;

/// A catalog pricing `demo/*` at `input`/`output` USD per 1M tokens.
fn catalog(dir: &Path, name: &str, input: &str, output: &str) -> PathBuf {
    let path = dir.join(name);
    let models = ["demo/mock", "demo/first", "demo/pushed", "demo/third"]
        .iter()
        .map(|m| format!("  {m}: {{input: {input}, output: {output}}}\n"))
        .collect::<String>();
    std::fs::write(
        &path,
        format!("currency: USD\nupstream:\n  mock: {{input: 0.5, output: 1}}\nstandard:\n{models}"),
    )
    .unwrap();
    path
}

/// A config with `demo/mock` plus `extra_model`, both on a mock answering 100,000 prompt and
/// 50,000 completion tokens, priced by `pricing`.
fn write_config(dir: &Path, name: &str, extra_model: &str, pricing: &Path, more: Value) -> PathBuf {
    let mut c = json!({
        "pricing_file": pricing.display().to_string(),
        "targets": [{"id": "mock", "provider": "openai",
            "base_url": "builtin:mock/x/prompt_tokens=100000,completion_tokens=50000",
            "upstream_model": "mock"}],
        "models": [{"id": "demo/mock", "targets": ["mock"]}, {"id": extra_model, "targets": ["mock"]}]
    });
    if let (Some(c), Some(more)) = (c.as_object_mut(), more.as_object()) {
        c.extend(more.clone());
    }
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(&c).unwrap()).unwrap();
    path
}

async fn model_ids(base: &str) -> Vec<String> {
    let v: Value = reqwest::get(format!("{base}/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut ids: Vec<String> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

/// Sends one chat request (a new prompt each time: a cache hit would be free) and returns the
/// charge stored for it, USD.
async fn charge_of_next_request(up: &up::Up) -> Decimal {
    // Billing has migrated the ledger once ready (no concurrent migration from here).
    up.wait_ready().await;
    let (base, data_dir) = (&up.base, &up.data_dir);
    let r = post_keyless(
        base,
        &crate::common::chat(
            "demo/mock",
            &format!("price me {}", uuid::Uuid::now_v7()),
            false,
        ),
    )
    .await;
    assert_eq!(r.status(), 200);
    let id = crate::common::request_id(r.headers());
    let ledger =
        switchyard_billing::Ledger::connect(&format!("sqlite://{}/ledger.db", data_dir.display()))
            .await
            .unwrap();
    crate::common::eventually(Duration::from_secs(10), || {
        let ledger = ledger.clone();
        async move { ledger.cost_of(id, UsageKind::Charge, 0).await.unwrap() }
    })
    .await
}

/// `switchyard ARGS…` as the admin against `nats_url`: asserts it succeeds printing `said`, then
/// waits (up to 10 s) for `up` to log that it reloaded config `version`.
async fn config_cli_reloads(
    up: &mut up::Up,
    nats_url: &str,
    args: &[&str],
    said: &str,
    version: u32,
) {
    let (ok, out, err) = admin_cli(&up.data_dir, nats_url, args).await;
    assert!(ok, "{err}");
    assert_eq!(out, said);
    up.wait_log(
        &format!("config reloaded version={version}"),
        Duration::from_secs(10),
    )
    .await;
}

/// `switchyard config push FILE` as the admin: it says `version` is live and `up` reloads it.
async fn push_reloads(up: &mut up::Up, nats_url: &str, file: &Path, version: u32) {
    let args = ["config", "push", file.to_str().unwrap()];
    let said = format!("config version {version} is live\n");
    config_cli_reloads(up, nats_url, &args, &said, version).await;
}

/// A temp dir, its `data` dir's path and two catalogs in it: `cheap.yaml` ($1 / $2 per 1M) and
/// `dear.yaml` ($3 / $4).
fn scene() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = dir.join("data");
    let cheap = catalog(dir, "cheap.yaml", "1", "2");
    let dear = catalog(dir, "dear.yaml", "3", "4");
    (tmp, data, cheap, dear)
}

fn usd(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

#[tokio::test]
async fn flag_and_file_win_over_kv_and_a_pushed_price_is_charged_on_the_next_request() {
    let (tmp, data, cheap, dear) = scene();
    let dir = tmp.path();

    // First run: its file becomes the live config; then someone pushes another config that
    // names another listen address and other models.
    let first = write_config(dir, "first.yaml", "demo/first", &cheap, json!({}));
    let mut up1 = up::start(&data, &first).await;
    let url = up1.nats_url().await;
    up1.wait_log(
        "no live config in KV yet; pushed the config file",
        Duration::from_secs(5),
    )
    .await;
    let pushed = write_config(
        dir,
        "pushed.yaml",
        "demo/pushed",
        &cheap,
        json!({"listen": "127.0.0.1:1", "data_dir": "/nonexistent"}),
    );
    push_reloads(&mut up1, &url, &pushed, 2).await;
    // Shared settings apply live; the pushed listen address and data dir do not.
    assert_eq!(model_ids(&up1.base).await, ["demo/mock", "demo/pushed"]);
    assert_eq!(charge_of_next_request(&up1).await, usd("0.20"));
    up1.stop().await;

    // Restart with another port and another file: the flag and the file win.
    let port = switchyard_natsd::free_port().unwrap();
    let third = write_config(dir, "third.yaml", "demo/third", &cheap, json!({}));
    let listen = format!("127.0.0.1:{port}");
    let mut up2 = up::spawn(up::command(&data, &listen, Some(&third)), &data).await;
    assert_eq!(up2.base, format!("http://{listen}"));
    let line = up2
        .wait_log(
            "config file differs from the live config in KV; made it the live config",
            Duration::from_secs(5),
        )
        .await;
    assert!(line.contains("was=2 version=3"), "{line}");
    assert_eq!(model_ids(&up2.base).await, ["demo/mock", "demo/third"]);
    // 100,000 prompt tokens at $1/M + 50,000 completion tokens at $2/M.
    assert_eq!(charge_of_next_request(&up2).await, usd("0.20"));

    // A price change pushed while it runs is charged on the very next request.
    let url = up2.nats_url().await;
    let repriced = write_config(dir, "repriced.yaml", "demo/third", &dear, json!({}));
    push_reloads(&mut up2, &url, &repriced, 4).await;
    // 100,000 at $3/M + 50,000 at $4/M.
    assert_eq!(charge_of_next_request(&up2).await, usd("0.50"));

    // History lists every version, the last one live; a rollback re-publishes version 3.
    let (ok, out, err) = admin_cli(&data, &url, &["config", "history"]).await;
    assert!(ok, "{err}");
    let versions: Vec<(&str, bool)> = out
        .lines()
        .map(|l| (l.split_whitespace().next().unwrap(), l.ends_with("(live)")))
        .collect();
    assert_eq!(
        versions,
        [("1", false), ("2", false), ("3", false), ("4", true)],
        "{out}"
    );
    config_cli_reloads(
        &mut up2,
        &url,
        &["config", "rollback", "3"],
        "config version 5 is live (the text of version 3)\n",
        5,
    )
    .await;
    assert_eq!(charge_of_next_request(&up2).await, usd("0.20"));
    let (ok, _, err) = admin_cli(&data, &url, &["config", "rollback", "99"]).await;
    assert!(!ok);
    assert!(
        err.contains("config version 99 is not in the history"),
        "{err}"
    );
    up2.stop().await;
}

const BUDGET_KEY: &str = "sk-precedence-budget-0123456789";

/// One chat request on `demo/mock` as [`BUDGET_KEY`] asking for up to 100,000 completion tokens
/// (the same prompt every time: the route does not cache); its status and body.
async fn reserve_100k(base: &str) -> (u16, Value) {
    let mut body = crate::common::chat("demo/mock", "reserve room for me", false);
    body["max_tokens"] = json!(100_000);
    let r = post_keyed(base, BUDGET_KEY, &body).await;
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn a_pushed_price_is_used_for_the_next_reservation() {
    let (tmp, data, cheap, dear) = scene();
    let dir = tmp.path();
    // A key with $0.30 a day; the mock answers 10 + 10 tokens, so what it spends stays tiny
    // and the reservation (100,000 output tokens at the sale price, +10 %) decides.
    let more = || {
        json!({
            "targets": [{"id": "mock", "provider": "openai",
                "base_url": "builtin:mock/x/prompt_tokens=10,completion_tokens=10",
                "upstream_model": "mock"}],
            "models": [{"id": "demo/mock", "targets": ["mock"], "cache": {"enabled": false}}],
            "keys": [{"id": "k1", "tenant": "t1",
                "key_sha256": switchyard_schemas::tenancy::sha256_hex(BUDGET_KEY),
                "budget": {"daily_usd": 0.3}}]
        })
    };
    let file = write_config(dir, "cheap-config.yaml", "demo/first", &cheap, more());
    let mut up = up::start(&data, &file).await;
    up.wait_ready().await;
    // At $2/M output the reservation is about $0.22: admitted.
    let (status, body) = reserve_100k(&up.base).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 10);

    // At $4/M output it is about $0.44, over the $0.30: refused before any upstream call.
    let url = up.nats_url().await;
    let repriced = write_config(dir, "dear-config.yaml", "demo/first", &dear, more());
    push_reloads(&mut up, &url, &repriced, 2).await;
    let (status, body) = reserve_100k(&up.base).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["type"], "insufficient_quota");
    assert_eq!(body["error"]["code"], "insufficient_quota");
    // Spent: the first answer's 10 + 10 tokens at $1/$2 per M. Needed: (10 prompt tokens at $3/M
    // + 100,000 at $4/M) + 10 %; at the old prices it was $0.220011, which fitted.
    assert_eq!(
        body["error"]["message"],
        "The daily budget of key `k1` would be exceeded: $0.00003 of $0.3 spent or reserved, \
         this request needs up to $0.440033."
    );

    // Back to the old prices: the same request is admitted again (the spend did not change).
    config_cli_reloads(
        &mut up,
        &url,
        &["config", "rollback", "1"],
        "config version 3 is live (the text of version 1)\n",
        3,
    )
    .await;
    let (status, body) = reserve_100k(&up.base).await;
    assert_eq!(status, 200, "{body}");
    up.stop().await;
}

async fn chat_status(base: &str) -> u16 {
    post_keyless(
        base,
        &crate::common::chat(
            "demo/mock",
            &format!("still here {}", uuid::Uuid::now_v7()),
            false,
        ),
    )
    .await
    .status()
    .as_u16()
}

#[tokio::test]
async fn a_pushed_nats_url_is_ignored_the_process_keeps_its_file_or_flag_value() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = dir.join("data");
    let cheap = catalog(dir, "cheap.yaml", "1", "2");
    // An open nats-server of the test's; `up` is told about it by its file, later by its flag.
    let nats = switchyard_natsd::NatsServer::start(&dir.join("nats"), None).unwrap();
    let nats_url = nats.url();
    let first = write_config(
        dir,
        "first.yaml",
        "demo/first",
        &cheap,
        json!({"nats_url": nats_url}),
    );
    let mut up1 = up::start(&data, &first).await;
    up1.wait_log(
        "no live config in KV yet; pushed the config file",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(up1.log_count("started private nats-server"), 0);
    // Someone pushes a config naming a NATS URL nothing listens on.
    let dead = format!(
        "nats://127.0.0.1:{}",
        switchyard_natsd::free_port().unwrap()
    );
    let pushed = write_config(
        dir,
        "pushed.yaml",
        "demo/pushed",
        &cheap,
        json!({"nats_url": dead}),
    );
    push_reloads(&mut up1, &nats_url, &pushed, 2).await;
    // The shared settings apply; the process stays on the file's NATS and serves.
    assert_eq!(model_ids(&up1.base).await, ["demo/mock", "demo/pushed"]);
    assert_eq!(chat_status(&up1.base).await, 200);
    up1.stop().await;

    // Restarted without a file, on the flag's URL: the live config (with the pushed nats_url)
    // comes from KV, the NATS URL from the flag.
    let mut cmd = up::command(&data, "127.0.0.1:0", None);
    cmd.args(["--nats-url", &nats_url]);
    let mut up2 = up::spawn(cmd, &data).await;
    up2.wait_log("using the live config from KV", Duration::from_secs(5))
        .await;
    assert_eq!(up2.log_count("started private nats-server"), 0);
    up2.wait_ready().await;
    assert_eq!(model_ids(&up2.base).await, ["demo/mock", "demo/pushed"]);
    assert_eq!(chat_status(&up2.base).await, 200);
    up2.stop().await;
    drop(nats);
}
