//! Switchyard services as child processes (`switchyard ingress`, `switchyard worker`, …), for
//! tests that need them in processes of their own (separate OpenTelemetry exporters, RSS).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// `config` with its `data_dir` under `dir`, written to `dir/config.json` for child processes:
/// the config and that file's path.
pub(crate) fn config_file(
    dir: &Path,
    mut config: switchyard_schemas::config::GatewayConfig,
) -> (switchyard_schemas::config::GatewayConfig, String) {
    config.data_dir = dir.join("data").display().to_string();
    let path = dir.join("config.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    (config, path.display().to_string())
}

/// A running service process; killed when dropped.
pub(crate) struct Service {
    pub child: tokio::process::Child,
    /// The stderr line that said it was ready.
    pub ready_line: String,
    /// Its stderr after that line, collected until it exits.
    pub log: std::sync::Arc<parking_lot::Mutex<Vec<String>>>,
}

impl Service {
    /// Starts `switchyard <args>` with `envs` and waits (at most 30 s) for a stderr line
    /// containing `ready`.
    pub(crate) async fn start(args: &[&str], envs: &[(&str, &str)], ready: &str) -> Self {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchyard"));
        cmd.args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let ready_line = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains(ready) {
                    return line;
                }
            }
            panic!("switchyard {args:?} exited before `{ready}`");
        })
        .await
        .unwrap_or_else(|_| panic!("switchyard {args:?}: no `{ready}` within 30 s"));
        let log = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let sink = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                sink.lock().push(line);
            }
        });
        Self {
            child,
            ready_line,
            log,
        }
    }

    /// `switchyard worker` on the config file `config`, against `nats` and the mock upstream at
    /// `mock`, once it says it serves.
    pub(crate) async fn worker(
        config: &str,
        nats: &str,
        mock: &str,
        envs: &[(&str, &str)],
    ) -> Self {
        let args = [
            "worker",
            "--config",
            config,
            "--nats-url",
            nats,
            "--mock-url",
            mock,
        ];
        Self::start(&args, envs, "worker serving").await
    }

    /// `switchyard [global…] ingress` on the config file `config` against `nats`, listening on
    /// a free port, once it says it listens; `global` are options before the subcommand.
    pub(crate) async fn ingress(
        global: &[&str],
        config: &str,
        nats: &str,
        envs: &[(&str, &str)],
    ) -> Self {
        let mut args = global.to_vec();
        args.extend([
            "ingress",
            "--config",
            config,
            "--nats-url",
            nats,
            "--listen",
            "127.0.0.1:0",
        ]);
        Self::start(&args, envs, "ingress listening on http://").await
    }

    /// The base URL an ingress started with text logs announced in its ready line.
    pub(crate) fn base_url(&self) -> String {
        let addr = self.ready_line.split("http://").nth(1).unwrap().trim();
        format!("http://{addr}")
    }

    /// Sends SIGTERM and waits (at most 60 s) for the process to exit; returns its exit code.
    pub(crate) async fn stop(mut self) -> Option<i32> {
        let pid = self.child.id().unwrap().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .expect("service did not exit within 60 s of SIGTERM")
            .unwrap();
        status.code()
    }
}
