//! Publishes normalised requests and demultiplexes worker replies.
//!
//! One wildcard subscription `<prefix>.inbox.<ingress-id>.>` per ingress process receives every
//! reply; each attempt's frames go to `<inbox>.<request-id>.<attempt>` and are routed in-process to
//! the waiting handler through a channel. No NATS subscribe/unsubscribe happens per request.

use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use switchyard_schemas::subjects::{CAP_CHAT, Subjects};
use switchyard_schemas::{ChatRequest, ErrorClass, ErrorInfo, Frame, FrameBody};
use tokio::sync::mpsc;
use uuid::Uuid;

type Key = (Uuid, u32);

/// What the demultiplexer hands an attempt.
#[derive(Debug)]
enum Incoming {
    Frame(Frame),
    /// NATS answered "no responders": no worker subscribed for this provider.
    NoResponders,
    Undecodable(String),
}

type Pending = Arc<Mutex<HashMap<Key, mpsc::UnboundedSender<Incoming>>>>;

/// Sends requests to workers and routes their replies.
#[derive(Clone)]
pub struct Dispatcher {
    nats: async_nats::Client,
    subjects: Subjects,
    inbox: String,
    pending: Pending,
}

impl Dispatcher {
    /// Subscribes the process inbox and starts the demultiplexer task.
    pub async fn start(
        nats: async_nats::Client,
        subjects: Subjects,
        ingress_id: &str,
    ) -> Result<Self, async_nats::SubscribeError> {
        let inbox = subjects.inbox(ingress_id);
        let mut sub = nats.subscribe(format!("{inbox}.>")).await?;
        // Make sure the server knows the inbox before the first reply can arrive.
        if !switchyard_schemas::publish::sync_with_server(&nats).await {
            tracing::warn!("could not confirm the inbox subscription with the NATS server");
        }
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let routes = pending.clone();
        let prefix_len = inbox.len() + 1;
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let Some(key) = parse_key(msg.subject.get(prefix_len..).unwrap_or("")) else {
                    continue;
                };
                let incoming = if msg.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                    Incoming::NoResponders
                } else {
                    match serde_json::from_slice::<Frame>(&msg.payload) {
                        Ok(f) => Incoming::Frame(f),
                        Err(e) => Incoming::Undecodable(e.to_string()),
                    }
                };
                let tx = routes.lock().get(&key).cloned();
                if let Some(tx) = tx {
                    let _ = tx.send(incoming);
                }
            }
        });
        Ok(Self {
            nats,
            subjects,
            inbox,
            pending,
        })
    }

    /// Publishes one attempt of `req` to its target's provider queue and returns its reply reader.
    pub async fn send(&self, req: &ChatRequest) -> Result<Attempt, ErrorInfo> {
        let key = (req.id, req.attempt);
        let (tx, rx) = mpsc::unbounded_channel();
        self.pending.lock().insert(key, tx);
        let mut attempt = Attempt {
            rx,
            key,
            pending: self.pending.clone(),
            nats: self.nats.clone(),
            subjects: self.subjects.clone(),
            next_seq: 0,
            worker: None,
            finished: false,
        };
        let payload = serde_json::to_vec(req)
            .map_err(|e| ErrorInfo::new(ErrorClass::Internal, format!("encoding request: {e}")))?;
        let subject = self.subjects.request(CAP_CHAT, &req.target.provider);
        let reply = format!("{}.{}.{}", self.inbox, req.id, req.attempt);
        self.nats
            .publish_with_reply(subject, reply, payload.into())
            .await
            .map_err(|e| {
                ErrorInfo::new(
                    ErrorClass::NoCapacity,
                    format!("publishing to NATS failed: {e}"),
                )
            })?;
        attempt.finished = false;
        Ok(attempt)
    }
}

fn parse_key(rest: &str) -> Option<Key> {
    let (id, attempt) = rest.split_once('.')?;
    Some((id.parse().ok()?, attempt.parse().ok()?))
}

/// The reply stream of one attempt. Dropping it before the end (client went away) tells the
/// worker to abort the upstream call.
pub struct Attempt {
    rx: mpsc::UnboundedReceiver<Incoming>,
    key: Key,
    pending: Pending,
    nats: async_nats::Client,
    subjects: Subjects,
    next_seq: u32,
    worker: Option<String>,
    finished: bool,
}

impl Attempt {
    /// The next frame, waiting at most `limit`. Heartbeats are consumed here (they only prove the
    /// worker is alive). Missing workers, gaps in `seq` and silence become classified errors
    /// delivered as an `error` frame, so callers handle one shape.
    pub async fn next(&mut self, limit: Duration) -> FrameBody {
        loop {
            let incoming = match tokio::time::timeout(limit, self.rx.recv()).await {
                Ok(Some(i)) => i,
                Ok(None) => return self.fail(ErrorClass::Internal, "reply channel closed"),
                Err(_) => {
                    let what = if self.worker.is_some() {
                        "the worker went silent (no frame or heartbeat)"
                    } else {
                        "no worker picked up the request"
                    };
                    return self.fail(
                        ErrorClass::NoCapacity,
                        &format!("{what} within {} ms", limit.as_millis()),
                    );
                }
            };
            let frame = match incoming {
                Incoming::Frame(f) => f,
                Incoming::NoResponders => {
                    return self.fail(ErrorClass::NoCapacity, "no worker is serving this provider");
                }
                Incoming::Undecodable(e) => {
                    return self.fail(ErrorClass::Internal, &format!("bad frame: {e}"));
                }
            };
            if frame.seq != self.next_seq {
                let msg = format!(
                    "lost reply frames: expected seq {}, got {}",
                    self.next_seq, frame.seq
                );
                return self.fail(ErrorClass::Internal, &msg);
            }
            self.next_seq += 1;
            match frame.body {
                FrameBody::Heartbeat => continue,
                FrameBody::Start { ref worker, .. } => self.worker = Some(worker.clone()),
                ref b if b.is_terminal() => self.finished = true,
                _ => {}
            }
            return frame.body;
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
}

impl Drop for Attempt {
    fn drop(&mut self) {
        self.pending.lock().remove(&self.key);
        if !self.finished
            && let Some(worker) = self.worker.take()
        {
            let nats = self.nats.clone();
            let subject = self.subjects.cancel(&worker);
            let id = self.key.0.to_string();
            tokio::spawn(async move {
                let _ = nats.publish(subject, id.into()).await;
            });
        }
    }
}
