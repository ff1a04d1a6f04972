//! `kind: jetstream` (a durable pull consumer, acknowledged after delivery) and `kind: nats`
//! (a core NATS subscription: at-most-once, since core NATS has no acknowledgement).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, AckKind};
use async_nats::Subject;
use bytes::Bytes;
use futures_util::StreamExt;
use serde::Deserialize;
use sluice_core::event::{Data, Event, EventError, Timestamp};
use sluice_core::pipeline::SendOptions;
use sluice_core::pull::{Backoff, InFlight};
use sluice_core::telemetry::{PullTelemetry, Settled, EVENTS_DROPPED};
use sluice_core::units::HumanDuration;
use sluice_core::{
    argo, format, BoxFuture, ConnectorError, Outcome, Running, SourceConfig, SourceContext, Status,
};

use crate::binding::{self, Decoded};
use crate::{check_auth_tls, connect_with, AuthConfig, Format, TlsConfig};

/// Where a newly created consumer starts (`deliver:`; ignored for an existing consumer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Deliver {
    /// Every message the stream holds (default).
    #[default]
    All,
    /// Only messages published after the consumer was created.
    New,
    /// The last message of the stream, then new ones.
    Last,
}

/// `kind: jetstream` options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JetStreamSourceConfig {
    /// Server URL(s), comma-separated. Default `nats://127.0.0.1:4222`.
    #[serde(default = "crate::default_url")]
    pub url: String,
    /// The stream to consume. Required (`argo-eventbus`: default `default`).
    pub stream: Option<String>,
    /// The durable pull consumer's name. Default: the source's name.
    pub consumer: Option<String>,
    /// Subjects of the stream to consume (empty: all of them).
    #[serde(default)]
    pub filter_subjects: Vec<String>,
    /// How long JetStream waits for an acknowledgement before it redelivers. Messages still in
    /// the pipeline get a progress ack (`+WPI`) once half of it has passed. Default 30s.
    #[serde(default = "thirty_seconds")]
    pub ack_wait: HumanDuration,
    /// Messages in flight at once; the consumer's `max_ack_pending`. Default 1000.
    #[serde(default = "default_window")]
    pub max_in_flight: usize,
    /// Create the consumer when it does not exist (default true). An existing consumer is
    /// checked against this config either way, with an error naming what differs.
    #[serde(default = "yes")]
    pub create: bool,
    /// Where a created consumer starts: `all` (default), `new`, `last`.
    #[serde(default)]
    pub deliver: Deliver,
    /// Deliveries of one message before JetStream gives up on it (default: unlimited).
    pub max_deliver: Option<i64>,
    /// `cloudevents` (default: the NATS binding, plain messages wrapped) or `argo-eventbus`
    /// (read an Argo Events JetStream EventBus: structured CloudEvents JSON bodies).
    #[serde(default)]
    pub format: Format,
    /// `type` of events made from plain messages. Default `jetstream`.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// `source` of events made from plain messages. Default: the source's name.
    #[serde(rename = "source")]
    pub event_source: Option<String>,
    pub auth: Option<AuthConfig>,
    pub tls: Option<TlsConfig>,
}

fn thirty_seconds() -> HumanDuration {
    HumanDuration::from_secs(30)
}
fn default_window() -> usize {
    1000
}
fn yes() -> bool {
    true
}

/// A consumer or stream name as JetStream allows it.
fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty()
        || name
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        return Err(format!(
            "{what} {name:?} is not a valid JetStream name (no spaces, '.', '*', '>', '/')"
        ));
    }
    Ok(())
}

impl JetStreamSourceConfig {
    fn stream_name(&self) -> Option<&str> {
        match (&self.stream, self.format) {
            (Some(s), _) => Some(s),
            (None, Format::ArgoEventbus) => Some("default"),
            (None, Format::Cloudevents) => None,
        }
    }
}

