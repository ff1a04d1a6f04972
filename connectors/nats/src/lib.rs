//! `kind: nats` — publishes events to NATS: JetStream (acknowledged, deduplicated by
//! `Nats-Msg-Id`) or core NATS (fire and forget after a flush).

pub mod argo;
mod binding;
mod source;
mod subject;

use std::path::PathBuf;
use std::time::Duration as StdDuration;

use async_nats::jetstream::{self, stream};
use async_nats::{HeaderMap, HeaderName};
use bytes::Bytes;
use serde::Deserialize;
use sluice_core::event::{Event, Timestamp};
use sluice_core::http_binding::percent_encode_value;
use sluice_core::pipeline::{SinkWindow, Step};
use sluice_core::units::HumanDuration;
use sluice_core::{
    format, BoxFuture, ConnectorError, Delivery, Running, SinkConfig, SinkContext, SinkItem,
};

pub use source::{CoreFormat, Deliver, JetStreamSourceConfig, NatsSourceConfig};
pub use subject::Template;

/// How events travel (CloudEvents NATS binding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `ce-*` headers (including `ce-datacontenttype`), data as the payload (default).
    #[default]
    Binary,
    /// The whole event as JSON, `Content-Type: application/cloudevents+json`.
    Structured,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// The CloudEvents NATS binding (default).
    #[default]
    Cloudevents,
    /// Argo Events' JetStream EventBus: stream `default`, subject `default.<source>.<subject>`,
    /// structured JSON, `Nats-Msg-Id` = the event id.
    ArgoEventbus,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    #[default]
    File,
    Memory,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Retention {
    #[default]
    Limits,
    Interest,
    Workqueue,
}

/// `jetstream.create`: create the stream when it does not exist.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateStream {
    pub subjects: Vec<String>,
    #[serde(default)]
    pub storage: Storage,
    #[serde(default = "one")]
    pub replicas: usize,
    /// The window in which JetStream drops a repeated `Nats-Msg-Id`. Default 10m.
    #[serde(default = "ten_minutes")]
    pub duplicate_window: HumanDuration,
    #[serde(default)]
    pub retention: Retention,
    /// Messages older than this are removed (set when the stream is created). Default: kept.
    #[serde(default)]
    pub max_age: Option<HumanDuration>,
    /// At most this many messages, the oldest removed first (set when the stream is created).
    /// Default: no limit.
    #[serde(default)]
    pub max_messages: Option<i64>,
}

fn one() -> usize {
    1
}
fn ten_minutes() -> HumanDuration {
    HumanDuration::from_secs(600)
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JetStreamConfig {
    /// The stream events must land in.
    pub stream: String,
    /// Create it if missing (refuse to start when it exists with incompatible settings).
    pub create: Option<CreateStream>,
}

/// `auth:` — one of user/password, token, nkey seed, credentials file.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    pub nkey: Option<String>,
    pub credentials: Option<PathBuf>,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("user", &self.user)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM CA bundle to trust.
    pub ca: Option<PathBuf>,
    /// Client certificate and key (mTLS).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// `kind: nats` options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsConfig {
    /// Server URL(s), comma-separated. Default `nats://127.0.0.1:4222`.
    #[serde(default = "default_url")]
    pub url: String,
    /// Subject template over event attributes: `{source}`, `{type}`, `{subject}`, `{id}`, or an
    /// extension name. Default `events.{source}.{type}`.
    #[serde(default = "default_subject")]
    pub subject: String,
    #[serde(default)]
    pub mode: Mode,
    /// Publish to JetStream and count an event delivered on its PubAck.
    pub jetstream: Option<JetStreamConfig>,
    #[serde(default)]
    pub format: Format,
    /// JetStream publishes awaiting their PubAck at once (1 to 4096). Default 256.
    #[serde(default = "default_window")]
    pub max_in_flight: usize,
    /// How long a publish may wait for its PubAck. Default 10s.
    #[serde(default = "default_ack_timeout")]
    pub ack_timeout: HumanDuration,
    pub auth: Option<AuthConfig>,
    pub tls: Option<TlsConfig>,
}

