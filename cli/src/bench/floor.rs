//! `switchyard bench-floor` (hidden): the least a gateway can cost on the bench's JSON path, so
//! `switchyard bench --floors` can put Switchyard's numbers beside the cost of the design itself.
//!
//! Two minimal gateways, each its own process (the bench reads each process tree's CPU alone),
//! both on the same binary, allocator and tokio runtime as `switchyard up`:
//! - **proxy**: HTTP in (axum) → parse the JSON body → the same request to the upstream (reqwest,
//!   the worker's client settings) → parse the answer → answer. No NATS: what any Rust gateway
//!   pays (TensorZero's shape).
//! - **proxy + NATS** (`--nats`): the same, with the upstream call behind one core-NATS
//!   request/reply through its own nats-server child: an "ingress" connection publishes the
//!   request, a queue-group responder on a second connection (the "worker") calls the upstream
//!   and publishes the answer back. That is the one hop Switchyard's pipeline cannot do without
//!   (ingress → worker → ingress) and nothing else: no cache lookup or store, no budget, no
//!   limits, no usage events, no billing.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use futures::StreamExt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The subject the NATS floor's responder serves (queue group `workers`).
const SUBJECT: &str = "floor.chat";
/// Header of a streaming request (the responder reads no JSON to tell).
const STREAM: &str = "Floor-Stream";
/// Header of the empty message that ends a failed stream.
const FAILED: &str = "Floor-Failed";

/// Options of `switchyard bench-floor`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct FloorArgs {
    /// Listen address of the minimal gateway.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The upstream's chat completions URL for `"stream": false` requests (the bench's mock).
    #[arg(long)]
    pub upstream: String,
    /// The upstream's chat completions URL for `"stream": true` requests.
    #[arg(long)]
    pub stream_upstream: String,
    /// Put the upstream call behind NATS (a nats-server child of this process, which dies with
    /// it).
    #[arg(long)]
    pub nats: bool,
}

/// How a request reaches the upstream.
enum Hop {
    /// The handler calls the upstream itself.
    Direct,
    /// The handler asks the responder over NATS.
    Nats(async_nats::Client),
}

struct Floor {
    http: reqwest::Client,
    upstream: Upstreams,
    hop: Hop,
}

/// The two upstream URLs (JSON, streaming).
#[derive(Clone)]
struct Upstreams {
    json: String,
    stream: String,
}

/// Serves until `shutdown` fires.
pub(crate) async fn run(args: FloorArgs, shutdown: CancellationToken) -> Result<(), String> {
    // The worker's upstream client settings (`workers/src/worker.rs`).
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| e.to_string())?;
    let upstream = Upstreams {
        json: args.upstream,
        stream: args.stream_upstream,
    };
    let tasks = TaskTracker::new();
    // Held until the end: dropping it stops the nats-server child.
    let mut server = None;
    let hop = if args.nats {
        // Owned (like `up`'s): it dies with this process even on SIGKILL.
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let nats = switchyard_natsd::NatsServer::start_owned(dir.path(), None, &[])
            .map_err(|e| e.to_string())?;
        let ingress = async_nats::connect(nats.url())
            .await
            .map_err(|e| e.to_string())?;
        let worker = async_nats::connect(nats.url())
            .await
            .map_err(|e| e.to_string())?;
        let requests = worker
            .queue_subscribe(SUBJECT, "workers".into())
            .await
            .map_err(|e| e.to_string())?;
        worker.flush().await.map_err(|e| e.to_string())?;
        tasks.spawn(respond(
            requests,
            worker,
            http.clone(),
            upstream.clone(),
            tasks.clone(),
            shutdown.clone(),
        ));
        server = Some((nats, dir));
        Hop::Nats(ingress)
    } else {
        Hop::Direct
    };
    let state = Arc::new(Floor {
        http,
        upstream,
        hop,
    });
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(chat))
        .with_state(state);
    // TCP_NODELAY as ingress sets it (`ingress/src/server.rs`): with Nagle on, an SSE chunk
    // after the head waits for the client's delayed ACK (≈ 40 ms).
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| e.to_string())?
        .tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
    let stop = shutdown.clone();
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .map_err(|e| e.to_string());
    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
    drop(server);
    served
}

