//! The CloudEvents 1.0 event model, validated strictly.
//!
//! Data is kept as bytes ([`Data`]); nothing on the hot path parses it into a JSON tree. The time
//! attribute keeps the exact text it arrived with, so an incoming event passes through unchanged.

use std::fmt;

use bytes::Bytes;
use chrono::{DateTime, FixedOffset, SecondsFormat, Utc};

/// The only CloudEvents version Sluice speaks.
pub const SPEC_VERSION: &str = "1.0";

/// Context attribute names defined by the spec; an extension may not reuse them.
pub const CORE_ATTRIBUTES: [&str; 8] = [
    "id",
    "source",
    "specversion",
    "type",
    "datacontenttype",
    "dataschema",
    "subject",
    "time",
];

/// Why an event is not a valid CloudEvent 1.0. The text is meant for the client that sent it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EventError(pub String);

impl EventError {
    pub fn new(msg: impl Into<String>) -> Self {
        EventError(msg.into())
    }
}

/// An RFC 3339 timestamp, kept as the text it was given (validated), so it passes through
/// byte for byte.
///
/// One made from an instant ([`Timestamp::from_utc`], [`Timestamp::now`]) is written out the
/// first time its text is read: most events get their time that way, and on paths where
/// nothing encodes the event (a `null` sink, a filter that drops it) the text was made, kept
/// and freed for nothing, per event.
#[derive(Clone, Eq)]
pub struct Timestamp {
    text: std::sync::OnceLock<String>,
    at: DateTime<FixedOffset>,
}

impl std::fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timestamp")
            .field("text", &self.as_str())
            .field("at", &self.at)
            .finish()
    }
}

impl Timestamp {
    /// Parses and validates an RFC 3339 timestamp (`2018-04-05T17:31:00Z`, offsets allowed).
    pub fn parse(text: &str) -> Result<Self, EventError> {
        // chrono also accepts a space separator and lowercase `t`/`z`; RFC 3339 §5.6 requires
        // `T` in the CloudEvents profile, so insist on the canonical letters.
        let ok_shape = text.len() >= 20 && text.as_bytes().get(10) == Some(&b'T');
        let at = DateTime::parse_from_rfc3339(text)
            .ok()
            .filter(|_| ok_shape)
            .ok_or_else(|| EventError(format!("time {text:?} is not an RFC 3339 timestamp")))?;
        Ok(Timestamp {
            text: std::sync::OnceLock::from(text.to_owned()),
            at,
        })
    }

    /// A timestamp for an instant, formatted in UTC (`Z`) with the precision it has, up to
    /// nanoseconds, when its text is first read.
    pub fn from_utc(at: DateTime<Utc>) -> Self {
        Timestamp {
            text: std::sync::OnceLock::new(),
            at: at.fixed_offset(),
        }
    }

    pub fn now() -> Self {
        Self::from_utc(Utc::now())
    }

    pub fn as_str(&self) -> &str {
        // Unset only for `from_utc`, whose offset is zero.
        self.text.get_or_init(|| format_utc(&self.at.to_utc()))
    }

    /// The text's length, without writing the text out: a text not made yet counts as 30 bytes,
    /// the longest `from_utc` writes for years 0 to 9999 (`YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`; a
    /// few more beyond them). An estimate for sizing, read once per queued event.
    fn text_len(&self) -> usize {
        self.text.get().map_or(30, String::len)
    }

    pub fn instant(&self) -> DateTime<FixedOffset> {
        self.at
    }
}

thread_local! {
    /// The `YYYY-MM-DDTHH:MM:SS` text of the second this thread formatted last, with that
    /// second (Unix time): events made in the same second share it.
    static SECOND: std::cell::Cell<(i64, [u8; 19])> = const { std::cell::Cell::new((i64::MIN, [0; 19])) };
}