impl SourceConfig for JetStreamSourceConfig {
    fn validate(&self, name: &str) -> Result<(), String> {
        let Some(stream) = self.stream_name() else {
            return Err("stream is required: the JetStream stream to consume".into());
        };
        check_name("stream", stream)?;
        check_name("consumer", self.consumer.as_deref().unwrap_or(name))?;
        if self.max_in_flight == 0 || self.max_in_flight > 100_000 {
            return Err("max_in_flight must be between 1 and 100000".into());
        }
        if self.ack_wait.get() < Duration::from_secs(1) {
            return Err("ack_wait must be at least 1s".into());
        }
        if self.max_deliver.is_some_and(|n| n == 0 || n < -1) {
            return Err("max_deliver must be at least 1 (or -1: unlimited)".into());
        }
        sluice_core::event::check_source_and_type(
            self.event_source.as_deref().unwrap_or(name),
            self.event_type.as_deref().unwrap_or("jetstream"),
        )?;
        check_auth_tls(self.auth.as_ref(), self.tls.as_ref())
    }

    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("jetstream source {name}: {m}"));
            let stream_name = self.stream_name().unwrap_or("default").to_owned();
            let durable = self.consumer.clone().unwrap_or_else(|| name.clone());
            let client = connect_with(&self.url, self.auth.as_ref(), self.tls.as_ref(), |o| o)
                .await
                .map_err(err)?;
            let js = jetstream::new(client.clone());
            let consumer = ensure_consumer(&js, &stream_name, &durable, &self)
                .await
                .map_err(err)?;
            let source = JetStreamSource {
                ty: self
                    .event_type
                    .clone()
                    .unwrap_or_else(|| "jetstream".into()),
                source: self.event_source.clone().unwrap_or_else(|| name.clone()),
                argo: self.format == Format::ArgoEventbus,
                stream: stream_name,
                window: self.max_in_flight,
                ack_wait: self.ack_wait.get(),
                telemetry: PullTelemetry::new(&name),
                name,
                client,
            };
            Ok(Box::pin(source.run(consumer, ctx)) as Running)
        })
    }
}

