//! SaaS webhook kinds (`github`, `gitlab`, `bitbucket`, `bitbucket-server`, `gerrit`, `stripe`,
//! `slack`, `standard-webhooks`, `hmac`): the webhook listener machinery (shared ports, TLS,
//! limits, shedding, honest acks) plus, per provider, signature verification on the raw body and
//! CloudEvent naming after the CloudEvents adapters, with ids from the provider's delivery id so
//! retries deduplicate.
//!
//! A provider sees a request after its body was read within the limits: [`Provider::verify`]
//! checks it (constant time, every configured secret tried), then [`Provider::event`] names it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use sluice_core::event::{Data, Event, Timestamp};
use subtle::ConstantTimeEq;

use crate::Format;

#[macro_use]
mod common;
pub mod bitbucket;
pub mod gerrit;
pub mod github;
pub mod gitlab;
pub mod hmac;
pub mod slack;
pub mod standard;
pub mod stripe;

/// A request as a provider sees it.
pub(crate) struct Request<'a> {
    pub headers: &'a HeaderMap,
    pub body: &'a Bytes,
    /// Unix seconds, for timestamp tolerance.
    pub now: i64,
}

/// What a verified request becomes. (The event is moved once per request: boxing it would cost
/// an allocation per request to save a move.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Verdict {
    /// One event; `fresh` when its id was made now (it cannot repeat, so dedup is skipped).
    Event { event: Event, fresh: bool },
    /// Answered without an event (GitHub `ping`, Slack `url_verification`, …).
    Reply(StatusCode, Bytes),
    /// An event the config does not ask for: answered 200, counted as filtered.
    Filtered,
}

/// Why a request is refused: the status, a reason that names the header (never a secret), and
/// the metric label.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub status: StatusCode,
    pub reason: Cow<'static, str>,
    pub metric: &'static str,
}

impl Refusal {
    pub fn unauthorized(metric: &'static str, reason: impl Into<Cow<'static, str>>) -> Self {
        Refusal {
            status: StatusCode::UNAUTHORIZED,
            reason: reason.into(),
            metric,
        }
    }

    pub fn bad_request(metric: &'static str, reason: impl Into<Cow<'static, str>>) -> Self {
        Refusal {
            status: StatusCode::BAD_REQUEST,
            reason: reason.into(),
            metric,
        }
    }
}

/// How events are named: the route's fallbacks and the output shape.
pub(crate) struct Naming<'a> {
    /// `format: argo`: the source name; otherwise the fallback source.
    pub source: &'a str,
    pub subject: &'a str,
    pub ty: &'a str,
    pub format: Format,
    /// `metadata` as JSON (Argo shapes).
    pub metadata: &'a Bytes,
}

pub(crate) trait Provider: Send + Sync + 'static {
    /// The provider's delivery id, for log lines about refused requests.
    fn delivery_id<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str>;
    /// Checks the request's signature or token.
    fn verify(&self, req: &Request<'_>) -> Result<(), Refusal>;
    /// Names a verified request.
    fn event(&self, req: &Request<'_>, naming: &Naming<'_>) -> Result<Verdict, Refusal>;
}

/// A secret from the config (`${ENV}` / `${file:…}`); never printed.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

/// Checks a list of secrets: at least one unless `optional`, none empty.
pub(crate) fn check_secrets(field: &str, secrets: &[Secret], optional: bool) -> Result<(), String> {
    if secrets.is_empty() && !optional {
        return Err(format!(
            "{field}: give at least one secret (several while rotating: any may match)"
        ));
    }
    if secrets.iter().any(|s| s.0.is_empty()) {
        return Err(format!(
            "{field}: a secret is empty (is its environment variable or file empty?)"
        ));
    }
    Ok(())
}

/// HMAC keys, one per configured secret.
pub(crate) struct Keys {
    keys: Vec<aws_lc_rs::hmac::Key>,
}

