//! The AMQP connectors against the RabbitMQ on 127.0.0.1:5672 (each test declares its own
//! queues and exchanges); a connection drop goes through a relay the test cuts.

use std::collections::BTreeSet;
use std::time::Duration;

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use serde_json::json;
use sluice_amqp::{AmqpSinkConfig, AmqpSourceConfig};
use sluice_core::testkit::peers::Relay;
use sluice_core::testkit::{
    self, assert_sink_telemetry, assert_source_telemetry, metric, SinkRig, SourceRig,
};
use sluice_core::{Event, SinkConfig, SourceConfig, Status};

const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

async fn start_source(name: &str, cfg: serde_json::Value) -> (SourceRig, testkit::Task) {
    testkit::start_source::<AmqpSourceConfig>(name, cfg).await
}

async fn start_sink(name: &str, cfg: serde_json::Value) -> SinkRig {
    testkit::start_sink::<AmqpSinkConfig>(name, cfg).await
}

async fn channel() -> (Connection, Channel) {
    let conn = Connection::connect(URL, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| {
            panic!("RabbitMQ at {URL} is not reachable ({e}): scripts/test.sh starts it")
        });
    let ch = conn.create_channel().await.unwrap();
    (conn, ch)
}

async fn publish(ch: &Channel, exchange: &str, key: &str, body: &[u8], props: BasicProperties) {
    ch.basic_publish(
        exchange.into(),
        key.into(),
        BasicPublishOptions::default(),
        body,
        props,
    )
    .await
    .unwrap()
    .await
    .unwrap();
}

/// Declares `queue`, deleted with its last consumer when `auto_delete`.
async fn declare_queue(ch: &Channel, queue: &str, auto_delete: bool) {
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            auto_delete,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
}

/// Declares an auto-delete `queue` bound to `exchange` with `key`.
async fn bound_queue(ch: &Channel, queue: &str, exchange: &str, key: &str) {
    declare_queue(ch, queue, true).await;
    ch.queue_bind(
        queue.into(),
        exchange.into(),
        key.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
}

/// Messages ready in `queue` (not counting unacknowledged ones).
async fn ready(ch: &Channel, queue: &str) -> u32 {
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            passive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap()
    .message_count()
}

fn with_id(id: &str) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(id.into())
        .with_content_type("application/json".into())
}

