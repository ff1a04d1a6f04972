//! `kind: k8s` — Argo's `k8s` trigger: each event makes, changes or deletes one object of any
//! kind. The object comes from `resource` (inline), `inline`, `file`, `url` or `configmap`;
//! `parameters` write the event's values into it.
//!
//! What an answer means: 2xx delivered; a create answered 409 AlreadyExists for a name derived
//! from the event id delivered (a duplicate, counted); 400/404/409/415/422 rejected with the
//! server's message; 401/403 rejected and the missing permission named on `/readyz`; 429, 5xx
//! and no answer retried with backoff (the server's `retryAfterSeconds` honoured), then failed.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::Client;
use serde::Deserialize;
use serde_json::Value;
use sluice_core::pipeline::serve_each;
use sluice_core::telemetry::K8S_DUPLICATE_CREATES;
use sluice_core::units::HumanDuration;
use sluice_core::{BoxFuture, ConnectorError, Event, Running, SinkConfig, SinkContext, SinkItem};
use tokio_util::sync::CancellationToken;

use crate::client::{self, count, Kinds, KubeError, Permission, Permissions, Verdict};
use crate::object::{self, Origin, Params};
use crate::trigger_options;

/// What the trigger does with the object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    /// POST the object (default). With only `generateName`, the name is derived from the
    /// event id, so a redelivered event meets 409 instead of making a second object.
    #[default]
    Create,
    /// GET the live object, merge the object over it, PUT with its resourceVersion (retried
    /// on 409 Conflict); create it when absent.
    Update,
    /// PATCH with `patchStrategy`; create it when absent.
    Patch,
    /// Server-side apply (field manager `sluice`).
    Apply,
    /// DELETE; an absent object counts as deleted.
    Delete,
}

impl Operation {
    fn verbs(self, strategy: PatchStrategy) -> &'static [&'static str] {
        match self {
            Operation::Create => &["create"],
            Operation::Update => &["get", "update", "create"],
            // A JSON patch names an object that exists; apply creates without a GET.
            Operation::Patch if matches!(strategy, PatchStrategy::Json | PatchStrategy::Apply) => {
                &["patch"]
            }
            Operation::Patch => &["get", "patch", "create"],
            Operation::Apply => &["patch"],
            Operation::Delete => &["delete"],
        }
    }
}

/// Argo's `patchStrategy` (a Content-Type).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum PatchStrategy {
    /// JSON merge patch (RFC 7386), the default.
    #[default]
    #[serde(rename = "application/merge-patch+json", alias = "merge")]
    Merge,
    /// JSON Patch (RFC 6902): the document is an array of operations, and `target` names the
    /// object (Argo sent an object here and could never work, #3032).
    #[serde(rename = "application/json-patch+json", alias = "json")]
    Json,
    /// Strategic merge patch: built-in kinds only (a custom resource refuses it).
    #[serde(rename = "application/strategic-merge-patch+json", alias = "strategic")]
    Strategic,
    /// Server-side apply, as `operation: apply`.
    #[serde(rename = "application/apply-patch+yaml", alias = "apply")]
    Apply,
}

/// The object a JSON patch applies to.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchTarget {
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    pub kind: String,
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
}

/// Argo's `policy.k8s`: after the object is made, wait until its labels match.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Every one of these labels with this value.
    pub labels: std::collections::BTreeMap<String, String>,
    /// How long to wait: Argo's backoff (`steps` waits of `duration`, each `factor` times
    /// longer). Default 5 steps of 1s.
    #[serde(default)]
    pub backoff: Option<Backoff>,
    /// When the labels never matched: `true` fails the event, `false` (default) delivers it.
    #[serde(default, rename = "errorOnBackoffTimeout")]
    pub error_on_backoff_timeout: bool,
}

/// Argo's `Backoff`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    #[serde(default)]
    pub duration: Option<HumanDuration>,
    #[serde(default)]
    pub factor: Option<f64>,
    #[serde(default)]
    pub jitter: Option<f64>,
    #[serde(default)]
    pub steps: Option<u32>,
}

impl Backoff {
    /// The whole wait: the sum of the steps' delays.
    pub fn total(b: &Option<Backoff>) -> Duration {
        let (d, f, steps) = match b {
            None => (Duration::from_secs(1), 1.0, 5),
            Some(b) => (
                b.duration.map_or(Duration::from_secs(1), |d| d.get()),
                b.factor.unwrap_or(1.0).max(1.0),
                b.steps.filter(|s| *s > 0).unwrap_or(5),
            ),
        };
        let mut total = 0.0;
        let mut cur = d.as_secs_f64();
        for _ in 0..steps {
            total += cur;
            cur *= f;
        }
        Duration::from_secs_f64(total.min(3600.0))
    }
}

