//! Go `text/template` (the `gtmpl` crate) with the sprig functions Argo users write in
//! `dataTemplate`, `contextTemplate` and data filter templates: `{{ .Input.body.ref |
//! trimPrefix "refs/heads/" }}`. A missing key renders as `<no value>`, never a crash.

use std::collections::HashMap;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use gtmpl::{Context, FuncError, Template, Value};

/// A parsed template; `.Input` is what it is rendered over.
pub struct Tmpl {
    text: String,
    tmpl: Template,
}

impl std::fmt::Debug for Tmpl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Tmpl").field(&self.text).finish()
    }
}

type Func = fn(&[Value]) -> Result<Value, FuncError>;

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::NoValue | Value::Nil => String::new(),
        other => other.to_string(),
    }
}

fn arg(args: &[Value], i: usize) -> Result<&Value, FuncError> {
    args.get(i)
        .ok_or(FuncError::ExactlyXArgs(String::new(), i + 1))
}

fn last(args: &[Value]) -> Result<String, FuncError> {
    args.last()
        .map(s)
        .ok_or(FuncError::AtLeastXArgs(String::new(), 1))
}

fn str_fn(f: fn(&str) -> String) -> impl Fn(&[Value]) -> Result<Value, FuncError> {
    move |args| Ok(Value::from(f(&last(args)?)))
}

macro_rules! unary {
    ($name:ident, $f:expr) => {
        fn $name(args: &[Value]) -> Result<Value, FuncError> {
            str_fn($f)(args)
        }
    };
}

unary!(lower, |x| x.to_lowercase());
unary!(upper, |x| x.to_uppercase());
unary!(trim, |x| x.trim().to_owned());
unary!(nospace, |x| x
    .chars()
    .filter(|c| !c.is_whitespace())
    .collect());
unary!(title, |x| {
    let mut out = String::with_capacity(x.len());
    let mut start = true;
    for c in x.chars() {
        if start && c.is_alphabetic() {
            out.extend(c.to_uppercase());
        } else {
            out.push(c);
        }
        start = !c.is_alphanumeric() && c != '\'';
    }
    out
});
unary!(quote, |x| format!("{x:?}"));
unary!(squote, |x| format!("'{x}'"));
unary!(b64enc, |x| B64.encode(x.as_bytes()));

fn b64dec(args: &[Value]) -> Result<Value, FuncError> {
    let x = last(args)?;
    // sprig returns the decoder's error text instead of failing; Argo's filters rely on it.
    Ok(Value::from(match B64.decode(x.as_bytes()) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => e.to_string(),
    }))
}

/// `trimPrefix "p" s`, `trimSuffix "p" s`, `trimAll "c" s`, `contains "p" s`, `hasPrefix "p"
/// s`, `hasSuffix "p" s`: the piped string comes last.
fn two(args: &[Value]) -> Result<(String, String), FuncError> {
    if args.len() != 2 {
        return Err(FuncError::ExactlyXArgs(String::new(), 2));
    }
    Ok((s(&args[0]), s(&args[1])))
}

