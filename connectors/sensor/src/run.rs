//! The sensor at run time: match each input against the dependencies, keep partial matches
//! per trigger, fire triggers whose condition holds, and settle each input by the rules of
//! `atLeastOnce`.

use std::collections::HashMap;
use std::str::FromStr as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use smallvec::SmallVec;

use chrono::Utc;
use croner::Cron;
use futures_util::future::join_all;
use metrics::{counter, gauge, Counter, Gauge};
use sluice_core::event::check_extension_name;
use sluice_core::pipeline::{SinkWindow, Step, Then, DEAD_LETTER_REASON, DEAD_LETTER_SINK};
use sluice_core::state::StateStore;
use sluice_core::telemetry as t;
use sluice_core::{
    ConnectorError, Event, Outcome, ProcessorContext, SinkItem, SourceSender, Status, Target,
    Timestamp,
};

use crate::condition::{self, Cond};
use crate::filter::Filters;
use crate::json::{Doc, Plan};
use crate::{expr, Retry, SensorConfig};
use sluice_core::params::{context_json, Param, Resolved};

const BATCH: usize = 64;

enum Transform {
    Jq(crate::jq::Jq),
    Lua(crate::script::Script),
}

pub(crate) struct Dep {
    pub(crate) name: String,
    ty: Option<String>,
    event_source: Option<String>,
    event_subject: Option<String>,
    transform: Option<Transform>,
    filters: Filters,
    matched: Counter,
    errors: Counter,
    /// `result="filtered"` per family, in `filter::FAMILIES` order.
    filtered: Vec<(&'static str, Counter)>,
}

/// A trigger's counters, made once.
pub(crate) struct TriggerCounters {
    fired: Counter,
    failed: Counter,
    dead_lettered: Counter,
    retries: Counter,
}

pub(crate) struct Trigger {
    pub(crate) name: String,
    cond: Cond,
    /// The dependencies the condition names, in the order their events are kept.
    deps: Vec<usize>,
    pure_or: bool,
    sink: String,
    dlq: Option<Dlq>,
    payload: Vec<Param>,
    parameters: Vec<Param>,
    retry: Retry,
    rate: Option<Duration>,
    at_least_once: bool,
    resets: Vec<(Cron, chrono_tz::Tz)>,
    correlate: Option<String>,
    max_keys: usize,
    ttl: Option<Duration>,
    ty: String,
    /// The `sensor` and `trigger` extensions of a payload-built output, made once.
    names: [(sluice_core::Str, sluice_core::ExtValue); 2],
    counters: TriggerCounters,
}

/// Where what still failed after the retries goes.
pub(crate) enum Dlq {
    Sink(String),
    Trigger(Box<Trigger>),
}

impl Trigger {
    /// Whether it sends its events unchanged: no `payload`, no `parameters`.
    fn forwards(&self) -> bool {
        self.payload.is_empty() && self.parameters.is_empty()
    }
}

impl Dlq {
    fn sink(&self) -> &str {
        match self {
            Dlq::Sink(s) => s,
            Dlq::Trigger(t) => &t.sink,
        }
    }
}

pub(crate) struct Sensor {
    pub(crate) name: String,
    pub(crate) deps: Vec<Dep>,
    pub(crate) triggers: Vec<Trigger>,
    /// Stage name → the dependencies that read it, and the paths their filters read, located
    /// while the event's data is checked.
    by_origin: foldhash::HashMap<String, (Vec<usize>, Plan)>,
    /// Per dependency: the triggers whose conditions name it.
    dep_triggers: Vec<Vec<usize>>,
}

fn unique<'a>(names: impl Iterator<Item = &'a str>, what: &str) -> Result<(), String> {
    let mut seen = Vec::new();
    for (i, n) in names.enumerate() {
        if n.is_empty() {
            return Err(format!("{what}.{i}.name: must not be empty"));
        }
        if seen.contains(&n) {
            return Err(format!("{what}.{i}.name: `{n}` is used twice"));
        }
        seen.push(n);
    }
    Ok(())
}

/// One trigger of `cfg` (or a trigger's `dlqTrigger`, `nested_ok` false), compiled.
fn compile_trigger(
    cfg: &SensorConfig,
    name: &str,
    tc: &crate::TriggerConfig,
    what: &str,
    nested_ok: bool,
) -> Result<Trigger, String> {
    let dep_index = |n: &str| cfg.dependencies.iter().position(|d| d.name == n);
    let ndeps = cfg.dependencies.len();
    let cond = match tc.conditions.as_deref() {
        Some(c) if !c.trim().is_empty() => {
            condition::parse(c, &dep_index).map_err(|e| format!("{what}.conditions: {e}"))?
        }
        _ => Cond::all(ndeps),
    };
    let mut tdeps = Vec::new();
    cond.deps(&mut tdeps);
    let params = |list: &[crate::ParamConfig], key: &str| -> Result<Vec<Param>, String> {
        list.iter()
            .enumerate()
            .map(|(pi, p)| {
                let pw = format!("{what}.{key}.{pi}");
                if p.src.dependency_name.is_empty() {
                    return Err(format!(
                        "{pw}.src.dependencyName: required (the dependency whose event it reads)"
                    ));
                }
                let d = dep_index(&p.src.dependency_name).ok_or_else(|| {
                    format!(
                        "{pw}.src.dependencyName: `{}` is not a dependency of this sensor",
                        p.src.dependency_name
                    )
                })?;
                Param::compile(p, d, &pw)
            })
            .collect()
    };
    let payload = params(&tc.payload, "payload")?;
    let parameters = params(&tc.parameters, "parameters")?;
    for (pi, p) in tc.parameters.iter().enumerate() {
        let first = p.dest.split('.').next().unwrap_or("");
        let ok = matches!(first, "type" | "subject" | "dataschema")
            || (!matches!(
                first,
                "id" | "source" | "specversion" | "time" | "data" | "datacontenttype"
            ) && check_extension_name(first).is_ok());
        if !ok || p.dest.contains('.') {
            return Err(format!(
                    "{what}.parameters.{pi}.dest: `{}` is not an attribute a trigger may set (type, subject, dataschema, or an extension name)",
                    p.dest
                ));
        }
    }
    let mut resets = Vec::new();
    for (ri, r) in tc.conditions_reset.iter().enumerate() {
        let cron = Cron::from_str(&r.by_time.cron).map_err(|e| {
            format!(
                "{what}.conditionsReset.{ri}.byTime.cron: {:?}: {e}",
                r.by_time.cron
            )
        })?;
        let tz = match r.by_time.timezone.as_deref().filter(|z| !z.is_empty()) {
            None => chrono_tz::UTC,
            Some(z) => z.parse().map_err(|_| {
                format!(
                    "{what}.conditionsReset.{ri}.byTime.timezone: {z:?} is not an IANA time zone"
                )
            })?,
        };
        resets.push((cron, tz));
    }
    let rate = match &tc.rate_limit {
        None => None,
        Some(r) if r.requests_per_unit == 0 => {
            return Err(format!(
                "{what}.rateLimit.requestsPerUnit: must be at least 1"
            ))
        }
        Some(r) => {
            let unit = match r.unit {
                crate::RateUnit::Second => 1.0,
                crate::RateUnit::Minute => 60.0,
                crate::RateUnit::Hour => 3600.0,
            };
            Some(Duration::from_secs_f64(unit / r.requests_per_unit as f64))
        }
    };
    if tc.max_keys == 0 {
        return Err(format!("{what}.max_keys: must be at least 1"));
    }
    if let Some(p) = &tc.correlate_by {
        if p.is_empty() {
            return Err(format!("{what}.correlate_by: give a gjson path"));
        }
    }
    if tc.dlq_trigger.is_some() && !nested_ok {
        return Err(format!(
            "{what}: a dlqTrigger cannot have a dlqTrigger of its own"
        ));
    }
    let dlq = match &tc.dlq_trigger {
        None => None,
        Some(d) if d.sink() == tc.sink => {
            return Err(format!(
                "{what}.dlqTrigger: must be another sink than `sink`"
            ))
        }
        Some(crate::DlqTrigger::Sink(s)) => Some(Dlq::Sink(s.clone())),
        Some(crate::DlqTrigger::Trigger(d)) => {
            if d.conditions.is_some() || !d.conditions_reset.is_empty() || d.correlate_by.is_some()
            {
                return Err(format!("{what}.dlqTrigger: runs with the failed trigger's events; `conditions`, `conditionsReset` and `correlate_by` do not apply"));
            }
            Some(Dlq::Trigger(Box::new(compile_trigger(
                cfg,
                name,
                d,
                &format!("{what}.dlqTrigger"),
                false,
            )?)))
        }
    };
    let ty = tc
        .ty
        .clone()
        .unwrap_or_else(|| format!("sluice.sensor.{}", tc.name));
    sluice_core::event::check_source_and_type(&format!("/sensors/{name}"), &ty)
        .map_err(|e| format!("{what}.type: {e}"))?;
    Ok(Trigger {
        name: tc.name.clone(),
        pure_or: cond.is_pure_or(),
        cond,
        deps: tdeps,
        sink: tc.sink.clone(),
        dlq,
        payload,
        parameters,
        retry: Retry::from(&tc.retry_strategy, &format!("{what}.retryStrategy"))?,
        rate,
        at_least_once: tc.at_least_once,
        resets,
        correlate: tc.correlate_by.clone(),
        max_keys: tc.max_keys,
        ttl: tc.state_ttl.map(|d| d.get()),
        ty,
        names: [
            (
                SENSOR_EXT.into(),
                sluice_core::ExtValue::String(name.into()),
            ),
            (
                TRIGGER_EXT.into(),
                sluice_core::ExtValue::String(tc.name.as_str().into()),
            ),
        ],
        counters: {
            let c = |r: &'static str| counter!(t::SENSOR_TRIGGERS, "sensor" => name.to_owned(), "trigger" => tc.name.clone(), "result" => r);
            TriggerCounters {
                fired: c("fired"),
                failed: c("failed"),
                dead_lettered: c("dead_lettered"),
                retries: counter!(t::SENSOR_TRIGGER_RETRIES, "sensor" => name.to_owned(), "trigger" => tc.name.clone()),
            }
        },
    })
}

