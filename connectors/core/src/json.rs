//! A JSON scanner that checks RFC 8259's grammar without building values: one document, or one
//! value inside a document, from a byte offset. It accepts what serde_json's `IgnoredAny`
//! accepts (a test compares the two on tens of thousands of random edits of a corpus): any
//! `\uXXXX` escape, a lone surrogate included (as serde_json for a value it skips and Go's
//! `encoding/json`, which reads one as U+FFFD), any depth (it is iterative: data nested beyond
//! any stack is checked without recursion), and no check of the bytes' encoding (a caller that
//! has bytes checks UTF-8 first; see [`crate::event::is_json`]).
//!
//! It reads a string's first eight bytes as one word, a longer run by memchr's vector search,
//! and keeps the kinds of the open arrays and objects as bits. Why it replaced serde_json's
//! pass, with the instruction counts measured: `docs/decisions.md`, 2026-12-05.
//!
//! Positions are byte offsets into the document; each function takes the offset of the first
//! byte to read and answers the offset after what it read, `None` when the text there is not
//! what the grammar allows. Keys and values a caller slices from a `&str` at these offsets
//! start and end at ASCII bytes (quotes, brackets, a value's first byte), so the slices are
//! UTF-8.

/// Whether `text` is exactly one JSON document (surrounding whitespace allowed).
pub fn is_document(text: &[u8]) -> bool {
    let start = ws(text, 0);
    skip_value(text, start).is_some_and(|end| ws(text, end) == text.len())
}

/// The offset of the first byte at or after `i` that is not JSON whitespace.
#[inline(always)]
pub fn ws(b: &[u8], mut i: usize) -> usize {
    while let Some(&c) = b.get(i) {
        if !matches!(c, b' ' | b'\n' | b'\r' | b'\t') {
            break;
        }
        i += 1;
    }
    i
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `w` that ends a string's run of plain characters (a control
/// character, `"` or `\`). Bytes above the lowest such byte may be marked falsely (a borrow
/// carries upwards), the lowest is always right: that is the one the caller reads.
#[inline(always)]
fn specials(w: u64) -> u64 {
    // With bit 1 flipped, `"` (0x22) becomes 0x20 and the control characters stay below it,
    // while no other byte falls under 0x21: one test below 0x21 finds both.
    let low = w ^ (ONES * 0x02);
    let backslash = w ^ (ONES * u64::from(b'\\'));
    ((low.wrapping_sub(ONES * 0x21) & !low) | (backslash.wrapping_sub(ONES) & !backslash)) & HIGHS
}

/// A string's rest, from the byte after its opening quote: the offset after its closing quote,
/// and whether it holds an escape.
#[inline(always)]
fn skip_str(b: &[u8], i: usize) -> Option<(usize, bool)> {
    // Where short strings end: a quote in the next eight bytes with nothing special before it.
    if let Some(chunk) = b.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().ok()?);
        let m = specials(w);
        if m != 0 {
            let high = m.trailing_zeros();
            // The lowest marked byte is right (see `specials`): read it from the word.
            if (w >> (high - 7)) as u8 == b'"' {
                return Some((i + (high / 8) as usize + 1, false));
            }
        }
    }
    skip_str_long(b, i)
}

/// [`skip_str`] past its quick case: a string longer than seven bytes, one with an escape or a
/// control character, one with fewer than eight bytes of text after its opening quote, or one
/// that is not closed.
#[inline(never)]
fn skip_str_long(b: &[u8], mut i: usize) -> Option<(usize, bool)> {
    let mut escaped = false;
    loop {
        // The next special byte: in the next eight bytes (where short strings end), else
        // the next quote or backslash by memchr's vector search with no control character
        // before it; byte by byte in the last few bytes of the text.
        let c = if let Some(chunk) = b.get(i..i + 8) {
            let m = specials(u64::from_le_bytes(chunk.try_into().ok()?));
            if m != 0 {
                i += (m.trailing_zeros() / 8) as usize;
            } else {
                let rest = &b[i + 8..];
                let n = memchr::memchr2(b'"', b'\\', rest)?;
                // Without an early exit, so that the compiler reads it a vector at a time.
                if rest[..n].iter().fold(0u8, |a, &c| a | u8::from(c < 0x20)) != 0 {
                    return None;
                }
                i += 8 + n;
            }
            b[i]
        } else {
            loop {
                let c = *b.get(i)?;
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break c;
                }
                i += 1;
            }
        };
        match c {
            b'"' => return Some((i + 1, escaped)),
            b'\\' => {
                escaped = true;
                i = match *b.get(i + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i + 2,
                    // Any four hex digits: a lone surrogate is accepted, as serde_json does for
                    // a value it skips and Go's `encoding/json` does (it reads one as U+FFFD).
                    b'u' if b.get(i + 2..i + 6)?.iter().all(u8::is_ascii_hexdigit) => i + 6,
                    _ => return None,
                };
            }
            // A control character.
            _ => return None,
        }
    }
}

