//! `kind: mqtt` sink: QoS 1 delivered on PUBACK, QoS 2 on PUBCOMP, QoS 0 once written.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::{AsyncClient, Event as MqttEvent, EventLoop, Outgoing, Packet, QoS};
use serde::Deserialize;
use sluice_core::template::Template;
use sluice_core::units::HumanDuration;
use sluice_core::{
    format, BoxFuture, ConnectorError, Delivery, Running, SinkConfig, SinkContext, SinkItem,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::{check_common, options, qos, reconnect_delay, AuthConfig, TlsConfig};

/// What a sink publishes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Payload {
    /// The structured JSON CloudEvent (the MQTT 3.1.1 binding, default).
    #[default]
    Event,
    /// The event's data alone.
    Data,
}

/// `kind: mqtt` sink options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttSinkConfig {
    #[serde(default = "crate::default_url")]
    pub url: String,
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
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("mqtt sink {name}: {m}"));
            // A publisher keeps no subscriptions: a clean session, and what it had in flight is
            // resent by the client after a reconnect.
            let mut opts = options(
                &self.url,
                &self.client_id(&name),
                self.keep_alive.get(),
                true,
                self.auth.as_ref(),
                self.tls.as_ref(),
            )
            .map_err(err)?;
            opts.set_inflight(self.max_in_flight);
            let (client, mut eventloop) = AsyncClient::new(opts, self.max_in_flight as usize + 16);
            // Built means connected.
            let connected = tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    match eventloop.poll().await {
                        Ok(MqttEvent::Incoming(Packet::ConnAck(_))) => return Ok(()),
                        Ok(_) => {}
                        Err(e) => return Err(format!("cannot connect ({e})")),
                    }
                }
            })
            .await
            .map_err(|_| {
                err(format!(
                    "no answer from {} within 10s; is the broker up?",
                    self.url
                ))
            })?;
            connected.map_err(err)?;
            let sink = MqttSink {
                template: Template::parse("topic", &self.topic).map_err(err)?,
                qos: qos(self.qos).map_err(err)?,
                name,
                cfg: *self,
            };
            Ok(Box::pin(sink.run(client, eventloop, ctx)) as Running)
        })
    }
}

struct Waiting {
    delivery: Delivery,
    deadline: Instant,
    _permit: OwnedSemaphorePermit,
}

/// Publishes between the request and the broker's acknowledgement. The client writes publishes
/// in request order and reports each with its packet id, so the queue is matched in order; a
/// publish the client resends after a reconnect keeps its packet id and is not matched again.
/// A publish whose wait expired stays known by its packet id until the broker acknowledges it
/// (the client keeps resending it), so that its resends are not taken for new publishes.
#[derive(Default)]
struct Tracker {
    queued: VecDeque<Waiting>,
    by_pkid: HashMap<u16, Waiting>,
    expired: std::collections::HashSet<u16>,
}

struct MqttSink {
    name: String,
    cfg: MqttSinkConfig,
    template: Template,
    qos: QoS,
}

