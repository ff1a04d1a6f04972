//! `kind: pubsub` source: a streaming pull, settled message by message after delivery.
//!
//! One gRPC `StreamingPull` whose request stream is ours (the first request carries the flow
//! control, then a keepalive every 30 s; dropped, it half-closes the call, so no stream outlives
//! the source). The loop reads the next response only when the messages of the last one are in
//! the pipeline and the in-flight window has room, so a slow pipeline stops the stream (and the
//! server's flow control stops at `max_outstanding_*`). Each message's events go into
//! the pipeline with a deadline (`max_extension`); while they are there its ack deadline is
//! extended (`ModifyAckDeadline`). Delivered → `Acknowledge` (batched). Failed, or a copy
//! already in flight → its deadline is set to a backoff, so Pub/Sub redelivers it later, never
//! in a hot loop. Rejected (or not a valid event) → nacked at once when the subscription has a
//! dead-letter policy (Pub/Sub forwards it after its `max_delivery_attempts`), else held back
//! for the longest deadline (600 s) and logged.
//!
//! Ordering keys: while a message of a key is in the pipeline, later messages of that key wait
//! here (their deadlines extended too) and go in one by one, in arrival order, each after the
//! previous one was delivered. When one is not delivered, the ones waiting behind it are
//! handed back with it, so Pub/Sub redelivers the key's messages in order.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use gcloud_pubsub::apiv1::conn_pool::ConnectionManager;
use gcloud_pubsub::apiv1::subscriber_client::SubscriberClient;
use gcloud_pubsub::client::Client;
use gcloud_pubsub::subscription::{Subscription, SubscriptionConfig};
use google_cloud_gax::grpc::{Code, Request, Status as GrpcStatus, Streaming};
use google_cloud_googleapis::pubsub::v1::subscriber_client::SubscriberClient as GrpcSubscriber;
use google_cloud_googleapis::pubsub::v1::{
    AcknowledgeRequest, ModifyAckDeadlineRequest, PubsubMessage, StreamingPullRequest,
    StreamingPullResponse,
};
use sluice_core::event::{
    check_extension_name, extension_name_from, Data, Event, ExtValue, Str, Timestamp,
};
use sluice_core::pipeline::SendOptions;
use sluice_core::pull::{Backoff, InFlight, SettleBatch};
use sluice_core::telemetry::{PullTelemetry, Settled};
use sluice_core::{
    argo, BoxFuture, ConnectorError, Outcome, Running, SourceConfig, SourceContext, Status,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::binding::{self, Decoded};
use crate::{api_call, resource_id, Format, PubSubSourceConfig};

/// How often an empty request keeps the stream alive.
const KEEPALIVE: Duration = Duration::from_secs(30);
/// The largest response the stream takes (Pub/Sub's message limit is 10 MB).
const MAX_RESPONSE: usize = 20 * 1024 * 1024;
/// Ack ids in one `Acknowledge` / `ModifyAckDeadline` call, at most.
const SETTLE_BATCH: usize = 500;
/// How long acks and deadline changes wait to fill a batch.
const LINGER: Duration = Duration::from_millis(20);
/// The longest ack deadline Pub/Sub takes: how long a rejected message is held back.
const REJECT_HOLD_SECS: i32 = 600;
/// Default `type` of wrapped messages (Google's own CloudEvent type for Pub/Sub messages).
pub const DEFAULT_TYPE: &str = "google.cloud.pubsub.topic.v1.messagePublished";

impl SourceConfig for PubSubSourceConfig {
    fn validate(&self, name: &str) -> Result<(), String> {
        self.check()?;
        let ty = self.event_type.as_deref().unwrap_or(match self.format {
            Format::Argo => "pubsub",
            Format::Cloudevents => DEFAULT_TYPE,
        });
        sluice_core::event::check_source_and_type(
            self.event_source.as_deref().unwrap_or(match self.format {
                Format::Argo => name,
                Format::Cloudevents => "//pubsub.googleapis.com/projects/p/topics/t",
            }),
            ty,
        )
    }

    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("pubsub source {name}: {m}"));
            self.check().map_err(err)?;
            let project = self.project.clone();
            let sub_id = resource_id(
                "subscription",
                "subscriptions",
                &self.subscription,
                &project,
            )
            .map_err(err)?
            .to_owned();
            let (client, streaming) = self.connection().clients().await.map_err(err)?;
            let sub = client.subscription(&sub_id);
            let (topic, sc) = read_or_create(&client, &sub, &self).await.map_err(err)?;
            let decoder = Decoder {
                ty: self.event_type.clone().unwrap_or_else(|| {
                    match self.format {
                        Format::Argo => "pubsub",
                        Format::Cloudevents => DEFAULT_TYPE,
                    }
                    .into()
                }),
                source: self
                    .event_source
                    .clone()
                    .unwrap_or_else(|| match self.format {
                        Format::Argo => name.clone(),
                        Format::Cloudevents => format!("//pubsub.googleapis.com/{topic}"),
                    }),
                name: self.event_subject.clone().unwrap_or_else(|| name.clone()),
                format: self.format,
                json_body: self.json_body,
                metadata: serde_json::to_vec(&self.metadata).unwrap_or_else(|_| b"{}".to_vec()),
            };
            let engine = Engine {
                telemetry: PullTelemetry::new(&name),
                streaming,
                client_id: format!(
                    "sluice-{name}-{}-{}",
                    std::process::id(),
                    chrono::Utc::now().timestamp_micros()
                ),
                client: sub.get_client(),
                fqsn: sub.fully_qualified_name().to_owned(),
                dead_letter: sc.dead_letter_policy.is_some(),
                name,
                decoder,
                ack_deadline: self.ack_deadline.get(),
                max_extension: self.max_extension.get(),
                max_outstanding_messages: self.max_outstanding_messages,
                max_outstanding_bytes: self.max_outstanding_bytes.bytes(),
            };
            tracing::info!(
                source = %engine.name,
                subscription = %engine.fqsn,
                topic = %topic,
                ordering = sc.enable_message_ordering,
                exactly_once = sc.enable_exactly_once_delivery,
                dead_letter = engine.dead_letter,
                "pubsub: subscribed"
            );
            Ok(Box::pin(engine.run(ctx)) as Running)
        })
    }
}

