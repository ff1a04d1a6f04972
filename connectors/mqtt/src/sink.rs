//! `kind: mqtt` sink: QoS 1 delivered on PUBACK, QoS 2 on PUBCOMP, QoS 0 once written.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use sluice_core::template::Template;
use sluice_core::units::HumanDuration;
use sluice_core::{
    format, BoxFuture, ConnectorError, Delivery, Running, SinkConfig, SinkContext, SinkItem,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::proto::{PollError, Polled, Props, Proto, Settings, V4, V5};
use crate::{binding, check_common, check_version, qos, reconnect_delay, AuthConfig, TlsConfig};

/// What a sink publishes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Payload {
    /// The structured JSON CloudEvent (the MQTT 3.1.1 binding, default).
    #[default]
    Event,
    /// The event's data alone.
    Data,
    /// MQTT 5 binary mode: the data as the payload, the attributes as user properties, the
    /// content type as the Content Type property.
    Binary,
}

/// `kind: mqtt` sink options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttSinkConfig {
    #[serde(default = "crate::default_url")]
    pub url: String,
    /// The MQTT protocol level: 4 (MQTT 3.1.1, default) or 5.
    #[serde(default = "four")]
    pub protocol_version: u8,
    /// The topic, a template over event attributes. Default `events/{type}`.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// 0 (delivered once written to the connection), 1 (default: on PUBACK), 2 (on PUBCOMP).
    #[serde(default = "one")]
    pub qos: u8,
    #[serde(default)]
    pub retain: bool,
    #[serde(default)]
    pub payload: Payload,
    /// Default `sluice-<sink name>`.
    pub client_id: Option<String>,
    /// Publishes awaiting their acknowledgement at once. Default 100.
    #[serde(default = "default_window")]
    pub max_in_flight: u16,
    /// How long an acknowledgement may take before the event counts as failed. Default 10s.
    #[serde(default = "ten_seconds")]
    pub timeout: HumanDuration,
    #[serde(default = "thirty_seconds")]
    pub keep_alive: HumanDuration,
    pub auth: Option<AuthConfig>,
    pub tls: Option<TlsConfig>,
}

fn default_topic() -> String {
    "events/{type}".into()
}
fn one() -> u8 {
    1
}
fn four() -> u8 {
    4
}
fn default_window() -> u16 {
    100
}
fn ten_seconds() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn thirty_seconds() -> HumanDuration {
    HumanDuration::from_secs(30)
}

impl MqttSinkConfig {
    fn client_id(&self, name: &str) -> String {
        self.client_id
            .clone()
            .unwrap_or_else(|| format!("sluice-{name}"))
    }
}

impl SinkConfig for MqttSinkConfig {
    fn validate(&self, name: &str) -> Result<(), String> {
        check_common(&self.url, &self.client_id(name), self.tls.as_ref())?;
        check_version(self.protocol_version)?;
        if self.payload == Payload::Binary && self.protocol_version != 5 {
            return Err("payload: binary needs MQTT 5 (protocol_version: 5): MQTT 3.1.1 has no properties to carry the attributes".into());
        }
        qos(self.qos)?;
        Template::parse("topic", &self.topic)?;
        if self.topic.contains(['+', '#']) {
            return Err(format!(
                "topic {:?}: wildcards are for subscriptions, not for publishing",
                self.topic
            ));
        }
        if self.max_in_flight == 0 {
            return Err("max_in_flight must be at least 1".into());
        }
        Ok(())
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        if self.protocol_version == 5 {
            Box::pin(start::<V5>(*self, ctx))
        } else {
            Box::pin(start::<V4>(*self, ctx))
        }
    }
}

async fn start<P: Proto>(cfg: MqttSinkConfig, ctx: SinkContext) -> Result<Running, ConnectorError> {
    let name = ctx.name.clone();
    let err = |m: String| ConnectorError(format!("mqtt sink {name}: {m}"));
    // A clean session: every connection starts with a fresh client and nothing carried over
    // (what was in flight when a connection dropped is reported failed, and the source upstream
    // retries it), so packet ids never have to be matched across connections.
    let mut opts = P::options(&Settings {
        url: &cfg.url,
        client_id: &cfg.client_id(&name),
        keep_alive: cfg.keep_alive.get(),
        clean: true,
        session_expiry: Duration::ZERO,
        auth: cfg.auth.as_ref(),
        tls: cfg.tls.as_ref(),
        manual_acks: false,
    })
    .map_err(err)?;
    P::set_inflight(&mut opts, cfg.max_in_flight);
    qos(cfg.qos).map_err(err)?;
    let sink = MqttSink::<P> {
        template: Template::parse("topic", &cfg.topic).map_err(err)?,
        qos: cfg.qos,
        name: name.clone(),
        opts,
        cfg,
    };
    // Built means connected.
    let conn = sink.connect().await.map_err(err)?;
    Ok(Box::pin(sink.run(conn, ctx)) as Running)
}

