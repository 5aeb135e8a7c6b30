//! Tests of `strategy.rs`: planning, exclusions, orders and capabilities.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::json;

/// Targets a (prio 2), b (prio 0), c (prio 1), d (anthropic, prio 3); model m → [a, b, c, d].
fn config(policy: serde_json::Value) -> GatewayConfig {
    let c: GatewayConfig = serde_json::from_value(json!({
        "targets": [
            {"id": "a", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "gpt-4o", "priority": 2, "weight": 1},
            {"id": "b", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "gpt-4o-mini", "priority": 0, "weight": 3},
            {"id": "c", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "gpt-4.1", "priority": 1, "weight": 0},
            {"id": "d", "provider": "anthropic", "base_url": "builtin:mock", "upstream_model": "claude-sonnet-4-20250514", "priority": 3, "context_window": 1000}
        ],
        "models": [{"id": "m", "targets": ["a", "b", "c", "d"], "policy": "p"}],
        "policies": [policy]
    }))
    .unwrap();
    c.validate().unwrap();
    c
}

struct Fixture {
    obs: HashMap<&'static str, Observed>,
}

impl Fixture {
    fn new() -> Self {
        let catalog = switchyard_schemas::pricing::Catalog::bundled().unwrap();
        let mut obs = HashMap::new();
        for (id, kind, model) in [
            ("a", ProviderKind::Openai, "gpt-4o"),
            ("b", ProviderKind::Openai, "gpt-4o-mini"),
            ("c", ProviderKind::Openai, "gpt-4.1"),
            ("d", ProviderKind::Anthropic, "claude-sonnet-4-20250514"),
        ] {
            let mut o = Observed::fresh(kind);
            o.cost = cost_per_million(&catalog, model);
            obs.insert(id, o);
        }
        Self { obs }
    }

    fn set(mut self, id: &'static str, f: impl FnOnce(&mut Observed)) -> Self {
        f(self.obs.get_mut(id).unwrap());
        self
    }

    fn order(&self, policy: serde_json::Value, needs: &Needs, prefs: &Preferences) -> Vec<String> {
        self.order_seeded(policy, needs, prefs, 7)
    }

    fn order_seeded(
        &self,
        policy: serde_json::Value,
        needs: &Needs,
        prefs: &Preferences,
        seed: u64,
    ) -> Vec<String> {
        self.plan_ids(policy, needs, prefs, seed).unwrap()
    }

    fn error(&self, policy: serde_json::Value, needs: &Needs, prefs: &Preferences) -> ErrorInfo {
        self.plan_ids(policy, needs, prefs, 1).unwrap_err()
    }

    /// The planned target ids of model `m` under `policy`, drawing with `seed`.
    fn plan_ids(
        &self,
        policy: serde_json::Value,
        needs: &Needs,
        prefs: &Preferences,
        seed: u64,
    ) -> Result<Vec<String>, ErrorInfo> {
        let c = config(policy);
        let model = c.model("m").unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        let planned = plan(
            &c,
            model,
            needs,
            prefs,
            |t| self.obs[t.id.as_str()],
            &mut rng,
        )?;
        Ok(planned.targets.iter().map(|t| t.id.clone()).collect())
    }
}

fn p(strategy: &str) -> serde_json::Value {
    json!({"id": "p", "strategy": strategy})
}

/// `e` is a no-capacity error with exactly `message`.
fn assert_no_capacity(e: &ErrorInfo, message: &str) {
    assert_eq!(e.class, ErrorClass::NoCapacity);
    assert_eq!(e.message, message);
}

fn none() -> (Needs, Preferences) {
    (Needs::default(), Preferences::default())
}

#[test]
fn priority_orders_by_priority_then_list_order() {
    let (n, pr) = none();
    assert_eq!(
        Fixture::new().order(p("priority"), &n, &pr),
        ["b", "c", "a", "d"]
    );
}

