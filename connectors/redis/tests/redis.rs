//! The Redis connectors against real redis-server processes: the shared one on 127.0.0.1:6379
//! (each test uses its own keys) and servers started here for outage tests.

use std::collections::BTreeSet;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;
use sluice_core::testkit::peers::spawn_redis;
use sluice_core::testkit::{
    assert_sink_telemetry, assert_source_telemetry, metric, start_sink, start_source, SourceRig,
};
use sluice_core::{Event, SinkConfig, SourceConfig, Status};
use sluice_redis::{PubSubSinkConfig, PubSubSourceConfig, StreamsSinkConfig, StreamsSourceConfig};

const SHARED: &str = "redis://127.0.0.1:6379";

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

async fn conn(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).unwrap();
    client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| {
            panic!("Redis at {url} is not reachable ({e}): scripts/test.sh starts it")
        })
}

async fn pending(c: &mut redis::aio::MultiplexedConnection, stream: &str, group: &str) -> i64 {
    let v: redis::Value = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .query_async(c)
        .await
        .unwrap();
    match v {
        redis::Value::Array(a) => match a.first() {
            Some(redis::Value::Int(n)) => *n,
            other => panic!("XPENDING: {other:?}"),
        },
        other => panic!("XPENDING: {other:?}"),
    }
}

async fn wait_pending(
    c: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    group: &str,
    want: i64,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n = pending(c, stream, group).await;
        if n == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} entries pending, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn xadd(
    c: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    fields: &[(&str, &str)],
) -> String {
    c.xadd(stream, "*", fields).await.unwrap()
}

#[tokio::test]
async fn streams_acknowledge_only_after_delivery_and_retry_failures() {
    let mut c = conn(SHARED).await;
    let stream = unique("orders");
    let (mut rig, _task) = start_source::<StreamsSourceConfig>(
        "rs-ack",
        json!({"url": SHARED, "streams": [stream], "group": "g", "consumer": "c1", "claim_idle": "5s"}),
    )
    .await;
    let mut capture = rig.capture();
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(xadd(&mut c, &stream, &[("order", &i.to_string())]).await);
    }
    // The first fails, the others are delivered: only the first stays pending.
    let first = capture.next_within(Duration::from_secs(10)).await;
    assert_eq!(first.event.id, format!("{stream}-{}", ids[0]));
    assert_eq!(first.event.subject.as_deref(), Some(stream.as_str()));
    assert_eq!(first.event.ty, "redis.stream");
    let data: serde_json::Value =
        serde_json::from_slice(first.event.data.as_bytes().unwrap()).unwrap();
    assert_eq!(data, json!({"order": "0"}));
    assert_eq!(
        pending(&mut c, &stream, "g").await,
        3,
        "nothing acknowledged before delivery"
    );
    first.delivery.failed("downstream is down");
    for _ in 0..2 {
        capture.deliver_next().await;
    }
    wait_pending(&mut c, &stream, "g", 1).await;
    // After the backoff the failed entry comes again (claimed back: a new delivery count).
    let again = capture.next_within(Duration::from_secs(10)).await;
    assert_eq!(
        again.event.id,
        format!("{stream}-{}", ids[0]),
        "same id: dedup-stable"
    );
    again.delivery.delivered();
    wait_pending(&mut c, &stream, "g", 0).await;
    assert!(
        capture.try_next().is_none(),
        "nothing is delivered twice after success"
    );
    assert_source_telemetry("rs-ack", 4);
    assert_eq!(
        metric(
            "sluice_source_settled_total",
            &[("source", "rs-ack"), ("result", "retry")]
        ),
        1.0
    );
    assert_eq!(
        metric(
            "sluice_source_settled_total",
            &[("source", "rs-ack"), ("result", "ack")]
        ),
        3.0
    );
}

