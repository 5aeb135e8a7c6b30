//! The durable local spool of usage events JetStream did not acknowledge, and its drainer.
//!
//! When JetStream does not acknowledge an event after [`PUBLISH_ATTEMPTS`] attempts (NATS down or
//! unreachable for longer than the retries last), [`publish_usage_event`] appends it as one JSON
//! line to a durable local spool file (written and fsync'd before it returns) instead of dropping
//! it. [`drain_spool`], spawned once per process, re-publishes spooled events with the same subject
//! and `Nats-Msg-Id` once NATS answers again, and removes an event from the spool only after the
//! stream acknowledged it. A crash between the acknowledgement and the removal re-publishes the
//! event later: inside the stream's duplicate window JetStream drops it, after it the ledger's
//! primary key (request id, kind, attempt) does, so an event is never counted twice.
//!
//! A process opens its spool ([`Spool::open`]; the CLI uses `<data_dir>/spool/<service>-<id>`)
//! and hands it to its publishers and to one [`drain_spool`] task: there is no process-wide
//! spool, so two gateways in one process (tests) never spool into each other's directory. The
//! directory holds an exclusive lock file ([`LOCK_FILE`]) for the lifetime of the process,
//! `pending.jsonl` (appended to) and `draining-<uuid>.jsonl` (taken over by the drainer). Sibling
//! directories whose lock is free (left by a process that has exited) are adopted by the drainer:
//! their files move into this process's spool and are drained with it, so a restart never
//! strands spooled events.
//!
//! [`PUBLISH_ATTEMPTS`]: crate::publish::PUBLISH_ATTEMPTS
//! [`publish_usage_event`]: crate::publish::publish_usage_event

use crate::message::{Entry, connected, send, subject_of};
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_schemas::subjects::Subjects;

/// Name of the lock file every spool directory holds while its process runs.
pub const LOCK_FILE: &str = ".switchyard-spool.lock";
/// The file new spooled events are appended to.
const PENDING_FILE: &str = "pending.jsonl";
/// Prefix of the files the drainer has taken over from `pending.jsonl` or adopted.
const DRAINING_PREFIX: &str = "draining-";
/// Lines of the spool that are not readable events (a torn write at a crash), kept for inspection.
const REJECTED_FILE: &str = "rejected.jsonl";
/// Events published before their acknowledgements are awaited, per drain step.
const DRAIN_CHUNK: usize = 256;
/// Shortest and longest wait between drain passes while events remain spooled.
const RETRY_MIN: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// Wait between passes while the spool is empty (looks for directories left by other processes).
const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Whether a spooled entry belongs to `subjects`' prefix: its subject is the event's current one
/// or the per-request one earlier versions spooled (`<prefix>.usage.<kind>.<request-id>`).
fn ours(subjects: &Subjects, entry: &Entry) -> bool {
    entry.subject == subject_of(subjects, &entry.event)
        || entry.subject
            == subjects.usage(
                entry.event.kind.as_str(),
                &entry.event.request_id.to_string(),
            )
}

/// Counters of one [`Spool`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpoolStats {
    /// Events appended to the spool, events.
    pub spooled: u64,
    /// Spooled events published and acknowledged by JetStream, events.
    pub drained: u64,
}

/// What one [`Spool::drain`] pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainOutcome {
    /// Events published and acknowledged (and removed from the spool), events.
    pub published: u64,
    /// Events still spooled for this drainer's subjects (NATS still unreachable), events.
    pub remaining: u64,
    /// Events left alone because they belong to another subject prefix, events.
    pub foreign: u64,
}

/// A durable local spool directory of usage events (see the module docs), used through
/// [`crate::publish::publish_usage_event`] (or a [`crate::batch::UsagePublisher`]) and
/// [`drain_spool`].
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    /// Held (exclusively locked) while the spool is open; tells other processes it is in use.
    _lock: File,
    /// Serialises appends with the drainer taking over `pending.jsonl`.
    write: Mutex<()>,
    /// Serialises drain passes.
    draining: tokio::sync::Mutex<()>,
    /// Woken on every append.
    wake: tokio::sync::Notify,
    spooled: AtomicU64,
    drained: AtomicU64,
}

