//! Where batches live, all in JetStream so every ingress replica sees the same state and a
//! restart of any service loses nothing:
//!
//! | what | where |
//! |---|---|
//! | file contents | object store [`FILES_BUCKET`], object name = file id |
//! | file and batch records | KV [`RECORDS_BUCKET`], keys `f.<tenant>.<id>` / `b.<tenant>.<id>` ([`super::records::batch_key`]) |
//! | listings (per tenant: files, OpenAI batches, Anthropic batches) | KV [`RECORDS_BUCKET`]: counter `n.<list>`, entries `i.<list>.<n>` = record key ([`BatchStore::page`]) |
//! | batches not yet terminal | KV [`ACTIVE_BUCKET`], key = batch id, value = the record's key |
//! | items to run | work-queue stream [`ITEMS_STREAM`] on `<prefix>.batch.item.<batch>`, removed when acknowledged |
//! | item results | stream [`RESULTS_STREAM`] on `<prefix>.batch.result.<batch>.<outcome>.<index>`, `Nats-Msg-Id` = `<batch>.<index>` |
//! | item run counters | stream [`RESULTS_STREAM`] on `<prefix>.batch.result.<batch>.run.<index>.n` (one more token than a result, so result filters `<batch>.*.*` skip them; [`BatchStore::claim_run`]) |
//!
//! The results stream's duplicate window ([`RESULT_DEDUP`]) is longer than an item's
//! redelivery delay, so an item that ran twice (its runner died before acknowledging) stores one
//! result; per-subject message counts give the live progress without reading the results, and
//! the index in the subject lets a runner see that a redelivered item already has its result
//! ([`BatchStore::has_result`]) before it dispatches it again.

use super::records::{BatchRecord, FileRecord, Item, ItemResult, Outcome};
use async_nats::jetstream::{self, kv, object_store, stream};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use std::collections::HashMap;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// Object store bucket of file contents.
pub const FILES_BUCKET: &str = "SY_FILES";
/// KV bucket of file and batch records.
pub const RECORDS_BUCKET: &str = "SY_BATCHES";
/// KV bucket indexing the batches that are not terminal yet (the sweeper's work list).
pub const ACTIVE_BUCKET: &str = "SY_BATCH_ACTIVE";
/// Work-queue stream of items to run.
pub const ITEMS_STREAM: &str = "SY_BATCH_WQ";
/// Stream of item results.
pub const RESULTS_STREAM: &str = "SY_BATCH_RESULTS";
/// Durable consumer of [`ITEMS_STREAM`] shared by every ingress's runner.
pub const RUNNER_CONSUMER: &str = "batch-runner";
/// Duplicate window of [`RESULTS_STREAM`] (and [`ITEMS_STREAM`]).
pub const RESULT_DEDUP: Duration = Duration::from_secs(2 * 3600);

/// Batch store failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A JetStream call failed.
    #[error("batch store: {0}")]
    Nats(String),
    /// A stored record does not parse.
    #[error("batch store: corrupt record `{key}`: {reason}")]
    Corrupt {
        /// KV key or subject.
        key: String,
        /// Parse error.
        reason: String,
    },
}

fn nats(e: impl std::fmt::Display) -> StoreError {
    StoreError::Nats(e.to_string())
}

/// Handles on the batch buckets and streams.
#[derive(Clone)]
pub struct BatchStore {
    js: jetstream::Context,
    prefix: String,
    records: kv::Store,
    active: kv::Store,
    files: object_store::ObjectStore,
    items: stream::Stream,
    results: stream::Stream,
}

impl std::fmt::Debug for BatchStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchStore")
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// A counter's value (decimal text) stored under `key` (a KV key or a subject).
fn parse_count<T: std::str::FromStr>(value: &[u8], key: &str) -> Result<T, StoreError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse::<T>().ok())
        .ok_or_else(|| StoreError::Corrupt {
            key: key.to_owned(),
            reason: "not a count".into(),
        })
}

/// Gets or creates the KV bucket `bucket` keeping one revision per key.
async fn latest_only_kv(js: &jetstream::Context, bucket: &str) -> Result<kv::Store, StoreError> {
    match js.get_key_value(bucket).await {
        Ok(s) => Ok(s),
        Err(_) => js
            .create_key_value(switchyard_schemas::replicas::kv(kv::Config {
                bucket: bucket.into(),
                history: 1,
                ..Default::default()
            }))
            .await
            .map_err(nats),
    }
}

