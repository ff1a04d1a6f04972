//! The admin server: `/metrics` (Prometheus), `/healthz`, `/readyz`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Whether each component is running, for `/readyz`.
#[derive(Default)]
pub struct Readiness {
    components: std::sync::Mutex<Vec<(String, Arc<AtomicBool>)>>,
}

impl Readiness {
    /// Registers a component (not yet running) and returns its flag.
    pub fn register(&self, what: String) -> Arc<AtomicBool> {
        let flag = Arc::new(AtomicBool::new(false));
        self.components.lock().unwrap().push((what, flag.clone()));
        flag
    }

    /// The components that are not running (empty when ready).
    pub fn not_ready(&self) -> Vec<String> {
        self.components
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, f)| !f.load(Ordering::Relaxed))
            .map(|(n, _)| n.clone())
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
            let mut r = text(StatusCode::OK, metrics.render());
            r.headers_mut().insert(
                "content-type",
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
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