/// Reads the subscription's settings (which also proves it exists and the credentials reach
/// it), creating it on `topic:` when it is missing and the config asks for that.
async fn read_or_create(
    client: &Client,
    sub: &Subscription,
    cfg: &PubSubSourceConfig,
) -> Result<(String, SubscriptionConfig), String> {
    let fq = sub.fully_qualified_name().to_owned();
    match sub.config(None).await {
        Ok(found) => return Ok(found),
        Err(s) if s.code() == Code::NotFound => {}
        Err(s) => {
            return Err(format!(
                "cannot read subscription {fq} ({}: {}); may these credentials call pubsub.subscriptions.get?",
                s.code(),
                s.message()
            ))
        }
    }
    let Some(topic) = &cfg.topic else {
        return Err(format!(
            "subscription {fq} does not exist: create it, or set topic: so that Sluice creates it"
        ));
    };
    let topic_id = resource_id("topic", "topics", topic, &cfg.project)?;
    let fqtn = client.fully_qualified_topic_name(topic_id);
    let create = SubscriptionConfig {
        ack_deadline_seconds: cfg.ack_deadline.get().as_secs() as i32,
        enable_message_ordering: cfg.enable_message_ordering,
        ..SubscriptionConfig::default()
    };
    match sub.create(&fqtn, create, None).await {
        Ok(()) => tracing::info!(subscription = %fq, topic = %fqtn, "pubsub: subscription created"),
        // Another instance created it meanwhile.
        Err(s) if s.code() == Code::AlreadyExists => {}
        Err(s) => {
            return Err(format!(
                "cannot create subscription {fq} on {fqtn} ({}: {}); does the topic exist?",
                s.code(),
                s.message()
            ))
        }
    }
    sub.config(None).await.map_err(|s| {
        format!(
            "cannot read subscription {fq} after creating it: {}",
            s.message()
        )
    })
}

/// How messages become events.
struct Decoder {
    ty: String,
    source: String,
    /// `argo`: the events' subject (the `subject` option, else the source's name).
    name: String,
    format: Format,
    json_body: bool,
    /// `argo`: `data.metadata` as JSON text.
    metadata: Vec<u8>,
}