impl Sensor {
    pub(crate) fn compile(cfg: &SensorConfig, name: &str) -> Result<Sensor, String> {
        if cfg.dependencies.is_empty() {
            return Err("dependencies: give at least one".into());
        }
        if cfg.triggers.is_empty() {
            return Err("triggers: give at least one".into());
        }
        if cfg.concurrency == 0 {
            return Err("concurrency: must be at least 1".into());
        }
        unique(
            cfg.dependencies.iter().map(|d| d.name.as_str()),
            "dependencies",
        )?;
        unique(cfg.triggers.iter().map(|t| t.name.as_str()), "triggers")?;
        let mut deps = Vec::new();
        let mut by_origin: foldhash::HashMap<String, (Vec<usize>, Plan)> =
            foldhash::HashMap::default();
        for (i, d) in cfg.dependencies.iter().enumerate() {
            let filters = Filters::compile(
                &d.filters.clone().unwrap_or_default(),
                d.filters_logical_operator,
            )
            .map_err(|e| format!("dependencies.{i}.{e}"))?;
            by_origin.entry(d.source.clone()).or_default().0.push(i);
            let l = |r: &'static str| counter!(t::SENSOR_DEPENDENCY_EVENTS, "sensor" => name.to_owned(), "dependency" => d.name.clone(), "result" => r);
            let transform = match &d.transform {
                None => None,
                Some(t) => match (t.jq.as_deref(), t.script.as_deref()) {
                    (Some(jq), None) => {
                        Some(Transform::Jq(crate::jq::Jq::compile(jq).map_err(|e| {
                            format!("dependencies.{i}.transform.jq: {e}")
                        })?))
                    }
                    (None, Some(lua)) => Some(Transform::Lua(
                        crate::script::Script::compile(lua)
                            .map_err(|e| format!("dependencies.{i}.transform.script: {e}"))?,
                    )),
                    _ => {
                        return Err(format!(
                            "dependencies.{i}.transform: give one of `jq` or `script`"
                        ))
                    }
                },
            };
            deps.push(Dep {
                name: d.name.clone(),
                transform,
                ty: d.ty.clone(),
                event_source: d.event_source.clone(),
                event_subject: d.event_subject.clone(),
                filters,
                matched: l("matched"),
                errors: l("error"),
                filtered: crate::filter::FAMILIES
                    .iter()
                    .map(|f| (*f, counter!(t::SENSOR_DEPENDENCY_EVENTS, "sensor" => name.to_owned(), "dependency" => d.name.clone(), "result" => "filtered", "family" => *f)))
                    .collect(),
            });
        }
        let mut triggers = Vec::new();
        let mut dep_triggers = vec![Vec::new(); deps.len()];
        for (ti, tc) in cfg.triggers.iter().enumerate() {
            let tr = compile_trigger(cfg, name, tc, &format!("triggers.{ti}"), true)?;
            for &d in &tr.deps {
                dep_triggers[d].push(ti);
            }
            triggers.push(tr);
        }
        for (ds, plan) in by_origin.values_mut() {
            *plan = Plan::new(ds.iter().flat_map(|&d| deps[d].filters.paths()));
        }
        Ok(Sensor {
            name: name.to_owned(),
            deps,
            triggers,
            by_origin,
            dep_triggers,
        })
    }

    /// The dependencies `e` (from stage `origin`) satisfies, each with the event as its
    /// transform made it (`None`: unchanged).
    fn matches(&self, root: &cel::Context<'_, '_>, origin: &str, e: &Event) -> Matched<Arc<Event>> {
        let Some((cands, plan)) = self.by_origin.get(origin) else {
            return Matched::new();
        };
        let mut out = Matched::new();
        // The data checked as JSON once for every dependency that reads it unchanged.
        let mut json_text: Option<Result<Option<Doc<'_>>, String>> = None;
        for &d in cands {
            let dep = &self.deps[d];
            if dep.ty.as_deref().is_some_and(|ty| ty != e.ty)
                || dep.event_source.as_deref().is_some_and(|s| s != e.source)
                || dep
                    .event_subject
                    .as_deref()
                    .is_some_and(|s| e.subject.as_deref() != Some(s))
            {
                continue;
            }
            let transformed = match &dep.transform {
                None => None,
                Some(t) => {
                    let data = e.data.as_bytes().map(|b| b.as_ref()).unwrap_or(b"");
                    let out = match t {
                        // Argo: an event without data passes a transform unchanged.
                        _ if data.is_empty() => Ok(None),
                        Transform::Jq(jq) => jq.apply(data).map(Some),
                        Transform::Lua(s) => s.transform(data).map(Some),
                    };
                    match out {
                        Ok(None) => None,
                        Ok(Some(new)) => {
                            let mut t = e.clone();
                            t.datacontenttype = Some("application/json".into());
                            t.data =
                                sluice_core::Data::from_bytes(new.into(), Some("application/json"));
                            Some(Arc::new(t))
                        }
                        Err(err) => {
                            dep.errors.increment(1);
                            tracing::debug!(sensor = %self.name, dependency = %dep.name, id = %e.id, error = %err, "transform error; the event is not used");
                            continue;
                        }
                    }
                }
            };
            let seen = transformed.as_deref().unwrap_or(e);
            let own;
            let text = match &transformed {
                // Filters that do not read the data (none, `context`, `time`) do not check it
                // (Argo reads it in its data, exprs and script filters only).
                _ if !dep.filters.reads_data() => {
                    own = Ok(None);
                    &own
                }
                None => &*json_text.get_or_insert_with(|| data_text_with(e, plan)),
                Some(t) => {
                    own = data_text_with(t, plan);
                    &own
                }
            };
            let v = dep.filters.eval(root, seen, text);
            for err in &v.errors {
                tracing::debug!(sensor = %self.name, dependency = %dep.name, id = %e.id, error = %err, "filter error");
            }
            if !v.errors.is_empty() {
                dep.errors.increment(1);
            }
            if v.pass {
                dep.matched.increment(1);
                out.push((d, transformed));
            } else if let Some(family) = v.family {
                if let Some((_, c)) = dep.filtered.iter().find(|(f, _)| *f == family) {
                    c.increment(1);
                }
            }
        }
        out
    }

