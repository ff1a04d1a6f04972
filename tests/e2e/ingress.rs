//! Webhook and schedule ingress through to sinks: acknowledgements, dead letters, dedup across
//! restarts, readiness, the CloudEvents SDKs' events, processors, provider signatures, the log
//! sink's lines.

use super::*;

#[tokio::test]
async fn webhook_to_log_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path(), "");
    d.wait_ready().await;
    assert_eq!(get(d.admin, "/healthz").await.unwrap().0, StatusCode::OK);
    let (status, body) = request(
        d.hook,
        "POST",
        "/",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", "e2e-1"),
        ],
        br#"{"n":1}"#,
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "{body:?}");
    let line = d.next_line();
    assert_eq!(line["specversion"], "1.0");
    assert_eq!(line["id"], "e2e-1");
    assert_eq!(line["source"], "hooks");
    assert_eq!(line["data"], serde_json::json!({"n": 1}));
    // A structured CloudEvent passes through untouched.
    let ce = r#"{"specversion":"1.0","id":"ce-1","source":"urn:upstream","type":"com.example.x","data":"hi","datacontenttype":"text/plain"}"#;
    let (status, _) = request(
        d.hook,
        "POST",
        "/",
        &[("content-type", "application/cloudevents+json")],
        ce.as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    let line = d.next_line();
    assert_eq!(
        (
            line["id"].as_str(),
            line["source"].as_str(),
            line["data"].as_str()
        ),
        (Some("ce-1"), Some("urn:upstream"), Some("hi"))
    );

    let (_, metrics) = get(d.admin, "/metrics").await.unwrap();
    let m = String::from_utf8_lossy(&metrics);
    assert_eq!(
        metric(&m, "sluice_events_received_total{source=\"hooks\"}"),
        2.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "sluice_events_delivered_total{sink=\"console\"}"),
        2.0,
        "{m}"
    );
    assert!(
        m.contains("sluice_delivery_latency_seconds_bucket{sink=\"console\",le=\"0.005\"}"),
        "{m}"
    );
    // One latency per delivered event, and one `# TYPE` line for the histogram.
    assert_eq!(
        metric(
            &m,
            "sluice_delivery_latency_seconds_count{sink=\"console\"}"
        ),
        2.0,
        "{m}"
    );
    assert_eq!(
        m.matches("# TYPE sluice_delivery_latency_seconds histogram")
            .count(),
        1,
        "{m}"
    );
    assert!(m.contains("sluice_queue_events{sink=\"console\"}"));
    // Transparent huge pages are off for the daemon unless `--allow-thp` (docs/decisions.md).
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
    assert!(
        status.lines().any(|l| l == "THP_enabled:\t0"),
        "THP_enabled in {status}"
    );
    let status = d.stop();
    assert!(status.success(), "SIGTERM → exit 0, got {status:?}");
}

#[tokio::test]
async fn http_sink_failures_go_to_the_dead_letter_sink() {
    let dir = tempfile::tempdir().unwrap();
    // The target closes every connection at once: every attempt fails. (A port nobody listens on
    // could be taken by another test process meanwhile; this one is held for the whole test.)
    let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = target.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in target.incoming() {
            drop(conn);
        }
    });
    let body = format!(
        "sources:\n  hooks: {{ kind: webhook, listen: {HOOK}, path: / }}\nsinks:\n  trigger:\n    kind: http\n    url: http://127.0.0.1:{dead}/events\n    retry: {{ max_attempts: 2, initial_backoff: 10ms, max_backoff: 20ms }}\n    dead_letter: parked\n  parked: {{ kind: log }}\nroutes:\n  - {{ from: [hooks], to: [trigger] }}\n"
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    let (status, body) = request(
        d.hook,
        "POST",
        "/",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", "dl-1"),
        ],
        br#"{"n":1}"#,
    )
    .await
    .unwrap();
    // Handled: the dead-letter sink confirmed it.
    assert_eq!(status, StatusCode::OK, "{body:?}");
    let line = d.next_line();
    assert_eq!(line["id"], "dl-1");
    assert_eq!(line["deadlettersink"], "trigger");
    assert_eq!(line["deadletterstatus"], "failed");
    let reason = line["deadletterreason"].as_str().unwrap();
    assert!(reason.contains("after 2 attempts"), "{reason}");
    let (_, metrics) = get(d.admin, "/metrics").await.unwrap();
    let m = String::from_utf8_lossy(&metrics);
    assert_eq!(
        metric(
            &m,
            "sluice_events_dead_lettered_total{sink=\"trigger\",dead_letter=\"parked\"}"
        ),
        1.0,
        "{m}"
    );
    assert!(d.stop().success());
}

