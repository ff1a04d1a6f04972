//! The CloudEvents JSON event format (structured mode) and JSON batches.
//!
//! Decoding borrows from the input: a JSON `data` member becomes a zero-copy slice of the input
//! [`Bytes`]. Encoding writes text directly; no `serde_json::Value` tree is built either way.

use std::borrow::Cow;
use std::fmt;

use base64::Engine as _;
use bytes::Bytes;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::event::{
    check_extension_name, is_json_media_type, Data, Event, EventError, ExtValue, Str, Timestamp,
    SPEC_VERSION,
};

pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";
pub const BATCH_CONTENT_TYPE: &str = "application/cloudevents-batch+json";

/// The structured-mode event in `payload` when `content_type` is a CloudEvents media type
/// (`application/cloudevents…`, in any case): `None` when it is not one (binary mode or a plain
/// message), an error for a format other than JSON (`+avro`, a batch) or an invalid event.
/// Every binding with a content type (HTTP aside) goes by this rule.
pub fn structured_by_content_type(
    content_type: &str,
    payload: &Bytes,
) -> Option<Result<Event, EventError>> {
    let ct = content_type.trim_start();
    let is_ce = ct
        .get(..23)
        .is_some_and(|p| p.eq_ignore_ascii_case("application/cloudevents"));
    if !is_ce {
        return None;
    }
    let essence = ct.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case(STRUCTURED_CONTENT_TYPE) {
        return Some(Err(EventError(format!(
            "structured format {essence:?} is not supported (only application/cloudevents+json)"
        ))));
    }
    Some(decode_event(payload))
}

/// Whether a payload with no content type to go by is taken for a structured JSON CloudEvent: a
/// JSON object with a `specversion` member in its first 4 KiB (it must then be a valid one). For
/// bindings without headers (MQTT 3.1.1, Redis Pub/Sub).
pub fn looks_structured(payload: &[u8]) -> bool {
    // Built once: `memmem::find` builds its searcher on every call, a third of the search's cost
    // for a payload of a KiB.
    static SPECVERSION: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"specversion\""));
    let t = payload.trim_ascii_start();
    t.first() == Some(&b'{') && SPECVERSION.find(&t[..t.len().min(4096)]).is_some()
}

/// Decodes one structured-mode JSON event and validates it.
pub fn decode_event(input: &Bytes) -> Result<Event, EventError> {
    let members: Members<'_> = serde_json::from_slice(input)
        .map_err(|e| EventError(format!("not a JSON CloudEvent object: {e}")))?;
    event_from_members(input, members)
}

/// Decodes a JSON batch (an array of structured events; it may be empty) and validates each.
///
/// One pass over the input: every item's members are read as borrowed slices while the array
/// is parsed (the `data` of a 1 KiB event is scanned once, not once for the array and again
/// for the item).
pub fn decode_batch(input: &Bytes) -> Result<Vec<Event>, EventError> {
    let mut failed_item = None;
    let mut de = serde_json::Deserializer::from_slice(input);
    let items = BatchSeed {
        failed_item: &mut failed_item,
    }
    .deserialize(&mut de)
    .and_then(|items| de.end().map(|()| items))
    .map_err(|e| match failed_item {
        Some(i) => EventError(format!("batch item {i}: {e}")),
        None => EventError(format!("a CloudEvents batch must be a JSON array: {e}")),
    })?;
    items
        .into_iter()
        .enumerate()
        .map(|(i, members)| {
            event_from_members(input, members)
                .map_err(|e| EventError(format!("batch item {i}: {}", e.0)))
        })
        .collect()
}

/// A JSON object's members in document order, names and values borrowed from the input where
/// possible. A repeated name: the last one counts (as a map would have it).
struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Members<'a> {
    /// Takes member `name` out (the last of repeats; all of them are removed).
    fn remove(&mut self, name: &str) -> Option<&'a RawValue> {
        let last = self.0.iter().rposition(|(k, _)| k == name)?;
        let value = self.0[last].1;
        self.0.retain(|(k, _)| k != name);
        Some(value)
    }
}

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8).min(64));
                while let Some(Name(name)) = map.next_key()? {
                    members.push((name, map.next_value::<&'de RawValue>()?));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Object)
    }
}

/// A member name: borrowed unless it holds escapes.
struct Name<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Str;
        impl<'de> Visitor<'de> for Str {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(Str)
    }
}

/// The batch array; records which item was being read when an error struck.
struct BatchSeed<'f> {
    failed_item: &'f mut Option<usize>,
}

