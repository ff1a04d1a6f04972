//! The raw kube-rs side of `benches/k8s.sh`, on the same kube 5 client Sluice uses:
//!
//! - `create`: COUNT Workflow creates (each a `generateName` Workflow of about 1 KiB, as the
//!   `k8s` sink sends), CONCURRENCY in flight; prints "creates/s".
//! - `fill`: COUNT Workflows with label `bench=relist` (for the source's relist), as fast as
//!   CONCURRENCY allows; prints "objects/s".
//! - `list`: lists the `bench=relist` Workflows in pages of 500 (what a relist reads); prints
//!   "objects/s".
//!
//! Arguments: `create|fill --kubeconfig PATH --namespace NS --count N --concurrency C`.

use std::time::Instant;

use futures_util::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;

fn arg(name: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| panic!("k8s_loop: {name} is required"))
}

/// The Workflow both sides create (benches/k8s.sh writes the same one into Sluice's config).
fn workflow(relist: bool) -> serde_json::Value {
    let mut wf = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "bench-", "labels": {"bench": if relist { "relist" } else { "create" }}},
        "spec": {
            "entrypoint": "process",
            "arguments": {"parameters": [{"name": "key", "value": "incoming/2026-12-07/orders-0001.csv"}]},
            "templates": [{"name": "process", "container": {"image": "alpine:3.20", "command": ["sh", "-c"],
                "args": ["echo processing {{workflow.parameters.key}} && sleep 1"],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}}]
        }
    });
    wf["metadata"]["annotations"] = json!({"pad": "x".repeat(300)});
    wf
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mode = std::env::args().nth(1).expect("k8s_loop: create or fill");
    let count: usize = arg("--count").parse().expect("--count");
    let concurrency: usize = arg("--concurrency").parse().expect("--concurrency");
    let ns = arg("--namespace");
    let kc = Kubeconfig::read_from(arg("--kubeconfig")).expect("kubeconfig");
    let mut cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    cfg.default_retry = false;
    let client = Client::try_from(cfg).expect("client");
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Workflow"),
        "workflows",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &ar);
    if mode == "list" {
        let started = Instant::now();
        let mut n = 0usize;
        let mut lp = kube::api::ListParams::default()
            .labels("bench=relist")
            .limit(500);
        loop {
            let page = api.list(&lp).await.expect("list");
            n += page.items.len();
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(c) => lp = lp.continue_token(&c),
                None => break,
            }
        }
        assert!(n >= count, "k8s_loop: listed {n}, expected {count}");
        println!("{:.1}", n as f64 / started.elapsed().as_secs_f64());
        return;
    }
    let obj: DynamicObject = serde_json::from_value(workflow(mode == "fill")).expect("object");
    let pp = PostParams::default();
    let started = Instant::now();
    let done = futures_util::stream::iter(0..count)
        .map(|_| {
            let (api, obj, pp) = (&api, obj.clone(), &pp);
            async move { api.create(pp, &obj).await.is_ok() }
        })
        .buffer_unordered(concurrency)
        .filter(|ok| futures_util::future::ready(*ok))
        .count()
        .await;
    let secs = started.elapsed().as_secs_f64();
    if done < count {
        eprintln!("k8s_loop: {} of {count} creates failed", count - done);
    }
    println!("{:.1}", done as f64 / secs);
}
