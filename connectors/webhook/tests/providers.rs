//! The provider kinds over real HTTP, through the real pipeline, into a capture sink: each
//! provider's published payload sample (tests/data/providers, sources in its README), signed
//! here, becomes the event the CloudEvents adapter names; refusals are 401s that name the header
//! and are counted by reason; pings and challenges are answered without an event.

use std::net::SocketAddr;

use base64::Engine as _;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use sluice_core::pipeline::WhenFull;
use sluice_core::testkit::{free_port, metric, Collected, SourceRig};
use sluice_core::{Data, Event, SourceConfig, Status};
use tokio::net::TcpStream;

struct Hook {
    addr: SocketAddr,
    got: Collected,
    _rig: SourceRig,
    _task: tokio::task::JoinHandle<Result<(), sluice_core::ConnectorError>>,
}

/// Starts source `name` of config type `T` on a free port (retrying when another test process
/// took the port first), every event delivered at once.
async fn start<T: SourceConfig + DeserializeOwned>(name: &str, cfg: Value) -> Hook {
    for _ in 0..20 {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut cfg = cfg.clone();
        cfg["listen"] = json!(addr.to_string());
        cfg["path"] = json!("/hook");
        let config: T = serde_json::from_value(cfg).expect("test config");
        config.validate(name).expect("valid test config");
        let mut rig = SourceRig::with_queue(name, 1000, WhenFull::Block);
        let ctx = rig.context(name);
        match Box::new(config).build(ctx).await {
            Ok(running) => {
                let got = rig.capture().auto(Status::Delivered);
                return Hook {
                    addr,
                    got,
                    _rig: rig,
                    _task: tokio::spawn(running),
                };
            }
            Err(e) if e.to_string().contains("Address already in use") => continue,
            Err(e) => panic!("source {name} does not build: {e}"),
        }
    }
    panic!("no free port in 20 tries");
}