impl Keys {
    pub fn new<'s>(
        alg: aws_lc_rs::hmac::Algorithm,
        secrets: impl IntoIterator<Item = &'s [u8]>,
    ) -> Keys {
        Keys {
            keys: secrets
                .into_iter()
                .map(|s| aws_lc_rs::hmac::Key::new(alg, s))
                .collect(),
        }
    }

    /// HMAC-SHA256 keys from the configured secrets, as given (GitHub, Bitbucket, Stripe, Slack).
    pub fn sha256(secrets: &[Secret]) -> Keys {
        Keys::new(
            aws_lc_rs::hmac::HMAC_SHA256,
            secrets.iter().map(|s| s.0.as_bytes()),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether any of `signatures` is the tag of `parts` under any key. Every pair is compared
    /// in constant time, so timing shows neither which secret matched nor how much of a
    /// signature did.
    pub fn verify_any<'a>(
        &self,
        parts: &[&[u8]],
        signatures: impl IntoIterator<Item = &'a [u8]> + Clone,
    ) -> bool {
        let mut ok = subtle::Choice::from(0u8);
        for k in &self.keys {
            let mut c = aws_lc_rs::hmac::Context::with_key(k);
            for p in parts {
                c.update(p);
            }
            let tag = c.sign();
            for sig in signatures.clone() {
                ok |= tag.as_ref().ct_eq(sig);
            }
        }
        ok.into()
    }

    /// [`Keys::verify_any`] for one signature written as hex digits, in either case: each tag
    /// is written as lowercase hex and compared with the case-folded signature in constant time
    /// (cheaper than decoding the signature, and nothing is allocated). `None` when `hex` holds
    /// anything but an even number of hex digits.
    pub fn verify_any_hex(&self, parts: &[&[u8]], hex: &str) -> Option<bool> {
        let given = hex.as_bytes();
        if !given.len().is_multiple_of(2) || !given.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        // Longer than any tag (SHA-512's is 64 bytes): matches none.
        let mut folded = [0u8; 128];
        let Some(folded) = folded.get_mut(..given.len()) else {
            return Some(false);
        };
        for (f, g) in folded.iter_mut().zip(given) {
            // ASCII `A`–`F` to `a`–`f`; digits and `a`–`f` already have this bit.
            *f = g | 0x20;
        }
        let mut ok = false;
        let mut written = [0u8; 128];
        for k in &self.keys {
            let mut c = aws_lc_rs::hmac::Context::with_key(k);
            for p in parts {
                c.update(p);
            }
            let tag = c.sign();
            let tag = tag.as_ref();
            let written = &mut written[..tag.len() * 2];
            hex::encode_to_slice(tag, written).ok()?;
            // Every key is tried, so the time does not show which one matched.
            ok |= aws_lc_rs::constant_time::verify_slices_are_equal(written, folded).is_ok();
        }
        Some(ok)
    }
}

/// Tokens compared for equality in constant time (GitLab's `X-Gitlab-Token`).
/// Digests are compared, so neither a token's content nor its length shows in the timing.
pub(crate) fn token_matches(tokens: &[Secret], given: &[u8]) -> bool {
    let given = Sha256::digest(given);
    let mut ok = subtle::Choice::from(0u8);
    for t in tokens {
        ok |= Sha256::digest(t.0.as_bytes()).ct_eq(&given);
    }
    ok.into()
}

/// A header name as the helpers below take it: a `&str` (parsed and lowercased at each lookup)
/// or a prebuilt `&HeaderName` (hashed only), for the headers read on every request.
pub(crate) trait Name: http::header::AsHeaderName + Copy + std::fmt::Display {}
impl Name for &str {}
impl Name for &http::HeaderName {}
impl Name for &String {}

/// The value of a header sent at most once. Two copies of a header that decides verification
/// are refused rather than guessed between.
pub(crate) fn single(headers: &HeaderMap, name: impl Name) -> Result<Option<&str>, Refusal> {
    let mut all = headers.get_all(name).iter();
    let Some(first) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(Refusal::unauthorized(
            "duplicated_header",
            format!("{name} is sent more than once"),
        ));
    }
    let v = first
        .to_str()
        .map_err(|_| Refusal::unauthorized("bad_header", format!("{name} is not visible ASCII")))?
        .trim();
    Ok(Some(v).filter(|v| !v.is_empty()))
}