#[tokio::test]
async fn dedup_window_survives_a_restart_with_state_dir() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let extra = format!("state_dir: {}", state.display());
    let mut d = Daemon::start(dir.path(), &extra);
    d.wait_ready().await;
    let (s, _) = request(d.hook, "POST", "/", &[("idempotency-key", "once")], b"{}")
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK);
    assert_eq!(d.next_line()["id"], "once");
    assert!(d.stop().success());

    let mut d = Daemon::start(dir.path(), &extra);
    d.wait_ready().await;
    let (s, body) = request(d.hook, "POST", "/", &[("idempotency-key", "once")], b"{}")
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["duplicates"], 1, "remembered across the restart");
    let (s, _) = request(d.hook, "POST", "/", &[("idempotency-key", "twice")], b"{}")
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        d.next_line()["id"],
        "twice",
        "the duplicate printed nothing; the new one prints"
    );
    assert!(d.stop().success());
}

/// /readyz is 503 while a component is still being built — here a Kafka sink whose build waits
/// for a broker that is down — and 200 once it runs; bad requests do not hurt afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_for_components_and_bad_requests_do_not_hurt() {
    let cluster = rdkafka::mocking::MockCluster::new(1).expect("librdkafka mock cluster");
    cluster.create_topic("events.webhook", 1, 1).unwrap();
    cluster.broker_down(1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "sources:\n  hooks: {{ kind: webhook, listen: {HOOK}, path: / }}\nsinks:\n  stream:\n    kind: kafka\n    brokers: {}\n    topic: \"events.{{type}}\"\n    properties: {{ reconnect.backoff.max.ms: 100 }}\nroutes:\n  - {{ from: [hooks], to: [stream] }}\n",
        cluster.bootstrap_servers()
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    // Not ready while the broker is down: seen on several answers over half a second.
    let mut not_ready = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while not_ready < 5 {
        if d.restarted_for_a_taken_port() {
            not_ready = 0;
            continue;
        }
        if let Ok((status, body)) = get(d.admin, "/readyz").await {
            assert_eq!(
                (status, String::from_utf8_lossy(&body).into_owned()),
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: sink stream, source hooks\n".to_owned()
                ),
                "ready although the Kafka sink cannot have been built"
            );
            not_ready += 1;
        }
        assert!(
            Instant::now() < deadline,
            "the admin server never answered; sluice's log:\n{}",
            d.stderr_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.broker_up(1).unwrap();
    d.wait_ready().await;
    assert_eq!(
        get(d.admin, "/readyz").await.unwrap(),
        (StatusCode::OK, Bytes::from("ready\n"))
    );
    // Garbage on the webhook port: the daemon stays up.
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(d.hook).await.unwrap();
    s.write_all(b"\x16\x03\x01garbage\r\n\r\n").await.unwrap();
    drop(s);
    let (status, _) = request(
        d.hook,
        "POST",
        "/",
        &[("content-type", "application/cloudevents+json")],
        b"{not json",
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(get(d.admin, "/readyz").await.unwrap().0, StatusCode::OK);
    let (status, _) = request(
        d.hook,
        "POST",
        "/",
        &[("idempotency-key", "still-up")],
        b"{}",
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "still serving after the garbage");
    assert!(d.stop().success());
}

#[tokio::test]
async fn schedule_catchup_across_a_restart_emits_no_slot_twice() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "state_dir: {}\nsources:\n  tick: {{ kind: schedule, interval: 1s, catchup: {{ enabled: true, max_duration: 1h }} }}\nsinks:\n  console: {{ kind: log }}\nroutes:\n  - {{ from: [tick], to: [console] }}\n",
        dir.path().join("state").display()
    );
    let id = |v: &Value| v["id"].as_str().unwrap().to_owned();
    let mut ids = Vec::new();
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    for _ in 0..2 {
        ids.push(id(&d.next_line()));
    }
    // Every slot printed before the exit counts, however late in the shutdown it came.
    let (status, rest) = d.stop_collecting();
    assert!(status.success());
    ids.extend(rest.iter().map(id));
    let first_run = ids.len();
    // Down for a while: the slots missed meanwhile are replayed after the restart.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let restarted = chrono::Utc::now();
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    for _ in 0..4 {
        ids.push(id(&d.next_line()));
    }
    let (status, rest) = d.stop_collecting();
    assert!(status.success());
    ids.extend(rest.iter().map(id));
    let slots: Vec<chrono::DateTime<chrono::Utc>> = ids
        .iter()
        .map(|id| id.strip_prefix("tick:").unwrap().parse().unwrap())
        .collect();
    for w in slots.windows(2) {
        assert_eq!(
            (w[1] - w[0]).num_seconds(),
            1,
            "consecutive slots, none twice, none missing: {ids:?}"
        );
    }
    assert!(
        slots[first_run] < restarted - chrono::Duration::seconds(1),
        "the second run began with slots missed while it was down: {ids:?}"
    );
}