    #[cfg(test)]
    pub(crate) fn outputs_for_test(
        &self,
        ti: usize,
        have: &[(usize, Event)],
    ) -> Result<Vec<Event>, String> {
        let have: Vec<_> = have
            .iter()
            .map(|(d, e)| (*d, Arc::new(e.clone())))
            .collect();
        self.outputs(&self.triggers[ti], &have)
    }

    /// Counts and logs the end of a run of `tr` over `events` (a dead-lettered run is counted
    /// where it is sent). Each firing is counted (`fired`); its line is debug, or info when it
    /// took retries: a line per event took 8 % of a busy sensor's CPU at info.
    fn ended<'e>(
        &self,
        tr: &Trigger,
        ids: impl Fn() -> Vec<&'e str>,
        attempts: u32,
        outcome: &Outcome,
    ) {
        if outcome.is_delivered() {
            tr.counters.fired.increment(1);
            if attempts == 1 {
                tracing::debug!(sensor = %self.name, trigger = %tr.name, events = ?ids(), "trigger fired");
            } else {
                tracing::info!(sensor = %self.name, trigger = %tr.name, events = ?ids(), attempts, "trigger fired after retries");
            }
        } else {
            tr.counters.failed.increment(1);
            let reason = outcome.reason.as_deref().unwrap_or("failed");
            tracing::error!(sensor = %self.name, trigger = %tr.name, events = ?ids(), %reason, at_least_once = tr.at_least_once, "trigger failed");
        }
    }

    /// The events the trigger sends for the events `have` (one per satisfied dependency).
    /// A trigger that [forwards](Trigger::forwards) sends copies of them; a direct run takes
    /// them instead ([`Run::fire_direct`]).
    fn outputs(&self, tr: &Trigger, have: &[(usize, Arc<Event>)]) -> Result<Vec<Event>, String> {
        let by_dep = |d: usize| have.iter().find(|(x, _)| *x == d).map(|(_, e)| &**e);
        // Each event's data checked as JSON once for all the parameters that read it, not once
        // per parameter.
        let mut checked = Checked::default();
        let mut resolve = |p: &Param| {
            let e = by_dep(p.dep);
            let doc = match e {
                Some(e) if p.reads_data_key() => checked.of(p.dep, e).as_ref().ok(),
                _ => None,
            };
            match doc {
                Some(doc) => p.resolve_with(e, Some(&|key| doc.as_ref().map(|d| d.get(key)))),
                None => p.resolve_with(e, None),
            }
        };
        let mut outs = if tr.payload.is_empty() {
            copies(have)
        } else {
            let mut doc = serde_json::Value::Null;
            for p in &tr.payload {
                match resolve(p)? {
                    Resolved::Skip => {}
                    // Argo: the first parameter with an empty dest is the whole payload.
                    Resolved::Value(v) if p.is_whole() => {
                        doc = v;
                        break;
                    }
                    Resolved::Value(v) => p.apply(&mut doc, v)?,
                }
            }
            if doc.is_null() {
                doc = serde_json::Value::Object(Default::default());
            }
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            for part in [self.name.as_str(), "\0", tr.name.as_str()] {
                h.update(part.as_bytes());
            }
            for (d, e) in have {
                for part in [
                    "\0",
                    self.deps[*d].name.as_str(),
                    "\0",
                    &e.source,
                    "\0",
                    &e.id,
                ] {
                    h.update(part.as_bytes());
                }
            }
            let id = format!("{:032x}", h.digest128());
            vec![
                Event::new(id, format!("/sensors/{}", self.name), tr.ty.clone())
                    .with_time(Timestamp::now())
                    .with_json(serde_json::to_vec(&doc).unwrap_or_default()),
            ]
        };
        if !tr.payload.is_empty() {
            // An event the trigger built names the sensor and trigger that made it: a
            // Kubernetes trigger labels what it creates with them (Argo's
            // `events.argoproj.io/sensor` and `…/trigger`). Forwarded events stay as they came.
            for out in &mut outs {
                // A new event: it has no extensions yet, so no name can repeat.
                out.extensions.extend(tr.names.iter().cloned());
            }
        }
        if !tr.parameters.is_empty() {
            for out in &mut outs {
                let mut doc = context_json(out);
                for p in &tr.parameters {
                    match resolve(p)? {
                        Resolved::Skip => {}
                        Resolved::Value(v) => p.apply(&mut doc, v)?,
                    }
                }
                let text = |k: &str| {
                    doc.get(k).map(|v| match v {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                };
                for p in &tr.parameters {
                    match p.dest_text.as_str() {
                        "type" => out.ty = text("type").unwrap_or_default().into(),
                        "subject" => out.subject = text("subject").map(Into::into),
                        "dataschema" => out.dataschema = text("dataschema"),
                        ext => {
                            if let Some(v) = text(ext) {
                                out.set_extension(ext.to_owned(), v);
                            }
                        }
                    }
                }
                out.validate()
                    .map_err(|e| format!("the parameters make an invalid CloudEvent: {e}"))?;
            }
        }
        Ok(outs)
    }
}

/// The extension naming the sensor that made an output event.
pub const SENSOR_EXT: &str = "sensor";
/// The extension naming the trigger that made an output event.
pub const TRIGGER_EXT: &str = "trigger";

/// The dependencies' data checked as JSON while one trigger's output is built.
#[derive(Default)]
struct Checked<'a> {
    docs: Vec<(usize, Result<Option<Doc<'a>>, String>)>,
}

impl<'a> Checked<'a> {
    /// Dependency `dep`'s event `e`, checked on first use.
    fn of(&mut self, dep: usize, e: &'a Event) -> &Result<Option<Doc<'a>>, String> {
        let i = match self.docs.iter().position(|(d, _)| *d == dep) {
            Some(i) => i,
            None => {
                self.docs.push((dep, data_text(e)));
                self.docs.len() - 1
            }
        };
        &self.docs[i].1
    }
}

/// The ids of a run's events, for its log lines (a field is evaluated only when its level is
/// on).
fn event_ids(events: &[(usize, Arc<Event>)]) -> Vec<&str> {
    events.iter().map(|(_, e)| e.id.as_str()).collect()
}

/// The event's data for the filters: `Ok(None)` without data, `Err` when it is not JSON.
/// Data known to be JSON is not checked again.
pub(crate) fn data_text(e: &Event) -> Result<Option<Doc<'_>>, String> {
    data_text_with(e, &NO_PLAN)
}

/// No path located while checking.
static NO_PLAN: Plan = Plan::EMPTY;

/// [`data_text`], locating `plan`'s paths in the same pass.
pub(crate) fn data_text_with<'a>(e: &'a Event, plan: &'a Plan) -> Result<Option<Doc<'a>>, String> {
    let not_json = || "the event's data is not JSON".to_string();
    let Some(bytes) = e.data.as_bytes() else {
        return Ok(None);
    };
    // simdutf8: under a third of std's instructions for a 1 KiB body (callgrind).
    let text = simdutf8::basic::from_utf8(bytes).map_err(|_| not_json())?;
    if text.is_empty() {
        return Ok(None);
    }
    match &e.data {
        sluice_core::Data::Json(_) => Ok(Some(Doc::trusted(text))),
        _ => Doc::check_with(text, plan).map(Some).ok_or_else(not_json),
    }
}

/// A kept dependency event.
#[derive(Clone)]
struct Stored {
    event: Arc<Event>,
    at_ms: u64,
}

#[derive(Clone, Default)]
struct Slot {
    /// By position in the trigger's `deps`.
    events: Vec<Option<Stored>>,
    touched_ms: u64,
}

impl Slot {
    fn count(&self) -> usize {
        self.events.iter().filter(|e| e.is_some()).count()
    }
}

/// Partial matches, per trigger and correlation key, mirrored in the state store: every kept
/// event is a key `<trigger> NUL <dependency> NUL <correlation key>` (the key last, so it may
/// hold any byte) whose value is its time (8 bytes) and the event in the JSON format.
struct State {
    table: String,
    store: Option<Arc<dyn StateStore>>,
    slots: Vec<HashMap<String, Slot>>,
    gauges: Vec<Gauge>,
    counts: Vec<usize>,
}

fn now_ms() -> u64 {
    Utc::now().timestamp_millis().max(0) as u64
}

fn state_key(trigger: &str, key: &str, dep: &str) -> Vec<u8> {
    [
        trigger.as_bytes(),
        b"\0",
        dep.as_bytes(),
        b"\0",
        key.as_bytes(),
    ]
    .concat()
}

/// Puts and deletes gathered for one atomic write.
#[derive(Default)]
struct Writes {
    puts: Vec<(Vec<u8>, Vec<u8>)>,
    dels: Vec<Vec<u8>>,
}

impl State {
    fn new(s: &Sensor, store: Option<Arc<dyn StateStore>>) -> State {
        State {
            table: format!("sensor.{}", s.name),
            store,
            slots: s.triggers.iter().map(|_| HashMap::new()).collect(),
            gauges: s
                .triggers
                .iter()
                .map(|t| gauge!(t::SENSOR_STATE_EVENTS, "sensor" => s.name.clone(), "trigger" => t.name.clone()))
                .collect(),
            counts: vec![0; s.triggers.len()],
        }
    }

    fn persistent(&self) -> bool {
        self.store.is_some()
    }

    /// Adds `delta` to the kept-event count of trigger `ti`.
    fn adjust(&mut self, ti: usize, delta: isize) {
        self.counts[ti] = self.counts[ti].saturating_add_signed(delta);
        self.gauges[ti].set(self.counts[ti] as f64);
    }

    fn recount(&mut self, ti: usize) {
        self.counts[ti] = self.slots[ti].values().map(Slot::count).sum();
        self.gauges[ti].set(self.counts[ti] as f64);
    }

    fn write(&self, w: &Writes) -> Result<(), String> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        if w.puts.is_empty() && w.dels.is_empty() {
            return Ok(());
        }
        let p: Vec<(&[u8], &[u8])> = w
            .puts
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_slice()))
            .collect();
        let d: Vec<&[u8]> = w.dels.iter().map(Vec::as_slice).collect();
        store.write(&self.table, &p, &d).map_err(|e| e.to_string())
    }

    fn slot_keys(s: &Sensor, ti: usize, key: &str, slot: &Slot) -> Vec<Vec<u8>> {
        let tr = &s.triggers[ti];
        slot.events
            .iter()
            .enumerate()
            .filter(|(_, e)| e.is_some())
            .map(|(pos, _)| state_key(&tr.name, key, &s.deps[tr.deps[pos]].name))
            .collect()
    }

    fn encode(st: &Stored) -> Vec<u8> {
        let mut v = st.at_ms.to_be_bytes().to_vec();
        sluice_core::format::encode_event_into(&st.event, &mut v);
        v
    }

    /// Loads what the store holds, dropping entries of triggers or dependencies that no longer
    /// exist or no longer keep state (pure-OR), and entries older than the last reset tick or
    /// the trigger's TTL.
    fn load(&mut self, s: &Sensor) -> Result<(), String> {
        let Some(store) = self.store.clone() else {
            return Ok(());
        };
        let mut stale = Vec::new();
        let now = now_ms();
        let mut rows = Vec::new();
        store
            .scan(&self.table, &mut |k, v| rows.push((k.to_vec(), v.to_vec())))
            .map_err(|e| e.to_string())?;
        for (k, v) in rows {
            let parts: Vec<&[u8]> = k.splitn(3, |b| *b == 0).collect();
            let found = (parts.len() == 3 && v.len() > 8)
                .then(|| {
                    let tn = std::str::from_utf8(parts[0]).ok()?;
                    let dn = std::str::from_utf8(parts[1]).ok()?;
                    let key = std::str::from_utf8(parts[2]).ok()?;
                    let ti = s.triggers.iter().position(|t| t.name == tn)?;
                    let tr = &s.triggers[ti];
                    if tr.pure_or {
                        return None;
                    }
                    let pos = tr.deps.iter().position(|&d| s.deps[d].name == dn)?;
                    let at_ms = u64::from_be_bytes(v[..8].try_into().ok()?);
                    let event =
                        sluice_core::format::decode_event(&bytes::Bytes::copy_from_slice(&v[8..]))
                            .ok()?;
                    let floor = last_reset_ms(tr).max(
                        tr.ttl
                            .map_or(0, |ttl| now.saturating_sub(ttl.as_millis() as u64)),
                    );
                    (at_ms >= floor).then_some((
                        ti,
                        key.to_owned(),
                        pos,
                        Stored {
                            event: Arc::new(event),
                            at_ms,
                        },
                    ))
                })
                .flatten();
            match found {
                Some((ti, key, pos, st)) => {
                    let n = s.triggers[ti].deps.len();
                    let slot = self.slots[ti].entry(key).or_default();
                    slot.events.resize(n, None);
                    slot.touched_ms = slot.touched_ms.max(st.at_ms);
                    slot.events[pos] = Some(st);
                }
                None => stale.push(k),
            }
        }
        if !stale.is_empty() {
            tracing::info!(sensor = %s.name, entries = stale.len(), "sensor: dropped saved partial matches that are stale or belong to a changed spec");
        }
        self.write(&Writes {
            puts: Vec::new(),
            dels: stale,
        })?;
        for ti in 0..s.triggers.len() {
            self.recount(ti);
        }
        Ok(())
    }

    fn clear(&mut self, s: &Sensor, ti: usize, reason: &'static str) -> Result<(), String> {
        let keys: Vec<String> = self.slots[ti].keys().cloned().collect();
        self.evict(s, ti, &keys, reason)
    }

    fn expire(&mut self, s: &Sensor, now: u64) -> Result<(), String> {
        for ti in 0..s.triggers.len() {
            let Some(ttl) = s.triggers[ti].ttl else {
                continue;
            };
            let floor = now.saturating_sub(ttl.as_millis() as u64);
            let old: Vec<String> = self.slots[ti]
                .iter()
                .filter(|(_, sl)| sl.touched_ms < floor)
                .map(|(k, _)| k.clone())
                .collect();
            self.evict(s, ti, &old, "ttl")?;
        }
        Ok(())
    }

    fn evict(
        &mut self,
        s: &Sensor,
        ti: usize,
        keys: &[String],
        reason: &'static str,
    ) -> Result<(), String> {
        let mut w = Writes::default();
        self.evict_into(s, ti, keys, reason, &mut w);
        self.write(&w)
    }

    fn evict_into(
        &mut self,
        s: &Sensor,
        ti: usize,
        keys: &[String],
        reason: &'static str,
        w: &mut Writes,
    ) {
        if keys.is_empty() {
            return;
        }
        let mut n = 0;
        for k in keys {
            if let Some(slot) = self.slots[ti].remove(k) {
                n += slot.count();
                if self.persistent() {
                    w.dels.extend(Self::slot_keys(s, ti, k, &slot));
                }
            }
        }
        counter!(t::SENSOR_STATE_EVICTIONS, "sensor" => s.name.clone(), "trigger" => s.triggers[ti].name.clone(), "reason" => reason).increment(keys.len() as u64);
        self.adjust(ti, -(n as isize));
    }

    /// After an at-least-once run settled for good (delivered, dead-lettered, or rejected):
    /// the events it took are spent; delete their saved copies where no newer event of the
    /// same dependency took the key since.
    fn spend(&mut self, s: &Sensor, ti: usize, key: &str, taken: &Slot) {
        if !self.persistent() {
            return;
        }
        let tr = &s.triggers[ti];
        let current = self.slots[ti].get(key);
        let dels: Vec<Vec<u8>> = taken
            .events
            .iter()
            .enumerate()
            .filter(|(pos, st)| {
                st.is_some()
                    && current.is_none_or(|c| c.events.get(*pos).is_none_or(Option::is_none))
            })
            .map(|(pos, _)| state_key(&tr.name, key, &s.deps[tr.deps[pos]].name))
            .collect();
        if let Err(e) = self.write(&Writes {
            puts: Vec::new(),
            dels,
        }) {
            tracing::error!(sensor = %s.name, trigger = %tr.name, error = %e, "sensor: cannot delete the spent partial match");
        }
    }

    /// Puts back what a failed at-least-once run had taken, where nothing newer arrived and
    /// no reset happened since (the saved copies were kept, so a restart also has them).
    fn restore(&mut self, s: &Sensor, ti: usize, key: String, taken: Slot) {
        let tr = &s.triggers[ti];
        let floor = last_reset_ms(tr);
        let slot = self.slots[ti].entry(key).or_default();
        slot.events.resize(tr.deps.len(), None);
        let mut added = 0;
        for (pos, st) in taken.events.into_iter().enumerate() {
            if let (None, Some(st)) = (&slot.events[pos], st) {
                if st.at_ms >= floor {
                    slot.events[pos] = Some(st);
                    added += 1;
                }
            }
        }
        slot.touched_ms = slot.touched_ms.max(taken.touched_ms);
        self.adjust(ti, added);
    }
}

