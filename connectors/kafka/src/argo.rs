//! Argo Events' `kafka` EventSource and trigger onto these kinds (`sluice run -f`).

use serde_json::{json, Map, Value};
use sluice_core::argo::map::{
    argo_source, no_source_filter, reconnects, EventCtx, Fields, TriggerCtx,
};

/// Argo's `tls` and `sasl` blocks as librdkafka properties.
fn security(f: &mut Fields) -> Map<String, Value> {
    let mut props = Map::new();
    let mut ssl = false;
    if let Some(mut t) = f.obj("tls") {
        ssl = true;
        for (from, to) in [
            ("caCertSecret", "ssl.ca.location"),
            ("clientCertSecret", "ssl.certificate.location"),
            ("clientKeySecret", "ssl.key.location"),
        ] {
            if let Some(v) = t.secret_file(from) {
                props.insert(to.into(), json!(v));
            }
        }
        t.refuse(
            "insecureSkipVerify",
            "Sluice always verifies the broker's certificate: trust its CA with `caCertSecret`",
        );
        t.ignore("enabled", "TLS is on when the block is given");
    }
    let mut sasl = false;
    if let Some(mut s) = f.obj("sasl") {
        sasl = true;
        let mech = s.str("mechanism").unwrap_or_else(|| "PLAIN".into());
        if mech == "OAUTHBEARER" || mech == "GSSAPI" {
            s.refuse_here(&format!("SASL mechanism {mech} is not supported yet"));
        }
        props.insert("sasl.mechanism".into(), json!(mech));
        if let Some(u) = s.secret("userSecret") {
            props.insert("sasl.username".into(), json!(u));
        }
        if let Some(p) = s.secret("passwordSecret") {
            props.insert("sasl.password".into(), json!(p));
        }
    }
    let protocol = match (ssl, sasl) {
        (false, false) => None,
        (true, false) => Some("ssl"),
        (false, true) => Some("sasl_plaintext"),
        (true, true) => Some("sasl_ssl"),
    };
    if let Some(p) = protocol {
        props.insert("security.protocol".into(), json!(p));
    }
    f.ignore(
        "version",
        "librdkafka negotiates the protocol version with the brokers",
    );
    f.refuse(
        "schemaRegistry",
        "Avro through a schema registry is not supported yet",
    );
    f.refuse(
        "awsMskIamAuth",
        "MSK IAM authentication is not supported yet",
    );
    props
}

/// Argo's `kafka` EventSource.
pub fn source(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let mut out = argo_source(ctx, f);
    match f.str("url") {
        Some(u) => {
            out.insert("brokers".into(), json!(u));
        }
        None => f.refuse_here("`url` (the brokers) is required"),
    }
    match f.str("topic") {
        Some(t) => {
            out.insert("topics".into(), json!([t]));
        }
        None => f.refuse_here("`topic` is required"),
    }
    let mut group = None;
    let mut oldest = false;
    if let Some(mut g) = f.obj("consumerGroup") {
        group = g.str("groupName");
        oldest = g.bool("oldest") == Some(true);
        g.ignore(
            "rebalanceStrategy",
            "Sluice's consumer uses cooperative-sticky rebalancing",
        );
    }
    let group = group.unwrap_or_else(|| {
        f.note(
            "topic",
            "without consumerGroup Argo reads one partition with no group; Sluice always reads \
             every partition in a consumer group, named after the event",
        );
        format!("{}.{}", ctx.event_source, ctx.event)
    });
    out.insert("group".into(), json!(group));
    f.ignore(
        "partition",
        "Sluice reads every partition of the topic, in a consumer group",
    );
    if let Some(j) = f.bool("jsonBody") {
        out.insert("json_body".into(), json!(j));
    }
    f.refuse(
        "limitEventsPerSecond",
        "not supported yet: the pipeline's backpressure bounds the rate instead",
    );
    f.refuse(
        "config",
        "a sarama config is not supported: give librdkafka properties in native config",
    );
    let mut props = security(f);
    if !oldest {
        // Argo's default: a partition without a committed offset starts at the newest record.
        props.insert("auto.offset.reset".into(), json!("latest"));
    }
    out.insert("properties".into(), Value::Object(props));
    reconnects(f);
    no_source_filter(f);
    Value::Object(out)
}

/// Argo's `kafka` trigger.
pub fn trigger(ctx: &mut TriggerCtx<'_>, f: &mut Fields) -> Value {
    let mut out = Map::new();
    match f.str("url") {
        Some(u) => {
            out.insert("brokers".into(), json!(u));
        }
        None => f.refuse_here("`url` (the brokers) is required"),
    }
    match f.str("topic") {
        Some(t) if !t.contains('{') => {
            out.insert("topic".into(), json!(t));
        }
        Some(_) => f.refuse_taken("topic", "a topic with `{` is not supported"),
        None => f.refuse_here("`topic` is required"),
    }
    match f.str("partitioningKey") {
        Some(k) if !k.contains('{') => {
            out.insert("key".into(), json!(k));
        }
        Some(_) => f.refuse_taken("partitioningKey", "a key with `{` is not supported"),
        None => {}
    }
    if f.bool("compress") == Some(true) {
        out.insert("compression".into(), json!("snappy"));
    }
    f.ignore(
        "requiredAcks",
        "Sluice's producer is idempotent with acks=all and counts a record delivered on its \
         delivery report",
    );
    f.ignore("flushFrequency", "librdkafka batches by itself (linger.ms)");
    f.ignore(
        "partition",
        "deprecated in Argo; the key picks the partition",
    );
    if let Some(p) = f.list("payload") {
        ctx.payload = Some(p);
    }
    f.refuse("headers", "static record headers are not supported yet");
    f.refuse(
        "secureHeaders",
        "static record headers are not supported yet",
    );
    f.refuse(
        "parameters",
        "parameters that rewrite the kafka trigger are not supported yet: build the record with \
         `payload`",
    );
    let props = security(f);
    if !props.is_empty() {
        out.insert("properties".into(), Value::Object(props));
    }
    reconnects(f);
    Value::Object(out)
}
