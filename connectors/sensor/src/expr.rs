//! `exprs` filters: Argo writes them in govaluate's syntax (`a == "b" || c == 10`,
//! `name =~ "^pr-"`); Sluice translates each to CEL and runs it on the `cel` crate.
//!
//! govaluate compares every number as float64, so numeric literals become CEL doubles and
//! numeric fields are bound as doubles: `c == 10` holds for a field value of `10` or `10.0`.
//! Supported: literals (numbers, single- or double-quoted strings, `true`/`false`, `nil`),
//! variables, `!`, unary `-`, `* / %`, `+ -`, `< <= > >=`, `== !=`, `=~ !~` (regular
//! expressions, unanchored), `&&`, `||`, `c ? a : b`, `x in (a, b)` and parentheses. The rest
//! of govaluate (bitwise operators, `**`, `??`, dates as strings) is refused at validation.

use std::collections::HashMap;
use std::sync::Arc;

use cel::common::types::{CelBool, CelDouble, CelNull, CelString};

use crate::json::Found;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Str(String),
    Ident(String),
    Op(&'static str),
    Open,
    Close,
    Comma,
}

const OPS: [&str; 20] = [
    "&&", "||", "==", "!=", "=~", "!~", ">=", "<=", "**", "??", "<<", ">>", ">", "<", "+", "-",
    "*", "/", "%", "!",
];

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c == b'(' || c == b')' || c == b',' {
            out.push(match c {
                b'(' => Tok::Open,
                b')' => Tok::Close,
                _ => Tok::Comma,
            });
            i += 1;
            continue;
        }
        if c == b'?' && b.get(i + 1) != Some(&b'?') {
            out.push(Tok::Op("?"));
            i += 1;
            continue;
        }
        if c == b':' {
            out.push(Tok::Op(":"));
            i += 1;
            continue;
        }
        if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            let start = i;
            while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
                i += 1;
            }
            let n: f64 = s[start..i]
                .parse()
                .map_err(|_| format!("`{}` is not a number", &s[start..i]))?;
            out.push(Tok::Num(n));
            continue;
        }
        if c == b'"' || c == b'\'' {
            let quote = c;
            let mut v = String::new();
            i += 1;
            loop {
                match b.get(i) {
                    None => return Err("a string literal is not closed".into()),
                    Some(&q) if q == quote => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') => {
                        let next = s[i + 1..].chars().next().ok_or("a string ends in `\\`")?;
                        v.push(match next {
                            'n' => '\n',
                            't' => '\t',
                            other => other,
                        });
                        i += 1 + next.len_utf8();
                    }
                    Some(_) => {
                        let ch = s[i..].chars().next().unwrap_or_default();
                        v.push(ch);
                        i += ch.len_utf8();
                    }
                }
            }
            out.push(Tok::Str(v));
            continue;
        }
        if c == b'[' {
            // govaluate's escaped parameter name: [name with-dashes]
            let end = s[i..].find(']').ok_or("`[` without `]`")?;
            out.push(Tok::Ident(s[i + 1..i + end].to_owned()));
            i += end + 1;
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                i += 1;
            }
            out.push(Tok::Ident(s[start..i].to_owned()));
            continue;
        }
        match OPS.iter().find(|op| s[i..].starts_with(**op)) {
            Some(op) => {
                out.push(Tok::Op(op));
                i += op.len();
            }
            None => {
                let ch = s[i..].chars().next().unwrap_or('?');
                return Err(format!("unexpected `{ch}`"));
            }
        }
    }
    Ok(out)
}

struct P {
    toks: Vec<Tok>,
    at: usize,
}

fn binding(op: &str) -> Option<u8> {
    Some(match op {
        "?" => 1,
        "||" => 2,
        "&&" => 3,
        "==" | "!=" | "=~" | "!~" => 4,
        "<" | "<=" | ">" | ">=" => 5,
        "+" | "-" => 6,
        "*" | "/" | "%" => 7,
        _ => return None,
    })
}

