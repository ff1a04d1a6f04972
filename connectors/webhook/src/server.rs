//! Listeners: one hyper server per `listen` address, shared by the webhook sources on it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
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
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The header timeout is enforced per connection by `serve_watched`, not by hyper's per-request
    // timer (which boxes and registers a new timer for every request).
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
        let watcher = graceful.watcher();
        let (l, b) = (listener.clone(), builder.clone());
        let tls = tls.as_ref().map(|t| t.current.load_full());
        tokio::spawn(async move {
            let _permit = permit;
            let svc = |idle: &Arc<Idle>| {
                let idle = idle.clone();
                let (idle, l) = (idle.clone(), l.clone());
                // The handler's future is handed to hyper as it is: wrapping it in another
                // async block would copy the whole (large) future once more per request.
                service_fn(move |req| handler::handle(l.clone(), req, peer, idle.busy()))
            };
            match tls {
                None => {
                    let idle = Arc::new(Idle::new());
                    let conn = b
                        .serve_connection(TokioIo::new(stream), svc(&idle))
                        .into_owned();
                    serve_watched(watcher.watch(conn), &idle, header_timeout).await;
                }
                Some(sc) => {
                    let acceptor = TlsAcceptor::from(sc);
                    match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => {
                            // The header budget starts after the handshake, which had its own.
                            let idle = Arc::new(Idle::new());
                            let conn = b.serve_connection(TokioIo::new(s), svc(&idle)).into_owned();
                            serve_watched(watcher.watch(conn), &idle, header_timeout).await;
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
    graceful.shutdown().await;
    listener.done.cancel();
}

/// When a connection last became idle (no request being handled), and how many requests it is
/// handling now.
struct Idle {
    base: tokio::time::Instant,
    since_ms: std::sync::atomic::AtomicU64,
    active: std::sync::atomic::AtomicUsize,
}

impl Idle {
    fn new() -> Self {
        Idle {
            base: tokio::time::Instant::now(),
            since_ms: std::sync::atomic::AtomicU64::new(0),
            active: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn busy(self: &Arc<Self>) -> BusyGuard {
        self.active
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        BusyGuard(self.clone())
    }

    fn idle_since(&self) -> tokio::time::Instant {
        self.base + Duration::from_millis(self.since_ms.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// Marks its connection busy until dropped (when the request's handler finishes).
pub(crate) struct BusyGuard(Arc<Idle>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let idle = &self.0;
        let ms = idle.base.elapsed().as_millis() as u64;
        idle.since_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
        idle.active
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Serves `conn`, closing it when it has been idle — connected or past its last response, with
/// no request handled — for `timeout`: a client must send its request headers within that time.
/// One timer per connection, re-armed only when it fires, instead of one per request.
async fn serve_watched<F: std::future::Future>(conn: F, idle: &Idle, timeout: Option<Duration>) {
    let Some(timeout) = timeout else {
        conn.await;
        return;
    };
    tokio::pin!(conn);
    let sleep = tokio::time::sleep_until(idle.base + timeout);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut conn => return,
            _ = &mut sleep => {
                let now = tokio::time::Instant::now();
                if idle.active.load(std::sync::atomic::Ordering::Acquire) > 0 {
                    // A request is being handled: its body has its own timeout.
                    sleep.as_mut().reset(now + timeout);
                    continue;
                }
                let deadline = idle.idle_since() + timeout;
                if now >= deadline {
                    tracing::debug!("webhook: no request headers within header_timeout; closing the connection");
                    return;
                }
                sleep.as_mut().reset(deadline);
            }
        }
    }
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
