//! Where things are in a config file: the positions of keys and values by dotted path, the
//! context that collects located errors while a file is parsed, and the "did you mean" hints.

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use yaml_serde::Value;

use super::{seg, ConfigError, Pos};

/// Positions of keys and values, by dotted path (`sources.hooks.listen`, `routes.0.to.1`).
#[derive(Default)]
pub(crate) struct Positions {
    keys: HashMap<String, Pos>,
    values: HashMap<String, Pos>,
}

impl Positions {
    pub(super) fn index(text: &str) -> (Positions, Vec<(Pos, String)>) {
        Positions::index_all(text)
            .into_iter()
            .next()
            .unwrap_or_default()
    }

    /// The positions of every document of a multi-document text, in order.
    pub(crate) fn index_all(text: &str) -> Vec<(Positions, Vec<(Pos, String)>)> {
        use saphyr_parser::{Event, Parser};
        enum Frame {
            Map {
                path: String,
                key: Option<String>,
                seen: HashMap<String, Pos>,
            },
            Seq {
                path: String,
                idx: usize,
            },
        }
        fn join(parent: &str, seg: &str) -> String {
            if parent.is_empty() {
                seg.to_owned()
            } else {
                format!("{parent}.{seg}")
            }
        }
        let mut docs: Vec<(Positions, Vec<(Pos, String)>)> = Vec::new();
        let mut pos = Positions::default();
        let mut dups = Vec::new();
        let mut stack: Vec<Frame> = Vec::new();
        let mut started = false;
        // Returns the path of the node that starts now, recording its position; None for a key.
        let node_start = |stack: &mut Vec<Frame>,
                          scalar: Option<&str>,
                          at: Pos,
                          pos: &mut Positions,
                          dups: &mut Vec<(Pos, String)>|
         -> Option<String> {
            match stack.last_mut() {
                None => Some(String::new()),
                Some(Frame::Seq { path, idx }) => {
                    let p = join(path, &idx.to_string());
                    *idx += 1;
                    pos.values.insert(p.clone(), at);
                    Some(p)
                }
                Some(Frame::Map { path, key, seen }) => match key.take() {
                    None => {
                        let k = scalar.unwrap_or("?").to_owned();
                        if let Some(first) = seen.get(&k) {
                            dups.push((
                                at,
                                format!("duplicate key `{k}` (first at line {})", first.line),
                            ));
                        }
                        seen.insert(k.clone(), at);
                        pos.keys.insert(join(path, &k), at);
                        *key = Some(k);
                        None
                    }
                    Some(k) => {
                        let p = join(path, &k);
                        pos.values.insert(p.clone(), at);
                        Some(p)
                    }
                },
            }
        };
        for item in Parser::new_from_str(text) {
            let Ok((ev, span)) = item else { break };
            let at = Pos {
                line: span.start.line(),
                col: span.start.col() + 1,
            };
            match ev {
                Event::Scalar(s, ..) => {
                    node_start(&mut stack, Some(&s), at, &mut pos, &mut dups);
                }
                Event::Alias(_) => {
                    node_start(&mut stack, None, at, &mut pos, &mut dups);
                }
                Event::MappingStart(..) => {
                    let path =
                        node_start(&mut stack, None, at, &mut pos, &mut dups).unwrap_or_default();
                    stack.push(Frame::Map {
                        path,
                        key: None,
                        seen: HashMap::new(),
                    });
                }
                Event::SequenceStart(..) => {
                    let path =
                        node_start(&mut stack, None, at, &mut pos, &mut dups).unwrap_or_default();
                    stack.push(Frame::Seq { path, idx: 0 });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                }
                Event::DocumentStart(..) => started = true,
                Event::DocumentEnd => {
                    docs.push((std::mem::take(&mut pos), std::mem::take(&mut dups)));
                    stack.clear();
                    started = false;
                }
                _ => {}
            }
        }
        if started || docs.is_empty() {
            docs.push((pos, dups));
        }
        docs
    }

    /// Records `p` as the position of `path` (key and value).
    pub(crate) fn set(&mut self, path: &str, p: Pos) {
        self.keys.insert(path.to_owned(), p);
        self.values.insert(path.to_owned(), p);
    }

