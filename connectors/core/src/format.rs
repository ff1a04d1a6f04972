//! The CloudEvents JSON event format (structured mode) and JSON batches.
//!
//! Decoding borrows from the input: a JSON `data` member becomes a zero-copy slice of the input
//! [`Bytes`]. Encoding writes text directly; no `serde_json::Value` tree is built either way.

use std::borrow::Cow;
use std::collections::HashMap;

use base64::Engine as _;
use bytes::Bytes;
use serde_json::value::RawValue;

use crate::event::{
    check_extension_name, is_json_media_type, Data, Event, EventError, ExtValue, Timestamp,
    SPEC_VERSION,
};

pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";
pub const BATCH_CONTENT_TYPE: &str = "application/cloudevents-batch+json";

/// Decodes one structured-mode JSON event and validates it.
pub fn decode_event(input: &Bytes) -> Result<Event, EventError> {
    let members: HashMap<Cow<'_, str>, &RawValue> = serde_json::from_slice(input)
        .map_err(|e| EventError(format!("not a JSON CloudEvent object: {e}")))?;
    event_from_members(input, members)
}

/// Decodes a JSON batch (an array of structured events; it may be empty) and validates each.
pub fn decode_batch(input: &Bytes) -> Result<Vec<Event>, EventError> {
    let items: Vec<&RawValue> = serde_json::from_slice(input)
        .map_err(|e| EventError(format!("a CloudEvents batch must be a JSON array: {e}")))?;
    items
        .into_iter()
        .enumerate()
        .map(|(i, raw)| {
            let members: HashMap<Cow<'_, str>, &RawValue> = serde_json::from_str(raw.get())
                .map_err(|_| EventError(format!("batch item {i} is not a JSON object")))?;
            event_from_members(input, members)
                .map_err(|e| EventError(format!("batch item {i}: {}", e.0)))
        })
        .collect()
}

fn string_member(name: &str, raw: &RawValue) -> Result<Option<String>, EventError> {
    if raw.get() == "null" {
        return Ok(None);
    }
    serde_json::from_str::<String>(raw.get())
        .map(Some)
        .map_err(|_| EventError(format!("{name} must be a JSON string")))
}

fn event_from_members(
    input: &Bytes,
    mut members: HashMap<Cow<'_, str>, &RawValue>,
) -> Result<Event, EventError> {
    let mut take = |name: &str| -> Result<Option<String>, EventError> {
        match members.remove(name) {
            Some(raw) => string_member(name, raw),
            None => Ok(None),
        }
    };
    match take("specversion")?.as_deref() {
        Some(SPEC_VERSION) => {}
        Some(other) => {
            return Err(EventError(format!(
                "specversion {other:?} is not supported (only \"1.0\")"
            )))
        }
        None => return Err(EventError::new("specversion is missing")),
    }
    let id = take("id")?.ok_or_else(|| EventError::new("id is missing"))?;
    let source = take("source")?.ok_or_else(|| EventError::new("source is missing"))?;
    let ty = take("type")?.ok_or_else(|| EventError::new("type is missing"))?;
    let datacontenttype = take("datacontenttype")?;
    let dataschema = take("dataschema")?;
    let subject = take("subject")?;
    let time = take("time")?.map(|t| Timestamp::parse(&t)).transpose()?;

    let data_raw = members.remove("data").filter(|r| r.get() != "null");
    let b64_raw = members.remove("data_base64").filter(|r| r.get() != "null");
    let data = match (data_raw, b64_raw) {
        (Some(_), Some(_)) => {
            return Err(EventError::new(
                "an event may carry data or data_base64, not both",
            ))
        }
        (None, Some(raw)) => {
            let text: Cow<'_, str> = serde_json::from_str(raw.get())
                .map_err(|_| EventError::new("data_base64 must be a JSON string"))?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .map_err(|e| EventError(format!("data_base64 is not valid base64: {e}")))?;
            Data::Binary(Bytes::from(bytes))
        }
        (Some(raw), None) => {
            let json_type = datacontenttype.as_deref().is_none_or(is_json_media_type);
            let text = raw.get();
            if !json_type && text.starts_with('"') {
                // Non-JSON content carried as a JSON string: the string is the data.
                let s: String = serde_json::from_str(text)
                    .map_err(|e| EventError(format!("data string is malformed: {e}")))?;
                Data::Binary(Bytes::from(s))
            } else {
                Data::Json(slice_of(input, text.as_bytes()))
            }
        }
        (None, None) => Data::None,
    };

    let mut extensions = Vec::with_capacity(members.len());
    for (name, raw) in members {
        check_extension_name(&name)?;
        let text = raw.get();
        let value = match text.as_bytes().first() {
            Some(b'"') => ExtValue::String(
                serde_json::from_str(text)
                    .map_err(|e| EventError(format!("extension {name:?}: {e}")))?,
            ),
            Some(b't') | Some(b'f') => ExtValue::Boolean(text == "true"),
            Some(b'n') => continue,
            Some(b'-' | b'0'..=b'9') => ExtValue::Integer(text.parse::<i32>().map_err(|_| {
                EventError(format!(
                    "extension {name:?} must be a string, a boolean or a 32-bit integer, \
                         got {text}"
                ))
            })?),
            _ => {
                return Err(EventError(format!(
                    "extension {name:?} must be a string, a boolean or an integer"
                )))
            }
        };
        extensions.push((name.into_owned(), value));
    }
    // HashMap order is arbitrary; keep a stable order so encodings are deterministic.
    extensions.sort_by(|a, b| a.0.cmp(&b.0));

    let event = Event {
        id,
        source,
        ty,
        datacontenttype,
        dataschema,
        subject,
        time,
        extensions,
        data,
    };
    event.validate()?;
    Ok(event)
}