/// The most recent reset tick of a trigger, in ms (0 without resets).
fn last_reset_ms(tr: &Trigger) -> u64 {
    tr.resets
        .iter()
        .filter_map(|(cron, tz)| {
            let now = Utc::now().with_timezone(tz);
            cron.find_previous_occurrence(&now, true).ok()
        })
        .map(|t| t.timestamp_millis().max(0) as u64)
        .max()
        .unwrap_or(0)
}

/// A trigger's next reset tick after `after`.
fn next_tick(tr: &Trigger, after: chrono::DateTime<Utc>) -> Option<chrono::DateTime<Utc>> {
    tr.resets
        .iter()
        .filter_map(|(cron, tz)| {
            cron.find_next_occurrence(&after.with_timezone(tz), false)
                .ok()
                .map(|t| t.with_timezone(&Utc))
        })
        .min()
}

/// A trigger whose condition holds: its events, and (at-least-once) what it took.
struct Firing {
    trigger: usize,
    /// Shared with the state's saved copies and the other firings of the same input: the
    /// output is made from them, so holding them costs no copy of the event.
    events: SmallVec<[(usize, Arc<Event>); 2]>,
    taken: Option<(String, Slot)>,
}

impl Sensor {
    /// The triggers that name one of `matched`, each once, in order.
    fn triggers_of(&self, matched: &[(usize, Option<Arc<Event>>)]) -> SmallVec<[usize; 4]> {
        let mut tis: SmallVec<[usize; 4]> = matched
            .iter()
            .flat_map(|(d, _)| self.dep_triggers[*d].iter().copied())
            .collect();
        tis.sort_unstable();
        tis.dedup();
        tis
    }