/// A message as the stream delivered it.
struct Msg {
    ack_id: String,
    message: PubsubMessage,
    /// Pub/Sub's delivery attempt (only with a dead-letter policy).
    attempt: Option<u32>,
}

fn publish_time(m: &Msg) -> Option<chrono::DateTime<chrono::Utc>> {
    let t = m.message.publish_time.as_ref()?;
    chrono::DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).unwrap_or(0))
}

impl Decoder {
    /// `Err`: not a valid event (rejected).
    fn event(&self, r: &Msg) -> Result<Event, String> {
        let m = &r.message;
        let time = publish_time(r);
        let stamp = time.map(Timestamp::from_utc).unwrap_or_else(Timestamp::now);
        if self.format == Format::Argo {
            // The object written as bytes: the body (JSON or base64 text) goes in as it is.
            let body = argo::body(&m.data, self.json_body)?;
            let mut data = Vec::with_capacity(body.len() + 160);
            let text = |e: serde_json::Error| e.to_string();
            data.extend_from_slice(b"{\"id\":");
            serde_json::to_writer(&mut data, &m.message_id).map_err(text)?;
            data.extend_from_slice(b",\"body\":");
            data.extend_from_slice(&body);
            data.extend_from_slice(b",\"attributes\":");
            // In name order: the same data on every copy.
            let attributes: std::collections::BTreeMap<_, _> = m.attributes.iter().collect();
            serde_json::to_writer(&mut data, &attributes).map_err(text)?;
            data.extend_from_slice(b",\"publishTime\":");
            let published = argo::go_time(time.unwrap_or_else(chrono::Utc::now));
            serde_json::to_writer(&mut data, &published).map_err(text)?;
            data.extend_from_slice(b",\"metadata\":");
            data.extend_from_slice(&self.metadata);
            data.push(b'}');
            let e = Event::new(&*m.message_id, &*self.source, &*self.ty)
                .with_subject(&*self.name)
                .with_time(stamp)
                .with_json(data);
            return Ok(e);
        }
        match binding::decode(&m.attributes, &m.data).map_err(|e| e.to_string())? {
            Decoded::Event(e) => Ok(*e),
            Decoded::Plain => {
                // id and time from Pub/Sub: the same on every redelivery.
                let mut e = Event::new(&*m.message_id, &*self.source, &*self.ty).with_time(stamp);
                if !m.data.is_empty() {
                    let ct = binding::content_type(&m.attributes)
                        .map(str::to_owned)
                        .unwrap_or_else(|| {
                            sluice_core::event::guess_content_type(&m.data).to_owned()
                        });
                    let data = Data::from_bytes(m.data.clone(), Some(&ct));
                    e = e.with_data(Some(ct), data);
                }
                // Attributes → extensions, in name order (the same event on every copy).
                let mut names: Vec<&String> = m.attributes.keys().collect();
                names.sort();
                for k in names {
                    if k.eq_ignore_ascii_case("content-type") {
                        continue;
                    }
                    let ext = extension_name_from(k);
                    if check_extension_name(&ext).is_err() || e.extension(&ext).is_some() {
                        tracing::debug!(attribute = %k, "message attribute not mapped to an extension (its name is reserved or not a valid extension name)");
                        continue;
                    }
                    e.extensions
                        .push((ext, ExtValue::String(Str::new(&m.attributes[k]))));
                }
                if !m.ordering_key.is_empty() && e.extension("partitionkey").is_none() {
                    e.set_extension("partitionkey", m.ordering_key.as_str());
                }
                Ok(e)
            }
        }
    }
}

/// What settling one message needs.
struct Handle {
    ack_id: String,
    attempt: u32,
    /// The ordering key and the message id (what unblocks the key when it comes again).
    key: Option<(String, String)>,
}

/// A message received and not in the pipeline yet: waiting for room, or behind an earlier one
/// of its ordering key.
struct Waiting {
    msg: Msg,
    lease_until: Instant,
}

