//! The one client path: a kube `Client` from the component's connection options, kinds
//! resolved through discovery (cached), the permission checks, and what each API answer means
//! for an event ([`Verdict`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::{ApiCapabilities, Scope};
use kube::{Api, Client, Config};
use sluice_core::telemetry::{K8S_PERMISSIONS_MISSING, K8S_REQUESTS};
use sluice_core::Health;

use crate::Connection;

/// Builds the client: the kubeconfig named (with its context), else kube's inference
/// (`KUBECONFIG`, `~/.kube/config`, then the in-cluster service account, whose token file is
/// re-read as it rotates), with impersonation on top.
pub async fn connect(conn: &Connection, component: &str) -> Result<Client, String> {
    let opts = KubeConfigOptions {
        context: conn.context.clone(),
        ..Default::default()
    };
    let mut config = match &conn.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| format!("{component}: kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &opts)
                .await
                .map_err(|e| format!("{component}: kubeconfig {}: {e}", path.display()))?
        }
        None if conn.context.is_some() => Config::from_kubeconfig(&opts).await.map_err(|e| {
            format!("{component}: kubeconfig (KUBECONFIG or ~/.kube/config) with context {:?}: {e}", conn.context)
        })?,
        None => Config::infer().await.map_err(|e| {
            format!("{component}: no Kubernetes configuration: {e} (set kubeconfig:, KUBECONFIG, or run in a pod with a service account)")
        })?,
    };
    // The components retry by their own policy (`retries`, the server's retryAfterSeconds,
    // within the shutdown grace), not kube's default layer (15 retries, up to 1000 s apart).
    config.default_retry = false;
    if let Some(i) = &conn.impersonate {
        config.auth_info.impersonate = Some(i.user.clone());
        config.auth_info.impersonate_groups = (!i.groups.is_empty()).then(|| i.groups.clone());
    }
    Client::try_from(config).map_err(|e| format!("{component}: Kubernetes client: {e}"))
}

/// The pod's own namespace when Sluice runs in a cluster.
pub fn pod_namespace() -> Option<String> {
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// A resolved kind: where its objects live and whether they are namespaced.
#[derive(Clone, Debug)]
pub struct Kind {
    pub resource: ApiResource,
    pub namespaced: bool,
}

impl Kind {
    /// `group/resource` (`resource` alone for the core group), for messages.
    pub fn gr(&self) -> String {
        gr(&self.resource.group, &self.resource.plural)
    }

    /// The API for objects of this kind in `ns` (ignored for cluster-scoped kinds: a
    /// cluster-scoped object is never given a namespace, unlike Argo, #1219).
    pub fn api(&self, client: &Client, ns: &str) -> Api<DynamicObject> {
        if self.namespaced {
            Api::namespaced_with(client.clone(), ns, &self.resource)
        } else {
            Api::all_with(client.clone(), &self.resource)
        }
    }
}

pub fn gr(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{group}/{plural}")
    }
}

/// Kinds resolved through discovery, kept once found (a kind's scope and plural do not change
/// while a CRD is installed).
#[derive(Default)]
pub struct Kinds(Mutex<HashMap<(String, String), Kind>>);

impl Kinds {
    /// The kind of `apiVersion` + `kind`.
    pub async fn resolve(
        &self,
        client: &Client,
        api_version: &str,
        kind: &str,
    ) -> Result<Kind, KubeError> {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(k) = self.0.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(k.clone());
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps): (ApiResource, ApiCapabilities) =
            kube::discovery::pinned_kind(client, &gvk)
                .await
                .map_err(|e| KubeError::of(&e))?;
        let k = Kind {
            resource,
            namespaced: caps.scope == Scope::Namespaced,
        };
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, k.clone());
        Ok(k)
    }

    /// The kind of a group/version/resource (the `k8s` source names the plural).
    pub async fn resolve_resource(
        &self,
        client: &Client,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Result<Kind, KubeError> {
        let gv = kube::core::GroupVersion::gv(group, version);
        let g = kube::discovery::pinned_group(client, &gv)
            .await
            .map_err(|e| KubeError::of(&e))?;
        for (resource, caps) in g.recommended_resources() {
            if resource.plural == plural {
                return Ok(Kind {
                    resource,
                    namespaced: caps.scope == Scope::Namespaced,
                });
            }
        }
        Err(KubeError {
            code: Some(404),
            reason: "NotFound".into(),
            message: format!(
                "the server serves no resource {plural:?} in {}{version} (check group, version and the plural resource name)",
                if group.is_empty() { String::new() } else { format!("{group}/") }
            ),
            retry_after: None,
        })
    }
}

/// An API error reduced to what decides an event's fate.
#[derive(Clone, Debug)]
pub struct KubeError {
    /// The HTTP status; `None` when no answer came (connection, timeout, TLS).
    pub code: Option<u16>,
    pub reason: String,
    pub message: String,
    /// `Status.details.retryAfterSeconds` (429, some 5xx).
    pub retry_after: Option<Duration>,
}