pub(crate) fn default_url() -> String {
    "nats://127.0.0.1:4222".into()
}
fn default_subject() -> String {
    "events.{source}.{type}".into()
}
fn default_window() -> usize {
    256
}
fn default_ack_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}

impl NatsConfig {
    fn effective(&self) -> (String, Option<JetStreamConfig>, Mode) {
        match self.format {
            Format::Cloudevents => (self.subject.clone(), self.jetstream.clone(), self.mode),
            Format::ArgoEventbus => {
                let js = self.jetstream.clone().unwrap_or(JetStreamConfig {
                    stream: "default".into(),
                    create: Some(CreateStream {
                        subjects: vec!["default.*.*".into()],
                        storage: Storage::File,
                        replicas: 1,
                        duplicate_window: HumanDuration::from_secs(300),
                        retention: Retention::Limits,
                        // The limits of Argo's controller configuration, so the bus does not
                        // grow without bound.
                        max_age: Some(HumanDuration::from_secs(168 * 3600)),
                        max_messages: Some(50_000),
                    }),
                });
                (
                    "default.{source}.{subject}".into(),
                    Some(js),
                    Mode::Structured,
                )
            }
        }
    }
}

impl SinkConfig for NatsConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        Template::parse(&self.effective().0)?;
        // async-nats allows 5000 PubAcks in flight per context; stay below it.
        if self.max_in_flight == 0 || self.max_in_flight > 4096 {
            return Err("max_in_flight must be between 1 and 4096".into());
        }
        check_auth_tls(self.auth.as_ref(), self.tls.as_ref())?;
        Ok(())
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("nats sink {name}: {m}"));
            let (subject, js, mode) = self.effective();
            let template = Template::parse(&subject).map_err(err)?;
            let client = connect(&self).await.map_err(err)?;
            let publisher = match &js {
                Some(js) => {
                    let mut context = jetstream::new(client.clone());
                    // The client's own request timeout (5s by default) bounds every publish and
                    // PubAck wait: make it ours.
                    context.set_timeout(self.ack_timeout.get());
                    ensure_stream(&context, js).await.map_err(err)?;
                    Publisher::JetStream(context)
                }
                None => Publisher::Core(client.clone()),
            };
            let sink = NatsSink {
                name: ctx.name.clone(),
                fixed_subject: template.fixed().map(async_nats::Subject::from),
                template,
                mode,
                argo: self.format == Format::ArgoEventbus,
                publisher,
                window: self.max_in_flight,
                ack_timeout: self.ack_timeout.get(),
            };
            Ok(Box::pin(sink.run(ctx)) as Running)
        })
    }
}

/// Checks `auth:` and `tls:` (shared by the sink and the sources).
pub(crate) fn check_auth_tls(
    auth: Option<&AuthConfig>,
    tls: Option<&TlsConfig>,
) -> Result<(), String> {
    if let Some(a) = auth {
        let n = [
            a.user.is_some(),
            a.token.is_some(),
            a.nkey.is_some(),
            a.credentials.is_some(),
        ]
        .iter()
        .filter(|x| **x)
        .count();
        if n != 1 {
            return Err(
                "auth: give exactly one of user (with password), token, nkey, credentials".into(),
            );
        }
        if a.user.is_some() != a.password.is_some() {
            return Err("auth: user and password go together".into());
        }
    }
    if let Some(t) = tls {
        if t.cert.is_some() != t.key.is_some() {
            return Err("tls: cert and key go together".into());
        }
    }
    Ok(())
}

async fn connect(cfg: &NatsConfig) -> Result<async_nats::Client, String> {
    connect_with(&cfg.url, cfg.auth.as_ref(), cfg.tls.as_ref(), |o| o).await
}