    /// Whether every one of `tis` is a pure OR, which keeps nothing: applying an event to them
    /// reads and writes no state (nor takes its lock).
    fn all_pure_or(&self, tis: &[usize]) -> bool {
        tis.iter().all(|&ti| self.triggers[ti].pure_or)
    }

    /// The run of pure-OR trigger `ti` for a matched event: at once, with the events of the
    /// dependencies it names that `matched` holds (each the transformed one, if any, else `e`).
    fn pure_or_firing(
        &self,
        ti: usize,
        e: &Arc<Event>,
        matched: &[(usize, Option<Arc<Event>>)],
    ) -> Firing {
        let events = self.triggers[ti]
            .deps
            .iter()
            .filter_map(|&d| {
                let (_, t) = matched.iter().find(|(x, _)| *x == d)?;
                Some((d, t.as_ref().unwrap_or(e).clone()))
            })
            .collect();
        Firing {
            trigger: ti,
            events,
            taken: None,
        }
    }

    /// Applies one matched event to the triggers `tis` (those that name one of `matched`:
    /// [`Sensor::triggers_of`]), and saves what changed in one atomic write (before the input
    /// is acknowledged).
    fn apply(
        &self,
        state: &mut State,
        e: &Arc<Event>,
        matched: &[(usize, Option<Arc<Event>>)],
        tis: &[usize],
    ) -> Result<SmallVec<[Firing; 1]>, String> {
        let mut firings = SmallVec::new();
        let event_of = |d: usize| {
            matched
                .iter()
                .find(|(x, _)| *x == d)
                .and_then(|(_, t)| t.as_ref())
                .unwrap_or(e)
        };
        // Read only for the triggers that keep the event (a pure OR fires at once).
        let now = if self.all_pure_or(tis) { 0 } else { now_ms() };
        let persistent = state.persistent();
        let mut w = Writes::default();
        for &ti in tis {
            let tr = &self.triggers[ti];
            if tr.pure_or {
                firings.push(self.pure_or_firing(ti, e, matched));
                continue;
            }
            let mine: SmallVec<[usize; 4]> = tr
                .deps
                .iter()
                .copied()
                .filter(|d| matched.iter().any(|(x, _)| x == d))
                .collect();
            let key = match &tr.correlate {
                None => String::new(),
                Some(path) => {
                    let e = event_of(mine[0]);
                    let data = e
                        .data
                        .as_bytes()
                        .and_then(|b| std::str::from_utf8(b).ok())
                        .unwrap_or("");
                    let v = gjson::get(data, path);
                    if !v.exists() {
                        tracing::debug!(sensor = %self.name, trigger = %tr.name, id = %e.id, path = %path, "sensor: no correlation key in the event; not kept for this trigger");
                        continue;
                    }
                    v.str().to_owned()
                }
            };
            // A partial match past its TTL is dropped before this event joins it.
            if let Some(ttl) = tr.ttl {
                let floor = now.saturating_sub(ttl.as_millis() as u64);
                if state.slots[ti]
                    .get(&key)
                    .is_some_and(|sl| sl.touched_ms < floor)
                {
                    state.evict_into(self, ti, std::slice::from_ref(&key), "ttl", &mut w);
                }
            }
            let slot = state.slots[ti].entry(key.clone()).or_default();
            slot.events.resize(tr.deps.len(), None);
            slot.touched_ms = now;
            let mut added = 0isize;
            for d in &mine {
                let pos = tr.deps.iter().position(|x| x == d).unwrap_or(0);
                let st = Stored {
                    event: event_of(*d).clone(),
                    at_ms: now,
                };
                if persistent {
                    w.puts.push((
                        state_key(&tr.name, &key, &self.deps[*d].name),
                        State::encode(&st),
                    ));
                }
                if slot.events[pos].is_none() {
                    added += 1;
                }
                slot.events[pos] = Some(st);
            }
            let holds = tr.cond.eval(&|d| {
                tr.deps
                    .iter()
                    .position(|x| *x == d)
                    .is_some_and(|pos| slot.events[pos].is_some())
            });
            state.adjust(ti, added);
            if holds {
                let taken = state.slots[ti].remove(&key).unwrap_or_default();
                state.adjust(ti, -(taken.count() as isize));
                let events = taken
                    .events
                    .iter()
                    .enumerate()
                    .filter_map(|(pos, st)| st.as_ref().map(|st| (tr.deps[pos], st.event.clone())))
                    .collect();
                if tr.at_least_once {
                    // The saved copies stay until the run settled (`State::spend`): a crash or
                    // a stop in between leaves them for the next start, and the sender's
                    // redelivery completes the condition again.
                    firings.push(Firing {
                        trigger: ti,
                        events,
                        taken: Some((key, taken)),
                    });
                } else {
                    if persistent {
                        // Every saved copy of the slot, this event's put included (deletes
                        // apply after puts in one write).
                        w.dels.extend(State::slot_keys(self, ti, &key, &taken));
                    }
                    firings.push(Firing {
                        trigger: ti,
                        events,
                        taken: None,
                    });
                }
            } else if state.slots[ti].len() > tr.max_keys {
                let oldest = state.slots[ti]
                    .iter()
                    .min_by_key(|(_, s)| s.touched_ms)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    state.evict_into(self, ti, &[k], "capacity", &mut w);
                }
            }
        }
        state.write(&w)?;
        Ok(firings)
    }
}