impl std::fmt::Display for KubeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.code {
            Some(c) => write!(f, "{c} {}: {}", self.reason, self.message),
            None => write!(f, "{}", self.message),
        }
    }
}

impl KubeError {
    pub fn of(e: &kube::Error) -> KubeError {
        match e {
            kube::Error::Api(s) => KubeError {
                // A JSON error body that is not a Status (a proxy's) reads as code 0: no
                // answer from the API server, retried.
                code: (s.code != 0).then_some(s.code),
                reason: s.reason.clone(),
                message: s.message.clone(),
                retry_after: s
                    .details
                    .as_ref()
                    .map(|d| d.retry_after_seconds)
                    .filter(|s| *s > 0)
                    .map(|s| Duration::from_secs(u64::from(s))),
            },
            kube::Error::Discovery(d) => KubeError {
                code: Some(404),
                reason: "NotFound".into(),
                message: format!("discovery: {d}"),
                retry_after: None,
            },
            other => KubeError {
                code: None,
                reason: String::new(),
                message: other.to_string(),
                retry_after: None,
            },
        }
    }

    pub fn is(&self, code: u16) -> bool {
        self.code == Some(code)
    }

    /// What this answer means for the event that caused it.
    pub fn verdict(&self) -> Verdict {
        match self.code {
            None => Verdict::Retry,
            Some(401 | 403) => Verdict::Forbidden,
            Some(408 | 429) => Verdict::Retry,
            Some(c) if c >= 500 => Verdict::Retry,
            // 409 Conflict on update is retried by the operation itself; one that reaches
            // here (an AlreadyExists the operation did not expect) is a rejection.
            Some(_) => Verdict::Reject,
        }
    }
}

/// What an API answer means for an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// 429, 5xx, no answer: try again after a backoff.
    Retry,
    /// 400, 404, 409, 415, 422: the server refuses this object as it is; to the dead letter.
    Reject,
    /// 401, 403: a permission is missing; rejected, and said loudly.
    Forbidden,
}

/// Counts an API call by verb and answer.
pub fn count(component: &str, verb: &'static str, code: Option<u16>) {
    let code = code.map_or_else(|| "error".to_owned(), |c| c.to_string());
    metrics::counter!(K8S_REQUESTS, "component" => component.to_owned(), "verb" => verb, "code" => code)
        .increment(1);
}

/// One permission a component needs: a verb on a group/resource in a namespace (`None`: all
/// namespaces, or a cluster-scoped kind).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Permission {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub namespace: Option<String>,
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.verb, gr(&self.group, &self.resource))?;
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns}"),
            None => write!(f, " in all namespaces"),
        }
    }
}

/// The permission checks of one component: each is asked with a `SelfSubjectAccessReview`;
/// a denied one (or a 403 at run time) is a [`Health`] problem, shown by `/readyz`, logged
/// with what to grant, and counted in [`K8S_PERMISSIONS_MISSING`].
#[derive(Clone)]
pub struct Permissions {
    component: Arc<str>,
    health: Health,
    missing: Arc<Mutex<std::collections::BTreeSet<Permission>>>,
    /// How many are missing, read without the lock by [`Permissions::used`] on every call.
    missing_count: Arc<std::sync::atomic::AtomicUsize>,
    gauge: metrics::Gauge,
}

impl Permissions {
    pub fn new(component: &str, health: Health) -> Self {
        Permissions {
            component: component.into(),
            health,
            missing: Default::default(),
            missing_count: Default::default(),
            gauge: metrics::gauge!(K8S_PERMISSIONS_MISSING, "component" => component.to_owned()),
        }
    }

    /// Asks the API server whether this component's identity may do each of `needed`; marks
    /// each denied one missing, each allowed one granted. A review that cannot be made (no
    /// answer, or the server does not serve the review API) leaves the permission unknown:
    /// logged, not marked, and answered with why.
    pub async fn review(
        &self,
        client: &Client,
        needed: &[Permission],
    ) -> Vec<(Permission, String)> {
        let mut unknown = Vec::new();
        let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
        for p in needed {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        verb: Some(p.verb.clone()),
                        group: Some(p.group.clone()),
                        resource: Some(p.resource.clone()),
                        namespace: p.namespace.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            match api.create(&PostParams::default(), &review).await {
                Ok(r) => {
                    let status = r.status.unwrap_or_default();
                    count(&self.component, "create_selfsubjectaccessreview", Some(201));
                    if status.allowed {
                        self.granted(p);
                    } else {
                        let why = status.reason.filter(|r| !r.is_empty());
                        self.denied(p, why.as_deref().unwrap_or("the access review said no"));
                    }
                }
                Err(e) => {
                    let k = KubeError::of(&e);
                    count(&self.component, "create_selfsubjectaccessreview", k.code);
                    tracing::warn!(component = %self.component, permission = %p, error = %k,
                        "kubernetes: could not review a permission; it is checked again when used");
                    unknown.push((p.clone(), k.to_string()));
                }
            }
        }
        unknown
    }

