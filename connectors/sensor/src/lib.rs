//! The Sensor (`sensors:` in the config, a processor of kind `sensor`): Argo Events' Sensor
//! semantics on the Sluice pipeline. Dependencies pick events from named sources and filter
//! them; each trigger waits until its condition over the dependencies holds, then builds its
//! output from their events (`payload`, `parameters`) and hands it to a sink, with retries, a
//! rate limit and a dead-letter sink. Partial matches are kept in `state_dir` across restarts.
//!
//! The specification is `../shared/reference/argo-events.md` §5; where this differs from Argo
//! the docs page (`docs/connectors/sensor.md`) says so.

mod condition;
mod expr;
mod filter;
mod jq;
mod json;
mod run;
mod script;

use std::time::Duration;

use serde::Deserialize;
use sluice_core::units::HumanDuration;
use sluice_core::{
    BoxFuture, ConnectorError, NamedStage, ProcessorConfig, ProcessorContext, Running, Wiring,
};

pub use condition::Cond;
pub use filter::{FiltersConfig, Logic};
pub use sluice_core::params::{Operation, ParamConfig};

/// `sensors.<name>`: dependencies and triggers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SensorConfig {
    /// The events this sensor waits for.
    pub dependencies: Vec<DependencyConfig>,
    /// What it does when their conditions hold.
    pub triggers: Vec<TriggerConfig>,
    /// Trigger runs in flight at once: up to this many plain hand-overs to a sink, settled by
    /// the sink's answer, and up to this many runs that wait (retries, a dead letter, a rate
    /// limit, spent state, room in a full sink queue). Default 256.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
}

fn default_concurrency() -> usize {
    256
}

/// One dependency: events from `source` that pass the filters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DependencyConfig {
    /// Its name, used in `conditions` and `dependencyName` (may contain `-`).
    pub name: String,
    /// The Sluice source (or processor) whose events it takes.
    pub source: String,
    /// Only events of this CloudEvents `type`.
    #[serde(default, rename = "type")]
    pub ty: Option<String>,
    /// Only events whose CloudEvents `source` is this (Argo's `eventSourceName`, for events
    /// read from Argo's EventBus).
    #[serde(default)]
    pub event_source: Option<String>,
    /// Only events whose CloudEvents `subject` is this (Argo's `eventName`).
    #[serde(default)]
    pub event_subject: Option<String>,
    #[serde(default)]
    pub filters: Option<FiltersConfig>,
    /// `and` (default): every filter family given must pass; `or`: one of them.
    #[serde(default, rename = "filtersLogicalOperator")]
    pub filters_logical_operator: Logic,
    /// Reshapes the event's data before the filters see it (and the triggers after them).
    #[serde(default)]
    pub transform: Option<TransformConfig>,
}

/// One of `jq` or `script`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformConfig {
    /// A jq program; its first output, a JSON object, becomes the data.
    #[serde(default)]
    pub jq: Option<String>,
    /// Lua (5.1): the global `event` is the data; the table returned becomes the data.
    #[serde(default)]
    pub script: Option<String>,
}