/// Connects with the given auth and TLS; `tune` adjusts the options (a source's buffer size,
/// its event callback). Fails when the server cannot be reached within 10 s.
pub(crate) async fn connect_with(
    url: &str,
    auth: Option<&AuthConfig>,
    tls: Option<&TlsConfig>,
    tune: impl FnOnce(async_nats::ConnectOptions) -> async_nats::ConnectOptions,
) -> Result<async_nats::Client, String> {
    let mut opts = async_nats::ConnectOptions::new()
        .name("sluice")
        .retry_on_initial_connect()
        .connection_timeout(StdDuration::from_secs(5));
    if let Some(a) = auth {
        if let (Some(u), Some(p)) = (&a.user, &a.password) {
            opts = opts.user_and_password(u.clone(), p.clone());
        }
        if let Some(t) = &a.token {
            opts = opts.token(t.clone());
        }
        if let Some(seed) = &a.nkey {
            opts = opts.nkey(seed.clone());
        }
        if let Some(path) = &a.credentials {
            opts = opts
                .credentials_file(path)
                .await
                .map_err(|e| format!("auth.credentials {}: {e}", path.display()))?;
        }
    }
    if let Some(t) = tls {
        opts = opts.require_tls(true);
        if let Some(ca) = &t.ca {
            opts = opts.add_root_certificates(ca.clone());
        }
        if let (Some(c), Some(k)) = (&t.cert, &t.key) {
            opts = opts.add_client_certificate(c.clone(), k.clone());
        }
    }
    let opts = tune(opts);
    // Fail the build when the server cannot be reached at all, rather than buffering blindly.
    let connecting = opts.connect(url);
    match tokio::time::timeout(StdDuration::from_secs(10), connecting).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!("cannot connect to {url}: {e}")),
        Err(_) => Err(format!(
            "cannot connect to {url} within 10s; is the server up?"
        )),
    }
}

async fn ensure_stream(context: &jetstream::Context, js: &JetStreamConfig) -> Result<(), String> {
    match context.get_stream(&js.stream).await {
        Ok(mut s) => {
            let info = s
                .info()
                .await
                .map_err(|e| format!("stream {}: {e}", js.stream))?;
            if let Some(want) = &js.create {
                let have = &info.config;
                let mut problems = Vec::new();
                for subj in &want.subjects {
                    if !have.subjects.contains(subj) {
                        problems.push(format!("subjects {:?} lack {subj:?}", have.subjects));
                    }
                }
                if have.duplicate_window != want.duplicate_window.get() {
                    problems.push(format!(
                        "duplicate_window is {:?}, the config asks {:?}",
                        have.duplicate_window,
                        want.duplicate_window.get()
                    ));
                }
                let storage = match want.storage {
                    Storage::File => stream::StorageType::File,
                    Storage::Memory => stream::StorageType::Memory,
                };
                if have.storage != storage {
                    problems.push(format!(
                        "storage is {:?}, the config asks {:?}",
                        have.storage, storage
                    ));
                }
                if !problems.is_empty() {
                    return Err(format!(
                        "stream {} exists with incompatible settings: {}; change the config or the stream",
                        js.stream,
                        problems.join("; ")
                    ));
                }
            }
            Ok(())
        }
        Err(e) => {
            let Some(c) = &js.create else {
                return Err(format!(
                    "stream {} is not available ({e}); create it or set jetstream.create",
                    js.stream
                ));
            };
            context
                .create_stream(stream::Config {
                    name: js.stream.clone(),
                    subjects: c.subjects.clone(),
                    storage: match c.storage {
                        Storage::File => stream::StorageType::File,
                        Storage::Memory => stream::StorageType::Memory,
                    },
                    num_replicas: c.replicas,
                    duplicate_window: c.duplicate_window.get(),
                    retention: match c.retention {
                        Retention::Limits => stream::RetentionPolicy::Limits,
                        Retention::Interest => stream::RetentionPolicy::Interest,
                        Retention::Workqueue => stream::RetentionPolicy::WorkQueue,
                    },
                    max_age: c.max_age.map(HumanDuration::get).unwrap_or_default(),
                    max_messages: c.max_messages.unwrap_or(-1),
                    ..Default::default()
                })
                .await
                .map(|_| ())
                .map_err(|e| format!("cannot create stream {}: {e}", js.stream))
        }
    }
}

enum Publisher {
    JetStream(jetstream::Context),
    Core(async_nats::Client),
}

