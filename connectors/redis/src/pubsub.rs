//! `kind: redis`: Pub/Sub. Redis keeps nothing for a subscriber and has no acknowledgement, so
//! the source is at-most-once (messages published while it is disconnected, or dropped because
//! the pipeline is full, are gone; the drops are counted) and the sink's "delivered" means Redis
//! took the `PUBLISH`.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use redis::aio::ConnectionManager;
use redis::{RedisResult, Value};
use serde::Deserialize;
use sluice_core::event::{Data, Event, EventError, Timestamp};
use sluice_core::pipeline::SendOptions;
use sluice_core::telemetry::EVENTS_DROPPED;
use sluice_core::template::Template;
use sluice_core::units::HumanDuration;
use sluice_core::{
    format, BoxFuture, ConnectorError, Running, SinkConfig, SinkContext, SourceConfig,
    SourceContext,
};
use tokio::sync::mpsc;

use crate::entry::argo_pubsub_body;
use crate::{check_url, client, reconnect_delay, redact, Format, TlsConfig};

/// `kind: redis` source options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PubSubSourceConfig {
    #[serde(default = "crate::default_url")]
    pub url: String,
    /// Channels to `SUBSCRIBE` to.
    #[serde(default)]
    pub channels: Vec<String>,
    /// Glob patterns to `PSUBSCRIBE` to (`alerts.*`).
    #[serde(default)]
    pub patterns: Vec<String>,
    /// Messages held while the pipeline is full; past it messages are dropped and counted in
    /// `sluice_events_dropped_total{reason="slow_consumer"}`. Default 1024.
    #[serde(default = "default_buffer")]
    pub buffer: usize,
    /// `cloudevents` (default: a structured JSON CloudEvent is taken as it is, other payloads
    /// are wrapped) or `argo` (Argo Events' `redis` event: `{channel, pattern, body, metadata}`).
    #[serde(default)]
    pub format: Format,
    /// `argo`: the payload is JSON and goes into `data.body` as is (else as a string).
    #[serde(default)]
    pub json_body: bool,
    /// `argo`: `data.metadata`.
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// `type` of events made from plain messages. Default `redis`.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// `source` of events made from plain messages. Default: the source's name.
    #[serde(rename = "source")]
    pub event_source: Option<String>,
    /// `argo`: the events' `subject` (Argo's event name). Default: the source's name.
    #[serde(rename = "subject")]
    pub event_subject: Option<String>,
    pub tls: Option<TlsConfig>,
}

fn default_buffer() -> usize {
    1024
}

impl SourceConfig for PubSubSourceConfig {
    fn validate(&self, name: &str) -> Result<(), String> {
        check_url(&self.url, self.tls.as_ref())?;
        if self.channels.is_empty() && self.patterns.is_empty() {
            return Err("channels and patterns are both empty: name at least one channel (or pattern) to subscribe to".into());
        }
        if let Some(c) = self
            .channels
            .iter()
            .chain(&self.patterns)
            .find(|c| c.is_empty())
        {
            return Err(format!("channel {c:?} is empty"));
        }
        if self.buffer == 0 {
            return Err("buffer must be at least 1".into());
        }
        sluice_core::event::check_source_and_type(
            self.event_source.as_deref().unwrap_or(name),
            self.event_type.as_deref().unwrap_or("redis"),
        )
    }

    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("redis source {name}: {m}"));
            let client = client(&self.url, self.tls.as_ref()).map_err(err)?;
            // Built means subscribed: the daemon reports ready only once Redis has the
            // subscriptions.
            let first = subscribe(&client, &self.channels, &self.patterns)
                .await
                .map_err(|e| {
                    err(format!(
                        "cannot subscribe at {} ({e}); is Redis up?",
                        redact(&self.url)
                    ))
                })?;
            let source = PubSubSource {
                ty: self.event_type.clone().unwrap_or_else(|| "redis".into()),
                source: self.event_source.clone().unwrap_or_else(|| name.clone()),
                argo_subject: self.event_subject.clone().unwrap_or_else(|| name.clone()),
                argo: self.format == Format::Argo,
                json_body: self.json_body,
                metadata: serde_json::to_vec(&self.metadata).unwrap_or_else(|_| b"{}".to_vec()),
                name,
            };
            Ok(Box::pin(source.run(client, first, self, ctx)) as Running)
        })
    }
}

