//! Argo Events' `mqtt` EventSource onto `kind: mqtt` (`sluice run -f`).

use serde_json::{json, Value};
use sluice_core::argo::map::{
    argo_source, no_source_filter, reconnects, tls_files, EventCtx, Fields,
};

/// Argo's `mqtt` EventSource: `url`, `topic`, `clientId`, `auth`, `tls`, `jsonBody`.
pub fn source(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let mut out = argo_source(ctx, f);
    let tls = tls_files(f);
    match f.str("url") {
        Some(u) => {
            // With a tls block the connection is TLS whatever the scheme says (Argo's client
            // decides by the block).
            let u = match (&tls, u.split_once("://")) {
                (Some(_), Some(("tcp" | "mqtt", rest))) => format!("mqtts://{rest}"),
                _ => u,
            };
            out.insert("url".into(), json!(u));
        }
        None => f.refuse_here("`url` is required"),
    }
    if let Some(t) = tls {
        out.insert("tls".into(), t);
    }
    match f.str("topic") {
        Some(t) => {
            out.insert("topics".into(), json!([t]));
        }
        None => f.refuse_here("`topic` is required"),
    }
    if let Some(c) = f.str("clientId") {
        out.insert("client_id".into(), json!(c));
    }
    f.note(
        "topic",
        "Sluice subscribes with QoS 1 and acknowledges after delivery (Argo: QoS 0, at most once)",
    );
    if let Some(mut a) = f.obj("auth") {
        let user = a.secret("username");
        let pass = a.secret("password");
        match user {
            Some(u) => {
                out.insert(
                    "auth".into(),
                    json!({"username": u, "password": pass.unwrap_or_default()}),
                );
            }
            None => a.refuse_here("`auth` needs `username`"),
        }
    }
    if let Some(j) = f.bool("jsonBody") {
        out.insert("json_body".into(), json!(j));
    }
    reconnects(f);
    no_source_filter(f);
    Value::Object(out)
}
