//! `kind: kafka` source: a consumer group member (cooperative rebalancing) whose offsets are
//! committed only up to each partition's watermark — the first record whose events are not yet
//! delivered — so nothing undelivered is ever committed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use indexmap::IndexMap;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol, StreamConsumer,
};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde::Deserialize;
use sluice_core::event::{
    check_extension_name, check_media_type, check_string, extension_name_from, Data, Event,
    EventError, ExtValue, Str, Timestamp,
};
use sluice_core::pull::{Backoff, InFlight, Watermark};
use sluice_core::telemetry::{PullTelemetry, Settled};
use sluice_core::units::HumanDuration;
use sluice_core::{
    argo, kafka_binding, BoxFuture, ConnectorError, Outcome, Pending, Running, SourceConfig,
    SourceContext, SourceSender, Status,
};
use smallvec::SmallVec;
use tokio_util::sync::CancellationToken;

use crate::PropValue;

/// Where a partition starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    /// The group's committed offset; a partition without one starts at its earliest record
    /// (default).
    #[default]
    Committed,
    /// The earliest record, the first time this process is assigned a partition (a replay:
    /// commits are ignored at start).
    Earliest,
    /// The end, the first time this process is assigned a partition (the backlog is skipped).
    Latest,
}

/// What a record whose event a sink rejected does to its partition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnRejected {
    /// Count it, log it, commit past it (default). A sink's `dead_letter` takes it first.
    #[default]
    Skip,
    /// Stop the source with an error; the commit stays before the record.
    Stop,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceFormat {
    /// The CloudEvents Kafka binding (binary or structured, passed through); plain records
    /// wrapped (default).
    #[default]
    Cloudevents,
    /// Argo Events' Kafka event: type `kafka`, data `{topic, key, partition, body, timestamp,
    /// headers, metadata}`.
    Argo,
    /// Argo Events' Kafka EventBus: each value is a structured CloudEvent in JSON, with no
    /// content type (what Argo's EventSources write); passed through as it is.
    ArgoEventbus,
}

/// `kind: kafka` source options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceConfig {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// Topics to consume.
    #[serde(default)]
    pub topics: Vec<String>,
    /// Or: a regular expression over topic names (librdkafka's, anchored with `^`).
    pub topic_pattern: Option<String>,
    /// The consumer group.
    pub group: String,
    /// `committed` (default), `earliest` or `latest`.
    #[serde(default)]
    pub start: Start,
    /// Records in flight at once, over all partitions (the pipeline's share of this source).
    /// Default 10000.
    #[serde(default = "default_in_flight")]
    pub max_in_flight: usize,
    /// Records in flight at once in one partition (the watermark's bound). Default:
    /// `max_in_flight`.
    pub max_in_flight_per_partition: Option<usize>,
    /// How often advanced watermarks are committed (asynchronously). Also committed on
    /// revoke and at shutdown (synchronously). Default 1s.
    #[serde(default = "one_second")]
    pub commit_interval: HumanDuration,
    #[serde(default)]
    pub on_rejected: OnRejected,
    #[serde(default)]
    pub format: SourceFormat,
    /// `argo`: the value is JSON and goes into `data.body` as is (else base64).
    #[serde(default)]
    pub json_body: bool,
    /// `argo`: `data.metadata`.
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// `type` of events made from plain records. Default `kafka`.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// `source` of events made from plain records. Default: the source's name.
    #[serde(rename = "source")]
    pub event_source: Option<String>,
    /// `argo`: the events' `subject` (Argo's event name). Default: the source's name.
    #[serde(rename = "subject")]
    pub event_subject: Option<String>,
    /// Any librdkafka consumer property, passed through (`security.protocol`, `sasl.*`,
    /// `ssl.*`, `fetch.max.bytes`, ...). Offsets are ours: `enable.auto.commit` and
    /// `enable.auto.offset.store` cannot be turned on.
    #[serde(default)]
    pub properties: IndexMap<String, PropValue>,
}

/// librdkafka's prefetch bound per source, in KiB: what it holds before the source takes it.
const QUEUED_KBYTES: i64 = 16 * 1024;

fn default_in_flight() -> usize {
    10_000
}
fn one_second() -> HumanDuration {
    HumanDuration::from_secs(1)
}

impl KafkaSourceConfig {
    fn per_partition(&self) -> usize {
        self.max_in_flight_per_partition
            .unwrap_or(self.max_in_flight)
            .min(self.max_in_flight)
    }

    fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("client.id", "sluice")
            .set("group.id", &self.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky")
            // Prefetch bounded in line with the window: what librdkafka holds before we take it.
            .set(
                "queued.min.messages",
                self.per_partition().clamp(1, 100_000).to_string(),
            )
            .set("queued.max.messages.kbytes", QUEUED_KBYTES.to_string())
            // The source stops taking records while its window is full, so librdkafka's queue
            // reaches those bounds often; librdkafka then postpones that partition's next fetch
            // by this much (default 1000 ms, which capped the source at ~16 MiB/s, measured in
            // benches/consume.sh). Resume fetching soon after room appears.
            .set("fetch.queue.backoff.ms", "10");
        if let Some(bytes) = self.fetch_max_bytes() {
            c.set("fetch.max.bytes", bytes.to_string());
        }
        for (k, v) in &self.properties {
            c.set(k, v.text());
        }
        c
    }

    /// `fetch.max.bytes` unless set in `properties`: a quarter of the prefetch bound
    /// (`queued.max.messages.kbytes`), no more than librdkafka's own 50 MiB and no less than
    /// `message.max.bytes`, as librdkafka requires. librdkafka's default is the whole bound (up
    /// to 50 MiB): one response then fills the queue, the next fetch goes out only once the
    /// source has taken the queue below its bounds, and the source idles while that fetch is
    /// answered (measured in benches/consume.sh: the source at 85–89 % of its core with 16 MiB
    /// fetches, 87–93 % with 4 MiB ones). `None` (librdkafka decides) when either property is
    /// given in a form this does not read as librdkafka would (it also takes hex, say).
    fn fetch_max_bytes(&self) -> Option<i64> {
        let prop = |k: &str, default: i64| match self.properties.get(k) {
            None => Some(default),
            Some(v) => v.text().trim().parse::<i64>().ok(),
        };
        let queued = prop("queued.max.messages.kbytes", QUEUED_KBYTES)?.saturating_mul(1024);
        Some(
            (queued / 4)
                .min(50 << 20)
                .max(prop("message.max.bytes", 1_000_000)?),
        )
    }

