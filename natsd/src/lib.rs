//! A private nats-server child process with JetStream.
//!
//! `switchyard up` uses it when no NATS URL is configured (data under `./data/nats`), and every
//! integration test uses it on a random port with a temporary JetStream directory, so no test relies
//! on a server that happens to be running. NATS >= 2.10 is required (Debian's 2.9.10 lacks JetStream
//! account fields async-nats 0.51 needs for KV); `scripts/bootstrap` installs 2.15.1 under `.tools/`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod sys;

/// The pid file every server started here writes in its store directory (nats-server `-P`).
pub const PID_FILE: &str = "nats-server.pid";

/// Why the server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum NatsdError {
    /// No usable binary: names every place looked at.
    #[error(
        "nats-server >= 2.10 not found (looked at $SWITCHYARD_NATS_SERVER, {0}); run scripts/bootstrap"
    )]
    NotFound(String),
    /// Spawning or preparing directories failed.
    #[error("starting nats-server: {0}")]
    Io(#[from] std::io::Error),
    /// The server did not accept connections in time.
    #[error("nats-server did not accept connections on {addr} within {waited_ms} ms")]
    NotReady {
        /// Where we waited.
        addr: SocketAddr,
        /// How long, ms.
        waited_ms: u128,
    },
}

/// A running nats-server; killed (and its temp dir removed) on drop.
#[derive(Debug)]
pub struct NatsServer {
    child: Child,
    port: u16,
    store_dir: PathBuf,
    /// The `authorization` users it was started with (empty: open server).
    users: Vec<User>,
    /// Started by [`NatsServer::start_owned`]: dies with this process ([`sys::die_with_parent`]).
    owned: bool,
    _tmp: Option<tempfile::TempDir>,
}

/// One user of the server's `authorization { users: [...] }` block (nats-server config,
/// docs.nats.io "Authorization"): a name, a password and its subject permissions.
#[derive(Clone, PartialEq, Eq)]
pub struct User {
    /// User name.
    pub name: String,
    /// Password (written into the server's config file, mode 0600).
    pub password: String,
    /// Instead of `password`: the environment variable the server reads it from when it loads
    /// its config (`password: $VAR`), so the file holds no secret (compose.yaml).
    pub password_env: Option<String>,
    /// What the user may publish and subscribe to.
    pub permissions: Permissions,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("password", &"[redacted]")
            .field("password_env", &self.password_env)
            .field("permissions", &self.permissions)
            .finish()
    }
}

/// A user's `permissions` block: `publish` and `subscribe` rules and `allow_responses` (may
/// publish one reply to the reply subject of each message it received, without a publish
/// permission on that subject).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    /// Subjects the user may publish to.
    pub publish: Rule,
    /// Subjects the user may subscribe to (queue subscriptions included).
    pub subscribe: Rule,
    /// `allow_responses: true`.
    pub allow_responses: bool,
}

/// An `allow`/`deny` pair of subject lists (wildcards `*` and `>`); a deny wins over an allow.
/// An empty `allow` with a non-empty `deny` allows everything else; both empty allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    /// Allowed subjects.
    pub allow: Vec<String>,
    /// Denied subjects.
    pub deny: Vec<String>,
}

