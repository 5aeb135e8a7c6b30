//! Provider credentials never in clear: `enc:v1:` values decrypted only by the worker and sent
//! upstream; `switchyard secret keygen|encrypt|rotate`, `config push` of literal credentials
//! (encrypted / hashed in KV, warned), `config show` redacted, a wrong master key a clear
//! start-up error, and `switchyard key …` through the admin API.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::admin::{ADMIN_KEY, CLIENT_KEY, config, watch};
use crate::common::*;
use serde_json::json;
use std::process::Stdio;
use switchyard_schemas::config::{ConfigHandle, resolve_provider_secrets};
use switchyard_schemas::sealed::MasterKey;
use tokio::io::AsyncWriteExt as _;

const BIN: &str = env!("CARGO_BIN_EXE_switchyard");

async fn stored(url: &str) -> String {
    let c = async_nats::connect(url).await.unwrap();
    let kv = switchyard::reload::bucket(&c).await.unwrap();
    let e = kv.entry(switchyard::reload::KEY).await.unwrap().unwrap();
    String::from_utf8(e.value.to_vec()).unwrap()
}

/// Runs the binary with `env` and optional stdin; (exit code, stdout, stderr).
async fn run(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> (i32, String, String) {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(args)
        .env_remove("SWITCHYARD_MASTER_KEY")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).await.unwrap();
    }
    drop(input);
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the command finished")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn encrypted_provider_key_is_decrypted_only_by_the_worker_and_sent_upstream() {
    let (master, _) = MasterKey::generate();
    let plain = "sk-upstream-sealed-0123456789abcdef";
    let (text, c) = config(json!({"targets": [{"id": "mock", "provider": "openai",
        "base_url": "builtin:mock", "upstream_model": "mock", "api_key": master.encrypt(plain)}]}));
    // Ingress holds the ciphertext only; the worker's copy is resolved.
    assert!(c.targets[0].api_key.expose().starts_with("enc:v1:"));
    let gw = start(Options {
        config: c.clone(),
        worker: false,
        ..Default::default()
    })
    .await;
    let mut worker_config = c.clone();
    resolve_provider_secrets(&mut worker_config, &|_| None, Some(&master)).unwrap();
    assert_eq!(worker_config.targets[0].api_key.expose(), plain);
    let client = async_nats::connect(gw.nats.url()).await.unwrap();
    spawn_worker(
        &gw,
        ConfigHandle::new(worker_config),
        "worker-sealed",
        gw.worker_shutdown.clone(),
    )
    .await;
    switchyard::reload::push(&client, &text).await.unwrap();
    assert!(!stored(&gw.nats.url()).await.contains(plain));

    let resp = post_keyed(&gw.base, CLIENT_KEY, &chat("demo/mock", "hi", false)).await;
    assert_eq!(resp.status().as_u16(), 200);
    let seen = gw.mock.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {plain}").as_str())
    );
    // Without the master key the worker cannot resolve it: an error naming the field.
    let mut no_key = c.clone();
    let e = resolve_provider_secrets(&mut no_key, &|_| None, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "config field `targets[0].api_key`: an encrypted value (enc:v1:…) needs the master key \
         in SWITCHYARD_MASTER_KEY"
    );
}