trigger_options! {
    /// `kind: k8s` sink options.
    pub struct K8sSinkConfig {
        /// `create` (default), `update`, `patch`, `apply` or `delete`.
        #[serde(default)]
        pub operation: Operation,
        /// For `patch`: the Content-Type. Default `application/merge-patch+json`.
        #[serde(default, rename = "patchStrategy")]
        pub patch_strategy: PatchStrategy,
        /// For `update`: apply the parameters to the live object instead of the template.
        #[serde(default, rename = "liveObject")]
        pub live_object: bool,
        /// For a JSON patch: the object it applies to.
        #[serde(default)]
        pub target: Option<PatchTarget>,
        /// For `apply`: take fields other managers own (`force=true`).
        #[serde(default)]
        pub force: bool,
        /// Wait after the operation until the object's labels match.
        #[serde(default)]
        pub policy: Option<PolicyConfig>,
    }
}

pub(crate) fn sixteen() -> usize {
    16
}
pub(crate) fn five() -> u32 {
    5
}
pub(crate) fn thirty_seconds() -> HumanDuration {
    HumanDuration::from_secs(30)
}

/// A trigger sink's client, namespace and permission checks.
pub(crate) async fn connect_trigger(
    conn: &crate::Connection,
    namespace: &Option<String>,
    ctx: &SinkContext,
) -> Result<(Client, String, Permissions), ConnectorError> {
    let component = format!("sink {}", ctx.name);
    let client = client::connect(conn, &component)
        .await
        .map_err(ConnectorError::new)?;
    let namespace = namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let perms = Permissions::new(&component, ctx.health.clone());
    Ok((client, namespace, perms))
}

impl K8sSinkConfig {
    fn check(&self) -> Result<(Origin, Params), String> {
        self.connection().check()?;
        let origin = self.origin()?;
        let params = Params::compile(&self.parameters)?;
        let json_patch =
            self.operation == Operation::Patch && self.patch_strategy == PatchStrategy::Json;
        if json_patch && self.target.is_none() {
            return Err("patchStrategy application/json-patch+json: the document is the array of operations; name the object in target: {apiVersion, kind, name}".into());
        }
        if !json_patch && self.target.is_some() {
            return Err("target is for patchStrategy application/json-patch+json; other operations take the object's own apiVersion, kind and name".into());
        }
        if self.live_object && self.operation != Operation::Update {
            return Err(
                "liveObject: true goes with operation: update (Argo honours it only there)".into(),
            );
        }
        if let Origin::Inline(obj) = &origin {
            if json_patch {
                if !obj.is_array() {
                    return Err("patchStrategy application/json-patch+json: the document must be an array of operations ([{op, path, value}])".into());
                }
            } else {
                let id = object::ident(obj).map_err(|e| format!("resource: {e}"))?;
                let named = id.name.is_some()
                    || (self.operation == Operation::Create && id.generate_name.is_some());
                // A parameter may set the name.
                let params_name = self.parameters.iter().any(|p| {
                    matches!(
                        p.dest.as_str(),
                        "" | "metadata.name" | "metadata.generateName"
                    )
                });
                if !named && !params_name {
                    return Err(format!(
                        "resource: metadata.name is required for {:?}{}",
                        self.operation,
                        if self.operation == Operation::Create {
                            " (or metadata.generateName)"
                        } else {
                            ""
                        }
                    ));
                }
                if self.operation == Operation::Patch
                    && self.patch_strategy == PatchStrategy::Strategic
                {
                    check_strategic(id.api_version)?;
                }
            }
        }
        if let Some(t) = &self.target {
            if self.patch_strategy == PatchStrategy::Strategic {
                check_strategic(&t.api_version)?;
            }
        }
        if self.concurrency == 0 || self.concurrency > 1024 {
            return Err("concurrency must be between 1 and 1024".into());
        }
        if self.timeout.get().is_zero() {
            return Err("timeout must be above 0".into());
        }
        Ok((origin, params))
    }
}

/// Strategic merge patch is served for the built-in kinds only: a custom resource answers 415.
fn check_strategic(api_version: &str) -> Result<(), String> {
    let group = api_version.split_once('/').map_or("", |(g, _)| g);
    let builtin = !group.contains('.') || group.ends_with(".k8s.io");
    if builtin {
        Ok(())
    } else {
        Err(format!(
            "patchStrategy application/strategic-merge-patch+json works on built-in kinds only; {api_version} is a custom resource: use application/merge-patch+json (or apply)"
        ))
    }
}

