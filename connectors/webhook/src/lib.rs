//! `kind: webhook` — HTTP ingress on hyper 1 + rustls.
//!
//! Several webhook sources may share one `listen` address; they are told apart by `path`. Plain
//! requests become CloudEvents; incoming CloudEvents (binary, structured, batched) pass through
//! unchanged. The answer is honest: with `ack: delivered` a 200 means every routed sink
//! confirmed the event.

pub mod argo;
mod auth;
mod handler;
pub mod providers;
mod server;
mod tls;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Deserialize;
use sluice_core::units::{ByteSize, HumanDuration};
use sluice_core::{BoxFuture, ConnectorError, Running, SourceConfig, SourceContext};

pub use auth::{AuthConfig, BasicCredentials};
pub use providers::{
    bitbucket::{BitbucketConfig, BitbucketServerConfig},
    gerrit::GerritConfig,
    github::GithubConfig,
    gitlab::GitlabConfig,
    hmac::HmacConfig,
    slack::SlackConfig,
    standard::StandardWebhooksConfig,
    stripe::StripeConfig,
};
pub use tls::TlsConfig;

/// When the webhook answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AckMode {
    /// 200 only after every routed sink confirmed every event of the request (default).
    #[default]
    Delivered,
    /// 202 once the events are queued. A crash can lose queued events.
    Accepted,
}

/// How a plain request's id is made when no `id_headers` header is present.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdFallback {
    /// A fresh UUIDv7 (default).
    #[default]
    Uuid,
    /// The hex SHA-256 of the body: identical bodies are duplicates within the dedup window.
    BodySha256,
}

/// The shape of events made from plain requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Native: data is the raw body; incoming CloudEvents pass through (default).
    #[default]
    Cloudevents,
    /// Argo Events' webhook event: data `{header, body, metadata}`, type `webhook`.
    Argo,
}

/// An HTTP method a webhook accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    pub fn as_http(self) -> http::Method {
        match self {
            Method::Get => http::Method::GET,
            Method::Post => http::Method::POST,
            Method::Put => http::Method::PUT,
            Method::Patch => http::Method::PATCH,
            Method::Delete => http::Method::DELETE,
        }
    }
}

/// `kind: webhook` options. Listener-wide options (`tls`, the limits and timeouts) must agree
/// between webhook sources that share a `listen` address.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// Address to listen on. Default `0.0.0.0:12000`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Exact request path (no trailing-slash folding: `/a` and `/a/` differ). Default `/`.
    #[serde(default = "default_path")]
    pub path: String,
    /// Accepted methods. Default `[POST]`.
    #[serde(default = "default_methods")]
    pub methods: Vec<Method>,
    /// Largest body accepted; larger ones get 413 without being read. Default 1MiB.
    #[serde(default = "default_max_body")]
    pub max_body: ByteSize,
    /// Bearer tokens or basic credentials; unset means no auth.
    pub auth: Option<AuthConfig>,
    /// `delivered` (default) or `accepted`.
    #[serde(default)]
    pub ack: AckMode,
    /// How long a request may wait for room in the pipeline before 503. Default 1s.
    #[serde(default = "default_accept_timeout")]
    pub accept_timeout: HumanDuration,
    /// How long `ack: delivered` waits for the sinks before 503. Default 30s.
    #[serde(default = "default_ack_timeout")]
    pub ack_timeout: HumanDuration,
    /// Headers whose value becomes the event id, first present wins.
    #[serde(default = "default_id_headers")]
    pub id_headers: Vec<String>,
    /// `uuid` (default) or `body-sha256`.
    #[serde(default)]
    pub id_fallback: IdFallback,
    /// `cloudevents` (default) or `argo`.
    #[serde(default)]
    pub format: Format,
    /// Serve HTTPS (and optionally require client certificates).
    pub tls: Option<TlsConfig>,
    /// `type` of events made from plain requests. Default `webhook`.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// `source` of events made from plain requests. Default: the source's name.
    #[serde(rename = "source")]
    pub event_source: Option<String>,
    /// `subject` of events made from plain requests. Default: the path (`argo`: the name).
    #[serde(rename = "subject")]
    pub event_subject: Option<String>,
    /// Request headers copied into extensions (name: lowercase letters and digits of the
    /// header name, e.g. `X-Request-Id` → `xrequestid`).
    #[serde(default)]
    pub header_extensions: Vec<String>,
    /// Origins allowed by the CloudEvents webhook handshake (`OPTIONS` with
    /// `WebHook-Request-Origin`); `*` allows any.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Static strings put in `data.metadata` (`format: argo`).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// A client must send its request headers within this time. Default 10s.
    #[serde(default = "default_header_timeout")]
    pub header_timeout: HumanDuration,
    /// A client must send its whole body within this time (408 otherwise). Default 30s.
    #[serde(default = "default_body_timeout")]
    pub body_timeout: HumanDuration,
    /// Open connections per listener; more wait in the kernel's backlog. Default 10000.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Requests handled at once per listener; more get 503 at once. Bodies in memory are bounded
    /// by `max_in_flight × max_body`. Default 1024.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
}

