//! GCP Pub/Sub connectors.
//!
//! - `kind: pubsub` source: a streaming pull with flow control (`max_outstanding_messages` and
//!   `max_outstanding_bytes` are both the server's limit and the in-flight window), each
//!   message acknowledged only after its events were delivered, its ack deadline extended
//!   while they are in the pipeline, a failed one handed back with a backoff, messages of one
//!   ordering key delivered one after another in order.
//! - `kind: pubsub` sink: publishes in batches; an event is delivered when the server returned
//!   its message id.
//!
//! The client is `gcloud-pubsub` (docs/decisions.md says why). `endpoint:` or
//! `PUBSUB_EMULATOR_HOST` points both at the Pub/Sub emulator, without credentials.

pub mod argo;
pub mod binding;
mod sink;
mod source;

use std::collections::BTreeMap;
use std::time::Duration;

use gcloud_pubsub::apiv1::conn_pool::ConnectionManager;
use gcloud_pubsub::client::{Client, ClientConfig};
use google_cloud_gax::conn::Environment;
use serde::Deserialize;
use sluice_core::units::{ByteSize, HumanDuration};

pub use binding::Mode;
pub use source::DEFAULT_TYPE;

/// How to reach Pub/Sub: the project, and either an emulator or Google with credentials.
#[derive(Clone, Debug)]
pub struct Connection {
    pub project: String,
    pub endpoint: Option<String>,
    pub credentials_file: Option<String>,
}

/// A config struct with the connection options every Pub/Sub connector has.
macro_rules! pubsub_options {
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
            /// The Google Cloud project that holds the topic or subscription.
            pub project: String,
            /// `host:port` of a Pub/Sub emulator (plain gRPC, no credentials). Default:
            /// `PUBSUB_EMULATOR_HOST` when it is set, else Google's endpoint.
            pub endpoint: Option<String>,
            /// A service-account or authorized-user JSON key file. Default: Application
            /// Default Credentials (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's login, workload
            /// identity).
            pub credentials_file: Option<String>,
            $( $(#[$fmeta])* pub $field : $ty ),*
        }

        impl $name {
            pub(crate) fn connection(&self) -> $crate::Connection {
                $crate::Connection {
                    project: self.project.clone(),
                    endpoint: self.endpoint.clone(),
                    credentials_file: self.credentials_file.clone(),
                }
            }
        }
    };
}

impl Connection {
    pub(crate) fn check(&self) -> Result<(), String> {
        check_id("project", &self.project)?;
        if let Some(e) = &self.endpoint {
            let ok = e
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok || e.contains("://") {
                return Err(format!(
                    "endpoint: {e:?} must be host:port of a Pub/Sub emulator (like 127.0.0.1:8085)"
                ));
            }
        }
        if self.endpoint.is_some() && self.credentials_file.is_some() {
            return Err(
                "credentials_file: is for Google's endpoint; an emulator endpoint takes none"
                    .into(),
            );
        }
        Ok(())
    }

    /// The emulator address, if one is used.
    fn emulator(&self) -> Option<String> {
        self.endpoint.clone().or_else(|| {
            std::env::var("PUBSUB_EMULATOR_HOST")
                .ok()
                .filter(|h| !h.is_empty())
        })
    }

    /// A client: the emulator without credentials, or Google with the configured ones.
    pub(crate) async fn client(&self) -> Result<Client, String> {
        let config = self.config().await?;
        Client::new(config)
            .await
            .map_err(|e| format!("cannot connect to Pub/Sub: {e}"))
    }

    /// A client, and a channel of its own for a streaming pull.
    pub(crate) async fn clients(&self) -> Result<(Client, ConnectionManager), String> {
        let config = self.config().await?;
        let streaming = ConnectionManager::new(
            1,
            &config.endpoint,
            &config.environment,
            &config.connection_option,
        )
        .await
        .map_err(|e| format!("cannot connect to Pub/Sub: {e}"))?;
        let client = Client::new(config)
            .await
            .map_err(|e| format!("cannot connect to Pub/Sub: {e}"))?;
        Ok((client, streaming))
    }

    async fn config(&self) -> Result<ClientConfig, String> {
        let mut config = ClientConfig {
            project_id: Some(self.project.clone()),
            ..ClientConfig::default()
        };
        match self.emulator() {
            Some(host) => {
                config.environment = Environment::Emulator(host);
                config.pool_size = 1;
            }
            None => {
                // `ClientConfig::default()` is Google's endpoint without a token yet (no
                // PUBSUB_EMULATOR_HOST here); the credentials come next.
                config = match &self.credentials_file {
                    Some(path) => {
                        let file = gcloud_pubsub::client::google_cloud_auth::credentials::CredentialsFile::new_from_file(path.clone())
                            .await
                            .map_err(|e| format!("cannot read credentials_file {path}: {e}"))?;
                        config.with_credentials(file).await
                    }
                    None => config.with_auth().await,
                }
                .map_err(|e| {
                    format!(
                        "no Google credentials ({e}): set credentials_file, GOOGLE_APPLICATION_CREDENTIALS or run where workload identity applies; for the emulator set endpoint"
                    )
                })?;
                // The configured project wins over the credentials' own.
                config.project_id = Some(self.project.clone());
            }
        }
        Ok(config)
    }
}

