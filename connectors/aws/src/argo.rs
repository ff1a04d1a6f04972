//! Argo Events' `sqs` EventSource and `awsLambda` trigger onto these kinds (`sluice run -f`).

use serde_json::{json, Map, Value};
use sluice_core::argo::map::{argo_source, no_source_filter, EventCtx, Fields, TriggerCtx};

/// Argo's AWS connection fields: `region`, `endpoint`, `accessKey`/`secretKey`/`sessionToken`
/// (secrets), `roleARN`.
fn connection(f: &mut Fields, out: &mut Map<String, Value>) {
    for (from, to) in [("region", "region"), ("endpoint", "endpoint")] {
        if let Some(v) = f.str(from) {
            out.insert(to.into(), json!(v));
        }
    }
    let key = f.secret("accessKey");
    let secret = f.secret("secretKey");
    let token = f.secret("sessionToken");
    match (key, secret) {
        (Some(k), Some(s)) => {
            let mut c = json!({"access_key_id": k, "secret_access_key": s});
            if let Some(t) = token {
                c["session_token"] = json!(t);
            }
            out.insert("credentials".into(), c);
        }
        (None, None) => {}
        _ => f.refuse_here("accessKey and secretKey go together"),
    }
    if let Some(r) = f.str("roleARN") {
        out.insert("assume_role".into(), json!({ "role_arn": r }));
    }
}

/// Argo's `sqs` EventSource.
pub fn sqs(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let mut out = argo_source(ctx, f);
    connection(f, &mut out);
    let queue = f.str("queue");
    let account = f.str("queueAccountId");
    match (queue, account, out.get("region").and_then(Value::as_str)) {
        (Some(q), Some(a), Some(r)) => {
            out.insert("queue".into(), json!(format!("arn:aws:sqs:{r}:{a}:{q}")));
        }
        (Some(_), Some(_), None) => {
            f.refuse_here("queueAccountId needs `region` (Sluice names the queue by its ARN)")
        }
        (Some(q), None, _) => {
            out.insert("queue".into(), json!(q));
        }
        (None, ..) => f.refuse_here("`queue` is required"),
    }
    if let Some(w) = f.uint("waitTimeSeconds") {
        // Argo turns 0 into 3; Sluice's long poll is 1 to 20 s.
        let w = if w == 0 { 3 } else { w.min(20) };
        out.insert("wait_time".into(), json!(format!("{w}s")));
    }
    if let Some(j) = f.bool("jsonBody") {
        out.insert("json_body".into(), json!(j));
    }
    if let Some(d) = f.bool("dlq") {
        if d {
            f.note(
                "dlq",
                "a message Sluice cannot turn into an event stays on the queue for its redrive \
                 policy (as Argo's `dlq: true`)",
            );
        }
    }
    f.ignore("sessionToken", "read together with accessKey and secretKey");
    no_source_filter(f);
    Value::Object(out)
}

/// Argo's `awsLambda` trigger.
pub fn lambda(ctx: &mut TriggerCtx<'_>, f: &mut Fields) -> Value {
    let mut out = Map::new();
    connection(f, &mut out);
    match f.str("functionName") {
        Some(n) => {
            out.insert("function_name".into(), json!(n));
        }
        None => f.refuse_here("`functionName` is required"),
    }
    if let Some(i) = f.str("invocationType") {
        if i == "DryRun" {
            f.refuse_here("invocationType DryRun is not supported: it invokes nothing");
        } else {
            out.insert("invocation_type".into(), json!(i));
        }
    }
    if let Some(p) = f.list("payload") {
        ctx.payload = Some(p);
    }
    f.refuse(
        "parameters",
        "parameters that rewrite the awsLambda trigger are not supported yet: build the \
         request with `payload`",
    );
    Value::Object(out)
}

/// Argo's `sns` EventSource: the HTTPS endpoint SNS posts to.
pub fn sns(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let mut out = argo_source(ctx, f);
    match f.obj("webhook") {
        Some(mut w) => {
            match w.str("port") {
                Some(p) if p.parse::<u16>().is_ok() => {
                    out.insert("listen".into(), json!(format!("0.0.0.0:{p}")));
                }
                _ => w.refuse_here("`port` is required (a port number)"),
            }
            if let Some(e) = w.str("endpoint") {
                let e = if e.starts_with('/') {
                    e
                } else {
                    format!("/{e}")
                };
                out.insert("path".into(), json!(e));
            }
            w.ignore("method", "SNS posts; Sluice accepts POST");
            w.ignore(
                "url",
                "Sluice does not call SNS Subscribe: subscribe this endpoint to the topic \
                 yourself; Sluice confirms the subscription when SNS asks",
            );
            let (c, k) = (
                w.secret_file("serverCertSecret"),
                w.secret_file("serverKeySecret"),
            );
            match (c, k) {
                (Some(c), Some(k)) => {
                    out.insert("tls".into(), json!({"cert": c, "key": k}));
                }
                (None, None) => {}
                _ => w.refuse_here("serverCertSecret and serverKeySecret go together"),
            }
        }
        None => f.refuse_here("`webhook` (port and endpoint) is required"),
    }
    match f.str("topicArn") {
        Some(t) => {
            out.insert("topic_arns".into(), json!([t]));
        }
        None => f.refuse_here("`topicArn` is required"),
    }
    if f.bool("validateSignature") == Some(false) {
        f.note("validateSignature", "Sluice always verifies SNS signatures");
    }
    for k in [
        "region",
        "accessKey",
        "secretKey",
        "sessionToken",
        "roleARN",
        "endpoint",
    ] {
        f.ignore(
            k,
            "used by Argo to call SNS Subscribe; Sluice only receives and confirms",
        );
    }
    no_source_filter(f);
    Value::Object(out)
}
