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

pub mod argo;
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

/// Declares a trigger sink's options: the connection options, the object (one of `resource`,
/// `inline`, `file`, `url`, `configmap`) with Argo's `parameters`, and the delivery options
/// every Kubernetes trigger takes (`namespace`, `concurrency`, `retries`, `timeout`).
macro_rules! trigger_options {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $crate::kube_options! {
            $(#[$meta])*
            pub struct $name {
                /// The object, inline.
                #[serde(default)]
                pub resource: Option<serde_json::Value>,
                /// The object as YAML or JSON text.
                #[serde(default)]
                pub inline: Option<String>,
                /// The object from a YAML or JSON file, read for each event.
                #[serde(default)]
                pub file: Option<std::path::PathBuf>,
                /// The object from a URL, fetched for each event (200 only, at most 512 KiB).
                #[serde(default)]
                pub url: Option<$crate::object::UrlSource>,
                /// The object from a ConfigMap key, read through the API for each event.
                #[serde(default)]
                pub configmap: Option<$crate::object::ConfigMapSource>,
                /// Argo's parameters: values of the event written into the object.
                #[serde(default)]
                pub parameters: Vec<sluice_core::params::ParamConfig>,
                /// The namespace of objects that name none. Default: the kubeconfig context's,
                /// or the pod's own.
                #[serde(default)]
                pub namespace: Option<String>,
                /// Events in flight at once. Default 16.
                #[serde(default = "crate::sink::sixteen")]
                pub concurrency: usize,
                /// Retries of an API call answered 429, 5xx or not at all. Default 5.
                #[serde(default = "crate::sink::five")]
                pub retries: u32,
                /// One API call. Default 30s.
                #[serde(default = "crate::sink::thirty_seconds")]
                pub timeout: sluice_core::units::HumanDuration,
                $( $(#[$fmeta])* pub $field : $ty ),*
            }
        }

        impl $name {
            /// The object's origin (exactly one given).
            pub(crate) fn origin(&self) -> Result<$crate::object::Origin, String> {
                $crate::object::Origin::pick(
                    &self.resource,
                    &self.inline,
                    &self.file,
                    &self.url,
                    &self.configmap,
                )
            }
        }
    };
}
pub(crate) use trigger_options;

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
