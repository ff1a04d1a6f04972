//! `kind: argo-workflow` — Argo's `argoWorkflow` trigger, natively: no `argo` CLI in the image.
//!
//! - `submit`: creates the Workflow (Argo's labels; a `generateName` Workflow named from the
//!   event id, so a redelivered event does not start a second one).
//! - `submit-from`: a Workflow from a `WorkflowTemplate`, `ClusterWorkflowTemplate` or
//!   `CronWorkflow`, with `spec.arguments` from the referenced document (after `parameters`).
//! - `suspend`, `stop`, `terminate`: merge patches, as the `argo` CLI makes them; a Workflow
//!   that has finished gets a clear rejection.
//! - `resume`, `retry`, `resubmit`: the Argo Server's REST API (`argo_server`).
//!
//! A Workflow is named by `metadata.name`, or picked by `selector` (labels; Argo #1258).

use std::sync::Arc;

use kube::api::{ListParams, Patch, PatchParams};
use serde::Deserialize;
use serde_json::{json, Value};
use sluice_core::pipeline::serve_each;
use sluice_core::{BoxFuture, ConnectorError, Event, Running, SinkConfig, SinkContext, SinkItem};

use crate::client::{self, Permission};
use crate::object::{self, Origin, Params};
use crate::sink::{Common, Done, Failure, Trigger};
use crate::trigger_options;

/// What the trigger does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WfOperation {
    #[default]
    Submit,
    SubmitFrom,
    Suspend,
    Stop,
    Terminate,
    Resume,
    Retry,
    Resubmit,
}

impl WfOperation {
    fn needs_server(self) -> bool {
        matches!(
            self,
            WfOperation::Resume | WfOperation::Retry | WfOperation::Resubmit
        )
    }
    fn verb(self) -> &'static str {
        match self {
            WfOperation::Resume => "resume",
            WfOperation::Retry => "retry",
            WfOperation::Resubmit => "resubmit",
            WfOperation::Suspend => "suspend",
            WfOperation::Stop => "stop",
            WfOperation::Terminate => "terminate",
            WfOperation::Submit => "submit",
            WfOperation::SubmitFrom => "submit-from",
        }
    }
}

/// The Argo Server, for the operations the Kubernetes API alone cannot do.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgoServer {
    /// Its base URL, e.g. `https://argo-server.argo:2746`.
    pub url: String,
    /// A bearer token (`argo auth token`), sent as `Authorization: Bearer …`.
    #[serde(default)]
    pub token: Option<String>,
    /// Verify the server's certificate. Default `true`.
    #[serde(default = "yes", rename = "verifyCert")]
    pub verify_cert: bool,
}

fn yes() -> bool {
    true
}

trigger_options! {
    /// `kind: argo-workflow` sink options.
    pub struct ArgoWorkflowConfig {
        /// `submit` (default), `submit-from`, `suspend`, `stop`, `terminate`, `resume`,
        /// `retry` or `resubmit`.
        #[serde(default)]
        pub operation: WfOperation,
        /// For the operations on existing Workflows: act on every Workflow these labels select
        /// (`key=value,…`) instead of one by name.
        #[serde(default)]
        pub selector: Option<String>,
        /// Needed by `resume`, `retry` and `resubmit`.
        #[serde(default)]
        pub argo_server: Option<ArgoServer>,
        /// Argo's `args` for the CLI: not used (there is no CLI); accepted so manifests load.
        #[serde(default)]
        pub args: Vec<String>,
    }
}

const ARGO_API: &str = "argoproj.io/v1alpha1";

