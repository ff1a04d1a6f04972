//! The CloudEvents HTTP protocol binding: binary, structured and batched modes.
//!
//! Header values are percent-encoded as the binding demands (space, `"`, `%` and everything
//! outside U+0021..U+007E, byte by byte in UTF-8, uppercase hex). Decoding strips an RFC 7230
//! quoted string, percent-decodes once and rejects invalid UTF-8.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use percent_encoding::{percent_decode, utf8_percent_encode, AsciiSet, CONTROLS};

use crate::event::{
    check_media_type, Data, Event, EventError, ExtValue, Str, Timestamp, SPEC_VERSION,
};
use crate::format::{self, BATCH_CONTENT_TYPE, STRUCTURED_CONTENT_TYPE};

/// How an event travels over HTTP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Attributes in `ce-*` headers, data as the body.
    #[default]
    Binary,
    /// The whole event as `application/cloudevents+json`.
    Structured,
    /// An array of events as `application/cloudevents-batch+json`.
    Batched,
}

/// Built once: a `&str` key would be parsed and lowercased on every lookup.
static CE_SPECVERSION: HeaderName = HeaderName::from_static("ce-specversion");

/// Every byte the binding says must be percent-encoded (non-ASCII is always encoded).
const HEADER_ENCODE: &AsciiSet = &CONTROLS.add(b' ').add(b'"').add(b'%');

/// What a request's headers say it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detected {
    Binary,
    Structured,
    Batched,
    /// Not a CloudEvent: a plain request.
    Plain,
}

/// Reads the content mode from the headers: a `Content-Type` of `application/cloudevents-batch`
/// is batched, `application/cloudevents` is structured, a `ce-specversion` header is binary.
pub fn detect(headers: &HeaderMap) -> Detected {
    detect_from(
        headers.get(CONTENT_TYPE),
        headers.contains_key(&CE_SPECVERSION),
    )
}

/// [`detect`] from what a caller found already: the Content-Type (first value) and whether a
/// `ce-specversion` header is present.
pub fn detect_from(content_type: Option<&HeaderValue>, specversion: bool) -> Detected {
    if let Some(ct) = content_type.and_then(|v| v.to_str().ok()) {
        let ct = ct.trim_start();
        if starts_with_ignore_case(ct, "application/cloudevents-batch") {
            return Detected::Batched;
        }
        if starts_with_ignore_case(ct, "application/cloudevents") {
            return Detected::Structured;
        }
    }
    if specversion {
        Detected::Binary
    } else {
        Detected::Plain
    }
}

fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// Decodes the events a request carries. `Plain` requests are not CloudEvents: `Ok(None)`.
pub fn decode_request(headers: &HeaderMap, body: Bytes) -> Result<Option<Vec<Event>>, EventError> {
    decode_detected(detect(headers), headers, body)
}

/// [`decode_request`] for a request whose mode was [`detect`]ed already.
pub fn decode_detected(
    mode: Detected,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Option<Vec<Event>>, EventError> {
    match mode {
        Detected::Plain => Ok(None),
        Detected::Binary => decode_binary(headers, body).map(|e| Some(vec![e])),
        Detected::Structured => {
            let ct = headers
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let essence = ct.split(';').next().unwrap_or("").trim();
            if !essence.eq_ignore_ascii_case(STRUCTURED_CONTENT_TYPE) {
                return Err(EventError(format!(
                    "structured event format {essence:?} is not supported; \
                     send {STRUCTURED_CONTENT_TYPE} or binary mode"
                )));
            }
            format::decode_event(&body).map(|e| Some(vec![e]))
        }
        Detected::Batched => format::decode_batch(&body).map(Some),
    }
}

/// Decodes one header value: strips a quoted string, percent-decodes once, checks UTF-8.
/// Borrowed from the header when there is nothing to strip or decode (ids, URIs and type names
/// usually), so each attribute is copied once, into its field.
pub fn decode_header_value<'v>(
    name: &str,
    raw: &'v HeaderValue,
) -> Result<std::borrow::Cow<'v, str>, EventError> {
    let not_utf8 = || {
        EventError(format!(
            "header {name} is not valid UTF-8 after percent-decoding"
        ))
    };
    let whole: &'v [u8] = raw.as_bytes();
    let quoted = whole.len() >= 2 && whole[0] == b'"' && whole[whole.len() - 1] == b'"';
    if !quoted && !whole.contains(&b'%') {
        return std::str::from_utf8(whole)
            .map(std::borrow::Cow::Borrowed)
            .map_err(|_| not_utf8());
    }
    let mut bytes = whole;
    let unquoted;
    if quoted {
        let mut out = Vec::with_capacity(bytes.len());
        let mut it = bytes[1..bytes.len() - 1].iter();
        while let Some(&b) = it.next() {
            if b == b'\\' {
                if let Some(&next) = it.next() {
                    out.push(next);
                }
            } else {
                out.push(b);
            }
        }
        unquoted = out;
        bytes = &unquoted;
    }
    let decoded: Vec<u8> = percent_decode(bytes).collect();
    String::from_utf8(decoded)
        .map(std::borrow::Cow::Owned)
        .map_err(|_| not_utf8())
}