/// One trigger.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerConfig {
    pub name: String,
    /// `&&`, `||` and parentheses over dependency names. Default: all dependencies.
    #[serde(default)]
    pub conditions: Option<String>,
    /// Clear the partial state on a schedule.
    #[serde(default, rename = "conditionsReset")]
    pub conditions_reset: Vec<ResetConfig>,
    /// The sink that receives what the trigger makes.
    pub sink: String,
    /// Builds the output's JSON data from the events; empty: the events themselves are sent.
    #[serde(default)]
    pub payload: Vec<ParamConfig>,
    /// Sets the output's attributes (`dest`: `type`, `subject`, `dataschema` or an
    /// extension name) from the events.
    #[serde(default)]
    pub parameters: Vec<ParamConfig>,
    /// Absent: one attempt. `steps: 0` means 5.
    #[serde(default, rename = "retryStrategy")]
    pub retry_strategy: Option<BackoffConfig>,
    #[serde(default, rename = "rateLimit")]
    pub rate_limit: Option<RateLimitConfig>,
    /// `false` (Argo's default): the input is acknowledged once the trigger run has started;
    /// `true`: only after it finished, retries and dead-lettering included.
    #[serde(default, rename = "atLeastOnce")]
    pub at_least_once: bool,
    /// A sink for what still failed after the retries.
    #[serde(default, rename = "dlqTrigger")]
    pub dlq_trigger: Option<DlqTrigger>,
    /// Beyond Argo: a gjson path into the events' data; the condition is then evaluated per
    /// value (e.g. per order id) instead of over the latest event of each dependency.
    #[serde(default)]
    pub correlate_by: Option<String>,
    /// Partial matches kept per trigger (correlation keys); the oldest goes first. Default
    /// 10000.
    #[serde(default = "default_max_keys")]
    pub max_keys: usize,
    /// Drop a partial match older than this. Default: never.
    #[serde(default)]
    pub state_ttl: Option<HumanDuration>,
    /// The output event's `type` when `payload` builds one. Default `sluice.sensor.<trigger>`.
    #[serde(default, rename = "type")]
    pub ty: Option<String>,
}

fn default_max_keys() -> usize {
    10_000
}

/// `dlqTrigger`: a sink (what failed goes there, with `deadlettersink` and
/// `deadletterreason` extensions), or a whole trigger as in Argo, run with the same events
/// after the retries (its own `sink`, `payload`, `parameters`, `retryStrategy`; no condition
/// and no `dlqTrigger` of its own).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum DlqTrigger {
    Sink(String),
    Trigger(Box<TriggerConfig>),
}