/// The loop's mutable state.
struct State {
    window: InFlight<Handle>,
    /// Messages of the last response not taken yet (the window was full).
    received: VecDeque<Waiting>,
    /// Ordering keys with a message in the pipeline, and the messages waiting behind it.
    keys: HashMap<String, VecDeque<Waiting>>,
    /// Messages in `keys` queues.
    held: usize,
    /// Ordering keys whose head was handed back: later messages of the key are handed back
    /// too until the head comes again (its message id), or until the time given, and with
    /// the head's delay in seconds.
    blocked: HashMap<String, (String, Instant, i32)>,
    /// Data bytes of the messages in the window and in `keys`.
    bytes: u64,
    sizes: HashMap<String, u64>,
    acks: SettleBatch<String>,
    modacks: SettleBatch<(String, i32)>,
    calls: FuturesUnordered<BoxFuture<'static, ()>>,
}

struct Engine {
    name: String,
    /// The channel the streaming pull runs on.
    streaming: ConnectionManager,
    /// Sent on every stream (Pub/Sub keeps ordering-key affinity per client id).
    client_id: String,
    client: SubscriberClient,
    fqsn: String,
    decoder: Decoder,
    dead_letter: bool,
    ack_deadline: Duration,
    max_extension: Duration,
    max_outstanding_messages: usize,
    max_outstanding_bytes: u64,
    telemetry: PullTelemetry,
}

/// An open streaming pull: our request stream's sender (dropping it half-closes the call) and
/// the responses.
struct Pull {
    requests: Option<mpsc::Sender<StreamingPullRequest>>,
    responses: Option<Streaming<StreamingPullResponse>>,
}

impl Drop for Pull {
    /// Half-closes the call and lets the server end it (for a few seconds at most, on a task of
    /// its own), instead of resetting it at once: the emulator never cleans up a stream that is
    /// reset (its log shows a `NoSuchMethodError` on `RST_STREAM`) and goes on sending to it.
    /// What the server still sends meanwhile is not taken; it comes again after its deadline.
    fn drop(&mut self) {
        drop(self.requests.take());
        let Some(mut responses) = self.responses.take() else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(5), async {
                    while let Ok(Some(_)) = responses.message().await {}
                })
                .await;
            });
        }
    }
}

/// The next response of the stream; pending while there is none.
async fn next_of(pull: &mut Option<Pull>) -> Result<Option<StreamingPullResponse>, GrpcStatus> {
    match pull {
        Some(Pull {
            responses: Some(r), ..
        }) => r.message().await,
        _ => std::future::pending().await,
    }
}