fn trim_prefix(args: &[Value]) -> Result<Value, FuncError> {
    let (p, x) = two(args)?;
    Ok(Value::from(
        x.strip_prefix(p.as_str()).unwrap_or(&x).to_owned(),
    ))
}
fn trim_suffix(args: &[Value]) -> Result<Value, FuncError> {
    let (p, x) = two(args)?;
    Ok(Value::from(
        x.strip_suffix(p.as_str()).unwrap_or(&x).to_owned(),
    ))
}
fn trim_all(args: &[Value]) -> Result<Value, FuncError> {
    let (p, x) = two(args)?;
    let set: Vec<char> = p.chars().collect();
    Ok(Value::from(x.trim_matches(|c| set.contains(&c)).to_owned()))
}
fn contains(args: &[Value]) -> Result<Value, FuncError> {
    let (p, x) = two(args)?;
    Ok(Value::Bool(x.contains(p.as_str())))
}
fn has_prefix(args: &[Value]) -> Result<Value, FuncError> {
    let (p, x) = two(args)?;
    Ok(Value::Bool(x.starts_with(p.as_str())))
}
fn has_suffix(args: &[Value]) -> Result<Value, FuncError> {
    let (p, x) = two(args)?;
    Ok(Value::Bool(x.ends_with(p.as_str())))
}
/// `replace "old" "new" s`
fn replace(args: &[Value]) -> Result<Value, FuncError> {
    if args.len() != 3 {
        return Err(FuncError::ExactlyXArgs(String::new(), 3));
    }
    Ok(Value::from(s(&args[2]).replace(&s(&args[0]), &s(&args[1]))))
}
/// `default "d" x`: `d` when `x` is empty or missing.
fn default(args: &[Value]) -> Result<Value, FuncError> {
    let d = arg(args, 0)?.clone();
    match args.get(1) {
        None | Some(Value::NoValue) | Some(Value::Nil) => Ok(d),
        Some(Value::String(x)) if x.is_empty() => Ok(d),
        Some(Value::Bool(false)) => Ok(d),
        Some(v) => Ok(v.clone()),
    }
}
/// `substr start end s`
fn substr(args: &[Value]) -> Result<Value, FuncError> {
    if args.len() != 3 {
        return Err(FuncError::ExactlyXArgs(String::new(), 3));
    }
    let n = |v: &Value| s(v).parse::<i64>().unwrap_or(0);
    let x: Vec<char> = s(&args[2]).chars().collect();
    let (a, b) = (n(&args[0]).max(0) as usize, n(&args[1]));
    let b = if b < 0 {
        x.len()
    } else {
        (b as usize).min(x.len())
    };
    Ok(Value::from(
        x.get(a.min(b)..b).unwrap_or(&[]).iter().collect::<String>(),
    ))
}
/// `trunc n s`
fn trunc(args: &[Value]) -> Result<Value, FuncError> {
    let (n, x) = two(args)?;
    let n: usize = n.parse().unwrap_or(0);
    Ok(Value::from(x.chars().take(n).collect::<String>()))
}
/// `toJson x`
fn to_json(args: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::from(
        serde_json::to_string(&from_gtmpl(arg(args, 0)?)).unwrap_or_default(),
    ))
}
fn to_string(args: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::from(last(args)?))
}
/// `split "sep" s` gives a map `_0`, `_1`, … as sprig's does.
fn split(args: &[Value]) -> Result<Value, FuncError> {
    let (sep, x) = two(args)?;
    let m: HashMap<String, Value> = x
        .split(sep.as_str())
        .enumerate()
        .map(|(i, p)| (format!("_{i}"), Value::from(p.to_owned())))
        .collect();
    Ok(Value::Map(m))
}

const FUNCS: [(&str, Func); 22] = [
    ("lower", lower),
    ("upper", upper),
    ("trim", trim),
    ("nospace", nospace),
    ("title", title),
    ("quote", quote),
    ("squote", squote),
    ("b64enc", b64enc),
    ("b64dec", b64dec),
    ("trimPrefix", trim_prefix),
    ("trimSuffix", trim_suffix),
    ("trimAll", trim_all),
    ("contains", contains),
    ("hasPrefix", has_prefix),
    ("hasSuffix", has_suffix),
    ("replace", replace),
    ("default", default),
    ("substr", substr),
    ("trunc", trunc),
    ("toJson", to_json),
    ("toString", to_string),
    ("split", split),
];

impl Tmpl {
    pub fn parse(text: &str) -> Result<Tmpl, String> {
        let mut tmpl = Template::default();
        for (name, f) in FUNCS {
            tmpl.add_func(name, f);
        }
        tmpl.parse(text).map_err(|e| format!("{text:?}: {e}"))?;
        Ok(Tmpl {
            text: text.to_owned(),
            tmpl,
        })
    }

    /// Renders with `.Input` = `input`.
    pub fn render_input(&self, input: &serde_json::Value) -> Result<String, String> {
        let mut root = HashMap::new();
        root.insert("Input".to_owned(), to_gtmpl(input));
        self.tmpl
            .render(&Context::from(Value::Map(root)))
            .map_err(|e| format!("template {:?}: {e}", self.text))
    }
}