impl ArgoWorkflowConfig {
    fn check(&self) -> Result<(Origin, Params), String> {
        self.connection().check()?;
        if self.operation.needs_server() && self.argo_server.is_none() {
            return Err(format!(
                "operation {}: needs the Argo Server (it resets node states, which only Argo's controller code does): set argo_server: {{url, token}}",
                self.operation.verb()
            ));
        }
        let origin = self.origin()?;
        let params = Params::compile(&self.parameters)?;
        if let Origin::Inline(obj) = &origin {
            let id = object::ident(obj).map_err(|e| format!("resource: {e}"))?;
            let by_param = self.parameters.iter().any(|p| {
                matches!(
                    p.dest.as_str(),
                    "" | "metadata.name" | "metadata.generateName"
                )
            });
            match self.operation {
                WfOperation::Submit => {
                    if id.kind != "Workflow" {
                        return Err(format!("operation submit: resource is a {}; give a Workflow (submit-from takes a template)", id.kind));
                    }
                    if id.name.is_none() && id.generate_name.is_none() && !by_param {
                        return Err("operation submit: the Workflow needs metadata.name or metadata.generateName".into());
                    }
                }
                WfOperation::SubmitFrom => {
                    if !matches!(
                        id.kind,
                        "WorkflowTemplate" | "ClusterWorkflowTemplate" | "CronWorkflow"
                    ) {
                        return Err(format!("operation submit-from: resource is a {}; give a WorkflowTemplate, ClusterWorkflowTemplate or CronWorkflow (apiVersion, kind, metadata.name)", id.kind));
                    }
                    if id.name.is_none() && !by_param {
                        return Err(
                            "operation submit-from: name the template in metadata.name".into()
                        );
                    }
                }
                _ => {
                    if id.name.is_none() && self.selector.is_none() && !by_param {
                        return Err(format!("operation {}: name the Workflow in metadata.name, or select Workflows with selector:", self.operation.verb()));
                    }
                }
            }
        }
        if self.concurrency == 0 || self.concurrency > 1024 {
            return Err("concurrency must be between 1 and 1024".into());
        }
        Ok((origin, params))
    }
}

impl ArgoWorkflowConfig {
    /// Whether `submit-from` reads a CronWorkflow (the kind known without an event).
    fn submits_from_cron(&self) -> bool {
        matches!(&self.resource, Some(r) if r.get("kind").and_then(Value::as_str) == Some("CronWorkflow"))
    }
}

impl SinkConfig for ArgoWorkflowConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        self.check().map(drop)
    }

    fn preflight<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(async move {
            self.check()?;
            let component = format!("sink {name}");
            let client = client::connect(&self.connection(), &component).await?;
            let namespace = self
                .namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_owned());
            let perms = client::Permissions::new(&component, sluice_core::Health::default());
            let needed = needed(
                self.operation,
                self.selector.is_some(),
                self.submits_from_cron(),
                &namespace,
            );
            Ok(perms.preflight(&client, &needed).await)
        })
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let (origin, params) = self.check().map_err(|e| {
                ConnectorError::new(format!("argo-workflow sink {}: {e}", ctx.name))
            })?;
            let (client, namespace, perms) =
                crate::sink::connect_trigger(&self.connection(), &self.namespace, &ctx).await?;
            let trigger = Trigger::creating(Common {
                client,
                origin,
                params,
                namespace: namespace.clone(),
                retries: self.retries,
                timeout: self.timeout.get(),
                name: ctx.name.clone(),
                perms,
                grace_over: ctx.grace_over.clone(),
            });
            let wf = Arc::new(Wf {
                t: trigger,
                server_client: std::sync::OnceLock::new(),
                op: self.operation,
                selector: self.selector.clone(),
                server: self.argo_server.clone(),
            });
            let needed = needed(
                wf.op,
                wf.selector.is_some(),
                self.submits_from_cron(),
                &namespace,
            );
            wf.t.perms.review(&wf.t.client, &needed).await;
            tracing::info!(sink = %ctx.name, operation = ?self.operation, %namespace,
                missing_permissions = wf.t.perms.missing().len(), "argo-workflow: ready");
            let concurrency = self.concurrency;
            Ok(Box::pin(async move {
                serve_each(ctx.input, ctx.grace_over, concurrency, |item| {
                    deliver(wf.clone(), item)
                })
                .await;
                Ok(())
            }) as Running)
        })
    }
}

