//! Reading Argo Events manifests onto native configs (`sluice run -f`, `sluice convert`).
//!
//! The daemon reads the documents, resolves names and wires dependencies; each connector crate
//! maps its own Argo type (an EventSource type such as `webhook`, or a trigger such as `http`)
//! onto its native options with a [`Fields`]: the mapping takes every field it honours, refuses
//! or notes the ones it cannot, and whatever it left untouched is refused when the `Fields` is
//! dropped. So no field is ever dropped silently.

use std::cell::RefCell;
use std::rc::Rc;

use serde_json::{json, Map, Value};

/// What happened to one field of a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoteKind {
    /// The document cannot run: the field has no equivalent.
    Refused,
    /// Accepted, but Sluice does something else (a Kubernetes-only field, an ignored option).
    Noted,
}

/// A note about one field, at its path inside the document (`spec.webhook.example.port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub path: Vec<String>,
    pub kind: NoteKind,
    pub msg: String,
}

/// The notes of one document, shared by the `Fields` of its parts.
#[derive(Clone, Default)]
pub struct Notes(Rc<RefCell<Vec<Note>>>);

impl Notes {
    pub fn push(&self, path: Vec<String>, kind: NoteKind, msg: impl Into<String>) {
        self.0.borrow_mut().push(Note {
            path,
            kind,
            msg: msg.into(),
        });
    }
    pub fn take(&self) -> Vec<Note> {
        std::mem::take(&mut self.0.borrow_mut())
    }
    pub fn refused(&self) -> bool {
        self.0.borrow().iter().any(|n| n.kind == NoteKind::Refused)
    }
}

/// One object of a manifest, read field by field. Fields left when it is dropped are refused.
pub struct Fields {
    path: Vec<String>,
    map: Map<String, Value>,
    notes: Notes,
}

impl Fields {
    /// `value` found at `path`; anything but an object is refused.
    pub fn new(path: Vec<String>, value: Value, notes: &Notes) -> Fields {
        let map = match value {
            Value::Object(m) => m,
            Value::Null => Map::new(),
            other => {
                notes.push(
                    path.clone(),
                    NoteKind::Refused,
                    format!("expected an object, found {}", kind_of(&other)),
                );
                Map::new()
            }
        };
        Fields {
            path,
            map,
            notes: notes.clone(),
        }
    }

    pub fn path(&self) -> &[String] {
        &self.path
    }

    /// The path of `key` under this object.
    pub fn path_of(&self, key: &str) -> Vec<String> {
        let mut p = self.path.clone();
        p.push(key.to_owned());
        p
    }

    pub fn notes(&self) -> &Notes {
        &self.notes
    }

    pub fn has(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(|v| !v.is_null())
    }

    /// The keys not taken yet.
    pub fn keys(&self) -> Vec<String> {
        self.map.keys().cloned().collect()
    }

    /// Takes a field as it is, with `${` escaped (the native config substitutes `${…}`).
    pub fn take(&mut self, key: &str) -> Option<Value> {
        match self.map.remove(key)? {
            Value::Null => None,
            mut v => {
                escape(&mut v);
                Some(v)
            }
        }
    }

    /// A string field; numbers and booleans are read as their text (Argo's `port: 12000`).
    pub fn str(&mut self, key: &str) -> Option<String> {
        match self.take(key)? {
            Value::String(s) => Some(s),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            other => {
                self.refuse_value(key, &other, "a string");
                None
            }
        }
    }

    /// A boolean field (`true`/`false`, or their text).
    pub fn bool(&mut self, key: &str) -> Option<bool> {
        match self.take(key)? {
            Value::Bool(b) => Some(b),
            Value::String(s) if s == "true" || s == "false" => Some(s == "true"),
            other => {
                self.refuse_value(key, &other, "true or false");
                None
            }
        }
    }

    /// A non-negative integer field (a number or its text).
    pub fn uint(&mut self, key: &str) -> Option<u64> {
        let v = self.take(key)?;
        match v
            .as_u64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        {
            Some(n) => Some(n),
            None => {
                self.refuse_value(key, &v, "a non-negative integer");
                None
            }
        }
    }

    /// A list field.
    pub fn list(&mut self, key: &str) -> Option<Vec<Value>> {
        match self.take(key)? {
            Value::Array(a) => Some(a),
            other => {
                self.refuse_value(key, &other, "a list");
                None
            }
        }
    }

