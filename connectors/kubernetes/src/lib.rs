//! The Kubernetes family, on kube 5 + k8s-openapi over rustls:
//! - `k8s` sink: Argo's `k8s` trigger (create, update, patch, apply, delete any kind);
//! - `argo-workflow` sink: Argo's `argoWorkflow` trigger, natively (no `argo` CLI);
//! - `k8s` source: Argo's `resource` EventSource (watch any kind; nothing missed while down).
//!
//! One client path for all three ([`client`]): kubeconfig, context, in-cluster service account,
//! impersonation; kinds resolved through discovery; every permission a component needs checked
//! with a `SelfSubjectAccessReview` at start, a missing one shown on `/readyz`.
//!
//! The reference is `../shared/reference/argo-k8s.md`; where Sluice differs from Argo, the docs
//! pages (`docs/connectors/k8s.md`, `argo-workflow.md`) say so.

pub mod client;
pub mod object;
pub mod sink;
pub mod source;
pub mod workflow;

use std::path::PathBuf;

use serde::Deserialize;

pub use sink::K8sSinkConfig;
pub use source::K8sSourceConfig;
pub use workflow::ArgoWorkflowConfig;

/// Whom to act as: Kubernetes impersonation (`Impersonate-User`, `Impersonate-Group`). A
/// Sensor's `template.serviceAccountName: sa` is `{user: "system:serviceaccount:<ns>:sa"}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Impersonate {
    pub user: String,
    #[serde(default)]
    pub groups: Vec<String>,
}

/// Declares a kubernetes component's options with the connection options every one of them
/// takes (`kubeconfig`, `context`, `as`), so each config stays `deny_unknown_fields`.
macro_rules! kube_options {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// A kubeconfig file. Default: `KUBECONFIG`, else `~/.kube/config`, else the pod's
            /// service account (in a cluster).
            #[serde(default)]
            pub kubeconfig: Option<std::path::PathBuf>,
            /// The kubeconfig context. Default: its current context.
            #[serde(default)]
            pub context: Option<String>,
            /// Act as this user (and groups): Kubernetes impersonation.
            #[serde(default, rename = "as")]
            pub impersonate: Option<$crate::Impersonate>,
            $( $(#[$fmeta])* pub $field : $ty ),*
        }

        impl $name {
            pub(crate) fn connection(&self) -> $crate::Connection {
                $crate::Connection {
                    kubeconfig: self.kubeconfig.clone(),
                    context: self.context.clone(),
                    impersonate: self.impersonate.clone(),
                }
            }
        }
    };
}
pub(crate) use kube_options;

/// How a component reaches the API server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Connection {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub impersonate: Option<Impersonate>,
}

impl Connection {
    /// What can be checked without the cluster.
    pub(crate) fn check(&self) -> Result<(), String> {
        if let Some(i) = &self.impersonate {
            if i.user.trim().is_empty() {
                return Err("as.user: give the user to act as (e.g. system:serviceaccount:argo-events:sensor)".into());
            }
        }
        if let Some(c) = &self.context {
            if c.trim().is_empty() {
                return Err(
                    "context: empty; leave it out for the kubeconfig's current context".into(),
                );
            }
        }
        Ok(())
    }
}