/// [`single`], refusing a missing header.
pub(crate) fn required(headers: &HeaderMap, name: impl Name) -> Result<&str, Refusal> {
    single(headers, name)?
        .ok_or_else(|| Refusal::unauthorized("missing_header", format!("{name} header missing")))
}

/// A header that names or identifies the delivery (not verification): missing or doubled is a
/// 400.
pub(crate) fn header_400(headers: &HeaderMap, name: impl Name) -> Result<Option<&str>, Refusal> {
    single(headers, name).map_err(|mut r| {
        r.status = StatusCode::BAD_REQUEST;
        r
    })
}

/// The first value of a header, for logs.
pub(crate) fn first(headers: &HeaderMap, name: impl Name) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Checks a unix-seconds timestamp against `tolerance` in both directions.
pub(crate) fn check_timestamp(
    header: &str,
    value: &str,
    now: i64,
    tolerance: Duration,
) -> Result<i64, Refusal> {
    let t: i64 = value.trim().parse().map_err(|_| {
        Refusal::unauthorized("bad_timestamp", format!("{header} is not a unix timestamp"))
    })?;
    let skew = now.saturating_sub(t);
    if skew.unsigned_abs() > tolerance.as_secs() {
        let (dir, by) = if skew > 0 {
            ("old", skew)
        } else {
            ("in the future", -skew)
        };
        return Err(Refusal::unauthorized(
            "stale",
            format!(
                "{header} is {by} s {dir}, outside the tolerance of {} s (replayed, or a clock is off)",
                tolerance.as_secs()
            ),
        ));
    }
    Ok(t)
}

/// Decodes lowercase or uppercase hex; `None` for anything else.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    // Into a buffer of the right size: `hex::decode` collects through an iterator of results,
    // several times slower for a signature. An odd length fails the size check.
    let mut out = vec![0; s.len() / 2];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

pub(crate) fn unbase64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(s))
        .ok()
}

/// A JSON payload read once: its top-level members are located in one pass (gjson's scan,
/// which skips nested values without building them), so that naming an event looks only inside
/// the few members it names, instead of scanning the whole body once per attribute.
///
/// The pass checks the document's structure (one object, brackets and strings closed, nothing
/// after it), not every token: the payload is only forwarded, and it leaves as data typed
/// `application/json` but not marked as checked, so an encoder that embeds it as JSON checks it
/// then (as for `kind: webhook`). A full check here cost about as much as the HMAC over the same
/// bytes (`docs/benchmarks.md`, signature verification). Arrays, scalars and objects with
/// escaped keys are checked in full.
pub(crate) struct Doc<'a> {
    json: &'a str,
    /// `None` when the top level is not an object with plain keys (then paths go through gjson
    /// over the whole text).
    top: Option<Vec<(&'a str, &'a str)>>,
}

/// Where `inner` starts in `outer`, when it is a slice of it.
fn offset_in(outer: &str, inner: &str) -> Option<usize> {
    let off = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    (off + inner.len() <= outer.len()).then_some(off)
}

enum Scan<'a> {
    Members(Vec<(&'a str, &'a str)>),
    /// Not an object with plain keys: check it in full.
    Other,
    Broken,
}

/// The members of a top-level object, each as its key and its value's raw JSON.
fn scan_members(json: &str) -> Scan<'_> {
    let body = json.trim_start_matches([' ', '\t', '\n', '\r']);
    if !body.starts_with('{') {
        return Scan::Other;
    }
    let root = gjson::parse(body);
    let mut members = Vec::with_capacity(24);
    let mut end = Some(1);
    let mut plain = true;
    root.each(|k, v| {
        let key = k.json();
        let (Some(ko), Some(vo)) = (offset_in(body, key), offset_in(body, v.json())) else {
            end = None;
            return false;
        };
        let Some(name) = key.strip_prefix('"').and_then(|k| k.strip_suffix('"')) else {
            end = None;
            return false;
        };
        if name.contains('\\') {
            plain = false;
            return false;
        }
        // gjson takes `true`, `false` and `null` by their length without reading them: a
        // broken token may end inside a multi-byte character, which is no place to cut.
        let (Some(value), Some(key)) = (
            body.get(vo..vo + v.json().len()),
            body.get(ko + 1..ko + 1 + name.len()),
        ) else {
            end = None;
            return false;
        };
        members.push((key, value));
        end = Some(vo + value.len());
        true
    });
    if !plain {
        return Scan::Other;
    }
    // After the last member: the object's `}` and nothing but white space.
    let closed = end
        .and_then(|e| body.get(e..))
        .map(|rest| rest.trim_start_matches([' ', '\t', '\n', '\r']))
        .and_then(|rest| rest.strip_prefix('}'))
        .is_some_and(|rest| rest.trim_matches([' ', '\t', '\n', '\r']).is_empty());
    if closed {
        Scan::Members(members)
    } else {
        Scan::Broken
    }
}