impl P {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }

    fn expr(&mut self, min: u8) -> Result<String, String> {
        let mut lhs = self.unary()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Op(":")) => break,
                Some(Tok::Op(op)) => *op,
                Some(Tok::Ident(w)) if w == "in" => "in",
                _ => break,
            };
            if op == "in" {
                if min > 4 {
                    break;
                }
                self.at += 1;
                if self.peek() != Some(&Tok::Open) {
                    return Err("`in` takes a parenthesised list: `x in (1, 2)`".into());
                }
                self.at += 1;
                let mut items = Vec::new();
                loop {
                    items.push(self.expr(1)?);
                    match self.peek() {
                        Some(Tok::Comma) => self.at += 1,
                        Some(Tok::Close) => {
                            self.at += 1;
                            break;
                        }
                        _ => return Err("missing `)` after the `in` list".into()),
                    }
                }
                lhs = format!("({lhs} in [{}])", items.join(", "));
                continue;
            }
            let Some(bp) = binding(op) else {
                return Err(format!("the govaluate operator `{op}` is not supported"));
            };
            if bp < min {
                break;
            }
            self.at += 1;
            if op == "?" {
                let a = self.expr(1)?;
                if self.peek() != Some(&Tok::Op(":")) {
                    return Err("`?` without `:`".into());
                }
                self.at += 1;
                let b = self.expr(1)?;
                lhs = format!("({lhs} ? {a} : {b})");
                continue;
            }
            let rhs = self.expr(bp + 1)?;
            lhs = match op {
                "=~" => format!("({lhs}).matches({rhs})"),
                "!~" => format!("!(({lhs}).matches({rhs}))"),
                // CEL has no remainder of doubles: whole numbers, as govaluate's fmod gives.
                "%" => format!("double(int({lhs}) % int({rhs}))"),
                _ => format!("({lhs} {op} {rhs})"),
            };
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> Result<String, String> {
        let t = self
            .peek()
            .cloned()
            .ok_or("the expression ends too early")?;
        self.at += 1;
        Ok(match t {
            Tok::Num(n) => format!("{n:?}"),
            Tok::Str(s) => serde_json::to_string(&s).unwrap_or_default(),
            Tok::Ident(w) => match w.as_str() {
                "true" | "false" => w,
                "nil" => "null".into(),
                _ => {
                    if w.contains('.') {
                        return Err(format!(
                            "`{w}`: bind a field for it (`fields: [{{name: x, path: {w}}}]`)"
                        ));
                    }
                    cel_name(&w)
                }
            },
            Tok::Op("!") => format!("!({})", self.unary()?),
            Tok::Op("-") => format!("-({})", self.unary()?),
            Tok::Open => {
                let e = self.expr(1)?;
                if self.peek() != Some(&Tok::Close) {
                    return Err("missing `)`".into());
                }
                self.at += 1;
                format!("({e})")
            }
            other => return Err(format!("unexpected {other:?}")),
        })
    }
}

/// A govaluate variable name as a CEL identifier (CEL names cannot hold `-`).
fn cel_name(name: &str) -> String {
    let mut out = String::from("v_");
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c)
        } else {
            out.push_str(&format!("_{:x}_", c as u32))
        }
    }
    out
}

/// The expression in CEL.
fn translate(expr: &str) -> Result<String, String> {
    let toks = lex(expr)?;
    if toks.is_empty() {
        return Err("empty expression".into());
    }
    let mut p = P { toks, at: 0 };
    let cel = p.expr(1)?;
    if p.at != p.toks.len() {
        return Err(format!("unexpected {:?}", p.toks[p.at]));
    }
    Ok(cel)
}

/// One compiled `exprs` entry.
pub struct Expr {
    source: String,
    program: cel::Program,
    /// (CEL variable, gjson path)
    fields: Vec<(String, String)>,
}

impl std::fmt::Debug for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Expr").field("expr", &self.source).finish()
    }
}

impl Expr {
    /// `fields` binds names to gjson paths into the event's data.
    pub fn compile(expr: &str, fields: &[(String, String)]) -> Result<Expr, String> {
        let t = translate(expr).map_err(|e| format!("{expr:?}: {e}"))?;
        // A variable without a field is an error only if the evaluation reaches it (`&&`
        // and `||` short-circuit, as govaluate's do).
        let program =
            cel::Program::compile(&t).map_err(|e| format!("{expr:?}: cannot be compiled ({e})"))?;
        Ok(Expr {
            source: expr.to_owned(),
            program,
            fields: fields
                .iter()
                .map(|(n, p)| (cel_name(n), p.clone()))
                .collect(),
        })
    }

