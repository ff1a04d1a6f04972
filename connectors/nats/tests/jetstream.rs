//! The NATS sink against real nats-server processes with JetStream, started here on ports they
//! pick themselves (the test script installs the pinned nats-server into target/natsenv; there
//! is no fallback to another one).

use std::time::Duration;

mod common;

use async_nats::jetstream;
use bytes::Bytes;
use common::Server;
use serde_json::json;
use sluice_core::testkit::{assert_sink_telemetry, SinkRig};
use sluice_core::{Event, SinkConfig, Status};
use sluice_nats::{msg_id, NatsConfig};

async fn sink(name: &str, cfg: serde_json::Value) -> SinkRig {
    let cfg: NatsConfig = serde_json::from_value(cfg).unwrap();
    cfg.validate(name).unwrap();
    let mut rig = SinkRig::new(name);
    let running = Box::new(cfg)
        .build(rig.context(name))
        .await
        .expect("builds");
    tokio::spawn(running);
    rig
}

fn event(id: &str) -> Event {
    let mut e = Event::new(id, "/orders%20api", "com.example.order.created")
        .with_subject("orders/1")
        .with_json(Bytes::from(format!("{{\"id\":\"{id}\"}}")));
    e.set_extension(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    e
}

async fn stream_messages(
    url: &str,
    stream: &str,
) -> Vec<async_nats::jetstream::message::StreamMessage> {
    let client = async_nats::connect(url).await.unwrap();
    let js = jetstream::new(client);
    let mut s = js.get_stream(stream).await.unwrap();
    let info = s.info().await.unwrap();
    let mut out = Vec::new();
    for seq in info.state.first_sequence..=info.state.last_sequence {
        if let Ok(m) = s.get_raw_message(seq).await {
            out.push(m);
        }
    }
    out
}

#[tokio::test]
async fn jetstream_binary_mode_with_headers_and_dedup() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let cfg = json!({"url": server.url(), "subject": "events.{source}.{type}",
        "jetstream": {"stream": "EVENTS", "create": {"subjects": ["events.>"], "duplicate_window": "10m"}}});
    let rig = sink("js-bin", cfg.clone()).await;
    let out = rig.send(vec![event("a"), event("b")]).await;
    assert_eq!(out.status, Status::Delivered, "{:?}", out.reason);
    // The same event again, through a second sink instance (as after a restart): JetStream
    // drops it by Nats-Msg-Id.
    let rig2 = sink("js-bin-2", cfg).await;
    assert!(rig2.send(vec![event("a")]).await.is_delivered());

    let msgs = stream_messages(&server.url(), "EVENTS").await;
    assert_eq!(msgs.len(), 2, "one message per distinct event");
    let m = &msgs[0];
    assert_eq!(
        m.subject.as_str(),
        "events._orders_20api.com_example_order_created"
    );
    let h = &m.headers;
    assert_eq!(h.get("ce-id").map(|v| v.as_str()), Some("a"));
    assert_eq!(
        h.get("ce-source").map(|v| v.as_str()),
        Some("/orders%2520api"),
        "percent-encoded (% → %25)"
    );
    assert_eq!(h.get("ce-specversion").map(|v| v.as_str()), Some("1.0"));
    assert_eq!(
        h.get("ce-datacontenttype").map(|v| v.as_str()),
        Some("application/json")
    );
    assert_eq!(
        h.get("ce-traceparent").map(|v| v.as_str()),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
    assert_eq!(
        h.get("Nats-Msg-Id").map(|v| v.as_str().to_owned()),
        Some(msg_id(&event("a")))
    );
    assert_eq!(&m.payload[..], br#"{"id":"a"}"#);
    assert_sink_telemetry("js-bin", 2, 0);
}

#[tokio::test]
async fn structured_mode_and_core_publish() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let rig = sink(
        "js-struct",
        json!({"url": server.url(), "mode": "structured", "subject": "s.{type}",
        "jetstream": {"stream": "S", "create": {"subjects": ["s.>"]}}}),
    )
    .await;
    assert!(rig.send(vec![event("x")]).await.is_delivered());
    let m = &stream_messages(&server.url(), "S").await[0];
    assert_eq!(
        m.headers.get("Content-Type").map(|v| v.as_str()),
        Some("application/cloudevents+json")
    );
    let back = sluice_core::format::decode_event(&m.payload).unwrap();
    assert_eq!(back, event("x"));

    // Core NATS: delivered once flushed; a subscriber sees it.
    let client = async_nats::connect(server.url()).await.unwrap();
    let mut sub = client.subscribe("core.>").await.unwrap();
    client.flush().await.unwrap();
    let rig = sink("core", json!({"url": server.url(), "subject": "core.{id}"})).await;
    use futures_util::StreamExt;
    // Core NATS promises nothing to a subscription the server has not registered yet (the
    // client's flush does not wait for the server to process the SUB): publish until one
    // arrives, and check it is the one published.
    let mut published = Vec::new();
    let mut got = None;
    for i in 0..20 {
        let id = format!("c{i}");
        assert!(rig.send(vec![event(&id)]).await.is_delivered());
        published.push(format!("core.{id}"));
        if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
            got = Some(m);
            break;
        }
    }
    let m = got.expect("a core NATS subscriber sees what the sink published");
    assert!(
        published.iter().any(|s| s == m.subject.as_str()),
        "{} is not one of {published:?}",
        m.subject
    );
}

