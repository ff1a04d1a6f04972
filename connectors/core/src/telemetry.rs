//! Metric names (all of them, in one place) and the per-component handles every connector gets.
//!
//! Handles are registered once per component, so the hot path only bumps atomics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{counter, gauge, Counter, Gauge};

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

/// Kubernetes API calls of a kubernetes component: `verb` (create, get, patch, …), `code`
/// (the HTTP status, or `error` when none came back).
pub const K8S_REQUESTS: &str = "sluice_k8s_requests_total";
/// Permissions a kubernetes component needs and lacks (a `SelfSubjectAccessReview` said no,
/// or the API answered 403): 0 when all are granted.
pub const K8S_PERMISSIONS_MISSING: &str = "sluice_k8s_permissions_missing";
/// Creates the API server answered 409 AlreadyExists for: a redelivered event whose object
/// (named from the event id) was made before; counted delivered.
pub const K8S_DUPLICATE_CREATES: &str = "sluice_k8s_duplicate_creates_total";
/// Objects a `k8s` source keeps the resourceVersion of.
pub const K8S_WATCHED_OBJECTS: &str = "sluice_k8s_watched_objects";
/// Watch restarts of a `k8s` source (a dropped connection, 410 Gone): `reason`.
pub const K8S_WATCH_RESTARTS: &str = "sluice_k8s_watch_restarts_total";

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
    pub latency: Arc<LatencyHistogram>,
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
            latency: LatencyHistogram::registered(role, &label),
        }
    }
}

/// [`DELIVERY_LATENCY`] of one stage: a Prometheus histogram over [`LATENCY_BUCKETS`] that
/// records a batch of deliveries with one latency (a unit's events reported together) in one
/// step, where the `metrics` exporter's histogram takes a sample per event: an epoch-pinned
/// push and a clock reading each, about 3 % of a Kafka → `null` daemon's CPU time in a `perf`
/// profile (docs/decisions.md, "The delivery latency histogram is Sluice's own"). Rendered
/// after the exporter's text by [`render_latency`].
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Deliveries per bucket (not cumulative), the last one past the largest bound.
    counts: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    /// The latencies' sum in seconds, as the bits of an `f64` (an integer count of nanoseconds
    /// would wrap within days under a large backlog).
    sum_secs: AtomicU64,
}

/// Every stage's latency histogram, by (role, name): registering a name again (a test, a
/// second pipeline in one process) shares its series, as the `metrics` registry does.
type Registered = Vec<(&'static str, String, Arc<LatencyHistogram>)>;
static LATENCY: Mutex<Registered> = Mutex::new(Vec::new());

impl LatencyHistogram {
    /// The histogram of stage `name` in role `role`, registered for [`render_latency`].
    pub fn registered(role: &'static str, name: &str) -> Arc<LatencyHistogram> {
        let mut all = LATENCY.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, h)) = all.iter().find(|(r, n, _)| *r == role && n == name) {
            return h.clone();
        }
        let h = Arc::new(LatencyHistogram::default());
        all.push((role, name.to_owned(), h.clone()));
        h
    }

    /// Records `n` deliveries that each took `latency`.
    pub fn record_many(&self, latency: Duration, n: u64) {
        let secs = latency.as_secs_f64();
        let i = LATENCY_BUCKETS.partition_point(|&le| le < secs);
        self.counts[i].fetch_add(n, Ordering::Relaxed);
        let add = secs * n as f64;
        let _ = self
            .sum_secs
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + add).to_bits())
            });
    }

    /// Records one delivery.
    pub fn record(&self, latency: Duration) {
        self.record_many(latency, 1)
    }

    /// Appends this histogram's series (`_bucket`, `_sum`, `_count`) labelled `role="name"`.
    fn render(&self, role: &str, name: &str, out: &mut String) {
        use std::fmt::Write;
        let mut label = String::with_capacity(name.len());
        for c in name.chars() {
            match c {
                '\\' => label.push_str("\\\\"),
                '"' => label.push_str("\\\""),
                '\n' => label.push_str("\\n"),
                c => label.push(c),
            }
        }
        let mut cumulative = 0u64;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            let le = match LATENCY_BUCKETS.get(i) {
                Some(b) => b.to_string(),
                None => "+Inf".to_owned(),
            };
            let _ = writeln!(
                out,
                "{DELIVERY_LATENCY}_bucket{{{role}=\"{label}\",le=\"{le}\"}} {cumulative}"
            );
        }
        let sum = f64::from_bits(self.sum_secs.load(Ordering::Relaxed));
        let _ = writeln!(out, "{DELIVERY_LATENCY}_sum{{{role}=\"{label}\"}} {sum}");
        // The count is the last cumulative bucket, so that the two agree in every scrape.
        let _ = writeln!(
            out,
            "{DELIVERY_LATENCY}_count{{{role}=\"{label}\"}} {cumulative}"
        );
    }
}