#[test]
fn weighted_draws_the_first_by_weight_and_falls_back_by_priority() {
    let (n, pr) = none();
    let f = Fixture::new();
    let mut firsts = HashMap::new();
    for seed in 0..1000 {
        let order = f.order_seeded(p("weighted"), &n, &pr, seed);
        // The rest keep priority order.
        let rest: Vec<&String> = order.iter().skip(1).collect();
        let expected: Vec<&str> = ["b", "c", "a", "d"]
            .into_iter()
            .filter(|id| *id != order[0])
            .collect();
        assert_eq!(rest, expected);
        *firsts.entry(order[0].clone()).or_insert(0) += 1;
    }
    // Weights a=1, b=3, c=0, d=1 (default): b 60 %, a 20 %, d 20 %, c never.
    assert_eq!(firsts.get("c"), None);
    let b = firsts["b"];
    assert!((540..=660).contains(&b), "{firsts:?}");
    assert!((150..=250).contains(&firsts["a"]), "{firsts:?}");
    assert!((150..=250).contains(&firsts["d"]), "{firsts:?}");
}

#[test]
fn lowest_cost_uses_the_catalog_and_puts_unpriced_last() {
    let (n, pr) = none();
    // gpt-4o-mini 0.75, gpt-4.1 10, gpt-4o 12.5, claude-sonnet-4 18.
    assert_eq!(
        Fixture::new().order(p("lowest_cost"), &n, &pr),
        ["b", "c", "a", "d"]
    );
    let f = Fixture::new().set("b", |o| o.cost = None);
    assert_eq!(f.order(p("lowest_cost"), &n, &pr), ["c", "a", "d", "b"]);
}

#[test]
fn lowest_latency_tries_unknown_targets_first() {
    let (n, pr) = none();
    let f = Fixture::new()
        .set("a", |o| o.ttft_ms = Some(120.0))
        .set("b", |o| o.ttft_ms = Some(300.0))
        .set("c", |o| o.ttft_ms = Some(80.0));
    // d was never measured: 0 ms, first.
    assert_eq!(f.order(p("lowest_latency"), &n, &pr), ["d", "c", "a", "b"]);
}

#[test]
fn least_busy_prefers_fewer_in_flight() {
    let (n, pr) = none();
    let f = Fixture::new()
        .set("a", |o| o.in_flight = 0)
        .set("b", |o| o.in_flight = 2)
        .set("c", |o| o.in_flight = 1)
        .set("d", |o| o.in_flight = 0);
    assert_eq!(f.order(p("least_busy"), &n, &pr), ["a", "d", "c", "b"]);
}

#[test]
fn canary_is_stable_per_user_and_splits_by_percent() {
    let policy = json!({"id": "p", "strategy": "canary", "canary": {"target": "a", "percent": 25}});
    let f = Fixture::new();
    let n = Needs::default();
    let mut hits = 0;
    for i in 0..2000 {
        let prefs = Preferences {
            user: Some(format!("user-{i}")),
            ..Preferences::default()
        };
        let first = f.order_seeded(policy.clone(), &n, &prefs, i);
        let again = f.order_seeded(policy.clone(), &n, &prefs, i + 99);
        assert_eq!(first, again, "user-{i} moved");
        if first[0] == "a" {
            hits += 1;
            assert_eq!(first, ["a", "b", "c", "d"]);
        } else {
            // Outside the share the canary is only the last resort.
            assert_eq!(first, ["b", "c", "d", "a"]);
        }
    }
    assert!((400..=600).contains(&hits), "{hits} of 2000");
    assert_eq!(canary_bucket("user-1"), canary_bucket("user-1"));
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
}

