//! `kind: gitlab` — `X-Gitlab-Token` compared in constant time (GitLab has no body signature),
//! or GitLab's signing token where it is sent (Standard Webhooks headers); events named after
//! the CloudEvents GitLab adapter (`cloudevents/spec`, `adapters/gitlab.md`), but with a stable
//! id: `Idempotency-Key`, else `X-Gitlab-Event-UUID`, else a hash of the body.

use http::HeaderMap;

use super::standard::{secret_key, Verifier};
use super::{
    first, header_400, json_event, single, token_matches, Doc, EventFilter, Keys, Naming, Provider,
    Refusal, Request, Secret, Verdict,
};
use crate::Format;
use sluice_core::units::HumanDuration;

provider_config! {
    /// `kind: gitlab` options.
    GitlabConfig, "gitlab", "/gitlab", "gitlab", 1 {
        /// Accepted `X-Gitlab-Token` values (the hook's "Secret token"); any may match.
        #[serde(default)]
        secrets: Vec<Secret>,
        /// `whsec_…` signing tokens: a request carrying `webhook-signature` must verify under one.
        #[serde(default)]
        signing_secrets: Vec<Secret>,
        /// Largest accepted |now − webhook-timestamp| for signed requests. Default 5m.
        #[serde(default = "super::standard::default_tolerance")]
        tolerance: HumanDuration,
        /// `object_kind` values (`push`, `merge_request`, …) or `X-Gitlab-Event` values
        /// (`Push Hook`) to turn into events; others are answered 200 and counted as filtered.
        #[serde(default)]
        events: Vec<String>,
    }
}
provider_source!(GitlabConfig);

impl GitlabConfig {
    pub(crate) fn auth_config(&self) -> Option<crate::AuthConfig> {
        None
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        if self.secrets.is_empty() && self.signing_secrets.is_empty() {
            return Err("give `secrets` (the hook's secret token) or `signing_secrets`".into());
        }
        super::check_secrets("secrets", &self.secrets, true)?;
        super::check_secrets("signing_secrets", &self.signing_secrets, true)?;
        for s in &self.signing_secrets {
            secret_key(&s.0).map_err(|e| format!("signing_secrets: {e}"))?;
        }
        EventFilter::new(&self.events).map(drop)
    }

    pub(crate) fn provider(&self) -> Result<Gitlab, String> {
        let signing = self
            .signing_secrets
            .iter()
            .map(|s| secret_key(&s.0))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Gitlab {
            tokens: self.secrets.clone(),
            signed: (!signing.is_empty()).then(|| Verifier {
                keys: Keys::new(
                    aws_lc_rs::hmac::HMAC_SHA256,
                    signing.iter().map(Vec::as_slice),
                ),
                public_keys: Vec::new(),
                tolerance: self.tolerance.get(),
            }),
            events: EventFilter::new(&self.events)?,
        })
    }
}

pub(crate) struct Gitlab {
    tokens: Vec<Secret>,
    signed: Option<Verifier>,
    events: EventFilter,
}

impl Provider for Gitlab {
    fn delivery_id<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        first(headers, "idempotency-key").or_else(|| first(headers, "x-gitlab-event-uuid"))
    }

    fn verify(&self, req: &Request<'_>) -> Result<(), Refusal> {
        if let Some(v) = &self.signed {
            if super::standard::headers(req.headers)?.is_some() || self.tokens.is_empty() {
                return v.verify(req);
            }
        }
        let token = single(req.headers, "x-gitlab-token")?.ok_or_else(|| {
            Refusal::unauthorized("missing_header", "X-Gitlab-Token header missing")
        })?;
        if token_matches(&self.tokens, token.as_bytes()) {
            Ok(())
        } else {
            Err(Refusal::unauthorized(
                "bad_token",
                "X-Gitlab-Token matches no configured secret",
            ))
        }
    }

    fn event(&self, req: &Request<'_>, naming: &Naming<'_>) -> Result<Verdict, Refusal> {
        let doc = Doc::parse(req.body)?;
        let json = doc.text();
        let kind = doc
            .get("object_kind")
            .or_else(|| doc.get("event_name"))
            .unwrap_or_else(|| "unknown".into());
        let header_event = header_400(req.headers, "x-gitlab-event")?;
        if !self.events.allows(&kind) && !header_event.is_some_and(|h| self.events.allows(h)) {
            return Ok(Verdict::Filtered);
        }
        let id = match header_400(req.headers, "idempotency-key")? {
            Some(k) => k.to_owned(),
            None => match header_400(req.headers, "x-gitlab-event-uuid")? {
                Some(u) => u.to_owned(),
                None => super::hash_id(&[req.body]),
            },
        };
        if naming.format == Format::Argo {
            let data = super::argo_headers_body(req.headers, json.as_bytes(), naming.metadata);
            return super::argo_verdict(id, naming, data);
        }
        let (ty, source, subject, time) = name(&kind, &doc);
        let e = json_event(id, source, ty, subject, time, req.body.clone())?;
        Ok(Verdict::Event {
            event: e,
            fresh: false,
        })
    }
}