#[tokio::test]
async fn a_killed_consumers_pending_entries_are_replayed_by_it_or_claimed_by_another() {
    let mut c = conn(SHARED).await;
    let stream = unique("jobs");
    let cfg = |consumer: &str| json!({"url": SHARED, "streams": [stream], "group": "g", "consumer": consumer, "claim_idle": "1s"});
    for i in 0..4 {
        xadd(&mut c, &stream, &[("job", &i.to_string())]).await;
    }
    // A reads all four and dies (its task aborted: no acknowledgement, no clean-up).
    let (mut rig_a, task_a) = start_source::<StreamsSourceConfig>("rs-kill-a", cfg("a")).await;
    let mut cap_a = rig_a.capture();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(cap_a.next_within(Duration::from_secs(10)).await);
    }
    task_a.abort();
    let _ = task_a.await;
    drop(held);
    wait_pending(&mut c, &stream, "g", 4).await;

    // Restarted under the same consumer name, it replays its own pending entries at once.
    let (mut rig_a2, task_a2) = start_source::<StreamsSourceConfig>("rs-kill-a2", cfg("a")).await;
    let mut cap_a2 = rig_a2.capture();
    let first = cap_a2.next_within(Duration::from_secs(5)).await;
    assert!(first.event.id.starts_with(&stream));
    first.delivery.delivered();
    wait_pending(&mut c, &stream, "g", 3).await;
    // ... and dies again with three in flight.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(cap_a2.next_within(Duration::from_secs(5)).await);
    }
    task_a2.abort();
    let _ = task_a2.await;
    drop(held);

    // Another replica (consumer b) takes them over once they are idle for claim_idle.
    let (mut rig_b, _task_b) = start_source::<StreamsSourceConfig>("rs-kill-b", cfg("b")).await;
    let got = rig_b.capture().auto(Status::Delivered);
    let events = got.wait_for(3).await;
    let jobs: BTreeSet<String> = events
        .iter()
        .map(|e| {
            let v: serde_json::Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
            v["job"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(jobs.len(), 3);
    wait_pending(&mut c, &stream, "g", 0).await;
    assert!(
        metric(
            "sluice_source_redeliveries_total",
            &[("source", "rs-kill-b")]
        ) >= 3.0
    );
}

#[tokio::test]
async fn streams_survive_a_connection_drop_and_a_server_restart_without_loss() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = spawn_redis(dir.path(), None);
    let port = server.port;
    let url = format!("redis://127.0.0.1:{port}");
    let stream = "events";
    let (mut rig, _task) = start_source::<StreamsSourceConfig>(
        "rs-outage",
        json!({"url": url, "streams": [stream], "group": "g", "consumer": "c", "claim_idle": "30s"}),
    )
    .await;
    let got = rig.capture().auto(Status::Delivered);
    let mut c = conn(&url).await;
    let mut added = BTreeSet::new();
    for i in 0..100 {
        added.insert(xadd(&mut c, stream, &[("n", &i.to_string())]).await);
    }
    got.wait_for(100).await;
    // Every client connection dropped by the server.
    let _: redis::Value = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query_async(&mut c)
        .await
        .unwrap();
    for i in 100..200 {
        added.insert(xadd(&mut c, stream, &[("n", &i.to_string())]).await);
    }
    got.wait_for(200).await;
    // The server is killed and started again on the same port (its append-only file keeps the
    // stream and the group); entries added meanwhile arrive once it is back.
    server.kill();
    server = spawn_redis(dir.path(), Some(port));
    let mut c = conn(&url).await;
    for i in 200..300 {
        added.insert(xadd(&mut c, stream, &[("n", &i.to_string())]).await);
    }
    let events = got.wait_for(300).await;
    let seen: BTreeSet<String> = events
        .iter()
        .map(|e| e.id.strip_prefix("events-").unwrap().to_owned())
        .collect();
    assert_eq!(seen, added, "every entry delivered");
    wait_pending(&mut c, stream, "g", 0).await;
    drop(server);
}

#[tokio::test]
async fn cloudevents_roundtrip_through_the_streams_sink_and_source() {
    let mut c = conn(SHARED).await;
    let stream = unique("ce");
    let rig = start_sink::<StreamsSinkConfig>(
        "rs-sink",
        json!({"url": SHARED, "stream": format!("{stream}.{{type}}"), "maxlen": "~1000"}),
    )
    .await;
    let mut e = Event::new("evt-1", "/orders", "created")
        .with_subject("o/1")
        .with_json(&b"{\"total\":3}"[..]);
    e.set_extension(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    let out = rig.send(vec![e.clone()]).await;
    assert_eq!(out.status, Status::Delivered, "{:?}", out.reason);
    let key = format!("{stream}.created");
    let entries: redis::streams::StreamRangeReply = c.xrange_all(&key).await.unwrap();
    assert_eq!(entries.ids.len(), 1);
    let fields = &entries.ids[0].map;
    let s = |k: &str| redis::from_redis_value::<String>(fields[k].clone()).unwrap();
    assert_eq!(s("ce_id"), "evt-1");
    assert_eq!(s("ce_type"), "created");
    assert_eq!(s("content-type"), "application/json");
    assert_eq!(s("data"), "{\"total\":3}");
    assert_sink_telemetry("rs-sink", 1, 0);

    // Read back by the source: the same event, not re-wrapped.
    let (mut src, _task) = start_source::<StreamsSourceConfig>(
        "rs-ce-src",
        json!({"url": SHARED, "streams": [key], "group": "g"}),
    )
    .await;
    let back = src.capture().deliver_next().await;
    assert_eq!(back, e);
}

#[tokio::test]
async fn the_streams_sink_appends_in_arrival_order_with_pipelines_in_flight() {
    let stream = unique("rs-order");
    let mut c = conn(SHARED).await;
    // Batches of 7: many pipelines, one after the other.
    let rig = start_sink::<StreamsSinkConfig>(
        "rs-sink-order",
        json!({"url": SHARED, "stream": stream, "batch": 7}),
    )
    .await;
    let ids: Vec<String> = (0..500).map(|i| format!("e-{i}")).collect();
    let sends = ids.chunks(50).map(|ids| {
        rig.send(
            ids.iter()
                .map(|id| Event::new(id.as_str(), "/s", "t"))
                .collect(),
        )
    });
    for out in futures_util::future::join_all(sends).await {
        assert_eq!(out.status, Status::Delivered, "{:?}", out.reason);
    }
    let entries: redis::streams::StreamRangeReply = c.xrange_all(&stream).await.unwrap();
    let got: Vec<String> = entries
        .ids
        .iter()
        .map(|e| redis::from_redis_value::<String>(e.map["ce_id"].clone()).unwrap())
        .collect();
    assert_eq!(
        got, ids,
        "the stream holds the events in the order they were queued"
    );
}

/// The next pipeline is taken and written while one waits for Redis; at the end of the grace
/// period both are settled as failed, and the one that was waiting to follow is never sent.
#[tokio::test]
async fn at_the_end_of_grace_the_pipeline_in_flight_and_the_one_built_to_follow_fail() {
    let dir = tempfile::tempdir().unwrap();
    let server = spawn_redis(dir.path(), None);
    let url = format!("redis://127.0.0.1:{}", server.port);
    let mut c = conn(&url).await;
    let rig = start_sink::<StreamsSinkConfig>(
        "rs-sink-grace",
        json!({"url": url, "stream": "out", "batch": 3, "timeout": "30s"}),
    )
    .await;
    // Writes wait on the server while it is paused: the first pipeline stays in flight.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(20_000)
        .arg("WRITE")
        .query_async(&mut c)
        .await
        .unwrap();
    let unit = |p: &str| {
        (0..3)
            .map(|i| Event::new(format!("{p}{i}"), "/s", "t"))
            .collect()
    };
    let first = rig.sender().send(unit("a")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = rig.sender().send(unit("b")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    rig.grace_over.cancel();
    for (name, pending) in [("in flight", first), ("following", second)] {
        let out = tokio::time::timeout(Duration::from_secs(5), pending)
            .await
            .unwrap_or_else(|_| {
                panic!("the {name} pipeline was not settled after the grace period")
            });
        assert_eq!(out.status, Status::Failed, "{name}: {:?}", out.reason);
        assert!(
            out.reason.as_deref().unwrap_or("").contains("grace period"),
            "{name}: {:?}",
            out.reason
        );
    }
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut c)
        .await
        .unwrap();
    // What was written before the end may still be applied; what followed never left.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let entries: redis::streams::StreamRangeReply = c.xrange_all("out").await.unwrap();
    let ids: Vec<String> = entries
        .ids
        .iter()
        .map(|e| redis::from_redis_value::<String>(e.map["ce_id"].clone()).unwrap())
        .collect();
    assert!(ids.iter().all(|id| id.starts_with('a')), "{ids:?}");
}

#[tokio::test]
async fn the_streams_sink_fails_what_redis_did_not_take() {
    let mut c = conn(SHARED).await;
    let key = unique("not-a-stream");
    let _: () = c.set(&key, "a string").await.unwrap();
    let rig =
        start_sink::<StreamsSinkConfig>("rs-sink-fail", json!({"url": SHARED, "stream": key}))
            .await;
    let out = rig.send(vec![Event::new("1", "/s", "t")]).await;
    assert_eq!(out.status, Status::Failed);
    assert!(
        out.reason.as_deref().unwrap_or("").contains("WRONGTYPE"),
        "{:?}",
        out.reason
    );

    // A server that went away: failed within the timeout, not delivered.
    let dir = tempfile::tempdir().unwrap();
    let mut server = spawn_redis(dir.path(), None);
    let url = format!("redis://127.0.0.1:{}", server.port);
    let rig =
        start_sink::<StreamsSinkConfig>("rs-sink-down", json!({"url": url, "timeout": "1s"})).await;
    assert!(rig
        .send(vec![Event::new("1", "/s", "t")])
        .await
        .is_delivered());
    server.kill();
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        rig.send(vec![Event::new("2", "/s", "t")]),
    )
    .await
    .expect("answered within the timeout");
    assert_eq!(out.status, Status::Failed);
}

#[tokio::test]
async fn argo_stream_shape() {
    let mut c = conn(SHARED).await;
    let stream = unique("argo");
    let (mut rig, _task) = start_source::<StreamsSourceConfig>(
        "rs-argo",
        json!({"url": SHARED, "streams": [stream], "format": "argo", "metadata": {"team": "a"},
               "subject": "example"}),
    )
    .await;
    let id = xadd(&mut c, &stream, &[("k", "v")]).await;
    let e = rig.capture().deliver_next().await;
    assert_eq!(
        (e.ty.as_str(), e.subject.as_deref()),
        ("redisStream", Some("example"))
    );
    let data: serde_json::Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
    assert_eq!(
        data,
        json!({"stream": stream, "message_id": id, "values": {"k": "v"}, "metadata": {"team": "a"}})
    );
}

#[tokio::test]
async fn pubsub_source_channels_patterns_and_structured_events() {
    let mut c = conn(SHARED).await;
    let ch = unique("alerts");
    let (mut rig, _task) = start_source::<PubSubSourceConfig>(
        "rp-src",
        json!({"url": SHARED, "channels": [ch], "patterns": [format!("{ch}.*")]}),
    )
    .await;
    let mut cap = rig.capture();
    let _: i64 = c.publish(&ch, "{\"level\":\"high\"}").await.unwrap();
    let e = cap.deliver_next().await;
    assert_eq!(
        (e.ty.as_str(), e.subject.as_deref()),
        ("redis", Some(ch.as_str()))
    );
    assert_eq!(e.datacontenttype.as_deref(), Some("application/json"));
    assert_eq!(e.data.as_bytes().unwrap().as_ref(), b"{\"level\":\"high\"}");
    let _: i64 = c.publish(format!("{ch}.disk"), "plain text").await.unwrap();
    let e = cap.deliver_next().await;
    assert_eq!(e.subject.as_deref(), Some(format!("{ch}.disk").as_str()));
    assert_eq!(
        e.datacontenttype.as_deref(),
        Some("text/plain; charset=utf-8")
    );
    // A structured CloudEvent is taken as it is (not re-wrapped).
    let ce = Event::new("ce-9", "/upstream", "com.example.alert").with_json(&b"[1]"[..]);
    let _: i64 = c
        .publish(&ch, sluice_core::format::encode_event(&ce))
        .await
        .unwrap();
    assert_eq!(cap.deliver_next().await, ce);
    assert_source_telemetry("rp-src", 3);
}

#[tokio::test]
async fn pubsub_argo_shape() {
    let mut c = conn(SHARED).await;
    let ch = unique("argo-ch");
    // Argo's names, as `sluice run -f` sets them: source = the EventSource, subject = the event.
    let (mut rig, _task) = start_source::<PubSubSourceConfig>(
        "rp-argo",
        json!({"url": SHARED, "channels": [ch], "format": "argo", "json_body": true,
               "source": "redis-es", "subject": "example"}),
    )
    .await;
    let _: i64 = c.publish(&ch, "{\"a\":1}").await.unwrap();
    let e = rig.capture().deliver_next().await;
    assert_eq!(
        (e.source.as_str(), e.subject.as_deref()),
        ("redis-es", Some("example"))
    );
    let data: serde_json::Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
    assert_eq!(
        data,
        json!({"channel": ch, "pattern": "", "body": {"a": 1}, "metadata": {}})
    );
}

#[tokio::test]
async fn pubsub_sink_publishes_and_can_require_a_subscriber() {
    let ch = unique("out");
    let client = redis::Client::open(SHARED).unwrap();
    let mut ps = client.get_async_pubsub().await.unwrap();
    ps.subscribe(&ch).await.unwrap();
    let rig = start_sink::<PubSubSinkConfig>(
        "rp-sink",
        json!({"url": SHARED, "channel": ch, "require_subscriber": true}),
    )
    .await;
    let e = Event::new("p-1", "/s", "t").with_json(&b"{}"[..]);
    assert!(rig.send(vec![e.clone()]).await.is_delivered());
    let msg = tokio::time::timeout(
        Duration::from_secs(5),
        futures_util::StreamExt::next(&mut ps.on_message()),
    )
    .await
    .unwrap()
    .unwrap();
    let got =
        sluice_core::format::decode_event(&bytes::Bytes::copy_from_slice(msg.get_payload_bytes()))
            .unwrap();
    assert_eq!(got, e);
    drop(ps);
    let rig2 = start_sink::<PubSubSinkConfig>(
        "rp-sink-none",
        json!({"url": SHARED, "channel": unique("nobody"), "require_subscriber": true}),
    )
    .await;
    let out = rig2.send(vec![e]).await;
    assert_eq!(out.status, Status::Failed);
    assert!(out.reason.unwrap().contains("no subscriber"));
}

#[test]
fn bad_config_is_refused_with_a_reason() {
    let cases = [
        (json!({"streams": []}), "streams is empty"),
        (
            json!({"url": "http://x", "streams": ["a"]}),
            "not a Redis URL",
        ),
        (json!({"streams": ["a", "a"]}), "listed twice"),
        // The name starts every event id and is the subject: no control characters.
        (json!({"streams": ["a\u{1}b"]}), "control character"),
        (
            json!({"streams": ["a"], "claim_idle": "10ms"}),
            "claim_idle",
        ),
    ];
    for (cfg, want) in cases {
        let c: StreamsSourceConfig = serde_json::from_value(cfg).unwrap();
        let e = c.validate("s").unwrap_err();
        assert!(e.contains(want), "{e}");
    }
    let c: PubSubSourceConfig = serde_json::from_value(json!({})).unwrap();
    assert!(c
        .validate("s")
        .unwrap_err()
        .contains("channels and patterns are both empty"));
    let c: StreamsSinkConfig = serde_json::from_value(json!({"maxlen": "~many"})).unwrap();
    assert!(c.validate("s").unwrap_err().contains("maxlen"));
    let e = serde_json::from_value::<StreamsSourceConfig>(json!({"streams": ["a"], "claim": "1s"}))
        .unwrap_err();
    assert!(e.to_string().contains("unknown field"), "{e}");
}

#[tokio::test]
async fn pubsub_drops_under_backpressure_are_counted_not_buffered_without_bound() {
    let mut c = conn(SHARED).await;
    let ch = unique("flood");
    // A pipeline that takes one event and a source buffer of four: the rest is dropped, counted.
    let cfg: PubSubSourceConfig =
        serde_json::from_value(json!({"url": SHARED, "channels": [ch], "buffer": 4})).unwrap();
    let mut rig = SourceRig::with_queue("rp-drop", 1, sluice_core::pipeline::WhenFull::Block);
    let running = Box::new(cfg)
        .build(rig.context("rp-drop"))
        .await
        .expect("builds");
    tokio::spawn(running);
    let mut cap = rig.capture();
    for i in 0..200 {
        let _: i64 = c.publish(&ch, format!("{i}")).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let dropped = loop {
        let d = metric(
            "sluice_events_dropped_total",
            &[("source", "rp-drop"), ("reason", "slow_consumer")],
        );
        if d >= 190.0 {
            break d;
        }
        assert!(tokio::time::Instant::now() < deadline, "dropped {d}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // What was kept still arrives.
    let mut kept = 0;
    while let Ok(item) = tokio::time::timeout(Duration::from_millis(300), cap.next_or_end()).await {
        item.expect("open").delivery.delivered();
        kept += 1;
    }
    assert_eq!(
        kept as f64 + dropped,
        200.0,
        "every message either delivered or counted"
    );
}

#[tokio::test]
async fn tls_with_client_certificates() {
    use sluice_core::testkit::peers::spawn_server_on;
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let pki = sluice_core::testkit::pki();
    let dir = pki.dir.path().to_path_buf();
    let d = dir.clone();
    let server = spawn_server_on("redis-server", &dir, None, move |p| {
        let f = |n: &str| d.join(n).display().to_string();
        [
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            p.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--tls-cert-file".into(),
            f("server.pem"),
            "--tls-key-file".into(),
            f("server.key"),
            "--tls-ca-cert-file".into(),
            f("ca.pem"),
            "--tls-auth-clients".into(),
            "yes".into(),
        ]
        .to_vec()
    });
    let url = format!("rediss://localhost:{}", server.port);
    let tls = json!({"ca": dir.join("ca.pem"), "cert": dir.join("client.pem"), "key": dir.join("client.key")});
    let sink = start_sink::<StreamsSinkConfig>(
        "rs-tls-sink",
        json!({"url": url, "stream": "secure", "tls": tls}),
    )
    .await;
    let (mut rig, _t) = start_source::<StreamsSourceConfig>(
        "rs-tls-src",
        json!({"url": url, "streams": ["secure"], "tls": tls}),
    )
    .await;
    let e = Event::new("tls-1", "/s", "t").with_json(&b"{\"secure\":true}"[..]);
    assert!(sink.send(vec![e.clone()]).await.is_delivered());
    assert_eq!(rig.capture().deliver_next().await, e);
    // Without the client certificate the server refuses: a clear build error.
    let cfg: StreamsSourceConfig = serde_json::from_value(
        json!({"url": url, "streams": ["secure"], "tls": {"ca": dir.join("ca.pem")}}),
    )
    .unwrap();
    let mut rig = SourceRig::new("rs-tls-nocert");
    let err = Box::new(cfg)
        .build(rig.context("rs-tls-nocert"))
        .await
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .contains("redis-streams source rs-tls-nocert"),
        "{err}"
    );
}

#[tokio::test]
async fn passes_the_pull_source_compliance_check() {
    let stream = unique("compliance");
    let s = stream.clone();
    let mut next = 0usize;
    sluice_core::testkit::pull_source_compliance::<StreamsSourceConfig>(
        "rs-compliance",
        json!({"url": SHARED, "streams": [stream], "group": "g", "consumer": "c", "claim_idle": "30s"}),
        json!({"url": SHARED, "streams": []}),
        move |k| {
            let (s, from) = (s.clone(), next);
            next += k;
            Box::pin(async move {
                let mut c = conn(SHARED).await;
                for i in from..from + k {
                    xadd(&mut c, &s, &[("n", &i.to_string())]).await;
                }
            })
        },
    )
    .await;
}

/// Every entry of `stream`, each as its fields' bytes concatenated.
async fn stream_records(url: &str, stream: &str) -> Vec<Vec<u8>> {
    let mut c = conn(url).await;
    let entries: redis::streams::StreamRangeReply = c.xrange_all(stream).await.unwrap();
    entries
        .ids
        .into_iter()
        .map(|e| {
            let mut out = Vec::new();
            for v in e.map.values() {
                if let redis::Value::BulkString(b) = v {
                    out.extend_from_slice(b);
                }
            }
            out
        })
        .collect()
}

#[tokio::test]
async fn the_streams_sink_passes_the_sink_compliance_check() {
    let stream = unique("sink-compliance");
    let s = stream.clone();
    sluice_core::testkit::sink_compliance::<StreamsSinkConfig>(
        "rs-sink-compliance",
        json!({"url": SHARED, "stream": stream}),
        json!({"url": SHARED, "stream": stream, "batch": 0}),
        json!({"url": format!("redis://127.0.0.1:{}", sluice_core::testkit::free_port()), "stream": stream, "timeout": "1s"}),
        move || {
            let s = s.clone();
            Box::pin(async move { stream_records(SHARED, &s).await })
        },
    )
    .await;
}

/// The shared sink compliance check on the Pub/Sub sink with `require_subscriber`: a
/// subscriber holds what was published (read as it arrives; each look waits until nothing
/// more comes for 300 ms).
#[tokio::test]
async fn the_pubsub_sink_passes_the_sink_compliance_check() {
    let ch = unique("sink-compliance");
    let client = redis::Client::open(SHARED).unwrap();
    let mut ps = client.get_async_pubsub().await.unwrap();
    ps.subscribe(&ch).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        let mut s = ps.on_message();
        while let Some(m) = futures_util::StreamExt::next(&mut s).await {
            let _ = tx.send(m.get_payload_bytes().to_vec());
        }
    });
    let rx = std::sync::Arc::new(tokio::sync::Mutex::new(rx));
    let got = std::sync::Arc::new(tokio::sync::Mutex::new(Vec::<Vec<u8>>::new()));
    sluice_core::testkit::sink_compliance::<PubSubSinkConfig>(
        "rp-sink-compliance",
        json!({"url": SHARED, "channel": ch, "require_subscriber": true}),
        json!({"url": SHARED, "channel": ch, "batch": 0}),
        json!({"url": format!("redis://127.0.0.1:{}", sluice_core::testkit::free_port()), "channel": ch, "timeout": "1s"}),
        move || {
            let (rx, got) = (rx.clone(), got.clone());
            Box::pin(async move {
                let mut rx = rx.lock().await;
                let mut got = got.lock().await;
                while let Ok(Some(p)) =
                    tokio::time::timeout(Duration::from_millis(300), rx.recv()).await
                {
                    got.push(p);
                }
                got.clone()
            })
        },
    )
    .await;
}