/// An event larger than the server's max_payload (1 MiB by default) can never be published:
/// it is rejected, not failed and retried for ever; the next one goes.
#[tokio::test]
async fn an_event_over_the_servers_max_payload_is_rejected_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let big = Event::new("big", "/s", "t").with_json(Bytes::from(format!(
        "{{\"pad\":\"{}\"}}",
        "x".repeat(1_100_000)
    )));
    let js = sink(
        "js-big",
        json!({"url": server.url(), "subject": "b.{id}",
        "jetstream": {"stream": "B", "create": {"subjects": ["b.>"]}}}),
    )
    .await;
    let core = sink(
        "core-big",
        json!({"url": server.url(), "subject": "c.{id}"}),
    )
    .await;
    for rig in [&js, &core] {
        let out = rig.send(vec![big.clone()]).await;
        assert_eq!(out.status, Status::Rejected, "{:?}", out.reason);
        assert!(
            out.reason.as_deref().unwrap_or("").contains("max payload"),
            "{:?}",
            out.reason
        );
        assert!(rig.send(vec![event("small")]).await.is_delivered());
    }
}

#[tokio::test]
async fn argo_eventbus_format() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let rig = sink(
        "argo-bus",
        json!({"url": server.url(), "format": "argo-eventbus"}),
    )
    .await;
    let mut e = Event::new("0f1e2d3c4b5a69788796a5b4c3d2e1f0", "webhook", "webhook")
        .with_subject("example");
    e = e.with_json(&br#"{"header":{},"body":{"k":1},"metadata":{}}"#[..]);
    assert!(rig.send(vec![e.clone()]).await.is_delivered());
    let msgs = stream_messages(&server.url(), "default").await;
    assert_eq!(msgs.len(), 1);
    let m = &msgs[0];
    assert_eq!(
        m.subject.as_str(),
        "default.webhook.example",
        "default.<eventSourceName>.<eventName>"
    );
    assert_eq!(
        m.headers.get("Nats-Msg-Id").map(|v| v.as_str()),
        Some("0f1e2d3c4b5a69788796a5b4c3d2e1f0"),
        "the CE id"
    );
    let body: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
    assert_eq!(body["specversion"], "1.0");
    assert_eq!(body["source"], "webhook");
    assert_eq!(body["subject"], "example");
    assert_eq!(
        body["data"]["body"],
        json!({"k": 1}),
        "data embedded as JSON, not base64"
    );
}