/// `MergeRequest` → `merge_request`.
fn snake(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 4);
    for (i, c) in s.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// `object_attributes.url` without its `#note_…` part.
fn note_url(doc: &Doc<'_>) -> Option<String> {
    doc.get("object_attributes.url")
        .map(|u| match u.split_once("#note_") {
            Some((base, _)) => base.to_owned(),
            None => u,
        })
}

/// `(type, source, subject, time)` per the adapter, for `object_kind` = `kind`.
fn name(
    kind: &str,
    doc: &Doc<'_>,
) -> (
    String,
    String,
    Option<String>,
    Option<sluice_core::event::Timestamp>,
) {
    let homepage = || doc.get("repository.homepage");
    let web_url = || doc.get("project.web_url");
    let attr = |p: &str| doc.get(&format!("object_attributes.{p}"));
    let with = |base: &str, suffix: Option<String>| match suffix {
        Some(s) => format!("com.gitlab.{base}.{s}"),
        None => format!("com.gitlab.{base}"),
    };
    let (ty, source, subject, time) = match kind {
        "push" => (
            with("push", None),
            homepage(),
            doc.get("checkout_sha"),
            None,
        ),
        "tag_push" => (with("tag_push", None), homepage(), doc.get("ref"), None),
        "issue" => (with("issue", attr("state")), homepage(), attr("iid"), None),
        "note" => {
            let on = attr("noteable_type").map(|t| snake(&t));
            let source = match on.as_deref() {
                Some("commit") => doc.get("commit.url"),
                _ => note_url(doc),
            };
            (
                with("note", on),
                source,
                attr("id"),
                doc.time(&["object_attributes.created_at"]),
            )
        }
        "merge_request" => (
            with("merge_request", attr("action")),
            homepage(),
            attr("iid"),
            doc.time(&["object_attributes.created_at"]),
        ),
        "wiki_page" => (
            with("wiki_page", attr("action")),
            web_url(),
            attr("slug"),
            None,
        ),
        "pipeline" => (
            with("pipeline", attr("status")),
            web_url(),
            attr("id"),
            None,
        ),
        // The adapter says `job_status` / `job_id`; GitLab's job events carry `build_*`.
        "build" => (
            with(
                "job",
                doc.get("build_status").or_else(|| doc.get("job_status")),
            ),
            homepage(),
            doc.get("build_id").or_else(|| doc.get("job_id")),
            None,
        ),
        other => (with(other, attr("action")), web_url(), attr("id"), None),
    };
    let source = source
        .or_else(|| doc.get("project.web_url"))
        .or_else(|| doc.get("repository.homepage"))
        .unwrap_or_else(|| "https://gitlab.com".into());
    (ty, source, subject, time)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_of(
        event: &str,
        json: &str,
    ) -> (
        String,
        String,
        Option<String>,
        Option<sluice_core::event::Timestamp>,
    ) {
        name(event, &Doc::parse(json.as_bytes()).unwrap())
    }

    #[test]
    fn names_follow_the_adapter() {
        let push = r#"{"object_kind":"push","checkout_sha":"da15","repository":{"homepage":"http://example.com/mike/diaspora"}}"#;
        let (ty, source, subject, _) = name_of("push", push);
        assert_eq!(ty, "com.gitlab.push");
        assert_eq!(source, "http://example.com/mike/diaspora");
        assert_eq!(subject.as_deref(), Some("da15"));
        let mr = r#"{"object_kind":"merge_request","object_attributes":{"iid":1,"action":"open","created_at":"2013-12-03T17:23:34Z"},"repository":{"homepage":"h:r"}}"#;
        let (ty, _, subject, time) = name_of("merge_request", mr);
        assert_eq!(ty, "com.gitlab.merge_request.open");
        assert_eq!(subject.as_deref(), Some("1"));
        assert_eq!(time.unwrap().as_str(), "2013-12-03T17:23:34Z");
        let note = r#"{"object_kind":"note","object_attributes":{"id":5,"noteable_type":"MergeRequest","url":"http://example.com/g/p/-/merge_requests/1#note_1244"}}"#;
        let (ty, source, ..) = name_of("note", note);
        assert_eq!(ty, "com.gitlab.note.merge_request");
        assert_eq!(source, "http://example.com/g/p/-/merge_requests/1");
        let job = r#"{"object_kind":"build","build_id":1977,"build_status":"created","repository":{"homepage":"h:r"}}"#;
        let (ty, _, subject, _) = name_of("build", job);
        assert_eq!(
            (ty.as_str(), subject.as_deref()),
            ("com.gitlab.job.created", Some("1977"))
        );
        let pipe = r#"{"object_kind":"pipeline","object_attributes":{"id":31,"status":"success"},"project":{"web_url":"http://example.com/g/p"}}"#;
        assert_eq!(name_of("pipeline", pipe).0, "com.gitlab.pipeline.success");
        assert_eq!(name_of("pipeline", pipe).1, "http://example.com/g/p");
    }
}
