//! Bounded fuzzing on stable Rust (issue 13, Deliver 6): a seeded mutation loop, run as normal
//! tests, over the SSE parser, each provider's stream translation (OpenAI, Azure, Anthropic,
//! Gemini, Responses, Bedrock's event stream) and request translation, and the front-door
//! parsers (Chat Completions, Completions, Messages, Responses).
//!
//! cargo-fuzz needs nightly's sanitizer flags; this machine (and CI) has stable only, so the
//! engine here is a small mutator (byte-level: bit flips, interesting tokens, deletions,
//! duplications, splices between seeds; JSON-level: a random node replaced by an extreme value)
//! with every input run under `catch_unwind`. Seeds are the fixture streams, live streams of the
//! built-in mock upstream in every provider's wire format, and real front-door bodies. Budget per
//! target: `SWITCHYARD_FUZZ_SECS` (default 3 s); `SWITCHYARD_FUZZ_SEED` picks the random seed.
//! A crashing input is written to `target/fuzz-crashes/` and fails the test. `scripts/fuzz` runs
//! these with a longer budget and prints the exec counts.

use futures::StreamExt;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};
use switchyard_ingress::front_door::FrontDoor;
use switchyard_schemas::ChatRequest;
use switchyard_schemas::config::{ProviderKind, TargetConfig};
use switchyard_workers::provider::SseTranslator;
use switchyard_workers::providers::{anthropic, azure, bedrock, gemini, openai, openai_responses};
use switchyard_workers::sse::SseParser;

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const TOKENS: &[&[u8]] = &[
    b"\n",
    b"\r",
    b"\r\n",
    b"\n\n",
    b"data: ",
    b"data:",
    b"event: ",
    b"id: ",
    b"retry: ",
    b":",
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b",",
    b"null",
    b"true",
    b"-1",
    b"0",
    b"18446744073709551615",
    b"99999999999999999999999",
    b"1e308",
    b"-1e308",
    b"NaN",
    b"\xff",
    b"\xc3",
    b"\xe2\x82",
    b"\0",
    b"[DONE]",
    b"\\u0000",
    b"\\ud800",
    b"data: [DONE]\n\n",
    b"\"type\"",
    b"\"index\"",
    b"\"tool_calls\"",
    b"\"usage\"",
    b"\"content_block_delta\"",
    b"\"message_stop\"",
    b"\"finishReason\"",
    b"data:image/png;base64,",
    b"http://169.254.169.254/",
    b"\xef\xbb\xbf",
];

fn extreme(rng: &mut Rng) -> Value {
    match rng.below(16) {
        0 => Value::Null,
        1 => json!(-1),
        2 => json!(u64::MAX),
        3 => json!(i64::MIN),
        4 => json!(1e308),
        5 => json!(""),
        6 => json!("x".repeat(1 + rng.below(5000))),
        7 => json!([]),
        8 => json!({}),
        9 => json!(true),
        10 => json!("data:image/png;base64,iVBORw0KGgo="),
        11 => json!("\u{0}\u{feff}é💥"),
        12 => {
            json!([{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "file:///x"}}])
        }
        13 => {
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})
        }
        14 => json!(0),
        _ => json!(4294967296u64),
    }
}

/// Replaces one node of `v` (depth-first index `pick`), or deletes an object member.
fn mutate_json(rng: &mut Rng, v: &mut Value) {
    fn count(v: &Value) -> usize {
        1 + match v {
            Value::Array(a) => a.iter().map(count).sum(),
            Value::Object(o) => o.values().map(count).sum(),
            _ => 0,
        }
    }
    fn visit(v: &mut Value, pick: &mut usize, rng: &mut Rng) -> bool {
        if *pick == 0 {
            match (rng.below(4), &mut *v) {
                (0, Value::Object(o)) if !o.is_empty() => {
                    let k = o
                        .keys()
                        .nth(rng.below(o.len()))
                        .cloned()
                        .unwrap_or_default();
                    o.remove(&k);
                }
                (1, Value::Array(a)) if !a.is_empty() => {
                    let x = a[rng.below(a.len())].clone();
                    a.push(x);
                }
                _ => *v = extreme(rng),
            }
            return true;
        }
        *pick -= 1;
        match v {
            Value::Array(a) => a.iter_mut().any(|x| visit(x, pick, rng)),
            Value::Object(o) => o.values_mut().any(|x| visit(x, pick, rng)),
            _ => false,
        }
    }
    let mut pick = rng.below(count(v));
    visit(v, &mut pick, rng);
}

