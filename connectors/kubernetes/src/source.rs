//! `kind: k8s` source — Argo's `resource` EventSource: a watch of any kind, each change an
//! event with Argo's payload `{type, body, oldBody, group, version, resource, metadata}`.
//!
//! Beyond Argo (#985): the `resourceVersion` of every object it has delivered is kept in
//! `state_dir`, so after a restart the relist emits UPDATE for objects changed while Sluice was
//! down, DELETE for those gone, and ADD only for new ones. An object's state is written only
//! once its event was delivered, so a change is never lost between the two. The id is
//! `<uid>.<resourceVersion>` (`<uid>.deleted` for a deletion), so a relist is deduplicated.
//!
//! Memory: per object its uid, resourceVersion and namespace/name; whole objects only when
//! `oldBody: true` asks for the previous version in UPDATE events.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Timelike, Utc};
use futures_util::stream::FuturesOrdered;
use futures_util::StreamExt;
use kube::api::DynamicObject;
use kube::runtime::watcher;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sluice_core::state::StateStore;
use sluice_core::telemetry::{K8S_WATCHED_OBJECTS, K8S_WATCH_RESTARTS};
use sluice_core::{
    BoxFuture, ConnectorError, Event, Running, SourceConfig, SourceContext, SourceSender, Status,
    Timestamp,
};
use tokio_util::sync::CancellationToken;

use crate::client::{self, Permission, Permissions};
use crate::kube_options;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
pub enum EventType {
    #[serde(rename = "ADD")]
    Add,
    #[serde(rename = "UPDATE")]
    Update,
    #[serde(rename = "DELETE")]
    Delete,
}

impl EventType {
    fn argo(self) -> &'static str {
        match self {
            EventType::Add => "ADD",
            EventType::Update => "UPDATE",
            EventType::Delete => "DELETE",
        }
    }
    fn native(self) -> &'static str {
        match self {
            EventType::Add => "added",
            EventType::Update => "updated",
            EventType::Delete => "deleted",
        }
    }
}

/// Argo's `Selector`: `{key, operation, value}`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selector {
    pub key: String,
    /// Labels: `==` (default), `=`, `!=`, `in`, `notin` (comma-separated values), `exists`,
    /// `!`, `gt`, `lt`. Fields: `==` (default; Argo rejects every event when it is empty),
    /// `=`, `!=`.
    #[serde(default)]
    pub operation: String,
    #[serde(default)]
    pub value: String,
}

/// Argo's `filter`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    /// Only objects whose name starts with this.
    #[serde(default)]
    pub prefix: Option<String>,
    /// Label selectors, sent to the API server.
    #[serde(default)]
    pub labels: Vec<Selector>,
    /// Field selectors on the object, evaluated here: `key` a gjson path, `value` a regex
    /// matched against the field's text.
    #[serde(default)]
    pub fields: Vec<Selector>,
    /// Only objects created at or before this time (RFC 3339).
    #[serde(default, rename = "createdBy")]
    pub created_by: Option<String>,
    /// Only changes that happened after the source started.
    #[serde(default, rename = "afterStart")]
    pub after_start: bool,
}

/// The CloudEvents naming.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// type `io.k8s.<resource>.<added|updated|deleted>`, source the resource path, subject
    /// `<namespace>/<name>` (default).
    #[default]
    Native,
    /// Argo's: type `resource`, source and subject the source's name.
    Argo,
}

kube_options! {
    /// `kind: k8s` source options.
    pub struct K8sSourceConfig {
        /// The API group (`""` for the core group).
        #[serde(default)]
        pub group: String,
        pub version: String,
        /// The plural resource name (`workflows`, `pods`).
        pub resource: String,
        /// Only this namespace. Default: all namespaces.
        #[serde(default)]
        pub namespace: Option<String>,
        /// Default: all three.
        #[serde(default = "all_types", rename = "eventTypes")]
        pub event_types: Vec<EventType>,
        #[serde(default)]
        pub filter: Option<Filter>,
        /// Copied into each event's payload as `metadata`.
        #[serde(default)]
        pub metadata: BTreeMap<String, String>,
        /// Keep whole objects so UPDATE events carry the previous version as `oldBody` (more
        /// memory: the objects instead of uid + resourceVersion).
        #[serde(default, rename = "oldBody")]
        pub old_body: bool,
        /// `argo`: the events' `source` (Argo's EventSource name). Default: the source's
        /// name.
        #[serde(default, rename = "source")]
        pub event_source: Option<String>,
        /// `argo`: the events' `subject` (Argo's event name). Default: the source's name.
        #[serde(default, rename = "subject")]
        pub event_subject: Option<String>,
        /// `native` (default) or `argo`.
        #[serde(default)]
        pub format: Format,
        /// Events in flight (sent, not yet delivered) at once. Default 256.
        #[serde(default = "default_in_flight")]
        pub max_in_flight: usize,
    }
}

