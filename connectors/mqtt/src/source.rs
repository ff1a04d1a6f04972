//! `kind: mqtt` source: subscriptions acknowledged after delivery, in arrival order.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use sluice_core::event::{check_media_type, check_string, Data, Event, EventError, Str, Timestamp};
use sluice_core::pipeline::SendOptions;
use sluice_core::pull::{InFlight, RetryQueue, Watermark};
use sluice_core::telemetry::{PullTelemetry, Settled, EVENTS_DROPPED};
use sluice_core::units::HumanDuration;
use sluice_core::{
    argo, format, BoxFuture, ConnectorError, Running, SourceConfig, SourceContext, Status,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::proto::{PollError, Polled, Proto, Settings, View, V4, V5};
use crate::{binding, check_common, check_version, qos, reconnect_delay, AuthConfig, TlsConfig};

/// `format:` of an MQTT source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// CloudEvents are taken as they are (structured; with MQTT 5 also binary: user
    /// properties), other payloads wrapped (default).
    #[default]
    Cloudevents,
    /// Argo Events' MQTT event: type `mqtt`, data `{topic, messageId, body, metadata}`.
    Argo,
}

/// `kind: mqtt` source options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttSourceConfig {
    /// `mqtt://host:1883` or `mqtts://host:8883`. Default `mqtt://127.0.0.1:1883`.
    #[serde(default = "crate::default_url")]
    pub url: String,
    /// Topic filters to subscribe to (`+` and `#` wildcards).
    pub topics: Vec<String>,
    /// The MQTT protocol level: 4 (MQTT 3.1.1, default) or 5.
    #[serde(default = "four")]
    pub protocol_version: u8,
    /// MQTT 5 with `clean_session: false`: how long the broker keeps the session after a
    /// disconnect. Default: as long as it can (the largest expiry MQTT 5 has; 3.1.1 sessions
    /// have no expiry).
    pub session_expiry: Option<HumanDuration>,
    /// Subscription QoS: 0 (at most once: nothing to acknowledge) or 1 (default). 2 is refused
    /// (see the connector's page).
    #[serde(default = "one")]
    pub qos: u8,
    /// The client id; with a persistent session it names the session the broker keeps, so keep
    /// it stable and unique per replica. Default `sluice-<source name>`.
    pub client_id: Option<String>,
    /// `false` (default): a persistent session; the broker keeps the subscriptions and the
    /// QoS 1 messages not acknowledged, and sends them after a reconnect or restart.
    #[serde(default)]
    pub clean_session: bool,
    /// Default 30s.
    #[serde(default = "thirty_seconds")]
    pub keep_alive: HumanDuration,
    /// QoS 1 messages whose events are in the pipeline at once (also how many QoS 0 messages may
    /// wait for it before more are dropped). Default 1000. The
    /// broker's own limit (mosquitto: `max_inflight_messages`, 20 by default) bounds it too.
    #[serde(default = "default_window")]
    pub max_in_flight: usize,
    #[serde(default)]
    pub format: Format,
    /// `argo`: the payload is JSON and goes into `data.body` as is (else base64).
    #[serde(default)]
    pub json_body: bool,
    /// `argo`: `data.metadata`.
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// `type` of events made from plain messages. Default `mqtt`.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// `source` of events made from plain messages. Default: the source's name.
    #[serde(rename = "source")]
    pub event_source: Option<String>,
    /// `argo`: the events' `subject` (Argo's event name). Default: the source's name.
    #[serde(rename = "subject")]
    pub event_subject: Option<String>,
    pub auth: Option<AuthConfig>,
    pub tls: Option<TlsConfig>,
}

fn one() -> u8 {
    1
}
fn four() -> u8 {
    4
}
fn thirty_seconds() -> HumanDuration {
    HumanDuration::from_secs(30)
}
fn default_window() -> usize {
    1000
}

impl MqttSourceConfig {
    fn client_id(&self, name: &str) -> String {
        self.client_id
            .clone()
            .unwrap_or_else(|| format!("sluice-{name}"))
    }
}

