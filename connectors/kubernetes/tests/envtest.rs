//! The Kubernetes connectors against a real API server: `scripts/envtest.sh start` (the
//! upstream apiextensions-apiserver with etcd, Argo's kinds as CRDs), whose kubeconfig is in
//! `SLUICE_TEST_KUBECONFIG` (set by `scripts/test.sh`), else at the script's default path.
//! Without a server these tests fail with what to run; they never skip.

use std::path::PathBuf;
use std::time::Duration;

use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::{json, Value};
use sluice_core::testkit::{self, SourceRig};
use sluice_core::{Event, SourceConfig, Status};
use sluice_kubernetes::{ArgoWorkflowConfig, K8sSinkConfig, K8sSourceConfig};

fn kubeconfig() -> PathBuf {
    if let Ok(p) = std::env::var("SLUICE_TEST_KUBECONFIG") {
        return PathBuf::from(p);
    }
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/k8s-envtest/run/kubeconfig");
    assert!(
        p.exists(),
        "no test API server: run `scripts/envtest.sh start` (scripts/test.sh does) or set SLUICE_TEST_KUBECONFIG"
    );
    p
}

async fn client() -> Client {
    let kc = Kubeconfig::read_from(kubeconfig()).expect("kubeconfig");
    let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(cfg).expect("client")
}

fn workflows(c: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Workflow"),
        "workflows",
    );
    Api::namespaced_with(c.clone(), ns, &ar)
}

/// A namespace of its own per test (the test server needs no Namespace object).
fn ns(test: &str) -> String {
    format!("{test}-{}", std::process::id())
}

fn kc() -> String {
    kubeconfig().display().to_string()
}

fn s3_event(id: &str, key: &str) -> Event {
    Event::new(
        id,
        "aws:s3.us-east-1.uploads",
        "com.amazonaws.s3.ObjectCreated:Put",
    )
    .with_subject(key.to_owned())
    .with_json(json!({"s3": {"bucket": {"name": "uploads"}, "object": {"key": key}}}).to_string())
}

fn workflow_template() -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "s3-processing-", "labels": {"app": "orders"}},
        "spec": {"entrypoint": "process", "arguments": {"parameters": [{"name": "key"}]},
                 "templates": [{"name": "process", "container": {"image": "alpine", "command": ["echo"]}}]}
    })
}