/// The text of every [`LatencyHistogram`] in the Prometheus exposition format, to follow the
/// `metrics` exporter's text: one `# TYPE` line, then each stage's series.
pub fn render_latency() -> String {
    let all = LATENCY.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = String::new();
    if all.is_empty() {
        return out;
    }
    out.push_str(&format!("# TYPE {DELIVERY_LATENCY} histogram\n"));
    for (role, name, h) in all.iter() {
        h.render(role, name, &mut out);
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    fn series(text: &str, prefix: &str) -> Vec<(String, f64)> {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').unwrap();
                (k.to_owned(), v.parse().unwrap())
            })
            .collect()
    }

    #[test]
    fn the_latency_histogram_counts_batches_into_cumulative_buckets() {
        let h = LatencyHistogram::registered("sink", "latency-test \"a\\b\"");
        // Registered again under the same name: the same series.
        let same = LatencyHistogram::registered("sink", "latency-test \"a\\b\"");
        assert!(Arc::ptr_eq(&h, &same));
        h.record_many(Duration::from_micros(300), 10); // ≤ 0.0005
        h.record_many(Duration::from_millis(1), 5); // exactly a bound: ≤ 0.001
        h.record(Duration::from_millis(7)); // ≤ 0.01
        h.record_many(Duration::from_secs(60), 2); // past the largest bound
        let text = render_latency();
        assert_eq!(
            text.lines()
                .filter(|l| *l == "# TYPE sluice_delivery_latency_seconds histogram")
                .count(),
            1
        );
        let label = r#"sink="latency-test \"a\\b\"""#;
        let buckets = series(
            &text,
            &format!("sluice_delivery_latency_seconds_bucket{{{label},"),
        );
        let le = |b: &str| {
            buckets
                .iter()
                .find(|(k, _)| k.ends_with(&format!("le=\"{b}\"}}")))
                .unwrap_or_else(|| panic!("bucket {b} in {text}"))
                .1
        };
        assert_eq!(buckets.len(), LATENCY_BUCKETS.len() + 1);
        assert_eq!(le("0.0005"), 10.0);
        assert_eq!(le("0.001"), 15.0);
        assert_eq!(le("0.005"), 15.0);
        assert_eq!(le("0.01"), 16.0);
        assert_eq!(le("30"), 16.0);
        assert_eq!(le("+Inf"), 18.0);
        let one = |name: &str| {
            series(
                &text,
                &format!("sluice_delivery_latency_seconds_{name}{{{label}}}"),
            )[0]
            .1
        };
        assert_eq!(one("count"), 18.0);
        let sum = 10.0 * 0.0003 + 5.0 * 0.001 + 0.007 + 2.0 * 60.0;
        assert!((one("sum") - sum).abs() < 1e-9, "{} vs {sum}", one("sum"));
    }

    #[test]
    fn the_latency_sum_does_not_wrap_under_a_large_backlog() {
        // A billion deliveries an hour late, ten times: 3.6e13 s, past what a u64 of
        // nanoseconds holds (1.8e10 s).
        let h = LatencyHistogram::registered("sink", "latency-backlog-test");
        for _ in 0..10 {
            h.record_many(Duration::from_secs(3600), 1_000_000_000);
        }
        let text = render_latency();
        let sum = series(
            &text,
            "sluice_delivery_latency_seconds_sum{sink=\"latency-backlog-test\"}",
        )[0]
        .1;
        assert!((sum / 3.6e13 - 1.0).abs() < 1e-9, "sum {sum}");
    }
}
