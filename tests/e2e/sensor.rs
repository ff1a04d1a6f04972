//! The Sensor through the binary: S3 notifications → filters → triggers (http, k8s/Argo
//! Workflow), across restarts, retries and dead letters.

use super::*;

/// Waits (up to 20 s) until the queue has no visible and no in-flight message; answers the
/// last counts read.
async fn queue_drained(sqs: &aws_sdk_sqs::Client, url: &str) -> String {
    let mut left = String::new();
    for _ in 0..200 {
        let a = sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(
                aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            )
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap();
        left = format!("{a:?}");
        if a.values().all(|v| v == "0") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    left
}

/// A moto bucket whose object-created notifications go to an SQS queue: the S3 client, the
/// SQS client and the queue's URL.
async fn s3_bucket_notifying_queue(
    moto_url: &str,
    bucket: &str,
    queue: &str,
) -> (aws_sdk_s3::Client, aws_sdk_sqs::Client, String) {
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(moto_url)
        .load()
        .await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let url = sqs
        .create_queue()
        .queue_name(queue)
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let arn = sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap()
        .remove(&aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .unwrap();
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&sdk)
            .force_path_style(true)
            .build(),
    );
    s3.create_bucket().bucket(bucket).send().await.unwrap();
    s3.put_bucket_notification_configuration()
        .bucket(bucket)
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
    (s3, sqs, url)
}