/// The nats-server config text: `max_payload` and, with users, the `authorization` block.
/// Strings are JSON-quoted (the config format accepts JSON strings; quoting keeps `$JS…`
/// subjects from being read as variables); a `password_env` is written as an unquoted
/// `$VAR` reference, which nats-server resolves from its environment.
pub fn config_text(users: &[User]) -> String {
    let q = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
    let rule = |name: &str, r: &Rule| {
        let mut text = format!("        {name}: {{\n");
        let mut lists = vec![("allow", r.allow.clone()), ("deny", r.deny.clone())];
        if r.allow.is_empty() && r.deny.is_empty() {
            // Nothing allowed: an allow list that matches no real subject.
            lists[0].1 = vec!["_NONE_".to_owned()];
        }
        for (key, list) in lists {
            if list.is_empty() {
                continue;
            }
            text.push_str(&format!("          {key}: [\n"));
            for subject in list {
                text.push_str(&format!("            {}\n", q(&subject)));
            }
            text.push_str("          ]\n");
        }
        text.push_str("        }\n");
        text
    };
    let mut text = String::from("max_payload: 8MB\n");
    if users.is_empty() {
        return text;
    }
    text.push_str("authorization {\n  users: [\n");
    for u in users {
        let password = u
            .password_env
            .as_ref()
            .map_or_else(|| q(&u.password), |v| format!("${v}"));
        text.push_str(&format!(
            "    {{\n      user: {}\n      password: {password}\n      permissions: {{\n",
            q(&u.name)
        ));
        text.push_str(&rule("publish", &u.permissions.publish));
        text.push_str(&rule("subscribe", &u.permissions.subscribe));
        if u.permissions.allow_responses {
            text.push_str("        allow_responses: true\n");
        }
        text.push_str("      }\n    }\n");
    }
    text.push_str("  ]\n}\n");
    text
}

/// Where `scripts/bootstrap` puts the binary, relative to the workspace root.
pub const BOOTSTRAP_PATH: &str = ".tools/bin/nats-server";

/// Finds the nats-server binary: `$SWITCHYARD_NATS_SERVER`, then `<root>/.tools/bin/nats-server` for
/// `root` in the given roots (current dir, the workspace this crate was built in).
pub fn find_binary() -> Result<PathBuf, NatsdError> {
    if let Some(p) = std::env::var_os("SWITCHYARD_NATS_SERVER") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
    }
    let mut looked = Vec::new();
    let mut roots = vec![PathBuf::from(".")];
    if let Ok(exe) = std::env::current_exe() {
        // target/{debug,release}/switchyard → workspace root three levels up.
        roots.extend(exe.ancestors().skip(3).take(1).map(Path::to_path_buf));
    }
    roots.push(PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")));
    for root in roots {
        let p = root.join(BOOTSTRAP_PATH);
        if p.is_file() {
            return Ok(p);
        }
        looked.push(p.display().to_string());
    }
    Err(NatsdError::NotFound(looked.join(", ")))
}