    /// The gjson paths its fields read.
    pub(crate) fn paths(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|(_, p)| p.as_str())
    }

    /// Evaluates over the event's JSON data. A field whose path does not exist is an error
    /// (as in Argo); so is a result that is not a boolean.
    ///
    /// The fields are bound through a resolver over their looked-up values, not added to the
    /// context one by one: that took a copy of each name and string value, a box and a map
    /// node per field, per event. Each value is made a CEL value here (a string is the one copy
    /// made of it), and the program reads it by reference; arrays and objects are converted
    /// too, so that one nested too deep is refused here, as before.
    pub fn eval<'a>(
        &'a self,
        root: &cel::Context<'_, '_>,
        data: &crate::filter::Lookup<'_, 'a>,
    ) -> Result<bool, String> {
        let mut vals = smallvec::SmallVec::<[Bound; 4]>::new();
        for (_, path) in &self.fields {
            let v = data.with(path, |v| {
                v.exists().then(|| match v {
                    Found::Value(v)
                        if matches!(v.kind(), gjson::Kind::Array | gjson::Kind::Object) =>
                    {
                        to_cel(v, 0).map(Err)
                    }
                    _ => Some(Ok(match v.kind() {
                        gjson::Kind::Null => Bound::Null(CelNull),
                        gjson::Kind::False => Bound::Bool(false.into()),
                        gjson::Kind::True => Bound::Bool(true.into()),
                        // Every number a double: govaluate's float64.
                        gjson::Kind::Number => Bound::Number(v.f64().into()),
                        // A located string is borrowed from the data; another is copied.
                        _ => Bound::String(match v.raw_str() {
                            Some(text) => text.into(),
                            None => v.str().to_owned().into(),
                        }),
                    })),
                })
            });
            let Some(v) = v else {
                return Err(format!("path {path:?} does not exist in the event's data"));
            };
            let Some(v) = v else {
                return Err(format!(
                    "the value at {path:?} nests deeper than {} levels",
                    crate::json::MAX_DEPTH
                ));
            };
            vals.push(match v {
                Ok(b) => b,
                Err(compound) => {
                    Bound::Compound(compound.try_into().map_err(|e: cel::ExecutionError| {
                        format!(
                            "{:?}: the value at {path:?} cannot be bound ({e})",
                            self.source
                        )
                    })?)
                }
            });
        }
        let fields = Fields {
            names: &self.fields,
            vals,
        };
        let mut cx = root.new_inner_scope();
        cx.set_variable_resolver(&fields);
        match self.program.execute(&cx) {
            Ok(cel::Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("{:?} gave {other:?}, not a boolean", self.source)),
            Err(cel::ExecutionError::UndeclaredReference(name)) => Err(format!(
                "{:?}: `{}` is not bound; add it to `fields`",
                self.source,
                name.strip_prefix("v_").unwrap_or(&name)
            )),
            Err(e) => Err(format!("{:?}: {e}", self.source)),
        }
    }
}

/// A field's value for one evaluation, as the CEL value the program reads (a borrow of it:
/// no value is boxed per read).
enum Bound<'a> {
    Null(CelNull),
    Bool(CelBool),
    Number(CelDouble),
    String(CelString<'a>),
    /// An array or an object, converted once per evaluation.
    Compound(Box<dyn cel::common::value::Val>),
}

impl Bound<'_> {
    fn val(&self) -> &dyn cel::common::value::Val {
        match self {
            Bound::Null(v) => v,
            Bound::Bool(v) => v,
            Bound::Number(v) => v,
            Bound::String(v) => v,
            Bound::Compound(v) => v.as_ref(),
        }
    }
}

/// An expression's fields (CEL names, in `Expr::fields` order) and their values.
struct Fields<'e, 'a> {
    names: &'e [(String, String)],
    vals: smallvec::SmallVec<[Bound<'a>; 4]>,
}

impl cel::context::VariableResolver for Fields<'_, '_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<cel::common::value::CowVal<'b, 'b>> {
        // The last field of a name wins, as the last `add_variable` did (and Argo's map).
        let i = self.names.iter().rposition(|(n, _)| n == variable)?;
        Some(cel::common::value::CowVal::Borrowed(self.vals[i].val()))
    }
}

/// A base context with CEL's standard functions, made once per sensor.
pub fn root_context() -> cel::Context<'static, 'static> {
    cel::Context::default()
}