async fn ensure_consumer(
    js: &jetstream::Context,
    stream_name: &str,
    durable: &str,
    cfg: &JetStreamSourceConfig,
) -> Result<consumer::PullConsumer, String> {
    let stream = js.get_stream(stream_name).await.map_err(|e| {
        format!(
            "stream {stream_name} is not available ({e}); create it (a nats sink with jetstream.create does) or fix `stream`"
        )
    })?;
    let want_filters = &cfg.filter_subjects;
    match stream.get_consumer::<consumer::pull::Config>(durable).await {
        Ok(c) => {
            let have = &c.cached_info().config;
            let mut problems = Vec::new();
            if have.ack_policy != consumer::AckPolicy::Explicit {
                problems.push(format!(
                    "ack_policy is {:?}, it must be explicit",
                    have.ack_policy
                ));
            }
            let mut have_filters: Vec<String> = have.filter_subjects.clone();
            if !have.filter_subject.is_empty() {
                have_filters.push(have.filter_subject.clone());
            }
            let mut a = have_filters.clone();
            let mut b = want_filters.clone();
            a.sort();
            b.sort();
            if a != b {
                problems.push(format!(
                    "filter subjects are {have_filters:?}, the config asks {want_filters:?}"
                ));
            }
            if have.max_ack_pending != cfg.max_in_flight as i64 {
                problems.push(format!(
                    "max_ack_pending is {}, max_in_flight asks {}",
                    have.max_ack_pending, cfg.max_in_flight
                ));
            }
            if have.ack_wait != cfg.ack_wait.get() {
                problems.push(format!(
                    "ack_wait is {:?}, the config asks {:?}",
                    have.ack_wait,
                    cfg.ack_wait.get()
                ));
            }
            if !problems.is_empty() {
                return Err(format!(
                    "consumer {durable} on stream {stream_name} exists with other settings: {}; change the config to match, or delete the consumer (nats consumer rm {stream_name} {durable}) so it is created anew",
                    problems.join("; ")
                ));
            }
            Ok(c)
        }
        Err(e) => {
            if !cfg.create {
                return Err(format!(
                    "consumer {durable} on stream {stream_name} is not available ({e}); create it or set create: true"
                ));
            }
            let (filter_subject, filter_subjects) = match want_filters.as_slice() {
                [one] => (one.clone(), Vec::new()),
                many => (String::new(), many.to_vec()),
            };
            stream
                .create_consumer(consumer::pull::Config {
                    durable_name: Some(durable.to_owned()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: cfg.ack_wait.get(),
                    max_ack_pending: cfg.max_in_flight as i64,
                    max_deliver: cfg.max_deliver.unwrap_or(-1),
                    filter_subject,
                    filter_subjects,
                    deliver_policy: match cfg.deliver {
                        Deliver::All => consumer::DeliverPolicy::All,
                        Deliver::New => consumer::DeliverPolicy::New,
                        Deliver::Last => consumer::DeliverPolicy::Last,
                    },
                    ..Default::default()
                })
                .await
                .map_err(|e| {
                    format!("cannot create consumer {durable} on stream {stream_name}: {e}")
                })
        }
    }
}

/// What settling one message upstream needs.
struct Handle {
    reply: Subject,
    delivered: i64,
}

/// A message taken from the consumer, with its JetStream metadata.
struct Received {
    h: Handle,
    seq: u64,
    /// When JetStream stored it, in Unix nanoseconds.
    published: i128,
    msg: async_nats::Message,
}

struct JetStreamSource {
    name: String,
    client: async_nats::Client,
    stream: String,
    ty: String,
    source: String,
    argo: bool,
    window: usize,
    ack_wait: Duration,
    telemetry: PullTelemetry,
}

impl JetStreamSource {
    fn to_event(&self, r: &Received) -> Result<Event, EventError> {
        let msg = &r.msg;
        if self.argo {
            return format::decode_event(&msg.payload);
        }
        match binding::decode(msg.headers.as_ref(), &msg.payload)? {
            Decoded::Event(e) => Ok(*e),
            Decoded::Plain => {
                let ct = binding::plain_content_type(msg.headers.as_ref());
                // id and time from JetStream: the same on every redelivery.
                let stored = chrono::DateTime::from_timestamp_nanos(r.published as i64);
                let mut e = Event::new(
                    format!("{}-{}", self.stream, r.seq),
                    &*self.source,
                    &*self.ty,
                )
                .with_subject(msg.subject.as_str())
                .with_time(Timestamp::from_utc(stored));
                if !msg.payload.is_empty() {
                    e = e.with_data(
                        ct.clone(),
                        Data::from_bytes(msg.payload.clone(), ct.as_deref()),
                    );
                }
                e.validate()?;
                Ok(e)
            }
        }
    }

    async fn run(
        self,
        consumer: consumer::PullConsumer,
        ctx: SourceContext,
    ) -> Result<(), ConnectorError> {
        let err = |m: String| ConnectorError(format!("jetstream source {}: {m}", self.name));
        let mut messages = Some(
            consumer
                .stream()
                .max_messages_per_batch(self.window.min(500))
                .heartbeat(Duration::from_secs(5))
                .expires(Duration::from_secs(30))
                .messages()
                .await
                .map_err(|e| err(format!("cannot start pulling: {e}")))?,
        );
        let mut window: InFlight<Handle> = InFlight::new(self.window, self.ack_wait);
        let mut stalled: Option<Received> = None;
        let check = (self.ack_wait / 4).max(Duration::from_millis(100));
        let mut leases = tokio::time::interval(check);
        leases.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tracing::info!(source = %self.name, stream = %self.stream, "jetstream: consuming");
        loop {
            if ctx.shutdown.is_cancelled() && messages.is_some() {
                // Stop pulling; what was received but not sent goes back at once: the one
                // waiting for room, and what the client already fetched.
                if let Some(r) = stalled.take() {
                    self.ack(r.h.reply, AckKind::Nak(None)).await;
                }
                if let Some(mut m) = messages.take() {
                    while let Some(Some(Ok(msg))) = futures_util::FutureExt::now_or_never(m.next())
                    {
                        if let Some(reply) = msg.message.reply.clone() {
                            self.ack(reply, AckKind::Nak(None)).await;
                        }
                    }
                }
            }
            if messages.is_none() && window.is_empty() {
                break;
            }
            if let Some(r) = stalled.take() {
                stalled = self.offer(&ctx, r, &mut window).await;
            }
            let pulling = messages.is_some() && stalled.is_none() && window.room() > 0;
            tokio::select! {
                biased;
                Some((h, outcome)) = window.next(), if !window.is_empty() => {
                    self.settle(h, outcome).await;
                    self.telemetry.in_flight.set(window.len() as f64);
                }
                _ = leases.tick() => {
                    let mut due = Vec::new();
                    window.extend_leases(self.ack_wait / 2, |h| due.push(h.reply.clone()));
                    // The message waiting for room in the pipeline is leased too.
                    if let Some(r) = &stalled {
                        due.push(r.h.reply.clone());
                    }
                    self.telemetry.lease_extensions.increment(due.len() as u64);
                    for reply in due {
                        self.ack(reply, AckKind::Progress).await;
                    }
                }
                _ = ctx.shutdown.cancelled(), if messages.is_some() => {}
                next = async { messages.as_mut().expect("pulling").next().await }, if pulling => {
                    match next {
                        Some(Ok(msg)) => {
                            let Ok(info) = msg.info().map(|i| (i.stream_sequence, i.delivered, i.pending, i.published.unix_timestamp_nanos())) else {
                                tracing::warn!(source = %self.name, "jetstream: a message without JetStream metadata; skipped");
                                continue;
                            };
                            let (seq, delivered, pending, published) = info;
                            let jetstream::Message { message, .. } = msg;
                            let Some(reply) = message.reply.clone() else { continue };
                            self.telemetry.lag.set(pending as f64);
                            if delivered > 1 {
                                self.telemetry.redeliveries.increment(1);
                            }
                            let r = Received { h: Handle { reply, delivered }, seq, published, msg: message };
                            stalled = self.offer(&ctx, r, &mut window).await;
                        }
                        Some(Err(e)) => match e.kind() {
                            consumer::pull::MessagesErrorKind::MissingHeartbeat => {
                                tracing::debug!(source = %self.name, "jetstream: missed a heartbeat (paused or reconnecting)");
                            }
                            consumer::pull::MessagesErrorKind::ConsumerDeleted => {
                                return Err(err("the consumer was deleted; restart to create it again".into()));
                            }
                            _ => tracing::warn!(source = %self.name, error = %e, "jetstream: pull failed; retrying"),
                        },
                        None => return Err(err("the message stream ended; check the consumer's limits (max_batch, max_expires)".into())),
                    }
                }
            }
        }
        // The acks must reach the server before the connection goes.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.client.flush()).await;
        tracing::debug!(source = %self.name, "jetstream: stopped");
        Ok(())
    }

    /// Sends one message's event into the window. Waits at most a quarter of `ack_wait` for
    /// room, so that leases are extended while the pipeline is full; hands the message back
    /// when the pipeline stayed full.
    async fn offer(
        &self,
        ctx: &SourceContext,
        r: Received,
        window: &mut InFlight<Handle>,
    ) -> Option<Received> {
        let event = match self.to_event(&r) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(source = %self.name, seq = r.seq, error = %e, "jetstream: not a valid CloudEvent; terminated (JetStream will not redeliver it)");
                ctx.sender.telemetry().rejected("invalid_event", 1);
                self.ack(r.h.reply, AckKind::Term).await;
                self.telemetry.settled(Settled::Reject, 1);
                return None;
            }
        };
        let opts = SendOptions {
            timeout: Some((self.ack_wait / 4).max(Duration::from_millis(100))),
            ..SendOptions::default()
        };
        match ctx.sender.send_with(vec![event], opts).await {
            Ok(pending) => {
                window.push(r.h, pending);
                self.telemetry.in_flight.set(window.len() as f64);
                None
            }
            Err(_) => Some(r),
        }
    }

    async fn settle(&self, h: Handle, outcome: Outcome) {
        let (kind, how) = match outcome.status {
            Status::Delivered => (AckKind::Ack, Settled::Ack),
            // A copy in flight or a transient failure: back off, then JetStream redelivers
            // (a delivered copy is then answered as a duplicate).
            Status::InFlight | Status::Failed => (
                AckKind::Nak(Some(Backoff::RETRY.after(h.delivered.max(1) as u32))),
                Settled::Retry,
            ),
            Status::Rejected => {
                tracing::warn!(source = %self.name, reason = outcome.reason.as_deref().unwrap_or(""), "jetstream: event rejected by a sink; terminated");
                (AckKind::Term, Settled::Reject)
            }
        };
        self.ack(h.reply, kind).await;
        self.telemetry.settled(how, 1);
    }

    async fn ack(&self, reply: Subject, kind: AckKind) {
        if let Err(e) = self.client.publish(reply, Bytes::from(kind)).await {
            tracing::warn!(source = %self.name, error = %e, "jetstream: acknowledgement not sent; the message will be redelivered after ack_wait");
        }
    }
}

