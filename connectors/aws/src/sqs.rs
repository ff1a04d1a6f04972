//! `kind: sqs` source, and the SQS polling engine that `kind: s3` (notification mode) shares.
//!
//! Several long polls run at once, each asking for no more messages than the in-flight window
//! has room for (a full window = no poll). A message's events go into the pipeline with a
//! deadline (`max_extension`); while they are there its visibility is extended
//! (`ChangeMessageVisibilityBatch`). Delivered → `DeleteMessageBatch` (by 10, or after a short
//! linger). Failed, or a copy already in flight → its visibility is set to a backoff, so SQS
//! hands it out again later, never in a hot loop. Rejected (or not a valid event) → moved to the
//! queue's dead-letter queue (its redrive policy's target), or, without one, held back for
//! `REJECT_HOLD` and logged.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message,
    MessageSystemAttributeName, QueueAttributeName,
};
use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde::Deserialize;
use sluice_core::event::{Event, Timestamp};
use sluice_core::pipeline::SendOptions;
use sluice_core::pull::{Backoff, InFlight, SettleBatch};
use sluice_core::telemetry::{PullTelemetry, Settled};
use sluice_core::units::HumanDuration;
use sluice_core::{
    argo, BoxFuture, ConnectorError, Outcome, Running, SourceConfig, SourceContext, Status,
};
use tokio::time::Instant;

use crate::attrs::{self, Attr, Decoded};
use crate::{api_call, aws_options, poll_backoff, QueueRef};

/// How long a rejected message is held back when its queue has no dead-letter queue.
const REJECT_HOLD: Duration = Duration::from_secs(15 * 60);
/// Settle calls (deletes, visibility changes, dead-letter moves) in flight at once.
const MAX_CALLS: usize = 16;
/// How long a batch of deletes or visibility changes waits to fill up.
const LINGER: Duration = Duration::from_millis(20);

/// `format:` of an SQS source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// CloudEvents carried in the message pass through; other messages are wrapped (default).
    #[default]
    Cloudevents,
    /// Argo Events' SQS event: type `sqs`, data `{messageId, messageAttributes, body,
    /// metadata}`.
    Argo,
}

aws_options! {
    /// `kind: sqs` source options.
    pub struct SqsSourceConfig {
        /// The queue: name, URL or ARN.
        pub queue: String,
        /// Messages one poll asks for (1 to 10). Default 10.
        #[serde(default = "ten")]
        pub max_messages: i32,
        /// How long one poll waits for messages (long polling, 1s to 20s). Default 20s.
        #[serde(default = "twenty_seconds")]
        pub wait_time: HumanDuration,
        /// How long a received message stays hidden from other consumers; extended while its
        /// events are in the pipeline. Default 2m.
        #[serde(default = "two_minutes")]
        pub visibility_timeout: HumanDuration,
        /// Long polls running at once. Default 2.
        #[serde(default = "two")]
        pub concurrency: usize,
        /// Messages whose events are in the pipeline at once; polling stops while it is
        /// reached. Default 1000.
        #[serde(default = "thousand")]
        pub max_in_flight: usize,
        /// The longest a message's visibility is extended; after it the message is given up
        /// and SQS hands it out again. Default 1h.
        #[serde(default = "one_hour")]
        pub max_extension: HumanDuration,
        #[serde(default)]
        pub format: Format,
        /// `argo`: the body is JSON and goes into `data.body` as is (else base64).
        #[serde(default)]
        pub json_body: bool,
        /// `argo`: `data.metadata`.
        #[serde(default)]
        pub metadata: BTreeMap<String, String>,
        /// `type` of events made from plain messages. Default `com.amazonaws.sqs.message`.
        #[serde(rename = "type")]
        pub event_type: Option<String>,
        /// `source` of events made from plain messages. Default: the queue ARN.
        #[serde(rename = "source")]
        pub event_source: Option<String>,
        /// `argo`: the events' `subject` (Argo's event name). Default: the source's name.
        #[serde(rename = "subject")]
        pub event_subject: Option<String>,
    }
}

fn ten() -> i32 {
    10
}
fn twenty_seconds() -> HumanDuration {
    HumanDuration::from_secs(20)
}
fn two_minutes() -> HumanDuration {
    HumanDuration::from_secs(120)
}
fn two() -> usize {
    2
}
fn thousand() -> usize {
    1000
}
fn one_hour() -> HumanDuration {
    HumanDuration::from_secs(3600)
}