fn check_filter(f: &str) -> Result<(), String> {
    let levels: Vec<&str> = f.split('/').collect();
    for (i, l) in levels.iter().enumerate() {
        let bad = (l.contains('#') && (*l != "#" || i != levels.len() - 1))
            || (l.contains('+') && *l != "+");
        if bad {
            return Err(format!(
                "topic filter {f:?}: `+` must be a whole level and `#` the whole last level"
            ));
        }
    }
    if f.is_empty() {
        return Err("a topic filter is empty".into());
    }
    Ok(())
}

impl SourceConfig for MqttSourceConfig {
    fn validate(&self, name: &str) -> Result<(), String> {
        check_common(&self.url, &self.client_id(name), self.tls.as_ref())?;
        check_version(self.protocol_version)?;
        if self.session_expiry.is_some() && (self.protocol_version != 5 || self.clean_session) {
            return Err(
                "session_expiry: applies to MQTT 5 (protocol_version: 5) with clean_session: false"
                    .into(),
            );
        }
        qos(self.qos)?;
        if self.qos == 2 {
            return Err("qos 2 subscriptions are not supported: the MQTT client cannot resume an exactly-once exchange after a reconnect (it refuses the broker's PUBREL); use qos 1 (repeats of CloudEvents are dropped by dedup)".into());
        }
        if self.topics.is_empty() {
            return Err("topics is empty: name at least one topic filter".into());
        }
        for t in &self.topics {
            check_filter(t)?;
        }
        if self.max_in_flight == 0 || self.max_in_flight > 65_535 {
            return Err("max_in_flight must be between 1 and 65535".into());
        }
        sluice_core::event::check_source_and_type(
            self.event_source.as_deref().unwrap_or(name),
            self.event_type.as_deref().unwrap_or("mqtt"),
        )
    }

    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        if self.protocol_version == 5 {
            Box::pin(start::<V5>(*self, ctx))
        } else {
            Box::pin(start::<V4>(*self, ctx))
        }
    }
}

async fn start<P: Proto>(
    cfg: MqttSourceConfig,
    ctx: SourceContext,
) -> Result<Running, ConnectorError> {
    let name = ctx.name.clone();
    let err = |m: String| ConnectorError(format!("mqtt source {name}: {m}"));
    let client_id = cfg.client_id(&name);
    let opts = P::options(&Settings {
        url: &cfg.url,
        client_id: &client_id,
        keep_alive: cfg.keep_alive.get(),
        clean: cfg.clean_session,
        session_expiry: cfg
            .session_expiry
            .map(HumanDuration::get)
            .unwrap_or(Duration::from_secs(u32::MAX as u64)),
        auth: cfg.auth.as_ref(),
        tls: cfg.tls.as_ref(),
        manual_acks: true,
    })
    .map_err(err)?;
    // Room for an acknowledgement of every message the packet id space lets the broker have
    // unacknowledged (65535); the source queues them without waiting either way.
    let capacity = 65_535 + 64;
    let (client, mut eventloop) = P::client(opts.clone(), capacity);
    let filters: Vec<(String, u8)> = cfg.topics.iter().map(|t| (t.clone(), cfg.qos)).collect();
    // Built means subscribed: connect and wait for the SUBACK, or with a kept session for the
    // CONNACK (its subscriptions are in force), 10 s at most.
    let mut early = Vec::new();
    let (session_present, suback_pending) = tokio::time::timeout(
        Duration::from_secs(10),
        connect::<P>(&client, &mut eventloop, &filters, true, &mut early),
    )
    .await
    .map_err(|_| {
        err(format!(
            "no answer from {} within 10s; is the broker up?",
            cfg.url
        ))
    })?
    .map_err(err)?;
    tracing::info!(source = %name, client_id = %client_id, session_present, suback_pending, topics = ?cfg.topics, protocol_version = P::VERSION, "mqtt: subscribed");
    let source = MqttSource {
        ty: cfg.event_type.clone().unwrap_or_else(|| "mqtt".into()),
        source: cfg.event_source.clone().unwrap_or_else(|| name.clone()),
        metadata: serde_json::to_vec(&cfg.metadata).unwrap_or_else(|_| b"{}".to_vec()),
        telemetry: PullTelemetry::new(&name),
        name,
        cfg,
    };
    let link = Link::<P> {
        opts,
        capacity,
        filters,
        resubscribe: suback_pending,
    };
    Ok(Box::pin(source.run::<P>(client, eventloop, link, early, ctx)) as Running)
}

