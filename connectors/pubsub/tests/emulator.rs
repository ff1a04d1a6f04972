//! The Pub/Sub connectors against the real Pub/Sub emulator (Google's, from the machine
//! image): `PUBSUB_EMULATOR_HOST` when scripts/test.sh started one, else one per test.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use gcloud_pubsub::client::{Client, ClientConfig};
use gcloud_pubsub::subscription::SubscriptionConfig;
use google_cloud_gax::conn::Environment;
use google_cloud_googleapis::pubsub::v1::PubsubMessage;
use serde_json::json;
use sluice_core::testkit::{self, peers};
use sluice_core::{Event, SourceConfig, Status};
use sluice_pubsub::{PubSubSinkConfig, PubSubSourceConfig};

const PROJECT: &str = "sluice-test";

struct Emu {
    host: String,
    client: Client,
    _process: Option<peers::ServerProcess>,
    _dir: tempfile::TempDir,
}

async fn emulator() -> Emu {
    let dir = tempfile::tempdir().unwrap();
    let (host, process) = peers::pubsub_emulator(dir.path());
    let client = Client::new(ClientConfig {
        project_id: Some(PROJECT.into()),
        environment: Environment::Emulator(host.clone()),
        pool_size: 1,
        ..ClientConfig::default()
    })
    .await
    .expect("a client for the emulator");
    Emu {
        host,
        client,
        _process: process,
        _dir: dir,
    }
}

/// A name no other test (or earlier run against the same emulator) uses.
fn unique(what: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{what}-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    )
}

impl Emu {
    async fn topic(&self) -> String {
        let t = unique("t");
        self.client.topic(&t).create(None, None).await.unwrap();
        t
    }

    async fn subscription(&self, topic: &str, ordering: bool) -> String {
        let s = unique("s");
        self.client
            .subscription(&s)
            .create(
                &self.client.fully_qualified_topic_name(topic),
                SubscriptionConfig {
                    ack_deadline_seconds: 10,
                    enable_message_ordering: ordering,
                    ..SubscriptionConfig::default()
                },
                None,
            )
            .await
            .unwrap();
        s
    }

    async fn publish(&self, topic: &str, messages: Vec<PubsubMessage>) -> Vec<String> {
        let publisher = self.client.topic(topic).new_publisher(None);
        let ids = publisher.publish_immediately(messages, None).await.unwrap();
        let mut p = publisher;
        p.shutdown().await;
        ids
    }

    fn source_cfg(&self, sub: &str) -> serde_json::Value {
        json!({
            "project": PROJECT,
            "endpoint": self.host,
            "subscription": sub,
            "ack_deadline": "10s",
            "max_outstanding_messages": 100,
        })
    }
}

fn plain(data: &str) -> PubsubMessage {
    PubsubMessage {
        data: Bytes::from(data.to_owned()),
        ..PubsubMessage::default()
    }
}

fn keyed(key: &str, data: &str) -> PubsubMessage {
    PubsubMessage {
        data: Bytes::from(data.to_owned()),
        ordering_key: key.to_owned(),
        ..PubsubMessage::default()
    }
}

