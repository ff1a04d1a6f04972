//! The webhook source over real HTTP (and HTTPS), through the real pipeline, into a capture
//! sink from the test kit.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use sluice_core::pipeline::WhenFull;
use sluice_core::testkit::free_port;
use sluice_core::testkit::{assert_source_telemetry, metric, Capture, SourceRig};
use sluice_core::{format, ExtValue, SourceConfig, Status};
use sluice_webhook::WebhookConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Hook {
    addr: SocketAddr,
    rig: SourceRig,
    capture: Option<Capture>,
    task: tokio::task::JoinHandle<Result<(), sluice_core::ConnectorError>>,
}

/// Builds webhook source `name` listening on a free port of 127.0.0.1: its address, rig, the
/// `Shared` it registered its listener in, and the running source.
///
/// `free_port` only names a port that was free a moment ago: another test process (nextest runs
/// each test in its own) can bind it before the source does. A build that finds the port taken
/// is retried on another one, so that race cannot fail a test. (Local for now: a better
/// `free_port` belongs in the core test kit.)
async fn build_on_free_port(
    name: &str,
    cfg: &Value,
    queue: usize,
) -> (
    SocketAddr,
    SourceRig,
    sluice_core::Shared,
    sluice_core::Running,
) {
    let mut last = String::new();
    for _ in 0..20 {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut cfg = cfg.clone();
        cfg["listen"] = json!(addr.to_string());
        let mut rig = SourceRig::with_queue(name, queue, WhenFull::Block);
        let config: WebhookConfig = serde_json::from_value(cfg).expect("test config");
        config.validate(name).expect("valid test config");
        let ctx = rig.context(name);
        let shared = ctx.shared.clone();
        match Box::new(config).build(ctx).await {
            Ok(running) => return (addr, rig, shared, running),
            Err(e) if e.to_string().contains("Address already in use") => last = e.to_string(),
            Err(e) => panic!("webhook source {name} does not build: {e}"),
        }
    }
    panic!("webhook source {name}: no free port in 20 tries; last: {last}");
}

async fn start_with(name: &str, cfg: Value, queue: usize) -> Hook {
    let (addr, mut rig, _, running) = build_on_free_port(name, &cfg, queue).await;
    let task = tokio::spawn(running);
    let capture = Some(rig.capture());
    Hook {
        addr,
        rig,
        capture,
        task,
    }
}

async fn start(name: &str, cfg: Value) -> Hook {
    start_with(name, cfg, 10_000).await
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

async fn send_on<S>(io: S, req: Request<Full<Bytes>>) -> Reply
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::copy_from_slice(body))).unwrap();
    send_on(TcpStream::connect(addr).await.unwrap(), req).await
}

async fn post(addr: SocketAddr, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    call(addr, "POST", "/", headers, body).await
}

