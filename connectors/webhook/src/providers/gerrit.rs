//! `kind: gerrit` — Gerrit's webhooks plugin signs nothing, so requests are checked with basic
//! auth or a bearer token (`auth`, as on `kind: webhook`); type `com.googlesource.gerrit.<type>`;
//! id = the SHA-256 of the body, which a retry of the same event repeats.

use http::HeaderMap;

use super::{json_event, unix_time, Doc, EventFilter, Naming, Provider, Refusal, Request, Verdict};
use crate::Format;

provider_config! {
    /// `kind: gerrit` options.
    GerritConfig, "gerrit", "/gerrit", "gerrit", 1 {
        /// Basic credentials or bearer tokens the plugin's URL carries (required: Gerrit has no
        /// signatures).
        auth: crate::AuthConfig,
        /// Gerrit event types (`patchset-created`, `change-merged`, `comment-*`) to turn into
        /// events; others are answered 200 and counted as filtered. Default: all.
        #[serde(default)]
        events: Vec<String>,
    }
}
provider_source!(GerritConfig);

impl GerritConfig {
    pub(crate) fn auth_config(&self) -> Option<crate::AuthConfig> {
        Some(self.auth.clone())
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        EventFilter::new(&self.events).map(drop)
    }

    pub(crate) fn provider(&self) -> Result<Gerrit, String> {
        Ok(Gerrit {
            events: EventFilter::new(&self.events)?,
        })
    }
}

pub(crate) struct Gerrit {
    events: EventFilter,
}

impl Provider for Gerrit {
    fn delivery_id<'h>(&self, _headers: &'h HeaderMap) -> Option<&'h str> {
        None
    }

    /// The webhook layer checked `auth` before the body was read.
    fn verify(&self, _req: &Request<'_>) -> Result<(), Refusal> {
        Ok(())
    }

    fn event(&self, req: &Request<'_>, naming: &Naming<'_>) -> Result<Verdict, Refusal> {
        let doc = Doc::parse(req.body)?;
        let json = doc.text();
        let ty = doc
            .get("type")
            .ok_or_else(|| Refusal::bad_request("invalid_event", "the event has no `type`"))?;
        if !self.events.allows(&ty) {
            return Ok(Verdict::Filtered);
        }
        // The webhooks plugin sends a retry with the very same body, and two distinct events
        // never share one (each carries its own accounts, approvals, patch set, ref update): the
        // body's hash is the stable id. (A hash of `type` + `eventCreatedOn` + change alone would
        // merge events of one second, e.g. several reviewers added at once.)
        let id = super::hash_id(&[req.body]);
        let created = doc.get("eventCreatedOn").unwrap_or_default();
        let project = doc
            .get("change.project")
            .or_else(|| doc.get("project"))
            .or_else(|| doc.get("project.name"))
            .unwrap_or_default();
        if naming.format == Format::Argo {
            let data = super::argo_headers_body(req.headers, json.as_bytes(), naming.metadata);
            return super::argo_verdict(id, naming, data);
        }
        // `https://host/c/project/+/123` → `https://host/project`.
        let source = doc
            .get("change.url")
            .and_then(|u| u.split_once("/c/").map(|(origin, _)| origin.to_owned()))
            .map(|origin| {
                if project.is_empty() {
                    origin
                } else {
                    format!("{origin}/{project}")
                }
            })
            .unwrap_or_else(|| naming.source.to_owned());
        let subject = doc.get("change.number");
        let time = created.parse().ok().and_then(unix_time);
        let e = json_event(
            id,
            source,
            format!("com.googlesource.gerrit.{ty}"),
            subject,
            time,
            req.body.clone(),
        )?;
        Ok(Verdict::Event {
            event: e,
            fresh: false,
        })
    }
}