impl Spool {
    /// Opens (creating it if needed) the spool directory `dir` and locks it for this process.
    /// Fails when another live process holds it.
    pub fn open(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let in_use = |e: std::fs::TryLockError| {
            io::Error::other(format!(
                "spool {} is in use by another process: {e}",
                dir.display()
            ))
        };
        let path = dir.join(LOCK_FILE);
        let lock = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(lock) => {
                lock.try_lock().map_err(in_use)?;
                lock
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Lock first, then rename into place: an adopter never sees an unlocked lock file
                // of a directory that is being set up.
                let tmp = dir.join(format!("{LOCK_FILE}.{}.tmp", uuid::Uuid::now_v7()));
                let lock = File::create(&tmp)?;
                lock.try_lock().map_err(in_use)?;
                std::fs::rename(&tmp, &path)?;
                sync_dir(dir)?;
                lock
            }
            Err(e) => return Err(e),
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            _lock: lock,
            write: Mutex::new(()),
            draining: tokio::sync::Mutex::new(()),
            wake: tokio::sync::Notify::new(),
            spooled: AtomicU64::new(0),
            drained: AtomicU64::new(0),
        })
    }

    /// The spool directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Counters since the spool was opened.
    pub fn stats(&self) -> SpoolStats {
        SpoolStats {
            spooled: self.spooled.load(Ordering::Relaxed),
            drained: self.drained.load(Ordering::Relaxed),
        }
    }

    /// Appends one entry to `pending.jsonl` and fsyncs it (and the directory when the file is
    /// new) before returning. Blocking.
    pub(crate) fn append(&self, entry: &Entry) -> io::Result<()> {
        let mut line = serde_json::to_vec(entry).map_err(io::Error::other)?;
        line.push(b'\n');
        let _guard = self.write.lock().unwrap_or_else(|p| p.into_inner());
        let path = self.dir.join(PENDING_FILE);
        let existed = path.exists();
        let mut file = OpenOptions::new().create(true).append(true).open(&path)?;
        let before = file.metadata()?.len();
        if let Err(e) = file.write_all(&line).and_then(|()| file.sync_data()) {
            // Never leave a torn line the next append would glue itself to.
            let _ = file.set_len(before);
            return Err(e);
        }
        if !existed {
            sync_dir(&self.dir)?;
        }
        self.spooled.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
        Ok(())
    }

    /// Events currently spooled in this directory (all subject prefixes), events. Blocking.
    pub fn len(&self) -> io::Result<u64> {
        let _guard = self.write.lock().unwrap_or_else(|p| p.into_inner());
        let mut n = 0;
        for path in self.spool_files()? {
            n += read_lines(&path)?.len() as u64;
        }
        Ok(n)
    }

    /// Events spooled and the size of the spool files, (events, bytes); (0, 0) when unreadable.
    /// Blocking (reads the files only when they are not empty).
    pub fn size(&self) -> (u64, u64) {
        let bytes: u64 = match self.spool_files() {
            Ok(files) => files
                .iter()
                .filter_map(|p| std::fs::metadata(p).ok())
                .map(|m| m.len())
                .sum(),
            Err(_) => return (0, 0),
        };
        if bytes == 0 {
            return (0, 0);
        }
        (self.len().unwrap_or(0), bytes)
    }

    /// Whether no event is spooled. Blocking.
    pub fn is_empty(&self) -> io::Result<bool> {
        self.len().map(|n| n == 0)
    }

    /// `pending.jsonl` and the `draining-*.jsonl` files, draining files first in name order.
    fn spool_files(&self) -> io::Result<Vec<PathBuf>> {
        let mut draining = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(DRAINING_PREFIX) && name.ends_with(".jsonl") {
                draining.push(entry.path());
            }
        }
        draining.sort();
        let pending = self.dir.join(PENDING_FILE);
        if pending.exists() {
            draining.push(pending);
        }
        Ok(draining)
    }

    /// Moves `pending.jsonl` aside as a new draining file, so appends continue in a fresh file
    /// while the drainer works. Blocking.
    fn rotate(&self) -> io::Result<()> {
        let _guard = self.write.lock().unwrap_or_else(|p| p.into_inner());
        let pending = self.dir.join(PENDING_FILE);
        match std::fs::metadata(&pending) {
            Ok(m) if m.len() == 0 => std::fs::remove_file(&pending)?,
            Ok(_) => {
                std::fs::rename(&pending, self.dir.join(draining_name()))?;
                sync_dir(&self.dir)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Takes over the files of sibling spool directories whose lock is free (their process has
    /// exited) and removes those directories. Returns how many files were adopted. Blocking.
    fn adopt_orphans(&self) -> io::Result<usize> {
        let Some(parent) = self.dir.parent() else {
            return Ok(0);
        };
        let mut adopted = 0;
        for entry in std::fs::read_dir(parent)? {
            let path = entry?.path();
            if path == self.dir || !path.is_dir() {
                continue;
            }
            let Ok(lock) = OpenOptions::new()
                .read(true)
                .write(true)
                .open(path.join(LOCK_FILE))
            else {
                continue; // not a spool directory, or being removed
            };
            if lock.try_lock().is_err() {
                continue; // its process is alive
            }
            let Ok(files) = std::fs::read_dir(&path) else {
                continue; // adopted by another process meanwhile
            };
            for file in files {
                let file = file?;
                let name = file.file_name();
                let name = name.to_string_lossy().into_owned();
                if name == LOCK_FILE {
                    continue;
                }
                let target = if name == PENDING_FILE
                    || (name.starts_with(DRAINING_PREFIX) && name.ends_with(".jsonl"))
                {
                    adopted += 1;
                    self.dir.join(draining_name())
                } else if name == REJECTED_FILE {
                    self.dir
                        .join(format!("rejected-{}.jsonl", uuid::Uuid::now_v7()))
                } else {
                    // An unfinished rewrite (`*.tmp`): the file it was to replace still exists.
                    std::fs::remove_file(file.path())?;
                    continue;
                };
                std::fs::rename(file.path(), target)?;
            }
            sync_dir(&self.dir)?;
            std::fs::remove_file(path.join(LOCK_FILE))?;
            std::fs::remove_dir(&path)?;
            sync_dir(parent)?;
            tracing::info!(from = %path.display(), files = adopted, "adopted a spool left by an exited process");
        }
        Ok(adopted)
    }

    /// One pass: adopts orphaned sibling spools, takes over `pending.jsonl`, and publishes every
    /// spooled event whose subject is under `subjects`' prefix, removing each from the spool only
    /// after its acknowledgement. Stops at the first failure (the rest stays spooled). Events of
    /// other prefixes are kept untouched.
    pub async fn drain(
        self: &Arc<Self>,
        js: &async_nats::jetstream::Context,
        subjects: &Subjects,
    ) -> io::Result<DrainOutcome> {
        let _pass = self.draining.lock().await;
        if !connected(js) {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "NATS is not connected",
            ));
        }
        let files = {
            let me = self.clone();
            tokio::task::spawn_blocking(move || -> io::Result<Vec<PathBuf>> {
                if let Err(e) = me.adopt_orphans() {
                    tracing::warn!(error = %e, "adopting spools of exited processes failed");
                }
                me.rotate()?;
                let mut files = me.spool_files()?;
                // `pending.jsonl` was just rotated; anything in it now is newer than this pass.
                files.retain(|p| !p.ends_with(PENDING_FILE));
                Ok(files)
            })
            .await
            .map_err(io::Error::other)??
        };
        let mut out = DrainOutcome::default();
        let mut failed = false;
        for path in files {
            let lines = read_lines(&path)?;
            let mut keep: Vec<String> = Vec::new();
            let mut todo: Vec<(String, Entry)> = Vec::new();
            let mut rejected: Vec<String> = Vec::new();
            for line in lines {
                match serde_json::from_str::<Entry>(&line) {
                    Ok(mut entry) if ours(subjects, &entry) => {
                        // Spooled by an older version: re-published on the per-kind subject.
                        entry.subject = subject_of(subjects, &entry.event);
                        todo.push((line, entry));
                    }
                    Ok(_) => {
                        out.foreign += 1;
                        keep.push(line);
                    }
                    Err(e) => {
                        tracing::error!(file = %path.display(), error = %e, %line,
                            "unreadable spool line moved to rejected.jsonl");
                        rejected.push(line);
                    }
                }
            }
            let mut changed = !rejected.is_empty();
            for chunk in todo.chunks(DRAIN_CHUNK) {
                if failed {
                    keep.extend(chunk.iter().map(|(line, _)| line.clone()));
                    out.remaining += chunk.len() as u64;
                    continue;
                }
                let (acked, rest) = publish_chunk(js, chunk).await;
                out.published += acked as u64;
                self.drained.fetch_add(acked as u64, Ordering::Relaxed);
                changed |= acked > 0;
                if !rest.is_empty() {
                    failed = true;
                    out.remaining += rest.len() as u64;
                    keep.extend(rest);
                }
            }
            if !changed && !keep.is_empty() {
                continue; // nothing delivered from this file: leave it as it is
            }
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || finish_file(&dir, &path, &keep, &rejected))
                .await
                .map_err(io::Error::other)??;
        }
        Ok(out)
    }
}