async fn post(addr: SocketAddr, headers: &[(&str, String)], body: &[u8]) -> (StatusCode, Value) {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(
        TcpStream::connect(addr).await.unwrap(),
    ))
    .await
    .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method("POST")
        .uri("/hook")
        .header("host", "localhost");
    for (k, v) in headers {
        req = req.header(*k, v.as_str());
    }
    let resp = sender
        .send_request(req.body(Full::new(Bytes::copy_from_slice(body))).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn sample(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/providers/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn hmac_hex(secret: &[u8], parts: &[&[u8]]) -> String {
    let k = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret);
    hex::encode(aws_lc_rs::hmac::sign(&k, &parts.concat()).as_ref())
}

fn now() -> String {
    chrono::Utc::now().timestamp().to_string()
}

fn json_data(e: &Event) -> Value {
    match &e.data {
        Data::Json(b) | Data::Binary(b) => serde_json::from_slice(b).expect("JSON data"),
        Data::None => Value::Null,
    }
}

fn rejected(source: &str, reason: &str) -> f64 {
    metric(
        "sluice_events_rejected_total",
        &[("source", source), ("reason", reason)],
    )
}

#[tokio::test]
async fn github_samples_are_named_after_the_adapter() {
    let h = start::<sluice_webhook::GithubConfig>("gh", json!({ "secrets": ["gh-secret"] })).await;
    let gh = |event: &str, delivery: &str, body: &[u8], secret: &[u8]| {
        vec![
            ("content-type", "application/json".to_owned()),
            ("x-github-event", event.to_owned()),
            ("x-github-delivery", delivery.to_owned()),
            (
                "x-hub-signature-256",
                format!("sha256={}", hmac_hex(secret, &[body])),
            ),
        ]
    };
    let push = sample("github-push.json");
    let (status, _) = post(h.addr, &gh("push", "d-push", &push, b"gh-secret"), &push).await;
    assert_eq!(status, StatusCode::OK);
    let pr = sample("github-pull_request-opened.json");
    let (status, _) = post(h.addr, &gh("pull_request", "d-pr", &pr, b"gh-secret"), &pr).await;
    assert_eq!(status, StatusCode::OK);
    let events = h.got.wait_for(2).await;
    let (push_e, pr_e) = (&events[0], &events[1]);
    assert_eq!(push_e.ty, "com.github.push");
    assert_eq!(push_e.id, "d-push");
    assert_eq!(push_e.source, "https://github.com/Codertocat/Hello-World");
    assert_eq!(push_e.subject.as_deref(), Some("refs/tags/simple-tag"));
    assert_eq!(push_e.datacontenttype.as_deref(), Some("application/json"));
    assert_eq!(
        push_e.data,
        Data::Json(Bytes::from(push.clone())),
        "the body, byte for byte"
    );
    assert_eq!(pr_e.ty, "com.github.pull_request.opened");
    assert_eq!(
        pr_e.source,
        "https://api.github.com/repos/Codertocat/Hello-World"
    );
    assert_eq!(pr_e.subject.as_deref(), Some("2"));
    assert_eq!(pr_e.time.as_ref().unwrap().as_str(), "2019-05-15T15:20:33Z");

    // ping: answered, no event.
    let ping = br#"{"zen":"Keep it logically awesome.","hook_id":1}"#;
    let (status, body) = post(h.addr, &gh("ping", "d-ping", ping, b"gh-secret"), ping).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("pong"))
    );
    // One byte changed: 401 naming the header, counted, nothing forwarded.
    let mut bad = push.clone();
    bad[10] ^= 1;
    let (status, body) = post(h.addr, &gh("push", "d-bad", &push, b"gh-secret"), &bad).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("X-Hub-Signature-256"),
        "{body}"
    );
    let (status, _) = post(h.addr, &gh("push", "d-bad2", &push, b"wrong"), &push).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(rejected("gh", "bad_signature"), 2.0);
    // Missing the delivery id: 400 (verified, but cannot be named).
    let mut no_id = gh("push", "", &push, b"gh-secret");
    no_id.remove(2);
    let (status, body) = post(h.addr, &no_id, &push).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // Signed, but cut off: not one JSON document, 400.
    let cut = &push[..push.len() / 2];
    let (status, body) = post(h.addr, &gh("push", "d-cut", cut, b"gh-secret"), cut).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"].as_str().unwrap().contains("JSON"), "{body}");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(h.got.len(), 2, "refused requests reached nothing");

    // Signed and whole, with a bad token inside: the structure is all that is checked at
    // ingest, so it is delivered as the signed bytes; an encoder that embeds data as JSON
    // checks it and carries it as base64 instead, so its output stays JSON.
    let odd =
        br#"{"ref":"refs/heads/main","forced":tru,"repository":{"url":"https://github.com/o/r"}}"#;
    let (status, body) = post(h.addr, &gh("push", "d-odd", odd, b"gh-secret"), odd).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let odd_e = &h.got.wait_for(3).await[2];
    assert_eq!(odd_e.source, "https://github.com/o/r");
    assert_eq!(odd_e.data.as_bytes().map(|b| &b[..]), Some(&odd[..]));
    let structured: Value =
        serde_json::from_slice(&sluice_core::format::encode_event(odd_e)).expect("JSON");
    assert!(structured.get("data").is_none(), "{structured}");
    let carried = base64::engine::general_purpose::STANDARD
        .decode(structured["data_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(carried, odd);
}

#[tokio::test]
async fn github_argo_shape_injects_the_headers_into_the_body() {
    let h = start::<sluice_webhook::GithubConfig>(
        "gh-argo",
        json!({ "secrets": ["s"], "format": "argo", "metadata": { "team": "infra" } }),
    )
    .await;
    let push = sample("github-push.json");
    let headers = vec![
        ("content-type", "application/json".to_owned()),
        ("x-github-event", "push".to_owned()),
        ("x-github-delivery", "d-1".to_owned()),
        (
            "x-hub-signature-256",
            format!("sha256={}", hmac_hex(b"s", &[&push])),
        ),
    ];
    assert_eq!(post(h.addr, &headers, &push).await.0, StatusCode::OK);
    let e = &h.got.wait_for(1).await[0];
    assert_eq!((e.ty.as_str(), e.source.as_str()), ("github", "gh-argo"));
    assert_eq!(e.id, "d-1", "a stable id, not Argo's random one");
    let data = json_data(e);
    assert_eq!(data["body"]["X-GitHub-Event"], "push");
    assert_eq!(data["body"]["X-GitHub-Delivery"], "d-1");
    assert_eq!(data["body"]["ref"], "refs/tags/simple-tag");
    assert_eq!(data["headers"]["X-Github-Event"], json!(["push"]));
    assert_eq!(data["metadata"], json!({ "team": "infra" }));

    // Argo's names, as `sluice run -f` sets them (source = EventSource, subject = event).
    let named = start::<sluice_webhook::GithubConfig>(
        "gh-argo-named",
        json!({ "secrets": ["s"], "format": "argo", "source": "github-es", "subject": "example" }),
    )
    .await;
    assert_eq!(post(named.addr, &headers, &push).await.0, StatusCode::OK);
    let e = &named.got.wait_for(1).await[0];
    assert_eq!(
        (e.source.as_str(), e.subject.as_deref()),
        ("github-es", Some("example"))
    );
}

#[tokio::test]
async fn github_events_filter_answers_200_and_counts() {
    let h = start::<sluice_webhook::GithubConfig>(
        "gh-filter",
        json!({ "secrets": ["s"], "events": ["pull_request"] }),
    )
    .await;
    let push = sample("github-push.json");
    let headers = vec![
        ("x-github-event", "push".to_owned()),
        ("x-github-delivery", "d-f".to_owned()),
        (
            "x-hub-signature-256",
            format!("sha256={}", hmac_hex(b"s", &[&push])),
        ),
    ];
    let (status, body) = post(h.addr, &headers, &push).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("filtered"))
    );
    assert_eq!(
        metric("sluice_events_filtered_total", &[("source", "gh-filter")]),
        1.0
    );
    assert!(h.got.is_empty());
}

