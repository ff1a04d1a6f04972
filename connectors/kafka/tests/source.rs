//! The Kafka source against librdkafka's mock cluster (real Kafka protocol on real sockets):
//! commits never pass an undelivered record, failures are retried, a restart resumes from the
//! commit, two members of one group share the partitions, the binding passes through.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sluice_core::testkit::{assert_source_telemetry, metric, Capture, SourceRig};
use sluice_core::SinkItem;
use sluice_core::{Event, SourceConfig, Status, Str};
use sluice_kafka::KafkaSourceConfig;

fn cluster() -> MockCluster<'static, DefaultProducerContext> {
    MockCluster::new(1).expect("librdkafka mock cluster")
}

/// Record headers from name/value pairs.
fn headers(pairs: &[(&str, &str)]) -> OwnedHeaders {
    pairs.iter().fold(OwnedHeaders::new(), |h, (key, value)| {
        h.insert(Header {
            key,
            value: Some(*value),
        })
    })
}

/// Produces `n` records round-robin over `partitions`, each with key `k<i>` and value `{"i":i}`.
async fn produce(bootstrap: &str, topic: &str, partitions: i32, n: usize, from: usize) {
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let mut sends = Vec::with_capacity(n);
    for i in from..from + n {
        let value = format!("{{\"i\":{i}}}");
        let key = format!("k{i}");
        let record = FutureRecord::to(topic)
            .partition((i % partitions as usize) as i32)
            .key(&key)
            .payload(&value)
            .headers(headers(&[("X-Trace-Id", "t-1")]));
        sends.push(p.send_result(record).map_err(|(e, _)| e).unwrap());
    }
    for s in sends {
        s.await.unwrap().unwrap();
    }
}

/// The group's committed offset per partition (`-1001`: none).
fn committed(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(5)).unwrap();
    (0..partitions)
        .map(|p| match got.find_partition(topic, p).unwrap().offset() {
            Offset::Offset(o) => o,
            _ => -1001,
        })
        .collect()
}

async fn start(
    name: &str,
    cfg: serde_json::Value,
    rig: &mut SourceRig,
) -> tokio::task::JoinHandle<Result<(), sluice_core::ConnectorError>> {
    let cfg: KafkaSourceConfig = serde_json::from_value(cfg).unwrap();
    cfg.validate(name).expect("valid config");
    let running = Box::new(cfg)
        .build(rig.context(name))
        .await
        .expect("builds");
    tokio::spawn(running)
}

/// Takes `n` events without settling them, then checks that no more arrive meanwhile.
async fn hold(cap: &mut Capture, n: usize, more: &str) -> Vec<SinkItem> {
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(cap.next_within(Duration::from_secs(15)).await);
    }
    cap.assert_quiet(Duration::from_millis(500), more).await;
    held
}

