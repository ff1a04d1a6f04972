//! THE list of connector kinds. This is the one place where the daemon names connectors.

use std::fmt;

use sluice_core::{
    BoxFuture, ConnectorError, ProcessorConfig, ProcessorContext, Running, SinkConfig, SinkContext,
    SourceConfig, SourceContext,
};
use yaml_serde::Value;

use crate::config::Ctx;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Source,
    Sink,
    Processor,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Role::Source => "source",
            Role::Sink => "sink",
            Role::Processor => "processor",
        })
    }
}

/// A parsed source config with its type erased.
pub trait DynSource: Send {
    fn validate(&self, name: &str) -> Result<(), String>;
    fn preflight<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<String>, String>>;
    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>>;
}

impl<T: SourceConfig> DynSource for T {
    fn validate(&self, name: &str) -> Result<(), String> {
        SourceConfig::validate(self, name)
    }
    fn preflight<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<String>, String>> {
        SourceConfig::preflight(self, name)
    }
    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        SourceConfig::build(self, ctx)
    }
}

/// A parsed sink config with its type erased.
pub trait DynSink: Send {
    fn validate(&self, name: &str) -> Result<(), String>;
    fn preflight<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<String>, String>>;
    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>>;
}

impl<T: SinkConfig> DynSink for T {
    fn validate(&self, name: &str) -> Result<(), String> {
        SinkConfig::validate(self, name)
    }
    fn preflight<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<String>, String>> {
        SinkConfig::preflight(self, name)
    }
    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        SinkConfig::build(self, ctx)
    }
}