async fn wait_list(api: &Api<DynamicObject>, sel: &str, n: usize) -> Vec<DynamicObject> {
    for _ in 0..100 {
        let l = api.list(&ListParams::default().labels(sel)).await.unwrap();
        if l.items.len() >= n {
            return l.items;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    api.list(&ListParams::default().labels(sel))
        .await
        .unwrap()
        .items
}

#[tokio::test]
async fn create_with_generate_name_is_idempotent_per_event() {
    let ns = ns("create");
    let rig = testkit::start_sink::<K8sSinkConfig>(
        "wf",
        json!({
            "kubeconfig": kc(), "namespace": ns, "resource": workflow_template(),
            "parameters": [{"src": {"dataKey": "s3.object.key"}, "dest": "spec.arguments.parameters.0.value"}]
        }),
    )
    .await;
    let out = rig.send(vec![s3_event("e-1", "in/a.csv")]).await;
    assert_eq!(out.status, Status::Delivered, "{out:?}");
    // The same event through another instance (a replica, or this one after a crash: its
    // pipeline's dedup window does not have it): the derived name meets 409, delivered.
    let replica = testkit::start_sink::<K8sSinkConfig>(
        "wf",
        json!({
            "kubeconfig": kc(), "namespace": ns, "resource": workflow_template(),
            "parameters": [{"src": {"dataKey": "s3.object.key"}, "dest": "spec.arguments.parameters.0.value"}]
        }),
    )
    .await;
    let again = replica.send(vec![s3_event("e-1", "in/a.csv")]).await;
    assert_eq!(again.status, Status::Delivered, "{again:?}");
    let other = rig.send(vec![s3_event("e-2", "in/b.csv")]).await;
    assert_eq!(other.status, Status::Delivered, "{other:?}");

    let c = client().await;
    let items = wait_list(&workflows(&c, &ns), "app=orders", 2).await;
    assert_eq!(items.len(), 2, "one Workflow per event");
    let mut keys: Vec<String> = items
        .iter()
        .map(|w| {
            w.data["spec"]["arguments"]["parameters"][0]["value"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    keys.sort();
    assert_eq!(keys, ["in/a.csv", "in/b.csv"]);
    for w in &items {
        let name = w.metadata.name.as_deref().unwrap();
        assert!(
            name.starts_with("s3-processing-") && name.len() == "s3-processing-".len() + 10,
            "{name}"
        );
        let labels = w.metadata.labels.as_ref().unwrap();
        assert!(labels.contains_key("events.argoproj.io/action-timestamp"));
    }
    assert_eq!(
        testkit::metric("sluice_k8s_duplicate_creates_total", &[("sink", "wf")]),
        1.0
    );
    // The standard sink telemetry: three delivered (the duplicate included), no failure.
    testkit::assert_sink_telemetry("wf", 3, 0);
}

#[tokio::test]
async fn the_server_refusing_an_object_rejects_the_event_with_its_message() {
    let ns = ns("reject");
    let rig = testkit::start_sink::<K8sSinkConfig>(
        "bad",
        json!({"kubeconfig": kc(), "namespace": ns, "resource": {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "Not_A_DNS_Name"}, "spec": {}}}),
    )
    .await;
    let out = rig.send(vec![Event::new("x", "s", "t")]).await;
    assert_eq!(out.status, Status::Rejected, "{out:?}");
    let reason = out.reason.unwrap();
    assert!(
        reason.contains("422") && reason.contains("Not_A_DNS_Name"),
        "{reason}"
    );
}

#[tokio::test]
async fn patch_update_apply_and_delete() {
    let ns = ns("ops");
    let c = client().await;
    let api = workflows(&c, &ns);
    let named = |name: &str| {
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
               "metadata": {"name": name, "labels": {"a": "1"}}, "spec": {"entrypoint": "x", "keep": true}})
    };
    let obj: DynamicObject = serde_json::from_value(named("target")).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();

    // Merge patch: the template's fields over the live object.
    let rig = testkit::start_sink::<K8sSinkConfig>("patch", json!({"kubeconfig": kc(), "namespace": ns, "operation": "patch",
        "resource": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "target"}, "spec": {"priority": 1}},
        "parameters": [{"src": {"dataKey": "who"}, "dest": "metadata.labels.who"}]})).await;
    let out = rig
        .send(vec![
            Event::new("p1", "s", "t").with_json(r#"{"who":"ops"}"#)
        ])
        .await;
    assert_eq!(out.status, Status::Delivered, "{out:?}");
    let live = api.get("target").await.unwrap();
    assert_eq!(live.data["spec"]["priority"], 1);
    assert_eq!(live.data["spec"]["keep"], true);
    assert_eq!(live.metadata.labels.as_ref().unwrap()["who"], "ops");

    // JSON Patch: an array of operations, the object named by target (Argo #3032).
    let rig = testkit::start_sink::<K8sSinkConfig>("jsonpatch", json!({"kubeconfig": kc(), "namespace": ns, "operation": "patch",
        "patchStrategy": "application/json-patch+json",
        "target": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "target"},
        "resource": [{"op": "replace", "path": "/spec/priority", "value": 0}, {"op": "add", "path": "/spec/note", "value": ""}],
        "parameters": [{"src": {"dataKey": "n", "useRawData": true}, "dest": "0.value"}, {"src": {"dataKey": "note"}, "dest": "1.value"}]})).await;
    let out = rig
        .send(vec![
            Event::new("j1", "s", "t").with_json(r#"{"n":7,"note":"hi"}"#)
        ])
        .await;
    assert_eq!(out.status, Status::Delivered, "{out:?}");
    let live = api.get("target").await.unwrap();
    assert_eq!(live.data["spec"]["priority"], 7);
    assert_eq!(live.data["spec"]["note"], "hi");

    // Update: merged over the live object (its other fields kept), PUT with its version.
    let rig = testkit::start_sink::<K8sSinkConfig>("update", json!({"kubeconfig": kc(), "namespace": ns, "operation": "update",
        "resource": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "target"}, "spec": {"priority": 9}}})).await;
    assert_eq!(
        rig.send(vec![Event::new("u1", "s", "t")]).await.status,
        Status::Delivered
    );
    let live = api.get("target").await.unwrap();
    assert_eq!(live.data["spec"]["priority"], 9);
    assert_eq!(live.data["spec"]["note"], "hi");
    // Update of an absent object creates it.
    let rig2 = testkit::start_sink::<K8sSinkConfig>(
        "update2",
        json!({"kubeconfig": kc(), "namespace": ns, "operation": "update",
        "resource": named("fresh")}),
    )
    .await;
    assert_eq!(
        rig2.send(vec![Event::new("u2", "s", "t")]).await.status,
        Status::Delivered
    );
    assert!(api.get_opt("fresh").await.unwrap().is_some());

    // Server-side apply with field manager sluice.
    let rig = testkit::start_sink::<K8sSinkConfig>("apply", json!({"kubeconfig": kc(), "namespace": ns, "operation": "apply",
        "resource": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "applied"}, "spec": {"entrypoint": "a"}}})).await;
    assert_eq!(
        rig.send(vec![Event::new("a1", "s", "t")]).await.status,
        Status::Delivered
    );
    let live = api.get("applied").await.unwrap();
    let managers: Vec<_> = live
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.contains(&"sluice".to_owned()), "{managers:?}");

    // Delete, and a delete of what is gone counts as done.
    let rig = testkit::start_sink::<K8sSinkConfig>(
        "delete",
        json!({"kubeconfig": kc(), "namespace": ns, "operation": "delete",
        "resource": named("fresh")}),
    )
    .await;
    assert_eq!(
        rig.send(vec![Event::new("d1", "s", "t")]).await.status,
        Status::Delivered
    );
    assert_eq!(
        rig.send(vec![Event::new("d2", "s", "t")]).await.status,
        Status::Delivered
    );
    for _ in 0..50 {
        if api.get_opt("fresh").await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(api.get_opt("fresh").await.unwrap().is_none());
}

