//! Stream entries: parsing Redis replies, and entries ↔ events.
//!
//! A CloudEvent in an entry uses the Kafka binding's names: binary mode puts each attribute in a
//! field `ce_<name>` (`ce_specversion`, `ce_id`, ...), `datacontenttype` in `content-type` and the
//! data in field `data`; structured mode sets `content-type: application/cloudevents+json` and
//! puts the JSON event in `data`. Any other entry is a plain entry: its fields become a JSON
//! object.

use std::borrow::Cow;

use base64::Engine;
use bytes::Bytes;
use redis::Value;
use sluice_core::event::{check_string, Data, Event, EventError, Str, Timestamp};
use sluice_core::{argo, format, kafka_binding};

/// The field that holds the data of a CloudEvent entry.
pub const DATA_FIELD: &str = "data";

pub type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// One entry of a reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub id: String,
    /// `None`: the entry was deleted (or trimmed) while it was pending.
    pub fields: Option<Fields>,
}

/// A string-like value, moved out of the reply (no copy).
fn bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        Value::Okay => Some(b"OK".to_vec()),
        _ => None,
    }
}

fn string(v: Value) -> Option<String> {
    bytes(v).and_then(|b| String::from_utf8(b).ok())
}

fn items(v: Value) -> Vec<Value> {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => Vec::new(),
    }
}

fn pairs(v: Value) -> Result<Fields, String> {
    let flat: Vec<(Value, Value)> = match v {
        Value::Map(m) => m,
        Value::Array(a) => {
            if a.len() % 2 != 0 {
                return Err("an entry with an odd number of field items".into());
            }
            let mut it = a.into_iter();
            let mut out = Vec::with_capacity(it.len() / 2);
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((k, v));
            }
            out
        }
        other => return Err(format!("unexpected entry fields {other:?}")),
    };
    flat.into_iter()
        .map(|(k, v)| match (bytes(k), bytes(v)) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => Err("an entry field that is not a string".to_string()),
        })
        .collect()
}

/// Entries of `[[id, [field, value, ...]], ...]`; a deleted pending entry is `[id, nil]`.
pub fn entries(v: Value) -> Result<Vec<Entry>, String> {
    items(v)
        .into_iter()
        .map(|e| {
            let mut parts = items(e).into_iter();
            let id = parts
                .next()
                .and_then(string)
                .ok_or_else(|| "unexpected stream entry without an id".to_string())?;
            let fields = match parts.next() {
                None | Some(Value::Nil) => None,
                Some(f) => Some(pairs(f)?),
            };
            Ok(Entry { id, fields })
        })
        .collect()
}

/// An `XREADGROUP` reply: entries per stream name (nil when the block timed out).
pub fn read_reply(v: Value) -> Result<Vec<(String, Vec<Entry>)>, String> {
    let per_stream: Vec<(Value, Value)> = match v {
        Value::Nil => return Ok(Vec::new()),
        Value::Map(m) => m,
        Value::Array(a) => a
            .into_iter()
            .map(|s| {
                let mut kv = items(s).into_iter();
                match (kv.next(), kv.next(), kv.next()) {
                    (Some(k), Some(e), None) => Ok((k, e)),
                    _ => Err("unexpected XREADGROUP item".to_string()),
                }
            })
            .collect::<Result<_, _>>()?,
        other => return Err(format!("unexpected XREADGROUP reply {other:?}")),
    };
    per_stream
        .into_iter()
        .map(|(k, e)| {
            let key = string(k).ok_or("a stream name that is not a string")?;
            Ok((key, entries(e)?))
        })
        .collect()
}

/// An `XAUTOCLAIM` reply: the next cursor, the claimed entries and (Redis 7) the ids of
/// pending entries that no longer exist.
pub fn autoclaim_reply(v: Value) -> Result<(String, Vec<Entry>, Vec<String>), String> {
    let mut parts = items(v).into_iter();
    match (parts.next(), parts.next()) {
        (Some(cursor), Some(claimed)) => {
            let cursor = string(cursor).ok_or("XAUTOCLAIM: a cursor that is not a string")?;
            let deleted = parts
                .next()
                .map(|d| items(d).into_iter().filter_map(string).collect())
                .unwrap_or_default();
            Ok((cursor, entries(claimed)?, deleted))
        }
        _ => Err("unexpected XAUTOCLAIM reply".to_string()),
    }
}

/// The millisecond time part of an entry id (`<ms>-<seq>`).
pub fn id_time(id: &str) -> Option<Timestamp> {
    let ms: i64 = id.split('-').next()?.parse().ok()?;
    chrono::DateTime::from_timestamp_millis(ms).map(Timestamp::from_utc)
}

fn field<'a>(fields: &'a Fields, name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, v)| v.as_slice())
}