struct Wf {
    t: Trigger,
    /// The Argo Server's client, made at its first use.
    server_client: std::sync::OnceLock<object::HttpClient>,
    op: WfOperation,
    selector: Option<String>,
    server: Option<ArgoServer>,
}

impl Wf {
    async fn run(&self, event: &Event) -> Result<Done, Failure> {
        let mut doc = self.t.template().await?;
        self.t.params.apply(&mut doc, event).map_err(Failure::Bad)?;
        let id = object::ident(&doc).map_err(Failure::Bad)?;
        let ns = id
            .namespace
            .map_or_else(|| self.t.namespace.clone(), str::to_owned);
        let wf_kind = self
            .t
            .kinds
            .resolve(&self.t.client, ARGO_API, "Workflow")
            .await
            .map_err(|err| Failure::api("get", None, None, err))?;
        let api = wf_kind.api(&self.t.client, &ns);
        match self.op {
            WfOperation::Submit => {
                let name = id.name.map(str::to_owned);
                self.t
                    .create(&wf_kind, Some(&ns), &api, doc, name, event)
                    .await
            }
            WfOperation::SubmitFrom => {
                let wf = self.workflow_from(&doc, &ns).await?;
                self.t
                    .create(&wf_kind, Some(&ns), &api, wf, None, event)
                    .await
            }
            op => {
                let names = match (&self.selector, id.name) {
                    (Some(sel), _) => {
                        let lp = ListParams::default().labels(sel);
                        let list = self
                            .t
                            .call("list", Some(&wf_kind), Some(&ns), || api.list(&lp))
                            .await?;
                        list.items
                            .into_iter()
                            .filter_map(|o| o.metadata.name)
                            .collect::<Vec<_>>()
                    }
                    (None, Some(n)) => vec![n.to_owned()],
                    (None, None) => {
                        return Err(Failure::Bad(
                            "no Workflow named (metadata.name) or selected (selector)".into(),
                        ))
                    }
                };
                if names.is_empty() {
                    return Err(Failure::Bad(format!(
                        "selector {:?} selects no Workflow in {ns}",
                        self.selector
                    )));
                }
                let selected = self.selector.is_some();
                for name in &names {
                    if op.needs_server() {
                        self.server_call_retried(op, &ns, name).await?;
                    } else {
                        self.shutdown_or_suspend(op, &wf_kind, &api, &ns, name, selected)
                            .await?;
                    }
                }
                Ok(Done::Applied(names.join(",")))
            }
        }
    }

    /// `submit-from`: a Workflow that refers to the template (or carries the CronWorkflow's
    /// spec), with the document's `spec.arguments`, named `<template>-<hash of the event>`.
    async fn workflow_from(&self, doc: &Value, ns: &str) -> Result<Value, Failure> {
        let id = object::ident(doc).map_err(Failure::Bad)?;
        let name = id
            .name
            .ok_or_else(|| Failure::Bad("submit-from: the template has no metadata.name".into()))?;
        let args = doc.pointer("/spec/arguments").cloned();
        let (label, mut spec) = match id.kind {
            "WorkflowTemplate" => ("workflows.argoproj.io/workflow-template", json!({"workflowTemplateRef": {"name": name}})),
            "ClusterWorkflowTemplate" => (
                "workflows.argoproj.io/cluster-workflow-template",
                json!({"workflowTemplateRef": {"name": name, "clusterScope": true}}),
            ),
            "CronWorkflow" => {
                let k = self
                    .t
                    .kinds
                    .resolve(&self.t.client, ARGO_API, "CronWorkflow")
                    .await
                    .map_err(|err| Failure::api("get", None, None, err))?;
                let api = k.api(&self.t.client, ns);
                let cron = self.t.call("get", Some(&k), Some(ns), || api.get(name)).await?;
                let spec = cron
                    .data
                    .pointer("/spec/workflowSpec")
                    .cloned()
                    .ok_or_else(|| Failure::Bad(format!("CronWorkflow {ns}/{name} has no spec.workflowSpec")))?;
                ("workflows.argoproj.io/cron-workflow", spec)
            }
            other => return Err(Failure::Bad(format!("submit-from takes a WorkflowTemplate, ClusterWorkflowTemplate or CronWorkflow, not a {other}"))),
        };
        if let (Some(args), Value::Object(s)) = (args, &mut spec) {
            s.insert("arguments".into(), args);
        }
        Ok(json!({
            "apiVersion": ARGO_API,
            "kind": "Workflow",
            "metadata": {"generateName": format!("{name}-"), "namespace": ns, "labels": {label: name}},
            "spec": spec,
        }))
    }