/// `at.to_rfc3339_opts(SecondsFormat::AutoSi, true)` written digit by digit instead of through
/// chrono's formatting machinery, with the date and time of day kept per second:
/// `YYYY-MM-DDTHH:MM:SS[.fff|.ffffff|.fffffffff]Z`. Years outside 0..=9999 and leap seconds
/// take chrono's path.
fn format_utc(at: &DateTime<Utc>) -> String {
    use chrono::{Datelike, Timelike};
    fn put(buf: &mut [u8], mut v: u32) {
        for b in buf.iter_mut().rev() {
            *b = b'0' + (v % 10) as u8;
            v /= 10;
        }
    }
    let nanos = at.timestamp_subsec_nanos();
    let unix = at.timestamp();
    // 0000-01-01 and 9999-12-31T23:59:59, in Unix seconds.
    if !(-62_167_219_200..=253_402_300_799).contains(&unix) || nanos >= 1_000_000_000 {
        return at.to_rfc3339_opts(SecondsFormat::AutoSi, true);
    }
    let head = SECOND.with(|c| {
        let (second, text) = c.get();
        if second == unix {
            return text;
        }
        // The naive UTC parts: each accessor of a `DateTime` would apply the (zero) offset again.
        let (date, time) = (at.date_naive(), at.time());
        let secs = time.num_seconds_from_midnight();
        let mut text = *b"0000-00-00T00:00:00";
        put(&mut text[0..4], date.year() as u32);
        put(&mut text[5..7], date.month());
        put(&mut text[8..10], date.day());
        put(&mut text[11..13], secs / 3600);
        put(&mut text[14..16], secs / 60 % 60);
        put(&mut text[17..19], secs % 60);
        c.set((unix, text));
        text
    });
    let mut buf = *b"0000-00-00T00:00:00.000000000Z";
    buf[..19].copy_from_slice(&head);
    let digits = match nanos {
        0 => 0,
        n if n % 1_000_000 == 0 => 3,
        n if n % 1_000 == 0 => 6,
        _ => 9,
    };
    let mut end = 19;
    if digits > 0 {
        put(
            &mut buf[20..20 + digits],
            nanos / 10u32.pow(9 - digits as u32),
        );
        end = 20 + digits;
    }
    buf[end] = b'Z';
    std::str::from_utf8(&buf[..=end])
        .expect("ASCII digits and separators")
        .to_owned()
}

/// A fresh event id: a UUIDv7 (ordered by its millisecond, cannot repeat: 74 random bits), in
/// its hyphenated lowercase form, written without the `fmt` machinery. No counter orders the
/// ids of one millisecond (the crate's shared counter takes a process-wide lock per id).
pub fn new_event_id() -> String {
    new_event_id_at(Utc::now())
}

/// A fresh id ([`new_event_id`]) and the time it was made, from one reading of the clock.
pub fn new_event_id_and_time() -> (String, Timestamp) {
    let now = Utc::now();
    (new_event_id_at(now), Timestamp::from_utc(now))
}

/// [`new_event_id`] for an instant the caller read already (the event's `time`, say), so one
/// event needs one clock reading.
pub fn new_event_id_at(at: DateTime<Utc>) -> String {
    let uuid = match u64::try_from(at.timestamp()) {
        Ok(secs) => uuid::Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::timestamp::context::NoContext,
            secs,
            at.timestamp_subsec_nanos(),
        )),
        // Before 1970: the clock is wrong; the crate's own reading of it still makes an id.
        Err(_) => uuid::Uuid::now_v7(),
    };
    let mut buf = uuid::Uuid::encode_buffer();
    uuid.hyphenated().encode_lower(&mut buf).to_owned()
}

/// Two timestamps are equal when they name the same instant (the conformance suite's rule).
impl PartialEq for Timestamp {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

/// An extension attribute value. JSON carries strings, integers and booleans natively; the other
/// CloudEvents types (binary, URI, timestamp) travel as their canonical strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtValue {
    String(Str),
    Integer(i32),
    Boolean(bool),
}

impl ExtValue {
    /// The canonical string form, as used by binary-mode headers.
    pub fn to_canonical(&self) -> std::borrow::Cow<'_, str> {
        match self {
            ExtValue::String(s) => std::borrow::Cow::Borrowed(s.as_str()),
            ExtValue::Integer(i) => std::borrow::Cow::Owned(i.to_string()),
            ExtValue::Boolean(b) => std::borrow::Cow::Borrowed(if *b { "true" } else { "false" }),
        }
    }

    /// The length of [`ExtValue::to_canonical`], without writing an integer out.
    pub fn canonical_len(&self) -> usize {
        match self {
            ExtValue::String(s) => s.len(),
            ExtValue::Integer(i) => {
                usize::from(*i < 0)
                    + i.unsigned_abs()
                        .checked_ilog10()
                        .map_or(1, |d| d as usize + 1)
            }
            ExtValue::Boolean(b) => {
                if *b {
                    4
                } else {
                    5
                }
            }
        }
    }
}

impl fmt::Display for ExtValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_canonical())
    }
}

impl From<&str> for ExtValue {
    fn from(s: &str) -> Self {
        ExtValue::String(Str::new(s))
    }
}

