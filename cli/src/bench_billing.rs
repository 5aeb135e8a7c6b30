//! `switchyard bench billing`: how many usage rows per second the billing write path stores.
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use std::time::{Duration, Instant};
use switchyard_billing::ledger::ScratchSchema;
use switchyard_billing::{BillingService, Ledger, ServiceConfig};
use switchyard_schemas::subjects::{BILLING_CONSUMER, Subjects};
use switchyard_schemas::usage::{Usage, UsageEvent, UsageKind};

/// Publish acknowledgements awaited at once by the end-to-end publisher, acks.
const PUBLISH_WINDOW: usize = 4096;
/// How often the end-to-end run asks JetStream how far the billing consumer has acked.
const POLL: Duration = Duration::from_millis(20);

/// Options of `switchyard bench billing`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BillingBenchArgs {
    /// Usage events (ledger rows) per measurement, rows.
    #[arg(long, default_value_t = 100_000)]
    pub rows: u64,
    /// The ledger: `postgres://…` (each measurement creates and drops a schema of its own
    /// there) or `sqlite:` (each measurement uses a fresh file in the temporary directory).
    #[arg(
        long,
        env = "SWITCHYARD_BENCH_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    pub database_url: String,
    /// Events per `insert_batch` call, and the billing consumer's `batch_max`, rows.
    #[arg(long, default_value_t = ServiceConfig::default().batch_max)]
    pub batch: usize,
    /// Concurrent writers: `insert_batch` callers in the second raw measurement, and the
    /// billing consumer's `writers` (PostgreSQL).
    #[arg(long, default_value_t = ServiceConfig::default().writers)]
    pub writers: usize,
    /// Skip the end-to-end measurement (raw `insert_batch` only).
    #[arg(long)]
    pub raw_only: bool,
    /// Events per stream message in the end-to-end runs, as a JSON array of one kind the way
    /// the producers' lingered batches carry them (about 10 at 2,000 requests/s); 1 publishes
    /// each event alone, events.
    #[arg(long, default_value_t = 10)]
    pub per_message: usize,
}

/// An empty ledger for one measurement and what to clean up after it.
struct BenchLedger {
    ledger: Ledger,
    scratch: Scratch,
}

enum Scratch {
    Postgres(ScratchSchema),
    /// The SQLite file; its `-wal` and `-shm` companions go with it.
    Sqlite(std::path::PathBuf),
}

impl BenchLedger {
    async fn open(url: &str) -> Result<Self, String> {
        let (scratch, ledger_url) = if url.starts_with("sqlite:") {
            let path = std::env::temp_dir().join(format!(
                "switchyard-bench-{}.db",
                uuid::Uuid::now_v7().simple()
            ));
            let ledger_url = format!("sqlite://{}", path.display());
            (Scratch::Sqlite(path), ledger_url)
        } else {
            let schema = ScratchSchema::create(url, "switchyard_bench")
                .await
                .map_err(|e| format!("{url}: {e}"))?;
            let ledger_url = schema.url().to_owned();
            (Scratch::Postgres(schema), ledger_url)
        };
        let ledger = Ledger::connect(&ledger_url)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self { ledger, scratch })
    }

    async fn close(self) {
        self.ledger.close().await;
        match self.scratch {
            Scratch::Postgres(schema) => {
                if let Err(e) = schema.drop_schema().await {
                    eprintln!("dropping the benchmark schema failed: {e}");
                }
            }
            Scratch::Sqlite(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let mut file = path.clone().into_os_string();
                    file.push(suffix);
                    let _ = std::fs::remove_file(file);
                }
            }
        }
    }
}

