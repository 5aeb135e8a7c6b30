//! The worker's side of one attempt's reply subject: frames published with increasing `seq`,
//! within the flow-control window ingress grants (docs/architecture.md, "Flow control"), and
//! coalesced into one message when ingress aggregates a non-streamed answer.

use crate::context::CallEnd;
use std::time::Duration;
use switchyard_schemas::{ErrorInfo, Frame, FrameBody};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The flow control of one attempt.
pub(crate) struct Flow {
    /// The latest grant: frames with `seq < upto` may be sent.
    pub(crate) upto: watch::Receiver<u32>,
    /// Longest wait for credit (`timeouts.stall_ms`).
    pub(crate) stall: Duration,
}

/// Why a sink stopped sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Halt {
    /// No credit within the stall deadline: the client stopped reading.
    Stalled,
    /// The attempt was cancelled while waiting for credit.
    Cancelled,
}

/// Publishes frames with increasing `seq` on one reply subject, within the attempt's window.
pub(crate) struct FrameSink {
    pub(crate) nats: async_nats::Client,
    pub(crate) reply: async_nats::Subject,
    pub(crate) seq: u32,
    pub(crate) content_sent: bool,
    /// `None`: the request carried no window (not flow-controlled).
    pub(crate) flow: Option<Flow>,
    pub(crate) cancel: CancellationToken,
    /// Set once the sink gave up waiting for credit; later frames (but the final error) are dropped.
    pub(crate) halted: Option<Halt>,
    /// Frames held back to go out as one message (a JSON array): `Some` when ingress aggregates
    /// the answer (non-streaming client), so a complete answer is one NATS message after `start`
    /// instead of one per frame.
    pub(crate) batch: Option<Vec<Frame>>,
    /// `start` is held in `batch`, to go out with the answer if it comes within [`START_HOLD`].
    pub(crate) start_held: bool,
}

/// How long a coalescing sink holds `start` for the answer to join it (one NATS message for a
/// fast upstream instead of two). Past it `start` goes alone, so ingress learns the worker (for
/// cancels and credit) within this much of the call starting; far below any first-frame timeout.
pub(crate) const START_HOLD: Duration = Duration::from_millis(10);

/// Most frames one coalesced message carries.
pub(crate) const BATCH_FRAMES: usize = 64;

impl FrameSink {
    /// Waits until the next frame fits the window; false (and `halted` set) after the stall
    /// deadline or a cancel.
    pub(crate) async fn credit(&mut self) -> bool {
        if self.halted.is_some() {
            return false;
        }
        let Some(flow) = self.flow.as_mut() else {
            return true;
        };
        let deadline = tokio::time::Instant::now() + flow.stall;
        loop {
            if self.seq < *flow.upto.borrow_and_update() {
                return true;
            }
            let halt = tokio::select! {
                biased;
                _ = self.cancel.cancelled() => Halt::Cancelled,
                r = flow.upto.changed() => match r {
                    Ok(()) => continue,
                    // The grant table lost the entry: no credit can come.
                    Err(_) => Halt::Stalled,
                },
                _ = tokio::time::sleep_until(deadline) => Halt::Stalled,
            };
            self.halted = Some(halt);
            return false;
        }
    }

    /// The call end for a halted sink.
    pub(crate) fn halt_end(&self) -> CallEnd {
        match self.halted {
            Some(Halt::Stalled) => CallEnd::Stalled,
            _ => CallEnd::Cancelled,
        }
    }

    /// A heartbeat, only if the window has room now: with the window used up ingress holds
    /// unread frames and needs no proof of life, and waiting here would delay the upstream.
    pub(crate) async fn heartbeat(&mut self) {
        let room = self
            .flow
            .as_ref()
            .is_none_or(|f| self.seq < *f.upto.borrow());
        if room && self.halted.is_none() {
            self.send(FrameBody::Heartbeat).await;
        }
    }

    /// Sends `body` once it fits the window; the terminal `error` never waits (ingress keeps one
    /// slot beyond the window for it). Dropped when the sink halted.
    pub(crate) async fn send(&mut self, body: FrameBody) {
        let exempt = matches!(body, FrameBody::Error { .. });
        if !exempt && !self.credit().await {
            return;
        }
        self.content_sent |= body.is_content();
        let (terminal, passes) = (body.is_terminal(), matches!(body, FrameBody::Heartbeat));
        self.start_held |= self.batch.is_some() && matches!(body, FrameBody::Start { .. });
        let frame = Frame {
            seq: self.seq,
            body,
        };
        self.seq += 1;
        if let Some(batch) = self.batch.as_mut()
            && !passes
        {
            batch.push(frame);
            if terminal || batch.len() >= BATCH_FRAMES {
                self.flush().await;
            }
            return;
        }
        // A heartbeat must not overtake held frames.
        self.flush().await;
        self.publish(serde_json::to_vec(&frame)).await;
    }

    /// Publishes the held frames as one message.
    pub(crate) async fn flush(&mut self) {
        let Some(batch) = self.batch.as_mut() else {
            return;
        };
        if batch.is_empty() {
            return;
        }
        self.start_held = false;
        let bytes = serde_json::to_vec(&*batch);
        batch.clear();
        self.publish(bytes).await;
    }

    pub(crate) async fn publish(&self, bytes: Result<Vec<u8>, serde_json::Error>) {
        match bytes {
            Ok(bytes) => {
                if let Err(e) = self.nats.publish(self.reply.clone(), bytes.into()).await {
                    tracing::warn!(error = %e, "publishing frame failed");
                }
            }
            Err(e) => tracing::error!(error = %e, "encoding frame failed"),
        }
    }

    pub(crate) async fn error(&mut self, error: ErrorInfo) {
        let content_sent = self.content_sent;
        self.send(FrameBody::Error {
            error,
            content_sent,
        })
        .await;
    }
}