/// Connects and subscribes; returns whether the broker had a session for this client and whether
/// a SUBACK is still to come, and collects the messages it sent meanwhile. With a session, it
/// returns at CONNACK (a persistent session's backlog arrives right after it), without waiting for
/// the SUBACK of a subscription sent again: `(true, true)`. `always_subscribe` false: a kept
/// session's subscriptions are left as they are.
async fn connect<P: Proto>(
    client: &P::Client,
    eventloop: &mut P::EventLoop,
    filters: &[(String, u8)],
    always_subscribe: bool,
    early: &mut Vec<P::Publish>,
) -> Result<(bool, bool), String> {
    let mut session_present = None;
    loop {
        match P::poll(eventloop).await {
            Ok(Polled::Publish(p)) => early.push(p),
            Ok(Polled::ConnAck {
                session_present: present,
                refused,
            }) => {
                if let Some(why) = refused {
                    return Err(why);
                }
                session_present = Some(present);
                if present && !always_subscribe {
                    // The broker kept the subscriptions (subscribing again would resend
                    // retained messages).
                    return Ok((true, false));
                }
                P::subscribe(client, filters.to_vec())
                    .await
                    .map_err(|e| format!("subscribe: {e}"))?;
                if present {
                    // The session's backlog comes next, ahead of the SUBACK, at the broker's
                    // pace (mosquitto 2.0 sends all of it at once). Waiting for the SUBACK here
                    // would read all of it into memory; the pump reads it as the source takes
                    // it, and reports a refused subscription when its SUBACK comes.
                    return Ok((true, true));
                }
            }
            Ok(Polled::SubAck { failed }) => {
                if let Some(i) = failed {
                    return Err(format!(
                        "the broker refused the subscription to {:?}; check the ACL for this user",
                        filters.get(i).map(|f| f.0.as_str()).unwrap_or("?")
                    ));
                }
                return Ok((session_present.unwrap_or(false), false));
            }
            Ok(_) => {}
            Err(PollError::Done) => return Err("cannot connect (the client stopped)".into()),
            Err(PollError::Lost(e)) => return Err(format!("cannot connect ({e})")),
        }
    }
}

enum Arrival<P: Proto> {
    Publish(P::Publish, u64),
    /// A new connection (generation) with its own client: acknowledgements of older ones are
    /// not sent (their client is gone with its connection; the broker resends those messages).
    Connected(u64, P::Client),
}

/// What opening another connection needs.
struct Link<P: Proto> {
    opts: P::Options,
    capacity: usize,
    filters: Vec<(String, u8)>,
    /// A subscription sent over a kept session has no SUBACK yet: the next connection sends it
    /// again even if the broker still has the session (the connection may have dropped before
    /// the broker read it).
    resubscribe: bool,
}

/// A QoS 1 message between arrival and acknowledgement.
struct Entry<P: Proto> {
    publish: P::Publish,
    generation: u64,
    /// The id and time made up for its event, kept so that a retry rebuilds the same event from
    /// the message (`None`: the message carries its own, a structured CloudEvent).
    minted: Option<Minted>,
    attempts: u32,
}

/// The parts of an event made from a plain message that are not in the message.
#[derive(Clone)]
struct Minted {
    id: String,
    time: Timestamp,
}

struct MqttSource {
    name: String,
    cfg: MqttSourceConfig,
    ty: String,
    source: String,
    metadata: Vec<u8>,
    telemetry: PullTelemetry,
}