fn all_types() -> Vec<EventType> {
    vec![EventType::Add, EventType::Update, EventType::Delete]
}
fn default_in_flight() -> usize {
    256
}

/// A label selector string from Argo's selectors.
pub fn label_selector(sels: &[Selector]) -> Result<String, String> {
    let mut parts = Vec::new();
    for (i, s) in sels.iter().enumerate() {
        let (k, v) = (s.key.trim(), s.value.trim());
        if k.is_empty() {
            return Err(format!("filter.labels.{i}.key is empty"));
        }
        let list = || v.split(',').map(str::trim).collect::<Vec<_>>().join(",");
        parts.push(match s.operation.trim() {
            "" | "==" => format!("{k}=={v}"),
            "=" => format!("{k}={v}"),
            "!=" => format!("{k}!={v}"),
            "in" => format!("{k} in ({})", list()),
            "notin" => format!("{k} notin ({})", list()),
            "exists" => k.to_owned(),
            "!" => format!("!{k}"),
            "gt" => format!("{k}>{v}"),
            "lt" => format!("{k}<{v}"),
            other => {
                return Err(format!(
                    "filter.labels.{i}.operation {other:?}: one of ==, =, !=, in, notin, exists, !, gt, lt"
                ))
            }
        });
    }
    Ok(parts.join(","))
}

type Checked = (String, Vec<FieldFilter>, Option<DateTime<Utc>>);

struct FieldFilter {
    key: String,
    re: regex::Regex,
    negate: bool,
}

impl K8sSourceConfig {
    /// The label selector, the field filters and `createdBy`.
    fn check(&self) -> Result<Checked, String> {
        self.connection().check()?;
        if self.version.trim().is_empty() || self.resource.trim().is_empty() {
            return Err(
                "version and resource are required (resource is the plural: workflows, pods)"
                    .into(),
            );
        }
        if self.event_types.is_empty() {
            return Err("eventTypes: give at least one of ADD, UPDATE, DELETE".into());
        }
        if self.max_in_flight == 0 {
            return Err("max_in_flight must be at least 1".into());
        }
        let f = self.filter.clone().unwrap_or_default();
        let labels = label_selector(&f.labels)?;
        let mut fields = Vec::new();
        for (i, s) in f.fields.iter().enumerate() {
            let negate = match s.operation.trim() {
                // Argo rejects every event on an empty operation; its docs say `==`.
                "" | "=" | "==" => false,
                "!=" => true,
                other => {
                    return Err(format!(
                        "filter.fields.{i}.operation {other:?}: one of ==, =, !="
                    ))
                }
            };
            let re =
                regex::Regex::new(&s.value).map_err(|e| format!("filter.fields.{i}.value: {e}"))?;
            fields.push(FieldFilter {
                key: s.key.clone(),
                re,
                negate,
            });
        }
        let created_by = f
            .created_by
            .as_deref()
            .map(|t| {
                DateTime::parse_from_rfc3339(t)
                    .map(|d| d.with_timezone(&Utc))
                    .map_err(|e| {
                        format!("filter.createdBy {t:?}: {e} (RFC 3339, e.g. 2026-01-02T15:04:05Z)")
                    })
            })
            .transpose()?;
        Ok((labels, fields, created_by))
    }
}

/// What is kept per object (and, as JSON, in `state_dir`).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Seen {
    rv: String,
    ns: Option<String>,
    name: String,
    #[serde(skip)]
    obj: Option<Arc<Value>>,
}

impl K8sSourceConfig {
    fn needed(&self, namespaced: bool) -> Vec<Permission> {
        let ns = if namespaced {
            self.namespace.clone()
        } else {
            None
        };
        ["list", "watch"]
            .iter()
            .map(|v| Permission {
                verb: (*v).into(),
                group: self.group.clone(),
                resource: self.resource.clone(),
                namespace: ns.clone(),
            })
            .collect()
    }
}