impl From<String> for ExtValue {
    fn from(s: String) -> Self {
        ExtValue::String(s.into())
    }
}

impl From<Str> for ExtValue {
    fn from(s: Str) -> Self {
        ExtValue::String(s)
    }
}

/// Event data as bytes. `Json` promises the bytes are one well-formed JSON document (so the
/// structured format embeds them without a check); `Binary` is any bytes, including JSON that
/// nobody has checked yet: the structured encoder checks it then, only if it must embed it.
/// Two `Data` are equal when their bytes are.
#[derive(Clone, Debug, Default)]
pub enum Data {
    #[default]
    None,
    Json(Bytes),
    Binary(Bytes),
}

impl PartialEq for Data {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Data {}

impl Data {
    pub fn as_bytes(&self) -> Option<&Bytes> {
        match self {
            Data::None => None,
            Data::Json(b) | Data::Binary(b) => Some(b),
        }
    }

    pub fn len(&self) -> usize {
        self.as_bytes().map_or(0, Bytes::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Data for bytes received with a content type. Nothing is parsed or validated here (this
    /// runs once per inbound request); see [`Data::is_embeddable_json`].
    pub fn from_bytes(bytes: Bytes, content_type: Option<&str>) -> Data {
        if bytes.is_empty() && content_type.is_none() {
            Data::None
        } else {
            Data::Binary(bytes)
        }
    }

    /// Whether the structured JSON format may embed these bytes as a JSON value: they are
    /// known JSON, or declared JSON by `content_type` and well-formed (checked now, without
    /// building a tree).
    pub fn is_embeddable_json(&self, content_type: Option<&str>) -> bool {
        match self {
            Data::None => false,
            Data::Json(_) => true,
            Data::Binary(b) => content_type.is_none_or(is_json_media_type) && is_json(b),
        }
    }
}

/// Checks that `bytes` hold exactly one JSON document (UTF-8, RFC 8259), without building a
/// tree.
///
/// The UTF-8 check is separate: the grammar's scan ([`crate::json`]) steps over a string's
/// bytes without checking their encoding, so `{"a":"\xff"}` passes it alone.
pub fn is_json(bytes: &[u8]) -> bool {
    simdutf8::basic::from_utf8(bytes).is_ok_and(is_json_text)
}

/// [`is_json`] for text already known to be UTF-8.
pub fn is_json_text(text: &str) -> bool {
    crate::json::is_document(text.as_bytes())
}

/// The content type of a payload that came without one (an MQTT 3.1.1 or Redis Pub/Sub message,
/// an SQS body without a `content-type` attribute): `application/json` when it is one JSON
/// document, `text/plain; charset=utf-8` when it is UTF-8, else `application/octet-stream`.
pub fn guess_content_type(payload: &[u8]) -> &'static str {
    match simdutf8::basic::from_utf8(payload) {
        Err(_) => "application/octet-stream",
        Ok(text) if is_json_text(text) => "application/json",
        Ok(_) => "text/plain; charset=utf-8",
    }
}

/// `application/json`, `text/json` and any `+json` structured suffix (parameters ignored).
pub fn is_json_media_type(ct: &str) -> bool {
    let essence = ct.split(';').next().unwrap_or("").trim();
    let (ty, sub) = match essence.split_once('/') {
        Some(p) => p,
        None => return false,
    };
    (ty.eq_ignore_ascii_case("application") || ty.eq_ignore_ascii_case("text"))
        && (sub.eq_ignore_ascii_case("json")
            || sub.len() > 5 && sub.as_bytes()[sub.len() - 5..].eq_ignore_ascii_case(b"+json"))
}

/// The text of an event's `id`, `source`, `type`, `subject` and extensions (names and string
/// values): held inline up to 24 bytes (most sources' names and types, a topic as subject,
/// `<topic>-<partition>-<offset>` ids, `partitionkey` and most keys) and on the heap past
/// that. Held as `String`s, each was an allocation and a free per event (docs/decisions.md,
/// "Event attributes are compact strings").
pub type Str = compact_str::CompactString;

/// A CloudEvent 1.0. Build one with [`Event::new`] and the setters, or decode one with the
/// [`crate::format`] and [`crate::http_binding`] modules; call [`Event::validate`] on anything
/// built from untrusted parts.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub id: Str,
    pub source: Str,
    pub ty: Str,
    pub datacontenttype: Option<String>,
    pub dataschema: Option<String>,
    pub subject: Option<Str>,
    pub time: Option<Timestamp>,
    /// Extension attributes in arrival order; names are unique.
    pub extensions: Vec<(Str, ExtValue)>,
    pub data: Data,
}

impl Event {
    /// A 128-bit key of the event's identity `(source, id)`: the same in every process and
    /// across restarts (XXH3-128), so it can name the event to a bus that deduplicates
    /// (JetStream `Nats-Msg-Id`). Two events with the same key are the same event.
    pub fn key(&self) -> u128 {
        crate::pipeline::dedup::dedup_key(&self.source, &self.id)
    }