#[tokio::test]
async fn acknowledged_after_delivery_retried_after_a_delay_and_rejected_to_the_dead_letter_exchange(
) {
    let (_conn, ch) = channel().await;
    let queue = unique("orders");
    let dlx = unique("dlx");
    let dead = unique("dead");
    ch.exchange_declare(
        dlx.as_str().into(),
        ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            auto_delete: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    bound_queue(&ch, &dead, &dlx, "").await;
    let exchange = unique("orders-x");
    let (mut rig, task) = start_source(
        "amqp-ack",
        json!({"url": URL, "queue": queue, "prefetch": 10, "retry_delay": "100ms",
               "declare": {"queue": {"durable": false, "arguments": {"x-dead-letter-exchange": dlx}},
                           "bindings": [{"exchange": exchange, "routing_key": "#"}]}}),
    )
    .await;
    let mut cap = rig.capture();
    for i in 0..4 {
        publish(
            &ch,
            &exchange,
            "order.created",
            format!("{{\"n\":{i}}}").as_bytes(),
            with_id(&format!("m-{i}")),
        )
        .await;
    }
    let first = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(first.event.id, "m-0", "message-id is the event id");
    assert_eq!(first.event.subject.as_deref(), Some("order.created"));
    assert_eq!(
        first.event.datacontenttype.as_deref(),
        Some("application/json")
    );
    first.delivery.failed("downstream down");
    let second = cap.next_within(Duration::from_secs(10)).await;
    second.delivery.rejected("schema says no");
    cap.deliver_next().await;
    cap.deliver_next().await;
    // The failed one comes back after the delay, flagged as a redelivery.
    let again = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(again.event.id, "m-0");
    again.delivery.delivered();
    // The rejected one went to the dead-letter exchange.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let got = loop {
        if let Some(m) = ch
            .basic_get(dead.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            break m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        got.delivery
            .properties
            .message_id()
            .as_ref()
            .unwrap()
            .as_str(),
        "m-1"
    );
    // Stop: everything was settled, so nothing is left in the queue.
    rig.shutdown.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(ready(&ch, &queue).await, 0);
    assert!(cap.try_next().is_none());
    ch.queue_delete(queue.as_str().into(), Default::default())
        .await
        .unwrap();
    assert_source_telemetry("amqp-ack", 5);
    assert!(
        metric(
            "sluice_source_redeliveries_total",
            &[("source", "amqp-ack")]
        ) >= 1.0
    );
    assert_eq!(
        metric(
            "sluice_source_settled_total",
            &[("source", "amqp-ack"), ("result", "reject")]
        ),
        1.0
    );
    assert_eq!(
        metric("sluice_source_reconnects_total", &[("source", "amqp-ack")]),
        0.0,
        "the channel stayed open"
    );
}

#[tokio::test]
async fn a_nack_or_reject_at_the_front_is_never_named_by_a_coalesced_ack() {
    // A nacked or rejected tag is gone from the broker; `basic.ack(multiple)` naming it would
    // make the broker close the channel (406 unknown delivery tag).
    let (_conn, ch) = channel().await;
    let queue = unique("front");
    let (mut rig, _task) = start_source(
        "amqp-front",
        json!({"url": URL, "queue": queue, "retry_delay": "50ms", "declare": {"queue": {"durable": false}}}),
    )
    .await;
    let mut cap = rig.capture();
    publish(&ch, "", &queue, b"1", with_id("f-1")).await;
    cap.next_within(Duration::from_secs(10))
        .await
        .delivery
        .rejected("no");
    publish(&ch, "", &queue, b"2", with_id("f-2")).await;
    cap.next_within(Duration::from_secs(10))
        .await
        .delivery
        .failed("later");
    let again = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(again.event.id, "f-2");
    again.delivery.delivered();
    publish(&ch, "", &queue, b"3", with_id("f-3")).await;
    assert_eq!(cap.deliver_next().await.id, "f-3");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        metric(
            "sluice_source_reconnects_total",
            &[("source", "amqp-front")]
        ),
        0.0,
        "the channel stayed open"
    );
    assert!(cap.try_next().is_none(), "nothing came twice");
    assert_eq!(ready(&ch, &queue).await, 0);
    ch.queue_delete(queue.as_str().into(), Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn messages_in_flight_when_the_source_dies_are_delivered_after_it_restarts() {
    let (_conn, ch) = channel().await;
    let queue = unique("jobs");
    declare_queue(&ch, &queue, false).await;
    for i in 0..5 {
        publish(&ch, "", &queue, b"{}", with_id(&format!("j-{i}"))).await;
    }
    let cfg = json!({"url": URL, "queue": queue, "prefetch": 10});
    let (mut rig, task) = start_source("amqp-kill", cfg.clone()).await;
    let mut cap = rig.capture();
    let one = cap.next_within(Duration::from_secs(10)).await;
    one.delivery.delivered();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(cap.next_within(Duration::from_secs(10)).await);
    }
    // Wait until the first one's ack reached the broker (it is gone for good), then die.
    tokio::time::sleep(Duration::from_millis(200)).await;
    task.abort();
    let _ = task.await;
    drop(held);
    let (mut rig2, _task2) = start_source("amqp-kill-2", cfg).await;
    let got = rig2.capture().auto(Status::Delivered);
    let events = got.wait_for(4).await;
    let ids: BTreeSet<String> = events.iter().map(|e| e.id.to_string()).collect();
    assert_eq!(ids, (1..5).map(|i| format!("j-{i}")).collect());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(got.len(), 4, "the acknowledged one is not delivered again");
    ch.queue_delete(queue.as_str().into(), Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_dropped_connection_is_reopened_and_nothing_is_lost() {
    let relay = Relay::new();
    relay.point_at(Some(5672));
    let via = format!("amqp://guest:guest@127.0.0.1:{}/%2f", relay.port);
    let (_conn, ch) = channel().await;
    let queue = unique("drop");
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let (mut rig, _task) = start_source(
        "amqp-drop",
        json!({"url": via, "queue": queue, "prefetch": 50}),
    )
    .await;
    let got = rig.capture().auto(Status::Delivered);
    for i in 0..100 {
        publish(&ch, "", &queue, b"x", with_id(&format!("d-{i}"))).await;
    }
    got.wait_for(50).await;
    relay.cut();
    for i in 100..200 {
        publish(&ch, "", &queue, b"x", with_id(&format!("d-{i}"))).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ids: BTreeSet<String> = got.events().iter().map(|e| e.id.to_string()).collect();
        if ids.len() == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of 200 distinct messages delivered",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while ready(&ch, &queue).await != 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ch.queue_delete(queue.as_str().into(), Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn the_sink_counts_a_message_delivered_only_on_the_brokers_confirm() {
    let (_conn, ch) = channel().await;
    let exchange = unique("events");
    let queue = unique("events-q");
    let rig = start_sink(
        "amqp-sink",
        json!({"url": URL, "exchange": exchange, "routing_key": "ev.{type}", "declare": {"type": "topic", "durable": false}}),
    )
    .await;
    bound_queue(&ch, &queue, &exchange, "ev.created").await;
    let mut e = Event::new("e-1", "/orders", "created")
        .with_subject("o/1")
        .with_json(&b"{\"total\":3}"[..]);
    e.set_extension(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    let out = rig.send(vec![e.clone()]).await;
    assert_eq!(out.status, Status::Delivered, "{:?}", out.reason);
    let m = ch
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("queued");
    let h = m.delivery.properties.headers().clone().unwrap();
    assert_eq!(
        h.inner().get("cloudEvents:id"),
        Some(&AMQPValue::LongString("e-1".into()))
    );
    assert_eq!(
        m.delivery
            .properties
            .content_type()
            .as_ref()
            .unwrap()
            .as_str(),
        "application/json"
    );
    assert_eq!(
        *m.delivery.properties.delivery_mode(),
        Some(2),
        "persistent"
    );
    assert_eq!(m.delivery.data, b"{\"total\":3}");
    // No queue bound for this routing key: returned (mandatory) = failed, not delivered.
    let out = rig
        .send(vec![Event::new("e-2", "/orders", "deleted")])
        .await;
    assert_eq!(out.status, Status::Failed);
    assert!(
        out.reason
            .as_deref()
            .unwrap_or("")
            .contains("no queue is bound"),
        "{:?}",
        out.reason
    );
    assert_sink_telemetry("amqp-sink", 1, 1);

    // Through the source again: the same event, not re-wrapped.
    let exchange2 = unique("ce");
    let sink2 = start_sink(
        "amqp-sink-2",
        json!({"url": URL, "exchange": exchange2, "declare": {}}),
    )
    .await;
    let q2 = unique("ce-q");
    let (mut src, _t) = start_source(
        "amqp-ce-src",
        json!({"url": URL, "queue": q2, "declare": {"queue": {"durable": false, "auto_delete": true}, "bindings": [{"exchange": exchange2}]}}),
    )
    .await;
    assert!(sink2.send(vec![e.clone()]).await.is_delivered());
    assert_eq!(src.capture().deliver_next().await, e);
}

#[tokio::test]
async fn argo_shape_and_plain_messages_without_an_id() {
    let (_conn, ch) = channel().await;
    let queue = unique("argo");
    let (mut rig, _t) = start_source(
        "amqp-argo",
        json!({"url": URL, "queue": queue, "format": "argo", "json_body": true, "metadata": {"k": "v"},
               "declare": {"queue": {"durable": false, "auto_delete": true}}}),
    )
    .await;
    let props = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_correlation_id("c-1".into())
        .with_timestamp(1_764_590_400);
    publish(&ch, "", &queue, b"{\"a\":1}", props).await;
    let e = rig.capture().deliver_next().await;
    assert_eq!(
        (e.ty.as_str(), e.subject.as_deref()),
        ("amqp", Some("amqp-argo"))
    );
    let d: serde_json::Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
    assert_eq!(d["body"], json!({"a": 1}));
    assert_eq!(d["correlationId"], "c-1");
    assert_eq!(d["routingKey"], queue.as_str());
    assert_eq!(d["exchange"], "");
    assert_eq!(d["timestamp"], "2025-12-01 12:00:00 +0000 UTC");
    assert_eq!(d["metadata"], json!({"k": "v"}));
}

#[tokio::test]
async fn a_queue_that_does_not_exist_is_a_clear_error() {
    let cfg: AmqpSourceConfig =
        serde_json::from_value(json!({"url": URL, "queue": unique("missing")})).unwrap();
    let mut rig = SourceRig::new("amqp-missing");
    let e = Box::new(cfg)
        .build(rig.context("amqp-missing"))
        .await
        .err()
        .expect("refused");
    assert!(e.to_string().contains("cannot consume queue"), "{e}");
}

#[test]
fn bad_config_is_refused_with_a_reason() {
    for (cfg, want) in [
        (json!({"queue": ""}), "queue must be"),
        (json!({"queue": "q", "prefetch": 0}), "prefetch"),
        (json!({"queue": "q", "url": "http://x"}), "not an AMQP URL"),
        (json!({"queue": "q", "retry_delay": "1ms"}), "retry_delay"),
    ] {
        let c: AmqpSourceConfig = serde_json::from_value(cfg).unwrap();
        let e = c.validate("s").unwrap_err();
        assert!(e.contains(want), "{e}");
    }
    let c: AmqpSinkConfig = serde_json::from_value(json!({"declare": {}})).unwrap();
    assert!(c.validate("s").unwrap_err().contains("exchange"));
    let e = serde_json::from_value::<AmqpSourceConfig>(json!({"queue": "q", "prefech": 1}))
        .unwrap_err();
    assert!(e.to_string().contains("unknown field"), "{e}");
}

#[tokio::test]
async fn passes_the_pull_source_compliance_check() {
    let (_conn, ch) = channel().await;
    let queue = unique("compliance");
    let (q, c2) = (queue.clone(), ch.clone());
    let mut next = 0usize;
    sluice_core::testkit::pull_source_compliance::<AmqpSourceConfig>(
        "amqp-compliance",
        json!({"url": URL, "queue": queue, "declare": {"queue": {"durable": false}}}),
        json!({"url": URL, "queue": queue, "prefetch": 0}),
        move |k| {
            let (q, ch, from) = (q.clone(), c2.clone(), next);
            next += k;
            Box::pin(async move {
                for i in from..from + k {
                    publish(
                        &ch,
                        "",
                        &q,
                        format!("{i}").as_bytes(),
                        with_id(&format!("c-{i}")),
                    )
                    .await;
                }
            })
        },
    )
    .await;
    ch.queue_delete(queue.as_str().into(), Default::default())
        .await
        .unwrap();
}

/// lapin hands deliveries over outside tokio's I/O, so a backlog of up to `prefetch` messages is
/// always ready: the source must still give the thread up now and then, or every other task on
/// it (the admin server's /metrics and /health, the sinks) waits (9 547 messages in one run
/// before the source spent tokio's budget).
#[tokio::test]
async fn a_backlog_does_not_keep_the_thread_from_other_tasks() {
    let (_conn, ch) = channel().await;
    let queue = unique("backlog");
    declare_queue(&ch, &queue, true).await;
    const N: usize = 20_000;
    let mut confirms = Vec::with_capacity(N);
    for i in 0..N {
        let sent = ch
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                b"{}",
                with_id(&format!("b-{i}")),
            )
            .await
            .unwrap();
        confirms.push(sent);
    }
    for c in confirms {
        c.await.unwrap();
    }
    let (mut rig, _task) = start_source(
        "amqp-backlog",
        json!({"url": URL, "queue": queue, "prefetch": 10000}),
    )
    .await;
    let got = rig.capture().auto(Status::Delivered);
    testkit::assert_yields_while_reading("amqp-backlog", N).await;
    got.wait_for(N).await;
}

/// The shared sink compliance check (`testkit::sink_compliance`) on RabbitMQ.
#[tokio::test]
async fn the_sink_passes_the_sink_compliance_check() {
    let (conn, ch) = channel().await;
    let queue = unique("sink-compliance");
    declare_queue(&ch, &queue, true).await;
    let got = std::sync::Arc::new(tokio::sync::Mutex::new(Vec::<Vec<u8>>::new()));
    let (ch, q, g) = (std::sync::Arc::new(ch), queue.clone(), got.clone());
    testkit::sink_compliance::<sluice_amqp::AmqpSinkConfig>(
        "amqp-sink-compliance",
        json!({"url": URL, "exchange": "", "routing_key": queue}),
        json!({"url": URL, "exchange": "", "routing_key": queue, "max_in_flight": 0}),
        json!({"url": format!("amqp://guest:guest@127.0.0.1:{}/%2f", testkit::free_port()),
            "exchange": "", "routing_key": queue}),
        move || {
            let (ch, q, g) = (ch.clone(), q.clone(), g.clone());
            Box::pin(async move {
                let mut got = g.lock().await;
                while let Some(m) = ch
                    .basic_get(q.as_str().into(), BasicGetOptions { no_ack: true })
                    .await
                    .unwrap()
                {
                    got.push(m.delivery.data.clone());
                }
                got.clone()
            })
        },
    )
    .await;
    drop(conn);
}