/// The polling options an SQS-fed source has (`sqs`, and `s3` in notification mode).
#[derive(Clone, Debug)]
pub(crate) struct Polling {
    pub queue: String,
    pub max_messages: i32,
    pub wait_time: Duration,
    pub visibility_timeout: Duration,
    pub concurrency: usize,
    pub max_in_flight: usize,
    pub max_extension: Duration,
}

impl Polling {
    pub(crate) fn check(&self) -> Result<QueueRef, String> {
        let q = QueueRef::parse(&self.queue)?;
        if !(1..=10).contains(&self.max_messages) {
            return Err("max_messages must be between 1 and 10 (SQS returns at most 10)".into());
        }
        if self.wait_time > Duration::from_secs(20) || self.wait_time < Duration::from_secs(1) {
            return Err(
                "wait_time must be between 1s and 20s (long polling: 0 would poll an empty queue in a tight loop)"
                    .into(),
            );
        }
        let vis = self.visibility_timeout;
        if vis < Duration::from_secs(2) || vis > Duration::from_secs(12 * 3600) {
            return Err(
                "visibility_timeout must be between 2s and 12h (SQS's limit; it is extended while in flight)"
                    .into(),
            );
        }
        if self.concurrency == 0 || self.concurrency > 64 {
            return Err("concurrency must be between 1 and 64".into());
        }
        if self.max_in_flight == 0 || self.max_in_flight > 100_000 {
            return Err("max_in_flight must be between 1 and 100000".into());
        }
        if self.max_extension < vis || self.max_extension > Duration::from_secs(12 * 3600) {
            return Err(
                "max_extension must be at least visibility_timeout and at most 12h (SQS ends visibility 12h after receipt)"
                    .into(),
            );
        }
        Ok(q)
    }
}

impl SqsSourceConfig {
    fn polling(&self) -> Polling {
        Polling {
            queue: self.queue.clone(),
            max_messages: self.max_messages,
            wait_time: self.wait_time.get(),
            visibility_timeout: self.visibility_timeout.get(),
            concurrency: self.concurrency,
            max_in_flight: self.max_in_flight,
            max_extension: self.max_extension.get(),
        }
    }
}

/// A received message, taken apart.
pub(crate) struct Received {
    pub message_id: String,
    pub receipt: String,
    pub body: Bytes,
    pub attrs: Vec<(String, Attr)>,
    /// `SentTimestamp`.
    pub sent: Option<chrono::DateTime<chrono::Utc>>,
    /// `ApproximateReceiveCount` (1 the first time).
    pub receives: u32,
    /// `MessageGroupId` (FIFO queues).
    pub group: Option<String>,
}

impl Received {
    fn from_message(m: Message) -> Option<Received> {
        let Message {
            message_id,
            receipt_handle,
            body,
            attributes,
            message_attributes,
            ..
        } = m;
        let sys = attributes.unwrap_or_default();
        let num = |k: &MessageSystemAttributeName| sys.get(k).and_then(|v| v.parse::<i64>().ok());
        Some(Received {
            receipt: receipt_handle?,
            body: Bytes::from(body.unwrap_or_default()),
            attrs: attrs::from_sqs(message_attributes.unwrap_or_default()),
            sent: num(&MessageSystemAttributeName::SentTimestamp)
                .and_then(chrono::DateTime::from_timestamp_millis),
            receives: num(&MessageSystemAttributeName::ApproximateReceiveCount)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(1),
            group: sys
                .get(&MessageSystemAttributeName::MessageGroupId)
                .cloned(),
            message_id: message_id?,
        })
    }
}

/// What a message turns into.
pub(crate) enum Made {
    /// Its events (one send: the message is deleted only when all are delivered).
    Events(Vec<Event>),
    /// Nothing to forward (an S3 test event, every record filtered): deleted at once, counted
    /// under `reason`.
    Skip(&'static str),
}

/// How a source on the engine turns messages into events.
pub(crate) trait Decode: Send + Sync + 'static {
    /// The connector's kind, for log lines and errors.
    fn kind(&self) -> &'static str;
    /// `Err`: not a valid event (rejected: moved to the dead-letter queue).
    fn events(&self, r: &Received, queue_arn: &str) -> Result<Made, String>;
}

