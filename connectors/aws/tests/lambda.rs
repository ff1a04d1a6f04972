//! The aws-lambda sink against a local server speaking Lambda's Invoke API
//! (`POST /2015-03-31/functions/{name}/invocations`, SigV4-signed by the SDK): moto's Lambda
//! needs Docker to run a function, which this machine does not have. The server answers as
//! Lambda does: 200 with the function's result, 200 with `X-Amz-Function-Error` when it threw,
//! 202 for `Event`, `ResourceNotFoundException` (404) and `TooManyRequestsException` (429).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use sluice_aws::LambdaSinkConfig;
use sluice_core::testkit::start_sink;
use sluice_core::{Event, SinkConfig, Status};

/// (function, invocation type, signed?, body)
type Calls = Arc<Mutex<Vec<(String, String, bool, Value)>>>;

async fn fake_lambda() -> (String, Calls) {
    std::env::set_var("AWS_ACCESS_KEY_ID", "test");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    std::env::set_var("AWS_REGION", "us-east-1");
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let calls: Calls = Arc::default();
    let c = calls.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let c = c.clone();
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let c = c.clone();
                async move {
                    let path = req.uri().path().to_owned();
                    let function = path
                        .strip_prefix("/2015-03-31/functions/")
                        .and_then(|p| p.strip_suffix("/invocations"))
                        .unwrap_or("?")
                        .to_owned();
                    let h = |n: &str| {
                        req.headers()
                            .get(n)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned()
                    };
                    let (kind, signed) = (
                        h("x-amz-invocation-type"),
                        h("authorization").starts_with("AWS4-HMAC-SHA256"),
                    );
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    c.lock()
                        .unwrap()
                        .push((function.clone(), kind.clone(), signed, v.clone()));
                    let mut r = Response::new(Full::new(Bytes::new()));
                    match function.as_str() {
                        "missing" => {
                            *r.status_mut() = StatusCode::NOT_FOUND;
                            r.headers_mut().insert(
                                "x-amzn-errortype",
                                "ResourceNotFoundException".parse().unwrap(),
                            );
                            *r.body_mut() = Full::new(Bytes::from(
                                r#"{"Type":"User","Message":"Function not found: missing"}"#,
                            ));
                        }
                        "throttled" => {
                            *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                            r.headers_mut().insert(
                                "x-amzn-errortype",
                                "TooManyRequestsException".parse().unwrap(),
                            );
                            *r.body_mut() = Full::new(Bytes::from(
                                r#"{"Type":"User","message":"Rate exceeded","Reason":"ReservedFunctionConcurrentInvocationLimitExceeded"}"#,
                            ));
                        }
                        "badjson" => {
                            *r.status_mut() = StatusCode::BAD_REQUEST;
                            r.headers_mut().insert(
                                "x-amzn-errortype",
                                "InvalidRequestContentException".parse().unwrap(),
                            );
                            *r.body_mut() = Full::new(Bytes::from(
                                r#"{"Type":"User","message":"Could not parse request body into json"}"#,
                            ));
                        }
                        "throws" => {
                            r.headers_mut()
                                .insert("x-amz-function-error", "Unhandled".parse().unwrap());
                            *r.body_mut() = Full::new(Bytes::from(
                                r#"{"errorMessage":"boom","errorType":"Error"}"#,
                            ));
                        }
                        _ if kind == "Event" => *r.status_mut() = StatusCode::ACCEPTED,
                        _ => *r.body_mut() = Full::new(Bytes::from(body.to_vec())),
                    }
                    Ok::<_, std::convert::Infallible>(r)
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (url, calls)
}

fn cfg(url: &str, function: &str, extra: Value) -> Value {
    let mut v = json!({"function_name": function, "endpoint": url, "region": "us-east-1", "timeout": "10s"});
    v.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    v
}

#[tokio::test]
async fn invoke_is_delivered_when_the_function_returned() {
    let (url, calls) = fake_lambda().await;
    let rig = start_sink::<LambdaSinkConfig>("fn", cfg(&url, "release", json!({}))).await;
    let e = Event::new("1", "/sensors/release", "sluice.sensor.submit")
        .with_json(r#"{"commit":"abc123"}"#);
    assert_eq!(rig.send(vec![e.clone()]).await.status, Status::Delivered);
    let rig2 = start_sink::<LambdaSinkConfig>(
        "fn-async",
        cfg(
            &url,
            "release",
            json!({"invocation_type": "Event", "payload": "structured"}),
        ),
    )
    .await;
    assert_eq!(rig2.send(vec![e]).await.status, Status::Delivered);
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[0].0.as_str(), calls[0].1.as_str(), calls[0].2),
        ("release", "RequestResponse", true)
    );
    assert_eq!(
        calls[0].3,
        json!({"commit": "abc123"}),
        "the event's data is the payload"
    );
    assert_eq!(calls[1].1, "Event");
    assert_eq!(
        (
            calls[1].3["id"].as_str(),
            calls[1].3["data"]["commit"].as_str()
        ),
        (Some("1"), Some("abc123")),
        "structured: the CloudEvent"
    );
}