fn mutate_bytes(rng: &mut Rng, data: &mut Vec<u8>, seeds: &[Vec<u8>]) {
    for _ in 0..1 + rng.below(4) {
        let len = data.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                data[i] = rng.next() as u8;
            }
            2 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                let i = rng.below(len + 1);
                data.splice(i..i, t.iter().copied());
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(64));
                data.drain(i..i + n);
            }
            4 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(256));
                let chunk: Vec<u8> = data[i..i + n].to_vec();
                let at = rng.below(len + 1);
                data.splice(at..at, chunk);
            }
            5 if !seeds.is_empty() => {
                let other = &seeds[rng.below(seeds.len())];
                if !other.is_empty() {
                    let i = rng.below(other.len());
                    let n = 1 + rng.below((other.len() - i).min(512));
                    let at = rng.below(len + 1);
                    data.splice(at..at, other[i..i + n].iter().copied());
                }
            }
            6 if len > 0 => data.truncate(rng.below(len)),
            _ => {
                let t = TOKENS[rng.below(TOKENS.len())];
                data.extend_from_slice(t);
            }
        }
    }
}

fn budget() -> Duration {
    let secs = std::env::var("SWITCHYARD_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

/// Runs `target` on every seed, then on mutants until the budget is spent; returns the execs.
fn fuzz(name: &str, seeds: Vec<Vec<u8>>, json_aware: bool, target: impl Fn(&[u8])) -> u64 {
    assert!(!seeds.is_empty(), "{name}: no seeds");
    let seed = std::env::var("SWITCHYARD_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0x5EED);
    let mut rng = Rng(seed
        ^ name
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31) ^ u64::from(b)));
    let deadline = Instant::now() + budget();
    let mut execs = 0u64;
    let run = |input: &[u8], execs: &mut u64| {
        *execs += 1;
        if catch_unwind(AssertUnwindSafe(|| target(input))).is_err() {
            let dir =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz-crashes");
            let _ = std::fs::create_dir_all(&dir);
            let path = dir.join(format!("{name}-{seed}-{execs}.bin"));
            let _ = std::fs::write(&path, input);
            panic!(
                "fuzz target {name} panicked on input {} (saved to {}): {:?}",
                *execs,
                path.display(),
                String::from_utf8_lossy(&input[..input.len().min(2000)])
            );
        }
    };
    for s in &seeds {
        run(s, &mut execs);
    }
    while Instant::now() < deadline {
        let mut input = seeds[rng.below(seeds.len())].clone();
        let as_json = json_aware
            .then(|| serde_json::from_slice::<Value>(&input).ok())
            .flatten();
        match as_json {
            Some(mut v) if rng.below(3) != 0 => {
                for _ in 0..1 + rng.below(3) {
                    mutate_json(&mut rng, &mut v);
                }
                input = serde_json::to_vec(&v).unwrap();
            }
            _ => mutate_bytes(&mut rng, &mut input, &seeds),
        }
        run(&input, &mut execs);
    }
    eprintln!("fuzz {name}: {execs} execs, 0 crashes (seed {seed})");
    execs
}

// ---- seeds -------------------------------------------------------------------------------

fn fixture_streams(prefix: &str) -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../mock/src/fixtures");
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains(prefix))
        .map(|e| std::fs::read(e.path()).unwrap())
        .collect();
    out.sort();
    out
}