#[tokio::test]
async fn a_cluster_scoped_kind_gets_no_namespace() {
    let rig = testkit::start_sink::<K8sSinkConfig>("cwt", json!({"kubeconfig": kc(), "namespace": "argo", "operation": "apply",
        "resource": {"apiVersion": "argoproj.io/v1alpha1", "kind": "ClusterWorkflowTemplate",
                     "metadata": {"name": format!("cluster-{}", std::process::id()), "namespace": "ignored"}, "spec": {"entrypoint": "x"}}})).await;
    let out = rig.send(vec![Event::new("c1", "s", "t")]).await;
    assert_eq!(out.status, Status::Delivered, "{out:?}");
    let c = client().await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "ClusterWorkflowTemplate"),
        "clusterworkflowtemplates",
    );
    let api: Api<DynamicObject> = Api::all_with(c, &ar);
    let got = api
        .get(&format!("cluster-{}", std::process::id()))
        .await
        .unwrap();
    assert!(got.metadata.namespace.is_none());
}

#[tokio::test]
async fn argo_workflow_submit_from_template_and_stop() {
    let ns = ns("argo");
    let c = client().await;
    let wt_ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "WorkflowTemplate"),
        "workflowtemplates",
    );
    let wt: DynamicObject = serde_json::from_value(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTemplate",
        "metadata": {"name": "nightly"}, "spec": {"entrypoint": "main", "arguments": {"parameters": [{"name": "day", "value": "x"}]}}})).unwrap();
    Api::<DynamicObject>::namespaced_with(c.clone(), &ns, &wt_ar)
        .create(&PostParams::default(), &wt)
        .await
        .unwrap();

    let rig = testkit::start_sink::<ArgoWorkflowConfig>("from", json!({"kubeconfig": kc(), "namespace": ns, "operation": "submit-from",
        "resource": {"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTemplate", "metadata": {"name": "nightly"},
                     "spec": {"arguments": {"parameters": [{"name": "day"}]}}},
        "parameters": [{"src": {"dataKey": "day"}, "dest": "spec.arguments.parameters.0.value"}]})).await;
    let out = rig
        .send(vec![
            Event::new("n1", "cron", "tick").with_json(r#"{"day":"2026-12-07"}"#)
        ])
        .await;
    assert_eq!(out.status, Status::Delivered, "{out:?}");
    let wfs = workflows(&c, &ns);
    let items = wait_list(&wfs, "workflows.argoproj.io/workflow-template=nightly", 1).await;
    assert_eq!(items.len(), 1);
    let wf = &items[0];
    assert_eq!(wf.data["spec"]["workflowTemplateRef"]["name"], "nightly");
    assert_eq!(
        wf.data["spec"]["arguments"]["parameters"][0]["value"],
        "2026-12-07"
    );
    let name = wf.metadata.name.clone().unwrap();
    assert!(name.starts_with("nightly-"), "{name}");

    // Stop it by label (Argo #1258), then a stop of a finished Workflow is refused clearly.
    let stop = testkit::start_sink::<ArgoWorkflowConfig>(
        "stop",
        json!({"kubeconfig": kc(), "namespace": ns, "operation": "stop",
        "selector": "workflows.argoproj.io/workflow-template=nightly",
        "resource": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow"}}),
    )
    .await;
    assert_eq!(
        stop.send(vec![Event::new("s1", "s", "t")]).await.status,
        Status::Delivered
    );
    assert_eq!(
        wfs.get(&name).await.unwrap().data["spec"]["shutdown"],
        "Stop"
    );
    wfs.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
    )
    .await
    .unwrap();
    // Again (a redelivery): already stopped, done.
    assert_eq!(
        stop.send(vec![Event::new("s2", "s", "t")]).await.status,
        Status::Delivered
    );
    // A Workflow named that finished without being stopped: a clear refusal.
    let done: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"name": "finished"}, "spec": {"entrypoint": "x"}}),
    )
    .unwrap();
    wfs.create(&PostParams::default(), &done).await.unwrap();
    wfs.patch_status(
        "finished",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
    )
    .await
    .unwrap();
    let by_name = testkit::start_sink::<ArgoWorkflowConfig>("stop-named", json!({"kubeconfig": kc(), "namespace": ns, "operation": "stop",
        "resource": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "finished"}}})).await;
    let out = by_name.send(vec![Event::new("s3", "s", "t")]).await;
    assert_eq!(out.status, Status::Rejected);
    assert!(
        out.reason
            .as_deref()
            .unwrap()
            .contains("already finished (phase Succeeded)"),
        "{out:?}"
    );
}