/// `n` priced events as ingress and the workers write them: per request one `upstream` event
/// (gpt-4o-mini, cached and reasoning tokens, so three to four ledger lines) and one `charge`
/// with the audit values ingress sends (so an `audit_log` row too).
fn events(n: u64) -> Vec<UsageEvent> {
    let now = switchyard_schemas::now_ms();
    let mut out = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    let mut request_id = uuid::Uuid::now_v7();
    for i in 0..n {
        let upstream = i % 2 == 0;
        if upstream {
            request_id = uuid::Uuid::now_v7();
        }
        let kind = if upstream {
            UsageKind::Upstream
        } else {
            UsageKind::Charge
        };
        out.push(UsageEvent {
            attempt: u32::from(upstream),
            tenant: Some(format!("tenant-{}", i % 7)),
            key_id: Some(format!("key-{}", i % 31)),
            target: Some("openai-primary".into()),
            upstream_model: Some("gpt-4o-mini".into()),
            usage: Usage {
                prompt_tokens: 1200 + i % 500,
                cached_tokens: 512,
                cache_write_tokens: 0,
                completion_tokens: 300 + i % 100,
                reasoning_tokens: i % 3 * 10,
                ..Usage::default()
            },
            ttft_ms: Some(180),
            latency_ms: 950,
            finish_reason: Some(switchyard_schemas::FinishReason::Stop),
            audit: (!upstream).then(|| {
                Box::new(switchyard_schemas::audit::AuditInfo {
                    front_door: Some("openai".into()),
                    http_status: Some(200),
                    finish_reason: Some("stop".into()),
                    overhead_ms: Some(1),
                    client_ip: Some("10.0.0.7".into()),
                    user_agent: Some("openai-python/1.54.0".into()),
                    cache_outcome: Some("miss".into()),
                    ..Default::default()
                })
            }),
            ..UsageEvent::new(request_id, kind, now + i, "openai/gpt-4o-mini")
        });
    }
    out
}

