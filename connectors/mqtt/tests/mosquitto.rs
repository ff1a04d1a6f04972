//! The MQTT connectors against mosquitto: the one on 127.0.0.1:1883 (each test uses its own
//! topics and client ids) and brokers started here for restarts, behind a relay for drops.

use std::collections::BTreeSet;
use std::time::Duration;

use rumqttc::{AsyncClient, Event as MqttEvent, MqttOptions, Packet, QoS};
use serde_json::json;
use sluice_core::testkit::peers::{spawn_mosquitto, Relay};
use sluice_core::testkit::{
    self, assert_sink_telemetry, assert_source_telemetry, SinkRig, SourceRig,
};
use sluice_core::{Event, SinkConfig, SourceConfig, Status};
use sluice_mqtt::{MqttSinkConfig, MqttSourceConfig};

const URL: &str = "mqtt://127.0.0.1:1883";

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

async fn start_source(name: &str, cfg: serde_json::Value) -> (SourceRig, testkit::Task) {
    testkit::start_source::<MqttSourceConfig>(name, cfg).await
}

async fn start_sink(name: &str, cfg: serde_json::Value) -> SinkRig {
    testkit::start_sink::<MqttSinkConfig>(name, cfg).await
}

/// A test client that publishes (QoS 1, waiting for each PUBACK) and collects what it receives.
struct Peer {
    client: AsyncClient,
    rx: tokio::sync::mpsc::UnboundedReceiver<rumqttc::Publish>,
    acks: tokio::sync::mpsc::UnboundedReceiver<u16>,
}

async fn peer(port: u16) -> Peer {
    let mut o = MqttOptions::new(unique("peer"), "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(10));
    let (client, mut el) = AsyncClient::new(o, 1000);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (atx, acks) = tokio::sync::mpsc::unbounded_channel();
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut ready_tx = Some(ready_tx);
        loop {
            match el.poll().await {
                Ok(MqttEvent::Incoming(Packet::ConnAck(_))) => {
                    if let Some(r) = ready_tx.take() {
                        let _ = r.send(());
                    }
                }
                Ok(MqttEvent::Incoming(Packet::Publish(p))) => {
                    let _ = tx.send(p);
                }
                Ok(MqttEvent::Incoming(Packet::PubAck(a))) => {
                    let _ = atx.send(a.pkid);
                }
                Ok(MqttEvent::Incoming(Packet::SubAck(_))) => {
                    let _ = atx.send(0);
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(10), ready)
        .await
        .unwrap_or_else(|_| {
            panic!("mosquitto on 127.0.0.1:{port} is not reachable: scripts/test.sh starts it")
        })
        .unwrap();
    Peer { client, rx, acks }
}

impl Peer {
    async fn publish(&mut self, topic: &str, body: impl Into<Vec<u8>>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, body)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.acks.recv())
            .await
            .expect("PUBACK")
            .unwrap();
    }

    async fn subscribe(&mut self, topic: &str) {
        self.client
            .subscribe(topic, QoS::AtLeastOnce)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.acks.recv())
            .await
            .expect("SUBACK")
            .unwrap();
    }
}

fn body(e: &Event) -> String {
    String::from_utf8(e.data.as_bytes().unwrap().to_vec()).unwrap()
}

#[tokio::test]
async fn acknowledgements_follow_arrival_order_and_a_restart_gets_what_was_not_acknowledged() {
    order_and_restart(4).await;
}

#[tokio::test]
async fn mqtt5_acknowledgements_follow_arrival_order_and_the_session_outlives_a_restart() {
    order_and_restart(5).await;
}

