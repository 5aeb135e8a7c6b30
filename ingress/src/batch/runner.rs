//! Runs batch items and ends batches. Every ingress process runs one [`run`] loop: a pull
//! consumer ([`RUNNER_CONSUMER`], shared, so items spread over the replicas) and a sweeper.
//!
//! **An item** enters the same pipeline as a live request ([`execute`]): the endpoint's front
//! door (`front_door::serve`, or the embeddings handler) under the batch owner's caller and a
//! [`BatchItem`] routing context — so validation, routing, limits, retries, breakers, fallbacks,
//! budgets and the charge event are the live ones, and the result body is byte for byte what a
//! live request gets. The context gives the request a deterministic id and marks its usage
//! events with the batch id (batch price in billing and budgets; workers keep live headroom).
//!
//! **Priority.** At most `batch.max_in_flight` items run per ingress at once, and an item waits
//! while this ingress has more than `batch.yield_above` live requests in flight, so interactive
//! traffic goes first and batches use what is left.
//!
//! **Exactly once.** An item has one request id for all its tries and redeliveries
//! ([`Item::request_id`]); each run of it (any try, any delivery, any replica) claims a run
//! number `r` ([`BatchStore::claim_run`]) and numbers its upstream attempts from
//! `r × ATTEMPTS_PER_RUN`, so every upstream call keeps its own `upstream` ledger row under that
//! id (every call to the provider leaves exactly one usage record). The request's `charge`
//! event comes back to the runner ([`ChargeSlot`]) instead of going out: a retryable failure
//! (429, 408, 5xx) is not a result — the item is queued again as try `n + 1` after a backoff
//! and this try's charge is dropped — for a 429 (workers refuse batch items beyond half of each
//! target limit, `switchyard_workers::limits::BATCH_SHARE`) until the window ends, for the others
//! up to [`MAX_TRIES`]. The last try publishes its charge, then stores the result, then
//! acknowledges the message, so each executed item leaves exactly one `charge` row whatever
//! dies when. A runner that dies before the acknowledgement leaves the message to be redelivered
//! (after the consumer's `ack_wait`); a message whose item already has a stored result
//! ([`BatchStore::has_result`], looked up before every run: a restarted nats-server can
//! redeliver an item it had already handed out, with its delivery count back at 1) is
//! acknowledged without running, and one whose item is running on this runner right now is given
//! back until that run ends ([`Running`]). What can
//! still reach the provider twice is a call in flight when its answer was lost (the worker or
//! nats-server died after the upstream answered): at most the items in flight then
//! (`batch.max_in_flight` per ingress) — billed once all the same.
//!
//! **Sweeper** (every [`SWEEP_EVERY`]): for each active batch, marks it expiring once
//! `expires_at` passes (items still queued then end as `expired` without running), and when no
//! item of it is left on the queue, finalizes it ([`finalize`]): results → files, counts, usage,
//! terminal status, by compare-and-set so one replica does it.

use super::records::{BatchRecord, Item, ItemResult, Outcome, Status, usage_of};
use super::store::{BatchStore, RUNNER_CONSUMER, StoreError};
use crate::AppState;
use crate::context::{BatchItem, Caller, ChargeSlot, ClientInfo, RequestContext, RequestHints};
use async_nats::jetstream::{AckKind, consumer};
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use switchyard_schemas::{UsageEvent, now_ms};
use tokio_util::sync::CancellationToken;

/// Tries per item before a retryable error becomes its result.
pub const MAX_TRIES: u32 = 5;
/// How often the sweeper looks at active batches.
pub const SWEEP_EVERY: Duration = Duration::from_millis(500);
/// A batch stuck in `finalizing` this long (its finalizer died) is finalized again.
const REFINALIZE_AFTER_S: u64 = 30;
/// A batch still `validating` this long after creation was abandoned by its submitter.
const ABANDONED_AFTER_S: u64 = 300;
/// Longest wait for an item's charge event after its answer was read (its budget settlement
/// runs first); beyond it the try counts as unfinished and runs again.
const CHARGE_WAIT: Duration = Duration::from_secs(30);
/// Largest response body kept as a result, bytes.
const MAX_RESULT_BYTES: usize = 64 * 1024 * 1024;