impl BatchStore {
    /// Opens (creating when absent) the buckets and streams under subject prefix `prefix`.
    pub async fn open(js: &jetstream::Context, prefix: &str) -> Result<Self, StoreError> {
        let records = latest_only_kv(js, RECORDS_BUCKET).await?;
        let active = latest_only_kv(js, ACTIVE_BUCKET).await?;
        let files = match js.get_object_store(FILES_BUCKET).await {
            Ok(s) => s,
            Err(_) => js
                .create_object_store(switchyard_schemas::replicas::object_store(
                    object_store::Config {
                        bucket: FILES_BUCKET.into(),
                        ..Default::default()
                    },
                ))
                .await
                .map_err(nats)?,
        };
        let items = js
            .get_or_create_stream(switchyard_schemas::replicas::stream(stream::Config {
                name: ITEMS_STREAM.into(),
                subjects: vec![format!("{prefix}.batch.item.>")],
                retention: stream::RetentionPolicy::WorkQueue,
                duplicate_window: RESULT_DEDUP,
                ..Default::default()
            }))
            .await
            .map_err(nats)?;
        let results = js
            .get_or_create_stream(switchyard_schemas::replicas::stream(stream::Config {
                name: RESULTS_STREAM.into(),
                subjects: vec![format!("{prefix}.batch.result.>")],
                duplicate_window: RESULT_DEDUP,
                ..Default::default()
            }))
            .await
            .map_err(nats)?;
        Ok(Self {
            js: js.clone(),
            prefix: prefix.to_owned(),
            records,
            active,
            files,
            items,
            results,
        })
    }

    /// The items stream (the runner's consumer lives on it).
    pub fn items_stream(&self) -> &stream::Stream {
        &self.items
    }