async fn wait_committed(bootstrap: &str, group: &str, topic: &str, want: &[i64]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (b, g, t, n) = (
            bootstrap.to_owned(),
            group.to_owned(),
            topic.to_owned(),
            want.len(),
        );
        let got = tokio::task::spawn_blocking(move || committed(&b, &g, &t, n as i32))
            .await
            .unwrap();
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "committed {got:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_stop_at_the_first_undelivered_record_and_failures_are_retried() {
    let c = cluster();
    let bs = c.bootstrap_servers();
    c.create_topic("orders", 2, 1).unwrap();
    produce(&bs, "orders", 2, 40, 0).await;
    let mut rig = SourceRig::new("k-commit");
    // The mock coordinator, unlike a broker, waits out the session timeout before it lets a
    // new member into a group whose last member left: keep it short for the restart below.
    let cfg = serde_json::json!({"brokers": bs, "topics": ["orders"], "group": "g-commit",
        "commit_interval": "50ms", "properties": {"session.timeout.ms": 3000, "heartbeat.interval.ms": 500}});
    let task = start("k-commit", cfg.clone(), &mut rig).await;
    let mut cap = rig.capture();
    // Hold partition 0 offset 3 (record i=6); fail i=9 (partition 1 offset 4) once; deliver
    // everything else.
    let mut held = None;
    let mut failed_once = false;
    let mut delivered = BTreeSet::new();
    let mut first: Option<Event> = None;
    let mut failed_event: Option<Event> = None;
    while delivered.len() < 39 {
        let item = cap.next_within(Duration::from_secs(15)).await;
        let id = item.event.id.clone();
        if first.is_none() {
            first = Some((*item.event).clone());
        }
        if id == "orders-0-3" && held.is_none() {
            held = Some(item);
            continue;
        }
        if id == "orders-1-4" && !failed_once {
            failed_once = true;
            failed_event = Some((*item.event).clone());
            item.delivery.failed("test: sink down");
            continue;
        }
        if id == "orders-1-4" {
            // The retry is the same event, attribute for attribute and byte for byte (it is
            // made again from the record, not kept as a copy).
            let before = failed_event.as_ref().unwrap();
            assert_eq!(
                sluice_core::format::encode_event(&item.event),
                sluice_core::format::encode_event(before)
            );
        }
        item.delivery.delivered();
        delivered.insert(id);
    }
    // Partition 1 is all delivered (the failure was retried); partition 0 stops at offset 3,
    // or before it: records read together are one unit, settled together, so delivered records
    // of the held one's batch wait for it (-1001: nothing committed yet).
    let committed_now = || {
        let bs = bs.clone();
        tokio::task::spawn_blocking(move || committed(&bs, "g-commit", "orders", 2))
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while committed_now().await.unwrap()[1] != 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "partition 1 committed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let p0 = committed_now().await.unwrap()[0];
    assert!(
        p0 == -1001 || (0..=3).contains(&p0),
        "the commit never passes the undelivered record: {p0}"
    );
    held.unwrap().delivery.delivered();
    wait_committed(&bs, "g-commit", "orders", &[20, 20]).await;

    // A plain record: id from topic/partition/offset, key and headers as extensions.
    let e = first.unwrap();
    assert_eq!(e.ty, "kafka");
    assert_eq!(e.source, "k-commit");
    assert_eq!(e.subject.as_deref(), Some("orders"));
    assert!(e.extension("partitionkey").is_some());
    assert_eq!(e.extension("xtraceid").unwrap().to_canonical(), "t-1");
    assert!(e.time.is_some());
    assert_source_telemetry("k-commit", 41);
    assert!(metric("sluice_source_commits_total", &[("source", "k-commit")]) >= 2.0);

    // Shutdown, then a restart of the same group resumes after the commit: only new records.
    rig.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .expect("stops")
        .unwrap()
        .unwrap();
    produce(&bs, "orders", 2, 4, 40).await;
    let mut rig = SourceRig::new("k-commit-2");
    let _t = start("k-commit-2", cfg, &mut rig).await;
    let mut cap = rig.capture();
    let mut ids = BTreeSet::new();
    for _ in 0..4 {
        ids.insert(cap.deliver_next().await.id);
    }
    assert_eq!(
        ids,
        BTreeSet::from(["orders-0-20", "orders-0-21", "orders-1-20", "orders-1-21"].map(Str::from))
    );
    cap.assert_quiet(
        Duration::from_millis(500),
        "nothing before the commit is read again",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_bounds_records_in_flight() {
    let c = cluster();
    let bs = c.bootstrap_servers();
    c.create_topic("win", 1, 1).unwrap();
    produce(&bs, "win", 1, 30, 0).await;
    let mut rig = SourceRig::new("k-win");
    let _t = start(
        "k-win",
        serde_json::json!({"brokers": bs, "topics": ["win"], "group": "g-win", "max_in_flight": 5}),
        &mut rig,
    )
    .await;
    let mut cap = rig.capture();
    let held = hold(&mut cap, 5, "a sixth record while five are in flight").await;
    assert_eq!(
        metric("sluice_source_in_flight", &[("source", "k-win")]),
        5.0
    );
    for h in held {
        h.delivery.delivered();
    }
    let mut n = 5;
    while n < 30 {
        cap.deliver_next().await;
        n += 1;
    }
    wait_committed(&bs, "g-win", "win", &[30]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_events_skip_or_stop_as_configured() {
    let c = cluster();
    let bs = c.bootstrap_servers();
    c.create_topic("rej", 1, 1).unwrap();
    produce(&bs, "rej", 1, 3, 0).await;
    // skip: committed past the rejected record.
    let mut rig = SourceRig::new("k-skip");
    let _t = start(
        "k-skip",
        serde_json::json!({"brokers": bs, "topics": ["rej"], "group": "g-skip", "commit_interval": "50ms"}),
        &mut rig,
    )
    .await;
    let mut cap = rig.capture();
    let first = cap.next_within(Duration::from_secs(15)).await;
    first.delivery.rejected("test: schema mismatch");
    cap.deliver_next().await;
    cap.deliver_next().await;
    wait_committed(&bs, "g-skip", "rej", &[3]).await;

    // stop: the source ends with an error naming the record; the commit stays before it.
    let mut rig = SourceRig::new("k-stop");
    let task = start(
        "k-stop",
        serde_json::json!({"brokers": bs, "topics": ["rej"], "group": "g-stop", "on_rejected": "stop", "commit_interval": "50ms"}),
        &mut rig,
    )
    .await;
    let mut cap = rig.capture();
    cap.deliver_next().await;
    let second = cap.next_within(Duration::from_secs(15)).await;
    second.delivery.rejected("test: schema mismatch");
    // The three records were waiting together: one unit, whose outcome comes when all three
    // are settled. The third is delivered, and not committed: it is behind the rejected one.
    cap.deliver_next().await;
    let e = tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("kafka source k-stop: a sink rejected the event of rej-0 offset 1"),
        "{e}"
    );
    wait_committed(&bs, "g-stop", "rej", &[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_records_pass_through_and_two_members_of_one_group_deliver_every_record() {
    let c = cluster();
    let bs = c.bootstrap_servers();
    c.create_topic("ce", 4, 1).unwrap();
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .create()
        .unwrap();
    // Binary and structured CloudEvents.
    p.send(
        FutureRecord::<(), _>::to("ce")
            .partition(0)
            .payload("{\"a\":1}")
            .headers(headers(&[
                ("ce_specversion", "1.0"),
                ("ce_id", "evt-1"),
                ("ce_source", "/orders"),
                ("ce_type", "com.example.created"),
                ("content-type", "application/json"),
            ])),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    p.send(
        FutureRecord::<(), _>::to("ce")
            .partition(1)
            .payload(r#"{"specversion":"1.0","id":"evt-2","source":"/o","type":"t"}"#)
            // Written as `Content-Type` by some producers: matched in any case.
            .headers(headers(&[("Content-Type", "application/cloudevents+json")])),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    produce(&bs, "ce", 4, 98, 0).await;

    let cfg = serde_json::json!({"brokers": bs, "topics": ["ce"], "group": "g-two", "commit_interval": "50ms"});
    let mut a = SourceRig::new("k-a");
    let _ta = start("k-a", cfg.clone(), &mut a).await;
    let got_a = a.capture().auto(Status::Delivered);
    let mut b = SourceRig::new("k-b");
    let _tb = start("k-b", cfg, &mut b).await;
    let got_b = b.capture().auto(Status::Delivered);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let all: BTreeMap<String, Event> = loop {
        let all: BTreeMap<String, Event> = got_a
            .events()
            .into_iter()
            .chain(got_b.events())
            .map(|e| (e.id.to_string(), e))
            .collect();
        if all.len() == 100 {
            break all;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of 100 distinct records",
            all.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let e1 = &all["evt-1"];
    assert_eq!(
        (e1.source.as_str(), e1.ty.as_str()),
        ("/orders", "com.example.created")
    );
    assert_eq!(e1.data.as_bytes().unwrap().as_ref(), b"{\"a\":1}");
    assert_eq!(all["evt-2"].source, "/o");
    wait_committed(&bs, "g-two", "ce", &[26, 26, 24, 24]).await;
}

#[test]
fn config_errors_say_what_to_fix() {
    let bad = |v: serde_json::Value| {
        serde_json::from_value::<KafkaSourceConfig>(v)
            .unwrap()
            .validate("k")
            .unwrap_err()
    };
    let base = |extra: serde_json::Value| {
        let mut v = serde_json::json!({"brokers": "127.0.0.1:9092", "group": "g"});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    assert!(bad(base(serde_json::json!({})).clone()).contains("give `topics` or `topic_pattern`"));
    assert!(bad(base(
        serde_json::json!({"topics": ["a"], "topic_pattern": "b"})
    ))
    .contains("not both"));
    assert!(bad(base(
        serde_json::json!({"topics": ["a"], "properties": {"enable.auto.commit": true}})
    ))
    .contains("commits offsets itself"));
    assert!(bad(base(
        serde_json::json!({"topics": ["a"], "properties": {"group.id": "x"}})
    ))
    .contains("set `group` instead"));
    assert!(bad(base(
        serde_json::json!({"topics": ["a"], "properties": {"no.such.property": 1}})
    ))
    .starts_with("properties: "));
    assert!(bad(base(
        serde_json::json!({"topics": ["a"], "max_in_flight": 0})
    ))
    .contains("max_in_flight"));
    // A `source` that would make every plain record an invalid event is a config error.
    assert!(bad(base(
        serde_json::json!({"topics": ["a"], "source": "not a uri"})
    ))
    .contains("type or source"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_pull_source_compliance_check() {
    let c = cluster();
    c.create_topic("comply", 1, 1).unwrap();
    let bootstrap = c.bootstrap_servers();
    let b = bootstrap.clone();
    let mut next = 0usize;
    sluice_core::testkit::pull_source_compliance::<KafkaSourceConfig>(
        "k-compliance",
        serde_json::json!({"brokers": bootstrap, "topics": ["comply"], "group": "comply",
            "commit_interval": "100ms",
            "properties": {"session.timeout.ms": "3000", "heartbeat.interval.ms": "500"}}),
        serde_json::json!({"brokers": bootstrap, "topics": []}),
        move |k| {
            let (b, from) = (b.clone(), next);
            next += k;
            Box::pin(async move { produce(&b, "comply", 1, k, from).await })
        },
    )
    .await;
}

/// librdkafka's queue is not a tokio resource, so a full one never makes the source wait: the
/// source must still give the thread up now and then, or every other task on it (the admin
/// server's /metrics and /health, the sinks) starves while a backlog is read (10 128 records in
/// one run before the source spent tokio's budget).
#[tokio::test]
async fn a_backlog_does_not_keep_the_thread_from_other_tasks() {
    let c = cluster();
    let bs = c.bootstrap_servers();
    c.create_topic("yield", 4, 1).unwrap();
    const N: usize = 20_000;
    produce(&bs, "yield", 4, N, 0).await;
    let mut rig = SourceRig::new("k-yield");
    let _t = start(
        "k-yield",
        serde_json::json!({"brokers": bs, "topics": ["yield"], "group": "g-yield"}),
        &mut rig,
    )
    .await;
    let got = rig.capture().auto(Status::Delivered);
    sluice_core::testkit::assert_yields_while_reading("k-yield", N).await;
    got.wait_for(N).await;
}

/// A partition whose watermark is full is paused and its records parked, in order, while the
/// other partition goes on; a record that is not a valid event is skipped in its turn and
/// committed past. Every valid record is delivered once, in its partition's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_partition_parks_its_records_in_order_and_skips_invalid_ones() {
    let c = cluster();
    let bs = c.bootstrap_servers();
    c.create_topic("park", 2, 1).unwrap();
    produce(&bs, "park", 2, 20, 0).await; // offsets 0..10 in each partition
                                          // Offset 10 of partition 0: a binary CloudEvent without `ce_id` (not a valid event).
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .create()
        .unwrap();
    p.send(
        FutureRecord::<(), _>::to("park")
            .partition(0)
            .payload("{}")
            .headers(headers(&[
                ("ce_specversion", "1.0"),
                ("ce_source", "/x"),
                ("ce_type", "t"),
            ])),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    produce(&bs, "park", 2, 4, 20).await; // offsets 11, 12 of partition 0; 10, 11 of partition 1
    let mut rig = SourceRig::new("k-park");
    let _t = start(
        "k-park",
        serde_json::json!({"brokers": bs, "topics": ["park"], "group": "g-park",
            "max_in_flight": 100, "max_in_flight_per_partition": 3, "commit_interval": "50ms"}),
        &mut rig,
    )
    .await;
    let mut cap = rig.capture();
    // With nothing settled, each partition has at most 3 records in flight.
    let held = hold(
        &mut cap,
        6,
        "a fourth record of a partition while three are in flight",
    )
    .await;
    let mut got: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let note = |got: &mut BTreeMap<String, Vec<i64>>, e: &Event| {
        let (part, offset) = e.id.strip_prefix("park-").unwrap().split_once('-').unwrap();
        got.entry(part.to_owned())
            .or_default()
            .push(offset.parse().unwrap());
    };
    for h in held {
        note(&mut got, &h.event);
        h.delivery.delivered();
    }
    for _ in 6..24 {
        note(&mut got, &cap.deliver_next().await);
    }
    assert_eq!(
        got["0"],
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12],
        "partition 0"
    );
    assert_eq!(got["1"], (0..12).collect::<Vec<i64>>(), "partition 1");
    wait_committed(&bs, "g-park", "park", &[13, 12]).await;
    cap.assert_quiet(Duration::from_millis(300), "nothing delivered twice")
        .await;
    assert_eq!(
        metric(
            sluice_core::telemetry::EVENTS_REJECTED,
            &[("source", "k-park"), ("reason", "invalid_event")]
        ),
        1.0
    );
}

/// A backlog over several partitions is taken in batches of interleaved records and split into
/// one unit per run of a partition's records: every record arrives once, each partition's in
/// its order, and the commits reach the end of every partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_over_partitions_arrives_once_in_each_partitions_order() {
    let c = cluster();
    let bs = c.bootstrap_servers();
    const P: i32 = 5;
    const N: usize = 3_000;
    c.create_topic("runs", P, 1).unwrap();
    produce(&bs, "runs", P, N, 0).await;
    let mut rig = SourceRig::new("k-runs");
    let _t = start(
        "k-runs",
        serde_json::json!({"brokers": bs, "topics": ["runs"], "group": "g-runs"}),
        &mut rig,
    )
    .await;
    let got = rig.capture().auto(Status::Delivered).wait_for(N).await;
    assert_eq!(got.len(), N, "every record once");
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for e in &got {
        // The plain record's id: `<topic>-<partition>-<offset>`.
        let mut parts = e.id.rsplitn(3, '-');
        let offset: i64 = parts.next().unwrap().parse().unwrap();
        let partition: i32 = parts.next().unwrap().parse().unwrap();
        let want = next.entry(partition).or_insert(0);
        assert_eq!(
            offset, *want,
            "partition {partition} out of order at {}",
            e.id
        );
        *want += 1;
        // Record i went to partition i % P as its (i / P)th record.
        let i: usize = serde_json::from_slice::<serde_json::Value>(e.data.as_bytes().unwrap())
            .unwrap()["i"]
            .as_u64()
            .unwrap() as usize;
        assert_eq!(
            (i % P as usize, i / P as usize),
            (partition as usize, offset as usize)
        );
    }
    let per = (N / P as usize) as i64;
    assert_eq!(
        next.values().copied().collect::<Vec<_>>(),
        vec![per; P as usize]
    );
    wait_committed(&bs, "g-runs", "runs", &vec![per; P as usize]).await;
}

/// `sluice_source_lag` counts the records behind the end of the log that are not yet delivered
/// in order: all of them while none is delivered, then fewer as the first ones are, none at the
/// end (brought up to date at every commit interval, without librdkafka's statistics).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_counts_the_records_not_yet_delivered_in_order() {
    let c = cluster();
    let bs = c.bootstrap_servers();
    c.create_topic("lag", 1, 1).unwrap();
    produce(&bs, "lag", 1, 10, 0).await;
    let mut rig = SourceRig::new("k-lag");
    let _t = start(
        "k-lag",
        serde_json::json!({"brokers": bs, "topics": ["lag"], "group": "g-lag",
            "commit_interval": "50ms"}),
        &mut rig,
    )
    .await;
    let mut cap = rig.capture();
    let lag_is = |want: f64, what: &'static str| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let got = metric(sluice_core::telemetry::SOURCE_LAG, &[("source", "k-lag")]);
            if got == want {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: lag {got}, expected {want}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let mut held = hold(&mut cap, 10, "an eleventh record").await;
    lag_is(10.0, "nothing delivered").await;
    // The last six first: the first four still hold the commit point.
    for h in held.drain(4..) {
        h.delivery.delivered();
    }
    lag_is(10.0, "the last six delivered, the first four not").await;
    for h in held.drain(..) {
        h.delivery.delivered();
    }
    lag_is(0.0, "every record delivered").await;
    wait_committed(&bs, "g-lag", "lag", &[10]).await;
}

/// `format: argo-eventbus`: a record as Argo's Kafka EventBus writes it (the structured
/// CloudEvent as the value, key `<eventSourceName>.<eventName>`, no headers) passes through as
/// the event it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argo_eventbus_records_are_the_events_they_hold() {
    let c = cluster();
    let bootstrap = c.bootstrap_servers();
    c.create_topic("argo-bus", 1, 1).unwrap();
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let ce = r#"{"specversion":"1.0","id":"a1b2","source":"webhook","type":"webhook","subject":"example","datacontenttype":"application/json","time":"2026-12-07T10:00:00Z","data":{"header":{},"body":{"n":1}}}"#;
    p.send_result(
        FutureRecord::to("argo-bus")
            .key("webhook.example")
            .payload(ce),
    )
    .map_err(|(e, _)| e)
    .unwrap()
    .await
    .unwrap()
    .unwrap();
    let mut rig = SourceRig::new("k-argo-bus");
    let mut cap = rig.capture();
    let task = start(
        "k-argo-bus",
        serde_json::json!({"brokers": bootstrap, "topics": ["argo-bus"], "group": "g-argo-bus",
               "start": "earliest", "format": "argo-eventbus"}),
        &mut rig,
    )
    .await;
    let item = cap.next_within(Duration::from_secs(15)).await;
    let e = &item.event;
    assert_eq!(
        (
            e.id.as_str(),
            e.source.as_str(),
            e.ty.as_str(),
            e.subject.as_deref()
        ),
        ("a1b2", "webhook", "webhook", Some("example"))
    );
    let data: serde_json::Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
    assert_eq!(data["body"]["n"], 1);
    item.delivery.delivered();
    rig.shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
}