/// Whether the entry carries a CloudEvent (a `ce_specversion` field, or a
/// `content-type: application/cloudevents...` field).
pub fn is_cloudevent(fields: &Fields) -> bool {
    fields.iter().any(|(k, _)| k == b"ce_specversion")
        || field(fields, "content-type").is_some_and(|v| {
            v.len() >= 23 && v[..23].eq_ignore_ascii_case(b"application/cloudevents")
        })
}

/// The JSON object of an entry's fields, in entry order: values that are UTF-8 as strings,
/// others as `{"base64": "..."}` (so that nothing is lost). Written directly, without a tree.
pub fn fields_json(fields: &Fields) -> Vec<u8> {
    // Room for the escapes of values that are JSON text themselves (a `"` every few bytes) too:
    // a buffer one byte short is copied whole into one twice its size.
    let size: usize = fields
        .iter()
        .map(|(k, v)| k.len() + v.len() + v.len() / 8 + 8)
        .sum();
    let mut out = Vec::with_capacity(size + 2);
    out.push(b'{');
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        format::write_json_str(&mut out, &String::from_utf8_lossy(k));
        out.push(b':');
        match std::str::from_utf8(v) {
            Ok(s) => format::write_json_str(&mut out, s),
            Err(_) => {
                out.extend_from_slice(b"{\"base64\":\"");
                out.extend_from_slice(
                    base64::engine::general_purpose::STANDARD
                        .encode(v)
                        .as_bytes(),
                );
                out.extend_from_slice(b"\"}");
            }
        }
    }
    out.push(b'}');
    out
}

/// How a stream source names the events it makes.
pub struct Naming<'a> {
    pub source: &'a str,
    pub ty: &'a str,
    /// `format: argo`: Argo's `redisStream` shape, subject = the source's name.
    pub argo: Option<ArgoShape<'a>>,
}

pub struct ArgoShape<'a> {
    pub subject: &'a str,
    /// The JSON text of `data.metadata`.
    pub metadata: &'a [u8],
}

/// The event of one entry of `stream`.
pub fn to_event(stream: &str, id: &str, fields: &Fields, n: &Naming) -> Result<Event, EventError> {
    // Joined inline when it fits in 24 bytes (a short stream name and a millisecond id).
    let event_id: Str = [stream, "-", id].into_iter().collect();
    let time = id_time(id).unwrap_or_else(Timestamp::now);
    if let Some(a) = &n.argo {
        let mut data = Vec::with_capacity(128);
        data.extend_from_slice(b"{\"stream\":");
        serde_json::to_writer(&mut data, stream).map_err(|e| EventError(e.to_string()))?;
        data.extend_from_slice(b",\"message_id\":");
        serde_json::to_writer(&mut data, id).map_err(|e| EventError(e.to_string()))?;
        data.extend_from_slice(b",\"values\":");
        data.extend_from_slice(&fields_json(fields));
        data.extend_from_slice(b",\"metadata\":");
        data.extend_from_slice(a.metadata);
        data.push(b'}');
        return Ok(Event::new(event_id, n.source, n.ty)
            .with_subject(a.subject)
            .with_time(time)
            .with_json(data));
    }
    if is_cloudevent(fields) {
        let headers: Vec<(&str, &[u8])> = fields
            .iter()
            .filter(|(k, _)| k != DATA_FIELD.as_bytes())
            .filter_map(|(k, v)| Some((std::str::from_utf8(k).ok()?, v.as_slice())))
            .collect();
        let payload = field(fields, DATA_FIELD).map(Bytes::copy_from_slice);
        return kafka_binding::decode(&headers, payload);
    }
    // Only the entry id came from Redis; the stream's name, `source` and `type` were checked at
    // `validate`, and the data is JSON written here. Set in place: each `with_*` moved the whole
    // event again.
    check_string("id", id, true)?;
    let mut e = Event::new(event_id, n.source, n.ty);
    e.subject = Some(stream.into());
    e.time = Some(time);
    e.datacontenttype = Some("application/json".into());
    e.data = Data::Json(fields_json(fields).into());
    Ok(e)
}

/// How a sink writes events into entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `ce_*` fields, `content-type`, data in `data` (default).
    #[default]
    Binary,
    /// `content-type: application/cloudevents+json`, the JSON event in `data`.
    Structured,
}

/// The fields of the entry for `e`.
#[cfg(test)]
pub fn to_fields(e: &Event, mode: Mode) -> Fields {
    fields_of(e, mode)
        .into_iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.into_owned()))
        .collect()
}