    // ---- records ----

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<(T, u64)>, StoreError> {
        let Some(entry) = self.records.entry(key).await.map_err(nats)? else {
            return Ok(None);
        };
        if entry.operation != kv::Operation::Put {
            return Ok(None);
        }
        let value = serde_json::from_slice(&entry.value).map_err(|e| StoreError::Corrupt {
            key: key.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Some((value, entry.revision)))
    }

    /// The file record under `key`.
    pub async fn file(&self, key: &str) -> Result<Option<FileRecord>, StoreError> {
        Ok(self.get_json(key).await?.map(|(v, _)| v))
    }

    /// The batch record under `key` and its revision (for [`Self::update_batch`]).
    pub async fn batch(&self, key: &str) -> Result<Option<(BatchRecord, u64)>, StoreError> {
        self.get_json(key).await
    }

    /// Stores a file: content first, then its record (a record never points at nothing), listed
    /// in its tenant's file listing (a file written again, e.g. by a re-finalization, keeps its
    /// place).
    pub async fn put_file(
        &self,
        key: &str,
        record: &FileRecord,
        content: &[u8],
    ) -> Result<(), StoreError> {
        let mut reader = content;
        self.files
            .put(record.id.as_str(), &mut reader)
            .await
            .map_err(nats)?;
        let mut record = record.clone();
        record.list_seq = match self.file(key).await? {
            Some(old) if old.list_seq > 0 => old.list_seq,
            _ => {
                let list = super::records::file_list(record.tenant.as_deref());
                self.list_add(&list, key).await?
            }
        };
        let json = serde_json::to_vec(&record).map_err(nats)?;
        self.records.put(key, json.into()).await.map_err(nats)?;
        Ok(())
    }

    /// A file's content.
    pub async fn file_content(&self, id: &str) -> Result<Bytes, StoreError> {
        let mut object = self.files.get(id).await.map_err(nats)?;
        let mut out = Vec::new();
        object.read_to_end(&mut out).await.map_err(nats)?;
        Ok(out.into())
    }

    /// Deletes a file's record and content (its listing entry then points at nothing and is
    /// skipped).
    pub async fn delete_file(&self, key: &str, id: &str) -> Result<(), StoreError> {
        self.records.delete(key).await.map_err(nats)?;
        if let Err(e) = self.files.delete(id).await {
            tracing::warn!(file = id, error = %e, "file content not deleted");
        }
        Ok(())
    }

    /// Deletes a record (a deleted batch).
    pub async fn delete_record(&self, key: &str) -> Result<(), StoreError> {
        self.records.delete(key).await.map_err(nats)
    }

    /// Creates a batch record (fails when the key exists), listed in its tenant's batch
    /// listing of its API; returns its revision.
    pub async fn create_batch(&self, key: &str, record: &BatchRecord) -> Result<u64, StoreError> {
        let mut record = record.clone();
        let list = super::records::batch_list(record.tenant.as_deref(), record.api);
        record.list_seq = self.list_add(&list, key).await?;
        let json = serde_json::to_vec(&record).map_err(nats)?;
        self.records.create(key, json.into()).await.map_err(nats)
    }

    // ---- listings ----

    /// The `list_seq` of the record under `key` (`None` when there is none).
    pub async fn list_seq_of(&self, key: &str) -> Result<Option<u64>, StoreError> {
        Ok(self
            .get_json::<serde_json::Value>(key)
            .await?
            .map(|(v, _)| v["list_seq"].as_u64().unwrap_or(0)))
    }

    /// Appends record `key` to listing `list`: allocates the next position `n` (a counter under
    /// `n.<list>`, compare-and-set) and writes `i.<list>.<n>` = `key`; returns `n`. The record
    /// must then be written with `list_seq = n`: an entry whose record is missing or carries
    /// another position (deleted, or a writer that died in between) is skipped by [`Self::page`].
    async fn list_add(&self, list: &str, key: &str) -> Result<u64, StoreError> {
        let counter = format!("n.{list}");
        let n = loop {
            match self.records.entry(&counter).await.map_err(nats)? {
                Some(e) if e.operation == kv::Operation::Put => {
                    let n = parse_count::<u64>(&e.value, &counter)? + 1;
                    match self
                        .records
                        .update(&counter, n.to_string().into(), e.revision)
                        .await
                    {
                        Ok(_) => break n,
                        Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                        Err(e) => return Err(nats(e)),
                    }
                }
                _ => match self.records.create(&counter, "1".into()).await {
                    Ok(_) => break 1,
                    Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(nats(e)),
                },
            }
        };
        self.records
            .put(format!("i.{list}.{n}"), key.to_owned().into())
            .await
            .map_err(nats)?;
        Ok(n)
    }

    /// One page of listing `list`: up to `limit` records that `keep` accepts, newest first
    /// (`ascending`: oldest first), starting after position `after` (a record's `list_seq`;
    /// `None`: from the newest, or the oldest), and whether more follow. Reads the counter, then
    /// the entries and records of the page (plus one, to know `has_more`) — the cost is the
    /// page's, not the listing's (entries skipped as deleted or filtered out add to it).
    pub async fn page<T: serde::de::DeserializeOwned>(
        &self,
        list: &str,
        after: Option<u64>,
        ascending: bool,
        limit: usize,
        seq_of: impl Fn(&T) -> u64,
        keep: impl Fn(&T) -> bool,
    ) -> Result<(Vec<T>, bool), StoreError> {
        let head = match self.records.get(format!("n.{list}")).await.map_err(nats)? {
            Some(v) => std::str::from_utf8(&v)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0),
            None => 0,
        };
        // The next position to look at (positions run 1..=head); 0 or beyond head: none left.
        let mut next = match (ascending, after) {
            (false, None) => head,
            (false, Some(a)) => a.saturating_sub(1).min(head),
            (true, None) => 1,
            (true, Some(a)) => a.saturating_add(1),
        };
        let mut out = Vec::new();
        let want = limit + 1;
        loop {
            let mut seqs = Vec::new();
            while seqs.len() < want - out.len() && (1..=head).contains(&next) {
                seqs.push(next);
                next = if ascending { next + 1 } else { next - 1 };
            }
            if seqs.is_empty() {
                break;
            }
            let found = futures::future::join_all(seqs.iter().map(|n| async move {
                let Some(key) = self
                    .records
                    .get(format!("i.{list}.{n}"))
                    .await
                    .map_err(nats)?
                else {
                    return Ok(None);
                };
                let key = String::from_utf8_lossy(&key).into_owned();
                Ok::<_, StoreError>(self.get_json::<T>(&key).await?.map(|(v, _)| v))
            }))
            .await;
            for (n, r) in seqs.iter().zip(found) {
                if let Some(v) = r?
                    && seq_of(&v) == *n
                    && keep(&v)
                    && out.len() < want
                {
                    out.push(v);
                }
            }
            if out.len() >= want {
                break;
            }
        }
        let has_more = out.len() > limit;
        out.truncate(limit);
        Ok((out, has_more))
    }

    /// Writes `record` if the stored revision is still `revision`: `Ok(None)` when another
    /// writer came first (re-read and decide again), else the new revision.
    pub async fn update_batch(
        &self,
        key: &str,
        record: &BatchRecord,
        revision: u64,
    ) -> Result<Option<u64>, StoreError> {
        let json = serde_json::to_vec(record).map_err(nats)?;
        match self.records.update(key, json.into(), revision).await {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(e) => Err(nats(e)),
        }
    }

    // ---- the active index ----

