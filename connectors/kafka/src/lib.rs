//! `kind: kafka` — produces events to Kafka with rdkafka (bundled librdkafka): an idempotent
//! producer with `acks=all`, where an event counts as delivered only on its delivery report.

pub mod argo;
mod source;

use std::time::Duration as StdDuration;

use bytes::Bytes;
use indexmap::IndexMap;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use serde::Deserialize;
use sluice_core::kafka_binding;
use sluice_core::pipeline::{SinkWindow, Step};
use sluice_core::template::Template;
use sluice_core::units::HumanDuration;
use sluice_core::{
    format, BoxFuture, ConnectorError, Delivery, Event, Running, SinkConfig, SinkContext, SinkItem,
};

pub use source::{KafkaSourceConfig, OnRejected, SourceFormat, Start};

/// How events travel (CloudEvents Kafka binding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `ce_*` headers, `content-type` = `datacontenttype`, data as the value (default).
    #[default]
    Binary,
    /// The whole event as JSON, `content-type: application/cloudevents+json`.
    Structured,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Compression {
    fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

/// A librdkafka property value as YAML writes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum PropValue {
    Str(String),
    Int(i64),
    Bool(bool),
}

impl PropValue {
    fn text(&self) -> String {
        match self {
            PropValue::Str(s) => s.clone(),
            PropValue::Int(i) => i.to_string(),
            PropValue::Bool(b) => b.to_string(),
        }
    }
}

/// `kind: kafka` options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// Topic template over event attributes, e.g. `events.{type}`. A filled-in value keeps
    /// letters, digits, `.`, `-`, `_`; any other character becomes `_`.
    pub topic: String,
    #[serde(default)]
    pub mode: Mode,
    /// Record key template (values used as they are). Default: the `partitionkey` extension,
    /// or no key when the event has none.
    pub key: Option<String>,
    #[serde(default)]
    pub compression: Compression,
    /// Records awaiting their delivery report at once (1 to 1000000). librdkafka's own queue
    /// (`queue.buffering.max.messages`) is set to the same bound. Default 10000.
    #[serde(default = "default_in_flight")]
    pub max_in_flight: usize,
    /// How long librdkafka keeps trying one record (`message.timeout.ms`) before it reports it
    /// failed. Default 30s.
    #[serde(default = "default_message_timeout")]
    pub message_timeout: HumanDuration,
    /// Any librdkafka producer property, passed through (`linger.ms`, `security.protocol`,
    /// `sasl.*`, ...). `enable.idempotence` and `acks` cannot be weakened.
    #[serde(default)]
    pub properties: IndexMap<String, PropValue>,
}

fn default_in_flight() -> usize {
    10_000
}
fn default_message_timeout() -> HumanDuration {
    HumanDuration::from_secs(30)
}

/// Kafka topic names: at most 249 of `[a-zA-Z0-9._-]`.
const MAX_TOPIC: usize = 249;

fn topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-'
}

fn push_topic_value(out: &mut String, v: &str) {
    if v.is_empty() {
        out.push('_');
        return;
    }
    out.extend(v.chars().map(|c| if topic_char(c) { c } else { '_' }));
}

impl KafkaConfig {
    fn templates(&self) -> Result<(Template, Option<Template>), String> {
        let topic = Template::parse("topic", &self.topic)?;
        if let Some(c) = topic.literal().chars().find(|c| !topic_char(*c)) {
            return Err(format!(
                "topic {:?}: {c:?} cannot be in a Kafka topic name (letters, digits, `.`, `_`, `-`)",
                self.topic
            ));
        }
        if topic.is_fixed()
            && (self.topic.len() > MAX_TOPIC || self.topic == "." || self.topic == "..")
        {
            return Err(format!(
                "topic {:?}: not a valid Kafka topic name",
                self.topic
            ));
        }
        let key = self
            .key
            .as_deref()
            .map(|k| Template::parse("key", k))
            .transpose()?;
        Ok((topic, key))
    }

    fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("client.id", "sluice")
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("compression.type", self.compression.as_str())
            .set(
                "queue.buffering.max.messages",
                self.max_in_flight.to_string(),
            )
            .set(
                "message.timeout.ms",
                self.message_timeout.get().as_millis().to_string(),
            );
        for (k, v) in &self.properties {
            c.set(k, v.text());
        }
        c
    }
}

impl SinkConfig for KafkaConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        self.templates()?;
        if self.brokers.trim().is_empty() {
            return Err("brokers: give at least one host:port".into());
        }
        if self.max_in_flight == 0 || self.max_in_flight > 1_000_000 {
            return Err("max_in_flight must be between 1 and 1000000".into());
        }
        if self.message_timeout.get() < StdDuration::from_millis(1) {
            return Err("message_timeout must be above 0".into());
        }
        for (k, v) in &self.properties {
            let v = v.text();
            let weak = match k.as_str() {
                "enable.idempotence" => v != "true",
                "acks" | "request.required.acks" => v != "all" && v != "-1",
                "bootstrap.servers" | "metadata.broker.list" => {
                    return Err(format!("properties.{k}: set `brokers` instead"))
                }
                _ => false,
            };
            if weak {
                return Err(format!(
                    "properties.{k}: {v:?} would weaken delivery; the sink needs enable.idempotence=true and acks=all to report an event delivered only once Kafka has it"
                ));
            }
        }
        // librdkafka checks names and values: let it, now, without connecting.
        self.client_config()
            .create::<FutureProducer>()
            .map(drop)
            .map_err(|e| format!("properties: {e}"))
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("kafka sink {name}: {m}"));
            let (topic, key) = self.templates().map_err(err)?;
            let producer: FutureProducer = self
                .client_config()
                .create()
                .map_err(|e| err(format!("cannot create the producer: {e}")))?;
            // Fail the build when no broker answers at all, rather than queueing blindly.
            let probe = producer.clone();
            probe_brokers(&self.brokers, move || {
                probe
                    .client()
                    .fetch_metadata(None, StdDuration::from_secs(10))
                    .map(drop)
            })
            .await
            .map_err(err)?;
            tracing::info!(sink = %ctx.name, brokers = %self.brokers, topic = %self.topic, "kafka sink ready");
            let sink = KafkaSink {
                name: ctx.name.clone(),
                producer,
                topic,
                key,
                mode: self.mode,
                window: self.max_in_flight,
                in_flight: metrics::gauge!(sluice_core::telemetry::SINK_IN_FLIGHT, "sink" => ctx.name.clone()),
            };
            Ok(Box::pin(sink.run(ctx)) as Running)
        })
    }
}

/// Runs a metadata request (blocking, so on the blocking pool): a connector's build fails when no
/// broker answers within its 10 s, rather than queueing blindly.
pub(crate) async fn probe_brokers(
    brokers: &str,
    fetch: impl FnOnce() -> rdkafka::error::KafkaResult<()> + Send + 'static,
) -> Result<(), String> {
    tokio::task::spawn_blocking(fetch)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot reach the brokers {brokers} within 10s: {e}"))
}

struct KafkaSink {
    name: String,
    producer: FutureProducer,
    topic: Template,
    key: Option<Template>,
    mode: Mode,
    window: usize,
    in_flight: metrics::Gauge,
}

/// One encoded record.
struct Record {
    topic: String,
    key: Option<String>,
    headers: OwnedHeaders,
    payload: Option<Bytes>,
}