/// Runs the consumer and the sweeper until `stop`; then waits for the items in flight.
pub async fn run(app: Arc<AppState>, store: Arc<BatchStore>, stop: CancellationToken) {
    let consumer = match store
        .items_stream()
        .get_or_create_consumer(
            RUNNER_CONSUMER,
            consumer::pull::Config {
                durable_name: Some(RUNNER_CONSUMER.into()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: ack_wait(&app),
                max_ack_pending: 100_000,
                ..Default::default()
            },
        )
        .await
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "batch runner: consumer not created; batches will not run here");
            return;
        }
    };
    let tasks = tokio_util::task::TaskTracker::new();
    let sweeper = {
        let (app, store, stop) = (app.clone(), store.clone(), stop.clone());
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => {
                        if let Err(e) = sweep(&app, &store).await {
                            tracing::warn!(error = %e, "batch sweep failed");
                        }
                    }
                }
            }
        })
    };
    let running = Running::default();
    let max = app.config.get().batch.max_in_flight.max(1);
    let permits = Arc::new(tokio::sync::Semaphore::new(max));
    // Pull only as many items as there are free slots: a prefetched item waiting for a slot would
    // outlive its `ack_wait` and be redelivered to another runner while still queued here.
    while !stop.is_cancelled() {
        let first = tokio::select! {
            _ = stop.cancelled() => break,
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let mut slots = vec![first];
        while let Ok(p) = permits.clone().try_acquire_owned() {
            slots.push(p);
        }
        yield_to_live(&app, &stop).await;
        let batch = consumer
            .fetch()
            .max_messages(slots.len())
            .expires(Duration::from_secs(5))
            .messages()
            .await;
        let mut batch = match batch {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "batch runner: pull failed; retrying");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => None,
                m = batch.next() => m,
            };
            let msg = match msg {
                Some(Ok(m)) => m,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "batch runner: pull error");
                    break;
                }
                None => break,
            };
            let Some(permit) = slots.pop() else {
                // More than asked for cannot arrive; give it back to be safe.
                let _ = msg.ack_with(AckKind::Nak(None)).await;
                break;
            };
            let (app, store, running) = (app.clone(), store.clone(), running.clone());
            tasks.spawn(async move {
                let _permit = permit;
                handle(&app, &store, &running, msg).await;
            });
        }
    }
    drop(sweeper);
    tasks.close();
    tasks.wait().await;
}

/// The items consumer's `ack_wait` (`batch.ack_wait_s`, at least 1 s): a runner that died
/// leaves its items to others after this.
fn ack_wait(app: &AppState) -> Duration {
    Duration::from_secs(app.config.get().batch.ack_wait_s.max(1))
}