async fn subscribe(
    client: &redis::Client,
    channels: &[String],
    patterns: &[String],
) -> RedisResult<redis::aio::PubSub> {
    let connecting = client.get_async_pubsub();
    let mut ps = tokio::time::timeout(Duration::from_secs(5), connecting)
        .await
        .map_err(|_| redis::RedisError::from((redis::ErrorKind::Io, "connect timed out")))??;
    if !channels.is_empty() {
        ps.subscribe(channels).await?;
    }
    if !patterns.is_empty() {
        ps.psubscribe(patterns).await?;
    }
    Ok(ps)
}

/// One message as received.
struct Message {
    channel: String,
    pattern: Option<String>,
    payload: Bytes,
}

struct PubSubSource {
    name: String,
    ty: String,
    source: String,
    /// `argo`: the events' subject.
    argo_subject: String,
    argo: bool,
    json_body: bool,
    metadata: Vec<u8>,
}

impl PubSubSource {
    /// The event of a message, and whether its id was made up just now (then dedup is skipped).
    fn to_event(&self, m: &Message) -> Result<(Event, bool), EventError> {
        if self.argo {
            let mut data = Vec::with_capacity(m.payload.len() + 96);
            data.extend_from_slice(b"{\"channel\":");
            serde_json::to_writer(&mut data, &m.channel).map_err(|e| EventError(e.to_string()))?;
            data.extend_from_slice(b",\"pattern\":");
            serde_json::to_writer(&mut data, m.pattern.as_deref().unwrap_or(""))
                .map_err(|e| EventError(e.to_string()))?;
            data.extend_from_slice(b",\"body\":");
            data.extend_from_slice(
                &argo_pubsub_body(&m.payload, self.json_body).map_err(EventError)?,
            );
            data.extend_from_slice(b",\"metadata\":");
            data.extend_from_slice(&self.metadata);
            data.push(b'}');
            let e = Event::new(sluice_core::event::new_event_id(), &*self.source, &*self.ty)
                .with_subject(&*self.argo_subject)
                .with_time(Timestamp::now())
                .with_json(data);
            return Ok((e, true));
        }
        if format::looks_structured(&m.payload) {
            return format::decode_event(&m.payload).map(|e| (e, false));
        }
        let ct = sluice_core::event::guess_content_type(&m.payload);
        let mut e = Event::new(sluice_core::event::new_event_id(), &*self.source, &*self.ty)
            .with_subject(&*m.channel)
            .with_time(Timestamp::now());
        if !m.payload.is_empty() {
            e = e.with_data(
                Some(ct.into()),
                Data::from_bytes(m.payload.clone(), Some(ct)),
            );
        }
        e.validate()?;
        Ok((e, true))
    }

    async fn run(
        self,
        client: redis::Client,
        first: redis::aio::PubSub,
        cfg: Box<PubSubSourceConfig>,
        ctx: SourceContext,
    ) -> Result<(), ConnectorError> {
        let (tx, mut rx) = mpsc::channel::<Message>(cfg.buffer);
        let dropped = metrics::counter!(EVENTS_DROPPED, "source" => self.name.clone(), "reason" => "slow_consumer");
        let stop = ctx.shutdown.clone();
        let name = self.name.clone();
        let reader = tokio::spawn(async move {
            let mut ps = Some(first);
            let mut attempt = 0u32;
            loop {
                let Some(conn) = ps.take() else {
                    tokio::select! {
                        _ = tokio::time::sleep(reconnect_delay(attempt)) => {}
                        _ = stop.cancelled() => return,
                    }
                    attempt += 1;
                    match subscribe(&client, &cfg.channels, &cfg.patterns).await {
                        Ok(c) => {
                            tracing::info!(source = %name, "redis: subscribed again (messages published meanwhile are lost: Pub/Sub is at-most-once)");
                            ps = Some(c);
                        }
                        Err(e) => {
                            tracing::warn!(source = %name, error = %e, "redis: cannot subscribe; retrying")
                        }
                    }
                    continue;
                };
                attempt = 0;
                let mut stream = conn.into_on_message();
                loop {
                    let msg = tokio::select! {
                        m = stream.next() => m,
                        _ = stop.cancelled() => return,
                    };
                    let Some(msg) = msg else {
                        tracing::warn!(source = %name, "redis: the subscription connection was lost; reconnecting");
                        break;
                    };
                    let m = Message {
                        channel: msg.get_channel_name().to_owned(),
                        pattern: msg
                            .from_pattern()
                            .then(|| msg.get_pattern::<String>().ok())
                            .flatten(),
                        payload: Bytes::copy_from_slice(msg.get_payload_bytes()),
                    };
                    match tx.try_send(m) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(_)) => dropped.increment(1),
                        Err(mpsc::error::TrySendError::Closed(_)) => return,
                    }
                }
            }
        });
        tracing::info!(source = %self.name, "redis: subscribed (at-most-once: Redis Pub/Sub has no acknowledgement)");
        // Until the reader stops (at shutdown), then what it buffered is still forwarded.
        while let Some(m) = rx.recv().await {
            match self.to_event(&m) {
                Ok((event, fresh)) => {
                    let opts = SendOptions {
                        skip_dedup: fresh,
                        ..SendOptions::default()
                    };
                    // Nothing upstream waits for the outcome: the sinks count their failures.
                    let _ = ctx.sender.send_with(vec![event], opts).await;
                }
                Err(e) => {
                    tracing::warn!(source = %self.name, channel = %m.channel, error = %e, "redis: not a valid CloudEvent; dropped");
                    ctx.sender.telemetry().rejected("invalid_event", 1);
                }
            }
        }
        let _ = reader.await;
        tracing::debug!(source = %self.name, "redis: stopped");
        Ok(())
    }
}

