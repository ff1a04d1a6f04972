//! YAML → typed config, with `FILE:LINE:COL: message` for every error.
//!
//! `yaml_serde` parses the document; a second pass with `saphyr-parser` records where every key
//! and value sits, so a serde error (located by `serde_path_to_error`) or a semantic error can
//! point at its line and column. Each section and each connector is deserialized on its own, so
//! one run reports every error, not just the first.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::Deserialize;
use sluice_core::pipeline::wiring::{Attr, DedupScope, Match, RouteSpec, Unrouted};
use sluice_core::pipeline::WhenFull;
use sluice_core::units::{ByteSize, HumanDuration};
use yaml_serde::Value;

use crate::registry::{self, DynProcessor, DynSink, DynSource, Role};

mod graph;
mod positions;
mod substitute;

use graph::processor_graph;
use positions::strip_location;
pub use positions::suggest;
pub(crate) use positions::{Ctx, Positions};
use substitute::substitute_all;

/// The embedded default configuration: a webhook on 0.0.0.0:12000 → log.
pub const DEFAULT_CONFIG: &str = include_str!("../../config/default.yaml");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub pos: Option<Pos>,
    pub msg: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pos {
            Some(p) => write!(f, "{}:{}:{}: {}", self.file, p.line, p.col, self.msg),
            None => write!(f, "{}: {}", self.file, self.msg),
        }
    }
}

/// Every error found in one file.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// `admin:` — the metrics and health server.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin server (`/metrics`, `/healthz`, `/readyz`). Default 127.0.0.1:7777.
    #[serde(default = "default_admin_listen")]
    pub listen: SocketAddr,
    /// Set false to run without an admin server.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// How long a source or sink may stay stopped (outside shutdown) before `/healthz` answers
    /// 503, so a supervisor (Kubernetes liveness, systemd watchdog scripts) restarts the process.
    /// Default 30s.
    #[serde(default = "default_liveness_grace")]
    pub liveness_grace: HumanDuration,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: default_admin_listen(),
            enabled: true,
            liveness_grace: default_liveness_grace(),
        }
    }
}

fn default_liveness_grace() -> HumanDuration {
    HumanDuration::from_secs(30)
}

fn default_admin_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7777))
}

fn yes() -> bool {
    true
}

/// `pipeline:` — queue bounds, memory budget, dedup.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Events each sink's queue holds before `when_full` applies. Default 10000.
    #[serde(default = "default_queue_events")]
    pub queue_events: usize,
    /// Bytes each sink's queue holds before `when_full` applies. Default 64MiB.
    #[serde(default = "default_queue_bytes")]
    pub queue_bytes: ByteSize,
    /// Bytes all sink queues hold together. Default 256MiB.
    #[serde(default = "default_memory_budget")]
    pub memory_budget: ByteSize,
    /// How long a (source, id) pair is remembered. `0s` turns dedup off. Default 10m.
    #[serde(default = "default_dedup_window")]
    pub dedup_window: HumanDuration,
    /// At most this many remembered pairs (about 100 bytes each); the oldest go first.
    /// Default 100000.
    #[serde(default = "default_dedup_capacity")]
    pub dedup_capacity: usize,
    /// What to do with an event no route takes: `ack` (default) or `reject`.
    #[serde(default)]
    pub unrouted: Unrouted,
    /// `dedup: { scope: source | global }`: one dedup window per ingress source (default), or
    /// one for the whole daemon.
    #[serde(default)]
    pub dedup: DedupSection,
}

/// `pipeline.dedup:` — which events share a dedup window.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupSection {
    #[serde(default)]
    pub scope: DedupScope,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            queue_events: default_queue_events(),
            queue_bytes: default_queue_bytes(),
            memory_budget: default_memory_budget(),
            dedup_window: default_dedup_window(),
            dedup_capacity: default_dedup_capacity(),
            unrouted: Unrouted::default(),
            dedup: DedupSection::default(),
        }
    }
}

fn default_queue_events() -> usize {
    10_000
}
fn default_queue_bytes() -> ByteSize {
    ByteSize::mib(64)
}
fn default_memory_budget() -> ByteSize {
    ByteSize::mib(256)
}
fn default_dedup_window() -> HumanDuration {
    HumanDuration::from_secs(600)
}
fn default_dedup_capacity() -> usize {
    100_000
}

/// Options every sink takes besides its own.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkCommon {
    /// Overrides `pipeline.queue_events` for this sink.
    pub queue_events: Option<usize>,
    /// Overrides `pipeline.queue_bytes` for this sink.
    pub queue_bytes: Option<ByteSize>,
    /// `block` (default: the pressure reaches the sources) or `drop_newest` (counted).
    #[serde(default)]
    pub when_full: WhenFull,
    /// Another sink's name: events this sink gives up on go there, with the reason added as
    /// extensions (`deadlettersink`, `deadletterreason`, `deadletterstatus`), and count as
    /// handled once that sink confirms them.
    pub dead_letter: Option<String>,
}

const SINK_COMMON_KEYS: [&str; 4] = ["queue_events", "queue_bytes", "when_full", "dead_letter"];

/// Options every processor has besides its kind's: the bounds of its input queue.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessorCommon {
    /// This processor's input queue length. Default: `pipeline.queue_events`.
    pub queue_events: Option<usize>,
    /// This processor's input queue bytes. Default: `pipeline.queue_bytes`.
    pub queue_bytes: Option<ByteSize>,
}