#[tokio::test]
async fn secret_commands_push_show_rotate_and_a_wrong_master_key() {
    let (text, c) = config(json!({}));
    let gw = start_config(c).await;
    let url = gw.nats.url();
    let dir = tempfile::tempdir().unwrap();

    let (code, key1, _) = run(&["secret", "keygen"], &[], None).await;
    assert_eq!(code, 0);
    let key1 = key1.trim().to_owned();
    let (_, key2, _) = run(&["secret", "keygen"], &[], None).await;
    let key2 = key2.trim().to_owned();
    assert_ne!(key1, key2);

    let plain = "sk-upstream-cli-0123456789abcdef";
    let (code, enc, err) = run(
        &["secret", "encrypt"],
        &[("SWITCHYARD_MASTER_KEY", &key1)],
        Some(&format!("{plain}\n")),
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let enc = enc.trim().to_owned();
    let m1 = MasterKey::from_base64("k1", &key1).unwrap();
    assert_eq!(m1.decrypt(&enc).unwrap().expose(), plain);
    let (code, _, err) = run(&["secret", "encrypt"], &[], Some(plain)).await;
    assert_eq!(
        (code, err.trim()),
        (1, "switchyard: SWITCHYARD_MASTER_KEY is not set")
    );

    // A config with the encrypted key, a literal provider key and a literal client key.
    let literal_provider = "sk-literal-provider-cli-987654321";
    let literal_client = "sk-literal-client-cli-123456789";
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["targets"][0]["api_key"] = json!(enc);
    v["targets"].as_array_mut().unwrap().push(
        json!({"id": "mock2", "provider": "openai", "base_url": "builtin:mock",
        "upstream_model": "mock", "api_key": literal_provider}),
    );
    v["keys"]
        .as_array_mut()
        .unwrap()
        .push(json!({"id": "lit", "tenant": "team-b", "key": literal_client}));
    let file = dir.path().join("gateway.yaml");
    std::fs::write(&file, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let f = file.to_str().unwrap();

    let (code, out, err) = run(
        &["config", "push", f, "--nats-url", &url],
        &[("SWITCHYARD_MASTER_KEY", &key1)],
        None,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("is live"), "{out}");
    assert!(
        err.contains("warning: targets[1].api_key is written literally: stored encrypted"),
        "{err}"
    );
    assert!(
        err.contains("warning: keys[1].key is written literally: stored as its SHA-256"),
        "{err}"
    );
    let kv = stored(&url).await;
    for secret in [plain, literal_provider, literal_client] {
        assert!(!kv.contains(secret), "{secret} in KV: {kv}");
    }
    let (code, shown, _) = run(&["config", "show", "--nats-url", &url], &[], None).await;
    assert_eq!(code, 0);
    assert!(shown.starts_with("# version "), "{shown}");
    for secret in [plain, literal_provider, literal_client, &key1] {
        assert!(!shown.contains(secret), "{secret} shown: {shown}");
    }

    // Rotation: the file and the live config, from key1 to key2.
    let (code, out, err) = run(
        &[
            "secret",
            "rotate",
            "--old-key-env",
            "OLD_K",
            "--new-key-env",
            "NEW_K",
            "--file",
            f,
            "--live",
            "--nats-url",
            &url,
        ],
        &[("OLD_K", &key1), ("NEW_K", &key2)],
        None,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("{}: 1 values re-encrypted", f)),
        "{out}"
    );
    assert!(out.contains("live config: 2 values re-encrypted"), "{out}");
    let m2 = MasterKey::from_base64("k2", &key2).unwrap();
    let live = switchyard_schemas::config_text::parse("kv", &stored(&url).await, |_| None).unwrap();
    let mut resolved = live.clone();
    resolve_provider_secrets(&mut resolved, &|_| None, Some(&m2)).unwrap();
    assert_eq!(resolved.targets[0].api_key.expose(), plain);
    assert_eq!(resolved.targets[1].api_key.expose(), literal_provider);
    let mut old = live.clone();
    assert!(resolve_provider_secrets(&mut old, &|_| None, Some(&m1)).is_err());

    // A worker started with the old (now wrong) key, or a malformed one, stops with a clear error.
    let (code, _, err) = run(
        &["worker", "--config", f, "--nats-url", &url],
        &[("SWITCHYARD_MASTER_KEY", &key1)],
        None,
    )
    .await;
    assert_eq!(code, 1);
    assert_eq!(
        err.lines().last().unwrap(),
        "switchyard: config field `targets[0].api_key`: cannot decrypt the enc:v1 value: wrong \
         master key or corrupted value"
    );
    let (code, _, err) = run(
        &["worker", "--config", f, "--nats-url", &url],
        &[("SWITCHYARD_MASTER_KEY", "c2hvcnQ=")],
        None,
    )
    .await;
    assert_eq!(code, 1);
    assert!(
        err.contains("SWITCHYARD_MASTER_KEY must be 32 bytes in standard base64"),
        "{err}"
    );
    assert!(!err.contains("c2hvcnQ="), "the key is never printed: {err}");
}

#[tokio::test]
async fn key_commands_go_through_the_admin_api() {
    let (text, c) = config(json!({}));
    let gw = start_config(c).await;
    let admin = async_nats::connect(gw.nats.url()).await.unwrap();
    switchyard::reload::push(&admin, &text).await.unwrap();
    watch(&gw, &gw.config, &gw.shutdown).await;
    let env = [
        ("SWITCHYARD_URL", gw.base.as_str()),
        ("SWITCHYARD_ADMIN_KEY", ADMIN_KEY),
    ];
    let (code, out, err) = run(
        &["key", "create", "--tenant", "team-a", "--id", "cli-1"],
        &env,
        None,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let key = out
        .lines()
        .find_map(|l| l.strip_prefix("key (shown once): "))
        .unwrap()
        .to_owned();
    let (s, _) = get_as(format!("{}/v1/models", gw.base), &key).await;
    assert_eq!(s, 200);
    let (code, out, _) = run(&["key", "list", "--tenant", "team-a"], &env, None).await;
    assert_eq!(code, 0);
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0]["id"].as_str(), rows[0]["status"].as_str()),
        (Some("cli-1"), Some("active"))
    );
    let (code, _, _) = run(&["key", "revoke", "cli-1"], &env, None).await;
    assert_eq!(code, 0);
    let (s, _) = get_as(format!("{}/v1/models", gw.base), &key).await;
    assert_eq!(s, 401);
    let (code, _, err) = run(&["key", "revoke", "nope"], &env, None).await;
    assert_eq!(code, 1);
    assert_eq!(
        err.trim(),
        "switchyard: 404 Not Found: No API key with id `nope`."
    );
    let (code, _, err) = run(
        &["key", "list"],
        &[
            ("SWITCHYARD_URL", gw.base.as_str()),
            ("SWITCHYARD_ADMIN_KEY", "sk-not-an-admin-key-000"),
        ],
        None,
    )
    .await;
    assert_eq!(code, 1);
    assert!(
        err.contains("401 Unauthorized: Incorrect admin key provided"),
        "{err}"
    );
}
