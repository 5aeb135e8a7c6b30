//! The HTTP/1.1 server under the router: hyper's connection driver with the limits of the
//! config's `server:` section ([`ServerConfig`]) and a graceful drain.
//!
//! - **Head**: hyper's `header_read_timeout` closes a connection whose request head does not
//!   arrive in time; hyper also runs it while a keep-alive connection waits for its next request.
//! - **Body**: [`DeadlineBody`] fails a body that is not complete `body_read_timeout_ms` after
//!   the head; the client gets 408 and the connection is closed.
//! - **Idle**: a connection with no request in flight for `idle_timeout_ms` is shut down.
//! - **Write stall**: [`StallGuard`] fails the socket when a write makes no progress for
//!   `write_stall_ms`, so a client that stopped reading cannot hold a stream.
//! - **Connections**: beyond `max_connections` a connection is answered 503 with `Retry-After`
//!   and closed (at most [`MAX_REJECTING`] such answers at once; more are closed at once).
//!   Accept errors (EMFILE, …) back off from 10 ms to 1 s instead of spinning.
//! - **Requests**: beyond `max_in_flight` a request gets 503 `server_overloaded` at once.
//! - **Drain**: on shutdown the listener is closed, idle connections close, busy ones finish
//!   their response and close; after `drain_timeout_ms` the rest are cut.

use crate::error::ApiError;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use switchyard_schemas::config::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

/// File descriptors kept free of client connections (NATS, the spool, the ledger, upstream
/// calls of an in-process worker, over-limit answers).
pub const FD_RESERVE: u64 = 1_024;
/// Over-limit connections answered 503 at the same time; beyond, they are closed at once.
pub const MAX_REJECTING: usize = 256;
/// How long an over-limit connection may take to send its request head (and the whole answer).
const REJECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Shortest and longest pause after a failed `accept` (EMFILE, ENFILE, ENOMEM, …).
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The server limits as durations; built from [`ServerConfig`].
#[derive(Debug, Clone)]
pub struct Limits {
    /// Request head deadline (also bounds keep-alive idle time, see the module docs).
    pub header_read: Duration,
    /// Whole request body deadline, from the head.
    pub body_read: Duration,
    /// Keep-alive idle time with no request in flight.
    pub idle: Duration,
    /// Longest time a socket write may make no progress.
    pub write_stall: Duration,
    /// Open connections served (before the file-descriptor clamp of [`run`]).
    pub max_connections: usize,
    /// Requests in flight.
    pub max_in_flight: usize,
    /// Drain deadline on shutdown.
    pub drain: Duration,
}

impl From<&ServerConfig> for Limits {
    fn from(c: &ServerConfig) -> Self {
        let ms = Duration::from_millis;
        Self {
            header_read: ms(c.header_read_timeout_ms.max(1)),
            body_read: ms(c.body_read_timeout_ms.max(1)),
            idle: ms(c.idle_timeout_ms.max(1)),
            write_stall: ms(c.write_stall_ms.max(1)),
            max_connections: c.max_connections.max(1),
            max_in_flight: c.max_in_flight.max(1),
            drain: ms(c.drain_timeout_ms),
        }
    }
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit and returns the new soft limit
/// (`None` where it cannot be read or raised, logged). Call once at start.
pub fn raise_fd_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => {
            tracing::debug!(nofile = n, "file descriptor limit raised to the hard limit");
            Some(n)
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not raise the file descriptor limit");
            None
        }
    }
}

/// `configured`, lowered to the soft file-descriptor limit minus [`FD_RESERVE`] (so accepting
/// connections alone never exhausts descriptors), with a warning when lowered.
pub fn effective_max_connections(configured: usize) -> usize {
    let Ok((soft, _)) = rlimit::getrlimit(rlimit::Resource::NOFILE) else {
        return configured;
    };
    let room = soft.saturating_sub(FD_RESERVE).max(1);
    if configured as u64 > room {
        tracing::warn!(
            configured,
            nofile = soft,
            using = room,
            "server.max_connections exceeds the file descriptor limit; lowered"
        );
        return room as usize;
    }
    configured
}

/// Everything a connection task shares.
struct Shared {
    router: Router,
    limits: Limits,
    in_flight: Arc<Semaphore>,
    builder: http1::Builder,
    /// Graceful drain: connections finish their current response and close.
    drain: CancellationToken,
    /// Drain deadline passed: connections close at once.
    force: CancellationToken,
}

