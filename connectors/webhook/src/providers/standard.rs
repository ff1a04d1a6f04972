//! `kind: standard-webhooks` — the Standard Webhooks spec (Svix wrote it; `svix-*` headers are
//! accepted too): `webhook-signature` holds space-separated `v1,<base64 HMAC-SHA256>` and
//! `v1a,<base64 Ed25519>` signatures over `"{webhook-id}.{webhook-timestamp}.{body}"`; the
//! timestamp must be within `tolerance`; id = `webhook-id`.

use std::time::Duration;

use http::HeaderMap;

use super::{
    check_timestamp, first, json_event, single, text_at, time_at, unbase64, EventFilter, Keys,
    Naming, Provider, Refusal, Request, Secret, Verdict,
};
use crate::Format;
use sluice_core::units::HumanDuration;

provider_config! {
    /// `kind: standard-webhooks` options.
    StandardWebhooksConfig, "standard-webhooks", "/webhooks", "webhook", 1 {
        /// `whsec_<base64>` symmetric secrets (v1, HMAC-SHA256); any may match.
        #[serde(default)]
        secrets: Vec<Secret>,
        /// `whpk_<base64>` Ed25519 public keys (v1a); any may match.
        #[serde(default)]
        public_keys: Vec<Secret>,
        /// Largest accepted |now − webhook-timestamp|. Default 5m.
        #[serde(default = "default_tolerance")]
        tolerance: HumanDuration,
        /// gjson path of the event type in the payload. Default `type`.
        #[serde(default = "default_type_path")]
        type_path: String,
        /// Type when the payload has none at `type_path`. Default `webhook`.
        #[serde(rename = "type", default = "default_type")]
        event_type: String,
        /// Prepended to the payload's type (e.g. `com.example.`). Default none.
        #[serde(default)]
        type_prefix: String,
        /// gjson path of the subject in the payload. Default none.
        subject_path: Option<String>,
        /// Payload types to turn into events (`*`, `prefix*`); others are answered 200 and
        /// counted as filtered. Default: all.
        #[serde(default)]
        events: Vec<String>,
    }
}
provider_source!(StandardWebhooksConfig);

pub(crate) fn default_tolerance() -> HumanDuration {
    HumanDuration::from_secs(300)
}
fn default_type_path() -> String {
    "type".into()
}
fn default_type() -> String {
    "webhook".into()
}

/// The key bytes of a `whsec_` secret (the base64 after the prefix).
pub(crate) fn secret_key(s: &str) -> Result<Vec<u8>, String> {
    let b64 = s.strip_prefix("whsec_").unwrap_or(s);
    unbase64(b64)
        .ok_or_else(|| "a secret is not `whsec_` + base64 (as the sender shows it)".to_owned())
}

fn public_key(s: &str) -> Result<Vec<u8>, String> {
    let b64 = s.strip_prefix("whpk_").unwrap_or(s);
    match unbase64(b64) {
        Some(k) if k.len() == 32 => Ok(k),
        _ => Err("a public key is not `whpk_` + base64 of 32 bytes (Ed25519)".to_owned()),
    }
}

impl StandardWebhooksConfig {
    pub(crate) fn auth_config(&self) -> Option<crate::AuthConfig> {
        None
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        if self.secrets.is_empty() && self.public_keys.is_empty() {
            return Err("give `secrets` (whsec_…) or `public_keys` (whpk_…)".into());
        }
        super::check_secrets("secrets", &self.secrets, true)?;
        for s in &self.secrets {
            secret_key(&s.0).map_err(|e| format!("secrets: {e}"))?;
        }
        for k in &self.public_keys {
            public_key(&k.0).map_err(|e| format!("public_keys: {e}"))?;
        }
        if self.format == Format::Argo {
            return Err(
                "format: argo is not available: Argo Events has no Standard Webhooks source".into(),
            );
        }
        sluice_core::event::check_string("type", &self.event_type, true).map_err(|e| e.0)?;
        EventFilter::new(&self.events).map(drop)
    }

    pub(crate) fn provider(&self) -> Result<Standard, String> {
        let secrets = self
            .secrets
            .iter()
            .map(|s| secret_key(&s.0))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Standard {
            verifier: Verifier {
                keys: Keys::new(
                    aws_lc_rs::hmac::HMAC_SHA256,
                    secrets.iter().map(Vec::as_slice),
                ),
                public_keys: self
                    .public_keys
                    .iter()
                    .map(|k| public_key(&k.0))
                    .collect::<Result<_, _>>()?,
                tolerance: self.tolerance.get(),
            },
            type_path: self.type_path.clone(),
            ty: self.event_type.clone(),
            type_prefix: self.type_prefix.clone(),
            source: self.event_source.clone(),
            subject_path: self.subject_path.clone(),
            events: EventFilter::new(&self.events)?,
        })
    }
}