    fn subscription(&self) -> Vec<String> {
        match &self.topic_pattern {
            Some(p) => vec![if p.starts_with('^') {
                p.clone()
            } else {
                format!("^{p}")
            }],
            None => self.topics.clone(),
        }
    }
}

impl SourceConfig for KafkaSourceConfig {
    fn validate(&self, name: &str) -> Result<(), String> {
        sluice_core::event::check_source_and_type(
            self.event_source.as_deref().unwrap_or(name),
            self.event_type.as_deref().unwrap_or("kafka"),
        )?;
        if self.brokers.trim().is_empty() {
            return Err("brokers: give at least one host:port".into());
        }
        match (self.topics.is_empty(), &self.topic_pattern) {
            (true, None) => return Err("give `topics` or `topic_pattern`".into()),
            (false, Some(_)) => return Err("give `topics` or `topic_pattern`, not both".into()),
            _ => {}
        }
        if self.group.trim().is_empty() {
            return Err("group: name the consumer group".into());
        }
        if self.max_in_flight == 0 || self.max_in_flight > 1_000_000 {
            return Err("max_in_flight must be between 1 and 1000000".into());
        }
        if self.max_in_flight_per_partition == Some(0) {
            return Err("max_in_flight_per_partition must be at least 1".into());
        }
        if self.commit_interval.get() < Duration::from_millis(10) {
            return Err("commit_interval must be at least 10ms".into());
        }
        for (k, v) in &self.properties {
            let v = v.text();
            match k.as_str() {
                "enable.auto.commit" | "enable.auto.offset.store" if v != "false" => {
                    return Err(format!(
                        "properties.{k}: the source commits offsets itself, only after delivery; it cannot be {v:?}"
                    ))
                }
                "bootstrap.servers" | "metadata.broker.list" => {
                    return Err(format!("properties.{k}: set `brokers` instead"))
                }
                "group.id" => return Err(format!("properties.{k}: set `group` instead")),
                _ => {}
            }
        }
        self.client_config()
            .create::<BaseConsumer>()
            .map(drop)
            .map_err(|e| format!("properties: {e}"))
    }

    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("kafka source {name}: {m}"));
            let shared = Arc::new(Mutex::new(Partitions::default()));
            let context = GroupContext {
                name: name.clone(),
                start: self.start,
                bound: self.per_partition(),
                shared: shared.clone(),
                telemetry: PullTelemetry::new(&name),
            };
            let consumer: StreamConsumer<GroupContext> = self
                .client_config()
                .create_with_context(context)
                .map_err(|e| err(format!("cannot create the consumer: {e}")))?;
            let consumer = Arc::new(consumer);
            let probe = consumer.clone();
            crate::probe_brokers(&self.brokers, move || {
                probe
                    .client()
                    .fetch_metadata(None, Duration::from_secs(10))
                    .map(drop)
            })
            .await
            .map_err(err)?;
            let topics = self.subscription();
            let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
            consumer
                .subscribe(&refs)
                .map_err(|e| err(format!("cannot subscribe to {topics:?}: {e}")))?;
            tracing::info!(source = %name, brokers = %self.brokers, topics = ?topics, group = %self.group, "kafka source subscribed");
            let metadata = serde_json::to_vec(&self.metadata).unwrap_or_else(|_| b"{}".to_vec());
            let source = KafkaSource {
                ty: Str::new(self.event_type.as_deref().unwrap_or("kafka")),
                source: Str::new(self.event_source.as_deref().unwrap_or(&name)),
                subject: Str::new(self.event_subject.as_deref().unwrap_or(&name)),
                format: self.format,
                json_body: self.json_body,
                metadata: Arc::from(metadata),
                window: self.max_in_flight,
                commit_interval: self.commit_interval.get(),
                on_rejected: self.on_rejected,
                telemetry: PullTelemetry::new(&name),
                name,
                consumer: Closing(Some(consumer)),
                shared,
            };
            Ok(Box::pin(source.run(ctx)) as Running)
        })
    }
}

type Tp = (Arc<str>, i32);

/// One assigned partition.
struct Part {
    wm: Watermark,
    /// Bumped on every assignment, so outcomes of a previous assignment are ignored.
    generation: u64,
    /// The last offset committed (or asked to be).
    committed: Option<u64>,
    paused: bool,
}

#[derive(Default)]
struct Partitions {
    parts: HashMap<Tp, Part>,
    /// Partitions this process was ever assigned (`start: earliest | latest` apply once).
    seen: HashSet<Tp>,
    generation: u64,
}

/// Serves rebalances: sets start offsets on first assignment, commits the watermark of
/// revoked partitions synchronously before they go.
struct GroupContext {
    name: String,
    start: Start,
    bound: usize,
    shared: Arc<Mutex<Partitions>>,
    telemetry: PullTelemetry,
}

/// The lag is not read from librdkafka's statistics: with `statistics.interval.ms` set,
/// librdkafka records every consumed message's queue time in a histogram (about 1 % of a
/// Kafka → null event's instructions) and writes a JSON document per interval, of which the
/// lag is one number per partition. See [`KafkaSource::update_lag`].
impl ClientContext for GroupContext {
    /// Statistics turned on in `properties` are not read (nor logged: rdkafka's default logs
    /// the whole document at `info` every interval).
    fn stats_raw(&self, _statistics: &[u8]) {}
}