/// Serves `router` on `listener` until `shutdown` completes, then drains: stops accepting,
/// lets in-flight responses finish for up to `limits.drain`, closes what is left, and returns
/// once every connection is closed.
pub async fn run(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let max_connections = effective_max_connections(limits.max_connections);
    let connections = Arc::new(Semaphore::new(max_connections));
    let rejecting = Arc::new(Semaphore::new(MAX_REJECTING));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .keep_alive(true);
    let mut reject_builder = builder.clone();
    reject_builder
        .keep_alive(false)
        .header_read_timeout(limits.header_read.min(REJECT_TIMEOUT));
    let shared = Arc::new(Shared {
        router,
        in_flight: Arc::new(Semaphore::new(limits.max_in_flight)),
        limits,
        builder,
        drain: CancellationToken::new(),
        force: CancellationToken::new(),
    });
    tracing::info!(
        max_connections,
        max_in_flight = shared.limits.max_in_flight,
        header_read_ms = shared.limits.header_read.as_millis() as u64,
        "HTTP server limits"
    );
    let tracker = TaskTracker::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut backoff = ACCEPT_BACKOFF_MIN;
    let mut accept_errors = 0u64;
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown.as_mut() => break,
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                if accept_errors > 0 {
                    tracing::info!(failed = accept_errors, "accepting connections again");
                    accept_errors = 0;
                }
                backoff = ACCEPT_BACKOFF_MIN;
                stream
            }
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // EMFILE and friends: retrying at once would spin; the pending connection
                // stays in the backlog until descriptors free up.
                if accept_errors == 0 {
                    tracing::warn!(error = %e, "accept failed; backing off");
                }
                accept_errors += 1;
                tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match connections.clone().try_acquire_owned() {
            Ok(permit) => {
                tracker.spawn(serve_connection(stream, shared.clone(), permit));
            }
            Err(_) => match rejecting.clone().try_acquire_owned() {
                Ok(permit) => {
                    tracker.spawn(reject_connection(
                        stream,
                        reject_builder.clone(),
                        max_connections,
                        permit,
                    ));
                }
                // Dropping the stream closes it: the client sees a reset, never a hung accept.
                Err(_) => drop(stream),
            },
        }
    }
    drop(listener);
    tracker.close();
    tracing::info!(
        connections = tracker.len(),
        in_flight = shared.limits.max_in_flight - shared.in_flight.available_permits(),
        drain_ms = shared.limits.drain.as_millis() as u64,
        "stopped accepting; draining"
    );
    shared.drain.cancel();
    if tokio::time::timeout(shared.limits.drain, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            connections = tracker.len(),
            "drain deadline passed; closing the remaining connections"
        );
        shared.force.cancel();
        tracker.wait().await;
    }
    tracing::info!("HTTP server drained");
}

/// Errors of one pending connection (the next accept may succeed at once).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Accept-queue length asked of the kernel (capped by `net.core.somaxconn`, 4096 on current
/// Linux). tokio's default of 1,024 overflows when thousands of clients connect at once on a
/// busy machine, and an overflowed handshake can end in a reset instead of a slow accept.
pub const LISTEN_BACKLOG: u32 = 65_535;

