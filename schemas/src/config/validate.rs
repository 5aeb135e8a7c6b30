//! The cross-field rules serde cannot check ([`GatewayConfig::validate`]).

use super::error::{ConfigError, err};
use super::gateway::GatewayConfig;
use super::target::{
    BUILTIN_LOCAL_MODEL_URL, BUILTIN_MOCK_URL, OpenAiApi, ProviderKind, TargetConfig,
    is_mock_path_prefix,
};
use std::collections::HashSet;

impl GatewayConfig {
    /// Checks rules serde cannot: unique ids, references, a valid subject prefix, timeout order.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.subject_prefix.is_empty() || self.subject_prefix.contains(['.', '*', '>', ' ']) {
            return Err(err(
                "subject_prefix",
                "must be one NATS token (no '.', '*', '>', spaces)",
            ));
        }
        self.nats
            .validate()
            .map_err(|e| err("nats", e.to_string()))?;
        self.tracing.validate().map_err(|e| err("tracing", e))?;
        let mut target_ids = HashSet::new();
        for (i, t) in self.targets.iter().enumerate() {
            unique_id(&mut target_ids, &t.id, || format!("targets[{i}].id"))?;
            let bedrock_default = t.base_url.is_empty() && t.provider == ProviderKind::Bedrock;
            if !bedrock_default
                && t.base_url != BUILTIN_MOCK_URL
                && !is_mock_path_prefix(&t.base_url)
                && t.base_url != BUILTIN_LOCAL_MODEL_URL
                && !t.base_url.starts_with("http://")
                && !t.base_url.starts_with("https://")
            {
                return Err(err(
                    format!("targets[{i}].base_url"),
                    format!(
                        "`{}` must start with http:// or https:// (or be {BUILTIN_MOCK_URL}, \
                         {BUILTIN_MOCK_URL}/x/<key=value,...> or {BUILTIN_LOCAL_MODEL_URL})",
                        t.base_url
                    ),
                ));
            }
            if let Some(v) = &t.api_version {
                if t.provider != ProviderKind::AzureOpenai {
                    return Err(err(
                        format!("targets[{i}].api_version"),
                        format!(
                            "only azure_openai targets take an api_version (this one is {})",
                            t.provider.as_str()
                        ),
                    ));
                }
                if v.trim().is_empty() || v.contains(['&', '#', ' ', '?']) {
                    return Err(err(
                        format!("targets[{i}].api_version"),
                        format!("`{v}` is not an api-version like 2024-10-21"),
                    ));
                }
            }
            if t.api == OpenAiApi::Responses
                && !matches!(
                    t.provider,
                    ProviderKind::Openai
                        | ProviderKind::OpenaiCompatible
                        | ProviderKind::AzureOpenai
                )
            {
                return Err(err(
                    format!("targets[{i}].api"),
                    format!(
                        "only openai, openai_compatible and azure_openai targets can use api: responses (this one is {})",
                        t.provider.as_str()
                    ),
                ));
            }
            validate_aws(i, t)?;
        }
        let mut model_ids = HashSet::new();
        for (i, m) in self.models.iter().enumerate() {
            unique_id(&mut model_ids, &m.id, || format!("models[{i}].id"))?;
            if m.targets.is_empty() {
                return Err(err(
                    format!("models[{i}].targets"),
                    "needs at least one target",
                ));
            }
            if let Some(t) = m.cache.as_ref().and_then(|c| c.threshold)
                && !(t > 0.0 && t <= 1.0)
            {
                return Err(err(
                    format!("models[{i}].cache.threshold"),
                    "must be in (0, 1]",
                ));
            }
            for (j, t) in m.targets.iter().enumerate() {
                if !target_ids.contains(t.as_str()) {
                    return Err(err(
                        format!("models[{i}].targets[{j}]"),
                        format!("unknown target `{t}`"),
                    ));
                }
            }
        }
        let mut policy_ids = HashSet::new();
        for (i, p) in self.policies.iter().enumerate() {
            unique_id(&mut policy_ids, &p.id, || format!("policies[{i}].id"))?;
            if let Some(c) = &p.canary {
                if !(0.0..=100.0).contains(&c.percent) {
                    return Err(err(
                        format!("policies[{i}].canary.percent"),
                        "must be between 0 and 100",
                    ));
                }
                if !target_ids.contains(c.target.as_str()) {
                    return Err(err(
                        format!("policies[{i}].canary.target"),
                        format!("unknown target `{}`", c.target),
                    ));
                }
            } else if p.strategy == crate::routing::Strategy::Canary {
                return Err(err(
                    format!("policies[{i}].canary"),
                    "strategy `canary` needs `canary: {target, percent}`",
                ));
            }
        }
        for (i, m) in self.models.iter().enumerate() {
            if let Some(p) = &m.policy
                && !policy_ids.contains(p.as_str())
            {
                return Err(err(
                    format!("models[{i}].policy"),
                    format!("unknown policy `{p}`"),
                ));
            }
        }
        for (i, t) in self.targets.iter().enumerate() {
            if !(t.weight.is_finite() && t.weight >= 0.0) {
                return Err(err(
                    format!("targets[{i}].weight"),
                    "must be a finite number >= 0",
                ));
            }
            if t.retry.max_attempts == 0 {
                return Err(err(
                    format!("targets[{i}].retry.max_attempts"),
                    "must be at least 1",
                ));
            }
        }
        for (i, m) in self.models.iter().enumerate() {
            if let Some(c) = &m.cheaper
                && (c == &m.id || !model_ids.contains(c.as_str()))
            {
                return Err(err(
                    format!("models[{i}].cheaper"),
                    format!("`{c}` must name another model"),
                ));
            }
        }
        self.validate_tenancy()?;
        let t = &self.timeouts;
        if t.heartbeat_ms == 0 || t.heartbeat_ms >= t.worker_silence_ms {
            return Err(err(
                "timeouts.heartbeat_ms",
                "must be > 0 and < timeouts.worker_silence_ms",
            ));
        }
        if t.stall_ms == 0 {
            return Err(err("timeouts.stall_ms", "must be > 0"));
        }
        if self.responses.ttl_s == 0 {
            return Err(err("responses.ttl_s", "must be > 0"));
        }
        self.server.validate()
    }

    /// Keys: valid unique ids, exactly one of `key_sha256` / `key`, unique hashes; tenants: valid
    /// unique ids; budget shares in (0, 1].
    fn validate_tenancy(&self) -> Result<(), ConfigError> {
        use crate::tenancy::valid_id;
        let mut tenant_ids = HashSet::new();
        for (i, t) in self.tenants.iter().enumerate() {
            if !valid_id(&t.id) || !tenant_ids.insert(t.id.as_str()) {
                return Err(err(
                    format!("tenants[{i}].id"),
                    format!("`{}` is repeated or not 1-64 of [A-Za-z0-9_-]", t.id),
                ));
            }
            validate_budget(&format!("tenants[{i}].budget"), &t.budget)?;
            validate_rates(&format!("tenants[{i}].limits"), &t.limits)?;
        }
        let mut key_ids = HashSet::new();
        let mut hashes = HashSet::new();
        for (i, k) in self.keys.iter().enumerate() {
            if !valid_id(&k.id) || !key_ids.insert(k.id.as_str()) {
                return Err(err(
                    format!("keys[{i}].id"),
                    format!("`{}` is repeated or not 1-64 of [A-Za-z0-9_-]", k.id),
                ));
            }
            if !valid_id(&k.tenant) {
                return Err(err(
                    format!("keys[{i}].tenant"),
                    format!("`{}` is not 1-64 of [A-Za-z0-9_-]", k.tenant),
                ));
            }
            match (&k.key_sha256, &k.key) {
                (Some(h), None) => {
                    if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return Err(err(
                            format!("keys[{i}].key_sha256"),
                            "must be 64 hex digits (the SHA-256 of the key)",
                        ));
                    }
                }
                (None, Some(s)) if s.expose().len() >= 8 => {}
                (None, Some(_)) => {
                    return Err(err(
                        format!("keys[{i}].key"),
                        "must be at least 8 characters",
                    ));
                }
                _ => {
                    return Err(err(
                        format!("keys[{i}]"),
                        "needs exactly one of `key_sha256` and `key`",
                    ));
                }
            }
            if let Some(h) = k.sha256()
                && !hashes.insert(h)
            {
                return Err(err(
                    format!("keys[{i}]"),
                    "the same key is configured twice",
                ));
            }
            validate_budget(&format!("keys[{i}].budget"), &k.budget)?;
            validate_rates(&format!("keys[{i}].limits"), &k.limits)?;
        }
        let mut admin_ids = HashSet::new();
        let mut admin_hashes = HashSet::new();
        for (i, k) in self.admin.keys.iter().enumerate() {
            if !valid_id(&k.id) || !admin_ids.insert(k.id.as_str()) {
                return Err(err(
                    format!("admin.keys[{i}].id"),
                    format!("`{}` is repeated or not 1-64 of [A-Za-z0-9_-]", k.id),
                ));
            }
            match (&k.key_sha256, &k.key) {
                (Some(h), None) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
                    let h = h.to_ascii_lowercase();
                    if hashes.contains(&h) {
                        return Err(err(
                            format!("admin.keys[{i}]"),
                            "an admin key must not also be a client key",
                        ));
                    }
                    // One key under two ids would sign in as whichever comes first, and
                    // revoking one id would leave the key working under the other.
                    if !admin_hashes.insert(h) {
                        return Err(err(
                            format!("admin.keys[{i}]"),
                            "the same admin key is configured twice",
                        ));
                    }
                }
                (Some(_), None) => {
                    return Err(err(
                        format!("admin.keys[{i}].key_sha256"),
                        "must be 64 hex digits (the SHA-256 of the key)",
                    ));
                }
                (None, Some(_)) => {}
                _ => {
                    return Err(err(
                        format!("admin.keys[{i}]"),
                        "needs exactly one of `key_sha256` and `key`",
                    ));
                }
            }
            if let Some(t) = &k.tenant
                && !valid_id(t)
            {
                return Err(err(
                    format!("admin.keys[{i}].tenant"),
                    format!("`{t}` is not 1-64 of [A-Za-z0-9_-]"),
                ));
            }
        }
        if self.admin.stale_after_ms == 0 {
            return Err(err("admin.stale_after_ms", "must be > 0"));
        }
        let b = &self.budgets;
        if b.safety_margin > rust_decimal::Decimal::from(10) {
            return Err(err("budgets.safety_margin", "must be between 0 and 10"));
        }
        Ok(())
    }
}

