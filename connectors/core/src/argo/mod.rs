//! Argo Events compatibility: pieces of Argo's event shapes that several `format: argo` sources
//! share (`../shared/reference/argo-events.md` §2.3: the `jsonBody` rule and Go's
//! `time.String()`), and [`map`], the kit each connector uses to read its part of an Argo
//! manifest (`sluice run -f`).

pub mod map;

use base64::Engine;
use chrono::{DateTime, Utc};

/// The JSON text of `data.body` under Argo's `jsonBody` rule: with `json_body`, the payload
/// verbatim (it must be JSON: Argo drops the message otherwise, we refuse it with a reason);
/// without, a Go `[]byte`, which JSON-encodes as a base64 string.
pub fn body(payload: &[u8], json_body: bool) -> Result<Vec<u8>, String> {
    if json_body {
        if crate::event::is_json(payload) {
            Ok(payload.to_vec())
        } else {
            Err("json_body is set but the payload is not JSON".into())
        }
    } else {
        let mut out = Vec::with_capacity(payload.len() * 4 / 3 + 4);
        out.push(b'"');
        out.extend_from_slice(
            base64::engine::general_purpose::STANDARD
                .encode(payload)
                .as_bytes(),
        );
        out.push(b'"');
        Ok(out)
    }
}

/// Go's `time.Time.String()` of a UTC instant: `2006-01-02 15:04:05.999999999 +0000 UTC`
/// (fraction without trailing zeros, omitted when zero).
pub fn go_time(at: DateTime<Utc>) -> String {
    let mut s = at.format("%Y-%m-%d %H:%M:%S").to_string();
    let nanos = at.timestamp_subsec_nanos();
    if nanos != 0 {
        let frac = format!("{nanos:09}");
        s.push('.');
        s.push_str(frac.trim_end_matches('0'));
    }
    s.push_str(" +0000 UTC");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_body_rule() {
        assert_eq!(body(br#"{"a":1}"#, true).unwrap(), br#"{"a":1}"#);
        assert!(body(b"not json", true).is_err());
        assert_eq!(body(b"hi", false).unwrap(), br#""aGk=""#);
    }

    #[test]
    fn go_time_string() {
        let t = DateTime::from_timestamp(1_764_590_400, 120_000_000).unwrap();
        assert_eq!(go_time(t), "2025-12-01 12:00:00.12 +0000 UTC");
        let t = DateTime::from_timestamp(1_764_590_400, 0).unwrap();
        assert_eq!(go_time(t), "2025-12-01 12:00:00 +0000 UTC");
    }
}
