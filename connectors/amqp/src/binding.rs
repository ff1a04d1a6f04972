//! The CloudEvents AMQP binding on AMQP 0-9-1 messages (RabbitMQ maps AMQP 1.0
//! application-properties to 0-9-1 headers): binary mode puts each attribute but
//! `datacontenttype` in a header `cloudEvents:<name>` (`cloudEvents_<name>`, the JMS-safe form,
//! is read too) and `datacontenttype` in the `content-type` property; structured mode sets
//! `content-type: application/cloudevents+json` and the JSON event is the body.

use bytes::Bytes;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use sluice_core::event::{
    check_media_type, Data, Event, EventError, ExtValue, Timestamp, SPEC_VERSION,
};
use sluice_core::format::{self, STRUCTURED_CONTENT_TYPE};

pub const PREFIX: &str = "cloudEvents:";
const PREFIX_JMS: &str = "cloudEvents_";

fn attr_name(header: &str) -> Option<&str> {
    header
        .strip_prefix(PREFIX)
        .or_else(|| header.strip_prefix(PREFIX_JMS))
}

/// A header value as the attribute's canonical string (native AMQP types are accepted too, as
/// the binding requires; a timestamp is seconds since the epoch in AMQP 0-9-1).
pub fn value_string(v: &AMQPValue) -> Option<String> {
    Some(match v {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok()?,
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(i) => i.to_string(),
        AMQPValue::ShortShortUInt(i) => i.to_string(),
        AMQPValue::ShortInt(i) => i.to_string(),
        AMQPValue::ShortUInt(i) => i.to_string(),
        AMQPValue::LongInt(i) => i.to_string(),
        AMQPValue::LongUInt(i) => i.to_string(),
        AMQPValue::LongLongInt(i) => i.to_string(),
        AMQPValue::Timestamp(t) => {
            let at = chrono::DateTime::from_timestamp(i64::try_from(*t).ok()?, 0)?;
            Timestamp::from_utc(at).as_str().to_owned()
        }
        _ => return None,
    })
}

/// Whether a message carries a CloudEvent (a `cloudEvents:specversion` header, or a
/// `content-type` of `application/cloudevents...`).
pub fn is_cloudevent(props: &BasicProperties) -> bool {
    let structured = props.content_type().as_ref().is_some_and(|ct| {
        ct.as_str()
            .as_bytes()
            .get(..23)
            .is_some_and(|p| p.eq_ignore_ascii_case(b"application/cloudevents"))
    });
    structured
        || props.headers().as_ref().is_some_and(|h| {
            h.inner()
                .keys()
                .any(|k| attr_name(k.as_str()) == Some("specversion"))
        })
}

/// Decodes a message that [`is_cloudevent`].
pub fn decode(props: &BasicProperties, body: Bytes) -> Result<Event, EventError> {
    if let Some(ct) = props.content_type() {
        if let Some(structured) = format::structured_by_content_type(ct.as_str(), &body) {
            return structured;
        }
    }
    let mut e = Event::new(String::new(), String::new(), String::new());
    let mut specversion = None;
    if let Some(h) = props.headers() {
        for (k, v) in h.inner() {
            let Some(attr) = attr_name(k.as_str()) else {
                continue;
            };
            let s = value_string(v).ok_or_else(|| {
                EventError(format!(
                    "header {k} holds no string, number, boolean or timestamp"
                ))
            })?;
            match attr {
                "specversion" => specversion = Some(s),
                "id" => e.id = s.into(),
                "source" => e.source = s.into(),
                "type" => e.ty = s.into(),
                "subject" => e.subject = Some(s.into()),
                "dataschema" => e.dataschema = Some(s),
                "time" => e.time = Some(Timestamp::parse(&s)?),
                "datacontenttype" => {}
                ext => {
                    if e.extension(ext).is_none() {
                        e.extensions.push((ext.into(), ExtValue::String(s.into())));
                    }
                }
            }
        }
    }
    match specversion.as_deref() {
        Some(SPEC_VERSION) => {}
        Some(v) => {
            return Err(EventError(format!(
                "cloudEvents:specversion {v:?} is not supported"
            )))
        }
        None => return Err(EventError::new("cloudEvents:specversion header is missing")),
    }
    if let Some(ct) = props.content_type() {
        check_media_type(ct.as_str())?;
        e.datacontenttype = Some(ct.as_str().to_owned());
    }
    if !body.is_empty() || e.datacontenttype.is_some() {
        e.data = Data::from_bytes(body, e.datacontenttype.as_deref());
    }
    e.validate()?;
    Ok(e)
}

/// How a sink writes events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `cloudEvents:*` headers, data as the body (default).
    #[default]
    Binary,
    /// The JSON event as the body, `content-type: application/cloudevents+json`.
    Structured,
}

/// An AMQP short string (at most 255 bytes: lapin panics past that), or why not.
pub fn short(what: &str, v: &str) -> Result<ShortString, String> {
    if v.len() > 255 {
        return Err(format!(
            "{what} is {} bytes; AMQP short strings hold at most 255",
            v.len()
        ));
    }
    Ok(ShortString::from(v))
}