/// The handler: parse, one upstream call (direct or over NATS), answer. A JSON answer is parsed
/// and written again; a stream's chunks pass as they come (over NATS: one message per chunk the
/// responder read, then an empty message).
async fn chat(State(floor): State<Arc<Floor>>, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let stream = request["stream"].as_bool() == Some(true);
    let Ok(request) = serde_json::to_vec(&request) else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    if stream {
        return match &floor.hop {
            Hop::Direct => match send(&floor.http, &floor.upstream.stream, request.into()).await {
                Some(resp) => sse(Body::from_stream(resp.bytes_stream())),
                None => StatusCode::BAD_GATEWAY.into_response(),
            },
            Hop::Nats(client) => {
                let inbox = client.new_inbox();
                let Ok(chunks) = client.subscribe(inbox.clone()).await else {
                    return StatusCode::BAD_GATEWAY.into_response();
                };
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(STREAM, "1");
                if client
                    .publish_with_reply_and_headers(SUBJECT, inbox, headers, request.into())
                    .await
                    .is_err()
                {
                    return StatusCode::BAD_GATEWAY.into_response();
                }
                // Ends at the empty message; a message with headers is the responder's failure
                // mark, which aborts the body (the client sees a broken stream, not a clean end).
                let chunks = chunks
                    .take_while(|m| {
                        futures::future::ready(!m.payload.is_empty() || m.headers.is_some())
                    })
                    .map(|m| match m.headers {
                        Some(_) => Err(std::io::Error::other("upstream stream failed")),
                        None => Ok(m.payload),
                    });
                sse(Body::from_stream(chunks))
            }
        };
    }
    let answer = match &floor.hop {
        Hop::Direct => call(&floor.http, &floor.upstream.json, request.into()).await,
        Hop::Nats(client) => client
            .request(SUBJECT, request.into())
            .await
            .ok()
            .map(|m| m.payload)
            .filter(|p| !p.is_empty()),
    };
    let answer = answer
        .and_then(|a| serde_json::from_slice::<serde_json::Value>(&a).ok())
        .and_then(|a| serde_json::to_vec(&a).ok());
    match answer {
        Some(a) => ([("content-type", "application/json")], a).into_response(),
        None => StatusCode::BAD_GATEWAY.into_response(),
    }
}

/// An SSE answer with `body`.
fn sse(body: Body) -> Response {
    ([("content-type", "text/event-stream")], body).into_response()
}

/// The responder ("worker") of the NATS floor: each request is one upstream call, answered on
/// its reply subject: a JSON answer as one message (an empty payload on failure), a stream as
/// one message per chunk read and an empty message at the end.
async fn respond(
    mut requests: async_nats::Subscriber,
    client: async_nats::Client,
    http: reqwest::Client,
    upstream: Upstreams,
    tasks: TaskTracker,
    shutdown: CancellationToken,
) {
    while let Some(Some(msg)) = shutdown.run_until_cancelled(requests.next()).await {
        let Some(reply) = msg.reply else { continue };
        let (client, http, upstream) = (client.clone(), http.clone(), upstream.clone());
        tasks.spawn(async move {
            let stream = msg
                .headers
                .as_ref()
                .is_some_and(|h| h.get(STREAM).is_some());
            if !stream {
                let answer = call(&http, &upstream.json, msg.payload).await;
                let _ = client.publish(reply, answer.unwrap_or_default()).await;
                return;
            }
            let mut failed = true;
            if let Some(resp) = send(&http, &upstream.stream, msg.payload).await {
                let mut chunks = resp.bytes_stream();
                failed = false;
                while let Some(chunk) = chunks.next().await {
                    let Ok(chunk) = chunk else {
                        failed = true;
                        break;
                    };
                    if client.publish(reply.clone(), chunk).await.is_err() {
                        return;
                    }
                }
            }
            let _ = match failed {
                true => {
                    let mut mark = async_nats::HeaderMap::new();
                    mark.insert(FAILED, "1");
                    client.publish_with_headers(reply, mark, Bytes::new()).await
                }
                false => client.publish(reply, Bytes::new()).await,
            };
        });
    }
}

/// One upstream call; the answer's body when it is a success.
async fn call(http: &reqwest::Client, upstream: &str, body: Bytes) -> Option<Bytes> {
    send(http, upstream, body).await?.bytes().await.ok()
}

/// One upstream request; the response when its status is a success.
async fn send(http: &reqwest::Client, upstream: &str, body: Bytes) -> Option<reqwest::Response> {
    let resp = http
        .post(upstream)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .ok()?;
    resp.status().is_success().then_some(resp)
}