fn text(e: &Event) -> String {
    String::from_utf8(e.data.as_bytes().cloned().unwrap_or_default().to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_source_compliance() {
    let emu = emulator().await;
    let topic = emu.topic().await;
    let sub = emu.subscription(&topic, false).await;
    let mut bad = emu.source_cfg(&sub);
    bad["ack_deadline"] = json!("5s");
    let n = std::sync::Arc::new(AtomicUsize::new(0));
    let client = emu.client.clone();
    testkit::pull_source_compliance::<PubSubSourceConfig>(
        "pubsub-compliance",
        emu.source_cfg(&sub),
        bad,
        move |count| {
            let (client, topic, n) = (client.clone(), topic.clone(), n.clone());
            Box::pin(async move {
                let msgs = (0..count)
                    .map(|_| plain(&format!("m{}", n.fetch_add(1, Ordering::Relaxed))))
                    .collect();
                client
                    .topic(&topic)
                    .new_publisher(None)
                    .publish_immediately(msgs, None)
                    .await
                    .unwrap();
            })
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_messages_become_events_with_stable_ids() {
    let emu = emulator().await;
    let topic = emu.topic().await;
    let sub = emu.subscription(&topic, false).await;
    let mut m = plain("{\"order\":7}");
    m.attributes = HashMap::from([
        ("Region".to_owned(), "eu".to_owned()),
        ("content-type".to_owned(), "application/json".to_owned()),
        ("not valid!".to_owned(), "x".to_owned()),
    ]);
    let ids = emu.publish(&topic, vec![m]).await;
    let (mut rig, task) =
        testkit::start_source::<PubSubSourceConfig>("ps-plain", emu.source_cfg(&sub)).await;
    let mut cap = rig.capture();
    let item = cap.next_within(Duration::from_secs(20)).await;
    let e = &item.event;
    assert_eq!(e.id, ids[0], "id = the Pub/Sub message id");
    assert_eq!(e.ty, sluice_pubsub::DEFAULT_TYPE);
    assert_eq!(
        e.source,
        format!("//pubsub.googleapis.com/projects/{PROJECT}/topics/{topic}")
    );
    assert_eq!(e.datacontenttype.as_deref(), Some("application/json"));
    assert_eq!(text(e), "{\"order\":7}");
    assert_eq!(
        e.extension("region").map(|v| v.to_canonical().into_owned()),
        Some("eu".into())
    );
    assert!(e.time.is_some(), "time = the publish time");
    // Failed: Pub/Sub hands it out again (after a short backoff), with the same id.
    item.delivery.failed("sink down");
    let again = cap.next_within(Duration::from_secs(20)).await;
    assert_eq!(again.event.id, ids[0]);
    assert_eq!(again.event, item.event, "the same event on every copy");
    again.delivery.delivered();
    cap.assert_quiet(Duration::from_secs(3), "acknowledged: not handed out again")
        .await;
    testkit::assert_source_telemetry("ps-plain", 2);
    assert!(
        testkit::metric(
            sluice_core::telemetry::SOURCE_SETTLED,
            &[("source", "ps-plain"), ("result", "retry")]
        ) >= 1.0
    );
    rig.shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_delivery_is_extended_not_redelivered() {
    let emu = emulator().await;
    let topic = emu.topic().await;
    let sub = emu.subscription(&topic, false).await;
    emu.publish(&topic, vec![plain("slow")]).await;
    let (mut rig, task) =
        testkit::start_source::<PubSubSourceConfig>("ps-slow", emu.source_cfg(&sub)).await;
    let mut cap = rig.capture();
    let item = cap.next_within(Duration::from_secs(20)).await;
    // Held past two ack deadlines (10 s each): extended meanwhile, so no copy arrives.
    cap.assert_quiet(
        Duration::from_secs(22),
        "redelivered while its events were still in the pipeline",
    )
    .await;
    assert!(
        testkit::metric(
            sluice_core::telemetry::SOURCE_LEASE_EXTENSIONS,
            &[("source", "ps-slow")]
        ) >= 2.0,
        "ack deadline extensions counted"
    );
    item.delivery.delivered();
    cap.assert_quiet(
        Duration::from_secs(12),
        "acknowledged after the slow delivery",
    )
    .await;
    rig.shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_keys_are_delivered_in_order_one_at_a_time() {
    let emu = emulator().await;
    let topic = emu.topic().await;
    // Sluice creates the ordered subscription (topic: and enable_message_ordering:).
    let sub = unique("s");
    let mut cfg = emu.source_cfg(&sub);
    cfg["topic"] = json!(topic);
    cfg["enable_message_ordering"] = json!(true);
    let (mut rig, task) = testkit::start_source::<PubSubSourceConfig>("ps-order", cfg).await;
    let (_, sc) = emu.client.subscription(&sub).config(None).await.unwrap();
    assert!(sc.enable_message_ordering, "created with ordering");
    let mut msgs = Vec::new();
    for i in 0..5 {
        msgs.push(keyed("a", &format!("a{i}")));
        msgs.push(keyed("b", &format!("b{i}")));
    }
    emu.publish(&topic, msgs).await;
    let mut cap = rig.capture();
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    let mut failed_once = false;
    while seen.values().map(Vec::len).sum::<usize>() < 10 {
        let item = cap.next_within(Duration::from_secs(30)).await;
        let key = item
            .event
            .extension("partitionkey")
            .map(|v| v.to_canonical().into_owned())
            .expect("ordering key → partitionkey");
        // While this one is held, nothing else of its key arrives.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut others = Vec::new();
        while let Some(o) = cap.try_next() {
            let k = o
                .event
                .extension("partitionkey")
                .map(|v| v.to_canonical().into_owned());
            assert_ne!(
                k.as_deref(),
                Some(key.as_str()),
                "two of key {key} in flight at once"
            );
            others.push(o);
        }
        let body = text(&item.event);
        if body == "a2" && !failed_once {
            // A failure: a2 and what follows it come again, in order.
            failed_once = true;
            item.delivery.failed("once");
        } else {
            seen.entry(key).or_default().push(body);
            item.delivery.delivered();
        }
        for o in others {
            let k = o
                .event
                .extension("partitionkey")
                .unwrap()
                .to_canonical()
                .into_owned();
            let body = text(&o.event);
            seen.entry(k).or_default().push(body);
            o.delivery.delivered();
        }
    }
    let want = |p: &str| (0..5).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
    let dedup = |v: &Vec<String>| {
        let mut out: Vec<String> = Vec::new();
        for s in v {
            if out.last() != Some(s) {
                out.push(s.clone());
            }
        }
        out
    };
    assert_eq!(
        dedup(&seen["a"]),
        want("a"),
        "key a in order: {:?}",
        seen["a"]
    );
    assert_eq!(
        dedup(&seen["b"]),
        want("b"),
        "key b in order: {:?}",
        seen["b"]
    );
    assert!(failed_once);
    rig.shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_cross_both_ways_intact() {
    let emu = emulator().await;
    let topic = emu.topic().await;
    let raw_sub = emu.subscription(&topic, false).await;
    let sub = emu.subscription(&topic, false).await;
    let sink_cfg = |mode: &str| json!({"project": PROJECT, "endpoint": emu.host, "topic": topic, "mode": mode, "max_batch": 10});
    let mut binary =
        Event::new("ev-1", "/orders", "com.example.created").with_json(&b"{\"n\":1}"[..]);
    binary.set_extension(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    );
    binary.subject = Some("o/1".into());
    let structured = Event::new("ev-2", "/orders", "com.example.created").with_json(&b"[1,2]"[..]);

    let b = testkit::start_sink::<PubSubSinkConfig>("ps-sink-b", sink_cfg("binary")).await;
    let s = testkit::start_sink::<PubSubSinkConfig>("ps-sink-s", sink_cfg("structured")).await;
    let o = b.send(vec![binary.clone()]).await;
    assert_eq!(o.status, Status::Delivered, "{o:?}");
    let o = s.send(vec![structured.clone()]).await;
    assert_eq!(o.status, Status::Delivered, "{o:?}");
    testkit::assert_sink_telemetry("ps-sink-b", 1, 0);

    // On the wire: the binding's attributes.
    let raw = emu
        .client
        .subscription(&raw_sub)
        .pull(10, None)
        .await
        .unwrap();
    assert_eq!(raw.len(), 2);
    for m in &raw {
        let a = &m.message.attributes;
        if a.contains_key("ce-id") {
            assert_eq!(a["ce-id"], "ev-1");
            assert_eq!(a["ce-specversion"], "1.0");
            assert_eq!(a["ce-subject"], "o/1");
            assert_eq!(a["Content-Type"], "application/json");
            assert_eq!(&m.message.data[..], b"{\"n\":1}");
        } else {
            assert!(a["Content-Type"].starts_with("application/cloudevents+json"));
            let v: serde_json::Value = serde_json::from_slice(&m.message.data).unwrap();
            assert_eq!(v["id"], "ev-2");
        }
        m.ack().await.unwrap();
    }

    // Read back by the source: the same events, not wrapped again.
    let (mut rig, task) =
        testkit::start_source::<PubSubSourceConfig>("ps-ce", emu.source_cfg(&sub)).await;
    let mut cap = rig.capture();
    let mut got = HashMap::new();
    for _ in 0..2 {
        let item = cap.next_within(Duration::from_secs(20)).await;
        got.insert(item.event.id.clone(), item.event.clone());
        item.delivery.delivered();
    }
    assert_eq!(*got["ev-1"], binary);
    assert_eq!(*got["ev-2"], structured);
    rig.shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argo_format_and_invalid_cloudevents() {
    let emu = emulator().await;
    let topic = emu.topic().await;
    let sub = emu.subscription(&topic, false).await;
    let mut m = plain("{\"k\":1}");
    m.attributes = HashMap::from([("a".to_owned(), "1".to_owned())]);
    let ids = emu.publish(&topic, vec![m]).await;
    let mut cfg = emu.source_cfg(&sub);
    cfg["format"] = json!("argo");
    cfg["json_body"] = json!(true);
    cfg["metadata"] = json!({"team": "x"});
    let (mut rig, task) = testkit::start_source::<PubSubSourceConfig>("ps-argo", cfg).await;
    let mut cap = rig.capture();
    let item = cap.next_within(Duration::from_secs(20)).await;
    assert_eq!(item.event.ty, "pubsub");
    assert_eq!(item.event.source, "ps-argo");
    let d: serde_json::Value = serde_json::from_slice(item.event.data.as_bytes().unwrap()).unwrap();
    assert_eq!(d["id"], ids[0]);
    assert_eq!(d["body"], json!({"k": 1}));
    assert_eq!(d["attributes"], json!({"a": "1"}));
    assert_eq!(d["metadata"], json!({"team": "x"}));
    assert!(
        d["publishTime"].as_str().unwrap().ends_with("+0000 UTC"),
        "{d}"
    );
    item.delivery.delivered();
    rig.shutdown.cancel();
    task.await.unwrap().unwrap();

    // A message that claims to be a CloudEvent and is not one: rejected, never forwarded.
    let topic2 = emu.topic().await;
    let sub2 = emu.subscription(&topic2, false).await;
    let mut bad = plain("x");
    bad.attributes = HashMap::from([("ce-specversion".to_owned(), "1.0".to_owned())]);
    emu.publish(&topic2, vec![bad, plain("fine")]).await;
    let (mut rig, task) =
        testkit::start_source::<PubSubSourceConfig>("ps-bad", emu.source_cfg(&sub2)).await;
    let mut cap = rig.capture();
    let item = cap.next_within(Duration::from_secs(20)).await;
    assert_eq!(text(&item.event), "fine");
    item.delivery.delivered();
    cap.assert_quiet(Duration::from_millis(500), "nothing more")
        .await;
    assert!(
        testkit::metric(
            sluice_core::telemetry::EVENTS_REJECTED,
            &[("source", "ps-bad"), ("reason", "invalid_event")]
        ) >= 1.0
    );
    rig.shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_resources_are_clear_errors() {
    let emu = emulator().await;
    let mut rig = testkit::SourceRig::new("ps-missing");
    let cfg: PubSubSourceConfig = serde_json::from_value(emu.source_cfg("nope")).unwrap();
    cfg.validate("ps-missing").unwrap();
    let err = match Box::new(cfg).build(rig.context("ps-missing")).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("built without a subscription"),
    };
    assert!(
        err.contains("pubsub source ps-missing")
            && err.contains("subscriptions/nope does not exist")
            && err.contains("topic:"),
        "{err}"
    );
    let cfg: PubSubSinkConfig = serde_json::from_value(
        json!({"project": PROJECT, "endpoint": emu.host, "topic": "absent"}),
    )
    .unwrap();
    let mut sink_rig = testkit::SinkRig::new("ps-missing-sink");
    let err =
        match sluice_core::SinkConfig::build(Box::new(cfg), sink_rig.context("ps-missing-sink"))
            .await
        {
            Err(e) => e.to_string(),
            Ok(_) => panic!("built without a topic"),
        };
    assert!(err.contains("topics/absent does not exist"), "{err}");
    // Refused before any call.
    for (bad, what) in [
        (
            json!({"project": PROJECT, "subscription": "s", "max_outstanding_messages": 0}),
            "max_outstanding_messages",
        ),
        (
            json!({"project": PROJECT, "subscription": "projects/other/subscriptions/s"}),
            "not in project",
        ),
        (
            json!({"project": PROJECT, "subscription": "s", "enable_message_ordering": true}),
            "set topic",
        ),
        (
            json!({"project": PROJECT, "subscription": "s", "endpoint": "http://x:1"}),
            "host:port",
        ),
    ] {
        let c: PubSubSourceConfig = serde_json::from_value(bad).unwrap();
        let e = c.validate("x").unwrap_err();
        assert!(e.contains(what), "{e}");
    }
    let e = serde_json::from_value::<PubSubSourceConfig>(
        json!({"project": PROJECT, "subscription": "s", "max_outstanding": 1}),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("max_outstanding"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sink_sets_ordering_keys_from_a_template() {
    let emu = emulator().await;
    let topic = emu.topic().await;
    let raw_sub = emu.subscription(&topic, true).await;
    let sink = testkit::start_sink::<PubSubSinkConfig>(
        "ps-sink-order",
        json!({"project": PROJECT, "endpoint": emu.host, "topic": topic, "ordering_key": "k-{partitionkey}"}),
    )
    .await;
    let events: Vec<Event> = (0..3)
        .map(|i| {
            let mut e = Event::new(format!("o{i}"), "/s", "t").with_json(format!("{{\"i\":{i}}}"));
            e.set_extension("partitionkey", "acct7");
            e
        })
        .collect();
    let o = sink.send(events).await;
    assert_eq!(o.status, Status::Delivered, "{o:?}");
    let mut got = Vec::new();
    while got.len() < 3 {
        for m in emu
            .client
            .subscription(&raw_sub)
            .pull(10, None)
            .await
            .unwrap()
        {
            assert_eq!(m.message.ordering_key, "k-acct7");
            got.push(m.message.attributes["ce-id"].clone());
            m.ack().await.unwrap();
        }
    }
    assert_eq!(got, ["o0", "o1", "o2"], "published in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_head_holds_back_its_key_also_what_is_not_taken_yet() {
    let emu = emulator().await;
    let topic = emu.topic().await;
    let sub = emu.subscription(&topic, true).await;
    emu.publish(
        &topic,
        (1..=4).map(|i| keyed("x", &format!("x{i}"))).collect(),
    )
    .await;
    // A window of 2: x1 in the pipeline, x2 waiting behind it, x3 and x4 not taken yet.
    let mut cfg = emu.source_cfg(&sub);
    cfg["max_outstanding_messages"] = json!(2);
    let (mut rig, task) = testkit::start_source::<PubSubSourceConfig>("ps-block", cfg).await;
    let mut cap = rig.capture();
    let first = cap.next_within(Duration::from_secs(20)).await;
    assert_eq!(text(&first.event), "x1");
    cap.assert_quiet(Duration::from_millis(500), "x2 waits behind x1")
        .await;
    first.delivery.failed("once");
    let mut order = Vec::new();
    while order.len() < 4 {
        let item = cap.next_within(Duration::from_secs(30)).await;
        order.push(text(&item.event));
        item.delivery.delivered();
    }
    assert_eq!(
        order,
        ["x1", "x2", "x3", "x4"],
        "nothing of the key overtook its failed head"
    );
    rig.shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// The shared sink compliance check (`testkit::sink_compliance`) against the emulator: a
/// streaming subscriber, opened before the first publish, collects what the topic took (a pull
/// cut short would hold its messages until their ack deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sink_passes_the_sink_compliance_check() {
    let emu = emulator().await;
    let topic = emu.topic().await;
    let sub = emu.subscription(&topic, false).await;
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Vec<u8>>::new()));
    let mut stream = emu.client.subscription(&sub).subscribe(None).await.unwrap();
    let g = got.clone();
    let reader = tokio::spawn(async move {
        while let Some(m) = futures_util::StreamExt::next(&mut stream).await {
            g.lock().unwrap().push(m.message.data.to_vec());
            let _ = m.ack().await;
        }
    });
    testkit::sink_compliance::<PubSubSinkConfig>(
        "ps-sink-compliance",
        json!({"project": PROJECT, "endpoint": emu.host, "topic": topic}),
        json!({"project": PROJECT, "endpoint": emu.host, "topic": topic, "max_batch": 0}),
        json!({"project": PROJECT, "endpoint": format!("127.0.0.1:{}", testkit::free_port()),
            "topic": topic, "timeout": "2s"}),
        move || {
            let got = got.lock().unwrap().clone();
            Box::pin(async move { got })
        },
    )
    .await;
    reader.abort();
}