impl ConsumerContext for GroupContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                let mut starts = Vec::new();
                for e in tpl.elements() {
                    let tp: Tp = (Arc::from(e.topic()), e.partition());
                    s.generation += 1;
                    let generation = s.generation;
                    if s.seen.insert(tp.clone()) && self.start != Start::Committed {
                        starts.push(tp.clone());
                    }
                    s.parts.insert(
                        tp,
                        Part {
                            wm: Watermark::new(self.bound),
                            generation,
                            committed: None,
                            paused: false,
                        },
                    );
                }
                drop(s);
                for (t, p) in starts {
                    let at = match self.start {
                        Start::Latest => Offset::End,
                        _ => Offset::Beginning,
                    };
                    let _ = tpl.set_partition_offset(&t, p, at);
                }
                tracing::info!(source = %self.name, partitions = tpl.count(), "kafka: partitions assigned");
                let r = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                if let Err(e) = r {
                    tracing::error!(source = %self.name, error = %e, "kafka: assignment failed");
                }
                // A partition paused under a previous assignment starts unpaused (its Part is new).
                let _ = consumer.resume(tpl);
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let mut commit = TopicPartitionList::new();
                {
                    let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                    for e in tpl.elements() {
                        let tp: Tp = (Arc::from(e.topic()), e.partition());
                        if let Some(mut part) = s.parts.remove(&tp) {
                            if let Some(point) = part.wm.revoke() {
                                if part.committed != Some(point) {
                                    let _ = commit.add_partition_offset(
                                        &tp.0,
                                        tp.1,
                                        Offset::Offset(point as i64),
                                    );
                                }
                            }
                        }
                    }
                }
                // Lost partitions (session timeout) cannot be committed: the group moved on.
                if commit.count() > 0 && !consumer.assignment_lost() {
                    match consumer.commit(&commit, CommitMode::Sync) {
                        Ok(()) => self.telemetry.commits.increment(1),
                        Err(e) => {
                            tracing::warn!(source = %self.name, error = %e, "kafka: commit on revoke failed; the new owner resumes from the previous commit (duplicates, no loss)")
                        }
                    }
                }
                tracing::info!(source = %self.name, partitions = tpl.count(), "kafka: partitions revoked");
                let r = if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                };
                if let Err(e) = r {
                    tracing::error!(source = %self.name, error = %e, "kafka: unassignment failed");
                }
            }
            other => {
                tracing::error!(source = %self.name, error = ?other, "kafka: rebalance error");
                let _ = consumer.unassign();
            }
        }
    }
}

/// The consumer, closed off the caller's thread when dropped: librdkafka's close leaves the
/// group and commits on revoke, and with the brokers gone it never returns. When the source is
/// aborted (the grace is over) the future is dropped on a runtime thread, which must not hang:
/// the close goes to a detached thread that the process exit ends.
struct Closing(Option<Arc<StreamConsumer<GroupContext>>>);

impl Closing {
    fn take(&mut self) -> Option<Arc<StreamConsumer<GroupContext>>> {
        self.0.take()
    }
}

impl std::ops::Deref for Closing {
    type Target = StreamConsumer<GroupContext>;
    fn deref(&self) -> &Self::Target {
        self.0
            .as_ref()
            .expect("the consumer is taken only at the end")
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            let _ = std::thread::Builder::new()
                .name("kafka-close".into())
                .spawn(move || drop(c));
        }
    }
}

/// What a record's event is made of, read out of librdkafka's message once. Kept while the
/// record is in flight, so that a retry makes the event again (the payload is shared, not
/// copied) instead of every record holding a copy of its event for a retry that seldom comes.
struct Record {
    tp: Tp,
    offset: i64,
    /// Held inline up to 24 bytes (most keys are short: an id, a customer number), so a
    /// record's key costs no allocation of its own.
    key: Option<SmallVec<[u8; 24]>>,
    payload: Option<Bytes>,
    /// The record's timestamp, in milliseconds since the epoch.
    millis: Option<i64>,
    headers: Vec<(Box<str>, Bytes)>,
    /// `format: argo`: when the record was read (the event's time), so that a retry carries
    /// the same time. Boxed: a record is moved between the take and its unit, and the plain
    /// format, which has no use for it, would carry its 48 bytes at every move.
    received: Option<Box<Timestamp>>,
}

impl Record {
    fn read(m: &BorrowedMessage<'_>, topic: Arc<str>) -> Record {
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        (
                            Box::from(h.key),
                            Bytes::copy_from_slice(h.value.unwrap_or_default()),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Record {
            tp: (topic, m.partition()),
            offset: m.offset(),
            key: m.key().map(SmallVec::from_slice),
            payload: m.payload().map(Bytes::copy_from_slice),
            millis: m.timestamp().to_millis(),
            headers,
            received: None,
        }
    }

    /// `<topic>-<partition>-<offset>`: the same for every delivery of the record. Held inline
    /// (no allocation) up to 24 bytes: a topic name of up to 12 with a partition below 100 and
    /// an offset below 10^8. Joined by compact_str from the pieces: built with `push_str` and
    /// `push`, which re-check the representation at every call, an id took about 340
    /// instructions.
    fn id(&self) -> Str {
        let (mut p, mut o) = (itoa::Buffer::new(), itoa::Buffer::new());
        let (p, o) = (p.format(self.tp.1), o.format(self.offset));
        [&*self.tp.0, "-", p, "-", o].into_iter().collect()
    }
}

/// The records of one unit in flight, all of one partition (of the assignment `generation`):
/// a run of records that were ready together, or one record sent again.
struct Handle {
    records: Vec<Record>,
    generation: u64,
}

/// A run of one partition's records taken together. Their events are made when the run is
/// offered, straight into the batch the pipeline takes: a record (about 200 bytes) and its
/// event (about 250) carried together through the take, the run and the offer were moved at
/// every step.
struct Run {
    tp: Tp,
    records: Vec<Record>,
    /// For parked records: the assignment they were read under. If the partition was revoked
    /// and assigned again since, they are stale (the new assignment reads them again from the
    /// commit) and are dropped.
    generation: Option<u64>,
}

impl Run {
    fn new(tp: Tp, capacity: usize) -> Run {
        Run {
            tp,
            records: Vec::with_capacity(capacity),
            generation: None,
        }
    }
}

/// Records taken from librdkafka at once at most: the first and those already waiting behind
/// it. Each run of one partition's records among them is one unit, so a backlog goes through
/// the pipeline in batches (one unit, one settle and one lock of the partitions per run) while
/// a trickle still goes one by one.
const BATCH: usize = 256;

/// The first attempt's outcome, or a retry after a backoff.
enum Attempt {
    First(Pending),
    Retry(Pin<Box<dyn Future<Output = Outcome> + Send>>),
}

impl Future for Attempt {
    type Output = Outcome;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        match self.get_mut() {
            Attempt::First(p) => Pin::new(p).poll(cx),
            Attempt::Retry(f) => f.as_mut().poll(cx),
        }
    }
}

fn retry(
    sender: SourceSender,
    event: Box<Event>,
    wait: Duration,
    stop: CancellationToken,
) -> Attempt {
    Attempt::Retry(Box::pin(async move {
        tokio::select! {
            _ = tokio::time::sleep(wait) => sender.send_boxed(vec![event]).await.await,
            _ = stop.cancelled() => Outcome {
                status: Status::Failed,
                reason: Some("shutting down before the retry".into()),
                events: 1,
                duplicates: 0,
                each: Vec::new(),
            },
        }
    }))
}