const DIRECTIVES: &[&str] = &[
    "text=Hello,+world chunks=3 prompt_tokens=5 completion_tokens=2",
    "tool_calls=2",
    "tool_calls=1 chunks=4",
    "reasoning=thinking+hard text=ok",
];

fn chat_request(provider: &str, directive: &str, stream: bool) -> ChatRequest {
    serde_json::from_value(json!({
        "id": "01900000-0000-7000-8000-000000000000", "model": "m",
        "target": {"id": "t", "provider": provider, "upstream_model": "mock"},
        "messages": [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": format!("hi\n#mock {directive}")}],
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "stream": stream, "include_usage": true, "deadline_ms": 0
    }))
    .unwrap()
}

fn target(provider: &str) -> TargetConfig {
    serde_json::from_value(
        json!({"id": "t", "provider": provider, "base_url": "builtin:mock",
        "upstream_model": "mock"}),
    )
    .unwrap()
}

/// Live streams of the mock upstream in each wire format (`path`, body per directive).
async fn mock_streams(
    base: &str,
    path: &str,
    body: impl Fn(&ChatRequest) -> Vec<u8>,
    provider: &str,
) -> Vec<Vec<u8>> {
    let http = reqwest::Client::new();
    let mut out = Vec::new();
    for d in DIRECTIVES {
        let req = chat_request(provider, d, true);
        let resp = http
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body(&req))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        out.push(resp.bytes().await.unwrap().to_vec());
    }
    out
}

struct Seeds {
    openai: Vec<Vec<u8>>,
    anthropic: Vec<Vec<u8>>,
    gemini: Vec<Vec<u8>>,
    responses: Vec<Vec<u8>>,
    bedrock: Vec<Vec<u8>>,
}

async fn seeds() -> Seeds {
    let mock = switchyard_mock::MockUpstream::start().await.unwrap();
    let base = mock.base_url();
    let mut openai = mock_streams(
        &base,
        "/v1/chat/completions",
        |r| openai::build_body(ProviderKind::Openai, "mock", r).unwrap(),
        "openai",
    )
    .await;
    openai.extend(fixture_streams("_openai_"));
    let mut anthropic = mock_streams(
        &base,
        "/v1/messages",
        |r| {
            serde_json::to_vec(&anthropic::build_request(&target("anthropic"), r).unwrap()).unwrap()
        },
        "anthropic",
    )
    .await;
    anthropic.extend(fixture_streams("_anthropic_"));
    let gemini = mock_streams(
        &base,
        "/v1beta/models/mock:streamGenerateContent?alt=sse",
        |r| serde_json::to_vec(&gemini::build_request(r).unwrap()).unwrap(),
        "gemini",
    )
    .await;
    let mut responses = mock_streams(
        &base,
        "/v1/responses",
        |r| {
            let mut o = openai_responses::build_object("mock", r).unwrap();
            o.insert("stream".into(), json!(true));
            serde_json::to_vec(&o).unwrap()
        },
        "openai",
    )
    .await;
    responses.extend(fixture_streams("_responses_"));
    let bedrock = mock_streams(
        &base,
        "/model/mock/converse-stream",
        |r| serde_json::to_vec(&bedrock::build_request(r).unwrap()).unwrap(),
        "bedrock",
    )
    .await;
    Seeds {
        openai,
        anthropic,
        gemini,
        responses,
        bedrock,
    }
}

/// Seed inputs of one target.
type Corpus = Vec<Vec<u8>>;

