//! Argo's `TriggerParameter`: a value taken from an event (`dataKey`, `dataTemplate`,
//! `contextKey`, `contextTemplate`, `value` as the fallback) and written at `dest` into a JSON
//! document with `operation` overwrite, append or prepend. The Sensor writes into a trigger's
//! payload or its output event's attributes (the event is a dependency's); a trigger sink (the
//! Kubernetes ones) writes into the object it sends (the event is the one it received).
//!
//! Behind the `params` feature (gjson, Go templates).

pub mod tmpl;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::Event;
use tmpl::Tmpl;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamConfig {
    pub src: SrcConfig,
    /// Where the value goes: dot-separated keys, numeric array indexes, `-1` to append to an
    /// array. Empty: the value is the whole document.
    #[serde(default)]
    pub dest: String,
    #[serde(default)]
    pub operation: Operation,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SrcConfig {
    /// The Sensor's dependency whose event is read (required there; a trigger sink reads the
    /// event it received and ignores this).
    #[serde(default, rename = "dependencyName")]
    pub dependency_name: String,
    /// gjson path into the event's data.
    #[serde(default, rename = "dataKey")]
    pub data_key: Option<String>,
    /// Go template over the event's data (`.Input`).
    #[serde(default, rename = "dataTemplate")]
    pub data_template: Option<String>,
    /// gjson path into the event's context (`id`, `source`, `type`, `subject`, `time`, …).
    #[serde(default, rename = "contextKey")]
    pub context_key: Option<String>,
    /// Go template over the event's context (`.Input`).
    #[serde(default, rename = "contextTemplate")]
    pub context_template: Option<String>,
    /// The fallback: used when nothing else resolves, and when the dependency has no event
    /// (OR conditions).
    #[serde(default)]
    pub value: Option<String>,
    /// Insert a resolved non-string value (number, object, …) as JSON, not as its text.
    #[serde(default, rename = "useRawData")]
    pub use_raw_data: bool,
    /// Beyond Argo: when nothing resolves and there is no `value`, leave the destination as it
    /// is instead of failing (what `sluice run -f` sets on the object parameters a Sensor
    /// resolved for a k8s trigger: Argo skips a parameter whose dependency has no event).
    #[serde(default)]
    pub optional: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    #[default]
    Overwrite,
    Append,
    Prepend,
}

#[derive(Debug)]
pub struct Param {
    pub dep: usize,
    data_key: Option<String>,
    data_template: Option<Tmpl>,
    context_key: Option<String>,
    context_template: Option<Tmpl>,
    value: Option<String>,
    raw: bool,
    optional: bool,
    dest: Vec<Seg>,
    pub dest_text: String,
    op: Operation,
}

#[derive(Debug, Clone, PartialEq)]
enum Seg {
    Key(String),
    Index(usize),
    Append,
}

fn parse_dest(dest: &str) -> Vec<Seg> {
    if dest.is_empty() {
        return Vec::new();
    }
    let mut segs = Vec::new();
    let mut cur = String::new();
    let mut chars = dest.chars();
    let push = |cur: &mut String, segs: &mut Vec<Seg>| {
        let s = std::mem::take(cur);
        segs.push(match s.as_str() {
            "-1" => Seg::Append,
            n if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                Seg::Index(n.parse().unwrap_or(0))
            }
            _ => Seg::Key(s),
        });
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' => cur.extend(chars.next()),
            '.' => push(&mut cur, &mut segs),
            c => cur.push(c),
        }
    }
    push(&mut cur, &mut segs);
    segs
}

/// What a parameter resolved to.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolved {
    /// Nothing to write: the dependency has no event and the parameter no `value`.
    Skip,
    Value(Value),
}

