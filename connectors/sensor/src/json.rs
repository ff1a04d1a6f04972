//! An event's data checked as JSON once per event, with the members of a top-level object
//! located on the way, so that a lookup whose first step names a member starts at that member's
//! value instead of walking the document from its start (a path behind a long string, such as
//! `items.0.sku` after a KiB of `description`, was skipped over once per lookup).
//!
//! The check is [`sluice_core::json`]'s scan of RFC 8259's grammar, which builds no values and
//! is iterative at any depth (gjson's `valid`, used before, recursed per level and overflowed a
//! worker's stack at about 100 000 levels, a 200 KB body); only the planned paths, whose depth
//! the configuration sets, are followed here by recursion.

use sluice_core::json::{key, skip_rest, skip_value, ws};
use smallvec::SmallVec;

/// Data known to be one JSON document.
pub(crate) struct Doc<'a> {
    /// The whole document.
    pub(crate) text: &'a str,
    /// The top-level object's members in document order, each as its key and its value's raw
    /// JSON; `None` when the document is not an object or a key is written with escapes (its
    /// text is then not the key).
    members: Option<Members<'a>>,
    /// The values a [`Plan`] located while checking, by slot, with the plan; `None` without a
    /// plan or when a key on a planned path was written with escapes.
    located: Option<(&'a Plan, Located<'a>)>,
}

/// The values a plan located, by slot: inline for the usual few paths. (Not a `SmallVec`,
/// which is invariant in its items' lifetime: a `Doc` must shorten like the text it borrows.)
#[derive(Debug)]
enum Located<'a> {
    Inline([Option<&'a str>; 6]),
    Heap(Vec<Option<&'a str>>),
}

impl<'a> Located<'a> {
    fn new(slots: usize) -> Located<'a> {
        if slots <= 6 {
            Located::Inline([None; 6])
        } else {
            Located::Heap(vec![None; slots])
        }
    }

    fn slots(&mut self) -> &mut [Option<&'a str>] {
        match self {
            Located::Inline(a) => a,
            Located::Heap(v) => v,
        }
    }

    fn get(&self, slot: usize) -> Option<&'a str> {
        match self {
            Located::Inline(a) => a[slot],
            Located::Heap(v) => v[slot],
        }
    }
}

impl<'a> Doc<'a> {
    /// `text` if it is one JSON document, else `None`.
    pub(crate) fn check(text: &'a str) -> Option<Doc<'a>> {
        let b = text.as_bytes();
        let i = ws(b, 0);
        let (end, members) = if b.get(i) == Some(&b'{') {
            members(text, i)?
        } else {
            (skip_value(b, i)?, None)
        };
        (ws(b, end) == b.len()).then_some(Doc {
            text,
            members,
            located: None,
        })
    }

    /// `text` if it is one JSON document, else `None`; the values at `plan`'s paths are
    /// located in the same pass, so that looking them up afterwards reads nothing again.
    pub(crate) fn check_with(text: &'a str, plan: &'a Plan) -> Option<Doc<'a>> {
        if plan.slots == 0 {
            return Doc::check(text);
        }
        let mut located = Located::new(plan.slots);
        let mut exact = true;
        let b = text.as_bytes();
        let end = visit(&plan.root, text, ws(b, 0), located.slots(), &mut exact)?;
        (ws(b, end) == b.len()).then(|| Doc {
            text,
            members: None,
            located: exact.then_some((plan, located)),
        })
    }