/// A run's outputs: built by [`Sensor::outputs`], or, for a trigger that
/// [forwards](Trigger::forwards) its events, those events themselves: copied when the run
/// starts, or taken from the firing by a direct run ([`Run::fire_direct`]), which needs only
/// their ids afterwards.
enum Outs {
    Built(Vec<Event>),
    Forward,
}

impl Outs {
    /// How many events the run sends.
    fn len(&self, f: &Firing) -> usize {
        match self {
            Outs::Built(v) => v.len(),
            Outs::Forward => f.events.len(),
        }
    }

    /// The events to send, forwarded ones copied (the firing keeps them for its retries, its
    /// dead-letter trigger and its log lines).
    fn copied(self, f: &Firing) -> Vec<Event> {
        match self {
            Outs::Built(v) => v,
            Outs::Forward => copies(&f.events),
        }
    }
}

/// What a trigger that [forwards](Trigger::forwards) sends for the events `have`: copies of them.
fn copies(have: &[(usize, Arc<Event>)]) -> Vec<Event> {
    have.iter().map(|(_, e)| Event::clone(e)).collect()
}

/// The dependencies an event satisfies, each with the event its transform made (`None`: the
/// event unchanged), shared: the firings and the saved partial matches hold it, not copies.
/// Inline for the usual one or two, so that no event allocates a list.
type Matched<E> = SmallVec<[(usize, Option<E>); 2]>;

/// A leaky bucket: one run per `interval`, waiting (bounded by the window) when ahead.
struct Limiter {
    interval: Duration,
    next: Mutex<tokio::time::Instant>,
    waited: Counter,
}

impl Limiter {
    async fn wait(&self) {
        let now = tokio::time::Instant::now();
        let at = {
            let mut n = self.next.lock().unwrap_or_else(|p| p.into_inner());
            let at = (*n).max(now);
            *n = at + self.interval;
            at
        };
        if at > now {
            self.waited.increment(1);
            tokio::time::sleep_until(at).await;
        }
    }
}

struct Run {
    sensor: Arc<Sensor>,
    state: Arc<Mutex<State>>,
    sender: SourceSender,
    targets: Vec<(Target, Option<Target>)>,
    limiters: Vec<Option<Arc<Limiter>>>,
    grace_over: tokio_util::sync::CancellationToken,
    /// Runs handed straight to their sink and not settled yet ([`Run::fire_direct`]), at most
    /// `concurrency`: each holds its inputs, whose bytes the pipeline no longer counts.
    direct: std::sync::atomic::AtomicUsize,
    concurrency: usize,
}

fn rand01() -> f64 {
    // Jitter only: the low bits of the clock are random enough.
    (Utc::now().timestamp_subsec_nanos() % 1_000_000) as f64 / 1_000_000.0
}

