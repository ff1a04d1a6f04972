//! The AWS connectors against moto's server (S3, SQS, SNS over their real HTTP APIs), one
//! server per test on a free port (`scripts/test.sh` installs moto in `target/motoenv`), and the
//! SNS endpoint against messages signed by a test certificate served over HTTPS (`sns`).

mod sns;

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName};
use serde_json::json;
use sluice_aws::{S3SourceConfig, SnsSinkConfig, SqsSinkConfig, SqsSourceConfig};
use sluice_core::event::Event;
use sluice_core::state::StateStore;
use sluice_core::testkit::peers::{spawn_moto, ServerProcess};
use sluice_core::testkit::{self, start_sink, start_source, SourceRig};
use sluice_core::{ExtValue, SourceConfig, Status};

/// A moto server on a free port (the test kit's), with its log directory.
struct Moto {
    _server: ServerProcess,
    _dir: tempfile::TempDir,
    url: String,
}

async fn moto() -> Moto {
    let dir = tempfile::tempdir().unwrap();
    let server = spawn_moto(dir.path());
    Moto {
        url: format!("http://127.0.0.1:{}", server.port),
        _server: server,
        _dir: dir,
    }
}

/// Stops a source and checks it returned by itself without an error.
async fn stop(rig: SourceRig, task: testkit::Task) {
    rig.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the source returned after its drain")
        .expect("the task ran")
        .expect("the source ended without an error");
}

async fn sdk(m: &Moto) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(&m.url)
        .load()
        .await
}

async fn sqs(m: &Moto) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&sdk(m).await)
}

async fn queue(
    c: &aws_sdk_sqs::Client,
    name: &str,
    attrs: &[(QueueAttributeName, String)],
) -> String {
    let mut call = c.create_queue().queue_name(name);
    for (k, v) in attrs {
        call = call.attributes(k.clone(), v);
    }
    call.send().await.unwrap().queue_url.unwrap()
}

async fn arn_of(c: &aws_sdk_sqs::Client, url: &str) -> String {
    c.get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap()
        .remove(&QueueAttributeName::QueueArn)
        .unwrap()
}

