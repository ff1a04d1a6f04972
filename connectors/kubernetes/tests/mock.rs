//! What the test API server cannot be made to do (it has no RBAC, never answers 429): a local
//! HTTP server speaking the few API paths a `k8s` sink uses.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::json;
use sluice_core::testkit;
use sluice_core::{Event, Status};
use sluice_kubernetes::K8sSinkConfig;

/// How the mock answers a create.
#[derive(Clone, Copy)]
enum Creates {
    Forbidden,
    /// 429 (with retryAfterSeconds 1) this many times, then 201.
    ThrottledThenCreated(usize),
}

async fn serve(
    creates: Creates,
    allowed: bool,
) -> (std::path::PathBuf, Arc<AtomicUsize>, tempfile::TempDir) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let c = c.clone();
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let c = c.clone();
                async move {
                    let path = req.uri().path().to_owned();
                    let (status, body) = match (req.method().as_str(), path.as_str()) {
                        ("GET", "/apis/argoproj.io/v1alpha1") => (
                            200,
                            json!({"kind": "APIResourceList", "apiVersion": "v1",
                            "groupVersion": "argoproj.io/v1alpha1", "resources": [{"name": "workflows", "singularName": "workflow",
                            "namespaced": true, "kind": "Workflow", "verbs": ["create", "get", "list", "watch", "patch"]}]}),
                        ),
                        ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews") => (
                            201,
                            json!({
                            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": {},
                            "status": {"allowed": allowed, "reason": if allowed { "" } else { "no RBAC policy matched" }}}),
                        ),
                        ("GET", "/api/v1/namespaces/argo/configmaps/templates") => (
                            200,
                            json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": "templates", "namespace": "argo"},
                            "data": {"wf.yaml": "apiVersion: argoproj.io/v1alpha1\nkind: Workflow\nmetadata:\n  generateName: from-cm-\nspec:\n  entrypoint: x\n"}}),
                        ),
                        ("GET", "/apis/argoproj.io/v1alpha1/namespaces/argo/workflows") => (
                            403,
                            json!({"kind": "Status",
                            "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                            "message": "workflows.argoproj.io is forbidden: User \"sluice\" cannot list resource \"workflows\""}),
                        ),
                        ("POST", "/apis/argoproj.io/v1alpha1/namespaces/argo/workflows") => {
                            let n = c.fetch_add(1, Ordering::SeqCst);
                            match creates {
                                Creates::Forbidden => (
                                    403,
                                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "message": "workflows.argoproj.io is forbidden: User \"system:serviceaccount:argo-events:sluice\" cannot create resource \"workflows\"",
                                    "reason": "Forbidden", "code": 403}),
                                ),
                                Creates::ThrottledThenCreated(k) if n < k => (
                                    429,
                                    json!({"kind": "Status", "apiVersion": "v1",
                                    "status": "Failure", "message": "too many requests", "reason": "TooManyRequests",
                                    "details": {"retryAfterSeconds": 1}, "code": 429}),
                                ),
                                Creates::ThrottledThenCreated(_) => (
                                    201,
                                    json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                                    "metadata": {"name": "w", "namespace": "argo", "uid": "u1", "resourceVersion": "1"}}),
                                ),
                            }
                        }
                        _ => (
                            404,
                            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "not found", "reason": "NotFound", "code": 404}),
                        ),
                    };
                    let resp = Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(body.to_string())))
                        .unwrap();
                    Ok::<_, Infallible>(resp)
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    std::fs::write(
        &kc,
        format!("apiVersion: v1\nkind: Config\nclusters: [{{name: m, cluster: {{server: \"http://127.0.0.1:{port}\"}}}}]\nusers: [{{name: u, user: {{}}}}]\ncontexts: [{{name: m, context: {{cluster: m, user: u, namespace: argo}}}}]\ncurrent-context: m\n"),
    )
    .unwrap();
    (kc, calls, dir)
}

fn cfg(kc: &std::path::Path) -> serde_json::Value {
    json!({"kubeconfig": kc, "retries": 3, "resource": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"generateName": "w-"}, "spec": {"entrypoint": "x"}}})
}

#[tokio::test]
async fn a_missing_permission_is_named_on_readiness_and_in_the_rejection() {
    let (kc, _, _dir) = serve(Creates::Forbidden, false).await;
    let rig = testkit::start_sink::<K8sSinkConfig>("rbac", cfg(&kc)).await;
    // The access review at start already said no: /readyz would show it.
    assert_eq!(
        rig.health.problems(),
        ["missing permission: create argoproj.io/workflows in namespace argo (grant it to the identity Sluice runs as)"]
    );
    assert_eq!(
        testkit::metric(
            "sluice_k8s_permissions_missing",
            &[("component", "sink rbac")]
        ),
        1.0
    );
    // And each event the API refuses with 403 says the same.
    let out = rig.send(vec![Event::new("e1", "s", "t")]).await;
    assert_eq!(out.status, Status::Rejected);
    let reason = out.reason.unwrap();
    assert!(
        reason.contains("missing permission: create argoproj.io/workflows in namespace argo")
            && reason.contains("forbidden"),
        "{reason}"
    );
}