/// [`to_fields`] borrowed from the event where it can be (the attribute names are static, the
/// values and the data the event's own): what the sink writes into its `XADD` at once.
pub fn fields_of(e: &Event, mode: Mode) -> Vec<(Cow<'static, str>, Cow<'_, [u8]>)> {
    match mode {
        Mode::Structured => vec![
            (
                Cow::Borrowed("content-type"),
                Cow::Borrowed(format::STRUCTURED_CONTENT_TYPE.as_bytes()),
            ),
            (
                Cow::Borrowed(DATA_FIELD),
                Cow::Owned(format::encode_event(e)),
            ),
        ],
        Mode::Binary => {
            let mut f = kafka_binding::binary_headers("ce_", e);
            if let Some(d) = e.data.as_bytes() {
                f.push((Cow::Borrowed(DATA_FIELD), Cow::Borrowed(&d[..])));
            }
            f
        }
    }
}

/// `data.body` of Argo's `redis` event: the payload as a JSON string (Argo's payload is a Go
/// string), or verbatim JSON with `json_body`.
pub fn argo_pubsub_body(payload: &[u8], json_body: bool) -> Result<Vec<u8>, String> {
    if json_body {
        return argo::body(payload, true);
    }
    serde_json::to_vec(&String::from_utf8_lossy(payload)).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn read_replies_in_resp2_and_resp3_and_deleted_entries() {
        let entry = |id: &str, f: Value| Value::Array(vec![bulk(id), f]);
        let fields = Value::Array(vec![bulk("a"), bulk("1"), bulk("b"), bulk("2")]);
        let resp2 = Value::Array(vec![Value::Array(vec![
            bulk("orders"),
            Value::Array(vec![entry("1-0", fields.clone()), entry("2-0", Value::Nil)]),
        ])]);
        let got = read_reply(resp2).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "orders");
        assert_eq!(
            got[0].1[0].fields.as_ref().unwrap(),
            &vec![
                (b"a".to_vec(), b"1".to_vec()),
                (b"b".to_vec(), b"2".to_vec())
            ]
        );
        assert_eq!(got[0].1[1].fields, None, "deleted while pending");
        let resp3 = Value::Map(vec![(
            bulk("orders"),
            Value::Array(vec![entry("1-0", Value::Map(vec![(bulk("a"), bulk("1"))]))]),
        )]);
        assert_eq!(read_reply(resp3).unwrap()[0].1[0].id, "1-0");
        assert!(read_reply(Value::Nil).unwrap().is_empty());
        let (cursor, claimed, deleted) = autoclaim_reply(Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![entry("3-1", fields)]),
            Value::Array(vec![bulk("4-0")]),
        ]))
        .unwrap();
        assert_eq!((cursor.as_str(), claimed.len()), ("0-0", 1));
        assert_eq!(deleted, ["4-0"]);
    }

    #[test]
    fn plain_entries_become_json_objects_with_stable_ids() {
        let n = Naming {
            source: "redis",
            ty: "redis.stream",
            argo: None,
        };
        let fields = vec![
            (b"order".to_vec(), b"42".to_vec()),
            (b"raw".to_vec(), vec![0xff, 0x00]),
        ];
        let e = to_event("orders", "1700000000000-3", &fields, &n).unwrap();
        assert_eq!(e.id, "orders-1700000000000-3");
        assert_eq!(e.subject.as_deref(), Some("orders"));
        assert_eq!(e.time.as_ref().unwrap().as_str(), "2023-11-14T22:13:20Z");
        let data: serde_json::Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
        assert_eq!(
            data,
            serde_json::json!({"order": "42", "raw": {"base64": "/wA="}})
        );
    }

    #[test]
    fn cloudevent_entries_roundtrip_in_both_modes() {
        let mut e = Event::new("id-1", "/src", "com.example.t")
            .with_subject("s")
            .with_json(&b"{\"a\":1}"[..]);
        e.set_extension("traceparent", "00-abc");
        let n = Naming {
            source: "x",
            ty: "y",
            argo: None,
        };
        for mode in [Mode::Binary, Mode::Structured] {
            let f = to_fields(&e, mode);
            assert!(is_cloudevent(&f));
            let back = to_event("st", "1-0", &f, &n).unwrap();
            assert_eq!(back, e, "{mode:?}");
        }
    }

    #[test]
    fn argo_shape() {
        let n = Naming {
            source: "es",
            ty: "redisStream",
            argo: Some(ArgoShape {
                subject: "ev",
                metadata: b"{\"k\":\"v\"}",
            }),
        };
        let e = to_event("s1", "5-0", &vec![(b"f".to_vec(), b"v".to_vec())], &n).unwrap();
        let data: serde_json::Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
        assert_eq!(
            data,
            serde_json::json!({"stream": "s1", "message_id": "5-0", "values": {"f": "v"}, "metadata": {"k": "v"}})
        );
        assert_eq!(argo_pubsub_body(b"hi", false).unwrap(), b"\"hi\"");
        assert_eq!(argo_pubsub_body(b"{\"a\":1}", true).unwrap(), b"{\"a\":1}");
    }
}