impl<'a> Doc<'a> {
    /// The body as a JSON document, or a 400.
    pub fn parse(body: &'a [u8]) -> Result<Doc<'a>, Refusal> {
        let json = std::str::from_utf8(body)
            .map_err(|_| Refusal::bad_request("invalid_event", "the body is not UTF-8 JSON"))?;
        match scan_members(json) {
            Scan::Members(top) => Ok(Doc {
                json,
                top: Some(top),
            }),
            Scan::Other if sluice_core::event::is_json(body) => Ok(Doc { json, top: None }),
            Scan::Other | Scan::Broken => Err(Refusal::bad_request(
                "invalid_event",
                "the body is not a JSON document",
            )),
        }
    }

    pub fn text(&self) -> &'a str {
        self.json
    }

    /// The value at a dotted `path` (`repository.url`, `changes.0.refId`), as text: strings
    /// unescaped, numbers and booleans as written; `None` for absent, null, objects, arrays and
    /// empty strings.
    pub fn get(&self, path: &str) -> Option<String> {
        let Some(top) = &self.top else {
            return text_at(self.json, path);
        };
        let (head, rest) = path.split_once('.').unwrap_or((path, ""));
        let raw = top.iter().find(|(k, _)| *k == head)?.1;
        if rest.is_empty() {
            scalar(&gjson::parse(raw))
        } else {
            text_at(raw, rest)
        }
    }

    /// The time at the first of `paths` that holds one (see [`time_at`]).
    pub fn time(&self, paths: &[&str]) -> Option<Timestamp> {
        let Some(top) = &self.top else {
            return time_at(self.json, paths);
        };
        paths.iter().find_map(|p| {
            let (head, rest) = p.split_once('.').unwrap_or((p, ""));
            let raw = top.iter().find(|(k, _)| *k == head)?.1;
            if rest.is_empty() {
                time_of(&gjson::parse(raw))
            } else {
                time_of(&gjson::get(raw, rest))
            }
        })
    }

    /// The raw JSON of a top-level member (Slack's `event`).
    pub fn raw(&self, key: &str) -> Option<&'a str> {
        match &self.top {
            Some(top) => top.iter().find(|(k, _)| *k == key).map(|(_, v)| *v),
            None => None,
        }
    }
}

fn scalar(v: &gjson::Value<'_>) -> Option<String> {
    match v.kind() {
        gjson::Kind::String => Some(v.str().to_owned()).filter(|s| !s.is_empty()),
        gjson::Kind::Number | gjson::Kind::True | gjson::Kind::False => Some(v.json().to_owned()),
        _ => None,
    }
}

fn time_of(v: &gjson::Value<'_>) -> Option<Timestamp> {
    match v.kind() {
        gjson::Kind::String => parse_time(v.str()),
        gjson::Kind::Number => unix_time(v.i64()),
        _ => None,
    }
}

/// A scalar at `path` as text: strings unescaped, numbers and booleans as written.
pub(crate) fn text_at(json: &str, path: &str) -> Option<String> {
    scalar(&gjson::get(json, path))
}

/// A time at the first of `paths` that holds one: RFC 3339 (or `+hhmm` offsets) or unix
/// seconds (milliseconds when it is that large).
pub(crate) fn time_at(json: &str, paths: &[&str]) -> Option<Timestamp> {
    paths.iter().find_map(|p| time_of(&gjson::get(json, p)))
}