/// The value percent-encoded for a `ce-` header, borrowed when nothing needs encoding (the
/// common case: ids, URIs and type names are visible ASCII without `"` or `%`).
pub fn percent_encode_value(value: &str) -> std::borrow::Cow<'_, str> {
    if value
        .bytes()
        .all(|b| (0x21..=0x7e).contains(&b) && b != b'"' && b != b'%')
    {
        std::borrow::Cow::Borrowed(value)
    } else {
        std::borrow::Cow::Owned(utf8_percent_encode(value, HEADER_ENCODE).to_string())
    }
}

/// Percent-encodes an attribute value for a `ce-` header.
pub fn encode_header_value(value: &str) -> HeaderValue {
    let encoded = utf8_percent_encode(value, HEADER_ENCODE).to_string();
    // Only visible ASCII remains after encoding, which is always a valid header value.
    HeaderValue::from_str(&encoded).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Decodes a binary-mode event from its headers and body.
pub fn decode_binary(headers: &HeaderMap, body: Bytes) -> Result<Event, EventError> {
    let mut event = Event::new(Str::default(), Str::default(), Str::default());
    let mut specversion = None;
    let mut seen = (false, false, false);
    for (name, value) in headers {
        let Some(attr) = name.as_str().strip_prefix("ce-") else {
            continue;
        };
        let v = decode_header_value(name.as_str(), value)?;
        match attr {
            "specversion" => specversion = Some(v),
            "id" => (event.id, seen.0) = (v.into(), true),
            "source" => (event.source, seen.1) = (v.into(), true),
            "type" => (event.ty, seen.2) = (v.into(), true),
            "datacontenttype" => {
                // The binding carries the content type in Content-Type; tolerate the header
                // only when Content-Type is absent.
                if !headers.contains_key(CONTENT_TYPE) {
                    event.datacontenttype = Some(v.into_owned());
                }
            }
            "dataschema" => event.dataschema = Some(v.into_owned()),
            "subject" => event.subject = Some(v.into()),
            "time" => event.time = Some(Timestamp::parse(&v)?),
            ext => {
                if event.extension(ext).is_some() {
                    return Err(EventError(format!("header ce-{ext} appears twice")));
                }
                event
                    .extensions
                    .push((ext.into(), ExtValue::String(v.into())));
            }
        }
    }
    match specversion.as_deref() {
        Some(SPEC_VERSION) => {}
        Some(other) => {
            return Err(EventError(format!(
                "ce-specversion {other:?} is not supported (only \"1.0\")"
            )))
        }
        None => return Err(EventError::new("ce-specversion header is missing")),
    }
    for (present, name) in [
        (seen.0, "ce-id"),
        (seen.1, "ce-source"),
        (seen.2, "ce-type"),
    ] {
        if !present {
            return Err(EventError(format!("{name} header is missing")));
        }
    }
    if let Some(ct) = headers.get(CONTENT_TYPE) {
        let ct = ct
            .to_str()
            .map_err(|_| EventError::new("Content-Type is not visible ASCII"))?;
        check_media_type(ct)?;
        event.datacontenttype = Some(ct.to_owned());
    }
    event.data = if body.is_empty() {
        Data::None
    } else {
        Data::from_bytes(body, event.datacontenttype.as_deref())
    };
    event.validate()?;
    Ok(event)
}

/// Appends the binary-mode headers for `event` (`ce-*` plus `Content-Type`) to `headers`; the
/// body is the event's data bytes.
pub fn encode_binary_headers(event: &Event, headers: &mut HeaderMap) {
    headers.insert("ce-specversion", HeaderValue::from_static(SPEC_VERSION));
    headers.insert("ce-id", encode_header_value(&event.id));
    headers.insert("ce-source", encode_header_value(&event.source));
    headers.insert("ce-type", encode_header_value(&event.ty));
    if let Some(v) = &event.dataschema {
        headers.insert("ce-dataschema", encode_header_value(v));
    }
    if let Some(v) = &event.subject {
        headers.insert("ce-subject", encode_header_value(v));
    }
    if let Some(v) = &event.time {
        headers.insert("ce-time", encode_header_value(v.as_str()));
    }
    for (name, value) in &event.extensions {
        if let Ok(h) = HeaderName::from_bytes(format!("ce-{name}").as_bytes()) {
            headers.insert(h, encode_header_value(&value.to_canonical()));
        }
    }
    if let Some(ct) = &event.datacontenttype {
        if let Ok(v) = HeaderValue::from_str(ct) {
            headers.insert(CONTENT_TYPE, v);
        }
    }
}

/// The body for `event` in binary mode.
pub fn binary_body(event: &Event) -> Bytes {
    event.data.as_bytes().cloned().unwrap_or_default()
}

/// Structured mode: `(content type, body)`.
pub fn encode_structured(event: &Event) -> (HeaderValue, Bytes) {
    (
        HeaderValue::from_static(STRUCTURED_CONTENT_TYPE),
        Bytes::from(format::encode_event(event)),
    )
}

/// Batched mode: `(content type, body)`.
pub fn encode_batched(events: &[Event]) -> (HeaderValue, Bytes) {
    (
        HeaderValue::from_static(BATCH_CONTENT_TYPE),
        Bytes::from(format::encode_batch(events)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn percent_encoding_follows_the_binding() {
        assert!(matches!(
            percent_encode_value("com.example/x?y=1"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(percent_encode_value("a b"), "a%20b");
        assert_eq!(
            encode_header_value("Euro € 😀"),
            "Euro%20%E2%82%AC%20%F0%9F%98%80"
        );
        assert_eq!(encode_header_value("a\"b%c"), "a%22b%25c");
        assert_eq!(encode_header_value("!~/:?"), "!~/:?");
        let v = HeaderValue::from_static("Euro%20%E2%82%AC%20%F0%9F%98%80");
        assert_eq!(decode_header_value("ce-x", &v).unwrap(), "Euro € 😀");
        // Quoted strings are stripped before the one round of percent-decoding.
        let v = HeaderValue::from_static("\"a%20\\\"b\"");
        assert_eq!(decode_header_value("ce-x", &v).unwrap(), "a \"b");
        // Only one round: %2520 decodes to %20, not to a space.
        let v = HeaderValue::from_static("%2520");
        assert_eq!(decode_header_value("ce-x", &v).unwrap(), "%20");
        // Overlong encodings are invalid UTF-8.
        let v = HeaderValue::from_static("%C0%A0");
        assert!(decode_header_value("ce-x", &v).is_err());
        // Nothing to strip or decode: the header's own text, borrowed.
        let v = HeaderValue::from_static("orders-1-42");
        let plain = decode_header_value("ce-id", &v).unwrap();
        assert!(matches!(plain, std::borrow::Cow::Borrowed("orders-1-42")));
        // Quoted without a `%`: still stripped.
        let v = HeaderValue::from_static("\"a\\\"b\"");
        assert_eq!(decode_header_value("ce-x", &v).unwrap(), "a\"b");
        // Raw bytes that are not UTF-8 fail on the borrowed path too.
        let v = HeaderValue::from_bytes(b"caf\xe9").unwrap();
        assert!(decode_header_value("ce-x", &v).is_err());
    }

    #[test]
    fn detect_modes() {
        assert_eq!(
            detect(&headers(&[(
                "content-type",
                "application/cloudevents+json; charset=utf-8"
            )])),
            Detected::Structured
        );
        assert_eq!(
            detect(&headers(&[(
                "content-type",
                "application/cloudevents-batch+json"
            )])),
            Detected::Batched
        );
        assert_eq!(
            detect(&headers(&[
                ("ce-specversion", "1.0"),
                ("content-type", "application/json")
            ])),
            Detected::Binary
        );
        assert_eq!(
            detect(&headers(&[("content-type", "application/json")])),
            Detected::Plain
        );
    }

    #[test]
    fn binary_roundtrip_with_extensions() {
        let mut e = Event::new("id 1", "/my-context?a=b&c=%20", "com.example.t")
            .with_subject("sub/ject")
            .with_time(Timestamp::parse("2018-04-05T03:56:24Z").unwrap())
            .with_json(&br#"{"a":"b"}"#[..]);
        e.set_extension(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        );
        e.set_extension("comexampleext", "ü");
        let mut h = HeaderMap::new();
        encode_binary_headers(&e, &mut h);
        assert_eq!(h["ce-id"], "id%201");
        assert!(!h.contains_key("ce-datacontenttype"));
        let back = decode_binary(&h, binary_body(&e)).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn binary_requires_core_headers() {
        let h = headers(&[("ce-specversion", "1.0"), ("ce-id", "1"), ("ce-type", "t")]);
        let err = decode_binary(&h, Bytes::new()).unwrap_err();
        assert!(err.0.contains("ce-source"), "{err}");
        let h = headers(&[
            ("ce-specversion", "0.3"),
            ("ce-id", "1"),
            ("ce-type", "t"),
            ("ce-source", "/s"),
        ]);
        assert!(decode_binary(&h, Bytes::new()).is_err());
    }

    #[test]
    fn structured_rejects_unknown_formats() {
        let h = headers(&[("content-type", "application/cloudevents+avro")]);
        assert!(decode_request(&h, Bytes::from_static(b"x")).is_err());
    }
}