impl<'de> DeserializeSeed<'de> for BatchSeed<'_> {
    type Value = Vec<Members<'de>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for BatchSeed<'_> {
    type Value = Vec<Members<'de>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON array of CloudEvents")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        loop {
            *self.failed_item = Some(items.len());
            match seq.next_element::<Members<'de>>()? {
                Some(m) => items.push(m),
                None => break,
            }
        }
        *self.failed_item = None;
        Ok(items)
    }
}

fn string_member(name: &str, raw: &RawValue) -> Result<Option<Str>, EventError> {
    let text = raw.get();
    if text == "null" {
        return Ok(None);
    }
    // A string without escapes is its text between the quotes: the raw value is valid JSON
    // (serde_json checked it when it captured it), so no parser is needed to read it.
    if let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        if !inner.contains('\\') {
            return Ok(Some(Str::new(inner)));
        }
    }
    serde_json::from_str::<Str>(text)
        .map(Some)
        .map_err(|_| EventError(format!("{name} must be a JSON string")))
}

fn event_from_members(input: &Bytes, mut members: Members<'_>) -> Result<Event, EventError> {
    let mut take = |name: &str| -> Result<Option<Str>, EventError> {
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
    let datacontenttype = take("datacontenttype")?.map(String::from);
    let dataschema = take("dataschema")?.map(String::from);
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

    // What is left are extensions. Sorted by name for deterministic encodings; of repeats the
    // last one counts (reversed first, the stable sort puts the last of equal names first, and
    // dedup keeps the first of a run).
    let mut rest = members.0;
    rest.reverse();
    rest.sort_by(|a, b| a.0.cmp(&b.0));
    rest.dedup_by(|later, first| later.0 == first.0);
    let mut extensions = Vec::with_capacity(rest.len());
    for (name, raw) in rest {
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
        extensions.push((name.into(), value));
    }
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
    write_json_str(out, &event.id);
    out.extend_from_slice(b",\"source\":");
    write_json_str(out, &event.source);
    out.extend_from_slice(b",\"type\":");
    write_json_str(out, &event.ty);
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
            write_json_str(out, v);
        }
    }
    for (name, value) in &event.extensions {
        out.extend_from_slice(b",\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
        match value {
            ExtValue::String(s) => write_json_str(out, s),
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
                write_json_str(out, text);
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

/// Appends `s` as a JSON string, escaped exactly as serde_json escapes it. The text is read
/// in blocks of 32 bytes: a block with nothing to escape (no `"`, `\` or control character) is
/// passed over in one step and copied with its neighbours in one run; only a block that holds
/// such a byte is read byte by byte, and each escape is written by serde_json's formatter.
/// serde_json's own escaper reads every byte through a table (about 9 instructions per byte: a
/// third of what a Redis stream entry of a KiB of JSON text cost).
pub fn write_json_str(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    out.reserve(b.len() + 2);
    out.push(b'"');
    // `b[run..]` is not written yet.
    let mut run = 0;
    let mut escape_block = |out: &mut Vec<u8>, at: usize, block: &[u8]| {
        for (j, &x) in block.iter().enumerate() {
            if needs_escape(x) {
                out.extend_from_slice(&b[run..at + j]);
                write_escape(out, x);
                run = at + j + 1;
            }
        }
    };
    let mut blocks = b.chunks_exact(32);
    let mut at = 0;
    for block in &mut blocks {
        // Folded without an exit inside, which the compiler turns into vector compares.
        if block
            .iter()
            .fold(0, |acc, &x| acc | u8::from(needs_escape(x)))
            != 0
        {
            escape_block(out, at, block);
        }
        at += 32;
    }
    escape_block(out, at, blocks.remainder());
    out.extend_from_slice(&b[run..]);
    out.push(b'"');
}

/// Whether serde_json escapes `x` in a string: `"`, `\` and the bytes below 0x20.
fn needs_escape(x: u8) -> bool {
    x < 0x20 || x == b'"' || x == b'\\'
}

fn write_escape(out: &mut Vec<u8>, x: u8) {
    use serde_json::ser::{CharEscape, CompactFormatter, Formatter};
    let escape = match x {
        b'"' => CharEscape::Quote,
        b'\\' => CharEscape::ReverseSolidus,
        0x08 => CharEscape::Backspace,
        0x0c => CharEscape::FormFeed,
        b'\n' => CharEscape::LineFeed,
        b'\r' => CharEscape::CarriageReturn,
        b'\t' => CharEscape::Tab,
        other => CharEscape::AsciiControl(other),
    };
    // Writing into a Vec cannot fail.
    let _ = CompactFormatter.write_char_escape(out, escape);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_written_as_serde_json_writes_them() {
        let mut cases: Vec<String> = [
            "",
            "plain",
            "é ✓ 日本 😀",
            "with \"quote\"",
            "back\\slash",
            "tab\tnew\nline\r",
            "\u{0}\u{1f}\u{7f}\u{20}/",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Every byte that may be escaped, alone and at each position of a block of 32 and its
        // remainder, in text of lengths around the block size.
        for len in [1, 31, 32, 33, 63, 64, 65, 100] {
            for c in (0u8..0x80).map(char::from) {
                for at in [0, len / 2, len - 1] {
                    let mut s: Vec<char> = "x".repeat(len).chars().collect();
                    s[at] = c;
                    cases.push(s.into_iter().collect());
                }
            }
        }
        cases.push("x".repeat(1000));
        cases.push("\"".repeat(100));
        cases.push((0u8..0x20).map(char::from).cycle().take(200).collect());
        let doc = serde_json::json!({"pad": "x".repeat(300), "items": [{"sku": "A-1", "q": 3}], "t": "a\tb\u{1}"});
        cases.push(serde_json::to_string(&doc).unwrap());
        cases.push(serde_json::to_string_pretty(&doc).unwrap());
        cases.push(format!("{}\"", "é".repeat(500)));
        for s in &cases {
            let mut ours = b"prefix".to_vec();
            write_json_str(&mut ours, s);
            let mut want = b"prefix".to_vec();
            serde_json::to_writer(&mut want, s).unwrap();
            assert_eq!(ours, want, "{s:?}");
        }
    }

    #[test]
    fn string_members_read_without_the_parser_equal_the_parsers_reading() {
        let cases = [
            r#""""#,
            r#""plain""#,
            r#""é ✓ 日本""#,
            r#""with \"quote\"""#,
            r#""tab\tand \u00e9""#,
            r#""\ud83d\ude00""#,
            r#""a\\b""#,
            "null",
        ];
        for text in cases {
            let raw: Box<RawValue> = serde_json::from_str(text).unwrap();
            let want = if text == "null" {
                None
            } else {
                Some(serde_json::from_str::<String>(text).unwrap())
            };
            let got = string_member("id", &raw).unwrap().map(String::from);
            assert_eq!(got, want, "{text}");
        }
        for not_a_string in ["1", "true", "[\"a\"]", "{\"a\":\"b\"}"] {
            let raw: Box<RawValue> = serde_json::from_str(not_a_string).unwrap();
            assert!(string_member("id", &raw).is_err(), "{not_a_string}");
        }
    }

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

    #[test]
    fn batch_errors_name_the_item() {
        let err = |b: &[u8]| decode_batch(&Bytes::copy_from_slice(b)).unwrap_err().0;
        let ok = br#"{"specversion":"1.0","id":"1","source":"/s","type":"t"}"#;
        assert!(err(b"{}").starts_with("a CloudEvents batch must be a JSON array"));
        let not_object = [&b"["[..], ok, b",7]"].concat();
        assert!(
            err(&not_object)
                .starts_with("batch item 1: invalid type: integer `7`, expected a JSON object"),
            "{}",
            err(&not_object)
        );
        let invalid = [
            &b"["[..],
            ok,
            br#",{"specversion":"1.0","id":"2","type":"t"}]"#,
        ]
        .concat();
        assert_eq!(err(&invalid), "batch item 1: source is missing");
        let truncated = [&b"["[..], ok, br#",{"id":"#].concat();
        assert!(
            err(&truncated).starts_with("batch item 1: "),
            "{}",
            err(&truncated)
        );
        let trailing = [&b"["[..], ok, b"] x"].concat();
        assert!(err(&trailing)
            .starts_with("a CloudEvents batch must be a JSON array: trailing characters"));
    }

    #[test]
    fn repeated_members_last_one_counts_and_escaped_names_are_read() {
        let input = Bytes::from_static(
            br#"{"specversion":"1.0","id":"first","source":"/s","type":"t","id":"second",
                "ext":"a","\u0065xt":"b","other":1,"data":{"k":1}}"#,
        );
        let e = decode_event(&input).unwrap();
        assert_eq!(e.id, "second");
        assert_eq!(
            e.extensions,
            vec![
                ("ext".into(), ExtValue::String("b".into())),
                ("other".into(), ExtValue::Integer(1)),
            ]
        );
        assert_eq!(e.data.as_bytes().unwrap().as_ref(), br#"{"k":1}"#);
    }
}
