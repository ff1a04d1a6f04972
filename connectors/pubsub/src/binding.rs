//! The CloudEvents Pub/Sub protocol binding (cloudevents/spec `pubsub-protocol-binding.md`).
//!
//! Read side: an attribute `Content-Type` starting with `application/cloudevents` is structured
//! mode (only the JSON format is understood); `ce-specversion` is binary mode (`ce-<name>`
//! attributes, names in any case, values as plain strings, `Content-Type` as
//! `datacontenttype`, the message data as the event data); anything else is a plain message
//! the source wraps. Write side: binary mode unless the event does not fit Pub/Sub's attribute
//! limits, then structured.

use std::collections::HashMap;

use bytes::Bytes;
use sluice_core::event::{Data, Event, EventError};
use sluice_core::{format, kafka_binding};

/// Pub/Sub's limits on attributes: 100 per message, names up to 256 bytes, values up to 1024.
pub const MAX_ATTRIBUTES: usize = 100;
pub(crate) const MAX_ATTRIBUTE_NAME: usize = 256;
pub(crate) const MAX_ATTRIBUTE_VALUE: usize = 1024;

/// What a message carries.
pub enum Decoded {
    /// A CloudEvent (binary or structured): passed through intact, never re-wrapped.
    Event(Box<Event>),
    /// Not a CloudEvent.
    Plain,
}

/// The `Content-Type` attribute, in any case.
pub fn content_type(attrs: &HashMap<String, String>) -> Option<&str> {
    attrs
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.as_str())
}

/// Decodes a message's attributes and data. A message with `ce-specversion` or a structured
/// content type must be a valid CloudEvent; anything else is [`Decoded::Plain`].
pub fn decode(attrs: &HashMap<String, String>, data: &Bytes) -> Result<Decoded, EventError> {
    if let Some(ct) = content_type(attrs) {
        if let Some(structured) = format::structured_by_content_type(ct, data) {
            return structured.map(|e| Decoded::Event(Box::new(e)));
        }
    }
    if !attrs
        .keys()
        .any(|k| k.eq_ignore_ascii_case("ce-specversion"))
    {
        return Ok(Decoded::Plain);
    }
    // `ce-datacontenttype` (as the binding's own example writes it) stands for `Content-Type`
    // when that is absent.
    let has_ct = content_type(attrs).is_some();
    let pairs: Vec<(&str, &[u8])> = attrs
        .iter()
        .map(|(k, v)| {
            if !has_ct && k.eq_ignore_ascii_case("ce-datacontenttype") {
                ("content-type", v.as_bytes())
            } else {
                (k.as_str(), v.as_bytes())
            }
        })
        .collect();
    let payload = (!data.is_empty()).then(|| data.clone());
    kafka_binding::decode_prefixed("ce-", true, &pairs, payload)
        .map(|e| Decoded::Event(Box::new(e)))
}

/// How the sink writes an event into a message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `ce-*` attributes and `content-type`, the data as the message data (default). An event
    /// that does not fit Pub/Sub's attribute limits (100 attributes, values up to 1024 bytes)
    /// is sent structured.
    #[default]
    Binary,
    /// The JSON event as the data, attribute `content-type: application/cloudevents+json`.
    Structured,
}

