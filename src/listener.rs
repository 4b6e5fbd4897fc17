//! The HTTP listener: an accept loop over hyper's HTTP/1.1 connections that
//! bounds what a client can hold without sending requests.
//!
//! - A request head must arrive whole within the header read timeout, counted
//!   from the accept for a connection's first request and from the first byte
//!   of each later one.
//! - Its body must then arrive whole within the request body timeout
//!   ([`crate::body_deadline`]), else it is answered 408 and the connection,
//!   its body unread, closed.
//! - A keep-alive connection with no request in flight is closed after the idle
//!   timeout.
//! - At most `max_connections` connections are open at once. One over the cap is
//!   accepted and closed at once (the client reads EOF), never left waiting in
//!   the listen backlog. The cap counts every connection, `/healthz` probes
//!   included: while it is full a probe is refused like any other client. Clients
//!   that hold a connection without sending requests lose it within the
//!   timeouts above, so a full cap of slow or idle clients drains by itself.
//! - The soft open-file limit is raised to the hard limit at start, and the cap is
//!   lowered to leave [`RESERVED_FDS`] descriptors free when the limit is too low
//!   for it, so accepting (and closing) never fails for lack of descriptors.
//!
//! hyper's own `header_read_timeout` is not used: it restarts as soon as a
//! keep-alive connection waits for its next request, so it cannot tell an idle
//! connection from a slow head, and the two limits differ.
//!
//! Graceful shutdown is hyper-util's: the listener closes, idle connections are
//! closed, and each busy one finishes its in-flight request (a partly received
//! head still gets at most the header read timeout).
//!
//! A response given before its request's body was read (413 for a body over
//! the limit, 408, any refusal that never needed the body) closes the
//! connection, and closing a socket with unread bytes makes the kernel reset
//! it: a client still writing the body got a broken pipe or a reset instead
//! of the answer. Such a connection lingers: it stops writing and reads and
//! drops what the client still sends, for at most [`LINGER_TIME`] and
//! [`LINGER_BYTES`], before it closes (as nginx's `lingering_close`). It
//! keeps its place under the connection cap while it lingers.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::{Bytes, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::body_deadline::DeadlineBody;
use crate::config::Settings;
use crate::poll_again::PollAgain;

/// Descriptors kept free beyond the connection cap: the database and its WAL,
/// log files, outgoing callback and MCP connections, the listener itself.
pub const RESERVED_FDS: u64 = 256;

/// How long a failing `accept` (out of descriptors or memory) waits before the next try.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Longest a connection closed with its request body unread keeps reading
/// (and dropping) what its client still sends, so that the client can read
/// the answer instead of a reset.
const LINGER_TIME: Duration = Duration::from_secs(5);
/// Most bytes such a connection reads before it closes anyway.
const LINGER_BYTES: usize = 64 * 1024 * 1024;

/// What one connection may hold.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub request_body_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl ConnectionLimits {
    /// The configured limits, the cap lowered to fit `open_files` (the soft
    /// open-file limit in force, when known).
    pub fn new(settings: &Settings, open_files: Option<u64>) -> Self {
        let configured = settings.max_connections.min(Semaphore::MAX_PERMITS);
        let mut max_connections = configured;
        if let Some(limit) = open_files {
            let room = usize::try_from(limit.saturating_sub(RESERVED_FDS))
                .unwrap_or(usize::MAX)
                .max(1);
            if room < configured {
                tracing::warn!(
                    configured,
                    lowered_to = room,
                    open_file_limit = limit,
                    reserved = RESERVED_FDS,
                    "the connection cap does not fit the open-file limit; lowering it"
                );
                max_connections = room;
            }
        }
        Self {
            header_read_timeout: Duration::from_millis(settings.header_read_timeout_ms),
            request_body_timeout: Duration::from_millis(settings.request_body_timeout_ms),
            idle_timeout: Duration::from_millis(settings.idle_timeout_ms),
            max_connections,
        }
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit and returns the soft limit
/// now in force (None where it cannot be read).
pub fn raise_open_file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let (before, hard) = match rlimit::getrlimit(rlimit::Resource::NOFILE) {
            Ok(limits) => limits,
            Err(err) => {
                tracing::warn!(%err, "cannot read the open-file limit (RLIMIT_NOFILE)");
                return None;
            }
        };
        match rlimit::increase_nofile_limit(u64::MAX) {
            Ok(after) => {
                tracing::info!(
                    before,
                    after,
                    hard,
                    "soft open-file limit (RLIMIT_NOFILE) set to its hard limit"
                );
                Some(after)
            }
            Err(err) => {
                tracing::warn!(%err, before, hard, "cannot raise the open-file limit (RLIMIT_NOFILE)");
                Some(before)
            }
        }
    }
    #[cfg(not(unix))]
    None
}

