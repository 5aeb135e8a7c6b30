//! Publishes normalised requests and demultiplexes worker replies, with flow control.
//!
//! Replies go to `<prefix>.inbox.<ingress-id>.<shard>.<request-id>.<attempt>`. The process holds
//! one wildcard subscription per shard (`<inbox>.<shard>.>`, one shard per core), each drained by
//! its own task that owns its routing table: no lock and no decoding on the demux path. A shard
//! task only parses the subject and hands the raw payload to the attempt's bounded channel; the
//! frame is decoded in the request's own task ([`Attempt::next`]).
//!
//! Flow control (see [`switchyard_schemas::frame`]): each attempt's channel holds `window + 1`
//! frames and [`Attempt::next`] grants the worker more credit as the front door consumes frames,
//! so a well-behaved worker never overflows it. A frame that does not fit is a protocol violation
//! that fails only that attempt; the demux never waits. The subscriptions keep async-nats's
//! per-subscription capacity (the connection's `subscription_capacity`, 65,536 messages by
//! default): it only has to absorb frames a shard task has not yet routed, since routed frames
//! wait in the attempts' own channels.

use bytes::Bytes;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use switchyard_schemas::frame::{AGGREGATE_WINDOW, Credit, STREAM_WINDOW, WINDOW_HEADER};
use switchyard_schemas::subjects::{CAP_CHAT, Subjects};
use switchyard_schemas::{ChatRequest, ErrorClass, ErrorInfo, Frame, FrameBody};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

type Key = (Uuid, u32);

/// Registrations a shard task may have queued (bounded; `send` waits when full).
const REGISTER_CAPACITY: usize = 1024;
/// Cancels of dropped attempts waiting to be published (bounded; beyond it the worker's stall
/// deadline is the backstop).
const CONTROL_CAPACITY: usize = 4096;
/// A waiting attempt re-sends its latest grant this often, in case a grant was lost.
const REGRANT_EVERY: Duration = Duration::from_millis(500);

/// What the demultiplexer hands an attempt.
#[derive(Debug)]
enum Incoming {
    /// A raw frame payload (decoded by the attempt).
    Frame(Bytes),
    /// NATS answered "no responders": no worker subscribed for this provider.
    NoResponders,
}

/// One attempt's entry in a shard's routing table.
struct Route {
    tx: mpsc::Sender<Incoming>,
    /// Set when the worker sent more than the window allows.
    overflow: Arc<AtomicBool>,
}

/// Sends requests to workers and routes their replies.
#[derive(Clone)]
pub struct Dispatcher {
    nats: async_nats::Client,
    subjects: Subjects,
    inbox: String,
    shards: Arc<[mpsc::Sender<(Key, Route)>]>,
    control: mpsc::Sender<(String, Bytes)>,
}

impl Dispatcher {
    /// Subscribes one inbox shard per core and starts, on `tasks`, their demultiplexer tasks and
    /// the task that publishes cancels of dropped attempts; all end when `stop` fires (the cancels
    /// queued by then are still published).
    pub async fn start(
        nats: async_nats::Client,
        subjects: Subjects,
        ingress_id: &str,
        tasks: &TaskTracker,
        stop: CancellationToken,
    ) -> Result<Self, async_nats::SubscribeError> {
        let inbox = subjects.inbox(ingress_id);
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(2, 16);
        let mut shards = Vec::with_capacity(n);
        for shard in 0..n {
            let prefix = format!("{inbox}.{shard}");
            let sub = nats.subscribe(format!("{prefix}.>")).await?;
            let (tx, rx) = mpsc::channel(REGISTER_CAPACITY);
            tasks.spawn(demux(sub, rx, prefix.len() + 1, stop.clone()));
            shards.push(tx);
        }
        // Make sure the server knows the inbox before the first reply can arrive.
        if !switchyard_publish::sync_with_server(&nats).await {
            tracing::warn!("could not confirm the inbox subscriptions with the NATS server");
        }
        let (control, mut control_rx) = mpsc::channel::<(String, Bytes)>(CONTROL_CAPACITY);
        let publisher = nats.clone();
        // Lives as long as any dispatcher clone or attempt, or until `stop`; ends after the last
        // cancel queued is out.
        tasks.spawn(async move {
            loop {
                let (subject, payload) = tokio::select! {
                    biased;
                    c = control_rx.recv() => match c {
                        Some(c) => c,
                        None => break,
                    },
                    _ = stop.cancelled() => break,
                };
                if let Err(e) = publisher.publish(subject, payload).await {
                    tracing::debug!(error = %e, "publishing a cancel failed");
                }
            }
        });
        Ok(Self {
            nats,
            subjects,
            inbox,
            shards: shards.into(),
            control,
        })
    }

