//! API keys, tenants and their budgets (the `keys:`, `tenants:` and `budgets:` config sections).
//!
//! With no keys configured the gateway is open (single-box default). With keys, every `/v1/*`
//! request must present one as `Authorization: Bearer <key>` (OpenAI SDKs) or `x-api-key: <key>`
//! (Anthropic SDKs). Keys are stored as the SHA-256 of the key (`key_sha256`), or given
//! literally (`key`, usually `${ENV}`) and hashed at load; the key itself never prints.

use crate::secret::Secret;
use rust_decimal::Decimal;
use serde::{Deserialize, Deserializer, Serialize};

/// One API key.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// Key id (`[A-Za-z0-9_-]`, ≤ 64 chars): recorded on every usage event, names budgets.
    pub id: String,
    /// Tenant the key belongs to (its tenant budget applies too, if `tenants` lists it).
    pub tenant: String,
    /// Lower-case hex SHA-256 of the key (64 chars). Exactly one of `key_sha256` / `key`.
    pub key_sha256: Option<String>,
    /// The key itself (e.g. `${TEAM_A_KEY}`); hashed at load, never printed.
    pub key: Option<Secret>,
    /// May read every tenant's usage (`GET /v1/usage?tenant=…`).
    #[serde(default)]
    pub admin: bool,
    /// `false` rejects the key with 401 (revocation without deleting the entry).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Spend limits and token quotas of this key.
    #[serde(default)]
    pub budget: Budget,
    /// Request-rate limits of this key (RPM, TPM, concurrent requests).
    #[serde(default, skip_serializing_if = "RateLimits::is_none")]
    pub limits: RateLimits,
    /// Unix time, seconds (UTC), from which the key is refused with 401 (`None` = never).
    pub expires_at: Option<u64>,
}

impl KeyConfig {
    /// Whether the key has expired at `now_s` (Unix seconds).
    pub fn expired(&self, now_s: u64) -> bool {
        self.expires_at.is_some_and(|at| now_s >= at)
    }

    /// The lower-case hex SHA-256 this key is matched by.
    pub fn sha256(&self) -> Option<String> {
        match (&self.key_sha256, &self.key) {
            (Some(h), _) => Some(h.to_ascii_lowercase()),
            (None, Some(k)) => Some(sha256_hex(k.expose())),
            (None, None) => None,
        }
    }
}

/// The `admin:` section: who may call the admin API (`/admin/…`), and how long a replica trusts
/// its copy of the live config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Admin keys, separate from client `keys` (a client key never opens `/admin`).
    pub keys: Vec<AdminKeyConfig>,
    /// A replica that could not confirm for this long (ms) that its live config is the latest
    /// refuses every API key with 503 `config_unconfirmed` (fail closed) until it can
    /// (docs/security.md, "Key changes across replicas"). Default 5000: long enough that a
    /// replica starved of CPU under load (confirmations are 4 per second) keeps serving.
    pub stale_after_ms: u64,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            stale_after_ms: 5000,
        }
    }
}

/// One admin key.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminKeyConfig {
    /// Id (`[A-Za-z0-9_-]`, ≤ 64), named in logs.
    pub id: String,
    /// Lower-case hex SHA-256 of the key. Exactly one of `key_sha256` / `key`.
    pub key_sha256: Option<String>,
    /// The key as a reference: `env:NAME` (read by ingress) or `${NAME}`. A literal is stored
    /// as its hash by `config push`.
    pub key: Option<Secret>,
    /// Limits the key to one tenant's keys, tenant and usage (`None` = the whole gateway).
    pub tenant: Option<String>,
}

impl AdminKeyConfig {
    /// The SHA-256 the key is matched by, resolving an `env:NAME` reference with `env`; `None`
    /// when the variable is unset.
    pub fn sha256(&self, env: &impl Fn(&str) -> Option<String>) -> Option<String> {
        match (&self.key_sha256, &self.key) {
            (Some(h), _) => Some(h.to_ascii_lowercase()),
            (None, Some(k)) => crate::sealed::resolve(k, env, None)
                .ok()
                .filter(|k| !k.is_empty())
                .map(|k| sha256_hex(k.expose())),
            (None, None) => None,
        }
    }
}

/// One tenant (a team or customer owning keys).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Tenant id (`[A-Za-z0-9_-]`, ≤ 64 chars).
    pub id: String,
    /// Spend limits and token quotas shared by all the tenant's keys.
    #[serde(default)]
    pub budget: Budget,
    /// Request-rate limits shared by all the tenant's keys.
    #[serde(default, skip_serializing_if = "RateLimits::is_none")]
    pub limits: RateLimits,
    /// A prepaid balance (credits) the tenant's requests draw from, beside the calendar budgets
    /// (docs/budgets.md, "Prepaid balances").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance: Option<BalanceConfig>,
}

impl TenantConfig {
    /// The tenant's balance settings when its balance is enabled.
    pub fn prepaid(&self) -> Option<&BalanceConfig> {
        self.balance.as_ref().filter(|b| b.enabled)
    }
}

/// `tenants[].balance`: a prepaid balance topped up through the admin API
/// (`POST /admin/tenants/{id}/balance/topups`). With `enabled`, a request is admitted only when
/// its reservation fits in what is left (top-ups minus settled charges minus open reservations);
/// otherwise 429 `insufficient_quota` naming the tenant's balance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalanceConfig {
    /// Whether requests draw from the balance (default true once the section is present).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The low-balance threshold, USD: when what is left (after open reservations) falls below
    /// it, `on_low` applies. Absent: no threshold.
    #[serde(
        default,
        deserialize_with = "opt_usd",
        skip_serializing_if = "Option::is_none"
    )]
    pub low_balance_usd: Option<Decimal>,
    /// What a low balance does (default `downgrade`).
    #[serde(default)]
    pub on_low: OnLowBalance,
}