/// `format:` of a core NATS source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CoreFormat {
    /// The CloudEvents NATS binding; plain messages are wrapped (default).
    #[default]
    Cloudevents,
    /// Argo Events' NATS event: type `nats`, data `{subject, body, header, metadata}`.
    Argo,
}

/// `kind: nats` source options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsSourceConfig {
    #[serde(default = "crate::default_url")]
    pub url: String,
    /// The subject to subscribe to (wildcards allowed).
    pub subject: String,
    /// Join this queue group: each message goes to one member of the group.
    pub queue_group: Option<String>,
    /// Messages the client buffers while the pipeline is full; past it the client drops them
    /// and they are counted in `sluice_events_dropped_total{reason="slow_consumer"}`.
    /// Default 1024.
    #[serde(default = "default_buffer")]
    pub buffer: usize,
    #[serde(default)]
    pub format: CoreFormat,
    /// `argo`: the payload is JSON and goes into `data.body` as is (else base64).
    #[serde(default)]
    pub json_body: bool,
    /// `argo`: `data.metadata`.
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// `type` of events made from plain messages. Default `nats`.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// `source` of events made from plain messages. Default: the source's name.
    #[serde(rename = "source")]
    pub event_source: Option<String>,
    /// `argo`: the events' `subject` (Argo's event name; `subject` is what is subscribed to).
    /// Default: the source's name.
    #[serde(default)]
    pub event_subject: Option<String>,
    pub auth: Option<AuthConfig>,
    pub tls: Option<TlsConfig>,
}