    /// Publishes one attempt of `req` to its target's provider queue and returns its reply reader;
    /// `shown` is the request id its NATS headers carry (`X-Request-Id`).
    pub async fn send(&self, req: &ChatRequest, shown: &str) -> Result<Attempt, ErrorInfo> {
        let key = (req.id, req.attempt);
        let window = if req.stream {
            STREAM_WINDOW
        } else {
            AGGREGATE_WINDOW
        };
        // One slot beyond the window for the terminal `error` (see the frame module).
        let (tx, rx) = mpsc::channel(window as usize + 1);
        let overflow = Arc::new(AtomicBool::new(false));
        let shard = (req.id.as_u64_pair().1 % self.shards.len() as u64) as usize;
        let route = Route {
            tx,
            overflow: overflow.clone(),
        };
        let closed = || ErrorInfo::new(ErrorClass::Internal, "reply demultiplexer stopped");
        self.shards
            .get(shard)
            .ok_or_else(closed)?
            .send((key, route))
            .await
            .map_err(|_| closed())?;
        let attempt = Attempt {
            rx,
            overflow,
            key,
            nats: self.nats.clone(),
            subjects: self.subjects.clone(),
            control: self.control.clone(),
            next_seq: 0,
            window,
            granted: window,
            worker: None,
            finished: false,
            lost: false,
            pending: std::collections::VecDeque::new(),
        };
        let payload = serde_json::to_vec(req)
            .map_err(|e| ErrorInfo::new(ErrorClass::Internal, format!("encoding request: {e}")))?;
        let subject = self.subjects.request(CAP_CHAT, &req.target.provider);
        let reply = format!("{}.{shard}.{}.{}", self.inbox, req.id, req.attempt);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(WINDOW_HEADER, window.to_string().as_str());
        crate::spans::nats_headers(&mut headers, shown);
        self.nats
            .publish_with_reply_and_headers(subject, reply, headers, payload.into())
            .await
            .map_err(|e| {
                switchyard_publish::count_publish_error(switchyard_publish::PublishKind::Request);
                ErrorInfo::new(
                    ErrorClass::NoCapacity,
                    format!("publishing to NATS failed: {e}"),
                )
            })?;
        Ok(attempt)
    }
}