const CONTENT_TYPE: HeaderName = HeaderName::from_static("Content-Type");
const CE_SPECVERSION: HeaderName = HeaderName::from_static("ce-specversion");
const CE_ID: HeaderName = HeaderName::from_static("ce-id");
const CE_SOURCE: HeaderName = HeaderName::from_static("ce-source");
const CE_TYPE: HeaderName = HeaderName::from_static("ce-type");
const CE_DATACONTENTTYPE: HeaderName = HeaderName::from_static("ce-datacontenttype");
const CE_DATASCHEMA: HeaderName = HeaderName::from_static("ce-dataschema");
const CE_SUBJECT: HeaderName = HeaderName::from_static("ce-subject");
const CE_TIME: HeaderName = HeaderName::from_static("ce-time");

struct NatsSink {
    name: String,
    template: Template,
    fixed_subject: Option<async_nats::Subject>,
    mode: Mode,
    argo: bool,
    publisher: Publisher,
    window: usize,
    ack_timeout: StdDuration,
}

/// The `Nats-Msg-Id` of an event: its dedup key, so repeats within the stream's duplicate window
/// are dropped by JetStream itself, across our restarts and replicas.
pub fn msg_id(e: &Event) -> String {
    hex::encode(e.key().to_be_bytes())
}

/// The `Nats-Msg-Id` for `e`: the event id in Argo's EventBus form (Argo deduplicates by it),
/// unless it holds a line break, which no header value may (async-nats panics on one); else,
/// and always in Sluice's own form, the hashed key.
fn message_id(e: &Event, argo: bool) -> String {
    if argo && !e.id.contains(['\r', '\n']) {
        e.id.to_string()
    } else {
        msg_id(e)
    }
}

impl NatsSink {
    /// The subject for `e`: rendered, or the fixed one shared (no allocation per event).
    fn subject(&self, e: &Event) -> async_nats::Subject {
        match &self.fixed_subject {
            Some(s) => s.clone(),
            None => self.template.render(e).into(),
        }
    }

    /// Headers and payload for one event.
    fn encode(&self, e: &Event) -> (HeaderMap, Bytes) {
        let mut h = HeaderMap::new();
        h.insert(
            async_nats::header::NATS_MESSAGE_ID,
            message_id(e, self.argo),
        );
        match self.mode {
            Mode::Structured => {
                h.insert(CONTENT_TYPE, format::STRUCTURED_CONTENT_TYPE);
                (h, Bytes::from(format::encode_event(e)))
            }
            Mode::Binary => {
                // Fixed names are static (no allocation per event); values are moved in.
                let mut put = |k: HeaderName, v: &str| {
                    h.insert(k, percent_encode_value(v).into_owned());
                };
                put(CE_SPECVERSION, "1.0");
                put(CE_ID, &e.id);
                put(CE_SOURCE, &e.source);
                put(CE_TYPE, &e.ty);
                if let Some(v) = &e.datacontenttype {
                    put(CE_DATACONTENTTYPE, v);
                }
                if let Some(v) = &e.dataschema {
                    put(CE_DATASCHEMA, v);
                }
                if let Some(v) = &e.subject {
                    put(CE_SUBJECT, v);
                }
                if let Some(v) = &e.time {
                    put(CE_TIME, Timestamp::as_str(v));
                }
                for (n, v) in &e.extensions {
                    h.insert(
                        format!("ce-{n}").as_str(),
                        percent_encode_value(&v.to_canonical()).into_owned(),
                    );
                }
                (h, e.data.as_bytes().cloned().unwrap_or_default())
            }
        }
    }

    async fn run(self, ctx: SinkContext) -> Result<(), ConnectorError> {
        match &self.publisher {
            Publisher::JetStream(js) => self.run_jetstream(js.clone(), ctx).await,
            Publisher::Core(client) => self.run_core(client.clone(), ctx).await,
        }
    }

