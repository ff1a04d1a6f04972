//! Metric names (all of them, in one place) and the per-component handles every connector gets.
//!
//! Handles are registered once per component, so the hot path only bumps atomics.

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

pub const EVENTS_RECEIVED: &str = "sluice_events_received_total";
pub const EVENTS_DEDUPLICATED: &str = "sluice_events_deduplicated_total";
pub const EVENTS_REJECTED: &str = "sluice_events_rejected_total";
pub const EVENTS_UNROUTED: &str = "sluice_events_unrouted_total";
pub const EVENTS_FILTERED: &str = "sluice_events_filtered_total";
pub const EVENTS_DELIVERED: &str = "sluice_events_delivered_total";
pub const DELIVERY_FAILURES: &str = "sluice_delivery_failures_total";
pub const SINK_RETRIES: &str = "sluice_sink_retries_total";
pub const SINK_IN_FLIGHT: &str = "sluice_sink_in_flight";
pub const EVENTS_DEAD_LETTERED: &str = "sluice_events_dead_lettered_total";
pub const EVENTS_DROPPED: &str = "sluice_events_dropped_total";
pub const QUEUE_EVENTS: &str = "sluice_queue_events";
pub const QUEUE_BYTES: &str = "sluice_queue_bytes";
pub const DELIVERY_LATENCY: &str = "sluice_delivery_latency_seconds";
pub const DEDUP_ENTRIES: &str = "sluice_dedup_entries";
pub const DEDUP_EVICTIONS: &str = "sluice_dedup_evictions_total";
pub const COMPONENT_UP: &str = "sluice_component_up";
pub const SOURCE_IN_FLIGHT: &str = "sluice_source_in_flight";
pub const SOURCE_SETTLED: &str = "sluice_source_settled_total";
pub const SOURCE_REDELIVERIES: &str = "sluice_source_redeliveries_total";
pub const SOURCE_LAG: &str = "sluice_source_lag";
pub const SOURCE_COMMITS: &str = "sluice_source_commits_total";
pub const SOURCE_LEASE_EXTENSIONS: &str = "sluice_source_lease_extensions_total";
pub const SOURCE_RECONNECTS: &str = "sluice_source_reconnects_total";
/// A sensor's dependency events: `result` = `matched`, `filtered` (with `family`) or `error`.
pub const SENSOR_DEPENDENCY_EVENTS: &str = "sluice_sensor_dependency_events_total";
/// A sensor's trigger runs: `result` = `fired`, `failed`, `dead_lettered`.
pub const SENSOR_TRIGGERS: &str = "sluice_sensor_triggers_total";
pub const SENSOR_TRIGGER_RETRIES: &str = "sluice_sensor_trigger_retries_total";
pub const SENSOR_RATE_LIMITED: &str = "sluice_sensor_rate_limited_total";
/// Dependency events a sensor holds for its triggers' conditions.
pub const SENSOR_STATE_EVENTS: &str = "sluice_sensor_state_events";
/// Partial matches dropped: `reason` = `reset`, `ttl`, `capacity`.
pub const SENSOR_STATE_EVICTIONS: &str = "sluice_sensor_state_evictions_total";

/// Buckets for [`DELIVERY_LATENCY`], in seconds.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A source's standard counters.
#[derive(Clone)]
pub struct SourceTelemetry {
    name: std::sync::Arc<str>,
    role: &'static str,
    pub received: Counter,
    pub deduplicated: Counter,
    pub unrouted: Counter,
}

impl SourceTelemetry {
    pub fn new(name: &str) -> Self {
        Self::labelled("source", name)
    }

    /// The counters of a stage that emits events, labelled `role="name"` (`source`, or
    /// `processor` for a processor's output).
    pub fn labelled(role: &'static str, name: &str) -> Self {
        let label = name.to_owned();
        SourceTelemetry {
            name: name.into(),
            role,
            received: counter!(EVENTS_RECEIVED, role => label.clone()),
            deduplicated: counter!(EVENTS_DEDUPLICATED, role => label.clone()),
            unrouted: counter!(EVENTS_UNROUTED, role => label),
        }
    }

