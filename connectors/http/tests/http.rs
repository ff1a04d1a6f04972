//! The HTTP sink against a real local HTTP server (hyper, plain and TLS with client
//! certificates) that answers as each test scripts it.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_core::testkit::{self, SinkRig};
use sluice_core::{Event, SinkConfig, Status};
use sluice_http::HttpSinkConfig;
use tokio::net::TcpListener;

/// What the server saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    headers: HeaderMap,
    body: Bytes,
    at: Instant,
}

type Script =
    Arc<dyn Fn(usize) -> (StatusCode, Vec<(&'static str, String)>, Duration) + Send + Sync>;

#[derive(Clone)]
struct Server {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    concurrent: Arc<AtomicUsize>,
    max_concurrent: Arc<AtomicUsize>,
}

impl Server {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// Starts a server; `script(n)` (n = 0-based request number) gives the status, extra headers
/// and a delay before answering.
async fn serve(script: Script, tls: Option<tokio_rustls::TlsAcceptor>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let host = if tls.is_some() {
        "localhost"
    } else {
        "127.0.0.1"
    };
    let server = Server {
        url: format!("{scheme}://{host}:{}/hook?token=secret", addr.port()),
        seen: Arc::default(),
        concurrent: Arc::default(),
        max_concurrent: Arc::default(),
    };
    let s = server.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (s, script, tls) = (s.clone(), script.clone(), tls.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                    let (s, script) = (s.clone(), script.clone());
                    async move {
                        let now = s.concurrent.fetch_add(1, Ordering::SeqCst) + 1;
                        s.max_concurrent.fetch_max(now, Ordering::SeqCst);
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.unwrap().to_bytes();
                        let n = {
                            let mut seen = s.seen.lock().unwrap();
                            seen.push(Seen {
                                headers: parts.headers,
                                body,
                                at: Instant::now(),
                            });
                            seen.len() - 1
                        };
                        let (status, headers, delay) = script(n);
                        tokio::time::sleep(delay).await;
                        s.concurrent.fetch_sub(1, Ordering::SeqCst);
                        let mut resp = Response::new(Full::new(Bytes::from(format!("answer {n}"))));
                        *resp.status_mut() = status;
                        for (k, v) in headers {
                            resp.headers_mut().insert(k, v.parse().unwrap());
                        }
                        Ok::<_, Infallible>(resp)
                    }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                match tls {
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(tcp).await {
                            let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                        }
                    }
                    None => {
                        let _ = builder.serve_connection(TokioIo::new(tcp), svc).await;
                    }
                }
            });
        }
    });
    server
}

fn always(status: StatusCode) -> Script {
    Arc::new(move |_| (status, vec![], Duration::ZERO))
}

/// A checked config from JSON (YAML's subset the tests write).
fn sink(json: &str) -> HttpSinkConfig {
    let cfg: HttpSinkConfig = serde_json::from_str(json).unwrap();
    cfg.validate("hook").unwrap();
    cfg
}

async fn start(name: &str, cfg: HttpSinkConfig) -> (SinkRig, tokio::task::JoinHandle<()>) {
    let mut rig = SinkRig::new(name);
    let running = Box::new(cfg).build(rig.context(name)).await.unwrap();
    let task = tokio::spawn(async move { running.await.unwrap() });
    (rig, task)
}

fn event(id: &str) -> Event {
    Event::new(id, "/test/src", "com.example.t")
        .with_subject("sub ject")
        .with_json(Bytes::from(format!("{{\"n\":\"{id}\"}}")))
}

fn quick_retry(attempts: u32) -> String {
    format!(
        r#""retry": {{"max_attempts": {attempts}, "initial_backoff": "10ms", "max_backoff": "50ms"}}"#
    )
}