    /// A list of strings.
    pub fn strings(&mut self, key: &str) -> Option<Vec<String>> {
        let list = self.list(key)?;
        let mut out = Vec::new();
        for (i, v) in list.into_iter().enumerate() {
            match v {
                Value::String(s) => out.push(s),
                other => {
                    let mut p = self.path_of(key);
                    p.push(i.to_string());
                    self.notes.push(
                        p,
                        NoteKind::Refused,
                        format!("expected a string, found {}", kind_of(&other)),
                    );
                }
            }
        }
        Some(out)
    }

    /// A map of strings (`metadata`).
    pub fn string_map(&mut self, key: &str) -> Option<Map<String, Value>> {
        let mut f = self.obj(key)?;
        let mut out = Map::new();
        for k in f.keys() {
            if let Some(v) = f.str(&k) {
                out.insert(k, Value::String(v));
            }
        }
        Some(out)
    }

    /// A nested object, read with its own `Fields`.
    pub fn obj(&mut self, key: &str) -> Option<Fields> {
        let v = self.map.remove(key)?;
        if v.is_null() {
            return None;
        }
        Some(Fields::new(self.path_of(key), v, &self.notes))
    }

    /// A `secretKeySelector` (`{name, key}`): the native config's `${secret:NAME/KEY}`, which
    /// the daemon resolves at start from `--secrets-dir`, then the environment.
    pub fn secret(&mut self, key: &str) -> Option<String> {
        let mut sel = self.obj(key)?;
        let (name, k) = (sel.str("name"), sel.str("key"));
        sel.ignore("optional", "a missing secret is always an error in Sluice");
        let bad = |s: &str| s.is_empty() || s.contains(['{', '}', '/', '$']) || s.contains("..");
        match (name, k) {
            (Some(n), Some(k)) if bad(&n) || bad(&k) => {
                sel.refuse_here(&format!(
                    "secret {n:?} key {k:?}: a name or key with `{{`, `}}`, `/`, `$` or `..` \
                     cannot be read"
                ));
                None
            }
            (Some(n), Some(k)) => Some(format!("${{secret:{n}/{k}}}")),
            _ => {
                sel.refuse_here("a secret selector needs `name` and `key`");
                None
            }
        }
    }

    /// Like [`Fields::secret`], for options that take a file: `${secret-file:NAME/KEY}`, the
    /// path of the mounted secret.
    pub fn secret_file(&mut self, key: &str) -> Option<String> {
        self.secret(key)
            .map(|s| s.replacen("${secret:", "${secret-file:", 1))
    }

    /// Refuses a field (when present), with the reason.
    pub fn refuse(&mut self, key: &str, why: &str) {
        if self.map.remove(key).is_some_and(|v| !v.is_null()) {
            self.notes
                .push(self.path_of(key), NoteKind::Refused, why.to_owned());
        }
    }

    /// Refuses a field already taken (its value was read and found wanting).
    pub fn refuse_taken(&mut self, key: &str, why: &str) {
        self.notes
            .push(self.path_of(key), NoteKind::Refused, why.to_owned());
    }

    /// Refuses this whole object.
    pub fn refuse_here(&mut self, why: &str) {
        self.notes
            .push(self.path.clone(), NoteKind::Refused, why.to_owned());
    }

    /// Accepts a field (when present) and notes what Sluice does instead.
    pub fn ignore(&mut self, key: &str, instead: &str) {
        if self.map.remove(key).is_some_and(|v| !v.is_null()) {
            self.notes
                .push(self.path_of(key), NoteKind::Noted, instead.to_owned());
        }
    }

    /// Notes something about a field that was honoured.
    pub fn note(&self, key: &str, msg: &str) {
        self.notes
            .push(self.path_of(key), NoteKind::Noted, msg.to_owned());
    }

    fn refuse_value(&self, key: &str, v: &Value, want: &str) {
        self.notes.push(
            self.path_of(key),
            NoteKind::Refused,
            format!("expected {want}, found {}", kind_of(v)),
        );
    }
}