#[tokio::test]
async fn s3_upload_of_a_csv_triggers_the_http_sink_and_a_log_upload_does_not() {
    // The test kit sets the SDK's standard credential chain for moto; the daemon inherits it.
    let dir = tempfile::tempdir().unwrap();
    let moto = sluice_core::testkit::peers::spawn_moto(dir.path());
    let moto_url = format!("http://127.0.0.1:{}", moto.port);
    let (s3, sqs, url) = s3_bucket_notifying_queue(&moto_url, "data", "uploads-events").await;
    // The trigger target: records each request's ce-subject and ce-type.
    let target = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target_port = target.local_addr().unwrap().port();
    let (tx, mut got) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = target.accept().await else {
                return;
            };
            let tx = tx.clone();
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let h = |n: &str| {
                    req.headers()
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned()
                };
                let _ = tx.send((h("ce-subject"), h("ce-type")));
                async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    let body = format!(
        "sources:\n  uploads:\n    kind: s3\n    queue: uploads-events\n    events: [\"s3:ObjectCreated:*\"]\n    filter: {{ prefix: incoming/, suffix: .csv }}\n    region: us-east-1\n    endpoint: {}\n    wait_time: 1s\nsinks:\n  trigger: {{ kind: http, url: \"http://127.0.0.1:{target_port}/run\" }}\nroutes:\n  - {{ from: [uploads], to: [trigger] }}\n",
        moto_url
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    for key in ["incoming/report.log", "incoming/2026-12-01.csv"] {
        s3.put_object()
            .bucket("data")
            .key(key)
            .body(b"a,b\n".to_vec().into())
            .send()
            .await
            .unwrap();
    }
    let (subject, ty) = tokio::time::timeout(Duration::from_secs(20), got.recv())
        .await
        .expect("the .csv upload reached the HTTP sink")
        .unwrap();
    assert_eq!(subject, "incoming/2026-12-01.csv");
    assert_eq!(ty, "com.amazonaws.s3.ObjectCreated:Put");
    // Every message settled: the .csv one deleted after delivery, the .log one and the test
    // event deleted as filtered.
    let left = queue_drained(&sqs, &url).await;
    assert!(
        !left.contains("\"1\"") && !left.contains("\"2\""),
        "queue not empty: {left}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(got.try_recv().is_err(), "the .log upload triggered nothing");
    let (_, metrics) = get(d.admin, "/metrics").await.unwrap();
    let m = String::from_utf8_lossy(&metrics);
    assert!(
        metric(&m, "sluice_events_filtered_total{source=\"uploads\"}") >= 2.0,
        "the test event and the .log record are counted as filtered: {m}"
    );
    assert!(d.stop().success());
}

#[tokio::test]
async fn sensor_fires_on_both_dependencies_across_a_restart_retries_and_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (port, mut got) = scripted_target(vec![
        ("/release", vec![500, 500, 200]),
        ("/broken", vec![500]),
    ])
    .await;
    let body = r#"state_dir: @STATE@
sources:
  gh: { kind: webhook, listen: @HOOK@, path: /push }
  nightly: { kind: webhook, listen: @HOOK@, path: /nightly }
sensors:
  release:
    dependencies:
      - name: push
        source: gh
        filters:
          data: [{ path: ref, type: string, value: ['refs/heads/main'] }]
      - { name: nightly, source: nightly }
    triggers:
      - name: submit
        conditions: push && nightly
        sink: release-api
        atLeastOnce: true
        retryStrategy: { steps: 3, duration: 50ms, jitter: 0 }
        payload:
          - { src: { dependencyName: push, dataKey: after }, dest: commit }
          - { src: { dependencyName: push, dataTemplate: '{{ .Input.ref | trimPrefix "refs/heads/" }}' }, dest: branch }
      - name: notify
        conditions: nightly
        sink: broken
        atLeastOnce: true
        retryStrategy: { steps: 2, duration: 20ms, jitter: 0 }
        dlqTrigger: parked
sinks:
  release-api: { kind: http, url: 'http://127.0.0.1:@PORT@/release', retry: { max_attempts: 1 } }
  broken: { kind: http, url: 'http://127.0.0.1:@PORT@/broken', retry: { max_attempts: 1 } }
  parked: { kind: log }
"#
    .replace("@STATE@", &state.display().to_string())
    .replace("@PORT@", &port.to_string());
    let post = |d: &Daemon, path: &'static str, key: &'static str, json: &'static str| {
        let hook = d.hook;
        async move {
            request(
                hook,
                "POST",
                path,
                &[
                    ("content-type", "application/json"),
                    ("idempotency-key", key),
                ],
                json.as_bytes(),
            )
            .await
            .unwrap()
        }
    };
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    // One dependency (and a push to another branch, filtered): answered, nothing fired.
    assert_eq!(
        post(
            &d,
            "/push",
            "p1",
            r#"{"ref":"refs/heads/main","after":"abc123"}"#
        )
        .await
        .0,
        StatusCode::OK
    );
    assert_eq!(
        post(
            &d,
            "/push",
            "p2",
            r#"{"ref":"refs/heads/dev","after":"fff"}"#
        )
        .await
        .0,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(got.try_recv().is_err(), "a trigger fired on one dependency");
    // A restart keeps the partial match (state_dir).
    assert!(d.stop().success());
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    // The nightly event completes `submit` (500, 500, then 200 on the third step) and fires
    // `notify`, whose target always answers 500: it goes to the dlqTrigger. The webhook
    // answers once both runs finished (atLeastOnce).
    let (status, answer) = post(&d, "/nightly", "n1", r#"{"ok":true}"#).await;
    assert_eq!(status, StatusCode::OK, "{answer:?}");
    let mut release = Vec::new();
    let mut broken = 0;
    while let Ok((path, body)) = got.try_recv() {
        match path.as_str() {
            "/release" => release.push(body),
            _ => broken += 1,
        }
    }
    assert_eq!(release.len(), 3, "three attempts: {release:?}");
    for b in &release {
        assert_eq!(
            b,
            &serde_json::json!({"commit": "abc123", "branch": "main"})
        );
    }
    assert_eq!(broken, 2, "notify: two steps, then the dead letter");
    let parked = d.next_line();
    assert_eq!(parked["deadlettersink"], "broken");
    assert_eq!(
        parked["type"], "webhook",
        "notify forwards the nightly event itself"
    );
    let metrics = get(d.admin, "/metrics").await.unwrap();
    let text = String::from_utf8_lossy(&metrics.1);
    assert_eq!(
        metric(
            &text,
            "sluice_sensor_triggers_total{sensor=\"release\",trigger=\"submit\",result=\"fired\"}"
        ),
        1.0,
        "{text}"
    );
    assert_eq!(metric(&text, "sluice_sensor_triggers_total{sensor=\"release\",trigger=\"notify\",result=\"dead_lettered\"}"), 1.0);
    // Fired: the state is clear, another nightly alone fires only `notify`.
    assert!(d.stop().success());
}

/// A body nested deeper than any thread's stack (150 000 brackets, 300 KB, under the webhook's
/// default `max_body`) reaches a sensor's data filter, exprs field and jq transform: each
/// answers with an error for that event, the daemon goes on. gjson's recursive `valid` and
/// jaq's reader overflowed a worker's stack on it and aborted the process.
#[tokio::test]
async fn a_sensor_takes_data_nested_deeper_than_a_stack_without_crashing() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"sources:
  hooks: { kind: webhook, listen: @HOOK@, path: /in }
sinks:
  console: { kind: log }
sensors:
  deep:
    dependencies:
      - name: bydata
        source: hooks
        filters:
          data: [{ path: kind, type: string, value: ['^order$'] }]
          exprs: [{ expr: 'n > 1', fields: [{ name: n, path: n }] }]
      - name: byjq
        source: hooks
        transform: { jq: "{kind, copied: true}" }
    triggers:
      - { name: fwd, conditions: bydata || byjq, sink: console, atLeastOnce: true }
"#;
    let mut d = Daemon::start_with(dir.path(), body);
    d.wait_ready().await;
    let levels = 150_000;
    let deep = format!(
        r#"{{"kind":"order","n":{}2{}}}"#,
        "[".repeat(levels),
        "]".repeat(levels)
    );
    let (status, answer) = request(
        d.hook,
        "POST",
        "/in",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", "deep"),
        ],
        deep.as_bytes(),
    )
    .await
    .expect("the daemon answers the deep body");
    assert_eq!(status, StatusCode::OK, "{answer:?}");
    // Still up, and still firing: a plain event passes both dependencies.
    let (status, answer) = request(
        d.hook,
        "POST",
        "/in",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", "plain"),
        ],
        br#"{"kind":"order","n":2}"#,
    )
    .await
    .expect("the daemon answers after the deep body");
    assert_eq!(status, StatusCode::OK, "{answer:?}");
    // The trigger's output, from the plain event (the deep one matched nothing).
    let line = d.next_line();
    assert_eq!(line["data"]["kind"], "order", "{line}");
    let metrics = String::from_utf8_lossy(&get(d.admin, "/metrics").await.unwrap().1).to_string();
    // The deep event: an error in each dependency (the exprs field too deep to convert, the jq
    // reader refused); the plain one matched both.
    for dep in ["bydata", "byjq"] {
        let series = |result: &str| {
            format!("sluice_sensor_dependency_events_total{{sensor=\"deep\",dependency=\"{dep}\",result=\"{result}\"}}")
        };
        assert_eq!(metric(&metrics, &series("error")), 1.0, "{dep}: {metrics}");
        assert_eq!(
            metric(&metrics, &series("matched")),
            1.0,
            "{dep}: {metrics}"
        );
    }
    assert!(d.stop().success());
}