impl Engine {
    /// Opens the streaming pull: the first request names the subscription, the deadline and
    /// the flow control.
    async fn open(&self) -> Result<Pull, GrpcStatus> {
        let (requests, rx) = mpsc::channel::<StreamingPullRequest>(4);
        let first = StreamingPullRequest {
            subscription: self.fqsn.clone(),
            stream_ack_deadline_seconds: self.ack_deadline.as_secs() as i32,
            max_outstanding_messages: self.max_outstanding_messages as i64,
            max_outstanding_bytes: self.max_outstanding_bytes.min(i64::MAX as u64) as i64,
            client_id: self.client_id.clone(),
            ..StreamingPullRequest::default()
        };
        requests.try_send(first).expect("a new channel has room");
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|r| (r, rx)) },
            );
        let mut req = Request::new(stream);
        if let Ok(v) = format!("subscription={}", self.fqsn).parse() {
            req.metadata_mut().insert("x-goog-request-params", v);
        }
        let mut client =
            GrpcSubscriber::new(self.streaming.conn()).max_decoding_message_size(MAX_RESPONSE);
        let responses = client.streaming_pull(req).await?.into_inner();
        Ok(Pull {
            requests: Some(requests),
            responses: Some(responses),
        })
    }

    async fn run(self, ctx: SourceContext) -> Result<(), ConnectorError> {
        let deadline = self.ack_deadline;
        let mut st = State {
            window: InFlight::new(self.max_outstanding_messages, deadline),
            received: VecDeque::new(),
            keys: HashMap::new(),
            held: 0,
            blocked: HashMap::new(),
            bytes: 0,
            sizes: HashMap::new(),
            acks: SettleBatch::new(SETTLE_BATCH, LINGER),
            modacks: SettleBatch::new(SETTLE_BATCH, LINGER),
            calls: FuturesUnordered::new(),
        };
        let mut pull: Option<Pull> = None;
        let mut reopen_at: Option<Instant> = Some(Instant::now());
        let mut leases = tokio::time::interval((deadline / 4).max(Duration::from_secs(1)));
        leases.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut keepalive = tokio::time::interval(KEEPALIVE);
        keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failures = 0u32;
        loop {
            let stopping = ctx.shutdown.is_cancelled();
            if stopping {
                // The call is half-closed and dropped: Pub/Sub sends nothing more.
                pull = None;
                reopen_at = None;
                // Received and not in the pipeline, or waiting behind their key (they would go
                // in out of order after a drain of the one ahead): handed back now.
                for w in std::mem::take(&mut st.received) {
                    self.hand_back(&mut st, w.msg.ack_id, 0);
                }
                let keys: Vec<String> = st.keys.keys().cloned().collect();
                for k in keys {
                    self.release_key(&mut st, &k, 0, true);
                }
            }
            // Messages of the last response, into the pipeline while there is room (and while
            // it takes them: a full pipeline gives the loop back to the leases and settles).
            while !stopping && st.window.room() > st.held {
                let Some(w) = st.received.pop_front() else {
                    break;
                };
                if !self.offer(&ctx, &mut st, w.msg).await {
                    break;
                }
            }
            if stopping && st.window.is_empty() {
                let rest = st.acks.take();
                if !rest.is_empty() {
                    st.calls.push(self.ack(rest));
                }
                let rest = st.modacks.take();
                if !rest.is_empty() {
                    st.calls.push(self.modack(rest, false));
                }
                // Bounded: each call carries the client's own timeouts and retries.
                let _ = tokio::time::timeout(Duration::from_secs(10), async {
                    while st.calls.next().await.is_some() {}
                })
                .await;
                break;
            }
            let take = !stopping
                && pull.is_some()
                && st.received.is_empty()
                && st.window.room() > st.held
                && st.bytes < self.max_outstanding_bytes;
            let linger = [st.acks.deadline(), st.modacks.deadline()]
                .into_iter()
                .flatten()
                .min();
            tokio::select! {
                biased;
                Some((h, outcome)) = st.window.next(), if !st.window.is_empty() => {
                    self.settle(&ctx, &mut st, h, outcome).await;
                    self.telemetry.in_flight.set(st.window.len() as f64);
                }
                Some(()) = st.calls.next(), if !st.calls.is_empty() => {}
                _ = async { tokio::time::sleep_until(linger.expect("checked")).await }, if linger.is_some() => {
                    let now = Instant::now();
                    if let Some(b) = st.acks.due(now) {
                        st.calls.push(self.ack(b));
                    }
                    if let Some(b) = st.modacks.due(now) {
                        st.calls.push(self.modack(b, false));
                    }
                }
                _ = leases.tick() => self.extend(&mut st),
                _ = keepalive.tick(), if pull.is_some() => {
                    if let Some(tx) = pull.as_ref().and_then(|p| p.requests.as_ref()) {
                        let _ = tx.try_send(StreamingPullRequest::default());
                    }
                }
                _ = ctx.shutdown.cancelled(), if !stopping => {}
                _ = async { tokio::time::sleep_until(reopen_at.expect("checked")).await }, if reopen_at.is_some() => {
                    reopen_at = None;
                    match self.open().await {
                        Ok(p) => pull = Some(p),
                        Err(e) => {
                            failures += 1;
                            let wait = Backoff::RETRY.after(failures + 3);
                            tracing::warn!(source = %self.name, subscription = %self.fqsn, code = %e.code(), error = %e.message(), retry_in = ?wait, "pubsub: cannot open the streaming pull");
                            reopen_at = Some(Instant::now() + wait);
                        }
                    }
                }
                r = next_of(&mut pull), if take => match r {
                    Ok(Some(resp)) => {
                        failures = 0;
                        let now = Instant::now();
                        for m in resp.received_messages {
                            let Some(message) = m.message else { continue };
                            let size = message.data.len() as u64;
                            st.bytes += size;
                            if let Some(old) = st.sizes.insert(m.ack_id.clone(), size) {
                                st.bytes -= old; // the same ack id twice: counted once
                            }
                            st.received.push_back(Waiting {
                                msg: Msg {
                                    ack_id: m.ack_id,
                                    message,
                                    attempt: u32::try_from(m.delivery_attempt).ok().filter(|n| *n > 0),
                                },
                                lease_until: now + deadline,
                            });
                        }
                    }
                    end => {
                        // Pub/Sub ends streams now and then (UNAVAILABLE after some minutes);
                        // other errors (the subscription deleted, permissions taken away) are
                        // worth a warning. Opened again with a backoff; what was in flight
                        // goes on.
                        pull = None;
                        failures += 1;
                        let wait = Backoff::RETRY.after(failures + 3);
                        self.telemetry.reconnects.increment(1);
                        let routine = matches!(&end, Err(e) if matches!(e.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled));
                        if routine && failures == 1 {
                            tracing::debug!(source = %self.name, end = ?end.err(), retry_in = ?wait, "pubsub: the streaming pull ended; opening it again");
                        } else {
                            let (code, error) = match &end {
                                Err(e) => (e.code().to_string(), e.message().to_owned()),
                                Ok(_) => ("OK".to_owned(), "the server closed the stream".to_owned()),
                            };
                            tracing::warn!(source = %self.name, subscription = %self.fqsn, %code, %error, retry_in = ?wait, "pubsub: the streaming pull ended (is the subscription still there, and may these credentials pull from it?); opening it again");
                        }
                        reopen_at = Some(Instant::now() + wait);
                    }
                },
            }
        }
        tracing::debug!(source = %self.name, "pubsub: stopped");
        Ok(())
    }

    /// Hands a message back for a redelivery in `secs` seconds (counted as a retry).
    fn hand_back(&self, st: &mut State, ack_id: String, secs: i32) {
        self.telemetry.settled(Settled::Retry, 1);
        self.redeliver_in(st, ack_id, secs);
    }

    /// Sets a message's deadline to `secs` (0: a nack), and stops counting its bytes.
    fn redeliver_in(&self, st: &mut State, ack_id: String, secs: i32) {
        self.forget(st, &ack_id);
        if let Some(b) = st.modacks.push((ack_id, secs)) {
            st.calls.push(self.modack(b, false));
        }
    }

    /// A message from the stream: in the pipeline now, queued behind its key, or handed back
    /// (its key is blocked). `false`: the pipeline was full.
    async fn offer(&self, ctx: &SourceContext, st: &mut State, msg: Msg) -> bool {
        if msg.attempt.is_some_and(|n| n > 1) {
            self.telemetry.redeliveries.increment(1);
        }
        let key = (!msg.message.ordering_key.is_empty()).then(|| msg.message.ordering_key.clone());
        if let Some(k) = &key {
            if let Some((head, until, secs)) = st.blocked.get(k).cloned() {
                if head == msg.message.message_id || Instant::now() >= until {
                    st.blocked.remove(k);
                } else {
                    // Behind a head that was handed back: back too, so the key keeps its order.
                    self.hand_back(st, msg.ack_id, secs);
                    return true;
                }
            }
            if let Some(q) = st.keys.get_mut(k) {
                q.push_back(Waiting {
                    msg,
                    lease_until: Instant::now() + self.ack_deadline,
                });
                st.held += 1;
                return true;
            }
            st.keys.insert(k.clone(), VecDeque::new());
        }
        self.start(ctx, st, msg, key).await
    }

    /// Sends a message's event. A full pipeline holds the loop for an eighth of the ack
    /// deadline at most (2 s at most), then the message is handed back. `false`: it was.
    async fn start(
        &self,
        ctx: &SourceContext,
        st: &mut State,
        msg: Msg,
        key: Option<String>,
    ) -> bool {
        let handle = Handle {
            ack_id: msg.ack_id.clone(),
            attempt: msg.attempt.unwrap_or(1),
            key: key.map(|k| (k, msg.message.message_id.clone())),
        };
        match self.decoder.event(&msg) {
            Ok(event) => {
                let opts = SendOptions {
                    timeout: Some(
                        (self.ack_deadline / 8)
                            .min(Duration::from_secs(2))
                            .max(Duration::from_millis(100)),
                    ),
                    deadline: Some(Instant::now() + self.max_extension),
                    ..SendOptions::default()
                };
                match ctx.sender.send_with(vec![event], opts).await {
                    Ok(pending) => {
                        st.window.push(handle, pending);
                        self.telemetry.in_flight.set(st.window.len() as f64);
                        true
                    }
                    Err(_) => {
                        // The pipeline is full: Pub/Sub hands it out again in a second.
                        self.unsettled(st, handle, 1);
                        false
                    }
                }
            }
            Err(e) => {
                tracing::warn!(source = %self.name, message = %msg.message.message_id, error = %e, "pubsub: not a valid event");
                ctx.sender.telemetry().rejected("invalid_event", 1);
                self.reject(st, handle);
                true
            }
        }
    }

    async fn settle(&self, ctx: &SourceContext, st: &mut State, h: Handle, outcome: Outcome) {
        match outcome.status {
            Status::Delivered => {
                self.telemetry.settled(Settled::Ack, 1);
                self.forget(st, &h.ack_id);
                if let Some(b) = st.acks.push(h.ack_id) {
                    st.calls.push(self.ack(b));
                }
                if let Some((k, _)) = h.key {
                    self.next_of_key(ctx, st, k).await;
                }
            }
            // A transient failure, or a copy still in flight: Pub/Sub redelivers it after a
            // backoff (a delivered copy is then a duplicate, answered by the dedup window).
            Status::Failed | Status::InFlight => {
                let secs = backoff_secs(h.attempt);
                self.unsettled(st, h, secs);
            }
            Status::Rejected => {
                tracing::warn!(source = %self.name, reason = outcome.reason.as_deref().unwrap_or(""), "pubsub: event rejected by a sink");
                self.reject(st, h);
            }
        }
    }

    /// The next message waiting behind `key`, into the pipeline; the key is free when none.
    async fn next_of_key(&self, ctx: &SourceContext, st: &mut State, key: String) {
        let next = st.keys.get_mut(&key).and_then(VecDeque::pop_front);
        match next {
            Some(w) => {
                st.held -= 1;
                self.start(ctx, st, w.msg, Some(key)).await;
            }
            None => {
                st.keys.remove(&key);
            }
        }
    }

    /// Hands a message back for a redelivery in `secs` seconds, with those waiting behind it.
    fn unsettled(&self, st: &mut State, h: Handle, secs: i32) {
        self.hand_back(st, h.ack_id, secs);
        if let Some((k, head)) = h.key {
            self.block(st, k, head, secs);
        }
    }

    /// The head of `key` was handed back for `secs`: what waits behind it here, and what of the
    /// key arrives before the head comes again, is handed back too.
    fn block(&self, st: &mut State, key: String, head: String, secs: i32) {
        self.release_key(st, &key, secs.max(1), false);
        let (mut behind, keep): (VecDeque<Waiting>, VecDeque<Waiting>) =
            std::mem::take(&mut st.received)
                .into_iter()
                .partition(|w| w.msg.message.ordering_key == key);
        st.received = keep;
        // At least a second: a follower nacked at once would come back in a hot loop while
        // its head is away.
        let secs = secs.max(1);
        for w in behind.drain(..) {
            self.hand_back(st, w.msg.ack_id, secs);
        }
        let until = Instant::now() + Duration::from_secs(secs as u64) + self.ack_deadline;
        st.blocked.insert(key, (head, until, secs));
    }

    fn reject(&self, st: &mut State, h: Handle) {
        let secs = if self.dead_letter {
            self.telemetry.settled(Settled::Reject, 1);
            0
        } else {
            tracing::warn!(source = %self.name, subscription = %self.fqsn, "pubsub: the subscription has no dead-letter policy (set one, with a dead-letter topic): the rejected message is held back for 10 minutes");
            self.telemetry.settled(Settled::Retry, 1);
            REJECT_HOLD_SECS
        };
        self.redeliver_in(st, h.ack_id, secs);
        if let Some((k, head)) = h.key {
            self.block(st, k, head, secs);
        }
    }

    /// Hands back every message waiting behind `key` (for a redelivery in `secs`), and frees
    /// the key. `keep_key`: the one ahead is still in the pipeline (a drain), so the key stays
    /// taken.
    fn release_key(&self, st: &mut State, key: &str, secs: i32, keep_key: bool) {
        let waiting = if keep_key {
            st.keys.get_mut(key).map(std::mem::take)
        } else {
            st.keys.remove(key)
        };
        for w in waiting.into_iter().flatten() {
            st.held -= 1;
            self.hand_back(st, w.msg.ack_id, secs);
        }
    }

    fn forget(&self, st: &mut State, ack_id: &str) {
        if let Some(n) = st.sizes.remove(ack_id) {
            st.bytes -= n;
        }
    }

    /// Extends the deadline of every message whose lease ends within three quarters of the
    /// deadline (the tick comes every quarter), in the pipeline or waiting behind its key.
    fn extend(&self, st: &mut State) {
        let now = Instant::now();
        st.blocked.retain(|_, (_, until, _)| *until > now);
        let secs = self.ack_deadline.as_secs() as i32;
        let margin = self.ack_deadline * 3 / 4;
        let mut due = Vec::new();
        st.window
            .extend_leases(margin, |h| due.push((h.ack_id.clone(), secs)));
        for q in st
            .keys
            .values_mut()
            .chain(std::iter::once(&mut st.received))
        {
            for w in q.iter_mut() {
                if w.lease_until.saturating_duration_since(now) <= margin {
                    w.lease_until = now + self.ack_deadline;
                    due.push((w.msg.ack_id.clone(), secs));
                }
            }
        }
        if !due.is_empty() {
            self.telemetry.lease_extensions.increment(due.len() as u64);
            for chunk in due.chunks(SETTLE_BATCH) {
                st.calls.push(self.modack(chunk.to_vec(), true));
            }
        }
    }

    fn ack(&self, ack_ids: Vec<String>) -> BoxFuture<'static, ()> {
        let client = self.client.clone();
        let subscription = self.fqsn.clone();
        let name = self.name.clone();
        Box::pin(async move {
            let n = ack_ids.len();
            let r = client
                .acknowledge(
                    AcknowledgeRequest {
                        subscription,
                        ack_ids,
                    },
                    None,
                )
                .await;
            api_call(("source", &name), "Acknowledge", r.is_ok());
            if let Err(s) = r {
                // On an exactly-once subscription this is the ack result: the messages were
                // not acknowledged and come again; the dedup window answers the copies.
                metrics::counter!("sluice_pubsub_ack_failures_total", "source" => name.clone())
                    .increment(n as u64);
                tracing::warn!(source = %name, code = %s.code(), error = %s.message(), messages = n, "pubsub: Acknowledge failed; the messages will be delivered again and answered as duplicates");
            }
        })
    }

    /// `ModifyAckDeadline` for each distinct deadline in `items`.
    fn modack(&self, items: Vec<(String, i32)>, extension: bool) -> BoxFuture<'static, ()> {
        let client = self.client.clone();
        let subscription = self.fqsn.clone();
        let name = self.name.clone();
        Box::pin(async move {
            let mut by_secs: Vec<(i32, Vec<String>)> = Vec::new();
            for (id, secs) in items {
                match by_secs.iter_mut().find(|(s, _)| *s == secs) {
                    Some((_, ids)) => ids.push(id),
                    None => by_secs.push((secs, vec![id])),
                }
            }
            for (secs, ack_ids) in by_secs {
                let req = ModifyAckDeadlineRequest {
                    subscription: subscription.clone(),
                    ack_ids,
                    ack_deadline_seconds: secs,
                };
                let r = client.modify_ack_deadline(req, None).await;
                api_call(("source", &name), "ModifyAckDeadline", r.is_ok());
                if let Err(s) = r {
                    let what = if extension {
                        "deadline extension"
                    } else {
                        "deadline change"
                    };
                    tracing::warn!(source = %name, code = %s.code(), error = %s.message(), "pubsub: a {what} failed (the messages will be redelivered when their deadline passes)");
                }
            }
        })
    }
}

/// Seconds until a message that failed `attempt` times comes again: about 1 s, doubling, at
/// most 30 (`attempt` is Pub/Sub's delivery attempt, known with a dead-letter policy; else 1).
fn backoff_secs(attempt: u32) -> i32 {
    let d = Backoff::RETRY
        .after(attempt.saturating_add(3))
        .as_secs_f64()
        .ceil() as i32;
    d.clamp(1, 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_bounded() {
        assert_eq!(backoff_secs(1), 1);
        assert!(backoff_secs(3) > backoff_secs(1));
        assert!(backoff_secs(40) <= 60);
    }
}
