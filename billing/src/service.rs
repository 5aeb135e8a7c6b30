//! The consumer loop: usage stream → ledger, in batches, acking only after commit.
//!
//! Delivery guarantees: a message is acked only after the transaction holding its row commits.
//! A crash between commit and ack leads to a redelivery that the ledger's primary key ignores, so
//! every event is counted exactly once. A message that is not a storable [`UsageEvent`] (bad
//! JSON, a count beyond `i64::MAX`, a NUL in a string) can never succeed: it is logged with its
//! subject and acked with [`AckKind::Term`], so JetStream stops redelivering it instead of
//! looping forever (the work queue then removes it; the log line is the record). When the database
//! fails, the batch is nak'ed with a delay and redelivered later; nothing is dropped.
//!
//! Budget settlements an ingress could not write itself travel in the `charge` event
//! (`budget_owed`, docs/budgets.md): after the event's row commits, billing adds them to the
//! `SY_BUDGETS` entries ([`BudgetStore::settle_late`], idempotent per request id) and only then
//! acks; if the budget store is unreachable the message is nak'ed and redelivered (the ledger's
//! primary key absorbs the second insert, the entry's late-id list the second settlement).
//!
//! On PostgreSQL a batch is split by request id into [`ServiceConfig::writers`] parts stored in
//! concurrent transactions (each acked after its own commit): the database then works on more than
//! one core, and since every copy of an event lands in the same part, two transactions never
//! insert the same key.

use crate::decode::{Owed, decode};
use crate::row::UsageRow;
use crate::stream::{ensure_billing_consumer, ensure_usage_stream};
use crate::{Backend, BillingError, Ledger, Query};
use async_nats::jetstream::consumer::pull::{self, MessagesErrorKind};
use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::time::Duration;
use switchyard_budgets::{BudgetStore, Demand};
use switchyard_schemas::subjects::{BILLING_CONSUMER, Subjects, USAGE_STREAM};
use switchyard_schemas::usage::BudgetOwed;
use tokio::time::Instant;

/// Tuning of the consumer loop.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Most messages stored in one batch (default 1,000; split among [`Self::writers`]).
    pub batch_max: usize,
    /// Most usage events (rows) in one batch, rows (default 256): a message carries up to 256
    /// events, so this, not [`Self::batch_max`], bounds a transaction's work. A batch closes at
    /// the message that reaches it.
    pub batch_rows: usize,
    /// Longest wait for more messages once a batch has its first one (default 20 ms). Shorter
    /// waits make more, smaller transactions: each one a shorter burst on a core.
    pub batch_wait: Duration,
    /// Consumer `max_ack_pending`: delivered-but-unacked messages allowed (default 10 000; must
    /// exceed `2 * batch_max`, as the client pulls ahead while a batch is being stored).
    pub max_ack_pending: i64,
    /// Consumer `ack_wait`: redelivery delay of an unacked message (default 30 s).
    pub ack_wait: Duration,
    /// Nak delay after a failed insert, and pause before re-subscribing after an error (default 1 s).
    pub retry_delay: Duration,
    /// Transactions a batch is split into and stored concurrently on PostgreSQL, by request id
    /// (default 2; SQLite, which has one writer at a time, always uses 1). Each part commits on
    /// its own and its messages are acked after its commit.
    pub writers: usize,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            batch_max: 1000,
            batch_rows: 256,
            batch_wait: Duration::from_millis(20),
            max_ack_pending: 10_000,
            ack_wait: Duration::from_secs(30),
            retry_delay: Duration::from_secs(1),
            writers: 2,
        }
    }
}

/// Counters of one [`BillingService::run`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BillingStats {
    /// Transactions committed (a batch is one per writer part, see [`ServiceConfig::writers`]).
    pub batches: u64,
    /// Rows newly inserted.
    pub inserted: u64,
    /// Valid events already in the ledger (redelivery or replay).
    pub duplicates: u64,
    /// Messages terminated as undecodable or unstorable.
    pub terminated: u64,
    /// Transactions whose insert failed (their messages nak'ed for redelivery).
    pub failed_batches: u64,
}