#[tokio::test]
async fn throttling_is_retried_after_the_servers_wait() {
    let (kc, calls, _dir) = serve(Creates::ThrottledThenCreated(2), true).await;
    let rig = testkit::start_sink::<K8sSinkConfig>("throttled", cfg(&kc)).await;
    assert!(rig.health.problems().is_empty());
    let started = std::time::Instant::now();
    let out = rig.send(vec![Event::new("e1", "s", "t")]).await;
    assert_eq!(out.status, Status::Delivered, "{out:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // Two waits of the server's retryAfterSeconds (1 s each), not the 200 ms backoff.
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // More 429s than retries: failed (the sender retries later).
    let (kc, _, _dir2) = serve(Creates::ThrottledThenCreated(100), true).await;
    let rig = testkit::start_sink::<K8sSinkConfig>("throttled-out", json!({"kubeconfig": kc, "retries": 1,
        "resource": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "w"}}})).await;
    let out = rig.send(vec![Event::new("e2", "s", "t")]).await;
    assert_eq!(out.status, Status::Failed, "{out:?}");
    assert!(out.reason.unwrap().contains("429"));
}

/// `sluice validate --kube`'s check of a sink: the review's answer, without starting anything.
#[tokio::test]
async fn preflight_names_each_missing_permission() {
    use sluice_core::SinkConfig;
    let (kc, calls, _dir) = serve(Creates::Forbidden, false).await;
    let c: K8sSinkConfig = serde_json::from_value(cfg(&kc)).unwrap();
    let problems = c.preflight("wf").await.unwrap();
    assert_eq!(
        problems,
        ["missing permission: create argoproj.io/workflows in namespace argo (grant it to the identity Sluice runs as)"]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing was created");
    let (kc, _, _dir) = serve(Creates::Forbidden, true).await;
    let c: K8sSinkConfig = serde_json::from_value(cfg(&kc)).unwrap();
    assert!(c.preflight("wf").await.unwrap().is_empty());
}

/// The object from a ConfigMap key, read through the API (core/v1: not in the test API server).
#[tokio::test]
async fn the_object_can_come_from_a_configmap() {
    let (kc, calls, _dir) = serve(Creates::ThrottledThenCreated(0), true).await;
    let rig = testkit::start_sink::<K8sSinkConfig>(
        "cm",
        json!({"kubeconfig": kc, "configmap": {"name": "templates", "key": "wf.yaml"}}),
    )
    .await;
    let out = rig.send(vec![Event::new("c1", "s", "t")]).await;
    assert_eq!(out.status, Status::Delivered, "{out:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let rig = testkit::start_sink::<K8sSinkConfig>(
        "cm-missing-key",
        json!({"kubeconfig": kc, "configmap": {"name": "templates", "key": "nope.yaml"}}),
    )
    .await;
    let out = rig.send(vec![Event::new("c2", "s", "t")]).await;
    assert_eq!(out.status, Status::Rejected);
    assert!(out.reason.unwrap().contains("no key \"nope.yaml\""));
}

/// `resume`, `retry` and `resubmit` go to the Argo Server's REST API with the bearer token.
#[tokio::test]
async fn resume_goes_to_the_argo_server() {
    use sluice_kubernetes::ArgoWorkflowConfig;
    let (kc, _, _dir) = serve(Creates::Forbidden, true).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, String, String)>();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let auth = req
                    .headers()
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                let _ = tx.send((req.method().to_string(), req.uri().path().to_owned(), auth));
                let status = if req.uri().path().contains("/gone/") {
                    404
                } else {
                    200
                };
                async move {
                    Ok::<_, Infallible>(
                        Response::builder()
                            .status(status)
                            .body(Full::new(Bytes::from(if status == 404 {
                                r#"{"code":5,"message":"workflows.argoproj.io \"gone\" not found"}"#
                            } else {
                                "{}"
                            })))
                            .unwrap(),
                    )
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    let cfg = |name: &str| {
        json!({"kubeconfig": kc, "operation": "resume", "argo_server": {"url": format!("http://127.0.0.1:{port}"), "token": "s3cret"},
            "resource": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": name}}})
    };
    let rig = testkit::start_sink::<ArgoWorkflowConfig>("resume", cfg("wf-1")).await;
    assert_eq!(
        rig.send(vec![Event::new("r1", "s", "t")]).await.status,
        Status::Delivered
    );
    let (method, path, auth) = rx.recv().await.unwrap();
    assert_eq!(
        (method.as_str(), path.as_str(), auth.as_str()),
        ("PUT", "/api/v1/workflows/argo/wf-1/resume", "Bearer s3cret")
    );
    let rig = testkit::start_sink::<ArgoWorkflowConfig>("resume-gone", cfg("gone")).await;
    let out = rig.send(vec![Event::new("r2", "s", "t")]).await;
    assert_eq!(out.status, Status::Rejected);
    assert!(out.reason.unwrap().contains("not found"));
}

/// A policy needs list and watch on the kind: a 403 on its list rejects the event with `list`
/// named, and shows it on readiness.
#[tokio::test]
async fn a_policy_without_list_permission_is_named() {
    let (kc, calls, _dir) = serve(Creates::ThrottledThenCreated(0), true).await;
    let rig = testkit::start_sink::<K8sSinkConfig>(
        "policy-rbac",
        json!({"kubeconfig": kc, "resource": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": "w"}, "spec": {"entrypoint": "x"}},
            "policy": {"labels": {"done": "true"}, "backoff": {"duration": "1s", "steps": 3}}}),
    )
    .await;
    let out = rig.send(vec![Event::new("p1", "s", "t")]).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "created first");
    assert_eq!(out.status, Status::Rejected, "{out:?}");
    let reason = out.reason.unwrap();
    assert!(
        reason.contains("missing permission: list argoproj.io/workflows in namespace argo"),
        "{reason}"
    );
    assert_eq!(
        rig.health.problems(),
        ["missing permission: list argoproj.io/workflows in namespace argo (grant it to the identity Sluice runs as)"]
    );
}
