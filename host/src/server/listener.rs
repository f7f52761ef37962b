//! The accept loop: client connections with bounded waits, a cap below the file limit, and a
//! shutdown that drains for `server.shutdown_grace_seconds` and then ends what is left.
//!
//! axum::serve has none of these knobs, so connections are driven here: HTTP/1 by the connection's
//! own task (`server/http1.rs`), HTTP/2 (prior knowledge) by hyper's HTTP/2 connection; the
//! service is the server's `Edge` (the axum `Router`, with inference
//! requests taken to their handler directly).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

use super::http1::ClientDeadlines;
use crate::config::EdgeConfig;

/// File descriptors kept back from the connection cap: upstream sockets beyond one per client
/// (pools, health checks), the database, strategy files, logs.
const RESERVED_FDS: u64 = 128;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the limit now in force. A
/// gateway holds two sockets per proxied request (client and upstream); the common soft default
/// of 1,024 is reached by a few hundred idle clients.
pub fn raise_file_limit() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let soft = limit.current.unwrap_or(u64::MAX);
    match limit.maximum {
        Some(hard) if hard > soft => {
            let raised = Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => hard,
                Err(e) => {
                    tracing::warn!("raising the file limit from {soft} to {hard} failed: {e}");
                    soft
                }
            }
        }
        _ => soft,
    }
}

/// The connection cap: `server.max_connections` when set, else half of what the file limit
/// leaves after [`RESERVED_FDS`] (each client may hold an upstream socket too), at least 16.
pub fn connection_cap(configured: Option<usize>, file_limit: u64) -> usize {
    configured.unwrap_or_else(|| {
        let derived = file_limit.saturating_sub(RESERVED_FDS) / 2;
        usize::try_from(derived).unwrap_or(usize::MAX).max(16)
    })
}

/// Where the process is in its life: serving, draining after SIGTERM, or past the drain deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Serving,
    Draining,
    Closing,
}

/// The shutdown state every request can see: `/health` answers 503 while draining, and streams
/// still running at the deadline end with an error event.
#[derive(Debug)]
pub struct Drain {
    phase: watch::Sender<Phase>,
}

impl Default for Drain {
    fn default() -> Self {
        Self {
            phase: watch::Sender::new(Phase::Serving),
        }
    }
}

impl Drain {
    /// True from SIGTERM on: load balancers should stop sending.
    pub fn is_draining(&self) -> bool {
        *self.phase.borrow() >= Phase::Draining
    }

    /// True once the drain deadline has passed: what is still running is being ended.
    pub fn is_closing(&self) -> bool {
        *self.phase.borrow() >= Phase::Closing
    }

    /// Completes when the drain deadline has passed (never, if it does not come).
    pub fn closing(&self) -> impl Future<Output = ()> + Send + 'static {
        self.reached(Phase::Closing)
    }

    /// Completes when draining has begun (at once if it has), never if it does not.
    pub fn draining(&self) -> impl Future<Output = ()> + Send + 'static {
        self.reached(Phase::Draining)
    }

    fn reached(&self, phase: Phase) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.phase.subscribe();
        async move {
            let reached = rx.wait_for(|p| *p >= phase).await.is_ok();
            if !reached {
                // The gateway is gone: nothing will drain.
                std::future::pending::<()>().await;
            }
        }
    }

    fn advance(&self, phase: Phase) {
        self.phase.send_if_modified(|p| {
            let later = phase > *p;
            if later {
                *p = phase;
            }
            later
        });
    }
}

/// Counts open connections and wakes whoever waits for them all to close.
#[derive(Default)]
struct OpenConnections {
    count: AtomicUsize,
    closed: Notify,
}

impl OpenConnections {
    /// Takes a slot if fewer than `cap` are open.
    fn try_open(self: &Arc<Self>, cap: usize) -> Option<ConnectionSlot> {
        self.count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()
            .map(|_| ConnectionSlot(self.clone()))
    }

