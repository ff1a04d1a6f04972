//! An Argo `Sensor` onto a native sensor (`sensors.<name>`) and one sink per trigger
//! (`sinks.<sensor>.<trigger>`): dependencies are wired to the sources their
//! `eventSourceName`/`eventName` became; each trigger's type is mapped by the sink kind that
//! runs it.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Map, Value};
use sluice_core::argo::map::{Fields, NoteKind, Notes, TriggerCtx, TriggerMap};

use super::{bus_name_field, common, kubernetes_only, s, Bus, Doc, Translation};

type Triggers<'a> = HashMap<&'a str, (&'static str, TriggerMap)>;

/// Argo's trigger types, for "not supported" messages that tell a type Sluice lacks from a typo.
const ARGO_TRIGGERS: [&str; 14] = [
    "argoWorkflow",
    "k8s",
    "http",
    "awsLambda",
    "kafka",
    "nats",
    "slack",
    "log",
    "azureEventHubs",
    "azureServiceBus",
    "pulsar",
    "openWhisk",
    "custom",
    "email",
];

struct Out {
    /// Sinks made: (name, value, document path).
    sinks: Vec<(String, Value, Vec<String>)>,
}

pub(super) fn translate(
    doc: &Doc,
    events: &BTreeMap<(String, String), String>,
    triggers: &Triggers<'_>,
    bus: Option<(String, &Bus)>,
    t: &mut Translation,
) {
    let notes = Notes::default();
    let mut out = Out { sinks: Vec::new() };
    let mut sensor = Map::new();
    let mut origins: Vec<(Vec<String>, Vec<String>)> = vec![(vec![], vec![s("spec")])];
    let mut bus_source: Option<(String, Value)> = None;
    {
        let mut f = Fields::new(vec![], doc.value.clone(), &notes);
        common(doc, &mut f);
        let Some(mut spec) = f.obj("spec") else {
            f.refuse_here("a Sensor needs a `spec`");
            drop(f);
            t.take_notes(doc, &notes);
            return;
        };
        kubernetes_only(&mut spec, "Sensor");
        bus_name_field(&mut spec, bus.as_ref().map(|(n, _)| n.as_str()));
        spec.ignore(
            "revisionHistoryLimit",
            "a Kubernetes Deployment setting; Sluice has no Deployment",
        );
        spec.ignore(
            "loggingFields",
            "Sluice's log lines carry the sensor and trigger names already",
        );
        spec.refuse(
            "errorOnFailedRound",
            "not supported yet: a failed trigger is logged and counted",
        );

        let mut deps = Vec::new();
        let mut dep_names = Vec::new();
        let mut bus_deps: Vec<(String, String)> = Vec::new();
        for (i, d) in spec
            .list("dependencies")
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let path = vec![s("spec"), s("dependencies"), i.to_string()];
            let mut df = Fields::new(path.clone(), d, &notes);
            let name = df.str("name");
            let es = df.str("eventSourceName");
            let ev = df.str("eventName");
            let (Some(name), Some(es), Some(ev)) = (name, es, ev) else {
                df.refuse_here("a dependency needs `name`, `eventSourceName` and `eventName`");
                continue;
            };
            // With an EventBus, every dependency reads it (Argo's Sensors do), matched by the
            // CloudEvent's source and subject; without one, the source the event became here.
            let from_bus = bus
                .as_ref()
                .map(|(b, _)| format!("{}.{}", Bus::sink_name(b), doc.name));
            let source = match (events.get(&(es.clone(), ev.clone())), &from_bus) {
                (_, Some(b)) => {
                    if !super::bus_name_ok(&es) || !super::bus_name_ok(&ev) {
                        notes.push(
                            path.clone(),
                            NoteKind::Refused,
                            "on the EventBus, EventSource and event names may only use letters, \
                             digits, `-` and `_` (they are subject tokens)",
                        );
                        continue;
                    }
                    bus_deps.push((es.clone(), ev.clone()));
                    b.clone()
                }
                (Some(src), None) => src.clone(),
                (None, None) => {
                    let known: Vec<String> =
                        events.keys().map(|(a, b)| format!("{a}/{b}")).collect();
                    let hint = crate::config::suggest(
                        &format!("{es}/{ev}"),
                        known.iter().map(String::as_str),
                    )
                    .map(|h| format!(" (did you mean `{h}`?)"))
                    .unwrap_or_default();
                    let declared = if known.is_empty() {
                        "no EventSource was given (pass its manifest with -f too)".to_owned()
                    } else {
                        format!("declared: {}", known.join(", "))
                    };
                    notes.push(
                        [path.clone(), vec![s("eventName")]].concat(),
                        NoteKind::Refused,
                        format!("no EventSource declares event `{ev}` of `{es}`{hint}; {declared}"),
                    );
                    continue;
                }
            };
            let mut m = Map::new();
            m.insert("name".into(), json!(name));
            m.insert("source".into(), json!(source));
            if from_bus.is_some() {
                m.insert("event_source".into(), json!(es));
                m.insert("event_subject".into(), json!(ev));
            }
            for k in ["filters", "filtersLogicalOperator", "transform"] {
                if let Some(v) = df.take(k) {
                    m.insert(k.into(), v);
                }
            }
            origins.push((vec![s("dependencies"), deps.len().to_string()], path));
            dep_names.push(name);
            deps.push(Value::Object(m));
        }
        if deps.is_empty() {
            spec.refuse_here("a Sensor needs at least one dependency it can wire");
        }
        if let Some((bus_name, b)) = &bus {
            let src = b.sensor_source(&doc.name, doc.namespace.as_deref(), &bus_deps);
            bus_source = Some((format!("{}.{}", Bus::sink_name(bus_name), doc.name), src));
        }
        sensor.insert("dependencies".into(), Value::Array(deps));

        let mut native_triggers = Vec::new();
        for (i, tv) in spec
            .list("triggers")
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let path = vec![s("spec"), s("triggers"), i.to_string()];
            if let Some(nt) = trigger(
                doc,
                &dep_names,
                path.clone(),
                tv,
                &notes,
                triggers,
                &mut out,
                true,
            ) {
                origins.push((vec![s("triggers"), native_triggers.len().to_string()], path));
                native_triggers.push(nt);
            }
        }
        if native_triggers.is_empty() {
            spec.refuse_here("a Sensor needs at least one trigger");
        }
        sensor.insert("triggers".into(), Value::Array(native_triggers));
    }
    t.take_notes(doc, &notes);
    if notes.refused() {
        return;
    }
    if let Some((name, src)) = bus_source {
        t.add(
            doc,
            "sources",
            &name,
            src,
            &[(vec![], vec![s("spec"), s("dependencies")])],
        );
    }
    t.add(doc, "sensors", &doc.name, Value::Object(sensor), &origins);
    for (name, value, path) in out.sinks {
        t.add(doc, "sinks", &name, value, &[(vec![], path)]);
    }
}