/// The next `n` events' (type, subject), sorted, each delivered.
async fn take_sorted(cap: &mut testkit::Capture, n: usize) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    for _ in 0..n {
        let item = cap.next_within(Duration::from_secs(10)).await;
        seen.push((
            item.event.ty.to_string(),
            item.event.subject.clone().unwrap().to_string(),
        ));
        item.delivery.delivered();
    }
    seen.sort();
    seen
}

/// The `k8s` source: a relist of what it knew (ADD for new objects only), live changes, and
/// after a restart UPDATE for what changed while it was down and DELETE for what went.
#[tokio::test]
async fn the_source_misses_nothing_across_a_restart() {
    let ns = ns("watch");
    let c = client().await;
    let api = workflows(&c, &ns);
    let mk = |name: &str| -> DynamicObject {
        serde_json::from_value(
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": name, "labels": {"app": "orders"}}, "spec": {"entrypoint": "x"}}),
        )
        .unwrap()
    };
    api.create(&PostParams::default(), &mk("a")).await.unwrap();
    api.create(&PostParams::default(), &mk("b")).await.unwrap();
    let cfg = json!({"kubeconfig": kc(), "group": "argoproj.io", "version": "v1alpha1", "resource": "workflows",
        "namespace": ns, "filter": {"labels": [{"key": "app", "operation": "==", "value": "orders"}]}});
    let state = std::sync::Arc::new(sluice_core::state::MemoryStateStore::default());

    let run = |state: std::sync::Arc<sluice_core::state::MemoryStateStore>| {
        let cfg = cfg.clone();
        async move {
            let mut rig = SourceRig::new("wf-watch");
            rig.state = state;
            let c: K8sSourceConfig = serde_json::from_value(cfg).unwrap();
            c.validate("wf-watch").unwrap();
            let running = Box::new(c).build(rig.context("wf-watch")).await.unwrap();
            let task = tokio::spawn(running);
            let cap = rig.capture();
            (rig, cap, task)
        }
    };
    let (rig, mut cap, task) = run(state.clone()).await;
    assert_eq!(
        take_sorted(&mut cap, 2).await,
        [
            ("io.k8s.workflows.added".to_owned(), format!("{ns}/a")),
            ("io.k8s.workflows.added".to_owned(), format!("{ns}/b"))
        ]
    );
    // A live change.
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"step": 1}})),
    )
    .await
    .unwrap();
    let item = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(item.event.ty.as_str(), "io.k8s.workflows.updated");
    let data: Value = serde_json::from_slice(item.event.data.as_bytes().unwrap()).unwrap();
    assert_eq!(data["type"], "UPDATE");
    assert_eq!(data["body"]["spec"]["step"], 1);
    assert_eq!(data["resource"], "workflows");
    item.delivery.delivered();
    // Stop, and change things while it is down.
    rig.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    drop(cap);
    api.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"step": 2}})),
    )
    .await
    .unwrap();
    api.delete("a", &Default::default()).await.unwrap();
    api.create(&PostParams::default(), &mk("c")).await.unwrap();

    let (rig, mut cap, task) = run(state.clone()).await;
    assert_eq!(
        take_sorted(&mut cap, 3).await,
        [
            ("io.k8s.workflows.added".to_owned(), format!("{ns}/c")),
            ("io.k8s.workflows.deleted".to_owned(), format!("{ns}/a")),
            ("io.k8s.workflows.updated".to_owned(), format!("{ns}/b")),
        ]
    );
    // The standard source telemetry: 3 events in the first run, 3 in the second.
    testkit::assert_source_telemetry("wf-watch", 6);
    // Nothing else: the unchanged objects are not emitted again.
    cap.assert_quiet(Duration::from_millis(500), "nothing more")
        .await;
    rig.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Argo's `policy.k8s`: delivery waits, by a watch of the object, until its labels match; a wait
