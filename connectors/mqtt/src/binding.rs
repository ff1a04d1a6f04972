//! The CloudEvents MQTT protocol binding. MQTT 5 binary mode: every attribute but
//! `datacontenttype` is a user property named after it (`specversion`, `id`, …, extensions),
//! `datacontenttype` is the Content Type property, the data is the payload. Structured mode (both
//! versions): the JSON event is the payload (with MQTT 5 the Content Type is
//! `application/cloudevents+json`).

use bytes::Bytes;
use sluice_core::event::{check_extension_name, Event, EventError, SPEC_VERSION};
use sluice_core::{format, kafka_binding};

use crate::proto::{Props, View};

/// The event a message carries by its MQTT 5 properties (`None`: they say nothing; the
/// caller may still find a structured event in the payload).
pub(crate) fn decode(p: &View<'_>) -> Result<Option<Event>, EventError> {
    if let Some(ct) = p.content_type {
        if let Some(structured) = format::structured_by_content_type(ct, p.payload) {
            return structured.map(Some);
        }
    }
    if !p.user_properties.iter().any(|(k, _)| k == "specversion") {
        return Ok(None);
    }
    // User properties that cannot be attribute names (`x-trace`, `Tenant`) belong to the
    // application, not to the event.
    // MQTT 5 allows a name twice: the first one counts.
    let mut pairs: Vec<(&str, &[u8])> = Vec::with_capacity(p.user_properties.len() + 1);
    for (k, v) in p.user_properties {
        if check_extension_name(k).is_ok() || is_core(k) {
            pairs.push((k.as_str(), v.as_bytes()));
        }
    }
    sluice_core::event::keep_first_of_each_name(&mut pairs, |(n, _)| n);
    if let Some(ct) = p.content_type {
        pairs.push(("content-type", ct.as_bytes()));
    }
    let payload = (!p.payload.is_empty()).then(|| Bytes::clone(p.payload));
    kafka_binding::decode_prefixed("", false, &pairs, payload).map(Some)
}

fn is_core(name: &str) -> bool {
    matches!(
        name,
        "specversion" | "id" | "source" | "type" | "subject" | "time" | "dataschema"
    )
}

/// MQTT 5 binary mode: the properties and the payload for `e`.
pub(crate) fn encode_binary(e: &Event) -> (Props, Bytes) {
    let mut props = Props::default();
    for (k, v) in kafka_binding::encode_binary_headers_prefixed("", e) {
        let v = String::from_utf8(v).unwrap_or_default();
        if k == "content-type" {
            props.content_type = Some(v);
        } else {
            props.user_properties.push((k, v));
        }
    }
    debug_assert!(props
        .user_properties
        .iter()
        .any(|(k, v)| k == "specversion" && v == SPEC_VERSION));
    let payload = e.data.as_bytes().cloned().unwrap_or_default();
    (props, payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn view<'a>(props: &'a Props, payload: &'a Bytes) -> View<'a> {
        View {
            topic: Cow::Borrowed("t"),
            payload,
            qos: 1,
            dup: false,
            pkid: 1,
            content_type: props.content_type.as_deref(),
            user_properties: &props.user_properties,
        }
    }

    #[test]
    fn binary_round_trip_and_application_properties() {
        let mut e = Event::new("1", "/s", "t").with_json(&b"{\"a\":1}"[..]);
        e.subject = Some("devices/7".into());
        e.set_extension("traceparent", "00-x");
        let (mut props, payload) = encode_binary(&e);
        assert_eq!(props.content_type.as_deref(), Some("application/json"));
        assert!(props.user_properties.contains(&("id".into(), "1".into())));
        let back = decode(&view(&props, &payload)).unwrap().unwrap();
        assert_eq!(back, e);
        // A property of the application's own is not an attribute; a repeated name counts once.
        props.user_properties.push(("x-tenant".into(), "a".into()));
        props
            .user_properties
            .push(("traceparent".into(), "00-y".into()));
        let back = decode(&view(&props, &payload)).unwrap().unwrap();
        assert_eq!(back, e);

        let plain = Props {
            content_type: Some("text/plain".into()),
            user_properties: vec![("x-a".into(), "1".into())],
        };
        assert!(decode(&view(&plain, &payload)).unwrap().is_none());

        let structured = Props {
            content_type: Some("application/cloudevents+json; charset=utf-8".into()),
            ..Props::default()
        };
        let body = Bytes::from(format::encode_event(&e));
        assert_eq!(decode(&view(&structured, &body)).unwrap().unwrap().id, "1");

        let broken = Props {
            user_properties: vec![("specversion".into(), "1.0".into())],
            ..Props::default()
        };
        assert!(decode(&view(&broken, &payload)).is_err());
    }
}