impl MqttSource {
    /// The event of a message, and the id and time made up for it (`None`: the message is a
    /// CloudEvent with its own). A retry passes the ones made the first time.
    fn to_event(
        &self,
        p: &View<'_>,
        again: Option<&Minted>,
    ) -> Result<(Event, Option<Minted>), EventError> {
        let minted = again.cloned().unwrap_or_else(|| {
            let (id, time) = sluice_core::event::new_event_id_and_time();
            Minted { id, time }
        });
        let (id, time) = (minted.id.clone(), minted.time.clone());
        if self.cfg.format == Format::Argo {
            let mut data = Vec::with_capacity(p.payload.len() + 96);
            data.extend_from_slice(b"{\"topic\":");
            serde_json::to_writer(&mut data, &*p.topic).map_err(|e| EventError(e.to_string()))?;
            data.extend_from_slice(format!(",\"messageId\":{},\"body\":", p.pkid).as_bytes());
            data.extend_from_slice(&argo::body(p.payload, self.cfg.json_body).map_err(EventError)?);
            data.extend_from_slice(b",\"metadata\":");
            data.extend_from_slice(&self.metadata);
            data.push(b'}');
            let e = Event::new(id, &*self.source, &*self.ty)
                .with_subject(self.cfg.event_subject.as_deref().unwrap_or(&self.name))
                .with_time(time)
                .with_json(data);
            return Ok((e, Some(minted)));
        }
        match binding::decode(p)? {
            Some(e) => return Ok((e, None)),
            None if p.content_type.is_none() && format::looks_structured(p.payload) => {
                return format::decode_event(p.payload).map(|e| (e, None));
            }
            None => {}
        }
        // What came with the message is checked (its topic, and a v5 content type where there
        // is data for it to describe); the id and time are made here, `source` and `type` were
        // checked at `validate`.
        check_string("subject", &p.topic, true)?;
        // Set in place: each `with_*` moved the whole event again.
        let mut e = Event::new(id, &*self.source, &*self.ty);
        e.subject = Some(Str::new(&*p.topic));
        e.time = Some(time);
        if !p.payload.is_empty() {
            let ct = match p.content_type {
                Some(ct) => {
                    check_media_type(ct)?;
                    ct
                }
                None => sluice_core::event::guess_content_type(p.payload),
            };
            e.data = Data::from_bytes(Bytes::clone(p.payload), Some(ct));
            e.datacontenttype = Some(ct.into());
        }
        Ok((e, Some(minted)))
    }