const PROCESSOR_COMMON_KEYS: [&str; 2] = ["queue_events", "queue_bytes"];

/// A match on one attribute: a string is an exact match, `{prefix: ...}` a prefix match.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum StrMatch {
    Exact(String),
    Prefix { prefix: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteConfig {
    from: Vec<String>,
    to: Vec<String>,
    #[serde(rename = "type")]
    ty: Option<StrMatch>,
    source: Option<StrMatch>,
    subject: Option<StrMatch>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Top {
    admin: Option<Value>,
    state_dir: Option<Value>,
    pipeline: Option<Value>,
    shutdown_grace: Option<Value>,
    sources: Option<IndexMap<String, Value>>,
    processors: Option<IndexMap<String, Value>>,
    /// Processors of kind `sensor`, by name (the kind is implied).
    sensors: Option<IndexMap<String, Value>>,
    sinks: Option<IndexMap<String, Value>>,
    routes: Option<Vec<Value>>,
}

pub struct ProcessorEntry {
    pub name: String,
    pub kind: &'static str,
    pub common: ProcessorCommon,
    pub config: Box<dyn DynProcessor>,
}

pub struct SourceEntry {
    pub name: String,
    pub kind: &'static str,
    pub config: Box<dyn DynSource>,
}

pub struct SinkEntry {
    pub name: String,
    pub kind: &'static str,
    pub common: SinkCommon,
    /// `common.dead_letter` resolved to an index into `Config::sinks`.
    pub dead_letter: Option<usize>,
    pub config: Box<dyn DynSink>,
}

/// A whole, checked configuration.
pub struct Config {
    pub file: String,
    pub admin: AdminConfig,
    pub state_dir: Option<PathBuf>,
    pub pipeline: PipelineConfig,
    /// How long a stop waits for in-flight events. Default 30s.
    pub shutdown_grace: std::time::Duration,
    pub sources: Vec<SourceEntry>,
    pub sinks: Vec<SinkEntry>,
    pub processors: Vec<ProcessorEntry>,
    /// Processor indices, each after every processor that feeds it (build in reverse, drain
    /// in this order).
    pub processor_order: Vec<usize>,
    /// Routes; `from` indexes sources then processors, `to` sinks then processors (the order
    /// of `pipeline::wiring::PipelineSpec`).
    pub routes: Vec<RouteSpec>,
    /// `(stage, queue)` pairs that processors address by name (a sensor's trigger sinks), in
    /// the index spaces of `routes`.
    pub addressed: Vec<(usize, usize)>,
}

/// Where the config comes from: `-c FILE`, else `./sluice.yaml`, else the embedded default.
pub fn resolve(path: Option<&Path>) -> Result<(String, String), ConfigErrors> {
    let (name, path) = match path {
        Some(p) => (p.display().to_string(), Some(p.to_path_buf())),
        None if Path::new("sluice.yaml").exists() => {
            ("sluice.yaml".to_owned(), Some(PathBuf::from("sluice.yaml")))
        }
        None => {
            return Ok((
                "<embedded config/default.yaml>".into(),
                DEFAULT_CONFIG.into(),
            ))
        }
    };
    let text = std::fs::read_to_string(path.as_deref().unwrap_or(Path::new(""))).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            file: name.clone(),
            pos: None,
            msg: format!("cannot read the config file: {e}"),
        }])
    })?;
    Ok((name, text))
}

fn seg(s: &str) -> String {
    s.to_owned()
}

/// Parses and checks a config. Touches nothing outside the process but `${file:...}` secrets.
pub fn parse(file: &str, text: &str) -> Result<Config, ConfigErrors> {
    parse_with(file, text, Generated::default())
}

/// Entries made from other files (Argo manifests, `sluice run -f`), added to a config's
/// `sources`, `sensors` and `sinks`, each with the file and positions its errors point into.
#[derive(Default)]
pub struct Generated {
    /// `(section, name, value, file, positions)`; the positions are keyed by the entry's
    /// native paths (`sources.<name>.listen`).
    pub entries: Vec<(String, String, Value, String, Positions)>,
    /// Routes, each with its file and the position errors about it point at.
    pub routes: Vec<(Value, String, Option<Pos>)>,
}