/// One trigger: its native sensor trigger, with its sink added to `out`.
#[allow(clippy::too_many_arguments)]
fn trigger(
    doc: &Doc,
    deps: &[String],
    path: Vec<String>,
    value: Value,
    notes: &Notes,
    types: &Triggers<'_>,
    out: &mut Out,
    top: bool,
) -> Option<Value> {
    let mut f = Fields::new(path.clone(), value, notes);
    let mut tpl = match f.obj("template") {
        Some(t) => t,
        None => {
            f.refuse_here("a trigger needs a `template`");
            return None;
        }
    };
    let Some(name) = tpl.str("name") else {
        tpl.refuse_here("a trigger template needs a `name`");
        return None;
    };
    let mut nt = Map::new();
    nt.insert("name".into(), json!(name));
    if top {
        for k in ["conditions", "conditionsReset"] {
            if let Some(v) = tpl.take(k) {
                nt.insert(k.into(), v);
            }
        }
    }
    // Argo's documentation puts `policy` on the trigger; its code reads it only there. A policy
    // placed under `template` is honoured too.
    let mut policy = f.take("policy");
    if let Some(p) = tpl.take("policy") {
        tpl.note(
            "policy",
            "honoured here too (Argo reads `policy` only next to `template`)",
        );
        policy.get_or_insert(p);
    }
    let present: Vec<String> = tpl
        .keys()
        .into_iter()
        .filter(|k| ARGO_TRIGGERS.contains(&k.as_str()) || types.contains_key(k.as_str()))
        .collect();
    let ty = match present.as_slice() {
        [one] => one.clone(),
        [] => {
            tpl.refuse_here(&format!(
                "the template names no trigger type ({})",
                ARGO_TRIGGERS.join(", ")
            ));
            return None;
        }
        many => {
            tpl.refuse_here(&format!(
                "the template names several trigger types ({}); Argo runs one",
                many.join(", ")
            ));
            return None;
        }
    };
    let Some(&(kind, map)) = types.get(ty.as_str()) else {
        let mut have: Vec<&str> = types.keys().copied().collect();
        have.sort();
        tpl.refuse(
            &ty,
            &format!(
                "trigger type `{ty}` is not supported by Sluice; it runs: {}",
                have.join(", ")
            ),
        );
        return None;
    };
    // Argo applies the trigger-level `parameters` to the trigger template itself; those that
    // write into this type's spec are handed to its mapping.
    let mut template_parameters = Vec::new();
    for (i, p) in f
        .list("parameters")
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let prefix = format!("{ty}.");
        match p["dest"].as_str().and_then(|d| d.strip_prefix(&prefix)) {
            Some(rest) => {
                let mut p = p.clone();
                p["dest"] = json!(rest);
                template_parameters.push((i, p));
            }
            None => notes.push(
                [f.path_of("parameters"), vec![i.to_string(), s("dest")]].concat(),
                NoteKind::Refused,
                format!(
                    "a trigger parameter writes into the `{ty}` spec: its dest starts with `{ty}.`"
                ),
            ),
        }
    }
    let mut ctx = TriggerCtx {
        sensor: &doc.name,
        trigger: &name,
        namespace: doc.namespace.as_deref(),
        dependencies: deps,
        payload: None,
        policy,
        template_parameters,
    };
    // `log:` with nothing after it is a trigger with no options.
    let mut kf = tpl
        .obj(&ty)
        .unwrap_or_else(|| Fields::new(tpl.path_of(&ty), Value::Null, notes));
    let kind_path = kf.path().to_vec();
    let mut sink = map(&mut ctx, &mut kf);
    drop(kf);
    for (i, _) in &ctx.template_parameters {
        notes.push(
            [f.path_of("parameters"), vec![i.to_string(), s("dest")]].concat(),
            NoteKind::Refused,
            format!("this part of a `{ty}` trigger cannot be set from an event yet"),
        );
    }
    if ctx.policy.is_some() {
        notes.push(
            f.path_of("policy"),
            NoteKind::Refused,
            format!("a policy is not supported for `{ty}` triggers"),
        );
    }
    sink["kind"] = json!(kind);
    let suffix = if top { "" } else { ".dlq" };
    let sink_name = format!("{}.{}{suffix}", doc.name, name);
    nt.insert("sink".into(), json!(sink_name));
    if let Some(p) = ctx.payload {
        nt.insert("payload".into(), Value::Array(p));
    }
    for k in ["retryStrategy", "rateLimit", "atLeastOnce"] {
        if let Some(v) = f.take(k) {
            nt.insert(k.into(), v);
        } else if let Some(v) = tpl.take(k) {
            tpl.note(
                k,
                "honoured here too (Argo reads it only next to `template`, and ignores it here)",
            );
            nt.insert(k.into(), v);
        }
    }
    if top {
        if let Some(d) = f.take("dlqTrigger") {
            let dpath = [path.clone(), vec![s("dlqTrigger")]].concat();
            if let Some(dt) = trigger(doc, deps, dpath, d, notes, types, out, false) {
                nt.insert("dlqTrigger".into(), dt);
            }
        }
    } else {
        f.refuse(
            "dlqTrigger",
            "a dead-letter trigger cannot have one of its own",
        );
    }
    out.sinks.push((sink_name, sink, kind_path));
    Some(Value::Object(nt))
}
