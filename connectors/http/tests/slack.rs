//! The Slack sink against a local fake of Slack's Web API (`chat.postMessage` over HTTP, with
//! the answers Slack gives: `ok`, `ts`, `error`, 429 with Retry-After).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use sluice_core::testkit::start_sink;
use sluice_core::{Event, SinkConfig, Status};
use sluice_http::SlackSinkConfig;

type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// A fake Slack: checks the bot token, answers `channel_not_found` for `#nope`, 429 once for
/// `#busy`, and `ok` with a new `ts` otherwise. Records (Authorization, body) of every call.
async fn fake_slack() -> (String, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api", listener.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let busy_once = Arc::new(Mutex::new(true));
    let s = seen.clone();
    tokio::spawn(async move {
        let counter = Arc::new(Mutex::new(0u64));
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (s, busy, counter) = (s.clone(), busy_once.clone(), counter.clone());
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let (s, busy, counter) = (s.clone(), busy.clone(), counter.clone());
                async move {
                    assert_eq!(req.uri().path(), "/api/chat.postMessage");
                    let auth = req
                        .headers()
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default();
                    let body: Value = serde_json::from_slice(
                        &req.into_body().collect().await.unwrap().to_bytes(),
                    )
                    .unwrap();
                    s.lock().unwrap().push((auth.clone(), body.clone()));
                    let reply = |status: u16, v: Value| {
                        let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
                        *r.status_mut() = StatusCode::from_u16(status).unwrap();
                        if status == 429 {
                            r.headers_mut().insert("retry-after", "0".parse().unwrap());
                        }
                        Ok::<_, std::convert::Infallible>(r)
                    };
                    if auth != "Bearer xoxb-test" {
                        return reply(200, json!({"ok": false, "error": "invalid_auth"}));
                    }
                    match body["channel"].as_str() {
                        Some("#nope") => {
                            reply(200, json!({"ok": false, "error": "channel_not_found"}))
                        }
                        Some("#busy") if std::mem::take(&mut *busy.lock().unwrap()) => {
                            reply(429, json!({"ok": false, "error": "ratelimited"}))
                        }
                        _ => {
                            let ts = {
                                let mut c = counter.lock().unwrap();
                                *c += 1;
                                format!("1700000000.{:06}", *c)
                            };
                            reply(
                                200,
                                json!({"ok": true, "channel": body["channel"], "ts": ts}),
                            )
                        }
                    }
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (url, seen)
}

#[tokio::test]
async fn posts_messages_from_templates_or_the_events_data_and_threads_them() {
    let (url, seen) = fake_slack().await;
    let rig = start_sink::<SlackSinkConfig>(
        "chat",
        json!({"token": "xoxb-test", "api_url": url, "channel": "#releases", "message": "{type} for {subject}",
               "thread": {"aggregation_key": "{subject}"}, "sender": {"username": "sluice", "icon": ":rocket:"},
               "retry": {"max_attempts": 3, "initial_backoff": "10ms"}}),
    )
    .await;
    // Attributes through the templates.
    let o = rig
        .send(vec![
            Event::new("1", "/ci", "build.finished").with_subject("app")
        ])
        .await;
    assert_eq!(o.status, Status::Delivered, "{o:?}");
    // A sensor payload's data members win; same subject: a reply in the first one's thread.
    let data = json!({"text": "Release *abc123* is out", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "hi"}}]});
    let o = rig
        .send(vec![Event::new(
            "2",
            "/sensors/release",
            "sluice.sensor.submit",
        )
        .with_subject("app")
        .with_json(data.to_string())])
        .await;
    assert_eq!(o.status, Status::Delivered, "{o:?}");
    // Rate limited once (429, Retry-After: 0), then posted.
    let o = rig
        .send(vec![
            Event::new("3", "/x", "t").with_json(r##"{"channel":"#busy","text":"later"}"##)
        ])
        .await;
    assert_eq!(o.status, Status::Delivered, "{o:?}");
    let seen = seen.lock().unwrap().clone();
    assert!(seen.iter().all(|(auth, _)| auth == "Bearer xoxb-test"));
    let bodies: Vec<&Value> = seen.iter().map(|(_, b)| b).collect();
    assert_eq!(bodies[0]["channel"], "#releases");
    assert_eq!(bodies[0]["text"], "build.finished for app");
    assert_eq!(
        (
            bodies[0]["username"].as_str(),
            bodies[0]["icon_emoji"].as_str()
        ),
        (Some("sluice"), Some(":rocket:"))
    );
    assert!(bodies[0].get("thread_ts").is_none());
    assert_eq!(bodies[1]["text"], "Release *abc123* is out");
    assert_eq!(bodies[1]["blocks"][0]["type"], "section");
    assert_eq!(
        bodies[1]["thread_ts"], "1700000000.000001",
        "the reply goes into the first message's thread"
    );
    assert_eq!(bodies.len(), 4, "three messages, one of them sent twice");
    assert_eq!(
        (bodies[2]["channel"].as_str(), bodies[3]["channel"].as_str()),
        (Some("#busy"), Some("#busy"))
    );
}

#[tokio::test]
async fn slack_refusals_are_rejections_and_nothing_is_delivered_without_ok() {
    let (url, _seen) = fake_slack().await;
    let rig = start_sink::<SlackSinkConfig>(
        "chat-nope",
        json!({"token": "xoxb-test", "api_url": url, "channel": "#nope"}),
    )
    .await;
    let o = rig.send(vec![Event::new("1", "/s", "t")]).await;
    assert_eq!(o.status, Status::Rejected);
    assert!(o.reason.unwrap().contains("channel_not_found"));
    let bad = start_sink::<SlackSinkConfig>(
        "chat-auth",
        json!({"token": "xoxb-wrong", "api_url": url, "channel": "#x"}),
    )
    .await;
    let o = bad.send(vec![Event::new("1", "/s", "t")]).await;
    assert_eq!(o.status, Status::Rejected);
    assert!(o.reason.unwrap().contains("invalid_auth"));
    // No channel anywhere: refused before any call.
    let none =
        start_sink::<SlackSinkConfig>("chat-none", json!({"token": "xoxb-test", "api_url": url}))
            .await;
    let o = none.send(vec![Event::new("1", "/s", "t")]).await;
    assert_eq!(o.status, Status::Rejected);
    assert!(o.reason.unwrap().contains("no channel"));
    // Slack unreachable: failed (transient), not delivered.
    let port = sluice_core::testkit::free_port();
    let gone = start_sink::<SlackSinkConfig>("chat-gone", json!({"token": "xoxb-test", "api_url": format!("http://127.0.0.1:{port}/api"), "channel": "#x", "retry": {"max_attempts": 2, "initial_backoff": "10ms"}})).await;
    let o = gone.send(vec![Event::new("1", "/s", "t")]).await;
    assert_eq!(o.status, Status::Failed);
}

#[tokio::test]
async fn allowed_channels_bound_where_event_data_posts() {
    let (url, seen) = fake_slack().await;
    let rig = start_sink::<SlackSinkConfig>(
        "chat-allowed",
        json!({"token": "xoxb-test", "api_url": url, "channel": "#releases",
               "allowed_channels": ["#releases", "C0123ABCD"]}),
    )
    .await;
    let send = |id: &str, data: Value| {
        rig.send(vec![Event::new(id, "/s", "t").with_json(data.to_string())])
    };
    let o = send("1", json!({"text": "to the default channel"})).await;
    assert_eq!(o.status, Status::Delivered, "{o:?}");
    let o = send("2", json!({"channel": "C0123ABCD", "text": "by id"})).await;
    assert_eq!(o.status, Status::Delivered, "{o:?}");
    // A channel the data picks outside the list: refused before any call to Slack.
    let o = send("3", json!({"channel": "#general", "text": "spam"})).await;
    assert_eq!(o.status, Status::Rejected, "{o:?}");
    assert!(o.reason.unwrap().contains("allowed_channels"));
    let seen = seen.lock().unwrap().clone();
    let channels: Vec<&str> = seen
        .iter()
        .filter_map(|(_, b)| b["channel"].as_str())
        .collect();
    assert_eq!(channels, ["#releases", "C0123ABCD"]);
}

#[test]
fn bad_configs_are_refused() {
    let bad = |v: Value| {
        serde_json::from_value::<SlackSinkConfig>(v)
            .unwrap()
            .validate("s")
            .unwrap_err()
    };
    assert!(bad(json!({"token": ""})).contains("token"));
    assert!(bad(json!({"token": "x", "api_url": "slack.com"})).contains("api_url"));
    assert!(bad(json!({"token": "x", "blocks": "{}"})).contains("blocks: must be a JSON array"));
    assert!(bad(json!({"token": "x", "channel": "{unclosed"})).contains("unclosed"));
    assert!(
        bad(json!({"token": "x", "channel": "#ops", "allowed_channels": ["#releases"]}))
            .contains("#ops is not in allowed_channels")
    );
    assert!(bad(json!({"token": "x", "allowed_channels": [" "]})).contains("allowed_channels.0"));
    assert!(
        bad(json!({"token": "x", "allowed_channels": ["#ops", " #releases"]}))
            .contains("allowed_channels.1")
    );
}

/// The shared sink compliance check (`testkit::sink_compliance`) against the fake Slack: the
/// posted text is the event's data.
#[tokio::test]
async fn passes_the_sink_compliance_check() {
    let (url, seen) = fake_slack().await;
    sluice_core::testkit::sink_compliance::<SlackSinkConfig>(
        "slack-compliance",
        json!({"token": "xoxb-test", "api_url": url, "channel": "#releases", "message": "{id}"}),
        json!({"token": "", "api_url": url, "channel": "#releases"}),
        json!({"token": "xoxb-test", "channel": "#releases",
            "api_url": format!("http://127.0.0.1:{}/api", sluice_core::testkit::free_port()),
            "retry": {"max_attempts": 100, "initial_backoff": "50ms"}}),
        move || {
            let got: Vec<Vec<u8>> = seen
                .lock()
                .unwrap()
                .iter()
                .map(|(_, v)| serde_json::to_vec(v).unwrap())
                .collect();
            Box::pin(async move { got })
        },
    )
    .await;
}
