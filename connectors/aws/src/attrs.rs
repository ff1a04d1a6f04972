//! SQS and SNS message attributes ↔ CloudEvents.
//!
//! There is no CloudEvents binding for SQS or SNS; Sluice uses the Kafka binding's names, as its
//! Redis Streams connector does: binary mode puts each attribute in a message attribute
//! `ce_<name>` (type `String`) and `datacontenttype` in `content-type`, the data is the body;
//! structured mode sets `content-type: application/cloudevents+json` and the JSON event is the
//! body. SQS and SNS allow 10 message attributes per message, so an event with more attributes
//! than that is sent structured (see the sink).

use std::collections::HashMap;

use base64::Engine as _;
use bytes::Bytes;
use sluice_core::event::{
    check_extension_name, extension_name_from, Data, Event, EventError, ExtValue,
};
use sluice_core::{format, kafka_binding};

/// One message attribute, whatever service it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Attr {
    /// `String`, `Number`, `Binary`, or one of those with a custom suffix (`String.json`).
    pub data_type: String,
    pub string: Option<String>,
    pub binary: Option<Vec<u8>>,
}

/// Message attributes travel at most 10 to a message (SQS and SNS).
pub(crate) const MAX_ATTRIBUTES: usize = 10;

pub(crate) fn from_sqs(
    attrs: HashMap<String, aws_sdk_sqs::types::MessageAttributeValue>,
) -> Vec<(String, Attr)> {
    let mut v: Vec<(String, Attr)> = attrs
        .into_iter()
        .map(|(k, a)| {
            (
                k,
                Attr {
                    data_type: a.data_type,
                    string: a.string_value,
                    binary: a.binary_value.map(|b| b.into_inner()),
                },
            )
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The attribute's value as text (binary values in base64).
pub(crate) fn text(a: &Attr) -> String {
    match (&a.string, &a.binary) {
        (Some(s), _) => s.clone(),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD.encode(b),
        (None, None) => String::new(),
    }
}

fn content_type(attrs: &[(String, Attr)]) -> Option<&str> {
    attrs
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .and_then(|(_, a)| a.string.as_deref())
}

/// What a message body with its attributes is.
pub(crate) enum Decoded {
    /// A CloudEvent (binary attributes or a structured body), passed through untouched.
    Event(Box<Event>),
    /// Not a CloudEvent.
    Plain,
}

/// Recognises a CloudEvent carried in a message: `ce_specversion` attribute (binary mode), a
/// `content-type` of `application/cloudevents+json`, or a body that is a JSON object with a
/// `specversion` member (a structured event sent without attributes, as most producers do).
pub(crate) fn decode(attrs: &[(String, Attr)], body: &Bytes) -> Result<Decoded, EventError> {
    let binary = attrs.iter().any(|(k, _)| k == "ce_specversion");
    let structured_ct = content_type(attrs).is_some_and(|ct| {
        ct.to_ascii_lowercase()
            .starts_with("application/cloudevents")
    });
    if binary || structured_ct {
        let headers: Vec<(&str, &[u8])> = attrs
            .iter()
            .filter_map(|(k, a)| a.string.as_deref().map(|s| (k.as_str(), s.as_bytes())))
            .collect();
        let payload = (!body.is_empty()).then(|| body.clone());
        return kafka_binding::decode(&headers, payload).map(|e| Decoded::Event(Box::new(e)));
    }
    if format::looks_structured(body) {
        return format::decode_event(body).map(|e| Decoded::Event(Box::new(e)));
    }
    Ok(Decoded::Plain)
}

/// A plain message's data: its `content-type` attribute, else `application/json` for a JSON
/// body and `text/plain` for anything else (SQS bodies are text).
pub(crate) fn plain_data(e: Event, attrs: &[(String, Attr)], body: Bytes) -> Event {
    if body.is_empty() {
        return e;
    }
    let ct = match content_type(attrs) {
        Some(ct) => ct.to_owned(),
        None => sluice_core::event::guess_content_type(&body).to_owned(),
    };
    let data = Data::from_bytes(body, Some(&ct));
    e.with_data(Some(ct), data)
}

/// Message attributes → extensions: names reduced to lowercase letters and digits (CloudEvents
/// rules); attributes whose name is then empty, too long or reserved are left out.
pub(crate) fn add_extensions(e: &mut Event, attrs: &[(String, Attr)]) {
    for (k, a) in attrs {
        if k.eq_ignore_ascii_case("content-type") {
            continue;
        }
        let name = extension_name_from(k);
        if check_extension_name(&name).is_err() || e.extension(&name).is_some() {
            tracing::debug!(attribute = %k, "message attribute not mapped to an extension (its name is reserved or not a valid extension name)");
            continue;
        }
        e.extensions.push((name, ExtValue::String(text(a).into())));
    }
}

/// Argo Events' `messageAttributes` object (the AWS SDK v1 field names).
pub(crate) fn argo_attributes(attrs: &[(String, Attr)]) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (k, a) in attrs {
        let mut o = serde_json::Map::new();
        o.insert("DataType".into(), a.data_type.clone().into());
        if let Some(s) = &a.string {
            o.insert("StringValue".into(), s.clone().into());
        }
        if let Some(b) = &a.binary {
            o.insert(
                "BinaryValue".into(),
                base64::engine::general_purpose::STANDARD.encode(b).into(),
            );
        }
        m.insert(k.clone(), o.into());
    }
    m.into()
}

/// How a sink writes an event into a message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Attributes `ce_*` and `content-type`, the data as the body (default). An event with more
    /// than 10 attributes, or whose data is not text, is sent structured.
    #[default]
    Binary,
    /// The JSON event as the body, `content-type: application/cloudevents+json`.
    Structured,
}

/// A message made from an event: body and `(name, value)` string attributes.
pub(crate) struct Encoded {
    pub body: String,
    pub attrs: Vec<(String, String)>,
}

/// Whether SQS and SNS take `s` as a message body or attribute value: XML 1.0 characters only
/// (`#x9`, `#xA`, `#xD`, `#x20`–`#xD7FF`, `#xE000`–`#xFFFD`, `#x10000`–`#x10FFFF`).
pub(crate) fn allowed_text(s: &str) -> bool {
    s.chars().all(|c| {
        matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
    })
}

/// The message for `e`: binary when `mode` asks for it and the event fits (at most 10
/// attributes, text data SQS and SNS accept, a non-empty body), else structured (JSON escapes
/// every character they refuse).
pub(crate) fn encode(e: &Event, mode: Mode) -> Encoded {
    if mode == Mode::Binary {
        let headers = kafka_binding::encode_binary_headers(e);
        let body = match &e.data {
            Data::None => Some(String::new()),
            d => d
                .as_bytes()
                .and_then(|b| std::str::from_utf8(b).ok())
                .map(str::to_owned),
        };
        if let Some(body) = body.filter(|b| !b.is_empty() && allowed_text(b)) {
            if headers.len() <= MAX_ATTRIBUTES
                && headers
                    .iter()
                    .all(|(_, v)| !v.is_empty() && std::str::from_utf8(v).is_ok_and(allowed_text))
            {
                return Encoded {
                    body,
                    attrs: headers
                        .into_iter()
                        .map(|(k, v)| (k, String::from_utf8(v).unwrap_or_default()))
                        .collect(),
                };
            }
        }
    }
    Encoded {
        body: String::from_utf8(format::encode_event(e)).unwrap_or_default(),
        attrs: vec![(
            "content-type".to_owned(),
            format::STRUCTURED_CONTENT_TYPE.to_owned(),
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Attr {
        Attr {
            data_type: "String".into(),
            string: Some(v.into()),
            binary: None,
        }
    }

    fn as_attrs(enc: &Encoded) -> Vec<(String, Attr)> {
        enc.attrs.iter().map(|(k, v)| (k.clone(), s(v))).collect()
    }

    #[test]
    fn binary_and_structured_round_trip() {
        let mut e = Event::new("1", "/s", "t").with_json(&b"{\"a\":1}"[..]);
        e.set_extension("traceparent", "00-abc");
        for mode in [Mode::Binary, Mode::Structured] {
            let enc = encode(&e, mode);
            let body = Bytes::from(enc.body.clone());
            match decode(&as_attrs(&enc), &body).unwrap() {
                Decoded::Event(back) => assert_eq!(*back, e, "{mode:?}"),
                Decoded::Plain => panic!("{mode:?}: not recognised"),
            }
        }
        assert!(encode(&e, Mode::Binary)
            .attrs
            .iter()
            .any(|(k, _)| k == "ce_id"));
    }

    #[test]
    fn too_many_attributes_or_binary_data_go_structured() {
        let mut e = Event::new("1", "/s", "t").with_json(&b"1"[..]);
        for i in 0..8 {
            e.set_extension(format!("x{i}"), "v");
        }
        let enc = encode(&e, Mode::Binary);
        assert_eq!(enc.attrs.len(), 1);
        assert_eq!(enc.attrs[0].1, "application/cloudevents+json");
        let b = Event::new("1", "/s", "t").with_data(
            Some("application/octet-stream".into()),
            Data::Binary(Bytes::from_static(&[0xff, 0xfe])),
        );
        let enc = encode(&b, Mode::Binary);
        assert_eq!(enc.attrs[0].0, "content-type");
        // No data, or text SQS refuses (NUL): structured, which escapes it.
        let empty = Event::new("1", "/s", "t");
        assert_eq!(
            encode(&empty, Mode::Binary).attrs[0].1,
            "application/cloudevents+json"
        );
        let nul = Event::new("1", "/s", "t").with_data(
            Some("text/plain".into()),
            Data::Binary(Bytes::from_static(b"a\0b")),
        );
        let escaped = encode(&nul, Mode::Binary);
        assert_eq!(escaped.attrs[0].1, "application/cloudevents+json");
        assert!(allowed_text(&escaped.body));
        match decode(&as_attrs(&enc), &Bytes::from(enc.body.clone())).unwrap() {
            Decoded::Event(back) => assert_eq!(*back, b),
            Decoded::Plain => panic!("not recognised"),
        }
    }

    #[test]
    fn plain_messages_and_extensions() {
        let attrs = vec![
            ("Trace-Id".to_string(), s("t-1")),
            ("id".to_string(), s("reserved")),
            ("a-very-long-attribute-name-indeed".to_string(), s("x")),
            (
                "Blob".to_string(),
                Attr {
                    data_type: "Binary".into(),
                    string: None,
                    binary: Some(vec![1, 2]),
                },
            ),
        ];
        let body = Bytes::from_static(b"hello");
        assert!(matches!(decode(&attrs, &body).unwrap(), Decoded::Plain));
        let mut e = plain_data(Event::new("m1", "/q", "t"), &attrs, body);
        add_extensions(&mut e, &attrs);
        assert_eq!(
            e.datacontenttype.as_deref(),
            Some("text/plain; charset=utf-8")
        );
        assert_eq!(
            e.extension("traceid"),
            Some(&ExtValue::String("t-1".into()))
        );
        assert_eq!(e.extension("blob"), Some(&ExtValue::String("AQI=".into())));
        assert_eq!(e.extensions.len(), 2, "{:?}", e.extensions);
        let bad = Bytes::from_static(br#"{"specversion":"1.0","id":""}"#);
        assert!(
            decode(&[], &bad).is_err(),
            "a broken structured event is an error"
        );
    }
}