/// Reads usage events from the durable consumer `billing` and stores them in the [`Ledger`].
#[derive(Debug)]
pub struct BillingService {
    nats: async_nats::Client,
    subjects: Subjects,
    ledger: Ledger,
    config: ServiceConfig,
    stats: BillingStats,
    /// Opened by [`Self::run`]: applies `budget_owed` settlements.
    budgets: Option<BudgetStore>,
    /// When [`Self::checkpoint`] last ran.
    checkpointed: Instant,
}

/// How often the consumer checkpoints a SQLite ledger's WAL ([`Ledger::checkpoint`]), at most.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// Consecutive transient pull errors after which the message stream is re-created.
const MAX_TRANSIENT_ERRORS: u32 = 3;

/// Runs a [`BillingService`] with the default [`ServiceConfig`], and answers every [`Query`]
/// ([`crate::serve_queries`]) and runs the audit retention ([`crate::audit::run_retention`])
/// beside it, until `shutdown` completes.
pub async fn run(
    nats: async_nats::Client,
    subjects: Subjects,
    ledger: Ledger,
    shutdown: impl Future,
) -> Result<(), BillingError> {
    // The query servers and the retention; each is stopped and awaited below.
    let tasks = tokio_util::task::TaskTracker::new();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let mut served: Vec<(tokio::task::JoinHandle<()>, &str)> = Query::ALL
        .into_iter()
        .map(|query| {
            let serving = crate::serve_queries(
                nats.clone(),
                subjects.clone(),
                query,
                ledger.clone(),
                stopped(),
            );
            (spawn_served(&tasks, serving, query.name()), query.name())
        })
        .collect();
    let retention = tasks.spawn(crate::audit::run_retention(ledger.clone(), stopped()));
    served.push((retention, "audit retention"));
    let result = BillingService::new(nats, subjects, ledger)
        .run(shutdown)
        .await
        .map(|_| ());
    let _ = stop.send(true);
    for (task, what) in served {
        if let Err(e) = task.await {
            tracing::error!(error = %e, "{what} task failed");
        }
    }
    tasks.close();
    tasks.wait().await;
    result
}

/// Spawns the server of one [`Query`] (named `what`) on `tasks` for [`run`], logging the error
/// when it cannot subscribe.
fn spawn_served(
    tasks: &tokio_util::task::TaskTracker,
    served: impl Future<Output = Result<(), BillingError>> + Send + 'static,
    what: &'static str,
) -> tokio::task::JoinHandle<()> {
    tasks.spawn(async move {
        if let Err(e) = served.await {
            tracing::error!(error = %e, "{what} queries are not served");
        }
    })
}

/// What waiting for a batch produced.
enum Collected {
    /// Decoded messages to store; `stop` when shutdown was requested meanwhile.
    Batch { batch: Decoded, stop: bool },
    /// Shutdown requested with nothing in hand.
    Shutdown,
    /// Time for the periodic budget bucket check, with nothing in hand.
    Tick,
    /// The message stream ended or failed for good; re-subscribe.
    Lost(String),
}

impl BillingService {
    /// A service with the default [`ServiceConfig`].
    pub fn new(nats: async_nats::Client, subjects: Subjects, ledger: Ledger) -> Self {
        Self {
            nats,
            subjects,
            ledger,
            config: ServiceConfig::default(),
            stats: BillingStats::default(),
            budgets: None,
            checkpointed: Instant::now(),
        }
    }

    /// Replaces the tuning.
    pub fn with_config(mut self, config: ServiceConfig) -> Self {
        self.config = config;
        self
    }