/// Runs `tests/interop/<script>` with `url` on the test script's Python (target/pyenv, where
/// scripts/test.sh installs the SDKs and libraries the interop tests use) and returns its stdout;
/// a missing interpreter or a failing script fails the test with what to do or its output.
async fn run_interop_script(script: &str, url: String) -> String {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/pyenv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/test.sh, which installs the Python SDK and the provider libraries there",
        python.display()
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(script);
    let out =
        tokio::task::spawn_blocking(move || Command::new(&python).arg(&script).arg(url).output())
            .await
            .unwrap()
            .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A client no one here wrote: the official Python SDK sends binary and structured events, and
/// they arrive intact. The test script installs the SDK into target/pyenv.
#[tokio::test]
async fn python_cloudevents_sdk_events_arrive_intact() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path(), "");
    d.wait_ready().await;
    let stdout = run_interop_script("python_sdk_client.py", format!("http://{}/", d.hook)).await;
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        ["binary 200", "structured 200"]
    );
    let b = d.next_line();
    assert_eq!(b["id"], "py-binary-1");
    assert_eq!(b["source"], "urn:python-sdk");
    assert_eq!(b["type"], "com.example.py.binary");
    assert_eq!(b["subject"], "orders/7");
    assert_eq!(
        b["comexample"], "a b ü %",
        "percent-encoded header decoded exactly once"
    );
    assert_eq!(b["data"], serde_json::json!({"message": "Hello", "n": 7}));
    let s = d.next_line();
    assert_eq!(s["id"], "py-structured-1");
    assert_eq!(s["type"], "com.example.py.structured");
    assert_eq!(s["data"], serde_json::json!({"message": "World"}));
    assert!(
        s["time"].as_str().is_some(),
        "the SDK's time passes through"
    );
    assert!(d.stop().success());
}