/// [`parse`], with `generated` entries added.
pub fn parse_with(file: &str, text: &str, generated: Generated) -> Result<Config, ConfigErrors> {
    let one = |pos: Option<Pos>, msg: String| {
        ConfigErrors(vec![ConfigError {
            file: file.to_owned(),
            pos,
            msg,
        }])
    };
    let (pos, dups) = Positions::index(text);
    if !dups.is_empty() {
        // yaml_serde refuses duplicate keys too, but our index knows where the second one is.
        return Err(ConfigErrors(
            dups.into_iter()
                .map(|(p, msg)| ConfigError {
                    file: file.to_owned(),
                    pos: Some(p),
                    msg,
                })
                .collect(),
        ));
    }
    let mut root: Value = match yaml_serde::from_str(text) {
        Ok(Value::Null) => Value::Mapping(Default::default()),
        Ok(v) => v,
        Err(e) => {
            let pos = e.location().map(|l| Pos {
                line: l.line(),
                col: l.column(),
            });
            return Err(one(
                pos,
                format!("invalid YAML: {}", strip_location(&e.to_string())),
            ));
        }
    };
    let mut cx = Ctx {
        file,
        pos,
        elsewhere: HashMap::new(),
        errors: Vec::new(),
    };
    merge_generated(&mut root, generated, &mut cx);
    let mut sub_errors = Vec::new();
    substitute_all(&mut root, &mut Vec::new(), &mut sub_errors);
    for (path, msg) in sub_errors {
        let shown = format!("{}: {msg}", path.join("."));
        cx.err(&path, false, shown);
    }
    let Some(top) = cx.de::<Top>(root, &[]) else {
        return Err(ConfigErrors(cx.errors));
    };

    let admin = match top.admin {
        Some(v) => cx.de(v, &[seg("admin")]).unwrap_or_default(),
        None => AdminConfig::default(),
    };
    let pipeline = match top.pipeline {
        Some(v) => cx.de(v, &[seg("pipeline")]).unwrap_or_default(),
        None => PipelineConfig::default(),
    };
    let state_dir = top
        .state_dir
        .and_then(|v| cx.de::<PathBuf>(v, &[seg("state_dir")]));
    let shutdown_grace = top
        .shutdown_grace
        .and_then(|v| cx.de::<HumanDuration>(v, &[seg("shutdown_grace")]))
        .map_or(std::time::Duration::from_secs(30), HumanDuration::get);

    let mut parsed = components(
        &mut cx,
        [
            (Role::Source, "sources", top.sources.unwrap_or_default()),
            (
                Role::Processor,
                "processors",
                top.processors.unwrap_or_default(),
            ),
            (Role::Processor, "sensors", top.sensors.unwrap_or_default()),
            (Role::Sink, "sinks", top.sinks.unwrap_or_default()),
        ],
    );
    let mut routes = user_routes(&mut cx, &parsed, top.routes.unwrap_or_default());
    let (addressed, processor_order) = wiring(&mut cx, &parsed, &mut routes);
    dead_letters(&mut cx, &mut parsed);
    let Parsed {
        sources,
        sinks,
        processors,
        ..
    } = parsed;
    if pipeline.queue_events == 0 {
        cx.err(
            &[seg("pipeline"), seg("queue_events")],
            false,
            "pipeline.queue_events: must be at least 1",
        );
    }
    if pipeline.queue_bytes.bytes() == 0 || pipeline.memory_budget.bytes() == 0 {
        cx.err(
            &[seg("pipeline")],
            false,
            "pipeline: queue_bytes and memory_budget must be above 0",
        );
    }

    if !cx.errors.is_empty() {
        let mut errs = cx.errors;
        errs.sort_by_key(|e| e.pos.map(|p| (p.line, p.col)));
        let mut seen = HashSet::new();
        errs.retain(|e| seen.insert(e.to_string()));
        return Err(ConfigErrors(errs));
    }
    Ok(Config {
        file: file.to_owned(),
        admin,
        state_dir,
        pipeline,
        shutdown_grace,
        sources,
        sinks,
        processors,
        processor_order,
        routes,
        addressed,
    })
}

/// What the component sections became, with what routes and errors need to know.
struct Parsed {
    sources: Vec<SourceEntry>,
    sinks: Vec<SinkEntry>,
    processors: Vec<ProcessorEntry>,
    /// Per processor: the config path it was declared at (`processors.x`, `sensors.y`).
    processor_paths: Vec<Vec<String>>,
    /// Declared names per section, parsed or not: a route to a sink whose own config is wrong
    /// is not a second error.
    declared: HashMap<&'static str, Vec<String>>,
}

/// Adds the entries and routes made from other files (Argo manifests) to the root mapping.
fn merge_generated(root: &mut Value, generated: Generated, cx: &mut Ctx<'_>) {
    for (section, name, value, from, positions) in generated.entries {
        let key = format!("{section}.{name}");
        let Value::Mapping(root_map) = root else {
            break;
        };
        let sec = root_map
            .entry(Value::String(section.clone()))
            .or_insert_with(|| Value::Mapping(Default::default()));
        if sec.is_null() {
            *sec = Value::Mapping(Default::default());
        }
        let Value::Mapping(sec) = sec else { continue };
        if sec.contains_key(name.as_str()) {
            cx.err(
                &[section.clone(), name.clone()],
                true,
                format!(
                    "{key}: `{name}` is declared both here and by {from}; names must be unique"
                ),
            );
            continue;
        }
        sec.insert(Value::String(name.clone()), value);
        cx.elsewhere.insert(key, (from, positions));
    }
    if let Value::Mapping(root_map) = root {
        let routes = root_map
            .entry(Value::String("routes".into()))
            .or_insert_with(|| Value::Sequence(Vec::new()));
        if routes.is_null() {
            *routes = Value::Sequence(Vec::new());
        }
        if let Value::Sequence(list) = routes {
            for (route, from, at) in generated.routes {
                let mut positions = Positions::default();
                let key = format!("routes.{}", list.len());
                if let Some(p) = at {
                    positions.set(&key, p);
                }
                cx.elsewhere.insert(key, (from, positions));
                list.push(route);
            }
        }
    }
}