/// Digits from `i`, none or more.
#[inline(always)]
fn more_digits(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    i
}

/// Digits from `i`, at least one.
#[inline(always)]
fn digits(b: &[u8], i: usize) -> Option<usize> {
    b.get(i)
        .is_some_and(u8::is_ascii_digit)
        .then(|| more_digits(b, i + 1))
}

/// A number: `-`? (`0` | a digit 1–9 and digits) (`.` digits)? (`e`|`E` (`+`|`-`)? digits)?
#[inline(always)]
fn skip_num(b: &[u8], mut i: usize) -> Option<usize> {
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    i = match *b.get(i)? {
        b'0' => i + 1,
        b'1'..=b'9' => more_digits(b, i + 1),
        _ => return None,
    };
    match b.get(i) {
        Some(b'.' | b'e' | b'E') => skip_fraction(b, i),
        _ => Some(i),
    }
}

/// A number's fraction and exponent, from the `.`, `e` or `E` after its integer part.
#[inline(never)]
fn skip_fraction(b: &[u8], mut i: usize) -> Option<usize> {
    if b.get(i) == Some(&b'.') {
        i = digits(b, i + 1)?;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        i = digits(b, i)?;
    }
    Some(i)
}

/// [`ws`] where whitespace is rare: one test against `' '` answers for every byte above it.
#[inline(always)]
fn ws_fast(b: &[u8], i: usize) -> usize {
    match b.get(i) {
        Some(&c) if c > b' ' => i,
        _ => ws(b, i),
    }
}

/// An object member's key and colon, from the key's opening quote: the key's text without its
/// quotes (`None` when written with escapes) and the offset of the value.
#[inline(always)]
pub fn key(b: &[u8], i: usize) -> Option<(Option<std::ops::Range<usize>>, usize)> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let (end, escaped) = skip_str(b, i + 1)?;
    let mut colon = end;
    let mut c = *b.get(colon)?;
    if c <= b' ' {
        colon = ws(b, colon);
        c = *b.get(colon)?;
    }
    if c != b':' {
        return None;
    }
    Some(((!escaped).then_some(i + 1..end - 1), ws_fast(b, colon + 1)))
}

/// A member's key and colon, from the key's opening quote: the offset of its value.
#[inline(always)]
fn skip_key(b: &[u8], i: usize) -> Option<usize> {
    Some(key(b, i)?.1)
}

/// The kinds of the arrays and objects the scanner is inside: one bit each (set for an
/// object), the innermost lowest, in a word while they are few. The scanner copies it into
/// locals, so that the word and its count stay in registers.
struct Open {
    word: u64,
    /// How many levels `word` holds (up to 64).
    held: u32,
}

/// Inside no array or object; or inside one, an object when `object`.
#[inline(always)]
fn open(inside: Option<bool>) -> Open {
    Open {
        word: u64::from(inside == Some(true)),
        held: u32::from(inside.is_some()),
    }
}

/// One value, from its first byte: the offset after it. Iterative, at any depth.
#[inline]
pub fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    skip_within(b, i, open(None))
}

/// Inside an array (or, when `in_object`, an object), from the first byte of one of its
/// values: that value and the rest of the container, checked; the offset after its end.
#[inline]
pub fn skip_rest(b: &[u8], i: usize, in_object: bool) -> Option<usize> {
    skip_within(b, i, open(Some(in_object)))
}

/// The value at `i` (its first byte), then the rest of the arrays and objects `open` says it
/// is inside: the offset after the last of them closes (after the value, when none is open).
fn skip_within(b: &[u8], mut i: usize, open: Open) -> Option<usize> {
    let Open { mut word, mut held } = open;
    // The words of the levels outside the last 64 (only deep data gets here).
    let mut spilled: Vec<u64> = Vec::new();
    loop {
        // A value at `i`.
        let c = *b.get(i)?;
        if c == b'"' {
            i = skip_str(b, i + 1)?.0;
        } else if c == b'{' || c == b'[' {
            i = ws_fast(b, i + 1);
            // `}` is `{` + 2, `]` is `[` + 2.
            if b.get(i) == Some(&(c + 2)) {
                i += 1;
            } else {
                if held == 64 {
                    spilled.push(word);
                    held = 0;
                }
                let object = c == b'{';
                word = (word << 1) | u64::from(object);
                held += 1;
                if object {
                    i = skip_key(b, i)?;
                }
                continue;
            }
        } else {
            i = match c {
                b'-' | b'0'..=b'9' => skip_num(b, i)?,
                b't' if b.get(i..i + 4) == Some(b"true") => i + 4,
                b'f' if b.get(i..i + 5) == Some(b"false") => i + 5,
                b'n' if b.get(i..i + 4) == Some(b"null") => i + 4,
                _ => return None,
            }
        }
        // After a value: the next one in its array or object, or the ends of those it closes.
        if held == 0 {
            return Some(i);
        }
        loop {
            let mut c = *b.get(i)?;
            if c <= b' ' {
                i = ws(b, i);
                c = *b.get(i)?;
            }
            if c == b',' {
                i = ws_fast(b, i + 1);
                if word & 1 != 0 {
                    i = skip_key(b, i)?;
                }
                break;
            }
            // `}` is `]` + 0x20.
            if c != b']' + 0x20 * (word & 1) as u8 {
                return None;
            }
            i += 1;
            word >>= 1;
            held -= 1;
            if held == 0 {
                match spilled.pop() {
                    Some(w) => {
                        word = w;
                        held = 64;
                    }
                    None => return Some(i),
                }
            }
        }
    }
}