/// Checks the `aws` block of target `i`: required for `bedrock`, rejected elsewhere, with a
/// region of lower-case letters, digits and `-` and non-empty keys.
fn validate_aws(i: usize, t: &TargetConfig) -> Result<(), ConfigError> {
    let aws = match (&t.aws, t.provider) {
        (None, ProviderKind::Bedrock) => {
            return Err(err(
                format!("targets[{i}].aws"),
                "bedrock targets need `aws: {region, access_key_id, secret_access_key}`",
            ));
        }
        (None, _) => return Ok(()),
        (Some(aws), ProviderKind::Bedrock) => aws,
        (Some(_), other) => {
            return Err(err(
                format!("targets[{i}].aws"),
                format!(
                    "only bedrock targets take aws settings (this one is {})",
                    other.as_str()
                ),
            ));
        }
    };
    let region_ok = !aws.region.is_empty()
        && aws
            .region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !region_ok {
        return Err(err(
            format!("targets[{i}].aws.region"),
            format!("`{}` is not an AWS region like us-east-1", aws.region),
        ));
    }
    for (name, value) in [
        ("access_key_id", &aws.access_key_id),
        ("secret_access_key", &aws.secret_access_key),
    ] {
        if value.expose().trim().is_empty() {
            return Err(err(format!("targets[{i}].aws.{name}"), "must not be empty"));
        }
    }
    Ok(())
}