/// The Standard Webhooks check, also used by GitLab's signing tokens.
pub(crate) struct Verifier {
    pub keys: Keys,
    pub public_keys: Vec<Vec<u8>>,
    pub tolerance: Duration,
}

/// `(id, timestamp, signature)` headers: `webhook-*`, else `svix-*`.
pub(crate) fn headers(h: &HeaderMap) -> Result<Option<(&str, &str, &str)>, Refusal> {
    for (id, ts, sig) in [
        ("webhook-id", "webhook-timestamp", "webhook-signature"),
        ("svix-id", "svix-timestamp", "svix-signature"),
    ] {
        if let Some(s) = single(h, sig)? {
            let id = super::required(h, id)?;
            let ts = super::required(h, ts)?;
            return Ok(Some((id, ts, s)));
        }
    }
    Ok(None)
}

impl Verifier {
    pub fn verify(&self, req: &Request<'_>) -> Result<(), Refusal> {
        let Some((id, ts, sigs)) = headers(req.headers)? else {
            return Err(Refusal::unauthorized(
                "missing_header",
                "webhook-signature header missing",
            ));
        };
        check_timestamp("webhook-timestamp", ts, req.now, self.tolerance)?;
        let mut v1 = Vec::new();
        let mut v1a = Vec::new();
        for entry in sigs.split(' ').filter(|e| !e.is_empty()) {
            match entry.split_once(',') {
                Some(("v1", b64)) => v1.extend(unbase64(b64)),
                Some(("v1a", b64)) => v1a.extend(unbase64(b64)),
                _ => {} // other versions are ignored, as the spec asks
            }
        }
        if v1.is_empty() && v1a.is_empty() {
            return Err(Refusal::unauthorized(
                "bad_signature",
                "webhook-signature has no v1 or v1a signature",
            ));
        }
        let parts: [&[u8]; 5] = [id.as_bytes(), b".", ts.as_bytes(), b".", req.body];
        if !self.keys.is_empty() && self.keys.verify_any(&parts, v1.iter().map(Vec::as_slice)) {
            return Ok(());
        }
        if !self.public_keys.is_empty() && !v1a.is_empty() {
            let msg = parts.concat();
            for pk in &self.public_keys {
                let key = aws_lc_rs::signature::UnparsedPublicKey::new(
                    &aws_lc_rs::signature::ED25519,
                    pk,
                );
                if v1a.iter().any(|sig| key.verify(&msg, sig).is_ok()) {
                    return Ok(());
                }
            }
        }
        Err(Refusal::unauthorized(
            "bad_signature",
            "webhook-signature does not match the body under any configured secret or key",
        ))
    }
}

pub(crate) struct Standard {
    verifier: Verifier,
    type_path: String,
    ty: String,
    type_prefix: String,
    source: Option<String>,
    subject_path: Option<String>,
    events: EventFilter,
}

impl Provider for Standard {
    fn delivery_id<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        first(headers, "webhook-id").or_else(|| first(headers, "svix-id"))
    }

    fn verify(&self, req: &Request<'_>) -> Result<(), Refusal> {
        self.verifier.verify(req)
    }

    fn event(&self, req: &Request<'_>, naming: &Naming<'_>) -> Result<Verdict, Refusal> {
        let (id, ts, _) = headers(req.headers)?.expect("verified requests carry the headers");
        let json = std::str::from_utf8(req.body)
            .ok()
            .filter(|_| sluice_core::event::is_json(req.body));
        let payload_type = json.and_then(|j| text_at(j, &self.type_path));
        if !self
            .events
            .allows(payload_type.as_deref().unwrap_or(&self.ty))
        {
            return Ok(Verdict::Filtered);
        }
        let ty = match payload_type {
            Some(t) => format!("{}{t}", self.type_prefix),
            None => self.ty.clone(),
        };
        let source = self
            .source
            .clone()
            .unwrap_or_else(|| naming.source.to_owned());
        let subject = match (&self.subject_path, json) {
            (Some(p), Some(j)) => text_at(j, p),
            _ => None,
        };
        // The spec's payloads carry an RFC 3339 `timestamp`; else the signed header's time.
        let time = json
            .and_then(|j| time_at(j, &["timestamp"]))
            .or_else(|| ts.parse().ok().and_then(super::unix_time));
        if json.is_some() {
            let e = json_event(id.to_owned(), source, ty, subject, time, req.body.clone())?;
            return Ok(Verdict::Event {
                event: e,
                fresh: false,
            });
        }
        let e = super::body_event(req, id.to_owned(), source, ty, subject, time)?;
        Ok(Verdict::Event {
            event: e,
            fresh: false,
        })
    }
}
