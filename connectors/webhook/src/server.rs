//! Listeners: one hyper server per `listen` address, shared by the webhook sources on it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::handler::{self, Route};
use crate::tls::{Reloading, TlsConfig};

/// Requests being handled on a listener, bounded: a counter, since nobody waits for room (a
/// request past the bound is shed at once).
pub(crate) struct InFlight {
    now: std::sync::atomic::AtomicUsize,
    max: usize,
}

impl InFlight {
    fn new(max: usize) -> Self {
        InFlight {
            now: std::sync::atomic::AtomicUsize::new(0),
            max,
        }
    }

    /// A place for one more request, held until the guard is dropped; `None` when full.
    pub fn try_enter(&self) -> Option<InFlightGuard<'_>> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        self.now
            .fetch_update(AcqRel, Acquire, |n| (n < self.max).then_some(n + 1))
            .ok()
            .map(|_| InFlightGuard(self))
    }
}

pub(crate) struct InFlightGuard<'a>(&'a InFlight);

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Options that belong to a listener, not a route.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ListenerSettings {
    pub tls: Option<TlsConfig>,
    pub header_timeout: Duration,
    pub max_connections: usize,
    pub max_in_flight: usize,
}

/// All listeners of one daemon (kept in the topology's shared resources).
#[derive(Default)]
pub(crate) struct Listeners {
    map: tokio::sync::Mutex<HashMap<SocketAddr, Arc<Listener>>>,
}

pub(crate) struct Listener {
    pub addr: SocketAddr,
    settings: ListenerSettings,
    routes: ArcSwap<Routes>,
    update: std::sync::Mutex<()>,
    pub in_flight: InFlight,
    done: CancellationToken,
    pub not_found: metrics::Counter,
}

impl Listeners {
    /// Adds `route` at `path` on the listener for `addr`, starting the listener if needed.
    pub async fn attach(
        &self,
        addr: SocketAddr,
        settings: ListenerSettings,
        path: String,
        route: Route,
        shutdown: CancellationToken,
    ) -> Result<Arc<Listener>, String> {
        let mut map = self.map.lock().await;
        if let Some(l) = map.get(&addr) {
            if l.settings != settings {
                return Err(format!(
                    "listen {addr} is shared with another webhook source whose tls, header_timeout, \
                     max_connections or max_in_flight differ; give them the same values or another address"
                ));
            }
            l.add_route(path, route)?;
            return Ok(l.clone());
        }
        let tcp = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e} (change `listen`)"))?;
        let bound = tcp.local_addr().unwrap_or(addr);
        let tls = match &settings.tls {
            Some(t) => Some(Reloading::start(
                t.clone(),
                Duration::from_secs(2),
                shutdown.clone(),
            )?),
            None => None,
        };
        let listener = Arc::new(Listener {
            addr: bound,
            in_flight: InFlight::new(settings.max_in_flight),
            settings,
            routes: ArcSwap::from_pointee(Routes::default()),
            update: std::sync::Mutex::new(()),
            done: CancellationToken::new(),
            not_found: metrics::counter!("sluice_webhook_not_found_total", "listen" => bound.to_string()),
        });
        listener.add_route(path, route)?;
        tracing::info!(listen = %bound, tls = tls.is_some(), "webhook: listening");
        tokio::spawn(serve(listener.clone(), tcp, tls, shutdown));
        map.insert(addr, listener.clone());
        Ok(listener)
    }
}

/// The routes of one listener by path. Most listeners serve a few paths, found by comparing
/// them (cheaper than hashing the path); many are hashed.
#[derive(Clone)]
struct Routes<T = Arc<Route>> {
    list: Vec<(String, T)>,
    /// Path → index in `list`, when there are more than [`Routes::SCAN`].
    index: Option<HashMap<String, usize>>,
}

impl<T> Default for Routes<T> {
    fn default() -> Self {
        Routes {
            list: Vec::new(),
            index: None,
        }
    }
}

impl<T> Routes<T> {
    const SCAN: usize = 8;

    fn get(&self, path: &str) -> Option<&T> {
        match &self.index {
            Some(index) => index.get(path).map(|&i| &self.list[i].1),
            None => self.list.iter().find(|(p, _)| p == path).map(|(_, r)| r),
        }
    }

    fn with(list: Vec<(String, T)>) -> Routes<T> {
        let index = (list.len() > Self::SCAN).then(|| {
            list.iter()
                .enumerate()
                .map(|(i, (p, _))| (p.clone(), i))
                .collect()
        });
        Routes { list, index }
    }
}