    async fn all_closed(&self) {
        loop {
            let notified = self.closed.notified();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One open connection; frees its slot when dropped.
struct ConnectionSlot(Arc<OpenConnections>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.closed.notify_waiters();
        }
    }
}

/// What a connection over the cap is told before it is closed.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\nretry-after: 1\r\ncontent-type: application/json\r\ncontent-length: 87\r\n\r\n{\"error\":{\"message\":\"too many connections\",\"type\":\"service_unavailable\",\"code\":\"busy\"}}";

/// What every accept loop of one listening address shares: the HTTP/2 connection builder, the open
/// connections (one cap across all loops) and the drain.
#[derive(Clone)]
struct Serving {
    http2: Arc<http2::Builder<TokioExecutor>>,
    open: Arc<OpenConnections>,
    drain: Arc<Drain>,
    max_connections: usize,
    deadlines: ClientDeadlines,
    shutdown_grace: Duration,
}

impl Serving {
    fn new(edge: &EdgeConfig, max_connections: usize, drain: Arc<Drain>) -> Self {
        // HTTP/2 has no header timeout in hyper; pings find peers that went away.
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(Duration::from_secs(30)))
            .keep_alive_timeout(Duration::from_secs(20));
        Self {
            http2: Arc::new(http2),
            open: Arc::default(),
            drain,
            max_connections,
            deadlines: ClientDeadlines {
                header_read: edge.header_read_timeout,
                client_write: edge.client_write_timeout,
            },
            shutdown_grace: edge.shutdown_grace,
        }
    }