struct Waiting {
    delivery: Delivery,
    deadline: Instant,
    _permit: OwnedSemaphorePermit,
}

/// Publishes of one connection between the request and the broker's acknowledgement. The
/// client writes publishes in request order and reports each with its packet id, so the queue
/// is matched in order.
#[derive(Default)]
struct Tracker {
    queued: VecDeque<Waiting>,
    by_pkid: HashMap<u16, Waiting>,
}

impl Tracker {
    fn fail_all(&mut self, why: &str) {
        for w in self
            .queued
            .drain(..)
            .chain(self.by_pkid.drain().map(|(_, w)| w))
        {
            w.delivery.failed(why.to_owned());
        }
    }

    fn is_empty(&self) -> bool {
        self.queued.is_empty() && self.by_pkid.is_empty()
    }

    /// Whether anything waited past its deadline.
    fn overdue(&self, now: Instant) -> bool {
        self.queued.front().is_some_and(|w| w.deadline <= now)
            || self.by_pkid.values().any(|w| w.deadline <= now)
    }
}

/// One connection: its client, its tracker, the task that drives it.
struct Conn<P: Proto> {
    client: P::Client,
    tracker: Arc<Mutex<Tracker>>,
    pump: tokio::task::JoinHandle<()>,
}

impl<P: Proto> Conn<P> {
    /// Ends the connection and fails what it still had in flight.
    fn close(self, why: &str) {
        self.pump.abort();
        lock(&self.tracker).fail_all(why);
    }
}

fn lock(t: &Mutex<Tracker>) -> std::sync::MutexGuard<'_, Tracker> {
    t.lock().unwrap_or_else(|p| p.into_inner())
}

struct MqttSink<P: Proto> {
    name: String,
    cfg: MqttSinkConfig,
    opts: P::Options,
    template: Template,
    qos: u8,
}