#[test]
fn composite_weighs_the_normalised_terms() {
    let (n, pr) = none();
    // Only cost counts: cheapest first.
    let only_cost = json!({"id": "p", "strategy": "composite",
        "weights": {"priority": 0, "health": 0, "cost": 1, "latency": 0, "headroom": 0}});
    assert_eq!(
        Fixture::new().order(only_cost, &n, &pr),
        ["b", "c", "a", "d"]
    );
    // Priority 1, latency 2: a (prio 2 → 1/3, fastest → 1) = 2.33 beats b (1 + 0) = 1,
    // c (2/3 + 2 × 0.5) = 1.67; d (0 + 2 × 0.75) = 1.5.
    let f = Fixture::new()
        .set("a", |o| o.ttft_ms = Some(100.0))
        .set("b", |o| o.ttft_ms = Some(500.0))
        .set("c", |o| o.ttft_ms = Some(300.0))
        .set("d", |o| o.ttft_ms = Some(200.0));
    let w = json!({"id": "p", "strategy": "composite",
        "weights": {"priority": 1, "health": 0, "cost": 0, "latency": 2, "headroom": 0}});
    assert_eq!(f.order(w, &n, &pr), ["a", "c", "d", "b"]);
    // Defaults: health weighs 2, so a degraded target sinks (and is moved last anyway).
    let f = Fixture::new().set("b", |o| o.health = HealthState::Degraded);
    assert_eq!(f.order(p("composite"), &n, &pr).last().unwrap(), "b");
}

#[test]
fn health_skips_unhealthy_and_puts_degraded_last() {
    let (n, pr) = none();
    let f = Fixture::new()
        .set("b", |o| o.health = HealthState::Unhealthy)
        .set("c", |o| o.health = HealthState::Degraded);
    assert_eq!(f.order(p("priority"), &n, &pr), ["a", "d", "c"]);
    let f = Fixture::new()
        .set("a", |o| o.health = HealthState::Unhealthy)
        .set("b", |o| o.health = HealthState::Unhealthy)
        .set("c", |o| o.health = HealthState::Unhealthy)
        .set("d", |o| o.health = HealthState::Unhealthy);
    let e = f.error(p("priority"), &n, &pr);
    assert_no_capacity(
        &e,
        "Model `m`: every target is unhealthy (a: unhealthy; b: unhealthy; c: unhealthy; d: unhealthy).",
    );
}

#[test]
fn capabilities_filter_targets() {
    let pr = Preferences::default();
    // A deployment of d whose provider has no JSON mode (an override, as in CapabilityTable).
    let no_json = || Fixture::new().set("d", |o| o.capabilities.json_mode = false);
    let json = Needs {
        json_mode: true,
        ..Needs::default()
    };
    assert_eq!(no_json().order(p("priority"), &json, &pr), ["b", "c", "a"]);
    let only_d = Preferences {
        only: Some(vec!["d".into()]),
        ..Preferences::default()
    };
    let e = no_json().error(p("priority"), &json, &only_d);
    assert_eq!(e.class, ErrorClass::InvalidRequest);
    assert_eq!(e.param.as_deref(), Some("response_format"));
    assert_eq!(
        e.message,
        "Model `m` has no target that supports json_mode (d: provider anthropic lacks json_mode)."
    );
    // One target lacking, the other unhealthy: a 503 (the unhealthy one may come back).
    let only_cd = Preferences {
        only: Some(vec!["c".into(), "d".into()]),
        ..Preferences::default()
    };
    let f = no_json().set("c", |o| o.health = HealthState::Unhealthy);
    let e = f.error(p("priority"), &json, &only_cd);
    assert_no_capacity(
        &e,
        "Model `m`: no target can serve this request (c: unhealthy; d: provider anthropic lacks json_mode).",
    );
    let emb = Needs::embeddings();
    assert_eq!(
        Fixture::new().order(p("priority"), &emb, &pr),
        ["b", "c", "a"]
    );
    let e = Fixture::new().error(p("priority"), &emb, &only_d);
    assert_eq!(
        (e.class, e.param.as_deref()),
        (ErrorClass::InvalidRequest, Some("model"))
    );
    let no_tools = Fixture::new().set("b", |o| o.capabilities.tools = false);
    let tools = Needs {
        tools: true,
        ..Needs::default()
    };
    assert_eq!(no_tools.order(p("priority"), &tools, &pr), ["c", "a", "d"]);
}

