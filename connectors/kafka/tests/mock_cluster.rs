//! The Kafka sink against librdkafka's mock cluster: real Kafka protocol on real sockets, with
//! fault injection (broker down, produce errors).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sluice_core::testkit::{self, SinkRig};
use sluice_core::{Event, SinkConfig, Status};
use sluice_kafka::KafkaConfig;

/// A consumed record.
#[derive(Debug)]
struct Got {
    partition: i32,
    offset: i64,
    key: Option<String>,
    headers: HashMap<String, String>,
    payload: Option<Vec<u8>>,
}

fn cluster(brokers: i32) -> MockCluster<'static, DefaultProducerContext> {
    MockCluster::new(brokers).expect("librdkafka mock cluster")
}

/// Reads every record of `topic` (all partitions, from the beginning) until `n` arrived or
/// `wait` passed.
fn consume(bootstrap: &str, topic: &str, partitions: i32, n: usize, wait: Duration) -> Vec<Got> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "sluice-test")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + wait;
    while out.len() < n && Instant::now() < deadline {
        let Some(m) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m.unwrap();
        let mut headers = HashMap::new();
        if let Some(h) = m.headers() {
            for h in h.iter() {
                headers.insert(
                    h.key.to_owned(),
                    String::from_utf8(h.value.unwrap_or_default().to_vec()).unwrap(),
                );
            }
        }
        out.push(Got {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(|k| String::from_utf8(k.to_vec()).unwrap()),
            headers,
            payload: m.payload().map(<[u8]>::to_vec),
        });
    }
    out
}

fn config(json: serde_json::Value) -> KafkaConfig {
    let cfg: KafkaConfig = serde_json::from_value(json).unwrap();
    cfg.validate("k").unwrap();
    cfg
}

async fn start(name: &str, cfg: KafkaConfig) -> SinkRig {
    let mut rig = SinkRig::new(name);
    let running = Box::new(cfg).build(rig.context(name)).await.unwrap();
    tokio::spawn(running);
    rig
}