/// `kind: sqs`: one event per message.
struct Plain {
    ty: String,
    source: Option<String>,
    name: String,
    /// `argo`: the events' subject.
    subject: String,
    format: Format,
    json_body: bool,
    metadata: Vec<u8>,
}

impl Decode for Plain {
    fn kind(&self) -> &'static str {
        "sqs"
    }

    fn events(&self, r: &Received, queue_arn: &str) -> Result<Made, String> {
        let source = self.source.as_deref().unwrap_or(queue_arn);
        if self.format == Format::Argo {
            let mut data = Vec::with_capacity(r.body.len() + 128);
            data.extend_from_slice(b"{\"messageId\":");
            serde_json::to_writer(&mut data, &r.message_id).map_err(|e| e.to_string())?;
            data.extend_from_slice(b",\"messageAttributes\":");
            serde_json::to_writer(&mut data, &attrs::argo_attributes(&r.attrs))
                .map_err(|e| e.to_string())?;
            data.extend_from_slice(b",\"body\":");
            data.extend_from_slice(&argo::body(&r.body, self.json_body)?);
            data.extend_from_slice(b",\"metadata\":");
            data.extend_from_slice(&self.metadata);
            data.push(b'}');
            let e = Event::new(
                &*r.message_id,
                self.source.as_deref().unwrap_or(&self.name),
                &*self.ty,
            )
            .with_subject(&*self.subject)
            .with_time(
                r.sent
                    .map(Timestamp::from_utc)
                    .unwrap_or_else(Timestamp::now),
            )
            .with_json(data);
            return Ok(Made::Events(vec![e]));
        }
        match attrs::decode(&r.attrs, &r.body).map_err(|e| e.to_string())? {
            Decoded::Event(e) => Ok(Made::Events(vec![*e])),
            Decoded::Plain => {
                // id and time from SQS: the same on every redelivery.
                let mut e = Event::new(&*r.message_id, source, &*self.ty).with_time(
                    r.sent
                        .map(Timestamp::from_utc)
                        .unwrap_or_else(Timestamp::now),
                );
                e = attrs::plain_data(e, &r.attrs, r.body.clone());
                attrs::add_extensions(&mut e, &r.attrs);
                e.validate().map_err(|e| e.to_string())?;
                Ok(Made::Events(vec![e]))
            }
        }
    }
}

impl SourceConfig for SqsSourceConfig {
    fn validate(&self, name: &str) -> Result<(), String> {
        self.connection().check()?;
        self.polling().check()?;
        let ty = self.event_type.as_deref().unwrap_or(match self.format {
            Format::Argo => "sqs",
            Format::Cloudevents => "com.amazonaws.sqs.message",
        });
        sluice_core::event::check_source_and_type(
            self.event_source
                .as_deref()
                .unwrap_or(if self.format == Format::Argo {
                    name
                } else {
                    "arn:aws:sqs:r:1:q"
                }),
            ty,
        )
    }

    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        let decode = Plain {
            ty: self.event_type.clone().unwrap_or_else(|| {
                match self.format {
                    Format::Argo => "sqs",
                    Format::Cloudevents => "com.amazonaws.sqs.message",
                }
                .into()
            }),
            source: self.event_source.clone(),
            name: ctx.name.clone(),
            subject: self
                .event_subject
                .clone()
                .unwrap_or_else(|| ctx.name.clone()),
            format: self.format,
            json_body: self.json_body,
            metadata: serde_json::to_vec(&self.metadata).unwrap_or_else(|_| b"{}".to_vec()),
        };
        start(self.connection(), self.polling(), decode, ctx)
    }
}