/// What happens below `low_balance_usd`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnLowBalance {
    /// Models that name a `cheaper:` alternative are served by it
    /// (`x-switchyard-downgraded-from`); others as asked.
    #[default]
    Downgrade,
    /// Every request is refused with 429 `insufficient_quota` until the balance is topped up.
    Refuse,
}

/// Request-rate limits of a key or tenant (`limits:` of a `keys:` / `tenants:` entry), enforced
/// by ingress at admission across every replica (docs/limits.md). Each is off when absent.
/// RPM and TPM count per UTC clock minute (the window resets at every `hh:mm:00`), like the
/// budgets' `tokens_per_minute`; a request over any of them is answered 429
/// `rate_limit_exceeded` with `Retry-After`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimits {
    /// Requests admitted per clock minute (≥ 1).
    pub rpm: Option<u64>,
    /// Tokens per clock minute (≥ 1): each request is charged its estimate at admission (o200k
    /// prompt tokens + `max_tokens`, 256 when absent) and corrected to the tokens the upstream
    /// reported when it ends within the same minute.
    pub tpm: Option<u64>,
    /// Requests in flight at once across every ingress replica (≥ 1); a stream counts until its
    /// last byte.
    pub max_concurrent: Option<u32>,
}

impl RateLimits {
    /// Whether no limit is set.
    pub fn is_none(&self) -> bool {
        self.rpm.is_none() && self.tpm.is_none() && self.max_concurrent.is_none()
    }
}

/// Limits of a key or tenant; each is off when absent. Windows are calendar UTC: the day
/// (00:00–24:00), the month, and the clock minute.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Budget {
    /// Spend limit per UTC day, USD (sale price, i.e. what the tenant is charged).
    #[serde(deserialize_with = "opt_usd")]
    pub daily_usd: Option<Decimal>,
    /// Spend limit per UTC month, USD.
    #[serde(deserialize_with = "opt_usd")]
    pub monthly_usd: Option<Decimal>,
    /// Tokens (input + output) per clock minute.
    pub tokens_per_minute: Option<u64>,
    /// Tokens (input + output) per UTC day.
    pub tokens_per_day: Option<u64>,
    /// Cost-priority routing: once this share (0–1) of `daily_usd` is spent or reserved,
    /// models that name a `cheaper` alternative are served by it.
    #[serde(deserialize_with = "opt_usd")]
    pub downgrade_at: Option<Decimal>,
}

impl Budget {
    /// Whether any limit is set.
    pub fn is_limited(&self) -> bool {
        self.daily_usd.is_some()
            || self.monthly_usd.is_some()
            || self.tokens_per_minute.is_some()
            || self.tokens_per_day.is_some()
    }
}

/// How admission estimates the cost it reserves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetSettings {
    /// Output tokens reserved when the request sets no `max_tokens` (default 4096).
    pub default_max_tokens: u64,
    /// Added to every reservation, as a share of the estimate (default 0.10 = 10 %), covering
    /// tokenizer differences between our estimate and the provider's count.
    #[serde(deserialize_with = "usd")]
    pub safety_margin: Decimal,
    /// A reservation not settled within this many ms after the request's deadline is released
    /// (covers an ingress that died mid-request; default 60 000).
    pub hold_grace_ms: u64,
}

impl Default for BudgetSettings {
    fn default() -> Self {
        Self {
            default_max_tokens: 4096,
            safety_margin: Decimal::new(10, 2),
            hold_grace_ms: 60_000,
        }
    }
}

fn yes() -> bool {
    true
}

/// Reads a non-negative decimal written as a number or string, exactly as written.
fn usd<'de, D: Deserializer<'de>>(d: D) -> Result<Decimal, D::Error> {
    crate::pricing::decimal_as_written(d, "")
}

fn opt_usd<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Decimal>, D::Error> {
    usd(d).map(Some)
}

/// Lower-case hex SHA-256 of `key` (how keys are stored and matched).
pub fn sha256_hex(key: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(key.as_bytes()))
}

/// A new random API key: `sk-sy-` + 40 letters and digits (~238 bits), from the OS-seeded
/// thread RNG.
pub fn new_api_key() -> String {
    use rand::Rng as _;
    let secret: String = rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(40)
        .map(char::from)
        .collect();
    format!("sk-sy-{secret}")
}

/// Whether `id` is usable as a key or tenant id (it becomes part of KV keys and subjects).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn budget_reads_decimals_exactly() {
        let b: Budget =
            serde_yaml_ng::from_str("{daily_usd: 0.010, monthly_usd: '5', downgrade_at: 0.7}")
                .unwrap();
        assert_eq!(b.daily_usd, Some(Decimal::new(10, 3)));
        assert_eq!(b.monthly_usd, Some(Decimal::new(5, 0)));
        assert_eq!(b.downgrade_at, Some(Decimal::new(7, 1)));
        assert!(b.is_limited());
        assert!(serde_yaml_ng::from_str::<Budget>("{daily_usd: -1}").is_err());
        assert!(serde_yaml_ng::from_str::<Budget>("{daily: 1}").is_err());
    }

    #[test]
    fn keys_hash_the_same_either_way() {
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        let h = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_hex("abc"), h);
        let k: KeyConfig = serde_yaml_ng::from_str("{id: a, tenant: t, key: abc}").unwrap();
        assert_eq!(k.sha256().as_deref(), Some(h));
        assert!(format!("{k:?}").contains("[redacted]"));
        assert!(!format!("{k:?}").contains("abc"));
    }
}
