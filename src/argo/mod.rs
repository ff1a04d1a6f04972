//! Argo Events manifests (`sluice run -f`, `validate -f`, `convert -f`): reads the documents,
//! resolves names, wires each Sensor dependency to the source its EventSource event became,
//! and hands each EventSource type or trigger to the connector kind that runs it (the
//! registry's `argo` mappings). The result is native config entries, each with the positions
//! of the document it came from, so every error reads `file:line:col: …` in the manifest.

mod secrets;
mod sensor;

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use sluice_core::argo::map::{EventCtx, Fields, NoteKind, Notes};

use crate::config::{ConfigError, ConfigErrors, Generated, Pos, Positions};
use crate::registry::{self, ArgoMap, Role};

pub use secrets::{secret, secret_basic, secret_file, secret_url, DEFAULT_SECRETS_DIR};

/// One input file (or stdin), read whole.
pub struct Input {
    pub name: String,
    pub text: String,
}

/// Reads `-f` arguments: files, directories (their `.yaml`, `.yml` and `.json` files, sorted,
/// recursively) and `-` (stdin).
pub fn read(paths: &[PathBuf]) -> Result<Vec<Input>, ConfigErrors> {
    let mut out = Vec::new();
    let fail = |name: &str, msg: String| {
        ConfigErrors(vec![ConfigError {
            file: name.to_owned(),
            pos: None,
            msg,
        }])
    };
    for p in paths {
        if p.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| fail("<stdin>", format!("cannot read stdin: {e}")))?;
            out.push(Input {
                name: "<stdin>".into(),
                text,
            });
        } else if p.is_dir() {
            let mut files = Vec::new();
            walk(p, &mut files).map_err(|e| fail(&p.display().to_string(), e))?;
            files.sort();
            for f in files {
                out.push(read_file(&f).map_err(|e| fail(&f.display().to_string(), e))?);
            }
        } else {
            out.push(read_file(p).map_err(|e| fail(&p.display().to_string(), e))?);
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read the directory: {e}"))?;
    for e in entries {
        let path = e.map_err(|e| e.to_string())?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path
            .extension()
            .is_some_and(|x| x == "yaml" || x == "yml" || x == "json")
        {
            out.push(path);
        }
    }
    Ok(())
}

fn read_file(p: &Path) -> Result<Input, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("cannot read the file: {e}"))?;
    Ok(Input {
        name: p.display().to_string(),
        text,
    })
}

/// One Argo document.
pub(crate) struct Doc {
    pub file: String,
    pub kind: String,
    pub name: String,
    pub namespace: Option<String>,
    pub value: Value,
    pub pos: Positions,
}

impl Doc {
    /// The position of `path` (a path inside the document) in its file: its key's.
    pub fn at(&self, path: &[String]) -> Option<Pos> {
        self.pos.find(path, true)
    }
}

/// A note for the person running Sluice: `file:line:col: field: message`.
#[derive(Debug, Clone)]
pub struct Shown {
    pub file: String,
    pub pos: Option<Pos>,
    pub msg: String,
}

impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pos {
            Some(p) => write!(f, "{}:{}:{}: {}", self.file, p.line, p.col, self.msg),
            None => write!(f, "{}: {}", self.file, self.msg),
        }
    }
}

/// What the manifests became.
#[derive(Default)]
pub struct Translation {
    /// Native entries: `(section, name, value, file, positions by native path)`.
    pub generated: Generated,
    /// The same entries as one native config, for `sluice convert`.
    pub native: BTreeMap<&'static str, Map<String, Value>>,
    /// The routes, for `sluice convert`.
    pub native_routes: Vec<Value>,
    /// Fields accepted with a difference, and documents passed over.
    pub notes: Vec<Shown>,
    /// Fields refused: the manifests cannot run.
    pub refused: Vec<ConfigError>,
    /// One row per Argo document: `(file, kind/name, refused fields)`.
    pub rows: Vec<(String, String, Vec<String>)>,
}

impl Translation {
    fn note(&mut self, doc: &Doc, path: &[String], kind: NoteKind, msg: String) {
        let shown = if path.is_empty() {
            msg
        } else {
            format!("{}: {msg}", path.join("."))
        };
        match kind {
            NoteKind::Refused => self.refused.push(ConfigError {
                file: doc.file.clone(),
                pos: doc.at(path),
                msg: shown,
            }),
            NoteKind::Noted => self.notes.push(Shown {
                file: doc.file.clone(),
                pos: doc.at(path),
                msg: shown,
            }),
        }
    }