/// that runs out fails the event with `errorOnBackoffTimeout`, and delivers it without.
#[tokio::test]
async fn policy_waits_for_the_labels() {
    let ns = ns("policy");
    let c = client().await;
    let api = workflows(&c, &ns);
    let sink = |name: &str, error_on_timeout: bool| {
        json!({"kubeconfig": kc(), "namespace": ns, "resource": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": name}, "spec": {"entrypoint": "x"}},
            "policy": {"labels": {"workflows.argoproj.io/completed": "true"},
                       "backoff": {"duration": "500ms", "steps": 4}, "errorOnBackoffTimeout": error_on_timeout}})
    };
    let rig = testkit::start_sink::<K8sSinkConfig>("policy", sink("done-soon", true)).await;
    let pending = tokio::spawn(async move { rig.send(vec![Event::new("p1", "s", "t")]).await });
    // The "controller" marks it completed after a while.
    for _ in 0..100 {
        if api.get_opt("done-soon").await.unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pending.is_finished(), "delivery waits for the labels");
    api.patch(
        "done-soon",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"workflows.argoproj.io/completed": "true"}}})),
    )
    .await
    .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status, Status::Delivered, "{out:?}");

    // Never labelled: failed with errorOnBackoffTimeout (after 0.5 × 4 s), delivered without.
    let rig = testkit::start_sink::<K8sSinkConfig>("policy-strict", sink("never", true)).await;
    let started = std::time::Instant::now();
    let out = rig.send(vec![Event::new("p2", "s", "t")]).await;
    assert_eq!(out.status, Status::Rejected, "{out:?}");
    assert!(out.reason.unwrap().contains("did not match"));
    assert!(started.elapsed() >= Duration::from_secs(2));
    let rig = testkit::start_sink::<K8sSinkConfig>("policy-lax", sink("never-lax", false)).await;
    assert_eq!(
        rig.send(vec![Event::new("p3", "s", "t")]).await.status,
        Status::Delivered
    );
}