    /// Waits for `shutdown`, then starts the drain every accept loop watches.
    async fn drain_after(&self, shutdown: impl Future<Output = ()>) {
        shutdown.await;
        tracing::info!(
            grace_seconds = self.shutdown_grace.as_secs_f64(),
            "shutting down: draining in-flight requests"
        );
        self.drain.advance(Phase::Draining);
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then drains: `/health` answers 503,
/// idle connections close, in-flight requests may run for `shutdown_grace`; then the streams still
/// open end with an error event (see [`Drain::closing`]) and this returns.
pub async fn serve(
    listener: TcpListener,
    app: super::Edge,
    edge: &EdgeConfig,
    max_connections: usize,
    drain: Arc<Drain>,
    shutdown: impl Future<Output = ()>,
) {
    let serving = Serving::new(edge, max_connections, drain);
    let accepting = pin!(accept_loop(listener, app, serving.clone()));
    let draining = pin!(serving.drain_after(shutdown));
    // The loop ends only after the drain began, so the signal side is done by then.
    futures::future::select(accepting, draining)
        .await
        .factor_first()
        .1
        .await;
}

/// Serves `app` with one single-threaded runtime per listener, each on its own thread, until
/// `shutdown` completes, then drains like [`serve`]. The listeners share one address
/// (`SO_REUSEPORT`, see [`bind_shared`]): the kernel spreads new connections over them, and a
/// connection's requests, the strategy calls they make and their upstream sockets then stay on one
/// thread, with no work stealing or wake-ups across threads for a request's few microseconds of
/// work.
pub async fn serve_per_core(
    listeners: Vec<std::net::TcpListener>,
    app: super::Edge,
    edge: &EdgeConfig,
    max_connections: usize,
    drain: Arc<Drain>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let serving = Serving::new(edge, max_connections, drain);
    let mut finished = Vec::with_capacity(listeners.len());
    for (n, listener) in listeners.into_iter().enumerate() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (done, finished_rx) = tokio::sync::oneshot::channel::<()>();
        let app = app.clone();
        let serving = serving.clone();
        std::thread::Builder::new()
            .name(format!("switchyard-serve-{n}"))
            .spawn(move || {
                runtime.block_on(async move {
                    match TcpListener::from_std(listener) {
                        Ok(listener) => accept_loop(listener, app, serving).await,
                        Err(e) => tracing::error!("serving thread {n} cannot listen: {e}"),
                    }
                });
                // Tasks still running here (a connection past the drain's end) are dropped
                // with the runtime, as the process exits anyway.
                drop(runtime);
                let _ = done.send(());
            })?;
        finished.push(finished_rx);
    }
    let mut all_finished = pin!(futures::future::join_all(finished));
    tokio::select! {
        _ = &mut all_finished => return Ok(()),
        () = serving.drain_after(shutdown) => {}
    }
    all_finished.await;
    Ok(())
}

/// How soon a serving runtime's driver is always due to wake, at the latest.
const DRIVER_HEARTBEAT: Duration = Duration::from_secs(1);

/// Keeps a timer pending on a serving runtime (one per accept loop: per core, or the shared
/// runtime's one). tokio wakes its driver (an `eventfd` write, from the
/// driver's own thread) whenever a timer is set to fire before the driver's next wake; with no
/// timer pending at its last park, that was every request at low load (hyper arms a connection's
/// header-read timer each time it waits for the next request). A timer always due within a second
/// keeps every longer deadline from doing so, for one wake-up a second.
///
/// The same wake-up gives the memory freed by the last burst back to the OS once the runtime has
/// gone quiet ([`IdleCollector`]).
async fn driver_heartbeat() {
    let mut heartbeat = tokio::time::interval(DRIVER_HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut idle = IdleCollector::default();
    loop {
        heartbeat.tick().await;
        if idle.quiet_since_last_beat(&tokio::runtime::Handle::current().metrics()) {
            switchyard_allocator::return_freed_memory();
        }
    }
}

/// The most a runtime's workers may have been busy over one heartbeat for it to count as quiet.
const QUIET_BUSY_PER_BEAT: Duration = Duration::from_millis(2);

/// Decides when a serving runtime's freed memory goes back to the OS: once per quiet spell, at
/// the first heartbeat after a busy one that finds its workers (nearly) idle since the last.
///
/// mimalloc returns freed memory only when it next runs after a delay, so a gateway that went
/// quiet after a burst (or after startup) kept what the burst freed for as long as it stayed
/// quiet: 7 MiB of the release build's idle RSS after startup (10 on the dev build). Returning
/// it during the load would hand the next request's allocations page faults, so it waits for a
/// quiet heartbeat, and a spell that stays quiet is collected once.
///
/// Its default counts the first beat as after a busy spell: the serving thread just started.
#[derive(Debug, Default)]
struct IdleCollector {
    busy_before: Duration,
    collected: bool,
}

/// The runtime's workers' busy time in total so far.
fn total_busy(metrics: &tokio::runtime::RuntimeMetrics) -> Duration {
    (0..metrics.num_workers())
        .map(|w| metrics.worker_total_busy_duration(w))
        .sum()
}

impl IdleCollector {
    fn quiet_since_last_beat(&mut self, metrics: &tokio::runtime::RuntimeMetrics) -> bool {
        self.observe(total_busy(metrics))
    }

    /// `busy`: the workers' busy time in total so far.
    fn observe(&mut self, busy: Duration) -> bool {
        let quiet = busy.saturating_sub(self.busy_before) <= QUIET_BUSY_PER_BEAT;
        self.busy_before = busy;
        if !quiet {
            self.collected = false;
            return false;
        }
        !std::mem::replace(&mut self.collected, true)
    }
}

/// `count` listening sockets bound to `addr` with `SO_REUSEPORT`, so each serving thread accepts on
/// its own socket and the kernel balances connections between them. Port 0 picks one free port for
/// all of them.
pub fn bind_shared(addr: SocketAddr, count: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    use socket2::{Domain, Protocol, Socket, Type};
    let mut listeners = Vec::with_capacity(count.max(1));
    let mut addr = addr;
    for _ in 0..count.max(1) {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        let listener: std::net::TcpListener = socket.into();
        // The first socket decided the port when 0 was asked for; the others join it.
        addr = listener.local_addr()?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// Accepts on `listener` until, after draining began, every connection of the address has closed
/// (or the grace is over).
async fn accept_loop(listener: TcpListener, app: super::Edge, serving: Serving) {
    let Serving {
        http2,
        open,
        drain,
        max_connections,
        deadlines,
        shutdown_grace,
    } = serving;
    // The heartbeat stops with the accept loop that started it.
    let _heartbeat = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(driver_heartbeat()));
    let mut drained = pin!(drained(open.clone(), drain.clone(), shutdown_grace));
    let mut accept_errors = AcceptErrors::default();
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    accept_errors.note(&e).await;
                    continue;
                }
            },
            () = &mut drained => break,
        };
        let Some(slot) = open.try_open(max_connections) else {
            refuse(tcp);
            continue;
        };
        // Without TCP_NODELAY, the second small write of an SSE stream waits for the client's
        // delayed ACK (~40 ms on Linux): streams crawled at ~700/s while the CPU idled.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
        let http2 = http2.clone();
        let app = app.clone();
        let drain = drain.clone();
        tokio::spawn(async move {
            let _slot = slot;
            serve_connection(&http2, tcp, peer, app, drain, deadlines).await;
        });
    }
}

