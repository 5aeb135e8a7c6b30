//! `switchyard up` as a child process (the built binary: its own process, real signals), with
//! its log captured so tests can wait for a line.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncBufReadExt as _;

/// A running (or exited) `switchyard up`.
pub(crate) struct Up {
    /// The child.
    pub child: tokio::process::Child,
    /// Where ingress listens, `http://127.0.0.1:PORT`.
    pub base: String,
    /// The data dir.
    pub data_dir: PathBuf,
    log: tokio::sync::watch::Receiver<Vec<String>>,
}

/// `switchyard up --no-local-model --no-semantic --data-dir DATA --listen LISTEN [--config FILE]`
/// with a clean environment (no `SWITCHYARD_CONFIG` / `SWITCHYARD_NATS_URL`), log on stderr.
pub(crate) fn command(
    data_dir: &Path,
    listen: &str,
    config: Option<&Path>,
) -> tokio::process::Command {
    let mut cmd = command_with_semantic(data_dir, listen, config);
    cmd.arg("--no-semantic");
    cmd
}

/// [`command`] without `--no-semantic`: the cache loads the embedding model (found under
/// `.tools/venv`) when a route uses the semantic layer.
pub(crate) fn command_with_semantic(
    data_dir: &Path,
    listen: &str,
    config: Option<&Path>,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchyard"));
    cmd.args(["up", "--no-local-model", "--listen", listen])
        .arg("--data-dir")
        .arg(data_dir);
    if let Some(f) = config {
        cmd.arg("--config").arg(f);
    }
    cmd.env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .env_remove("SWITCHYARD_CONFIG")
        .env_remove("SWITCHYARD_NATS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Spawns `cmd` (from [`command`]) and waits up to 60 s for ingress to listen.
pub(crate) async fn spawn(mut cmd: tokio::process::Command, data_dir: &Path) -> Up {
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, mut log) = tokio::sync::watch::channel(Vec::<String>::new());
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("[up] {line}");
            tx.send_modify(|v| v.push(line));
        }
    });
    let line = tokio::time::timeout(
        Duration::from_secs(60),
        log.wait_for(|v| v.iter().any(|l| l.contains("ingress listening on http://"))),
    )
    .await
    .expect("`up` did not start listening within 60 s")
    .expect("`up` exited before listening")
    .iter()
    .find_map(|l| l.split("ingress listening on ").nth(1).map(str::to_owned))
    .unwrap();
    Up {
        child,
        base: line.trim().to_owned(),
        data_dir: data_dir.to_path_buf(),
        log,
    }
}

/// [`spawn`] of [`command`] on the config file `config` with the data dir `data_dir`, listening
/// on a free port.
pub(crate) async fn start(data_dir: &Path, config: &Path) -> Up {
    spawn(command(data_dir, "127.0.0.1:0", Some(config)), data_dir).await
}

impl Up {
    /// Waits up to `limit` for a log line containing `needle` (seen before or later); returns it.
    pub(crate) async fn wait_log(&mut self, needle: &str, limit: Duration) -> String {
        let lines = tokio::time::timeout(
            limit,
            self.log.wait_for(|v| v.iter().any(|l| l.contains(needle))),
        )
        .await
        .unwrap_or_else(|_| panic!("no log line with `{needle}` within {limit:?}"))
        .unwrap_or_else(|_| panic!("`up` exited without logging `{needle}`"));
        lines.iter().find(|l| l.contains(needle)).cloned().unwrap()
    }

    /// Waits up to 30 s for `GET /readyz` to answer 200 (every service ready, billing's
    /// database migrated).
    pub(crate) async fn wait_ready(&self) {
        let url = format!("{}/readyz", self.base);
        super::eventually(Duration::from_secs(30), || {
            let url = url.clone();
            async move { (reqwest::get(&url).await.ok()?.status() == 200).then_some(()) }
        })
        .await;
    }

    /// The number of log lines containing `needle` so far.
    pub(crate) fn log_count(&self, needle: &str) -> usize {
        self.log
            .borrow()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// The private nats-server's client URL (from the start-up log).
    pub(crate) async fn nats_url(&mut self) -> String {
        let line = self
            .wait_log("started private nats-server", Duration::from_secs(5))
            .await;
        line.split("url=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap()
            .to_owned()
    }

    /// SIGTERM, then waits up to 30 s for a clean exit.
    pub(crate) async fn stop(mut self) {
        let pid = self.child.id().unwrap();
        signal("TERM", pid);
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("`up` did not stop within 30 s of SIGTERM")
            .unwrap();
        assert!(status.success(), "`up` exited with {status}");
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        // A failed test: SIGTERM so `up` stops cleanly; its nats-server dies with it anyway.
        if let (Ok(None), Some(pid)) = (self.child.try_wait(), self.child.id()) {
            signal("TERM", pid);
        }
    }
}

/// `kill -SIG pid`.
pub(crate) fn signal(sig: &str, pid: u32) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// Runs `switchyard ARGS…` as the embedded server's `admin` identity (password from
/// `<data_dir>/nats-credentials.json`) against `nats_url`; returns (success, stdout, stderr).
pub(crate) async fn admin_cli(
    data_dir: &Path,
    nats_url: &str,
    args: &[&str],
) -> (bool, String, String) {
    let (creds, _) = switchyard::nats_auth::Credentials::load_or_create(data_dir).unwrap();
    let admin = creds.config_for(switchyard::nats_auth::Identity::Admin);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .args(["--nats-url", nats_url])
        .env("SWITCHYARD_NATS_USER", admin.user.clone().unwrap())
        .env(
            "SWITCHYARD_NATS_PASSWORD",
            admin.password.as_ref().unwrap().expose(),
        )
        .env_remove("SWITCHYARD_CONFIG")
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