/// Random edits of `corpus` for testing a JSON reader against another (a byte deleted,
/// inserted, replaced or a span repeated, the grammar's own bytes favoured; one to three per
/// text): `per_doc` texts for each document, those that stay UTF-8, deterministic.
#[cfg(any(test, feature = "testkit"))]
pub fn edits(corpus: &[String], per_doc: usize) -> Vec<String> {
    let grammar = b"{}[]\",:.-+eE0123456789 !#\t\nutrfalsn\\/x\x01\x7f";
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let mut out = Vec::with_capacity(corpus.len() * per_doc);
    for doc in corpus {
        for _ in 0..per_doc {
            let mut b = doc.clone().into_bytes();
            for _ in 0..1 + next(3) {
                let at = next(b.len() + 1);
                match next(4) {
                    0 if at < b.len() => {
                        b.remove(at);
                    }
                    1 => b.insert(at, grammar[next(grammar.len())]),
                    2 if at < b.len() => b[at] = grammar[next(grammar.len())],
                    _ => {
                        let end = (at + next(8)).min(b.len());
                        let span = b[at..end].to_vec();
                        b.splice(at..at, span);
                    }
                }
            }
            if let Ok(text) = String::from_utf8(b) {
                out.push(text);
            }
        }
    }
    out
}

/// Documents that reach every branch of the grammar, for [`edits`].
#[cfg(any(test, feature = "testkit"))]
pub fn corpus() -> Vec<String> {
    [
        r#"{"pad":"xxxxxxxx","items":[{"sku":"A-1","qty":3},{"sku":"B","qty":1}],"n":1.5,"t":true,"z":null,"o":{"a":{"b":"c"}},"s":"x"}"#,
        r#"{"k\u0065y":1,"key":2,"x":{"y":3}}"#,
        r#"  {"sp" : [ 1 , 2 ] , "e":{}, "ea":[] }  "#,
        r#"[{"a":1},{"a":2}]"#,
        r#""just a string""#,
        "42",
        r#"{"é":"ünïcødé ✓","n":[-0,0.5,1e5,1E-5,-12.25e+3,0e0],"u":"\u00e9\ud83d\ude00\uD800","e":"\"\\\/\b\f\n\r\t"}"#,
        "\t\r\n [ true , false , null , { } , [ ] , \"\" ] \n",
        r#"{"long":"0123456789abcdef0123456789abcdef\n0123456789","items":[{"sku":"A-1234","qty":3},{"sku":"A-1234","qty":3}]}"#,
        r#"{"a":[{"b":[{"c":[{"d":[{"e":[1,2,{"f":{}}]}]}]}]}],"z":-0.0}"#,
    ]
    .into_iter()
    .map(String::from)
    // Past the 64 levels the scanner keeps in one word.
    .chain([format!("{}\"x\"{}", "[{\"k\":".repeat(40), "}]".repeat(40))])
    .collect()
}

/// Texts that are not one JSON document, each for a different rule, for tests of readers.
#[cfg(any(test, feature = "testkit"))]
pub const NOT_JSON: &[&str] = &[
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
    r#"{"a":"\u12g4"}"#,
    "[\"0123456789\u{1}abcdef\"]",
    r#"[1 2]"#,
    r#"{"a":1 "b":2}"#,
];

/// Texts that are one JSON document though a reader might refuse them, for tests of readers.
#[cfg(any(test, feature = "testkit"))]
pub const JSON: &[&str] = &[
    r#"{"a":"\ud83d\ude00"}"#,
    r#"{"a":1e400}"#,
    r#"{"a":-0.5E+3}"#,
    "[]",
    "{}",
    "null",
    r#"{"a":"\ud800"}"#,
    " [ ] ",
];

