//! The CloudEvents Kafka protocol binding, independent of any Kafka client: binary mode uses
//! `ce_<name>` headers (UTF-8 values, no percent-encoding) and `content-type` for
//! `datacontenttype`; structured mode sets `content-type: application/cloudevents+json`.
//!
//! The same rules with another prefix serve other bindings whose attributes are plain strings:
//! the Pub/Sub binding is `ce-<name>` attributes, matched in any case
//! ([`decode_prefixed`], [`encode_binary_headers_prefixed`]).

use bytes::Bytes;

use crate::event::{check_media_type, Data, Event, EventError, ExtValue, Timestamp, SPEC_VERSION};
use crate::format;

/// Decodes a Kafka record's headers and payload into an event. Header names are matched
/// case-sensitively, as Kafka header keys are.
pub fn decode(headers: &[(&str, &[u8])], payload: Option<Bytes>) -> Result<Event, EventError> {
    decode_prefixed("ce_", false, headers, payload)
}

/// [`decode`] for attributes named `<prefix><attribute>`; `fold_case`: names are matched in
/// any case (the Pub/Sub binding says attribute names are case-insensitive).
pub fn decode_prefixed(
    prefix: &str,
    fold_case: bool,
    headers: &[(&str, &[u8])],
    payload: Option<Bytes>,
) -> Result<Event, EventError> {
    let utf8 = |name: &str, v: &[u8]| {
        std::str::from_utf8(v)
            .map(str::to_owned)
            .map_err(|_| EventError(format!("header {name} is not UTF-8")))
    };
    // Header keys are case-sensitive in Kafka; `content-type` is matched in any case, since
    // producers write `Content-Type` too.
    let content_type = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| utf8("content-type", v))
        .transpose()?;
    if let Some(ct) = &content_type {
        if let Some(structured) =
            format::structured_by_content_type(ct, &payload.clone().unwrap_or_default())
        {
            return structured;
        }
    }
    let mut event = Event::new(String::new(), String::new(), String::new());
    let mut specversion = None;
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("content-type") {
            continue; // datacontenttype, above
        }
        let attr = if fold_case {
            match name.get(..prefix.len()) {
                Some(p) if p.eq_ignore_ascii_case(prefix) => {
                    std::borrow::Cow::Owned(name[prefix.len()..].to_ascii_lowercase())
                }
                _ => continue,
            }
        } else {
            match name.strip_prefix(prefix) {
                Some(a) => std::borrow::Cow::Borrowed(a),
                None => continue,
            }
        };
        let v = utf8(name, value)?;
        match &*attr {
            "specversion" => specversion = Some(v),
            "id" => event.id = v,
            "source" => event.source = v,
            "type" => event.ty = v,
            "dataschema" => event.dataschema = Some(v),
            "subject" => event.subject = Some(v),
            "time" => event.time = Some(Timestamp::parse(&v)?),
            "datacontenttype" => {}
            ext => event.extensions.push((ext.to_owned(), ExtValue::String(v))),
        }
    }
    match specversion.as_deref() {
        Some(SPEC_VERSION) => {}
        Some(v) => {
            return Err(EventError(format!(
                "{prefix}specversion {v:?} is not supported"
            )))
        }
        None => return Err(EventError(format!("{prefix}specversion header is missing"))),
    }
    if let Some(ct) = content_type {
        check_media_type(&ct)?;
        event.datacontenttype = Some(ct);
    }
    event.data = match payload {
        None => Data::None,
        Some(b) => Data::from_bytes(b, event.datacontenttype.as_deref()),
    };
    event.validate()?;
    Ok(event)
}

/// Binary-mode headers for `event`; the payload is its data (`None` for no data, which is a
/// tombstone on a compacted topic).
pub fn encode_binary_headers(event: &Event) -> Vec<(String, Vec<u8>)> {
    encode_binary_headers_prefixed("ce_", event)
}

/// [`encode_binary_headers`] with attributes named `<prefix><attribute>`.
pub fn encode_binary_headers_prefixed(prefix: &str, event: &Event) -> Vec<(String, Vec<u8>)> {
    let named = |a: &str| format!("{prefix}{a}");
    let mut h = vec![
        (named("specversion"), SPEC_VERSION.as_bytes().to_vec()),
        (named("id"), event.id.as_bytes().to_vec()),
        (named("source"), event.source.as_bytes().to_vec()),
        (named("type"), event.ty.as_bytes().to_vec()),
    ];
    let optional = [
        (named("dataschema"), event.dataschema.as_deref()),
        (named("subject"), event.subject.as_deref()),
        (named("time"), event.time.as_ref().map(Timestamp::as_str)),
        ("content-type".to_owned(), event.datacontenttype.as_deref()),
    ];
    for (k, v) in optional {
        if let Some(v) = v {
            h.push((k, v.as_bytes().to_vec()));
        }
    }
    for (name, value) in &event.extensions {
        h.push((named(name), value.to_canonical().as_bytes().to_vec()));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_roundtrip() {
        let mut e = Event::new("1", "/s", "t").with_json(&b"{\"a\":1}"[..]);
        e.set_extension("partitionkey", "k1");
        let headers = encode_binary_headers(&e);
        let refs: Vec<(&str, &[u8])> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let back = decode(&refs, e.data.as_bytes().cloned()).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn a_prefix_matched_in_any_case() {
        let mut e = Event::new("1", "/s", "t").with_json(&b"{\"a\":1}"[..]);
        e.set_extension("traceparent", "00-x");
        let headers = encode_binary_headers_prefixed("ce-", &e);
        assert!(headers.iter().any(|(k, _)| k == "ce-id"));
        let upper: Vec<(String, Vec<u8>)> = headers
            .into_iter()
            .map(|(k, v)| (k.to_ascii_uppercase(), v))
            .collect();
        let refs: Vec<(&str, &[u8])> = upper
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let back = decode_prefixed("ce-", true, &refs, e.data.as_bytes().cloned()).unwrap();
        assert_eq!(back, e);
        let err = decode_prefixed("ce-", false, &refs, None).unwrap_err();
        assert!(err.0.contains("ce-specversion"), "{err}");
    }
}