/// A gjson value as a CEL value, every number a double (govaluate's float64); `None` when it
/// nests deeper than [`crate::json::MAX_DEPTH`] (this recurses per level).
fn to_cel(v: &gjson::Value, depth: usize) -> Option<cel::Value> {
    if depth > crate::json::MAX_DEPTH {
        return None;
    }
    Some(match v.kind() {
        gjson::Kind::Null => cel::Value::Null,
        gjson::Kind::False => cel::Value::Bool(false),
        gjson::Kind::True => cel::Value::Bool(true),
        gjson::Kind::Number => cel::Value::Float(v.f64()),
        gjson::Kind::String => cel::Value::String(Arc::new(v.str().to_owned())),
        gjson::Kind::Array => cel::Value::List(Arc::new(
            v.array()
                .iter()
                .map(|x| to_cel(x, depth + 1))
                .collect::<Option<_>>()?,
        )),
        gjson::Kind::Object => {
            let mut m = HashMap::new();
            let mut deep = false;
            v.each(|k, val| {
                let Some(x) = to_cel(&val, depth + 1) else {
                    deep = true;
                    return false;
                };
                m.insert(cel::objects::Key::String(Arc::new(k.str().to_owned())), x);
                true
            });
            if deep {
                return None;
            }
            cel::Value::Map(cel::objects::Map { map: Arc::new(m) })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(expr: &str, fields: &[(&str, &str)], data: &str) -> Result<bool, String> {
        let f: Vec<(String, String)> = fields
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let x = Expr::compile(expr, &f)?;
        let memo = crate::filter::Lookups::default();
        let doc = crate::json::Doc::check(data).expect("JSON");
        x.eval(&root_context(), &memo.on(&doc))
    }

    #[test]
    fn argo_example_expressions() {
        // examples/sensors/filter-with-expressions.yaml
        let data = r#"{"a":"b","a-longer-name":10,"nested":{"path":{"can-get":{"longer":false}}}}"#;
        assert!(run(
            r#"a == "b" || c == 10"#,
            &[("a", "a"), ("c", "a-longer-name")],
            data
        )
        .unwrap());
        assert!(run("e == false", &[("e", "nested.path.can-get.longer")], data).unwrap());
        assert!(!run("c > 10", &[("c", "a-longer-name")], data).unwrap());
        assert!(run("c >= 10 && c < 10.5", &[("c", "a-longer-name")], data).unwrap());
    }

    #[test]
    fn regex_in_ternary_and_arithmetic() {
        let data = r#"{"name":"pr-42","n":3,"kind":"x"}"#;
        let f = [("name", "name"), ("n", "n"), ("kind", "kind")];
        assert!(run(r#"name =~ "^pr-[0-9]+$""#, &f, data).unwrap());
        assert!(run(r#"name !~ "^main""#, &f, data).unwrap());
        assert!(run("n * 2 + 1 == 7", &f, data).unwrap());
        assert!(run("n % 2 == 1 && -n < 0", &f, data).unwrap());
        assert!(run("kind in ('x', 'y')", &f, data).unwrap());
        assert!(!run("n in (1, 2)", &f, data).unwrap());
        assert!(run("(n > 2 ? 'big' : 'small') == 'big'", &f, data).unwrap());
        assert!(run("!(n == 4)", &f, data).unwrap());
        assert!(run("[kind] == 'x'", &f, data).unwrap());
    }

    #[test]
    fn errors() {
        let data = r#"{"a":1}"#;
        let e = run("a == 1 && b == 2", &[("a", "a")], data).unwrap_err();
        assert!(e.contains("`b` is not bound"), "{e}");
        // Not reached: no error (govaluate short-circuits too).
        assert!(run("a == 1 || b == 2", &[("a", "a")], data).unwrap());
        let e = run("a == 1", &[("a", "missing")], data).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        let e = run("a ** 2 == 1", &[("a", "a")], data).unwrap_err();
        assert!(e.contains("`**` is not supported"), "{e}");
        let e = run("a + 1", &[("a", "a")], data).unwrap_err();
        assert!(e.contains("not a boolean"), "{e}");
        assert!(run("'open", &[], data).unwrap_err().contains("not closed"));
    }

    #[test]
    fn every_json_kind_binds_and_a_field_reads_twice() {
        let data = r#"{"s":"a\"b","t":true,"f":false,"z":null,"n":2.5,"l":[1,"x"],"o":{"k":"v"}}"#;
        let f = [
            ("s", "s"),
            ("t", "t"),
            ("f", "f"),
            ("z", "z"),
            ("n", "n"),
            ("l", "l"),
            ("o", "o"),
        ];
        assert!(run(r#"s == "a\"b" && s != "ab""#, &f, data).unwrap());
        assert!(run("t && !f && t != f", &f, data).unwrap());
        assert!(run("z == nil", &f, data).unwrap());
        assert!(run("n * n == 6.25 && n > 2", &f, data).unwrap());
        assert!(run("[l] == [l] && [o] == [o]", &f, data).unwrap());
        assert!(!run("[l] == [o]", &f, data).unwrap());
        // A name given twice: the last binding wins, as in Argo (a map of parameters).
        let twice = [("x", "n"), ("x", "s")];
        assert!(run(r#"x == "a\"b""#, &twice, data).unwrap());
    }

    #[test]
    fn a_field_nested_too_deep_to_convert_is_an_error_not_a_crash() {
        let n = 100_000;
        let data = format!(r#"{{"a":{}{}}}"#, "[".repeat(n), "]".repeat(n));
        let e = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || run("a == 1", &[("a", "a")], &data))
            .unwrap()
            .join()
            .unwrap()
            .unwrap_err();
        assert!(e.contains("nests deeper than 512 levels"), "{e}");
        let data = format!(r#"{{"a":{}1{}}}"#, "[".repeat(300), "]".repeat(300));
        assert!(!run("a == 1", &[("a", "a")], &data).unwrap());
    }
}