fn validate_budget(field: &str, b: &crate::tenancy::Budget) -> Result<(), ConfigError> {
    if let Some(s) = b.downgrade_at {
        if s.is_zero() || s > rust_decimal::Decimal::ONE {
            return Err(err(format!("{field}.downgrade_at"), "must be in (0, 1]"));
        }
        if b.daily_usd.is_none() {
            return Err(err(
                format!("{field}.downgrade_at"),
                "needs `daily_usd` (it is a share of the daily budget)",
            ));
        }
    }
    Ok(())
}

fn validate_rates(field: &str, l: &crate::tenancy::RateLimits) -> Result<(), ConfigError> {
    let zero = [
        ("rpm", l.rpm == Some(0)),
        ("tpm", l.tpm == Some(0)),
        ("max_concurrent", l.max_concurrent == Some(0)),
    ];
    match zero.iter().find(|(_, z)| *z) {
        Some((name, _)) => Err(err(
            format!("{field}.{name}"),
            "must be at least 1 (omit it for no limit)",
        )),
        None => Ok(()),
    }
}

/// Adds `id` to `seen`; an empty or repeated one is an error at `field()`.
fn unique_id<'a>(
    seen: &mut HashSet<&'a str>,
    id: &'a str,
    field: impl FnOnce() -> String,
) -> Result<(), ConfigError> {
    if id.is_empty() || !seen.insert(id) {
        return Err(err(field(), format!("`{id}` is empty or repeated")));
    }
    Ok(())
}