/// Waits while this ingress serves more live requests than `batch.yield_above` (the in-flight
/// count includes up to `max_in_flight` batch items of its own).
async fn yield_to_live(app: &AppState, stop: &CancellationToken) {
    let b = &app.config.get().batch;
    let limit = b.yield_above + b.max_in_flight as u64;
    while app.stats.total_in_flight() > limit && !stop.is_cancelled() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The item messages (batch id, index, try) running on this runner now. A second delivery of
/// one of them (nats-server restarted and handed it out again) is given back with a delay
/// ([`DUPLICATE_DELAY`]) until the first run has ended.
#[derive(Clone, Default)]
struct Running(Arc<parking_lot::Mutex<std::collections::HashSet<(String, u64, u32)>>>);

/// How long a second delivery of a running item message waits before it comes back.
const DUPLICATE_DELAY: Duration = Duration::from_secs(1);

/// An item's place in [`Running`], released on drop.
struct RunningGuard {
    running: Running,
    key: (String, u64, u32),
}

impl Running {
    /// Marks `item` running, or `None` when it already is. The try is part of the key: a try
    /// queues its successor before it acknowledges, and the successor need not wait for that.
    fn enter(&self, item: &Item) -> Option<RunningGuard> {
        let key = (item.batch_id.clone(), item.index, item.try_no);
        self.0.lock().insert(key.clone()).then(|| RunningGuard {
            running: self.clone(),
            key,
        })
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.running.0.lock().remove(&self.key);
    }
}

async fn handle(
    app: &Arc<AppState>,
    store: &BatchStore,
    running: &Running,
    msg: async_nats::jetstream::Message,
) {
    let item: Item = match serde_json::from_slice(&msg.payload) {
        Ok(i) => i,
        Err(e) => {
            tracing::error!(error = %e, "batch item unreadable; dropped");
            let _ = msg.ack_with(AckKind::Term).await;
            return;
        }
    };
    let Some(_running) = running.enter(&item) else {
        // Its first run acknowledges the message (which drops this delivery too) or gives it
        // back; until then this delivery keeps coming back.
        let _ = msg.ack_with(AckKind::Nak(Some(DUPLICATE_DELAY))).await;
        return;
    };
    let ack = match run_item(app, store, &msg, &item).await {
        Ok(Step::Done) => msg.ack().await,
        Ok(Step::Later(wait)) => msg.ack_with(AckKind::Nak(Some(wait))).await,
        Err(e) => {
            tracing::warn!(batch = %item.batch_id, index = item.index, error = %e, "batch item not finished; redelivered later");
            msg.ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await
        }
    };
    if let Err(e) = ack {
        tracing::warn!(batch = %item.batch_id, index = item.index, error = %e, "batch item ack failed (it will run again, with the same request id)");
    }
}

/// What to do with an item's message.
enum Step {
    /// Acknowledge: its result is stored (or it was dropped).
    Done,
    /// Not yet (retry backoff): redeliver after this.
    Later(Duration),
}

async fn run_item(
    app: &Arc<AppState>,
    store: &BatchStore,
    msg: &async_nats::jetstream::Message,
    item: &Item,
) -> Result<Step, StoreError> {
    let Some((batch, _)) = store.batch(&item.batch_key).await? else {
        tracing::warn!(batch = %item.batch_id, "batch item of an unknown batch; dropped");
        return Ok(Step::Done);
    };
    let skip = |outcome| ItemResult {
        index: item.index,
        custom_id: item.custom_id.clone(),
        request_id: None,
        outcome,
        status_code: 0,
        body: serde_json::Value::Null,
        usage: Default::default(),
    };
    match batch.status {
        Status::Cancelling => {
            store
                .append_result(&batch.id, &skip(Outcome::Canceled))
                .await?;
            return Ok(Step::Done);
        }
        // Failed at validation, or already ended: nothing to run.
        s if s.is_terminal() => return Ok(Step::Done),
        _ if batch.expiring || now_ms() / 1000 >= batch.expires_at => {
            store
                .append_result(&batch.id, &skip(Outcome::Expired))
                .await?;
            return Ok(Step::Done);
        }
        _ => {}
    }
    let wait = item.not_before_ms.saturating_sub(now_ms());
    if wait > 0 {
        // Not yet: give the slot back and come back after the backoff.
        return Ok(Step::Later(Duration::from_millis(wait)));
    }
    // An item that has its result is not dispatched again: a redelivered message (its runner
    // died, or its acknowledgement was lost with nats-server, after the result was stored), a
    // later try (an earlier one's redelivery may have ended the item meanwhile), or an item a
    // restarted nats-server handed out again as a first delivery.
    if store.has_result(&batch.id, item.index).await? {
        tracing::info!(batch = %batch.id, index = item.index, "batch item already has its result; not run again");
        return Ok(Step::Done);
    }
    let run_no = store.claim_run(&batch.id, item.index, item.try_no).await?;
    let request_id = item.request_id(batch.created_ms);
    let attempt_base = run_no.saturating_mul(super::records::ATTEMPTS_PER_RUN);
    let run = execute(app, &batch, item, request_id, attempt_base);
    tokio::pin!(run);
    // A running item tells JetStream it is alive (`+WPI`) three times per `ack_wait`, so long
    // items are not redelivered while they run.
    let mut progress = tokio::time::interval(ack_wait(app) / 3);
    progress.tick().await;
    let (status, body, charge) = loop {
        tokio::select! {
            r = &mut run => break r?,
            _ = progress.tick() => { let _ = msg.ack_with(AckKind::Progress).await; }
        }
    };
    // Rate limited (the target's limits, or the batch share of them): wait and try again for
    // as long as the window allows. Other retryable failures: up to MAX_TRIES.
    let rate_limited = status == 429;
    let retryable = status == 408 || status >= 500;
    if rate_limited || (retryable && item.failures + 1 < MAX_TRIES) {
        let mut next = item.clone();
        next.try_no += 1;
        if !rate_limited {
            next.failures += 1;
        }
        let backoff_ms = if rate_limited {
            1000u64 << next.try_no.min(5)
        } else {
            1000u64 << item.failures.min(6)
        };
        next.not_before_ms = now_ms() + backoff_ms;
        store.enqueue(&next).await?;
        // This try's charge is dropped: the item's one charge is its last try's. (Its budget
        // reservation was settled at this try's usage — $0 for a 429, 408 or 5xx answer.)
        drop(charge);
        return Ok(Step::Done);
    }
    // The charge first, then the result: a crash in between re-runs the item under the same
    // request id, whose charge the ledger already holds (one row per item either way).
    if let Some(event) = charge
        && !app.usage.publish(event.clone()).await
    {
        return Err(StoreError::Nats(
            "batch item charge neither acknowledged nor spooled".into(),
        ));
    }
    let outcome = if status == 200 {
        Outcome::Succeeded
    } else {
        Outcome::Errored
    };
    let result = ItemResult {
        index: item.index,
        custom_id: item.custom_id.clone(),
        request_id: Some(request_id),
        outcome,
        status_code: status,
        usage: if outcome == Outcome::Succeeded {
            usage_of(&body)
        } else {
            Default::default()
        },
        body,
    };
    store.append_result(&batch.id, &result).await?;
    Ok(Step::Done)
}

/// Runs one item through its endpoint's live handler as the batch's owner: (HTTP status, body,
/// the request's charge event — `None` when it was refused before admission, so never charged).
/// Fails when the charge did not arrive within [`CHARGE_WAIT`] (the item runs again).
async fn execute(
    app: &Arc<AppState>,
    batch: &BatchRecord,
    item: &Item,
    request_id: uuid::Uuid,
    attempt_base: u32,
) -> Result<(u16, serde_json::Value, Option<UsageEvent>), StoreError> {
    let (slot, charge) = ChargeSlot::new();
    let caller = Caller {
        tenant: batch.tenant.clone(),
        key_id: batch.key_id.clone(),
        admin: false,
    };
    let ctx = RequestContext::new(
        caller,
        RequestHints::default(),
        ClientInfo {
            front_door: Some("batch"),
            ..ClientInfo::default()
        },
        None,
    )
    .for_batch(BatchItem {
        batch_id: batch.id.clone(),
        request_id,
        attempt_base,
        charge: slot.clone(),
    });
    let body = match serde_json::to_vec(&item.body) {
        Ok(b) => Bytes::from(b),
        // The item fails (500) rather than run with an empty body.
        Err(e) => {
            let err = crate::error::ApiError::encoding("the batch item body", &e);
            return Ok((err.status.as_u16(), err.body(), None));
        }
    };
    let headers = HeaderMap::new();
    let endpoint = batch.endpoint.clone();
    let app2 = app.clone();
    // Each handler's future is boxed: they are large (the whole front-door pipeline), and a
    // debug build polling them inline from this already deep task overflowed the 2 MiB stack of
    // a tokio worker thread.
    let resp = match endpoint.as_str() {
        "/v1/chat/completions" => {
            Box::pin(crate::front_door::serve(
                crate::chat::OpenAiChat::default(),
                app2,
                &ctx,
                &headers,
                &body,
            ))
            .await
        }
        "/v1/messages" => {
            Box::pin(crate::front_door::serve(
                crate::anthropic::AnthropicMessages { beta: None },
                app2,
                &ctx,
                &headers,
                &body,
            ))
            .await
        }
        "/v1/responses" => Box::pin(crate::responses::serve(app2, &ctx, &headers, &body)).await,
        _ => Box::pin(crate::embeddings::serve(app2, &ctx, &body)).await,
    };
    let (status, body) = read_response(resp).await;
    // No charge started: the sender is still here; dropping it ends the wait at once.
    drop(slot.take());
    let charge = match tokio::time::timeout(CHARGE_WAIT, charge).await {
        Ok(Ok(event)) => Some(event),
        Ok(Err(_)) => None,
        Err(_) => {
            return Err(StoreError::Nats(format!(
                "batch item charge not settled within {CHARGE_WAIT:?}"
            )));
        }
    };
    Ok((status, body, charge))
}

async fn read_response(resp: Response) -> (u16, serde_json::Value) {
    let status = resp.status().as_u16();
    match axum::body::to_bytes(resp.into_body(), MAX_RESULT_BYTES).await {
        Ok(b) => match serde_json::from_slice(&b) {
            Ok(v) => (status, v),
            Err(_) => (
                status,
                serde_json::json!({"error": {"message": String::from_utf8_lossy(&b), "type": "api_error"}}),
            ),
        },
        Err(e) => (
            500,
            serde_json::json!({"error": {"message": format!("response body unreadable: {e}"), "type": "api_error"}}),
        ),
    }
}

/// One pass over the active batches.
async fn sweep(app: &Arc<AppState>, store: &BatchStore) -> Result<(), StoreError> {
    for (id, key) in store.active().await? {
        let Some((mut batch, rev)) = store.batch(&key).await? else {
            store.clear_active(&id).await?;
            continue;
        };
        let now_s = now_ms() / 1000;
        match batch.status {
            s if s.is_terminal() => store.clear_active(&id).await?,
            Status::InProgress | Status::Cancelling => {
                if batch.status == Status::InProgress
                    && !batch.expiring
                    && now_s >= batch.expires_at
                {
                    batch.expiring = true;
                    store.update_batch(&key, &batch, rev).await?;
                    continue;
                }
                if store.pending(&id).await? == 0 {
                    finalize(app, store, &key, batch, rev).await?;
                }
            }
            // The ingress that validated it died while queueing its items: fail it (queued items
            // of a failed batch are dropped unrun) rather than run part of it.
            Status::Validating if batch.created_at() + ABANDONED_AFTER_S <= now_s => {
                batch.status = Status::Failed;
                batch.failed_at = Some(now_s);
                batch.errors = vec![super::records::LineError {
                    code: "submission_interrupted".into(),
                    message: "The gateway stopped while queueing this batch; submit it again."
                        .into(),
                    param: None,
                    line: None,
                }];
                if store.update_batch(&key, &batch, rev).await?.is_some() {
                    store.clear_active(&id).await?;
                }
            }
            Status::Finalizing
                if batch.finalizing_at.unwrap_or(0) + REFINALIZE_AFTER_S <= now_s =>
            {
                finalize(app, store, &key, batch, rev).await?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Ends a batch whose items all ended: claims it (`finalizing`, compare-and-set), writes its
/// result files, sets the counts, usage and terminal status, drops the stored results.
pub async fn finalize(
    _app: &Arc<AppState>,
    store: &BatchStore,
    key: &str,
    mut batch: BatchRecord,
    rev: u64,
) -> Result<(), StoreError> {
    let now_s = now_ms() / 1000;
    let terminal = if batch.status == Status::Cancelling || batch.cancelling_at.is_some() {
        Status::Cancelled
    } else if batch.expiring {
        Status::Expired
    } else {
        Status::Completed
    };
    batch.status = Status::Finalizing;
    batch.finalizing_at = Some(now_s);
    let Some(rev) = store.update_batch(key, &batch, rev).await? else {
        return Ok(()); // another replica finalizes it
    };
    let results = store.results(&batch.id).await?;
    let mut counts = batch.counts;
    counts.succeeded = 0;
    counts.errored = 0;
    counts.canceled = 0;
    counts.expired = 0;
    let mut usage = super::records::BatchUsage::default();
    for r in &results {
        match r.outcome {
            Outcome::Succeeded => counts.succeeded += 1,
            Outcome::Errored => counts.errored += 1,
            Outcome::Canceled => counts.canceled += 1,
            Outcome::Expired => counts.expired += 1,
        }
        usage.add(&r.usage);
    }
    let files = match batch.api {
        super::records::Api::OpenAi => super::openai::result_files(&batch, &results),
        super::records::Api::Anthropic => super::anthropic::result_files(&batch, &results),
    };
    for (slot, file, content) in files {
        let fkey = super::records::file_key(batch.tenant.as_deref(), &file.id);
        store.put_file(&fkey, &file, &content).await?;
        match slot {
            super::FileSlot::Output => batch.output_file_id = Some(file.id),
            super::FileSlot::Error => batch.error_file_id = Some(file.id),
        }
    }
    batch.counts = counts;
    batch.usage = usage;
    batch.status = terminal;
    match terminal {
        Status::Cancelled => batch.cancelled_at = Some(now_s),
        Status::Expired => batch.expired_at = Some(now_s),
        _ => batch.completed_at = Some(now_s),
    }
    if store.update_batch(key, &batch, rev).await?.is_none() {
        return Ok(()); // a re-finalization overtook this one; it writes the same files
    }
    store.purge_results(&batch.id).await?;
    store.clear_active(&batch.id).await?;
    tracing::info!(batch = %batch.id, status = ?terminal, succeeded = counts.succeeded, errored = counts.errored, "batch finished");
    Ok(())
}