impl Param {
    pub fn compile(cfg: &ParamConfig, dep: usize, what: &str) -> Result<Param, String> {
        let t = |x: &Option<String>, name: &str| {
            x.as_deref()
                .map(|t| Tmpl::parse(t).map_err(|e| format!("{what}.src.{name}: {e}")))
                .transpose()
        };
        Ok(Param {
            dep,
            data_key: cfg.src.data_key.clone().filter(|k| !k.is_empty()),
            data_template: t(&cfg.src.data_template, "dataTemplate")?,
            context_key: cfg.src.context_key.clone().filter(|k| !k.is_empty()),
            context_template: t(&cfg.src.context_template, "contextTemplate")?,
            value: cfg.src.value.clone(),
            raw: cfg.src.use_raw_data,
            optional: cfg.src.optional,
            dest: parse_dest(&cfg.dest),
            dest_text: cfg.dest.clone(),
            op: cfg.operation,
        })
    }

    /// [`Param::resolve_with`], the data read here.
    pub fn resolve(&self, event: Option<&Event>) -> Result<Resolved, String> {
        self.resolve_with(event, None)
    }

    /// Whether resolving reads the event's data with a gjson key (the data is then checked as
    /// JSON first).
    pub fn reads_data_key(&self) -> bool {
        self.data_key.is_some()
    }

    /// Resolves against the dependency's event (`None`: the dependency has no event). Argo's
    /// precedence: a template, else a key, else `value`; neither key nor template: the whole
    /// event (`{context, data}`). `lookup`: reads a gjson key in the event's data when the
    /// caller has the data checked as JSON and indexed (the Sensor does it once per event for
    /// all its parameters); it answers `None` when the data is not JSON. No `lookup`, or
    /// `None` from it: the data is read here.
    pub fn resolve_with<'k>(
        &'k self,
        event: Option<&Event>,
        lookup: Option<&dyn Fn(&'k str) -> Option<gjson::Value<'k>>>,
    ) -> Result<Resolved, String> {
        match self.resolve_required(event, lookup) {
            Err(_) if self.optional => Ok(Resolved::Skip),
            r => r,
        }
    }

    fn resolve_required<'k>(
        &'k self,
        event: Option<&Event>,
        lookup: Option<&dyn Fn(&'k str) -> Option<gjson::Value<'k>>>,
    ) -> Result<Resolved, String> {
        let Some(e) = event else {
            return Ok(match &self.value {
                Some(v) => Resolved::Value(Value::String(v.clone())),
                None => Resolved::Skip,
            });
        };
        let fallback = |why: String| match &self.value {
            Some(v) => Ok(Resolved::Value(Value::String(v.clone()))),
            None => Err(why),
        };
        // Argo: any data field shadows the context fields; a template comes first and, when it
        // fails or renders nothing, the key; then `value`.
        let data_side = self.data_template.is_some() || self.data_key.is_some();
        let (tmpl, key, what) = if data_side {
            (&self.data_template, &self.data_key, "data")
        } else if self.context_template.is_some() || self.context_key.is_some() {
            (&self.context_template, &self.context_key, "context")
        } else if self.value.is_some() {
            return fallback(String::new());
        } else {
            let whole = serde_json::json!({ "context": context_json(e), "data": data_json(e) });
            return Ok(Resolved::Value(if self.raw {
                whole
            } else {
                Value::String(whole.to_string())
            }));
        };
        let input = || {
            if data_side {
                data_json(e)
            } else {
                context_json(e)
            }
        };
        let mut why = String::new();
        if let Some(t) = tmpl {
            match t.render_input(&input()) {
                Ok(out) if !out.is_empty() && out != "<no value>" => {
                    return Ok(Resolved::Value(self.text_value(out)))
                }
                Ok(_) => why = format!("the {what} template rendered nothing"),
                Err(e) => why = e,
            }
        }
        if let Some(key) = key.as_deref().filter(|k| !data_side && is_name(k)) {
            // A plain attribute name: read it off the event, without a JSON copy of the context.
            if let Some(v) = crate::template::attr(e, key) {
                return Ok(Resolved::Value(Value::String(v.into_owned())));
            }
        }
        if let Some(key) = key {
            // The data as it came (raw values keep their text), through the caller's index when
            // it has one; else the data or the context as JSON.
            let indexed = match (data_side, lookup) {
                (true, Some(f)) => f(key),
                _ => None,
            };
            let own;
            let r = match indexed {
                Some(r) => r,
                None => {
                    own = match data_side.then(|| json_text(e)).flatten() {
                        Some(text) => std::borrow::Cow::Borrowed(text),
                        None => std::borrow::Cow::Owned(input().to_string()),
                    };
                    gjson::get(&own, key)
                }
            };
            if r.exists() {
                return Ok(Resolved::Value(self.gjson_value(&r)));
            }
            why = format!("{what} key {key:?} does not exist in the event");
        }
        fallback(why)
    }