/// A zero-copy slice of `input` when `part` points into it, a copy otherwise.
fn slice_of(input: &Bytes, part: &[u8]) -> Bytes {
    let start = input.as_ptr() as usize;
    let p = part.as_ptr() as usize;
    if p >= start && p + part.len() <= start + input.len() {
        input.slice_ref(part)
    } else {
        Bytes::copy_from_slice(part)
    }
}

/// Appends the structured-mode JSON form of `event` to `out`.
pub fn encode_event_into(event: &Event, out: &mut Vec<u8>) {
    out.reserve(event.approx_size() + 64);
    out.extend_from_slice(b"{\"specversion\":\"1.0\",\"id\":");
    write_str(out, &event.id);
    out.extend_from_slice(b",\"source\":");
    write_str(out, &event.source);
    out.extend_from_slice(b",\"type\":");
    write_str(out, &event.ty);
    let optional = [
        ("datacontenttype", event.datacontenttype.as_deref()),
        ("dataschema", event.dataschema.as_deref()),
        ("subject", event.subject.as_deref()),
        ("time", event.time.as_ref().map(Timestamp::as_str)),
    ];
    for (name, value) in optional {
        if let Some(v) = value {
            out.extend_from_slice(b",\"");
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\":");
            write_str(out, v);
        }
    }
    for (name, value) in &event.extensions {
        out.extend_from_slice(b",\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
        match value {
            ExtValue::String(s) => write_str(out, s),
            ExtValue::Integer(i) => out.extend_from_slice(i.to_string().as_bytes()),
            ExtValue::Boolean(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        }
    }
    let ct = event.datacontenttype.as_deref();
    match &event.data {
        Data::None => {}
        data @ (Data::Json(bytes) | Data::Binary(bytes)) if data.is_embeddable_json(ct) => {
            out.extend_from_slice(b",\"data\":");
            out.extend_from_slice(bytes);
        }
        Data::Json(bytes) | Data::Binary(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) if ct.is_some_and(is_textual_media_type) => {
                out.extend_from_slice(b",\"data\":");
                write_str(out, text);
            }
            _ => {
                out.extend_from_slice(b",\"data_base64\":\"");
                let start = out.len();
                let n = base64::encoded_len(bytes.len(), true).unwrap_or(0);
                out.resize(start + n, 0);
                let written = base64::engine::general_purpose::STANDARD
                    .encode_slice(bytes, &mut out[start..])
                    .unwrap_or(0);
                out.truncate(start + written);
                out.push(b'"');
            }
        },
    }
    out.push(b'}');
}