/// Completes when, after draining began, every connection has closed, or the grace has passed
/// and the streams still open were told to end (with a little time to send their last event).
async fn drained(open: Arc<OpenConnections>, drain: Arc<Drain>, grace: Duration) {
    drain.reached(Phase::Draining).await;
    if tokio::time::timeout(grace, open.all_closed()).await.is_ok() {
        return;
    }
    tracing::warn!(
        open = open.count.load(Ordering::Acquire),
        "shutdown grace of {:.1} s is over: ending the requests still in flight",
        grace.as_secs_f64()
    );
    drain.advance(Phase::Closing);
    let _ = tokio::time::timeout(Duration::from_secs(5), open.all_closed()).await;
}

async fn serve_connection(
    http2: &http2::Builder<TokioExecutor>,
    tcp: TcpStream,
    peer: SocketAddr,
    app: super::Edge,
    drain: Arc<Drain>,
    deadlines: ClientDeadlines,
) {
    // The first head must come within the header timeout of the connection's start.
    let deadline = tokio::time::Instant::now() + deadlines.header_read;
    // A connection open when draining begins stops taking requests after its current one. One
    // accepted later is served once: its HTTP/1 answer carries `connection: close` (hyper would
    // drop an HTTP/2 one before reading its request, so it is not told).
    let drained_already = drain.is_draining();
    match opening(&tcp, deadline).await {
        Opening::Nothing => {}
        Opening::Http1 => {
            super::http1::serve(tcp, peer, &app, &drain, deadline, deadlines).await;
        }
        Opening::Http2 if drained_already => {
            serve_http2(http2, tcp, peer, app, std::future::pending()).await;
        }
        Opening::Http2 => serve_http2(http2, tcp, peer, app, drain.draining()).await,
    }
}

/// Serves an HTTP/2 connection with hyper until it closes, or until `draining` completes and
/// its streams have finished.
async fn serve_http2(
    http2: &http2::Builder<TokioExecutor>,
    tcp: TcpStream,
    peer: SocketAddr,
    app: super::Edge,
    draining: impl Future<Output = ()>,
) {
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        let answer = app.answer(request.map(Body::new));
        async move { Ok::<_, Infallible>(answer.await) }
    });
    let mut connection = pin!(http2.serve_connection(TokioIo::new(tcp), service));
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(%peer, "connection ended: {e}");
            }
            return;
        }
        () = draining => connection.as_mut().graceful_shutdown(),
    }
    if let Err(e) = connection.await {
        tracing::debug!(%peer, "connection ended: {e}");
    }
}

/// How a client opened its connection.
#[derive(Debug, PartialEq, Eq)]
enum Opening {
    /// Anything but HTTP/2's preface: served as HTTP/1 (which answers what does not parse).
    Http1,
    /// HTTP/2's preface, with prior knowledge.
    Http2,
    /// Nothing by the deadline, or it closed.
    Nothing,
}

