//! Argo Events' `http` and `slack` triggers onto these sinks (`sluice run -f`).

use serde_json::{json, Map, Value};
use sluice_core::argo::map::{Fields, TriggerCtx};

fn tls(f: &mut Fields, out: &mut Map<String, Value>) {
    if let Some(t) = sluice_core::argo::map::tls_files(f) {
        out.insert("tls".into(), t);
    }
}

/// Argo's `http` trigger: `url`, `method`, `payload` (the body), `headers`, `secureHeaders`,
/// `timeout`, `tls`.
pub fn http(ctx: &mut TriggerCtx<'_>, f: &mut Fields) -> Value {
    let mut out = Map::new();
    let url = match f.str("url") {
        Some(u) => Some(u),
        None => {
            let old = f.str("serverURL");
            if old.is_some() {
                f.note(
                    "serverURL",
                    "read as `url` (its name before Argo Events 1.0)",
                );
            }
            old
        }
    };
    match url {
        Some(u) => {
            out.insert("url".into(), json!(u));
        }
        None => f.refuse_here("`url` is required"),
    }
    if let Some(m) = f.str("method") {
        out.insert("method".into(), json!(m.to_uppercase()));
    }
    if let Some(p) = f.list("payload") {
        ctx.payload = Some(p);
    } else {
        f.note(
            "payload",
            "without a payload Sluice sends each event's data (Argo sends an empty body)",
        );
    }
    let mut headers = Map::new();
    if let Some(mut h) = f.obj("headers") {
        for k in h.keys() {
            if let Some(v) = h.str(&k) {
                headers.insert(k, json!(v));
            }
        }
    }
    if let Some(list) = f.list("secureHeaders") {
        for (i, h) in list.into_iter().enumerate() {
            let mut hf = Fields::new(
                [f.path_of("secureHeaders"), vec![i.to_string()]].concat(),
                h,
                f.notes(),
            );
            let name = hf.str("name");
            let value = hf.obj("valueFrom").and_then(|mut v| {
                v.refuse(
                    "configMapKeyRef",
                    "not supported yet: use a secret (`secretKeyRef`)",
                );
                v.secret("secretKeyRef")
            });
            match (name, value) {
                (Some(n), Some(v)) => {
                    headers.insert(n, json!(v));
                }
                _ => hf.refuse_here("a secure header needs `name` and `valueFrom.secretKeyRef`"),
            }
        }
    }
    if let Some(mut b) = f.obj("basicAuth") {
        let sel = |t: Option<String>| {
            t.and_then(|t| {
                t.strip_prefix("${secret:")
                    .and_then(|t| t.strip_suffix('}'))
                    .map(str::to_owned)
            })
        };
        match (sel(b.secret("username")), sel(b.secret("password"))) {
            (Some(u), Some(p)) => {
                // `Basic base64(user:password)`, made when the config is read.
                headers.insert(
                    "authorization".into(),
                    json!(format!("${{secret-basic:{u},{p}}}")),
                );
            }
            _ => b.refuse_here("basicAuth needs `username` and `password` secrets"),
        }
    }
    if !headers.is_empty() {
        out.insert("headers".into(), Value::Object(headers));
    }
    // Argo's default is 60 s.
    let t = f.uint("timeout").unwrap_or(60);
    out.insert("timeout".into(), json!(format!("{t}s")));
    tls(f, &mut out);
    // Argo's `policy.status.allow`: the statuses that count as success.
    if let Some(p) = ctx.policy.take() {
        match p.pointer("/status/allow") {
            Some(allow) if p.as_object().is_some_and(|m| m.len() == 1) => {
                out.insert("success_codes".into(), allow.clone());
            }
            _ => ctx.policy = Some(p),
        }
    } else {
        f.note(
            "url",
            "without `policy.status.allow` Sluice counts only 2xx as success (Argo counts any \
             answer, 5xx included)",
        );
    }
    f.refuse(
        "parameters",
        "parameters that rewrite the http trigger itself (its url, method) are not supported: \
         build the body with `payload`",
    );
    f.refuse("dynamicHeaders", "not supported yet");
    Value::Object(out)
}

/// Argo's `slack` trigger: `slackToken`, `channel`, `message`, `attachments`, `blocks`,
/// `thread`, `sender`.
pub fn slack(ctx: &mut TriggerCtx<'_>, f: &mut Fields) -> Value {
    let mut out = Map::new();
    match f.secret("slackToken") {
        Some(t) => {
            out.insert("token".into(), json!(t));
        }
        None => f.refuse_here("`slackToken` is required"),
    }
    for (from, to) in [
        ("channel", "channel"),
        ("message", "message"),
        ("attachments", "attachments"),
        ("blocks", "blocks"),
    ] {
        match f.str(from) {
            // The sink's channel and message are templates over `{…}`; Argo's are literal.
            Some(v) if v.contains('{') && (from == "channel" || from == "message") => f
                .refuse_taken(
                    from,
                    "a literal `{` is not supported (Sluice reads `{name}` as an attribute): \
                     build the text with the Sensor's payload (`text`)",
                ),
            Some(v) => {
                out.insert(to.into(), json!(v));
            }
            None => {}
        }
    }
    if let Some(mut t) = f.obj("thread") {
        let mut m = Map::new();
        match t.str("messageAggregationKey") {
            Some(k) if k.contains('{') => t.refuse_taken(
                "messageAggregationKey",
                "a literal `{` is not supported (Sluice reads `{name}` as an attribute)",
            ),
            Some(k) => {
                m.insert("aggregation_key".into(), json!(k));
            }
            None => {}
        }
        if let Some(b) = t.bool("broadcastMessageToChannel") {
            m.insert("broadcast".into(), json!(b));
        }
        out.insert("thread".into(), Value::Object(m));
    }
    if let Some(mut s) = f.obj("sender") {
        let mut m = Map::new();
        for k in ["username", "icon"] {
            if let Some(v) = s.str(k) {
                m.insert(k.into(), json!(v));
            }
        }
        out.insert("sender".into(), Value::Object(m));
    }
    // Trigger-level parameters on `slack.channel` / `slack.message`: the sink takes the data
    // members `channel` and `text` over its own, so the Sensor's payload builds them.
    let mut payload = ctx.take_template_parameter("channel");
    for mut p in ctx.take_template_parameter("message") {
        p["dest"] = json!("text");
        payload.push(p);
    }
    if !payload.is_empty() {
        ctx.payload = Some(payload);
    }
    f.refuse(
        "parameters",
        "parameters that rewrite the slack trigger are not supported yet: use templates over \
         the event in `channel` and `message`",
    );
    Value::Object(out)
}