/// RFC 3339, else the shapes providers send: `+hhmm` offsets (Bitbucket Server) and
/// `2013-12-03 17:23:34 UTC` (GitLab).
pub(crate) fn parse_time(s: &str) -> Option<Timestamp> {
    if let Ok(t) = Timestamp::parse(s) {
        return Some(t);
    }
    ["%Y-%m-%dT%H:%M:%S%.f%z", "%Y-%m-%d %H:%M:%S%.f %z"]
        .iter()
        .find_map(|f| chrono::DateTime::parse_from_str(s, f).ok())
        .map(|t| t.to_utc())
        .or_else(|| {
            let naive = s.strip_suffix(" UTC")?;
            chrono::NaiveDateTime::parse_from_str(naive, "%Y-%m-%d %H:%M:%S%.f")
                .ok()
                .map(|t| t.and_utc())
        })
        .map(Timestamp::from_utc)
}

/// Unix seconds, or milliseconds / microseconds when the number is that large.
pub(crate) fn unix_time(n: i64) -> Option<Timestamp> {
    let at = if n > 100_000_000_000_000 {
        chrono::DateTime::from_timestamp_micros(n)
    } else if n > 100_000_000_000 {
        chrono::DateTime::from_timestamp_millis(n)
    } else {
        chrono::DateTime::from_timestamp(n, 0)
    };
    at.filter(|_| n > 0).map(Timestamp::from_utc)
}

/// The hex SHA-256 of `parts`, each followed by a NUL (so `("ab","c")` and `("a","bc")` differ).
pub(crate) fn hash_id(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
        h.update([0u8]);
    }
    hex::encode(h.finalize())
}

/// `events:` — which provider event names become events: exact names, `*`, or a `prefix*`.
/// Empty lets everything through.
#[derive(Debug, Clone, Default)]
pub(crate) struct EventFilter(Vec<String>);

impl EventFilter {
    pub fn new(names: &[String]) -> Result<EventFilter, String> {
        if let Some(bad) = names
            .iter()
            .find(|n| n.is_empty() || n.strip_suffix('*').unwrap_or(n).contains('*'))
        {
            return Err(format!(
                "events: {bad:?} is not an event name, `*`, or a name ending in `*`"
            ));
        }
        Ok(EventFilter(names.to_vec()))
    }

    pub fn allows(&self, name: &str) -> bool {
        self.0.is_empty()
            || self.0.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => p == name,
            })
    }
}

/// Argo Events' git-provider data: `{"headers": {Canonical-Name: [values]}, "body": …,
/// "metadata": {…}}` (`Authorization` left out).
pub(crate) fn argo_headers_body(headers: &HeaderMap, body: &[u8], metadata: &[u8]) -> Bytes {
    let mut data = Vec::with_capacity(body.len() + 512);
    data.extend_from_slice(b"{\"headers\":");
    crate::handler::write_argo_headers(&mut data, headers);
    data.extend_from_slice(b",\"body\":");
    data.extend_from_slice(body);
    data.extend_from_slice(b",\"metadata\":");
    data.extend_from_slice(metadata);
    data.push(b'}');
    Bytes::from(data)
}

/// `{"a": …}` → `{"k1":"v1","k2":"v2","a": …}` for a JSON object (GitHub's Argo shape injects
/// `X-GitHub-Event` and `X-GitHub-Delivery`). Anything else is returned unchanged.
pub(crate) fn inject_keys(body: &str, pairs: &[(&str, &str)]) -> Cow<'static, [u8]> {
    let trimmed = body.trim_start();
    let Some(rest) = trimmed.strip_prefix('{') else {
        return Cow::Owned(body.as_bytes().to_vec());
    };
    let mut out = Vec::with_capacity(body.len() + 128);
    out.push(b'{');
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        sluice_core::format::write_json_str(&mut out, k);
        out.push(b':');
        sluice_core::format::write_json_str(&mut out, v);
    }
    if !rest.trim_start().starts_with('}') {
        out.push(b',');
    }
    out.extend_from_slice(rest.as_bytes());
    Cow::Owned(out)
}