    async fn run<P: Proto>(
        self,
        mut client: P::Client,
        eventloop: P::EventLoop,
        link: Link<P>,
        early: Vec<P::Publish>,
        ctx: SourceContext,
    ) -> Result<(), ConnectorError> {
        // Bounded: when the source holds back (its window is full), the connection task waits
        // here and stops reading, so the broker's sending is held back by TCP instead of piling
        // up in memory (a broker does not always keep to its in-flight limit: mosquitto 2.0
        // sent a 400 000-message backlog of a persistent session at once). The source never
        // waits on the connection task in turn: its acknowledgements are queued without
        // waiting (`try_ack`), and those that find the client's queue full wait in `unsent`
        // (rumqttc writes one request per turn of its loop, while it reads up to ten messages:
        // under a flood the acknowledgements fall behind; each waits as its packet id only).
        // QoS 0 messages past max_in_flight queued are dropped (`queued0`).
        // As large as the window, at least 64: a broker that keeps to an in-flight limit up to
        // the window plus this never fills it, so the connection task keeps polling (and
        // pinging); brokers' defaults are 10 to 32. Not larger: a small `max_in_flight` is how a
        // user bounds memory for large messages.
        let (tx, mut rx) = mpsc::channel::<Arrival<P>>(self.cfg.max_in_flight.clamp(64, 4096));
        let queued0 = Arc::new(AtomicUsize::new(0));
        let filters = link.filters.clone();
        let pump = tokio::spawn(pump::<P>(
            eventloop,
            link,
            early,
            tx,
            queued0.clone(),
            self.cfg.max_in_flight,
            self.name.clone(),
        ));
        let mut unsent: VecDeque<P::Publish> = VecDeque::new();
        let mut window: InFlight<u64> = InFlight::unleased(self.cfg.max_in_flight);
        // Room for the window and as many again settled behind an unsettled one.
        let mut marks = Watermark::new(self.cfg.max_in_flight * 2);
        let mut entries: HashMap<u64, Entry<P>> = HashMap::new();
        let mut retries: RetryQueue<u64> = RetryQueue::new();
        let mut next_seq = 0u64;
        let mut generation = 0u64;
        let mut stopping = false;
        loop {
            if ctx.shutdown.is_cancelled() && !stopping {
                stopping = true;
                retries.clear(); // unacknowledged: the broker resends them (persistent session)
                if self.cfg.clean_session {
                    // Nothing survives this session: stop the flow, then forward what came.
                    for f in &filters {
                        P::try_unsubscribe(&client, f.0.clone());
                    }
                }
            }
            if stopping && window.is_empty() && (!self.cfg.clean_session || rx.is_empty()) {
                break;
            }
            // The ordered-ack tracker holds what is in the window, what waits for a retry and
            // what is settled behind an unsettled one: stop taking when either is full.
            let taking =
                window.room() > 0 && !marks.is_full() && (!stopping || self.cfg.clean_session);
            let retry_due = retries.next_due();
            tokio::select! {
                biased;
                Some((seq, outcome)) = window.next(), if !window.is_empty() => {
                    match outcome.status {
                        Status::Delivered | Status::Rejected => {
                            if outcome.status == Status::Rejected {
                                tracing::warn!(source = %self.name, reason = outcome.reason.as_deref().unwrap_or(""), "mqtt: event rejected by a sink; acknowledged");
                                self.telemetry.settled(Settled::Reject, 1);
                            } else {
                                self.telemetry.settled(Settled::Ack, 1);
                            }
                            marks.delivered(seq);
                        }
                        Status::Failed | Status::InFlight => {
                            if stopping {
                                // Not acknowledged: the broker resends it.
                                entries.remove(&seq);
                            } else if let Some(e) = entries.get_mut(&seq) {
                                e.attempts += 1;
                                marks.failed(seq);
                                self.telemetry.settled(Settled::Retry, 1);
                                retries.push_failed(e.attempts, seq);
                            }
                        }
                    }
                    self.release::<P>(&client, &mut marks, &mut entries, generation, &mut unsent);
                    self.telemetry.in_flight.set(window.len() as f64);
                }
                _ = tokio::time::sleep_until(retry_due.unwrap_or_else(Instant::now)), if retry_due.is_some() && window.room() > 0 => {
                    for seq in retries.take_due(Instant::now(), window.room()) {
                        let Some(e) = entries.get(&seq) else { continue };
                        // The same event again: rebuilt from the message with the id and time
                        // made the first time (it converted then, so it converts now).
                        let Ok((event, _)) = self.to_event(&P::view(&e.publish), e.minted.as_ref()) else { continue };
                        self.telemetry.redeliveries.increment(1);
                        let opts = SendOptions { skip_dedup: e.minted.is_some(), ..SendOptions::default() };
                        if let Ok(p) = ctx.sender.send_with(vec![event], opts).await {
                            window.push(seq, p);
                        }
                    }
                }
                a = rx.recv(), if taking => {
                    match a {
                        Some(Arrival::Connected(g, c)) => {
                            tracing::info!(source = %self.name, "mqtt: reconnected (messages not acknowledged before are resent by the broker)");
                            self.telemetry.reconnects.increment(1);
                            generation = g;
                            client = c;
                            // For the old connection: the broker resends those messages.
                            unsent.clear();
                        }
                        Some(Arrival::Publish(p, g)) => {
                            let (q, dup) = { let v = P::view(&p); (v.qos, v.dup) };
                            if q == 0 {
                                queued0.fetch_sub(1, Ordering::Relaxed);
                            }
                            if dup {
                                self.telemetry.redeliveries.increment(1);
                            }
                            self.take::<P>(&ctx, p, g, &mut next_seq, &mut marks, &mut entries, &mut window).await;
                            self.release::<P>(&client, &mut marks, &mut entries, generation, &mut unsent);
                        }
                        None => return Err(ConnectorError(format!("mqtt source {}: the connection task ended", self.name))),
                    }
                }
                _ = tokio::time::sleep(UNSENT_RETRY), if !unsent.is_empty() => {
                    if pump.is_finished() {
                        unsent.clear(); // no connection to send them on: the broker resends
                    } else {
                        self.flush::<P>(&client, &mut unsent);
                    }
                }
                _ = ctx.shutdown.cancelled(), if !stopping => {}
                // Stopping with nothing in flight, and nothing more can be taken (the tracker
                // full of messages whose retries were given up at shutdown).
                else => break,
            }
        }
        self.release::<P>(&client, &mut marks, &mut entries, generation, &mut unsent);
        // The acknowledgements go out before the DISCONNECT (requests are sent in order); the
        // connection task must not wait on a full channel meanwhile, so it is drained alongside.
        let finish = async {
            for p in unsent.drain(..) {
                if P::ack(&client, &p).await.is_err() {
                    break; // the connection is gone: the broker resends the rest
                }
                self.telemetry.commits.increment(1);
            }
            P::disconnect(&client).await;
        };
        let drain = async { while rx.recv().await.is_some() {} };
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(pump, drain, finish)
        })
        .await;
        tracing::debug!(source = %self.name, "mqtt: stopped");
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn take<P: Proto>(
        &self,
        ctx: &SourceContext,
        p: P::Publish,
        generation: u64,
        next_seq: &mut u64,
        marks: &mut Watermark,
        entries: &mut HashMap<u64, Entry<P>>,
        window: &mut InFlight<u64>,
    ) {
        let view = P::view(&p);
        let converted = self.to_event(&view, None);
        if view.qos == 0 {
            match converted {
                Ok((event, minted)) => {
                    let _ = ctx
                        .sender
                        .send_with(
                            vec![event],
                            SendOptions {
                                skip_dedup: minted.is_some(),
                                ..SendOptions::default()
                            },
                        )
                        .await;
                }
                Err(e) => {
                    tracing::warn!(source = %self.name, topic = %view.topic, error = %e, "mqtt: not a valid CloudEvent; dropped");
                    ctx.sender.telemetry().rejected("invalid_event", 1);
                }
            }
            return;
        }
        let seq = *next_seq;
        *next_seq += 1;
        let _ = marks.push(seq);
        match converted {
            Ok((event, minted)) => {
                let opts = SendOptions {
                    skip_dedup: minted.is_some(),
                    ..SendOptions::default()
                };
                entries.insert(
                    seq,
                    Entry {
                        publish: p,
                        generation,
                        minted,
                        attempts: 0,
                    },
                );
                // No send timeout is set: the send waits for room and cannot fail.
                if let Ok(pending) = ctx.sender.send_with(vec![event], opts).await {
                    window.push(seq, pending);
                }
            }
            Err(e) => {
                tracing::warn!(source = %self.name, topic = %view.topic, error = %e, "mqtt: not a valid CloudEvent; acknowledged without delivery (MQTT has no dead-letter)");
                ctx.sender.telemetry().rejected("invalid_event", 1);
                self.telemetry.settled(Settled::Reject, 1);
                entries.insert(
                    seq,
                    Entry {
                        publish: p,
                        generation,
                        minted: None,
                        attempts: 0,
                    },
                );
                marks.delivered(seq);
            }
        }
    }

    /// Acknowledges, in arrival order, every message up to the first unsettled one. Never
    /// waits: what finds the client's request queue full waits in `unsent`, in order.
    fn release<P: Proto>(
        &self,
        client: &P::Client,
        marks: &mut Watermark,
        entries: &mut HashMap<u64, Entry<P>>,
        generation: u64,
        unsent: &mut VecDeque<P::Publish>,
    ) {
        let mut released = Vec::new();
        marks.advance(|s| released.push(s));
        for seq in released {
            let Some(e) = entries.remove(&seq) else {
                continue;
            };
            if e.generation != generation {
                continue; // its connection is gone; the broker resends it
            }
            unsent.push_back(P::ack_token(&e.publish));
        }
        self.flush::<P>(client, unsent);
    }

    /// Queues the waiting acknowledgements with the client, in order, while it has room.
    fn flush<P: Proto>(&self, client: &P::Client, unsent: &mut VecDeque<P::Publish>) {
        let mut sent = 0u64;
        while let Some(p) = unsent.front() {
            if !P::try_ack(client, p) {
                break;
            }
            unsent.pop_front();
            sent += 1;
        }
        if sent > 0 {
            self.telemetry.commits.increment(sent);
        }
    }
}