/// Stores `events` in batches of `batch` through `writers` concurrent `insert_batch` callers
/// (each takes the next batch when its last one committed); returns the time taken.
async fn raw_inserts(
    ledger: &Ledger,
    events: &[UsageEvent],
    batch: usize,
    writers: usize,
) -> Result<Duration, String> {
    let batches: Vec<Vec<UsageEvent>> = events.chunks(batch).map(<[_]>::to_vec).collect();
    let queue = std::sync::Arc::new(parking_lot::Mutex::new(batches.into_iter()));
    let start = Instant::now();
    #[expect(clippy::disallowed_methods, reason = "every writer is awaited below")]
    let tasks: Vec<_> = (0..writers)
        .map(|_| {
            let (queue, ledger) = (queue.clone(), ledger.clone());
            tokio::spawn(async move {
                loop {
                    let next = queue.lock().next();
                    let Some(chunk) = next else { break };
                    ledger
                        .insert_batch(&chunk)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok::<(), String>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    Ok(start.elapsed())
}

/// CPU time (user + system) of this process so far.
fn own_cpu() -> Duration {
    Duration::from_secs_f64(
        crate::proc_stat::cpu_ticks(std::process::id()) as f64 / crate::proc_stat::TICKS_PER_S,
    )
}

/// `cpu` per row of `rows`, µs.
fn cpu_per_row_us(cpu: Duration, rows: u64) -> f64 {
    cpu.as_secs_f64() * 1e6 / rows.max(1) as f64
}

fn rate(rows: u64, elapsed: Duration) -> f64 {
    rows as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// Runs both measurements and prints them.
pub(crate) async fn run(args: BillingBenchArgs) -> Result<(), String> {
    let batch = args.batch.max(1);
    eprintln!(
        "switchyard bench billing: {} rows, batches of {batch}, ledger {}",
        args.rows,
        args.database_url.split('@').next_back().unwrap_or_default()
    );
    let events = events(args.rows);

    // (a) Raw insert_batch: one batch after the other, then `writers` callers at once (the
    // consumer stores each batch as that many concurrent parts on PostgreSQL; SQLite has one
    // writer at a time, so the consumer never splits batches there).
    let sqlite = args.database_url.starts_with("sqlite:");
    let writers = if sqlite { 1 } else { args.writers.max(1) };
    let mut runs = vec![1];
    if writers > 1 {
        runs.push(writers);
    }
    for writers in runs {
        let target = BenchLedger::open(&args.database_url).await?;
        let cpu = own_cpu();
        let raw = raw_inserts(&target.ledger, &events, batch, writers).await?;
        let cpu = own_cpu().saturating_sub(cpu);
        let stored = target.ledger.count().await.map_err(|e| e.to_string())?;
        target.close().await;
        if stored != args.rows {
            return Err(format!("raw insert stored {stored} of {} rows", args.rows));
        }
        println!(
            "insert_batch, {writers} writer(s): {:>7.0} rows/s  ({} rows in {:.3} s; CPU {:.1} \
             µs per row)",
            rate(args.rows, raw),
            args.rows,
            raw.as_secs_f64(),
            cpu_per_row_us(cpu, args.rows)
        );
    }
    if args.raw_only {
        return Ok(());
    }

    // (b) End to end: publishing while the consumer stores; then a backlog drained.
    end_to_end(&args, &events, batch, writers, false).await?;
    end_to_end(&args, &events, batch, writers, true).await?;
    Ok(())
}

/// Publishes `events` to a private JetStream (with `Nats-Msg-Id`, as ingress and the workers
/// do) and times the billing consumer storing them, until every message is acked (the consumer
/// acks only after the commit). `backlog = false`: the consumer runs while the events are
/// published, timed from the first publish. `backlog = true`: the events are all in the stream
/// first (as after a billing outage), timed from the consumer's start.
async fn end_to_end(
    args: &BillingBenchArgs,
    events: &[UsageEvent],
    batch: usize,
    writers: usize,
    backlog: bool,
) -> Result<(), String> {
    let nats_server = switchyard_natsd::NatsServer::start_temp().map_err(|e| e.to_string())?;
    let client = async_nats::connect(nats_server.url())
        .await
        .map_err(|e| e.to_string())?;
    let js = async_nats::jetstream::new(client.clone());
    let subjects = Subjects::new("sy");
    let stream = switchyard_billing::ensure_usage_stream(&js, &subjects)
        .await
        .map_err(|e| e.to_string())?;
    let target = BenchLedger::open(&args.database_url).await?;
    // Serialised up front (the producers' JSON encoding is ingress's work, not billing's), as
    // the producers' batches: a JSON array of up to `per_message` events of one kind.
    let mut messages = messages(&subjects, events, args.per_message)?;
    let message_count = messages.len() as u64;
    let published = if backlog {
        Some(
            spawn_publisher(js.clone(), std::mem::take(&mut messages), Instant::now())
                .await
                .map_err(|e| e.to_string())??,
        )
    } else {
        None
    };

    let config = ServiceConfig {
        batch_max: batch,
        writers,
        max_ack_pending: i64::try_from(batch.saturating_mul(20))
            .unwrap_or(i64::MAX)
            .max(ServiceConfig::default().max_ack_pending),
        ..ServiceConfig::default()
    };
    let consumer_nats = async_nats::connect(nats_server.url())
        .await
        .map_err(|e| e.to_string())?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = BillingService::new(consumer_nats, subjects.clone(), target.ledger.clone())
        .with_config(config);
    let consumer_start = Instant::now();
    let cpu = own_cpu();
    #[expect(
        clippy::disallowed_methods,
        reason = "awaited at the end of the run (the bench exits on an error before)"
    )]
    let service = tokio::spawn(service.run(async move {
        let _ = stopped.await;
    }));
    let (start, publisher) = if backlog {
        (consumer_start, None)
    } else {
        while stream.consumer_info(BILLING_CONSUMER).await.is_err() {
            if consumer_start.elapsed() > Duration::from_secs(10) {
                return Err("the billing consumer did not start within 10 s".into());
            }
            tokio::time::sleep(POLL).await;
        }
        let start = Instant::now();
        (start, Some(spawn_publisher(js, messages, start)))
    };
    // The consumer acks a message only after the transaction holding its row committed, so
    // "everything acked" is "every row committed". (Polling COUNT(*) instead would scan the
    // growing table and slow the database down.)
    let deadline = Duration::from_secs(60 + args.rows / 1_000);
    loop {
        tokio::time::sleep(POLL).await;
        let acked = match stream.consumer_info(BILLING_CONSUMER).await {
            Ok(info) => {
                info.ack_floor.stream_sequence >= message_count
                    && info.num_ack_pending == 0
                    && info.num_pending == 0
            }
            Err(_) => false,
        };
        if acked || start.elapsed() > deadline {
            break;
        }
    }
    let elapsed = start.elapsed();
    let cpu = own_cpu().saturating_sub(cpu);
    let published = match publisher {
        Some(p) => p.await.map_err(|e| e.to_string())??,
        None => published.unwrap_or_default(),
    };
    let _ = stop.send(());
    let stats = service
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let stored = target.ledger.count().await.map_err(|e| e.to_string())?;
    target.close().await;
    if stored != args.rows {
        return Err(format!(
            "end to end stored {stored} of {} rows within {deadline:?}",
            args.rows
        ));
    }
    let what = if backlog {
        "backlog drain"
    } else {
        "end to end"
    };
    println!(
        "{what}, {writers} writer(s): {:>9.0} rows/s  ({} rows in {:.3} s, {message_count} \
         messages; CPU of this process {:.1} µs per row{}; published in {:.3} s = {:.0}/s{}; {} \
         transactions)",
        rate(args.rows, elapsed),
        args.rows,
        elapsed.as_secs_f64(),
        cpu_per_row_us(cpu, args.rows),
        if backlog {
            ", the consumer's alone"
        } else {
            ", publisher included"
        },
        published.as_secs_f64(),
        rate(args.rows, published),
        if backlog {
            ", before the consumer started"
        } else {
            ""
        },
        stats.batches
    );
    Ok(())
}

/// The stream messages (subject, `Nats-Msg-Id`, payload) carrying `events`: per kind, JSON
/// arrays of up to `per_message` events (each event alone when `per_message` is 1).
fn messages(
    subjects: &Subjects,
    events: &[UsageEvent],
    per_message: usize,
) -> Result<Vec<(String, String, Vec<u8>)>, String> {
    let id = |e: &UsageEvent| format!("{}:{}:{}", e.request_id, e.kind.as_str(), e.attempt);
    let mut out = Vec::new();
    for kind in [UsageKind::Upstream, UsageKind::Charge] {
        let of_kind: Vec<&UsageEvent> = events.iter().filter(|e| e.kind == kind).collect();
        for chunk in of_kind.chunks(per_message.max(1)) {
            let (msg_id, payload) = match chunk {
                [one] => (id(one), serde_json::to_vec(one)),
                _ => (
                    format!("batch:{}:{}", id(chunk[0]), chunk.len()),
                    serde_json::to_vec(chunk),
                ),
            };
            let payload = payload.map_err(|e| e.to_string())?;
            out.push((subjects.usage_kind(kind.as_str()), msg_id, payload));
        }
    }
    Ok(out)
}

/// Publishes (subject, `Nats-Msg-Id`, payload) messages with up to [`PUBLISH_WINDOW`]
/// acknowledgements outstanding; returns the time from `start` to the last acknowledgement.
#[expect(
    clippy::disallowed_methods,
    reason = "the bench awaits the handle (it exits on an error before)"
)]
fn spawn_publisher(
    js: async_nats::jetstream::Context,
    messages: Vec<(String, String, Vec<u8>)>,
    start: Instant,
) -> tokio::task::JoinHandle<Result<Duration, String>> {
    tokio::spawn(async move {
        let mut acks = FuturesUnordered::new();
        for (subject, msg_id, payload) in messages {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", msg_id.as_str());
            let ack = js
                .publish_with_headers(subject, headers, payload.into())
                .await
                .map_err(|e| e.to_string())?;
            acks.push(ack.into_future());
            if acks.len() >= PUBLISH_WINDOW
                && let Some(r) = acks.next().await
            {
                r.map_err(|e| e.to_string())?;
            }
        }
        while let Some(r) = acks.next().await {
            r.map_err(|e| e.to_string())?;
        }
        Ok(start.elapsed())
    })
}
