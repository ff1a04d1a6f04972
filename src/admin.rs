//! The admin server: `/metrics` (Prometheus), `/healthz`, `/readyz`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// One component's state, shared by its supervisor and the admin server.
#[derive(Default)]
pub struct Component {
    up: AtomicBool,
    /// What the running component reports wrong with itself (a missing permission).
    health: sluice_core::Health,
    /// When it stopped outside shutdown, and why (None while running or never started).
    stopped: std::sync::Mutex<Option<(Instant, String)>>,
}

impl Component {
    /// The handle the component's context carries.
    pub fn health(&self) -> sluice_core::Health {
        self.health.clone()
    }

    pub fn running(&self) {
        self.up.store(true, Ordering::Relaxed);
    }

    /// Marks it stopped; `why` is the error (or "stopped") shown by `/healthz` and `/readyz`.
    pub fn stopped(&self, why: String) {
        self.up.store(false, Ordering::Relaxed);
        *self.stopped.lock().unwrap() = Some((Instant::now(), why));
    }
}

/// Whether each component is running (`/readyz`) and whether the process is still worth
/// keeping (`/healthz`).
///
/// Liveness: a source or sink is never restarted inside the process, so one that stopped
/// outside shutdown leaves the daemon running without it. Once such a component has been down
/// for `liveness_grace`, `/healthz` answers 503 so a supervisor restarts the process; while
/// draining (after SIGTERM) it stays 200, or the kubelet would kill a drain in progress.
pub struct Readiness {
    components: std::sync::Mutex<Vec<(String, Arc<Component>)>>,
    draining: AtomicBool,
    liveness_grace: Duration,
}

impl Readiness {
    pub fn new(liveness_grace: Duration) -> Self {
        Readiness {
            components: Default::default(),
            draining: AtomicBool::new(false),
            liveness_grace,
        }
    }

    /// Registers a component (not yet running) and returns its state.
    pub fn register(&self, what: String) -> Arc<Component> {
        let c = Arc::new(Component::default());
        self.components.lock().unwrap().push((what, c.clone()));
        c
    }

    /// From now on components stop on purpose: they no longer count against liveness.
    pub fn draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// The components that are not running, or that run with a problem they reported (with
    /// its text); empty when ready.
    pub fn not_ready(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (n, c) in self.components.lock().unwrap().iter() {
            if !c.up.load(Ordering::Relaxed) {
                out.push(n.clone());
                continue;
            }
            let problems = c.health.problems();
            if !problems.is_empty() {
                out.push(format!("{n} ({})", problems.join("; ")));
            }
        }
        out
    }

    /// The components that stopped outside shutdown at least `liveness_grace` ago, with the
    /// reason (empty while the process is healthy).
    pub fn dead(&self) -> Vec<String> {
        if self.draining.load(Ordering::Relaxed) {
            return Vec::new();
        }
        self.components
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(n, c)| {
                let stopped = c.stopped.lock().unwrap();
                let (at, why) = stopped.as_ref()?;
                let down = at.elapsed();
                (down >= self.liveness_grace)
                    .then(|| format!("{n} stopped {}s ago: {why}", down.as_secs()))
            })
            .collect()
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(body.into()))
        .expect("static response parts are valid")
}

async fn handle(
    req: Request<Incoming>,
    metrics: PrometheusHandle,
    ready: Arc<Readiness>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n"));
    }
    Ok(match req.uri().path() {
        "/metrics" => {
            let mut body = metrics.render();
            body.push_str(&sluice_core::telemetry::render_latency());
            let mut r = text(StatusCode::OK, body);
            r.headers_mut().insert(
                "content-type",
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        "/healthz" => {
            let dead = ready.dead();
            if dead.is_empty() {
                text(StatusCode::OK, "ok\n")
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("unhealthy (restart the process): {}\n", dead.join("; ")),
                )
            }
        }
        "/readyz" => {
            let down = ready.not_ready();
            if down.is_empty() {
                text(StatusCode::OK, "ready\n")
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {}\n", down.join(", ")),
                )
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n",
        ),
    })
}

/// Binds the admin server; the returned future serves until `shutdown`.
pub async fn bind(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    ready: Arc<Readiness>,
    shutdown: CancellationToken,
) -> Result<impl std::future::Future<Output = ()>, String> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("admin server: cannot listen on {addr}: {e} (change admin.listen)"))?;
    Ok(async move {
        loop {
            let (stream, _) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "admin server: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = shutdown.cancelled() => return,
            };
            let (metrics, ready) = (metrics.clone(), ready.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(req, metrics.clone(), ready.clone()));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_component_stopped_outside_shutdown_fails_liveness_after_the_grace() {
        let r = Readiness::new(Duration::from_millis(50));
        let sink = r.register("sink out".into());
        let source = r.register("source hooks".into());
        assert_eq!(r.not_ready(), ["sink out", "source hooks"]);
        assert!(r.dead().is_empty(), "never started is not dead");
        sink.running();
        source.running();
        assert!(r.not_ready().is_empty());
        sink.stopped("connection refused".into());
        assert_eq!(r.not_ready(), ["sink out"]);
        // A running component that reports a problem is not ready, with its text, until the
        // problem is cleared.
        let health = r.register("sink k8s".into());
        health.running();
        health.health().problem(
            "rbac",
            "missing permission: create argoproj.io/workflows in argo",
        );
        assert_eq!(
            r.not_ready(),
            [
                "sink out",
                "sink k8s (missing permission: create argoproj.io/workflows in argo)"
            ]
        );
        health.health().clear("rbac");
        assert_eq!(r.not_ready(), ["sink out"]);
        assert!(
            r.dead().is_empty(),
            "within the grace the process is still live"
        );
        std::thread::sleep(Duration::from_millis(60));
        let dead = r.dead();
        assert_eq!(dead.len(), 1, "{dead:?}");
        assert!(
            dead[0].starts_with("sink out stopped ") && dead[0].ends_with(": connection refused"),
            "{dead:?}"
        );
        r.draining();
        assert!(r.dead().is_empty(), "a drain is never reported as dead");
    }
}