impl SourceConfig for K8sSourceConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        self.check().map(drop)
    }

    fn preflight<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(async move {
            self.check()?;
            let component = format!("source {name}");
            let client = client::connect(&self.connection(), &component).await?;
            let kind = client::Kinds::default()
                .resolve_resource(&client, &self.group, &self.version, &self.resource)
                .await
                .map_err(|e| e.to_string())?;
            let perms = Permissions::new(&component, sluice_core::Health::default());
            Ok(perms
                .preflight(&client, &self.needed(kind.namespaced))
                .await)
        })
    }

    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let (labels, fields, created_by) = self
                .check()
                .map_err(|e| ConnectorError::new(format!("k8s source {}: {e}", ctx.name)))?;
            let component = format!("source {}", ctx.name);
            let client = client::connect(&self.connection(), &component)
                .await
                .map_err(ConnectorError::new)?;
            let kinds = client::Kinds::default();
            let kind = kinds
                .resolve_resource(&client, &self.group, &self.version, &self.resource)
                .await
                .map_err(|e| ConnectorError::new(format!("k8s source {}: {e}", ctx.name)))?;
            let perms = Permissions::new(&component, ctx.health.clone());
            let ns = if kind.namespaced {
                self.namespace.clone()
            } else {
                None
            };
            perms.review(&client, &self.needed(kind.namespaced)).await;
            let api = match &ns {
                Some(n) => {
                    kube::Api::<DynamicObject>::namespaced_with(client.clone(), n, &kind.resource)
                }
                None => kube::Api::<DynamicObject>::all_with(client.clone(), &kind.resource),
            };
            let table = format!("k8s-source/{}", ctx.name);
            let mut seen = HashMap::new();
            if let Some(state) = &ctx.state {
                state
                    .scan(&table, &mut |k, v| {
                        if let (Ok(uid), Ok(s)) =
                            (std::str::from_utf8(k), serde_json::from_slice::<Seen>(v))
                        {
                            seen.insert(uid.to_owned(), s);
                        }
                    })
                    .map_err(|e| ConnectorError::new(format!("k8s source {}: {e}", ctx.name)))?;
            }
            let source = match self.format {
                Format::Native => {
                    let base = if self.group.is_empty() {
                        format!("/api/{}", self.version)
                    } else {
                        format!("/apis/{}/{}", self.group, self.version)
                    };
                    match &ns {
                        Some(n) => format!("{base}/namespaces/{n}/{}", self.resource),
                        None => format!("{base}/{}", self.resource),
                    }
                }
                Format::Argo => self
                    .event_source
                    .clone()
                    .unwrap_or_else(|| ctx.name.clone()),
            };
            tracing::info!(source = %ctx.name, resource = %kind.gr(), namespace = ns.as_deref().unwrap_or("*"),
                known_objects = seen.len(), "k8s: watching");
            let needed = self.needed(kind.namespaced);
            let watch = Watch {
                cfg: *self,
                name: ctx.name.clone(),
                source,
                fields,
                created_by,
                started: Utc::now(),
                table,
                state: ctx.state.clone(),
                sender: ctx.sender,
                shutdown: ctx.shutdown.clone(),
                objects: metrics::gauge!(K8S_WATCHED_OBJECTS, "source" => ctx.name.clone()),
                needed,
                perms,
            };
            let wc = watcher::Config::default().labels(&labels);
            Ok(Box::pin(watch.run(api, wc, seen)) as Running)
        })
    }
}

struct Watch {
    cfg: K8sSourceConfig,
    name: String,
    source: String,
    fields: Vec<FieldFilter>,
    created_by: Option<DateTime<Utc>>,
    started: DateTime<Utc>,
    table: String,
    state: Option<Arc<dyn StateStore>>,
    sender: SourceSender,
    shutdown: CancellationToken,
    objects: metrics::Gauge,
    /// `list` and `watch` on the resource: marked missing on a 403, granted once a list worked.
    perms: Permissions,
    needed: Vec<Permission>,
}

/// Argo's `ResourceEventData`: `{type, body, oldBody, group, version, resource, metadata}`
/// (`metadata` left out when empty).
#[derive(Serialize)]
struct Payload<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    body: &'a Value,
    #[serde(rename = "oldBody")]
    old_body: Option<&'a Value>,
    group: &'a str,
    version: &'a str,
    resource: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<&'a BTreeMap<String, String>>,
}

/// A change on its way: resolves to the state to record once it is settled (`None`: not
/// delivered before the source stopped; nothing is recorded).
type Settling =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<(String, Option<Seen>)>> + Send>>;

