//! Conversions between our [`Event`] and the CloudEvents Rust SDK's `cloudevents::Event`
//! (feature `cloudevents-sdk`). They are for interoperating with code written against the SDK
//! and for cross-checking our encoders in tests; the hot path uses our own type (see
//! docs/decisions.md for why).

use bytes::Bytes;
use cloudevents::event::{AttributesReader, AttributesWriter, ExtensionValue, TryIntoUrl};

use crate::event::{Data, Event, EventError, ExtValue, Timestamp};

impl TryFrom<&Event> for cloudevents::Event {
    type Error = EventError;

    fn try_from(e: &Event) -> Result<Self, EventError> {
        let mut out = cloudevents::Event::default();
        out.set_id(e.id.clone());
        out.set_source(e.source.clone());
        out.set_type(e.ty.clone());
        out.set_subject(e.subject.clone());
        if let Some(t) = &e.time {
            out.set_time(Some(t.instant().to_utc()));
        }
        if let Some(schema) = &e.dataschema {
            let url = schema
                .as_str()
                .into_url()
                .map_err(|err| EventError(format!("dataschema: {err}")))?;
            out.set_dataschema(Some(url));
        }
        for (name, value) in &e.extensions {
            let v = match value {
                ExtValue::String(s) => ExtensionValue::String(s.to_string()),
                ExtValue::Integer(i) => ExtensionValue::Integer(i64::from(*i)),
                ExtValue::Boolean(b) => ExtensionValue::Boolean(*b),
            };
            out.set_extension(name, v);
        }
        let data = match &e.data {
            Data::None => None,
            d @ (Data::Json(b) | Data::Binary(b))
                if d.is_embeddable_json(e.datacontenttype.as_deref()) =>
            {
                Some(cloudevents::Data::Json(
                    serde_json::from_slice(b).map_err(|err| EventError(format!("data: {err}")))?,
                ))
            }
            Data::Json(b) | Data::Binary(b) => Some(cloudevents::Data::Binary(b.to_vec())),
        };
        if let Some(d) = data {
            out.set_data_unchecked(d);
        }
        out.set_datacontenttype(e.datacontenttype.clone());
        Ok(out)
    }
}

impl TryFrom<&cloudevents::Event> for Event {
    type Error = EventError;

    fn try_from(e: &cloudevents::Event) -> Result<Self, EventError> {
        let mut out = Event::new(e.id(), e.source().as_str(), e.ty());
        out.datacontenttype = e.datacontenttype().map(str::to_owned);
        out.dataschema = e.dataschema().map(|u| u.to_string());
        out.subject = e.subject().map(Into::into);
        out.time = e.time().map(|t| Timestamp::from_utc(*t));
        for (name, value) in e.iter_extensions() {
            let v = match value {
                ExtensionValue::String(s) => ExtValue::String(s.into()),
                ExtensionValue::Boolean(b) => ExtValue::Boolean(*b),
                ExtensionValue::Integer(i) => {
                    ExtValue::Integer(i32::try_from(*i).map_err(|_| {
                        EventError(format!(
                            "extension {name:?}: {i} does not fit a 32-bit integer"
                        ))
                    })?)
                }
            };
            out.extensions.push((name.into(), v));
        }
        out.data = match e.data() {
            None => Data::None,
            Some(cloudevents::Data::Json(v)) => Data::Json(Bytes::from(
                serde_json::to_vec(v).map_err(|err| EventError(format!("data: {err}")))?,
            )),
            Some(cloudevents::Data::String(s)) => Data::Binary(Bytes::from(s.clone())),
            Some(cloudevents::Data::Binary(b)) => {
                Data::from_bytes(Bytes::from(b.clone()), out.datacontenttype.as_deref())
            }
        };
        out.validate()?;
        Ok(out)
    }
}