/// Builds a JSON event and checks every attribute (values come from the payload).
pub(crate) fn json_event(
    id: String,
    source: String,
    ty: String,
    subject: Option<String>,
    time: Option<Timestamp>,
    data: Bytes,
) -> Result<Event, Refusal> {
    // Typed JSON but not marked as checked: the payload's tokens were not all read (see
    // [`Doc`]), so an encoder that embeds it checks it first.
    let mut e = Event::new(id, source, ty)
        .with_time(time.unwrap_or_else(Timestamp::now))
        .with_data(Some("application/json".into()), Data::Binary(data));
    e.subject = subject.map(Into::into);
    e.validate().map_err(|err| {
        Refusal::bad_request("invalid_event", format!("cannot make a CloudEvent: {err}"))
    })?;
    Ok(e)
}

/// The Argo shape's event: type, source and subject from the route (Argo's EventSource type,
/// EventSource and event names), receipt time, our stable id.
pub(crate) fn argo_verdict(
    id: String,
    naming: &Naming<'_>,
    data: Bytes,
) -> Result<Verdict, Refusal> {
    let event = json_event(
        id,
        naming.source.to_owned(),
        naming.ty.to_owned(),
        Some(naming.subject.to_owned()),
        None,
        data,
    )?;
    Ok(Verdict::Event {
        event,
        fresh: false,
    })
}

/// An event whose data is the body as sent, typed by the request's `Content-Type`
/// (`application/octet-stream` without one); every attribute checked.
pub(crate) fn body_event(
    req: &Request<'_>,
    id: String,
    source: String,
    ty: String,
    subject: Option<String>,
    time: Option<Timestamp>,
) -> Result<Event, Refusal> {
    let ct = req
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream")
        .to_owned();
    let mut e = Event::new(id, source, ty)
        .with_time(time.unwrap_or_else(Timestamp::now))
        .with_data(Some(ct), sluice_core::event::Data::Binary(req.body.clone()));
    e.subject = subject.map(Into::into);
    e.validate().map_err(|err| {
        Refusal::bad_request("invalid_event", format!("cannot make a CloudEvent: {err}"))
    })?;
    Ok(e)
}

/// `{key: value}` (the first value of each key) for a urlencoded form.
pub(crate) fn form_object(input: &[u8]) -> Bytes {
    let mut map: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in form_urlencoded::parse(input) {
        map.entry(k.into_owned()).or_insert_with(|| v.into_owned());
    }
    Bytes::from(serde_json::to_vec(&map).unwrap_or_else(|_| b"{}".to_vec()))
}