impl K8sSinkConfig {
    #[allow(clippy::too_many_arguments)]
    fn trigger(
        &self,
        origin: Origin,
        params: Params,
        client: Client,
        namespace: String,
        perms: Permissions,
        name: &str,
        grace_over: CancellationToken,
    ) -> Trigger {
        Trigger {
            client,
            kinds: Kinds::default(),
            origin,
            params,
            op: self.operation,
            strategy: self.patch_strategy,
            live_object: self.live_object,
            target: self.target.clone(),
            namespace,
            force: self.force,
            policy: self.policy.clone(),
            retries: self.retries,
            timeout: self.timeout.get(),
            name: name.to_owned(),
            perms,
            grace_over,
            duplicates: metrics::counter!(K8S_DUPLICATE_CREATES, "sink" => name.to_owned()),
            url_client: std::sync::OnceLock::new(),
        }
    }
}

impl SinkConfig for K8sSinkConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        self.check().map(drop)
    }

    fn preflight<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(async move {
            let (origin, params) = self.check()?;
            let component = format!("sink {name}");
            let client = client::connect(&self.connection(), &component).await?;
            let namespace = self
                .namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_owned());
            let perms = Permissions::new(&component, sluice_core::Health::default());
            let t = self.trigger(
                origin,
                params,
                client,
                namespace,
                perms,
                name,
                CancellationToken::new(),
            );
            let needed = t.needed_permissions().await;
            if needed.is_empty() {
                return Ok(vec!["the object's kind is known only per event (file, url, configmap or parameters): its permissions are checked when it is used".into()]);
            }
            Ok(t.perms.preflight(&t.client, &needed).await)
        })
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let (origin, params) = self
                .check()
                .map_err(|e| ConnectorError::new(format!("k8s sink {}: {e}", ctx.name)))?;
            let (client, namespace, perms) =
                connect_trigger(&self.connection(), &self.namespace, &ctx).await?;
            let trigger = Arc::new(self.trigger(
                origin,
                params,
                client,
                namespace,
                perms,
                &ctx.name,
                ctx.grace_over.clone(),
            ));
            // The permissions the object's kind needs, when the kind is known without an event.
            let needed = trigger.needed_permissions().await;
            trigger.perms.review(&trigger.client, &needed).await;
            tracing::info!(sink = %ctx.name, operation = ?self.operation, namespace = %trigger.namespace,
                missing_permissions = trigger.perms.missing().len(), "k8s: ready");
            let concurrency = self.concurrency;
            Ok(Box::pin(async move {
                serve_each(ctx.input, ctx.grace_over, concurrency, |item| {
                    deliver(trigger.clone(), item)
                })
                .await;
                Ok(())
            }) as Running)
        })
    }
}

pub(crate) struct Trigger {
    pub client: Client,
    pub kinds: Kinds,
    pub origin: Origin,
    pub params: Params,
    op: Operation,
    strategy: PatchStrategy,
    live_object: bool,
    target: Option<PatchTarget>,
    pub namespace: String,
    force: bool,
    policy: Option<PolicyConfig>,
    pub retries: u32,
    pub timeout: Duration,
    pub name: String,
    pub perms: Permissions,
    pub grace_over: CancellationToken,
    duplicates: metrics::Counter,
    /// The `url` origin's client, made at its first use.
    url_client: std::sync::OnceLock<object::HttpClient>,
}

/// What one event did.
#[derive(Debug, PartialEq, Eq)]
pub enum Done {
    /// The object was made, changed or deleted (its name).
    Applied(String),
    /// The create met an object of the same name: this event's, made before.
    Duplicate(String),
    /// A delete found nothing to delete.
    Absent,
}

/// A call the API server refused, with what it was.
#[derive(Debug)]
pub struct ApiFailure {
    pub verb: &'static str,
    pub kind: Option<client::Kind>,
    pub ns: Option<String>,
    pub err: KubeError,
}

impl Failure {
    pub(crate) fn api(
        verb: &'static str,
        kind: Option<client::Kind>,
        ns: Option<String>,
        err: KubeError,
    ) -> Failure {
        Failure::Api(Box::new(ApiFailure {
            verb,
            kind,
            ns,
            err,
        }))
    }
}

/// Why an event was not delivered.
#[derive(Debug)]
pub enum Failure {
    /// The object or its template is wrong (no retry helps).
    Bad(String),
    /// The API server's answer (boxed: it is the rare path, and large).
    Api(Box<ApiFailure>),
}