impl DlqTrigger {
    fn sink(&self) -> &str {
        match self {
            DlqTrigger::Sink(s) => s,
            DlqTrigger::Trigger(t) => &t.sink,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetConfig {
    #[serde(rename = "byTime")]
    pub by_time: ByTimeConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByTimeConfig {
    /// Five-field cron expression.
    pub cron: String,
    /// IANA time zone of the cron expression. Default UTC.
    #[serde(default)]
    pub timezone: Option<String>,
}

/// Argo's `retryStrategy` (k8s `wait.Backoff`): `steps` attempts, the first retry after
/// `duration`, each next one `factor` times longer, plus up to `jitter` × the delay at random.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackoffConfig {
    #[serde(default)]
    pub steps: Option<u32>,
    /// A Go duration (`1s`, `500ms`) or nanoseconds. Default 1s.
    #[serde(default)]
    pub duration: Option<DurationValue>,
    /// Default 1.
    #[serde(default)]
    pub factor: Option<NumberValue>,
    /// Default 1.
    #[serde(default)]
    pub jitter: Option<NumberValue>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum DurationValue {
    Nanos(u64),
    Text(String),
}

/// Argo's `Amount`: a number or its text.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum NumberValue {
    Number(f64),
    Text(String),
}

impl NumberValue {
    fn get(&self, what: &str) -> Result<f64, String> {
        match self {
            NumberValue::Number(n) => Ok(*n),
            NumberValue::Text(t) => t
                .trim()
                .parse()
                .map_err(|_| format!("{what}: {t:?} is not a number")),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// `Second` (default), `Minute` or `Hour`.
    #[serde(default)]
    pub unit: RateUnit,
    #[serde(rename = "requestsPerUnit")]
    pub requests_per_unit: u32,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub enum RateUnit {
    #[default]
    Second,
    Minute,
    Hour,
}

/// The retry schedule of a trigger, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Retry {
    pub attempts: u32,
    pub first: Duration,
    pub factor: f64,
    pub jitter: f64,
}

impl Retry {
    fn from(cfg: &Option<BackoffConfig>, what: &str) -> Result<Retry, String> {
        let Some(b) = cfg else {
            return Ok(Retry {
                attempts: 1,
                first: Duration::from_secs(1),
                factor: 1.0,
                jitter: 0.0,
            });
        };
        let first = match &b.duration {
            None => Duration::from_secs(1),
            Some(DurationValue::Nanos(n)) => Duration::from_nanos(*n),
            Some(DurationValue::Text(t)) => match t.trim().parse::<u64>() {
                Ok(n) => Duration::from_nanos(n),
                Err(_) => humantime::parse_duration(t.trim())
                    .map_err(|e| format!("{what}.duration: {t:?}: {e}"))?,
            },
        };
        let factor = b
            .factor
            .as_ref()
            .map_or(Ok(1.0), |f| f.get(&format!("{what}.factor")))?;
        let jitter = b
            .jitter
            .as_ref()
            .map_or(Ok(1.0), |f| f.get(&format!("{what}.jitter")))?;
        if factor < 1.0 || !(0.0..=10.0).contains(&jitter) {
            return Err(format!(
                "{what}: factor must be at least 1 and jitter between 0 and 10"
            ));
        }
        Ok(Retry {
            attempts: match b.steps {
                None | Some(0) => 5,
                Some(n) => n,
            },
            first,
            factor,
            jitter,
        })
    }

    /// The wait before retry `n` (0 = the first retry), with `rand` in [0, 1).
    pub fn delay(&self, n: u32, rand: f64) -> Duration {
        let base = self.first.as_secs_f64() * self.factor.powi(n as i32);
        Duration::from_secs_f64((base * (1.0 + self.jitter * rand)).min(3600.0))
    }
}

impl SensorConfig {
    fn compile(&self, name: &str) -> Result<run::Sensor, String> {
        run::Sensor::compile(self, name)
    }
}

impl ProcessorConfig for SensorConfig {
    fn validate(&self, name: &str) -> Result<(), String> {
        self.compile(name).map(drop)
    }

    fn wiring(&self) -> Wiring {
        let stage = |name: &str, path: [String; 3]| NamedStage {
            name: name.to_owned(),
            path: path.to_vec(),
        };
        let mut w = Wiring::default();
        for (i, d) in self.dependencies.iter().enumerate() {
            if !w.inputs.iter().any(|s| s.name == d.source) {
                w.inputs.push(stage(
                    &d.source,
                    ["dependencies".into(), i.to_string(), "source".into()],
                ));
            }
        }
        for (i, t) in self.triggers.iter().enumerate() {
            let mut named = vec![(t.sink.as_str(), vec!["sink"])];
            match &t.dlq_trigger {
                Some(DlqTrigger::Sink(s)) => named.push((s.as_str(), vec!["dlqTrigger"])),
                Some(DlqTrigger::Trigger(d)) => {
                    named.push((d.sink.as_str(), vec!["dlqTrigger", "sink"]))
                }
                None => {}
            }
            for (sink, keys) in named {
                if !w.targets.iter().any(|s| s.name == sink) {
                    let mut path = vec!["triggers".to_string(), i.to_string()];
                    path.extend(keys.iter().map(|k| k.to_string()));
                    w.targets.push(NamedStage {
                        name: sink.to_owned(),
                        path,
                    });
                }
            }
        }
        w
    }

    fn build(
        self: Box<Self>,
        ctx: ProcessorContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let sensor = self
                .compile(&ctx.name)
                .map_err(|e| ConnectorError::new(format!("sensor {}: {e}", ctx.name)))?;
            let running = run::start(sensor, self.concurrency, ctx)?;
            Ok(Box::pin(running) as Running)
        })
    }
}

/// For benchmarks: the per-event work of a sensor (filters, conditions, payload) without the
/// pipeline around it.
#[doc(hidden)]
pub mod bench {
    pub use crate::run::Bench;
}

#[cfg(test)]
mod tests;