    /// A template's output: always text (Argo types it `String`, whatever `useRawData` says).
    fn text_value(&self, out: String) -> Value {
        Value::String(out)
    }

    /// A gjson result: strings as strings; anything else as JSON with `useRawData`, else as
    /// its text (Argo inserts every value as a JSON string without it).
    fn gjson_value(&self, r: &gjson::Value) -> Value {
        match r.kind() {
            gjson::Kind::String => Value::String(r.str().to_owned()),
            _ if self.raw => serde_json::from_str(r.json()).unwrap_or(Value::Null),
            // Argo inserts the value's own text (its spacing kept) as a string.
            _ => Value::String(r.json().to_owned()),
        }
    }

    /// Writes `v` at this parameter's `dest` in `doc`.
    /// Whether `dest` is empty: the value is the whole document.
    pub fn is_whole(&self) -> bool {
        self.dest.is_empty()
    }

    pub fn apply(&self, doc: &mut Value, v: Value) -> Result<(), String> {
        let slot = slot(doc, &self.dest)?;
        *slot = match self.op {
            Operation::Overwrite => v,
            // Argo: appending to a destination that does not exist just sets it.
            _ if slot.is_null() => v,
            Operation::Append | Operation::Prepend => {
                let old = text_of(slot);
                let new = text_of(&v);
                Value::String(if self.op == Operation::Append {
                    old + &new
                } else {
                    new + &old
                })
            }
        };
        Ok(())
    }
}

/// A CloudEvents attribute or extension name (no gjson syntax in it).
fn is_name(k: &str) -> bool {
    !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

fn text_of(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The place `dest` names in `doc`, created on the way (objects for keys, arrays for
/// indexes, null padding up to an index).
fn slot<'a>(doc: &'a mut Value, dest: &[Seg]) -> Result<&'a mut Value, String> {
    let mut cur = doc;
    for seg in dest {
        cur = match seg {
            Seg::Key(k) => {
                if !cur.is_object() {
                    if !cur.is_null() {
                        return Err(format!(
                            "dest: `{k}` is a key into something that is not an object"
                        ));
                    }
                    *cur = Value::Object(Map::new());
                }
                cur.as_object_mut()
                    .map(|m| m.entry(k.clone()).or_insert(Value::Null))
                    .ok_or("dest: not an object")?
            }
            Seg::Index(i) => {
                if cur.is_null() {
                    *cur = Value::Array(Vec::new());
                }
                match cur {
                    Value::Array(a) => {
                        if a.len() <= *i {
                            a.resize(i + 1, Value::Null);
                        }
                        &mut a[*i]
                    }
                    // sjson treats a number as a key into an object.
                    Value::Object(m) => m.entry(i.to_string()).or_insert(Value::Null),
                    _ => {
                        return Err(format!(
                            "dest: index {i} into something that is not an array"
                        ))
                    }
                }
            }
            Seg::Append => {
                if cur.is_null() {
                    *cur = Value::Array(Vec::new());
                }
                match cur {
                    Value::Array(a) => {
                        a.push(Value::Null);
                        a.last_mut().ok_or("dest: append")?
                    }
                    _ => return Err("dest: `-1` appends to an array; this is not one".into()),
                }
            }
        };
    }
    Ok(cur)
}

/// The event's data as text when it is a JSON document.
fn json_text(e: &Event) -> Option<&str> {
    let b = e.data.as_bytes()?;
    let text = simdutf8::basic::from_utf8(b).ok()?;
    crate::json::is_document(b).then_some(text)
}

/// The event's data as JSON: parsed when it is JSON, else its text.
pub fn data_json(e: &Event) -> Value {
    match e.data.as_bytes() {
        None => Value::Null,
        Some(b) => serde_json::from_slice(b)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(b).into_owned())),
    }
}