/// The parts of a trigger that every Kubernetes sink has.
pub(crate) struct Common {
    pub client: Client,
    pub origin: Origin,
    pub params: Params,
    pub namespace: String,
    pub retries: u32,
    pub timeout: Duration,
    pub name: String,
    pub perms: Permissions,
    pub grace_over: CancellationToken,
}

impl Trigger {
    /// A trigger that creates objects (what `argo-workflow` submits through).
    pub(crate) fn creating(c: Common) -> Trigger {
        Trigger {
            duplicates: metrics::counter!(K8S_DUPLICATE_CREATES, "sink" => c.name.clone()),
            url_client: std::sync::OnceLock::new(),
            client: c.client,
            kinds: Kinds::default(),
            origin: c.origin,
            params: c.params,
            op: Operation::Create,
            strategy: PatchStrategy::Merge,
            live_object: false,
            target: None,
            namespace: c.namespace,
            force: false,
            policy: None,
            retries: c.retries,
            timeout: c.timeout,
            name: c.name,
            perms: c.perms,
            grace_over: c.grace_over,
        }
    }

    async fn needed_permissions(&self) -> Vec<Permission> {
        let (api_version, kind, ns) = match (&self.origin, &self.target) {
            (_, Some(t)) => (t.api_version.clone(), t.kind.clone(), t.namespace.clone()),
            (Origin::Inline(obj), None) => match object::ident(obj) {
                Ok(id) => (
                    id.api_version.to_owned(),
                    id.kind.to_owned(),
                    id.namespace.map(str::to_owned),
                ),
                Err(_) => return Vec::new(),
            },
            _ => return Vec::new(),
        };
        let Ok(k) = self.kinds.resolve(&self.client, &api_version, &kind).await else {
            // Not served (yet): each event says so.
            return Vec::new();
        };
        let ns = k
            .namespaced
            .then(|| ns.unwrap_or_else(|| self.namespace.clone()));
        let mut verbs: Vec<&str> = self.op.verbs(self.strategy).to_vec();
        if self.policy.is_some() {
            verbs.extend(["list", "watch"]);
        }
        verbs
            .into_iter()
            .map(|verb| Permission {
                verb: verb.to_owned(),
                group: k.resource.group.clone(),
                resource: k.resource.plural.clone(),
                namespace: ns.clone(),
            })
            .collect()
    }