/// Whether serde_json reads `text` as one JSON document (its pass that builds no value, which
/// this scanner replaced): the oracle of tests of readers.
#[cfg(any(test, feature = "testkit"))]
pub fn serde_json_reads(text: &str) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// Panics unless both answers came up often enough, `json` of `n` edits being JSON, for a
/// comparison over [`edits`] to mean something.
#[cfg(any(test, feature = "testkit"))]
pub fn assert_mixed(json: usize, n: usize) {
    assert!(
        json > n / 20 && json < n * 19 / 20,
        "{json} of {n} edits were JSON"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_accepts_what_serde_json_accepts_after_any_edit() {
        let corpus = corpus();
        for doc in &corpus {
            assert!(is_document(doc.as_bytes()), "{doc}");
        }
        let texts = edits(&corpus, 6000);
        let mut json = 0;
        for text in &texts {
            let want = serde_json_reads(text);
            assert_eq!(is_document(text.as_bytes()), want, "{text:?}");
            json += usize::from(want);
        }
        assert_mixed(json, texts.len());
    }

    /// The byte `specials` marks lowest in a word is the first control character, `"` or `\`
    /// in it, for every byte value at every position, whatever the bytes before and after it
    /// are (the neighbours of `"` and of 0x20, high bytes, other specials).
    #[test]
    fn the_lowest_special_of_a_word_is_the_first_string_ending_byte() {
        let special = |c: u8| c < 0x20 || c == b'"' || c == b'\\';
        let others = [
            b' ', b'!', b'#', b'a', b'\\', b'"', 0x1f, 0x00, 0x7f, 0x80, 0xff,
        ];
        for v in 0..=255u8 {
            for at in 0..8 {
                for &before in &others {
                    for &after in &others {
                        let mut w = [after; 8];
                        w[..at].fill(before);
                        w[at] = v;
                        let want = w.iter().position(|&c| special(c));
                        let m = specials(u64::from_le_bytes(w));
                        let got = (m != 0).then(|| (m.trailing_zeros() / 8) as usize);
                        assert_eq!(got, want, "{w:02x?}");
                        if let Some(high) = (m != 0).then(|| m.trailing_zeros()) {
                            assert_eq!(high % 8, 7);
                            assert_eq!(
                                (u64::from_le_bytes(w) >> (high - 7)) as u8,
                                w[got.unwrap()]
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn what_is_not_one_json_document_is_refused() {
        for bad in NOT_JSON {
            assert!(!is_document(bad.as_bytes()), "{bad:?} is not JSON");
            assert!(
                !serde_json_reads(bad),
                "{bad:?} is not JSON for serde_json either"
            );
        }
        for good in JSON {
            assert!(is_document(good.as_bytes()), "{good:?} is JSON");
            assert!(
                serde_json_reads(good),
                "{good:?} is JSON for serde_json too"
            );
        }
    }

    #[test]
    fn irregular_nesting_past_the_words_of_kinds_is_read_as_serde_json_reads_it() {
        // Arrays and objects mixed in no repeating pattern over 300 levels, so that every word
        // of kinds the scanner keeps differs; closed correctly, then with one closer swapped
        // at each depth in turn.
        let mut seed: u32 = 7;
        let kinds: Vec<bool> = (0..300)
            .map(|_| {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                seed >> 16 & 1 == 1
            })
            .collect();
        let open: String = kinds
            .iter()
            .map(|&o| if o { r#"{"k":"# } else { "[" })
            .collect();
        let closers: Vec<char> = kinds
            .iter()
            .rev()
            .map(|&o| if o { '}' } else { ']' })
            .collect();
        let doc = format!("{open}1{}", closers.iter().collect::<String>());
        assert!(serde_json_reads(&doc) && is_document(doc.as_bytes()));
        for swap in 0..closers.len() {
            let mut c = closers.clone();
            c[swap] = if c[swap] == '}' { ']' } else { '}' };
            let bad = format!("{open}1{}", c.iter().collect::<String>());
            assert_eq!(
                is_document(bad.as_bytes()),
                serde_json_reads(&bad),
                "swap {swap}"
            );
            assert!(!is_document(bad.as_bytes()), "swap {swap}");
        }
    }

    #[test]
    fn data_nested_beyond_any_stack_is_checked_without_recursion() {
        // 400 000 levels: an array and an object per repeat.
        let n = 200_000;
        let doc = format!(r#"{}1{}"#, r#"[{"k":"#.repeat(n), "}]".repeat(n));
        let cut = doc[..doc.len() - 1].to_owned();
        let ok = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || (is_document(doc.as_bytes()), is_document(cut.as_bytes())))
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(ok, (true, false));
    }
}