/// Front-door bodies: the Claude Code request, and one of every feature per door.
fn door_seeds() -> (Corpus, Corpus, Corpus) {
    let png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    let chat = vec![
        json!({"model": "demo/mock", "messages": [{"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "hi"},
                {"type": "image_url", "image_url": {"url": png, "detail": "low"}}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "w", "arguments": "{\"a\":1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
            "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
            "tool_choice": "auto", "stream": true, "stream_options": {"include_usage": true},
            "max_tokens": 5, "temperature": 0.5, "stop": ["x"], "response_format": {"type": "json_object"}}),
        json!({"model": "m", "functions": [{"name": "w", "parameters": {"type": "object"}}],
            "function_call": {"name": "w"}, "messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "function_call": {"name": "w", "arguments": "{}"}},
            {"role": "function", "name": "w", "content": "ok"}]}),
        json!({"model": "m", "prompt": ["a", "b"], "max_tokens": 3, "echo": false}),
    ];
    let claude_code =
        include_bytes!("../../../ingress/src/anthropic/claude_code_request.json").to_vec();
    let anthropic = vec![
        claude_code,
        serde_json::to_vec(&json!({"model": "demo/claude", "max_tokens": 16,
            "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "look"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                    "data": "iVBORw0KGgo="}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "tool_use", "id": "t1", "name": "w", "input": {"c": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}],
            "tools": [{"name": "w", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 2048},
            "stream": true}))
        .unwrap(),
    ];
    let responses = vec![
        json!({"model": "demo/mock", "instructions": "be brief", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"},
                {"type": "input_image", "image_url": png}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
            "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}},
                {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "x"}]}],
            "tool_choice": {"type": "function", "name": "w"}, "max_output_tokens": 9,
            "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
            "stream": true}),
        json!({"model": "m", "input": "hi", "previous_response_id": "resp_1", "store": false}),
    ];
    let to_bytes = |v: Vec<Value>| v.iter().map(|v| serde_json::to_vec(v).unwrap()).collect();
    (to_bytes(chat), anthropic, to_bytes(responses))
}

// ---- targets -----------------------------------------------------------------------------

/// Parses `input` in one piece and in pieces split at `cuts`: both give the same events.
fn sse_events(input: &[u8], cuts: &[usize]) -> Vec<switchyard_workers::sse::SseEvent> {
    let mut p = SseParser::with_max_event_bytes(1 << 16);
    let mut out = Vec::new();
    let mut at = 0;
    for &c in cuts.iter().chain(std::iter::once(&input.len())) {
        let c = c.clamp(at, input.len());
        if p.push(&input[at..c], &mut out).is_err() {
            return out;
        }
        at = c;
    }
    out.extend(p.finish());
    out
}

/// A fuzz target taking one input.
type Target = fn(&[u8]);

fn translate<T: SseTranslator + Default>(input: &[u8]) {
    let mut parser = SseParser::new();
    let mut events = Vec::new();
    let _ = parser.push(input, &mut events);
    events.extend(parser.finish());
    let mut tr = T::default();
    let mut out = VecDeque::new();
    if !events.into_iter().any(|ev| tr.on_event(ev, &mut out)) {
        tr.on_eof(&mut out);
    }
}

/// Every provider's request translation of `req` (errors are fine; panics are not).
fn translate_request(req: &ChatRequest) {
    for kind in [ProviderKind::Openai, ProviderKind::OpenaiCompatible] {
        let _ = openai::build_body(kind, "m", req);
    }
    let _ = azure::build_body("dep", "2024-10-21", req);
    let _ = azure::build_body("dep", "2024-02-01", req);
    let _ = anthropic::build_request(&target("anthropic"), req);
    let _ = gemini::build_request(req);
    let _ = bedrock::build_request(req);
    let _ = openai_responses::build_object("m", req);
}

fn inbound_request(i: switchyard_ingress::route::Inbound) -> ChatRequest {
    ChatRequest {
        prompt_tokens: None,
        id: uuid::Uuid::nil(),
        tenant: None,
        key_id: None,
        model: i.model,
        target: switchyard_schemas::request::TargetRef {
            id: "t".into(),
            provider: "openai".into(),
            upstream_model: "m".into(),
        },
        messages: i.messages,
        tools: i.tools,
        tool_choice: i.tool_choice,
        params: i.params,
        stream: i.stream,
        include_usage: i.include_usage,
        deadline_ms: u64::MAX,
        attempt: 0,
        batch_id: None,
        passthrough: i.passthrough,
    }
}