/// Binds `addr` (`host:port`) with [`LISTEN_BACKLOG`] and `SO_REUSEADDR`.
pub async fn bind(addr: &str) -> io::Result<TcpListener> {
    let mut last = io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("no address for {addr}"),
    );
    for a in tokio::net::lookup_host(addr).await? {
        let socket = if a.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(a).and_then(|()| socket.listen(LISTEN_BACKLOG)) {
            Ok(l) => return Ok(l),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Serves one connection until it closes, the idle timeout, or the drain.
async fn serve_connection(stream: TcpStream, shared: Arc<Shared>, _permit: OwnedSemaphorePermit) {
    // The peer address, for the audit log's client IP (`ConnectInfo` in each request).
    let peer = stream.peer_addr().ok();
    let io = TokioIo::new(StallGuard::new(stream, shared.limits.write_stall));
    // Requests of this connection whose response body is still alive.
    let (active_tx, mut active_rx) = watch::channel(0usize);
    let active = Arc::new(active_tx);
    let service = {
        let shared = shared.clone();
        hyper::service::service_fn(move |mut req: Request<Incoming>| {
            if let Some(addr) = peer {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(addr));
            }
            handle(shared.clone(), active.clone(), req)
        })
    };
    let conn = shared.builder.serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    // The first request is bounded by the header timeout; idle counts after a response.
    let mut idle_at: Option<Instant> = None;
    let mut closing = false;
    loop {
        let idle_deadline = if closing { None } else { idle_at };
        let idle = async move {
            match idle_deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = shared.force.cancelled() => return,
            _ = shared.drain.cancelled(), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            changed = active_rx.changed() => {
                if changed.is_err() {
                    return;
                }
                let busy = *active_rx.borrow_and_update() > 0;
                idle_at = (!busy).then(|| Instant::now() + shared.limits.idle);
            }
            _ = idle => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// One request: the in-flight cap, the body deadline, then the router.
async fn handle(
    shared: Arc<Shared>,
    active: Arc<watch::Sender<usize>>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let counted = !matches!(req.uri().path(), "/healthz" | "/readyz" | "/metrics");
    let permit = if counted {
        match shared.in_flight.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                let anthropic = req.uri().path() == "/v1/messages";
                return Ok(overloaded(shared.limits.max_in_flight, anthropic));
            }
        }
    } else {
        None
    };
    let guard = RequestGuard::new(active, permit);
    let timed_out = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + shared.limits.body_read;
    let req = req.map(|b| Body::new(DeadlineBody::new(b, deadline, timed_out.clone())));
    let resp = match shared.router.clone().oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let resp = if timed_out.load(Ordering::Relaxed) {
        body_timeout(shared.limits.body_read)
    } else {
        resp
    };
    Ok(resp.map(|b| {
        Body::new(Guarded {
            inner: b,
            _guard: guard,
        })
    }))
}

/// 503 `server_overloaded` with `Retry-After: 1`, in the front door's error shape.
fn overloaded(limit: usize, anthropic: bool) -> Response<Body> {
    let e = ApiError::unavailable(
        "server_overloaded",
        format!("Switchyard is serving its limit of {limit} requests at once; retry shortly."),
    );
    if anthropic {
        e.into_anthropic_response()
    } else {
        axum::response::IntoResponse::into_response(e)
    }
}

/// 408 for a body that did not arrive in time; the connection is closed after it.
fn body_timeout(limit: Duration) -> Response<Body> {
    let e = ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "invalid_request_error",
        "request_timeout",
        format!(
            "The request body did not arrive within {} ms.",
            limit.as_millis()
        ),
    );
    let mut resp = axum::response::IntoResponse::into_response(e);
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// Answers an over-limit connection with one 503 and closes it.
async fn reject_connection(
    stream: TcpStream,
    builder: http1::Builder,
    limit: usize,
    _permit: OwnedSemaphorePermit,
) {
    let service = hyper::service::service_fn(move |_req: Request<Incoming>| async move {
        let e = ApiError::unavailable(
            "server_overloaded",
            format!("Switchyard has its limit of {limit} connections open; retry shortly."),
        );
        Ok::<_, Infallible>(axum::response::IntoResponse::into_response(e))
    });
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(REJECT_TIMEOUT, conn).await;
}

/// Holds a request's in-flight permit and marks its connection busy until the response body
/// is dropped (a stream counts until its last byte).
struct RequestGuard {
    active: Arc<watch::Sender<usize>>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl RequestGuard {
    fn new(active: Arc<watch::Sender<usize>>, permit: Option<OwnedSemaphorePermit>) -> Self {
        active.send_modify(|n| *n += 1);
        Self {
            active,
            _permit: permit,
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.active.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A response body that keeps its [`RequestGuard`] alive.
struct Guarded {
    inner: Body,
    _guard: RequestGuard,
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that fails once `deadline` passes before its end (the timer is only created
/// when the body is not already buffered, so small bodies cost no timer).
struct DeadlineBody<B> {
    inner: B,
    deadline: Instant,
    timer: Option<Pin<Box<Sleep>>>,
    timed_out: Arc<AtomicBool>,
}

impl<B> DeadlineBody<B> {
    fn new(inner: B, deadline: Instant, timed_out: Arc<AtomicBool>) -> Self {
        Self {
            inner,
            deadline,
            timer: None,
            timed_out,
        }
    }
}

impl<B> HttpBody for DeadlineBody<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|r| r.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.as_mut().poll(cx).is_ready() {
            this.timed_out.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err("request body read timed out".into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Wraps a socket so that a write making no progress for `limit` fails with `TimedOut`
/// (hyper then closes the connection). Progress on any write, flush or shutdown resets it.
pub struct StallGuard<S> {
    io: S,
    limit: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    stalled: bool,
}

impl<S> StallGuard<S> {
    /// Guards `io` with a stall limit of `limit`.
    pub fn new(io: S, limit: Duration) -> Self {
        Self {
            io,
            limit,
            timer: None,
            stalled: false,
        }
    }

    fn check<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.stalled = false;
            return r;
        }
        if !self.stalled {
            self.stalled = true;
            let deadline = Instant::now() + self.limit;
            match &mut self.timer {
                Some(t) => t.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        if let Some(t) = &mut self.timer
            && t.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "client stopped reading (write stalled)",
            )));
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StallGuard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StallGuard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.check(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.check(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.check(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.check(cx, r)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    #![allow(clippy::disallowed_methods, reason = "tasks end with their test")]
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    #[tokio::test(start_paused = true)]
    async fn stalled_writes_fail_after_the_limit() {
        // A duplex pipe with a 16-byte buffer nobody reads: the second write blocks.
        let (a, _b) = tokio::io::duplex(16);
        let mut guarded = StallGuard::new(a, Duration::from_millis(500));
        guarded.write_all(&[0; 16]).await.unwrap();
        let started = Instant::now();
        let e = guarded.write_all(&[0; 16]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn progress_resets_the_stall_timer() {
        let (a, mut b) = tokio::io::duplex(16);
        let mut guarded = StallGuard::new(a, Duration::from_millis(500));
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                tokio::io::AsyncReadExt::read_exact(&mut b, &mut buf)
                    .await
                    .unwrap();
            }
        });
        // Each write waits 300 ms for the reader: slow, but never 500 ms without progress.
        for _ in 0..5 {
            guarded.write_all(&[1; 16]).await.unwrap();
        }
        reader.await.unwrap();
    }
}