/// The event's context attributes as a JSON object (Argo's `EventContext` names).
pub fn context_json(e: &Event) -> Value {
    let mut m = Map::new();
    let mut put = |k: &str, v: Option<&str>| {
        if let Some(v) = v {
            m.insert(k.to_owned(), Value::String(v.to_owned()));
        }
    };
    put("id", Some(&e.id));
    put("source", Some(&e.source));
    put("specversion", Some("1.0"));
    put("type", Some(&e.ty));
    put("datacontenttype", e.datacontenttype.as_deref());
    put("dataschema", e.dataschema.as_deref());
    put("subject", e.subject.as_deref());
    put("time", e.time.as_ref().map(|t| t.as_str()));
    for (k, v) in &e.extensions {
        m.insert(k.to_string(), Value::String(v.to_canonical().into_owned()));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(src: serde_json::Value, dest: &str, op: &str) -> Param {
        let cfg: ParamConfig = serde_json::from_value(serde_json::json!({
            "src": src, "dest": dest, "operation": op
        }))
        .unwrap();
        Param::compile(&cfg, 0, "payload.0").unwrap()
    }

    fn event() -> Event {
        Event::new("id-1", "/gh", "com.github.push")
            .with_subject("main")
            .with_json(
                r#"{"ref":"refs/heads/main","size":12,"head":{"id":"abc"},"msg":"hello world"}"#,
            )
    }

    #[test]
    fn an_optional_parameter_that_resolves_nothing_is_skipped() {
        let e = event();
        let required = param(serde_json::json!({"dataKey": "nope"}), "x", "overwrite");
        assert!(required.resolve(Some(&e)).is_err());
        let optional = param(
            serde_json::json!({"dataKey": "nope", "optional": true}),
            "x",
            "overwrite",
        );
        assert_eq!(optional.resolve(Some(&e)).unwrap(), Resolved::Skip);
        let found = param(
            serde_json::json!({"dataKey": "size", "optional": true}),
            "x",
            "overwrite",
        );
        assert_eq!(
            found.resolve(Some(&e)).unwrap(),
            Resolved::Value(Value::String("12".into()))
        );
    }

    #[test]
    fn keys_templates_values_and_precedence() {
        let e = event();
        let r = |p: &Param| p.resolve(Some(&e)).unwrap();
        let v = |s: &str| Resolved::Value(Value::String(s.into()));
        assert_eq!(
            r(&param(
                serde_json::json!({"dependencyName":"d","dataKey":"head.id"}),
                "x",
                "overwrite"
            )),
            v("abc")
        );
        // Without useRawData a number or object is inserted as its text.
        assert_eq!(
            r(&param(
                serde_json::json!({"dependencyName":"d","dataKey":"size"}),
                "x",
                "overwrite"
            )),
            v("12")
        );
        assert_eq!(
            r(&param(
                serde_json::json!({"dependencyName":"d","dataKey":"head"}),
                "x",
                "overwrite"
            )),
            v(r#"{"id":"abc"}"#)
        );
        assert_eq!(
            r(&param(
                serde_json::json!({"dependencyName":"d","dataKey":"head","useRawData":true}),
                "x",
                "overwrite"
            )),
            Resolved::Value(serde_json::json!({"id":"abc"}))
        );
        assert_eq!(
            r(&param(
                serde_json::json!({"dependencyName":"d","contextKey":"subject"}),
                "x",
                "overwrite"
            )),
            v("main")
        );
        // Template first, then key.
        assert_eq!(
            r(&param(
                serde_json::json!({"dependencyName":"d","dataKey":"size","dataTemplate":"{{ .Input.ref | trimPrefix \"refs/heads/\" }}"}),
                "x",
                "overwrite"
            )),
            v("main")
        );
        assert_eq!(
            r(&param(
                serde_json::json!({"dependencyName":"d","dataTemplate":"{{ .Input.msg | title }}"}),
                "x",
                "overwrite"
            )),
            v("Hello World")
        );
        assert_eq!(
            r(&param(
                serde_json::json!({"dependencyName":"d","contextTemplate":"{{ .Input.type | upper }}"}),
                "x",
                "overwrite"
            )),
            v("COM.GITHUB.PUSH")
        );
        // A missing key falls back to value; without one it is an error.
        assert_eq!(
            r(&param(
                serde_json::json!({"dependencyName":"d","dataKey":"nope","value":"dflt"}),
                "x",
                "overwrite"
            )),
            v("dflt")
        );
        assert!(param(
            serde_json::json!({"dependencyName":"d","dataKey":"nope"}),
            "x",
            "overwrite"
        )
        .resolve(Some(&e))
        .is_err());
        // No event: value, else skipped.
        assert_eq!(
            param(
                serde_json::json!({"dependencyName":"d","dataKey":"x","value":"v"}),
                "x",
                "overwrite"
            )
            .resolve(None)
            .unwrap(),
            v("v")
        );
        assert_eq!(
            param(
                serde_json::json!({"dependencyName":"d","dataKey":"x"}),
                "x",
                "overwrite"
            )
            .resolve(None)
            .unwrap(),
            Resolved::Skip
        );
    }

    #[test]
    fn dest_paths_and_operations() {
        let mut doc = serde_json::json!({"spec":{"arguments":{"parameters":[{"name":"m","value":"x"}]}},"list":[1]});
        let p = param(
            serde_json::json!({"dependencyName":"d"}),
            "spec.arguments.parameters.0.value",
            "overwrite",
        );
        p.apply(&mut doc, Value::String("hi".into())).unwrap();
        assert_eq!(doc["spec"]["arguments"]["parameters"][0]["value"], "hi");
        param(
            serde_json::json!({"dependencyName":"d"}),
            "spec.arguments.parameters.0.value",
            "append",
        )
        .apply(&mut doc, Value::String("-there".into()))
        .unwrap();
        assert_eq!(
            doc["spec"]["arguments"]["parameters"][0]["value"],
            "hi-there"
        );
        param(
            serde_json::json!({"dependencyName":"d"}),
            "spec.arguments.parameters.0.value",
            "prepend",
        )
        .apply(&mut doc, Value::String(">".into()))
        .unwrap();
        assert_eq!(
            doc["spec"]["arguments"]["parameters"][0]["value"],
            ">hi-there"
        );
        param(
            serde_json::json!({"dependencyName":"d"}),
            "list.-1",
            "overwrite",
        )
        .apply(&mut doc, serde_json::json!(2))
        .unwrap();
        assert_eq!(doc["list"], serde_json::json!([1, 2]));
        param(
            serde_json::json!({"dependencyName":"d"}),
            "new.deep\\.key.2",
            "overwrite",
        )
        .apply(&mut doc, serde_json::json!(true))
        .unwrap();
        assert_eq!(
            doc["new"]["deep.key"],
            serde_json::json!([null, null, true])
        );
        let mut whole = Value::Null;
        param(serde_json::json!({"dependencyName":"d"}), "", "overwrite")
            .apply(&mut whole, serde_json::json!({"a":1}))
            .unwrap();
        assert_eq!(whole, serde_json::json!({"a":1}));
        assert!(param(
            serde_json::json!({"dependencyName":"d"}),
            "list.x",
            "overwrite"
        )
        .apply(&mut doc, Value::Null)
        .is_err());
    }
}
