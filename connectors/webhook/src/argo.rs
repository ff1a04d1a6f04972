//! Argo Events' webhook-style EventSource types onto these kinds (`sluice run -f`): `webhook`,
//! `github`, `gitlab`, `bitbucket`, `bitbucketserver`. Each emits Argo's event shape
//! (`format: argo`) with the EventSource's name as `source` and the event's as `subject`.

use serde_json::{json, Map, Value};
use sluice_core::argo::map::{argo_source, EventCtx, Fields};

/// Argo's webhook server options (`port`, `endpoint`, `method`, `maxPayloadSize`, TLS secrets,
/// `url`) onto the listener's options.
fn server(f: &mut Fields, out: &mut Map<String, Value>, plain: bool) {
    match f.str("port") {
        Some(p) if p.parse::<u16>().is_ok() => {
            out.insert("listen".into(), json!(format!("0.0.0.0:{p}")));
        }
        Some(p) => f.refuse_here(&format!("port: {p:?} is not a port number")),
        None => f.refuse_here("`port` is required (the port the webhook listens on)"),
    }
    match f.str("endpoint") {
        Some(e) if e.starts_with('/') => {
            out.insert("path".into(), json!(e));
        }
        Some(e) => {
            out.insert("path".into(), json!(format!("/{e}")));
        }
        None => f.refuse_here("`endpoint` is required (the request path)"),
    }
    if let Some(m) = f.str("method") {
        if plain {
            out.insert("methods".into(), json!([m.to_uppercase()]));
        } else if !m.eq_ignore_ascii_case("POST") {
            f.note(
                "method",
                "providers post their webhooks: Sluice accepts POST only",
            );
        }
    }
    if let Some(n) = f.uint("maxPayloadSize") {
        out.insert("max_body".into(), json!(n));
    }
    let (cert, key) = (
        f.secret_file("serverCertSecret"),
        f.secret_file("serverKeySecret"),
    );
    match (cert, key) {
        (Some(c), Some(k)) => {
            out.insert("tls".into(), json!({ "cert": c, "key": k }));
        }
        (None, None) => {}
        _ => f.refuse_here("serverCertSecret and serverKeySecret go together"),
    }
    f.ignore(
        "url",
        "the public URL is only used by Argo to register hooks; Sluice registers none",
    );
}

/// Argo's `webhook` EventSource.
pub fn webhook(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let mut out = argo_source(ctx, f);
    server(f, &mut out, true);
    if let Some(token) = f.secret("authSecret") {
        out.insert("auth".into(), json!({ "bearer": [token] }));
    }
    f.refuse(
        "filter",
        "a source-side filter is not supported yet: move the expression into the Sensor's \
         dependency filters (`filters.exprs`)",
    );
    Value::Object(out)
}

/// The options of Argo's git-provider types that only serve to register the hook through the
/// provider's API: Sluice registers none.
fn no_hook_registration(f: &mut Fields, keys: &[&str]) {
    for k in keys {
        f.ignore(
            k,
            "Sluice does not register the hook through the provider's API: create it yourself, \
             pointing at this source's listen address and path",
        );
    }
}

fn provider(ctx: &EventCtx<'_>, f: &mut Fields, secret_key: &str, hook_keys: &[&str]) -> Value {
    let mut out = argo_source(ctx, f);
    match f.obj("webhook") {
        Some(mut w) => server(&mut w, &mut out, false),
        None => f.refuse_here("`webhook` (port and endpoint) is required"),
    }
    if let Some(s) = f.secret(secret_key) {
        out.insert("secrets".into(), json!([s]));
    }
    if let Some(ev) = f.strings("events") {
        out.insert("events".into(), json!(ev));
    }
    no_hook_registration(f, hook_keys);
    f.refuse(
        "filter",
        "a source-side filter is not supported yet: move the expression into the Sensor's \
         dependency filters (`filters.exprs`)",
    );
    Value::Object(out)
}

/// Argo's `github` EventSource.
pub fn github(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let v = provider(
        ctx,
        f,
        "webhookSecret",
        &[
            "repositories",
            "organizations",
            "owner",
            "repository",
            "id",
            "apiToken",
            "githubApp",
            "insecure",
            "active",
            "contentType",
            "githubBaseURL",
            "githubUploadURL",
            "deleteHookOnFinish",
        ],
    );
    if v.get("secrets").is_none() {
        f.refuse_here(
            "Sluice verifies X-Hub-Signature-256: give the hook's secret with `webhookSecret`",
        );
    }
    v
}

