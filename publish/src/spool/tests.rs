//! Tests of the spool and its drainer, with the publish that fills it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods, reason = "tasks end with their test")]
use super::*;
use crate::message::msg_id_of;
use crate::publish::publish_usage_event;
use crate::test_support::{event, messages, server};
use switchyard_schemas::usage::{UsageEvent, UsageKind};

fn entry(subjects: &Subjects, e: &UsageEvent) -> Entry {
    Entry {
        subject: subject_of(subjects, e),
        msg_id: msg_id_of(e),
        event: e.clone(),
    }
}

/// Polls `f` every 20 ms until it is true; fails after `limit`.
async fn until<F: FnMut() -> Fut, Fut: Future<Output = bool>>(limit: Duration, mut f: F) {
    let deadline = tokio::time::Instant::now() + limit;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Events published while the server is down are
/// spooled (fsync'd lines) and drained exactly once when it is back; a spooled event the stream
/// already holds (its acknowledgement was lost) is dropped by the `Nats-Msg-Id` dedupe.
#[tokio::test]
async fn spooled_while_down_then_drained_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let spool = Arc::new(Spool::open(&tmp.path().join("spool").join("test-1")).unwrap());
    let (mut server, js, mut stream) = server().await;
    let subjects = Subjects::default();

    let stored = event(UsageKind::Charge);
    assert!(publish_usage_event(&js, Some(&spool), &subjects, &stored).await);
    assert_eq!(spool.stats().spooled, 0);

    server.stop().unwrap();
    let a = event(UsageKind::Upstream);
    let b = event(UsageKind::Charge);
    let (ra, rb) = tokio::join!(
        publish_usage_event(&js, Some(&spool), &subjects, &a),
        publish_usage_event(&js, Some(&spool), &subjects, &b)
    );
    assert!(ra && rb, "spooled counts as stored");
    assert_eq!(spool.stats().spooled, 2);
    assert_eq!(spool.len().unwrap(), 2);
    let text = std::fs::read_to_string(spool.dir().join(PENDING_FILE)).unwrap();
    let mut spooled: Vec<(String, String, UsageEvent)> = text
        .lines()
        .map(|l| serde_json::from_str::<Entry>(l).unwrap())
        .map(|e| (e.msg_id, e.subject, e.event))
        .collect();
    spooled.sort_by_key(|(id, _, _)| id.clone());
    let mut want: Vec<_> = [&a, &b]
        .map(|e| (msg_id_of(e), subject_of(&subjects, e), e.clone()))
        .into();
    want.sort_by_key(|(id, _, _)| id.clone());
    assert_eq!(spooled, want);
    spool.append(&entry(&subjects, &stored)).unwrap();

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let drainer = tokio::spawn(drain_spool(
        js.clone(),
        subjects.clone(),
        spool.clone(),
        async {
            let _ = stopped.await;
        },
    ));
    server.restart().unwrap();
    until(Duration::from_secs(20), || {
        let spool = spool.clone();
        async move { spool.stats().drained == 3 && spool.is_empty().unwrap() }
    })
    .await;
    assert_eq!(messages(&mut stream).await, 3);
    // Subjects are per kind, so the events are found by sequence.
    let mut stored_events = Vec::new();
    for seq in 1..=3 {
        let m = stream.get_raw_message(seq).await.unwrap();
        let e: UsageEvent = serde_json::from_slice(&m.payload).unwrap();
        assert_eq!(m.subject.as_str(), subject_of(&subjects, &e));
        stored_events.push(e);
    }
    for e in [&stored, &a, &b] {
        assert!(stored_events.contains(e), "{e:?} not in the stream");
    }
    // Another pass finds nothing to do.
    let again = spool.drain(&js, &subjects).await.unwrap();
    assert_eq!(again, DrainOutcome::default());
    assert_eq!(messages(&mut stream).await, 3);
    stop.send(()).unwrap();
    drainer.await.unwrap();
}

/// An event spooled by an earlier version on its per-request subject is delivered on the
/// per-kind subject, not kept as foreign.
#[tokio::test]
async fn legacy_spooled_subjects_are_republished_per_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let (_server, js, mut stream) = server().await;
    let subjects = Subjects::default();
    let e = event(UsageKind::Charge);
    let spool = Arc::new(Spool::open(&tmp.path().join("up-1")).unwrap());
    let mut legacy = entry(&subjects, &e);
    legacy.subject = subjects.usage("charge", &e.request_id.to_string());
    spool.append(&legacy).unwrap();
    let out = spool.drain(&js, &subjects).await.unwrap();
    assert_eq!((out.published, out.foreign), (1, 0));
    assert_eq!(messages(&mut stream).await, 1);
    let m = stream.get_raw_message(1).await.unwrap();
    assert_eq!(m.subject.as_str(), "sy.usage.charge");
    assert!(spool.is_empty().unwrap());
}

#[tokio::test]
async fn adopts_spools_of_exited_processes_only() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("spool");
    let (_server, js, mut stream) = server().await;
    let subjects = Subjects::default();
    let other = Subjects::new("other");

    // A process that exited: two events of ours, one of another prefix, one torn line.
    let (e1, e2, foreign) = (
        event(UsageKind::Upstream),
        event(UsageKind::Charge),
        event(UsageKind::Charge),
    );
    {
        let dead = Spool::open(&root.join("worker-dead")).unwrap();
        dead.append(&entry(&subjects, &e1)).unwrap();
        dead.append(&entry(&other, &foreign)).unwrap();
        dead.append(&entry(&subjects, &e2)).unwrap();
        let mut f = OpenOptions::new()
            .append(true)
            .open(dead.dir().join(PENDING_FILE))
            .unwrap();
        f.write_all(b"{\"subject\":\"sy.usage.char").unwrap();
        assert!(Spool::open(&root.join("worker-dead")).is_err(), "locked");
    }
    // A live process: its spool is not touched.
    let live = Spool::open(&root.join("ingress-live")).unwrap();
    let e3 = event(UsageKind::Charge);
    live.append(&entry(&subjects, &e3)).unwrap();

    let me = Arc::new(Spool::open(&root.join("worker-new")).unwrap());
    let out = me.drain(&js, &subjects).await.unwrap();
    assert_eq!(
        out,
        DrainOutcome {
            published: 2,
            remaining: 0,
            foreign: 1
        }
    );
    assert!(!root.join("worker-dead").exists());
    assert_eq!(me.len().unwrap(), 1, "the foreign event stays spooled");
    let rejected = std::fs::read_to_string(me.dir().join(REJECTED_FILE)).unwrap();
    assert!(rejected.starts_with("{\"subject\":\"sy.usage.char"));
    assert_eq!(live.len().unwrap(), 1);
    assert_eq!(messages(&mut stream).await, 2);

    // Once the live one exits, its event is adopted and delivered too.
    drop(live);
    let out = me.drain(&js, &subjects).await.unwrap();
    assert_eq!((out.published, out.foreign), (1, 1));
    assert_eq!(messages(&mut stream).await, 3);
    assert_eq!(me.len().unwrap(), 1);
}