/// A project, topic or subscription id: Pub/Sub's rules, checked before any call.
fn check_id(what: &str, id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err(format!("{what}: must not be empty"));
    }
    if id.len() > 255 || id.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(format!(
            "{what}: {id:?} is not a Pub/Sub id (no spaces or slashes, at most 255 characters)"
        ));
    }
    Ok(())
}

/// `subscription:` or `topic:` as an id or as `projects/<p>/<kind>/<id>`; returns the id and
/// checks that a full name is in the configured project.
fn resource_id<'a>(
    what: &str,
    kind: &str,
    value: &'a str,
    project: &str,
) -> Result<&'a str, String> {
    if let Some(rest) = value.strip_prefix("projects/") {
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() != 3 || parts[1] != kind {
            return Err(format!(
                "{what}: {value:?} must be an id or projects/<project>/{kind}/<id>"
            ));
        }
        if parts[0] != project {
            return Err(format!(
                "{what}: {value:?} is in project {:?}, not in project {project:?}",
                parts[0]
            ));
        }
        check_id(what, parts[2])?;
        return Ok(parts[2]);
    }
    check_id(what, value)?;
    Ok(value)
}

/// Counts a Pub/Sub API call by method and result.
pub(crate) fn api_call(stage: (&'static str, &str), method: &'static str, ok: bool) {
    metrics::counter!(
        "sluice_pubsub_requests_total",
        stage.0 => stage.1.to_owned(),
        "method" => method,
        "result" => if ok { "ok" } else { "error" }
    )
    .increment(1);
}

/// `format:` of a Pub/Sub source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// CloudEvents carried in the message (binary or structured) pass through; other messages
    /// are wrapped (default).
    #[default]
    Cloudevents,
    /// Argo Events' Pub/Sub event: type `pubsub`, data `{id, body, attributes, publishTime,
    /// metadata}`.
    Argo,
}

pubsub_options! {
    /// `kind: pubsub` source options.
    pub struct PubSubSourceConfig {
        /// The subscription: its id, or `projects/<project>/subscriptions/<id>`.
        pub subscription: String,
        /// Create the subscription on this topic (an id in the same project) when it does not
        /// exist. Without it a missing subscription is an error.
        pub topic: Option<String>,
        /// When Sluice creates the subscription: deliver messages of one ordering key in order.
        #[serde(default)]
        pub enable_message_ordering: bool,
        /// Messages received and not yet acknowledged, at most: the server stops sending at this
        /// count, and it is the source's in-flight window. Default 1000.
        #[serde(default = "thousand")]
        pub max_outstanding_messages: usize,
        /// Bytes of message data received and not yet acknowledged, at most. Default 100MiB.
        #[serde(default = "hundred_mib")]
        pub max_outstanding_bytes: ByteSize,
        /// The ack deadline of the stream (10s to 600s); extended while a message's events are in
        /// the pipeline. Default 60s.
        #[serde(default = "sixty_seconds")]
        pub ack_deadline: HumanDuration,
        /// The longest a message's deadline is extended; after it the message is handed back and
        /// Pub/Sub redelivers it. Default 1h.
        #[serde(default = "one_hour")]
        pub max_extension: HumanDuration,
        #[serde(default)]
        pub format: Format,
        /// `argo`: the data is JSON and goes into `data.body` as is (else base64).
        #[serde(default)]
        pub json_body: bool,
        /// `argo`: `data.metadata`.
        #[serde(default)]
        pub metadata: BTreeMap<String, String>,
        /// `type` of events made from plain messages. Default
        /// `google.cloud.pubsub.topic.v1.messagePublished`.
        #[serde(rename = "type")]
        pub event_type: Option<String>,
        /// `source` of events made from plain messages. Default
        /// `//pubsub.googleapis.com/projects/<project>/topics/<topic>`.
        #[serde(rename = "source")]
        pub event_source: Option<String>,
        /// `argo`: the events' `subject` (Argo's event name). Default: the source's name.
        #[serde(rename = "subject")]
        pub event_subject: Option<String>,
    }
}