impl Listener {
    fn add_route(&self, path: String, route: Route) -> Result<(), String> {
        let _g = self.update.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.routes.load();
        if let Some(other) = current.get(&path) {
            return Err(format!(
                "path {path} on {} is already served by webhook source `{}`",
                self.addr,
                other.name()
            ));
        }
        let mut list = current.list.clone();
        list.push((path, Arc::new(route)));
        self.routes.store(Arc::new(Routes::with(list)));
        Ok(())
    }

    /// Removes the route at `path` (dropping its pipeline sender).
    pub fn detach(&self, path: &str) {
        let _g = self.update.lock().unwrap_or_else(|p| p.into_inner());
        let mut list = self.routes.load().list.clone();
        list.retain(|(p, _)| p != path);
        self.routes.store(Arc::new(Routes::with(list)));
    }

    pub fn route(&self, path: &str) -> Option<Arc<Route>> {
        self.routes.load().get(path).cloned()
    }

    /// Resolves once the listener stopped and every connection finished.
    pub async fn closed(&self) {
        self.done.cancelled().await
    }
}

async fn serve(
    listener: Arc<Listener>,
    tcp: TcpListener,
    tls: Option<Reloading>,
    shutdown: CancellationToken,
) {
    let connections = Arc::new(Semaphore::new(listener.settings.max_connections));
    let conns = Arc::new(Conns::new(&listener.addr.to_string()));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The header timeout is enforced by the listener's watchdog (`Conns::sweep`), not by hyper's
    // per-request timer (which boxes and registers a new timer for every request).
    // `header_timeout: 0s` turns it off (a trusted link, e.g. a sidecar on localhost).
    let header_timeout = Some(listener.settings.header_timeout).filter(|d| !d.is_zero());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256);
    let builder = Arc::new(builder);
    let handshake_timeout = header_timeout.unwrap_or(Duration::from_secs(10));
    let watchdog = CancellationToken::new();
    if let Some(timeout) = header_timeout {
        tokio::spawn(conns.clone().watchdog(timeout, watchdog.clone()));
    }
    loop {
        // Take a connection slot first: beyond the cap, clients wait in the kernel backlog.
        let permit = tokio::select! {
            p = connections.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = shutdown.cancelled() => break,
        };
        let (stream, peer) = tokio::select! {
            r = tcp.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(listen = %listener.addr, error = %e, "webhook: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        // Registered here, before the task runs, so a shutdown that starts now still sees it.
        let conn = conns.open();
        let (l, b) = (listener.clone(), builder.clone());
        let tls = tls.as_ref().map(|t| t.current.load_full());
        tokio::spawn(async move {
            let _permit = permit;
            let svc = |state: &Arc<ConnState>| {
                let (state, l) = (state.clone(), l.clone());
                // The handler's future is handed to hyper as it is: wrapping it in another
                // async block would copy the whole (large) future once more per request.
                service_fn(move |req| handler::handle(l.clone(), req, peer, state.busy()))
            };
            match tls {
                None => {
                    let c = b
                        .serve_connection(TokioIo::new(stream), svc(&conn.state))
                        .into_owned();
                    serve_watched(c, &conn.state, &conn.conns.timed_out).await;
                }
                Some(sc) => {
                    let acceptor = TlsAcceptor::from(sc);
                    // The handshake has its own timeout; the watchdog counts it as work, so the
                    // header budget starts after it.
                    let handshake = conn.state.busy();
                    let accepted =
                        tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await;
                    drop(handshake);
                    match accepted {
                        Ok(Ok(s)) => {
                            let c = b
                                .serve_connection(TokioIo::new(s), svc(&conn.state))
                                .into_owned();
                            serve_watched(c, &conn.state, &conn.conns.timed_out).await;
                        }
                        Ok(Err(e)) => tracing::debug!(error = %e, "webhook: TLS handshake failed"),
                        Err(_) => tracing::debug!("webhook: TLS handshake timed out"),
                    }
                }
            }
        });
    }
    // Stop accepting: close the socket, then let open requests finish (idle keep-alive
    // connections are closed at once).
    drop(tcp);
    conns.shutdown().await;
    watchdog.cancel();
    listener.done.cancel();
}

/// Set in [`ConnState::flags`] from outside the connection's task.
const GRACEFUL: u8 = 1;
const CLOSE: u8 = 2;
/// [`ConnState::work`]: requests being handled in the low 32 bits, and in the high 32 bits a
/// count that moves whenever a request starts or ends.
const STARTED: u64 = (1 << 32) + 1;
const ENDED: u64 = (1 << 32) - 1;
const ACTIVE: u64 = u32::MAX as u64;

/// What the outside knows of one connection, and how it reaches the connection's task.
pub(crate) struct ConnState {
    flags: AtomicU8,
    /// The connection task's waker, set at its first poll.
    waker: std::sync::Mutex<Option<std::task::Waker>>,
    work: AtomicU64,
}

impl ConnState {
    fn busy(self: &Arc<Self>) -> BusyGuard {
        self.work.fetch_add(STARTED, Ordering::Relaxed);
        BusyGuard(self.clone())
    }

    /// Whether the watchdog's close stands. A request may have started after the sweep found
    /// the connection idle (on another worker thread); requests start only inside the
    /// connection's poll, so what the connection's task reads here before polling is current.
    /// Then the close is withdrawn, and the next sweeps see the activity.
    fn take_close(&self) -> bool {
        if self.work.load(Ordering::Acquire) & ACTIVE == 0 {
            return true;
        }
        self.flags.fetch_and(!CLOSE, Ordering::AcqRel);
        false
    }

    fn signal(&self, flag: u8) {
        self.flags.fetch_or(flag, Ordering::Release);
        if let Some(w) = &*self.waker.lock().unwrap_or_else(|p| p.into_inner()) {
            w.wake_by_ref();
        }
    }
}

/// Marks its connection busy until dropped (when the request's handler finishes).
pub(crate) struct BusyGuard(Arc<ConnState>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.work.fetch_add(ENDED, Ordering::Relaxed);
    }
}