/// The object from a URL (Argo's `url` artifact): fetched for each event, at most 512 KiB.
#[tokio::test]
async fn the_object_can_come_from_a_url() {
    use http_body_util::Full;
    let ns = ns("url");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let svc = hyper::service::service_fn(
                |req: hyper::Request<hyper::body::Incoming>| async move {
                    let body = match req.uri().path() {
                    "/wf.yaml" => "apiVersion: argoproj.io/v1alpha1\nkind: Workflow\nmetadata:\n  generateName: from-url-\n  labels: {origin: url}\nspec:\n  entrypoint: x\n".to_owned(),
                    _ => format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: big}}\ndata: {{pad: \"{}\"}}\n", "x".repeat(600 * 1024)),
                };
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                        bytes::Bytes::from(body),
                    )))
                },
            );
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    let rig = testkit::start_sink::<K8sSinkConfig>(
        "url",
        json!({"kubeconfig": kc(), "namespace": ns,
        "url": {"path": format!("http://127.0.0.1:{port}/wf.yaml")}}),
    )
    .await;
    assert_eq!(
        rig.send(vec![Event::new("u1", "s", "t")]).await.status,
        Status::Delivered
    );
    let c = client().await;
    assert_eq!(
        wait_list(&workflows(&c, &ns), "origin=url", 1).await.len(),
        1
    );
    let rig = testkit::start_sink::<K8sSinkConfig>(
        "url-big",
        json!({"kubeconfig": kc(), "namespace": ns,
        "url": {"path": format!("http://127.0.0.1:{port}/big.yaml")}}),
    )
    .await;
    let out = rig.send(vec![Event::new("u2", "s", "t")]).await;
    assert_eq!(out.status, Status::Rejected, "{out:?}");
    assert!(out.reason.unwrap().contains("524288"), "the cap is named");
}

/// `oldBody: true` keeps whole objects, so an UPDATE carries the previous version; `format:
/// argo` names the event as Argo's `resource` EventSource does.
#[tokio::test]
async fn old_body_and_argo_naming() {
    let ns = ns("oldbody");
    let c = client().await;
    let api = workflows(&c, &ns);
    let mut rig = SourceRig::new("argo-watch");
    let cfg: K8sSourceConfig = serde_json::from_value(json!({"kubeconfig": kc(), "group": "argoproj.io", "version": "v1alpha1",
        "resource": "workflows", "namespace": ns, "oldBody": true, "format": "argo", "eventTypes": ["UPDATE"],
        "metadata": {"team": "data"}, "source": "resource-es", "subject": "workflows"})).unwrap();
    let task = tokio::spawn(
        Box::new(cfg)
            .build(rig.context("argo-watch"))
            .await
            .unwrap(),
    );
    let mut cap = rig.capture();
    let obj: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"name": "o"}, "spec": {"entrypoint": "x", "step": 1}}),
    )
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
    // The ADD is not among eventTypes: only the change comes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    api.patch(
        "o",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"step": 2}})),
    )
    .await
    .unwrap();
    let item = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(item.event.ty.as_str(), "resource");
    // Argo's names, as `sluice run -f` sets them (source = EventSource, subject = event).
    assert_eq!(item.event.source.as_str(), "resource-es");
    assert_eq!(item.event.subject.as_deref(), Some("workflows"));
    let data: Value = serde_json::from_slice(item.event.data.as_bytes().unwrap()).unwrap();
    assert_eq!(data["type"], "UPDATE");
    assert_eq!(data["oldBody"]["spec"]["step"], 1);
    assert_eq!(data["body"]["spec"]["step"], 2);
    assert_eq!(data["metadata"], json!({"team": "data"}));
    item.delivery.delivered();
    rig.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// `liveObject: true` with `update`: the parameters apply to the live object, which is written