#[test]
fn context_window_filter_and_the_400_when_only_length_is_the_reason() {
    let pr = Preferences::default();
    let fits = Needs {
        prompt_tokens: Some(900),
        max_tokens: 100,
        ..Needs::default()
    };
    assert_eq!(
        Fixture::new().order(p("priority"), &fits, &pr),
        ["b", "c", "a", "d"]
    );
    let long = Needs {
        prompt_tokens: Some(901),
        max_tokens: 100,
        ..Needs::default()
    };
    assert_eq!(
        Fixture::new().order(p("priority"), &long, &pr),
        ["b", "c", "a"]
    );
    let only_d = Preferences {
        only: Some(vec!["d".into()]),
        ..Preferences::default()
    };
    let e = Fixture::new().error(p("priority"), &long, &only_d);
    assert_eq!(e.class, ErrorClass::ContextLengthExceeded);
    assert_eq!(e.param.as_deref(), Some("messages"));
    assert!(e.message.contains("about 1001 tokens"), "{}", e.message);
    // With trimming, only what cannot be dropped has to fit.
    let trimmable = Needs {
        min_prompt_tokens: Some(500),
        ..long
    };
    assert_eq!(
        Fixture::new().order(p("priority"), &trimmable, &only_d),
        ["d"]
    );
    // Mixed reasons: 503 listing each.
    let f = Fixture::new().set("c", |o| o.health = HealthState::Unhealthy);
    let only_cd = Preferences {
        only: Some(vec!["d".into(), "c".into()]),
        ..Preferences::default()
    };
    let e = f.error(p("priority"), &long, &only_cd);
    assert_no_capacity(
        &e,
        "Model `m`: no target can serve this request (c: unhealthy; d: needs ~1001 tokens, context window is 1000).",
    );
}

#[test]
fn client_preferences() {
    let n = Needs::default();
    let f = Fixture::new();
    let prefs = Preferences {
        ignore: vec!["b".into()],
        ..Preferences::default()
    };
    assert_eq!(f.order(p("priority"), &n, &prefs), ["c", "a", "d"]);
    let prefs = Preferences {
        only: Some(vec!["a".into(), "d".into()]),
        ..Preferences::default()
    };
    assert_eq!(f.order(p("priority"), &n, &prefs), ["a", "d"]);
    let prefs = Preferences {
        order: vec!["d".into(), "a".into(), "zzz".into()],
        ..Preferences::default()
    };
    assert_eq!(f.order(p("priority"), &n, &prefs), ["d", "a", "b", "c"]);
    let prefs = Preferences {
        only: Some(vec!["zzz".into()]),
        ..Preferences::default()
    };
    let e = f.error(p("priority"), &n, &prefs);
    assert_eq!(e.class, ErrorClass::InvalidRequest);
    assert_eq!(e.param.as_deref(), Some("x-switchyard-only"));
}

#[test]
fn max_attempts_caps_the_list() {
    let (n, pr) = none();
    let policy = json!({"id": "p", "strategy": "priority", "max_attempts": 2});
    assert_eq!(Fixture::new().order(policy, &n, &pr), ["b", "c"]);
}

#[test]
fn needs_of_a_chat_request() {
    let messages: Vec<Message> = serde_json::from_value(json!([
        {"role": "user", "content": [{"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}
    ]))
    .unwrap();
    let params = SamplingParams {
        response_format: Some(json!({"type": "json_schema", "json_schema": {}})),
        max_tokens: Some(50),
        ..SamplingParams::default()
    };
    let n = Needs::chat(&messages, &[], &params);
    assert!(n.vision && n.json_mode && !n.tools && !n.embeddings);
    assert_eq!(n.max_tokens, 50);
    let text = SamplingParams {
        response_format: Some(json!({"type": "text"})),
        ..SamplingParams::default()
    };
    assert!(!Needs::chat(&messages, &[], &text).json_mode);
}