/// One shard: routes raw replies to attempts. Never waits on an attempt: a full channel fails that
/// attempt. Registrations are read first, so one queued before its request was published is in the
/// table before the first reply is routed.
async fn demux(
    mut sub: async_nats::Subscriber,
    mut register: mpsc::Receiver<(Key, Route)>,
    prefix_len: usize,
    stop: CancellationToken,
) {
    let mut routes: HashMap<Key, Route> = HashMap::new();
    // Dropped attempts leave closed entries; sweeping when the table doubles keeps it O(1) amortised.
    let mut sweep_at = 64;
    loop {
        tokio::select! {
            biased;
            // Shutdown: every attempt is over by then.
            _ = stop.cancelled() => break,
            r = register.recv() => {
                let Some((key, route)) = r else { break };
                routes.insert(key, route);
                if routes.len() >= sweep_at {
                    routes.retain(|_, r| !r.tx.is_closed());
                    sweep_at = (routes.len() * 2).max(64);
                }
            }
            m = sub.next() => {
                let Some(msg) = m else { break };
                let Some(key) = parse_key(msg.subject.get(prefix_len..).unwrap_or("")) else {
                    continue;
                };
                let incoming = if msg.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                    Incoming::NoResponders
                } else {
                    // A copy: async-nats slices payloads out of its 64 kB read buffer, and a
                    // buffered slice would pin that whole buffer while a client does not read.
                    Incoming::Frame(Bytes::copy_from_slice(&msg.payload))
                };
                let Some(route) = routes.get(&key) else { continue };
                match route.tx.try_send(incoming) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        route.overflow.store(true, Ordering::Release);
                        routes.remove(&key);
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        routes.remove(&key);
                    }
                }
            }
        }
    }
}

fn parse_key(rest: &str) -> Option<Key> {
    let (id, attempt) = rest.split_once('.')?;
    Some((id.parse().ok()?, attempt.parse().ok()?))
}

/// The reply stream of one attempt. Dropping it before the end (client went away) tells the
/// worker to abort the upstream call.
pub struct Attempt {
    rx: mpsc::Receiver<Incoming>,
    overflow: Arc<AtomicBool>,
    key: Key,
    nats: async_nats::Client,
    subjects: Subjects,
    control: mpsc::Sender<(String, Bytes)>,
    next_seq: u32,
    /// Frames the worker may have outstanding.
    window: u32,
    /// The latest grant: the worker may send `seq < granted`.
    granted: u32,
    worker: Option<String>,
    finished: bool,
    /// The attempt ended because its worker went silent, none picked it up, or reply frames were
    /// lost on the way: the worker's (or the path's) failure, not the target's
    /// ([`Attempt::worker_lost`]).
    lost: bool,
    /// Frames of a coalesced message (a JSON array) not yet handed out.
    pending: std::collections::VecDeque<Frame>,
}

impl Attempt {
    /// The next frame, waiting at most `limit`. Heartbeats are consumed here (they only prove the
    /// worker is alive). Missing workers, gaps in `seq`, window overruns and silence become
    /// classified errors delivered as an `error` frame, so callers handle one shape. Each consumed
    /// frame counts toward the worker's next credit grant.
    pub async fn next(&mut self, limit: Duration) -> FrameBody {
        loop {
            let frame = match self.pending.pop_front() {
                Some(f) => f,
                None => match self.receive(limit).await {
                    Ok(f) => f,
                    Err(error) => return error,
                },
            };
            if frame.seq != self.next_seq {
                // Core NATS dropped frames on the way (a server between ingress and the worker
                // failed, its clients reconnected): the path is lost, like a silent worker, and
                // another attempt may get through (503, not 500).
                self.lost = true;
                let msg = format!(
                    "lost reply frames: expected seq {}, got {}",
                    self.next_seq, frame.seq
                );
                return self.fail(ErrorClass::NoCapacity, &msg);
            }
            self.next_seq += 1;
            match frame.body {
                FrameBody::Heartbeat => {
                    self.grant(false).await;
                    continue;
                }
                FrameBody::Start { ref worker, .. } => self.worker = Some(worker.clone()),
                ref b if b.is_terminal() => self.finished = true,
                _ => {}
            }
            if !self.finished {
                self.grant(false).await;
            }
            return frame.body;
        }
    }