/// Waits until the client has sent enough to tell HTTP/1 from HTTP/2 (its first byte, or the
/// HTTP/2 preface), until `deadline` at the latest.
async fn opening(tcp: &TcpStream, deadline: tokio::time::Instant) -> Opening {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut buf = [0u8; PREFACE.len()];
    loop {
        match tokio::time::timeout_at(deadline, tcp.peek(&mut buf)).await {
            Err(_) | Ok(Err(_)) | Ok(Ok(0)) => return Opening::Nothing,
            Ok(Ok(n)) => {
                if buf[..n] != PREFACE[..n] {
                    return Opening::Http1;
                }
                if n == PREFACE.len() {
                    return Opening::Http2;
                }
            }
        }
        // Part of the preface (or of `PRI`): peek would return the same bytes at once.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Answers a connection over the cap with a 503 and closes it, without waiting on the client.
fn refuse(tcp: TcpStream) {
    crate::telemetry::metrics::connection_refused();
    let _ = tcp.try_write(REFUSAL);
}

/// Accept failures (out of file descriptors, mostly): logged at most once a second, with a short
/// pause so the loop does not spin while nothing can be accepted.
#[derive(Default)]
struct AcceptErrors {
    last_logged: Option<Instant>,
    since_logged: u64,
}

impl AcceptErrors {
    async fn note(&mut self, e: &std::io::Error) {
        self.since_logged += 1;
        if self
            .last_logged
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            tracing::warn!(
                failures = self.since_logged,
                "accepting a connection failed: {e}"
            );
            self.last_logged = Some(Instant::now());
            self.since_logged = 0;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_memory_is_returned_once_per_quiet_spell() {
        let ms = Duration::from_millis;
        let mut idle = IdleCollector::default();
        // Quiet from the start: collected at the first beat, not again while it stays quiet.
        assert!(idle.observe(ms(1)));
        assert!(!idle.observe(ms(2)));
        assert!(!idle.observe(ms(2)));
        // Under load nothing is collected; the first quiet beat after it collects.
        assert!(!idle.observe(ms(400)));
        assert!(!idle.observe(ms(900)));
        assert!(idle.observe(ms(901)));
        assert!(!idle.observe(ms(902)));
        // A beat busy just above the threshold counts as load.
        assert!(!idle.observe(ms(902) + QUIET_BUSY_PER_BEAT + ms(1)));
        assert!(idle.observe(ms(906)));
    }

    /// The collector reads busy time from the runtime's metrics; on a serving thread's
    /// current-thread runtime they must count a task's work, or no spell would ever end.
    #[test]
    fn a_current_thread_runtime_counts_its_busy_time() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        let metrics = runtime.handle().metrics();
        let before = total_busy(&metrics);
        runtime.block_on(async {
            tokio::spawn(async {
                let start = std::time::Instant::now();
                while start.elapsed() < Duration::from_millis(30) {
                    std::hint::spin_loop();
                }
            })
            .await
            .unwrap_or_else(|e| panic!("task: {e}"));
            // Metrics are published when the scheduler parks.
            tokio::time::sleep(Duration::from_millis(5)).await;
        });
        let after = total_busy(&metrics);
        assert!(
            after.saturating_sub(before) > QUIET_BUSY_PER_BEAT,
            "busy {before:?} -> {after:?}"
        );
    }

    #[test]
    fn the_derived_cap_leaves_room_for_upstream_sockets() {
        assert_eq!(connection_cap(None, 1024), 448);
        assert_eq!(connection_cap(None, 256), 64);
        assert_eq!(connection_cap(None, 100), 16);
        assert_eq!(connection_cap(Some(10), 1024), 10);
    }

    #[test]
    fn the_refusal_is_a_complete_http_response() {
        let text = std::str::from_utf8(REFUSAL).unwrap_or_default();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or_default();
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        assert!(
            serde_json::from_str::<serde_json::Value>(body).is_ok(),
            "{body}"
        );
    }
}