fn default_buffer() -> usize {
    1024
}

impl SourceConfig for NatsSourceConfig {
    fn validate(&self, name: &str) -> Result<(), String> {
        sluice_core::event::check_source_and_type(
            self.event_source.as_deref().unwrap_or(name),
            self.event_type.as_deref().unwrap_or("nats"),
        )?;
        if self.subject.is_empty() || self.subject.contains(char::is_whitespace) {
            return Err(format!(
                "subject {:?} is not a valid NATS subject",
                self.subject
            ));
        }
        if self.buffer == 0 {
            return Err("buffer must be at least 1".into());
        }
        check_auth_tls(self.auth.as_ref(), self.tls.as_ref())
    }

    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("nats source {name}: {m}"));
            let dropped = metrics::counter!(EVENTS_DROPPED, "source" => name.clone(), "reason" => "slow_consumer");
            let buffer = self.buffer;
            let client = connect_with(&self.url, self.auth.as_ref(), self.tls.as_ref(), move |o| {
                o.subscription_capacity(buffer).event_callback(move |ev| {
                    let dropped = dropped.clone();
                    async move {
                        if let async_nats::Event::SlowConsumer(_) = ev {
                            dropped.increment(1);
                        }
                    }
                })
            })
            .await
            .map_err(err)?;
            let sub = match &self.queue_group {
                Some(g) => {
                    client
                        .queue_subscribe(self.subject.clone(), g.clone())
                        .await
                }
                None => client.subscribe(self.subject.clone()).await,
            }
            .map_err(|e| err(format!("cannot subscribe to {}: {e}", self.subject)))?;
            // Built means subscribed: the server has the SUB before the daemon reports ready.
            client
                .flush()
                .await
                .map_err(|e| err(format!("cannot subscribe to {}: {e}", self.subject)))?;
            let metadata = serde_json::to_vec(&self.metadata).unwrap_or_else(|_| b"{}".to_vec());
            let source = CoreSource {
                ty: self.event_type.clone().unwrap_or_else(|| "nats".into()),
                source: self.event_source.clone().unwrap_or_else(|| name.clone()),
                argo_subject: self.event_subject.clone().unwrap_or_else(|| name.clone()),
                format: self.format,
                json_body: self.json_body,
                metadata: Arc::from(metadata),
                name,
                _client: client,
            };
            Ok(Box::pin(source.run(sub, ctx)) as Running)
        })
    }
}