fn event(id: &str) -> Event {
    Event::new(id, "/orders", "com.example.order")
        .with_subject("o-1")
        .with_json(Bytes::from(format!("{{\"id\":\"{id}\"}}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_records_carry_ce_headers_key_and_data() {
    let c = cluster(1);
    c.create_topic("events.com.example.order", 3, 1).unwrap();
    let cfg = config(serde_json::json!({
        "brokers": c.bootstrap_servers(),
        "topic": "events.{type}",
        "compression": "zstd",
    }));
    let rig = start("kafka-binary", cfg).await;
    let mut e = event("b-1");
    e.set_extension("partitionkey", "customer-7");
    assert!(rig.send(vec![e]).await.is_delivered());
    // No partitionkey: no key.
    assert!(rig.send(vec![event("b-2")]).await.is_delivered());
    let got = consume(
        &c.bootstrap_servers(),
        "events.com.example.order",
        3,
        2,
        Duration::from_secs(10),
    );
    assert_eq!(got.len(), 2, "{got:?}");
    let first = got.iter().find(|g| g.headers["ce_id"] == "b-1").unwrap();
    assert_eq!(first.key.as_deref(), Some("customer-7"));
    assert_eq!(first.headers["ce_specversion"], "1.0");
    assert_eq!(first.headers["ce_source"], "/orders");
    assert_eq!(first.headers["ce_type"], "com.example.order");
    assert_eq!(first.headers["ce_subject"], "o-1");
    assert_eq!(first.headers["ce_partitionkey"], "customer-7");
    assert_eq!(first.headers["content-type"], "application/json");
    assert_eq!(first.payload.as_deref(), Some(&br#"{"id":"b-1"}"#[..]));
    // The record decodes back to the same event with the core Kafka binding.
    let headers: Vec<(&str, &[u8])> = first
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_bytes()))
        .collect();
    let back = sluice_core::kafka_binding::decode(&headers, first.payload.clone().map(Bytes::from))
        .unwrap();
    assert_eq!(back.id, "b-1");
    assert_eq!(
        back.extension("partitionkey").unwrap().to_canonical(),
        "customer-7"
    );
    let second = got.iter().find(|g| g.headers["ce_id"] == "b-2").unwrap();
    assert_eq!(second.key, None);
    testkit::assert_sink_telemetry("kafka-binary", 2, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_mode_key_template_and_topic_sanitizing() {
    let c = cluster(1);
    c.create_topic("ev.com_example_x_y", 1, 1).unwrap();
    let cfg = config(serde_json::json!({
        "brokers": c.bootstrap_servers(),
        "topic": "ev.{type}",
        "mode": "structured",
        "key": "{source}/{subject}",
        "properties": { "linger.ms": 1, "batch.num.messages": 500 },
    }));
    let rig = start("kafka-structured", cfg).await;
    let e = Event::new("s-1", "/src", "com/example x:y").with_subject("sub");
    assert!(rig.send(vec![e.clone()]).await.is_delivered());
    let got = consume(
        &c.bootstrap_servers(),
        "ev.com_example_x_y",
        1,
        1,
        Duration::from_secs(10),
    );
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key.as_deref(), Some("/src/sub"));
    assert_eq!(
        got[0].headers["content-type"],
        "application/cloudevents+json"
    );
    let back =
        sluice_core::format::decode_event(&Bytes::from(got[0].payload.clone().unwrap())).unwrap();
    assert_eq!(back, e);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_produce_requests_leave_no_duplicates() {
    let c = cluster(1);
    c.create_topic("idem", 1, 1).unwrap();
    let cfg = config(serde_json::json!({
        "brokers": c.bootstrap_servers(),
        "topic": "idem",
        "properties": { "retry.backoff.ms": 10 },
    }));
    let rig = start("kafka-idem", cfg).await;
    // The next produce requests fail with retriable errors; the idempotent producer retries
    // them with the same sequence numbers.
    c.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        ],
    );
    let mut pending = Vec::new();
    for i in 0..200 {
        pending.push(rig.sender().send(vec![event(&format!("i-{i}"))]).await);
    }
    for p in pending {
        let out = p.await;
        assert!(out.is_delivered(), "{out:?}");
    }
    let got = consume(
        &c.bootstrap_servers(),
        "idem",
        1,
        201,
        Duration::from_secs(5),
    );
    let ids: Vec<&str> = got.iter().map(|g| g.headers["ce_id"].as_str()).collect();
    assert_eq!(ids.len(), 200, "exactly one record per event");
    // And in order: idempotence keeps the order through retries.
    let want: Vec<String> = (0..200).map(|i| format!("i-{i}")).collect();
    assert_eq!(ids, want);
    assert!(got
        .windows(2)
        .all(|w| w[1].offset == w[0].offset + 1 && w[0].partition == 0));
    // The injected errors were hit, by the sink's produce requests: the mock hands out one per
    // Produce request, and none is left. A probe that does not retry would get any left over.
    assert_eq!(
        produce_once_without_retries(&c.bootstrap_servers(), "idem").await,
        Ok(()),
        "an injected produce error was still pending: the sink's requests never hit it"
    );
}

/// One record produced with no retries and no idempotence: the broker's first answer.
async fn produce_once_without_retries(bootstrap: &str, topic: &str) -> Result<(), String> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let probe: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "false")
        .set("acks", "all")
        .set("message.send.max.retries", "0")
        .create()
        .unwrap();
    probe
        .send(
            FutureRecord::to(topic).key("probe").payload("probe"),
            Duration::from_secs(10),
        )
        .await
        .map(drop)
        .map_err(|(e, _)| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_loses_nothing_and_reports_nothing_early() {
    let c = cluster(1);
    c.create_topic("outage", 1, 1).unwrap();
    let cfg = config(serde_json::json!({
        "brokers": c.bootstrap_servers(),
        "topic": "outage",
        "message_timeout": "20s",
        "properties": { "reconnect.backoff.max.ms": 100 },
    }));
    let rig = start("kafka-outage", cfg).await;
    assert!(rig.send(vec![event("before")]).await.is_delivered());
    c.broker_down(1).unwrap();
    let mut pending = Vec::new();
    for i in 0..20 {
        pending.push(rig.sender().send(vec![event(&format!("during-{i}"))]).await);
    }
    // While the broker is down, nothing is reported delivered.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut pending: Vec<_> = pending.into_iter().map(Box::pin).collect();
    for p in &mut pending {
        assert!(
            futures_util::poll!(p.as_mut()).is_pending(),
            "an event was settled while the broker was down"
        );
    }
    c.broker_up(1).unwrap();
    for p in pending {
        let out = p.await;
        assert!(out.is_delivered(), "{out:?}");
    }
    let got = consume(
        &c.bootstrap_servers(),
        "outage",
        1,
        22,
        Duration::from_secs(5),
    );
    let mut ids: Vec<&str> = got.iter().map(|g| g.headers["ce_id"].as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        21,
        "every acknowledged event is there, once: {ids:?}"
    );
    assert_eq!(got.len(), 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_past_the_message_timeout_fails_the_events() {
    let c = cluster(1);
    c.create_topic("gone", 1, 1).unwrap();
    let cfg = config(serde_json::json!({
        "brokers": c.bootstrap_servers(),
        "topic": "gone",
        "message_timeout": "1s",
    }));
    let (mut rig, mut dead) = SinkRig::with_dead_letter("kafka-gone");
    let running = Box::new(cfg)
        .build(rig.context("kafka-gone"))
        .await
        .unwrap();
    tokio::spawn(running);
    c.broker_down(1).unwrap();
    let t0 = Instant::now();
    let pending = rig.sender().send(vec![event("late")]).await;
    // The event ends up in the dead-letter sink with Kafka's reason.
    let item = dead.next_within(Duration::from_secs(15)).await;
    assert!(t0.elapsed() >= Duration::from_millis(900));
    let reason = item
        .event
        .extension("deadletterreason")
        .unwrap()
        .to_canonical()
        .into_owned();
    assert!(reason.contains("Kafka did not take the record"), "{reason}");
    item.delivery.failed("dead-letter sink down too");
    let out = pending.await;
    assert_eq!(out.status, Status::Failed);
}

#[test]
fn invalid_configs_say_what_is_wrong() {
    let bad = |json: serde_json::Value, needle: &str| {
        let cfg: KafkaConfig = serde_json::from_value(json.clone()).unwrap();
        let err = cfg.validate("k").unwrap_err();
        assert!(err.contains(needle), "{json}: {err}");
    };
    let b = "127.0.0.1:9092";
    bad(
        serde_json::json!({"brokers": b, "topic": "a b"}),
        "cannot be in a Kafka topic name",
    );
    bad(
        serde_json::json!({"brokers": b, "topic": "x.{Type}"}),
        "not an attribute name",
    );
    bad(
        serde_json::json!({"brokers": b, "topic": "t", "properties": {"acks": 1}}),
        "would weaken delivery",
    );
    bad(
        serde_json::json!({"brokers": b, "topic": "t", "properties": {"enable.idempotence": false}}),
        "would weaken delivery",
    );
    bad(
        serde_json::json!({"brokers": b, "topic": "t", "properties": {"no.such.property": 1}}),
        "properties:",
    );
    bad(
        serde_json::json!({"brokers": b, "topic": "t", "max_in_flight": 0}),
        "max_in_flight",
    );
    bad(serde_json::json!({"brokers": "", "topic": "t"}), "brokers");
}

/// A record larger than librdkafka's whole local queue can never be enqueued: it fails after
/// short waits instead of blocking the sink forever, and the sink goes on with the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_larger_than_the_local_queue_fails_and_the_sink_goes_on() {
    let c = cluster(1);
    c.create_topic("small", 1, 1).unwrap();
    let cfg = config(serde_json::json!({
        "brokers": c.bootstrap_servers(),
        "topic": "small",
        "properties": { "queue.buffering.max.kbytes": 1 },
    }));
    let rig = start("kafka-small-queue", cfg).await;
    let big = Event::new("big", "/orders", "com.example.order")
        .with_json(Bytes::from(format!("\"{}\"", "x".repeat(4096))));
    let t0 = Instant::now();
    // The bug this guards is a sink that waits forever; ~1 s is expected, 15 s is a bound a
    // loaded machine still meets.
    let out = tokio::time::timeout(Duration::from_secs(30), rig.send(vec![big]))
        .await
        .expect("the record that can never fit blocked the sink");
    assert_eq!(out.status, Status::Failed, "{out:?}");
    assert!(out
        .reason
        .unwrap()
        .contains("Kafka did not take the record"));
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    assert!(rig.send(vec![event("small-1")]).await.is_delivered());
}

/// The shared sink compliance check (`testkit::sink_compliance`) on librdkafka's mock cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_sink_compliance_check() {
    let c = cluster(1);
    let bootstrap = c.bootstrap_servers();
    c.create_topic("compliance", 1, 1).unwrap();
    let b = bootstrap.clone();
    sluice_core::testkit::sink_compliance::<KafkaConfig>(
        "kafka-compliance",
        serde_json::json!({"brokers": bootstrap, "topic": "compliance"}),
        serde_json::json!({"brokers": "", "topic": "compliance"}),
        serde_json::json!({"brokers": format!("127.0.0.1:{}", sluice_core::testkit::free_port()),
            "topic": "compliance", "message_timeout": "60s"}),
        move || {
            let b = b.clone();
            Box::pin(async move {
                tokio::task::spawn_blocking(move || {
                    consume(&b, "compliance", 1, usize::MAX, Duration::from_secs(2))
                        .into_iter()
                        .filter_map(|g| g.payload)
                        .collect()
                })
                .await
                .unwrap()
            })
        },
    )
    .await;
}