#[tokio::test]
async fn binary_mode_sends_ce_headers_and_data() {
    let server = serve(always(StatusCode::OK), None).await;
    let cfg = sink(&format!(
        r#"{{"url": "{}", "headers": {{"authorization": "Bearer abc", "x-tenant": "t1"}}}}"#,
        server.url
    ));
    let (mut rig, task) = start("http-binary", cfg).await;
    let mut e = event("b-1");
    e.set_extension("partitionkey", "k 1");
    assert!(rig.send(vec![e]).await.is_delivered());
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    assert_eq!(h["ce-id"], "b-1");
    assert_eq!(h["ce-specversion"], "1.0");
    assert_eq!(h["ce-source"], "/test/src");
    assert_eq!(h["ce-type"], "com.example.t");
    assert_eq!(h["ce-subject"], "sub%20ject");
    assert_eq!(h["ce-partitionkey"], "k%201");
    assert_eq!(h["content-type"], "application/json");
    assert_eq!(h["authorization"], "Bearer abc");
    assert_eq!(h["x-tenant"], "t1");
    assert_eq!(&seen[0].body[..], br#"{"n":"b-1"}"#);
    rig.close();
    task.await.unwrap();
    testkit::assert_sink_telemetry("http-binary", 1, 0);
}

#[tokio::test]
async fn structured_mode_sends_the_whole_event() {
    let server = serve(always(StatusCode::ACCEPTED), None).await;
    let cfg = sink(&format!(
        r#"{{"url": "{}", "mode": "structured"}}"#,
        server.url
    ));
    let (rig, _task) = start("http-structured", cfg).await;
    assert!(rig.send(vec![event("s-1")]).await.is_delivered());
    let seen = server.seen();
    assert_eq!(
        seen[0].headers["content-type"],
        "application/cloudevents+json"
    );
    let back = sluice_core::format::decode_event(&seen[0].body).unwrap();
    assert_eq!(back, event("s-1"));
}

#[tokio::test]
async fn batched_mode_groups_events_within_bounds() {
    let server = serve(always(StatusCode::OK), None).await;
    let cfg = sink(&format!(
        r#"{{"url": "{}", "mode": "batched", "batch": {{"max_events": 40, "linger": "50ms"}}}}"#,
        server.url
    ));
    let (rig, _task) = start("http-batched", cfg).await;
    let sends: Vec<_> = (0..100)
        .map(|i| rig.sender().send(vec![event(&format!("m-{i}"))]))
        .collect();
    let mut pending = Vec::new();
    for s in sends {
        pending.push(s.await);
    }
    for p in pending {
        assert!(p.await.is_delivered());
    }
    let seen = server.seen();
    let mut ids = Vec::new();
    for s in &seen {
        assert_eq!(
            s.headers["content-type"],
            "application/cloudevents-batch+json"
        );
        let batch = sluice_core::format::decode_batch(&s.body).unwrap();
        assert!(batch.len() <= 40, "batch of {}", batch.len());
        ids.extend(batch.into_iter().map(|e| e.id));
    }
    assert_eq!(ids.len(), 100);
    assert!(seen.len() <= 5, "{} requests for 100 events", seen.len());
    testkit::assert_sink_telemetry("http-batched", 100, 0);
}

#[tokio::test]
async fn retries_transient_failures_then_delivers() {
    // 503, connection-level 500, 502, then 200.
    let script: Script = Arc::new(|n| match n {
        0 => (StatusCode::SERVICE_UNAVAILABLE, vec![], Duration::ZERO),
        1 => (StatusCode::INTERNAL_SERVER_ERROR, vec![], Duration::ZERO),
        2 => (StatusCode::BAD_GATEWAY, vec![], Duration::ZERO),
        _ => (StatusCode::OK, vec![], Duration::ZERO),
    });
    let server = serve(script, None).await;
    let cfg = sink(&format!(
        r#"{{"url": "{}", {}}}"#,
        server.url,
        quick_retry(5)
    ));
    let (rig, _task) = start("http-retry", cfg).await;
    let out = rig.send(vec![event("r-1")]).await;
    assert!(out.is_delivered(), "{out:?}");
    let seen = server.seen();
    assert_eq!(seen.len(), 4);
    assert!(seen.iter().all(|s| s.headers["ce-id"] == "r-1"));
    // Backoff grows: each gap is at least half the nominal delay (10, 20, 40 ms).
    for (i, w) in seen.windows(2).enumerate() {
        let gap = w[1].at - w[0].at;
        assert!(gap >= Duration::from_millis(5 << i), "gap {i}: {gap:?}");
    }
    assert_eq!(
        testkit::metric("sluice_sink_retries_total", &[("sink", "http-retry")]),
        3.0
    );
    testkit::assert_sink_telemetry("http-retry", 1, 0);
}

#[tokio::test]
async fn gives_up_after_max_attempts_and_fails_upstream() {
    let server = serve(always(StatusCode::SERVICE_UNAVAILABLE), None).await;
    let cfg = sink(&format!(
        r#"{{"url": "{}", {}}}"#,
        server.url,
        quick_retry(3)
    ));
    let (rig, _task) = start("http-giveup", cfg).await;
    let out = rig.send(vec![event("g-1")]).await;
    assert_eq!(out.status, Status::Failed);
    let reason = out.reason.unwrap();
    assert!(reason.contains("503"), "{reason}");
    assert!(reason.contains("after 3 attempts"), "{reason}");
    assert_eq!(server.count(), 3);
    testkit::assert_sink_telemetry("http-giveup", 0, 1);
}

#[tokio::test]
async fn honours_retry_after_on_429() {
    let script: Script = Arc::new(|n| match n {
        0 => (
            StatusCode::TOO_MANY_REQUESTS,
            vec![("retry-after", "1".into())],
            Duration::ZERO,
        ),
        _ => (StatusCode::NO_CONTENT, vec![], Duration::ZERO),
    });
    let server = serve(script, None).await;
    let cfg = sink(&format!(
        r#"{{"url": "{}", "retry": {{"max_attempts": 3, "initial_backoff": "10ms", "max_backoff": "5s"}}}}"#,
        server.url
    ));
    let (rig, _task) = start("http-429", cfg).await;
    assert!(rig.send(vec![event("t-1")]).await.is_delivered());
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    assert!(gap >= Duration::from_millis(990), "retried after {gap:?}");
}

#[tokio::test]
async fn retry_after_beyond_max_backoff_gives_up_at_once() {
    let script: Script = Arc::new(|_| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            vec![("retry-after", "3600".into())],
            Duration::ZERO,
        )
    });
    let server = serve(script, None).await;
    let cfg = sink(&format!(
        r#"{{"url": "{}", {}}}"#,
        server.url,
        quick_retry(5)
    ));
    let (rig, _task) = start("http-retry-after-long", cfg).await;
    let out = rig.send(vec![event("l-1")]).await;
    assert_eq!(out.status, Status::Failed);
    assert!(out.reason.unwrap().contains("retry after 3600s"));
    assert_eq!(server.count(), 1);
}