/// The value of `key` in a urlencoded form.
pub(crate) fn form_value(input: &[u8], key: &str) -> Option<String> {
    form_urlencoded::parse(input)
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

/// Whether the request's content type is `application/x-www-form-urlencoded`.
pub(crate) fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| {
            v.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn a_broken_literal_that_ends_inside_a_character_is_a_400_not_a_panic() {
        // gjson takes `t`, `f` and `n` tokens by their length without reading them; where that
        // length ends inside a character, the body is refused (before: a slice panic).
        for body in [
            "{\"a\":tx\u{20ac}}",
            "{\"a\":fals\u{e9}}",
            "{\"a\":1,\"b\":nx\u{20ac}}",
        ] {
            let r = std::panic::catch_unwind(|| Doc::parse(body.as_bytes()).is_err());
            assert_eq!(r.ok(), Some(true), "{body}");
        }
        // Where it ends on a boundary, the token is located, not checked (as documented).
        let r = std::panic::catch_unwind(|| Doc::parse("{\"a\":n\u{20ac}}".as_bytes()).is_ok());
        assert_eq!(r.ok(), Some(true));
    }

    #[test]
    fn doc_paths_match_gjson_over_the_whole_text() {
        let j = br#"{"a":{"b":[{"c":"x"}],"n":7},"s":"t\u00e9","e":"","z":null,"t":"2019-05-15T15:20:33Z"}"#;
        let d = Doc::parse(j).unwrap();
        assert!(d.top.is_some());
        let text = std::str::from_utf8(j).unwrap();
        for p in ["a.b.0.c", "a.n", "s", "e", "z", "missing", "a.missing", "a"] {
            assert_eq!(d.get(p), text_at(text, p), "{p}");
        }
        assert_eq!(d.get("s").as_deref(), Some("t\u{e9}"));
        assert_eq!(
            d.time(&["z", "t"]).unwrap().as_str(),
            "2019-05-15T15:20:33Z"
        );
        // Escaped keys and non-objects fall back to gjson over the text.
        let d = Doc::parse(br#"{"k\u0065y":"v"}"#).unwrap();
        assert!(d.top.is_none());
        assert!(Doc::parse(b"[1,2]").is_ok());
        assert_eq!(
            Doc::parse(b"{\"a\":").err().unwrap().metric,
            "invalid_event"
        );
        assert_eq!(Doc::parse(b"\xff").err().unwrap().metric, "invalid_event");
    }

    /// Every JSON sample of the provider tests: the scan finds exactly the members serde_json
    /// reads, each with the same raw value; every proper prefix (a cut-off body) is refused.
    #[test]
    fn the_member_scan_agrees_with_serde_json_and_refuses_every_truncation() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/providers");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let body = std::fs::read(&path).unwrap();
            let want: Vec<(String, String)> = serde_json::from_slice::<
                serde_json::Map<String, serde_json::Value>,
            >(&body)
            .unwrap()
            .keys()
            .map(|k| {
                let raw: &serde_json::value::RawValue =
                    serde_json::from_slice::<BTreeMap<&str, &serde_json::value::RawValue>>(&body)
                        .unwrap()[k.as_str()];
                (k.clone(), raw.get().to_owned())
            })
            .collect();
            let doc = Doc::parse(&body).unwrap();
            let mut got: Vec<(String, String)> = doc
                .top
                .as_ref()
                .expect("plain keys")
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            got.sort();
            assert_eq!(got, want, "{}", path.display());
            let end = body.iter().rposition(|b| *b == b'}').unwrap();
            for cut in 0..=end {
                assert!(
                    Doc::parse(&body[..cut]).is_err(),
                    "{} cut at {cut} accepted",
                    path.display()
                );
            }
            seen += 1;
        }
        assert!(seen >= 8, "samples found: {seen}");
        // What the structure check refuses besides cut-off bodies.
        for bad in [
            &br#"{"a":1}}"#[..],
            br#"{"a":1} x"#,
            br#"{"a":1,}"#,
            br#"{"a":{"b":1}"#,
            br#"{"a":"x}"#,
            br#"{1:2}"#,
        ] {
            assert!(Doc::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        for good in [
            &b" {} "[..],
            br#"{"a":[1,{"b":"}"}],"c":"\"}"}"#,
            b"\n{\"a\" : 1 }\n",
        ] {
            assert!(
                Doc::parse(good).is_ok(),
                "{}",
                String::from_utf8_lossy(good)
            );
        }
    }

    #[test]
    fn hex_signatures_match_in_either_case_and_only_as_hex() {
        let keys = Keys::sha256(&[Secret("wrong".into()), Secret("right".into())]);
        let parts: [&[u8]; 2] = [b"a.", b"body"];
        let mut c = aws_lc_rs::hmac::Context::with_key(&aws_lc_rs::hmac::Key::new(
            aws_lc_rs::hmac::HMAC_SHA256,
            b"right",
        ));
        c.update(b"a.body");
        let tag = c.sign();
        let lower = hex::encode(tag.as_ref());
        assert!(keys.verify_any(&parts, [tag.as_ref()]));
        assert_eq!(keys.verify_any_hex(&parts, &lower), Some(true));
        assert_eq!(
            keys.verify_any_hex(&parts, &lower.to_uppercase()),
            Some(true)
        );
        let mixed: String = lower
            .chars()
            .enumerate()
            .map(|(i, c)| {
                if i % 2 == 0 {
                    c.to_ascii_uppercase()
                } else {
                    c
                }
            })
            .collect();
        assert_eq!(keys.verify_any_hex(&parts, &mixed), Some(true));
        // One digit off, one digit short or long, a tag under another key: no match.
        let mut off = lower.clone().into_bytes();
        off[10] = if off[10] == b'0' { b'1' } else { b'0' };
        assert_eq!(
            keys.verify_any_hex(&parts, std::str::from_utf8(&off).unwrap()),
            Some(false)
        );
        assert_eq!(keys.verify_any_hex(&parts, &lower[..62]), Some(false));
        assert_eq!(
            keys.verify_any_hex(&parts, &format!("{lower}00")),
            Some(false)
        );
        assert_eq!(keys.verify_any_hex(&parts, &"ab".repeat(200)), Some(false));
        assert_eq!(keys.verify_any_hex(&[b"other"], &lower), Some(false));
        // Not hex: refused as such (`g`, an odd length, `@` which folds to a backtick).
        for bad in [
            &format!("{}g", &lower[..63]),
            &lower[..63].to_owned(),
            &format!("{}@", &lower[..63]),
        ] {
            assert_eq!(keys.verify_any_hex(&parts, bad), None, "{bad}");
        }
    }

    #[test]
    fn event_filter_patterns() {
        let f = EventFilter::new(&["push".into(), "charge.*".into()]).unwrap();
        assert!(f.allows("push"));
        assert!(f.allows("charge.succeeded"));
        assert!(!f.allows("pull_request"));
        assert!(!f.allows("pushx"));
        assert!(EventFilter::new(&[]).unwrap().allows("anything"));
        assert!(EventFilter::new(&["*".into()]).unwrap().allows("x"));
        assert!(EventFilter::new(&["a*b".into()]).is_err());
        assert!(EventFilter::new(&["é".into(), "ü*".into()])
            .unwrap()
            .allows("üx"));
    }

    #[test]
    fn timestamps_in_both_directions() {
        let tol = Duration::from_secs(300);
        assert!(check_timestamp("t", "1000", 1300, tol).is_ok());
        assert_eq!(
            check_timestamp("t", "1000", 1301, tol).unwrap_err().metric,
            "stale"
        );
        assert_eq!(
            check_timestamp("t", "1302", 1001, tol).unwrap_err().metric,
            "stale"
        );
        assert_eq!(
            check_timestamp("t", "x", 1001, tol).unwrap_err().metric,
            "bad_timestamp"
        );
    }

    #[test]
    fn keys_are_injected_into_objects() {
        let pairs = [("X-GitHub-Event", "push")];
        assert_eq!(
            &inject_keys(r#"{"a":1}"#, &pairs)[..],
            br#"{"X-GitHub-Event":"push","a":1}"#
        );
        assert_eq!(
            &inject_keys(" { } ", &pairs)[..],
            br#"{"X-GitHub-Event":"push" } "#
        );
        assert_eq!(&inject_keys("[1]", &pairs)[..], b"[1]");
    }

    #[test]
    fn times_from_payloads() {
        let j = r#"{"a":"2019-05-15T15:20:33Z","b":1557933633,"c":"2017-09-19T09:58:11+1000","d":null}"#;
        assert_eq!(
            time_at(j, &["d", "a"]).unwrap().as_str(),
            "2019-05-15T15:20:33Z"
        );
        assert_eq!(time_at(j, &["b"]).unwrap().as_str(), "2019-05-15T15:20:33Z");
        assert_eq!(time_at(j, &["c"]).unwrap().as_str(), "2017-09-18T23:58:11Z");
        assert!(time_at(j, &["missing"]).is_none());
        assert_eq!(
            parse_time("2013-12-03 17:23:34 UTC").unwrap().as_str(),
            "2013-12-03T17:23:34Z"
        );
        assert_eq!(
            parse_time("2013-12-03 17:23:34 +0200").unwrap().as_str(),
            "2013-12-03T15:23:34Z"
        );
        assert_eq!(
            unix_time(1515449522000016).unwrap().as_str(),
            "2018-01-08T22:12:02.000016Z"
        );
        assert_eq!(
            unix_time(1515449522000).unwrap().as_str(),
            "2018-01-08T22:12:02Z"
        );
    }

    #[test]
    fn duplicated_and_missing_headers() {
        let mut h = HeaderMap::new();
        assert_eq!(required(&h, "x-sig").unwrap_err().metric, "missing_header");
        h.append("x-sig", "a".parse().unwrap());
        assert_eq!(required(&h, "x-sig").unwrap(), "a");
        h.append("x-sig", "b".parse().unwrap());
        assert_eq!(
            required(&h, "x-sig").unwrap_err().metric,
            "duplicated_header"
        );
    }
}