pub(crate) fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 12000))
}
pub(crate) fn default_path() -> String {
    "/".into()
}
pub(crate) fn default_methods() -> Vec<Method> {
    vec![Method::Post]
}
pub(crate) fn default_max_body() -> ByteSize {
    ByteSize::mib(1)
}
pub(crate) fn default_accept_timeout() -> HumanDuration {
    HumanDuration::from_secs(1)
}
pub(crate) fn default_ack_timeout() -> HumanDuration {
    HumanDuration::from_secs(30)
}
pub(crate) fn default_id_headers() -> Vec<String> {
    [
        "Idempotency-Key",
        "webhook-id",
        "X-GitHub-Delivery",
        "X-Gitlab-Event-UUID",
    ]
    .map(String::from)
    .to_vec()
}
pub(crate) fn default_header_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
pub(crate) fn default_body_timeout() -> HumanDuration {
    HumanDuration::from_secs(30)
}
pub(crate) fn default_max_connections() -> usize {
    10_000
}
pub(crate) fn default_max_in_flight() -> usize {
    1024
}

impl WebhookConfig {
    /// Options that belong to the listener and must agree between sources sharing it.
    fn listener_settings(&self) -> server::ListenerSettings {
        server::ListenerSettings {
            tls: self.tls.clone(),
            header_timeout: self.header_timeout.get(),
            max_connections: self.max_connections,
            max_in_flight: self.max_in_flight,
        }
    }
}

impl SourceConfig for WebhookConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        if !self.path.starts_with('/') {
            return Err(format!("path {:?} must start with `/`", self.path));
        }
        if self.path == "/health" {
            return Err("path `/health` is reserved: every listener answers it with 200".into());
        }
        if self.methods.is_empty() {
            return Err("methods must name at least one method".into());
        }
        if self.max_body.bytes() == 0 {
            return Err("max_body must be above 0".into());
        }
        if self.max_connections == 0 || self.max_in_flight == 0 {
            return Err("max_connections and max_in_flight must be above 0".into());
        }
        if let Some(a) = &self.auth {
            a.validate()?;
        }
        for h in self.id_headers.iter().chain(&self.header_extensions) {
            http::HeaderName::try_from(h.as_str())
                .map_err(|_| format!("{h:?} is not a valid header name"))?;
        }
        for h in &self.header_extensions {
            let ext = handler::extension_name(h);
            sluice_core::event::check_extension_name(&ext)
                .map_err(|e| format!("header_extensions: {h:?} gives extension {ext:?}: {e}"))?;
        }
        // Events from plain requests carry these attributes as they are: check them once here.
        let mut probe = sluice_core::Event::new(
            "probe",
            self.event_source.as_deref().unwrap_or("webhook"),
            self.event_type.as_deref().unwrap_or("webhook"),
        );
        probe.subject = Some(self.event_subject.as_deref().unwrap_or(&self.path).into());
        probe
            .validate()
            .map_err(|e| format!("type, source or subject: {e}"))?;
        Ok(())
    }

    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        start(*self, None, ctx)
    }
}

/// Starts a webhook-style source: its route on the shared listener for `cfg.listen`, with a
/// provider's verification and naming when given.
pub(crate) fn start(
    cfg: WebhookConfig,
    provider: Option<std::sync::Arc<dyn providers::Provider>>,
    ctx: SourceContext,
) -> BoxFuture<'static, Result<Running, ConnectorError>> {
    Box::pin(async move {
        let settings = cfg.listener_settings();
        let listen = cfg.listen;
        let path = cfg.path.clone();
        let name = ctx.name.clone();
        let route = handler::Route::new(cfg, provider, &ctx)
            .map_err(|e| ConnectorError(format!("webhook {name}: {e}")))?;
        let listeners = ctx.shared.get_or_default::<server::Listeners>();
        let listener = listeners
            .attach(listen, settings, path.clone(), route, ctx.shutdown.clone())
            .await
            .map_err(|e| ConnectorError(format!("webhook {name}: {e}")))?;
        let shutdown = ctx.shutdown.clone();
        Ok(Box::pin(async move {
            shutdown.cancelled().await;
            listener.closed().await;
            listener.detach(&path);
            Ok(())
        }) as Running)
    })
}