/// The open connections of one listener, for the two things that act on a connection from
/// outside its task: the header watchdog, which closes a connection that stayed idle for
/// `header_timeout`, and the graceful shutdown. A connection's task reads one flag per poll;
/// no timer and no shutdown future is polled with each request.
struct Conns {
    inner: std::sync::Mutex<ConnsInner>,
    empty: tokio::sync::Notify,
    /// `sluice_webhook_connections{listen}`: connections open now.
    open_now: metrics::Gauge,
    /// `sluice_webhook_header_timeouts_total{listen}`: connections the watchdog closed.
    timed_out: metrics::Counter,
}

#[derive(Default)]
struct ConnsInner {
    next: u64,
    open: HashMap<u64, Watched>,
}

/// The watchdog's view of a connection.
struct Watched {
    state: Arc<ConnState>,
    /// The high half of `work` at the last sweep.
    seen: u32,
    /// Sweeps in a row that found the connection idle and unchanged; -1 until the first sweep
    /// after it opened (which may come at once).
    idle: i32,
}

/// A connection's registration; it leaves the listener's list when dropped.
struct Conn {
    conns: Arc<Conns>,
    id: u64,
    state: Arc<ConnState>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.conns.open_now.decrement(1.0);
        let mut inner = self.conns.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.open.remove(&self.id);
        if inner.open.is_empty() {
            self.conns.empty.notify_waiters();
        }
    }
}

/// Sweeps per `header_timeout`: a connection is closed after between 1 and 1 + 1/SWEEPS
/// `header_timeout` of idleness.
const SWEEPS: u32 = 4;

impl Conns {
    fn new(listen: &str) -> Self {
        Conns {
            inner: Default::default(),
            empty: tokio::sync::Notify::new(),
            open_now: metrics::gauge!("sluice_webhook_connections", "listen" => listen.to_owned()),
            timed_out: metrics::counter!("sluice_webhook_header_timeouts_total", "listen" => listen.to_owned()),
        }
    }

    fn open(self: &Arc<Self>) -> Conn {
        self.open_now.increment(1.0);
        let state = Arc::new(ConnState {
            flags: AtomicU8::new(0),
            waker: std::sync::Mutex::new(None),
            work: AtomicU64::new(0),
        });
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let id = inner.next;
        inner.next += 1;
        inner.open.insert(
            id,
            Watched {
                state: state.clone(),
                seen: 0,
                idle: -1,
            },
        );
        Conn {
            conns: self.clone(),
            id,
            state,
        }
    }

    /// One sweep: closes the connections that had no request handled, started or ended over
    /// the last [`SWEEPS`] sweeps.
    fn sweep(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for w in inner.open.values_mut() {
            let work = w.state.work.load(Ordering::Relaxed);
            let changes = (work >> 32) as u32;
            if work & ACTIVE != 0 || changes != w.seen {
                w.seen = changes;
                w.idle = 0;
                continue;
            }
            if w.idle < SWEEPS as i32 {
                w.idle += 1;
                if w.idle == SWEEPS as i32 {
                    w.state.signal(CLOSE);
                }
            }
        }
    }

