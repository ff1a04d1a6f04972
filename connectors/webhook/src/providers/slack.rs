//! `kind: slack` — `X-Slack-Signature: v0=<hex>`, HMAC-SHA256 with the app's signing secret over
//! `"v0:{X-Slack-Request-Timestamp}:{body}"`, timestamp within `tolerance`. Events API callbacks
//! (`url_verification` answered with its challenge), interactive payloads (`payload=` forms) and
//! slash commands (`command=` forms) become `com.slack.<type>` events.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use super::{
    check_timestamp, form_object, form_value, is_form, json_event, required, unix_time, Doc,
    EventFilter, Keys, Naming, Provider, Refusal, Request, Secret, Verdict,
};
use crate::Format;
use sluice_core::units::HumanDuration;

provider_config! {
    /// `kind: slack` options.
    SlackConfig, "slack", "/slack", "slack", 1 {
        /// The app's signing secret(s); any may match.
        secrets: Vec<Secret>,
        /// Largest accepted |now − X-Slack-Request-Timestamp|. Default 5m (Slack's advice).
        #[serde(default = "super::standard::default_tolerance")]
        tolerance: HumanDuration,
        /// Types (`app_mention`, `message`, `block_actions`, `slash_command`, …) to turn into
        /// events; others are answered 200 and counted as filtered. Default: all.
        #[serde(default)]
        events: Vec<String>,
    }
}
provider_source!(SlackConfig);

impl SlackConfig {
    pub(crate) fn auth_config(&self) -> Option<crate::AuthConfig> {
        None
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        super::check_secrets("secrets", &self.secrets, false)?;
        EventFilter::new(&self.events).map(drop)
    }

    pub(crate) fn provider(&self) -> Result<Slack, String> {
        Ok(Slack {
            keys: Keys::sha256(&self.secrets),
            tolerance: self.tolerance.get(),
            events: EventFilter::new(&self.events)?,
        })
    }
}

pub(crate) struct Slack {
    keys: Keys,
    tolerance: std::time::Duration,
    events: EventFilter,
}

impl Provider for Slack {
    fn delivery_id<'h>(&self, _headers: &'h HeaderMap) -> Option<&'h str> {
        None
    }

    fn verify(&self, req: &Request<'_>) -> Result<(), Refusal> {
        let ts = required(req.headers, "x-slack-request-timestamp")?;
        let sig = required(req.headers, "x-slack-signature")?;
        check_timestamp("X-Slack-Request-Timestamp", ts, req.now, self.tolerance)?;
        let hex = sig.strip_prefix("v0=").ok_or_else(|| {
            Refusal::unauthorized("bad_signature", "X-Slack-Signature must be `v0=<hex>`")
        })?;
        let parts: [&[u8]; 4] = [b"v0:", ts.as_bytes(), b":", req.body];
        let matched = self.keys.verify_any_hex(&parts, hex).ok_or_else(|| {
            Refusal::unauthorized("bad_signature", "X-Slack-Signature is not hex")
        })?;
        if matched {
            Ok(())
        } else {
            Err(Refusal::unauthorized(
                "bad_signature",
                "X-Slack-Signature does not match the body under any configured secret",
            ))
        }
    }

    fn event(&self, req: &Request<'_>, naming: &Naming<'_>) -> Result<Verdict, Refusal> {
        let body = &req.body[..];
        let team_source = |team: Option<String>| match team {
            Some(t) => format!("https://slack.com/{t}"),
            None => "https://slack.com".to_owned(),
        };
        // (type suffix, id, source, subject, time, data, argo data)
        let (kind, id, source, subject, time, data, argo): (
            String,
            String,
            String,
            Option<String>,
            Option<i64>,
            Bytes,
            Bytes,
        ) = if is_form(req.headers) {
            if form_value(body, "ssl_check").is_some() {
                return Ok(Verdict::Reply(StatusCode::OK, Bytes::new()));
            }
            if let Some(payload) = form_value(body, "payload") {
                let data = Bytes::from(payload.into_bytes());
                let pdoc = Doc::parse(&data)?;
                let kind = pdoc.get("type").unwrap_or_else(|| "interaction".into());
                (
                    kind,
                    super::hash_id(&[body]),
                    team_source(pdoc.get("team.id")),
                    pdoc.get("channel.id"),
                    None,
                    data.clone(),
                    data,
                )
            } else if form_value(body, "command").is_some() {
                let data = form_object(body);
                (
                    "slash_command".into(),
                    super::hash_id(&[body]),
                    team_source(form_value(body, "team_id")),
                    form_value(body, "channel_id"),
                    None,
                    data.clone(),
                    data,
                )
            } else {
                return Err(Refusal::bad_request(
                    "invalid_event",
                    "a form without `payload` or `command` is not a Slack request",
                ));
            }
        } else {
            let doc = Doc::parse(req.body)?;
            match doc.get("type").as_deref() {
                Some("url_verification") => {
                    let challenge = doc.get("challenge").unwrap_or_default();
                    let body = serde_json::json!({ "challenge": challenge }).to_string();
                    return Ok(Verdict::Reply(StatusCode::OK, Bytes::from(body)));
                }
                Some("event_callback") => {
                    let inner = doc.raw("event").unwrap_or("null");
                    (
                        doc.get("event.type")
                            .unwrap_or_else(|| "event_callback".into()),
                        doc.get("event_id")
                            .unwrap_or_else(|| super::hash_id(&[body])),
                        team_source(doc.get("team_id")),
                        doc.get("event.channel"),
                        doc.get("event_time").and_then(|t| t.parse().ok()),
                        req.body.clone(),
                        Bytes::copy_from_slice(inner.as_bytes()),
                    )
                }
                other => (
                    other.unwrap_or("unknown").to_owned(),
                    doc.get("event_id")
                        .unwrap_or_else(|| super::hash_id(&[body])),
                    team_source(doc.get("team_id")),
                    None,
                    None,
                    req.body.clone(),
                    req.body.clone(),
                ),
            }
        };
        if !self.events.allows(&kind) {
            return Ok(Verdict::Filtered);
        }
        if naming.format == Format::Argo {
            return super::argo_verdict(id, naming, argo);
        }
        let e = json_event(
            id,
            source,
            format!("com.slack.{kind}"),
            subject,
            time.and_then(unix_time),
            data,
        )?;
        Ok(Verdict::Event {
            event: e,
            fresh: false,
        })
    }
}
