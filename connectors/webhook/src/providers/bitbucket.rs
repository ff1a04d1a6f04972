//! `kind: bitbucket` (Bitbucket Cloud) and `kind: bitbucket-server` (Bitbucket Data Center /
//! Server): `X-Hub-Signature: sha256=<hex>` HMAC-SHA256 over the raw body; type
//! `org.bitbucket.<X-Event-Key>`; id = `X-Request-UUID` (Cloud) / `X-Request-Id` (Server).

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use super::{
    first, header_400, json_event, single, Doc, EventFilter, Keys, Naming, Provider, Refusal,
    Request, Secret, Verdict,
};
use crate::Format;

provider_config! {
    /// `kind: bitbucket` (Cloud) options.
    BitbucketConfig, "bitbucket", "/bitbucket", "bitbucket", 1 {
        /// The webhook's secret(s); any may match. Without one, requests are not verified
        /// (Bitbucket Cloud hooks made before secrets existed send no signature).
        #[serde(default)]
        secrets: Vec<Secret>,
        /// `X-Event-Key` values (`repo:push`, `pullrequest:*`) to turn into events; others are
        /// answered 200 and counted as filtered. Default: all.
        #[serde(default)]
        events: Vec<String>,
    }
}
provider_source!(BitbucketConfig);

provider_config! {
    /// `kind: bitbucket-server` options.
    BitbucketServerConfig, "bitbucket-server", "/bitbucket-server", "bitbucketserver", 1 {
        /// The webhook's secret(s); any may match.
        secrets: Vec<Secret>,
        /// `X-Event-Key` values (`repo:refs_changed`, `pr:*`) to turn into events. Default: all.
        #[serde(default)]
        events: Vec<String>,
    }
}
provider_source!(BitbucketServerConfig);

impl BitbucketConfig {
    pub(crate) fn auth_config(&self) -> Option<crate::AuthConfig> {
        None
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        super::check_secrets("secrets", &self.secrets, true)?;
        EventFilter::new(&self.events).map(drop)
    }

    pub(crate) fn provider(&self) -> Result<Bitbucket, String> {
        if self.secrets.is_empty() {
            tracing::warn!(
                path = self.path.as_deref().unwrap_or("/bitbucket"),
                "bitbucket: no `secrets`: requests are not verified (set the hook's secret in Bitbucket and here)"
            );
        }
        Bitbucket::new(&self.secrets, &self.events, Flavor::Cloud)
    }
}

impl BitbucketServerConfig {
    pub(crate) fn auth_config(&self) -> Option<crate::AuthConfig> {
        None
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        super::check_secrets("secrets", &self.secrets, false)?;
        EventFilter::new(&self.events).map(drop)
    }

    pub(crate) fn provider(&self) -> Result<Bitbucket, String> {
        Bitbucket::new(&self.secrets, &self.events, Flavor::Server)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Flavor {
    Cloud,
    Server,
}

pub(crate) struct Bitbucket {
    keys: Keys,
    events: EventFilter,
    flavor: Flavor,
}

impl Bitbucket {
    fn new(secrets: &[Secret], events: &[String], flavor: Flavor) -> Result<Bitbucket, String> {
        Ok(Bitbucket {
            keys: Keys::sha256(secrets),
            events: EventFilter::new(events)?,
            flavor,
        })
    }

    fn id_header(&self) -> &'static str {
        match self.flavor {
            Flavor::Cloud => "x-request-uuid",
            Flavor::Server => "x-request-id",
        }
    }
}

impl Provider for Bitbucket {
    fn delivery_id<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        first(headers, self.id_header())
    }

    fn verify(&self, req: &Request<'_>) -> Result<(), Refusal> {
        if self.keys.is_empty() {
            return Ok(());
        }
        let sig = single(req.headers, "x-hub-signature")?.ok_or_else(|| {
            Refusal::unauthorized("missing_header", "X-Hub-Signature header missing")
        })?;
        super::github::verify_sha256(&self.keys, "X-Hub-Signature", sig, req.body)
    }

    fn event(&self, req: &Request<'_>, naming: &Naming<'_>) -> Result<Verdict, Refusal> {
        let key = header_400(req.headers, "x-event-key")?
            .ok_or_else(|| Refusal::bad_request("missing_header", "X-Event-Key header missing"))?;
        // "Test connection" in Bitbucket Server's hook settings.
        if key == "diagnostics:ping" {
            return Ok(Verdict::Reply(
                StatusCode::OK,
                Bytes::from_static(b"{\"status\":\"pong\"}"),
            ));
        }
        if !self.events.allows(key) {
            return Ok(Verdict::Filtered);
        }
        let doc = Doc::parse(req.body)?;
        let json = doc.text();
        let id = match header_400(req.headers, self.id_header())? {
            Some(id) => id.to_owned(),
            None => super::hash_id(&[key.as_bytes(), req.body]),
        };
        if naming.format == Format::Argo {
            let data = super::argo_headers_body(req.headers, json.as_bytes(), naming.metadata);
            return super::argo_verdict(id, naming, data);
        }
        let (source, subject, time) = match self.flavor {
            Flavor::Cloud => (
                doc.get("repository.links.html.href").or_else(|| {
                    doc.get("repository.full_name")
                        .map(|n| format!("https://bitbucket.org/{n}"))
                }),
                doc.get("pullrequest.id")
                    .or_else(|| doc.get("push.changes.0.new.name"))
                    .or_else(|| doc.get("issue.id")),
                doc.time(&["pullrequest.updated_on", "push.changes.0.new.target.date"]),
            ),
            Flavor::Server => (
                doc.get("repository.links.self.0.href")
                    .or_else(|| doc.get("pullRequest.toRef.repository.links.self.0.href")),
                doc.get("pullRequest.id")
                    .or_else(|| doc.get("changes.0.refId")),
                doc.time(&["date"]),
            ),
        };
        let source = source.unwrap_or_else(|| naming.source.to_owned());
        let e = json_event(
            id,
            source,
            format!("org.bitbucket.{key}"),
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