/// Argo's `gitlab` EventSource.
pub fn gitlab(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let mut v = provider(
        ctx,
        f,
        "secretToken",
        &[
            "projects",
            "projectID",
            "groups",
            "accessToken",
            "gitlabBaseURL",
            "enableSSLVerification",
            "deleteHookOnFinish",
        ],
    );
    // Argo's `events` are hook options (`PushEvents`); Sluice's are X-Gitlab-Event names. An
    // option without a known header is refused: leaving it out would narrow the filter, and an
    // empty list would mean every event.
    if let Some(ev) = v.as_object_mut().and_then(|m| m.remove("events")) {
        let mut names = Vec::new();
        for (i, o) in ev.as_array().into_iter().flatten().enumerate() {
            match o.as_str().and_then(gitlab_event) {
                Some(h) => names.push(json!(h)),
                None => f.refuse_taken(
                    &format!("events.{i}"),
                    &format!("GitLab hook option {o} has no known X-Gitlab-Event header"),
                ),
            }
        }
        v["events"] = Value::Array(names);
    }
    v
}

/// A GitLab hook option (`PushEvents`) as the `X-Gitlab-Event` header it sends.
fn gitlab_event(option: &str) -> Option<&'static str> {
    Some(match option {
        "PushEvents" => "Push Hook",
        "TagPushEvents" => "Tag Push Hook",
        "IssuesEvents" => "Issue Hook",
        "ConfidentialIssuesEvents" => "Confidential Issue Hook",
        "NoteEvents" => "Note Hook",
        "ConfidentialNoteEvents" => "Confidential Note Hook",
        "MergeRequestsEvents" => "Merge Request Hook",
        "JobEvents" => "Job Hook",
        "PipelineEvents" => "Pipeline Hook",
        "WikiPageEvents" => "Wiki Page Hook",
        "DeploymentEvents" => "Deployment Hook",
        "ReleasesEvents" => "Release Hook",
        "EmojiEvents" => "Emoji Hook",
        "FeatureFlagEvents" => "Feature Flag Hook",
        "MemberEvents" => "Member Hook",
        "SubGroupEvents" => "Subgroup Hook",
        _ => return None,
    })
}

/// Argo's `bitbucket` (Cloud) EventSource.
pub fn bitbucket(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    provider(
        ctx,
        f,
        "webhookSecret",
        &[
            "auth",
            "repositories",
            "owner",
            "projectKey",
            "repositorySlug",
            "deleteHookOnFinish",
        ],
    )
}

/// Argo's `bitbucketserver` EventSource.
pub fn bitbucketserver(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let v = provider(
        ctx,
        f,
        "webhookSecret",
        &[
            "repositories",
            "projectKey",
            "repositorySlug",
            "projects",
            "accessToken",
            "bitbucketserverBaseURL",
            "deleteHookOnFinish",
            "tls",
            "checkInterval",
        ],
    );
    f.refuse(
        "oneEventPerChange",
        "not supported yet: Sluice emits one event per webhook request",
    );
    f.refuse("skipBranchRefsChangedOnOpenPR", "not supported yet");
    if v.get("secrets").is_none() {
        f.refuse_here(
            "Sluice verifies X-Hub-Signature: give the hook's secret with `webhookSecret`",
        );
    }
    v
}

/// Argo's `slack` EventSource.
pub fn slack(ctx: &EventCtx<'_>, f: &mut Fields) -> Value {
    let v = provider(ctx, f, "signingSecret", &[]);
    f.ignore(
        "token",
        "Slack's verification token is deprecated; Sluice verifies the signing secret",
    );
    if v.get("secrets").is_none() {
        f.refuse_here("Sluice verifies X-Slack-Signature: give the app's `signingSecret`");
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::argo::map::{NoteKind, Notes};

    #[test]
    fn argo_webhook_maps_onto_the_webhook_kind() {
        let notes = Notes::default();
        let ctx = EventCtx {
            event_source: "webhook",
            event: "example",
            namespace: None,
        };
        let mut f = Fields::new(
            vec!["spec".into(), "webhook".into(), "example".into()],
            json!({"port": "12000", "endpoint": "/example", "method": "POST",
                   "authSecret": {"name": "tok", "key": "t"}, "url": "http://x"}),
            &notes,
        );
        let v = webhook(&ctx, &mut f);
        drop(f);
        assert_eq!(
            v,
            json!({"format": "argo", "source": "webhook", "subject": "example",
                   "listen": "0.0.0.0:12000", "path": "/example", "methods": ["POST"],
                   "auth": {"bearer": ["${secret:tok/t}"]}})
        );
        let n = notes.take();
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].kind, NoteKind::Noted);
    }

    #[test]
    fn a_filter_is_refused_with_what_to_do() {
        let notes = Notes::default();
        let ctx = EventCtx {
            event_source: "w",
            event: "e",
            namespace: None,
        };
        let mut f = Fields::new(
            vec![],
            json!({"port": "1", "endpoint": "/", "filter": {"expression": "x"}}),
            &notes,
        );
        webhook(&ctx, &mut f);
        drop(f);
        let n = notes.take();
        assert_eq!(n[0].path, vec!["filter"]);
        assert!(n[0].msg.contains("filters.exprs"));
    }
}
