//! The `jetstream` and `nats` sources against real nats-server processes started here on free
//! ports: acknowledgement only after delivery, redelivery after a failure, progress acks for a
//! slow sink, the binding read back, a server outage, drain on shutdown.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use async_nats::HeaderMap;
use bytes::Bytes;
use common::Server;
use serde_json::json;
use sluice_core::testkit::{assert_source_telemetry, metric, SourceRig};
use sluice_core::{Event, SourceConfig};
use sluice_nats::{JetStreamSourceConfig, NatsSourceConfig};

async fn js_at(url: &str) -> jetstream::Context {
    jetstream::new(async_nats::connect(url).await.unwrap())
}

async fn make_stream(url: &str, name: &str, subjects: &[&str]) -> jetstream::Context {
    let js = js_at(url).await;
    js.create_stream(stream::Config {
        name: name.into(),
        subjects: subjects.iter().map(|s| s.to_string()).collect(),
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .unwrap();
    js
}

async fn publish(js: &jetstream::Context, subject: &str, n: usize, tag: &str) {
    for i in 0..n {
        js.publish(
            subject.to_owned(),
            Bytes::from(format!("{{\"{tag}\":{i}}}")),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
}

/// Builds and starts a source; returns the rig (capture not taken yet) and its task.
async fn start<C: SourceConfig>(
    name: &str,
    cfg: serde_json::Value,
    rig: &mut SourceRig,
) -> tokio::task::JoinHandle<Result<(), sluice_core::ConnectorError>> {
    let cfg: C = serde_json::from_value(cfg).unwrap();
    cfg.validate(name).expect("valid config");
    let running = Box::new(cfg)
        .build(rig.context(name))
        .await
        .expect("builds");
    tokio::spawn(running)
}

async fn consumer_info(js: &jetstream::Context, stream: &str, name: &str) -> consumer::Info {
    let mut c: consumer::PullConsumer = js
        .get_stream(stream)
        .await
        .unwrap()
        .get_consumer(name)
        .await
        .unwrap();
    c.info().await.unwrap().clone()
}

/// Waits until the consumer has nothing pending and nothing unacknowledged.
async fn wait_settled(js: &jetstream::Context, stream: &str, name: &str) -> consumer::Info {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let info = consumer_info(js, stream, name).await;
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            return info;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "consumer never settled: ack_pending {} pending {}",
            info.num_ack_pending,
            info.num_pending
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn jetstream_acks_after_delivery_and_redelivers_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let js = make_stream(&server.url(), "ORDERS", &["orders.>"]).await;
    publish(&js, "orders.created", 5, "n").await;

    let mut rig = SourceRig::new("js-ack");
    let task = start::<JetStreamSourceConfig>(
        "js-ack",
        json!({"url": server.url(), "stream": "ORDERS", "filter_subjects": ["orders.>"], "ack_wait": "5s"}),
        &mut rig,
    )
    .await;
    let mut cap = rig.capture();
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(cap.next_within(Duration::from_secs(10)).await);
    }
    // Plain messages: id from the stream sequence, the subject, JSON data, the stored time.
    let e = &held[0].event;
    assert_eq!(
        (e.id.as_str(), e.ty.as_str(), e.source.as_str()),
        ("ORDERS-1", "jetstream", "js-ack")
    );
    assert_eq!(e.subject.as_deref(), Some("orders.created"));
    assert_eq!(e.data.as_bytes().unwrap().as_ref(), br#"{"n":0}"#);
    assert!(e.time.is_some());
    // Nothing is acknowledged while the sinks hold the events.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        consumer_info(&js, "ORDERS", "js-ack").await.num_ack_pending,
        5
    );

    // Deliver four, fail the second: JetStream redelivers that one (after the nak's backoff).
    let mut it = held.into_iter();
    it.next().unwrap().delivery.delivered();
    let failed = it.next().unwrap();
    let failed_id = failed.event.id.clone();
    failed.delivery.failed("test: sink down");
    for item in it {
        item.delivery.delivered();
    }
    let again = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(
        again.event.id, failed_id,
        "the failed event comes back, the same id"
    );
    again.delivery.delivered();
    let info = wait_settled(&js, "ORDERS", "js-ack").await;
    assert_eq!(info.delivered.stream_sequence, 5);
    assert!(cap.try_next().is_none(), "nothing delivered is redelivered");
    assert_source_telemetry("js-ack", 6);
    assert_eq!(
        metric("sluice_source_redeliveries_total", &[("source", "js-ack")]),
        1.0
    );
    assert_eq!(
        metric(
            "sluice_source_settled_total",
            &[("source", "js-ack"), ("result", "retry")]
        ),
        1.0
    );

    // Drain on shutdown: an event in flight is still acknowledged once delivered.
    publish(&js, "orders.created", 1, "last").await;
    let last = cap.next_within(Duration::from_secs(10)).await;
    rig.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!task.is_finished(), "waits for what is in flight");
    last.delivery.delivered();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("returns after the drain")
        .unwrap()
        .unwrap();
    wait_settled(&js, "ORDERS", "js-ack").await;
}

#[tokio::test]
async fn jetstream_progress_acks_keep_a_slow_event_from_redelivery() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let js = make_stream(&server.url(), "SLOW", &["slow"]).await;
    publish(&js, "slow", 1, "s").await;
    let mut rig = SourceRig::new("js-slow");
    let _task = start::<JetStreamSourceConfig>(
        "js-slow",
        json!({"url": server.url(), "stream": "SLOW", "ack_wait": "1s"}),
        &mut rig,
    )
    .await;
    let mut cap = rig.capture();
    let item = cap.next_within(Duration::from_secs(10)).await;
    // Three times ack_wait with the event held: no second copy arrives.
    cap.assert_quiet(Duration::from_secs(3), "redelivered while in flight")
        .await;
    assert_eq!(
        consumer_info(&js, "SLOW", "js-slow").await.num_redelivered,
        0
    );
    assert!(
        metric(
            "sluice_source_lease_extensions_total",
            &[("source", "js-slow")]
        ) >= 2.0,
        "progress acks sent"
    );
    item.delivery.delivered();
    wait_settled(&js, "SLOW", "js-slow").await;
}

#[tokio::test]
async fn jetstream_window_bounds_what_is_in_flight_and_rejects_terminate() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let js = make_stream(&server.url(), "WIN", &["win"]).await;
    publish(&js, "win", 20, "w").await;
    let mut rig = SourceRig::new("js-win");
    let _task = start::<JetStreamSourceConfig>(
        "js-win",
        json!({"url": server.url(), "stream": "WIN", "max_in_flight": 4}),
        &mut rig,
    )
    .await;
    let mut cap = rig.capture();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(cap.next_within(Duration::from_secs(10)).await);
    }
    cap.assert_quiet(
        Duration::from_millis(300),
        "the window of 4 is full: no fifth event",
    )
    .await;
    assert_eq!(consumer_info(&js, "WIN", "js-win").await.num_ack_pending, 4);
    // A rejection terminates the message: it is not redelivered.
    let rejected = held.remove(0);
    let rejected_id = rejected.event.id.clone();
    rejected.delivery.rejected("test: malformed for this sink");
    for h in held {
        h.delivery.delivered();
    }
    let mut seen = BTreeSet::new();
    for _ in 0..16 {
        let item = cap.next_within(Duration::from_secs(10)).await;
        seen.insert(item.event.id.clone());
        item.delivery.delivered();
    }
    assert!(!seen.contains(&rejected_id));
    assert_eq!(seen.len(), 16);
    wait_settled(&js, "WIN", "js-win").await;
    cap.assert_quiet(
        Duration::from_millis(300),
        "the terminated message is not redelivered",
    )
    .await;
}