/// Properties and body for `e`. `message-id` is the event id (unless it is longer than a
/// short string holds; the id still travels in the CloudEvents header or body) and
/// `timestamp` its time, so consumers that know nothing of CloudEvents still see them. An
/// event whose content type or extension names do not fit AMQP's short strings is refused.
pub fn encode(
    e: &Event,
    mode: Mode,
    persistent: bool,
) -> Result<(BasicProperties, Vec<u8>), String> {
    let mut props = BasicProperties::default().with_delivery_mode(if persistent { 2 } else { 1 });
    if let Ok(id) = short("the id", &e.id) {
        props = props.with_message_id(id);
    }
    if let Some(t) = &e.time {
        if let Ok(secs) = u64::try_from(t.instant().timestamp()) {
            props = props.with_timestamp(secs);
        }
    }
    Ok(match mode {
        Mode::Structured => (
            props.with_content_type(ShortString::from(STRUCTURED_CONTENT_TYPE)),
            format::encode_event(e),
        ),
        Mode::Binary => {
            let mut h = FieldTable::default();
            let mut put = |k: &str, v: &str| -> Result<(), String> {
                h.insert(
                    short("a header name", &format!("{PREFIX}{k}"))?,
                    AMQPValue::LongString(LongString::from(v.as_bytes().to_vec())),
                );
                Ok(())
            };
            put("specversion", SPEC_VERSION)?;
            put("id", &e.id)?;
            put("source", &e.source)?;
            put("type", &e.ty)?;
            if let Some(v) = &e.subject {
                put("subject", v)?;
            }
            if let Some(v) = &e.dataschema {
                put("dataschema", v)?;
            }
            if let Some(v) = &e.time {
                put("time", v.as_str())?;
            }
            for (n, v) in &e.extensions {
                put(n, &v.to_canonical())?;
            }
            props = props.with_headers(h);
            if let Some(ct) = &e.datacontenttype {
                props = props.with_content_type(short("the datacontenttype", ct)?);
            }
            (
                props,
                e.data.as_bytes().map(|b| b.to_vec()).unwrap_or_default(),
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> Event {
        let mut e = Event::new("id-1", "/orders", "com.example.created")
            .with_subject("o/1")
            .with_time(Timestamp::parse("2026-12-01T10:00:00Z").unwrap())
            .with_json(&b"{\"a\":1}"[..]);
        e.set_extension("traceparent", "00-abc-def-01");
        e
    }

    #[test]
    fn binary_and_structured_roundtrip() {
        for mode in [Mode::Binary, Mode::Structured] {
            let (props, body) = encode(&event(), mode, true).unwrap();
            assert!(is_cloudevent(&props));
            assert_eq!(
                decode(&props, Bytes::from(body)).unwrap(),
                event(),
                "{mode:?}"
            );
            assert_eq!(
                props.message_id().as_ref().map(|s| s.as_str()),
                Some("id-1")
            );
            assert_eq!(*props.delivery_mode(), Some(2));
        }
    }

    #[test]
    fn jms_prefix_and_native_values_are_read() {
        let mut h = FieldTable::default();
        h.insert(
            "cloudEvents_specversion".into(),
            AMQPValue::LongString("1.0".into()),
        );
        h.insert("cloudEvents_id".into(), AMQPValue::ShortString("7".into()));
        h.insert(
            "cloudEvents_source".into(),
            AMQPValue::LongString("/s".into()),
        );
        h.insert("cloudEvents_type".into(), AMQPValue::LongString("t".into()));
        h.insert(
            "cloudEvents_time".into(),
            AMQPValue::Timestamp(1_764_590_400),
        );
        h.insert("cloudEvents_count".into(), AMQPValue::LongLongInt(3));
        let props = BasicProperties::default().with_headers(h);
        assert!(is_cloudevent(&props));
        let e = decode(&props, Bytes::new()).unwrap();
        assert_eq!(e.id, "7");
        assert_eq!(e.time.as_ref().unwrap().as_str(), "2025-12-01T12:00:00Z");
        assert_eq!(
            e.extension("count").map(|v| v.to_canonical().into_owned()),
            Some("3".into())
        );
        assert_eq!(e.data, Data::None);
    }

    #[test]
    fn values_longer_than_a_short_string_are_left_out_or_refused_not_a_panic() {
        let mut e = event();
        e.id = "i".repeat(300).into();
        for mode in [Mode::Binary, Mode::Structured] {
            let (props, body) = encode(&e, mode, true).unwrap();
            assert!(props.message_id().is_none(), "{mode:?}");
            let back = decode(&props, Bytes::from(body)).unwrap();
            assert_eq!(back.id, e.id, "{mode:?}: the id travels in full");
        }
        let mut e = event();
        e.datacontenttype = Some(format!("application/json; x={}", "y".repeat(300)));
        let err = encode(&e, Mode::Binary, true).unwrap_err();
        assert!(err.contains("datacontenttype is 320 bytes"), "{err}");
        let mut e = event();
        e.extensions
            .push(("x".repeat(250).into(), ExtValue::String("v".into())));
        assert!(encode(&e, Mode::Binary, true)
            .unwrap_err()
            .contains("a header name"));
        assert!(encode(&e, Mode::Structured, true).is_ok());
    }

    #[test]
    fn a_content_type_with_a_multibyte_character_at_the_prefix_end_is_not_a_cloudevent() {
        for ct in [
            "application/cloudeventé",
            "application/cloudevent€+json",
            "é",
        ] {
            let props = BasicProperties::default().with_content_type(ct.into());
            assert!(!is_cloudevent(&props), "{ct}");
        }
        let props =
            BasicProperties::default().with_content_type("application/cloudevents+json".into());
        assert!(is_cloudevent(&props));
    }

    #[test]
    fn wrong_specversion_is_refused() {
        let mut h = FieldTable::default();
        h.insert(
            "cloudEvents:specversion".into(),
            AMQPValue::LongString("0.3".into()),
        );
        let props = BasicProperties::default().with_headers(h);
        assert!(decode(&props, Bytes::new())
            .unwrap_err()
            .to_string()
            .contains("0.3"));
    }
}