    /// The next message's first frame (a coalesced message's others go to `pending`), or the
    /// error frame that ends the attempt.
    async fn receive(&mut self, limit: Duration) -> Result<Frame, FrameBody> {
        let incoming = match self.recv(limit).await {
            Ok(Some(i)) => i,
            Ok(None) if self.overflow.load(Ordering::Acquire) => {
                let msg = format!(
                    "flow-control violation: the worker exceeded its window of {} frames",
                    self.window
                );
                return Err(self.fail(ErrorClass::Internal, &msg));
            }
            Ok(None) => return Err(self.fail(ErrorClass::Internal, "reply channel closed")),
            Err(()) => {
                self.lost = true;
                let what = if self.worker.is_some() {
                    "the worker went silent (no frame or heartbeat)"
                } else {
                    "no worker picked up the request"
                };
                return Err(self.fail(
                    ErrorClass::NoCapacity,
                    &format!("{what} within {} ms", limit.as_millis()),
                ));
            }
        };
        let payload = match incoming {
            Incoming::Frame(payload) => payload,
            Incoming::NoResponders => {
                return Err(self.fail(ErrorClass::NoCapacity, "no worker is serving this provider"));
            }
        };
        let bad = |e: serde_json::Error| format!("bad frame: {e}");
        if payload.first() == Some(&b'[') {
            let frames: Vec<Frame> = serde_json::from_slice(&payload)
                .map_err(|e| self.fail(ErrorClass::Internal, &bad(e)))?;
            self.pending.extend(frames);
            return self
                .pending
                .pop_front()
                .ok_or_else(|| self.fail(ErrorClass::Internal, "empty frame batch"));
        }
        serde_json::from_slice::<Frame>(&payload)
            .map_err(|e| self.fail(ErrorClass::Internal, &bad(e)))
    }

    /// Receives within `limit`; `Err` on timeout. Re-sends the latest grant every
    /// [`REGRANT_EVERY`] while waiting, so a lost grant cannot stall the attempt.
    async fn recv(&mut self, limit: Duration) -> Result<Option<Incoming>, ()> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let slice = (tokio::time::Instant::now() + REGRANT_EVERY).min(deadline);
            match tokio::time::timeout_at(slice, self.rx.recv()).await {
                Ok(r) => return Ok(r),
                Err(_) if slice >= deadline => return Err(()),
                Err(_) => self.grant(true).await,
            }
        }
    }

    /// Grants `window` frames beyond those consumed once half the window was consumed since the
    /// last grant (one grant per `window / 2` frames), or always when `resend`.
    async fn grant(&mut self, resend: bool) {
        let Some(worker) = &self.worker else { return };
        let upto = self.next_seq + self.window;
        if !resend && upto - self.granted < self.window / 2 {
            return;
        }
        self.granted = upto;
        let credit = Credit {
            id: self.key.0,
            attempt: self.key.1,
            upto,
        };
        let Ok(payload) = serde_json::to_vec(&credit) else {
            return;
        };
        let subject = self.subjects.credit(worker);
        if let Err(e) = self.nats.publish(subject, payload.into()).await {
            tracing::debug!(error = %e, "publishing a credit grant failed");
        }
    }

    fn fail(&mut self, class: ErrorClass, message: &str) -> FrameBody {
        FrameBody::Error {
            error: ErrorInfo::new(class, message),
            content_sent: false,
        }
    }

    /// The worker serving this attempt, once its `start` frame arrived.
    pub fn worker(&self) -> Option<&str> {
        self.worker.as_deref()
    }

    /// Whether the attempt failed because its worker went silent (no frame or heartbeat within
    /// the limit), no worker picked the request up, or reply frames were lost between the worker
    /// and ingress: another replica (or path) may serve the same target.
    pub fn worker_lost(&self) -> bool {
        self.lost
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        // The shard drops its entry when it next sees the closed channel (or sweeps).
        if !self.finished
            && let Some(worker) = self.worker.take()
        {
            // No task per drop: the dispatcher's publisher sends it. If its queue is full, the
            // worker's stall deadline ends the call instead (no more credit comes).
            let cancel = (
                self.subjects.cancel(&worker),
                Bytes::from(self.key.0.to_string()),
            );
            if self.control.try_send(cancel).is_err() {
                tracing::warn!(request = %self.key.0, "cancel queue full; the worker's stall deadline will end the call");
            }
        }
    }
}