impl MqttSink {
    async fn run(
        self,
        client: AsyncClient,
        eventloop: EventLoop,
        mut ctx: SinkContext,
    ) -> Result<(), ConnectorError> {
        let tracker = Arc::new(Mutex::new(Tracker::default()));
        let window = Arc::new(Semaphore::new(self.cfg.max_in_flight as usize));
        let pump = tokio::spawn(pump(
            eventloop,
            tracker.clone(),
            self.qos,
            self.name.clone(),
        ));
        let mut sweep = tokio::time::interval(Duration::from_millis(250));
        let mut batch: Vec<SinkItem> = Vec::new();
        loop {
            let permit = tokio::select! {
                p = window.clone().acquire_owned() => p.expect("never closed"),
                _ = ctx.grace_over.cancelled() => break,
            };
            let n = tokio::select! {
                n = ctx.input.recv_many(&mut batch, 1) => n,
                _ = sweep.tick() => { expire(&tracker); continue; }
                _ = ctx.grace_over.cancelled() => break,
            };
            if n == 0 {
                break;
            }
            let SinkItem { event, delivery } = batch.pop().expect("one item");
            let topic = self.template.render_with(&event, |out, v| out.push_str(v));
            let body = match self.cfg.payload {
                Payload::Event => format::encode_event(&event),
                Payload::Data => event
                    .data
                    .as_bytes()
                    .map(|b| b.to_vec())
                    .unwrap_or_default(),
            };
            // Queued before the request, so the client cannot report it first.
            tracker
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .queued
                .push_back(Waiting {
                    delivery,
                    deadline: Instant::now() + self.cfg.timeout.get(),
                    _permit: permit,
                });
            if let Err(e) = client.publish(topic, self.qos, self.cfg.retain, body).await {
                if let Some(w) = tracker
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .queued
                    .pop_back()
                {
                    w.delivery
                        .failed(format!("publish refused by the client: {e}"));
                }
            }
        }
        // Drain: wait for what is in flight, each bounded by its deadline.
        loop {
            expire(&tracker);
            let empty = {
                let t = tracker.lock().unwrap_or_else(|p| p.into_inner());
                t.queued.is_empty() && t.by_pkid.is_empty()
            };
            if empty || ctx.grace_over.is_cancelled() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = client.disconnect().await;
        let _ = tokio::time::timeout(Duration::from_secs(5), pump).await;
        // Whatever is left is dropped and reported failed by the deliveries themselves.
        tracing::debug!(sink = %self.name, "mqtt: stopped");
        Ok(())
    }
}

/// Fails what waited past its deadline.
fn expire(tracker: &Mutex<Tracker>) {
    let now = Instant::now();
    let mut t = tracker.lock().unwrap_or_else(|p| p.into_inner());
    let late: Vec<u16> = t
        .by_pkid
        .iter()
        .filter(|(_, w)| w.deadline <= now)
        .map(|(k, _)| *k)
        .collect();
    for k in late {
        if let Some(w) = t.by_pkid.remove(&k) {
            w.delivery
                .failed("no acknowledgement from the broker in time");
            t.expired.insert(k);
        }
    }
    while t.queued.front().is_some_and(|w| w.deadline <= now) {
        if let Some(w) = t.queued.pop_front() {
            w.delivery
                .failed("not sent to the broker in time (disconnected?)");
        }
    }
}

async fn pump(mut eventloop: EventLoop, tracker: Arc<Mutex<Tracker>>, qos: QoS, name: String) {
    let mut attempts = 0u32;
    loop {
        match eventloop.poll().await {
            Ok(MqttEvent::Outgoing(Outgoing::Publish(pkid))) => {
                attempts = 0;
                let mut t = tracker.lock().unwrap_or_else(|p| p.into_inner());
                if qos == QoS::AtMostOnce {
                    if let Some(w) = t.queued.pop_front() {
                        w.delivery.delivered();
                    }
                } else if !t.by_pkid.contains_key(&pkid) && !t.expired.contains(&pkid) {
                    if let Some(w) = t.queued.pop_front() {
                        t.by_pkid.insert(pkid, w);
                    }
                }
            }
            Ok(MqttEvent::Incoming(Packet::PubAck(rumqttc::PubAck { pkid })))
            | Ok(MqttEvent::Incoming(Packet::PubComp(rumqttc::PubComp { pkid }))) => {
                let mut t = tracker.lock().unwrap_or_else(|p| p.into_inner());
                t.expired.remove(&pkid);
                if let Some(w) = t.by_pkid.remove(&pkid) {
                    w.delivery.delivered();
                }
            }
            Ok(MqttEvent::Outgoing(Outgoing::Disconnect)) => return,
            Ok(_) => {}
            Err(rumqttc::ConnectionError::RequestsDone) => return,
            Err(e) => {
                tracing::warn!(sink = %name, error = %e, "mqtt: connection lost; reconnecting (unacknowledged publishes are resent)");
                tokio::time::sleep(reconnect_delay(attempts)).await;
                attempts += 1;
            }
        }
    }
}