impl<P: Proto> MqttSink<P> {
    async fn connect(&self) -> Result<Conn<P>, String> {
        let (client, mut eventloop) =
            P::client(self.opts.clone(), self.cfg.max_in_flight as usize + 16);
        let connected = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match P::poll(&mut eventloop).await {
                    Ok(Polled::ConnAck { refused: None, .. }) => return Ok(()),
                    Ok(Polled::ConnAck {
                        refused: Some(why), ..
                    }) => return Err(why),
                    Ok(_) => {}
                    Err(PollError::Done) => {
                        return Err("cannot connect (the client stopped)".into())
                    }
                    Err(PollError::Lost(e)) => return Err(format!("cannot connect ({e})")),
                }
            }
        })
        .await
        .map_err(|_| {
            format!(
                "no answer from {} within 10s; is the broker up?",
                self.cfg.url
            )
        })?;
        connected?;
        let tracker = Arc::new(Mutex::new(Tracker::default()));
        let pump = tokio::spawn(pump::<P>(
            eventloop,
            tracker.clone(),
            self.qos,
            self.name.clone(),
        ));
        Ok(Conn {
            client,
            tracker,
            pump,
        })
    }

    async fn run(self, first: Conn<P>, mut ctx: SinkContext) -> Result<(), ConnectorError> {
        let window = Arc::new(Semaphore::new(self.cfg.max_in_flight as usize));
        let mut conn = Some(first);
        let mut next_attempt = Instant::now();
        let mut attempts = 0u32;
        let mut sweep = tokio::time::interval(Duration::from_millis(100));
        let mut batch: Vec<SinkItem> = Vec::new();
        loop {
            // A connection whose task ended (the connection dropped) or that let a publish wait
            // past its deadline is done: what it had in flight is failed.
            let broken = conn
                .as_ref()
                .is_some_and(|c| c.pump.is_finished() || lock(&c.tracker).overdue(Instant::now()));
            if broken {
                tracing::warn!(sink = %self.name, "mqtt: connection lost or not acknowledging; reconnecting (what was in flight is failed)");
                if let Some(c) = conn.take() {
                    c.close("the connection to the broker was lost before its acknowledgement");
                }
                next_attempt = Instant::now() + reconnect_delay(attempts);
                attempts += 1;
            }
            if conn.is_none() && Instant::now() >= next_attempt {
                match self.connect().await {
                    Ok(c) => {
                        tracing::info!(sink = %self.name, "mqtt: reconnected");
                        attempts = 0;
                        conn = Some(c);
                    }
                    Err(e) => {
                        tracing::warn!(sink = %self.name, error = %e, "mqtt: reconnect failed");
                        next_attempt = Instant::now() + reconnect_delay(attempts);
                        attempts += 1;
                    }
                }
            }
            let permit = tokio::select! {
                p = window.clone().acquire_owned() => p.expect("never closed"),
                _ = sweep.tick() => continue,
                _ = ctx.grace_over.cancelled() => break,
            };
            let n = tokio::select! {
                n = ctx.input.recv_many(&mut batch, 1) => n,
                _ = sweep.tick() => continue,
                _ = ctx.grace_over.cancelled() => break,
            };
            if n == 0 {
                break;
            }
            let SinkItem { event, delivery } = batch.pop().expect("one item");
            let topic = self.template.render_with(&event, |out, v| out.push_str(v));
            if topic.is_empty() || topic.contains(['+', '#']) {
                delivery.rejected(format!(
                    "topic {topic:?} is not a valid MQTT topic name (empty or with a wildcard)"
                ));
                continue;
            }
            if topic.len() > crate::proto::MAX_STRING {
                delivery.rejected(format!(
                    "the topic is {} bytes; MQTT topics hold at most 65535",
                    topic.len()
                ));
                continue;
            }
            let Some(c) = &conn else {
                delivery.failed("not connected to the broker (reconnecting)");
                continue;
            };
            let (props, body) = match self.cfg.payload {
                Payload::Event => {
                    let props = Props {
                        content_type: (P::VERSION == 5)
                            .then(|| format!("{}; charset=utf-8", format::STRUCTURED_CONTENT_TYPE)),
                        ..Props::default()
                    };
                    (props, Bytes::from(format::encode_event(&event)))
                }
                Payload::Data => {
                    let props = Props {
                        content_type: event.datacontenttype.clone().filter(|_| P::VERSION == 5),
                        ..Props::default()
                    };
                    (props, event.data.as_bytes().cloned().unwrap_or_default())
                }
                Payload::Binary => binding::encode_binary(&event),
            };
            if let Some(why) = props.too_long() {
                delivery.rejected(why);
                continue;
            }
            // Queued before the request, so the client cannot report it first.
            lock(&c.tracker).queued.push_back(Waiting {
                delivery,
                deadline: Instant::now() + self.cfg.timeout.get(),
                _permit: permit,
            });
            if let Err(e) =
                P::publish(&c.client, topic, self.qos, self.cfg.retain, body, props).await
            {
                if let Some(w) = lock(&c.tracker).queued.pop_back() {
                    w.delivery
                        .failed(format!("publish refused by the client: {e}"));
                }
            }
        }
        // Drain: wait for what is in flight, each bounded by its deadline.
        if let Some(c) = conn.take() {
            loop {
                let (empty, overdue) = {
                    let t = lock(&c.tracker);
                    (t.is_empty(), t.overdue(Instant::now()))
                };
                if empty || overdue || c.pump.is_finished() || ctx.grace_over.is_cancelled() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            P::disconnect(&c.client).await;
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                while !c.pump.is_finished() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await;
            c.close("the sink stopped before the broker acknowledged it");
        }
        tracing::debug!(sink = %self.name, "mqtt: stopped");
        Ok(())
    }
}

/// Drives one connection and matches acknowledgements; returns when it drops.
async fn pump<P: Proto>(
    mut eventloop: P::EventLoop,
    tracker: Arc<Mutex<Tracker>>,
    qos: u8,
    name: String,
) {
    loop {
        match P::poll(&mut eventloop).await {
            Ok(Polled::Sent(pkid)) => {
                let mut t = lock(&tracker);
                if let Some(w) = t.queued.pop_front() {
                    if qos == 0 {
                        w.delivery.delivered();
                    } else {
                        t.by_pkid.insert(pkid, w);
                    }
                }
            }
            Ok(Polled::Acked { pkid, refused }) => {
                if let Some(w) = lock(&tracker).by_pkid.remove(&pkid) {
                    match refused {
                        None => w.delivery.delivered(),
                        Some(r) if r.permanent => w.delivery.rejected(r.why),
                        Some(r) => w.delivery.failed(r.why),
                    }
                }
            }
            Ok(Polled::Disconnected) => return,
            Ok(_) => {}
            Err(PollError::Done) => return,
            Err(PollError::Lost(e)) => {
                tracing::warn!(sink = %name, error = %e, "mqtt: connection lost");
                return;
            }
        }
    }
}