/// A change to emit, and the state it leaves once delivered.
struct Change {
    ty: EventType,
    uid: String,
    body: Arc<Value>,
    old: Option<Arc<Value>>,
    id: String,
    /// `None`: the object is gone.
    after: Option<Seen>,
}

impl Watch {
    async fn run(
        self,
        api: kube::Api<DynamicObject>,
        wc: watcher::Config,
        mut seen: HashMap<String, Seen>,
    ) -> Result<(), ConnectorError> {
        let mut stream = std::pin::pin!(watcher(api, wc));
        let mut listed: Option<HashSet<String>> = None;
        let mut in_flight: FuturesOrdered<Settling> = FuturesOrdered::new();
        let mut failures = 0u32;
        self.objects.set(seen.len() as f64);
        loop {
            // Room in the window first: the watch waits while downstream is slow.
            let next = if in_flight.len() < self.cfg.max_in_flight {
                tokio::select! {
                    biased;
                    _ = self.shutdown.cancelled() => break,
                    done = in_flight.next(), if !in_flight.is_empty() => { self.settled(done); continue; }
                    ev = stream.next() => ev,
                }
            } else {
                tokio::select! {
                    biased;
                    _ = self.shutdown.cancelled() => break,
                    done = in_flight.next() => { self.settled(done); continue; }
                }
            };
            let Some(ev) = next else { break };
            let ev = match ev {
                Ok(ev) => {
                    failures = 0;
                    ev
                }
                Err(e) => {
                    // The watcher relists after a 410 Gone and reconnects a dropped watch by
                    // itself; it needs a pause between tries.
                    let reason = match &e {
                        watcher::Error::WatchError(s) if s.code == 410 => "gone",
                        _ => "error",
                    };
                    metrics::counter!(K8S_WATCH_RESTARTS, "source" => self.name.clone(), "reason" => reason).increment(1);
                    if let watcher::Error::InitialListFailed(kube::Error::Api(s))
                    | watcher::Error::WatchStartFailed(kube::Error::Api(s)) = &e
                    {
                        if s.code == 403 {
                            for p in &self.needed {
                                self.perms.denied(p, &s.message);
                            }
                        }
                    }
                    tracing::warn!(source = %self.name, error = %e, "k8s: watch failed; retrying");
                    failures += 1;
                    let wait = client::backoff(failures.saturating_sub(1), None);
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = self.shutdown.cancelled() => break,
                    }
                    continue;
                }
            };
            let changes = match ev {
                watcher::Event::Init => {
                    listed = Some(HashSet::new());
                    Vec::new()
                }
                watcher::Event::InitApply(obj) => {
                    if let (Some(l), Some(uid)) = (listed.as_mut(), obj.metadata.uid.clone()) {
                        l.insert(uid);
                    }
                    self.applied(&mut seen, obj).into_iter().collect()
                }
                watcher::Event::InitDone => {
                    // A list worked: whatever a 403 marked missing is there now.
                    for p in &self.needed {
                        self.perms.granted(p);
                    }
                    // Objects known before (in state, or from an earlier list) that the list
                    // no longer has were deleted while the watch was away.
                    let l = listed.take().unwrap_or_default();
                    let gone: Vec<String> =
                        seen.keys().filter(|u| !l.contains(*u)).cloned().collect();
                    gone.into_iter()
                        .filter_map(|uid| {
                            let s = seen.remove(&uid)?;
                            let body = s
                                .obj
                                .clone()
                                .unwrap_or_else(|| Arc::new(self.stub(&uid, &s)));
                            Some(Change {
                                ty: EventType::Delete,
                                id: format!("{uid}.deleted"),
                                uid,
                                body,
                                old: None,
                                after: None,
                            })
                        })
                        .collect()
                }
                watcher::Event::Apply(obj) => self.applied(&mut seen, obj).into_iter().collect(),
                watcher::Event::Delete(obj) => {
                    let uid = obj.metadata.uid.clone().unwrap_or_default();
                    seen.remove(&uid);
                    vec![Change {
                        ty: EventType::Delete,
                        id: format!("{uid}.deleted"),
                        uid,
                        body: Arc::new(to_value(obj)),
                        old: None,
                        after: None,
                    }]
                }
            };
            self.objects.set(seen.len() as f64);
            for c in changes {
                match self.event(&c) {
                    Some(ev) => in_flight.push_back(Box::pin(self.deliver(ev, c)) as Settling),
                    // Filtered out: the state still moves on (it was seen), in its turn behind
                    // what is still in flight, so an older change is never recorded over it.
                    None => {
                        in_flight.push_back(
                            Box::pin(std::future::ready(Some((c.uid, c.after)))) as Settling
                        )
                    }
                }
            }
        }
        // Finish what was sent: the pipeline delivers it during the drain.
        while let Some(done) = in_flight.next().await {
            self.settled(Some(done));
        }
        Ok(())
    }

    fn settled(&self, done: Option<Option<(String, Option<Seen>)>>) {
        if let Some(Some(update)) = done {
            self.persist(&[update]);
        }
    }

    /// The change an applied object makes to what is known.
    fn applied(&self, seen: &mut HashMap<String, Seen>, obj: DynamicObject) -> Option<Change> {
        let uid = obj.metadata.uid.clone()?;
        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
        let (ty, old) = match seen.get(&uid) {
            Some(s) if s.rv == rv => return None,
            Some(s) => (EventType::Update, s.obj.clone()),
            None => (EventType::Add, None),
        };
        let name = obj.metadata.name.clone().unwrap_or_default();
        let ns = obj.metadata.namespace.clone();
        let body = Arc::new(to_value(obj));
        let after = Seen {
            rv: rv.clone(),
            ns,
            name,
            obj: self.cfg.old_body.then(|| body.clone()),
        };
        seen.insert(uid.clone(), after.clone());
        Some(Change {
            ty,
            id: format!("{uid}.{rv}"),
            uid,
            body,
            old,
            after: Some(after),
        })
    }

    /// An object known only by its state (deleted while Sluice was down).
    fn stub(&self, uid: &str, s: &Seen) -> Value {
        let mut meta = json!({"name": s.name, "uid": uid, "resourceVersion": s.rv});
        if let Some(ns) = &s.ns {
            meta["namespace"] = json!(ns);
        }
        json!({"metadata": meta})
    }

    /// The event for a change, or `None` when the filters drop it.
    fn event(&self, c: &Change) -> Option<Event> {
        if !self.cfg.event_types.contains(&c.ty) {
            return None;
        }
        let meta = c.body.get("metadata");
        let name = meta
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let ns = meta
            .and_then(|m| m.get("namespace"))
            .and_then(Value::as_str);
        if let Some(f) = &self.cfg.filter {
            if let Some(p) = &f.prefix {
                if !name.starts_with(p.as_str()) {
                    return None;
                }
            }
            let created = meta
                .and_then(|m| m.get("creationTimestamp"))
                .and_then(Value::as_str)
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&Utc));
            if let (Some(limit), Some(created)) = (self.created_by, created) {
                if created > limit {
                    return None;
                }
            }
            if f.after_start {
                let at = match c.ty {
                    EventType::Add => created,
                    EventType::Update => newest_update(&c.body),
                    EventType::Delete => meta
                        .and_then(|m| m.get("deletionTimestamp"))
                        .and_then(Value::as_str)
                        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                        .map(|t| t.with_timezone(&Utc))
                        .or(Some(Utc::now())),
                };
                // Timestamps are whole seconds: what happened in the start's second counts.
                let started = self.started.with_nanosecond(0).unwrap_or(self.started);
                if at.is_none_or(|t| t < started) {
                    return None;
                }
            }
        }
        if !self.fields.is_empty() {
            let text = c.body.to_string();
            for f in &self.fields {
                let v = gjson::get(&text, &f.key);
                let hit = v.exists() && f.re.is_match(&v.to_string());
                if hit == f.negate {
                    return None;
                }
            }
        }
        // Serialized from references: the object is written once, not copied into a tree first.
        let data = Payload {
            ty: c.ty.argo(),
            body: &c.body,
            old_body: c.old.as_deref(),
            group: &self.cfg.group,
            version: &self.cfg.version,
            resource: &self.cfg.resource,
            metadata: (!self.cfg.metadata.is_empty()).then_some(&self.cfg.metadata),
        };
        let (ty, subject) = match self.cfg.format {
            Format::Native => (
                format!("io.k8s.{}.{}", self.cfg.resource, c.ty.native()),
                match ns {
                    Some(ns) => format!("{ns}/{name}"),
                    None => name.to_owned(),
                },
            ),
            Format::Argo => (
                "resource".to_owned(),
                self.cfg
                    .event_subject
                    .clone()
                    .unwrap_or_else(|| self.name.clone()),
            ),
        };
        Some(
            Event::new(c.id.clone(), self.source.clone(), ty)
                .with_subject(subject)
                .with_time(Timestamp::now())
                .with_json(serde_json::to_vec(&data).unwrap_or_default()),
        )
    }

    /// Sends the event until it is delivered (or rejected: a final answer) or the source
    /// stops; answers the state to keep.
    fn deliver(
        &self,
        ev: Event,
        c: Change,
    ) -> impl std::future::Future<Output = Option<(String, Option<Seen>)>> + use<> {
        let sender = self.sender.clone();
        let shutdown = self.shutdown.clone();
        let name = self.name.clone();
        async move {
            let mut attempt = 0u32;
            let pending = sender.send(vec![ev.clone()]).await;
            let mut outcome = pending.await;
            loop {
                match outcome.status {
                    Status::Delivered => return Some((c.uid, c.after)),
                    Status::Rejected => {
                        tracing::warn!(source = %name, id = %ev.id, reason = ?outcome.reason, "k8s: event rejected downstream");
                        return Some((c.uid, c.after));
                    }
                    Status::Failed | Status::InFlight => {}
                }
                if shutdown.is_cancelled() {
                    // Not delivered: its state is not written, so the next start emits it again.
                    return None;
                }
                let wait = client::backoff(attempt, None);
                attempt += 1;
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.cancelled() => return None,
                }
                outcome = sender.send(vec![ev.clone()]).await.await;
            }
        }
    }

    fn persist(&self, updates: &[(String, Option<Seen>)]) {
        let Some(state) = &self.state else { return };
        let mut puts = Vec::new();
        let mut deletes = Vec::new();
        for (uid, s) in updates {
            match s {
                Some(s) => puts.push((uid.as_bytes(), serde_json::to_vec(s).unwrap_or_default())),
                None => deletes.push(uid.as_bytes()),
            }
        }
        let puts: Vec<(&[u8], &[u8])> = puts.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        if let Err(e) = state.write(&self.table, &puts, &deletes) {
            tracing::error!(source = %self.name, error = %e, "k8s: could not keep the watched objects' versions; a restart may emit them again");
        }
    }
}