impl Drop for Fields {
    fn drop(&mut self) {
        for (k, v) in std::mem::take(&mut self.map) {
            if v.is_null() {
                continue;
            }
            self.notes.push(
                self.path_of(&k),
                NoteKind::Refused,
                "not supported by Sluice (docs/argo-compat.md lists what is)",
            );
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Escapes `${` as `$${` in every string (the native config substitutes `${…}`).
pub fn escape(v: &mut Value) {
    match v {
        Value::String(s) if s.contains("${") => *s = s.replace("${", "$${"),
        Value::Array(a) => a.iter_mut().for_each(escape),
        Value::Object(m) => m.values_mut().for_each(escape),
        _ => {}
    }
}

/// One event of an EventSource: `spec.<type>.<event>`.
pub struct EventCtx<'a> {
    /// The EventSource's `metadata.name`: Argo's CloudEvent `source`.
    pub event_source: &'a str,
    /// The event's name (its key): Argo's CloudEvent `subject`.
    pub event: &'a str,
    /// The document's namespace, when it names one.
    pub namespace: Option<&'a str>,
}

/// Maps one EventSource event's spec onto a native source config (without `kind`).
pub type SourceMap = fn(&EventCtx<'_>, &mut Fields) -> Value;

/// One trigger of a Sensor: `spec.triggers[i].template.<type>`.
pub struct TriggerCtx<'a> {
    pub sensor: &'a str,
    pub trigger: &'a str,
    pub namespace: Option<&'a str>,
    /// The Sensor's dependency names, in order.
    pub dependencies: &'a [String],
    /// The sensor trigger's `payload` (Argo parameters building the output's data) the mapping
    /// asks for; `None`: the events are handed to the sink as they are.
    pub payload: Option<Vec<Value>>,
    /// The trigger's `policy` (`status`, `k8s`): a mapping that honours it takes it; one left
    /// here is refused.
    pub policy: Option<Value>,
    /// The trigger-level `parameters` (Argo applies them to the trigger template), with `dest`
    /// made relative to the type's spec (`k8s.source.resource.metadata.name` →
    /// `source.resource.metadata.name`), each with its index. A mapping takes those it can
    /// honour; the rest are refused.
    pub template_parameters: Vec<(usize, Value)>,
}

impl TriggerCtx<'_> {
    /// Takes the template parameters whose `dest` starts with `prefix`, with the prefix removed.
    pub fn take_template_parameters(&mut self, prefix: &str) -> Vec<Value> {
        let mut taken = Vec::new();
        self.template_parameters.retain(|(_, p)| {
            let Some(rest) = p["dest"].as_str().and_then(|d| d.strip_prefix(prefix)) else {
                return true;
            };
            let mut p = p.clone();
            p["dest"] = Value::String(rest.to_owned());
            taken.push(p);
            false
        });
        taken
    }

    /// Takes the template parameters whose `dest` is exactly `dest`.
    pub fn take_template_parameter(&mut self, dest: &str) -> Vec<Value> {
        let mut taken = Vec::new();
        self.template_parameters.retain(|(_, p)| {
            if p["dest"] == dest {
                taken.push(p.clone());
                false
            } else {
                true
            }
        });
        taken
    }
}

/// Maps one trigger's spec onto a native sink config (without `kind`).
pub type TriggerMap = fn(&mut TriggerCtx<'_>, &mut Fields) -> Value;

/// Argo's trigger `parameters` that change the object a trigger creates (`k8s.parameters`,
/// `argoWorkflow.parameters`), which may read any dependency: the sensor resolves each
/// parameter's `src` into the output's data as `p<i>` (so every dependency is at hand), and the
/// sink writes `p<i>` at the parameter's `dest`. Returns the sink's parameters and sets
/// `ctx.payload`.
pub fn object_parameters(ctx: &mut TriggerCtx<'_>, list: Vec<Value>, f: &Fields) -> Vec<Value> {
    let mut payload = Vec::new();
    let mut sink = Vec::new();
    for (i, p) in list.into_iter().enumerate() {
        let path = {
            let mut p = f.path_of("parameters");
            p.push(i.to_string());
            p
        };
        let mut pf = Fields::new(path, p, f.notes());
        let (Some(src), Some(dest)) = (pf.take("src"), pf.str("dest")) else {
            pf.refuse_here("a parameter needs `src` and `dest`");
            continue;
        };
        let raw = src.get("useRawData").and_then(Value::as_bool) == Some(true);
        let key = format!("p{i}");
        payload.push(json!({ "src": src, "dest": key }));
        // Optional: a dependency without an event (an OR condition) leaves the field as it is,
        // as Argo does.
        let mut sp = json!({
            "src": { "dataKey": key, "useRawData": raw, "optional": true },
            "dest": dest,
        });
        if let Some(op) = pf.str("operation") {
            sp["operation"] = Value::String(op);
        }
        sink.push(sp);
    }
    let mut all = ctx.payload.take().unwrap_or_default();
    all.extend(payload);
    ctx.payload = Some(all);
    sink
}

/// Argo's `tls` block (`caCertSecret`, `clientCertSecret`, `clientKeySecret`) as the
/// `{ca, cert, key}` files most connectors take; `insecureSkipVerify` is refused.
pub fn tls_files(f: &mut Fields) -> Option<Value> {
    let mut t = f.obj("tls")?;
    let mut m = Map::new();
    for (from, to) in [
        ("caCertSecret", "ca"),
        ("clientCertSecret", "cert"),
        ("clientKeySecret", "key"),
    ] {
        if let Some(v) = t.secret_file(from) {
            m.insert(to.into(), json!(v));
        }
    }
    t.refuse(
        "insecureSkipVerify",
        "Sluice always verifies the server's certificate: trust its CA with `caCertSecret`",
    );
    t.ignore("enabled", "TLS is on when the block is given");
    Some(Value::Object(m))
}

/// Argo's `connectionBackoff`: noted, Sluice reconnects with its own backoff.
pub fn reconnects(f: &mut Fields) {
    f.ignore(
        "connectionBackoff",
        "Sluice reconnects on its own, with a capped exponential backoff, for as long as it runs",
    );
}

/// Argo's source-side `filter` (expr-lang over the event's data): refused with what to do.
pub fn no_source_filter(f: &mut Fields) {
    f.refuse(
        "filter",
        "a source-side filter is not supported yet: move the expression into the Sensor's \
         dependency filters (`filters.exprs`)",
    );
}

/// Argo's `metadata` in `format: argo` events and the options every `format: argo` source
/// shares: `format`, `source` = the EventSource name, `subject` = the event name.
pub fn argo_source(ctx: &EventCtx<'_>, f: &mut Fields) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("format".into(), json!("argo"));
    out.insert("source".into(), json!(ctx.event_source));
    out.insert("subject".into(), json!(ctx.event));
    if let Some(m) = f.string_map("metadata") {
        if !m.is_empty() {
            out.insert("metadata".into(), Value::Object(m));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_taken_noted_or_refused() {
        let notes = Notes::default();
        {
            let mut f = Fields::new(
                vec!["spec".into()],
                json!({"port": 12000, "endpoint": "/x", "template": {}, "bogus": 1, "s": "${A}"}),
                &notes,
            );
            assert_eq!(f.str("port").as_deref(), Some("12000"));
            assert_eq!(f.str("endpoint").as_deref(), Some("/x"));
            assert_eq!(f.str("s").as_deref(), Some("$${A}"));
            f.ignore("template", "no pod");
        }
        let all = notes.take();
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all[0].kind, NoteKind::Noted);
        assert_eq!(all[1].path, vec!["spec", "bogus"]);
        assert_eq!(all[1].kind, NoteKind::Refused);
    }

    #[test]
    fn secrets_become_tokens() {
        let notes = Notes::default();
        let mut f = Fields::new(
            vec![],
            json!({"a": {"name": "s", "key": "k"}, "b": {"name": "s"}}),
            &notes,
        );
        assert_eq!(f.secret("a").as_deref(), Some("${secret:s/k}"));
        assert_eq!(f.secret_file("b"), None);
        drop(f);
        assert!(notes.refused());
    }

    #[test]
    fn object_parameters_go_through_the_payload() {
        let notes = Notes::default();
        let f = Fields::new(vec!["k8s".into()], json!({}), &notes);
        let mut ctx = TriggerCtx {
            sensor: "s",
            trigger: "t",
            namespace: None,
            dependencies: &[],
            payload: None,
            policy: None,
            template_parameters: Vec::new(),
        };
        let sink = object_parameters(
            &mut ctx,
            vec![
                json!({"src": {"dependencyName": "d", "dataKey": "body.x"}, "dest": "spec.a", "operation": "append"}),
            ],
            &f,
        );
        assert_eq!(
            sink,
            vec![
                json!({"src": {"dataKey": "p0", "useRawData": false, "optional": true}, "dest": "spec.a", "operation": "append"})
            ]
        );
        assert_eq!(
            ctx.payload.unwrap(),
            vec![json!({"src": {"dependencyName": "d", "dataKey": "body.x"}, "dest": "p0"})]
        );
    }
}