/// Whether the record's topic is named `name`, compared byte for byte with the name librdkafka
/// keeps for the topic.
fn same_name(m: &BorrowedMessage<'_>, name: &str) -> bool {
    // SAFETY: the message holds a reference to its topic, whose name librdkafka keeps as a
    // NUL-terminated string while the topic lives; it is only read here, while `m` is borrowed.
    let held =
        unsafe { std::ffi::CStr::from_ptr(rdkafka::bindings::rd_kafka_topic_name(m.topic_ptr())) };
    held.to_bytes() == name.as_bytes()
}

/// Tracks a run of one partition's records, in order, in the partition's watermark. The
/// records stay where the run holds them (each move of one copies about 150 bytes): those from
/// the first that finds the watermark full on are split off and returned, to be parked, with
/// `true`; positions already tracked (a redelivery) are taken out.
fn track(wm: &mut Watermark, records: &mut Vec<Record>) -> (Vec<Record>, bool) {
    let mut tracked = Vec::new();
    let mut full = None;
    for (i, record) in records.iter().enumerate() {
        match wm.push(record.offset as u64) {
            Ok(true) => {}
            Ok(false) => tracked.push(i),
            Err(_) => {
                full = Some(i);
                break;
            }
        }
    }
    let back = full.map(|i| records.split_off(i)).unwrap_or_default();
    if !tracked.is_empty() {
        let mut i = 0;
        let mut next = tracked.iter().peekable();
        records.retain(|_| {
            let known = next.next_if_eq(&&i).is_some();
            i += 1;
            !known
        });
    }
    (back, full.is_some())
}

/// The most of a payload the take loop asks the CPU to bring into its cache ahead of the copy
/// ([`sluice_core::hint::prefetch_bytes`]), line by line: enough for the usual record, and a
/// bound so that a large payload's prefetch stays small against the first-level cache. A
/// payload lies in librdkafka's fetch buffer, written by its broker thread a while before, and
/// copying it out of cold memory was 15–17 % of the source thread's samples in a `perf`
/// profile; asked for one record ahead, about 4 %. Asking for the first 256 bytes only saved
/// nothing measurable (docs/benchmarks.md, bus sources).
const PREFETCH_LIMIT: usize = 2048;

struct KafkaSource {
    name: String,
    consumer: Closing,
    shared: Arc<Mutex<Partitions>>,
    /// Cloned into each event: an inline `Str` is copied as one 24-byte value, where one made
    /// from a `&str` goes through a `memcpy` call.
    ty: Str,
    source: Str,
    /// `argo`: the events' subject.
    subject: Str,
    format: SourceFormat,
    json_body: bool,
    metadata: Arc<[u8]>,
    window: usize,
    commit_interval: Duration,
    on_rejected: OnRejected,
    telemetry: PullTelemetry,
}

impl KafkaSource {
    /// The record's event, made in its own allocation: it goes into the sink queues as it is
    /// ([`SourceSender::send_boxed`]). `topic` is the record's topic, made once for a run.
    fn to_event(&self, r: &Record, topic: &Str) -> Result<Box<Event>, EventError> {
        let headers: Vec<(&str, &[u8])> = r.headers.iter().map(|(k, v)| (&**k, &v[..])).collect();
        let payload = r.payload.clone();
        let time = r.millis.and_then(chrono::DateTime::from_timestamp_millis);
        let id = r.id();
        if self.format == SourceFormat::Argo {
            let mut data = Vec::with_capacity(payload.as_ref().map_or(0, Bytes::len) + 160);
            let head = serde_json::json!({
                "topic": &*r.tp.0,
                "key": r.key.as_deref().map(String::from_utf8_lossy),
                "partition": r.tp.1,
                "timestamp": time.map(argo::go_time),
            });
            let head = serde_json::to_vec(&head).map_err(|e| EventError(e.to_string()))?;
            data.extend_from_slice(&head[..head.len() - 1]);
            data.extend_from_slice(b",\"body\":");
            data.extend_from_slice(
                &argo::body(payload.as_deref().unwrap_or_default(), self.json_body)
                    .map_err(EventError)?,
            );
            let hmap: std::collections::BTreeMap<&str, String> = headers
                .iter()
                .map(|(k, v)| (*k, String::from_utf8_lossy(v).into_owned()))
                .collect();
            data.extend_from_slice(b",\"headers\":");
            serde_json::to_writer(&mut data, &hmap).map_err(|e| EventError(e.to_string()))?;
            data.extend_from_slice(b",\"metadata\":");
            data.extend_from_slice(&self.metadata);
            data.push(b'}');
            return Ok(Box::new(
                Event::new(id, self.source.clone(), self.ty.clone())
                    .with_subject(self.subject.clone())
                    .with_time(
                        r.received
                            .as_deref()
                            .cloned()
                            .unwrap_or_else(Timestamp::now),
                    )
                    .with_json(data),
            ));
        }
        if self.format == SourceFormat::ArgoEventbus {
            return match payload {
                Some(p) => sluice_core::format::decode_event(&p).map(Box::new),
                None => Err(EventError("an Argo EventBus record without a value".into())),
            };
        }
        let is_ce = headers.iter().any(|(k, v)| {
            *k == "ce_specversion"
                || (k.eq_ignore_ascii_case("content-type")
                    && v.len() >= 23
                    && v[..23].eq_ignore_ascii_case(b"application/cloudevents"))
        });
        if is_ce {
            return kafka_binding::decode(&headers, payload).map(Box::new);
        }
        // Fields set in place: each `with_*` moved the whole event (about 250 bytes) again.
        let mut e = Box::new(Event::new(id, self.source.clone(), self.ty.clone()));
        e.subject = Some(topic.clone());
        e.time = time.map(Timestamp::from_utc);
        // Sized once: an extension list grown from empty allocates for four (and a reserve on
        // an empty list goes through the general growth path).
        e.extensions = Vec::with_capacity(usize::from(r.key.is_some()) + headers.len());
        if let Some(k) = r.key.as_deref().and_then(|k| std::str::from_utf8(k).ok()) {
            e.extensions.push((
                Str::const_new("partitionkey"),
                ExtValue::String(Str::new(k)),
            ));
        }
        let mut ct = None;
        for (k, v) in &headers {
            if k.eq_ignore_ascii_case("content-type") {
                ct = std::str::from_utf8(v).ok().map(str::to_owned);
                continue;
            }
            let name = extension_name_from(k);
            let Ok(value) = std::str::from_utf8(v) else {
                continue;
            };
            // Invalid or reserved names (`id`, `data`, ...) are skipped, repeats below.
            if check_extension_name(&name).is_err() {
                continue;
            }
            e.extensions.push((name, ExtValue::String(Str::new(value))));
        }
        sluice_core::event::keep_first_of_each_name(&mut e.extensions, |(n, _)| n);
        if let Some(p) = payload {
            e.data = Data::from_bytes(p, ct.as_deref());
            e.datacontenttype = ct;
        }
        // What came from the record is checked (the content type, the extensions' values,
        // their names above); the rest is ours: the id, the topic as subject, and `source`
        // and `type`, checked once at `validate`.
        if let Some(ct) = &e.datacontenttype {
            check_media_type(ct)?;
        }
        for (name, value) in &e.extensions {
            if let ExtValue::String(v) = value {
                check_string(name, v, false)?;
            }
        }
        Ok(e)
    }