impl Run {
    /// Runs one firing to its end: rate limit, attempts with backoff, dead letter; then
    /// spends or puts back what an at-least-once run took.
    fn fire(
        self: &Arc<Self>,
        f: Firing,
        outs: Vec<Event>,
    ) -> impl std::future::Future<Output = Outcome> + Send + 'static {
        // One reference for the run: cloning the sender, the token and the rest one by one
        // cost a dozen reference counts (and the token's lock) per firing.
        let run = self.clone();
        let (target, dlq) = self.targets[f.trigger];
        async move {
            let (sensor, state, sender) = (&run.sensor, &run.state, &run.sender);
            let (limiter, grace_over) = (&run.limiters[f.trigger], &run.grace_over);
            let tr = &sensor.triggers[f.trigger];
            // The output is kept for a next attempt or a dead letter only when one can follow.
            let reusable = tr.retry.attempts > 1 || tr.dlq.is_some();
            let mut outs = outs;
            if let Some(l) = &limiter {
                l.wait().await;
            }
            let mut attempt = 0;
            let outcome = loop {
                let batch = if reusable {
                    outs.clone()
                } else {
                    std::mem::take(&mut outs)
                };
                let outcome = sender.send_to(target, batch).await.await;
                if outcome.status == Status::Delivered || outcome.status == Status::Rejected {
                    break outcome;
                }
                attempt += 1;
                if attempt >= tr.retry.attempts || grace_over.is_cancelled() {
                    break outcome;
                }
                tr.counters.retries.increment(1);
                let delay = tr.retry.delay(attempt - 1, rand01());
                tracing::debug!(sensor = %sensor.name, trigger = %tr.name, attempt, ?delay, reason = ?outcome.reason, "trigger failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = grace_over.cancelled() => break outcome,
                }
            };
            let settle = |outcome: Outcome| {
                if let Some((key, taken)) = f.taken {
                    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
                    if outcome.status == Status::Failed {
                        st.restore(sensor, f.trigger, key, taken);
                    } else {
                        st.spend(sensor, f.trigger, &key, &taken);
                    }
                }
                outcome
            };
            if outcome.is_delivered() {
                sensor.ended(tr, || event_ids(&f.events), attempt + 1, &outcome);
                return settle(outcome);
            }
            let reason = outcome.reason.clone().unwrap_or_else(|| "failed".into());
            if let (Some(target), Some(d)) = (dlq, tr.dlq.as_ref()) {
                let dl = match d {
                    Dlq::Sink(_) => {
                        let dead: Vec<Event> = outs
                            .into_iter()
                            .map(|mut e| {
                                e.set_extension(DEAD_LETTER_SINK, tr.sink.clone());
                                e.set_extension(DEAD_LETTER_REASON, reason.clone());
                                e
                            })
                            .collect();
                        sender.send_to(target, dead).await.await
                    }
                    // Argo's form: another trigger, run with the same events and its own
                    // payload and retries.
                    Dlq::Trigger(dt) => match sensor.outputs(dt, &f.events) {
                        Err(e) => Outcome {
                            status: Status::Rejected,
                            reason: Some(format!("dlqTrigger {}: {e}", dt.name)),
                            events: outs.len(),
                            duplicates: 0,
                            each: Vec::new(),
                        },
                        Ok(dead) => {
                            let mut attempt = 0;
                            loop {
                                let o = sender.send_to(target, dead.clone()).await.await;
                                attempt += 1;
                                if o.is_delivered()
                                    || o.status == Status::Rejected
                                    || attempt >= dt.retry.attempts
                                    || grace_over.is_cancelled()
                                {
                                    break o;
                                }
                                dt.counters.retries.increment(1);
                                tokio::select! {
                                    _ = tokio::time::sleep(dt.retry.delay(attempt - 1, rand01())) => {}
                                    _ = grace_over.cancelled() => break o,
                                }
                            }
                        }
                    },
                };
                if dl.is_delivered() {
                    tr.counters.dead_lettered.increment(1);
                    tracing::warn!(sensor = %sensor.name, trigger = %tr.name, events = ?event_ids(&f.events), %reason, "trigger failed; sent to its dlqTrigger");
                    return settle(dl);
                }
            }
            sensor.ended(tr, || event_ids(&f.events), attempt + 1, &outcome);
            settle(outcome)
        }
    }

    /// Whether firing `f` with `outs` is one hand-over to the sink and nothing more: one
    /// output, no retry, no dead letter, no rate limit, no partial match to spend or restore.
    /// Such a run needs no task: the output's continuation settles it. Only while no run waits
    /// in `window` (a run queued straight away would overtake one waiting for room in the same
    /// sink) and fewer than `concurrency` such runs are unsettled.
    fn direct<F: std::future::Future<Output = ()>>(
        &self,
        f: &Firing,
        outs: &Outs,
        window: &SinkWindow<F>,
    ) -> bool {
        let tr = &self.sensor.triggers[f.trigger];
        outs.len(f) == 1
            && f.taken.is_none()
            && tr.retry.attempts <= 1
            && tr.dlq.is_none()
            && self.limiters[f.trigger].is_none()
            && window.is_empty()
            && self.direct.load(std::sync::atomic::Ordering::Relaxed) < self.concurrency
    }

    /// Fires a [`Run::direct`] run: its output is queued for the sink now, with a
    /// continuation that counts the run and then calls `settled` (the input's settling, for
    /// an at-least-once trigger). When the sink's queue has no room now, a task in `window`
    /// waits for it and does the same.
    ///
    /// A forwarded event is taken from the firing, not copied ([`Outs::Forward`]); the
    /// continuation keeps its id for the log line.
    fn fire_direct(
        self: &Arc<Self>,
        mut f: Firing,
        outs: Outs,
        settled: impl FnOnce(&Outcome) + Send + 'static,
        window: &mut SinkWindow<futures_util::future::BoxFuture<'static, ()>>,
    ) {
        let (target, _) = self.targets[f.trigger];
        let (out, id) = match outs {
            Outs::Built(mut outs) => (outs.pop().expect("a direct run has one output"), None),
            Outs::Forward => {
                let (_, e) = f.events.pop().expect("a direct run has one event");
                // The only holder once the input dropped its own (`Run::input`); a copy when
                // another trigger's run of the same input still holds it.
                let out = Arc::unwrap_or_clone(e);
                let id = out.id.clone();
                (out, Some(id))
            }
        };
        let run = self.clone();
        self.direct
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let then: Then = Box::new(move |outcome: Outcome| {
            let tr = &run.sensor.triggers[f.trigger];
            match &id {
                Some(id) => run.sensor.ended(tr, || vec![id.as_str()], 1, &outcome),
                None => run.sensor.ended(tr, || event_ids(&f.events), 1, &outcome),
            }
            settled(&outcome);
            run.direct
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        });
        if let Err((out, then)) = self.sender.try_send_to_then(target, out, then) {
            let run = self.clone();
            window.push(Box::pin(async move {
                then(run.sender.send_to(target, vec![out]).await.await);
            }));
        }
    }

    /// Handles one input: match, keep, fire, and settle it.
    fn input(
        self: &Arc<Self>,
        root: &cel::Context<'_, '_>,
        item: SinkItem,
        window: &mut SinkWindow<futures_util::future::BoxFuture<'static, ()>>,
    ) {
        let SinkItem {
            event,
            mut delivery,
        } = item;
        delivery.release_memory();
        let matched = self.sensor.matches(root, delivery.origin(), &event);
        if matched.is_empty() {
            return delivery.delivered();
        }
        // Shared from here: the firings and the saved partial matches hold it, not copies.
        let event: Arc<Event> = Arc::from(event);
        let tis = self.sensor.triggers_of(&matched);
        let firings = if self.sensor.all_pure_or(&tis) {
            Ok(tis
                .iter()
                .map(|&ti| self.sensor.pure_or_firing(ti, &event, &matched))
                .collect())
        } else {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            self.sensor.apply(&mut st, &event, &matched, &tis)
        };
        let firings = match firings {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(sensor = %self.sensor.name, id = %event.id, error = %e, "sensor: cannot save the partial match; the event fails upstream");
                return delivery.failed(format!("sensor {}: state store: {e}", self.sensor.name));
            }
        };
        // The firings and the saved partial matches hold the event (and a transformed one)
        // where it is needed; without these holds, a direct run that forwards it can take it
        // instead of copying it.
        drop(event);
        drop(matched);
        // The runs an at-least-once input waits for, as what starts them: each run's future is
        // made inside the one box the window holds (a run's future is several KiB; made here
        // and moved into a list, out of it, into the settling future and into its box, it was
        // copied four times per input).
        let mut waits: SmallVec<[(Firing, Outs); 1]> = SmallVec::new();
        // The first refusal among the at-least-once runs that could not be built (each is a
        // `Rejected`, so the first is as bad as any).
        let mut refused: Option<Outcome> = None;
        for f in firings {
            let tr = &self.sensor.triggers[f.trigger];
            let built = if tr.forwards() {
                Ok(Outs::Forward)
            } else {
                self.sensor.outputs(tr, &f.events).map(Outs::Built)
            };
            let outs = match built {
                Ok(o) => o,
                Err(e) => {
                    tr.counters.failed.increment(1);
                    tracing::error!(sensor = %self.sensor.name, trigger = %tr.name, events = ?event_ids(&f.events), error = %e, "trigger cannot build its output");
                    // A run that cannot be built is refused for good: its events are spent.
                    if let Some((key, taken)) = &f.taken {
                        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                        st.spend(&self.sensor, f.trigger, key, taken);
                    }
                    if tr.at_least_once && refused.is_none() {
                        refused = Some(Outcome {
                            status: Status::Rejected,
                            reason: Some(format!(
                                "sensor {} trigger {}: {e}",
                                self.sensor.name, tr.name
                            )),
                            events: 1,
                            duplicates: 0,
                            each: Vec::new(),
                        });
                    }
                    continue;
                }
            };
            if tr.at_least_once {
                waits.push((f, outs));
            } else if self.direct(&f, &outs, window) {
                self.fire_direct(f, outs, |_| {}, window);
            } else {
                let outs = outs.copied(&f);
                let run = self.clone();
                window.push(Box::pin(async move {
                    run.fire(f, outs).await;
                }));
            }
        }
        match (waits.len(), refused) {
            (0, None) => delivery.delivered(),
            (0, Some(o)) => delivery.settle_with(&o),
            // The usual case: one box for the run and the input's settling, or none when the
            // run is one hand-over to the sink.
            (1, None) => {
                let (f, outs) = waits.pop().expect("one run");
                if self.direct(&f, &outs, window) {
                    return self.fire_direct(f, outs, move |o| delivery.settle_with(o), window);
                }
                let outs = outs.copied(&f);
                let run = self.clone();
                window.push(Box::pin(async move {
                    let outcome = run.fire(f, outs).await;
                    delivery.settle_with(&outcome);
                }));
            }
            (_, refused) => {
                let run = self.clone();
                window.push(Box::pin(async move {
                    let outcomes = join_all(waits.into_iter().map(|(f, outs)| {
                        let outs = outs.copied(&f);
                        run.fire(f, outs)
                    }))
                    .await;
                    let worst = outcomes.into_iter().chain(refused).max_by_key(|o| o.status);
                    match worst {
                        Some(o) => delivery.settle_with(&o),
                        None => delivery.delivered(),
                    }
                }));
            }
        }
    }
}