struct CoreSource {
    name: String,
    /// Held while the source runs, so the connection's life does not depend on what the
    /// subscriber happens to hold.
    _client: async_nats::Client,
    ty: String,
    source: String,
    /// `argo`: the events' subject.
    argo_subject: String,
    format: CoreFormat,
    json_body: bool,
    metadata: Arc<[u8]>,
}

impl CoreSource {
    /// Core NATS messages carry no stable id: `Nats-Msg-Id` when the publisher set one (then
    /// dedup applies), else a fresh UUIDv7 (and dedup is skipped for it).
    fn id(msg: &async_nats::Message) -> (String, bool) {
        match msg
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
        {
            Some(v) if !v.as_str().is_empty() => (v.as_str().to_owned(), false),
            _ => (sluice_core::event::new_event_id(), true),
        }
    }

    fn to_event(&self, msg: &async_nats::Message) -> Result<(Event, bool), EventError> {
        if self.format == CoreFormat::Argo {
            let (id, fresh) = Self::id(msg);
            let mut data = Vec::with_capacity(msg.payload.len() + 128);
            data.extend_from_slice(b"{\"subject\":");
            serde_json::to_writer(&mut data, msg.subject.as_str())
                .map_err(|e| EventError(e.to_string()))?;
            data.extend_from_slice(b",\"body\":");
            data.extend_from_slice(&argo::body(&msg.payload, self.json_body).map_err(EventError)?);
            if let Some(h) = msg.headers.as_ref().filter(|h| !h.is_empty()) {
                let map: std::collections::BTreeMap<&str, Vec<&str>> = h
                    .iter()
                    .map(|(k, v)| {
                        let k: &str = k.as_ref();
                        (k, v.iter().map(|x| x.as_str()).collect())
                    })
                    .collect();
                data.extend_from_slice(b",\"header\":");
                serde_json::to_writer(&mut data, &map).map_err(|e| EventError(e.to_string()))?;
            }
            data.extend_from_slice(b",\"metadata\":");
            data.extend_from_slice(&self.metadata);
            data.push(b'}');
            let e = Event::new(id, &*self.source, &*self.ty)
                .with_subject(&*self.argo_subject)
                .with_time(Timestamp::now())
                .with_json(data);
            return Ok((e, fresh));
        }
        match binding::decode(msg.headers.as_ref(), &msg.payload)? {
            Decoded::Event(e) => Ok((*e, false)),
            Decoded::Plain => {
                let (id, fresh) = Self::id(msg);
                let ct = binding::plain_content_type(msg.headers.as_ref());
                let mut e = Event::new(id, &*self.source, &*self.ty)
                    .with_subject(msg.subject.as_str())
                    .with_time(Timestamp::now());
                if !msg.payload.is_empty() {
                    e = e.with_data(
                        ct.clone(),
                        Data::from_bytes(msg.payload.clone(), ct.as_deref()),
                    );
                }
                e.validate()?;
                Ok((e, fresh))
            }
        }
    }

    async fn run(
        self,
        mut sub: async_nats::Subscriber,
        ctx: SourceContext,
    ) -> Result<(), ConnectorError> {
        tracing::info!(source = %self.name, "nats: subscribed (at-most-once: core NATS has no acknowledgement)");
        let mut draining = false;
        loop {
            let msg = tokio::select! {
                m = sub.next() => m,
                _ = ctx.shutdown.cancelled(), if !draining => {
                    // Stop the server sending; what the client buffered is still forwarded.
                    draining = true;
                    let _ = sub.unsubscribe().await;
                    continue;
                }
            };
            let Some(msg) = msg else { break };
            match self.to_event(&msg) {
                Ok((event, fresh)) => {
                    // Nothing upstream waits for the outcome: the sinks count their failures.
                    let opts = SendOptions {
                        skip_dedup: fresh,
                        ..SendOptions::default()
                    };
                    let _ = ctx.sender.send_with(vec![event], opts).await;
                }
                Err(e) => {
                    tracing::warn!(source = %self.name, subject = %msg.subject, error = %e, "nats: not a valid CloudEvent; dropped");
                    ctx.sender.telemetry().rejected("invalid_event", 1);
                }
            }
        }
        tracing::debug!(source = %self.name, "nats: stopped");
        Ok(())
    }
}
