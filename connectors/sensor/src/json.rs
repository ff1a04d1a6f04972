//! An event's data checked as JSON once per event, with the members of a top-level object
//! located on the way, so that a lookup whose first step names a member starts at that member's
//! value instead of walking the document from its start (a path behind a long string, such as
//! `items.0.sku` after a KiB of `description`, was skipped over once per lookup).
//!
//! The check is serde_json's grammar (RFC 8259) without building values. It is iterative: data
//! nested to any depth is checked without recursion (gjson's `valid`, used before, recursed per
//! level and overflowed a worker's stack at about 100 000 levels, a 200 KB body).

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// Data known to be one JSON document.
pub(crate) struct Doc<'a> {
    /// The whole document.
    pub(crate) text: &'a str,
    /// The top-level object's members in document order, each as its key and its value's raw
    /// JSON; `None` when the document is not an object or a key is written with escapes (its
    /// text is then not the key).
    members: Option<Vec<(&'a str, &'a str)>>,
}

impl<'a> Doc<'a> {
    /// `text` if it is one JSON document, else `None`.
    pub(crate) fn check(text: &'a str) -> Option<Doc<'a>> {
        match serde_json::from_str::<Top<'a>>(text) {
            Ok(Top(members)) => Some(Doc { text, members }),
            // A key serde_json would not take as a borrowed string (a lone surrogate escape, say)
            // fails the locating pass; the plain check decides.
            Err(_) => serde_json::from_str::<IgnoredAny>(text).ok().map(|_| Doc {
                text,
                members: None,
            }),
        }
    }