/// Publishes a chunk of entries, then awaits the acknowledgements. Returns how many were
/// acknowledged and the lines of the rest (everything from the first failure on is kept).
async fn publish_chunk(
    js: &async_nats::jetstream::Context,
    chunk: &[(String, Entry)],
) -> (usize, Vec<String>) {
    let mut acks = Vec::with_capacity(chunk.len());
    for (_, entry) in chunk {
        let Ok(payload) = serde_json::to_vec(&entry.event) else {
            acks.push(None);
            continue;
        };
        match send(js, &entry.subject, &entry.msg_id, &payload).await {
            Ok(ack) => acks.push(Some(ack)),
            Err(e) => {
                tracing::debug!(error = %e, "re-publishing a spooled usage event failed");
                break;
            }
        }
    }
    let mut acked = 0;
    let mut rest = Vec::new();
    let mut iter = chunk.iter();
    for ack in acks {
        let Some((line, _)) = iter.next() else { break };
        let ok = match ack {
            Some(ack) => match ack.await {
                Ok(_) => true,
                Err(e) => {
                    tracing::debug!(error = %e, "spooled usage event not acknowledged");
                    false
                }
            },
            None => false,
        };
        if ok {
            acked += 1;
        } else {
            rest.push(line.clone());
        }
    }
    rest.extend(iter.map(|(line, _)| line.clone()));
    (acked, rest)
}