#[tokio::test]
async fn gone_and_client_errors_are_not_retried() {
    for (status, name) in [
        (StatusCode::GONE, "http-410"),
        (StatusCode::BAD_REQUEST, "http-400"),
    ] {
        let server = serve(always(status), None).await;
        let cfg = sink(&format!(
            r#"{{"url": "{}", {}}}"#,
            server.url,
            quick_retry(5)
        ));
        let (rig, _task) = start(name, cfg).await;
        let out = rig.send(vec![event("x-1")]).await;
        assert_eq!(out.status, Status::Rejected, "{status}");
        assert!(out.reason.unwrap().contains(status.as_str()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(server.count(), 1, "{status} was retried");
    }
}

#[tokio::test]
async fn success_codes_decide_what_counts_as_delivered() {
    // A 500 counts only when listed; a 200 not listed is a refusal.
    let server = serve(always(StatusCode::INTERNAL_SERVER_ERROR), None).await;
    let cfg = sink(&format!(
        r#"{{"url": "{}", "success_codes": [500]}}"#,
        server.url
    ));
    let (rig, _task) = start("http-codes-500", cfg).await;
    assert!(rig.send(vec![event("c-1")]).await.is_delivered());

    let server = serve(always(StatusCode::OK), None).await;
    let cfg = sink(&format!(
        r#"{{"url": "{}", "success_codes": [202]}}"#,
        server.url
    ));
    let (rig, _task) = start("http-codes-202", cfg).await;
    assert_eq!(rig.send(vec![event("c-2")]).await.status, Status::Rejected);
}

#[tokio::test]
async fn slow_target_times_out_and_is_retried() {
    let script: Script = Arc::new(|n| {
        let delay = if n == 0 {
            Duration::from_secs(3)
        } else {
            Duration::ZERO
        };
        (StatusCode::OK, vec![], delay)
    });
    let server = serve(script, None).await;
    let cfg = sink(&format!(
        r#"{{"url": "{}", "timeout": "200ms", {}}}"#,
        server.url,
        quick_retry(3)
    ));
    let (rig, _task) = start("http-slow", cfg).await;
    let t0 = Instant::now();
    assert!(rig.send(vec![event("w-1")]).await.is_delivered());
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(server.count(), 2);

    // Always slow: fails with a timeout reason.
    let server = serve(
        Arc::new(|_| (StatusCode::OK, vec![], Duration::from_secs(3))),
        None,
    )
    .await;
    let cfg = sink(&format!(
        r#"{{"url": "{}", "timeout": "100ms", {}}}"#,
        server.url,
        quick_retry(2)
    ));
    let (rig, _task) = start("http-slow-always", cfg).await;
    let out = rig.send(vec![event("w-2")]).await;
    assert_eq!(out.status, Status::Failed);
    assert!(out.reason.unwrap().contains("timeout"));
}

/// The status decides: a 200 whose body is still arriving when the timeout strikes is
/// delivered (not retried, which would send a duplicate).
#[tokio::test]
async fn a_success_with_a_slow_body_is_delivered_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(AtomicUsize::new(0));
    let r = requests.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let r = r.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let _ = tcp.read(&mut buf).await;
                r.fetch_add(1, Ordering::SeqCst);
                let head = "HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial";
                let _ = tcp.write_all(head.as_bytes()).await;
                tokio::time::sleep(Duration::from_secs(5)).await;
            });
        }
    });
    let cfg = sink(&format!(
        r#"{{"url": "http://127.0.0.1:{port}/", "timeout": "200ms", {}}}"#,
        quick_retry(3)
    ));
    let (rig, _task) = start("http-slow-body", cfg).await;
    let t0 = Instant::now();
    let out = rig.send(vec![event("sb-1")]).await;
    assert!(out.is_delivered(), "{out:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(
        requests.load(Ordering::SeqCst),
        1,
        "no retry of an accepted event"
    );
}