    /// Marks a batch active (the sweeper watches it until it is terminal).
    pub async fn mark_active(&self, id: &str, key: &str) -> Result<(), StoreError> {
        self.active
            .put(id, key.to_owned().into())
            .await
            .map_err(nats)?;
        Ok(())
    }

    /// Removes a terminal batch from the active index.
    pub async fn clear_active(&self, id: &str) -> Result<(), StoreError> {
        self.active.purge(id).await.map_err(nats)
    }

    /// (batch id, record key) of every active batch.
    pub async fn active(&self) -> Result<Vec<(String, String)>, StoreError> {
        let ids: Vec<String> = self
            .active
            .keys()
            .await
            .map_err(nats)?
            .try_collect()
            .await
            .map_err(nats)?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(v) = self.active.get(&id).await.map_err(nats)? {
                out.push((id, String::from_utf8_lossy(&v).into_owned()));
            }
        }
        Ok(out)
    }

    // ---- items ----

    fn item_subject(&self, batch_id: &str) -> String {
        format!("{}.batch.item.{batch_id}", self.prefix)
    }

    /// Puts `item` on the work queue (acknowledged; `Nats-Msg-Id` `<batch>.<index>.<try>` makes
    /// a repeated publish a no-op).
    pub async fn enqueue(&self, item: &Item) -> Result<(), StoreError> {
        self.enqueue_all(std::slice::from_ref(item)).await
    }

    /// Puts every item on the queue: publishes in windows of 256 and then waits for their
    /// acknowledgements (one round trip per window, not per item).
    pub async fn enqueue_all(&self, items: &[Item]) -> Result<(), StoreError> {
        for window in items.chunks(256) {
            let mut acks = Vec::with_capacity(window.len());
            for item in window {
                let payload = serde_json::to_vec(item).map_err(nats)?;
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(
                    "Nats-Msg-Id",
                    format!("{}.{}.{}", item.batch_id, item.index, item.try_no).as_str(),
                );
                let ack = self
                    .js
                    .publish_with_headers(
                        self.item_subject(&item.batch_id),
                        headers,
                        payload.into(),
                    )
                    .await
                    .map_err(nats)?;
                acks.push(ack);
            }
            for ack in acks {
                ack.await.map_err(nats)?;
            }
        }
        Ok(())
    }

    /// Items of `batch_id` still on the queue (waiting or running).
    pub async fn pending(&self, batch_id: &str) -> Result<u64, StoreError> {
        let subject = self.item_subject(batch_id);
        let mut info = self
            .items
            .info_with_subjects(&subject)
            .await
            .map_err(nats)?;
        let mut n = 0u64;
        while let Some((_, count)) = info.try_next().await.map_err(nats)? {
            n += count as u64;
        }
        Ok(n)
    }

    // ---- results ----

    fn result_prefix(&self, batch_id: &str) -> String {
        format!("{}.batch.result.{batch_id}", self.prefix)
    }

    /// The subjects of `batch_id`'s results (`<outcome>.<index>`), not its run counters.
    fn results_filter(&self, batch_id: &str) -> String {
        format!("{}.*.*", self.result_prefix(batch_id))
    }

    fn result_subject(&self, batch_id: &str, outcome: Outcome, index: u64) -> String {
        format!(
            "{}.{}.{index}",
            self.result_prefix(batch_id),
            outcome.as_str()
        )
    }

    /// Whether item `index` of `batch_id` has a stored result (one stream lookup of the last
    /// message on `<prefix>.batch.result.<batch>.*.<index>`).
    pub async fn has_result(&self, batch_id: &str, index: u64) -> Result<bool, StoreError> {
        let subject = format!("{}.*.{index}", self.result_prefix(batch_id));
        match self.results.get_last_raw_message_by_subject(&subject).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(false),
            Err(e) => Err(nats(e)),
        }
    }

    /// Claims the next run number of item `index` of `batch_id`: `at_least` (the item's
    /// `try_no`: a try queued before run numbers existed numbered its attempts `try × 100`) for
    /// its first run, then one more for each run after it, across every try, redelivery and
    /// replica — a counter on subject
    /// `<prefix>.batch.result.<batch>.run.<index>.n` of the results stream, advanced by a
    /// publish that expects the subject's last sequence (`Nats-Expected-Last-Subject-Sequence`,
    /// so two claimants cannot both get one number; the loser reads again). JetStream's own
    /// delivery count cannot number runs: a restarted nats-server can redeliver an item with its
    /// count back at 1 while the first delivery still runs. The counter is purged with the
    /// batch's results ([`Self::purge_results`]).
    pub async fn claim_run(
        &self,
        batch_id: &str,
        index: u64,
        at_least: u32,
    ) -> Result<u32, StoreError> {
        let subject = format!("{}.run.{index}.n", self.result_prefix(batch_id));
        loop {
            let (last_seq, runs) =
                match self.results.get_last_raw_message_by_subject(&subject).await {
                    Ok(m) => (m.sequence, parse_count::<u32>(&m.payload, &subject)?),
                    Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => (0, 0),
                    Err(e) => return Err(nats(e)),
                };
            let runs = runs.max(at_least);
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(
                "Nats-Expected-Last-Subject-Sequence",
                last_seq.to_string().as_str(),
            );
            let next = runs.saturating_add(1).to_string();
            let ack = self
                .js
                .publish_with_headers(subject.clone(), headers, next.into())
                .await
                .map_err(nats)?
                .await;
            match ack {
                Ok(_) => return Ok(runs),
                // Another claimant advanced it first: read again.
                Err(e) if e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence => {
                    continue;
                }
                Err(e) => return Err(nats(e)),
            }
        }
    }

    /// Stores an item's result (acknowledged; a second result for the same index within
    /// [`RESULT_DEDUP`] is dropped by the stream).
    pub async fn append_result(
        &self,
        batch_id: &str,
        result: &ItemResult,
    ) -> Result<(), StoreError> {
        let payload = serde_json::to_vec(result).map_err(nats)?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            "Nats-Msg-Id",
            format!("{batch_id}.{}", result.index).as_str(),
        );
        let subject = self.result_subject(batch_id, result.outcome, result.index);
        self.js
            .publish_with_headers(subject, headers, payload.into())
            .await
            .map_err(nats)?
            .await
            .map_err(nats)?;
        Ok(())
    }

    /// Results stored so far per outcome (message counts; a duplicate a crash let through the
    /// window would count twice until finalization dedupes by index).
    pub async fn progress(&self, batch_id: &str) -> Result<HashMap<Outcome, u64>, StoreError> {
        let filter = self.results_filter(batch_id);
        let mut info = self
            .results
            .info_with_subjects(&filter)
            .await
            .map_err(nats)?;
        let mut out = HashMap::new();
        let head = format!("{}.", self.result_prefix(batch_id));
        while let Some((subject, count)) = info.try_next().await.map_err(nats)? {
            let token = subject
                .strip_prefix(&head)
                .and_then(|rest| rest.split('.').next());
            let outcome = match token {
                Some("succeeded") => Outcome::Succeeded,
                Some("errored") => Outcome::Errored,
                Some("canceled") => Outcome::Canceled,
                Some("expired") => Outcome::Expired,
                _ => continue,
            };
            *out.entry(outcome).or_insert(0) += count as u64;
        }
        Ok(out)
    }

    /// Every stored result of `batch_id`, one per index (the first stored wins), by index.
    pub async fn results(&self, batch_id: &str) -> Result<Vec<ItemResult>, StoreError> {
        let filter = self.results_filter(batch_id);
        let expected: u64 = self.progress(batch_id).await?.values().sum();
        let mut by_index: std::collections::BTreeMap<u64, ItemResult> = Default::default();
        if expected == 0 {
            return Ok(Vec::new());
        }
        let consumer = self
            .results
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                filter_subject: filter,
                deliver_policy: jetstream::consumer::DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(nats)?;
        let mut messages = consumer.messages().await.map_err(nats)?;
        let mut seen = 0u64;
        while seen < expected {
            let next = tokio::time::timeout(Duration::from_secs(10), messages.next()).await;
            let msg = match next {
                Ok(Some(Ok(m))) => m,
                Ok(Some(Err(e))) => return Err(nats(e)),
                Ok(None) | Err(_) => {
                    return Err(StoreError::Nats(format!(
                        "results of {batch_id}: read {seen} of {expected}"
                    )));
                }
            };
            seen += 1;
            let r: ItemResult =
                serde_json::from_slice(&msg.payload).map_err(|e| StoreError::Corrupt {
                    key: msg.subject.to_string(),
                    reason: e.to_string(),
                })?;
            by_index.entry(r.index).or_insert(r);
        }
        Ok(by_index.into_values().collect())
    }

    /// Drops the results (and run counters) of a finalized batch (they live on in its files).
    pub async fn purge_results(&self, batch_id: &str) -> Result<(), StoreError> {
        let filter = format!("{}.>", self.result_prefix(batch_id));
        self.results.purge().filter(filter).await.map_err(nats)?;
        Ok(())
    }
}
