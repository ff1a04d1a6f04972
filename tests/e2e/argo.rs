//! Argo Events manifests through the binary: `run -f`, `validate -f`, `convert`, the
//! EventBus on a real nats-server.

use super::*;

/// A manifest of Argo's own corpus (`tests/argo/corpus`), as Argo ships it.
fn corpus(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/argo/corpus")
        .join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Argo's webhook EventSource example, listening on `port` instead of 12000.
fn webhook_es(port: u16) -> String {
    corpus("event-sources/webhook.yaml").replace("\"12000\"", &format!("\"{port}\""))
}

/// Argo's http-trigger Sensor example, its dependency pointed at event `example` of
/// EventSource `es` (instead of minio's), its payload reading the webhook's `body.bucket`, and
/// its trigger posting to `127.0.0.1:<target>/hello`.
fn http_sensor(es: &str, target: u16) -> String {
    corpus("sensors/http-trigger.yaml")
        .replace("eventSourceName: minio", &format!("eventSourceName: {es}"))
        .replace("notification.0.s3.bucket.name", "body.bucket")
        .replace(
            "http://http-server.argo-events.svc:8090/hello",
            &format!("http://127.0.0.1:{target}/hello"),
        )
}

/// Argo Events' own examples through the binary (`sluice run -f`): the webhook EventSource with
/// a Sensor whose http trigger builds a body from the event, and the calendar EventSource with
/// the log Sensor, in one process with no bus.
#[tokio::test]
async fn argo_manifests_run_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let (target, mut got) = scripted_target(vec![("/hello", vec![200])]).await;
    let port = free_port();
    // The examples as Argo ships them, but for the listen port and the trigger's URL; the
    // http-trigger Sensor's dependency is pointed at the webhook example instead of minio.
    let files = [
        ("webhook-es.yaml", webhook_es(port)),
        ("http-sensor.yaml", http_sensor("webhook", target)),
        ("calendar-es.yaml", corpus("event-sources/calendar.yaml")),
        ("log-sensor.yaml", corpus("sensors/log.yaml")),
    ];
    let mut args = Vec::new();
    for (name, text) in &files {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        args.push("-f".to_owned());
        args.push(p.display().to_string());
    }
    let out = Command::new(BIN)
        .arg("validate")
        .args(&args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ok (") && stdout.contains("2 processors, 2 sinks"),
        "{stdout}"
    );
    // Kubernetes-only fields are noted at their place in the manifest.
    assert!(
        stdout.contains("webhook-es.yaml:7:5: spec.service.ports"),
        "{stdout}"
    );

    let mut d = Daemon::start_with_args(dir.path(), "", &args);
    d.wait_ready().await;
    let hook = SocketAddr::from(([127, 0, 0, 1], port));
    let (status, _) = request(
        hook,
        "POST",
        "/example",
        &[("content-type", "application/json")],
        br#"{"bucket": "uploads"}"#,
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    let (path, body) = tokio::time::timeout(Duration::from_secs(10), got.recv())
        .await
        .expect("the http trigger ran")
        .unwrap();
    assert_eq!(path, "/hello");
    // Argo's payload: `bucket` from the data (Argo's webhook shape: {header, body}), `type` from
    // the context (the EventSource type, as Argo sets it).
    assert_eq!(
        body,
        serde_json::json!({"bucket": "uploads", "type": "webhook"})
    );

    // The calendar ticks every 10 s; the log trigger writes the event Argo would have sent.
    let line = tokio::task::spawn_blocking(move || {
        let l = d
            .lines
            .recv_timeout(Duration::from_secs(25))
            .expect("a calendar event");
        (l, d)
    })
    .await
    .unwrap();
    let (line, d) = line;
    let ev: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(ev["type"], "calendar");
    assert_eq!(ev["source"], "calendar");
    assert_eq!(ev["subject"], "example-with-interval");
    assert!(ev["data"]["eventTime"].is_string(), "{ev}");
    assert!(d.stop().success());
}

/// Argo's `aws-sqs` EventSource and Sensor examples through the binary: a message on the queue
/// (moto) makes the Sensor's k8s trigger create the Workflow on the test API server, with the
/// message body as its parameter and Argo's labels. The examples' secrets come from the
/// environment (`SLUICE_SECRET_<NAME>_<KEY>`).
#[tokio::test]
async fn argo_sqs_example_creates_the_workflow() {
    let kubeconfig = test_kubeconfig();
    let ns = format!("argo-sqs-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let moto = sluice_core::testkit::peers::spawn_moto(dir.path());
    let moto_url = format!("http://127.0.0.1:{}", moto.port);
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(&moto_url)
        .load()
        .await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue_url = sqs
        .create_queue()
        .queue_name("test")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    // The examples as Argo ships them, with the endpoint of the test AWS and a namespace.
    let es = corpus("event-sources/aws-sqs.yaml").replace(
        "queue: test",
        &format!("queue: test\n      endpoint: {moto_url}"),
    );
    let sensor = corpus("sensors/aws-sqs.yaml").replace(
        "  name: aws-sqs\n",
        &format!("  name: aws-sqs\n  namespace: {ns}\n"),
    );
    let (es_path, sensor_path) = (dir.path().join("es.yaml"), dir.path().join("sensor.yaml"));
    std::fs::write(&es_path, es).unwrap();
    std::fs::write(&sensor_path, sensor).unwrap();
    // Inherited by the daemon: its secrets and the cluster it acts on.
    std::env::set_var("SLUICE_SECRET_AWS_SECRET_ACCESSKEY", "test");
    std::env::set_var("SLUICE_SECRET_AWS_SECRET_SECRETKEY", "test");
    std::env::set_var("KUBECONFIG", &kubeconfig);
    let args: Vec<String> = [
        "-f",
        &es_path.display().to_string(),
        "-f",
        &sensor_path.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut d = Daemon::start_with_args(dir.path(), "", &args);
    d.wait_ready().await;
    sqs.send_message()
        .queue_url(&queue_url)
        .message_body(r#"{"greeting":"hello from sqs"}"#)
        .send()
        .await
        .unwrap();

    let api = workflows_api(&kubeconfig, &ns).await;
    let mut items = Vec::new();
    for _ in 0..200 {
        items = api.list(&Default::default()).await.unwrap().items;
        if !items.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(items.len(), 1, "one Workflow; log:\n{}", d.stderr_tail());
    let wf = &items[0];
    assert!(wf
        .metadata
        .name
        .as_deref()
        .unwrap()
        .starts_with("aws-sqs-workflow-"));
    // Argo's parameter: `dataKey: body` of the sqs event (jsonBody: the message as JSON),
    // inserted as its JSON text.
    let value = wf.data["spec"]["arguments"]["parameters"][0]["value"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        serde_json::from_str::<Value>(&value).unwrap(),
        serde_json::json!({"greeting": "hello from sqs"})
    );
    let labels = wf.metadata.labels.clone().unwrap();
    assert_eq!(labels["events.argoproj.io/sensor"], "aws-sqs");
    assert_eq!(labels["events.argoproj.io/trigger"], "sqs-workflow");
    assert!(d.stop().success());
}

/// Argo's FNV-1a 32-bit hash, as its Sensors name their durable consumers
/// (`group-<fnv32a("<sensor>-<trigger>-<dependency>")>`).
fn fnv32a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(16_777_619)
    })
}

/// Argo's JetStream EventBus, both ways, on a real nats-server: an EventSource run by Sluice
/// publishes what a consumer configured exactly as an Argo Sensor's reads, and a message built
/// as Argo's EventSources build it fires a Sluice Sensor. One directory of manifests (EventBus,
/// EventSource, Sensor), as a team keeps them.
#[tokio::test]
async fn argo_eventbus_both_ways() {
    use async_nats::jetstream::{self, consumer, stream};
    let dir = tempfile::tempdir().unwrap();
    let nats = spawn_nats(dir.path());
    let url = format!("nats://127.0.0.1:{}", nats.port);
    let client = async_nats::connect(&url).await.unwrap();
    let js = jetstream::new(client.clone());
    // The stream as Argo's controller makes it (file storage, `default.*.*`, 5 minutes of dedup).
    let stream = js
        .create_stream(stream::Config {
            name: "default".into(),
            subjects: vec!["default.*.*".into()],
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(300),
            ..Default::default()
        })
        .await
        .unwrap();
    // An Argo Sensor's consumer for webhook/example: durable, explicit acks, new messages only.
    let argo_consumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(format!("group-{}", fnv32a("webhook-http-trigger-test-dep"))),
            filter_subject: "default.webhook.example".into(),
            ack_policy: consumer::AckPolicy::Explicit,
            deliver_policy: consumer::DeliverPolicy::New,
            ..Default::default()
        })
        .await
        .unwrap();

    let (target, mut got) = scripted_target(vec![("/hello", vec![200])]).await;
    let port = free_port();
    let manifests = dir.path().join("argo");
    std::fs::create_dir_all(&manifests).unwrap();
    let bus = format!(
        "apiVersion: argoproj.io/v1alpha1\nkind: EventBus\nmetadata:\n  name: default\nspec:\n  jetstreamExotic:\n    url: {url}\n"
    );
    std::fs::write(manifests.join("eventbus.yaml"), bus).unwrap();
    std::fs::write(manifests.join("webhook.yaml"), webhook_es(port)).unwrap();
    // The Sensor depends on an EventSource Sluice does not run (it stays in Argo).
    std::fs::write(
        manifests.join("sensor.yaml"),
        http_sensor("argo-webhook", target),
    )
    .unwrap();
    let args = vec!["-f".to_owned(), manifests.display().to_string()];
    let mut d = Daemon::start_with_args(dir.path(), "", &args);
    d.wait_ready().await;

    // Sluice → Argo: a request to the webhook EventSource lands on the bus as Argo's would.
    let hook = SocketAddr::from(([127, 0, 0, 1], port));
    let (status, _) = request(
        hook,
        "POST",
        "/example",
        &[("content-type", "application/json")],
        br#"{"message": "to argo"}"#,
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    let mut batch = argo_consumer
        .fetch()
        .max_messages(1)
        .expires(Duration::from_secs(10))
        .messages()
        .await
        .unwrap();
    use futures_util::StreamExt;
    let msg = batch.next().await.expect("a message on the bus").unwrap();
    assert_eq!(msg.subject.as_str(), "default.webhook.example");
    let ce: Value = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(ce["specversion"], "1.0");
    assert_eq!(ce["source"], "webhook");
    assert_eq!(ce["subject"], "example");
    assert_eq!(ce["type"], "webhook");
    assert_eq!(ce["datacontenttype"], "application/json");
    assert_eq!(
        ce["data"]["body"],
        serde_json::json!({"message": "to argo"})
    );
    assert!(ce["data"]["header"].is_object(), "{ce}");
    let msg_id = msg
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Msg-Id"))
        .unwrap();
    assert_eq!(msg_id.as_str(), ce["id"].as_str().unwrap());
    msg.ack().await.unwrap();

    // Argo → Sluice: a message built as Argo's EventSources build it (sdk-go's structured JSON,
    // `Nats-Msg-Id` = the id) fires the Sluice Sensor's http trigger.
    let id = "6a4c0f3f2b0e4e4f9e1d2c3b4a596877";
    let body = format!(
        r#"{{"specversion":"1.0","id":"{id}","source":"argo-webhook","type":"webhook","subject":"example","datacontenttype":"application/json","time":"2026-12-07T10:00:00.123456789Z","data":{{"header":{{"Content-Type":["application/json"]}},"body":{{"bucket":"from-argo"}}}}}}"#
    );
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", id);
    js.publish_with_headers("default.argo-webhook.example", headers, body.into())
        .await
        .unwrap()
        .await
        .unwrap();
    let (path, payload) = tokio::time::timeout(Duration::from_secs(15), got.recv())
        .await
        .unwrap_or_else(|_| panic!("the Sensor did not fire; log:\n{}", d.stderr_tail()))
        .unwrap();
    assert_eq!(path, "/hello");
    assert_eq!(
        payload,
        serde_json::json!({"bucket": "from-argo", "type": "webhook"})
    );
    assert!(d.stop().success());
}

/// `kubectl kustomize … | sluice validate -f -`: a rendered bundle on stdin, with kinds that
/// are not Argo's passed over; and `sluice convert` prints a native config that validates on
/// its own.
#[test]
fn argo_manifests_from_stdin_and_convert() {
    use std::io::Write;
    let read = corpus;
    let bundle = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: legacy\nspec: {{}}\n---\n{}\n---\n{}",
        read("event-sources/calendar.yaml"),
        read("sensors/log.yaml")
    );
    let mut child = Command::new(BIN)
        .args(["validate", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(bundle.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("note: <stdin>:2:1: Deployment legacy: not an Argo Events EventSource, Sensor or EventBus; passed over"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok (1 sources, 1 processors, 1 sinks"),
        "{stdout}"
    );

    // A refused field fails validation with its position in the stdin document.
    let bad = bundle.replace("interval: 10s", "interval: 10s\n      bogus: 1");
    let mut child = Command::new(BIN)
        .args(["validate", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(bad.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(": spec.calendar.example-with-interval.bogus: not supported by Sluice"),
        "{stderr}"
    );
    assert!(stderr.starts_with("<stdin>:"), "{stderr}");

    // convert → a native config that validates by itself.
    let dir = tempfile::tempdir().unwrap();
    let (es, sensor) = (dir.path().join("es.yaml"), dir.path().join("s.yaml"));
    std::fs::write(&es, read("event-sources/webhook.yaml")).unwrap();
    std::fs::write(&sensor, http_sensor("webhook", 80)).unwrap();
    let out = Command::new(BIN)
        .arg("convert")
        .arg("-f")
        .arg(&es)
        .arg("-f")
        .arg(&sensor)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let native = String::from_utf8(out.stdout).unwrap();
    assert!(
        native.contains("#   ") && native.contains("spec.service.ports"),
        "{native}"
    );
    let native_path = dir.path().join("native.yaml");
    std::fs::write(&native_path, &native).unwrap();
    let out = Command::new(BIN)
        .arg("validate")
        .arg("-c")
        .arg(&native_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{native}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Argo's Kafka EventBus, both ways, on librdkafka's mock cluster: a request to a Sluice
/// EventSource lands on the bus topic as Argo writes it (key `<eventSourceName>.<eventName>`,
/// the structured CloudEvent as the value), and a record written as Argo writes it fires a
/// Sluice Sensor whose EventSource stays elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argo_kafka_eventbus_both_ways() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let cluster = rdkafka::mocking::MockCluster::new(1).expect("librdkafka mock cluster");
    cluster.create_topic("argo-events-default", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let (target, mut got) = scripted_target(vec![("/hello", vec![200])]).await;
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("argo");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(
        manifests.join("eventbus.yaml"),
        format!("apiVersion: argoproj.io/v1alpha1\nkind: EventBus\nmetadata:\n  name: default\n  namespace: argo-events\nspec:\n  kafka:\n    url: {bootstrap}\n    consumerGroup:\n      oldest: true\n"),
    )
    .unwrap();
    std::fs::write(manifests.join("webhook.yaml"), webhook_es(port)).unwrap();
    // The Sensor depends on an EventSource Sluice does not run (it stays in Argo).
    std::fs::write(
        manifests.join("sensor.yaml"),
        http_sensor("argo-webhook", target),
    )
    .unwrap();
    let args = vec!["-f".to_owned(), manifests.display().to_string()];
    let mut d = Daemon::start_with_args(dir.path(), "", &args);
    d.wait_ready().await;

    // Sluice → Argo.
    let hook = SocketAddr::from(([127, 0, 0, 1], port));
    let (status, _) = request(
        hook,
        "POST",
        "/example",
        &[("content-type", "application/json")],
        br#"{"message": "to argo"}"#,
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    let b = bootstrap.clone();
    let (key, value) = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &b)
            .set("group.id", "argo-sensor-stand-in")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset("argo-events-default", 0, rdkafka::Offset::Beginning)
            .unwrap();
        consumer.assign(&tpl).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < deadline, "no record on the bus topic");
            let Some(m) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let m = m.unwrap();
            return (
                String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                m.payload().unwrap_or_default().to_vec(),
            );
        }
    })
    .await
    .unwrap();
    assert_eq!(key, "webhook.example");
    let ce: Value = serde_json::from_slice(&value).unwrap();
    assert_eq!(
        (ce["source"].as_str(), ce["subject"].as_str()),
        (Some("webhook"), Some("example"))
    );
    assert_eq!(
        ce["data"]["body"],
        serde_json::json!({"message": "to argo"})
    );

    // Argo → Sluice: a record as Argo's Kafka EventBus writes it (no headers).
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let body = r#"{"specversion":"1.0","id":"77aa","source":"argo-webhook","type":"webhook","subject":"example","datacontenttype":"application/json","time":"2026-12-07T10:00:00Z","data":{"header":{},"body":{"bucket":"from-argo"}}}"#;
    producer
        .send(
            FutureRecord::to("argo-events-default")
                .key("argo-webhook.example")
                .payload(body),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let (path, payload) = tokio::time::timeout(Duration::from_secs(20), got.recv())
        .await
        .unwrap_or_else(|_| panic!("the Sensor did not fire; log:\n{}", d.stderr_tail()))
        .unwrap();
    assert_eq!(path, "/hello");
    assert_eq!(
        payload,
        serde_json::json!({"bucket": "from-argo", "type": "webhook"})
    );
    assert!(d.stop().success());
}