/// Builds an SQS-fed source: resolves the queue, reads its ARN and redrive policy (which also
/// proves the credentials can read it), then polls.
pub(crate) fn start<D: Decode>(
    conn: crate::Connection,
    polling: Polling,
    decode: D,
    ctx: SourceContext,
) -> BoxFuture<'static, Result<Running, ConnectorError>> {
    Box::pin(async move {
        let name = ctx.name.clone();
        let kind = decode.kind();
        let err = |m: String| ConnectorError(format!("{kind} source {name}: {m}"));
        let q = polling.check().map_err(err)?;
        let sdk = conn.sdk_config(q.region()).await;
        let client = aws_sdk_sqs::Client::new(&sdk);
        let url = q.resolve(&client).await.map_err(err)?;
        let attrs = client
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(QueueAttributeName::QueueArn)
            .attribute_names(QueueAttributeName::RedrivePolicy)
            .send()
            .await
            .map_err(|e| {
                err(format!(
                    "cannot read the attributes of queue {url} ({}); may these credentials call sqs:GetQueueAttributes?",
                    aws_sdk_sqs::error::DisplayErrorContext(&e)
                ))
            })?;
        api_call(&name, "GetQueueAttributes", true);
        let mut attrs = attrs.attributes.unwrap_or_default();
        let arn = attrs
            .remove(&QueueAttributeName::QueueArn)
            .ok_or_else(|| err(format!("queue {url} has no QueueArn attribute")))?;
        let dlq = match attrs.remove(&QueueAttributeName::RedrivePolicy) {
            Some(policy) => {
                let target = serde_json::from_str::<serde_json::Value>(&policy)
                    .ok()
                    .and_then(|v| v.get("deadLetterTargetArn")?.as_str().map(str::to_owned))
                    .ok_or_else(|| {
                        err(format!(
                            "queue {url}: cannot read its RedrivePolicy {policy:?}"
                        ))
                    })?;
                let dq = QueueRef::parse(&target).map_err(err)?;
                Some(dq.resolve(&client).await.map_err(err)?)
            }
            None => {
                tracing::warn!(source = %name, queue = %url, "{kind}: the queue has no redrive policy: a rejected message is held back for 15 minutes at a time instead of going to a dead-letter queue");
                None
            }
        };
        let engine = Engine {
            telemetry: PullTelemetry::new(&name),
            name,
            client,
            url,
            arn,
            dlq,
            polling,
            decode: Arc::new(decode),
        };
        tracing::info!(source = %engine.name, queue = %engine.url, "{kind}: polling");
        Ok(Box::pin(engine.run(ctx)) as Running)
    })
}

/// What settling one message needs.
struct Handle {
    receipt: String,
    receives: u32,
    /// For a move to a FIFO dead-letter queue: the group and the message id (deduplication).
    group: Option<String>,
    message_id: String,
    /// For a move to the dead-letter queue.
    body: Bytes,
    attrs: Vec<(String, Attr)>,
}

type Poll = BoxFuture<'static, (usize, Result<Vec<Message>, String>)>;

struct Engine<D> {
    name: String,
    client: aws_sdk_sqs::Client,
    url: String,
    arn: String,
    dlq: Option<String>,
    polling: Polling,
    decode: Arc<D>,
    telemetry: PullTelemetry,
}