/// The floor gateways of one `switchyard bench --floors` run, each with what it recorded in the
/// current phase.
pub(super) struct Floors {
    list: Vec<FloorPath>,
}

struct FloorPath {
    name: &'static str,
    proc: super::Proc,
    path: super::Path2,
    stats: Arc<parking_lot::Mutex<super::PathStats>>,
    /// CPU clock ticks of the floor's process tree during its slices of this phase.
    cpu_ticks: u64,
    /// Of `cpu_ticks`, its nats-server's (the NATS floor).
    nats_ticks: u64,
}

impl Floors {
    /// Starts both floors against the mock's JSON URL `json` and streaming URL `stream` (the
    /// direct paths' URLs) and waits until each answers.
    pub(super) async fn start(
        dir: &std::path::Path,
        json: &str,
        stream: &str,
        http: &reqwest::Client,
        counter: &Arc<std::sync::atomic::AtomicU64>,
        own_conversations: bool,
    ) -> Result<Self, String> {
        let mut list = Vec::new();
        for (name, nats) in [("proxy floor", false), ("proxy + NATS floor", true)] {
            let listen = format!("127.0.0.1:{}", super::free_port()?);
            let mut args = vec![
                "bench-floor",
                "--listen",
                &listen,
                "--upstream",
                json,
                "--stream-upstream",
                stream,
            ];
            if nats {
                args.push("--nats");
            }
            let log = dir.join(if nats { "floor-nats.log" } else { "floor.log" });
            let proc = super::spawn(&args, &log, None)?;
            let path = super::Path2 {
                url: format!("http://{listen}/v1/chat/completions"),
                model: "mock",
                key: false,
                own_conversations,
            };
            let what = format!("the {name} (log: {})", log.display());
            super::wait_answering(http, &path, counter, Duration::from_secs(30), &what).await?;
            list.push(FloorPath {
                name,
                proc,
                path,
                stats: Arc::new(parking_lot::Mutex::new(super::PathStats::new()?)),
                cpu_ticks: 0,
                nats_ticks: 0,
            });
        }
        Ok(Self { list })
    }

    /// Clears what the floors recorded, for a new phase.
    pub(super) fn reset(&mut self) -> Result<(), String> {
        for f in &mut self.list {
            f.stats = Arc::new(parking_lot::Mutex::new(super::PathStats::new()?));
            f.cpu_ticks = 0;
            f.nats_ticks = 0;
        }
        Ok(())
    }

    /// One slice of `length` at `rate` (streams when `stream`) on each floor, counting each
    /// floor tree's CPU.
    pub(super) async fn slice(
        &mut self,
        http: &reqwest::Client,
        rate: u64,
        length: Duration,
        stream: bool,
        counter: &Arc<std::sync::atomic::AtomicU64>,
    ) {
        for f in &mut self.list {
            let pid = f.proc.0.id();
            let nats = super::child_named(pid, "nats-server");
            let (_, before) = super::tree_usage(pid);
            let nats_before = nats.map_or(0, super::cpu_ticks);
            super::slice(http, &f.path, rate, length, stream, counter, &f.stats).await;
            f.cpu_ticks += super::tree_usage(pid).1.saturating_sub(before);
            f.nats_ticks += nats.map_or(0, super::cpu_ticks).saturating_sub(nats_before);
        }
    }