    async fn watchdog(self: Arc<Self>, timeout: Duration, stop: CancellationToken) {
        let every = (timeout / SWEEPS).max(Duration::from_millis(1));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.sweep(),
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Asks every open connection to finish what it is handling and close (an idle one closes
    /// at once), and waits until all have.
    async fn shutdown(&self) {
        loop {
            let empty = self.empty.notified();
            tokio::pin!(empty);
            empty.as_mut().enable();
            {
                let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                if inner.open.is_empty() {
                    return;
                }
                for w in inner.open.values() {
                    w.state.signal(GRACEFUL);
                }
            }
            empty.await;
        }
    }
}

/// Serves `conn` until it ends, asks it to finish gracefully when the listener shuts down, or
/// drops it when the watchdog says so. One flag is read per poll.
async fn serve_watched<C: GracefulConnection>(
    conn: C,
    state: &ConnState,
    timed_out: &metrics::Counter,
) {
    tokio::pin!(conn);
    let mut registered: Option<std::task::Waker> = None;
    let mut graceful = false;
    std::future::poll_fn(|cx| {
        // The waker the signals wake: set again only if the task's waker changed (a spawned
        // task's never does). Set before the flags are read, so no signal is missed.
        if !registered.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *state.waker.lock().unwrap_or_else(|p| p.into_inner()) = Some(cx.waker().clone());
            registered = Some(cx.waker().clone());
        }
        let flags = state.flags.load(Ordering::Acquire);
        if flags != 0 {
            if flags & CLOSE != 0 && state.take_close() {
                tracing::debug!(
                    "webhook: no request headers within header_timeout; closing the connection"
                );
                timed_out.increment(1);
                return std::task::Poll::Ready(());
            }
            if flags & GRACEFUL != 0 && !graceful {
                graceful = true;
                conn.as_mut().graceful_shutdown();
            }
        }
        conn.as_mut().poll(cx).map(|_| ())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::Routes;

    #[test]
    fn routes_are_found_by_path_whether_scanned_or_hashed() {
        for n in [1, 3, Routes::<usize>::SCAN, Routes::<usize>::SCAN + 5] {
            let list: Vec<(String, usize)> = (0..n).map(|i| (format!("/p{i}"), i)).collect();
            let routes = Routes::with(list);
            assert_eq!(routes.index.is_some(), n > Routes::<usize>::SCAN);
            for i in 0..n {
                assert_eq!(routes.get(&format!("/p{i}")), Some(&i), "{n} routes");
            }
            assert_eq!(routes.get("/p"), None);
            assert_eq!(routes.get(&format!("/p{n}")), None);
        }
    }

    /// The watchdog's sweeps: a connection is closed only after SWEEPS full sweep intervals
    /// with no request handled, started or ended, and never while one is being handled.
    #[test]
    fn the_watchdog_closes_only_what_stayed_idle_for_the_whole_timeout() {
        use super::{Conns, CLOSE, SWEEPS};
        use std::sync::atomic::Ordering;
        let conns = std::sync::Arc::new(Conns::new("test"));
        let closed = |c: &super::Conn| c.state.flags.load(Ordering::Acquire) & CLOSE != 0;
        let quiet = conns.open();
        let busy = conns.open();
        let guard = busy.state.busy();
        // The first sweep may come right after the connection opened: it does not count.
        for _ in 0..SWEEPS {
            conns.sweep();
            assert!(!closed(&quiet), "closed before header_timeout");
        }
        conns.sweep();
        assert!(closed(&quiet), "idle for the whole header_timeout");
        // A request being handled keeps its connection open however long it takes; its end
        // starts a new idle period.
        for _ in 0..3 * SWEEPS {
            conns.sweep();
        }
        assert!(!closed(&busy));
        drop(guard);
        for _ in 0..SWEEPS {
            conns.sweep();
            assert!(
                !closed(&busy),
                "closed less than header_timeout after the answer"
            );
        }
        conns.sweep();
        assert!(closed(&busy));
        // A request that started and ended between two sweeps also counts as activity.
        let short = conns.open();
        for _ in 0..SWEEPS {
            conns.sweep();
        }
        drop(short.state.busy());
        for _ in 0..SWEEPS {
            conns.sweep();
            assert!(!closed(&short));
        }
        conns.sweep();
        assert!(closed(&short));
        // A close that finds a request started since the sweep is withdrawn.
        let late = conns.open();
        for _ in 0..=SWEEPS {
            conns.sweep();
        }
        assert!(closed(&late));
        let guard = late.state.busy();
        assert!(!late.state.take_close(), "a request is being handled");
        assert!(!closed(&late), "the close is withdrawn");
        drop(guard);
        for _ in 0..=SWEEPS {
            conns.sweep();
        }
        assert!(closed(&late) && late.state.take_close());
        drop((quiet, busy, short, late));
        assert!(
            conns.inner.lock().unwrap().open.is_empty(),
            "closed connections leave the list"
        );
    }

    #[test]
    fn in_flight_is_bounded_and_given_back() {
        let f = super::InFlight::new(2);
        let a = f.try_enter().unwrap();
        let _b = f.try_enter().unwrap();
        assert!(f.try_enter().is_none(), "full");
        drop(a);
        assert!(f.try_enter().is_some(), "a place was given back");
    }
}