    fn take_notes(&mut self, doc: &Doc, notes: &Notes) {
        for n in notes.take() {
            self.note(doc, &n.path, n.kind, n.msg);
        }
    }

    /// Adds a native entry whose paths map onto document paths (`origins`: native path below
    /// the entry → document path).
    fn add(
        &mut self,
        doc: &Doc,
        section: &'static str,
        name: &str,
        value: Value,
        origins: &[(Vec<String>, Vec<String>)],
    ) {
        let mut pos = Positions::default();
        for (native, argo) in origins {
            let mut full = vec![section.to_owned(), name.to_owned()];
            full.extend(native.iter().cloned());
            if let Some(p) = doc.at(argo) {
                pos.set(&full.join("."), p);
            }
        }
        let yaml: yaml_serde::Value = match yaml_serde::to_value(&value) {
            Ok(v) => v,
            Err(e) => {
                self.note(doc, &[], NoteKind::Refused, format!("cannot convert: {e}"));
                return;
            }
        };
        self.native
            .entry(section)
            .or_default()
            .insert(name.to_owned(), value);
        self.generated.entries.push((
            section.to_owned(),
            name.to_owned(),
            yaml,
            doc.file.clone(),
            pos,
        ));
    }

    /// Adds a native route, its errors placed at `path` of `doc`.
    fn add_route(&mut self, doc: &Doc, route: Value, path: &[String]) {
        let yaml: yaml_serde::Value = match yaml_serde::to_value(&route) {
            Ok(v) => v,
            Err(_) => return,
        };
        self.native_routes.push(route);
        self.generated
            .routes
            .push((yaml, doc.file.clone(), doc.at(path)));
    }

    /// `sluice convert`: the native config, with the notes as comments.
    pub fn to_native_yaml(&self) -> String {
        let mut out = String::from(
            "# Converted from Argo Events manifests by `sluice convert`.\n# Differences from Argo, \
             field by field:\n",
        );
        for n in &self.notes {
            out.push_str(&format!("#   {n}\n"));
        }
        let mut root = Map::new();
        for section in ["sources", "sensors", "sinks"] {
            if let Some(m) = self.native.get(section) {
                root.insert(section.into(), Value::Object(m.clone()));
            }
        }
        if !self.native_routes.is_empty() {
            root.insert("routes".into(), Value::Array(self.native_routes.clone()));
        }
        out.push_str(&yaml_serde::to_string(&Value::Object(root)).unwrap_or_default());
        out
    }
}

fn s(x: &str) -> String {
    x.to_owned()
}