pub(crate) fn start(
    sensor: Sensor,
    concurrency: usize,
    ctx: ProcessorContext,
) -> Result<impl std::future::Future<Output = Result<(), ConnectorError>> + Send, ConnectorError> {
    let mut targets = Vec::new();
    for tr in &sensor.triggers {
        let find = |sink: &str| {
            ctx.sender.target(sink).ok_or_else(|| {
                ConnectorError::new(format!(
                    "sensor {}: trigger {}: sink `{sink}` is not wired to this sensor",
                    sensor.name, tr.name
                ))
            })
        };
        targets.push((
            find(&tr.sink)?,
            tr.dlq.as_ref().map(|d| find(d.sink())).transpose()?,
        ));
    }
    let limiters = sensor
        .triggers
        .iter()
        .map(|tr| {
            tr.rate.map(|interval| {
                Arc::new(Limiter {
                    interval,
                    next: Mutex::new(tokio::time::Instant::now()),
                    waited: counter!(t::SENSOR_RATE_LIMITED, "sensor" => sensor.name.clone(), "trigger" => tr.name.clone()),
                })
            })
        })
        .collect();
    let mut state = State::new(&sensor, ctx.state.clone());
    state.load(&sensor).map_err(|e| {
        ConnectorError::new(format!(
            "sensor {}: cannot load its saved state: {e}",
            sensor.name
        ))
    })?;
    if ctx.state.is_none() && sensor.triggers.iter().any(|t| !t.pure_or) {
        tracing::info!(sensor = %sensor.name, "sensor: no state_dir; partial matches are kept in memory only and lost on restart");
    }
    let run = Run {
        sensor: Arc::new(sensor),
        state: Arc::new(Mutex::new(state)),
        sender: ctx.sender.clone(),
        targets,
        limiters,
        grace_over: ctx.grace_over.clone(),
        direct: std::sync::atomic::AtomicUsize::new(0),
        concurrency,
    };
    Ok(run_loop(run, concurrency, ctx))
}

async fn run_loop(
    run: Run,
    concurrency: usize,
    mut ctx: ProcessorContext,
) -> Result<(), ConnectorError> {
    let run = Arc::new(run);
    let root = expr::root_context();
    let mut window: SinkWindow<futures_util::future::BoxFuture<'static, ()>> =
        SinkWindow::new(concurrency);
    let mut batch: Vec<SinkItem> = Vec::with_capacity(BATCH);
    let sensor = run.sensor.clone();
    // Each trigger's next reset tick, checked after every step (so a busy sensor misses none)
    // and then moved past now; the TTL sweep likewise once a second.
    let mut ticks: Vec<Option<chrono::DateTime<Utc>>> = sensor
        .triggers
        .iter()
        .map(|tr| next_tick(tr, Utc::now()))
        .collect();
    let any_ttl = sensor.triggers.iter().any(|t| t.ttl.is_some());
    // Without resets or TTLs nothing here is timed: no clock is read per step.
    let timed = any_ttl || ticks.iter().any(Option::is_some);
    let mut next_sweep = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let now = if timed {
            Utc::now()
        } else {
            chrono::DateTime::<Utc>::MIN_UTC
        };
        if timed
            && (ticks.iter().flatten().any(|t| *t <= now)
                || (any_ttl && tokio::time::Instant::now() >= next_sweep))
        {
            let mut st = run.state.lock().unwrap_or_else(|p| p.into_inner());
            for (ti, tick) in ticks.iter_mut().enumerate() {
                if tick.is_some_and(|t| t <= now) {
                    tracing::info!(sensor = %sensor.name, trigger = %sensor.triggers[ti].name, "sensor: conditionsReset: partial state cleared");
                    if let Err(e) = st.clear(&sensor, ti, "reset") {
                        tracing::error!(sensor = %sensor.name, error = %e, "sensor: cannot clear the saved state");
                    }
                    *tick = next_tick(&sensor.triggers[ti], now);
                }
            }
            if any_ttl && tokio::time::Instant::now() >= next_sweep {
                if let Err(e) = st.expire(&sensor, now_ms()) {
                    tracing::error!(sensor = %sensor.name, error = %e, "sensor: cannot expire the saved state");
                }
                next_sweep = tokio::time::Instant::now() + Duration::from_secs(1);
            }
        }
        let wake = ticks
            .iter()
            .flatten()
            .map(|t| tokio::time::Instant::now() + (*t - Utc::now()).to_std().unwrap_or_default())
            .chain(any_ttl.then_some(next_sweep))
            .min();
        let input = &mut ctx.input;
        let step = tokio::select! {
            s = window.step(&ctx.grace_over, true, |room| input.recv_many(&mut batch, room.min(BATCH))) => s,
            _ = async { match wake { Some(w) => tokio::time::sleep_until(w).await, None => std::future::pending().await } } => continue,
        };
        match step {
            Step::GraceOver => break,
            Step::Settled | Step::Idle => {}
            Step::Input(0) => {
                window.drain_until(&ctx.grace_over).await;
                break;
            }
            Step::Input(_) => {
                for item in batch.drain(..) {
                    run.input(&root, item, &mut window);
                }
            }
        }
    }
    tracing::debug!(sensor = %sensor.name, "sensor: stopped");
    Ok(())
}

/// The per-event work without the pipeline (criterion benchmark).
pub struct Bench {
    sensor: Sensor,
    state: State,
    root: cel::Context<'static, 'static>,
}

impl Bench {
    /// A sensor from its config as JSON.
    pub fn new(cfg: serde_json::Value) -> Bench {
        let cfg: SensorConfig = serde_json::from_value(cfg).expect("bench: sensor config");
        let sensor = Sensor::compile(&cfg, "bench").expect("bench: sensor compiles");
        let state = State::new(&sensor, None);
        Bench {
            sensor,
            state,
            root: expr::root_context(),
        }
    }

    /// Matches, keeps and fires for one event from `origin`; returns the trigger runs it
    /// started (their outputs are built, as the sensor does).
    pub fn event(&mut self, origin: &str, e: &Event) -> usize {
        self.event_with_errors(origin, e).0
    }

    /// [`Bench::event`], and how many of the runs could not build their output.
    pub fn event_with_errors(&mut self, origin: &str, e: &Event) -> (usize, usize) {
        let matched = self.sensor.matches(&self.root, origin, e);
        if matched.is_empty() {
            return (0, 0);
        }
        let e = &Arc::new(e.clone());
        let tis = self.sensor.triggers_of(&matched);
        let firings = self
            .sensor
            .apply(&mut self.state, e, &matched, &tis)
            .unwrap_or_default();
        let errors = firings
            .iter()
            .filter(|f| {
                self.sensor
                    .outputs(&self.sensor.triggers[f.trigger], &f.events)
                    .is_err()
            })
            .count();
        (firings.len(), errors)
    }
}