#[tokio::test]
async fn gitlab_samples_with_token_and_idempotency_key() {
    let h = start::<sluice_webhook::GitlabConfig>("gl", json!({ "secrets": ["gl-token"] })).await;
    let mr = sample("gitlab-merge_request.json");
    let headers = |token: &str, extra: Option<(&'static str, &str)>| {
        let mut v = vec![
            ("content-type", "application/json".to_owned()),
            ("x-gitlab-event", "Merge Request Hook".to_owned()),
            ("x-gitlab-token", token.to_owned()),
            ("x-gitlab-event-uuid", "uuid-1".to_owned()),
        ];
        if let Some((k, val)) = extra {
            v.push((k, val.to_owned()));
        }
        v
    };
    let (status, _) = post(
        h.addr,
        &headers("gl-token", Some(("idempotency-key", "idem-1"))),
        &mr,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let push = sample("gitlab-push.json");
    let (status, _) = post(h.addr, &headers("gl-token", None), &push).await;
    assert_eq!(status, StatusCode::OK);
    let events = h.got.wait_for(2).await;
    assert_eq!(events[0].ty, "com.gitlab.merge_request.open");
    assert_eq!(events[0].id, "idem-1", "Idempotency-Key first");
    assert_eq!(events[0].source, "http://example.com/gitlabhq/gitlab-test");
    assert_eq!(events[0].subject.as_deref(), Some("1"));
    assert_eq!(
        events[0].time.as_ref().unwrap().as_str(),
        "2013-12-03T17:23:34Z"
    );
    assert_eq!(events[1].ty, "com.gitlab.push");
    assert_eq!(events[1].id, "uuid-1", "then X-Gitlab-Event-UUID");
    assert_eq!(
        events[1].subject.as_deref(),
        Some("da1560886d4f094c3e6c9ef40349f7d38b5d27d7")
    );
    let (status, body) = post(h.addr, &headers("nope", None), &push).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body["error"].as_str().unwrap().contains("X-Gitlab-Token"));
    assert_eq!(rejected("gl", "bad_token"), 1.0);
}

#[tokio::test]
async fn gitlab_argo_shape_keeps_the_token_out() {
    let h = start::<sluice_webhook::GitlabConfig>(
        "gl-argo",
        json!({ "secrets": ["gl-secret-token"], "format": "argo" }),
    )
    .await;
    let push = sample("gitlab-push.json");
    let headers = vec![
        ("x-gitlab-event", "Push Hook".to_owned()),
        ("x-gitlab-token", "gl-secret-token".to_owned()),
        ("x-gitlab-event-uuid", "uuid-argo".to_owned()),
    ];
    assert_eq!(post(h.addr, &headers, &push).await.0, StatusCode::OK);
    let e = &h.got.wait_for(1).await[0];
    assert_eq!((e.ty.as_str(), e.id.as_str()), ("gitlab", "uuid-argo"));
    let data = json_data(e);
    assert_eq!(data["headers"]["X-Gitlab-Event"], json!(["Push Hook"]));
    assert_eq!(data["body"]["object_kind"], "push");
    let encoded = String::from_utf8(sluice_core::format::encode_event(e)).unwrap();
    assert!(
        !encoded.contains("gl-secret-token"),
        "the token never reaches the event"
    );
}