    /// `stop`/`terminate` (`spec.shutdown`) and `suspend` (`spec.suspend`), as the `argo` CLI
    /// patches them; a finished Workflow is refused with its phase.
    /// Answers whether it patched (`false`: the Workflow already is as asked, or, when
    /// `selected` by labels, has finished and is passed over).
    async fn shutdown_or_suspend(
        &self,
        op: WfOperation,
        k: &client::Kind,
        api: &kube::Api<kube::api::DynamicObject>,
        ns: &str,
        name: &str,
        selected: bool,
    ) -> Result<bool, Failure> {
        let live = self
            .t
            .call("get", Some(k), Some(ns), || api.get(name))
            .await?;
        let (path, want) = match op {
            WfOperation::Stop => ("/spec/shutdown", json!("Stop")),
            WfOperation::Terminate => ("/spec/shutdown", json!("Terminate")),
            _ => ("/spec/suspend", json!(true)),
        };
        // Already as asked (this event's earlier attempt, or another's): done.
        if live.data.pointer(path) == Some(&want) {
            return Ok(false);
        }
        let phase = live
            .data
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        if matches!(phase, "Succeeded" | "Failed" | "Error") {
            if selected {
                return Ok(false);
            }
            return Err(Failure::Bad(format!(
                "workflow {ns}/{name} has already finished (phase {phase}): nothing to {}",
                op.verb()
            )));
        }
        let body = match op {
            WfOperation::Stop => json!({"spec": {"shutdown": "Stop"}}),
            WfOperation::Terminate => json!({"spec": {"shutdown": "Terminate"}}),
            _ => json!({"spec": {"suspend": true}}),
        };
        let pp = PatchParams::default();
        let patch = Patch::Merge(body);
        self.t
            .call("patch", Some(k), Some(ns), || api.patch(name, &pp, &patch))
            .await?;
        Ok(true)
    }

    /// [`Wf::server_call`], retried as the Kubernetes calls are (429, 5xx, no answer).
    async fn server_call_retried(
        &self,
        op: WfOperation,
        ns: &str,
        name: &str,
    ) -> Result<(), Failure> {
        let mut attempt = 0;
        loop {
            match self.server_call(op, ns, name).await {
                Err(Failure::Api(f))
                    if f.err.verdict() == client::Verdict::Retry && attempt < self.t.retries =>
                {
                    let wait = client::backoff(attempt, f.err.retry_after);
                    attempt += 1;
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = self.t.grace_over.cancelled() => return Err(Failure::Api(f)),
                    }
                }
                r => return r,
            }
        }
    }

    /// `PUT /api/v1/workflows/{ns}/{name}/{op}` on the Argo Server.
    async fn server_call(&self, op: WfOperation, ns: &str, name: &str) -> Result<(), Failure> {
        use http_body_util::{BodyExt, Full};
        let server = self
            .server
            .as_ref()
            .ok_or_else(|| Failure::Bad("no argo_server".into()))?;
        let url = format!(
            "{}/api/v1/workflows/{ns}/{name}/{}",
            server.url.trim_end_matches('/'),
            op.verb()
        );
        let client = self
            .server_client
            .get_or_init(|| object::http_client(server.verify_cert));
        let body = json!({"name": name, "namespace": ns}).to_string();
        let mut req = http::Request::put(&url).header("content-type", "application/json");
        if let Some(t) = &server.token {
            req = req.header(
                "authorization",
                format!("Bearer {}", t.trim_start_matches("Bearer ")),
            );
        }
        let req = req
            .body(Full::new(bytes::Bytes::from(body)))
            .map_err(|e| Failure::Bad(format!("argo server {url}: {e}")))?;
        let api_err = |code: Option<u16>, message: String| {
            let err = client::KubeError {
                code,
                reason: "ArgoServer".into(),
                message,
                retry_after: None,
            };
            Failure::api(op.verb(), None, Some(ns.to_owned()), err)
        };
        let resp = tokio::time::timeout(self.t.timeout, client.request(req))
            .await
            .map_err(|_| {
                api_err(
                    None,
                    format!("argo server {url}: no answer within {:?}", self.t.timeout),
                )
            })?
            .map_err(|e| api_err(None, format!("argo server {url}: {e}")))?;
        let status = resp.status();
        let text = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        client::count(&self.t.name, "argo_server", Some(status.as_u16()));
        if status.is_success() {
            return Ok(());
        }
        let message = serde_json::from_slice::<Value>(&text)
            .ok()
            .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&text).chars().take(300).collect());
        Err(api_err(
            Some(status.as_u16()),
            format!("argo server {} {name}: {message}", op.verb()),
        ))
    }
}