    /// The best position for an error at `path`: the key for unknown keys, the value otherwise,
    /// falling back to the nearest parent.
    pub(crate) fn find(&self, path: &[String], prefer_key: bool) -> Option<Pos> {
        let mut segs = path.to_vec();
        loop {
            let p = segs.join(".");
            let hit = if prefer_key {
                self.keys.get(&p).or_else(|| self.values.get(&p))
            } else {
                self.values.get(&p).or_else(|| self.keys.get(&p))
            };
            if hit.is_some() || segs.is_empty() {
                return hit.copied();
            }
            segs.pop();
        }
    }
}

/// Collects located errors while a file is parsed.
pub(crate) struct Ctx<'a> {
    pub(super) file: &'a str,
    pub(super) pos: Positions,
    /// Entries that came from another file (Argo manifests): `section.name` → that file and
    /// the positions of the entry's paths in it.
    pub(super) elsewhere: HashMap<String, (String, Positions)>,
    pub(super) errors: Vec<ConfigError>,
}

impl Ctx<'_> {
    pub(super) fn err(&mut self, path: &[String], prefer_key: bool, msg: impl Into<String>) {
        let (file, pos) = match path.get(..2).and_then(|p| self.elsewhere.get(&p.join("."))) {
            Some((file, pos)) => (file.clone(), pos.find(path, prefer_key)),
            None => (self.file.to_owned(), self.pos.find(path, prefer_key)),
        };
        self.errors.push(ConfigError {
            file,
            pos,
            msg: msg.into(),
        });
    }

    /// A connector's `validate` error. When its message starts with the dotted path of the
    /// option it is about (`triggers.0.conditions: …`), it is placed at that option; otherwise
    /// at the connector's key.
    pub(super) fn connector_err(&mut self, base: &[String], shown: String, msg: &str) {
        let path = msg.split_once(": ").map(|(p, _)| p).filter(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        });
        match path {
            Some(p) => {
                let full: Vec<String> = base.iter().cloned().chain(p.split('.').map(seg)).collect();
                self.err(&full, false, shown)
            }
            None => self.err(base, true, shown),
        }
    }

    /// Deserializes `value` (found at `base`) into `T`, recording a located error on failure.
    pub(crate) fn de<T: DeserializeOwned>(&mut self, value: Value, base: &[String]) -> Option<T> {
        match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(v) => Some(v),
            Err(e) => {
                let mut path = base.to_vec();
                for seg in e.path().iter() {
                    use serde_path_to_error::Segment;
                    match seg {
                        Segment::Map { key } => path.push(key.clone()),
                        Segment::Seq { index } => path.push(index.to_string()),
                        Segment::Enum { variant } => path.push(variant.clone()),
                        Segment::Unknown => {}
                    }
                }
                let msg = e.inner().to_string();
                let unknown = msg.starts_with("unknown field");
                let msg = with_hint(strip_location(&msg));
                let shown = if path.is_empty() {
                    msg
                } else {
                    format!("{}: {msg}", path.join("."))
                };
                self.err(&path, unknown, shown);
                None
            }
        }
    }
}

/// yaml_serde appends "at line N column M" where it knows; we print our own location.
pub(super) fn strip_location(msg: &str) -> &str {
    match msg.find(" at line ") {
        Some(i) => &msg[..i],
        None => msg,
    }
}

/// Adds "did you mean `x`?" to serde's "unknown field/variant `y`, expected ..." messages.
pub(super) fn with_hint(msg: &str) -> String {
    let (Some(start), Some(exp)) = (msg.find('`'), msg.find("expected")) else {
        return msg.to_owned();
    };
    if !(msg.starts_with("unknown field") || msg.starts_with("unknown variant")) {
        return msg.to_owned();
    }
    let bad = msg[start + 1..].split('`').next().unwrap_or("");
    let candidates: Vec<&str> = msg[exp..].split('`').skip(1).step_by(2).collect();
    match suggest(bad, candidates.iter().copied()) {
        Some(s) => format!("{msg} (did you mean `{s}`?)"),
        None => msg.to_owned(),
    }
}

/// The closest candidate to `bad`, if one is close enough to be a likely misspelling.
pub fn suggest<'a>(bad: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    // Close by edit distance (a typo or a swapped pair), or sharing a long prefix.
    candidates
        .map(|c| {
            let edits = strsim::damerau_levenshtein(bad, c);
            let ok =
                edits <= (bad.len().max(c.len()) / 3).max(1) || strsim::jaro_winkler(bad, c) > 0.9;
            (edits, c, ok)
        })
        .filter(|(_, _, ok)| *ok)
        .min_by_key(|(edits, _, _)| *edits)
        .map(|(_, c, _)| c)
}
