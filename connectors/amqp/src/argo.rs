//! Argo Events' `amqp` EventSource onto `kind: amqp` (`sluice run -f`).

use serde_json::{json, Map, Value};
use sluice_core::argo::map::{
    argo_source, no_source_filter, reconnects, tls_files, EventCtx, Fields,
};

/// Argo's `amqp` EventSource: an exchange (declared), a queue bound to it with `routingKey`
/// (declared; Argo's default is a server-named exclusive queue, Sluice names it after the
/// event), consumed with acknowledgements after delivery.
pub fn source(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let mut out = argo_source(ctx, f);
    let url = match (f.str("url"), f.secret("urlSecret")) {
        (Some(u), _) | (None, Some(u)) => Some(u),
        (None, None) => {
            f.refuse_here("`url` or `urlSecret` is required");
            None
        }
    };
    let mut creds = None;
    if let Some(mut a) = f.obj("auth") {
        // Percent-encoded: a password with `@`, `:` or `/` must not end the URL's userinfo.
        match (a.secret("username"), a.secret("password")) {
            (Some(u), Some(p)) => {
                creds = Some(format!(
                    "{}:{}",
                    u.replacen("${secret:", "${secret-url:", 1),
                    p.replacen("${secret:", "${secret-url:", 1)
                ))
            }
            _ => a.refuse_here("`auth` needs `username` and `password`"),
        }
    }
    if let Some(u) = url {
        let u = match (creds, u.split_once("://")) {
            (Some(c), Some((scheme, rest))) if !rest.contains('@') => {
                format!("{scheme}://{c}@{rest}")
            }
            (Some(_), _) => {
                f.refuse_taken(
                    "auth",
                    "cannot be combined with a url that carries credentials, comes from \
                     `urlSecret` or has no scheme",
                );
                u
            }
            (None, _) => u,
        };
        out.insert("url".into(), json!(u));
    }
    if let Some(t) = tls_files(f) {
        out.insert("tls".into(), t);
    }
    let exchange = f.str("exchangeName");
    let kind = f.str("exchangeType").unwrap_or_else(|| "topic".into());
    let routing_key = f.str("routingKey").unwrap_or_default();
    let mut declare = Map::new();
    if let Some(name) = &exchange {
        let mut ex = json!({"name": name, "type": kind, "durable": true, "auto_delete": false});
        if let Some(mut d) = f.obj("exchangeDeclare") {
            if let Some(v) = d.bool("durable") {
                ex["durable"] = json!(v);
            }
            if let Some(v) = d.bool("autoDelete") {
                ex["auto_delete"] = json!(v);
            }
            if d.bool("internal") == Some(true) {
                d.refuse_here("an internal exchange is not supported");
            }
            d.ignore("noWait", "declarations always wait for the broker's answer");
        }
        declare.insert("exchanges".into(), json!([ex]));
        declare.insert(
            "bindings".into(),
            json!([{"exchange": name, "routing_key": routing_key}]),
        );
    } else {
        f.refuse_here("`exchangeName` is required");
    }
    let mut queue = json!({"durable": false, "exclusive": true, "auto_delete": false});
    let mut qname = None;
    if let Some(mut q) = f.obj("queueDeclare") {
        qname = q.str("name").filter(|n| !n.is_empty());
        for (from, to) in [
            ("durable", "durable"),
            ("exclusive", "exclusive"),
            ("autoDelete", "auto_delete"),
        ] {
            if let Some(v) = q.bool(from) {
                queue[to] = json!(v);
            }
        }
        q.ignore("noWait", "declarations always wait for the broker's answer");
        if q.str("arguments").is_some_and(|a| !a.trim().is_empty()) {
            q.refuse_here("queue `arguments` are not supported yet");
        }
    }
    let qname = qname.unwrap_or_else(|| {
        f.note(
            "queueDeclare",
            "Argo lets the broker name the queue; Sluice names it after the event",
        );
        format!("argo-{}-{}", ctx.event_source, ctx.event)
    });
    out.insert("queue".into(), json!(qname));
    declare.insert("queue".into(), queue);
    out.insert("declare".into(), Value::Object(declare));
    if let Some(mut b) = f.obj("queueBind") {
        b.ignore("noWait", "declarations always wait for the broker's answer");
    }
    if let Some(mut c) = f.obj("consume") {
        if let Some(t) = c.str("consumerTag") {
            out.insert("consumer_tag".into(), json!(t));
        }
        if let Some(e) = c.bool("exclusive") {
            out.insert("exclusive".into(), json!(e));
        }
        c.ignore(
            "autoAck",
            "Sluice acknowledges each message after its event was delivered",
        );
        c.ignore("noLocal", "RabbitMQ does not implement it");
        c.ignore(
            "noWait",
            "the consumer always waits for the broker's answer",
        );
    }
    if let Some(j) = f.bool("jsonBody") {
        out.insert("json_body".into(), json!(j));
    }
    reconnects(f);
    no_source_filter(f);
    Value::Object(out)
}