#[tokio::test]
async fn a_processor_between_webhook_and_log_reshapes_and_drains() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "sources:\n  hooks: {{ kind: webhook, listen: {HOOK}, path: / }}\nprocessors:\n  tag: {{ kind: set, type: 'com.example.{{type}}', extensions: {{ region: eu, via: '{{source}}' }} }}\nsinks:\n  console: {{ kind: log }}\nroutes:\n  - {{ from: [hooks], to: [tag] }}\n  - {{ from: [tag], to: [console] }}\n"
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    let ready = get(d.admin, "/readyz").await.unwrap();
    assert_eq!(ready.0, StatusCode::OK);
    let ce =
        r#"{"specversion":"1.0","id":"p-1","source":"urn:shop","type":"order","data":{"n":1}}"#;
    let (status, body) = request(
        d.hook,
        "POST",
        "/",
        &[("content-type", "application/cloudevents+json")],
        ce.as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "{body:?}");
    let line = d.next_line();
    assert_eq!(line["id"], "p-1");
    assert_eq!(line["source"], "urn:shop");
    assert_eq!(line["type"], "com.example.order");
    assert_eq!(line["region"], "eu");
    assert_eq!(line["via"], "urn:shop");
    let metrics = get(d.admin, "/metrics").await.unwrap();
    let text = String::from_utf8_lossy(&metrics.1);
    assert_eq!(
        metric(&text, "sluice_events_received_total{processor=\"tag\"}"),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "sluice_events_delivered_total{processor=\"tag\"}"),
        1.0
    );
    // SIGTERM drains through the processor: events accepted just before are delivered, exit 0.
    let (status, _) = request(
        d.hook,
        "POST",
        "/",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", "p-2"),
        ],
        b"{}",
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    let (status, rest) = d.stop_collecting();
    assert!(status.success(), "{status}");
    assert_eq!(
        rest.iter()
            .map(|l| l["id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["p-2"]
    );
}

fn github_signature(secret: &str, body: &[u8]) -> String {
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = aws_lc_rs::hmac::sign(&key, body);
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// GitHub through the binary: a signed push reaches the sink named after the CloudEvents GitHub
/// adapter, with the delivery id as its id; the same delivery again is a duplicate; a bad
/// signature is a 401 that reaches nothing and is counted by reason.
#[tokio::test]
async fn github_push_is_verified_named_and_deduplicated() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gh-secret"), "s3cr3t-old\n").unwrap();
    let body = format!(
        "sources:\n  gh:\n    kind: github\n    listen: {HOOK}\n    path: /github\n    secrets: [\"${{file:{}}}\", \"s3cr3t-new\"]\n    events: [push]\nsinks:\n  console: {{ kind: log }}\nroutes:\n  - {{ from: [gh], to: [console] }}\n",
        dir.path().join("gh-secret").display()
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    let push = br#"{"ref":"refs/heads/main","after":"6113728f27ae82c7b1a177c8d03f9e96e0adf246","repository":{"id":1296269,"full_name":"octocat/Hello-World","url":"https://github.com/octocat/Hello-World"},"pusher":{"name":"octocat"}}"#;
    let headers = |sig: &str| {
        vec![
            ("content-type", "application/json".to_owned()),
            ("x-github-event", "push".to_owned()),
            (
                "x-github-delivery",
                "72d3162e-cc78-11e3-81ab-4c9367dc0958".to_owned(),
            ),
            ("x-hub-signature-256", sig.to_owned()),
        ]
    };
    let send = |h: Vec<(&'static str, String)>, body: &'static [u8]| {
        let addr = d.hook;
        async move {
            let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
            request(addr, "POST", "/github", &h, body).await.unwrap()
        }
    };
    // Signed with the secret read from the file (the file's newline is not part of it).
    let (status, reply) = send(headers(&github_signature("s3cr3t-old", push)), push).await;
    assert_eq!(status, StatusCode::OK, "{reply:?}");
    let line = d.next_line();
    assert_eq!(line["type"], "com.github.push");
    assert_eq!(line["id"], "72d3162e-cc78-11e3-81ab-4c9367dc0958");
    assert_eq!(line["source"], "https://github.com/octocat/Hello-World");
    assert_eq!(line["subject"], "refs/heads/main");
    assert_eq!(
        line["data"]["after"],
        "6113728f27ae82c7b1a177c8d03f9e96e0adf246"
    );
    // GitHub redelivers with the same delivery id: answered 200 as a duplicate, not forwarded.
    let (status, reply) = send(headers(&github_signature("s3cr3t-new", push)), push).await;
    assert_eq!(status, StatusCode::OK);
    let reply: Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(reply["duplicates"], 1, "{reply}");
    // A wrong secret: 401 naming the header, nothing forwarded.
    let (status, reply) = send(headers(&github_signature("wrong", push)), push).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(String::from_utf8_lossy(&reply).contains("X-Hub-Signature-256"));
    // An event not in `events`: 200, counted as filtered, nothing forwarded.
    let mut h = headers(&github_signature("s3cr3t-old", push));
    h[1].1 = "issues".into();
    h[2].1 = "other-delivery".into();
    assert_eq!(send(h, push).await.0, StatusCode::OK);

    let (_, metrics) = get(d.admin, "/metrics").await.unwrap();
    let m = String::from_utf8_lossy(&metrics);
    assert_eq!(
        metric(
            &m,
            "sluice_events_rejected_total{source=\"gh\",reason=\"bad_signature\"}"
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "sluice_events_filtered_total{source=\"gh\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "sluice_events_deduplicated_total{source=\"gh\"}"),
        1.0,
        "{m}"
    );
    let (status, rest) = d.stop_collecting();
    assert!(status.success());
    assert!(
        rest.is_empty(),
        "nothing but the first push reached the sink: {rest:?}"
    );
}

/// Requests signed by the providers' own Python libraries (`stripe`, `slack_sdk`,
/// `standardwebhooks`, installed by the test script into target/pyenv) verify in Sluice; the
/// same libraries' tampered, wrong-secret and stale requests do not.
#[tokio::test]
async fn provider_libraries_signatures_verify() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "sources:\n  pay: {{ kind: stripe, listen: {HOOK}, path: /stripe, secrets: [whsec_interop_stripe] }}\n  chat: {{ kind: slack, listen: {HOOK}, path: /slack, secrets: [interop-slack-signing-secret] }}\n  std: {{ kind: standard-webhooks, listen: {HOOK}, path: /standard, secrets: [whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw], type_prefix: com.example. }}\nsinks:\n  console: {{ kind: log }}\nroutes:\n  - {{ from: [pay, chat, std], to: [console] }}\n"
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    let stdout = run_interop_script("provider_signatures.py", format!("http://{}", d.hook)).await;
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            // The known answer held by the unit tests (providers/tests.rs, STRIPE_V1).
            "stripe-known t=1700000000,v1=d95c6b7477fbd7e9f90b1b0ef5f9c7ac25abca5382460e0d988c2b2a5b71b990",
            "stripe 200",
            "stripe-tampered 401",
            "slack 200",
            "slack-wrong-secret 401",
            "standard 200",
            "standard-stale 401",
        ]
    );
    let mut got: Vec<(String, String)> = (0..3)
        .map(|_| {
            let l = d.next_line();
            (
                l["type"].as_str().unwrap().to_owned(),
                l["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (
                "com.example.invoice.paid".to_owned(),
                "msg_interop_1".to_owned()
            ),
            ("com.slack.app_mention".to_owned(), "Ev0INTEROP1".to_owned()),
            (
                "com.stripe.charge.succeeded".to_owned(),
                "evt_interop_1".to_owned()
            ),
        ]
    );
    let (status, rest) = d.stop_collecting();
    assert!(status.success());
    assert!(
        rest.is_empty(),
        "refused requests reached the sink: {rest:?}"
    );
}

/// The `log` sink's promise, through the binary: one CloudEvent per line, also for a body sent
/// pretty-printed (as Stripe and many senders send theirs), with the same JSON inside.
#[tokio::test]
async fn the_log_sink_writes_a_pretty_printed_body_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path(), "");
    d.wait_ready().await;
    let pretty = b"{\n  \"id\": \"evt_1\",\r\n  \"data\": {\n    \"amount\": 10,\n    \"memo\": \"line\\nbreak\"\n  }\n}\n";
    let (status, body) = request(
        d.hook,
        "POST",
        "/",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", "pretty-1"),
        ],
        pretty,
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "{body:?}");
    // next_line fails unless the whole event is one JSON line.
    let e = d.next_line();
    assert_eq!(e["id"], "pretty-1");
    assert_eq!(
        e["data"],
        serde_json::json!({"id": "evt_1", "data": {"amount": 10, "memo": "line\nbreak"}})
    );
    let (status, rest) = d.stop_collecting();
    assert!(status.success());
    assert!(rest.is_empty(), "nothing else on stdout: {rest:?}");
}