    /// Data a source already checked (`Data::Json`): not checked again, no member located.
    pub(crate) fn trusted(text: &'a str) -> Doc<'a> {
        Doc {
            text,
            members: None,
        }
    }

    /// `gjson::get(text, path)`, started at the top-level member the path's first step names
    /// when that step is a plain name (letters, digits, `_`, `-`) followed by the end of the
    /// path or by a `.` and a plain next step, and the document's first member of that name
    /// was located. Whatever that does not find is looked up from the start of the text:
    /// gjson, having matched a key whose value lacks the rest of the path, goes on reading
    /// inside that value and after it (`{"data":{"data":{"id":5}}}` has `data.id` for gjson),
    /// so a miss from the member alone would not be gjson's answer.
    pub(crate) fn get(&self, path: &'a str) -> gjson::Value<'a> {
        if let Some(members) = &self.members {
            let plain = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
            let (first, rest) = match path.bytes().position(|c| !plain(c)) {
                None => (path, None),
                // The next step starts with a plain character or `#` (a count or a query),
                // never `.` (gjson's JSON-lines prefix), `@` (a modifier at a path's start)
                // or anything else gjson reads differently at the start of a path.
                Some(i)
                    if path.as_bytes()[i] == b'.'
                        && path
                            .as_bytes()
                            .get(i + 1)
                            .is_some_and(|&c| plain(c) || c == b'#') =>
                {
                    (&path[..i], Some(&path[i + 1..]))
                }
                Some(_) => return gjson::get(self.text, path),
            };
            if !first.is_empty() {
                if let Some((_, value)) = members.iter().find(|(k, _)| *k == first) {
                    let found = match rest {
                        None => gjson::parse(value),
                        Some(rest) => gjson::get(value, rest),
                    };
                    if found.exists() {
                        return found;
                    }
                }
            }
        }
        gjson::get(self.text, path)
    }
}

/// One pass of serde_json over a document: an object's members located (keys borrowed, values
/// as raw JSON, which serde_json checks without building them), anything else only checked.
struct Top<'a>(Option<Vec<(&'a str, &'a str)>>);

/// A key as written: `None` when it has escapes.
struct Key<'a>(Option<&'a str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Some(s)))
            }
            fn visit_str<E>(self, _: &str) -> Result<Key<'de>, E> {
                Ok(Key(None))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> serde::Deserialize<'de> for Top<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Top<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON document")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Top<'de>, A::Error> {
                let mut members = Some(Vec::with_capacity(8));
                while let Some(Key(key)) = m.next_key::<Key<'de>>()? {
                    let value = m.next_value::<&'de RawValue>()?;
                    match (key, members.as_mut()) {
                        (Some(k), Some(ms)) => ms.push((k, value.get())),
                        _ => members = None,
                    }
                }
                Ok(Top(members))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Top<'de>, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Top(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Top<'de>, E> {
                Ok(Top(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Top<'de>, E> {
                Ok(Top(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Top<'de>, E> {
                Ok(Top(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Top<'de>, E> {
                Ok(Top(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<Top<'de>, E> {
                Ok(Top(None))
            }
            fn visit_unit<E>(self) -> Result<Top<'de>, E> {
                Ok(Top(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// How deep `text` nests (arrays and objects), counted outside strings; for consumers that
/// recurse per level (jaq's reader), checked before they read.
pub(crate) fn depth(text: &[u8]) -> usize {
    let (mut depth, mut max, mut in_str, mut esc) = (0usize, 0usize, false, false);
    for &c in text {
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// The deepest nesting handed to a reader that recurses per level.
pub(crate) const MAX_DEPTH: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;

    const DOCS: &[&str] = &[
        r#"{"pad":"xxxxxxxx","items":[{"sku":"A-1","qty":3},{"sku":"B","qty":1}],"n":1.5,"t":true,"z":null,"o":{"a":{"b":"c"}},"s":"x"}"#,
        r#"{"a":1,"a":2,"b":{"a":3}}"#,
        r#"{"k\u0065y":1,"key":2,"x":{"y":3}}"#,
        r#"  {"sp" : [ 1 , 2 ] , "e":{}, "ea":[] }  "#,
        r#"[{"a":1},{"a":2}]"#,
        r#""just a string""#,
        "42",
        r#"{"a-b":{"c_d":[0,1,{"e":"f"}]},"0":"zero","1":{"2":"two"}}"#,
        r#"{"body":{"action":"opened","ref":"refs/heads/main"},"header":{"X-Foo":["a","b"]}}"#,
        r#"{"data":{"data":{"id":5}},"id":6}"#,
        r#"{"a":[1],"a":{"b":2}}"#,
        r#"{"a":{"x":1},"b":[{"k":"v","n":3},{"k":"w","n":4}]}"#,
    ];

    const PATHS: &[&str] = &[
        "pad",
        "items",
        "items.0.sku",
        "items.1.qty",
        "items.#",
        "items.#.sku",
        "n",
        "t",
        "z",
        "o",
        "o.a",
        "o.a.b",
        "s",
        "a",
        "b.a",
        "key",
        "x.y",
        "sp",
        "sp.1",
        "e",
        "ea",
        "0.a",
        "#.a",
        "a-b.c_d.2.e",
        "0",
        "1.2",
        "body.action",
        "header.X-Foo.1",
        "header.X-Foo.#",
        "missing",
        "missing.x",
        "items.",
        "o.a|b",
        "o.*.b",
        "i?ems.0",
        "@this",
        "items|@reverse",
        "body\\.action",
        "",
        "data.id",
        "data.data.id",
        "a.b",
        "a...0",
        "a..x",
        "a.@reverse",
        "b.#(k==\"w\").n",
        "b.#(n>3)#.k",
        "b.!true",
        "a.x.",
        "id",
    ];

    #[test]
    fn a_located_lookup_answers_what_gjson_answers_from_the_start() {
        for doc in DOCS {
            let d = Doc::check(doc).unwrap_or_else(|| panic!("{doc} is JSON"));
            for path in PATHS {
                let (a, b) = (d.get(path), gjson::get(doc, path));
                let what = format!("{doc} at {path:?}");
                assert_eq!(a.exists(), b.exists(), "{what}");
                assert!(a.kind() == b.kind(), "{what}");
                assert_eq!(a.json(), b.json(), "{what}");
                assert_eq!(a.str(), b.str(), "{what}");
                assert_eq!(a.f64(), b.f64(), "{what}");
            }
        }
    }

    #[test]
    fn members_are_located_only_when_every_key_is_plain() {
        let d = Doc::check(DOCS[0]).unwrap();
        let keys: Vec<_> = d.members.as_ref().unwrap().iter().map(|m| m.0).collect();
        assert_eq!(keys, ["pad", "items", "n", "t", "z", "o", "s"]);
        assert_eq!(
            d.members.as_ref().unwrap()[1].1,
            r#"[{"sku":"A-1","qty":3},{"sku":"B","qty":1}]"#
        );
        assert!(
            Doc::check(DOCS[2]).unwrap().members.is_none(),
            "an escaped key"
        );
        assert!(Doc::check(DOCS[4]).unwrap().members.is_none(), "an array");
        assert!(Doc::check(DOCS[6]).unwrap().members.is_none(), "a number");
    }

    #[test]
    fn what_is_not_one_json_document_is_refused() {
        for bad in [
            "",
            " ",
            "{",
            r#"{"a":1"#,
            r#"{"a":1}}"#,
            r#"{"a":1} {"b":2}"#,
            r#"{"a":}"#,
            r#"{"a" 1}"#,
            r#"{a:1}"#,
            r#"{"a":01}"#,
            r#"{"a":1,}"#,
            r#"[1,]"#,
            r#"{"a":"x"#,
            "{\"a\":\"tab\there\"}",
            r#"{"a":tru}"#,
            r#"{"a":"\x"}"#,
            "nul",
            r#"{"a":[1,2}"#,
            r#"{"a":{"b":[}]}"#,
            "'a'",
            r#"{"a":1e}"#,
            r#"{"a":-}"#,
            r#"{"a":.5}"#,
        ] {
            assert!(Doc::check(bad).is_none(), "{bad:?} is not JSON");
        }
        for good in [
            r#"{"a":"\ud83d\ude00"}"#,
            r#"{"a":1e400}"#,
            r#"{"a":-0.5E+3}"#,
            "[]",
            "{}",
            "null",
        ] {
            assert!(Doc::check(good).is_some(), "{good:?} is JSON");
        }
    }

    #[test]
    fn data_nested_beyond_any_stack_is_checked_without_recursion() {
        // gjson's `valid` overflowed a 2 MiB stack at about 100 000 levels.
        let n = 400_000;
        let doc = format!(r#"{{"a":{}{}, "b":"x"}}"#, "[".repeat(n), "]".repeat(n));
        let bad = format!(r#"{{"a":{}{}}}"#, "[".repeat(n), "]".repeat(n - 1));
        let (ok, refused, d) = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                let d = Doc::check(&doc).map(|d| d.get("b").str().to_owned());
                (
                    d.is_some(),
                    Doc::check(&bad).is_none(),
                    depth(doc.as_bytes()),
                )
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(ok && refused);
        assert_eq!(d, n + 1);
    }

    #[test]
    fn depth_counts_brackets_outside_strings() {
        assert_eq!(depth(b"1"), 0);
        assert_eq!(depth(br#"{"a":[1,{"b":[]}]}"#), 4);
        assert_eq!(depth(br#"{"a":"[[[[\"{{"}"#), 1);
        assert_eq!(depth(br#"["\\",[["x"]]]"#), 3);
    }
}