    /// Pipelined: up to `window` publishes await their PubAck at once; each event is delivered
    /// on its own PubAck (a duplicate PubAck counts: the stream has the message).
    async fn run_jetstream(
        &self,
        js: jetstream::Context,
        mut ctx: SinkContext,
    ) -> Result<(), ConnectorError> {
        type Acking = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
        let mut batch: Vec<SinkItem> = Vec::with_capacity(self.window);
        // Acks are independent: settle each as it arrives, so one slow PubAck holds no others.
        let mut in_flight: SinkWindow<Acking> = SinkWindow::new(self.window);
        loop {
            let input = &mut ctx.input;
            let step = in_flight
                .step(&ctx.grace_over, true, |room| {
                    input.recv_many(&mut batch, room)
                })
                .await;
            match step {
                // Grace over: stop taking events (those queued are reported failed on drop).
                Step::GraceOver => break,
                Step::Settled | Step::Idle => {}
                Step::Input(0) => break,
                Step::Input(_) => {
                    for SinkItem { event, delivery } in batch.drain(..) {
                        let subject = self.subject(&event);
                        let (headers, payload) = self.encode(&event);
                        match js.publish_with_headers(subject, headers, payload).await {
                            Ok(ack) => {
                                // The PubAck wait is bounded by the context's timeout, which
                                // build() set to ack_timeout: no second timer here.
                                in_flight.push(Box::pin(async move {
                                    let r = ack
                                        .await
                                        .map(drop)
                                        .map_err(|e| format!("JetStream did not acknowledge: {e}"));
                                    settle(delivery, r)
                                }));
                            }
                            // Too large for the server: no retry makes it fit.
                            Err(e)
                                if e.kind()
                                    == jetstream::context::PublishErrorKind::MaxPayloadExceeded =>
                            {
                                delivery.rejected(format!(
                                    "publish refused: {e} (the server's max_payload)"
                                ))
                            }
                            Err(e) => delivery.failed(format!("publish failed: {e}")),
                        }
                    }
                }
            }
        }
        // Drain: the outstanding PubAcks, each bounded by ack_timeout.
        in_flight.drain().await;
        tracing::debug!(sink = %self.name, "nats: stopped");
        Ok(())
    }

    /// Core NATS has no acknowledgement: a batch is delivered once the client flushed it to the
    /// server. Say so in the docs: the server may still drop it (no subscriber, slow consumer).
    async fn run_core(
        &self,
        client: async_nats::Client,
        mut ctx: SinkContext,
    ) -> Result<(), ConnectorError> {
        let mut batch: Vec<SinkItem> = Vec::with_capacity(self.window);
        loop {
            let n = tokio::select! {
                n = ctx.input.recv_many(&mut batch, self.window) => n,
                _ = ctx.grace_over.cancelled() => 0,
            };
            if n == 0 {
                return Ok(());
            }
            let mut sent = Vec::with_capacity(n);
            for SinkItem { event, delivery } in batch.drain(..) {
                let subject = self.subject(&event);
                let (headers, payload) = self.encode(&event);
                match client.publish_with_headers(subject, headers, payload).await {
                    Ok(()) => sent.push(delivery),
                    // Too large or a subject the client refuses: no retry helps.
                    Err(e)
                        if matches!(
                            e.kind(),
                            async_nats::client::PublishErrorKind::MaxPayloadExceeded
                                | async_nats::client::PublishErrorKind::InvalidSubject
                        ) =>
                    {
                        delivery.rejected(format!("publish refused: {e}"))
                    }
                    Err(e) => delivery.failed(format!("publish failed: {e}")),
                }
            }
            match tokio::time::timeout(self.ack_timeout, client.flush()).await {
                Ok(Ok(())) => sent.into_iter().for_each(Delivery::delivered),
                Ok(Err(e)) => sent
                    .into_iter()
                    .for_each(|d| d.failed(format!("flush failed: {e}"))),
                Err(_) => sent.into_iter().for_each(|d| d.failed("flush timed out")),
            }
        }
    }
}

fn settle(delivery: Delivery, result: Result<(), String>) {
    match result {
        Ok(()) => delivery.delivered(),
        Err(reason) => delivery.failed(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_argo_id_with_a_line_break_is_hashed_not_a_header_panic() {
        let plain = Event::new("abc-1", "/s", "t");
        assert_eq!(message_id(&plain, true), "abc-1");
        assert_eq!(message_id(&plain, false), msg_id(&plain));
        for id in ["a\nb", "a\r\nb", "\r"] {
            let e = Event::new(id, "/s", "t");
            let m = message_id(&e, true);
            assert_eq!(m, msg_id(&e), "{id:?}");
            let mut h = HeaderMap::new();
            h.insert(async_nats::header::NATS_MESSAGE_ID, m);
        }
    }
}
