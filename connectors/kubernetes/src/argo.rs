//! Argo Events' `k8s` and `argoWorkflow` triggers and `resource` EventSource onto these kinds
//! (`sluice run -f`).

use serde_json::{json, Map, Value};
use sluice_core::argo::map::{argo_source, object_parameters, EventCtx, Fields, TriggerCtx};

/// Argo's artifact `source` of a trigger's object: `resource`, `inline`, `file`, `url`,
/// `configmap`.
fn object_source(f: &mut Fields, out: &mut Map<String, Value>) {
    let Some(mut src) = f.obj("source") else {
        f.refuse_here("`source` (the object to act on) is required");
        return;
    };
    if let Some(r) = src.take("resource") {
        out.insert("resource".into(), r);
    }
    if let Some(i) = src.str("inline") {
        out.insert("inline".into(), json!(i));
    }
    if let Some(mut file) = src.obj("file") {
        if let Some(p) = file.str("path") {
            out.insert("file".into(), json!(p));
        }
    }
    if let Some(mut u) = src.obj("url") {
        let mut m = Map::new();
        if let Some(p) = u.str("path") {
            m.insert("path".into(), json!(p));
        }
        if let Some(v) = u.bool("verifyCert") {
            m.insert("verifyCert".into(), json!(v));
        } else {
            u.note(
                "verifyCert",
                "Sluice verifies the server's certificate unless `verifyCert: false` (Argo's \
                 default is not to)",
            );
        }
        out.insert("url".into(), Value::Object(m));
    }
    if let Some(mut c) = src.obj("configmap") {
        let mut m = Map::new();
        for k in ["name", "key", "namespace"] {
            if let Some(v) = c.str(k) {
                m.insert(k.into(), json!(v));
            }
        }
        c.ignore("optional", "a missing config map is an error for the event");
        out.insert("configmap".into(), Value::Object(m));
    }
    src.refuse(
        "git",
        "the git object source is not supported yet: use `resource`, `file`, `url` or `configmap`",
    );
    src.refuse(
        "s3",
        "the s3 object source is not supported yet: use `resource`, `file`, `url` or `configmap`",
    );
}

/// What both triggers share: the object, its parameters, the namespace.
fn object_trigger(ctx: &mut TriggerCtx<'_>, f: &mut Fields, out: &mut Map<String, Value>) {
    object_source(f, out);
    // Trigger-level parameters that write into the object are the object's parameters.
    let outer = ctx.take_template_parameters("source.resource.");
    let inner = f.list("parameters");
    if inner.is_some() || !outer.is_empty() {
        let mut list = inner.unwrap_or_default();
        list.extend(outer);
        let params = object_parameters(ctx, list, f);
        if !params.is_empty() {
            out.insert("parameters".into(), Value::Array(params));
        }
    } else {
        // One object per trigger run, not one per dependency event: a constant payload makes
        // the sensor build one event (which also carries the sensor and trigger names).
        if let Some(dep) = ctx.dependencies.first() {
            ctx.payload = Some(vec![json!({
                "src": {"dependencyName": dep, "contextKey": "id", "value": "1"},
                "dest": "run",
            })]);
        }
    }
    if let Some(ns) = ctx.namespace {
        out.insert("namespace".into(), json!(ns));
    }
}

/// Argo's `k8s` trigger.
pub fn k8s(ctx: &mut TriggerCtx<'_>, f: &mut Fields) -> Value {
    let mut out = Map::new();
    if let Some(op) = f.str("operation") {
        out.insert("operation".into(), json!(op));
    }
    object_trigger(ctx, f, &mut out);
    if let Some(s) = f.str("patchStrategy") {
        out.insert("patchStrategy".into(), json!(s));
    }
    if let Some(l) = f.bool("liveObject") {
        out.insert("liveObject".into(), json!(l));
    }
    if let Some(p) = ctx.policy.take() {
        match p.get("k8s") {
            Some(k) => {
                out.insert("policy".into(), k.clone());
            }
            None => ctx.policy = Some(p),
        }
    }
    Value::Object(out)
}

/// Argo's `argoWorkflow` trigger.
pub fn argo_workflow(ctx: &mut TriggerCtx<'_>, f: &mut Fields) -> Value {
    let mut out = Map::new();
    if let Some(op) = f.str("operation") {
        out.insert("operation".into(), json!(op));
    }
    object_trigger(ctx, f, &mut out);
    if let Some(a) = f.strings("args") {
        f.note(
            "args",
            "extra `argo` CLI arguments: Sluice calls the API and uses none",
        );
        out.insert("args".into(), json!(a));
    }
    Value::Object(out)
}

/// Argo's `resource` EventSource.
pub fn resource(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let mut out = argo_source(ctx, f);
    for k in ["group", "version", "resource", "namespace"] {
        if let Some(v) = f.str(k) {
            out.insert(k.into(), json!(v));
        }
    }
    if let Some(t) = f.strings("eventTypes") {
        out.insert("eventTypes".into(), json!(t));
    }
    if let Some(v) = f.take("filter") {
        out.insert("filter".into(), v);
    }
    Value::Object(out)
}