/// Argo Events' most common flow, on a real API server: a file lands in S3 → the `s3` source
/// (bucket notifications through SQS) → a Sensor keeps the `.csv` keys → a `k8s` trigger creates
/// an Argo Workflow whose parameter is the key. A `.log` upload creates nothing; the same
/// notification delivered twice, and again after a kill -9, creates one Workflow.
#[tokio::test]
async fn s3_to_sensor_to_argo_workflow() {
    let kubeconfig = test_kubeconfig();
    let ns = format!("seed-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let moto = sluice_core::testkit::peers::spawn_moto(dir.path());
    let moto_url = format!("http://127.0.0.1:{}", moto.port);
    let (s3, sqs, queue_url) =
        s3_bucket_notifying_queue(&moto_url, "landing", "landing-events").await;
    let body = format!(
        r#"state_dir: {state}
sources:
  uploads: {{ kind: s3, queue: landing-events, region: us-east-1, endpoint: "{moto_url}", wait_time: 1s }}
sensors:
  csv:
    dependencies:
      - name: upload
        source: uploads
        filters:
          data: [{{ path: s3.object.key, type: string, value: ['\.csv$'] }}]
    triggers:
      - {{ name: process, sink: process, atLeastOnce: true }}
sinks:
  process:
    kind: k8s
    kubeconfig: {kubeconfig}
    namespace: {ns}
    resource:
      apiVersion: argoproj.io/v1alpha1
      kind: Workflow
      metadata: {{ generateName: s3-processing-, labels: {{ flow: seed }} }}
      spec:
        entrypoint: process
        arguments: {{ parameters: [{{ name: key }}] }}
        templates: [{{ name: process, container: {{ image: alpine, command: [cat] }} }}]
    parameters:
      # The subject is the object key decoded (S3 sends s3.object.key URL-encoded).
      - {{ src: {{ contextKey: subject }}, dest: spec.arguments.parameters.0.value }}
"#,
        state = state.display()
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    for key in ["incoming/app.log", "incoming/2026-12-07.csv"] {
        s3.put_object()
            .bucket("landing")
            .key(key)
            .body(b"a,b\n".to_vec().into())
            .send()
            .await
            .unwrap();
    }
    let api = workflows_api(&kubeconfig, &ns).await;
    let keys = || async {
        let l = api
            .list(&kube::api::ListParams::default().labels("flow=seed"))
            .await
            .unwrap();
        let mut k: Vec<String> = l
            .items
            .iter()
            .map(|w| {
                w.data["spec"]["arguments"]["parameters"][0]["value"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect();
        k.sort();
        k
    };
    let mut got = Vec::new();
    for _ in 0..200 {
        got = keys().await;
        if !got.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        got,
        ["incoming/2026-12-07.csv"],
        "one Workflow, for the .csv; log:\n{}",
        d.stderr_tail()
    );
    let wf = api.list(&Default::default()).await.unwrap().items.remove(0);
    let labels = wf.metadata.labels.unwrap();
    assert!(
        labels.contains_key("events.argoproj.io/action-timestamp"),
        "{labels:?}"
    );
    let name = wf.metadata.name.unwrap();
    assert!(
        name.starts_with("s3-processing-") && name.len() == 24,
        "a name derived from the event: {name}"
    );

    // The same notification twice (S3 delivers at least once), then again after a kill -9.
    let record = serde_json::json!({"Records": [{"eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1",
        "eventTime": "2026-12-07T10:00:00.000Z", "eventName": "ObjectCreated:Put",
        "responseElements": {"x-amz-request-id": "REQ123", "x-amz-id-2": "ID2abc"},
        "s3": {"s3SchemaVersion": "1.0", "bucket": {"name": "landing", "arn": "arn:aws:s3:::landing"},
               "object": {"key": "incoming/dup.csv", "size": 4, "sequencer": "00AA"}}}]})
    .to_string();
    let notify = || {
        sqs.send_message()
            .queue_url(&queue_url)
            .message_body(record.clone())
            .send()
    };
    notify().await.unwrap();
    notify().await.unwrap();
    let want = ["incoming/2026-12-07.csv", "incoming/dup.csv"];
    for _ in 0..200 {
        got = keys().await;
        if got.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        keys().await,
        want,
        "the duplicate notification made one Workflow"
    );
    let _ = d.child.kill(); // SIGKILL
    let _ = d.child.wait();
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    notify().await.unwrap();
    // Settled (deleted from the queue) and still one Workflow for the key.
    queue_drained(&sqs, &queue_url).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        keys().await,
        want,
        "after kill -9 the notification again made no second Workflow; log:\n{}",
        d.stderr_tail()
    );
}
