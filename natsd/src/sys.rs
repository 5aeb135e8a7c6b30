//! Process hygiene for the server `switchyard up` owns: it dies with its parent, and a server an
//! old crash left on the same store is found and stopped before a new one starts.
//!
//! Linux only (`prctl(2)` `PR_SET_PDEATHSIG`, `/proc/<pid>`); elsewhere the functions are no-ops
//! and [`NatsServer`](crate::NatsServer)'s drop is the only cleanup.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Makes the child spawned by `cmd` receive SIGTERM when the thread that spawns it exits
/// (`prctl(2)`, `PR_SET_PDEATHSIG`: the signal follows the *thread* that forked, so spawn from a
/// thread that lives as long as the process, e.g. the main thread). If the parent already exited
/// between fork and `prctl`, the child fails to start (`ESRCH`) instead of running orphaned.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    let parent = std::process::id();
    // SAFETY: the hook runs in the forked child before exec. It only calls prctl and getppid,
    // both async-signal-safe, allocates nothing and touches no lock (`from_raw_os_error` and
    // `last_os_error` build an error without allocating).
    unsafe {
        cmd.pre_exec(move || {
            let signal = libc::SIGTERM as libc::c_ulong;
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Reparented already: the parent died before prctl, so the signal never comes.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// No parent-death signal off Linux.
#[cfg(not(target_os = "linux"))]
pub fn die_with_parent(_cmd: &mut Command) {}

/// Sends `signal` to `pid`; false when there is no such process (or it is not ours to signal).
#[cfg(unix)]
#[allow(unsafe_code)]
fn signal(pid: u32, signal: libc::c_int) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 1 {
        return false;
    }
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    unsafe { libc::kill(pid, signal) == 0 }
}

/// Whether `pid` is a live process (a zombie counts as gone: it no longer runs or holds files).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S …`: the state follows the last `)` (comm may hold spaces or parens).
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Waits up to `limit` for `pid` to exit (polls `/proc`: it is not our child, so it cannot be
/// waited for); returns whether it did.
pub fn wait_gone(pid: u32, limit: Duration) -> bool {
    let start = Instant::now();
    while alive(pid) {
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Whether `pid` is a nats-server whose `-sd` (JetStream store) is `store` (both canonicalised;
/// a relative argument is resolved against the process's `/proc/<pid>/cwd`).
fn is_nats_on(pid: u32, store: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let is_nats = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .is_some_and(|n| n.to_string_lossy().starts_with("nats-server"));
    if !is_nats {
        return false;
    }
    let Some(sd) = args
        .iter()
        .position(|a| a == "-sd" || a == "--store_dir")
        .and_then(|i| args.get(i + 1))
    else {
        return false;
    };
    let sd = PathBuf::from(sd);
    let sd = if sd.is_relative() {
        match std::fs::read_link(format!("/proc/{pid}/cwd")) {
            Ok(cwd) => cwd.join(sd),
            Err(_) => return false,
        }
    } else {
        sd
    };
    match (sd.canonicalize(), store.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The pids a server on `store` may have left: [`PID_FILE`](crate::PID_FILE) and the
/// `ports/nats-server_<pid>.ports` files (written by every server started on this store, also
/// by versions that wrote no pid file; removed on a clean exit).
fn recorded_pids(store: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    if let Ok(text) = std::fs::read_to_string(store.join(crate::PID_FILE))
        && let Ok(pid) = text.trim().parse()
    {
        pids.push(pid);
    }
    if let Ok(entries) = std::fs::read_dir(store.join("ports")) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_suffix(".ports")
                .and_then(|n| n.rsplit('_').next())
                .and_then(|p| p.parse().ok());
            if let Some(pid) = pid {
                pids.push(pid);
                // Its server is gone (or is stopped below): the file is stale either way.
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Stops every nats-server still running on `store` (left by a crashed `switchyard up`):
/// SIGTERM, up to 5 s for it to exit, then SIGKILL and up to 5 s more. Returns the pids stopped;
/// an error names a server that would not exit.
pub fn stop_stale(store: &Path) -> std::io::Result<Vec<u32>> {
    let mut stopped = Vec::new();
    #[cfg(unix)]
    for pid in recorded_pids(store) {
        if pid == std::process::id() || !alive(pid) || !is_nats_on(pid, store) {
            continue;
        }
        tracing::warn!(pid, store = %store.display(),
            "stopping a nats-server left running on this store by an earlier crash");
        signal(pid, libc::SIGTERM);
        if !wait_gone(pid, Duration::from_secs(5)) {
            signal(pid, libc::SIGKILL);
            if !wait_gone(pid, Duration::from_secs(5)) {
                return Err(std::io::Error::other(format!(
                    "a stale nats-server (pid {pid}) on {} does not exit",
                    store.display()
                )));
            }
        }
        stopped.push(pid);
    }
    Ok(stopped)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stops_a_server_left_on_the_store_and_ignores_others() {
        let store = tempfile::tempdir().unwrap();
        // A "crashed" run: a server started without an owner, then forgotten.
        let orphan = crate::NatsServer::start(store.path(), None).unwrap();
        let pid = orphan.pid();
        std::mem::forget(orphan);
        assert!(alive(pid));
        assert!(is_nats_on(pid, store.path()));
        let other = tempfile::tempdir().unwrap();
        assert!(!is_nats_on(pid, other.path()));
        assert_eq!(stop_stale(other.path()).unwrap(), Vec::<u32>::new());
        assert!(alive(pid));
        assert_eq!(stop_stale(store.path()).unwrap(), vec![pid]);
        assert!(!alive(pid));
        // Nothing left to stop.
        assert_eq!(stop_stale(store.path()).unwrap(), Vec::<u32>::new());
    }
}