pubsub_options! {
    /// `kind: pubsub` sink options.
    pub struct PubSubSinkConfig {
        /// The topic: its id, or `projects/<project>/topics/<id>`. It must exist.
        pub topic: String,
        #[serde(default)]
        pub mode: Mode,
        /// A template for each message's ordering key, like `{partitionkey}` or `{subject}`
        /// (the topic's subscriptions must enable message ordering to use it). Events of one key
        /// are published in order: the sink then has one publish in flight at a time.
        pub ordering_key: Option<String>,
        /// Events in one Publish call, at most (1 to 1000; a call also stays under 9 MB). Default 100.
        #[serde(default = "hundred")]
        pub max_batch: usize,
        /// Publish calls in flight at once. Default 4.
        #[serde(default = "four")]
        pub concurrency: usize,
        /// How long a Publish call (with the client's retries) may take before its events are
        /// reported failed. Default 30s.
        #[serde(default = "thirty_seconds")]
        pub timeout: HumanDuration,
    }
}

fn thousand() -> usize {
    1000
}
fn hundred() -> usize {
    100
}
fn four() -> usize {
    4
}
fn hundred_mib() -> ByteSize {
    ByteSize(100 * 1024 * 1024)
}
fn sixty_seconds() -> HumanDuration {
    HumanDuration::from_secs(60)
}
fn thirty_seconds() -> HumanDuration {
    HumanDuration::from_secs(30)
}
fn one_hour() -> HumanDuration {
    HumanDuration::from_secs(3600)
}

impl PubSubSourceConfig {
    pub(crate) fn check(&self) -> Result<(), String> {
        let c = self.connection();
        c.check()?;
        resource_id(
            "subscription",
            "subscriptions",
            &self.subscription,
            &c.project,
        )?;
        if let Some(t) = &self.topic {
            resource_id("topic", "topics", t, &c.project)?;
        } else if self.enable_message_ordering {
            return Err(
                "enable_message_ordering: applies when Sluice creates the subscription: set topic too (or enable ordering on the existing subscription)"
                    .into(),
            );
        }
        if self.max_outstanding_messages == 0 || self.max_outstanding_messages > 100_000 {
            return Err("max_outstanding_messages: must be between 1 and 100000".into());
        }
        if self.max_outstanding_bytes.bytes() < 1024 {
            return Err("max_outstanding_bytes: must be at least 1KiB".into());
        }
        let d = self.ack_deadline.get();
        if d < Duration::from_secs(10) || d > Duration::from_secs(600) {
            return Err(
                "ack_deadline: must be between 10s and 600s (Pub/Sub's limits; it is extended while in flight)"
                    .into(),
            );
        }
        if self.max_extension.get() < d {
            return Err("max_extension: must be at least ack_deadline".into());
        }
        Ok(())
    }
}

impl PubSubSinkConfig {
    pub(crate) fn check(&self) -> Result<(), String> {
        self.connection().check()?;
        resource_id("topic", "topics", &self.topic, &self.project)?;
        if let Some(t) = &self.ordering_key {
            sluice_core::template::Template::parse("ordering_key", t)?;
        }
        if self.max_batch == 0 || self.max_batch > 1000 {
            return Err("max_batch: must be between 1 and 1000 (Pub/Sub takes at most 1000 messages per Publish)".into());
        }
        if self.concurrency == 0 || self.concurrency > 256 {
            return Err("concurrency: must be between 1 and 256".into());
        }
        if self.timeout.get() < Duration::from_secs(1) {
            return Err("timeout: must be at least 1s".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_full_names() {
        assert_eq!(
            resource_id("subscription", "subscriptions", "s1", "p").unwrap(),
            "s1"
        );
        assert_eq!(
            resource_id(
                "subscription",
                "subscriptions",
                "projects/p/subscriptions/s1",
                "p"
            )
            .unwrap(),
            "s1"
        );
        let e = resource_id(
            "subscription",
            "subscriptions",
            "projects/q/subscriptions/s1",
            "p",
        )
        .unwrap_err();
        assert!(e.contains("not in project \"p\""), "{e}");
        let e = resource_id("topic", "topics", "projects/p/subscriptions/s1", "p").unwrap_err();
        assert!(e.contains("projects/<project>/topics/<id>"), "{e}");
        assert!(check_id("topic", "a b").is_err());
        assert!(check_id("topic", "").is_err());
    }

    #[test]
    fn connection_checks() {
        let c = |endpoint: Option<&str>, cred: Option<&str>| Connection {
            project: "p".into(),
            endpoint: endpoint.map(str::to_owned),
            credentials_file: cred.map(str::to_owned),
        };
        assert!(c(Some("127.0.0.1:8085"), None).check().is_ok());
        assert!(c(Some("http://127.0.0.1:8085"), None).check().is_err());
        assert!(c(Some("localhost"), None).check().is_err());
        assert!(c(Some("h:1"), Some("/k.json")).check().is_err());
        assert!(c(None, Some("/k.json")).check().is_ok());
    }
}
