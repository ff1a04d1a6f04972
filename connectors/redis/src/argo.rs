//! Argo Events' `redis` and `redisStream` EventSources onto `kind: redis` and
//! `kind: redis-streams` (`sluice run -f`).

use serde_json::{json, Map, Value};
use sluice_core::argo::map::{argo_source, no_source_filter, tls_files, EventCtx, Fields};

/// Argo's `hostAddress`, `username`, `password` (a secret), `db` and `tls` as a Redis URL.
fn connection(f: &mut Fields, out: &mut Map<String, Value>) {
    let tls = tls_files(f);
    let host = f.str("hostAddress");
    let user = f.str("username");
    let pass = f.secret("password");
    let db = f.uint("db");
    let Some(host) = host else {
        f.refuse_here("`hostAddress` is required");
        return;
    };
    let scheme = if tls.is_some() { "rediss" } else { "redis" };
    // Percent-encoded: a password with `@`, `:` or `/` must not end the URL's userinfo.
    let pass = pass.map(|p| p.replacen("${secret:", "${secret-url:", 1));
    let auth = match (user, pass) {
        (Some(u), Some(p)) => format!("{u}:{p}@"),
        (None, Some(p)) => format!(":{p}@"),
        (Some(u), None) => format!("{u}@"),
        (None, None) => String::new(),
    };
    let db = db.map(|d| format!("/{d}")).unwrap_or_default();
    out.insert("url".into(), json!(format!("{scheme}://{auth}{host}{db}")));
    if let Some(t) = tls {
        out.insert("tls".into(), t);
    }
    f.ignore(
        "namespace",
        "the Kubernetes namespace of the password secret; Sluice reads secrets from \
         --secrets-dir or the environment",
    );
}

/// Argo's `redis` EventSource (Pub/Sub channels).
pub fn pubsub(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let mut out = argo_source(ctx, f);
    connection(f, &mut out);
    match f.strings("channels") {
        Some(c) if !c.is_empty() => {
            out.insert("channels".into(), json!(c));
        }
        _ => f.refuse_here("`channels` is required"),
    }
    if let Some(j) = f.bool("jsonBody") {
        out.insert("json_body".into(), json!(j));
    }
    no_source_filter(f);
    Value::Object(out)
}

/// Argo's `redisStream` EventSource (a consumer group over streams).
pub fn streams(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let mut out = argo_source(ctx, f);
    connection(f, &mut out);
    match f.strings("streams") {
        Some(s) if !s.is_empty() => {
            out.insert("streams".into(), json!(s));
        }
        _ => f.refuse_here("`streams` is required"),
    }
    let group = f
        .str("consumerGroup")
        .unwrap_or_else(|| "argo-events-cg".into());
    out.insert("group".into(), json!(group));
    // Argo creates its group at `$`: only entries added afterwards.
    out.insert("start".into(), json!("new"));
    f.ignore(
        "maxMsgCountPerRead",
        "Sluice reads as many entries as its in-flight window has room for",
    );
    no_source_filter(f);
    Value::Object(out)
}