#[tokio::test]
async fn function_errors_and_missing_functions_fail_bad_requests_reject() {
    let (url, _calls) = fake_lambda().await;
    let e = || vec![Event::new("1", "/s", "t").with_json("{}")];
    let throws = start_sink::<LambdaSinkConfig>("fn-throws", cfg(&url, "throws", json!({}))).await;
    let o = throws.send(e()).await;
    assert_eq!(o.status, Status::Failed, "{o:?}");
    assert!(o.reason.unwrap().contains("Unhandled"));
    // A function that does not exist (yet) fails, as a missing queue does for the sqs sink:
    // it may be deployed later, and the sender (or a Sensor's retryStrategy) retries.
    let missing =
        start_sink::<LambdaSinkConfig>("fn-missing", cfg(&url, "missing", json!({}))).await;
    let o = missing.send(e()).await;
    assert_eq!(o.status, Status::Failed, "{o:?}");
    assert!(o.reason.unwrap().contains("ResourceNotFoundException"));
    // A request Lambda refuses as such is rejected.
    let bad = start_sink::<LambdaSinkConfig>("fn-bad", cfg(&url, "badjson", json!({}))).await;
    let o = bad.send(e()).await;
    assert_eq!(o.status, Status::Rejected, "{o:?}");
    assert!(o.reason.unwrap().contains("InvalidRequestContentException"));
    let throttled = start_sink::<LambdaSinkConfig>(
        "fn-throttled",
        cfg(&url, "throttled", json!({"timeout": "3s"})),
    )
    .await;
    let o = throttled.send(e()).await;
    assert_eq!(
        o.status,
        Status::Failed,
        "throttling is not the sender's fault: {o:?}"
    );
}

#[test]
fn bad_configs_are_refused() {
    let bad = |v: Value| {
        serde_json::from_value::<LambdaSinkConfig>(v)
            .unwrap()
            .validate("f")
            .unwrap_err()
    };
    assert!(bad(json!({"function_name": ""})).contains("function_name"));
    assert!(bad(json!({"function_name": "f", "endpoint": "localhost"})).contains("endpoint"));
    assert!(bad(json!({"function_name": "f", "concurrency": 0})).contains("concurrency"));
}

/// The shared sink compliance check (`testkit::sink_compliance`) against the fake Lambda API:
/// what a function was invoked with is what it holds.
#[tokio::test]
async fn passes_the_sink_compliance_check() {
    let (url, calls) = fake_lambda().await;
    sluice_core::testkit::sink_compliance::<LambdaSinkConfig>(
        "lambda-compliance",
        cfg(&url, "release", json!({})),
        cfg(&url, "", json!({})),
        cfg(
            &format!("http://127.0.0.1:{}", sluice_core::testkit::free_port()),
            "release",
            json!({"timeout": "1s"}),
        ),
        move || {
            let got: Vec<Vec<u8>> = calls
                .lock()
                .unwrap()
                .iter()
                .map(|(_, _, _, v)| serde_json::to_vec(v).unwrap())
                .collect();
            Box::pin(async move { got })
        },
    )
    .await;
}