#[tokio::test]
async fn incompatible_existing_stream_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let client = async_nats::connect(server.url()).await.unwrap();
    jetstream::new(client)
        .create_stream(jetstream::stream::Config {
            name: "OLD".into(),
            subjects: vec!["old.>".into()],
            duplicate_window: Duration::from_secs(60),
            ..Default::default()
        })
        .await
        .unwrap();
    let cfg: NatsConfig = serde_json::from_value(json!({"url": server.url(),
        "jetstream": {"stream": "OLD", "create": {"subjects": ["events.>"], "duplicate_window": "10m"}}})).unwrap();
    let mut rig = SinkRig::new("incompat");
    let err = Box::new(cfg)
        .build(rig.context("incompat"))
        .await
        .err()
        .expect("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("incompatible")
            && msg.contains("events.>")
            && msg.contains("duplicate_window"),
        "{msg}"
    );
    // A missing stream without `create` is refused with what to do.
    let cfg: NatsConfig =
        serde_json::from_value(json!({"url": server.url(), "jetstream": {"stream": "NOPE"}}))
            .unwrap();
    let mut rig = SinkRig::new("missing");
    let err = Box::new(cfg)
        .build(rig.context("missing"))
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("set jetstream.create"), "{err}");
}

#[tokio::test]
async fn server_outage_fails_events_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_relayed(&dir.path().join("store"));
    let rig = sink(
        "outage",
        json!({"url": server.url(), "ack_timeout": "1s", "subject": "o.{id}",
        "jetstream": {"stream": "O", "create": {"subjects": ["o.>"]}}}),
    )
    .await;
    let mut acked = Vec::new();
    for i in 0..5 {
        let id = format!("before-{i}");
        assert!(rig.send(vec![event(&id)]).await.is_delivered());
        acked.push(id);
    }
    server.stop();
    let out = rig.send(vec![event("during")]).await;
    assert_eq!(
        out.status,
        Status::Failed,
        "never reported delivered while the server is down"
    );
    server.restart();
    // After the restart (file storage), everything acknowledged is there, and new events flow.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if rig.send(vec![event("after")]).await.is_delivered() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sink did not recover"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ids: Vec<String> = stream_messages(&server.direct_url(), "O")
        .await
        .iter()
        .map(|m| m.headers.get("ce-id").unwrap().as_str().to_owned())
        .collect();
    for id in &acked {
        assert!(
            ids.contains(id),
            "acknowledged {id} missing after the restart: {ids:?}"
        );
    }
    assert!(ids.contains(&"after".to_string()));
}

#[test]
fn config_errors_say_what_to_fix() {
    let bad = |v: serde_json::Value| {
        serde_json::from_value::<NatsConfig>(v)
            .unwrap()
            .validate("n")
            .unwrap_err()
    };
    assert!(bad(json!({"max_in_flight": 5000})).contains("between 1 and 4096"));
    assert!(bad(json!({"max_in_flight": 0})).contains("between 1 and 4096"));
    assert!(bad(json!({"subject": "events.>"})).contains("wildcards"));
    assert!(bad(json!({"subject": "events.{Bad}"})).contains("attribute name"));
    assert!(bad(json!({"auth": {"user": "u"}})).contains("user and password"));
    assert!(bad(json!({"auth": {"token": "t", "nkey": "k"}})).contains("exactly one"));
    assert!(bad(json!({"tls": {"cert": "c.pem"}})).contains("cert and key"));
    assert!(serde_json::from_value::<NatsConfig>(json!({"mode": "fancy"})).is_err());
}

/// The shared sink compliance check (`testkit::sink_compliance`) on JetStream.
#[tokio::test]
async fn jetstream_sink_compliance() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.url();
    let cfg = json!({"url": url, "subject": "events.{source}.{type}",
        "jetstream": {"stream": "COMPLIANCE", "create": {"subjects": ["events.>"]}}});
    let held_url = url.clone();
    sluice_core::testkit::sink_compliance::<NatsConfig>(
        "nats-compliance",
        cfg,
        json!({"url": url, "subject": "", "max_in_flight": 0}),
        json!({"url": format!("nats://127.0.0.1:{}", sluice_core::testkit::free_port()),
               "jetstream": {"stream": "COMPLIANCE"}}),
        move || {
            let url = held_url.clone();
            Box::pin(async move {
                stream_messages(&url, "COMPLIANCE")
                    .await
                    .into_iter()
                    .map(|m| m.payload.to_vec())
                    .collect()
            })
        },
    )
    .await;
}