/// A free TCP port on 127.0.0.1 (bound then released; the tiny race is acceptable for tests).
pub fn free_port() -> Result<u16, NatsdError> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl NatsServer {
    /// Starts a server on a random port with a fresh temporary JetStream directory (for tests).
    pub fn start_temp() -> Result<Self, NatsdError> {
        Self::start_temp_with_users(&[])
    }

    /// Like [`Self::start_temp`], with authentication: only `users` may connect, each with its
    /// permissions (empty `users`: an open server).
    pub fn start_temp_with_users(users: &[User]) -> Result<Self, NatsdError> {
        let tmp = tempfile::tempdir()?;
        let mut s = Self::start_with_users(tmp.path(), None, users)?;
        s._tmp = Some(tmp);
        Ok(s)
    }

    /// Starts a server on 127.0.0.1:`port` keeping JetStream data under `store_dir`, and waits up to
    /// 10 s for it to accept connections. With `port` `None` the server picks a free port itself and
    /// reports it through its ports file (no bind-then-release race between parallel tests).
    /// `max_payload` is raised to 8 MiB so large prompts fit.
    pub fn start(store_dir: &Path, port: Option<u16>) -> Result<Self, NatsdError> {
        Self::start_with_users(store_dir, port, &[])
    }

    /// Like [`Self::start`], with an `authorization` block of `users` in the generated config
    /// file `<store_dir>/switchyard-nats.conf` (mode 0600: it holds the passwords). Empty
    /// `users`: an open server.
    pub fn start_with_users(
        store_dir: &Path,
        port: Option<u16>,
        users: &[User],
    ) -> Result<Self, NatsdError> {
        Self::start_inner(store_dir, port, users, false)
    }

    /// Like [`Self::start_with_users`], for the server a long-running process owns (`switchyard
    /// up`): a server an earlier crash left running on `store_dir` is stopped first
    /// ([`sys::stop_stale`]), and the new one dies with this process even on `kill -9`
    /// ([`sys::die_with_parent`]; call it from the main thread). Needs no other lock: the caller
    /// holds one on its data dir.
    pub fn start_owned(
        store_dir: &Path,
        port: Option<u16>,
        users: &[User],
    ) -> Result<Self, NatsdError> {
        std::fs::create_dir_all(store_dir)?;
        sys::stop_stale(store_dir)?;
        Self::start_inner(store_dir, port, users, true)
    }

    fn start_inner(
        store_dir: &Path,
        port: Option<u16>,
        users: &[User],
        owned: bool,
    ) -> Result<Self, NatsdError> {
        let (child, ports_dir) = spawn(store_dir, port, users, owned)?;
        let mut s = Self {
            child,
            port: port.unwrap_or(0),
            store_dir: store_dir.to_path_buf(),
            users: users.to_vec(),
            owned,
            _tmp: None,
        };
        s.wait_ready(&ports_dir, Duration::from_secs(10))?;
        Ok(s)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server (SIGKILL: a crash, nothing is flushed or handed over) and waits for it to
    /// exit. Clients see the connection drop and keep reconnecting. No-op when already stopped.
    pub fn stop(&mut self) -> Result<(), NatsdError> {
        if self.is_running() {
            self.child.kill()?;
        }
        self.child.wait()?;
        Ok(())
    }

    /// Starts the server again on the same port with the same JetStream store (streams, consumers
    /// and their state survive), stopping it first if it runs; waits up to 10 s for it to accept
    /// connections. Clients reconnect by themselves.
    pub fn restart(&mut self) -> Result<(), NatsdError> {
        self.stop()?;
        let (child, ports_dir) = spawn(&self.store_dir, Some(self.port), &self.users, self.owned)?;
        self.child = child;
        self.wait_ready(&ports_dir, Duration::from_secs(10))
    }

    /// The JetStream store directory.
    pub fn store_dir(&self) -> &Path {
        &self.store_dir
    }
}

/// The Go garbage collector's target for the private server, unless the environment sets
/// `GOGC`: a collection when the heap has grown by 50 % over the live data (Go's default 100 %).
/// Under a 2,000 rps run this cut the server's peak RSS growth from +64–69 MB to +50 MB with no
/// measurable CPU cost (docs/BENCHMARKS.md, "Memory of the `up` tree under load"); the cost
/// scales with the live heap, unlike a fixed `GOMEMLIMIT`.
const GOGC: &str = "50";

/// Spawns nats-server on `port` (`None`: it picks one) with JetStream data under `store_dir`;
/// returns the child and the directory its ports file appears in. The server writes its pid to
/// `<store_dir>/`[`PID_FILE`]; `owned` makes it die with this process.
fn spawn(
    store_dir: &Path,
    port: Option<u16>,
    users: &[User],
    owned: bool,
) -> Result<(Child, PathBuf), NatsdError> {
    let bin = find_binary()?;
    std::fs::create_dir_all(store_dir)?;
    let conf = store_dir.join("switchyard-nats.conf");
    write_private(&conf, &config_text(users))?;
    let ports_dir = store_dir.join("ports");
    std::fs::create_dir_all(&ports_dir)?;
    let port_arg = port.map_or_else(|| "-1".to_owned(), |p| p.to_string());
    let mut cmd = Command::new(&bin);
    if owned {
        sys::die_with_parent(&mut cmd);
    }
    if std::env::var_os("GOGC").is_none() {
        cmd.env("GOGC", GOGC);
    }
    let child = cmd
        .arg("-c")
        .arg(&conf)
        .args(["-a", "127.0.0.1", "-p", &port_arg, "-js", "-sd"])
        .arg(store_dir)
        .arg("--ports_file_dir")
        .arg(&ports_dir)
        .arg("-P")
        .arg(store_dir.join(PID_FILE))
        // A debugging aid: `SWITCHYARD_NATSD_LOG=<file>` keeps the server's log (permission
        // violations are logged there).
        // `SWITCHYARD_NATS_MONITOR_PORT=<port>` turns on the HTTP monitoring endpoint (`/varz`):
        // `switchyard bench` reads it to count NATS messages per request.
        .args(
            std::env::var_os("SWITCHYARD_NATS_MONITOR_PORT")
                .map(|p| vec![std::ffi::OsString::from("-m"), p])
                .unwrap_or_default(),
        )
        .args(
            std::env::var_os("SWITCHYARD_NATSD_LOG")
                .map(|f| vec![std::ffi::OsString::from("-l"), f])
                .unwrap_or_default(),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok((child, ports_dir))
}

/// Writes `text` to `path` readable by the owner only (0600 on Unix), replacing it.
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

impl NatsServer {
    /// Waits for the ports file of our child (written once it listens), then for a TCP connect.
    fn wait_ready(&mut self, ports_dir: &Path, limit: Duration) -> Result<(), NatsdError> {
        let start = Instant::now();
        let pid = self.child.id();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(NatsdError::Io(std::io::Error::other(format!(
                    "nats-server exited at start-up with {status} (port in use?)"
                ))));
            }
            if let Some(port) = read_ports_file(ports_dir, pid) {
                self.port = port;
                let addr = SocketAddr::from(([127, 0, 0, 1], port));
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return Ok(());
                }
            }
            if start.elapsed() > limit {
                let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
                return Err(NatsdError::NotReady {
                    addr,
                    waited_ms: start.elapsed().as_millis(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The client URL, `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// Reads the client port from `<dir>/nats-server_<pid>.ports` (`{"nats":["nats://host:port"],…}`).
fn read_ports_file(dir: &Path, pid: u32) -> Option<u16> {
    let entries = std::fs::read_dir(dir).ok()?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.ends_with(&format!("_{pid}.ports")) {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        let url = v.get("nats")?.as_array()?.first()?.as_str()?;
        return url.rsplit(':').next()?.parse().ok();
    }
    None
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn starts_and_stops() {
        let mut s = NatsServer::start_temp().unwrap();
        assert!(s.is_running());
        let url = s.url();
        assert!(url.starts_with("nats://127.0.0.1:"));
        let port = s.port();
        drop(s);
        // The port is free again once the child is gone.
        assert!(TcpListener::bind(("127.0.0.1", port)).is_ok());
    }

    #[test]
    fn renders_users_and_writes_the_config_privately() {
        let users = vec![User {
            name: "ingress".into(),
            password: "pw\"x".into(),
            password_env: None,
            permissions: Permissions {
                publish: Rule {
                    allow: vec!["sy.req.>".into(), "$JS.API.INFO".into()],
                    deny: vec![],
                },
                subscribe: Rule::default(),
                allow_responses: true,
            },
        }];
        assert_eq!(
            config_text(&users),
            r#"max_payload: 8MB
authorization {
  users: [
    {
      user: "ingress"
      password: "pw\"x"
      permissions: {
        publish: {
          allow: [
            "sy.req.>"
            "$JS.API.INFO"
          ]
        }
        subscribe: {
          allow: [
            "_NONE_"
          ]
        }
        allow_responses: true
      }
    }
  ]
}
"#
        );
        assert!(!format!("{users:?}").contains("pw"));
        let s = NatsServer::start_temp_with_users(&users).unwrap();
        let conf = s.store_dir().join("switchyard-nats.conf");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&conf).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(s.url().starts_with("nats://127.0.0.1:"));
    }

    #[test]
    fn restarts_on_the_same_port_and_store() {
        let mut s = NatsServer::start_temp().unwrap();
        let (port, store) = (s.port(), s.store_dir().to_path_buf());
        s.stop().unwrap();
        assert!(!s.is_running());
        s.stop().unwrap(); // already stopped: no-op
        s.restart().unwrap();
        assert!(s.is_running());
        assert_eq!((s.port(), s.store_dir()), (port, store.as_path()));
        assert!(TcpStream::connect(("127.0.0.1", port)).is_ok());
    }
}