#[tokio::test]
async fn bitbucket_cloud_and_server_samples() {
    let cloud = start::<sluice_webhook::BitbucketConfig>("bbc", json!({ "secrets": ["bb"] })).await;
    let push = sample("bitbucket-repo-push.json");
    let sig = |body: &[u8]| format!("sha256={}", hmac_hex(b"bb", &[body]));
    let headers = vec![
        ("x-event-key", "repo:push".to_owned()),
        ("x-request-uuid", "req-uuid-1".to_owned()),
        ("x-hub-signature", sig(&push)),
    ];
    assert_eq!(post(cloud.addr, &headers, &push).await.0, StatusCode::OK);
    let e = &cloud.got.wait_for(1).await[0];
    assert_eq!(e.ty, "org.bitbucket.repo:push");
    assert_eq!(e.id, "req-uuid-1");
    assert_eq!(e.source, "https://api.bitbucket.org/bitbucket/bitbucket");
    assert_eq!(e.subject.as_deref(), Some("name-of-branch"));

    let server =
        start::<sluice_webhook::BitbucketServerConfig>("bbs", json!({ "secrets": ["bb"] })).await;
    let pr = sample("bitbucket-server-pr-opened.json");
    let headers = vec![
        ("x-event-key", "pr:opened".to_owned()),
        ("x-request-id", "req-id-1".to_owned()),
        ("x-hub-signature", sig(&pr)),
    ];
    assert_eq!(post(server.addr, &headers, &pr).await.0, StatusCode::OK);
    let e = &server.got.wait_for(1).await[0];
    assert_eq!(e.ty, "org.bitbucket.pr:opened");
    assert_eq!(e.id, "req-id-1");
    assert_eq!(e.subject.as_deref(), Some("5"));
    assert_eq!(e.time.as_ref().unwrap().as_str(), "2019-03-01T09:31:15Z");
    // "Test connection": answered, no event.
    let ping = br#"{"test": true}"#;
    let headers = vec![
        ("x-event-key", "diagnostics:ping".to_owned()),
        ("x-hub-signature", sig(ping)),
    ];
    assert_eq!(post(server.addr, &headers, ping).await.0, StatusCode::OK);
    let headers = vec![("x-event-key", "pr:opened".to_owned())];
    assert_eq!(
        post(server.addr, &headers, &pr).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(server.got.len(), 1);
}

#[tokio::test]
async fn gerrit_sample_with_basic_auth_and_a_stable_id() {
    let h = start::<sluice_webhook::GerritConfig>(
        "gerrit",
        json!({ "auth": { "basic": { "username": "gerrit", "password": "pw" } } }),
    )
    .await;
    let ev = sample("gerrit-patchset-created.json");
    let auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("gerrit:pw")
    );
    let headers = vec![
        ("content-type", "application/json".to_owned()),
        ("authorization", auth),
    ];
    let (a, _) = post(h.addr, &headers, &ev).await;
    let (b, second) = post(h.addr, &headers, &ev).await;
    assert_eq!((a, b), (StatusCode::OK, StatusCode::OK));
    assert_eq!(
        second["duplicates"], 1,
        "a retry of the same event is a duplicate"
    );
    let e = &h.got.wait_for(1).await[0];
    assert_eq!(e.ty, "com.googlesource.gerrit.patchset-created");
    assert_eq!(e.source, "http://959be7129610/TestRepo1");
    assert_eq!(e.subject.as_deref(), Some("2"));
    assert_eq!(e.time.as_ref().unwrap().as_str(), "2023-11-20T11:12:12Z");
    assert_eq!(e.id.len(), 64, "a SHA-256 of the event's identity");
    let (status, _) = post(
        h.addr,
        &[("content-type", "application/json".to_owned())],
        &ev,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn stripe_sample_signed_now_and_stale() {
    let h = start::<sluice_webhook::StripeConfig>(
        "pay",
        json!({ "secrets": ["whsec_old", "whsec_new"], "events": ["charge.*"] }),
    )
    .await;
    let ev = sample("stripe-charge-succeeded.json");
    let sign = |t: &str, secret: &[u8]| {
        vec![
            ("content-type", "application/json".to_owned()),
            (
                "stripe-signature",
                format!("t={t},v1={}", hmac_hex(secret, &[t.as_bytes(), b".", &ev])),
            ),
        ]
    };
    assert_eq!(
        post(h.addr, &sign(&now(), b"whsec_new"), &ev).await.0,
        StatusCode::OK
    );
    let e = &h.got.wait_for(1).await[0];
    assert_eq!(e.ty, "com.stripe.charge.succeeded");
    assert_eq!(e.id, "evt_000000000000000000000000");
    assert_eq!(e.source, "https://stripe.com");
    assert_eq!(e.subject.as_deref(), Some("ch_000000000000000000000000"));
    assert_eq!(e.time.as_ref().unwrap().as_str(), "2022-03-26T18:40:32Z");
    let old = (chrono::Utc::now().timestamp() - 600).to_string();
    let (status, body) = post(h.addr, &sign(&old, b"whsec_old"), &ev).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        body["error"].as_str().unwrap().contains("tolerance"),
        "{body}"
    );
    assert_eq!(rejected("pay", "stale"), 1.0);
}

#[tokio::test]
async fn slack_challenge_events_interactions_and_commands() {
    let h = start::<sluice_webhook::SlackConfig>("chat", json!({ "secrets": ["slack-s"] })).await;
    let signed = |body: &[u8], ct: &str| {
        let ts = now();
        vec![
            ("content-type", ct.to_owned()),
            (
                "x-slack-signature",
                format!(
                    "v0={}",
                    hmac_hex(b"slack-s", &[b"v0:", ts.as_bytes(), b":", body])
                ),
            ),
            ("x-slack-request-timestamp", ts),
        ]
    };
    let challenge = br#"{"token":"x","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let (status, body) = post(h.addr, &signed(challenge, "application/json"), challenge).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["challenge"],
        "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    );

    let mention = sample("slack-event-app_mention.json");
    assert_eq!(
        post(h.addr, &signed(&mention, "application/json"), &mention)
            .await
            .0,
        StatusCode::OK
    );
    let actions = sample("slack-block_actions.json");
    let form: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", std::str::from_utf8(&actions).unwrap())
        .finish();
    let ct = "application/x-www-form-urlencoded";
    assert_eq!(
        post(h.addr, &signed(form.as_bytes(), ct), form.as_bytes())
            .await
            .0,
        StatusCode::OK
    );
    let command = b"token=x&team_id=T1DC2JH3J&channel_id=G8PSS9T3V&user_id=U2CERLKJA&command=%2Fdeploy&text=app&trigger_id=398738663015.47445629121.803a";
    assert_eq!(
        post(h.addr, &signed(command, ct), command).await.0,
        StatusCode::OK
    );

    let events = h.got.wait_for(3).await;
    assert_eq!(events[0].ty, "com.slack.app_mention");
    assert_eq!(events[0].id, "Ev0LAN670R");
    assert_eq!(events[0].source, "https://slack.com/T061EG9R6");
    assert_eq!(events[0].subject.as_deref(), Some("C0LAN2Q65"));
    assert_eq!(events[1].ty, "com.slack.block_actions");
    assert_eq!(events[1].source, "https://slack.com/T9TK3CUKW");
    assert_eq!(events[1].subject.as_deref(), Some("CBR2V3XEX"));
    assert_eq!(
        json_data(&events[1])["type"],
        "block_actions",
        "data is the decoded payload"
    );
    assert_eq!(events[2].ty, "com.slack.slash_command");
    assert_eq!(json_data(&events[2])["command"], "/deploy");
    assert_eq!(events[2].subject.as_deref(), Some("G8PSS9T3V"));

    let mut stale = signed(&mention, "application/json");
    stale[2].1 = (chrono::Utc::now().timestamp() - 400).to_string();
    assert_eq!(
        post(h.addr, &stale, &mention).await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn slack_argo_shape_is_the_inner_event() {
    let h = start::<sluice_webhook::SlackConfig>(
        "chat-argo",
        json!({ "secrets": ["s"], "format": "argo" }),
    )
    .await;
    let mention = sample("slack-event-app_mention.json");
    let ts = now();
    let headers = vec![
        ("content-type", "application/json".to_owned()),
        (
            "x-slack-signature",
            format!(
                "v0={}",
                hmac_hex(b"s", &[b"v0:", ts.as_bytes(), b":", &mention])
            ),
        ),
        ("x-slack-request-timestamp", ts),
    ];
    assert_eq!(post(h.addr, &headers, &mention).await.0, StatusCode::OK);
    let e = &h.got.wait_for(1).await[0];
    assert_eq!((e.ty.as_str(), e.source.as_str()), ("slack", "chat-argo"));
    let data = json_data(e);
    assert_eq!(
        data["type"], "app_mention",
        "Argo's slack data is the inner event: {data}"
    );
    assert_eq!(data["channel"], "C0LAN2Q65");
}

#[tokio::test]
async fn stripe_argo_shape_wraps_the_event() {
    let h = start::<sluice_webhook::StripeConfig>(
        "pay-argo",
        json!({ "secrets": ["whsec_x"], "format": "argo", "metadata": { "k": "v" } }),
    )
    .await;
    let ev = sample("stripe-charge-succeeded.json");
    let t = now();
    let headers = vec![(
        "stripe-signature",
        format!(
            "t={t},v1={}",
            hmac_hex(b"whsec_x", &[t.as_bytes(), b".", &ev])
        ),
    )];
    assert_eq!(post(h.addr, &headers, &ev).await.0, StatusCode::OK);
    let e = &h.got.wait_for(1).await[0];
    assert_eq!(
        (e.ty.as_str(), e.id.as_str()),
        ("stripe", "evt_000000000000000000000000")
    );
    let data = json_data(e);
    assert_eq!(data["event"]["type"], "charge.succeeded");
    assert_eq!(data["metadata"], json!({ "k": "v" }));
}

#[tokio::test]
async fn standard_webhooks_and_generic_hmac() {
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let key = base64::engine::general_purpose::STANDARD
        .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        .unwrap();
    let h = start::<sluice_webhook::StandardWebhooksConfig>(
        "std",
        json!({ "secrets": [secret], "type_prefix": "com.acme.", "subject_path": "data.id" }),
    )
    .await;
    let body =
        br#"{"type":"invoice.paid","timestamp":"2026-12-01T10:00:00Z","data":{"id":"in_1"}}"#;
    let ts = now();
    let sig = base64::engine::general_purpose::STANDARD.encode(
        aws_lc_rs::hmac::sign(
            &aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &key),
            &[b"msg_1.", ts.as_bytes(), b".", &body[..]].concat(),
        )
        .as_ref(),
    );
    let headers = vec![
        ("webhook-id", "msg_1".to_owned()),
        ("webhook-timestamp", ts),
        ("webhook-signature", format!("v1,{sig}")),
    ];
    assert_eq!(post(h.addr, &headers, body).await.0, StatusCode::OK);
    let e = &h.got.wait_for(1).await[0];
    assert_eq!(
        (e.ty.as_str(), e.id.as_str()),
        ("com.acme.invoice.paid", "msg_1")
    );
    assert_eq!(
        (e.source.as_str(), e.subject.as_deref()),
        ("std", Some("in_1"))
    );
    assert_eq!(e.time.as_ref().unwrap().as_str(), "2026-12-01T10:00:00Z");

    let g = start::<sluice_webhook::HmacConfig>(
        "generic",
        json!({ "header": "X-Shopify-Hmac-Sha256", "secrets": ["shp"], "encoding": "base64",
                "id_header": "X-Shopify-Webhook-Id", "type": "com.shopify.order", "source": "https://acme.myshopify.com" }),
    )
    .await;
    let body = br#"{"id":820982911946154508,"email":"jon@example.com"}"#;
    let sig = base64::engine::general_purpose::STANDARD.encode(
        aws_lc_rs::hmac::sign(
            &aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, b"shp"),
            body,
        )
        .as_ref(),
    );
    let headers = vec![
        ("content-type", "application/json".to_owned()),
        ("x-shopify-hmac-sha256", sig),
        (
            "x-shopify-webhook-id",
            "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043".to_owned(),
        ),
    ];
    assert_eq!(post(g.addr, &headers, body).await.0, StatusCode::OK);
    let e = &g.got.wait_for(1).await[0];
    assert_eq!(
        (e.ty.as_str(), e.id.as_str()),
        ("com.shopify.order", "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043")
    );
    assert_eq!(e.source, "https://acme.myshopify.com");
    let (status, _) = post(g.addr, &headers, br#"{"id":1}"#).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[test]
fn bad_configs_are_refused_with_the_option_named() {
    let errs = [
        (
            serde_json::from_value::<sluice_webhook::GithubConfig>(json!({ "secrets": [] }))
                .unwrap()
                .validate("gh"),
            "secrets",
        ),
        (
            serde_json::from_value::<sluice_webhook::StandardWebhooksConfig>(
                json!({ "secrets": ["whsec_!!"] }),
            )
            .unwrap()
            .validate("std"),
            "whsec_",
        ),
        (
            serde_json::from_value::<sluice_webhook::HmacConfig>(
                json!({ "header": "bad header", "secrets": ["k"] }),
            )
            .unwrap()
            .validate("h"),
            "header",
        ),
        (
            serde_json::from_value::<sluice_webhook::GithubConfig>(
                json!({ "secrets": ["s"], "path": "health" }),
            )
            .unwrap()
            .validate("gh"),
            "path",
        ),
        (
            serde_json::from_value::<sluice_webhook::GitlabConfig>(json!({}))
                .unwrap()
                .validate("gl"),
            "secrets",
        ),
    ];
    for (r, word) in errs {
        let e = r.expect_err("refused");
        assert!(e.contains(word), "{e:?} should name {word}");
    }
    let unknown = serde_json::from_value::<sluice_webhook::StripeConfig>(
        json!({ "secrets": ["s"], "tolerence": "5m" }),
    );
    assert!(unknown.unwrap_err().to_string().contains("tolerence"));
}

/// Runs the shared push-source compliance check (`testkit::http_push_source_compliance`) on
/// kind `T` at a free port, with `request(i)` building the `i`th delivery.
async fn push_compliance<T: SourceConfig + DeserializeOwned>(
    name: &str,
    mut cfg: Value,
    bad: Value,
    request: impl Fn(usize) -> (Vec<(String, String)>, Vec<u8>),
) {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    cfg["listen"] = json!(addr.to_string());
    cfg["path"] = json!("/hook");
    sluice_core::testkit::http_push_source_compliance::<T>(name, cfg, bad, addr, "/hook", request)
        .await;
}

fn pairs(v: Vec<(&str, String)>) -> Vec<(String, String)> {
    v.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

#[tokio::test]
async fn the_webhook_family_passes_the_push_source_compliance_check() {
    push_compliance::<sluice_webhook::WebhookConfig>(
        "pc-webhook",
        json!({}),
        json!({"methods": ["BREW"]}),
        |i| {
            (
                pairs(vec![
                    ("content-type", "application/json".to_owned()),
                    ("idempotency-key", format!("k-{i}")),
                ]),
                format!("{{\"n\":{i}}}").into_bytes(),
            )
        },
    )
    .await;
    let push = sample("github-push.json");
    push_compliance::<sluice_webhook::GithubConfig>(
        "pc-github",
        json!({"secrets": ["gh"]}),
        json!({"secrets": []}),
        |i| {
            (
                pairs(vec![
                    ("content-type", "application/json".to_owned()),
                    ("x-github-event", "push".to_owned()),
                    ("x-github-delivery", format!("d-{i}")),
                    (
                        "x-hub-signature-256",
                        format!("sha256={}", hmac_hex(b"gh", &[&push])),
                    ),
                ]),
                push.clone(),
            )
        },
    )
    .await;
    let mr = sample("gitlab-merge_request.json");
    push_compliance::<sluice_webhook::GitlabConfig>(
        "pc-gitlab",
        json!({"secrets": ["gl"]}),
        json!({"secrets": [""]}),
        |i| {
            (
                pairs(vec![
                    ("content-type", "application/json".to_owned()),
                    ("x-gitlab-event", "Merge Request Hook".to_owned()),
                    ("x-gitlab-token", "gl".to_owned()),
                    ("idempotency-key", format!("g-{i}")),
                ]),
                mr.clone(),
            )
        },
    )
    .await;
    let bb = sample("bitbucket-repo-push.json");
    push_compliance::<sluice_webhook::BitbucketConfig>(
        "pc-bitbucket",
        json!({"secrets": ["bb"]}),
        json!({"secrets": [""]}),
        |i| {
            (
                pairs(vec![
                    ("x-event-key", "repo:push".to_owned()),
                    ("x-request-uuid", format!("u-{i}")),
                    (
                        "x-hub-signature",
                        format!("sha256={}", hmac_hex(b"bb", &[&bb])),
                    ),
                ]),
                bb.clone(),
            )
        },
    )
    .await;
    let pr = sample("bitbucket-server-pr-opened.json");
    push_compliance::<sluice_webhook::BitbucketServerConfig>(
        "pc-bitbucket-server",
        json!({"secrets": ["bb"]}),
        json!({"secrets": []}),
        |i| {
            (
                pairs(vec![
                    ("x-event-key", "pr:opened".to_owned()),
                    ("x-request-id", format!("r-{i}")),
                    (
                        "x-hub-signature",
                        format!("sha256={}", hmac_hex(b"bb", &[&pr])),
                    ),
                ]),
                pr.clone(),
            )
        },
    )
    .await;
    let key = base64::engine::general_purpose::STANDARD
        .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        .unwrap();
    push_compliance::<sluice_webhook::StandardWebhooksConfig>(
        "pc-standard",
        json!({"secrets": ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]}),
        json!({"secrets": ["not base64"]}),
        move |i| {
            let body =
                format!(r#"{{"type":"invoice.paid","data":{{"id":"in_{i}"}}}}"#).into_bytes();
            let ts = now();
            let id = format!("msg_{i}");
            let sig = base64::engine::general_purpose::STANDARD.encode(
                aws_lc_rs::hmac::sign(
                    &aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &key),
                    &[id.as_bytes(), b".", ts.as_bytes(), b".", &body[..]].concat(),
                )
                .as_ref(),
            );
            (
                pairs(vec![
                    ("webhook-id", id),
                    ("webhook-timestamp", ts),
                    ("webhook-signature", format!("v1,{sig}")),
                ]),
                body,
            )
        },
    )
    .await;
    push_compliance::<sluice_webhook::HmacConfig>(
        "pc-hmac",
        json!({"header": "X-Signature", "secrets": ["hm"], "id_header": "X-Id", "type": "com.example.hook"}),
        json!({"header": "X-Signature", "secrets": ["hm"], "algorithm": "md4"}),
        |i| {
            let body = format!("{{\"n\":{i}}}").into_bytes();
            (
                pairs(vec![
                    ("x-signature", hmac_hex(b"hm", &[&body])),
                    ("x-id", format!("h-{i}")),
                ]),
                body,
            )
        },
    )
    .await;
}

#[tokio::test]
async fn stripe_slack_and_gerrit_pass_the_push_source_compliance_check() {
    let ev = String::from_utf8(sample("stripe-charge-succeeded.json")).unwrap();
    push_compliance::<sluice_webhook::StripeConfig>(
        "pc-stripe",
        json!({"secrets": ["whsec_x"]}),
        json!({"secrets": []}),
        |i| {
            let body = ev
                .replacen("evt_000000000000000000000000", &format!("evt_{i:024}"), 1)
                .into_bytes();
            let t = now();
            let sig = hmac_hex(b"whsec_x", &[t.as_bytes(), b".", &body]);
            (
                pairs(vec![
                    ("content-type", "application/json".to_owned()),
                    ("stripe-signature", format!("t={t},v1={sig}")),
                ]),
                body,
            )
        },
    )
    .await;
    let mention = String::from_utf8(sample("slack-event-app_mention.json")).unwrap();
    push_compliance::<sluice_webhook::SlackConfig>(
        "pc-slack",
        json!({"secrets": ["sl"]}),
        json!({"secrets": []}),
        |i| {
            let body = mention
                .replacen("Ev0LAN670R", &format!("Ev{i:08}"), 1)
                .into_bytes();
            let t = now();
            let sig = hmac_hex(b"sl", &[b"v0:", t.as_bytes(), b":", &body]);
            (
                pairs(vec![
                    ("content-type", "application/json".to_owned()),
                    ("x-slack-request-timestamp", t),
                    ("x-slack-signature", format!("v0={sig}")),
                ]),
                body,
            )
        },
    )
    .await;
    let auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("gerrit:pw")
    );
    let patchset: Value = serde_json::from_slice(&sample("gerrit-patchset-created.json")).unwrap();
    push_compliance::<sluice_webhook::GerritConfig>(
        "pc-gerrit",
        json!({"auth": {"basic": {"username": "gerrit", "password": "pw"}}}),
        json!({"auth": {}}),
        |i| {
            // The id is the hash of the body: another delivery is another body.
            let mut body = patchset.clone();
            body["eventCreatedOn"] = json!(1_700_000_000 + i);
            (
                pairs(vec![
                    ("content-type", "application/json".to_owned()),
                    ("authorization", auth.clone()),
                ]),
                serde_json::to_vec(&body).unwrap(),
            )
        },
    )
    .await;
}
