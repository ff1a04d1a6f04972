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

pub use secrets::{secret, secret_file, DEFAULT_SECRETS_DIR};

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
        &format!("the pod template of Argo's {what} deployment; Sluice runs in this process"),
    );
    f.ignore(
        "replicas",
        "Sluice runs as many copies as you start; dedup ids make copies safe",
    );
    f.ignore(
        "eventBusName",
        "without an EventBus document, EventSources and Sensors in one Sluice are wired \
         directly (no bus)",
    );
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

    // EventSources first: their events are what Sensor dependencies name.
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
            if let Some(mut spec) = f.obj("spec") {
                kubernetes_only(&mut spec, "EventSource");
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
                        continue;
                    };
                    for event in events_f.keys() {
                        let Some(mut ef) = events_f.obj(&event) else {
                            continue;
                        };
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

    for doc in docs.iter().filter(|d| d.kind == "EventBus") {
        let refused_before = t.refused.len();
        t.note(
            doc,
            &[s("spec")],
            NoteKind::Refused,
            "EventBus documents are not supported yet: without one, EventSources and Sensors in \
             one Sluice are wired directly"
                .into(),
        );
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
        sensor::translate(doc, &events, &trigger_types, &mut t);
        t.rows.push(row(doc, &t, refused_before));
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