    /// What `sluice validate --kube` prints: each missing permission, and each that could not
    /// be reviewed.
    pub async fn preflight(&self, client: &Client, needed: &[Permission]) -> Vec<String> {
        let unknown = self.review(client, needed).await;
        let mut out: Vec<String> = self
            .missing()
            .iter()
            .map(|p| format!("missing permission: {p} (grant it to the identity Sluice runs as)"))
            .collect();
        out.extend(
            unknown
                .into_iter()
                .map(|(p, why)| format!("could not check {p}: {why}")),
        );
        out
    }

    /// A permission denied (a review said no, or the API answered 403).
    pub fn denied(&self, p: &Permission, why: &str) {
        let mut m = self.missing.lock().unwrap_or_else(|e| e.into_inner());
        if m.insert(p.clone()) {
            tracing::error!(component = %self.component, verb = %p.verb, group = %p.group,
                resource = %p.resource, namespace = p.namespace.as_deref().unwrap_or("*"), reason = %why,
                "kubernetes: permission missing; grant it in the Role (or ClusterRole) of the identity Sluice runs as");
        }
        self.gauge.set(m.len() as f64);
        self.missing_count
            .store(m.len(), std::sync::atomic::Ordering::Relaxed);
        self.health.problem(
            format!("rbac {p}"),
            format!("missing permission: {p} (grant it to the identity Sluice runs as)"),
        );
    }

    /// A call of `p` succeeded: clears it if it was marked missing (a Role fixed while Sluice
    /// runs turns `/readyz` green again). Cheap when nothing is missing.
    pub fn used(&self, p: impl FnOnce() -> Permission) {
        if self
            .missing_count
            .load(std::sync::atomic::Ordering::Relaxed)
            != 0
        {
            self.granted(&p());
        }
    }

    pub fn granted(&self, p: &Permission) {
        let mut m = self.missing.lock().unwrap_or_else(|e| e.into_inner());
        m.remove(p);
        self.gauge.set(m.len() as f64);
        self.missing_count
            .store(m.len(), std::sync::atomic::Ordering::Relaxed);
        self.health.clear(&format!("rbac {p}"));
    }

    /// The missing permissions, in order.
    pub fn missing(&self) -> Vec<Permission> {
        self.missing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// The wait before retry `n` (0 = the first) of an API call: 200 ms doubling to 10 s, or what
/// the server asked for (capped at 60 s).
pub fn backoff(n: u32, asked: Option<Duration>) -> Duration {
    if let Some(d) = asked {
        return d.min(Duration::from_secs(60));
    }
    Duration::from_millis(200u64.saturating_mul(1 << n.min(6))).min(Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(code: Option<u16>) -> KubeError {
        KubeError {
            code,
            reason: String::new(),
            message: String::new(),
            retry_after: None,
        }
    }

    #[test]
    fn answers_map_to_verdicts() {
        assert_eq!(err(None).verdict(), Verdict::Retry);
        for c in [429, 500, 503, 504, 408] {
            assert_eq!(err(Some(c)).verdict(), Verdict::Retry, "{c}");
        }
        for c in [400, 404, 409, 415, 422] {
            assert_eq!(err(Some(c)).verdict(), Verdict::Reject, "{c}");
        }
        for c in [401, 403] {
            assert_eq!(err(Some(c)).verdict(), Verdict::Forbidden, "{c}");
        }
    }

    #[test]
    fn backoff_doubles_and_honours_the_server() {
        assert_eq!(backoff(0, None), Duration::from_millis(200));
        assert_eq!(backoff(1, None), Duration::from_millis(400));
        assert_eq!(backoff(20, None), Duration::from_secs(10));
        assert_eq!(
            backoff(0, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        assert_eq!(
            backoff(0, Some(Duration::from_secs(600))),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn permissions_show_on_health_until_granted() {
        let health = Health::default();
        let perms = Permissions::new("sink wf", health.clone());
        let p = Permission {
            verb: "create".into(),
            group: "argoproj.io".into(),
            resource: "workflows".into(),
            namespace: Some("argo".into()),
        };
        perms.denied(&p, "no RBAC policy matched");
        assert_eq!(
            health.problems(),
            ["missing permission: create argoproj.io/workflows in namespace argo (grant it to the identity Sluice runs as)"]
        );
        assert_eq!(perms.missing(), std::slice::from_ref(&p));
        perms.granted(&p);
        assert!(health.problems().is_empty());
        assert!(perms.missing().is_empty());
    }
}