    /// Data a source already checked (`Data::Json`): not checked again, no member located.
    pub(crate) fn trusted(text: &'a str) -> Doc<'a> {
        Doc {
            text,
            members: None,
            located: None,
        }
    }

    /// `gjson::get(text, path)`, started at the top-level member the path's first step names
    /// when that step is a plain name (letters, digits, `_`, `-`) followed by the end of the
    /// path or by a `.` and a plain next step, and the document's first member of that name
    /// was located. Whatever that does not find is looked up from the start of the text:
    /// gjson, having matched a key whose value lacks the rest of the path, goes on reading
    /// inside that value and after it (`{"data":{"data":{"id":5}}}` has `data.id` for gjson),
    /// so a miss from the member alone would not be gjson's answer.
    ///
    /// With a [`Plan`] the value at a planned path was located while checking: a plain path is
    /// read from its value; a path the plan reads from a value on its way (a member, for a path
    /// with a query after it) is looked up inside that value, and from the start when not found
    /// there, for the reason above.
    pub(crate) fn get(&self, path: &'a str) -> gjson::Value<'a> {
        if let Some((plan, located)) = &self.located {
            if let Some((slot, rest)) = plan.find(path) {
                if let Some(found) = located.get(slot).and_then(|v| inside(v, rest)) {
                    return found;
                }
                return gjson::get(self.text, path);
            }
        }
        if let Some(members) = &self.members {
            let Some((first, rest)) = split_first(path) else {
                return gjson::get(self.text, path);
            };
            let member = members.iter().find(|(k, _)| *k == first);
            if let Some(found) = member.and_then(|(_, v)| inside(v, rest)) {
                return found;
            }
        }
        gjson::get(self.text, path)
    }
}

/// What a lookup found: a scalar the plan located, read from its raw JSON without gjson's
/// parse, or gjson's value. [`Found`]'s readers answer what gjson's do for the same value
/// (a test compares them on every planned path of a corpus).
pub(crate) enum Found<'a> {
    /// A located number, `true`, `false`, `null`, or a string written without escapes (its
    /// quotes included), exactly as in the document.
    Raw(&'a str),
    Value(gjson::Value<'a>),
}

impl<'a> Found<'a> {
    pub(crate) fn exists(&self) -> bool {
        match self {
            Found::Raw(_) => true,
            Found::Value(v) => v.exists(),
        }
    }

    pub(crate) fn kind(&self) -> gjson::Kind {
        match self {
            Found::Raw(raw) => match raw.as_bytes()[0] {
                b'"' => gjson::Kind::String,
                b't' => gjson::Kind::True,
                b'f' => gjson::Kind::False,
                b'n' => gjson::Kind::Null,
                _ => gjson::Kind::Number,
            },
            Found::Value(v) => v.kind(),
        }
    }

    /// gjson's `str`: a string's text, a number's JSON, `true`/`false`, `""` for null.
    pub(crate) fn str(&self) -> &str {
        match self {
            Found::Raw(raw) => match self.kind() {
                gjson::Kind::String => &raw[1..raw.len() - 1],
                gjson::Kind::Null => "",
                _ => raw,
            },
            Found::Value(v) => v.str(),
        }
    }

    /// gjson's `str` for a string, borrowed from the document.
    pub(crate) fn raw_str(&self) -> Option<&'a str> {
        match self {
            Found::Raw(raw) if raw.starts_with('"') => Some(&raw[1..raw.len() - 1]),
            _ => None,
        }
    }

    /// gjson's `f64`: a number's value, a string's text read as one, 1 for `true`, else 0.
    pub(crate) fn f64(&self) -> f64 {
        match self {
            Found::Raw(_) => match self.kind() {
                gjson::Kind::True => 1.0,
                gjson::Kind::String | gjson::Kind::Number => self.str().parse().unwrap_or(0.0),
                _ => 0.0,
            },
            Found::Value(v) => v.f64(),
        }
    }

    /// gjson's `bool`.
    pub(crate) fn bool(&self) -> bool {
        match self {
            Found::Raw(raw) => match *raw {
                "1" | "true" | r#""t""# | r#""1""# | r#""T""# => true,
                r#""true""# | r#""TRUE""# | r#""True""# => true,
                "0" | "false" | r#""f""# | r#""0""# | r#""F""# => false,
                r#""false""# | r#""FALSE""# | r#""False""# => false,
                // gjson's `i64() != 0`.
                _ => match self.kind() {
                    gjson::Kind::True => true,
                    gjson::Kind::String | gjson::Kind::Number => {
                        let text = self.str();
                        text.parse::<i64>()
                            .unwrap_or_else(|_| text.parse::<f64>().unwrap_or(0.0) as i64)
                            != 0
                    }
                    _ => false,
                },
            },
            Found::Value(v) => v.bool(),
        }
    }
}

impl<'a> Doc<'a> {
    /// [`Doc::get`], with a scalar the plan located at exactly `path` read from its raw JSON
    /// ([`Found::Raw`]) instead of parsed by gjson.
    pub(crate) fn find(&self, path: &'a str) -> Found<'a> {
        if let Some((plan, located)) = &self.located {
            if let Some((slot, None)) = plan.find(path) {
                if let Some(raw) = located.get(slot) {
                    let scalar = match raw.as_bytes()[0] {
                        b'{' | b'[' => false,
                        b'"' => !raw.as_bytes().contains(&b'\\'),
                        _ => true,
                    };
                    if scalar {
                        return Found::Raw(raw);
                    }
                }
            }
        }
        Found::Value(self.get(path))
    }
}

/// `rest` looked up inside the raw JSON `value` (`None`: the value itself), when it is there.
fn inside<'a>(value: &'a str, rest: Option<&'a str>) -> Option<gjson::Value<'a>> {
    let found = match rest {
        None => gjson::parse(value),
        Some(rest) => gjson::get(value, rest),
    };
    found.exists().then_some(found)
}

/// A character of a plain step: one gjson reads as itself.
fn plain(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}

/// `path` as its first step, a plain name, and the rest after it, when gjson reads that rest
/// inside the first step's member as it would from the start: the next step starts with a plain
/// character or `#` (a count or a query), never `.` (gjson's JSON-lines prefix), `@` (a modifier
/// at a path's start) or anything else gjson reads differently at the start of a path.
fn split_first(path: &str) -> Option<(&str, Option<&str>)> {
    let (first, rest) = match path.bytes().position(|c| !plain(c)) {
        None => (path, None),
        Some(i)
            if path.as_bytes()[i] == b'.'
                && path
                    .as_bytes()
                    .get(i + 1)
                    .is_some_and(|&c| plain(c) || c == b'#') =>
        {
            (&path[..i], Some(&path[i + 1..]))
        }
        Some(_) => return None,
    };
    (!first.is_empty()).then_some((first, rest))
}

/// The gjson paths a sensor's filters read, as a tree of plain steps, so that one checking
/// pass over an event's data also locates their values ([`Doc::check_with`]).
///
/// A path whose every step is plain (letters, digits, `_`, `-`) is located at its end: in an
/// object, a step names a member (the first of that name: gjson's); in an array, a step of
/// digits is an index. A path whose first step is plain and whose next step starts with a plain
/// character or `#` (`items.#`, `a.b*`) is located at its first step and looked up inside it, as
/// [`Doc::get`] does with members. Anything else is looked up from the start. A located value
/// that holds other planned paths is located whole and those are looked up inside it.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    root: Node,
    /// Per planned path: the slot of the value it is read from, and what is left to look up
    /// inside that value (`None`: the value itself).
    paths: Vec<(String, usize, Option<String>)>,
    slots: usize,
}

#[derive(Debug, Default)]
struct Node {
    children: Vec<(String, Node)>,
    /// This value is located whole, into this slot.
    slot: Option<usize>,
    /// The array index this node's step names (a step of digits; gjson reads `00` as 0).
    index: Option<u64>,
}

fn plain_step(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(plain)
}

impl Plan {
    /// Locates nothing.
    pub(crate) const EMPTY: Plan = Plan {
        root: Node {
            children: Vec::new(),
            slot: None,
            index: None,
        },
        paths: Vec::new(),
        slots: 0,
    };

    /// The plan for `paths` (repeats and paths it cannot locate are fine).
    pub(crate) fn new<'p>(paths: impl IntoIterator<Item = &'p str>) -> Plan {
        // Each path as the steps of the value it is read from and the rest after them.
        let mut wanted: Vec<(String, Vec<&str>, Option<&str>)> = Vec::new();
        for path in paths {
            if wanted.iter().any(|(p, _, _)| p == path) {
                continue;
            }
            let steps: Vec<&str> = path.split('.').collect();
            if steps.iter().all(|s| plain_step(s)) {
                wanted.push((path.to_owned(), steps, None));
            } else if let Some((first, Some(rest))) = split_first(path) {
                wanted.push((path.to_owned(), vec![first], Some(rest)));
            }
        }
        // The located values, shortest first, so that a value holding another planned value
        // is located whole and the other is read inside it.
        let mut at: Vec<Vec<&str>> = wanted.iter().map(|(_, s, _)| s.clone()).collect();
        at.sort_by_key(|s| s.len());
        at.dedup();
        let mut plan = Plan::default();
        let mut kept: Vec<Vec<&str>> = Vec::new();
        for steps in at {
            if kept.iter().any(|k| steps.starts_with(k)) {
                continue;
            }
            let mut node = &mut plan.root;
            for step in &steps {
                let i = match node.children.iter().position(|(s, _)| s == step) {
                    Some(i) => i,
                    None => {
                        let index = step
                            .bytes()
                            .all(|c| c.is_ascii_digit())
                            .then(|| step.parse::<u64>().ok())
                            .flatten();
                        let node_of_step = Node {
                            index,
                            ..Node::default()
                        };
                        node.children.push(((*step).to_owned(), node_of_step));
                        node.children.len() - 1
                    }
                };
                node = &mut node.children[i].1;
            }
            node.slot = Some(plan.slots);
            plan.slots += 1;
            kept.push(steps);
        }
        for (path, steps, rest) in wanted {
            let k = kept
                .iter()
                .position(|k| steps.starts_with(k))
                .expect("every located path was kept or is inside a kept one");
            let slot = plan.slot_of(&kept[k]);
            let inner: Vec<&str> = steps[kept[k].len()..].to_vec();
            let rest = match (inner.is_empty(), rest) {
                (true, None) => None,
                (true, Some(r)) => Some(r.to_owned()),
                (false, None) => Some(inner.join(".")),
                (false, Some(r)) => Some(format!("{}.{r}", inner.join("."))),
            };
            plan.paths.push((path, slot, rest));
        }
        plan
    }

    fn slot_of(&self, steps: &[&str]) -> usize {
        let mut node = &self.root;
        for step in steps {
            node = &node
                .children
                .iter()
                .find(|(s, _)| s == step)
                .expect("a kept path is in the tree")
                .1;
        }
        node.slot.expect("a kept path has a slot")
    }

    /// Where `path` is read from, when it is planned.
    fn find(&self, path: &str) -> Option<(usize, Option<&str>)> {
        self.paths
            .iter()
            .find(|(p, _, _)| p == path)
            .map(|(_, slot, rest)| (*slot, rest.as_deref()))
    }
}

/// A top-level object's members in document order, each as its key and its value's raw JSON.
type Members<'a> = Vec<(&'a str, &'a str)>;

/// The members of the object at `i` (its `{`), checked: the offset after it, and each member's
/// key and raw value in document order (`None` when a key is written with escapes).
fn members(text: &str, mut i: usize) -> Option<(usize, Option<Members<'_>>)> {
    let b = text.as_bytes();
    let mut members = Some(Vec::with_capacity(8));
    i = ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some((i + 1, members));
    }
    loop {
        let (name, at) = key(b, i)?;
        let end = skip_value(b, at)?;
        match (name, members.as_mut()) {
            (Some(name), Some(ms)) => ms.push((&text[name], &text[at..end])),
            _ => members = None,
        }
        match next_item(b, end, b'}')? {
            Ok(next) => i = next,
            Err(after) => return Some((after, members)),
        }
    }
}