/// One record awaiting its delivery report (it settles its event itself).
type AwaitingReport = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl KafkaSink {
    fn encode(&self, e: &Event) -> Result<Record, String> {
        let topic = self.topic.render_with(e, push_topic_value);
        if topic.len() > MAX_TOPIC || topic == "." || topic == ".." {
            return Err(format!(
                "topic {topic:?} is not a valid Kafka topic name (at most {MAX_TOPIC} characters)"
            ));
        }
        let key = match &self.key {
            Some(t) => Some(t.render_with(e, |o, v| o.push_str(v))),
            None => e
                .extension("partitionkey")
                .map(|v| v.to_canonical().into_owned()),
        };
        let mut headers = OwnedHeaders::new();
        let payload = match self.mode {
            Mode::Binary => {
                for (k, v) in kafka_binding::binary_headers("ce_", e) {
                    headers = headers.insert(Header {
                        key: &k,
                        value: Some(&*v),
                    });
                }
                e.data.as_bytes().cloned()
            }
            Mode::Structured => {
                headers = headers.insert(Header {
                    key: "content-type",
                    value: Some(format::STRUCTURED_CONTENT_TYPE),
                });
                Some(Bytes::from(format::encode_event(e)))
            }
        };
        Ok(Record {
            topic,
            key,
            headers,
            payload,
        })
    }

    /// Enqueues one record with librdkafka. On a full local queue, waits for a delivery report
    /// (settling it) and tries again. With nothing of ours awaiting a report, the queue is full
    /// only for a moment (reported records are still being freed) or because this record alone
    /// does not fit (`queue.buffering.max.kbytes` below its size): short waits, then the
    /// record's error, instead of retrying forever.
    async fn enqueue(
        &self,
        record: &Record,
        in_flight: &mut SinkWindow<AwaitingReport>,
    ) -> Result<DeliveryFuture, KafkaError> {
        let mut idle_waits = 0u32;
        loop {
            let mut r =
                FutureRecord::<str, [u8]>::to(&record.topic).headers(record.headers.clone());
            if let Some(k) = &record.key {
                r = r.key(k.as_str());
            }
            if let Some(p) = &record.payload {
                r = r.payload(&p[..]);
            }
            match self.producer.send_result(r) {
                Ok(f) => return Ok(f),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                    if !in_flight.is_empty() =>
                {
                    in_flight.settle_one().await;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                    if idle_waits < 100 =>
                {
                    idle_waits += 1;
                    tokio::time::sleep(StdDuration::from_millis(10)).await;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    async fn run(self, mut ctx: SinkContext) -> Result<(), ConnectorError> {
        let mut batch: Vec<SinkItem> = Vec::with_capacity(256.min(self.window));
        let mut in_flight: SinkWindow<AwaitingReport> = SinkWindow::new(self.window);
        loop {
            let input = &mut ctx.input;
            let step = in_flight
                .step(&ctx.grace_over, true, |room| {
                    input.recv_many(&mut batch, room.min(256))
                })
                .await;
            match step {
                // Grace over: what waits for a report is dropped, each counted as failed.
                Step::GraceOver => break,
                Step::Settled | Step::Idle => {}
                Step::Input(0) => {
                    // Input done: wait for every outstanding report (each bounded by
                    // message_timeout).
                    in_flight.drain().await;
                    break;
                }
                Step::Input(_) => {
                    for SinkItem { event, delivery } in batch.drain(..) {
                        let record = match self.encode(&event) {
                            Ok(r) => r,
                            Err(e) => {
                                delivery.rejected(e);
                                continue;
                            }
                        };
                        match self.enqueue(&record, &mut in_flight).await {
                            Ok(report) => {
                                let gauge = self.in_flight.clone();
                                gauge.increment(1.0);
                                in_flight.push(Box::pin(async move {
                                    settle(delivery, report.await);
                                    gauge.decrement(1.0);
                                }));
                            }
                            Err(e) => fail(delivery, &e),
                        }
                    }
                }
            }
        }
        self.in_flight.set(0.0);
        tracing::debug!(sink = %self.name, "kafka: stopped");
        Ok(())
    }
}

fn settle<E>(
    delivery: Delivery,
    report: Result<rdkafka::producer::future_producer::OwnedDeliveryResult, E>,
) {
    match report {
        Ok(Ok(_)) => delivery.delivered(),
        Ok(Err((e, _))) => fail(delivery, &e),
        Err(_) => delivery.failed("the producer stopped before reporting the record"),
    }
}

fn fail(delivery: Delivery, e: &KafkaError) {
    let permanent = matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::InvalidTopic
        )
    );
    let reason = format!("Kafka did not take the record: {e}");
    if permanent {
        delivery.rejected(reason);
    } else {
        delivery.failed(reason);
    }
}
