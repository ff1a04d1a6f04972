//! Argo Events' `email` trigger onto `kind: email` (`sluice run -f`).

use serde_json::{json, Map, Value};
use sluice_core::argo::map::{Fields, TriggerCtx};

/// Argo's `email` trigger: `host`, `port`, `username`, `smtpPassword`, `from`, `to`,
/// `subject`, `body`.
pub fn trigger(ctx: &mut TriggerCtx<'_>, f: &mut Fields) -> Value {
    let mut out = Map::new();
    match f.str("host") {
        Some(h) => {
            out.insert("host".into(), json!(h));
        }
        None => f.refuse_here("`host` is required"),
    }
    if let Some(p) = f.uint("port").filter(|p| *p != 0) {
        out.insert("port".into(), json!(p));
        if p == 465 {
            out.insert("security".into(), json!("tls"));
        }
    }
    f.note(
        "host",
        "Sluice requires STARTTLS (or TLS on port 465) and never falls back to plain text \
         (Argo uses STARTTLS only when the server offers it); `security: none` in native config \
         allows plain text",
    );
    let user = f.str("username");
    let pass = f.secret("smtpPassword");
    match (user, pass) {
        (Some(u), Some(p)) => {
            out.insert("username".into(), json!(u));
            out.insert("password".into(), json!(p));
        }
        (None, None) => {}
        _ => f.refuse_here("username and smtpPassword go together"),
    }
    for k in ["from", "subject", "body"] {
        match f.str(k) {
            // The sink's subject and body are templates over `{…}`; Argo's are literal.
            Some(v) if v.contains('{') && k != "from" => f.refuse_taken(
                k,
                "a literal `{` is not supported (Sluice reads `{name}` as an attribute): set it \
                 from the event with a trigger parameter instead",
            ),
            Some(v) => {
                out.insert(k.into(), json!(v));
            }
            None => {}
        }
    }
    let to = f.strings("to").unwrap_or_default();
    if !to.is_empty() {
        out.insert("to".into(), json!(to));
    }
    // Trigger-level parameters on `email.subject` / `email.body`: the sink takes the data
    // members `subject` and `body` over its own, so the Sensor's payload builds them.
    let mut payload = Vec::new();
    for k in ["subject", "body"] {
        payload.extend(ctx.take_template_parameter(k));
    }
    // Recipients added from the event (`email.to.-1`): the data member `to` replaces the
    // sink's list, so it starts with the configured ones.
    let added = ctx.take_template_parameters("to.");
    if !added.is_empty() {
        if let Some(dep) = ctx.dependencies.first() {
            for addr in &to {
                payload
                    .push(json!({"src": {"dependencyName": dep, "value": addr}, "dest": "to.-1"}));
            }
        }
        payload.extend(added.into_iter().map(|mut p| {
            let rest = p["dest"].as_str().unwrap_or_default().to_owned();
            p["dest"] = json!(format!("to.{rest}"));
            p
        }));
    }
    if !payload.is_empty() {
        ctx.payload = Some(payload);
    }
    f.refuse(
        "parameters",
        "parameters that rewrite the email trigger are not supported yet: the data members \
         `to`, `subject` and `body` of the event (a Sensor `payload`) set them per message",
    );
    Value::Object(out)
}