/// Splits the inputs into documents; other kinds are passed over with a note.
fn documents(inputs: &[Input], t: &mut Translation) -> Vec<Doc> {
    let mut docs = Vec::new();
    for input in inputs {
        let positions = Positions::index_all(&input.text);
        let mut positions = positions.into_iter();
        for de in yaml_serde::Deserializer::from_str(&input.text) {
            let (pos, _) = positions.next().unwrap_or_default();
            let value = match serde::Deserialize::deserialize(de) {
                Ok(v) => v,
                Err(e) => {
                    let msg = e.to_string();
                    let p = e.location().map(|l| Pos {
                        line: l.line(),
                        col: l.column(),
                    });
                    t.refused.push(ConfigError {
                        file: input.name.clone(),
                        pos: p,
                        msg: format!(
                            "invalid YAML: {}",
                            msg.split(" at line ").next().unwrap_or(&msg)
                        ),
                    });
                    break;
                }
            };
            let value: Value = value;
            if value.is_null() {
                continue;
            }
            let api = value["apiVersion"].as_str().unwrap_or("");
            let kind = value["kind"].as_str().unwrap_or("").to_owned();
            let name = value["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let doc_at = pos
                .find(&[s("kind")], true)
                .or_else(|| pos.find(&[s("apiVersion")], true));
            if !api.starts_with("argoproj.io/")
                || !matches!(kind.as_str(), "EventSource" | "Sensor" | "EventBus")
            {
                let what = if kind.is_empty() {
                    "a document without `kind`".to_owned()
                } else {
                    format!("{kind} {name}")
                };
                t.notes.push(Shown {
                    file: input.name.clone(),
                    pos: doc_at,
                    msg: format!(
                        "{what}: not an Argo Events EventSource, Sensor or EventBus; passed over"
                    ),
                });
                continue;
            }
            if api != "argoproj.io/v1alpha1" {
                t.refused.push(ConfigError {
                    file: input.name.clone(),
                    pos: pos.find(&[s("apiVersion")], false),
                    msg: format!("apiVersion: `{api}`: Sluice reads argoproj.io/v1alpha1"),
                });
                continue;
            }
            if name.is_empty() {
                t.refused.push(ConfigError {
                    file: input.name.clone(),
                    pos: doc_at,
                    msg: format!("metadata.name: the {kind} has no name"),
                });
                continue;
            }
            let namespace = value["metadata"]["namespace"].as_str().map(str::to_owned);
            docs.push(Doc {
                file: input.name.clone(),
                kind,
                name,
                namespace,
                value,
                pos,
            });
        }
    }
    docs
}

/// The object-level fields every Argo kind may carry; Kubernetes-only ones are noted.
fn common(doc: &Doc, f: &mut Fields) {
    f.take("apiVersion");
    f.take("kind");
    if let Some(mut m) = f.obj("metadata") {
        m.take("name");
        m.take("namespace");
        for k in [
            "labels",
            "annotations",
            "generateName",
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "finalizers",
            "managedFields",
            "ownerReferences",
        ] {
            m.ignore(k, "Kubernetes object metadata; Sluice does not use it");
        }
    }
    f.ignore(
        "status",
        "written by Argo's controller; Sluice does not read it",
    );
    let _ = doc;
}

/// The spec fields of Argo's Kubernetes deployment, noted with what Sluice does instead.
fn kubernetes_only(f: &mut Fields, what: &str) {
    f.ignore(
        "template",
        &format!(
            "the pod template of Argo's {what} deployment; Sluice runs in this process (a \
             `serviceAccountName`: Kubernetes triggers act as Sluice's own identity, or as the \
             one `as:` names in native config)"
        ),
    );
    f.ignore(
        "replicas",
        "Sluice runs as many copies as you start; dedup ids make copies safe",
    );
}

/// An EventBus document Sluice connects to.
pub(crate) enum Bus {
    /// Argo's JetStream bus: stream `default`, subjects `default.<es>.<event>`.
    JetStream { url: String, tls: Option<Value> },
    /// Argo's Kafka bus: one topic, key `<es>.<event>`, the structured event as the value.
    Kafka {
        brokers: String,
        topic: String,
        /// `consumerGroup.groupName`: the Sensors' group (else `<namespace>-<sensor>`).
        group: Option<String>,
        /// `consumerGroup.oldest`: a new group starts at the oldest record.
        oldest: bool,
    },
}

impl Bus {
    /// The sink EventSources publish to.
    pub fn sink_name(name: &str) -> String {
        format!("eventbus.{name}")
    }

    /// The sink that publishes as Argo's EventSources do.
    pub fn sink(&self) -> Value {
        match self {
            Bus::JetStream { url, tls } => {
                let mut v = json!({"kind": "nats", "url": url, "format": "argo-eventbus"});
                if let Some(t) = tls {
                    v["tls"] = t.clone();
                }
                v
            }
            Bus::Kafka { brokers, topic, .. } => json!({
                "kind": "kafka",
                "brokers": brokers,
                "topic": topic,
                "key": "{source}.{subject}",
                "mode": "structured",
            }),
        }
    }

    /// The source a Sensor reads the bus with, for the dependencies' `(eventSourceName,
    /// eventName)` pairs.
    pub fn sensor_source(
        &self,
        sensor: &str,
        namespace: Option<&str>,
        deps: &[(String, String)],
    ) -> Value {
        match self {
            Bus::JetStream { url, tls } => {
                let mut subjects: Vec<String> = deps
                    .iter()
                    .map(|(es, ev)| format!("default.{es}.{ev}"))
                    .collect();
                subjects.sort();
                subjects.dedup();
                // A durable consumer per Sensor, created at the end of the stream (Argo's
                // DeliverNew: a new Sensor does not replay the bus's history).
                let consumer: String = format!("sluice-{sensor}")
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                let mut src = json!({
                    "kind": "jetstream",
                    "url": url,
                    "format": "argo-eventbus",
                    "consumer": consumer,
                    "filter_subjects": subjects,
                    "deliver": "new",
                });
                if let Some(t) = tls {
                    src["tls"] = t.clone();
                }
                src
            }
            Bus::Kafka {
                brokers,
                topic,
                group,
                oldest,
            } => {
                let group = group
                    .clone()
                    .unwrap_or_else(|| format!("{}-{sensor}", namespace.unwrap_or("argo-events")));
                let mut src = json!({
                    "kind": "kafka",
                    "brokers": brokers,
                    "topics": [topic],
                    "group": group,
                    "format": "argo-eventbus",
                });
                if !oldest {
                    // Argo's default: a new group starts at the newest record.
                    src["properties"] = json!({"auto.offset.reset": "latest"});
                }
                src
            }
        }
    }
}

/// Whether a name can be a token of an EventBus subject as Argo and the `nats` sink both write
/// it (`default.<eventSourceName>.<eventName>`).
pub(crate) fn bus_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The URL of Argo's managed JetStream bus when `--eventbus-url` gives none.
pub const EVENTBUS_URL_ENV: &str = "SLUICE_EVENTBUS_URL";

/// Reads an EventBus document.
fn bus(doc: &Doc, t: &mut Translation) -> Option<Bus> {
    let notes = Notes::default();
    let mut out = None;
    {
        let mut f = Fields::new(vec![], doc.value.clone(), &notes);
        common(doc, &mut f);
        let Some(mut spec) = f.obj("spec") else {
            f.refuse_here("an EventBus needs a `spec`");
            drop(f);
            t.take_notes(doc, &notes);
            return None;
        };
        if let Some(mut js) = spec.obj("jetstreamExotic") {
            let url = js.str("url");
            let tls = sluice_core::argo::map::tls_files(&mut js);
            js.refuse(
                "accessSecret",
                "not supported yet: a bus that needs credentials is reached with native config \
                 (a `nats` sink and `jetstream` source with `auth`)",
            );
            js.ignore(
                "streamConfig",
                "Sluice creates the stream `default` when missing with Argo's subjects \
                 (`default.*.*`), file storage and a 5-minute duplicate window; other settings \
                 stay the server's",
            );
            match url {
                Some(url) => out = Some(Bus::JetStream { url, tls }),
                None => js.refuse_here("`url` is required"),
            }
        }
        if let Some(mut js) = spec.obj("jetstream") {
            for k in js.keys() {
                js.ignore(
                    &k,
                    "a setting of the bus Argo's controller deploys; Sluice connects to it",
                );
            }
            match std::env::var(EVENTBUS_URL_ENV) {
                Ok(url) => out = Some(Bus::JetStream { url, tls: None }),
                Err(_) => js.refuse_here(&format!(
                    "Argo's managed bus is reached through its Service, with TLS and generated \
                     credentials: give its URL with --eventbus-url (or {EVENTBUS_URL_ENV}), or \
                     describe it as `jetstreamExotic`"
                )),
            }
        }
        if let Some(mut k) = spec.obj("kafka") {
            let brokers = k.str("url");
            let topic = k.str("topic").unwrap_or_else(|| {
                format!(
                    "{}-{}",
                    doc.namespace.as_deref().unwrap_or("argo-events"),
                    doc.name
                )
            });
            let (mut group, mut oldest) = (None, false);
            if let Some(mut g) = k.obj("consumerGroup") {
                group = g.str("groupName");
                oldest = g.bool("oldest") == Some(true);
                g.ignore(
                    "rebalanceStrategy",
                    "Sluice's consumer uses cooperative-sticky rebalancing",
                );
            }
            k.ignore("version", "librdkafka negotiates the protocol version");
            k.ignore(
                "partitioner",
                "records are keyed `<eventSourceName>.<eventName>` and placed by the key's hash",
            );
            k.refuse("tls", "not supported yet on the Kafka EventBus");
            k.refuse("sasl", "not supported yet on the Kafka EventBus");
            match brokers {
                Some(brokers) => {
                    out = Some(Bus::Kafka {
                        brokers,
                        topic,
                        group,
                        oldest,
                    })
                }
                None => k.refuse_here("`url` (the brokers) is required"),
            }
        }
        spec.refuse(
            "nats",
            "the NATS Streaming (STAN) EventBus is deprecated and not supported",
        );
        if out.is_none() && !notes.refused() {
            spec.refuse_here("an EventBus needs `jetstream`, `jetstreamExotic` or `kafka`");
        }
    }
    t.take_notes(doc, &notes);
    if notes.refused() {
        None
    } else {
        out
    }
}

/// The EventBus a document uses (`spec.eventBusName`, default `default`), when one was given.
fn bus_of<'a>(doc: &Doc, buses: &'a HashMap<String, Bus>) -> Option<(String, &'a Bus)> {
    let name = doc.value["spec"]["eventBusName"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    buses.get(&name).map(|b| (name, b))
}

/// `spec.eventBusName`: honoured when the bus was given, noted otherwise.
fn bus_name_field(spec: &mut Fields, bus: Option<&str>) {
    match bus {
        Some(_) => {
            spec.take("eventBusName");
        }
        None => spec.ignore(
            "eventBusName",
            "no EventBus document of this name was given: EventSources and Sensors in one \
             Sluice are wired directly (no bus)",
        ),
    }
}

/// Translates Argo manifests into native config entries.
pub fn translate(inputs: &[Input]) -> Translation {
    let mut t = Translation::default();
    let docs = documents(inputs, &mut t);
    let kinds = registry::kinds();
    let mut source_types: HashMap<&str, (&'static str, sluice_core::argo::map::SourceMap)> =
        HashMap::new();
    let mut trigger_types: HashMap<&str, (&'static str, sluice_core::argo::map::TriggerMap)> =
        HashMap::new();
    for k in &kinds {
        for (ty, m) in &k.argo {
            match (k.role, m) {
                (Role::Source, ArgoMap::Source(f)) => {
                    source_types.insert(ty, (k.name, *f));
                }
                (Role::Sink, ArgoMap::Trigger(f)) => {
                    trigger_types.insert(ty, (k.name, *f));
                }
                _ => {}
            }
        }
    }

    // EventBus documents first: EventSources publish to theirs, Sensors read from it.
    let mut buses: HashMap<String, Bus> = HashMap::new();
    for doc in docs.iter().filter(|d| d.kind == "EventBus") {
        let refused_before = t.refused.len();
        if buses.contains_key(&doc.name) {
            t.note(
                doc,
                &[s("metadata"), s("name")],
                NoteKind::Refused,
                format!(
                    "two EventBuses are named `{}`; names must be unique",
                    doc.name
                ),
            );
        } else if let Some(b) = bus(doc, &mut t) {
            buses.insert(doc.name.clone(), b);
        }
        t.rows.push(row(doc, &t, refused_before));
    }
    let mut bus_sinks: BTreeMap<String, Vec<(Value, Vec<String>, usize)>> = BTreeMap::new();

    // EventSources next: their events are what Sensor dependencies name.
    // (eventSourceName, eventName) → the source's name.
    let mut events: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut es_seen: HashMap<String, String> = HashMap::new();
    for doc in docs.iter().filter(|d| d.kind == "EventSource") {
        let refused_before = t.refused.len();
        if let Some(first) = es_seen.insert(doc.name.clone(), doc.file.clone()) {
            t.note(
                doc,
                &[s("metadata"), s("name")],
                NoteKind::Refused,
                format!(
                    "two EventSources are named `{}` (the other one is in {first}); names must be unique",
                    doc.name
                ),
            );
            t.rows.push(row(doc, &t, refused_before));
            continue;
        }
        let notes = Notes::default();
        {
            let mut f = Fields::new(vec![], doc.value.clone(), &notes);
            common(doc, &mut f);
            let bus = bus_of(doc, &buses);
            if let Some(mut spec) = f.obj("spec") {
                kubernetes_only(&mut spec, "EventSource");
                bus_name_field(&mut spec, bus.as_ref().map(|(n, _)| n.as_str()));
                if let Some(mut svc) = spec.obj("service") {
                    svc.ignore(
                        "ports",
                        "Sluice listens on the webhook's own `port` (no Service is made)",
                    );
                    svc.ignore("clusterIP", "no Service is made");
                    svc.ignore("metadata", "no Service is made");
                }
                for ty in spec.keys() {
                    let Some((kind, map)) = source_types.get(ty.as_str()).copied() else {
                        let mut have: Vec<&str> = source_types.keys().copied().collect();
                        have.sort();
                        spec.refuse(
                            &ty,
                            &format!(
                                "EventSource type `{ty}` is not supported by Sluice; it runs: {}",
                                have.join(", ")
                            ),
                        );
                        continue;
                    };
                    let Some(mut events_f) = spec.obj(&ty) else {
                        spec.refuse_taken(&ty, "declares no events");
                        continue;
                    };
                    for event in events_f.keys() {
                        // An event with nothing after it has no options.
                        let mut ef = events_f.obj(&event).unwrap_or_else(|| {
                            Fields::new(events_f.path_of(&event), Value::Null, &notes)
                        });
                        let ctx = EventCtx {
                            event_source: &doc.name,
                            event: &event,
                            namespace: doc.namespace.as_deref(),
                        };
                        let mut native = map(&ctx, &mut ef);
                        let path = ef.path().to_vec();
                        drop(ef);
                        native["kind"] = json!(kind);
                        let name = format!("{}.{}", doc.name, event);
                        if let Some((bus_name, _)) = &bus {
                            if !bus_name_ok(&doc.name) || !bus_name_ok(&event) {
                                t.note(
                                    doc,
                                    &path,
                                    NoteKind::Refused,
                                    "on the EventBus, EventSource and event names may only use \
                                     letters, digits, `-` and `_` (they are subject tokens)"
                                        .into(),
                                );
                            }
                            // Argo's Sensors route by the CloudEvent's source and subject.
                            // (The nats source names it `event_subject`: its `subject` is
                            // what it subscribes to.)
                            let subject = match native.get("event_subject") {
                                Some(s) => s,
                                None => &native["subject"],
                            };
                            if native["source"] != json!(doc.name) || *subject != json!(event) {
                                t.note(
                                    doc,
                                    &path,
                                    NoteKind::Refused,
                                    format!(
                                        "a `{ty}` event cannot publish to the EventBus yet: its \
                                         events do not carry the EventSource and event names as \
                                         their source and subject; leave the EventBus out to \
                                         wire it to Sensors in this Sluice directly"
                                    ),
                                );
                            }
                            let route = json!({"from": [name], "to": [Bus::sink_name(bus_name)]});
                            bus_sinks.entry(bus_name.clone()).or_default().push((
                                route,
                                path.clone(),
                                docs.iter().position(|d| std::ptr::eq(d, doc)).unwrap_or(0),
                            ));
                        }
                        events.insert((doc.name.clone(), event.clone()), name.clone());
                        t.add(doc, "sources", &name, native, &[(vec![], path)]);
                    }
                }
            } else {
                f.refuse_here("an EventSource needs a `spec`");
            }
        }
        t.take_notes(doc, &notes);
        t.rows.push(row(doc, &t, refused_before));
    }

    let mut sensor_seen: HashMap<String, String> = HashMap::new();
    for doc in docs.iter().filter(|d| d.kind == "Sensor") {
        let refused_before = t.refused.len();
        if let Some(first) = sensor_seen.insert(doc.name.clone(), doc.file.clone()) {
            t.note(
                doc,
                &[s("metadata"), s("name")],
                NoteKind::Refused,
                format!(
                    "two Sensors are named `{}` (the other one is in {first}); names must be unique",
                    doc.name
                ),
            );
            t.rows.push(row(doc, &t, refused_before));
            continue;
        }
        let bus = bus_of(doc, &buses);
        sensor::translate(doc, &events, &trigger_types, bus, &mut t);
        t.rows.push(row(doc, &t, refused_before));
    }

    // The bus sinks and the routes of the EventSources that publish to them.
    for (bus_name, routes) in bus_sinks {
        let Some(b) = buses.get(&bus_name) else {
            continue;
        };
        let Some(bus_doc) = docs
            .iter()
            .find(|d| d.kind == "EventBus" && d.name == bus_name)
        else {
            continue;
        };
        t.add(
            bus_doc,
            "sinks",
            &Bus::sink_name(&bus_name),
            b.sink(),
            &[(vec![], vec![s("spec")])],
        );
        for (route, path, di) in routes {
            t.add_route(&docs[di], route, &path);
        }
    }
    t
}

fn row(doc: &Doc, t: &Translation, refused_before: usize) -> (String, String, Vec<String>) {
    (
        doc.file.clone(),
        format!("{} {}", doc.kind, doc.name),
        t.refused[refused_before..]
            .iter()
            .map(|e| e.msg.clone())
            .collect(),
    )
}

#[cfg(test)]
mod tests;