    pub fn new(id: impl Into<Str>, source: impl Into<Str>, ty: impl Into<Str>) -> Self {
        Event {
            id: id.into(),
            source: source.into(),
            ty: ty.into(),
            datacontenttype: None,
            dataschema: None,
            subject: None,
            time: None,
            extensions: Vec::new(),
            data: Data::None,
        }
    }

    pub fn with_subject(mut self, subject: impl Into<Str>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    pub fn with_time(mut self, time: Timestamp) -> Self {
        self.time = Some(time);
        self
    }

    /// Sets JSON data (the caller promises well-formed JSON) and `application/json`.
    pub fn with_json(mut self, json: impl Into<Bytes>) -> Self {
        self.datacontenttype = Some("application/json".into());
        self.data = Data::Json(json.into());
        self
    }

    pub fn with_data(mut self, content_type: Option<String>, data: Data) -> Self {
        self.datacontenttype = content_type;
        self.data = data;
        self
    }

    pub fn extension(&self, name: &str) -> Option<&ExtValue> {
        self.extensions
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    /// Sets (or replaces) an extension attribute. The name is checked by [`Event::validate`].
    pub fn set_extension(&mut self, name: impl Into<Str>, value: impl Into<ExtValue>) {
        let name = name.into();
        let value = value.into();
        match self.extensions.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.extensions.push((name, value)),
        }
    }

    /// A rough size in bytes, used for queue and memory accounting.
    pub fn approx_size(&self) -> usize {
        let attrs = self.id.len()
            + self.source.len()
            + self.ty.len()
            + self.datacontenttype.as_ref().map_or(0, String::len)
            + self.dataschema.as_ref().map_or(0, String::len)
            + self.subject.as_ref().map_or(0, |s| s.len())
            + self.time.as_ref().map_or(0, Timestamp::text_len)
            + self
                .extensions
                .iter()
                .map(|(n, v)| n.len() + v.canonical_len() + 32)
                .sum::<usize>();
        std::mem::size_of::<Event>() + attrs + self.data.len()
    }

    /// Checks every rule of the CloudEvents 1.0 core spec that a value can break.
    pub fn validate(&self) -> Result<(), EventError> {
        check_string("id", &self.id, true)?;
        check_string("source", &self.source, true)?;
        if iri_string::validate::iri_reference::<iri_string::spec::UriSpec>(self.source.as_str())
            .is_err()
        {
            return Err(EventError(format!(
                "source {:?} is not a URI-reference (RFC 3986)",
                self.source
            )));
        }
        check_string("type", &self.ty, true)?;
        if let Some(ct) = &self.datacontenttype {
            check_media_type(ct)?;
        }
        if let Some(schema) = &self.dataschema {
            if schema.is_empty()
                || iri_string::validate::iri::<iri_string::spec::UriSpec>(schema.as_str()).is_err()
            {
                return Err(EventError(format!(
                    "dataschema {schema:?} is not an absolute URI"
                )));
            }
        }
        if let Some(subject) = &self.subject {
            check_string("subject", subject, true)?;
        }
        for (name, value) in &self.extensions {
            check_extension_name(name)?;
            if let ExtValue::String(s) = value {
                check_string(name, s, false)?;
            }
        }
        if let Some(i) = repeats(&self.extensions, |(n, _)| n).into_iter().next() {
            let name = &self.extensions[i].0;
            return Err(EventError(format!("extension {name:?} appears twice")));
        }
        Ok(())
    }
}

/// Positions, in order, of the items whose name an earlier item has. A scan while there are
/// few (the usual case: no allocation), a sort of positions past 16, so that a message with
/// 100 000 names (a 1 MiB structured event, or a Kafka record's headers) costs n log n
/// comparisons and not 10^10.
pub fn repeats<T>(items: &[T], name: impl Fn(&T) -> &str) -> Vec<usize> {
    const FEW: usize = 16;
    if items.len() <= FEW {
        return (0..items.len())
            .filter(|&i| items[..i].iter().any(|x| name(x) == name(&items[i])))
            .collect();
    }
    let mut order: Vec<usize> = (0..items.len()).collect();
    // Stable: of equal names the earliest position comes first.
    order.sort_by(|&a, &b| name(&items[a]).cmp(name(&items[b])));
    let mut out: Vec<usize> = order
        .windows(2)
        .filter(|w| name(&items[w[0]]) == name(&items[w[1]]))
        .map(|w| w[1])
        .collect();
    out.sort_unstable();
    out
}

/// Drops every item whose name an earlier item has (the first one counts), in linear or
/// n log n time ([`repeats`]).
pub fn keep_first_of_each_name<T>(items: &mut Vec<T>, name: impl Fn(&T) -> &str) {
    // One item or none (a Kafka record's key alone, say) repeats nothing.
    if items.len() < 2 {
        return;
    }
    let drop = repeats(items, name);
    if drop.is_empty() {
        return;
    }
    let mut next = drop.iter().copied().peekable();
    let mut i = 0;
    items.retain(|_| {
        let gone = next.peek() == Some(&i);
        if gone {
            next.next();
        }
        i += 1;
        !gone
    });
}

/// Checks the `source` and `type` a source puts on the events it makes from plain messages
/// (its `source:` / `type:` options or their defaults), once at `validate`, so that a bad value
/// is a config error instead of every message failing later.
pub fn check_source_and_type(source: &str, ty: &str) -> Result<(), String> {
    Event::new("probe", source, ty)
        .validate()
        .map_err(|e| format!("type or source: {e}"))
}

/// The extension name a header (HTTP, Kafka, ...) maps to: its ASCII letters and digits in
/// lowercase (`X-Request-Id` → `xrequestid`). Check the result with [`check_extension_name`].
pub fn extension_name_from(header: &str) -> Str {
    // Joined from `&str` pieces, not pushed char by char: compact_str's `push` re-checks the
    // representation at every call.
    let mut name: Str = header.split(|c: char| !c.is_ascii_alphanumeric()).collect();
    name.make_ascii_lowercase();
    name
}

/// Extension and attribute names: lowercase ASCII letters and digits, 1 to 20 characters.
pub fn check_extension_name(name: &str) -> Result<(), EventError> {
    let ok = !name.is_empty()
        && name.len() <= 20
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !ok {
        return Err(EventError(format!(
            "attribute name {name:?} is invalid: CloudEvents attribute names are 1 to 20 \
             lowercase letters or digits"
        )));
    }
    if CORE_ATTRIBUTES.contains(&name) || name == "data" {
        return Err(EventError(format!(
            "{name:?} is a reserved attribute name and cannot be an extension"
        )));
    }
    Ok(())
}

/// A CloudEvents string: no control characters; `non_empty` for id, source, type, subject.
pub fn check_string(attr: &str, value: &str, non_empty: bool) -> Result<(), EventError> {
    if non_empty && value.is_empty() {
        return Err(EventError(format!("{attr} must not be empty")));
    }
    if value
        .chars()
        .any(|c| matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}'))
    {
        return Err(EventError(format!(
            "{attr} contains a control character, which CloudEvents strings may not carry"
        )));
    }
    Ok(())
}

/// RFC 2046 media type: `type/subtype` with optional parameters.
pub fn check_media_type(ct: &str) -> Result<(), EventError> {
    // The types most requests carry are valid as written: no parse for them.
    const COMMON: [&str; 7] = [
        "application/json",
        "application/json; charset=utf-8",
        "application/octet-stream",
        "application/x-www-form-urlencoded",
        "text/plain",
        "text/plain; charset=utf-8",
        "application/xml",
    ];
    if COMMON.contains(&ct) {
        return Ok(());
    }
    match ct.parse::<mime::Mime>() {
        Ok(m) if !m.subtype().as_str().is_empty() && !m.type_().as_str().is_empty() => Ok(()),
        _ => Err(EventError(format!(
            "datacontenttype {ct:?} is not an RFC 2046 media type (type/subtype)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_map_to_their_lowercase_letters_and_digits() {
        assert_eq!(extension_name_from("X-Request-Id"), "xrequestid");
        assert_eq!(extension_name_from("traceparent"), "traceparent");
        assert_eq!(extension_name_from("--A_b.C9--"), "abc9");
        assert_eq!(extension_name_from("Grüße-2"), "gre2");
        assert_eq!(extension_name_from("-_-"), "");
        let long = extension_name_from("X-Some-Very-Long-Header-Name-Indeed-1");
        assert_eq!(long, "xsomeverylongheadernameindeed1");
    }

    #[test]
    fn canonical_len_is_the_canonical_texts_length() {
        let values = [
            ExtValue::String(Str::default()),
            ExtValue::String("héllo".into()),
            ExtValue::Boolean(true),
            ExtValue::Boolean(false),
        ]
        .into_iter()
        .chain([0, 1, 9, 10, 99, 100, -1, -9, -10, i32::MAX, i32::MIN].map(ExtValue::Integer));
        for v in values {
            assert_eq!(v.canonical_len(), v.to_canonical().len(), "{v:?}");
        }
    }

    fn minimal() -> Event {
        Event::new("1", "https://example.com/src", "com.example.test")
    }

    #[test]
    fn repeated_names_are_found_in_n_log_n_comparisons() {
        for n in [0, 1, 5, 16, 17, 1000] {
            // Every third name repeats the one before it.
            let names: Vec<String> = (0..n).map(|i| format!("x{}", i - i % 3 / 2)).collect();
            let expect: Vec<usize> = (0..n).filter(|i| i % 3 == 2).collect();
            assert_eq!(repeats(&names, |s| s), expect, "n = {n}");
            let mut kept = names.clone();
            keep_first_of_each_name(&mut kept, |s| s);
            let firsts: Vec<String> = (0..n)
                .filter(|i| i % 3 != 2)
                .map(|i| names[i].clone())
                .collect();
            assert_eq!(kept, firsts, "n = {n}");
        }
        // 100 000 distinct names: the scan would take 5·10^9 name reads, the sort takes n log n.
        let names: Vec<String> = (0..100_000).map(|i| format!("e{i}")).collect();
        let reads = std::cell::Cell::new(0u64);
        assert!(repeats(&names, |s| {
            reads.set(reads.get() + 1);
            s
        })
        .is_empty());
        assert!(reads.get() < 100_000 * 2 * 40, "{} name reads", reads.get());
        let mut e = minimal();
        e.extensions = names
            .iter()
            .map(|n| (n.into(), ExtValue::Integer(1)))
            .collect();
        e.validate().unwrap();
        e.extensions.push(("e99999".into(), ExtValue::Integer(2)));
        let err = e.validate().unwrap_err();
        assert!(err.0.contains("\"e99999\" appears twice"), "{err:?}");
    }

    #[test]
    fn a_media_type_with_multibyte_characters_is_read_without_a_panic() {
        for ct in [
            "application/aéabcd",
            "application/é",
            "text/éjson",
            "application/x+jsoné",
        ] {
            assert!(!is_json_media_type(ct), "{ct}");
        }
        assert!(is_json_media_type("application/ld+JSON; charset=utf-8"));
        let data = Data::Binary(bytes::Bytes::from_static(b"1"));
        assert!(!data.is_embeddable_json(Some("application/aéabcd")));
        assert!(data.is_embeddable_json(Some("application/json")));
    }

    #[test]
    fn utc_timestamps_are_written_as_chrono_writes_them() {
        use chrono::TimeZone;
        // Every precision (none, milli, micro, nano), the ends of the 4-digit years, a leap
        // day, and a spread of instants from a fixed-seed generator.
        let mut cases = vec![
            Utc.timestamp_opt(0, 0).unwrap(),
            Utc.timestamp_opt(1_700_000_000, 120_000_000).unwrap(),
            Utc.timestamp_opt(1_700_000_000, 123_456_000).unwrap(),
            Utc.timestamp_opt(1_700_000_000, 123_456_789).unwrap(),
            Utc.timestamp_opt(1_700_000_000, 1).unwrap(),
            Utc.with_ymd_and_hms(2024, 2, 29, 23, 59, 59).unwrap(),
            Utc.with_ymd_and_hms(0, 1, 1, 0, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap(),
            Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(-1, 1, 1, 0, 0, 0).unwrap(),
            // A leap second (chrono keeps it as nanoseconds past 10^9).
            Utc.timestamp_opt(1_483_228_799, 1_500_000_000).unwrap(),
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let secs = (x % 253_402_300_800) as i64 - 62_167_219_200;
            let nanos = match x >> 62 {
                0 => 0,
                1 => ((x >> 20) % 1000) as u32 * 1_000_000,
                2 => ((x >> 20) % 1_000_000) as u32 * 1000,
                _ => ((x >> 20) % 1_000_000_000) as u32,
            };
            cases.push(Utc.timestamp_opt(secs, nanos).unwrap());
            // The same second again (the kept date and time of day), then the next one.
            cases.push(Utc.timestamp_opt(secs, nanos / 2).unwrap());
            cases.push(Utc.timestamp_opt(secs + 1, nanos).unwrap());
        }
        for at in cases {
            let t = Timestamp::from_utc(at);
            assert_eq!(
                t.as_str(),
                at.to_rfc3339_opts(SecondsFormat::AutoSi, true),
                "{at:?}"
            );
            assert_eq!(t.instant(), at.fixed_offset());
        }
    }

    #[test]
    fn a_time_made_from_an_instant_is_written_out_only_when_read() {
        use chrono::TimeZone;
        let t = Timestamp::from_utc(Utc.timestamp_opt(1_700_000_000, 123_456_789).unwrap());
        let e = Event::new("1", "/s", "t").with_time(t.clone());
        let estimated = e.approx_size();
        let kept = e.time.as_ref().unwrap();
        assert!(
            kept.text.get().is_none(),
            "sizing the event wrote the text out"
        );
        assert_eq!(kept.as_str(), "2023-11-14T22:13:20.123456789Z");
        // The estimate is the longest text: the real one is no longer.
        assert!(e.approx_size() <= estimated);
        let copy = e.clone();
        assert_eq!(
            copy.time.as_ref().unwrap().text.get().map(String::as_str),
            Some(kept.as_str())
        );
        assert_eq!(&t, kept);
        assert_eq!(format!("{t:?}"), format!("{kept:?}"));
    }

    #[test]
    fn fresh_ids_are_hyphenated_uuid_v7() {
        let a = new_event_id();
        let b = new_event_id();
        assert_ne!(a, b);
        let u = uuid::Uuid::parse_str(&a).unwrap();
        assert_eq!(u.get_version_num(), 7);
        assert_eq!(a, u.hyphenated().to_string());
    }

    #[test]
    fn ids_made_at_one_instant_differ_and_carry_its_millisecond() {
        use chrono::TimeZone;
        let at = Utc.timestamp_opt(1_700_000_000, 123_456_789).unwrap();
        let ids: Vec<String> = (0..1000).map(|_| new_event_id_at(at)).collect();
        let mut distinct = ids.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), ids.len(), "distinct");
        let u = uuid::Uuid::parse_str(&ids[0]).unwrap();
        assert_eq!(u.get_version_num(), 7);
        assert_eq!(u.get_variant(), uuid::Variant::RFC4122);
        let (secs, nanos) = u.get_timestamp().unwrap().to_unix();
        assert_eq!((secs, nanos / 1_000_000), (1_700_000_000, 123));
        // Ids of a later millisecond sort after.
        let later = new_event_id_at(at + chrono::Duration::milliseconds(1));
        assert!(ids.iter().all(|id| *id < later));
    }

    #[test]
    fn common_media_types_pass_and_others_are_still_parsed() {
        for ct in [
            "application/json",
            "text/plain; charset=utf-8",
            "application/xml",
        ] {
            check_media_type(ct).unwrap();
        }
        check_media_type("application/vnd.acme+json; v=2").unwrap();
        for bad in ["json", "application/", "/json", "", "application/json;;"] {
            assert!(check_media_type(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn minimal_is_valid() {
        minimal().validate().unwrap();
    }

    #[test]
    fn empty_required_attributes_are_rejected() {
        for (i, e) in [
            Event::new("", "/s", "t"),
            Event::new("1", "", "t"),
            Event::new("1", "/s", ""),
        ]
        .iter()
        .enumerate()
        {
            assert!(e.validate().is_err(), "case {i} should fail");
        }
    }

    #[test]
    fn source_must_be_a_uri_reference() {
        let mut e = minimal();
        e.source = "not a uri ref ::".into();
        assert!(e.validate().unwrap_err().0.contains("URI-reference"));
        for ok in [
            "#fragment",
            "/a/b",
            "urn:x:y",
            "//authority/path",
            "order-svc",
        ] {
            e.source = ok.into();
            e.validate().unwrap();
        }
    }

    #[test]
    fn extension_names_follow_the_spec() {
        for bad in [
            "MyExtension",
            "my.extension",
            "with_underscore",
            "",
            "abcdefghijklmnopqrstu",
            "id",
            "data",
        ] {
            let mut e = minimal();
            e.set_extension(bad, "v");
            assert!(e.validate().is_err(), "{bad:?} should be rejected");
        }
        let mut e = minimal();
        e.set_extension("abcdefghijklmnopqrst", "v");
        e.set_extension("traceparent", "00-abc");
        e.validate().unwrap();
    }

    #[test]
    fn control_characters_are_rejected() {
        let mut e = minimal();
        e.set_extension("ext", "a\u{1}b");
        assert!(e.validate().is_err());
        let mut e = minimal();
        e.subject = Some("line\nbreak".into());
        assert!(e.validate().is_err());
        let mut e = minimal();
        e.id = "x\u{85}y".into();
        assert!(e.validate().is_err());
    }

    #[test]
    fn timestamps_are_rfc3339() {
        for ok in [
            "2018-04-05T17:31:00Z",
            "2018-04-05T17:31:00.000000000Z",
            "2018-04-05T18:31:00+01:00",
            "2018-04-05T16:31:00-01:00",
        ] {
            let t = Timestamp::parse(ok).unwrap();
            assert_eq!(t.as_str(), ok, "text is kept as it came");
            assert_eq!(t, Timestamp::parse("2018-04-05T17:31:00Z").unwrap());
        }
        for bad in [
            "lunchtime",
            "2018-04-05T18:31Z",
            "2018-04-05T18:31:00X",
            "2018-04-05T18:31:00+25:00",
            "2018-04-05T18:31:00+xx:00",
            "2018-04-05T18:31:00+05",
            "2018-04-05 18:31:00Z",
        ] {
            assert!(Timestamp::parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn media_types() {
        let mut e = minimal();
        for bad in ["xyz", "", "application/"] {
            e.datacontenttype = Some(bad.into());
            assert!(e.validate().is_err(), "{bad:?}");
        }
        e.datacontenttype = Some("application/json; charset=utf-8".into());
        e.validate().unwrap();
        assert!(is_json_media_type("application/cloudevents+json"));
        assert!(is_json_media_type("text/json"));
        assert!(is_json_media_type("Application/JSON; charset=utf-8"));
        assert!(!is_json_media_type("text/plain"));
        assert!(!is_json_media_type("application/jsonx"));
    }

    #[test]
    fn declared_json_is_embeddable_only_when_it_is_json() {
        let ct = Some("application/json");
        let ok = Data::from_bytes(Bytes::from_static(b"{\"a\":1}"), ct);
        assert!(
            matches!(ok, Data::Binary(_)),
            "nothing is validated on ingest"
        );
        assert!(ok.is_embeddable_json(ct));
        assert!(!Data::from_bytes(Bytes::from_static(b"{not json"), ct).is_embeddable_json(ct));
        assert!(!ok.is_embeddable_json(Some("text/plain")));
        assert!(Data::Json(Bytes::from_static(b"1")).is_embeddable_json(Some("text/plain")));
        assert_eq!(
            ok,
            Data::Json(Bytes::from_static(b"{\"a\":1}")),
            "equal by bytes"
        );
        assert!(matches!(Data::from_bytes(Bytes::new(), None), Data::None));
        // Not UTF-8 inside a string: not JSON, so not embedded as JSON.
        let bad = Data::from_bytes(Bytes::from_static(b"{\"a\":\"\xff\xfe\"}"), ct);
        assert!(!bad.is_embeddable_json(ct));
    }

    #[test]
    fn json_is_checked_for_utf8_too() {
        assert!(is_json(b"{\"a\":\"caf\xc3\xa9\"}"));
        for bad in [
            &b"{\"a\":\"\xff\"}"[..],
            b"{\"\xc3\":1}",
            b"[\"\xed\xa0\x80\"]",
            b"\"\xc0\xaf\"",
        ] {
            assert!(!is_json(bad), "{bad:?}");
            assert_eq!(
                guess_content_type(bad),
                "application/octet-stream",
                "{bad:?}"
            );
        }
        assert_eq!(guess_content_type(b"{\"a\":[1,2]}"), "application/json");
        assert_eq!(
            guess_content_type("caf\u{e9}".as_bytes()),
            "text/plain; charset=utf-8"
        );
        assert_eq!(guess_content_type(b"{\"a\":"), "text/plain; charset=utf-8");
        assert_eq!(guess_content_type(b""), "text/plain; charset=utf-8");
    }

    #[test]
    fn dataschema_must_be_absolute() {
        let mut e = minimal();
        e.dataschema = Some("/relative".into());
        assert!(e.validate().is_err());
        e.dataschema = Some("https://cloudevents.io/dataschema".into());
        e.validate().unwrap();
    }
}