    /// Ensures the usage stream and the consumer, then stores batches until `shutdown` completes.
    /// The batch in hand when shutdown arrives is finished (stored and acked) first. Fails only
    /// if the initial stream/consumer setup fails; later errors are logged and retried.
    pub async fn run(mut self, shutdown: impl Future) -> Result<BillingStats, BillingError> {
        let js = jetstream::new(self.nats.clone());
        let budgets = BudgetStore::connect(&js, "billing").await;
        self.budgets = Some(budgets);
        let mut shutdown = pin!(shutdown);
        let mut messages = Some(self.subscribe(&js).await?);
        tracing::info!(subjects = %self.subjects.usage_all(), "billing consumer started");
        // A lost `SY_BUDGETS` bucket comes back new: rebuilt from the ledger at the first check
        // without a backlog (entries an ingress created meanwhile get the earlier spend added).
        let mut bucket_check = crate::budget_rebuild::BucketCheck::default();
        let mut tick = tokio::time::interval(crate::budget_rebuild::BUCKET_CHECK_EVERY);
        // A busy consumer misses ticks: one check after the batch, not a burst.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let Some(stream) = messages.as_mut() else {
                if pause(self.config.retry_delay, &mut shutdown).await {
                    break;
                }
                match self.subscribe(&js).await {
                    Ok(stream) => messages = Some(stream),
                    Err(e) => {
                        tracing::warn!(error = %e, "re-subscribing to the usage stream failed")
                    }
                }
                continue;
            };
            match self.collect(stream, &mut tick, &mut shutdown).await {
                Collected::Tick => {
                    if let Some(store) = &self.budgets {
                        let backlog = self.backlog(&js).await;
                        bucket_check.run(&self.ledger, store, backlog).await;
                    }
                }
                Collected::Batch { batch, stop } => {
                    let ok = self.process(batch).await;
                    if ok {
                        self.checkpoint().await;
                    }
                    if stop || (!ok && pause(self.config.retry_delay, &mut shutdown).await) {
                        break;
                    }
                }
                Collected::Shutdown => break,
                Collected::Lost(reason) => {
                    tracing::warn!(%reason, "usage message stream lost; re-subscribing");
                    messages = None;
                }
            }
        }
        // Acks are buffered publishes: push them out before the caller drops the client.
        if let Err(e) = self.nats.flush().await {
            tracing::warn!(error = %e, "flushing acks on shutdown failed");
        }
        tracing::info!(stats = ?self.stats, "billing consumer stopped");
        Ok(self.stats)
    }

    /// The billing consumer's pending plus unacknowledged messages (`u64::MAX` when unknown).
    async fn backlog(&self, js: &jetstream::Context) -> u64 {
        let info = async {
            let stream = js.get_stream(USAGE_STREAM).await.ok()?;
            stream.consumer_info(BILLING_CONSUMER).await.ok()
        };
        match info.await {
            Some(i) => i.num_pending.saturating_add(i.num_ack_pending as u64),
            None => u64::MAX,
        }
    }

    /// Ensures stream and consumer and opens the pull message stream.
    async fn subscribe(&self, js: &jetstream::Context) -> Result<pull::Stream, BillingError> {
        let stream = ensure_usage_stream(js, &self.subjects).await?;
        let consumer =
            ensure_billing_consumer(&stream, self.config.max_ack_pending, self.config.ack_wait)
                .await?;
        let batch = self.config.batch_max.max(1);
        Ok(consumer
            .stream()
            .max_messages_per_batch(batch)
            .expires(Duration::from_secs(30))
            .heartbeat(Duration::from_secs(10))
            .messages()
            .await?)
    }

    /// Waits for a first message (or shutdown), then gathers more for up to `batch_wait` or until
    /// `batch_max` messages or `batch_rows` rows are in hand. Each message is decoded as it
    /// arrives (an unstorable one is terminated at once), so decoding is spread over the wait
    /// instead of added to the store.
    async fn collect<F: Future>(
        &mut self,
        stream: &mut pull::Stream,
        tick: &mut tokio::time::Interval,
        shutdown: &mut Pin<&mut F>,
    ) -> Collected {
        let mut transient = 0;
        let first = loop {
            let next = tokio::select! {
                biased;
                _ = shutdown.as_mut() => return Collected::Shutdown,
                _ = tick.tick() => return Collected::Tick,
                next = stream.next() => next,
            };
            match next {
                Some(Ok(message)) => break message,
                None => return Collected::Lost("message stream ended".into()),
                Some(Err(e)) if is_fatal(e.kind()) => return Collected::Lost(e.to_string()),
                Some(Err(e)) => {
                    transient += 1;
                    tracing::warn!(error = %e, "pulling usage events failed");
                    if transient >= MAX_TRANSIENT_ERRORS {
                        return Collected::Lost(e.to_string());
                    }
                    if pause(self.config.retry_delay, shutdown).await {
                        return Collected::Shutdown;
                    }
                }
            }
        };
        let mut batch = Decoded::default();
        self.take(&mut batch, first).await;
        let deadline = Instant::now() + self.config.batch_wait;
        while batch.messages.len() < self.config.batch_max
            && batch.rows.len() < self.config.batch_rows.max(1)
        {
            let next = tokio::select! {
                biased;
                _ = shutdown.as_mut() => return Collected::Batch { batch, stop: true },
                _ = tokio::time::sleep_until(deadline) => break,
                next = stream.next() => next,
            };
            match next {
                Some(Ok(message)) => self.take(&mut batch, message).await,
                // Store what is in hand; the next `collect` reports the error again if it lasts.
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "pulling usage events failed mid-batch");
                    break;
                }
                None => break,
            }
        }
        Collected::Batch { batch, stop: false }
    }

    /// Decodes `message` into `batch`; a message that is not a storable [`UsageEvent`]
    /// (`switchyard_schemas::UsageEvent`) is logged and terminated instead.
    async fn take(&mut self, batch: &mut Decoded, message: jetstream::Message) {
        match decode(&message.payload) {
            Ok(events) => {
                let i = batch.messages.len();
                (batch.rows).extend(events.into_iter().map(|(row, owed)| (row, owed, i)));
                batch.messages.push(message);
            }
            Err(reason) => {
                self.stats.terminated += 1;
                tracing::warn!(
                    subject = %message.subject,
                    %reason,
                    "terminating usage message that is not a storable UsageEvent"
                );
                if let Err(e) = message.ack_with(AckKind::Term).await {
                    tracing::warn!(subject = %message.subject, error = %e, "term failed");
                }
            }
        }
    }

    /// Stores and acks one decoded batch. Returns false when an insert failed (its messages
    /// nak'ed). A message may carry several events (a JSON array, see
    /// `switchyard_publish::batch`); it is acked once every row it carries committed.
    async fn process(&mut self, batch: Decoded) -> bool {
        let Decoded { rows, messages } = batch;
        let writers = match self.ledger.backend() {
            Backend::Sqlite => 1,
            Backend::Postgres => self.config.writers.max(1),
        };
        // Parts by request id: concurrent transactions never share a key.
        let mut parts: Vec<Part> = (0..writers).map(|_| (Vec::new(), Vec::new())).collect();
        for (row, owed, i) in rows {
            if let Some(part) = parts.get_mut(row.lane(writers)) {
                part.0.push(row);
                part.1.push((i, owed));
            }
        }
        parts.retain(|(rows, _)| !rows.is_empty());
        let started = Instant::now();
        let results =
            futures::future::join_all(parts.iter().map(|(rows, _)| self.ledger.insert_rows(rows)))
                .await;
        let store_us = started.elapsed().as_micros();
        tracing::debug!(events = rows_len(&parts), store_us, "usage batch stored");
        // A message is acked only when every part holding one of its rows committed and every
        // budget settlement it carries was applied.
        let mut ok = vec![true; messages.len()];
        let mut all_ok = true;
        for ((rows, owners), result) in parts.iter().zip(results) {
            let committed = self.record(rows.len(), result);
            all_ok &= committed;
            for (i, owed) in owners {
                let settled = match owed {
                    Some((request_id, owed)) if committed => {
                        self.settle_budget(request_id, owed).await
                    }
                    _ => committed,
                };
                if let Some(slot) = ok.get_mut(*i) {
                    *slot &= settled;
                }
            }
        }
        for (message, ok) in messages.iter().zip(ok) {
            // A lost ack means a redelivery, which the primary key absorbs.
            let result = if ok {
                message.ack().await
            } else {
                message
                    .ack_with(AckKind::Nak(Some(self.config.retry_delay)))
                    .await
            };
            if let Err(e) = result {
                tracing::warn!(subject = %message.subject, error = %e, "ack/nak failed");
            }
        }
        all_ok
    }

    /// A passive WAL checkpoint ([`Ledger::checkpoint`]) once [`CHECKPOINT_EVERY`] has passed:
    /// run after a batch is acked, so its copy of WAL pages into the database file neither
    /// lengthens a commit nor delays an ack (SQLite's own checkpoint at `wal_autocheckpoint`
    /// pages runs inside the commit that crosses it).
    async fn checkpoint(&mut self) {
        if self.checkpointed.elapsed() < CHECKPOINT_EVERY {
            return;
        }
        self.checkpointed = Instant::now();
        if let Err(e) = self.ledger.checkpoint().await {
            tracing::warn!(error = %e, "ledger WAL checkpoint failed");
        }
    }

    /// Counts one part's insert; returns whether it committed.
    fn record(&mut self, rows: usize, result: Result<u64, BillingError>) -> bool {
        match result {
            Ok(inserted) => {
                self.stats.batches += 1;
                self.stats.inserted += inserted;
                self.stats.duplicates += (rows as u64).saturating_sub(inserted);
                true
            }
            Err(e) => {
                self.stats.failed_batches += 1;
                tracing::error!(error = %e, events = rows, "storing usage batch failed; nak");
                false
            }
        }
    }
}

