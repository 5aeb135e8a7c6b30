//! NATS subject names. Every service builds subjects through [`Subjects`] so the prefix
//! (default `sy`) is configurable in one place.

/// Subject builder for one deployment prefix.
#[derive(Debug, Clone)]
pub struct Subjects {
    prefix: String,
}

/// The JetStream stream holding usage events (`<prefix>.usage.>`): a work queue, each event
/// removed once billing has stored and acknowledged it (docs/architecture.md, "Usage stream").
pub const USAGE_STREAM: &str = "SY_USAGE_WQ";
/// The limits-retention usage stream of earlier versions (one subject per request, kept 7 days);
/// billing migrates what it still holds into [`USAGE_STREAM`] at start-up and deletes it.
pub const LEGACY_USAGE_STREAM: &str = "SY_USAGE";
/// The durable consumer billing reads the usage stream with.
pub const BILLING_CONSUMER: &str = "billing";
/// The JetStream KV bucket holding the shared RPM/TPM token buckets of the workers, one key per
/// target and limit (`<target>.rpm`, `<target>.tpm`), each `{"tokens": f64, "updated_ms": u64}`.
pub const LIMITS_BUCKET: &str = "SY_LIMITS";
/// Capability token for chat completions.
pub const CAP_CHAT: &str = "chat";
/// Capability token for embeddings (request/reply, one answer).
pub const CAP_EMBED: &str = "embed";
/// Capability token for token counting (request/reply, one [`crate::count::CountReply`]).
pub const CAP_COUNT: &str = "count";

impl Default for Subjects {
    fn default() -> Self {
        Self::new("sy")
    }
}

impl Subjects {
    /// Subjects under `prefix` (a single NATS token such as `sy`).
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `<prefix>.req.<capability>.<provider>`: where ingress publishes normalised requests.
    pub fn request(&self, capability: &str, provider: &str) -> String {
        format!("{}.req.{capability}.{provider}", self.prefix)
    }

    /// Queue group shared by every worker of `provider`: NATS hands each request to one of them.
    pub fn worker_queue_group(provider: &str) -> String {
        format!("workers.{provider}")
    }

    /// `<prefix>.inbox.<ingress-id>`: the reply-subject prefix of one ingress process. Replies go to
    /// `<inbox>.<shard>.<request-id>.<attempt>`; the process holds one wildcard subscription
    /// `<inbox>.<shard>.>` per demultiplexer shard.
    pub fn inbox(&self, ingress_id: &str) -> String {
        format!("{}.inbox.{ingress_id}", self.prefix)
    }

    /// `<prefix>.credit.<worker-id>`: flow-control grants from ingress to one worker, JSON
    /// [`crate::frame::Credit`].
    pub fn credit(&self, worker_id: &str) -> String {
        format!("{}.credit.{worker_id}", self.prefix)
    }

    /// `<prefix>.cancel.<worker-id>`: payload is the request id whose upstream call to abort.
    pub fn cancel(&self, worker_id: &str) -> String {
        format!("{}.cancel.{worker_id}", self.prefix)
    }

    /// `<prefix>.usage.<kind>` (`kind` = `upstream` or `charge`): where usage events are
    /// published. One subject per kind, not per request, so the stream's per-subject state stays
    /// constant; duplicates are recognised by the `Nats-Msg-Id` header instead.
    pub fn usage_kind(&self, kind: &str) -> String {
        format!("{}.usage.{kind}", self.prefix)
    }

    /// `<prefix>.usage.<kind>.<request-id>`: the per-request subject of earlier versions (still
    /// captured by [`Self::usage_all`], so spooled or in-flight events of an older process are
    /// stored; new events use [`Self::usage_kind`]).
    pub fn usage(&self, kind: &str, request_id: &str) -> String {
        format!("{}.usage.{kind}.{request_id}", self.prefix)
    }

    /// `<prefix>.usage.>`: the usage stream's subject filter.
    pub fn usage_all(&self) -> String {
        format!("{}.usage.>", self.prefix)
    }

    /// `<prefix>.cache.lookup`: cache service request/reply (queue group `cache`).
    pub fn cache_lookup(&self) -> String {
        format!("{}.cache.lookup", self.prefix)
    }

    /// `<prefix>.cache.store`: fire-and-forget store of a complete answer.
    pub fn cache_store(&self) -> String {
        format!("{}.cache.store", self.prefix)
    }

    /// `<prefix>.billing.usage`: usage queries, request/reply (queue group `billing`); JSON
    /// [`crate::usage_query::UsageQuery`] in, [`crate::usage_query::UsageAnswer`] back.
    pub fn usage_query(&self) -> String {
        format!("{}.billing.usage", self.prefix)
    }

    /// `<prefix>.billing.audit`: audit log queries, request/reply (queue group `billing`); JSON
    /// [`crate::audit::AuditQuery`] in, [`crate::audit::AuditAnswer`] back.
    pub fn audit_query(&self) -> String {
        format!("{}.billing.audit", self.prefix)
    }

    /// `<prefix>.billing.balance`: prepaid tenant balances, request/reply (queue group `billing`);
    /// JSON [`crate::balance::BalanceRequest`] in, [`crate::balance::BalanceAnswer`] back.
    pub fn balance(&self) -> String {
        format!("{}.billing.balance", self.prefix)
    }

    /// `<prefix>.health.<target>`: circuit breaker / cooldown state changes, JSON
    /// [`crate::health::HealthEvent`].
    pub fn health(&self, target: &str) -> String {
        format!("{}.health.{target}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let s = Subjects::default();
        assert_eq!(s.request(CAP_CHAT, "openai"), "sy.req.chat.openai");
        assert_eq!(Subjects::worker_queue_group("openai"), "workers.openai");
        assert_eq!(s.inbox("abc"), "sy.inbox.abc");
        assert_eq!(s.credit("w1"), "sy.credit.w1");
        assert_eq!(s.usage("upstream", "r1"), "sy.usage.upstream.r1");
        assert_eq!(s.usage_kind("charge"), "sy.usage.charge");
        assert_eq!(s.usage_query(), "sy.billing.usage");
    }
}
