//! The CloudEvents Kafka protocol binding, independent of any Kafka client: binary mode uses
//! `ce_<name>` headers (UTF-8 values, no percent-encoding) and `content-type` for
//! `datacontenttype`; structured mode sets `content-type: application/cloudevents+json`.

use bytes::Bytes;

use crate::event::{check_media_type, Data, Event, EventError, ExtValue, Timestamp, SPEC_VERSION};
use crate::format::{self, STRUCTURED_CONTENT_TYPE};

/// Decodes a Kafka record's headers and payload into an event. Header names are matched
/// case-sensitively, as Kafka header keys are.
pub fn decode(headers: &[(&str, &[u8])], payload: Option<Bytes>) -> Result<Event, EventError> {
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
        if ct
            .to_ascii_lowercase()
            .starts_with("application/cloudevents")
        {
            let essence = ct.split(';').next().unwrap_or("").trim();
            if !essence.eq_ignore_ascii_case(STRUCTURED_CONTENT_TYPE) {
                return Err(EventError(format!(
                    "structured format {essence:?} is not supported"
                )));
            }
            return format::decode_event(&payload.unwrap_or_default());
        }
    }
    let mut event = Event::new(String::new(), String::new(), String::new());
    let mut specversion = None;
    for (name, value) in headers {
        let Some(attr) = name.strip_prefix("ce_") else {
            continue;
        };
        let v = utf8(name, value)?;
        match attr {
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
        Some(v) => return Err(EventError(format!("ce_specversion {v:?} is not supported"))),
        None => return Err(EventError::new("ce_specversion header is missing")),
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
    let mut h = vec![
        (
            "ce_specversion".to_owned(),
            SPEC_VERSION.as_bytes().to_vec(),
        ),
        ("ce_id".to_owned(), event.id.as_bytes().to_vec()),
        ("ce_source".to_owned(), event.source.as_bytes().to_vec()),
        ("ce_type".to_owned(), event.ty.as_bytes().to_vec()),
    ];
    let optional = [
        ("ce_dataschema", event.dataschema.as_deref()),
        ("ce_subject", event.subject.as_deref()),
        ("ce_time", event.time.as_ref().map(Timestamp::as_str)),
        ("content-type", event.datacontenttype.as_deref()),
    ];
    for (k, v) in optional {
        if let Some(v) = v {
            h.push((k.to_owned(), v.as_bytes().to_vec()));
        }
    }
    for (name, value) in &event.extensions {
        h.push((
            format!("ce_{name}"),
            value.to_canonical().as_bytes().to_vec(),
        ));
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
}
