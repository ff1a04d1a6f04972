//! Argo Events' `nats` EventSource and trigger onto these kinds (`sluice run -f`).

use serde_json::{json, Map, Value};
use sluice_core::argo::map::{
    argo_source, no_source_filter, reconnects, tls_files, EventCtx, Fields, TriggerCtx,
};

/// Argo's NATS `auth`: `basic` (`username`, `password`), `token`, `nkey`, `credential`.
fn auth(f: &mut Fields, out: &mut Map<String, Value>) {
    let Some(mut a) = f.obj("auth") else { return };
    let mut m = Map::new();
    if let Some(mut b) = a.obj("basic") {
        if let Some(u) = b.secret("username") {
            m.insert("user".into(), json!(u));
        }
        if let Some(p) = b.secret("password") {
            m.insert("password".into(), json!(p));
        }
    }
    if let Some(t) = a.secret("token") {
        m.insert("token".into(), json!(t));
    }
    if let Some(n) = a.secret("nkey") {
        m.insert("nkey".into(), json!(n));
    }
    if let Some(c) = a.secret_file("credential") {
        m.insert("credentials".into(), json!(c));
    }
    out.insert("auth".into(), Value::Object(m));
}

fn connection(f: &mut Fields, out: &mut Map<String, Value>) {
    match f.str("url") {
        Some(u) => {
            out.insert("url".into(), json!(u));
        }
        None => f.refuse_here("`url` is required"),
    }
    auth(f, out);
    if let Some(t) = tls_files(f) {
        out.insert("tls".into(), t);
    }
    reconnects(f);
}

/// Argo's `nats` EventSource (core NATS).
pub fn source(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let mut out = argo_source(ctx, f);
    // `subject` is what the source subscribes to; the events' subject is `event_subject`.
    if let Some(event) = out.remove("subject") {
        out.insert("event_subject".into(), event);
    }
    connection(f, &mut out);
    match f.str("subject") {
        Some(s) => {
            out.insert("subject".into(), json!(s));
        }
        None => f.refuse_here("`subject` is required"),
    }
    if let Some(q) = f.str("queue") {
        out.insert("queue_group".into(), json!(q));
    }
    if let Some(j) = f.bool("jsonBody") {
        out.insert("json_body".into(), json!(j));
    }
    no_source_filter(f);
    Value::Object(out)
}

/// Argo's `nats` trigger: the payload published on `subject` (core NATS).
pub fn trigger(ctx: &mut TriggerCtx<'_>, f: &mut Fields) -> Value {
    let mut out = Map::new();
    connection(f, &mut out);
    match f.str("subject") {
        // The sink's subject is a template over `{…}`; Argo's is literal.
        Some(s) if !s.contains('{') => {
            out.insert("subject".into(), json!(s));
        }
        Some(_) => f.refuse_taken("subject", "a subject with `{` is not supported"),
        None => f.refuse_here("`subject` is required"),
    }
    if let Some(p) = f.list("payload") {
        ctx.payload = Some(p);
    }
    f.refuse(
        "parameters",
        "parameters that rewrite the nats trigger are not supported yet: build the message with \
         `payload`",
    );
    Value::Object(out)
}