/// (visible, in flight) messages of a queue.
async fn counts(c: &aws_sdk_sqs::Client, url: &str) -> (u64, u64) {
    let a = c
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap();
    let n = |k: QueueAttributeName| a.get(&k).unwrap().parse::<u64>().unwrap();
    (
        n(QueueAttributeName::ApproximateNumberOfMessages),
        n(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    )
}

async fn wait_counts(c: &aws_sdk_sqs::Client, url: &str, want: (u64, u64)) {
    let mut got = (u64::MAX, u64::MAX);
    for _ in 0..100 {
        got = counts(c, url).await;
        if got == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("queue {url}: (visible, in flight) = {got:?}, expected {want:?}");
}

async fn send(c: &aws_sdk_sqs::Client, url: &str, body: &str) -> String {
    c.send_message()
        .queue_url(url)
        .message_body(body)
        .message_attributes(
            "Trace-Id",
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(format!("t-{body}"))
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap()
        .message_id
        .unwrap()
}

fn source_cfg(m: &Moto, queue: &str) -> serde_json::Value {
    json!({
        "queue": queue,
        "endpoint": m.url,
        "region": "us-east-1",
        "visibility_timeout": "2s",
        "max_extension": "2s",
        "wait_time": "1s",
    })
}

fn text(e: &Event) -> String {
    String::from_utf8(e.data.as_bytes().unwrap().to_vec()).unwrap()
}

#[tokio::test]
async fn sqs_source_deletes_only_delivered_messages_and_a_failed_one_comes_back() {
    let m = moto().await;
    let c = sqs(&m).await;
    let url = queue(&c, "jobs", &[]).await;
    let arn = arn_of(&c, &url).await;
    let mut ids = Vec::new();
    for b in ["a", "b", "c"] {
        ids.push(send(&c, &url, b).await);
    }
    let mut cfg = source_cfg(&m, "jobs");
    cfg["max_extension"] = json!("1h");
    let (mut rig, task) = start_source::<SqsSourceConfig>("jobs", cfg).await;
    let mut cap = rig.capture();
    let mut failed_id = None;
    for _ in 0..3 {
        let item = cap.next_within(Duration::from_secs(10)).await;
        let e = &item.event;
        assert!(
            ids.iter().any(|i| *i == e.id),
            "id is the MessageId: {}",
            e.id
        );
        assert_eq!(e.source, arn, "source is the queue ARN");
        assert_eq!(e.ty, "com.amazonaws.sqs.message");
        assert_eq!(
            e.extension("traceid"),
            Some(&ExtValue::String(format!("t-{}", text(e)).into()))
        );
        assert!(e.time.is_some(), "time from SentTimestamp");
        if text(e) == "b" {
            failed_id = Some(e.id.clone());
            item.delivery.failed("test: sink down");
        } else {
            item.delivery.delivered();
        }
    }
    // Two deleted; the failed one is hidden for its backoff, then handed out again.
    let again = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(
        Some(&again.event.id),
        failed_id.as_ref(),
        "the failed message came back, same id"
    );
    assert_eq!(text(&again.event), "b");
    again.delivery.delivered();
    wait_counts(&c, &url, (0, 0)).await;
    assert!(cap.try_next().is_none());
    stop(rig, task).await;
    assert!(
        testkit::metric(
            "sluice_aws_api_calls_total",
            &[
                ("connector", "jobs"),
                ("call", "DeleteMessageBatch"),
                ("result", "ok")
            ]
        ) >= 1.0
    );
    assert!(
        testkit::metric(
            sluice_core::telemetry::SOURCE_SETTLED,
            &[("source", "jobs"), ("result", "retry")]
        ) >= 1.0
    );
}

#[tokio::test]
async fn sqs_visibility_is_extended_while_the_sink_is_slow() {
    let m = moto().await;
    let c = sqs(&m).await;
    let url = queue(&c, "slow", &[]).await;
    send(&c, &url, "x").await;
    let mut cfg = source_cfg(&m, "slow");
    cfg["max_extension"] = json!("1h");
    let (mut rig, task) = start_source::<SqsSourceConfig>("slow", cfg).await;
    let mut cap = rig.capture();
    let item = cap.next_within(Duration::from_secs(10)).await;
    // Three visibility timeouts later the message is still hidden: nobody else can take it.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(counts(&c, &url).await, (0, 1), "hidden while in flight");
    }
    let other = c.receive_message().queue_url(&url).send().await.unwrap();
    assert!(
        other.messages.unwrap_or_default().is_empty(),
        "another consumer got it"
    );
    assert!(cap.try_next().is_none(), "not handed out twice");
    assert!(
        testkit::metric(
            sluice_core::telemetry::SOURCE_LEASE_EXTENSIONS,
            &[("source", "slow")]
        ) >= 2.0
    );
    item.delivery.delivered();
    wait_counts(&c, &url, (0, 0)).await;
    stop(rig, task).await;
}

#[tokio::test]
async fn sqs_rejected_and_invalid_messages_go_to_the_dead_letter_queue() {
    let m = moto().await;
    let c = sqs(&m).await;
    let dlq = queue(&c, "jobs-dlq", &[]).await;
    let dlq_arn = arn_of(&c, &dlq).await;
    let policy = json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "5"}).to_string();
    let url = queue(&c, "jobs2", &[(QueueAttributeName::RedrivePolicy, policy)]).await;
    send(&c, &url, "refused").await;
    send(&c, &url, r#"{"specversion":"1.0","id":""}"#).await; // a broken structured CloudEvent
    let (mut rig, task) = start_source::<SqsSourceConfig>("jobs2", source_cfg(&m, "jobs2")).await;
    let mut cap = rig.capture();
    let item = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(text(&item.event), "refused");
    item.delivery.rejected("test: schema mismatch");
    wait_counts(&c, &url, (0, 0)).await;
    wait_counts(&c, &dlq, (2, 0)).await;
    let moved = c
        .receive_message()
        .queue_url(&dlq)
        .max_number_of_messages(10)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap()
        .messages
        .unwrap();
    let mut bodies: Vec<String> = moved.iter().map(|m| m.body.clone().unwrap()).collect();
    bodies.sort();
    assert_eq!(bodies, ["refused", r#"{"specversion":"1.0","id":""}"#]);
    let refused = moved
        .iter()
        .find(|m| m.body.as_deref() == Some("refused"))
        .unwrap();
    assert!(
        refused
            .message_attributes
            .as_ref()
            .unwrap()
            .contains_key("Trace-Id"),
        "attributes moved along"
    );
    assert!(
        testkit::metric(
            sluice_core::telemetry::EVENTS_REJECTED,
            &[("source", "jobs2"), ("reason", "invalid_event")]
        ) >= 1.0
    );
    stop(rig, task).await;
}

#[tokio::test]
async fn sqs_sink_to_sqs_source_carries_cloudevents_both_modes_and_fifo_dedup() {
    let m = moto().await;
    let c = sqs(&m).await;
    queue(&c, "ce-binary", &[]).await;
    queue(&c, "ce-structured", &[]).await;
    let fifo = queue(
        &c,
        "ce.fifo",
        &[(QueueAttributeName::FifoQueue, "true".into())],
    )
    .await;
    let mut e = Event::new("evt-1", "/orders", "order.created").with_json(&b"{\"n\":1}"[..]);
    e.set_extension("tenant", "acme");
    for (q, mode) in [("ce-binary", "binary"), ("ce-structured", "structured")] {
        let sink = start_sink::<SqsSinkConfig>(
            &format!("out-{q}"),
            json!({"queue": q, "mode": mode, "endpoint": m.url, "region": "us-east-1"}),
        )
        .await;
        let o = sink.send(vec![e.clone()]).await;
        assert_eq!(o.status, Status::Delivered, "{q}: {:?}", o.reason);
        let (mut rig, task) =
            start_source::<SqsSourceConfig>(&format!("in-{q}"), source_cfg(&m, q)).await;
        let mut cap = rig.capture();
        let got = cap.next_within(Duration::from_secs(10)).await;
        assert_eq!(
            *got.event, e,
            "{q}: the CloudEvent passed through untouched"
        );
        got.delivery.delivered();
        rig.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
    // FIFO: the deduplication id is the event's dedup key, so a resend is dropped by SQS.
    let sink = start_sink::<SqsSinkConfig>(
        "out-fifo",
        json!({"queue": "ce.fifo", "group_id": "{tenant}", "endpoint": m.url, "region": "us-east-1"}),
    )
    .await;
    for _ in 0..2 {
        assert_eq!(sink.send(vec![e.clone()]).await.status, Status::Delivered);
    }
    let got = c
        .receive_message()
        .queue_url(&fifo)
        .max_number_of_messages(10)
        .message_system_attribute_names(
            aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId,
        )
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default();
    assert_eq!(got.len(), 1, "the resend was deduplicated by SQS");
    let group = got[0]
        .attributes
        .as_ref()
        .unwrap()
        .get(&aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId);
    assert_eq!(group.map(String::as_str), Some("acme"));
}

#[tokio::test]
async fn sqs_sink_fails_only_the_refused_entries_of_a_batch() {
    let m = moto().await;
    let c = sqs(&m).await;
    let url = queue(
        &c,
        "limits",
        &[(QueueAttributeName::MaximumMessageSize, "1024".into())],
    )
    .await;
    let sink = start_sink::<SqsSinkConfig>(
        "limits-out",
        json!({"queue": "limits", "endpoint": m.url, "region": "us-east-1"}),
    )
    .await;
    let small = Event::new("s", "/t", "t").with_json(&b"1"[..]);
    let big =
        Event::new("b", "/t", "t").with_json(format!("\"{}\"", "x".repeat(4000)).into_bytes());
    let (a, b) = tokio::join!(sink.send(vec![small]), sink.send(vec![big]));
    assert_eq!(a.status, Status::Delivered, "{:?}", a.reason);
    assert_ne!(
        b.status,
        Status::Delivered,
        "an entry over the queue's size limit is not delivered"
    );
    wait_counts(&c, &url, (1, 0)).await;
}

async fn s3(m: &Moto) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::config::Builder::from(&sdk(m).await)
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

async fn put(s: &aws_sdk_s3::Client, bucket: &str, key: &str, body: &str) {
    s.put_object()
        .bucket(bucket)
        .key(key)
        .body(body.as_bytes().to_vec().into())
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn s3_notifications_one_event_per_record_filtered_and_test_event_skipped() {
    let m = moto().await;
    let c = sqs(&m).await;
    let url = queue(&c, "uploads-events", &[]).await;
    let arn = arn_of(&c, &url).await;
    let s = s3(&m).await;
    s.create_bucket().bucket("data").send().await.unwrap();
    s.put_bucket_notification_configuration()
        .bucket("data")
        .notification_configuration(
            aws_sdk_s3::types::NotificationConfiguration::builder()
                .queue_configurations(
                    aws_sdk_s3::types::QueueConfiguration::builder()
                        .queue_arn(&arn)
                        .events(aws_sdk_s3::types::Event::from("s3:ObjectCreated:*"))
                        .build()
                        .unwrap(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    put(&s, "data", "incoming/day 1.csv", "a,b").await;
    put(&s, "data", "incoming/run.log", "log").await;
    let mut cfg = source_cfg(&m, "uploads-events");
    cfg["events"] = json!(["s3:ObjectCreated:*"]);
    cfg["filter"] = json!({"prefix": "incoming/", "suffix": ".csv"});
    let (mut rig, task) = start_source::<S3SourceConfig>("uploads", cfg).await;
    let mut cap = rig.capture();
    let item = cap.next_within(Duration::from_secs(10)).await;
    let e = &item.event;
    assert_eq!(e.ty, "com.amazonaws.s3.ObjectCreated:Put");
    assert_eq!(e.source, "aws:s3.us-east-1.data");
    assert_eq!(
        e.subject.as_deref(),
        Some("incoming/day 1.csv"),
        "the key, URL-decoded"
    );
    assert!(e.id.contains('.'), "id = request id . id-2: {}", e.id);
    let data: serde_json::Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
    assert_eq!(data["s3"]["bucket"]["name"], "data");
    item.delivery.delivered();
    // The test event and the .log record were deleted as filtered; the .csv one once delivered.
    wait_counts(&c, &url, (0, 0)).await;
    cap.assert_quiet(
        Duration::from_millis(300),
        "only the .csv upload made an event",
    )
    .await;
    assert!(
        testkit::metric(
            sluice_core::telemetry::EVENTS_FILTERED,
            &[("source", "uploads")]
        ) >= 2.0
    );
    stop(rig, task).await;
}

#[tokio::test]
async fn s3_poll_mode_emits_new_and_changed_objects_once_across_a_restart() {
    let m = moto().await;
    let s = s3(&m).await;
    s.create_bucket().bucket("store").send().await.unwrap();
    for k in ["incoming/1.csv", "incoming/2.csv", "other/x.csv"] {
        put(&s, "store", k, k).await;
    }
    let cfg = json!({"mode": "poll", "bucket": "store", "prefix": "incoming/", "interval": "1s",
                     "endpoint": m.url, "region": "us-east-1"});
    let state = Arc::new(sluice_core::state::MemoryStateStore::default());
    let run = |name: &'static str| {
        let cfg = cfg.clone();
        let state = state.clone();
        async move {
            let c: S3SourceConfig = serde_json::from_value(cfg).unwrap();
            c.validate(name).unwrap();
            let mut rig = SourceRig::new(name);
            let mut ctx = rig.context(name);
            ctx.state = Some(state as Arc<dyn StateStore>);
            let running = Box::new(c).build(ctx).await.unwrap();
            let task = tokio::spawn(running);
            (rig, task)
        }
    };
    let (mut rig, task) = run("poll").await;
    let mut cap = rig.capture();
    let mut keys = Vec::new();
    for _ in 0..2 {
        let item = cap.next_within(Duration::from_secs(10)).await;
        keys.push(item.event.subject.clone().unwrap());
        assert_eq!(item.event.ty, "com.amazonaws.s3.ObjectCreated:Poll");
        item.delivery.delivered();
    }
    keys.sort();
    assert_eq!(keys, ["incoming/1.csv", "incoming/2.csv"]);
    cap.assert_quiet(
        Duration::from_millis(2500),
        "nothing emitted twice by the next listings",
    )
    .await;
    stop(rig, task).await;

    // While it is down: one new object, one changed.
    put(&s, "store", "incoming/3.csv", "new").await;
    put(&s, "store", "incoming/1.csv", "changed").await;
    // The same source name: its remembered objects are its own.
    let (mut rig, task) = run("poll").await;
    let mut cap = rig.capture();
    let mut got = Vec::new();
    for _ in 0..2 {
        let item = cap.next_within(Duration::from_secs(10)).await;
        got.push(item.event.subject.clone().unwrap());
        item.delivery.delivered();
    }
    got.sort();
    assert_eq!(
        got,
        ["incoming/1.csv", "incoming/3.csv"],
        "the changed and the new one, nothing else"
    );
    cap.assert_quiet(Duration::from_millis(2500), "nothing more")
        .await;
    stop(rig, task).await;
}

#[tokio::test]
async fn sns_sink_publishes_to_a_topic_and_fifo_topics_deduplicate() {
    let m = moto().await;
    let c = sqs(&m).await;
    let sns = aws_sdk_sns::Client::new(&sdk(&m).await);
    let (topic, _) = topic_into_queue(&m, &c, "out", "fanout-q").await;
    let sink = start_sink::<SnsSinkConfig>(
        "fanout",
        json!({"topic_arn": topic, "endpoint": m.url, "region": "us-east-1"}),
    )
    .await;
    let e = Event::new("n-1", "/alerts", "alert.raised").with_json(&b"{\"level\":3}"[..]);
    let empty = Event::new("n-2", "/alerts", "alert.cleared");
    let o = sink.send(vec![e.clone(), empty.clone()]).await;
    assert_eq!(o.status, Status::Delivered, "{:?}", o.reason);
    // Read back through the SQS source: the CloudEvents come out as they went in.
    let (mut rig, task) =
        start_source::<SqsSourceConfig>("fanout-in", source_cfg(&m, "fanout-q")).await;
    let mut cap = rig.capture();
    let mut got = Vec::new();
    for _ in 0..2 {
        let item = cap.next_within(Duration::from_secs(10)).await;
        got.push((*item.event).clone());
        item.delivery.delivered();
    }
    got.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(got, [e.clone(), empty]);
    rig.shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;

    let fifo = sns
        .create_topic()
        .name("out.fifo")
        .attributes("FifoTopic", "true")
        .send()
        .await
        .unwrap()
        .topic_arn
        .unwrap();
    let sink = start_sink::<SnsSinkConfig>(
        "fanout-fifo",
        json!({"topic_arn": fifo, "endpoint": m.url, "region": "us-east-1"}),
    )
    .await;
    assert_eq!(sink.send(vec![e]).await.status, Status::Delivered);
}

#[tokio::test]
async fn sqs_source_passes_the_pull_source_compliance_check() {
    let m = moto().await;
    let c = sqs(&m).await;
    let url = queue(&c, "compliance", &[]).await;
    let mut n = 0;
    let put = move |k: usize| {
        let c = c.clone();
        let url = url.clone();
        let start = n;
        n += k;
        Box::pin(async move {
            for i in start..start + k {
                send(&c, &url, &format!("m{i}")).await;
            }
        }) as sluice_core::BoxFuture<'static, ()>
    };
    let mut bad = source_cfg(&m, "compliance");
    bad["max_messages"] = json!(11);
    testkit::pull_source_compliance::<SqsSourceConfig>(
        "sqs-compliance",
        source_cfg(&m, "compliance"),
        bad,
        put,
    )
    .await;
}

#[tokio::test]
async fn assume_role_takes_credentials_from_sts() {
    let m = moto().await;
    let c = sqs(&m).await;
    let url = queue(&c, "assumed", &[]).await;
    // moto's STS answers AssumeRole; the SQS calls then carry the role's temporary credentials
    // (a failing AssumeRole fails every call, so the send below would not be delivered).
    let sink = start_sink::<SqsSinkConfig>(
        "assumed-out",
        json!({"queue": "assumed", "endpoint": m.url, "region": "us-east-1",
               "assume_role": {"role_arn": "arn:aws:iam::123456789012:role/sluice-writer", "external_id": "x-1"}}),
    )
    .await;
    let o = sink
        .send(vec![Event::new("a-1", "/t", "t").with_json(&b"1"[..])])
        .await;
    assert_eq!(o.status, Status::Delivered, "{:?}", o.reason);
    wait_counts(&c, &url, (1, 0)).await;
}

/// The shared sink compliance check (`testkit::sink_compliance`) on the SQS sink.
#[tokio::test]
async fn sqs_sink_passes_the_sink_compliance_check() {
    let m = moto().await;
    let c = sqs(&m).await;
    let url = queue(&c, "sink-compliance", &[]).await;
    let got = std::sync::Arc::new(tokio::sync::Mutex::new(Vec::<Vec<u8>>::new()));
    let (c2, g) = (c.clone(), got.clone());
    testkit::sink_compliance::<SqsSinkConfig>(
        "sqs-sink-compliance",
        json!({"queue": "sink-compliance", "endpoint": m.url, "region": "us-east-1"}),
        json!({"queue": "", "endpoint": m.url}),
        json!({"queue": "sink-compliance", "region": "us-east-1",
            "endpoint": format!("http://127.0.0.1:{}", testkit::free_port()), "timeout": "2s"}),
        move || {
            let (c, url, g) = (c2.clone(), url.clone(), g.clone());
            Box::pin(async move { take_all(&c, &url, &g).await })
        },
    )
    .await;
}

/// Receives and deletes every message of the queue, adding the bodies to `got`; returns all
/// bodies taken so far.
async fn take_all(
    c: &aws_sdk_sqs::Client,
    url: &str,
    got: &tokio::sync::Mutex<Vec<Vec<u8>>>,
) -> Vec<Vec<u8>> {
    let mut got = got.lock().await;
    loop {
        let r = c
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .send()
            .await
            .unwrap();
        let msgs = r.messages.unwrap_or_default();
        if msgs.is_empty() {
            break;
        }
        for msg in msgs {
            got.push(msg.body.unwrap_or_default().into_bytes());
            c.delete_message()
                .queue_url(url)
                .receipt_handle(msg.receipt_handle.unwrap())
                .send()
                .await
                .unwrap();
        }
    }
    got.clone()
}

/// The shared sink compliance check on the SNS sink: the topic fans out to an SQS queue
/// (raw delivery), which is read back.
#[tokio::test]
async fn sns_sink_passes_the_sink_compliance_check() {
    let m = moto().await;
    let c = sqs(&m).await;
    let (topic, url) = topic_into_queue(&m, &c, "sns-compliance", "sns-compliance-q").await;
    let got = std::sync::Arc::new(tokio::sync::Mutex::new(Vec::<Vec<u8>>::new()));
    testkit::sink_compliance::<SnsSinkConfig>(
        "sns-sink-compliance",
        json!({"topic_arn": topic, "endpoint": m.url, "region": "us-east-1"}),
        json!({"topic_arn": "alerts", "endpoint": m.url}),
        json!({"topic_arn": topic, "region": "us-east-1",
            "endpoint": format!("http://127.0.0.1:{}", testkit::free_port()), "timeout": "2s"}),
        move || {
            let (c, url, g) = (c.clone(), url.clone(), got.clone());
            Box::pin(async move { take_all(&c, &url, &g).await })
        },
    )
    .await;
}

/// The pull-source compliance check on the s3 source (notification mode: an SQS consumer of
/// the bucket's notifications).
#[tokio::test]
async fn s3_source_passes_the_pull_source_compliance_check() {
    let m = moto().await;
    let c = sqs(&m).await;
    let url = queue(&c, "s3-compliance", &[]).await;
    let mut n = 0;
    let put = move |k: usize| {
        let (c, url, start) = (c.clone(), url.clone(), n);
        n += k;
        Box::pin(async move {
            for i in start..start + k {
                let record = json!({"Records": [{"eventVersion": "2.1", "eventSource": "aws:s3",
                    "awsRegion": "us-east-1", "eventTime": "2026-12-07T10:00:00.000Z",
                    "eventName": "ObjectCreated:Put",
                    "responseElements": {"x-amz-request-id": format!("R{i}"), "x-amz-id-2": format!("I{i}")},
                    "s3": {"s3SchemaVersion": "1.0", "bucket": {"name": "b", "arn": "arn:aws:s3:::b"},
                           "object": {"key": format!("k{i}.csv"), "size": 1, "sequencer": "00"}}}]});
                send(&c, &url, &record.to_string()).await;
            }
        }) as sluice_core::BoxFuture<'static, ()>
    };
    let mut bad = source_cfg(&m, "s3-compliance");
    bad["max_messages"] = json!(11);
    testkit::pull_source_compliance::<S3SourceConfig>(
        "s3-compliance",
        source_cfg(&m, "s3-compliance"),
        bad,
        put,
    )
    .await;
}

/// An SNS topic delivering every message (raw) into a new SQS queue: the topic's ARN and the
/// queue's URL.
async fn topic_into_queue(
    m: &Moto,
    c: &aws_sdk_sqs::Client,
    topic: &str,
    queue_name: &str,
) -> (String, String) {
    let sns = aws_sdk_sns::Client::new(&sdk(m).await);
    let url = queue(c, queue_name, &[]).await;
    let qarn = arn_of(c, &url).await;
    let arn = sns
        .create_topic()
        .name(topic)
        .send()
        .await
        .unwrap()
        .topic_arn
        .unwrap();
    sns.subscribe()
        .topic_arn(&arn)
        .protocol("sqs")
        .endpoint(&qarn)
        .attributes("RawMessageDelivery", "true")
        .send()
        .await
        .unwrap();
    (arn, url)
}