/// What a Pub/Sub sink publishes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Payload {
    /// The structured JSON CloudEvent (default).
    #[default]
    Event,
    /// The event's data alone.
    Data,
}

/// `kind: redis` sink options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PubSubSinkConfig {
    #[serde(default = "crate::default_url")]
    pub url: String,
    /// The channel, a template over event attributes (`alerts.{type}`). Default `events`.
    #[serde(default = "default_channel")]
    pub channel: String,
    /// `event` (default: the structured JSON CloudEvent) or `data`.
    #[serde(default)]
    pub payload: Payload,
    /// Count a message delivered only when at least one subscriber received it (`PUBLISH`
    /// returned more than 0). Default false: Redis took it.
    #[serde(default)]
    pub require_subscriber: bool,
    /// `PUBLISH`es sent in one pipeline. Default 500.
    #[serde(default = "crate::default_batch")]
    pub batch: usize,
    /// How long a pipeline may take before its events count as failed. Default 5s.
    #[serde(default = "crate::five_seconds")]
    pub timeout: HumanDuration,
    pub tls: Option<TlsConfig>,
}

fn default_channel() -> String {
    "events".into()
}

impl SinkConfig for PubSubSinkConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        check_url(&self.url, self.tls.as_ref())?;
        Template::parse("channel", &self.channel)?;
        if self.batch == 0 || self.batch > 10_000 {
            return Err("batch must be between 1 and 10000".into());
        }
        Ok(())
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("redis sink {name}: {m}"));
            let conn = crate::managed(&self.url, self.tls.as_ref(), self.timeout.get())
                .await
                .map_err(err)?;
            let sink = PubSubSink {
                template: Template::parse("channel", &self.channel).map_err(err)?,
                payload: self.payload,
                require_subscriber: self.require_subscriber,
                batch: self.batch,
                name,
            };
            Ok(Box::pin(sink.run(conn, ctx)) as Running)
        })
    }
}

struct PubSubSink {
    name: String,
    template: Template,
    payload: Payload,
    require_subscriber: bool,
    batch: usize,
}

impl PubSubSink {
    async fn run(self, conn: ConnectionManager, ctx: SinkContext) -> Result<(), ConnectorError> {
        let name = self.name.clone();
        let require = self.require_subscriber;
        crate::run_pipelined(
            &name,
            "PUBLISH",
            conn,
            ctx,
            self.batch,
            |pipe, e| {
                let channel = self.template.render_with(e, |out, v| out.push_str(v));
                let body: Vec<u8> = match self.payload {
                    Payload::Event => format::encode_event(e),
                    Payload::Data => e.data.as_bytes().map(|b| b.to_vec()).unwrap_or_default(),
                };
                pipe.cmd("PUBLISH").arg(channel).arg(body);
            },
            move |reply| match reply {
                Value::Int(0) if require => {
                    Err("no subscriber received it (require_subscriber)".into())
                }
                Value::Int(_) => Ok(()),
                other => Err(format!("PUBLISH answered {other:?}")),
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_events_are_recognised() {
        assert!(format::looks_structured(
            br#" {"specversion":"1.0","id":"1"}"#
        ));
        assert!(!format::looks_structured(br#"{"a":1}"#));
        assert!(!format::looks_structured(b"specversion"));
    }
}