/// Parses `sources`, `processors`, `sensors` and `sinks`: each entry's kind, common options and
/// its connector's own, validated.
fn components(
    cx: &mut Ctx<'_>,
    sections: [(Role, &'static str, IndexMap<String, Value>); 4],
) -> Parsed {
    let kinds = registry::kinds();
    let mut sources = Vec::new();
    let mut sinks = Vec::new();
    let mut processors: Vec<ProcessorEntry> = Vec::new();
    // Per processor: the config path it was declared at (`processors.x`, `sensors.y`).
    let mut processor_paths: Vec<Vec<String>> = Vec::new();
    let mut names: HashMap<String, &'static str> = HashMap::new();
    // Declared names, parsed or not: a route to a sink whose own config is wrong is not a
    // second error.
    let mut declared: HashMap<&'static str, Vec<String>> = HashMap::new();
    for (role, section, map) in sections {
        for (name, value) in map {
            let base = vec![seg(section), name.clone()];
            // Sensors are processors: routes and errors treat them as such.
            let decl = if section == "sensors" {
                "processors"
            } else {
                section
            };
            declared.entry(decl).or_default().push(name.clone());
            if let Some(other) = names.insert(name.clone(), section) {
                cx.err(
                    &base,
                    true,
                    format!("{section}.{name}: the name `{name}` is already used in {other}; names must be unique"),
                );
            }
            if let Err(msg) = check_name(&name) {
                cx.err(&base, true, format!("{section}.{name}: {msg}"));
            }
            let Value::Mapping(mut map) = value else {
                cx.err(
                    &base,
                    false,
                    format!("{section}.{name}: expected a mapping with a `kind`"),
                );
                continue;
            };
            let kind = match map.remove("kind") {
                None if section == "sensors" => "sensor".to_owned(),
                Some(Value::String(k)) if section == "sensors" && k != "sensor" => {
                    cx.err(
                        &[base.clone(), vec![seg("kind")]].concat(),
                        false,
                        format!("{section}.{name}.kind: a sensor's kind is `sensor` (leave it out); `{k}` belongs under `processors:`"),
                    );
                    continue;
                }
                Some(Value::String(k)) => k,
                // `kind: null` is YAML's null value; it can only mean the `null` sink.
                Some(Value::Null) => "null".to_owned(),
                Some(_) => {
                    cx.err(
                        &[base.clone(), vec![seg("kind")]].concat(),
                        false,
                        format!("{section}.{name}.kind: must be a string"),
                    );
                    continue;
                }
                None => {
                    let known: Vec<&str> = kinds
                        .iter()
                        .filter(|k| k.role == role)
                        .map(|k| k.name)
                        .collect();
                    cx.err(
                        &base,
                        true,
                        format!(
                            "{section}.{name}: missing `kind` (one of: {})",
                            known.join(", ")
                        ),
                    );
                    continue;
                }
            };
            if section == "sensors" && !kinds.iter().any(|k| k.name == "sensor") {
                cx.err(
                    &base,
                    true,
                    format!("{section}.{name}: this binary was built without the `sensor` feature; rebuild with `--features sensor`"),
                );
                continue;
            }
            let Some(entry) = kinds.iter().find(|k| k.role == role && k.name == kind) else {
                let known: Vec<&str> = kinds
                    .iter()
                    .filter(|k| k.role == role)
                    .map(|k| k.name)
                    .collect();
                let hint = suggest(&kind, known.iter().copied())
                    .map(|s| format!(" (did you mean `{s}`?)"))
                    .unwrap_or_default();
                let extra = match kinds.iter().find(|k| k.role != role && k.name == kind) {
                    Some(k) => format!("; `{kind}` is a {} kind, not a {}", k.role, role),
                    None => String::new(),
                };
                cx.err(
                    &[base.clone(), vec![seg("kind")]].concat(),
                    false,
                    format!("{section}.{name}.kind: unknown {role} kind `{kind}`{hint}{extra}; compiled kinds: {}", known.join(", ")),
                );
                continue;
            };
            match role {
                Role::Source => {
                    let Some(cfg) = (entry.parse_source)(Value::Mapping(map), &base, cx) else {
                        continue;
                    };
                    if let Err(msg) = cfg.validate(&name) {
                        cx.connector_err(&base, format!("{section}.{name}: {msg}"), &msg);
                    }
                    sources.push(SourceEntry {
                        name,
                        kind: entry.name,
                        config: cfg,
                    });
                }
                Role::Processor => {
                    let common = take_keys(&mut map, &PROCESSOR_COMMON_KEYS);
                    let common: ProcessorCommon = cx.de(common, &base).unwrap_or_default();
                    let Some(cfg) = (entry.parse_processor)(Value::Mapping(map), &base, cx) else {
                        continue;
                    };
                    if let Err(msg) = cfg.validate(&name) {
                        cx.connector_err(&base, format!("{section}.{name}: {msg}"), &msg);
                    }
                    processors.push(ProcessorEntry {
                        name,
                        kind: entry.name,
                        common,
                        config: cfg,
                    });
                    processor_paths.push(base);
                }
                Role::Sink => {
                    let common = take_keys(&mut map, &SINK_COMMON_KEYS);
                    let common: SinkCommon = cx.de(common, &base).unwrap_or_default();
                    let Some(cfg) = (entry.parse_sink)(Value::Mapping(map), &base, cx) else {
                        continue;
                    };
                    if let Err(msg) = cfg.validate(&name) {
                        cx.connector_err(&base, format!("{section}.{name}: {msg}"), &msg);
                    }
                    sinks.push(SinkEntry {
                        name,
                        kind: entry.name,
                        common,
                        dead_letter: None,
                        config: cfg,
                    });
                }
            }
        }
    }

    Parsed {
        sources,
        sinks,
        processors,
        processor_paths,
        declared,
    }
}

/// The `routes` section, resolved against the declared names.
fn user_routes(cx: &mut Ctx<'_>, p: &Parsed, list: Vec<Value>) -> Vec<RouteSpec> {
    let (sources, sinks, processors, declared) = (&p.sources, &p.sinks, &p.processors, &p.declared);
    let any_processor = declared.contains_key("processors");
    let mut routes = Vec::new();
    for (i, value) in list.into_iter().enumerate() {
        let base = vec![seg("routes"), i.to_string()];
        let Some(r) = cx.de::<RouteConfig>(value, &base) else {
            continue;
        };
        let mut resolve =
            |list: &[String], field: &str, names: Vec<&str>, all: &[String]| -> Vec<usize> {
                let mut out = Vec::new();
                if list.is_empty() {
                    cx.err(
                        &[base.clone(), vec![seg(field)]].concat(),
                        false,
                        format!("routes.{i}.{field}: must name at least one"),
                    );
                }
                for (j, n) in list.iter().enumerate() {
                    match names.iter().position(|x| x == n) {
                        Some(idx) => out.push(idx),
                        None if all.contains(n) => {}
                        None => {
                            let what = match (field == "from", any_processor) {
                                (true, false) => "source",
                                (true, true) => "source or processor",
                                (false, false) => "sink",
                                (false, true) => "sink or processor",
                            };
                            let hint = suggest(n, all.iter().map(String::as_str))
                                .map(|s| format!(" (did you mean `{s}`?)"))
                                .unwrap_or_default();
                            cx.err(
                                &[base.clone(), vec![seg(field), j.to_string()]].concat(),
                                false,
                                format!("routes.{i}.{field}: no {what} named `{n}`{hint}"),
                            );
                        }
                    }
                }
                out
            };
        let no_names = Vec::new();
        let declared_with = |section: &str| -> Vec<String> {
            let mut all = declared.get(section).unwrap_or(&no_names).clone();
            all.extend(
                declared
                    .get("processors")
                    .unwrap_or(&no_names)
                    .iter()
                    .cloned(),
            );
            all
        };
        let processor_names = processors.iter().map(|p| p.name.as_str());
        let from = resolve(
            &r.from,
            "from",
            sources
                .iter()
                .map(|s| s.name.as_str())
                .chain(processor_names.clone())
                .collect(),
            &declared_with("sources"),
        );
        let to = resolve(
            &r.to,
            "to",
            sinks
                .iter()
                .map(|s| s.name.as_str())
                .chain(processor_names)
                .collect(),
            &declared_with("sinks"),
        );
        let mut matches = Vec::new();
        for (attr, m) in [
            (Attr::Type, r.ty),
            (Attr::Source, r.source),
            (Attr::Subject, r.subject),
        ] {
            match m {
                Some(StrMatch::Exact(v)) => matches.push(Match::Exact(attr, v)),
                Some(StrMatch::Prefix { prefix }) => matches.push(Match::Prefix(attr, prefix)),
                None => {}
            }
        }
        routes.push(RouteSpec { from, to, matches });
    }

    routes
}

/// The routes and addressed pairs processors imply (a sensor's inputs and trigger sinks), the
/// check that every processor is fed, and the processors' topological order.
fn wiring(
    cx: &mut Ctx<'_>,
    p: &Parsed,
    routes: &mut Vec<RouteSpec>,
) -> (Vec<(usize, usize)>, Vec<usize>) {
    let (sources, sinks, processors, declared, processor_paths) = (
        &p.sources,
        &p.sinks,
        &p.processors,
        &p.declared,
        &p.processor_paths,
    );
    // The routes processors imply: a route from each stage a processor reads (a sensor's
    // dependency sources) and an addressed pair to each sink it names (its trigger targets).
    let mut addressed = Vec::new();
    let user_routes = routes.len();
    // For each implied route and addressed pair, the processor that implies it.
    let mut implied_by = Vec::new();
    // Processors that name their inputs: a bad name there is already an error.
    let mut names_inputs = vec![false; processors.len()];
    for (p, proc_) in processors.iter().enumerate() {
        let wiring = proc_.config.wiring();
        names_inputs[p] = !wiring.inputs.is_empty();
        let base = &processor_paths[p];
        let shown = base.join(".");
        let stage_names: Vec<&str> = sources
            .iter()
            .map(|s| s.name.as_str())
            .chain(processors.iter().map(|p| p.name.as_str()))
            .collect();
        let queue_names: Vec<&str> = sinks
            .iter()
            .map(|s| s.name.as_str())
            .chain(processors.iter().map(|p| p.name.as_str()))
            .collect();
        let mut find =
            |named: &sluice_core::NamedStage, names: &[&str], section: &str, what: &str| {
                let found = names.iter().position(|n| *n == named.name);
                let declared_elsewhere = declared
                    .get(section)
                    .is_some_and(|d| d.contains(&named.name))
                    || declared
                        .get("processors")
                        .is_some_and(|d| d.contains(&named.name));
                if found.is_none() && !declared_elsewhere {
                    let hint = suggest(&named.name, names.iter().copied())
                        .map(|s| format!(" (did you mean `{s}`?)"))
                        .unwrap_or_default();
                    let path = [base.clone(), named.path.clone()].concat();
                    cx.err(
                        &path,
                        false,
                        format!(
                            "{shown}.{}: no {what} named `{}`{hint}",
                            named.path.join("."),
                            named.name
                        ),
                    );
                }
                found
            };
        for input in &wiring.inputs {
            if let Some(from) = find(input, &stage_names, "sources", "source or processor") {
                routes.push(RouteSpec {
                    from: vec![from],
                    to: vec![sinks.len() + p],
                    matches: Vec::new(),
                });
                implied_by.push(p);
            }
        }
        for target in &wiring.targets {
            if let Some(to) = find(target, &queue_names, "sinks", "sink or processor") {
                addressed.push((sources.len() + p, to));
            }
        }
    }
    implied_by.extend(addressed.iter().map(|&(from, _)| from - sources.len()));

    // A processor nothing routes to would never see its input end (it holds a sender into the
    // pipeline itself), so every stop would wait out the whole grace: refuse it.
    for (p, proc_) in processors.iter().enumerate() {
        let fed = names_inputs[p]
            || routes
                .iter()
                .any(|r| r.to.iter().any(|&t| t == sinks.len() + p));
        if !fed {
            cx.err(
                &processor_paths[p],
                true,
                format!(
                    "{}: no route sends events to it; add a route with `to: [{}]` or remove it",
                    processor_paths[p].join("."),
                    proc_.name
                ),
            );
        }
    }
    // Addressed pairs are edges of the graph too (a sensor whose trigger is a processor).
    let mut graph = routes.clone();
    graph.extend(addressed.iter().map(|&(from, to)| RouteSpec {
        from: vec![from],
        to: vec![to],
        matches: Vec::new(),
    }));
    let processor_order =
        match processor_graph(&graph, sources.len(), sinks.len(), processors.len()) {
            Ok(order) => order,
            Err((route, cycle)) if route >= user_routes => {
                let names: Vec<&str> = cycle.iter().map(|&p| processors[p].name.as_str()).collect();
                let by = &processor_paths[implied_by[route - user_routes]];
                cx.err(
                    by,
                    true,
                    format!(
                        "{}: its inputs or targets close a cycle of processors ({}); events would \
                     go round for ever: remove one of these links",
                        by.join("."),
                        names.join(" → ")
                    ),
                );
                Vec::new()
            }
            Err((route, cycle)) => {
                let names: Vec<&str> = cycle.iter().map(|&p| processors[p].name.as_str()).collect();
                cx.err(
                    &[seg("routes"), route.to_string()],
                    false,
                    format!(
                        "routes.{route}: closes a cycle of processors ({}); events would go round \
                     for ever: remove one of these routes",
                        names.join(" → ")
                    ),
                );
                Vec::new()
            }
        };

    (addressed, processor_order)
}

/// Resolves each sink's `dead_letter` to an index, refusing chains and self-references.
fn dead_letters(cx: &mut Ctx<'_>, p: &mut Parsed) {
    let (sinks, declared) = (&mut p.sinks, &p.declared);
    let no_names = Vec::new();
    let declared_sinks = declared.get("sinks").unwrap_or(&no_names);
    let sink_names: Vec<String> = sinks.iter().map(|s| s.name.clone()).collect();
    let targets: Vec<Option<String>> = sinks.iter().map(|s| s.common.dead_letter.clone()).collect();
    for (i, sink) in sinks.iter_mut().enumerate() {
        let Some(target) = &targets[i] else { continue };
        let path = [seg("sinks"), sink.name.clone(), seg("dead_letter")];
        let name = &sink.name;
        match sink_names.iter().position(|n| n == target) {
            Some(j) if j == i => cx.err(
                &path,
                false,
                format!("sinks.{name}.dead_letter: a sink cannot be its own dead-letter sink"),
            ),
            Some(j) if targets[j].is_some() => cx.err(
                &path,
                false,
                format!(
                    "sinks.{name}.dead_letter: `{target}` has a dead_letter of its own; \
                     dead-letter chains are not supported: point both at a sink without one"
                ),
            ),
            Some(j) => sink.dead_letter = Some(j),
            None if declared_sinks.contains(target) => {}
            None => {
                let hint = suggest(target, sink_names.iter().map(String::as_str))
                    .map(|s| format!(" (did you mean `{s}`?)"))
                    .unwrap_or_default();
                cx.err(
                    &path,
                    false,
                    format!("sinks.{name}.dead_letter: no sink named `{target}`{hint}"),
                );
            }
        }
    }
}

/// Moves `keys` out of a connector's mapping into a mapping of their own (the options every
/// connector of a role has, deserialized apart from the kind's own).
fn take_keys(map: &mut yaml_serde::Mapping, keys: &[&str]) -> Value {
    let mut common = yaml_serde::Mapping::new();
    for key in keys {
        if let Some(v) = map.remove(*key) {
            common.insert(Value::String((*key).into()), v);
        }
    }
    Value::Mapping(common)
}

/// Names become metric labels and log fields: keep them simple.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "the name `{name}` may only use letters, digits, `-`, `_` and `.`"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::substitute::substitute;
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        match parse("t.yaml", text) {
            Ok(_) => vec![],
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn sensors_imply_their_routes_and_targets() {
        let text = "\
sources:
  gh: { kind: webhook, listen: 127.0.0.1:0 }
  cron: { kind: webhook, listen: 127.0.0.1:0, path: /cron }
sensors:
  release:
    dependencies:
      - { name: push, source: gh }
      - { name: nightly, source: cron }
    triggers:
      - { name: submit, sink: api, dlqTrigger: parked }
sinks:
  api: { kind: log }
  parked: { kind: log }
";
        let c = parse("t.yaml", text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.processors.len(), 1);
        assert_eq!(c.processors[0].kind, "sensor");
        // Routes: gh → release, cron → release (queue index = sinks, then processors).
        let routes: Vec<(Vec<usize>, Vec<usize>)> = c
            .routes
            .iter()
            .map(|r| (r.from.clone(), r.to.clone()))
            .collect();
        assert_eq!(routes, vec![(vec![0], vec![2]), (vec![1], vec![2])]);
        // Addressed: the sensor (stage 2) → api (0) and parked (1).
        assert_eq!(c.addressed, vec![(2, 0), (2, 1)]);
    }

    #[test]
    fn sensor_errors_have_the_position_of_the_name() {
        let e = errors(
            "\
sources:
  gh: { kind: webhook, listen: 127.0.0.1:0 }
sensors:
  release:
    dependencies:
      - { name: push, source: ghh }
    triggers:
      - { name: submit, sink: apii, conditions: \"push && x\" }
sinks:
  api: { kind: log }
",
        )
        .join("\n");
        assert!(e.contains("t.yaml:6:31: sensors.release.dependencies.0.source: no source or processor named `ghh` (did you mean `gh`?)"), "{e}");
        assert!(e.contains("t.yaml:8:31: sensors.release.triggers.0.sink: no sink or processor named `apii` (did you mean `api`?)"), "{e}");
        assert!(
            e.contains(
                "t.yaml:8:49: sensors.release: triggers.0.conditions: `x` is not a dependency"
            ),
            "{e}"
        );
        assert!(!e.contains("no route sends events"), "{e}");
        let e = errors("sensors:\n  s: { kind: set, dependencies: [], triggers: [] }\n").join("\n");
        assert!(
            e.contains("sensors.s.kind: a sensor's kind is `sensor`"),
            "{e}"
        );
    }

    #[test]
    fn default_config_is_valid() {
        let c = parse("default", DEFAULT_CONFIG).unwrap();
        assert_eq!(c.sources.len(), 1);
        assert_eq!(c.sinks.len(), 1);
        assert_eq!(c.admin.listen.port(), 7777);
    }

    #[test]
    fn processors_sit_between_routes_and_drain_in_topological_order() {
        let text = "\
sources:
  hooks: { kind: webhook, listen: 127.0.0.1:1, path: / }
processors:
  late: { kind: set, extensions: { stage: late } }
  early: { kind: set, subject: x, queue_events: 5 }
sinks:
  out: { kind: null }
routes:
  - { from: [early], to: [late] }
  - { from: [hooks], to: [early] }
  - { from: [late], to: [out] }
";
        let c = parse("t.yaml", text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.processors.len(), 2);
        assert_eq!(c.processors[1].common.queue_events, Some(5));
        // Senders: hooks = 0, late = 1, early = 2; queues: out = 0, late = 1, early = 2.
        assert_eq!(
            (c.routes[0].from.clone(), c.routes[0].to.clone()),
            (vec![2], vec![1])
        );
        assert_eq!(
            (c.routes[1].from.clone(), c.routes[1].to.clone()),
            (vec![0], vec![2])
        );
        assert_eq!(
            (c.routes[2].from.clone(), c.routes[2].to.clone()),
            (vec![1], vec![0])
        );
        assert_eq!(c.processor_order, [1, 0], "early drains before late");
    }

    #[test]
    fn a_cycle_of_processors_is_refused_at_the_route_that_closes_it() {
        let text = "\
sources:
  hooks: { kind: webhook, listen: 127.0.0.1:1, path: / }
processors:
  a: { kind: set, subject: a }
  b: { kind: set, subject: b }
sinks:
  out: { kind: null }
routes:
  - { from: [hooks], to: [a] }
  - { from: [a], to: [b, out] }
  - { from: [b], to: [a] }
";
        let e = errors(text);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("t.yaml:11:5: routes.2: closes a cycle of processors (a → b → a)"),
            "{}",
            e[0]
        );
        let self_loop = errors(&text.replace("{ from: [b], to: [a] }", "{ from: [b], to: [b] }"));
        assert!(self_loop[0].contains("(b → b)"), "{self_loop:?}");
    }

    #[test]
    fn processor_errors_name_the_processor() {
        let text = "\
processors:
  p: { kind: sett }
  q: { kind: log }
  r: { kind: set }
routes:
  - { from: [nowhere], to: [p] }
";
        let e = errors(text).join("\n");
        assert!(
            e.contains("processors.p.kind: unknown processor kind `sett` (did you mean `set`?)"),
            "{e}"
        );
        assert!(e.contains("`log` is a sink kind, not a processor"), "{e}");
        assert!(e.contains("processors.r: nothing to set"), "{e}");
        assert!(
            e.contains("routes.0.from: no source or processor named `nowhere`"),
            "{e}"
        );
        let unfed = errors("processors:\n  lone: { kind: set, subject: x }\n").join("\n");
        assert!(
            unfed.contains("processors.lone: no route sends events to it"),
            "{unfed}"
        );
    }

    #[test]
    fn unknown_top_level_key_with_hint() {
        let e = errors("piepline: {}\n");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("t.yaml:1:1: "), "{}", e[0]);
        assert!(e[0].contains("did you mean `pipeline`?"), "{}", e[0]);
    }

    #[test]
    fn dead_letter_targets_are_checked() {
        let text = "\
sinks:
  a: { kind: log, dead_letter: parkd }
  b: { kind: log, dead_letter: b }
  c: { kind: log, dead_letter: d }
  d: { kind: log, dead_letter: parked }
  parked: { kind: null }
";
        let e = errors(text);
        assert!(
            e.iter().any(|m| m.starts_with("t.yaml:2:32: ")
                && m.contains("no sink named `parkd` (did you mean `parked`?)")),
            "{e:#?}"
        );
        assert!(
            e.iter()
                .any(|m| m.starts_with("t.yaml:3:32: ") && m.contains("its own dead-letter")),
            "{e:#?}"
        );
        assert!(
            e.iter()
                .any(|m| m.starts_with("t.yaml:4:32: ") && m.contains("chains are not supported")),
            "{e:#?}"
        );
        assert_eq!(e.len(), 3, "{e:#?}");
        let ok = "sinks:\n  a: { kind: log, dead_letter: parked }\n  parked: { kind: null }\n";
        let cfg = parse("t.yaml", ok).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(cfg.sinks[0].dead_letter, Some(1));
        assert_eq!(cfg.sinks[1].dead_letter, None);
    }

    #[test]
    fn every_error_is_reported_with_its_position() {
        let text = "\
pipeline:
  queue_events: many
sinks:
  console: { kind: lgo }
  other: { kind: log, when_full: wait }
routes:
  - { from: [nope], to: [consle] }
";
        let e = errors(text);
        assert!(
            e.iter()
                .any(|m| m.starts_with("t.yaml:2:17: pipeline.queue_events: invalid type")),
            "{e:#?}"
        );
        assert!(
            e.iter().any(|m| m.starts_with("t.yaml:4:20:")
                && m.contains("unknown sink kind `lgo` (did you mean `log`?)")),
            "{e:#?}"
        );
        assert!(
            e.iter()
                .any(|m| m.starts_with("t.yaml:5:34:") && m.contains("unknown variant `wait`")),
            "{e:#?}"
        );
        assert!(
            e.iter()
                .any(|m| m.starts_with("t.yaml:7:14:") && m.contains("no source named `nope`")),
            "{e:#?}"
        );
        assert!(
            e.iter().any(|m| m.starts_with("t.yaml:7:26:")
                && m.contains("no sink named `consle` (did you mean `console`?)")),
            "{e:#?}"
        );
    }

    #[test]
    fn duplicate_keys_and_names() {
        let text = "sinks:\n  a: { kind: log }\n  a: { kind: null }\n";
        let e = errors(text);
        assert!(
            e.iter()
                .any(|m| m.starts_with("t.yaml:3:3: duplicate key `a` (first at line 2)")),
            "{e:#?}"
        );
        let text = "sources:\n  x: { kind: webhook }\nsinks:\n  x: { kind: log }\n";
        let e = errors(text);
        assert!(
            e.iter().any(|m| m.contains("already used in sources")),
            "{e:#?}"
        );
    }

    #[test]
    fn syntax_errors_have_positions() {
        let e = errors("sinks:\n  a: [unclosed\n");
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("t.yaml:"), "{}", e[0]);
        assert!(e[0].contains("invalid YAML"), "{}", e[0]);
    }

    #[test]
    fn env_and_file_substitution() {
        std::env::set_var("SLUICE_TEST_QB", "32MiB");
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("s");
        std::fs::write(&secret, "hunter2\n").unwrap();
        assert_eq!(substitute("a${SLUICE_TEST_QB}b").unwrap(), "a32MiBb");
        assert_eq!(substitute("${SLUICE_TEST_NOPE:-dflt}").unwrap(), "dflt");
        assert_eq!(substitute("$${NOT}").unwrap(), "${NOT}");
        assert_eq!(
            substitute(&format!("${{file:{}}}", secret.display())).unwrap(),
            "hunter2"
        );
        let c = parse("t", "pipeline: { queue_bytes: \"${SLUICE_TEST_QB}\" }\n").unwrap();
        assert_eq!(c.pipeline.queue_bytes.bytes(), 32 << 20);
        let e = errors("state_dir: ${SLUICE_TEST_UNSET_VAR}\n");
        assert!(
            e[0].starts_with(
                "t.yaml:1:12: state_dir: environment variable SLUICE_TEST_UNSET_VAR is not set"
            ),
            "{e:?}"
        );
    }

    #[test]
    fn routes_with_matchers() {
        let text = "\
sources: { a: { kind: webhook, listen: 127.0.0.1:0 } }
sinks: { b: { kind: log } }
routes:
  - { from: [a], to: [b], type: { prefix: com.example. }, subject: orders }
";
        let c = parse("t", text).unwrap();
        assert_eq!(c.routes[0].matches.len(), 2);
    }
}