/// Sends what a connection received while it subscribed to the source, counting QoS 0 messages
/// as queued; false when the source is gone.
async fn hand_over<P: Proto>(
    early: Vec<P::Publish>,
    generation: u64,
    tx: &mpsc::Sender<Arrival<P>>,
    queued0: &AtomicUsize,
) -> bool {
    for p in early {
        if P::view(&p).qos == 0 {
            queued0.fetch_add(1, Ordering::Relaxed);
        }
        if tx.send(Arrival::Publish(p, generation)).await.is_err() {
            return false;
        }
    }
    true
}

/// How soon acknowledgements that found the client's request queue full are tried again.
const UNSENT_RETRY: Duration = Duration::from_millis(2);

/// Drives the connection: forwards messages; when it drops, opens a new one with a fresh client
/// (so that no acknowledgement queued for the old connection reaches the new one) after a
/// backoff, and subscribes again when the broker kept no session, or when the subscription sent
/// over the kept one had no SUBACK yet.
async fn pump<P: Proto>(
    mut eventloop: P::EventLoop,
    mut link: Link<P>,
    early: Vec<P::Publish>,
    tx: mpsc::Sender<Arrival<P>>,
    queued0: Arc<AtomicUsize>,
    limit0: usize,
    name: String,
) {
    let dropped =
        metrics::counter!(EVENTS_DROPPED, "source" => name.clone(), "reason" => "slow_consumer");
    let mut generation = 0u64;
    let mut attempts = 0u32;
    // What arrived while the first connection subscribed.
    if !hand_over::<P>(early, generation, &tx, &queued0).await {
        return;
    }
    loop {
        // Forward until the connection fails.
        loop {
            let polled = tokio::select! {
                r = P::poll(&mut eventloop) => r,
                // The source is gone (stopped or aborted): drop the connection.
                _ = tx.closed() => return,
            };
            match polled {
                Ok(Polled::Publish(p)) => {
                    attempts = 0;
                    if P::view(&p).qos == 0 {
                        if queued0.load(Ordering::Relaxed) >= limit0 {
                            dropped.increment(1);
                            continue;
                        }
                        queued0.fetch_add(1, Ordering::Relaxed);
                    }
                    if tx.send(Arrival::Publish(p, generation)).await.is_err() {
                        return;
                    }
                }
                Ok(Polled::Disconnected) => return,
                // The SUBACK of a subscription sent again over a kept session, which `connect`
                // did not wait for: the session's old subscriptions stay in force.
                Ok(Polled::SubAck { failed }) => {
                    link.resubscribe = false;
                    if let Some(i) = failed {
                        tracing::error!(source = %name, filter = ?link.filters.get(i).map(|f| f.0.as_str()), "mqtt: the broker refused the subscription; the session's earlier subscriptions, if any, still deliver; check the ACL for this user");
                    }
                }
                Ok(_) => {}
                Err(PollError::Done) => return,
                Err(PollError::Lost(e)) => {
                    tracing::warn!(source = %name, error = %e, "mqtt: connection lost; reconnecting");
                    break;
                }
            }
        }
        // A new client for the new connection.
        loop {
            tokio::select! {
                _ = tokio::time::sleep(reconnect_delay(attempts)) => {}
                _ = tx.closed() => return,
            }
            attempts += 1;
            let (client, mut el) = P::client(link.opts.clone(), link.capacity);
            let mut early = Vec::new();
            let connected = tokio::time::timeout(
                Duration::from_secs(10),
                connect::<P>(
                    &client,
                    &mut el,
                    &link.filters,
                    link.resubscribe,
                    &mut early,
                ),
            )
            .await;
            match connected {
                Ok(Ok((_, suback_pending))) => {
                    link.resubscribe = suback_pending;
                    attempts = 0;
                    generation += 1;
                    if tx
                        .send(Arrival::Connected(generation, client))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    if !hand_over::<P>(early, generation, &tx, &queued0).await {
                        return;
                    }
                    eventloop = el;
                    break;
                }
                Ok(Err(e)) => tracing::warn!(source = %name, error = %e, "mqtt: reconnect failed"),
                Err(_) => tracing::warn!(source = %name, "mqtt: reconnect timed out"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_filters() {
        assert!(check_filter("devices/+/telemetry").is_ok());
        assert!(check_filter("a/#").is_ok());
        assert!(check_filter("a/#/b").is_err());
        assert!(check_filter("a/b+").is_err());
        assert!(format::looks_structured(b"{\"specversion\":\"1.0\"}"));
    }

    fn source() -> MqttSource {
        let cfg: MqttSourceConfig =
            serde_json::from_value(serde_json::json!({"topics": ["a/#"]})).unwrap();
        MqttSource {
            ty: "mqtt".into(),
            source: "dev".into(),
            metadata: b"{}".to_vec(),
            telemetry: PullTelemetry::new("dev"),
            name: "dev".into(),
            cfg,
        }
    }

    fn view<'a>(topic: &'a str, payload: &'a Bytes, ct: Option<&'a str>) -> View<'a> {
        View {
            topic: topic.into(),
            payload,
            qos: 1,
            dup: false,
            pkid: 1,
            content_type: ct,
            user_properties: &[],
        }
    }

    #[test]
    fn a_plain_message_is_checked_where_it_came_from_the_message() {
        let s = source();
        let json = Bytes::from_static(b"{\"a\":1}");
        let (e, minted) = s.to_event(&view("a/b", &json, None), None).unwrap();
        let minted = minted.unwrap();
        assert_eq!(
            (e.id.as_str(), e.subject.as_deref()),
            (minted.id.as_str(), Some("a/b"))
        );
        assert_eq!(e.time.as_ref(), Some(&minted.time));
        assert_eq!(e.datacontenttype.as_deref(), Some("application/json"));
        e.validate().unwrap();
        let text = Bytes::from_static(b"hello");
        let (e, _) = s.to_event(&view("a/b", &text, None), None).unwrap();
        assert_eq!(
            e.datacontenttype.as_deref(),
            Some("text/plain; charset=utf-8")
        );
        // A retry keeps the id and time made the first time.
        let (again, _) = s
            .to_event(&view("a/b", &json, None), Some(&minted))
            .unwrap();
        assert_eq!(
            (again.id.to_string(), again.time),
            (minted.id.clone(), Some(minted.time.clone()))
        );
        // The topic and a v5 content type come from the publisher: checked.
        assert!(s.to_event(&view("a/\u{1}", &json, None), None).is_err());
        assert!(s
            .to_event(&view("a/b", &json, Some("not a media type")), None)
            .is_err());
        let (e, _) = s
            .to_event(&view("a/b", &json, Some("application/vnd.x+json")), None)
            .unwrap();
        e.validate().unwrap();
        // Without data the content type describes nothing: not carried, not checked.
        let empty = Bytes::new();
        let (e, _) = s
            .to_event(&view("a/b", &empty, Some("not a media type")), None)
            .unwrap();
        assert_eq!((e.datacontenttype, e.data.is_empty()), (None, true));
    }
}