#[tokio::test]
async fn plain_post_becomes_a_cloudevent() {
    let mut h = start(
        "plain",
        json!({"path": "/orders", "methods": ["POST", "PUT"],
        "header_extensions": ["X-Tenant"]}),
    )
    .await;
    let got = h.capture.take().unwrap().auto(Status::Delivered);
    let r = call(
        h.addr,
        "POST",
        "/orders",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", "order-1"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            ("x-tenant", "acme"),
            ("authorization", "Bearer not-configured-here"),
        ],
        br#"{"amount":10}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.json()["status"], "delivered");
    let e = &got.wait_for(1).await[0];
    assert_eq!(e.id, "order-1");
    assert_eq!(e.ty, "webhook");
    assert_eq!(e.source, "plain");
    assert_eq!(e.subject.as_deref(), Some("/orders"));
    assert_eq!(e.datacontenttype.as_deref(), Some("application/json"));
    assert_eq!(
        e.data,
        sluice_core::Data::Json(Bytes::from_static(br#"{"amount":10}"#))
    );
    assert!(e.time.is_some());
    assert_eq!(
        e.extension("traceparent").map(|v| v.to_string()).as_deref(),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
    assert_eq!(
        e.extension("xtenant"),
        Some(&ExtValue::String("acme".into()))
    );
    let encoded = String::from_utf8(format::encode_event(e)).unwrap();
    assert!(
        !encoded.contains("not-configured-here"),
        "the Authorization value never reaches the event"
    );
    // PUT is configured too; non-JSON bodies are kept as bytes.
    let r = call(
        h.addr,
        "PUT",
        "/orders",
        &[("content-type", "text/plain")],
        b"hello",
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let e = &got.wait_for(2).await[1];
    assert_eq!(
        e.data,
        sluice_core::Data::Binary(Bytes::from_static(b"hello"))
    );
    assert_eq!(
        uuid::Uuid::parse_str(&e.id).unwrap().get_version_num(),
        7,
        "uuid v7 fallback id"
    );
    assert_source_telemetry("plain", 2);
    assert_eq!(
        metric(
            "sluice_webhook_responses_total",
            &[("source", "plain"), ("status", "200")]
        ),
        2.0
    );
    drop(h.rig);
}

#[tokio::test]
async fn status_codes_for_routing() {
    let h = start("routing", json!({"path": "/hook"})).await;
    assert_eq!(
        call(h.addr, "POST", "/nope", &[], b"").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(h.addr, "POST", "/hook/", &[], b"").await.status,
        StatusCode::NOT_FOUND,
        "no trailing-slash folding"
    );
    let r = call(h.addr, "DELETE", "/hook", &[], b"").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.headers["allow"], "POST");
    assert_eq!(
        call(h.addr, "GET", "/health", &[], b"").await.status,
        StatusCode::OK
    );
    let r = call(
        h.addr,
        "POST",
        "/hook",
        &[("content-type", "not a media type")],
        b"x",
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.json()["error"].as_str().unwrap().contains("media type"));
}

#[tokio::test]
async fn get_query_becomes_json_data() {
    let mut h = start(
        "getq",
        json!({"methods": ["GET"], "id_fallback": "body-sha256"}),
    )
    .await;
    let got = h.capture.take().unwrap().auto(Status::Delivered);
    let r = call(h.addr, "GET", "/?a=1&a=2&b=x%20y", &[], b"").await;
    assert_eq!(r.status, StatusCode::OK);
    let e = &got.wait_for(1).await[0];
    let data: Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
    assert_eq!(data, json!({"a": ["1", "2"], "b": ["x y"]}));
    // The hex SHA-256 of the raw query string, as sent (computed independently:
    // `printf 'a=1&a=2&b=x%%20y' | sha256sum`).
    assert_eq!(
        e.id, "e1eae77bbf02c6c206deac0bd86b4d51a282a34cae69532802e279a1353fcd96",
        "sha-256 hex of the query"
    );
    assert_eq!(
        e.id,
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"a=1&a=2&b=x%20y"))
    );
}

#[tokio::test]
async fn incoming_cloudevents_pass_through_unchanged() {
    let mut h = start("ce", json!({})).await;
    let got = h.capture.take().unwrap().auto(Status::Delivered);
    // Binary mode.
    let r = post(
        h.addr,
        &[
            ("ce-specversion", "1.0"),
            ("ce-id", "b-1"),
            ("ce-source", "//upstream/x"),
            ("ce-type", "com.example.thing"),
            ("ce-time", "2018-04-05T17:31:00+02:00"),
            ("ce-myext", "v%20w"),
            ("content-type", "application/json"),
        ],
        br#"{"k":1}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    // Structured mode.
    let structured = json!({"specversion": "1.0", "id": "s-1", "source": "urn:x", "type": "t.s",
        "subject": "sub", "comexample": 5, "data": {"z": true}});
    let r = post(
        h.addr,
        &[(
            "content-type",
            "application/cloudevents+json; charset=utf-8",
        )],
        structured.to_string().as_bytes(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    // Batched mode: one answer for all.
    let batch = json!([
        {"specversion": "1.0", "id": "m-1", "source": "/b", "type": "t.b"},
        {"specversion": "1.0", "id": "m-2", "source": "/b", "type": "t.b", "data_base64": "AAE="}
    ]);
    let r = post(
        h.addr,
        &[("content-type", "application/cloudevents-batch+json")],
        batch.to_string().as_bytes(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["events"], 2);
    let events = got.wait_for(4).await;
    let b = &events[0];
    assert_eq!(
        (b.id.as_str(), b.source.as_str(), b.ty.as_str()),
        ("b-1", "//upstream/x", "com.example.thing")
    );
    assert_eq!(
        b.time.as_ref().unwrap().as_str(),
        "2018-04-05T17:31:00+02:00",
        "time kept as sent"
    );
    assert_eq!(b.extension("myext"), Some(&ExtValue::String("v w".into())));
    assert_eq!(
        b.subject, None,
        "no webhook attributes added to an incoming event"
    );
    let s = &events[1];
    assert_eq!(
        (s.id.as_str(), s.source.as_str(), s.subject.as_deref()),
        ("s-1", "urn:x", Some("sub"))
    );
    assert_eq!(s.extension("comexample"), Some(&ExtValue::Integer(5)));
    assert_eq!(&events[3].data.as_bytes().unwrap()[..], &[0, 1]);
    // Invalid CloudEvents get 400 with the reason.
    let r = post(
        h.addr,
        &[("ce-specversion", "1.0"), ("ce-id", "x"), ("ce-type", "t")],
        b"",
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.json()["error"].as_str().unwrap().contains("ce-source"),
        "{:?}",
        r.json()
    );
    let r = post(
        h.addr,
        &[("content-type", "application/cloudevents+json")],
        br#"{"specversion":"1.0","id":"","source":"/","type":"t"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.json()["error"].as_str().unwrap().contains("id"),
        "{:?}",
        r.json()
    );
    // Neither invalid request became an event: a valid one sent after them is the very next
    // event out (one source, one pipeline: events arrive in the order they were taken).
    let r = post(
        h.addr,
        &[
            ("ce-specversion", "1.0"),
            ("ce-id", "after-invalid"),
            ("ce-source", "/x"),
            ("ce-type", "t"),
        ],
        b"",
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let ids: Vec<String> = got
        .wait_for(5)
        .await
        .into_iter()
        .map(|e| e.id.into())
        .collect();
    assert_eq!(ids, ["b-1", "s-1", "m-1", "m-2", "after-invalid"]);
}

#[tokio::test]
async fn bearer_and_basic_auth() {
    let mut h = start(
        "auth",
        json!({"auth": {"bearer": ["old-token", "new-token"]}}),
    )
    .await;
    let got = h.capture.take().unwrap().auto(Status::Delivered);
    let r = post(h.addr, &[], b"{}").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers["www-authenticate"], "Bearer realm=\"sluice\"");
    assert_eq!(
        post(h.addr, &[("authorization", "Bearer wrong")], b"{}")
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        post(h.addr, &[("authorization", "Bearer old-token")], b"{}")
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        post(h.addr, &[("authorization", "Bearer new-token")], b"{}")
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(got.wait_for(2).await.len(), 2);
    assert_eq!(
        metric(
            "sluice_events_rejected_total",
            &[("source", "auth"), ("reason", "unauthorized")]
        ),
        2.0
    );

    let mut h = start(
        "basic",
        json!({"auth": {"basic": {"username": "u", "password": "p"}}, "format": "argo"}),
    )
    .await;
    let got = h.capture.take().unwrap().auto(Status::Delivered);
    let r = post(h.addr, &[("authorization", "Basic dTpw")], b"{}").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        post(h.addr, &[("authorization", "Basic dTpx")], b"{}")
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    let e = &got.wait_for(1).await[0];
    let data: Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
    assert!(data["header"].get("Authorization").is_none(), "{data}");
    assert!(!String::from_utf8_lossy(e.data.as_bytes().unwrap()).contains("dTpw"));
}

#[tokio::test]
async fn argo_format_matches_argo_events() {
    let mut h = start(
        "argo-es",
        json!({"format": "argo", "subject": "example", "metadata": {"team": "a"}}),
    )
    .await;
    let got = h.capture.take().unwrap().auto(Status::Delivered);
    let r = post(
        h.addr,
        &[
            ("content-type", "application/json"),
            ("x-github-event", "push"),
        ],
        br#"{"message":"hi"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let e = &got.wait_for(1).await[0];
    assert_eq!(
        (e.ty.as_str(), e.source.as_str(), e.subject.as_deref()),
        ("webhook", "argo-es", Some("example"))
    );
    assert_eq!(e.datacontenttype.as_deref(), Some("application/json"));
    let data: Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
    assert_eq!(data["body"], json!({"message": "hi"}));
    assert_eq!(data["header"]["X-Github-Event"], json!(["push"]));
    assert_eq!(data["header"]["Content-Type"], json!(["application/json"]));
    assert_eq!(data["metadata"], json!({"team": "a"}));
    assert_eq!(data.as_object().unwrap().len(), 3);
}

#[tokio::test]
async fn same_idempotency_key_twice_is_one_event() {
    let mut h = start("dedup", json!({})).await;
    let got = h.capture.take().unwrap().auto(Status::Delivered);
    let a = post(h.addr, &[("idempotency-key", "k-1")], b"{}").await;
    let b = post(h.addr, &[("idempotency-key", "k-1")], b"{}").await;
    assert_eq!((a.status, b.status), (StatusCode::OK, StatusCode::OK));
    assert_eq!(b.json()["duplicates"], 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(got.len(), 1, "one event out");
    assert_eq!(
        metric("sluice_events_deduplicated_total", &[("source", "dedup")]),
        1.0
    );
}

#[tokio::test]
async fn sink_failure_is_never_a_200_and_retry_goes_through() {
    let mut h = start("failing", json!({})).await;
    let mut cap = h.capture.take().unwrap();
    let addr = h.addr;
    let req = tokio::spawn(async move { post(addr, &[("idempotency-key", "f-1")], b"{}").await });
    let item = cap.next_within(Duration::from_secs(5)).await;
    item.delivery.failed("downstream said no");
    let r = req.await.unwrap();
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers["retry-after"], "1");
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("downstream said no"));
    // The retry with the same id is forwarded again (not taken for a duplicate).
    let req = tokio::spawn(async move { post(addr, &[("idempotency-key", "f-1")], b"{}").await });
    let item = cap.next_within(Duration::from_secs(5)).await;
    item.delivery.delivered();
    assert_eq!(req.await.unwrap().status, StatusCode::OK);
}

#[tokio::test]
async fn ack_timeout_gives_503_then_the_retry_is_deduplicated() {
    let mut h = start("slowack", json!({"ack_timeout": "200ms"})).await;
    let mut cap = h.capture.take().unwrap();
    let started = Instant::now();
    let r = post(h.addr, &[("idempotency-key", "t-1")], b"{}").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers.contains_key("retry-after"));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(2),
        "answered when ack_timeout passed, not before nor much later: {waited:?}"
    );
    let msg = r.json()["error"].as_str().unwrap_or_default().to_owned();
    assert!(msg.contains("ack_timeout"), "{msg}");
    // Still in flight: a retry is not forwarded, and not answered 200 yet.
    let r = post(h.addr, &[("idempotency-key", "t-1")], b"{}").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    cap.next_within(Duration::from_secs(1))
        .await
        .delivery
        .delivered();
    let r = post(h.addr, &[("idempotency-key", "t-1")], b"{}").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["duplicates"], 1);
    assert!(cap.try_next().is_none(), "never forwarded twice");
}

#[tokio::test]
async fn ack_accepted_answers_202_once_queued() {
    let mut h = start("accepted", json!({"ack": "accepted"})).await;
    let mut cap = h.capture.take().unwrap();
    let r = post(h.addr, &[], b"{}").await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_eq!(cap.queued(), 1, "queued, not yet delivered");
    cap.next_within(Duration::from_secs(1))
        .await
        .delivery
        .delivered();
}

#[tokio::test]
async fn load_shedding_when_the_sink_cannot_keep_up() {
    // A queue of 2 that nobody drains: the third request cannot be taken within accept_timeout.
    let h = start_with(
        "shed",
        json!({"ack": "accepted", "accept_timeout": "100ms"}),
        2,
    )
    .await;
    for _ in 0..2 {
        assert_eq!(post(h.addr, &[], b"{}").await.status, StatusCode::ACCEPTED);
    }
    let started = Instant::now();
    let r = post(h.addr, &[], b"{}").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers["retry-after"], "1");
    // Shed after accept_timeout (100ms), not held until ack_timeout (30s by default): a bound
    // far above the one and far below the other, for a loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Many waiting clients: each is shed, none is held.
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let addr = h.addr;
        tasks.push(tokio::spawn(
            async move { post(addr, &[], b"{}").await.status },
        ));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(
        metric(
            "sluice_events_rejected_total",
            &[("source", "shed"), ("reason", "overloaded")]
        ),
        51.0
    );
    drop(h.capture);
}

#[tokio::test]
async fn max_in_flight_sheds_at_once() {
    let mut h = start("inflight", json!({"max_in_flight": 1, "ack_timeout": "5s"})).await;
    let mut cap = h.capture.take().unwrap();
    let addr = h.addr;
    let first = tokio::spawn(async move { post(addr, &[], b"{}").await.status });
    let item = cap.next_within(Duration::from_secs(5)).await;
    let r = post(h.addr, &[], b"{}").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    item.delivery.delivered();
    assert_eq!(first.await.unwrap(), StatusCode::OK);
}

#[tokio::test]
async fn oversized_body_is_refused_without_reading_it() {
    let h = start("big", json!({"max_body": "1KiB"})).await;
    // Content-Length says 10 MB, and we send only the headers: the answer comes at once.
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10485760\r\n\r\n0123")
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    // Chunked, no length: cut off once past the limit.
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let chunk = vec![b'a'; 2048];
    s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
        .await
        .unwrap();
    s.write_all(&chunk).await.unwrap();
    s.write_all(b"\r\n").await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 413"));
}

#[tokio::test]
async fn trickling_clients_are_cut_off() {
    let h = start(
        "slow",
        json!({"header_timeout": "300ms", "body_timeout": "300ms"}),
    )
    .await;
    // Headers that never finish: the connection is closed.
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let started = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
        .await
        .expect("cut off by header_timeout");
    assert!(started.elapsed() >= Duration::from_millis(250));
    // Closed without an answer (the request line never ended, so there is no request to
    // answer).
    match r {
        Ok(0) => {}
        Ok(n) => panic!(
            "expected the connection closed, got {:?}",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(e) => panic!("expected the connection closed, got {e}"),
    }
    let listen = h.addr.to_string();
    assert_eq!(
        metric(
            "sluice_webhook_header_timeouts_total",
            &[("listen", listen.as_str())]
        ),
        1.0
    );
    // A body that trickles: 408.
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nabc")
        .await
        .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
}

#[tokio::test]
async fn webhook_handshake() {
    let h = start(
        "handshake",
        json!({"allowed_origins": ["eventgrid.azure.net"]}),
    )
    .await;
    let r = call(
        h.addr,
        "OPTIONS",
        "/",
        &[("webhook-request-origin", "eventgrid.azure.net")],
        b"",
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["webhook-allowed-origin"], "eventgrid.azure.net");
    let r = call(
        h.addr,
        "OPTIONS",
        "/",
        &[("webhook-request-origin", "evil.example")],
        b"",
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn sources_share_a_listener_by_path() {
    let (addr, mut rig, shared, running) =
        build_on_free_port("shared-a", &json!({"path": "/a"}), 10_000).await;
    tokio::spawn(running);
    let mut rig_b = SourceRig::new("shared-b");
    let mut ctx_b = rig_b.context("shared-b");
    ctx_b.shared = shared.clone();
    let b: WebhookConfig =
        serde_json::from_value(json!({"listen": addr.to_string(), "path": "/b"})).unwrap();
    tokio::spawn(Box::new(b).build(ctx_b).await.unwrap());
    let got_a = rig.capture().auto(Status::Delivered);
    let got_b = rig_b.capture().auto(Status::Delivered);
    assert_eq!(
        call(addr, "POST", "/a", &[], b"{}").await.status,
        StatusCode::OK
    );
    assert_eq!(
        call(addr, "POST", "/b", &[], b"{}").await.status,
        StatusCode::OK
    );
    assert_eq!(
        call(addr, "POST", "/b", &[], b"{}").await.status,
        StatusCode::OK
    );
    assert_eq!(
        (got_a.wait_for(1).await.len(), got_b.wait_for(2).await.len()),
        (1, 2)
    );
    // The same path twice on one listener is refused.
    let mut rig_c = SourceRig::new("shared-c");
    let mut ctx_c = rig_c.context("shared-c");
    ctx_c.shared = shared;
    let c: WebhookConfig =
        serde_json::from_value(json!({"listen": addr.to_string(), "path": "/a"})).unwrap();
    let err = Box::new(c).build(ctx_c).await.err().expect("conflict");
    assert!(
        err.to_string()
            .contains("already served by webhook source `shared-a`"),
        "{err}"
    );
}

#[tokio::test]
async fn shutdown_finishes_in_flight_requests() {
    let mut h = start("drain", json!({"ack_timeout": "5s"})).await;
    let mut cap = h.capture.take().unwrap();
    let addr = h.addr;
    let req = tokio::spawn(async move { post(addr, &[], b"{}").await.status });
    let item = cap.next_within(Duration::from_secs(5)).await;
    h.rig.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "no new connections after shutdown"
    );
    item.delivery.delivered();
    assert_eq!(
        req.await.unwrap(),
        StatusCode::OK,
        "the accepted request is still answered"
    );
    tokio::time::timeout(Duration::from_secs(5), h.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn shutdown_closes_idle_keepalive_connections_at_once() {
    let mut h = start("idle", json!({"ack": "accepted", "header_timeout": "60s"})).await;
    let _cap = h.capture.take();
    // A kept-alive connection, answered and idle, and one that never sent a byte.
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 202"));
    let mut silent = TcpStream::connect(h.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    h.rig.shutdown.cancel();
    for c in [&mut s, &mut silent] {
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .expect("closed at shutdown, not after header_timeout")
            .unwrap_or(0);
        assert_eq!(n, 0, "closed without a response");
    }
    tokio::time::timeout(Duration::from_secs(5), h.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
}

mod tls {
    use super::*;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use sluice_core::testkit::pki;

    async fn tls_post(
        addr: SocketAddr,
        ca_pem: &str,
        client: Option<(&str, &str)>,
    ) -> Result<Reply, String> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match client {
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let stream = connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .map_err(|e| e.to_string())?;
        let req = Request::builder()
            .method("POST")
            .uri("/")
            .header("host", "localhost")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let resp = sender.send_request(req).await.map_err(|e| chain(&e))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    use rustls::pki_types::pem::PemObject as _;

    /// An error with its sources (hyper's "connection error" alone does not say which alert).
    fn chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut cur = e.source();
        while let Some(s) = cur {
            out.push_str(&format!(": {s}"));
            cur = s.source();
        }
        out
    }

    #[tokio::test]
    async fn https_and_certificate_reload() {
        let p = pki();
        let d = p.dir.path();
        let mut h = start(
            "https",
            json!({"tls": {"cert": d.join("server.pem"), "key": d.join("server.key")}}),
        )
        .await;
        let _got = h.capture.take().unwrap().auto(Status::Delivered);
        let r = tls_post(h.addr, &p.ca_pem, None).await.unwrap();
        assert_eq!(r.status, StatusCode::OK);
        // Plain HTTP to a TLS port does not get through.
        let plain = tokio::time::timeout(Duration::from_secs(3), async {
            let mut s = TcpStream::connect(h.addr).await.unwrap();
            s.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
                .await
                .unwrap();
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await.unwrap();
            buf
        })
        .await
        .expect("the connection is closed");
        // The TLS layer answers the plaintext with one fatal decode_error alert and closes: no
        // HTTP response of any kind, and no event.
        assert_eq!(
            plain,
            [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 50],
            "expected a fatal TLS decode_error alert, got {:?}",
            String::from_utf8_lossy(&plain)
        );
        // Replace the certificate with one from another CA: new handshakes use it.
        let other = pki();
        std::fs::copy(other.dir.path().join("server.pem"), d.join("server.pem")).unwrap();
        std::fs::copy(other.dir.path().join("server.key"), d.join("server.key")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut reloaded_posts = 0;
        loop {
            if let Ok(r) = tls_post(h.addr, &other.ca_pem, None).await {
                assert_eq!(r.status, StatusCode::OK);
                reloaded_posts += 1;
                break;
            }
            assert!(Instant::now() < deadline, "certificate was not reloaded");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let err = tls_post(h.addr, &p.ca_pem, None)
            .await
            .err()
            .expect("old CA no longer matches");
        assert!(err.contains("invalid peer certificate"), "{err}");
        assert_eq!(
            _got.len(),
            reloaded_posts + 1,
            "one event per successful post, none from the plaintext or failed handshakes"
        );
    }

    #[tokio::test]
    async fn mutual_tls() {
        let p = pki();
        let d = p.dir.path();
        let mut h = start("mtls", json!({"tls": {"cert": d.join("server.pem"), "key": d.join("server.key"), "client_ca": d.join("ca.pem")}})).await;
        let _got = h.capture.take().unwrap().auto(Status::Delivered);
        let ok = tls_post(h.addr, &p.ca_pem, Some((&p.client_cert, &p.client_key)))
            .await
            .unwrap();
        assert_eq!(ok.status, StatusCode::OK);
        // TLS 1.3: the client's handshake ends before the server checks the client's
        // certificate; the server's alert arrives with the request.
        let err = tls_post(h.addr, &p.ca_pem, None)
            .await
            .err()
            .expect("no client certificate, no request");
        assert!(err.contains("CertificateRequired"), "{err}");
        let stranger = pki();
        let err = tls_post(
            h.addr,
            &p.ca_pem,
            Some((&stranger.client_cert, &stranger.client_key)),
        )
        .await
        .err()
        .expect("a certificate from another CA is refused");
        // Every test CA has the same name: the stranger's certificate names our CA as its
        // issuer, and its signature does not verify against our CA's key.
        assert!(err.contains("DecryptError"), "{err}");
    }
}

#[tokio::test]
async fn header_timeout_closes_idle_keepalive_but_not_a_request_in_progress() {
    let mut h = start(
        "watchdog",
        json!({"header_timeout": "300ms", "ack_timeout": "5s"}),
    )
    .await;
    let mut cap = h.capture.take().unwrap();
    // One request, answered; then silence on the kept-alive connection: closed.
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let item = cap.next_within(Duration::from_secs(5)).await;
    // The sink holds the event longer than header_timeout: the connection must stay open.
    tokio::time::sleep(Duration::from_millis(700)).await;
    item.delivery.delivered();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    let started = Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
        .await
        .expect("closed by the watchdog")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without a response");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "{:?}",
        started.elapsed()
    );
}