/// back with the live fields the template does not name kept.
#[tokio::test]
async fn live_object_update_applies_parameters_to_the_live_object() {
    let ns = ns("live");
    let c = client().await;
    let api = workflows(&c, &ns);
    let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"name": "live", "labels": {"keep": "me"}}, "spec": {"entrypoint": "x", "replicas": 1}})).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
    let rig = testkit::start_sink::<K8sSinkConfig>("live", json!({"kubeconfig": kc(), "namespace": ns, "operation": "update",
        "liveObject": true, "resource": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "live"}},
        "parameters": [{"src": {"dataKey": "n", "useRawData": true}, "dest": "spec.replicas"}]})).await;
    let out = rig
        .send(vec![Event::new("l1", "s", "t").with_json(r#"{"n":5}"#)])
        .await;
    assert_eq!(out.status, Status::Delivered, "{out:?}");
    let live = api.get("live").await.unwrap();
    assert_eq!(live.data["spec"]["replicas"], 5);
    assert_eq!(live.data["spec"]["entrypoint"], "x");
    assert_eq!(live.metadata.labels.unwrap()["keep"], "me");
}

/// A kubeconfig naming a server that is not there (a closed port).
fn dead_kubeconfig(dir: &std::path::Path) -> String {
    let p = dir.join("dead-kubeconfig");
    let port = testkit::free_port();
    std::fs::write(
        &p,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: gone\n  cluster: {{server: \"http://127.0.0.1:{port}\"}}\ncontexts:\n- name: gone\n  context: {{cluster: gone, user: u}}\ncurrent-context: gone\nusers:\n- name: u\n  user: {{token: t}}\n"
        ),
    )
    .unwrap();
    p.display().to_string()
}

/// Every Workflow in `ns`, each as its JSON text.
async fn workflows_json(ns: &str) -> Vec<Vec<u8>> {
    let c = client().await;
    workflows(&c, ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|w| serde_json::to_vec(&w).unwrap())
        .collect()
}

/// The shared sink compliance check (`testkit::sink_compliance`) on the k8s and argo-workflow
/// sinks: each event becomes a Workflow whose parameter is the event's marker.
#[tokio::test]
async fn the_trigger_sinks_pass_the_sink_compliance_check() {
    let dir = tempfile::tempdir().unwrap();
    let dead = dead_kubeconfig(dir.path());
    let params =
        json!([{"src": {"dataKey": "marker"}, "dest": "spec.arguments.parameters.0.value"}]);
    let ns1 = ns("compliance-k8s");
    let n = ns1.clone();
    testkit::sink_compliance::<K8sSinkConfig>(
        "k8s-compliance",
        json!({"kubeconfig": kc(), "namespace": ns1, "resource": workflow_template(), "parameters": params}),
        json!({"kubeconfig": kc(), "namespace": ns1}),
        json!({"kubeconfig": dead, "namespace": ns1, "resource": workflow_template(), "parameters": params, "timeout": "1s"}),
        move || {
            let n = n.clone();
            Box::pin(async move { workflows_json(&n).await })
        },
    )
    .await;
    let ns2 = ns("compliance-wf");
    let n = ns2.clone();
    testkit::sink_compliance::<ArgoWorkflowConfig>(
        "argo-workflow-compliance",
        json!({"kubeconfig": kc(), "namespace": ns2, "resource": workflow_template(), "parameters": params}),
        json!({"kubeconfig": kc(), "namespace": ns2, "operation": "resume", "resource": workflow_template()}),
        json!({"kubeconfig": dead, "namespace": ns2, "resource": workflow_template(), "parameters": params, "timeout": "1s"}),
        move || {
            let n = n.clone();
            Box::pin(async move { workflows_json(&n).await })
        },
    )
    .await;
}