#[tokio::test]
async fn jetstream_reads_the_binding_and_argo_eventbus() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let js = make_stream(&server.url(), "CE", &["ce.>"]).await;
    // Binary mode as the nats sink writes it (percent-encoded values), and structured mode.
    let mut h = HeaderMap::new();
    h.insert("Nats-Msg-Id", "x");
    h.insert("ce-specversion", "1.0");
    h.insert("ce-id", "order-1");
    h.insert("ce-source", "/orders%2520api");
    h.insert("ce-type", "com.example.created");
    h.insert(
        "ce-traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    h.insert("Content-Type", "application/json");
    js.publish_with_headers("ce.bin", h, Bytes::from_static(b"{\"a\":1}"))
        .await
        .unwrap()
        .await
        .unwrap();
    let mut s = HeaderMap::new();
    s.insert("Content-Type", "application/cloudevents+json");
    js.publish_with_headers(
        "ce.str",
        s,
        Bytes::from_static(
            br#"{"specversion":"1.0","id":"order-2","source":"/o","type":"t","data":{"b":2}}"#,
        ),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    // Malformed: ce-specversion without the rest. Terminated, counted.
    let mut bad = HeaderMap::new();
    bad.insert("ce-specversion", "1.0");
    js.publish_with_headers("ce.bad", bad, Bytes::new())
        .await
        .unwrap()
        .await
        .unwrap();

    let mut rig = SourceRig::new("js-ce");
    let _t = start::<JetStreamSourceConfig>(
        "js-ce",
        json!({"url": server.url(), "stream": "CE"}),
        &mut rig,
    )
    .await;
    let mut cap = rig.capture();
    let a = cap.deliver_next().await;
    assert_eq!(
        (a.id.as_str(), a.source.as_str(), a.ty.as_str()),
        ("order-1", "/orders%20api", "com.example.created")
    );
    assert!(a.extension("traceparent").is_some());
    assert_eq!(a.data.as_bytes().unwrap().as_ref(), b"{\"a\":1}");
    let b = cap.deliver_next().await;
    assert_eq!((b.id.as_str(), b.source.as_str()), ("order-2", "/o"));
    wait_settled(&js, "CE", "js-ce").await;
    assert_eq!(
        metric(
            "sluice_events_rejected_total",
            &[("source", "js-ce"), ("reason", "invalid_event")]
        ),
        1.0
    );

    // Argo's EventBus: stream `default`, subjects default.<eventsource>.<event>, structured JSON
    // without a content type.
    let argo = make_stream(&server.url(), "default", &["default.*.*"]).await;
    argo.publish(
        "default.webhook-es.example",
        Bytes::from_static(br#"{"specversion":"1.0","id":"3f2a","source":"webhook-es","subject":"example","type":"webhook","datacontenttype":"application/json","data":{"body":{"x":1}}}"#),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let mut rig = SourceRig::new("argo-bus");
    let _t = start::<JetStreamSourceConfig>(
        "argo-bus",
        json!({"url": server.url(), "format": "argo-eventbus", "consumer": "sluice"}),
        &mut rig,
    )
    .await;
    let e = rig.capture().deliver_next().await;
    assert_eq!(
        (e.id.as_str(), e.source.as_str(), e.subject.as_deref()),
        ("3f2a", "webhook-es", Some("example"))
    );
}

#[tokio::test]
async fn jetstream_consumer_mismatch_and_missing_stream_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let js = make_stream(&server.url(), "M", &["m"]).await;
    js.get_stream("M")
        .await
        .unwrap()
        .create_consumer(consumer::pull::Config {
            durable_name: Some("legacy".into()),
            ack_policy: consumer::AckPolicy::All,
            max_ack_pending: 50,
            ..Default::default()
        })
        .await
        .unwrap();
    let build = |cfg: serde_json::Value| {
        let mut rig = SourceRig::new("mm");
        async move {
            let cfg: JetStreamSourceConfig = serde_json::from_value(cfg).unwrap();
            match Box::new(cfg).build(rig.context("mm")).await {
                Ok(_) => panic!("built"),
                Err(e) => e.to_string(),
            }
        }
    };
    let e = build(json!({"url": server.url(), "stream": "M", "consumer": "legacy"})).await;
    assert!(
        e.starts_with(
            "jetstream source mm: consumer legacy on stream M exists with other settings"
        ),
        "{e}"
    );
    assert!(
        e.contains("ack_policy") && e.contains("max_ack_pending is 50"),
        "{e}"
    );
    let e =
        build(json!({"url": server.url(), "stream": "M", "consumer": "absent", "create": false}))
            .await;
    assert!(e.contains("set create: true"), "{e}");
    let e = build(json!({"url": server.url(), "stream": "NOPE"})).await;
    assert!(e.contains("stream NOPE is not available"), "{e}");

    let bad = |v: serde_json::Value| {
        serde_json::from_value::<JetStreamSourceConfig>(v)
            .unwrap()
            .validate("x")
            .unwrap_err()
    };
    assert!(bad(json!({})).contains("stream is required"));
    assert!(bad(json!({"stream": "a.b"})).contains("not a valid JetStream name"));
    assert!(bad(json!({"stream": "s", "max_in_flight": 0})).contains("max_in_flight"));
    assert!(bad(json!({"stream": "s", "ack_wait": "10ms"})).contains("ack_wait"));
    assert!(bad(json!({"stream": "s", "source": "not a uri"})).contains("type or source"));
}

#[tokio::test]
async fn jetstream_server_outage_mid_stream_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_relayed(&dir.path().join("store"));
    let js = make_stream(&server.direct_url(), "OUT", &["out"]).await;
    publish(&js, "out", 50, "before").await;
    let mut rig = SourceRig::new("js-out");
    let _t = start::<JetStreamSourceConfig>(
        "js-out",
        json!({"url": server.url(), "stream": "OUT", "ack_wait": "2s", "max_in_flight": 10}),
        &mut rig,
    )
    .await;
    let got = rig.capture().auto(sluice_core::Status::Delivered);
    got.wait_for(10).await;
    server.restart();
    let js = js_at(&server.direct_url()).await;
    publish(&js, "out", 50, "after").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ids: BTreeSet<String> = got
            .events()
            .into_iter()
            .map(|e: Event| e.id.into())
            .collect();
        if ids.len() == 100 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of 100 distinct events after the outage",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_settled(&js, "OUT", "js-out").await;
}

#[tokio::test]
async fn core_nats_subscription_with_a_queue_group() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut rig = SourceRig::new("live");
    let task = start::<NatsSourceConfig>(
        "live",
        json!({"url": server.url(), "subject": "sensors.>", "queue_group": "sluice"}),
        &mut rig,
    )
    .await;
    let got = rig.capture().auto(sluice_core::Status::Delivered);
    let client = async_nats::connect(server.url()).await.unwrap();
    for i in 0..10 {
        client
            .publish(format!("sensors.t{i}"), Bytes::from(format!("{i}")))
            .await
            .unwrap();
    }
    let mut h = HeaderMap::new();
    h.insert("Nats-Msg-Id", "reading-1");
    client
        .publish_with_headers("sensors.x", h.clone(), Bytes::from_static(b"1"))
        .await
        .unwrap();
    // The same Nats-Msg-Id again: deduplicated.
    client
        .publish_with_headers("sensors.x", h, Bytes::from_static(b"1"))
        .await
        .unwrap();
    client.flush().await.unwrap();
    let events = got.wait_for(11).await;
    assert_eq!(events[0].subject.as_deref(), Some("sensors.t0"));
    assert_eq!(events[0].ty, "nats");
    assert!(events.iter().any(|e| e.id == "reading-1"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(got.len(), 11, "the repeated Nats-Msg-Id was deduplicated");
    rig.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn core_nats_argo_shape() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut rig = SourceRig::new("argo-nats");
    let _t = start::<NatsSourceConfig>(
        "argo-nats",
        json!({"url": server.url(), "subject": "foo", "format": "argo", "json_body": true, "metadata": {"k": "v"}}),
        &mut rig,
    )
    .await;
    let mut cap = rig.capture();
    let client = async_nats::connect(server.url()).await.unwrap();
    client
        .publish("foo", Bytes::from_static(b"{\"a\":1}"))
        .await
        .unwrap();
    client.flush().await.unwrap();
    let e = cap.deliver_next().await;
    assert_eq!(
        (e.ty.as_str(), e.subject.as_deref()),
        ("nats", Some("argo-nats"))
    );
    let data: serde_json::Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
    assert_eq!(
        data,
        json!({"subject": "foo", "body": {"a": 1}, "metadata": {"k": "v"}})
    );
}

#[tokio::test]
async fn jetstream_passes_the_pull_source_compliance_check() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.url();
    let js = make_stream(&url, "COMPLY", &["comply.>"]).await;
    let mut next = 0usize;
    sluice_core::testkit::pull_source_compliance::<JetStreamSourceConfig>(
        "js-compliance",
        json!({"url": url, "stream": "COMPLY", "consumer": "comply", "ack_wait": "1s"}),
        json!({"url": url, "stream": "COMPLY", "max_in_flight": 0}),
        move |k| {
            let (js, from) = (js.clone(), next);
            next += k;
            Box::pin(async move {
                for i in from..from + k {
                    js.publish("comply.x", Bytes::from(format!("{i}")))
                        .await
                        .unwrap()
                        .await
                        .unwrap();
                }
            })
        },
    )
    .await;
}