/// PUBACK order = arrival order; a crash leaves the unacknowledged ones to the broker, which
/// resends them to the next instance (MQTT 5: only because the session is asked to outlive the
/// disconnect, `session_expiry`).
async fn order_and_restart(v: u8) {
    let topic = unique("devices");
    let client_id = unique("sluice");
    let cfg = json!({"url": URL, "topics": [format!("{topic}/+/telemetry")], "qos": 1, "client_id": client_id, "protocol_version": v});
    let mut p = peer(1883).await;
    let (mut rig, task) = start_source(&format!("mqtt{v}-order"), cfg.clone()).await;
    let mut cap = rig.capture();
    for i in 0..3 {
        p.publish(&format!("{topic}/d{i}/telemetry"), format!("m{i}"))
            .await;
    }
    let mut items = Vec::new();
    for _ in 0..3 {
        items.push(cap.next_within(Duration::from_secs(10)).await);
    }
    assert_eq!(
        items.iter().map(|i| body(&i.event)).collect::<Vec<_>>(),
        ["m0", "m1", "m2"]
    );
    assert_eq!(
        items[1].event.subject.as_deref(),
        Some(format!("{topic}/d1/telemetry").as_str())
    );
    // m2 and m1 are delivered, m0 is not: their PUBACKs must wait behind m0's.
    let m0 = items.remove(0);
    for i in items.into_iter().rev() {
        i.delivery.delivered();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    task.abort();
    let _ = task.await;
    drop(m0);
    // Same client id, persistent session: the broker resends all three.
    let (mut rig2, task2) = start_source(&format!("mqtt{v}-order-2"), cfg.clone()).await;
    let got = rig2.capture().auto(Status::Delivered);
    let events = got.wait_for(3).await;
    let bodies: BTreeSet<String> = events.iter().map(body).collect();
    assert_eq!(bodies, ["m0", "m1", "m2"].map(String::from).into());
    tokio::time::sleep(Duration::from_millis(300)).await;
    rig2.shutdown.cancel();
    task2.await.unwrap().unwrap();
    // All acknowledged now: a third start gets nothing again, but new messages.
    let (mut rig3, _task3) = start_source(&format!("mqtt{v}-order-3"), cfg).await;
    let got3 = rig3.capture().auto(Status::Delivered);
    p.publish(&format!("{topic}/d9/telemetry"), "m9").await;
    let events = got3.wait_for(1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        got3.events().iter().map(body).collect::<Vec<_>>(),
        ["m9"],
        "{events:?}"
    );
    assert_source_telemetry(&format!("mqtt{v}-order-3"), 1);
}

#[tokio::test]
async fn failed_deliveries_are_retried_and_hold_back_later_acknowledgements() {
    let topic = unique("retry");
    let mut p = peer(1883).await;
    let (mut rig, _task) = start_source(
        "mqtt-retry",
        json!({"url": URL, "topics": [topic], "client_id": unique("c")}),
    )
    .await;
    let mut cap = rig.capture();
    p.publish(&topic, "a").await;
    let first = cap.next_within(Duration::from_secs(10)).await;
    let id = first.event.id.clone();
    first.delivery.failed("down");
    let again = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(again.event.id, id, "a retry keeps the event id");
    again.delivery.delivered();
}

#[tokio::test]
async fn a_dropped_connection_and_a_broker_restart_lose_nothing() {
    drop_and_restart(4).await;
}

#[tokio::test]
async fn mqtt5_a_dropped_connection_and_a_broker_restart_lose_nothing() {
    drop_and_restart(5).await;
}

async fn drop_and_restart(v: u8) {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = spawn_mosquitto(dir.path(), None);
    let port = broker.port;
    let relay = Relay::new();
    relay.point_at(Some(port));
    let topic = "t/drop";
    let (mut rig, _task) = start_source(
        &format!("mqtt{v}-outage"),
        json!({"url": format!("mqtt://127.0.0.1:{}", relay.port), "topics": [topic], "client_id": "sluice-outage", "keep_alive": "5s", "protocol_version": v}),
    )
    .await;
    let got = rig.capture().auto(Status::Delivered);
    let mut p = peer(port).await;
    for i in 0..50 {
        p.publish(topic, format!("n{i}")).await;
    }
    got.wait_for(50).await;
    // The connection drops; what is published meanwhile waits in the persistent session.
    relay.cut();
    for i in 50..100 {
        p.publish(topic, format!("n{i}")).await;
    }
    got.wait_for(100).await;
    // The broker restarts (a clean stop saves its sessions) on the same port.
    broker.stop();
    broker = spawn_mosquitto(dir.path(), Some(port));
    let mut p = peer(port).await;
    for i in 100..150 {
        p.publish(topic, format!("n{i}")).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let seen: BTreeSet<String> = got.events().iter().map(body).collect();
        if seen.len() == 150 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of 150 distinct messages delivered",
            seen.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(broker);
}

#[tokio::test]
async fn structured_events_and_the_argo_shape() {
    let topic = unique("ce");
    let mut p = peer(1883).await;
    let (mut rig, _t) = start_source(
        "mqtt-ce",
        json!({"url": URL, "topics": [topic], "client_id": unique("c")}),
    )
    .await;
    let mut cap = rig.capture();
    let e = Event::new("ce-1", "/sensors", "com.example.reading").with_json(&b"{\"t\":21}"[..]);
    p.publish(&topic, sluice_core::format::encode_event(&e))
        .await;
    assert_eq!(
        cap.deliver_next().await,
        e,
        "taken as it is, not re-wrapped"
    );

    let topic2 = unique("argo");
    let (mut rig, _t) = start_source(
        "mqtt-argo",
        json!({"url": URL, "topics": [topic2], "client_id": unique("c"), "format": "argo", "json_body": true}),
    )
    .await;
    p.publish(&topic2, "{\"a\":1}").await;
    let e = rig.capture().deliver_next().await;
    assert_eq!(
        (e.ty.as_str(), e.subject.as_deref()),
        ("mqtt", Some("mqtt-argo"))
    );
    let d: serde_json::Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
    assert_eq!(d["topic"], topic2.as_str());
    assert_eq!(d["body"], json!({"a": 1}));
    assert!(d["messageId"].is_number());
}

/// rumqttc writes a string's length in two bytes without checking it: a 65 554-byte topic went
/// out with the length 18, and the broker published to the topic's first 18 bytes. An event's
/// subject could so escape the topic template. Such an event is refused; the next one goes.
#[tokio::test]
async fn a_topic_longer_than_mqtt_strings_is_refused_not_cut_short_on_the_wire() {
    for v in [4u8, 5] {
        let topic = unique("long");
        let mut sub = peer(1883).await;
        sub.subscribe(&format!("{topic}/#")).await;
        let rig = start_sink(
            &format!("mqtt{v}-long"),
            json!({"url": URL, "topic": format!("{topic}/{{subject}}/telemetry"), "qos": 1, "protocol_version": v}),
        )
        .await;
        let sneaky = format!("victim/cmd{}", "A".repeat(65_526));
        let e = Event::new("l-1", "/s", "t")
            .with_subject(sneaky)
            .with_json(&b"{}"[..]);
        let out = rig.send(vec![e]).await;
        assert_eq!(out.status, Status::Rejected, "v{v}: {:?}", out.reason);
        assert!(
            out.reason
                .as_deref()
                .unwrap_or("")
                .contains("at most 65535"),
            "{:?}",
            out.reason
        );
        let ok = Event::new("l-2", "/s", "t")
            .with_subject("dev1")
            .with_json(&b"{}"[..]);
        assert!(rig.send(vec![ok]).await.is_delivered(), "v{v}");
        let m = tokio::time::timeout(Duration::from_secs(5), sub.rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            m.topic,
            format!("{topic}/dev1/telemetry"),
            "v{v}: only the second event"
        );
    }
}

#[tokio::test]
async fn the_sink_counts_delivered_on_puback_and_fails_without_one() {
    let topic = unique("out");
    let mut sub = peer(1883).await;
    sub.subscribe(&format!("{topic}/#")).await;
    let rig = start_sink(
        "mqtt-sink",
        json!({"url": URL, "topic": format!("{topic}/{{type}}"), "qos": 1}),
    )
    .await;
    let e = Event::new("s-1", "/s", "created").with_json(&b"{}"[..]);
    let out = rig.send(vec![e.clone()]).await;
    assert_eq!(out.status, Status::Delivered, "{:?}", out.reason);
    let m = tokio::time::timeout(Duration::from_secs(5), sub.rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.topic, format!("{topic}/created"));
    assert_eq!(sluice_core::format::decode_event(&m.payload).unwrap(), e);
    let rig2 = start_sink(
        "mqtt-sink-2",
        json!({"url": URL, "topic": format!("{topic}/q2"), "qos": 2}),
    )
    .await;
    assert!(rig2.send(vec![e.clone()]).await.is_delivered());
    assert_sink_telemetry("mqtt-sink", 1, 0);

    // The broker stops answering (the connection is cut and not restored): no PUBACK, failed.
    let relay = Relay::new();
    relay.point_at(Some(1883));
    let rig3 = start_sink(
        "mqtt-sink-cut",
        json!({"url": format!("mqtt://127.0.0.1:{}", relay.port), "topic": topic, "timeout": "1s"}),
    )
    .await;
    relay.point_at(None);
    relay.cut();
    let out = tokio::time::timeout(Duration::from_secs(10), rig3.send(vec![e.clone()]))
        .await
        .expect("answered");
    assert_eq!(out.status, Status::Failed);
    // The broker is back: the sink connects again and delivers.
    relay.point_at(Some(1883));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if rig3.send(vec![e.clone()]).await.is_delivered() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sink did not reconnect"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn bad_config_is_refused_with_a_reason() {
    for (cfg, want) in [
        (json!({"topics": []}), "topics is empty"),
        (json!({"topics": ["a/#/b"]}), "whole last level"),
        (json!({"topics": ["a"], "qos": 3}), "qos 3"),
        (
            json!({"topics": ["a"], "qos": 2}),
            "qos 2 subscriptions are not supported",
        ),
        (json!({"topics": ["a"], "url": "mqtt://u:p@h"}), "auth:"),
        (json!({"topics": ["a"], "url": "mqtts://h"}), "tls.ca"),
    ] {
        let c: MqttSourceConfig = serde_json::from_value(cfg).unwrap();
        let e = c.validate("s").unwrap_err();
        assert!(e.contains(want), "{e}");
    }
    let c: MqttSinkConfig = serde_json::from_value(json!({"topic": "a/+"})).unwrap();
    assert!(c.validate("s").unwrap_err().contains("wildcards"));
}

#[tokio::test]
async fn a_backlog_far_larger_than_the_window_flows_through() {
    // The broker sends up to its in-flight limit (1000) at once into a window of 50: the
    // connection task must keep going (it also writes the acknowledgements) while the source
    // holds back.
    let dir = tempfile::tempdir().unwrap();
    let broker = spawn_mosquitto(dir.path(), None);
    let url = format!("mqtt://127.0.0.1:{}", broker.port);
    let cfg =
        json!({"url": url, "topics": ["b/#"], "client_id": "sluice-backlog", "max_in_flight": 50});
    // The session exists (subscribed once), then 3000 messages wait in it.
    let (rig0, task0) = start_source("mqtt-backlog-0", cfg.clone()).await;
    rig0.shutdown.cancel();
    task0.await.unwrap().unwrap();
    let mut p = peer(broker.port).await;
    for i in 0..3000 {
        p.client
            .publish("b/x", QoS::AtLeastOnce, false, format!("{i}"))
            .await
            .unwrap();
    }
    for _ in 0..3000 {
        tokio::time::timeout(Duration::from_secs(20), p.acks.recv())
            .await
            .expect("PUBACK")
            .unwrap();
    }
    let (mut rig, _task) = start_source("mqtt-backlog", cfg).await;
    let got = rig.capture().auto(Status::Delivered);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let seen: BTreeSet<String> = got.events().iter().map(body).collect();
        if seen.len() == 3000 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of 3000 delivered",
            seen.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_broker_past_its_in_flight_limit_is_held_back_not_buffered() {
    // A broker with no in-flight limit forwards every message as it comes (mosquitto 2.0 also
    // sent a persistent session's 400 000-message backlog at once with its limit at 1000).
    // While the sink holds every event, the source must stop reading, so that the messages
    // wait with the broker and in the socket buffers instead of in Sluice's memory; once the
    // sink settles, everything flows.
    let dir = tempfile::tempdir().unwrap();
    let broker = mosquitto_without_limits(dir.path());
    let url = format!("mqtt://127.0.0.1:{}", broker.port);
    let cfg =
        json!({"url": url, "topics": ["f/#"], "client_id": "sluice-flood", "max_in_flight": 50});
    let (mut rig, _task) = start_source("mqtt-flood", cfg).await;
    let capture = rig.capture();
    // 10 000 messages of 4 KiB (40 MB), which the broker forwards as they come: the window (50)
    // and the hand-off (64) take about 0.5 MB of them.
    const N: usize = 10_000;
    publish_4k(broker.port, "f/x", N).await;
    // Without backpressure the connection task read everything into an unbounded queue,
    // leaving the socket empty.
    held_back_then_delivered(broker.port, capture, N, 32 << 10).await;
}

#[tokio::test]
async fn a_topic_added_to_the_config_is_subscribed_over_a_kept_session() {
    // The source starts at CONNACK when the broker kept its session; the subscription it sends
    // again must still take effect (a filter added since the session was made).
    let (a, b) = (unique("kept-a"), unique("kept-b"));
    let client_id = unique("sluice-kept");
    let cfg1 = json!({"url": URL, "topics": [format!("{a}/#")], "client_id": client_id});
    let (rig1, task1) = start_source("mqtt-kept-1", cfg1).await;
    rig1.shutdown.cancel();
    task1.await.unwrap().unwrap();
    let mut p = peer(1883).await;
    p.publish(&format!("{a}/x"), "queued").await;
    let cfg2 =
        json!({"url": URL, "topics": [format!("{a}/#"), format!("{b}/#")], "client_id": client_id});
    let (mut rig2, task2) = start_source("mqtt-kept-2", cfg2).await;
    let got = rig2.capture().auto(Status::Delivered);
    got.wait_for(1).await;
    // The broker takes the new filter once it reads the SUBSCRIBE; publish until it routes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    while !got.events().iter().any(|e| body(e).starts_with("new-")) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing published to the added filter arrived: {:?}",
            got.events().iter().map(body).collect::<Vec<_>>()
        );
        p.publish(&format!("{b}/y"), format!("new-{n}")).await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(body(&got.events()[0]), "queued");
    rig2.shutdown.cancel();
    task2.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_session_backlog_is_held_back_while_the_source_subscribes_again() {
    // A persistent session's backlog comes right after CONNACK, ahead of the SUBACK of the
    // subscription a start sends again. The source used to keep all of it in memory until the
    // SUBACK arrived; it must wait in the broker and the socket instead, as once subscribed.
    let dir = tempfile::tempdir().unwrap();
    let broker = mosquitto_without_limits(dir.path());
    let url = format!("mqtt://127.0.0.1:{}", broker.port);
    let cfg =
        json!({"url": url, "topics": ["s/#"], "client_id": "sluice-session", "max_in_flight": 50});
    let (rig0, task0) = start_source("mqtt-session-0", cfg.clone()).await;
    rig0.shutdown.cancel();
    task0.await.unwrap().unwrap();
    // 10 000 messages of 4 KiB (40 MB) wait in the session.
    const N: usize = 10_000;
    publish_4k(broker.port, "s/x", N).await;
    let (mut rig, _task) = start_source("mqtt-session", cfg).await;
    let capture = rig.capture();
    // A fresh connection's receive buffer holds less than a long-used one's: about 29 KB of
    // these messages here, against 0 when the source read the backlog on.
    held_back_then_delivered(broker.port, capture, N, 16 << 10).await;
}

/// A mosquitto that forwards every message as it comes and queues any number for an offline
/// session: no in-flight or queue limit.
fn mosquitto_without_limits(dir: &std::path::Path) -> sluice_core::testkit::peers::ServerProcess {
    sluice_core::testkit::peers::spawn_mosquitto_with(
        dir,
        None,
        "max_inflight_messages 0\nmax_queued_messages 0\n",
    )
}

/// Publishes `n` messages of 4 KiB to `topic` (QoS 1) and waits for every PUBACK.
async fn publish_4k(port: u16, topic: &str, n: usize) {
    let mut p = peer(port).await;
    let body = vec![b'x'; 4096];
    for _ in 0..n {
        p.client
            .publish(topic, QoS::AtLeastOnce, false, body.clone())
            .await
            .unwrap();
    }
    for _ in 0..n {
        tokio::time::timeout(Duration::from_secs(20), p.acks.recv())
            .await
            .expect("PUBACK")
            .unwrap();
    }
}

/// The sink holds the window's 50 events: the source must stop reading, so that what the broker
/// sends then waits in the socket's receive queue (the kernel's, bounded; at least `min_queued`
/// bytes over five samples 100 ms apart), not in Sluice. Then the sink lets go: all `n`
/// messages arrive, each once.
async fn held_back_then_delivered(
    port: u16,
    mut capture: testkit::Capture,
    n: usize,
    min_queued: u64,
) {
    let mut held = Vec::new();
    while held.len() < 50 {
        held.push(
            capture
                .next_for("the window's events", Duration::from_secs(10))
                .await,
        );
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut full_samples = 0;
    while full_samples < 5 {
        let queued = receive_queue_towards(port);
        full_samples = if queued >= min_queued {
            full_samples + 1
        } else {
            0
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "{queued} bytes wait in the socket while the source holds 50 events: it read on"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for item in held {
        item.delivery.delivered();
    }
    let got = capture.auto(Status::Delivered);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while got.len() + 50 < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} delivered after the sink let go",
            got.len() + 50
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        got.len() + 50,
        n,
        "messages delivered twice: the connection was lost"
    );
}

/// The most bytes waiting unread in one of this machine's established TCP connections to
/// `port` on 127.0.0.1 (the client side, `/proc/net/tcp`).
fn receive_queue_towards(port: u16) -> u64 {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let remote = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // sl local_address rem_address st tx_queue:rx_queue …; 01 is ESTABLISHED.
            (f.len() > 4 && f[2] == remote && f[3] == "01").then(|| f[4])
        })
        .filter_map(|q| {
            q.split_once(':')
                .and_then(|(_, rx)| u64::from_str_radix(rx, 16).ok())
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn tls_with_client_certificates_both_ways() {
    use sluice_core::testkit::peers::spawn_server_on;
    let pki = sluice_core::testkit::pki();
    let dir = pki.dir.path().to_path_buf();
    // mosquitto, started as root, drops to its own user: it must be able to read these.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        for f in ["ca.pem", "server.pem", "server.key"] {
            std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
    let d = dir.clone();
    let broker = spawn_server_on("/usr/sbin/mosquitto", &dir, None, move |p| {
        let conf = d.join(format!("tls-{p}.conf"));
        std::fs::write(
            &conf,
            format!(
                "listener {p} 127.0.0.1\nallow_anonymous true\ncafile {0}/ca.pem\ncertfile {0}/server.pem\nkeyfile {0}/server.key\nrequire_certificate true\n",
                d.display()
            ),
        )
        .unwrap();
        vec!["-c".into(), conf.display().to_string()]
    });
    let url = format!("mqtts://localhost:{}", broker.port);
    let tls = json!({"ca": dir.join("ca.pem"), "cert": dir.join("client.pem"), "key": dir.join("client.key")});
    let topic = unique("tls");
    let (mut rig, _t) = start_source(
        "mqtt-tls-src",
        json!({"url": url, "topics": [topic], "client_id": unique("c"), "tls": tls}),
    )
    .await;
    let sink = start_sink(
        "mqtt-tls-sink",
        json!({"url": url, "topic": topic, "tls": tls}),
    )
    .await;
    let e = Event::new("tls-1", "/s", "t").with_json(&b"{\"secure\":true}"[..]);
    assert!(sink.send(vec![e.clone()]).await.is_delivered());
    assert_eq!(rig.capture().deliver_next().await, e);
    // Without a client certificate the broker refuses the connection: a clear build error.
    let cfg: MqttSourceConfig = serde_json::from_value(
        json!({"url": url, "topics": [topic], "client_id": unique("c"), "tls": {"ca": dir.join("ca.pem")}}),
    )
    .unwrap();
    let mut rig = SourceRig::new("mqtt-tls-nocert");
    let err = Box::new(cfg)
        .build(rig.context("mqtt-tls-nocert"))
        .await
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains("mqtt source mqtt-tls-nocert"),
        "{err}"
    );
}

#[tokio::test]
async fn passes_the_pull_source_compliance_check() {
    compliance(4).await;
}

#[tokio::test]
async fn mqtt5_passes_the_pull_source_compliance_check() {
    compliance(5).await;
}

async fn compliance(v: u8) {
    let topic = unique("compliance");
    let peer = std::sync::Arc::new(tokio::sync::Mutex::new(peer(1883).await));
    let (t, p) = (topic.clone(), peer.clone());
    let mut next = 0usize;
    sluice_core::testkit::pull_source_compliance::<MqttSourceConfig>(
        &format!("mqtt{v}-compliance"),
        json!({"url": URL, "topics": [topic], "client_id": unique("compliance"), "protocol_version": v}),
        json!({"url": URL, "topics": [topic], "qos": 2, "protocol_version": v}),
        move |k| {
            let (t, p, from) = (t.clone(), p.clone(), next);
            next += k;
            Box::pin(async move {
                let mut p = p.lock().await;
                for i in from..from + k {
                    p.publish(&t, format!("{i}")).await;
                }
            })
        },
    )
    .await;
}

/// MQTT 5 binary mode both ways: the sink writes the attributes as user properties and the
/// content type as the Content Type property; the source reads the same event back (and a
/// structured one too), and keeps user properties that are not attributes out of the event.
#[tokio::test]
async fn mqtt5_binary_cloudevents_cross_intact() {
    let topic = unique("ce5");
    let (mut rig, _task) = start_source(
        "mqtt5-ce",
        json!({"url": URL, "topics": [format!("{topic}/#")], "client_id": unique("c"), "protocol_version": 5}),
    )
    .await;
    let mut cap = rig.capture();
    let binary = start_sink(
        "mqtt5-sink-binary",
        json!({"url": URL, "topic": format!("{topic}/b/{{type}}"), "protocol_version": 5, "payload": "binary"}),
    )
    .await;
    let structured = start_sink(
        "mqtt5-sink-structured",
        json!({"url": URL, "topic": format!("{topic}/s"), "protocol_version": 5}),
    )
    .await;
    let mut e = Event::new("b-1", "/devices", "telemetry").with_json(&b"{\"t\":21.5}"[..]);
    e.subject = Some("d7".into());
    e.set_extension(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    );
    let o = binary.send(vec![e.clone()]).await;
    assert_eq!(o.status, Status::Delivered, "{o:?}");
    let got = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(*got.event, e, "binary mode: the same event");
    got.delivery.delivered();
    let s = Event::new("s-1", "/devices", "telemetry").with_json(&b"[1]"[..]);
    let o = structured.send(vec![s.clone()]).await;
    assert_eq!(o.status, Status::Delivered, "{o:?}");
    let got = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(*got.event, s, "structured mode: the same event");
    got.delivery.delivered();
    assert_sink_telemetry("mqtt5-sink-binary", 1, 0);

    // On the wire, seen by a plain MQTT 5 client.
    let mut o = rumqttc::v5::MqttOptions::new(unique("peer5"), "127.0.0.1", 1883);
    o.set_keep_alive(Duration::from_secs(10));
    let (client, mut el) = rumqttc::v5::AsyncClient::new(o, 100);
    client
        .subscribe(
            format!("{topic}/b/#"),
            rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        )
        .await
        .unwrap();
    let wire = tokio::spawn(async move {
        loop {
            if let Ok(rumqttc::v5::Event::Incoming(rumqttc::v5::mqttbytes::v5::Packet::Publish(
                p,
            ))) = el.poll().await
            {
                return p;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let o = binary
        .send(vec![
            Event::new("b-2", "/devices", "telemetry").with_json(&b"{}"[..])
        ])
        .await;
    assert_eq!(o.status, Status::Delivered);
    let p = tokio::time::timeout(Duration::from_secs(10), wire)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&p.topic),
        format!("{topic}/b/telemetry")
    );
    let props = p.properties.expect("MQTT 5 properties");
    assert_eq!(props.content_type.as_deref(), Some("application/json"));
    assert!(props
        .user_properties
        .contains(&("id".to_owned(), "b-2".to_owned())));
    assert!(props
        .user_properties
        .contains(&("specversion".to_owned(), "1.0".to_owned())));
    let again = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(again.event.id, "b-2");
    again.delivery.delivered();

    // User properties of the application's own stay out of the event.
    let mut o = rumqttc::v5::MqttOptions::new(unique("pub5"), "127.0.0.1", 1883);
    o.set_keep_alive(Duration::from_secs(10));
    let (client, mut el) = rumqttc::v5::AsyncClient::new(o, 100);
    tokio::spawn(async move { while el.poll().await.is_ok() {} });
    let props = rumqttc::v5::mqttbytes::v5::PublishProperties {
        content_type: Some("application/json".into()),
        user_properties: vec![
            ("specversion".into(), "1.0".into()),
            ("id".into(), "b-3".into()),
            ("source".into(), "/x".into()),
            ("type".into(), "t".into()),
            ("X-Tenant".into(), "acme".into()),
        ],
        ..Default::default()
    };
    client
        .publish_with_properties(
            format!("{topic}/p"),
            rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
            false,
            "{\"k\":1}",
            props,
        )
        .await
        .unwrap();
    let got = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(got.event.id, "b-3");
    assert!(
        got.event.extensions.is_empty(),
        "{:?}",
        got.event.extensions
    );
    got.delivery.delivered();
}

/// MQTT 5 reason codes: a broker that may not take a publish (mosquitto's ACL) says so in the
/// PUBACK (QoS 1) or PUBREC (QoS 2); the sink rejects the event instead of counting it delivered,
/// as an MQTT 3.1.1 sink must (3.1.1 has no negative acknowledgement).
#[tokio::test]
async fn mqtt5_a_refusing_broker_rejects_the_event() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777));
    }
    let program = if std::path::Path::new("/usr/sbin/mosquitto").exists() {
        "/usr/sbin/mosquitto"
    } else {
        "mosquitto"
    };
    let broker = sluice_core::testkit::peers::spawn_server(program, dir.path(), move |p| {
        let acl = d.join("acl");
        // Anonymous clients may publish under open/ only.
        std::fs::write(&acl, "topic readwrite open/#\n").unwrap();
        let conf = d.join(format!("mosquitto-{p}.conf"));
        std::fs::write(
            &conf,
            format!(
                "listener {p} 127.0.0.1\nallow_anonymous true\nacl_file {}\n",
                acl.display()
            ),
        )
        .unwrap();
        vec!["-c".into(), conf.display().to_string()]
    });
    let url = format!("mqtt://127.0.0.1:{}", broker.port);
    let e = Event::new("r-1", "/s", "t").with_json(&b"{}"[..]);
    for qos in [1, 2] {
        let allowed = start_sink(
            &format!("mqtt5-acl-ok-{qos}"),
            json!({"url": url, "topic": "open/x", "qos": qos, "protocol_version": 5}),
        )
        .await;
        let out = allowed.send(vec![e.clone()]).await;
        assert_eq!(out.status, Status::Delivered, "qos {qos}: {:?}", out.reason);
        let denied = start_sink(
            &format!("mqtt5-acl-denied-{qos}"),
            json!({"url": url, "topic": "closed/x", "qos": qos, "protocol_version": 5, "timeout": "5s"}),
        )
        .await;
        let out = denied.send(vec![e.clone()]).await;
        assert_eq!(out.status, Status::Rejected, "qos {qos}: {:?}", out.reason);
        assert!(
            out.reason
                .as_deref()
                .unwrap_or("")
                .contains("NotAuthorized"),
            "{:?}",
            out.reason
        );
    }
    drop(broker);
}

/// The shared sink compliance check (`testkit::sink_compliance`) on Mosquitto. The broker is
/// the peer; a subscriber reads what it took (its forwarding takes a moment after the PUBACK,
/// so each look waits until nothing more arrives for 300 ms).
#[tokio::test]
async fn the_sink_passes_the_sink_compliance_check() {
    let topic = unique("sink-compliance");
    let mut sub = peer(1883).await;
    sub.subscribe(&topic).await;
    let _client = sub.client.clone();
    let rx = std::sync::Arc::new(tokio::sync::Mutex::new(sub.rx));
    let got = std::sync::Arc::new(tokio::sync::Mutex::new(Vec::<Vec<u8>>::new()));
    testkit::sink_compliance::<MqttSinkConfig>(
        "mqtt-sink-compliance",
        json!({"url": URL, "topic": topic, "qos": 1}),
        json!({"url": URL, "topic": format!("{topic}/#")}),
        json!({"url": format!("mqtt://127.0.0.1:{}", testkit::free_port()), "topic": topic, "timeout": "1s"}),
        move || {
            let (rx, got) = (rx.clone(), got.clone());
            Box::pin(async move {
                let mut rx = rx.lock().await;
                let mut got = got.lock().await;
                while let Ok(Some(p)) =
                    tokio::time::timeout(Duration::from_millis(300), rx.recv()).await
                {
                    got.push(p.payload.to_vec());
                }
                got.clone()
            })
        },
    )
    .await;
}