/// Serves `router` on `listener` until `shutdown` resolves, then stops
/// accepting and waits for the open connections to finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut refused = RefusedLog::default();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                accept_failed(err).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            refused.note(limits.max_connections);
            continue;
        };
        tokio::spawn(serve_connection(
            stream,
            peer,
            router.clone(),
            limits,
            graceful.watcher(),
            slot,
        ));
    }
    drop(listener);
    tracing::debug!(
        connections = graceful.count(),
        "listener closed; waiting for open connections"
    );
    graceful.shutdown().await;
}

async fn accept_failed(err: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset, Interrupted};
    // The peer gave up before its connection was accepted: nothing to do.
    if matches!(
        err.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset | Interrupted
    ) {
        return;
    }
    tracing::warn!(%err, "accepting a connection failed; retrying shortly");
    tokio::time::sleep(ACCEPT_RETRY).await;
}

/// Logs refusals over the cap at most once a second, with how many there were.
#[derive(Default)]
struct RefusedLog {
    since_last: u64,
    last: Option<Instant>,
}

impl RefusedLog {
    fn note(&mut self, max_connections: usize) {
        self.since_last += 1;
        let now = Instant::now();
        if self
            .last
            .is_none_or(|last| now - last >= Duration::from_secs(1))
        {
            tracing::warn!(
                refused = self.since_last,
                max_connections,
                "connection cap reached; new connections are closed at once"
            );
            self.since_last = 0;
            self.last = Some(now);
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    limits: ConnectionLimits,
    watcher: Watcher,
    slot: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(TrackedStream {
        inner: Some(stream),
        activity: activity.clone(),
        slot: Some(slot),
    });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            // What `into_make_service_with_connect_info` gives handlers: the
            // /api/tools loopback check reads it.
            request.extensions_mut().insert(ConnectInfo(peer));
            let request_guard = activity.request_started();
            let activity_of_body = activity.clone();
            let router = router.clone();
            async move {
                let body_limit = limits.request_body_timeout;
                let request = request.map(|body| {
                    let body = DeadlineBody::new(body, body_limit);
                    Body::new(UnreadMark::new(body, activity_of_body))
                });
                let response = router.oneshot(request).await?;
                Ok::<_, Infallible>(response.map(|body| TrackedBody {
                    inner: body,
                    _request: request_guard,
                }))
            }
        })
    };
    let connection = http1::Builder::new()
        .header_read_timeout(None)
        .serve_connection(io, service);
    let mut connection = std::pin::pin!(PollAgain::new(watcher.watch(connection)));
    let mut timer = std::pin::pin!(tokio::time::sleep_until(Instant::now()));
    let mut armed_for: Option<Instant> = None;
    // The phase changes only inside the connection's own poll (its reads, its
    // requests' start and end), so reading it after each poll is enough. A
    // wake-up of this task per change (a `Notify`) made every request poll the
    // task twice and wake an idle worker thread to steal it (BENCHMARKS.md,
    // issue 20, eighth pass).
    std::future::poll_fn(|cx| {
        if let Poll::Ready(result) = connection.as_mut().poll(cx) {
            if let Err(err) = result {
                tracing::debug!(%peer, %err, "connection ended with an error");
            }
            return Poll::Ready(());
        }
        let Some((at, reason)) = activity.deadline(&limits) else {
            return Poll::Pending;
        };
        if armed_for != Some(at) {
            timer.as_mut().reset(at);
            armed_for = Some(at);
        }
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        // No request is in flight in either state, so dropping the
        // connection loses nothing, and it has no body left to linger over.
        activity.body_left_unread.store(false, Ordering::Relaxed);
        tracing::debug!(%peer, reason, "closing connection");
        Poll::Ready(())
    })
    .await;
}

/// Where a connection stands, for its timeouts.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for a request head to arrive whole, since `since`.
    Head { since: Instant },
    /// Requests are being handled (their responses included).
    Busy { requests: usize },
    /// Nothing in flight and no byte of the next request yet, since `since`.
    Idle { since: Instant },
}