    /// Prints each floor's table rows for `phase` and returns its summary line: added latency
    /// (TTFT and inter-chunk gap when `stream`) against `direct` (same run) and CPU per request
    /// of its process tree.
    pub(super) fn report(&self, phase: &str, stream: bool, direct: &super::PathStats) -> String {
        let what = if stream { "TTFT" } else { "latency" };
        let mut parts = Vec::new();
        for f in &self.list {
            let s = f.stats.lock();
            super::print_row(phase, &format!("{} {what}", f.name), &s, &s.latency);
            if stream {
                super::print_row(phase, &format!("{} inter-chunk gap", f.name), &s, &s.gap);
            }
            let added = super::added_ms;
            let per_request = |ticks| s.ms_per_request(ticks);
            parts.push(format!(
                "{} added {what} p50 {:+.3} ms, p99 {:+.3} ms{}, CPU of its tree {:.3} ms/request{}, errors {}{}",
                f.name,
                added(0.5, &direct.latency, &s.latency),
                added(0.99, &direct.latency, &s.latency),
                if stream {
                    format!(", inter-chunk gap p99 {:+.3} ms", added(0.99, &direct.gap, &s.gap))
                } else {
                    String::new()
                },
                per_request(f.cpu_ticks),
                if f.nats_ticks > 0 {
                    format!(" ({:.3} of it nats-server)", per_request(f.nats_ticks))
                } else {
                    String::new()
                },
                s.errors,
                s.first_error_note()
            ));
        }
        format!("{phase}, floors: {}", parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::{FloorArgs, run};
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    /// The chat answer's content (JSON) or the stream's `data:` events, as the client reads them.
    async fn answer(http: &reqwest::Client, url: &str, stream: bool) -> (u16, Vec<String>) {
        let body = serde_json::json!({"model": "mock", "stream": stream,
            "messages": [{"role": "user", "content": "floor"}]});
        let resp = http.post(url).json(&body).send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        if stream {
            let events = text.lines().filter(|l| l.starts_with("data: ")).count();
            let last = text
                .lines()
                .rfind(|l| l.starts_with("data: "))
                .unwrap_or("");
            return (status, vec![events.to_string(), last.to_owned()]);
        }
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let content = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
        (status, vec![content.to_owned()])
    }

    /// Starts a floor on a free port; its chat URL once it accepts connections, its stop token
    /// and its task.
    async fn start(
        json: String,
        stream: String,
        nats: bool,
    ) -> (
        String,
        CancellationToken,
        tokio::task::JoinHandle<Result<(), String>>,
    ) {
        let listen = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let stop = CancellationToken::new();
        let args = FloorArgs {
            listen,
            upstream: json,
            stream_upstream: stream,
            nats,
        };
        #[expect(clippy::disallowed_methods, reason = "awaited by the test")]
        let floor = tokio::spawn(run(args, stop.clone()));
        // Up once it accepts a connection (a nats-server start can take a second).
        tokio::time::timeout(Duration::from_secs(20), async {
            while tokio::net::TcpStream::connect(listen).await.is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap();
        (format!("http://{listen}/v1/chat/completions"), stop, floor)
    }

    /// Stops a floor from [`start`] and waits (at most 20 s) for it to return `Ok`.
    async fn shut_down(
        stop: CancellationToken,
        floor: tokio::task::JoinHandle<Result<(), String>>,
    ) {
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(20), floor)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    /// Both floors (bare proxy, proxy + NATS hop) answer what the mock answers directly: the
    /// same content for JSON, the same number of SSE events ending in `[DONE]` for a stream; a
    /// failed upstream stream never ends as a clean answer.
    #[tokio::test]
    async fn both_floors_pass_the_mocks_answers_through() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mock = listener.local_addr().unwrap();
        #[expect(clippy::disallowed_methods, reason = "aborted at the end of the test")]
        let mock_task = tokio::spawn(switchyard_mock::serve(
            listener,
            switchyard_mock::MockState::new(),
        ));
        let json = format!("http://{mock}/v1/chat/completions");
        let stream = format!("http://{mock}/x/chunks=3,chunk_delay_ms=1/v1/chat/completions");
        let http = reqwest::Client::new();
        let direct_json = answer(&http, &json, false).await;
        let direct_stream = answer(&http, &stream, true).await;
        assert_eq!(direct_json.0, 200);
        assert!(!direct_json.1[0].is_empty());
        assert_eq!(direct_stream.0, 200);
        assert_eq!(direct_stream.1[1], "data: [DONE]");
        for nats in [false, true] {
            let (url, stop, floor) = start(json.clone(), stream.clone(), nats).await;
            assert_eq!(answer(&http, &url, false).await, direct_json, "{nats}");
            assert_eq!(answer(&http, &url, true).await, direct_stream, "{nats}");
            shut_down(stop, floor).await;
        }
        // A failed upstream stream is never a clean answer: 502 from the bare proxy, a broken
        // body over NATS (the head went out before the responder knew).
        let failing = format!("http://{mock}/x/status=503/v1/chat/completions");
        for nats in [false, true] {
            let (url, stop, floor) = start(json.clone(), failing.clone(), nats).await;
            let body = serde_json::json!({"model": "mock", "stream": true,
                "messages": [{"role": "user", "content": "floor"}]});
            let resp = http.post(&url).json(&body).send().await.unwrap();
            match nats {
                false => assert_eq!(resp.status().as_u16(), 502),
                true => assert!(resp.text().await.is_err(), "a clean end after a failure"),
            }
            shut_down(stop, floor).await;
        }
        mock_task.abort();
    }
}