impl BillingService {
    /// Adds `owed` to each of its scopes once; false when the budget store did not take it
    /// (the message is then redelivered).
    async fn settle_budget(&self, request_id: &str, owed: &BudgetOwed) -> bool {
        let Some(store) = &self.budgets else {
            return false;
        };
        let actual = Demand {
            usd: owed.usd,
            tokens: owed.tokens,
        };
        for scope in &owed.scopes {
            if let Err(e) = store.settle_late(scope, request_id, actual).await {
                tracing::warn!(request = request_id, scope, error = %e,
                    "late budget settlement failed; the event is redelivered");
                return false;
            }
        }
        true
    }
}

/// Messages decoded by [`BillingService::collect`]: their rows, each with its owed settlement
/// and the index of its message.
#[derive(Default)]
struct Decoded {
    rows: Vec<(UsageRow, Owed, usize)>,
    messages: Vec<jetstream::Message>,
}

/// One writer's share of a batch: rows, and per row the index of its message and its owed
/// settlement.
type Part = (Vec<UsageRow>, Vec<(usize, Owed)>);

/// Rows in `parts`.
fn rows_len(parts: &[Part]) -> usize {
    parts.iter().map(|(rows, _)| rows.len()).sum()
}

/// Pull errors after which the message stream yields nothing more.
fn is_fatal(kind: MessagesErrorKind) -> bool {
    matches!(
        kind,
        MessagesErrorKind::ConsumerDeleted
            | MessagesErrorKind::PushBasedConsumer
            | MessagesErrorKind::RequestLimitExceeded
    )
}

/// Sleeps `delay` unless shutdown completes first; returns true on shutdown.
async fn pause<F: Future>(delay: Duration, shutdown: &mut Pin<&mut F>) -> bool {
    tokio::select! {
        biased;
        _ = shutdown.as_mut() => true,
        _ = tokio::time::sleep(delay) => false,
    }
}
