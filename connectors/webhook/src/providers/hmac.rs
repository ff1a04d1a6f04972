//! `kind: hmac` — any HMAC scheme described by options: the signature header, algorithm
//! (sha1/sha256/sha512), encoding (hex/base64), a prefix such as `sha256=`, and optionally a
//! timestamp header whose value is signed with the body (`signed: "{timestamp}.{body}"`) and
//! checked against `tolerance`.

use http::{HeaderMap, HeaderName};
use serde::Deserialize;

use super::{
    check_timestamp, json_event, required, single, text_at, EventFilter, Keys, Naming, Provider,
    Refusal, Request, Secret, Verdict,
};
use crate::Format;
use sluice_core::units::HumanDuration;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    Sha1,
    #[default]
    Sha256,
    Sha512,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    #[default]
    Hex,
    Base64,
}

provider_config! {
    /// `kind: hmac` options.
    HmacConfig, "hmac", "/hmac", "webhook", 1 {
        /// The header holding the signature.
        header: String,
        /// The secrets; any may match.
        secrets: Vec<Secret>,
        /// `sha1`, `sha256` (default) or `sha512`.
        #[serde(default)]
        algorithm: Algorithm,
        /// `hex` (default) or `base64`.
        #[serde(default)]
        encoding: Encoding,
        /// Text before the signature in the header (`sha256=`). Default none.
        #[serde(default)]
        prefix: String,
        /// A header with a unix-seconds timestamp, checked against `tolerance`.
        timestamp_header: Option<String>,
        /// Largest accepted |now − timestamp|. Default 5m.
        #[serde(default = "super::standard::default_tolerance")]
        tolerance: HumanDuration,
        /// What is signed: `{body}` (default) with `{timestamp}` and literal text around it,
        /// e.g. `"{timestamp}.{body}"`.
        #[serde(default = "default_signed")]
        signed: String,
        /// A header whose value is the event id (a delivery id); else the body's SHA-256.
        id_header: Option<String>,
        /// CloudEvent `type`, when `type_path` is unset or finds nothing. Default `webhook`.
        #[serde(rename = "type", default = "default_type")]
        event_type: String,
        /// gjson path of the type in a JSON payload.
        type_path: Option<String>,
        /// Types to turn into events (`*`, `prefix*`); others are answered 200 and counted as
        /// filtered. Default: all.
        #[serde(default)]
        events: Vec<String>,
    }
}
provider_source!(HmacConfig);

fn default_signed() -> String {
    "{body}".into()
}
fn default_type() -> String {
    "webhook".into()
}

/// A piece of the signed string.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Body,
    Timestamp,
}

fn parse_signed(t: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut rest = t;
    while let Some(i) = rest.find('{') {
        if i > 0 {
            pieces.push(Piece::Text(rest[..i].to_owned()));
        }
        let end = rest[i..]
            .find('}')
            .ok_or_else(|| format!("signed: unclosed `{{` in {t:?}"))?;
        pieces.push(match &rest[i + 1..i + end] {
            "body" => Piece::Body,
            "timestamp" => Piece::Timestamp,
            other => {
                return Err(format!(
                    "signed: unknown placeholder {{{other}}}: use {{body}} and {{timestamp}}"
                ))
            }
        });
        rest = &rest[i + end + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_owned()));
    }
    if pieces.iter().filter(|p| **p == Piece::Body).count() != 1 {
        return Err("signed: must contain {body} exactly once".into());
    }
    Ok(pieces)
}

impl HmacConfig {
    pub(crate) fn auth_config(&self) -> Option<crate::AuthConfig> {
        None
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        super::check_secrets("secrets", &self.secrets, false)?;
        for (what, h) in [
            ("header", Some(&self.header)),
            ("timestamp_header", self.timestamp_header.as_ref()),
            ("id_header", self.id_header.as_ref()),
        ] {
            if let Some(h) = h {
                HeaderName::try_from(h.as_str())
                    .map_err(|_| format!("{what}: {h:?} is not a valid header name"))?;
            }
        }
        let pieces = parse_signed(&self.signed)?;
        if pieces.contains(&Piece::Timestamp) && self.timestamp_header.is_none() {
            return Err("signed: {timestamp} needs `timestamp_header`".into());
        }
        if self.timestamp_header.is_some() && !pieces.contains(&Piece::Timestamp) {
            return Err("timestamp_header is set but `signed` has no {timestamp}: an unsigned timestamp stops no replay (e.g. signed: \"{timestamp}.{body}\")".into());
        }
        if self.format == Format::Argo {
            return Err("format: argo is not available for kind hmac (Argo has no such source); use kind webhook for Argo's shape".into());
        }
        sluice_core::event::check_string("type", &self.event_type, true).map_err(|e| e.0)?;
        EventFilter::new(&self.events).map(drop)
    }