/// The structured-mode JSON form of `event`.
pub fn encode_event(event: &Event) -> Vec<u8> {
    let mut out = Vec::new();
    encode_event_into(event, &mut out);
    out
}

/// A JSON batch of events.
pub fn encode_batch(events: &[Event]) -> Vec<u8> {
    let mut out = Vec::with_capacity(events.iter().map(Event::approx_size).sum::<usize>() + 2);
    out.push(b'[');
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        encode_event_into(e, &mut out);
    }
    out.push(b']');
    out
}

/// Media types whose bytes are text, carried as a JSON string rather than base64.
fn is_textual_media_type(ct: &str) -> bool {
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence.starts_with("text/")
        || essence.ends_with("+xml")
        || essence == "application/xml"
        || essence == "application/x-www-form-urlencoded"
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    // serde_json's string escaper writes straight into the buffer; it cannot fail on a Vec.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(e: &Event) -> Event {
        decode_event(&Bytes::from(encode_event(e))).unwrap()
    }

    #[test]
    fn json_data_is_zero_copy_and_roundtrips() {
        let input = Bytes::from_static(
            br#"{"specversion":"1.0","id":"a","source":"/s","type":"t","data":{"k":[1,2]}}"#,
        );
        let e = decode_event(&input).unwrap();
        match &e.data {
            Data::Json(b) => {
                assert_eq!(&b[..], br#"{"k":[1,2]}"#);
                let base = input.as_ptr() as usize;
                let p = b.as_ptr() as usize;
                assert!(
                    p > base && p < base + input.len(),
                    "data must borrow the input"
                );
            }
            other => panic!("expected JSON data, got {other:?}"),
        }
        assert_eq!(roundtrip(&e), e);
    }

    #[test]
    fn binary_data_uses_base64_and_text_uses_strings() {
        let mut e = Event::new("1", "/s", "t");
        e.datacontenttype = Some("application/octet-stream".into());
        e.data = Data::Binary(Bytes::from_static(&[0, 159, 146, 150]));
        let text = String::from_utf8(encode_event(&e)).unwrap();
        assert!(text.contains("\"data_base64\":\"AJ+Slg==\""), "{text}");
        assert_eq!(roundtrip(&e), e);

        e.datacontenttype = Some("text/plain".into());
        e.data = Data::Binary(Bytes::from_static(b"Simple \"text\""));
        let text = String::from_utf8(encode_event(&e)).unwrap();
        assert!(text.contains(r#""data":"Simple \"text\"""#), "{text}");
        assert_eq!(roundtrip(&e), e);
    }

    #[test]
    fn extensions_keep_their_types() {
        let input = Bytes::from_static(
            br#"{"specversion":"1.0","id":"a","source":"/s","type":"t","num":-7,"flag":false,"str":"x"}"#,
        );
        let e = decode_event(&input).unwrap();
        assert_eq!(e.extension("num"), Some(&ExtValue::Integer(-7)));
        assert_eq!(e.extension("flag"), Some(&ExtValue::Boolean(false)));
        assert_eq!(e.extension("str"), Some(&ExtValue::String("x".into())));
        assert_eq!(roundtrip(&e), e);
        let too_big = Bytes::from_static(
            br#"{"specversion":"1.0","id":"a","source":"/s","type":"t","num":2147483648}"#,
        );
        assert!(decode_event(&too_big).is_err());
    }

    #[test]
    fn escapes_are_decoded_and_reencoded() {
        let input = Bytes::from_static(
            br#"{"specversion":"1.0","id":"\u00e9\"q","source":"/s","type":"t","data":"x\ny"}"#,
        );
        let e = decode_event(&input).unwrap();
        assert_eq!(e.id, "é\"q");
        assert_eq!(roundtrip(&e), e);
    }

    #[test]
    fn batch_encode_decode() {
        let events = vec![
            Event::new("1", "/s", "t").with_json(&b"{}"[..]),
            Event::new("2", "/s", "t"),
        ];
        let bytes = Bytes::from(encode_batch(&events));
        assert_eq!(decode_batch(&bytes).unwrap(), events);
        assert!(decode_batch(&Bytes::from_static(b"[]")).unwrap().is_empty());
        assert!(decode_batch(&Bytes::from_static(b"{}")).is_err());
    }
}