/// Removes a drained file, or replaces it atomically with the lines still to deliver; appends
/// unreadable lines to `rejected.jsonl`.
fn finish_file(dir: &Path, path: &Path, keep: &[String], rejected: &[String]) -> io::Result<()> {
    if !rejected.is_empty() {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(REJECTED_FILE))?;
        for line in rejected {
            f.write_all(line.as_bytes())?;
            f.write_all(b"\n")?;
        }
        f.sync_data()?;
    }
    if keep.is_empty() {
        std::fs::remove_file(path)?;
    } else {
        let tmp = path.with_extension("tmp");
        let mut f = File::create(&tmp)?;
        for line in keep {
            f.write_all(line.as_bytes())?;
            f.write_all(b"\n")?;
        }
        f.sync_data()?;
        std::fs::rename(&tmp, path)?;
    }
    sync_dir(dir)
}

/// The non-empty lines of a spool file (a torn last line is returned too and rejected later).
fn read_lines(path: &Path) -> io::Result<Vec<String>> {
    let text = match std::fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect())
}

/// A fresh, time-ordered draining file name.
fn draining_name() -> String {
    format!("{DRAINING_PREFIX}{}.jsonl", uuid::Uuid::now_v7())
}

/// fsyncs a directory, so renames and new files in it survive a crash.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Drains `spool` into JetStream until `shutdown` completes: a pass at start (which also adopts
/// spools left by exited processes), a pass right after each newly spooled event, retries every
/// 250 ms to 5 s while events remain, and a sweep every minute otherwise. Only events under
/// `subjects`' prefix are published.
pub async fn drain_spool(
    js: async_nats::jetstream::Context,
    subjects: Subjects,
    spool: Arc<Spool>,
    shutdown: impl Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut delay = RETRY_MIN;
    loop {
        let wait = match spool.drain(&js, &subjects).await {
            Ok(out) => {
                if out.published > 0 {
                    tracing::info!(
                        published = out.published,
                        remaining = out.remaining,
                        "spooled usage events delivered to JetStream"
                    );
                }
                if out.remaining == 0 {
                    delay = RETRY_MIN;
                    SWEEP_INTERVAL
                } else {
                    tracing::warn!(
                        remaining = out.remaining,
                        retry_ms = delay.as_millis() as u64,
                        "spooled usage events not yet accepted by JetStream; retrying"
                    );
                    let d = delay;
                    delay = (delay * 2).min(RETRY_MAX);
                    d
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotConnected => {
                let d = delay;
                delay = (delay * 2).min(RETRY_MAX);
                d
            }
            Err(e) => {
                tracing::warn!(error = %e, spool = %spool.dir().display(), "draining the usage spool failed");
                let d = delay;
                delay = (delay * 2).min(RETRY_MAX);
                d
            }
        };
        tokio::select! {
            biased;
            _ = shutdown.as_mut() => return,
            _ = spool.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests;