    /// Counts input the source refused (a malformed request, a failed auth check, ...).
    /// `reason` is a short, fixed label such as `invalid_event` or `unauthorized`.
    pub fn rejected(&self, reason: &'static str, n: u64) {
        counter!(EVENTS_REJECTED, self.role => self.name.to_string(), "reason" => reason)
            .increment(n);
    }

    /// Counts input the source answered but let through no event for, on purpose (a provider
    /// event type the config does not ask for).
    pub fn filtered(&self, n: u64) {
        counter!(EVENTS_FILTERED, self.role => self.name.to_string()).increment(n);
    }
}

/// A sink's standard counters and gauges.
#[derive(Clone)]
pub struct SinkTelemetry {
    pub delivered: Counter,
    pub failures: Counter,
    pub dropped_full: Counter,
    pub queue_events: Gauge,
    pub queue_bytes: Gauge,
    pub latency: Histogram,
}

impl SinkTelemetry {
    pub fn new(name: &str) -> Self {
        Self::labelled("sink", name)
    }

    /// The handles of a stage that takes events from a queue, labelled `role="name"` (`sink`,
    /// or `processor` for a processor's input).
    pub fn labelled(role: &'static str, name: &str) -> Self {
        let label = name.to_owned();
        SinkTelemetry {
            delivered: counter!(EVENTS_DELIVERED, role => label.clone()),
            failures: counter!(DELIVERY_FAILURES, role => label.clone()),
            dropped_full: counter!(EVENTS_DROPPED, role => label.clone(), "reason" => "queue_full"),
            queue_events: gauge!(QUEUE_EVENTS, role => label.clone()),
            queue_bytes: gauge!(QUEUE_BYTES, role => label.clone()),
            latency: histogram!(DELIVERY_LATENCY, role => label),
        }
    }
}

/// What a pull source settles upstream, by outcome (the `result` label of
/// [`SOURCE_SETTLED`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Acknowledged: its events were delivered (SQS delete, JetStream `+ACK`, Kafka commit).
    Ack,
    /// Handed back for a later redelivery (nack with delay, visibility lapse).
    Retry,
    /// Refused for good (JetStream `+TERM`, AMQP nack without requeue → the broker's DLQ).
    Reject,
}

/// The handles every pull source (SQS, Pub/Sub, Kafka, JetStream, AMQP, MQTT, Redis Streams)
/// keeps besides the standard source counters: messages in flight, settle calls by outcome,
/// redeliveries seen, lag behind the head, offset commits, lease extensions, reconnects.
#[derive(Clone)]
pub struct PullTelemetry {
    pub in_flight: Gauge,
    pub acked: Counter,
    pub retried: Counter,
    pub rejected: Counter,
    pub redeliveries: Counter,
    /// Messages the upstream holds that this source has not received yet.
    pub lag: Gauge,
    pub commits: Counter,
    pub lease_extensions: Counter,
    /// Connections to the upstream lost and opened again.
    pub reconnects: Counter,
}

impl PullTelemetry {
    pub fn new(source: &str) -> Self {
        let l = source.to_owned();
        PullTelemetry {
            in_flight: gauge!(SOURCE_IN_FLIGHT, "source" => l.clone()),
            acked: counter!(SOURCE_SETTLED, "source" => l.clone(), "result" => "ack"),
            retried: counter!(SOURCE_SETTLED, "source" => l.clone(), "result" => "retry"),
            rejected: counter!(SOURCE_SETTLED, "source" => l.clone(), "result" => "reject"),
            redeliveries: counter!(SOURCE_REDELIVERIES, "source" => l.clone()),
            lag: gauge!(SOURCE_LAG, "source" => l.clone()),
            commits: counter!(SOURCE_COMMITS, "source" => l.clone()),
            lease_extensions: counter!(SOURCE_LEASE_EXTENSIONS, "source" => l.clone()),
            reconnects: counter!(SOURCE_RECONNECTS, "source" => l),
        }
    }

    /// Counts one settle call's messages.
    pub fn settled(&self, how: Settled, n: u64) {
        match how {
            Settled::Ack => self.acked.increment(n),
            Settled::Retry => self.retried.increment(n),
            Settled::Reject => self.rejected.increment(n),
        }
    }
}