struct Activity {
    phase: Mutex<Phase>,
    /// A request's body was dropped before its end: the connection closes
    /// with bytes of it unread, and lingers.
    body_left_unread: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Self {
            phase: Mutex::new(Phase::Head {
                since: Instant::now(),
            }),
            body_left_unread: AtomicBool::new(false),
        }
    }

    fn with_phase<T>(&self, f: impl FnOnce(&mut Phase) -> T) -> T {
        let mut phase = self.phase.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut phase)
    }

    /// Bytes arrived: on an idle connection they start the next request head.
    fn bytes_read(&self) {
        self.with_phase(|phase| {
            if let Phase::Idle { .. } = phase {
                *phase = Phase::Head {
                    since: Instant::now(),
                };
            }
        });
    }

    /// A request head arrived whole; the guard ends the request when its
    /// response has been sent (or abandoned).
    fn request_started(self: &Arc<Self>) -> RequestGuard {
        // hyper read past the last request's body (it drained what was
        // left), or this head could not have been read.
        self.body_left_unread.store(false, Ordering::Relaxed);
        self.with_phase(|phase| {
            *phase = match *phase {
                Phase::Busy { requests } => Phase::Busy {
                    requests: requests + 1,
                },
                _ => Phase::Busy { requests: 1 },
            }
        });
        RequestGuard(self.clone())
    }

    fn request_finished(&self) {
        self.with_phase(|phase| {
            if let Phase::Busy { requests } = *phase {
                *phase = if requests > 1 {
                    Phase::Busy {
                        requests: requests - 1,
                    }
                } else {
                    Phase::Idle {
                        since: Instant::now(),
                    }
                };
            }
        });
    }

    /// When the connection is to be closed, and why; None while busy.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<(Instant, &'static str)> {
        match self.with_phase(|phase| *phase) {
            Phase::Head { since } => Some((
                since + limits.header_read_timeout,
                "request head not received within the header read timeout",
            )),
            Phase::Idle { since } => Some((
                since + limits.idle_timeout,
                "keep-alive connection idle past the idle timeout",
            )),
            Phase::Busy { .. } => None,
        }
    }
}

/// One request in flight on a connection, until dropped.
struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

/// A response body that keeps its request in flight until hyper is done with it.
struct TrackedBody {
    inner: Body,
    _request: RequestGuard,
}

impl hyper::body::Body for TrackedBody {
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

/// A request body that tells its connection's [`Activity`] when it is
/// dropped before its end.
struct UnreadMark {
    inner: DeadlineBody,
    activity: Arc<Activity>,
    ended: bool,
}

impl UnreadMark {
    fn new(inner: DeadlineBody, activity: Arc<Activity>) -> Self {
        Self {
            inner,
            activity,
            ended: false,
        }
    }
}

impl hyper::body::Body for UnreadMark {
    type Data = Bytes;
    type Error = <DeadlineBody as hyper::body::Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            self.ended = true;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UnreadMark {
    fn drop(&mut self) {
        use hyper::body::Body as _;
        if !self.ended && !self.inner.is_end_stream() {
            self.activity
                .body_left_unread
                .store(true, Ordering::Relaxed);
        }
    }
}

/// The TCP stream, telling its connection's [`Activity`] when bytes arrive.
/// It holds the connection's place under the cap, and takes both to
/// [`linger`] when it is dropped with a request body unread.
struct TrackedStream {
    /// Always Some until dropped.
    inner: Option<TcpStream>,
    activity: Arc<Activity>,
    slot: Option<OwnedSemaphorePermit>,
}

impl TrackedStream {
    fn stream(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        self.inner
            .as_mut()
            .map(Pin::new)
            .ok_or_else(|| io::ErrorKind::NotConnected.into())
    }
}

impl Drop for TrackedStream {
    fn drop(&mut self) {
        if !self.activity.body_left_unread.load(Ordering::Relaxed) {
            return;
        }
        if let (Some(stream), Ok(runtime)) =
            (self.inner.take(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(linger(stream, self.slot.take()));
        }
    }
}

/// Stops writing, then reads and drops what the client still sends until it
/// closes its side, [`LINGER_TIME`] passes or [`LINGER_BYTES`] arrived.
async fn linger(mut stream: TcpStream, _slot: Option<OwnedSemaphorePermit>) {
    let _ = stream.shutdown().await;
    let until = Instant::now() + LINGER_TIME;
    let mut buffer = vec![0; 64 * 1024];
    let mut dropped = 0;
    while dropped < LINGER_BYTES {
        match tokio::time::timeout_at(until, stream.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) | Err(_) => break,
            Ok(Ok(read)) => dropped += read,
        }
    }
}

impl AsyncRead for TrackedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = match self.stream() {
            Ok(stream) => stream.poll_read(cx, buf),
            Err(err) => return Poll::Ready(Err(err)),
        };
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        result
    }
}

impl AsyncWrite for TrackedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.stream() {
            Ok(stream) => stream.poll_write(cx, buf),
            Err(err) => Poll::Ready(Err(err)),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.stream() {
            Ok(stream) => stream.poll_write_vectored(cx, bufs),
            Err(err) => Poll::Ready(Err(err)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(AsyncWrite::is_write_vectored)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.stream() {
            Ok(stream) => stream.poll_flush(cx),
            Err(err) => Poll::Ready(Err(err)),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.stream() {
            Ok(stream) => stream.poll_shutdown(cx),
            Err(err) => Poll::Ready(Err(err)),
        }
    }
}
