//! Argo Events' `pubSub` EventSource onto `kind: pubsub` (`sluice run -f`).

use serde_json::{json, Value};
use sluice_core::argo::map::{argo_source, no_source_filter, EventCtx, Fields};

/// Argo's `pubSub` EventSource: `projectID`, `topic`, `subscriptionID`, `credentialSecret`,
/// `jsonBody`.
pub fn source(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let mut out = argo_source(ctx, f);
    let project = f.str("projectID");
    match &project {
        Some(p) => {
            out.insert("project".into(), json!(p));
        }
        None => f.refuse_here(
            "`projectID` is required (Sluice does not read it from the metadata server yet)",
        ),
    }
    if let Some(tp) = f.str("topicProjectID") {
        if Some(&tp) != project.as_ref() {
            f.refuse_taken(
                "topicProjectID",
                "a topic in another project is not supported yet",
            );
        }
    }
    if let Some(t) = f.str("topic") {
        out.insert("topic".into(), json!(t));
    }
    let sub = f.str("subscriptionID").unwrap_or_else(|| {
        f.note(
            "topic",
            "without subscriptionID Argo names the subscription after a hash of the spec (a \
             changed spec loses messages); Sluice names it after the event",
        );
        format!("{}-{}", ctx.event_source, ctx.event)
    });
    out.insert("subscription".into(), json!(sub));
    if let Some(c) = f.secret_file("credentialSecret") {
        out.insert("credentials_file".into(), json!(c));
    }
    if f.bool("deleteSubscriptionOnFinish") == Some(true) {
        f.note(
            "deleteSubscriptionOnFinish",
            "Sluice keeps the subscription when it stops, so nothing published meanwhile is lost",
        );
    }
    if let Some(j) = f.bool("jsonBody") {
        out.insert("json_body".into(), json!(j));
    }
    no_source_filter(f);
    Value::Object(out)
}