/// The verbs on workflows (and the templates read) each operation needs.
fn needed(op: WfOperation, selector: bool, from_cron: bool, ns: &str) -> Vec<Permission> {
    let p = |verb: &str, resource: &str| Permission {
        verb: verb.into(),
        group: "argoproj.io".into(),
        resource: resource.into(),
        namespace: Some(ns.to_owned()),
    };
    match op {
        WfOperation::Submit => vec![p("create", "workflows")],
        WfOperation::SubmitFrom if from_cron => {
            vec![p("create", "workflows"), p("get", "cronworkflows")]
        }
        WfOperation::SubmitFrom => vec![p("create", "workflows")],
        WfOperation::Suspend | WfOperation::Stop | WfOperation::Terminate => {
            let mut v = vec![p("get", "workflows"), p("patch", "workflows")];
            if selector {
                v.push(p("list", "workflows"));
            }
            v
        }
        // The Argo Server checks these with its own identity (or the token's).
        WfOperation::Resume | WfOperation::Retry | WfOperation::Resubmit => Vec::new(),
    }
}

async fn deliver(wf: Arc<Wf>, item: SinkItem) {
    let SinkItem { event, delivery } = item;
    let r = wf.run(&event).await;
    wf.t.settle(&event.id, r, delivery);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(v: Value) -> Result<(), String> {
        let c: ArgoWorkflowConfig = serde_json::from_value(v).map_err(|e| e.to_string())?;
        c.check().map(drop)
    }

    #[test]
    fn validation() {
        let wt = json!({"apiVersion": ARGO_API, "kind": "WorkflowTemplate", "metadata": {"name": "nightly"}});
        assert!(check(json!({"operation": "submit-from", "resource": wt})).is_ok());
        let e = check(json!({"operation": "submit", "resource": wt})).unwrap_err();
        assert!(e.contains("give a Workflow"), "{e}");
        let e = check(json!({"operation": "resume", "resource": {"apiVersion": ARGO_API, "kind": "Workflow", "metadata": {"name": "w"}}})).unwrap_err();
        assert!(e.contains("argo_server"), "{e}");
        assert!(check(
            json!({"operation": "resume", "argo_server": {"url": "https://argo:2746"},
            "resource": {"apiVersion": ARGO_API, "kind": "Workflow", "metadata": {"name": "w"}}})
        )
        .is_ok());
        let e = check(
            json!({"operation": "stop", "resource": {"apiVersion": ARGO_API, "kind": "Workflow"}}),
        )
        .unwrap_err();
        assert!(e.contains("selector"), "{e}");
        assert!(check(json!({"operation": "stop", "selector": "app=orders", "resource": {"apiVersion": ARGO_API, "kind": "Workflow"}})).is_ok());
    }
}
