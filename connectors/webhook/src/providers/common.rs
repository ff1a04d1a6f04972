//! The options every provider kind shares with `kind: webhook` (listener, limits, acks), stamped
//! into each kind's config struct so that each keeps `deny_unknown_fields`.

/// `provider_config!(Name, "kind", "/default-path", "argo-type", max_body_mib { fields })`.
macro_rules! provider_config {
    (
        $(#[$meta:meta])*
        $name:ident, $kind:literal, $path:literal, $argo:literal, $mib:literal {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// Address to listen on, shared with other webhook-style sources on it.
            /// Default `0.0.0.0:12000`.
            #[serde(default = "crate::default_listen")]
            pub listen: std::net::SocketAddr,
            #[doc = concat!("Exact request path. Default `", $path, "`.")]
            #[serde(default)]
            pub path: Option<String>,
            #[doc = concat!("Largest body accepted (413 beyond). Default ", $mib, "MiB.")]
            pub max_body: Option<sluice_core::units::ByteSize>,
            /// `delivered` (default) or `accepted`.
            #[serde(default)]
            pub ack: crate::AckMode,
            /// How long a request may wait for room in the pipeline before 503. Default 1s.
            #[serde(default = "crate::default_accept_timeout")]
            pub accept_timeout: sluice_core::units::HumanDuration,
            /// How long `ack: delivered` waits for the sinks before 503. Default 30s.
            #[serde(default = "crate::default_ack_timeout")]
            pub ack_timeout: sluice_core::units::HumanDuration,
            /// `cloudevents` (default: named after the CloudEvents adapter) or `argo`.
            #[serde(default)]
            pub format: crate::Format,
            /// Serve HTTPS (and optionally require client certificates).
            pub tls: Option<crate::TlsConfig>,
            /// Request headers copied into extensions.
            #[serde(default)]
            pub header_extensions: Vec<String>,
            /// Static strings put in `data.metadata` (`format: argo`).
            #[serde(default)]
            pub metadata: std::collections::BTreeMap<String, String>,
            /// CloudEvent `source`: of every event for `hmac` and `standard-webhooks`, of
            /// `format: argo` events for the others (Argo's EventSource name). Default: the
            /// source's name.
            #[serde(default, rename = "source")]
            pub event_source: Option<String>,
            /// `format: argo`: the events' `subject` (Argo's event name). Default: the source's
            /// name.
            #[serde(default, rename = "subject")]
            pub event_subject: Option<String>,
            /// A client must send its request headers within this time. Default 10s.
            #[serde(default = "crate::default_header_timeout")]
            pub header_timeout: sluice_core::units::HumanDuration,
            /// A client must send its whole body within this time. Default 30s.
            #[serde(default = "crate::default_body_timeout")]
            pub body_timeout: sluice_core::units::HumanDuration,
            /// Open connections per listener. Default 10000.
            #[serde(default = "crate::default_max_connections")]
            pub max_connections: usize,
            /// Requests handled at once per listener (503 beyond). Default 1024.
            #[serde(default = "crate::default_max_in_flight")]
            pub max_in_flight: usize,
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl $name {
            pub const KIND: &'static str = $kind;

            /// The webhook options this kind runs on.
            pub(crate) fn webhook(&self, auth: Option<crate::AuthConfig>) -> crate::WebhookConfig {
                crate::WebhookConfig {
                    listen: self.listen,
                    path: self.path.clone().unwrap_or_else(|| $path.to_owned()),
                    methods: vec![crate::Method::Post],
                    max_body: self
                        .max_body
                        .unwrap_or(sluice_core::units::ByteSize::mib($mib)),
                    auth,
                    ack: self.ack,
                    accept_timeout: self.accept_timeout,
                    ack_timeout: self.ack_timeout,
                    id_headers: Vec::new(),
                    id_fallback: crate::IdFallback::Uuid,
                    format: self.format,
                    tls: self.tls.clone(),
                    event_type: Some($argo.to_owned()),
                    event_source: self.event_source.clone(),
                    event_subject: self.event_subject.clone(),
                    header_extensions: self.header_extensions.clone(),
                    allowed_origins: Vec::new(),
                    metadata: self.metadata.clone(),
                    header_timeout: self.header_timeout,
                    body_timeout: self.body_timeout,
                    max_connections: self.max_connections,
                    max_in_flight: self.max_in_flight,
                }
            }
        }
    };
}

/// `SourceConfig` for a provider config: `check` validates the kind's own options, `provider`
/// builds its verifier, `auth` gives the webhook-level auth (Gerrit) if any.
macro_rules! provider_source {
    ($name:ident) => {
        impl sluice_core::SourceConfig for $name {
            fn validate(&self, name: &str) -> Result<(), String> {
                self.webhook(self.auth_config()).validate(name)?;
                self.check()
            }

            fn build(
                self: Box<Self>,
                ctx: sluice_core::SourceContext,
            ) -> sluice_core::BoxFuture<
                'static,
                Result<sluice_core::Running, sluice_core::ConnectorError>,
            > {
                let webhook = self.webhook(self.auth_config());
                let provider = self.provider().map(|p| {
                    std::sync::Arc::new(p) as std::sync::Arc<dyn crate::providers::Provider>
                });
                match provider {
                    Ok(p) => crate::start(webhook, Some(p), ctx),
                    Err(e) => {
                        let msg = format!("{} {}: {e}", $name::KIND, ctx.name);
                        Box::pin(async move { Err(sluice_core::ConnectorError(msg)) })
                    }
                }
            }
        }
    };
}