#[tokio::test]
async fn request_timeout_408_is_retried() {
    let script: Script = Arc::new(|n| {
        let status = if n == 0 {
            StatusCode::REQUEST_TIMEOUT
        } else {
            StatusCode::OK
        };
        (status, vec![], Duration::ZERO)
    });
    let server = serve(script, None).await;
    let cfg = sink(&format!(
        r#"{{"url": "{}", {}}}"#,
        server.url,
        quick_retry(3)
    ));
    let (rig, _task) = start("http-408", cfg).await;
    assert!(rig.send(vec![event("t-1")]).await.is_delivered());
    assert_eq!(server.count(), 2);
}

#[tokio::test]
async fn unreachable_target_fails_after_retries() {
    let port = testkit::free_port();
    let cfg = sink(&format!(
        r#"{{"url": "http://127.0.0.1:{port}/x", {}}}"#,
        quick_retry(3)
    ));
    let (rig, _task) = start("http-refused", cfg).await;
    let out = rig.send(vec![event("u-1")]).await;
    assert_eq!(out.status, Status::Failed);
    let reason = out.reason.unwrap();
    assert!(reason.contains("onnect"), "{reason}");
    assert!(reason.contains("after 3 attempts"), "{reason}");
}

#[tokio::test]
async fn dead_letter_takes_what_the_target_refuses() {
    let server = serve(always(StatusCode::BAD_GATEWAY), None).await;
    let cfg = sink(&format!(
        r#"{{"url": "{}", {}}}"#,
        server.url,
        quick_retry(2)
    ));
    let (mut rig, mut dead) = SinkRig::with_dead_letter("http-dl");
    let running = Box::new(cfg).build(rig.context("http-dl")).await.unwrap();
    tokio::spawn(running);
    let pending = rig.sender().send(vec![event("d-1")]).await;
    let item = dead.next_within(Duration::from_secs(10)).await;
    assert_eq!(item.event.id, "d-1");
    let ext = |n: &str| {
        item.event
            .extension(n)
            .map(|v| v.to_canonical().into_owned())
            .unwrap_or_default()
    };
    assert_eq!(ext("deadlettersink"), "http-dl");
    assert_eq!(ext("deadletterstatus"), "failed");
    assert!(
        ext("deadletterreason").contains("502"),
        "{}",
        ext("deadletterreason")
    );
    item.delivery.delivered();
    // Handled: the source sees success although the target never took it.
    assert!(pending.await.is_delivered());
    assert_eq!(server.count(), 2);
    assert_eq!(
        testkit::metric(
            "sluice_events_dead_lettered_total",
            &[("sink", "http-dl"), ("dead_letter", "http-dl-dead-letter")]
        ),
        1.0
    );
}