    /// The template for one event (read from its origin each time, but inline).
    pub(crate) async fn template(&self) -> Result<Value, Failure> {
        match &self.origin {
            Origin::Inline(v) => Ok(v.clone()),
            Origin::File(path) => {
                let bytes = tokio::fs::read(path)
                    .await
                    .map_err(|e| Failure::Bad(format!("file {}: {e}", path.display())))?;
                object::parse_document(&bytes, &format!("file {}", path.display()))
                    .map_err(Failure::Bad)
            }
            Origin::Url(u) => object::fetch_url(
                self.url_client
                    .get_or_init(|| object::http_client(u.verify_cert)),
                u,
                self.timeout,
            )
            .await
            .map_err(Failure::Bad),
            Origin::ConfigMap(c) => {
                use k8s_openapi::api::core::v1::ConfigMap;
                let ns = c
                    .namespace
                    .clone()
                    .unwrap_or_else(|| self.namespace.clone());
                let api: kube::Api<ConfigMap> = kube::Api::namespaced(self.client.clone(), &ns);
                let cm = self
                    .call("get", None, Some(&ns), || api.get(&c.name))
                    .await?;
                let text = cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get(&c.key))
                    .ok_or_else(|| {
                        Failure::Bad(format!("configmap {ns}/{}: no key {:?}", c.name, c.key))
                    })?;
                object::parse_document(
                    text.trim_end_matches('\n').as_bytes(),
                    &format!("configmap {ns}/{} key {}", c.name, c.key),
                )
                .map_err(Failure::Bad)
            }
        }
    }

    /// One API call, retried while the answer says so (429, 5xx, no answer), within the
    /// grace period.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        verb: &'static str,
        kind: Option<&client::Kind>,
        ns: Option<&str>,
        mut f: F,
    ) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, kube::Error>>,
    {
        let mut attempt = 0;
        loop {
            let r = tokio::time::timeout(self.timeout, f()).await;
            let err = match r {
                Ok(Ok(v)) => {
                    count(&self.name, verb, Some(200));
                    if let Some(k) = kind {
                        self.perms.used(|| Permission {
                            verb: verb.to_owned(),
                            group: k.resource.group.clone(),
                            resource: k.resource.plural.clone(),
                            namespace: k
                                .namespaced
                                .then(|| ns.unwrap_or(&self.namespace).to_owned()),
                        });
                    }
                    return Ok(v);
                }
                Ok(Err(e)) => KubeError::of(&e),
                Err(_) => KubeError {
                    code: None,
                    reason: String::new(),
                    message: format!("no answer within {:?}", self.timeout),
                    retry_after: None,
                },
            };
            count(&self.name, verb, err.code);
            if err.verdict() != Verdict::Retry || attempt >= self.retries {
                return Err(Failure::api(
                    verb,
                    kind.cloned(),
                    ns.map(str::to_owned),
                    err,
                ));
            }
            let wait = client::backoff(attempt, err.retry_after);
            tracing::debug!(sink = %self.name, verb, error = %err, ?wait, "k8s: retrying");
            attempt += 1;
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.grace_over.cancelled() => {
                    return Err(Failure::api(verb, kind.cloned(), ns.map(str::to_owned), err));
                }
            }
        }
    }

    /// Runs the operation for one event.
    pub(crate) async fn run(&self, event: &Event) -> Result<Done, Failure> {
        let mut obj = self.template().await?;
        if self.op == Operation::Patch && self.strategy == PatchStrategy::Json {
            return self.json_patch(obj, event).await;
        }
        if self.live_object {
            // Argo: the parameters apply to the live object, which is then merged back.
            let id = object::ident(&obj).map_err(Failure::Bad)?;
            let (k, ns, name) = self.locate(&id).await?;
            let name = name.ok_or_else(|| {
                Failure::Bad("liveObject: the object has no metadata.name".into())
            })?;
            let api = k.api(&self.client, &ns);
            if let Some(live) = self
                .call("get", Some(&k), Some(&ns), || api.get_opt(&name))
                .await?
            {
                obj = serde_json::to_value(live).map_err(|e| Failure::Bad(e.to_string()))?;
            }
        }
        self.params.apply(&mut obj, event).map_err(Failure::Bad)?;
        let id = object::ident(&obj).map_err(Failure::Bad)?;
        let (k, ns, name) = self.locate(&id).await?;
        let api = k.api(&self.client, &ns);
        let nsr = k.namespaced.then_some(ns.as_str());
        if k.namespaced {
            object::set_meta(&mut obj, "namespace", Value::String(ns.clone()));
        } else if let Value::Object(o) = &mut obj {
            if let Some(Value::Object(m)) = o.get_mut("metadata") {
                m.remove("namespace");
            }
        }
        let pp = PostParams::default();
        let done = match self.op {
            Operation::Create => self.create(&k, nsr, &api, obj, name, event).await?,
            Operation::Update => {
                let name = name.ok_or_else(|| {
                    Failure::Bad("update: the object has no metadata.name".into())
                })?;
                let mut conflicts = 0;
                loop {
                    let live = self
                        .call("get", Some(&k), nsr, || api.get_opt(&name))
                        .await?;
                    let Some(live) = live else {
                        let dobj = to_dynamic(obj.clone())?;
                        self.call("create", Some(&k), nsr, || api.create(&pp, &dobj))
                            .await?;
                        break Done::Applied(name);
                    };
                    let mut merged =
                        serde_json::to_value(&live).map_err(|e| Failure::Bad(e.to_string()))?;
                    object::merge_over(&mut merged, &obj);
                    // The live resourceVersion: a concurrent change answers 409, and the merge
                    // is made again over the newer object.
                    object::set_meta(
                        &mut merged,
                        "resourceVersion",
                        live.metadata
                            .resource_version
                            .clone()
                            .map_or(Value::Null, Value::String),
                    );
                    let dobj = to_dynamic(merged)?;
                    match self
                        .call("update", Some(&k), nsr, || api.replace(&name, &pp, &dobj))
                        .await
                    {
                        Ok(_) => break Done::Applied(name),
                        Err(Failure::Api(f)) if f.err.is(409) && conflicts < 10 => {
                            conflicts += 1;
                            continue;
                        }
                        Err(Failure::Api(f)) if f.err.is(409) => {
                            // Contention, not a refusal of the object: the sender retries.
                            let mut err = f.err;
                            err.message = format!(
                                "{} (409 Conflict {} times in a row)",
                                err.message,
                                conflicts + 1
                            );
                            err.code = None;
                            return Err(Failure::api(f.verb, f.kind, f.ns, err));
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Operation::Patch | Operation::Apply => {
                let name = name
                    .ok_or_else(|| Failure::Bad("patch: the object has no metadata.name".into()))?;
                let apply = self.op == Operation::Apply || self.strategy == PatchStrategy::Apply;
                if !apply
                    && self
                        .call("get", Some(&k), nsr, || api.get_opt(&name))
                        .await?
                        .is_none()
                {
                    // Argo (#679): patching what is not there creates it.
                    let dobj = to_dynamic(obj)?;
                    self.call("create", Some(&k), nsr, || api.create(&pp, &dobj))
                        .await?;
                    Done::Applied(name)
                } else {
                    let (params, patch) = if apply {
                        let mut p = PatchParams::apply("sluice");
                        p.force = self.force;
                        (p, Patch::Apply(obj))
                    } else if self.strategy == PatchStrategy::Strategic {
                        (PatchParams::default(), Patch::Strategic(obj))
                    } else {
                        (PatchParams::default(), Patch::Merge(obj))
                    };
                    self.call("patch", Some(&k), nsr, || api.patch(&name, &params, &patch))
                        .await?;
                    Done::Applied(name)
                }
            }
            Operation::Delete => {
                let name = name.ok_or_else(|| {
                    Failure::Bad("delete: the object has no metadata.name".into())
                })?;
                let dp = DeleteParams::default();
                match self
                    .call("delete", Some(&k), nsr, || api.delete(&name, &dp))
                    .await
                {
                    Ok(_) => Done::Applied(name),
                    Err(Failure::Api(f)) if f.err.is(404) => Done::Absent,
                    Err(e) => return Err(e),
                }
            }
        };
        if let (Some(policy), Done::Applied(name) | Done::Duplicate(name)) = (&self.policy, &done) {
            self.await_labels(&k, &ns, name, policy).await?;
        }
        Ok(done)
    }

    /// Creates `obj` (Argo's labels added); with only `generateName`, named from the event.
    pub(crate) async fn create(
        &self,
        k: &client::Kind,
        nsr: Option<&str>,
        api: &kube::Api<DynamicObject>,
        mut obj: Value,
        name: Option<String>,
        event: &Event,
    ) -> Result<Done, Failure> {
        let (name, derived) = match (name, id_generate_name(&obj)) {
            (Some(n), _) => (n, false),
            (None, Some(g)) => {
                let n = object::derived_name(&g, event, &self.name);
                object::set_meta(&mut obj, "name", Value::String(n.clone()));
                (n, true)
            }
            (None, None) => {
                return Err(Failure::Bad(
                    "the object has neither metadata.name nor metadata.generateName".into(),
                ))
            }
        };
        object::add_labels(&mut obj, &object::argo_labels(event));
        let dobj = to_dynamic(obj)?;
        let pp = PostParams::default();
        // Tries of this create: an AlreadyExists after a try that got no answer is most likely
        // that try's object.
        let tries = std::sync::atomic::AtomicU32::new(0);
        match self
            .call("create", Some(k), nsr, || {
                tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                api.create(&pp, &dobj)
            })
            .await
        {
            Ok(_) => Ok(Done::Applied(name)),
            Err(Failure::Api(f))
                if (derived || tries.load(std::sync::atomic::Ordering::Relaxed) > 1)
                    && f.err.is(409)
                    && f.err.reason == "AlreadyExists" =>
            {
                self.duplicates.increment(1);
                Ok(Done::Duplicate(name))
            }
            Err(e) => Err(e),
        }
    }

    async fn json_patch(&self, mut ops: Value, event: &Event) -> Result<Done, Failure> {
        self.params.apply(&mut ops, event).map_err(Failure::Bad)?;
        let t = self
            .target
            .as_ref()
            .ok_or_else(|| Failure::Bad("no target".into()))?;
        let patch: json_patch::Patch = serde_json::from_value(ops).map_err(|e| {
            Failure::Bad(format!("the JSON patch is not an array of operations: {e}"))
        })?;
        let k = self
            .kinds
            .resolve(&self.client, &t.api_version, &t.kind)
            .await
            .map_err(|err| Failure::api("get", None, None, err))?;
        let ns = t
            .namespace
            .clone()
            .unwrap_or_else(|| self.namespace.clone());
        let api = k.api(&self.client, &ns);
        let patch = Patch::<()>::Json(patch);
        let pp = PatchParams::default();
        self.call(
            "patch",
            Some(&k),
            k.namespaced.then_some(ns.as_str()),
            || api.patch(&t.name, &pp, &patch),
        )
        .await?;
        Ok(Done::Applied(t.name.clone()))
    }

    /// The kind, namespace and name of an object.
    pub(crate) async fn locate(
        &self,
        id: &object::Ident<'_>,
    ) -> Result<(client::Kind, String, Option<String>), Failure> {
        let k = self
            .kinds
            .resolve(&self.client, id.api_version, id.kind)
            .await
            .map_err(|err| Failure::api("get", None, None, err))?;
        let ns = id
            .namespace
            .map_or_else(|| self.namespace.clone(), str::to_owned);
        Ok((k, ns, id.name.map(str::to_owned)))
    }

    /// Argo's resource-labels policy, by a watch of the object rather than Argo's polling.
    async fn await_labels(
        &self,
        k: &client::Kind,
        ns: &str,
        name: &str,
        policy: &PolicyConfig,
    ) -> Result<(), Failure> {
        let api = k.api(&self.client, ns);
        // The namespace of its permissions: none for a cluster-scoped kind.
        let nsr = k.namespaced.then_some(ns);
        let cfg =
            kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
        let matches = |o: &DynamicObject| {
            let labels = o.metadata.labels.as_ref();
            policy
                .labels
                .iter()
                .all(|(key, v)| labels.and_then(|l| l.get(key)) == Some(v))
        };
        let wait = Backoff::total(&policy.backoff);
        use kube::runtime::watcher::{Error as WatchError, Event as WatchEvent};
        use kube::runtime::WatchStreamExt;
        // With backoff between failed tries (a watch that cannot start would otherwise be
        // retried at once, over and over, for the whole wait).
        let mut stream = std::pin::pin!(kube::runtime::watcher(api, cfg).default_backoff());
        let watching = async {
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(WatchEvent::Apply(o) | WatchEvent::InitApply(o)) if matches(&o) => {
                        return Ok(())
                    }
                    Ok(WatchEvent::Delete(_)) => {
                        return Err(Failure::Bad(format!(
                            "policy: {name} was deleted before its labels matched"
                        )))
                    }
                    Ok(WatchEvent::InitDone) => {
                        // The list worked: a 403 that marked these missing is over.
                        for verb in ["list", "watch"] {
                            self.perms.used(|| Permission {
                                verb: verb.to_owned(),
                                group: k.resource.group.clone(),
                                resource: k.resource.plural.clone(),
                                namespace: nsr.map(str::to_owned),
                            });
                        }
                    }
                    Ok(_) => {}
                    Err(WatchError::InitialListFailed(e)) => {
                        let err = KubeError::of(&e);
                        if err.verdict() == Verdict::Forbidden {
                            // The policy needs list and watch: said like any missing verb.
                            return Err(Failure::api(
                                "list",
                                Some(k.clone()),
                                nsr.map(str::to_owned),
                                err,
                            ));
                        }
                        tracing::debug!(sink = %self.name, error = %err, "k8s: policy watch error (retried)");
                    }
                    Err(WatchError::WatchStartFailed(e)) => {
                        let err = KubeError::of(&e);
                        if err.verdict() == Verdict::Forbidden {
                            return Err(Failure::api(
                                "watch",
                                Some(k.clone()),
                                nsr.map(str::to_owned),
                                err,
                            ));
                        }
                        tracing::debug!(sink = %self.name, error = %err, "k8s: policy watch error (retried)");
                    }
                    Err(e) => {
                        tracing::debug!(sink = %self.name, error = %e, "k8s: policy watch error (retried)")
                    }
                }
            }
            Err(Failure::Bad("policy: the watch ended".into()))
        };
        let watched = tokio::select! {
            r = tokio::time::timeout(wait, watching) => r,
            _ = self.grace_over.cancelled() => {
                return Err(Failure::api("watch", Some(k.clone()), nsr.map(str::to_owned), KubeError {
                    code: None,
                    reason: String::new(),
                    message: format!("policy: the shutdown grace ended while waiting for the labels of {name}"),
                    retry_after: None,
                }));
            }
        };
        match watched {
            Ok(r) => r,
            Err(_) if policy.error_on_backoff_timeout => Err(Failure::Bad(format!(
                "policy: the labels of {name} did not match {:?} within {wait:?} (errorOnBackoffTimeout)",
                policy.labels
            ))),
            Err(_) => {
                tracing::info!(sink = %self.name, object = %name, ?wait, "k8s: policy labels did not match in time; delivered (errorOnBackoffTimeout is false)");
                Ok(())
            }
        }
    }

    /// Settles an event's delivery from what the run did.
    pub(crate) fn settle(
        &self,
        item_id: &str,
        r: Result<Done, Failure>,
        delivery: sluice_core::Delivery,
    ) {
        match r {
            Ok(done) => {
                tracing::debug!(sink = %self.name, id = %item_id, ?done, "k8s: delivered");
                delivery.delivered()
            }
            Err(Failure::Bad(why)) => {
                tracing::warn!(sink = %self.name, id = %item_id, reason = %why, "k8s: rejected");
                delivery.rejected(why)
            }
            Err(Failure::Api(f)) => {
                let ApiFailure {
                    verb,
                    kind,
                    ns,
                    err,
                } = *f;
                match err.verdict() {
                    Verdict::Forbidden => {
                        let why = match &kind {
                            Some(k) => {
                                let p = Permission {
                                    verb: verb.to_owned(),
                                    group: k.resource.group.clone(),
                                    resource: k.resource.plural.clone(),
                                    namespace: ns.clone(),
                                };
                                self.perms.denied(&p, &err.message);
                                format!("missing permission: {p}: {err}")
                            }
                            None => format!("forbidden: {err}"),
                        };
                        tracing::warn!(sink = %self.name, id = %item_id, reason = %why, "k8s: rejected");
                        delivery.rejected(why)
                    }
                    Verdict::Reject => {
                        let why = format!(
                            "{verb} {}: {err}",
                            kind.as_ref().map_or_else(String::new, |k| k.gr())
                        );
                        tracing::warn!(sink = %self.name, id = %item_id, reason = %why, "k8s: rejected by the API server");
                        delivery.rejected(why)
                    }
                    Verdict::Retry => {
                        let why = format!("{verb}: {err}");
                        tracing::warn!(sink = %self.name, id = %item_id, reason = %why, "k8s: failed");
                        delivery.failed(why)
                    }
                }
            }
        }
    }
}

fn id_generate_name(obj: &Value) -> Option<String> {
    obj.get("metadata")?
        .get("generateName")?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

fn to_dynamic(obj: Value) -> Result<DynamicObject, Failure> {
    serde_json::from_value(obj).map_err(|e| Failure::Bad(format!("not a Kubernetes object: {e}")))
}

async fn deliver(t: Arc<Trigger>, item: SinkItem) {
    let SinkItem { event, delivery } = item;
    let r = t.run(&event).await;
    t.settle(&event.id, r, delivery);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(v: serde_json::Value) -> Result<K8sSinkConfig, String> {
        let c: K8sSinkConfig = serde_json::from_value(v).map_err(|e| e.to_string())?;
        c.check().map(|_| c)
    }

    #[test]
    fn validation_names_what_is_wrong() {
        let wf = serde_json::json!({"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","metadata":{"generateName":"x-"},"spec":{}});
        assert!(cfg(serde_json::json!({"resource": wf})).is_ok());
        let e = cfg(serde_json::json!({"operation":"update","resource": wf})).unwrap_err();
        assert!(e.contains("metadata.name is required"), "{e}");
        let e = cfg(serde_json::json!({"operation":"patch","patchStrategy":"application/json-patch+json","resource":[{"op":"add","path":"/x","value":1}]})).unwrap_err();
        assert!(e.contains("target"), "{e}");
        assert!(cfg(
            serde_json::json!({"operation":"patch","patchStrategy":"application/json-patch+json",
            "resource":[{"op":"add","path":"/x","value":1}],
            "target":{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"w"}})
        )
        .is_ok());
        let named = serde_json::json!({"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","metadata":{"name":"w"}});
        let e = cfg(serde_json::json!({"operation":"patch","patchStrategy":"application/strategic-merge-patch+json","resource": named})).unwrap_err();
        assert!(e.contains("built-in kinds only"), "{e}");
        let dep =
            serde_json::json!({"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"}});
        assert!(cfg(serde_json::json!({"operation":"patch","patchStrategy":"application/strategic-merge-patch+json","resource": dep})).is_ok());
        let e = cfg(serde_json::json!({"operation":"create","liveObject":true,"resource": named}))
            .unwrap_err();
        assert!(e.contains("liveObject"), "{e}");
        let e = cfg(serde_json::json!({"operation":"create"})).unwrap_err();
        assert!(e.contains("exactly one"), "{e}");
        let e = cfg(serde_json::json!({"resource": named, "bogus": 1})).unwrap_err();
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn policy_wait_is_the_sum_of_the_steps() {
        assert_eq!(Backoff::total(&None), Duration::from_secs(5));
        let b = Some(Backoff {
            duration: Some(HumanDuration::from_secs(1)),
            factor: Some(2.0),
            jitter: None,
            steps: Some(3),
        });
        assert_eq!(Backoff::total(&b), Duration::from_secs(7));
    }
}
