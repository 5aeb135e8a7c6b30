//! The group commit against a real nats-server: two processes' worth of combiners on one key,
//! 2,000 concurrent operations, every one applied exactly once; conflicts retried, not failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods, reason = "tasks end with their test")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use switchyard_kv::{Batch, Combiners, KvError, Plan, Stored};

/// A counter; counts the batches it applied and how many were computed from a fresh read
/// (after the first read of each process: a conflict with the other process).
struct Counter {
    applies: Arc<AtomicU64>,
    fresh: Arc<AtomicU64>,
}

impl Batch for Counter {
    type Value = u64;
    type Op = u64;
    /// The counter after this operation.
    type Answer = Result<u64, KvError>;

    fn max_contention(&self) -> Duration {
        Duration::from_secs(10)
    }
    fn decode(&self, key: &str, stored: Stored<u64>) -> Result<u64, KvError> {
        match stored {
            Stored::Value(v) => Ok(v),
            Stored::Absent => Ok(0),
            Stored::Unreadable(reason) => Err(KvError::Unreadable {
                key: key.into(),
                reason,
            }),
        }
    }
    fn needed_unawaited(&self, _: &u64) -> bool {
        true
    }
    fn apply(&mut self, value: &mut u64, ops: &[u64], fresh: bool) -> Plan<Self::Answer> {
        self.applies.fetch_add(1, Ordering::Relaxed);
        self.fresh.fetch_add(u64::from(fresh), Ordering::Relaxed);
        let answers = ops
            .iter()
            .map(|n| {
                *value += n;
                Ok(*value)
            })
            .collect();
        Plan::Write(answers)
    }
    fn undo(&self, _: u64, _: Self::Answer) -> Option<u64> {
        None
    }
    fn failed(&self, e: &KvError) -> Self::Answer {
        Err(e.clone())
    }
}

async fn bucket(nats: &switchyard_natsd::NatsServer) -> async_nats::jetstream::kv::Store {
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    match js.get_key_value("T").await {
        Ok(kv) => kv,
        Err(_) => js
            .create_key_value(async_nats::jetstream::kv::Config {
                bucket: "T".into(),
                history: 1,
                ..Default::default()
            })
            .await
            .unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_apply_every_operation_once() {
    let nats = switchyard_natsd::NatsServer::start_temp().unwrap();
    let (applies, fresh) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut procs = Vec::new();
    for _ in 0..2 {
        procs.push(Arc::new(Combiners::<Counter>::new(bucket(&nats).await)));
    }
    // 2,000 tasks in waves of 5 per task so both processes write many small batches.
    let tasks = (0..400).map(|i| {
        let (p, applies, fresh) = (procs[i % 2].clone(), applies.clone(), fresh.clone());
        tokio::spawn(async move {
            let c = p.get("n", || Counter { applies, fresh });
            let mut seen = Vec::new();
            for _ in 0..5 {
                seen.push(c.submit(1).await.unwrap().unwrap());
            }
            seen
        })
    });
    let mut seen: Vec<u64> = Vec::new();
    for t in futures::future::join_all(tasks).await {
        seen.extend(t.unwrap());
    }
    // Every operation saw a distinct counter value: none lost, none applied twice.
    seen.sort_unstable();
    assert_eq!(seen, (1..=2_000).collect::<Vec<_>>());
    let (_, stored) = switchyard_kv::load::<u64>(procs[0].store(), "n")
        .await
        .unwrap();
    assert_eq!(stored, Stored::Value(2_000));
    let batches = applies.load(Ordering::Relaxed);
    let fresh = fresh.load(Ordering::Relaxed);
    eprintln!("{batches} batch applications for 2,000 operations, {fresh} from a fresh read");
    assert!(batches < 2_000, "{batches}");
    for p in &procs {
        p.close().await;
    }
}

#[tokio::test]
async fn an_unreadable_entry_is_the_callers_policy() {
    let nats = switchyard_natsd::NatsServer::start_temp().unwrap();
    let kv = bucket(&nats).await;
    kv.put("bad", "{not json".into()).await.unwrap();
    let (revision, stored) = switchyard_kv::load::<u64>(&kv, "bad").await.unwrap();
    assert!(revision > 0);
    assert!(matches!(stored, Stored::Unreadable(_)), "{stored:?}");
    let p = Combiners::<Counter>::new(kv);
    let c = p.get("bad", || Counter {
        applies: Arc::default(),
        fresh: Arc::default(),
    });
    let r = c.submit(1).await.unwrap();
    assert!(matches!(r, Err(KvError::Unreadable { .. })), "{r:?}");
}

/// A deferred operation starts no batch: it is applied ahead of the next submitted one, in the
/// same write, or flushed on its own after its delay; under 2,000 concurrent operations from two
/// processes, half of them deferred, every one is applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_operations_ride_the_next_batch_or_flush() {
    let nats = switchyard_natsd::NatsServer::start_temp().unwrap();
    let (applies, fresh) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let p = Combiners::<Counter>::new(bucket(&nats).await);
    let c = p.get("d", || Counter {
        applies: applies.clone(),
        fresh: fresh.clone(),
    });
    let deferred = c.submit_deferred(5, Duration::from_secs(5));
    tokio::pin!(deferred);
    assert!(futures::poll!(&mut deferred).is_pending());
    assert_eq!(c.submit(1).await.unwrap().unwrap(), 6);
    assert_eq!(deferred.await.unwrap().unwrap(), 5);
    assert_eq!(applies.load(Ordering::Relaxed), 1, "one write for both");
    // Alone, it is flushed after its delay.
    let alone = c.submit_deferred(2, Duration::from_millis(20)).await;
    assert_eq!(alone.unwrap().unwrap(), 8);
    assert_eq!(applies.load(Ordering::Relaxed), 2);

    let procs = [p, Combiners::<Counter>::new(bucket(&nats).await)].map(Arc::new);
    let tasks = (0..2_000u64).map(|i| {
        let (p, applies, fresh) = (
            procs[(i % 2) as usize].clone(),
            applies.clone(),
            fresh.clone(),
        );
        tokio::spawn(async move {
            let c = p.get("d", || Counter { applies, fresh });
            if i % 4 < 2 {
                c.submit_deferred(1, Duration::from_millis(10)).await
            } else {
                c.submit(1).await
            }
            .unwrap()
            .unwrap()
        })
    });
    let mut seen: Vec<u64> = Vec::new();
    for t in futures::future::join_all(tasks).await {
        seen.push(t.unwrap());
    }
    seen.sort_unstable();
    assert_eq!(seen, (9..=2_008).collect::<Vec<_>>());
    for p in &procs {
        p.close().await;
    }
    let (_, stored) = switchyard_kv::load::<u64>(procs[0].store(), "d")
        .await
        .unwrap();
    assert_eq!(stored, Stored::Value(2_008));
}