#[tokio::test]
async fn concurrency_is_bounded() {
    let server = serve(
        Arc::new(|_| (StatusCode::OK, vec![], Duration::from_millis(100))),
        None,
    )
    .await;
    let cfg = sink(&format!(r#"{{"url": "{}", "concurrency": 4}}"#, server.url));
    let (rig, _task) = start("http-concurrency", cfg).await;
    let mut pending = Vec::new();
    for i in 0..20 {
        pending.push(rig.sender().send(vec![event(&format!("k-{i}"))]).await);
    }
    let t0 = Instant::now();
    for p in pending {
        assert!(p.await.is_delivered());
    }
    // Exactly 4 at once at the peak: never more (the bound), and not one at a time (the
    // server saw 4 together). 20 requests of 100 ms, at most 4 at a time, take at least 500 ms;
    // no upper bound on time: a loaded CI machine may be slow, and the peak already proves the
    // requests overlapped.
    assert_eq!(server.max_concurrent.load(Ordering::SeqCst), 4);
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(450), "{took:?}");
}

mod tls {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    /// The shared test PKI, and a TLS acceptor for its server certificate that asks for a
    /// client certificate signed by its CA.
    fn pki() -> (tempfile::TempDir, tokio_rustls::TlsAcceptor) {
        let p = testkit::pki();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(p.ca_pem.as_bytes()).unwrap())
            .unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .unwrap();
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(p.server_cert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(p.server_key.as_bytes()).unwrap(),
            )
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        (p.dir, tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }

    #[tokio::test]
    async fn mutual_tls_with_a_custom_ca() {
        let (dir, acceptor) = pki();
        let server = serve(always(StatusCode::OK), Some(acceptor)).await;
        let d = dir.path().display();
        let cfg = sink(&format!(
            r#"{{"url": "{}", "tls": {{"ca": "{d}/ca.pem", "cert": "{d}/client.pem", "key": "{d}/client.key"}}}}"#,
            server.url
        ));
        let (rig, _task) = start("http-mtls", cfg).await;
        assert!(rig.send(vec![event("tls-1")]).await.is_delivered());
        assert_eq!(server.seen()[0].headers["ce-id"], "tls-1");

        // Without a client certificate the server refuses the handshake: not delivered.
        let cfg = sink(&format!(
            r#"{{"url": "{}", "tls": {{"ca": "{d}/ca.pem"}}, {}}}"#,
            server.url,
            quick_retry(2)
        ));
        let (rig, _task) = start("http-mtls-nocert", cfg).await;
        let out = rig.send(vec![event("tls-2")]).await;
        assert_eq!(out.status, Status::Failed);
        // And without our CA, the server's certificate is not trusted.
        let cfg = sink(&format!(
            r#"{{"url": "{}", {}}}"#,
            server.url,
            quick_retry(1)
        ));
        let (rig, _task) = start("http-mtls-noca", cfg).await;
        let out = rig.send(vec![event("tls-3")]).await;
        assert_eq!(out.status, Status::Failed);
        assert!(out.reason.unwrap().to_lowercase().contains("certificate"));
        assert_eq!(server.count(), 1);
    }
}

#[test]
fn invalid_configs_say_what_is_wrong() {
    let bad = |json: &str, needle: &str| {
        let cfg: HttpSinkConfig = serde_json::from_str(json).unwrap();
        let err = cfg.validate("hook").unwrap_err();
        assert!(err.contains(needle), "{json}: {err}");
    };
    bad(r#"{"url": "ftp://x/y"}"#, "http:// or https://");
    bad(r#"{"url": "/relative"}"#, "absolute");
    bad(
        r#"{"url": "http://x", "method": "GE T"}"#,
        "not an HTTP method",
    );
    bad(
        r#"{"url": "http://x", "headers": {"ce-id": "1"}}"#,
        "CloudEvents binding",
    );
    bad(
        r#"{"url": "http://x", "headers": {"x": "a\nb"}}"#,
        "cannot carry",
    );
    bad(
        r#"{"url": "http://x", "success_codes": [700]}"#,
        "not an HTTP status",
    );
    bad(r#"{"url": "http://x", "concurrency": 0}"#, "concurrency");
    bad(
        r#"{"url": "http://x", "retry": {"max_attempts": 0}}"#,
        "max_attempts",
    );
    bad(
        r#"{"url": "http://x", "tls": {"ca": "/ca.pem"}}"#,
        "use https://",
    );
    bad(
        r#"{"url": "https://x", "tls": {"cert": "/c.pem"}}"#,
        "without tls.key",
    );
}

/// The shared sink compliance check (`testkit::sink_compliance`).
#[tokio::test]
async fn passes_the_sink_compliance_check() {
    let server = serve(always(StatusCode::OK), None).await;
    let s = server.clone();
    testkit::sink_compliance::<HttpSinkConfig>(
        "http-compliance",
        serde_json::json!({"url": server.url}),
        serde_json::json!({"url": "ftp://example.com/"}),
        serde_json::json!({"url": format!("http://127.0.0.1:{}/", testkit::free_port()),
            "retry": {"max_attempts": 100, "initial_backoff": "50ms"}}),
        move || {
            let s = s.clone();
            Box::pin(async move { s.seen().into_iter().map(|x| x.body.to_vec()).collect() })
        },
    )
    .await;
}