/// After an array's element or an object's member that ends at `end`: `Ok` with the offset of
/// the next one (after the comma), `Err` with the offset after `close`, `None` for anything else.
#[inline]
fn next_item(b: &[u8], end: usize, close: u8) -> Option<Result<usize, usize>> {
    let i = ws(b, end);
    match *b.get(i)? {
        b',' => Some(Ok(ws(b, i + 1))),
        c if c == close => Some(Err(i + 1)),
        _ => None,
    }
}

/// The value at `i` (its first byte), checked, with the values `node`'s planned paths name
/// located into `located`: the offset after it. `exact` is cleared when a key is written with
/// escapes in an object on a planned path before every planned member of that object was met
/// (gjson reads such a key by its unescaped text, which this pass does not compare, so the
/// located values are not used). Recurses once per step of a planned path, which the
/// configuration bounds; everything else is skipped by [`skip_value`].
fn visit<'a>(
    node: &Node,
    text: &'a str,
    mut i: usize,
    located: &mut [Option<&'a str>],
    exact: &mut bool,
) -> Option<usize> {
    let b = text.as_bytes();
    if let Some(slot) = node.slot {
        let end = skip_value(b, i)?;
        located[slot] = Some(&text[i..end]);
        return Some(end);
    }
    match *b.get(i)? {
        b'{' => {
            // The children met so far: gjson reads the first member of a name.
            let mut met: SmallVec<[bool; 8]> = SmallVec::from_elem(false, node.children.len());
            i = ws(b, i + 1);
            if b.get(i) == Some(&b'}') {
                return Some(i + 1);
            }
            loop {
                let (name, at) = key(b, i)?;
                let child = match name {
                    Some(name) => {
                        let name = &b[name];
                        node.children.iter().position(|(s, _)| s.as_bytes() == name)
                    }
                    None => {
                        *exact = false;
                        None
                    }
                };
                let end = match child {
                    Some(c) if !met[c] => {
                        met[c] = true;
                        visit(&node.children[c].1, text, at, located, exact)?
                    }
                    // Every planned member met: the rest of the object only needs checking.
                    _ if met.iter().all(|&m| m) => {
                        return skip_rest(b, at, true);
                    }
                    _ => skip_value(b, at)?,
                };
                match next_item(b, end, b'}')? {
                    Ok(next) => i = next,
                    Err(after) => return Some(after),
                }
            }
        }
        b'[' => {
            i = ws(b, i + 1);
            if b.get(i) == Some(&b']') {
                return Some(i + 1);
            }
            let last = node.children.iter().filter_map(|(_, n)| n.index).max();
            let mut index: u64 = 0;
            loop {
                if last.is_none_or(|last| index > last) {
                    // Past the last planned element: the rest only needs checking.
                    return skip_rest(b, i, false);
                }
                let child = node.children.iter().find(|(_, n)| n.index == Some(index));
                let end = match child {
                    Some((_, child)) => visit(child, text, i, located, exact)?,
                    None => skip_value(b, i)?,
                };
                match next_item(b, end, b']')? {
                    Ok(next) => i = next,
                    Err(after) => return Some(after),
                }
                index += 1;
            }
        }
        _ => skip_value(b, i),
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
        r#"{"o":{"a":{"x":1},"a":{"b":2}},"items":[{"sku":"x","sku":"y"},[7,8]]}"#,
        r#"{"o":{"\u0061":{"b":"escaped"},"a":{"b":"plain"}},"k\u0065y":[1]}"#,
        r##"{"items":{"0":{"sku":"in an object"},"1":2},"sp":[[0,1],[2,3]],"b":{"#":5}}"##,
        r#"[[1,{"a":"deep"}],{"a":2}]"#,
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
        "o.a.b",
        "o.a.x",
        "items.0.sku",
        "items.1.0",
        "items.1.1",
        "items.00.sku",
        "items.0",
        "sp.1.0",
        "0.1.a",
        "1.a",
        "b.#",
        "o.a.b*",
        "b.#.k",
        "key.0",
        "items.0.sku.x",
    ];

    /// `d.get(path)` is what gjson answers from the start of `doc`.
    fn assert_as_gjson(d: &Doc<'_>, doc: &str, path: &str, what: &str) {
        let (a, b) = (d.get(path), gjson::get(doc, path));
        assert_eq!(a.exists(), b.exists(), "{what}");
        assert!(a.kind() == b.kind(), "{what}");
        assert_eq!(a.json(), b.json(), "{what}");
        assert_eq!(a.str(), b.str(), "{what}");
        assert_eq!(a.f64(), b.f64(), "{what}");
    }

    #[test]
    fn a_located_lookup_answers_what_gjson_answers_from_the_start() {
        for doc in DOCS {
            let d = Doc::check(doc).unwrap_or_else(|| panic!("{doc} is JSON"));
            for path in PATHS {
                assert_as_gjson(&d, doc, path, &format!("{doc} at {path:?}"));
            }
        }
    }

    #[test]
    fn a_planned_lookup_answers_what_gjson_answers_from_the_start() {
        // Every path of the list planned at once, and each alone: a value located whole for
        // a shorter path changes where a longer one is read from.
        let together = Plan::new(PATHS.iter().copied());
        let plans: Vec<Plan> = std::iter::once(together)
            .chain(PATHS.iter().map(|p| Plan::new([*p])))
            .collect();
        let mut located_somewhere = 0;
        for doc in DOCS {
            for plan in &plans {
                let d = Doc::check_with(doc, plan).unwrap_or_else(|| panic!("{doc} is JSON"));
                if let Some((_, l)) = &d.located {
                    located_somewhere += (0..plan.slots).filter(|&i| l.get(i).is_some()).count();
                }
                for path in PATHS {
                    assert_as_gjson(&d, doc, path, &format!("{doc} at {path:?} with {plan:?}"));
                }
            }
        }
        assert!(
            located_somewhere > 100,
            "the plans located {located_somewhere} values"
        );
    }

    #[test]
    fn a_located_scalar_reads_as_gjson_reads_it() {
        // Scalars of every kind, strings that read as numbers and booleans (gjson's `f64` and
        // `bool` read those), and escaped strings, which gjson unescapes.
        let docs = [
            r#"{"v":"A-1"}"#,
            r#"{"v":""}"#,
            r#"{"v":"12.5"}"#,
            r#"{"v":"1e3"}"#,
            r#"{"v":"-7"}"#,
            r#"{"v":"x1"}"#,
            r#"{"v":"t"}"#,
            r#"{"v":"T"}"#,
            r#"{"v":"True"}"#,
            r#"{"v":"FALSE"}"#,
            r#"{"v":"0"}"#,
            r#"{"v":"2"}"#,
            r#"{"v":"0.4"}"#,
            r#"{"v":"a\"b"}"#,
            r#"{"v":"\u0041"}"#,
            r#"{"v":"é ü"}"#,
            r#"{"v":"NaN"}"#,
            r#"{"v":"inf"}"#,
            r#"{"v":"+1"}"#,
            r#"{"v":" 1"}"#,
            r#"{"v":"0x10"}"#,
            r#"{"v":"1.0"}"#,
            r#"{"v":"-0"}"#,
            r#"{"v":0}"#,
            r#"{"v":1}"#,
            r#"{"v":-0}"#,
            r#"{"v":2.5}"#,
            r#"{"v":-1.5e-3}"#,
            r#"{"v":1E400}"#,
            r#"{"v":12345678901234567890}"#,
            r#"{"v":0.5}"#,
            r#"{"v":true}"#,
            r#"{"v":false}"#,
            r#"{"v":null}"#,
            r#"{"v":[1,"a"]}"#,
            r#"{"v":{"a":1}}"#,
            r#"{"w":{"v":"x"}}"#,
        ];
        let paths = ["v", "w.v", "v.a", "missing"];
        // A scalar at `v` without an escape is read raw.
        let only_v = Plan::new(["v"]);
        for doc in docs {
            let d = Doc::check_with(doc, &only_v).unwrap();
            let scalar =
                !doc.contains('\\') && !doc.contains("\"v\":[") && !doc.contains("\"v\":{");
            let is_raw = matches!(d.find("v"), Found::Raw(_));
            assert_eq!(is_raw, scalar && doc.starts_with("{\"v\""), "{doc}");
        }
        let mut raw = 0;
        for doc in docs.iter().chain(DOCS) {
            let plans: Vec<Plan> = std::iter::once(Plan::new(paths.iter().copied()))
                .chain(std::iter::once(Plan::new(PATHS.iter().copied())))
                .collect();
            for plan in &plans {
                let d = Doc::check_with(doc, plan).unwrap_or_else(|| panic!("{doc} is JSON"));
                for path in paths.iter().chain(PATHS) {
                    let (a, b) = (d.find(path), gjson::get(doc, path));
                    let what = format!("{doc} at {path:?}");
                    if let Found::Raw(_) = a {
                        raw += 1;
                    }
                    assert_eq!(a.exists(), b.exists(), "{what}");
                    assert!(a.kind() == b.kind(), "{what}");
                    assert_eq!(a.str(), b.str(), "{what}");
                    assert_eq!(a.f64().to_bits(), b.f64().to_bits(), "{what}");
                    assert_eq!(a.bool(), b.bool(), "{what}");
                    if let Some(text) = a.raw_str() {
                        assert!(b.kind() == gjson::Kind::String, "{what}");
                        assert_eq!(text, b.str(), "{what}");
                    }
                }
            }
        }
        assert!(raw > 30, "{raw} lookups read a located scalar");
    }

    #[test]
    fn a_plan_locates_each_value_in_the_checking_pass() {
        let plan = Plan::new([
            "items.0.sku",
            "items.0.qty",
            "items.0.sku",
            "n",
            "o.a*",
            "o.*",
        ]);
        let d = Doc::check_with(DOCS[0], &plan).unwrap();
        let (_, located) = d.located.as_ref().expect("plain keys: located");
        let at = |p: &str| plan.find(p).map(|(slot, rest)| (located.get(slot), rest));
        assert_eq!(at("items.0.sku"), Some((Some(r#""A-1""#), None)));
        assert_eq!(at("items.0.qty"), Some((Some("3"), None)));
        assert_eq!(at("n"), Some((Some("1.5"), None)));
        // Read inside its first step's value.
        assert_eq!(at("o.a*"), Some((Some(r#"{"a":{"b":"c"}}"#), Some("a*"))));
        assert_eq!(
            at("o.*"),
            None,
            "a wildcard after the first step: from the start"
        );
        assert_eq!(at("items.1.qty"), None, "not planned");
        // A value holding another planned value is located whole.
        let plan = Plan::new(["o.a.b", "o"]);
        let d = Doc::check_with(DOCS[0], &plan).unwrap();
        assert_eq!(plan.find("o.a.b"), Some((0, Some("a.b"))));
        assert_eq!(d.get("o.a.b").str(), "c");
        // An escaped key on a planned path: nothing located is used.
        let plan = Plan::new(["o.a.b"]);
        let d = Doc::check_with(DOCS[13], &plan).unwrap();
        assert!(d.located.is_none());
        assert_eq!(d.get("o.a.b").str(), gjson::get(DOCS[13], "o.a.b").str());
        // Not JSON: refused as by `check`.
        assert!(Doc::check_with(r#"{"items":[{"sku":"A"}"#, &plan).is_none());
        assert!(Doc::check_with(r#"{"o":{"a":{"b":1}}} x"#, &plan).is_none());
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
        for bad in sluice_core::json::NOT_JSON {
            assert!(Doc::check(bad).is_none(), "{bad:?} is not JSON");
            assert!(
                Doc::check_with(bad, &Plan::new(["a.b"])).is_none(),
                "{bad:?}"
            );
        }
        for good in sluice_core::json::JSON {
            assert!(Doc::check(good).is_some(), "{good:?} is JSON");
        }
    }

    use sluice_core::json::serde_json_reads;

    #[test]
    fn the_check_accepts_what_serde_json_accepts_after_any_edit() {
        // The walk along planned paths and the members' pass read objects and arrays
        // themselves: with and without a plan, the check must answer as serde_json does.
        let mut corpus: Vec<String> = DOCS.iter().map(|d| d.to_string()).collect();
        corpus.extend(sluice_core::json::corpus());
        // The second plan ends the walk of the root at its first planned member.
        let paths = [
            "items.0.sku",
            "items.0.qty",
            "a.0.b",
            "n",
            "o.a.b",
            "long",
            "pad",
        ];
        let plans = [Plan::new(paths[..6].iter().copied()), Plan::new(["pad"])];
        for doc in &corpus {
            assert_eq!(Doc::check(doc).is_some(), serde_json_reads(doc), "{doc}");
        }
        let texts = sluice_core::json::edits(&corpus, 3000);
        let mut json = 0;
        for text in &texts {
            let want = serde_json_reads(text);
            let plain = Doc::check(text);
            assert_eq!(plain.is_some(), want, "{text:?}");
            for plan in &plans {
                let planned = Doc::check_with(text, plan);
                assert_eq!(planned.is_some(), want, "{text:?} planned");
                // What is located answers as gjson from the start (repeated spans make
                // duplicate keys: the first of a name is gjson's).
                for d in plain.iter().chain(planned.iter()) {
                    for path in paths {
                        assert_as_gjson(d, text, path, &format!("{text:?} at {path}"));
                    }
                }
            }
            json += usize::from(want);
        }
        sluice_core::json::assert_mixed(json, texts.len());
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
