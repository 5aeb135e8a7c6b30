//! `switchyard bench`: the latency Switchyard adds, measured in one run on this machine.
//!
//! Starts a private nats-server, the mock upstream, one worker and ingress in this process, then
//! sends the same small chat request `--requests` times directly to the mock and through the
//! gateway (alternating, so machine noise hits both alike), at `--concurrency`. Reports p50/p90/p99
//! of each path (HdrHistogram, µs precision) and the difference: the added latency of ingress +
//! two NATS hops + worker. Streaming mode measures time to first content byte (TTFT) instead of the
//! whole response.

use hdrhistogram::Histogram;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_schemas::config::{ConfigHandle, GatewayConfig};
use switchyard_schemas::subjects::Subjects;
use tokio_util::sync::CancellationToken;

/// Options of one run.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Requests per path.
    #[arg(long, default_value_t = 2000)]
    pub requests: u64,
    /// Requests in flight at once per path.
    #[arg(long, default_value_t = 1)]
    pub concurrency: u64,
    /// Measure time to first content byte of a streamed answer instead of the full response.
    #[arg(long)]
    pub stream: bool,
    /// Warm-up requests per path, not measured.
    #[arg(long, default_value_t = 200)]
    pub warmup: u64,
}

fn bench_config() -> Result<GatewayConfig, String> {
    let c: GatewayConfig = serde_json::from_value(serde_json::json!({
        "targets": [{"id": "mock", "provider": "openai", "base_url": "builtin:mock", "upstream_model": "mock",
                      "breaker": {"enabled": false}, "retry": {"max_attempts": 1}}],
        "models": [{"id": "demo/mock", "targets": ["mock"]}]
    }))
    .map_err(|e| e.to_string())?;
    c.validate().map_err(|e| e.to_string())?;
    Ok(c)
}

/// Runs the benchmark and prints the report.
pub async fn run(args: BenchArgs) -> Result<(), String> {
    let nats_server = switchyard_natsd::NatsServer::start_temp().map_err(|e| e.to_string())?;
    let mock = switchyard_workers::mock_upstream::MockUpstream::start_with_state(
        switchyard_workers::mock_upstream::MockState::with_record_limit(1),
    )
    .await
    .map_err(|e| e.to_string())?;
    let handle = ConfigHandle::new(bench_config()?);
    let subjects = Subjects::new("sy");
    let stop = CancellationToken::new();
    let nats = async_nats::connect(nats_server.url())
        .await
        .map_err(|e| e.to_string())?;
    let js = async_nats::jetstream::new(nats.clone());
    switchyard_billing::ensure_usage_stream(&js, &subjects)
        .await
        .map_err(|e| e.to_string())?;
    let wnats = async_nats::connect(nats_server.url())
        .await
        .map_err(|e| e.to_string())?;
    let worker = switchyard_workers::worker::Worker::subscribe(
        wnats,
        switchyard_workers::worker::WorkerOptions {
            worker_id: "bench-worker".into(),
            subjects: subjects.clone(),
            config: handle.clone(),
            providers: Vec::new(),
            builtin_mock_url: Some(format!("{}/v1", mock.base_url())),
            builtin_local_model_url: None,
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    tokio::spawn(worker.serve(stop.clone()));
    let state = switchyard_ingress::state(nats, handle, "bench-ingress")
        .await
        .map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let gateway = format!(
        "http://{}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    tokio::spawn(switchyard_ingress::serve(
        listener,
        state,
        stop.clone().cancelled_owned(),
    ));

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| e.to_string())?;
    let direct = Target {
        url: format!("{}/v1/chat/completions", mock.base_url()),
        model: "mock",
    };
    let via = Target {
        url: format!("{gateway}/v1/chat/completions"),
        model: "demo/mock",
    };
    let text = "#mock text=pong";
    eprintln!(
        "switchyard bench: {} requests per path, concurrency {}, {} ...",
        args.requests,
        args.concurrency,
        if args.stream {
            "TTFT of streamed answers"
        } else {
            "full non-streamed responses"
        }
    );
    for _ in 0..args.warmup {
        one(&http, &direct, text, args.stream).await?;
        one(&http, &via, text, args.stream).await?;
    }
    let direct_h = Arc::new(parking(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?,
    ));
    let via_h = Arc::new(parking(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?,
    ));
    let per_task = args.requests.div_ceil(args.concurrency.max(1));
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (http, direct, via) = (http.clone(), direct.clone(), via.clone());
        let (dh, vh) = (direct_h.clone(), via_h.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..per_task {
                let d = one(&http, &direct, text, args.stream).await?;
                let v = one(&http, &via, text, args.stream).await?;
                dh.lock()
                    .record(d.as_micros().max(1) as u64)
                    .map_err(|e| e.to_string())?;
                vh.lock()
                    .record(v.as_micros().max(1) as u64)
                    .map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    stop.cancel();
    let (d, v) = (direct_h.lock().clone(), via_h.lock().clone());
    let ms = |us: u64| us as f64 / 1000.0;
    println!("path              p50 ms   p90 ms   p99 ms   max ms   n");
    for (name, h) in [("direct to mock", &d), ("via switchyard", &v)] {
        println!(
            "{name:<16} {:>7.3}  {:>7.3}  {:>7.3}  {:>7.3}   {}",
            ms(h.value_at_quantile(0.5)),
            ms(h.value_at_quantile(0.9)),
            ms(h.value_at_quantile(0.99)),
            ms(h.max()),
            h.len()
        );
    }
    println!(
        "added latency: p50 {:.3} ms, p99 {:.3} ms",
        ms(v.value_at_quantile(0.5)).max(0.0) - ms(d.value_at_quantile(0.5)),
        ms(v.value_at_quantile(0.99)) - ms(d.value_at_quantile(0.99))
    );
    Ok(())
}

fn parking<T>(v: T) -> parking_lot::Mutex<T> {
    parking_lot::Mutex::new(v)
}

#[derive(Clone)]
struct Target {
    url: String,
    model: &'static str,
}

/// One request; returns the time to the full body (or to the first content byte when streaming).
async fn one(
    http: &reqwest::Client,
    t: &Target,
    text: &str,
    stream: bool,
) -> Result<Duration, String> {
    let body = serde_json::json!({"model": t.model, "stream": stream, "messages": [{"role": "user", "content": text}]});
    let start = Instant::now();
    let mut resp = http
        .post(&t.url)
        .json(&body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("{} answered {}", t.url, resp.status()));
    }
    if stream {
        // The first chunk carrying content ("pong").
        let mut seen = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
            seen.extend_from_slice(&chunk);
            if seen.windows(4).any(|w| w == b"pong") {
                let at = start.elapsed();
                while resp.chunk().await.map_err(|e| e.to_string())?.is_some() {}
                return Ok(at);
            }
        }
        return Err("stream ended without content".into());
    }
    resp.bytes().await.map_err(|e| e.to_string())?;
    Ok(start.elapsed())
}