    /// Resumes a partition paused for a full watermark, once its parked records are taken.
    fn resume(&self, tp: &Tp) {
        let was = {
            let mut s = self.shared.lock().unwrap_or_else(|x| x.into_inner());
            match s.parts.get_mut(tp) {
                Some(part) if part.paused => {
                    part.paused = false;
                    true
                }
                _ => false,
            }
        };
        if was {
            self.pause(tp, false);
        }
    }

    fn pause(&self, tp: &Tp, pause: bool) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&tp.0, tp.1);
        let r = if pause {
            self.consumer.pause(&tpl)
        } else {
            self.consumer.resume(&tpl)
        };
        if let Err(e) = r {
            tracing::debug!(source = %self.name, error = %e, "kafka: pause/resume");
        }
    }

    /// The current assignment's generation of a partition (`None`: not assigned).
    fn generation_of(&self, tp: &Tp) -> Option<u64> {
        self.assignment_of(tp).map(|(g, _)| g)
    }

    /// A partition's current generation and the room in its watermark (`None`: not assigned).
    fn assignment_of(&self, tp: &Tp) -> Option<(u64, usize)> {
        let s = self.shared.lock().unwrap_or_else(|x| x.into_inner());
        s.parts.get(tp).map(|p| (p.generation, p.wm.room()))
    }

    /// Tracks a run of one partition's records in its watermark and sends their events as one
    /// unit. The caller has checked the window's room. Returns, in order, the records to park:
    /// from the first that finds the watermark full (the partition is then paused) on, with the
    /// generation of the assignment they belong to.
    async fn offer(
        &self,
        ctx: &SourceContext,
        run: Run,
        window: &mut InFlight<Handle, Attempt>,
        in_flight: &mut usize,
    ) -> (Vec<Record>, u64) {
        let Run {
            tp,
            records: mut kept,
            generation: read_under,
        } = run;
        let (generation, back, pause) = {
            let mut s = self.shared.lock().unwrap_or_else(|x| x.into_inner());
            let Some(part) = s
                .parts
                .get_mut(&tp)
                .filter(|p| read_under.is_none_or(|g| g == p.generation))
            else {
                // Revoked meanwhile: the new owner (this member again, if it got the partition
                // back) reads them again from the commit.
                return (Vec::new(), 0);
            };
            let (back, full) = track(&mut part.wm, &mut kept);
            // Paused once, by the run that first finds the watermark full.
            let pause = full && !part.paused;
            part.paused |= full;
            (part.generation, back, pause)
        };
        if pause {
            self.pause(&tp, true);
        }
        // The events, made outside the lock. A record that is not a valid event is skipped:
        // delivered in its partition's order, so the commit passes it in its turn.
        let mut sent = Vec::with_capacity(kept.len());
        let mut invalid = Vec::new();
        // `Str::new`, not `to_string`: an `Arc<str>` formats itself through `Display`.
        let topic = Str::new(&*tp.0);
        kept.retain(|record| match self.to_event(record, &topic) {
            Ok(event) => {
                sent.push(event);
                true
            }
            Err(e) => {
                tracing::warn!(source = %self.name, topic = %record.tp.0, partition = record.tp.1, offset = record.offset, error = %e, "kafka: not a valid CloudEvent; skipped (committed past)");
                ctx.sender.telemetry().rejected("invalid_event", 1);
                invalid.push(record.offset as u64);
                false
            }
        });
        if !invalid.is_empty() {
            let mut s = self.shared.lock().unwrap_or_else(|x| x.into_inner());
            // Revoked meanwhile: the new owner reads them again (and skips them in its turn).
            if let Some(part) = s.parts.get_mut(&tp).filter(|p| p.generation == generation) {
                for &pos in &invalid {
                    part.wm.delivered(pos);
                }
                part.wm.advance(|_| ());
            }
        }
        // A run that took its batch's whole buffer and lost most of it here (parked past a full
        // watermark, redelivered or invalid) gives the spare room back, so that a unit in
        // flight holds at most twice its records' size.
        if kept.len() * 2 < kept.capacity() {
            kept.shrink_to_fit();
        }
        if !kept.is_empty() {
            *in_flight += kept.len();
            let pending = ctx.sender.send_boxed(sent).await;
            window.push(
                Handle {
                    records: kept,
                    generation,
                },
                Attempt::First(pending),
            );
        }
        self.telemetry.in_flight.set(*in_flight as f64);
        (back, generation)
    }

    /// Records a unit's outcome, record by record; returns an error when `on_rejected: stop`
    /// hits. A failed record is sent again on its own after a backoff; its delivered
    /// neighbours are not.
    fn settle(
        &self,
        ctx: &SourceContext,
        h: Handle,
        outcome: Outcome,
        window: &mut InFlight<Handle, Attempt>,
        in_flight: &mut usize,
        stop: &CancellationToken,
    ) -> Result<(), String> {
        // A failed record's event is made again from the record (the same event: its id is the
        // record's position), before the lock is taken.
        let mut again: Vec<Option<Box<Event>>> = Vec::new();
        if !outcome.is_delivered() && !stop.is_cancelled() {
            again = h
                .records
                .iter()
                .enumerate()
                .map(|(i, r)| match outcome.status_of(i) {
                    Status::Failed | Status::InFlight => match self.to_event(r, &Str::new(&*r.tp.0)) {
                        Ok(e) => Some(e),
                        Err(e) => {
                            tracing::warn!(source = %self.name, topic = %r.tp.0, partition = r.tp.1, offset = r.offset, error = %e, "kafka: the event of a failed record could not be made again; skipped (committed past)");
                            None
                        }
                    },
                    _ => None,
                })
                .collect();
        }
        let n = h.records.len();
        let (mut acked, mut skipped, mut failed) = (0, 0, 0);
        let mut retries = Vec::new();
        let mut result = Ok(());
        let mut s = self.shared.lock().unwrap_or_else(|x| x.into_inner());
        let generation = h.generation;
        let part = h.records.first().and_then(|r| {
            s.parts
                .get_mut(&r.tp)
                .filter(|p| p.generation == generation)
        });
        // None: revoked, what was committed stays.
        if let Some(part) = part {
            if outcome.is_delivered() {
                // Every record delivered: read in place, not moved out one by one.
                for record in &h.records {
                    part.wm.delivered(record.offset as u64);
                }
                acked = n as u64;
            } else {
                for (i, record) in h.records.into_iter().enumerate() {
                    let pos = record.offset as u64;
                    match outcome.status_of(i) {
                        Status::Delivered => {
                            part.wm.delivered(pos);
                            acked += 1;
                        }
                        Status::Rejected => match self.on_rejected {
                            OnRejected::Skip => {
                                tracing::warn!(source = %self.name, topic = %record.tp.0, partition = record.tp.1, offset = record.offset, reason = outcome.reason.as_deref().unwrap_or(""), "kafka: a sink rejected the event; committed past it (on_rejected: skip)");
                                part.wm.delivered(pos);
                                skipped += 1;
                            }
                            OnRejected::Stop => {
                                result = Err(format!(
                                "a sink rejected the event of {}-{} offset {} ({}); stopping with the commit before it (on_rejected: stop)",
                                record.tp.0,
                                record.tp.1,
                                record.offset,
                                outcome.reason.as_deref().unwrap_or("no reason")
                            ));
                                break;
                            }
                        },
                        Status::Failed | Status::InFlight => {
                            let attempts = part.wm.failed(pos).unwrap_or(1);
                            failed += 1;
                            if stop.is_cancelled() {
                                continue; // held: not committed, read again after the restart
                            }
                            match again.get_mut(i).and_then(Option::take) {
                                Some(event) => retries.push((record, event, attempts)),
                                // Made once already, so this cannot fail; if it did, the record
                                // is skipped as one that was never a valid event.
                                None => {
                                    part.wm.delivered(pos);
                                }
                            }
                        }
                    }
                }
            }
            part.wm.advance(|_| ());
        }
        drop(s);
        *in_flight -= n - retries.len();
        if acked > 0 {
            self.telemetry.settled(Settled::Ack, acked);
        }
        if skipped > 0 {
            self.telemetry.settled(Settled::Reject, skipped);
        }
        if failed > 0 {
            self.telemetry.settled(Settled::Retry, failed);
        }
        for (record, event, attempts) in retries {
            self.telemetry.redeliveries.increment(1);
            let wait = Backoff::RETRY.after(attempts);
            window.push(
                Handle {
                    records: vec![record],
                    generation,
                },
                retry(ctx.sender.clone(), event, wait, stop.clone()),
            );
        }
        self.telemetry.in_flight.set(*in_flight as f64);
        result
    }

    /// Commits every partition whose commit point moved.
    fn commit(&self, mode: CommitMode) {
        let mut tpl = TopicPartitionList::new();
        {
            let mut s = self.shared.lock().unwrap_or_else(|x| x.into_inner());
            for (tp, part) in s.parts.iter_mut() {
                if let Some(point) = part.wm.commit_point() {
                    if part.committed != Some(point) {
                        let _ = tpl.add_partition_offset(&tp.0, tp.1, Offset::Offset(point as i64));
                        part.committed = Some(point);
                    }
                }
            }
        }
        if tpl.count() == 0 {
            return;
        }
        match self.consumer.commit(&tpl, mode) {
            Ok(()) => self.telemetry.commits.increment(1),
            Err(e) => {
                tracing::warn!(source = %self.name, error = %e, "kafka: commit failed; retried at the next interval");
                let mut s = self.shared.lock().unwrap_or_else(|x| x.into_inner());
                for e in tpl.elements() {
                    if let Some(p) = s.parts.get_mut(&(Arc::from(e.topic()), e.partition())) {
                        p.committed = None;
                    }
                }
            }
        }
    }

    /// `sluice_source_lag`, at every commit interval: records behind the end of the log,
    /// summed over the assigned partitions. Per partition, the high watermark (librdkafka keeps
    /// it from every fetch response, without a request) less the first offset not yet
    /// delivered in order (the first one read while none is); a partition with neither yet is
    /// left out. The high watermark counts records of transactions still open, which a
    /// `read_committed` consumer (the default) reads only once they commit, and it stands still
    /// while a partition is paused (no fetches).
    fn update_lag(&self) {
        let from: Vec<(Tp, u64)> = {
            let s = self.shared.lock().unwrap_or_else(|x| x.into_inner());
            s.parts
                .iter()
                .filter_map(|(tp, p)| {
                    let at = p.wm.commit_point().or_else(|| p.wm.oldest())?;
                    Some((tp.clone(), at))
                })
                .collect()
        };
        let lag: i64 = from
            .iter()
            .filter_map(|(tp, at)| Some((self.high_watermark(tp)? - *at as i64).max(0)))
            .sum();
        self.telemetry.lag.set(lag as f64);
    }

    /// The partition's end of the log as librdkafka last saw it in a fetch response (no request
    /// is made); `None` before its first fetch. The rdkafka crate wraps only the variant that
    /// asks the broker (`fetch_watermarks`, blocking).
    fn high_watermark(&self, tp: &Tp) -> Option<i64> {
        let topic = std::ffi::CString::new(&*tp.0).ok()?;
        let (mut low, mut high) = (-1i64, -1i64);
        // librdkafka looks the partition up under its client-wide lock (marking it wanted, as the
        // assignment has it already): once per assigned partition per commit interval.
        // SAFETY: the client handle is alive while `self.consumer` holds it; `topic` is a
        // NUL-terminated string that outlives the call, which only reads it and writes the two
        // offsets through the pointers given.
        let err = unsafe {
            rdkafka::bindings::rd_kafka_get_watermark_offsets(
                self.consumer.client().native_ptr(),
                topic.as_ptr(),
                tp.1,
                &mut low,
                &mut high,
            )
        };
        (err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
    }

    /// What a record taken from librdkafka becomes: its parts, copied out of librdkafka's
    /// message (its event is made when it is offered).
    fn take(&self, m: &BorrowedMessage<'_>, topic: &mut Arc<str>) -> Record {
        // One topic's name is shared by its records, not allocated per record. Compared as
        // librdkafka holds it: `Message::topic` checks it is UTF-8 again for every record
        // (about 1 % of an event's instructions), which a name equal to one already checked is.
        if !same_name(m, topic) {
            *topic = Arc::from(m.topic());
        }
        let mut record = Record::read(m, topic.clone());
        if self.format == SourceFormat::Argo {
            record.received = Some(Box::new(Timestamp::now()));
        }
        record
    }

    async fn run(mut self, ctx: SourceContext) -> Result<(), ConnectorError> {
        let err = |m: String| ConnectorError(format!("kafka source {}: {m}", self.name));
        // Entries are units (a batch, or one record sent again); records in flight are counted
        // in `in_flight` and bounded by the window, so entries are too.
        let mut window: InFlight<Handle, Attempt> = InFlight::unleased(self.window);
        let mut in_flight = 0usize;
        // Records taken from librdkafka that found no room yet, per partition, in order;
        // bounded by the window (no more are taken while it is full).
        // Each with the generation of the assignment it was read under.
        let mut parked: HashMap<Tp, VecDeque<(Record, u64)>> = HashMap::new();
        let mut parked_total = 0usize;
        // The records one wake-up takes, before they are split into runs (kept across batches).
        let mut taken_now: Vec<Record> = Vec::with_capacity(BATCH);
        let mut topic: Arc<str> = Arc::from("");
        let mut commits = tokio::time::interval(self.commit_interval);
        commits.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let stop = ctx.shutdown.clone();
        let mut failure = None;
        // One stream for the source's life: `recv` registers and drops a waker slot per record.
        let mut stream = self.consumer.stream();
        loop {
            let stopping = stop.is_cancelled();
            if stopping {
                // Parked records are not tracked: read again after the restart.
                parked.clear();
                parked_total = 0;
                if window.is_empty() {
                    break;
                }
            }
            if parked_total > 0 && in_flight < self.window {
                let keys: Vec<Tp> = parked.keys().cloned().collect();
                for tp in keys {
                    let q = parked.get_mut(&tp).expect("a parked partition");
                    // Records of one assignment at a time.
                    let g = q.front().expect("a parked record").1;
                    let same = |q: &VecDeque<(Record, u64)>, at_most: usize| {
                        q.iter().take(at_most).take_while(|t| t.1 == g).count()
                    };
                    let take = match self.assignment_of(&tp) {
                        Some((now, room)) if now == g => {
                            if room == 0 {
                                continue; // its watermark is still full
                            }
                            same(q, room.min(self.window - in_flight))
                        }
                        // Revoked (and perhaps assigned again since): whoever has the partition
                        // now reads these again from the commit.
                        _ => {
                            let same = same(q, usize::MAX);
                            q.drain(..same);
                            parked_total -= same;
                            if q.is_empty() {
                                parked.remove(&tp);
                            }
                            continue;
                        }
                    };
                    let mut run = Run::new(tp.clone(), take);
                    run.generation = Some(g);
                    run.records.extend(q.drain(..take).map(|(t, _)| t));
                    parked_total -= take;
                    let (back, g) = self.offer(&ctx, run, &mut window, &mut in_flight).await;
                    parked_total += back.len();
                    let q = parked.get_mut(&tp).expect("a parked partition");
                    for t in back.into_iter().rev() {
                        q.push_front((t, g));
                    }
                    if q.is_empty() {
                        parked.remove(&tp);
                        self.resume(&tp);
                    }
                    if in_flight >= self.window {
                        break;
                    }
                }
            }
            // Records are taken from librdkafka only while there is room: its prefetch
            // (queued.min.messages, queued.max.messages.kbytes) holds the rest.
            let pulling = !stopping && in_flight < self.window && parked_total < self.window;
            tokio::select! {
                biased;
                Some((h, outcome)) = window.next(), if !window.is_empty() => {
                    if let Err(m) = self.settle(&ctx, h, outcome, &mut window, &mut in_flight, &stop) {
                        failure = Some(m);
                        break;
                    }
                }
                _ = commits.tick() => {
                    self.commit(CommitMode::Async);
                    self.update_lag();
                }
                _ = stop.cancelled(), if !stopping => {}
                m = stream.next(), if pulling => match m.expect("kafka streams never end") {
                    Ok(m) => {
                        // This record and those already waiting behind it, as one unit.
                        let max = (self.window - in_flight)
                            .min(self.window - parked_total)
                            .min(BATCH);
                        let mut m = m;
                        let mut taken = 0;
                        loop {
                            // librdkafka's queue is not a tokio resource: a full one never
                            // makes this task wait, so without this it would keep the thread
                            // from every other task (the admin server's /metrics and /health
                            // included).
                            tokio::task::consume_budget().await;
                            // The next record, if one is ready now, is asked for before this
                            // one is taken, so that its payload is on its way into the cache
                            // while this one's is copied.
                            let next = if taken + 1 < max {
                                match std::future::poll_fn(|cx| {
                                    Poll::Ready(Pin::new(&mut stream).poll_next(cx))
                                })
                                .await
                                {
                                    Poll::Ready(Some(next)) => Some(next),
                                    _ => None,
                                }
                            } else {
                                None
                            };
                            if let Some(p) = next.as_ref().and_then(|n| n.as_ref().ok()?.payload()) {
                                sluice_core::hint::prefetch_bytes(p, PREFETCH_LIMIT);
                            }
                            let record = self.take(&m, &mut topic);
                            drop(m);
                            taken += 1;
                            // Behind its partition's parked records, if it has any.
                            let behind = if parked_total > 0 {
                                parked.get_mut(&record.tp)
                            } else {
                                None
                            };
                            match behind {
                                Some(q) => {
                                    // Not assigned any more: the new owner reads it.
                                    if let Some(g) = self.generation_of(&record.tp) {
                                        q.push_back((record, g));
                                        parked_total += 1;
                                    }
                                }
                                None => taken_now.push(record),
                            }
                            m = match next {
                                Some(Ok(next)) => next,
                                Some(Err(e)) => {
                                    tracing::warn!(source = %self.name, error = %e, "kafka: consumer error");
                                    break;
                                }
                                None => break,
                            };
                        }
                        // Runs of one partition's records: a unit holds one run, so a slow
                        // event holds back only neighbours its partition's commit waits for
                        // anyway. Each run is sized to its records (they are large, and a run
                        // grown by doubling moved each of them again: 3 % of a Kafka → null
                        // event's instructions) and the buffer they were taken into is kept,
                        // unless the batch is one run that fills at least half of it: then
                        // the buffer is the run (a unit's records hold at most twice their
                        // size) and a new one is taken.
                        let mut runs: Vec<(Run, usize)> = taken_now
                            .chunk_by(|a, b| a.tp == b.tp)
                            .map(|c| (Run::new(c[0].tp.clone(), 0), c.len()))
                            .collect();
                        if let [(run, len)] = &mut runs[..] {
                            if *len >= BATCH / 2 {
                                // The usual batch of a backlog: its records stay where they
                                // were taken.
                                run.records = std::mem::replace(
                                    &mut taken_now,
                                    Vec::with_capacity(BATCH),
                                );
                            }
                        }
                        let mut rest = taken_now.drain(..);
                        for (run, len) in &mut runs {
                            if run.records.is_empty() {
                                run.records.reserve_exact(*len);
                                run.records.extend(rest.by_ref().take(*len));
                            }
                        }
                        drop(rest);
                        for (run, _) in runs {
                            let (back, g) = if parked_total > 0 && parked.contains_key(&run.tp) {
                                // An earlier run of its partition was parked: behind it.
                                match self.generation_of(&run.tp) {
                                    Some(g) => (run.records, g),
                                    None => (Vec::new(), 0), // not assigned any more
                                }
                            } else {
                                self.offer(&ctx, run, &mut window, &mut in_flight).await
                            };
                            for t in back {
                                parked.entry(t.tp.clone()).or_default().push_back((t, g));
                                parked_total += 1;
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(source = %self.name, error = %e, "kafka: consumer error");
                    }
                },
            }
        }
        drop(stream);
        // Final commit of what was delivered, then leave the group.
        self.commit(CommitMode::Sync);
        self.consumer.unsubscribe();
        let result = match failure {
            Some(m) => Err(err(m)),
            None => Ok(()),
        };
        // Closing leaves the group (its revoke commits again, synchronously): it blocks, so
        // not on a runtime worker.
        let name = self.name.clone();
        // Bounded: with the brokers gone the close does not return (the thread is left to the
        // process exit).
        let consumer = self.consumer.take();
        let closing = tokio::task::spawn_blocking(move || drop(consumer));
        if tokio::time::timeout(Duration::from_secs(5), closing)
            .await
            .is_err()
        {
            tracing::warn!(source = %self.name, "kafka: leaving the group did not finish within 5s (brokers unreachable?); the group reassigns the partitions after session.timeout.ms");
        }
        tracing::debug!(source = %name, "kafka source stopped");
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(properties: serde_json::Value) -> KafkaSourceConfig {
        serde_json::from_value(serde_json::json!({
            "brokers": "127.0.0.1:9092", "group": "g", "topics": ["t"], "properties": properties,
        }))
        .unwrap()
    }

    fn record(offset: i64) -> Record {
        Record {
            tp: (Arc::from("t"), 0),
            offset,
            key: None,
            payload: None,
            millis: None,
            headers: Vec::new(),
            received: None,
        }
    }

    fn offsets(records: &[Record]) -> Vec<i64> {
        records.iter().map(|r| r.offset).collect()
    }

    #[test]
    fn a_run_keeps_new_positions_drops_known_ones_and_splits_off_at_a_full_watermark() {
        let mut wm = Watermark::new(5);
        let mut run: Vec<Record> = [3, 4, 5].map(record).into();
        let (back, full) = track(&mut wm, &mut run);
        assert_eq!((offsets(&run), back.len(), full), (vec![3, 4, 5], 0, false));
        // 4 and 5 again (a redelivery) are taken out; 6 and 7 are new; 8 finds the bound of 5
        // positions reached, so it and what follows it are returned to park, in order.
        let mut run: Vec<Record> = [4, 5, 6, 7, 8, 9].map(record).into();
        let (back, full) = track(&mut wm, &mut run);
        assert_eq!(offsets(&run), [6, 7]);
        assert_eq!((offsets(&back), full), (vec![8, 9], true));
        // Known positions between new ones, nothing full.
        let mut wm = Watermark::new(100);
        let mut run: Vec<Record> = [10, 11].map(record).into();
        track(&mut wm, &mut run);
        let mut run: Vec<Record> = [10, 12, 11, 13].map(record).into();
        let (back, full) = track(&mut wm, &mut run);
        assert_eq!((offsets(&run), back.len(), full), (vec![12, 13], 0, false));
    }

    #[test]
    fn fetches_are_a_quarter_of_the_prefetch_bound_unless_set() {
        let fetch = |p: serde_json::Value| {
            let c = config(p);
            c.validate("k").unwrap();
            c.client_config()
                .get("fetch.max.bytes")
                .unwrap()
                .to_string()
        };
        assert_eq!(fetch(serde_json::json!({})), (4 << 20).to_string());
        assert_eq!(
            fetch(serde_json::json!({"queued.max.messages.kbytes": 65536})),
            (16 << 20).to_string()
        );
        // Never below `message.max.bytes`, which librdkafka refuses.
        assert_eq!(
            fetch(serde_json::json!({"queued.max.messages.kbytes": "1024"})),
            "1000000"
        );
        assert_eq!(
            fetch(
                serde_json::json!({"queued.max.messages.kbytes": 1024, "message.max.bytes": 2000000})
            ),
            "2000000"
        );
        // Never above librdkafka's own 50 MiB, which would raise `receive.message.max.bytes`
        // past its bound, or refuse the one a user set.
        assert_eq!(
            fetch(
                serde_json::json!({"queued.max.messages.kbytes": 262144, "receive.message.max.bytes": 60000000})
            ),
            (50 << 20).to_string()
        );
        // A value read otherwise than librdkafka reads it: librdkafka decides.
        let c = config(serde_json::json!({"message.max.bytes": "0x7A1200"}));
        assert_eq!(c.client_config().get("fetch.max.bytes"), None);
        // A user's own value wins.
        assert_eq!(
            fetch(serde_json::json!({"fetch.max.bytes": 52428800})),
            "52428800"
        );
    }
}