    pub(crate) fn provider(&self) -> Result<Hmac, String> {
        let alg = match self.algorithm {
            Algorithm::Sha1 => aws_lc_rs::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
            Algorithm::Sha256 => aws_lc_rs::hmac::HMAC_SHA256,
            Algorithm::Sha512 => aws_lc_rs::hmac::HMAC_SHA512,
        };
        Ok(Hmac {
            keys: Keys::new(alg, self.secrets.iter().map(|s| s.0.as_bytes())),
            header: self.header.to_ascii_lowercase(),
            encoding: self.encoding,
            prefix: self.prefix.clone(),
            timestamp_header: self
                .timestamp_header
                .as_ref()
                .map(|h| h.to_ascii_lowercase()),
            tolerance: self.tolerance.get(),
            signed: parse_signed(&self.signed)?,
            id_header: self.id_header.as_ref().map(|h| h.to_ascii_lowercase()),
            ty: self.event_type.clone(),
            type_path: self.type_path.clone(),
            source: self.event_source.clone(),
            events: EventFilter::new(&self.events)?,
        })
    }
}

pub(crate) struct Hmac {
    keys: Keys,
    header: String,
    encoding: Encoding,
    prefix: String,
    timestamp_header: Option<String>,
    tolerance: std::time::Duration,
    signed: Vec<Piece>,
    id_header: Option<String>,
    ty: String,
    type_path: Option<String>,
    source: Option<String>,
    events: EventFilter,
}

impl Provider for Hmac {
    fn delivery_id<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        self.id_header
            .as_deref()
            .and_then(|h| super::first(headers, h))
    }

    fn verify(&self, req: &Request<'_>) -> Result<(), Refusal> {
        let value = required(req.headers, &self.header)?;
        let ts = match self.timestamp_header.as_deref() {
            Some(h) => {
                let ts = required(req.headers, h)?;
                check_timestamp(h, ts, req.now, self.tolerance)?;
                ts
            }
            None => "",
        };
        let encoded = value.strip_prefix(self.prefix.as_str()).ok_or_else(|| {
            Refusal::unauthorized(
                "bad_signature",
                format!("{} must start with {:?}", self.header, self.prefix),
            )
        })?;
        let sig = match self.encoding {
            Encoding::Hex => super::unhex(encoded),
            Encoding::Base64 => super::unbase64(encoded),
        }
        .ok_or_else(|| {
            Refusal::unauthorized(
                "bad_signature",
                format!("{} is not {:?}", self.header, self.encoding),
            )
        })?;
        let parts: Vec<&[u8]> = self
            .signed
            .iter()
            .map(|p| match p {
                Piece::Text(t) => t.as_bytes(),
                Piece::Body => &req.body[..],
                Piece::Timestamp => ts.as_bytes(),
            })
            .collect();
        if self.keys.verify_any(&parts, [sig.as_slice()]) {
            Ok(())
        } else {
            Err(Refusal::unauthorized(
                "bad_signature",
                format!(
                    "{} does not match the body under any configured secret",
                    self.header
                ),
            ))
        }
    }

    fn event(&self, req: &Request<'_>, naming: &Naming<'_>) -> Result<Verdict, Refusal> {
        let json = std::str::from_utf8(req.body)
            .ok()
            .filter(|_| sluice_core::event::is_json(req.body));
        let ty = match (&self.type_path, json) {
            (Some(p), Some(j)) => text_at(j, p).unwrap_or_else(|| self.ty.clone()),
            _ => self.ty.clone(),
        };
        if !self.events.allows(&ty) {
            return Ok(Verdict::Filtered);
        }
        let id = match self.id_header.as_deref() {
            Some(h) => single(req.headers, h)
                .map_err(|mut r| {
                    r.status = http::StatusCode::BAD_REQUEST;
                    r
                })?
                .map(str::to_owned),
            None => None,
        }
        .unwrap_or_else(|| super::hash_id(&[req.body]));
        let source = self
            .source
            .clone()
            .unwrap_or_else(|| naming.source.to_owned());
        if json.is_some() {
            let e = json_event(id, source, ty, None, None, req.body.clone())?;
            return Ok(Verdict::Event {
                event: e,
                fresh: false,
            });
        }
        let e = super::body_event(req, id, source, ty, None, None)?;
        Ok(Verdict::Event {
            event: e,
            fresh: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_templates() {
        assert_eq!(parse_signed("{body}").unwrap(), vec![Piece::Body]);
        assert_eq!(
            parse_signed("v0:{timestamp}:{body}").unwrap(),
            vec![
                Piece::Text("v0:".into()),
                Piece::Timestamp,
                Piece::Text(":".into()),
                Piece::Body
            ]
        );
        assert!(parse_signed("{timestamp}").is_err());
        assert!(parse_signed("{body}{body}").is_err());
        assert!(parse_signed("{nope}.{body}").is_err());
    }
}