/// A front door's parse, then (when it accepts) the shared checks and every provider's
/// translation of the result.
fn door<D: FrontDoor>(door: D, input: &[u8]) {
    match door.parse(input) {
        Ok(inbound) => {
            let _ =
                switchyard_schemas::input::check_conversation(&inbound.messages, &inbound.tools);
            translate_request(&inbound_request(inbound));
        }
        Err(e) => {
            let _ = door.error(e);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzz_sse_parser_and_stream_translation() {
    let s = seeds().await;
    let all: Vec<Vec<u8>> = [&s.openai, &s.anthropic, &s.gemini, &s.responses]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    let runs = tokio::task::spawn_blocking(move || {
        let mut runs = vec![fuzz("sse_parser", all, false, |input| {
            // Differential: any chunking gives the events of one piece.
            let whole = sse_events(input, &[]);
            let n = input.len().max(1);
            let cuts: Vec<usize> = (1..8).map(|k| (input.len() * k) / 8 % n).collect();
            let mut sorted = cuts.clone();
            sorted.sort_unstable();
            assert_eq!(whole, sse_events(input, &sorted));
            let bytewise: Vec<usize> = (0..input.len()).collect();
            assert_eq!(whole, sse_events(input, &bytewise));
        })];
        let streams: [(&str, Vec<Vec<u8>>, Target); 5] = [
            (
                "stream_openai",
                s.openai.clone(),
                translate::<openai::OpenAiTranslator>,
            ),
            (
                "stream_azure",
                s.openai,
                translate::<azure::AzureTranslator>,
            ),
            (
                "stream_anthropic",
                s.anthropic,
                translate::<anthropic::AnthropicTranslator>,
            ),
            (
                "stream_gemini",
                s.gemini,
                translate::<gemini::GeminiTranslator>,
            ),
            (
                "stream_responses",
                s.responses,
                translate::<openai_responses::ResponsesTranslator>,
            ),
        ];
        for (name, seeds, target) in streams {
            runs.push(fuzz(name, seeds, false, target));
        }
        runs.push(fuzz("stream_bedrock", s.bedrock, false, |input| {
            let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = input
                .chunks(97)
                .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
                .collect();
            let stream = bedrock::translate_event_stream(futures::stream::iter(chunks));
            let _: Vec<_> = futures::executor::block_on(stream.collect());
        }));
        runs
    })
    .await
    .unwrap();
    assert!(runs.iter().all(|n| *n > 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzz_request_translation_and_front_doors() {
    let (chat, anthropic_bodies, responses) = door_seeds();
    let runs = tokio::task::spawn_blocking(move || {
        let requests: Vec<Vec<u8>> = ["openai", "anthropic", "gemini", "bedrock"]
            .iter()
            .flat_map(|p| DIRECTIVES.iter().map(move |d| chat_request(p, d, true)))
            .map(|r| serde_json::to_vec(&r).unwrap())
            .collect();
        vec![
            fuzz("request_translation", requests, true, |input| {
                if let Ok(req) = serde_json::from_slice::<ChatRequest>(input) {
                    translate_request(&req);
                }
            }),
            fuzz("door_chat", chat.clone(), true, |input| {
                door(switchyard_ingress::chat::OpenAiChat::default(), input)
            }),
            fuzz("door_completions", chat, true, |input| {
                door(
                    switchyard_ingress::openai::completions::OpenAiCompletions,
                    input,
                )
            }),
            fuzz("door_messages", anthropic_bodies, true, |input| {
                door(
                    switchyard_ingress::anthropic::AnthropicMessages::default(),
                    input,
                )
            }),
            fuzz("door_responses", responses, true, |input| {
                if let Ok(p) = switchyard_ingress::responses::request::parse(input, "x") {
                    let _ = switchyard_schemas::input::check_conversation(
                        &p.conversation(&[]),
                        &p.tools,
                    );
                }
            }),
        ]
    })
    .await
    .unwrap();
    assert!(runs.iter().all(|n| *n > 0));
}