/// A parsed processor config with its type erased.
pub trait DynProcessor: Send {
    fn validate(&self, name: &str) -> Result<(), String>;
    fn preflight<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<String>, String>>;
    fn wiring(&self) -> sluice_core::Wiring;
    fn build(
        self: Box<Self>,
        ctx: ProcessorContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>>;
}

impl<T: ProcessorConfig> DynProcessor for T {
    fn validate(&self, name: &str) -> Result<(), String> {
        ProcessorConfig::validate(self, name)
    }
    fn preflight<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<String>, String>> {
        ProcessorConfig::preflight(self, name)
    }
    fn wiring(&self) -> sluice_core::Wiring {
        ProcessorConfig::wiring(self)
    }
    fn build(
        self: Box<Self>,
        ctx: ProcessorContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        ProcessorConfig::build(self, ctx)
    }
}

type ParseSource = fn(Value, &[String], &mut Ctx<'_>) -> Option<Box<dyn DynSource>>;
type ParseSink = fn(Value, &[String], &mut Ctx<'_>) -> Option<Box<dyn DynSink>>;
type ParseProcessor = fn(Value, &[String], &mut Ctx<'_>) -> Option<Box<dyn DynProcessor>>;

pub struct Kind {
    pub name: &'static str,
    pub role: Role,
    pub description: &'static str,
    pub(crate) parse_source: ParseSource,
    pub(crate) parse_sink: ParseSink,
    pub(crate) parse_processor: ParseProcessor,
    /// The Argo Events types this kind runs (`sluice run -f`): EventSource types for a
    /// source, trigger types for a sink.
    pub argo: Vec<(&'static str, ArgoMap)>,
    /// The Rust type of its options (`sluice_webhook::WebhookConfig`).
    #[allow(dead_code)]
    pub config_type: &'static str,
}

/// How one Argo type maps onto a kind's options (the connector crate's `argo` module).
#[derive(Clone, Copy)]
pub enum ArgoMap {
    Source(sluice_core::argo::map::SourceMap),
    Trigger(sluice_core::argo::map::TriggerMap),
}

impl Kind {
    /// Declares that this source kind runs Argo's EventSource type `ty`.
    #[allow(dead_code)]
    fn argo_source(mut self, ty: &'static str, map: sluice_core::argo::map::SourceMap) -> Kind {
        self.argo.push((ty, ArgoMap::Source(map)));
        self
    }

    /// Declares that this sink kind runs Argo's trigger type `ty`.
    #[allow(dead_code)]
    fn argo_trigger(mut self, ty: &'static str, map: sluice_core::argo::map::TriggerMap) -> Kind {
        self.argo.push((ty, ArgoMap::Trigger(map)));
        self
    }
}

fn no_source(_: Value, _: &[String], _: &mut Ctx<'_>) -> Option<Box<dyn DynSource>> {
    None
}

fn no_sink(_: Value, _: &[String], _: &mut Ctx<'_>) -> Option<Box<dyn DynSink>> {
    None
}

fn no_processor(_: Value, _: &[String], _: &mut Ctx<'_>) -> Option<Box<dyn DynProcessor>> {
    None
}

fn parse_processor<T: ProcessorConfig>(
    v: Value,
    base: &[String],
    cx: &mut Ctx<'_>,
) -> Option<Box<dyn DynProcessor>> {
    cx.de::<T>(v, base)
        .map(|c| Box::new(c) as Box<dyn DynProcessor>)
}

fn parse_source<T: SourceConfig>(
    v: Value,
    base: &[String],
    cx: &mut Ctx<'_>,
) -> Option<Box<dyn DynSource>> {
    cx.de::<T>(v, base)
        .map(|c| Box::new(c) as Box<dyn DynSource>)
}

fn parse_sink<T: SinkConfig>(
    v: Value,
    base: &[String],
    cx: &mut Ctx<'_>,
) -> Option<Box<dyn DynSink>> {
    cx.de::<T>(v, base).map(|c| Box::new(c) as Box<dyn DynSink>)
}

#[allow(dead_code)]
fn source<T: SourceConfig>(name: &'static str, description: &'static str) -> Kind {
    Kind {
        name,
        role: Role::Source,
        description,
        parse_source: parse_source::<T>,
        parse_sink: no_sink,
        parse_processor: no_processor,
        argo: Vec::new(),
        config_type: std::any::type_name::<T>(),
    }
}

#[allow(dead_code)]
fn sink<T: SinkConfig>(name: &'static str, description: &'static str) -> Kind {
    Kind {
        name,
        role: Role::Sink,
        description,
        parse_source: no_source,
        parse_sink: parse_sink::<T>,
        parse_processor: no_processor,
        argo: Vec::new(),
        config_type: std::any::type_name::<T>(),
    }
}

#[allow(dead_code)]
fn processor<T: ProcessorConfig>(name: &'static str, description: &'static str) -> Kind {
    Kind {
        name,
        role: Role::Processor,
        description,
        parse_source: no_source,
        parse_sink: no_sink,
        parse_processor: parse_processor::<T>,
        argo: Vec::new(),
        config_type: std::any::type_name::<T>(),
    }
}

/// Every connector kind compiled into this binary.
pub fn kinds() -> Vec<Kind> {
    vec![
        #[cfg(feature = "webhook")]
        source::<sluice_webhook::WebhookConfig>(
            "webhook",
            "HTTP ingress: plain requests and CloudEvents (binary, structured, batched), auth, TLS, honest acks",
        )
        .argo_source("webhook", sluice_webhook::argo::webhook),
        #[cfg(feature = "webhook")]
        source::<sluice_webhook::GithubConfig>(
            "github",
            "GitHub webhooks: X-Hub-Signature-256 verified, named after the CloudEvents GitHub adapter, id = X-GitHub-Delivery",
        )
        .argo_source("github", sluice_webhook::argo::github),
        #[cfg(feature = "webhook")]
        source::<sluice_webhook::GitlabConfig>(
            "gitlab",
            "GitLab webhooks: X-Gitlab-Token or signing token verified, CloudEvents GitLab adapter types, id = Idempotency-Key",
        )
        .argo_source("gitlab", sluice_webhook::argo::gitlab),
        #[cfg(feature = "webhook")]
        source::<sluice_webhook::BitbucketConfig>(
            "bitbucket",
            "Bitbucket Cloud webhooks: X-Hub-Signature (HMAC-SHA256) verified, type org.bitbucket.<event-key>, id = X-Request-UUID",
        )
        .argo_source("bitbucket", sluice_webhook::argo::bitbucket),
        #[cfg(feature = "webhook")]
        source::<sluice_webhook::BitbucketServerConfig>(
            "bitbucket-server",
            "Bitbucket Server / Data Center webhooks: X-Hub-Signature verified, type org.bitbucket.<event-key>, id = X-Request-Id",
        )
        .argo_source("bitbucketserver", sluice_webhook::argo::bitbucketserver),
        #[cfg(feature = "webhook")]
        source::<sluice_webhook::GerritConfig>(
            "gerrit",
            "Gerrit webhooks plugin: basic or bearer auth, type com.googlesource.gerrit.<type>, id from the event",
        ),
        #[cfg(feature = "webhook")]
        source::<sluice_webhook::StripeConfig>(
            "stripe",
            "Stripe webhooks: Stripe-Signature v1 verified with timestamp tolerance, type com.stripe.<type>, id = event id",
        ),
        #[cfg(feature = "webhook")]
        source::<sluice_webhook::SlackConfig>(
            "slack",
            "Slack Events API, interactions and slash commands: X-Slack-Signature v0 verified, url_verification answered",
        )
        .argo_source("slack", sluice_webhook::argo::slack),
        #[cfg(feature = "webhook")]
        source::<sluice_webhook::StandardWebhooksConfig>(
            "standard-webhooks",
            "Standard Webhooks / Svix: v1 HMAC and v1a Ed25519 signatures, timestamp tolerance, id = webhook-id",
        ),
        #[cfg(feature = "webhook")]
        source::<sluice_webhook::HmacConfig>(
            "hmac",
            "any HMAC-signed webhook: header, algorithm, encoding, prefix, optional signed timestamp",
        ),
        #[cfg(feature = "schedule")]
        source::<sluice_schedule::ScheduleConfig>(
            "schedule",
            "cron and interval ticks with time zones, exclusion dates, catch-up, slot-derived ids",
        )
        .argo_source("calendar", sluice_schedule::argo::calendar),
        #[cfg(feature = "nats")]
        source::<sluice_nats::JetStreamSourceConfig>(
            "jetstream",
            "JetStream durable pull consumer: ack after delivery, progress acks, nak with backoff, CloudEvents NATS binding or Argo EventBus",
        ),
        #[cfg(feature = "nats")]
        source::<sluice_nats::NatsSourceConfig>(
            "nats",
            "core NATS subscription (queue groups; at-most-once, drops counted), CloudEvents NATS binding or Argo's NATS shape",
        )
        .argo_source("nats", sluice_nats::argo::source),
        #[cfg(feature = "nats")]
        sink::<sluice_nats::NatsConfig>(
            "nats",
            "NATS core or JetStream publish (PubAck = delivered, Nats-Msg-Id dedup), CloudEvents binding or Argo EventBus",
        )
        .argo_trigger("nats", sluice_nats::argo::trigger),
        #[cfg(feature = "kafka")]
        source::<sluice_kafka::KafkaSourceConfig>(
            "kafka",
            "Kafka consumer group (cooperative rebalancing): offsets committed only up to the delivered watermark, retries with backoff, CloudEvents Kafka binding",
        )
        .argo_source("kafka", sluice_kafka::argo::source),
        #[cfg(feature = "kafka")]
        sink::<sluice_kafka::KafkaConfig>(
            "kafka",
            "Kafka produce (idempotent, acks=all, delivery report = delivered), CloudEvents Kafka binding, topic and key templates",
        )
        .argo_trigger("kafka", sluice_kafka::argo::trigger),
        #[cfg(feature = "amqp")]
        source::<sluice_amqp::AmqpSourceConfig>(
            "amqp",
            "AMQP 0-9-1 (RabbitMQ) consumer: ack after delivery (coalesced), nack with requeue after a delay, reject to the dead-letter exchange, CloudEvents AMQP binding",
        )
        .argo_source("amqp", sluice_amqp::argo::source),
        #[cfg(feature = "amqp")]
        sink::<sluice_amqp::AmqpSinkConfig>(
            "amqp",
            "AMQP 0-9-1 (RabbitMQ) publish with publisher confirms (broker ack = delivered), mandatory returns as failures, CloudEvents AMQP binding",
        ),
        #[cfg(feature = "mqtt")]
        source::<sluice_mqtt::MqttSourceConfig>(
            "mqtt",
            "MQTT 3.1.1 and 5 subscriptions: QoS 1 acknowledged after delivery in arrival order, persistent sessions, structured and MQTT 5 binary CloudEvents",
        )
        .argo_source("mqtt", sluice_mqtt::argo::source),
        #[cfg(feature = "mqtt")]
        sink::<sluice_mqtt::MqttSinkConfig>(
            "mqtt",
            "MQTT 3.1.1 and 5 publish: QoS 1 delivered on PUBACK, QoS 2 on PUBCOMP, MQTT 5 reason codes, structured or binary CloudEvents, topic templates",
        ),
        #[cfg(feature = "redis")]
        source::<sluice_redis::StreamsSourceConfig>(
            "redis-streams",
            "Redis Streams consumer group: XACK after delivery, failed entries retried with backoff, dead consumers' entries taken over (XAUTOCLAIM)",
        )
        .argo_source("redisStream", sluice_redis::argo::streams),
        #[cfg(feature = "redis")]
        sink::<sluice_redis::StreamsSinkConfig>(
            "redis-streams",
            "Redis Streams XADD (optional MAXLEN ~), delivered = the entry id returned, CloudEvents as ce_* fields",
        ),
        #[cfg(feature = "redis")]
        source::<sluice_redis::PubSubSourceConfig>(
            "redis",
            "Redis Pub/Sub channels and patterns (at-most-once; drops under backpressure counted)",
        )
        .argo_source("redis", sluice_redis::argo::pubsub),
        #[cfg(feature = "redis")]
        sink::<sluice_redis::PubSubSinkConfig>(
            "redis",
            "Redis PUBLISH of structured CloudEvents (optionally only counted delivered when a subscriber got it)",
        ),
        #[cfg(feature = "aws")]
        source::<sluice_aws::SqsSourceConfig>(
            "sqs",
            "Amazon SQS: parallel long polls, bounded in flight, visibility extended, DeleteMessageBatch after delivery, rejections to the dead-letter queue",
        )
        .argo_source("sqs", sluice_aws::argo::sqs),
        #[cfg(feature = "aws")]
        sink::<sluice_aws::SqsSinkConfig>(
            "sqs",
            "Amazon SQS SendMessageBatch (FIFO group and deduplication ids), delivered = the entry SQS confirmed",
        ),
        #[cfg(feature = "aws")]
        source::<sluice_aws::S3SourceConfig>(
            "s3",
            "Amazon S3 object events from bucket notifications through SQS (CloudEvents S3 adapter naming), or polling an S3-compatible bucket",
        ),
        #[cfg(feature = "aws")]
        source::<sluice_aws::SnsSourceConfig>(
            "sns",
            "Amazon SNS HTTP endpoint: signatures v1/v2 verified, subscriptions of allowed topics confirmed, 200 only after delivery",
        )
        .argo_source("sns", sluice_aws::argo::sns),
        #[cfg(feature = "aws")]
        sink::<sluice_aws::SnsSinkConfig>(
            "sns",
            "Amazon SNS PublishBatch (FIFO topics), delivered = the entry SNS confirmed",
        ),
        #[cfg(feature = "aws")]
        sink::<sluice_aws::LambdaSinkConfig>(
            "aws-lambda",
            "AWS Lambda trigger: Invoke per event, delivered when the function returned without an error (or Lambda queued it)",
        )
        .argo_trigger("awsLambda", sluice_aws::argo::lambda),
        #[cfg(feature = "pubsub")]
        source::<sluice_pubsub::PubSubSourceConfig>(
            "pubsub",
            "GCP Pub/Sub streaming pull: flow control as the in-flight window, ack after delivery, deadlines extended, ordering keys in order",
        )
        .argo_source("pubSub", sluice_pubsub::argo::source),
        #[cfg(feature = "pubsub")]
        sink::<sluice_pubsub::PubSubSinkConfig>(
            "pubsub",
            "GCP Pub/Sub Publish in batches (CloudEvents Pub/Sub binding, ordering keys), delivered = the message id returned",
        ),
        #[cfg(feature = "kubernetes")]
        source::<sluice_kubernetes::K8sSourceConfig>(
            "k8s",
            "Kubernetes watch of any kind (Argo's resource EventSource): ADD/UPDATE/DELETE with Argo's payload, resourceVersions kept so nothing is missed across restarts",
        )
        .argo_source("resource", sluice_kubernetes::argo::resource),
        #[cfg(feature = "kubernetes")]
        sink::<sluice_kubernetes::K8sSinkConfig>(
            "k8s",
            "Kubernetes trigger: create (idempotent generateName), update, patch (merge, JSON, strategic), apply, delete any kind; permissions checked at start",
        )
        .argo_trigger("k8s", sluice_kubernetes::argo::k8s),
        #[cfg(feature = "kubernetes")]
        sink::<sluice_kubernetes::ArgoWorkflowConfig>(
            "argo-workflow",
            "Argo Workflows trigger, native: submit, submit-from (WorkflowTemplate, ClusterWorkflowTemplate, CronWorkflow), suspend, stop, terminate; resume, retry, resubmit through the Argo Server",
        )
        .argo_trigger("argoWorkflow", sluice_kubernetes::argo::argo_workflow),
        #[cfg(feature = "http")]
        sink::<sluice_http::HttpSinkConfig>(
            "http",
            "HTTP trigger: CloudEvents binary/structured/batched, success codes, retries with backoff and Retry-After, mTLS",
        )
        .argo_trigger("http", sluice_http::argo::http),
        #[cfg(feature = "http")]
        sink::<sluice_http::SlackSinkConfig>(
            "slack",
            "Slack trigger: chat.postMessage per event (channel and text from templates or the event's data), threads by key, delivered on ok: true",
        )
        .argo_trigger("slack", sluice_http::argo::slack),
        #[cfg(feature = "email")]
        sink::<sluice_email::EmailSinkConfig>(
            "email",
            "Email trigger: one message per event over SMTP (STARTTLS or TLS), delivered when the server accepted it",
        )
        .argo_trigger("email", sluice_email::argo::trigger),
        #[cfg(feature = "transform")]
        processor::<sluice_transform::SetConfig>(
            "set",
            "sets type, subject and extensions from templates over the event's attributes",
        ),
        #[cfg(feature = "sensor")]
        processor::<sluice_sensor::SensorConfig>(
            "sensor",
            "Argo-style Sensor: dependencies with filters, conditions, parameterized triggers into sinks, retries, rate limit, dead letter; partial matches kept in state_dir",
        ),
        #[cfg(feature = "console")]
        sink::<sluice_console::LogConfig>("log", "one structured JSON CloudEvent per line on stdout")
            .argo_trigger("log", sluice_console::argo_log),
        #[cfg(feature = "console")]
        sink::<sluice_console::NullConfig>("null", "accepts and discards every event (benchmarks)"),
    ]
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    /// Kinds the shared compliance checks do not fit, each with the reason.
    const NO_COMPLIANCE_KIT: [(&str, Role, &str); 7] = [
        ("nats", Role::Source, "core NATS is at-most-once: nothing is acknowledged upstream, so there is no redelivery to check (tests/sources.rs covers its drops and drain)"),
        ("redis", Role::Source, "Redis Pub/Sub is at-most-once: nothing is acknowledged upstream (tests/redis.rs covers its drops)"),
        ("k8s", Role::Source, "a watch acknowledges nothing upstream; what it must not miss across a restart is tests/envtest.rs `the_source_misses_nothing_across_a_restart`"),
        ("log", Role::Sink, "its peer is stdout: tests/e2e.rs checks its lines through the binary"),
        ("null", Role::Sink, "it discards by design: there is no peer to hold anything"),
        ("set", Role::Processor, "processors are checked through the pipeline rig (ack chaining), not a peer"),
        ("sensor", Role::Processor, "processors are checked through the pipeline rig (ack chaining), not a peer"),
    ];

    fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                rs_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// Every kind `sluice connectors` lists has a docs page, a README row and a run of the
    /// shared compliance check for its role (or a reason in `NO_COMPLIANCE_KIT`).
    #[test]
    fn every_kind_has_docs_a_readme_row_and_a_compliance_run() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let mut missing = Vec::new();
        for k in kinds() {
            let page = format!("docs/connectors/{}.md", k.name);
            if !root.join(&page).exists() {
                missing.push(format!("{} {}: no {page}", k.role, k.name));
            }
            if !readme.contains(&format!("({page})")) {
                missing.push(format!(
                    "{} {}: no README row linking {page}",
                    k.role, k.name
                ));
            }
            if NO_COMPLIANCE_KIT
                .iter()
                .any(|(n, r, _)| *n == k.name && *r == k.role)
            {
                continue;
            }
            // `sluice_webhook::providers::github::GithubConfig` → connectors/webhook, GithubConfig.
            let krate = k.config_type.split("::").next().unwrap_or("");
            let short = k.config_type.rsplit("::").next().unwrap_or("");
            let dir = root
                .join("connectors")
                .join(krate.trim_start_matches("sluice_"));
            let mut files = Vec::new();
            rs_files(&dir.join("tests"), &mut files);
            let ran = files.iter().any(|f| {
                let text = std::fs::read_to_string(f).unwrap_or_default();
                text.lines()
                    .any(|l| l.contains("compliance") && l.contains(short))
            });
            if !ran {
                missing.push(format!(
                    "{} {}: no compliance run ({short} in a `*compliance*` call under {}/tests)",
                    k.role,
                    k.name,
                    dir.display()
                ));
            }
        }
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }
}