/// A message's data and attributes for `e`.
pub fn encode(e: &Event, mode: Mode) -> (Bytes, HashMap<String, String>) {
    if mode == Mode::Binary {
        let headers = kafka_binding::encode_binary_headers_prefixed("ce-", e);
        let fits = headers.len() <= MAX_ATTRIBUTES
            && headers.iter().all(|(k, v)| {
                k.len() <= MAX_ATTRIBUTE_NAME
                    && v.len() <= MAX_ATTRIBUTE_VALUE
                    && std::str::from_utf8(v).is_ok()
            });
        if fits {
            // `Content-Type` as the binding spells it (Pub/Sub attribute names are
            // case-sensitive; readers here match it in any case).
            let attrs = headers
                .into_iter()
                .map(|(k, v)| {
                    let k = if k == "content-type" {
                        "Content-Type".to_owned()
                    } else {
                        k
                    };
                    (k, String::from_utf8(v).unwrap_or_default())
                })
                .collect();
            let data = match &e.data {
                Data::None => Bytes::new(),
                d => d.as_bytes().cloned().unwrap_or_default(),
            };
            return (data, attrs);
        }
    }
    let mut attrs = HashMap::with_capacity(1);
    attrs.insert(
        "Content-Type".to_owned(),
        format!("{}; charset=utf-8", format::STRUCTURED_CONTENT_TYPE),
    );
    (Bytes::from(format::encode_event(e)), attrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn binary_structured_and_plain_are_told_apart() {
        // The binding's own binary example: `ce-datacontenttype`, no Content-Type.
        let a = map(&[
            ("ce-specversion", "1.0"),
            ("ce-type", "com.example.someevent"),
            ("ce-time", "2020-03-10T03:56:24Z"),
            ("ce-id", "1234-1234-1234"),
            ("ce-source", "/mycontext/subcontext"),
            ("CE-Traceparent", "00-abc"),
            ("ce-datacontenttype", "application/json; charset=utf-8"),
        ]);
        let Decoded::Event(e) = decode(&a, &Bytes::from_static(b"{\"a\":1}")).unwrap() else {
            panic!("binary")
        };
        assert_eq!(
            (e.id.as_str(), e.ty.as_str()),
            ("1234-1234-1234", "com.example.someevent")
        );
        assert_eq!(
            e.datacontenttype.as_deref(),
            Some("application/json; charset=utf-8")
        );
        assert!(e.extension("traceparent").is_some());
        assert_eq!(e.time.as_ref().unwrap().as_str(), "2020-03-10T03:56:24Z");

        let s = map(&[(
            "Content-Type",
            "application/cloudevents+json; charset=utf-8",
        )]);
        let body = Bytes::from_static(
            br#"{"specversion":"1.0","id":"9","source":"/x","type":"y","data":{"k":2}}"#,
        );
        let Decoded::Event(e) = decode(&s, &body).unwrap() else {
            panic!("structured")
        };
        assert_eq!(e.id, "9");

        assert!(matches!(
            decode(&map(&[("content-type", "text/plain")]), &body).unwrap(),
            Decoded::Plain
        ));
        assert!(matches!(
            decode(&HashMap::new(), &body).unwrap(),
            Decoded::Plain
        ));
        let err = decode(&map(&[("ce-specversion", "1.0"), ("ce-id", "1")]), &body)
            .err()
            .unwrap();
        assert!(err.0.contains("source"), "{err}");
        assert!(decode(
            &map(&[("content-type", "application/cloudevents-batch+json")]),
            &body
        )
        .is_err());
    }

    #[test]
    fn encode_round_trips_and_falls_back_to_structured() {
        let mut e = Event::new("1", "/s", "t").with_json(&b"{\"a\":1}"[..]);
        e.set_extension("partitionkey", "k1");
        let (data, attrs) = encode(&e, Mode::Binary);
        assert_eq!(attrs.get("ce-id").map(String::as_str), Some("1"));
        assert_eq!(
            attrs.get("Content-Type").map(String::as_str),
            Some("application/json")
        );
        let Decoded::Event(back) = decode(&attrs, &data).unwrap() else {
            panic!("binary")
        };
        assert_eq!(*back, e);

        let (data, attrs) = encode(&e, Mode::Structured);
        let Decoded::Event(back) = decode(&attrs, &data).unwrap() else {
            panic!("structured")
        };
        assert_eq!(*back, e);

        // A value over Pub/Sub's 1024-byte limit: structured, so nothing is cut.
        let mut big = e.clone();
        big.set_extension("note", "x".repeat(2000));
        let (data, attrs) = encode(&big, Mode::Binary);
        assert_eq!(attrs.len(), 1);
        let Decoded::Event(mut back) = decode(&attrs, &data).unwrap() else {
            panic!("fallback")
        };
        // The JSON format keeps no order among extensions.
        back.extensions.sort_by(|a, b| a.0.cmp(&b.0));
        big.extensions.sort_by(|a, b| a.0.cmp(&b.0));
        assert!(*back == big, "structured fallback round trip");
    }
}