impl<D: Decode> Engine<D> {
    fn poll(&self, n: usize) -> Poll {
        let call = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(n as i32)
            .wait_time_seconds(self.polling.wait_time.as_secs() as i32)
            .visibility_timeout(self.polling.visibility_timeout.as_secs() as i32)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId);
        let name = self.name.clone();
        Box::pin(async move {
            let r = call.send().await;
            api_call(&name, "ReceiveMessage", r.is_ok());
            (
                n,
                r.map(|o| o.messages.unwrap_or_default())
                    .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(&e).to_string()),
            )
        })
    }

    async fn run(self, ctx: SourceContext) -> Result<(), ConnectorError> {
        let vis = self.polling.visibility_timeout;
        let mut window: InFlight<Handle> = InFlight::new(self.polling.max_in_flight, vis);
        let mut polls: FuturesUnordered<Poll> = FuturesUnordered::new();
        let mut reserved = 0usize;
        let mut calls: FuturesUnordered<BoxFuture<'static, ()>> = FuturesUnordered::new();
        let mut deletes: SettleBatch<String> = SettleBatch::new(10, LINGER);
        let mut hide: SettleBatch<(String, i32)> = SettleBatch::new(10, LINGER);
        let mut leases = tokio::time::interval((vis / 4).max(Duration::from_millis(500)));
        leases.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The backlog (`ApproximateNumberOfMessages`) as the lag gauge, every 30 s.
        let mut backlog = tokio::time::interval(Duration::from_secs(30));
        backlog.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failures = 0u32;
        let mut resume_at: Option<Instant> = None;
        loop {
            let stopping = ctx.shutdown.is_cancelled();
            if stopping && !polls.is_empty() {
                // Polls in progress are abandoned: what SQS handed to one reappears after its
                // visibility timeout, unsettled, so nothing is lost.
                polls.clear();
                reserved = 0;
            }
            while !stopping
                && polls.len() < self.polling.concurrency
                && calls.len() < MAX_CALLS
                && resume_at.is_none_or(|t| t <= Instant::now())
            {
                let room = window.room().saturating_sub(reserved);
                let n = room.min(self.polling.max_messages as usize);
                if n == 0 {
                    break;
                }
                reserved += n;
                polls.push(self.poll(n));
            }
            if stopping && window.is_empty() {
                let rest = deletes.take();
                if !rest.is_empty() {
                    calls.push(self.delete(rest));
                }
                let rest = hide.take();
                if !rest.is_empty() {
                    calls.push(self.change_visibility(rest, false));
                }
                // Bounded: each call carries the SDK's own timeouts and retries.
                let _ = tokio::time::timeout(Duration::from_secs(10), async {
                    while calls.next().await.is_some() {}
                })
                .await;
                break;
            }
            let linger = [deletes.deadline(), hide.deadline()]
                .into_iter()
                .flatten()
                .min();
            tokio::select! {
                biased;
                Some((h, outcome)) = window.next(), if !window.is_empty() => {
                    self.settle(h, outcome, &mut deletes, &mut hide, &mut calls);
                    self.telemetry.in_flight.set(window.len() as f64);
                }
                Some(()) = calls.next(), if !calls.is_empty() => {}
                _ = async { tokio::time::sleep_until(linger.expect("checked")).await }, if linger.is_some() => {
                    let now = Instant::now();
                    if let Some(b) = deletes.due(now) {
                        calls.push(self.delete(b));
                    }
                    if let Some(b) = hide.due(now) {
                        calls.push(self.change_visibility(b, false));
                    }
                }
                _ = leases.tick() => {
                    let mut due = Vec::new();
                    // Leases count from the push, up to a quarter of `vis` after the receipt
                    // (the send bound above): a margin of three quarters extends every message
                    // before SQS's own timer runs out.
                    window.extend_leases(vis * 3 / 4, |h| due.push((h.receipt.clone(), vis.as_secs() as i32)));
                    if !due.is_empty() {
                        self.telemetry.lease_extensions.increment(due.len() as u64);
                        for chunk in due.chunks(10) {
                            calls.push(self.change_visibility(chunk.to_vec(), true));
                        }
                    }
                }
                _ = backlog.tick(), if !stopping => calls.push(self.read_backlog()),
                _ = ctx.shutdown.cancelled(), if !stopping => {}
                _ = async { tokio::time::sleep_until(resume_at.expect("checked")).await }, if resume_at.is_some() => {
                    resume_at = None;
                }
                Some((asked, result)) = polls.next(), if !polls.is_empty() => {
                    reserved -= asked;
                    match result {
                        Ok(msgs) => {
                            failures = 0;
                            self.offer(&ctx, msgs, &mut window, &mut deletes, &mut hide, &mut calls).await;
                        }
                        Err(e) => {
                            failures += 1;
                            let wait = poll_backoff(failures);
                            tracing::warn!(source = %self.name, queue = %self.url, error = %e, retry_in = ?wait, "{}: ReceiveMessage failed", self.decode.kind());
                            resume_at = Some(Instant::now() + wait);
                        }
                    }
                }
            }
        }
        tracing::debug!(source = %self.name, "{}: stopped", self.decode.kind());
        Ok(())
    }

    /// Sends the events of a poll's messages. A full pipeline holds the poll loop for at most a
    /// quarter of the visibility timeout (leases are extended meanwhile by the next tick);
    /// messages it did not take are made visible again after a short backoff.
    async fn offer(
        &self,
        ctx: &SourceContext,
        msgs: Vec<Message>,
        window: &mut InFlight<Handle>,
        deletes: &mut SettleBatch<String>,
        hide: &mut SettleBatch<(String, i32)>,
        calls: &mut FuturesUnordered<BoxFuture<'static, ()>>,
    ) {
        let mut full = false;
        // One bound for the whole poll's sends, so the loop (and the lease extensions it runs)
        // is held at most a quarter of the visibility timeout.
        let until =
            Instant::now() + (self.polling.visibility_timeout / 4).max(Duration::from_millis(100));
        for m in msgs {
            let Some(r) = Received::from_message(m) else {
                continue;
            };
            if r.receives > 1 {
                self.telemetry.redeliveries.increment(1);
            }
            let handle = Handle {
                receipt: r.receipt.clone(),
                receives: r.receives,
                group: r.group.clone(),
                message_id: r.message_id.clone(),
                body: r.body.clone(),
                attrs: Vec::new(),
            };
            // The poll asked for no more than its reserved room; a server that hands out more
            // gets the surplus back soon instead of overfilling the window.
            if full || window.room() == 0 {
                self.retry_later(handle, Duration::from_secs(1), hide, calls);
                continue;
            }
            match self.decode.events(&r, &self.arn) {
                Ok(Made::Events(events)) => {
                    let opts = SendOptions {
                        timeout: Some(
                            until
                                .saturating_duration_since(Instant::now())
                                .max(Duration::from_millis(1)),
                        ),
                        deadline: Some(Instant::now() + self.polling.max_extension),
                        ..SendOptions::default()
                    };
                    match ctx.sender.send_with(events, opts).await {
                        Ok(pending) => {
                            let handle = Handle {
                                attrs: r.attrs,
                                ..handle
                            };
                            window.push(handle, pending);
                            self.telemetry.in_flight.set(window.len() as f64);
                        }
                        Err(_) => {
                            full = true;
                            self.retry_later(handle, Duration::from_secs(1), hide, calls);
                        }
                    }
                }
                Ok(Made::Skip(reason)) => {
                    tracing::debug!(source = %self.name, message = %r.message_id, reason, "{}: nothing to forward; deleted", self.decode.kind());
                    ctx.sender.telemetry().filtered(1);
                    self.telemetry.settled(Settled::Ack, 1);
                    if let Some(b) = deletes.push(handle.receipt) {
                        calls.push(self.delete(b));
                    }
                }
                Err(e) => {
                    tracing::warn!(source = %self.name, message = %r.message_id, error = %e, "{}: not a valid event", self.decode.kind());
                    ctx.sender.telemetry().rejected("invalid_event", 1);
                    let handle = Handle {
                        attrs: r.attrs,
                        ..handle
                    };
                    self.reject(handle, hide, calls);
                }
            }
        }
    }

    fn read_backlog(&self) -> BoxFuture<'static, ()> {
        let call = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages);
        let (name, lag) = (self.name.clone(), self.telemetry.lag.clone());
        Box::pin(async move {
            let r = call.send().await;
            api_call(&name, "GetQueueAttributes", r.is_ok());
            let n = r.ok().and_then(|o| {
                o.attributes?
                    .get(&QueueAttributeName::ApproximateNumberOfMessages)?
                    .parse::<f64>()
                    .ok()
            });
            if let Some(n) = n {
                lag.set(n);
            }
        })
    }

    fn settle(
        &self,
        h: Handle,
        outcome: Outcome,
        deletes: &mut SettleBatch<String>,
        hide: &mut SettleBatch<(String, i32)>,
        calls: &mut FuturesUnordered<BoxFuture<'static, ()>>,
    ) {
        match outcome.status {
            Status::Delivered => {
                self.telemetry.settled(Settled::Ack, 1);
                if let Some(b) = deletes.push(h.receipt) {
                    calls.push(self.delete(b));
                }
            }
            // A transient failure, or a copy of the event still in flight: SQS hands the
            // message out again after a backoff (a delivered copy is then a duplicate).
            Status::Failed | Status::InFlight => {
                let wait = Backoff::RETRY.after(h.receives.max(1));
                self.retry_later(h, wait, hide, calls);
            }
            Status::Rejected => {
                tracing::warn!(source = %self.name, reason = outcome.reason.as_deref().unwrap_or(""), "{}: event rejected by a sink", self.decode.kind());
                self.reject(h, hide, calls);
            }
        }
    }

    fn retry_later(
        &self,
        h: Handle,
        wait: Duration,
        hide: &mut SettleBatch<(String, i32)>,
        calls: &mut FuturesUnordered<BoxFuture<'static, ()>>,
    ) {
        self.telemetry.settled(Settled::Retry, 1);
        // Whole seconds, at least 1: 0 would make it visible at once.
        let secs = wait.as_secs_f64().ceil().max(1.0) as i32;
        if let Some(b) = hide.push((h.receipt, secs)) {
            calls.push(self.change_visibility(b, false));
        }
    }

    fn reject(
        &self,
        h: Handle,
        hide: &mut SettleBatch<(String, i32)>,
        calls: &mut FuturesUnordered<BoxFuture<'static, ()>>,
    ) {
        match &self.dlq {
            Some(dlq) => {
                self.telemetry.settled(Settled::Reject, 1);
                calls.push(self.move_to(dlq.clone(), h));
            }
            None => {
                tracing::warn!(source = %self.name, queue = %self.url, "{}: no dead-letter queue (set a redrive policy on the queue): the rejected message is held back for 15 minutes", self.decode.kind());
                self.retry_later(h, REJECT_HOLD, hide, calls);
            }
        }
    }

    fn delete(&self, receipts: Vec<String>) -> BoxFuture<'static, ()> {
        let entries: Vec<_> = receipts
            .into_iter()
            .enumerate()
            .filter_map(|(i, r)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(r)
                    .build()
                    .ok()
            })
            .collect();
        let call = self
            .client
            .delete_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries));
        let name = self.name.clone();
        Box::pin(async move {
            match call.send().await {
                Ok(out) => {
                    api_call(&name, "DeleteMessageBatch", true);
                    if !out.failed.is_empty() {
                        delete_failed(&name, out.failed.len());
                        for f in &out.failed {
                            tracing::warn!(source = %name, code = %f.code, message = f.message.as_deref().unwrap_or(""), "sqs: a delete failed; the message will be received again and answered as a duplicate");
                        }
                    }
                }
                Err(e) => {
                    api_call(&name, "DeleteMessageBatch", false);
                    tracing::warn!(source = %name, error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "sqs: DeleteMessageBatch failed; the messages will be received again and answered as duplicates");
                    delete_failed(&name, 1);
                }
            }
        })
    }

    fn change_visibility(
        &self,
        items: Vec<(String, i32)>,
        extension: bool,
    ) -> BoxFuture<'static, ()> {
        let entries: Vec<_> = items
            .into_iter()
            .enumerate()
            .filter_map(|(i, (r, secs))| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(r)
                    .visibility_timeout(secs)
                    .build()
                    .ok()
            })
            .collect();
        let call = self
            .client
            .change_message_visibility_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries));
        let name = self.name.clone();
        Box::pin(async move {
            let r = call.send().await;
            api_call(&name, "ChangeMessageVisibilityBatch", r.is_ok());
            let what = if extension {
                "visibility extension"
            } else {
                "visibility change"
            };
            match r {
                Ok(out) => {
                    for f in &out.failed {
                        tracing::debug!(source = %name, code = %f.code, "sqs: a {what} failed (the message may have been deleted or its receipt expired)");
                    }
                }
                Err(e) => {
                    tracing::warn!(source = %name, error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "sqs: {what} failed");
                }
            }
        })
    }

    /// Sends the message, as received, to the dead-letter queue, then deletes it here. Not
    /// deleted unless the copy was accepted.
    fn move_to(&self, dlq: String, h: Handle) -> BoxFuture<'static, ()> {
        let mut send = self
            .client
            .send_message()
            .queue_url(&dlq)
            .message_body(String::from_utf8_lossy(&h.body).into_owned());
        if dlq.ends_with(".fifo") {
            // A FIFO queue takes nothing without a group; the message id keeps a retried move
            // from landing twice.
            send = send
                .message_group_id(h.group.clone().unwrap_or_else(|| "sluice".into()))
                .message_deduplication_id(h.message_id.clone());
        }
        for (k, a) in &h.attrs {
            if let Ok(v) = aws_sdk_sqs::types::MessageAttributeValue::builder()
                .data_type(&a.data_type)
                .set_string_value(a.string.clone())
                .set_binary_value(a.binary.clone().map(aws_sdk_sqs::primitives::Blob::new))
                .build()
            {
                send = send.message_attributes(k, v);
            }
        }
        let delete = self
            .client
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(h.receipt);
        let name = self.name.clone();
        Box::pin(async move {
            let sent = send.send().await;
            api_call(&name, "SendMessage", sent.is_ok());
            if let Err(e) = sent {
                tracing::warn!(source = %name, error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "sqs: cannot move a rejected message to the dead-letter queue; it will be received again");
                return;
            }
            let deleted = delete.send().await;
            api_call(&name, "DeleteMessage", deleted.is_ok());
            if let Err(e) = deleted {
                delete_failed(&name, 1);
                tracing::warn!(source = %name, error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "sqs: moved to the dead-letter queue but not deleted here; it will be received again");
            }
        })
    }
}

fn delete_failed(name: &str, n: usize) {
    metrics::counter!("sluice_aws_deletes_failed_total", "source" => name.to_owned())
        .increment(n as u64);
}
