//! The CloudEvents Kafka protocol binding, independent of any Kafka client: binary mode uses
//! `ce_<name>` headers (UTF-8 values, no percent-encoding) and `content-type` for
//! `datacontenttype`; structured mode sets `content-type: application/cloudevents+json`.
//!
//! The same rules with another prefix serve other bindings whose attributes are plain strings:
//! the Pub/Sub binding is `ce-<name>` attributes, matched in any case
//! ([`decode_prefixed`], [`encode_binary_headers_prefixed`]).

use std::borrow::Cow;

use bytes::Bytes;

use crate::event::{
    check_media_type, Data, Event, EventError, ExtValue, Str, Timestamp, SPEC_VERSION,
};
use crate::format;

/// Decodes a Kafka record's headers and payload into an event. Header names are matched
/// case-sensitively, as Kafka header keys are.
pub fn decode(headers: &[(&str, &[u8])], payload: Option<Bytes>) -> Result<Event, EventError> {
    decode_prefixed("ce_", false, headers, payload)
}

/// [`decode`] for attributes named `<prefix><attribute>`; `fold_case`: names are matched in
/// any case (the Pub/Sub binding says attribute names are case-insensitive).
pub fn decode_prefixed<'a>(
    prefix: &str,
    fold_case: bool,
    headers: &[(&str, &'a [u8])],
    payload: Option<Bytes>,
) -> Result<Event, EventError> {
    // Borrowed: each attribute is copied once, into its field (inline when short).
    let utf8 = |name: &str, v: &'a [u8]| -> Result<&'a str, EventError> {
        std::str::from_utf8(v).map_err(|_| EventError(format!("header {name} is not UTF-8")))
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
    let mut event = Event::new(Str::default(), Str::default(), Str::default());
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
            "id" => event.id = v.into(),
            "source" => event.source = v.into(),
            "type" => event.ty = v.into(),
            "dataschema" => event.dataschema = Some(v.to_owned()),
            "subject" => event.subject = Some(v.into()),
            "time" => event.time = Some(Timestamp::parse(v)?),
            "datacontenttype" => {}
            ext => event
                .extensions
                .push((ext.into(), ExtValue::String(v.into()))),
        }
    }
    match specversion {
        Some(SPEC_VERSION) => {}
        Some(v) => {
            return Err(EventError(format!(
                "{prefix}specversion {v:?} is not supported"
            )))
        }
        None => return Err(EventError(format!("{prefix}specversion header is missing"))),
    }
    if let Some(ct) = content_type {
        check_media_type(ct)?;
        event.datacontenttype = Some(ct.to_owned());
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
    binary_headers(prefix, event)
        .into_iter()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// The CloudEvents attributes besides `datacontenttype`, in the order binary mode writes them.
const ATTRS: [&str; 7] = [
    "specversion",
    "id",
    "source",
    "type",
    "dataschema",
    "subject",
    "time",
];
const UNDERSCORED: [&str; 7] = [
    "ce_specversion",
    "ce_id",
    "ce_source",
    "ce_type",
    "ce_dataschema",
    "ce_subject",
    "ce_time",
];
const DASHED: [&str; 7] = [
    "ce-specversion",
    "ce-id",
    "ce-source",
    "ce-type",
    "ce-dataschema",
    "ce-subject",
    "ce-time",
];

/// The name of `ATTRS[i]` under `prefix`: static for the bindings' own prefixes.
fn attr_name(prefix: &str, i: usize) -> Cow<'static, str> {
    match prefix {
        "ce_" => Cow::Borrowed(UNDERSCORED[i]),
        "ce-" => Cow::Borrowed(DASHED[i]),
        "" => Cow::Borrowed(ATTRS[i]),
        p => Cow::Owned(prefixed(p, ATTRS[i])),
    }
}

fn prefixed(prefix: &str, name: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + name.len());
    s.push_str(prefix);
    s.push_str(name);
    s
}

/// [`encode_binary_headers_prefixed`] without copies: the names of the attributes are static
/// (under `ce_`, `ce-` or no prefix) and the values are borrowed from the event, except an
/// extension's name and a non-string extension's text. For a sink that writes the headers out
/// at once.
pub fn binary_headers<'e>(
    prefix: &str,
    event: &'e Event,
) -> Vec<(Cow<'static, str>, Cow<'e, [u8]>)> {
    let mut h = Vec::with_capacity(8 + event.extensions.len());
    let mut put =
        |i: usize, v: &'e str| h.push((attr_name(prefix, i), Cow::Borrowed(v.as_bytes())));
    put(0, SPEC_VERSION);
    put(1, &event.id);
    put(2, &event.source);
    put(3, &event.ty);
    let optional = [
        event.dataschema.as_deref(),
        event.subject.as_deref(),
        event.time.as_ref().map(Timestamp::as_str),
    ];
    for (i, v) in optional.into_iter().enumerate() {
        if let Some(v) = v {
            put(4 + i, v);
        }
    }
    if let Some(ct) = &event.datacontenttype {
        h.push((Cow::Borrowed("content-type"), Cow::Borrowed(ct.as_bytes())));
    }
    for (name, value) in &event.extensions {
        let value = match value.to_canonical() {
            Cow::Borrowed(v) => Cow::Borrowed(v.as_bytes()),
            Cow::Owned(v) => Cow::Owned(v.into_bytes()),
        };
        h.push((Cow::Owned(prefixed(prefix, name)), value));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_and_built_names_agree_for_every_prefix() {
        let mut e = Event::new("1", "/s", "t")
            .with_subject("sub")
            .with_time(Timestamp::parse("2026-12-03T10:00:00Z").unwrap())
            .with_json(&b"{}"[..]);
        e.dataschema = Some("https://x/s".into());
        e.set_extension("traceparent", "00-x");
        e.set_extension("n", ExtValue::Integer(7));
        for prefix in ["ce_", "ce-", "", "x-ce-"] {
            let h = binary_headers(prefix, &e);
            let names: Vec<&str> = h.iter().map(|(k, _)| k.as_ref()).collect();
            let want: Vec<String> = ATTRS
                .iter()
                .map(|a| format!("{prefix}{a}"))
                .chain(["content-type".to_owned()])
                .chain(["traceparent", "n"].iter().map(|x| format!("{prefix}{x}")))
                .collect();
            assert_eq!(names, want, "{prefix:?}");
            let values: Vec<&[u8]> = h.iter().map(|(_, v)| v.as_ref()).collect();
            assert_eq!(
                values,
                [
                    &b"1.0"[..],
                    b"1",
                    b"/s",
                    b"t",
                    b"https://x/s",
                    b"sub",
                    b"2026-12-03T10:00:00Z",
                    b"application/json",
                    b"00-x",
                    b"7"
                ]
            );
        }
    }

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