fn to_value(obj: DynamicObject) -> Value {
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

/// Argo's UPDATE time: the newest `managedFields[].time` with operation `Update`.
fn newest_update(body: &Value) -> Option<DateTime<Utc>> {
    body.pointer("/metadata/managedFields")?
        .as_array()?
        .iter()
        .filter(|f| f.get("operation").and_then(Value::as_str) == Some("Update"))
        .filter_map(|f| f.get("time").and_then(Value::as_str))
        .filter_map(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(key: &str, op: &str, value: &str) -> Selector {
        Selector {
            key: key.into(),
            operation: op.into(),
            value: value.into(),
        }
    }

    #[test]
    fn argo_label_selectors() {
        let s = label_selector(&[
            sel("app", "", "orders"),
            sel("tier", "!=", "web"),
            sel("env", "in", "a, b"),
            sel("x", "exists", ""),
            sel("y", "!", ""),
            sel("n", "gt", "3"),
        ])
        .unwrap();
        assert_eq!(s, "app==orders,tier!=web,env in (a,b),x,!y,n>3");
        assert!(label_selector(&[sel("a", "~", "b")]).is_err());
    }

    #[test]
    fn an_empty_field_operation_means_equals() {
        let c: K8sSourceConfig = serde_json::from_value(json!({
            "version": "v1alpha1", "group": "argoproj.io", "resource": "workflows",
            "filter": {"fields": [{"key": "metadata.name", "value": "^wf-"}]}
        }))
        .unwrap();
        let (_, fields, _) = c.check().unwrap();
        assert!(!fields[0].negate);
        let bad: K8sSourceConfig =
            serde_json::from_value(json!({"version": "v1", "resource": ""})).unwrap();
        assert!(bad.check().is_err());
    }

    #[test]
    fn update_time_is_the_newest_update() {
        let body = json!({"metadata": {"managedFields": [
            {"operation": "Update", "time": "2026-01-01T00:00:00Z"},
            {"operation": "Apply", "time": "2026-06-01T00:00:00Z"},
            {"operation": "Update", "time": "2026-03-01T00:00:00Z"}]}});
        assert_eq!(
            newest_update(&body).unwrap().to_rfc3339(),
            "2026-03-01T00:00:00+00:00"
        );
    }
}
