//! The CloudEvents NATS protocol binding, read side: binary mode (`ce-*` headers, values
//! percent-encoded as in the HTTP binding, data as the payload) and structured mode
//! (`Content-Type: application/cloudevents+json`). The write side lives in the sink.

use async_nats::{HeaderMap, HeaderName};
use bytes::Bytes;
use sluice_core::event::{Event, EventError};
use sluice_core::{format, http_binding};

/// What a NATS message carries.
pub enum Decoded {
    /// A CloudEvent (binary or structured): passed through intact, never re-wrapped.
    Event(Box<Event>),
    /// Not a CloudEvent: the source wraps it.
    Plain,
}

fn name(k: &HeaderName) -> &str {
    k.as_ref()
}

fn content_type(headers: &HeaderMap) -> Option<&str> {
    headers
        .iter()
        .find(|(k, _)| name(k).eq_ignore_ascii_case("content-type"))
        .and_then(|(_, v)| v.first())
        .map(|v| v.as_str())
}

/// The content type of a plain message, if it names one.
pub fn plain_content_type(headers: Option<&HeaderMap>) -> Option<String> {
    headers.and_then(content_type).map(str::to_owned)
}

/// Decodes a message's headers and payload. A message with `ce-specversion` or a structured
/// content type must be a valid CloudEvent; anything else is [`Decoded::Plain`].
pub fn decode(headers: Option<&HeaderMap>, payload: &Bytes) -> Result<Decoded, EventError> {
    let Some(headers) = headers else {
        return Ok(Decoded::Plain);
    };
    if let Some(ct) = content_type(headers) {
        if let Some(structured) = format::structured_by_content_type(ct, payload) {
            return structured.map(|e| Decoded::Event(Box::new(e)));
        }
    }
    let binary = headers
        .iter()
        .any(|(k, _)| name(k).eq_ignore_ascii_case("ce-specversion"));
    if !binary {
        return Ok(Decoded::Plain);
    }
    // Reuse the HTTP binding's rules (percent-decoding, required attributes, validation) over
    // the same header names.
    // Sized for the usual few: `with_capacity` panics past 24 576 (a message may carry more
    // header names than that; only the relevant ones are kept).
    let mut map = http::HeaderMap::with_capacity(headers.len().min(64));
    for (key, values) in headers.iter() {
        let lower = self::name(key).to_ascii_lowercase();
        let relevant = lower.starts_with("ce-") || lower == "content-type";
        let Ok(n) = http::HeaderName::from_bytes(lower.as_bytes()) else {
            if relevant {
                return Err(EventError(format!("header {lower:?} is not a valid name")));
            }
            continue;
        };
        if !relevant {
            continue;
        }
        for v in values {
            let v = http::HeaderValue::from_str(v.as_str()).map_err(|_| {
                EventError(format!(
                    "header {lower} has a value that is not visible ASCII"
                ))
            })?;
            map.try_append(n.clone(), v).map_err(|_| {
                EventError("more CloudEvents headers than a header map holds".to_string())
            })?;
        }
    }
    http_binding::decode_binary(&map, payload.clone()).map(|e| Decoded::Event(Box::new(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_header_names_than_a_header_map_holds_are_refused_not_a_panic() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("ce-specversion", "1.0"),
            ("ce-id", "1"),
            ("ce-source", "/s"),
            ("ce-type", "t"),
        ] {
            h.insert(k, v);
        }
        for i in 0..40_000 {
            h.insert(format!("ce-x{i}").as_str(), "v");
        }
        let r = std::panic::catch_unwind(|| decode(Some(&h), &Bytes::new()).is_err());
        assert_eq!(r.ok(), Some(true));
    }

    #[test]
    fn binary_structured_and_plain_are_told_apart() {
        let mut h = HeaderMap::new();
        h.insert("ce-specversion", "1.0");
        h.insert("ce-id", "a%20b");
        h.insert("ce-source", "/s");
        h.insert("ce-type", "t");
        h.insert("ce-traceparent", "x");
        h.insert("Content-Type", "application/json");
        let Decoded::Event(e) = decode(Some(&h), &Bytes::from_static(b"{\"a\":1}")).unwrap() else {
            panic!("binary")
        };
        assert_eq!((e.id.as_str(), e.ty.as_str()), ("a b", "t"));
        assert_eq!(e.datacontenttype.as_deref(), Some("application/json"));
        assert!(e.extension("traceparent").is_some());

        let mut s = HeaderMap::new();
        s.insert(
            "content-type",
            "application/cloudevents+json; charset=utf-8",
        );
        let body = Bytes::from_static(
            br#"{"specversion":"1.0","id":"9","source":"/x","type":"y","data":{"k":2}}"#,
        );
        let Decoded::Event(e) = decode(Some(&s), &body).unwrap() else {
            panic!("structured")
        };
        assert_eq!(e.id, "9");

        let mut p = HeaderMap::new();
        p.insert("Content-Type", "text/plain");
        assert!(matches!(decode(Some(&p), &body).unwrap(), Decoded::Plain));
        assert!(matches!(decode(None, &body).unwrap(), Decoded::Plain));

        let mut bad = HeaderMap::new();
        bad.insert("ce-specversion", "1.0");
        bad.insert("ce-id", "1");
        let err = decode(Some(&bad), &body).err().unwrap();
        assert!(err.0.contains("ce-source"), "{err}");
        let mut batch = HeaderMap::new();
        batch.insert("Content-Type", "application/cloudevents-batch+json");
        assert!(decode(Some(&batch), &body).is_err());
    }
}