pub fn to_gtmpl(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Nil,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (_, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(0.0)),
        },
        serde_json::Value::String(s) => Value::from(s.clone()),
        serde_json::Value::Array(a) => Value::Array(a.iter().map(to_gtmpl).collect()),
        serde_json::Value::Object(o) => {
            Value::Map(o.iter().map(|(k, v)| (k.clone(), to_gtmpl(v))).collect())
        }
    }
}

fn from_gtmpl(v: &Value) -> serde_json::Value {
    match v {
        Value::NoValue | Value::Nil | Value::Function(_) => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::String(s) => serde_json::Value::String(s.clone()),
        Value::Number(n) => serde_json::from_str(&n.to_string()).unwrap_or(serde_json::Value::Null),
        Value::Array(a) => serde_json::Value::Array(a.iter().map(from_gtmpl).collect()),
        Value::Object(m) | Value::Map(m) => {
            serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), from_gtmpl(v))).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(t: &str, input: serde_json::Value) -> Result<String, String> {
        Tmpl::parse(t)?.render_input(&input)
    }

    #[test]
    fn sprig_functions_in_argo_examples() {
        let pr = serde_json::json!({"body": {"message": "hello world", "name": "Some Name",
            "pull_request": {"number": 7, "head": {"sha": "0123456789abcdef"}}}});
        assert_eq!(
            r("{{ .Input.body.message | title }}", pr.clone()).unwrap(),
            "Hello World"
        );
        assert_eq!(
            r("{{ .Input.body.name | nospace | lower }}-", pr.clone()).unwrap(),
            "somename-"
        );
        assert_eq!(
            r("{{ .Input.body.pull_request.number }}-{{ .Input.body.pull_request.head.sha | substr 0 7 }}", pr.clone()).unwrap(),
            "7-0123456"
        );
        assert_eq!(
            r("Hi {{.Input.body.name}},\n\n\tHello There.", pr.clone()).unwrap(),
            "Hi Some Name,\n\n\tHello There."
        );
        assert_eq!(
            r(
                r#"{{ .Input.ref | trimPrefix "refs/heads/" }}"#,
                serde_json::json!({"ref": "refs/heads/main"})
            )
            .unwrap(),
            "main"
        );
        assert_eq!(
            r(
                r#"{{ .Input.s | replace "-" "_" | upper }}"#,
                serde_json::json!({"s": "a-b"})
            )
            .unwrap(),
            "A_B"
        );
        assert_eq!(
            r(
                r#"{{ .Input.x | default "none" }}"#,
                serde_json::json!({"x": ""})
            )
            .unwrap(),
            "none"
        );
        assert_eq!(
            r("{{ b64enc .Input.s }}", serde_json::json!({"s": "hi"})).unwrap(),
            "aGk="
        );
        assert_eq!(
            r(
                "{{ toJson .Input.o }}",
                serde_json::json!({"o": {"a": [1, true]}})
            )
            .unwrap(),
            r#"{"a":[1,true]}"#
        );
        assert_eq!(
            r(
                r#"{{ printf "%s/%d" .Input.a .Input.n }}"#,
                serde_json::json!({"a": "x", "n": 3})
            )
            .unwrap(),
            "x/3"
        );
        assert_eq!(
            r(
                r#"{{ if eq .Input.a "x" }}yes{{ else }}no{{ end }}"#,
                serde_json::json!({"a": "x"})
            )
            .unwrap(),
            "yes"
        );
    }

    #[test]
    fn a_missing_key_never_crashes() {
        // As Go's text/template: a missing key renders `<no value>`; a field of it is an
        // error (which a parameter falls back from); neither panics.
        assert_eq!(
            r("{{ .Input.nope }}", serde_json::json!({"a": 1})).unwrap(),
            "<no value>"
        );
        let e = r("{{ .Input.nope.deeper }}", serde_json::json!({"a": 1})).unwrap_err();
        assert!(e.contains("only maps and objects have fields"), "{e}");
        assert!(Tmpl::parse("{{ .Input").is_err());
        assert!(Tmpl::parse("{{ no }}")
            .unwrap_err()
            .contains("function no not defined"));
    }
}
