//! Trigger conditions: a boolean expression over dependency names with `&&`, `||` and
//! parentheses (Argo's `conditions`, e.g. `(dep01 || dep02) && dep-03`). Names may contain
//! `-`, `_` and `.` as Argo's do. No condition means the AND of every dependency.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cond {
    Dep(usize),
    And(Box<Cond>, Box<Cond>),
    Or(Box<Cond>, Box<Cond>),
}

impl Cond {
    /// Whether the condition holds when `have(dep)` tells which dependencies have an event.
    pub fn eval(&self, have: &dyn Fn(usize) -> bool) -> bool {
        match self {
            Cond::Dep(d) => have(*d),
            Cond::And(a, b) => a.eval(have) && b.eval(have),
            Cond::Or(a, b) => a.eval(have) || b.eval(have),
        }
    }

    /// The dependencies the condition names.
    pub fn deps(&self, out: &mut Vec<usize>) {
        match self {
            Cond::Dep(d) => {
                if !out.contains(d) {
                    out.push(*d)
                }
            }
            Cond::And(a, b) | Cond::Or(a, b) => {
                a.deps(out);
                b.deps(out);
            }
        }
    }

    /// True when no AND appears: any one dependency's event fires the trigger by itself, so
    /// nothing has to be kept (Argo: pure-OR triggers fire per event without state).
    pub fn is_pure_or(&self) -> bool {
        match self {
            Cond::Dep(_) => true,
            Cond::And(..) => false,
            Cond::Or(a, b) => a.is_pure_or() && b.is_pure_or(),
        }
    }

    /// The AND of `deps` (a missing `conditions`).
    pub fn all(deps: usize) -> Cond {
        let mut c = Cond::Dep(0);
        for d in 1..deps {
            c = Cond::And(Box::new(c), Box::new(Cond::Dep(d)));
        }
        c
    }
}

#[derive(Debug, PartialEq)]
enum Tok<'a> {
    Name(&'a str),
    And,
    Or,
    Open,
    Close,
}

fn lex(s: &str) -> Result<Vec<Tok<'_>>, String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            b'(' => {
                out.push(Tok::Open);
                i += 1
            }
            b')' => {
                out.push(Tok::Close);
                i += 1
            }
            b'&' if b.get(i + 1) == Some(&b'&') => {
                out.push(Tok::And);
                i += 2
            }
            b'|' if b.get(i + 1) == Some(&b'|') => {
                out.push(Tok::Or);
                i += 2
            }
            c if c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'.' => {
                let start = i;
                while i < b.len()
                    && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'_' | b'-' | b'.'))
                {
                    i += 1;
                }
                out.push(Tok::Name(&s[start..i]));
            }
            _ => {
                let ch = s[i..].chars().next().unwrap_or('?');
                return Err(format!(
                    "unexpected `{ch}` at offset {i}; conditions use dependency names, `&&`, `||` and parentheses"
                ));
            }
        }
    }
    Ok(out)
}

/// Parses `s`, resolving each name with `dep`. `&&` binds tighter than `||`.
pub fn parse(s: &str, dep: &dyn Fn(&str) -> Option<usize>) -> Result<Cond, String> {
    let toks = lex(s)?;
    if toks.is_empty() {
        return Err("empty condition".into());
    }
    let mut p = Parser { toks, at: 0, dep };
    let c = p.or()?;
    if p.at != p.toks.len() {
        return Err(format!(
            "unexpected {} after a complete condition",
            show(&p.toks[p.at])
        ));
    }
    Ok(c)
}

fn show(t: &Tok<'_>) -> String {
    match t {
        Tok::Name(n) => format!("`{n}`"),
        Tok::And => "`&&`".into(),
        Tok::Or => "`||`".into(),
        Tok::Open => "`(`".into(),
        Tok::Close => "`)`".into(),
    }
}

struct Parser<'a, 'd> {
    toks: Vec<Tok<'a>>,
    at: usize,
    dep: &'d dyn Fn(&str) -> Option<usize>,
}

impl Parser<'_, '_> {
    fn or(&mut self) -> Result<Cond, String> {
        let mut l = self.and()?;
        while self.toks.get(self.at) == Some(&Tok::Or) {
            self.at += 1;
            let r = self.and()?;
            l = Cond::Or(Box::new(l), Box::new(r));
        }
        Ok(l)
    }

    fn and(&mut self) -> Result<Cond, String> {
        let mut l = self.atom()?;
        while self.toks.get(self.at) == Some(&Tok::And) {
            self.at += 1;
            let r = self.atom()?;
            l = Cond::And(Box::new(l), Box::new(r));
        }
        Ok(l)
    }

    fn atom(&mut self) -> Result<Cond, String> {
        match self.toks.get(self.at) {
            Some(Tok::Name(n)) => {
                let n = *n;
                self.at += 1;
                (self.dep)(n)
                    .map(Cond::Dep)
                    .ok_or_else(|| format!("`{n}` is not a dependency of this sensor"))
            }
            Some(Tok::Open) => {
                self.at += 1;
                let c = self.or()?;
                match self.toks.get(self.at) {
                    Some(Tok::Close) => {
                        self.at += 1;
                        Ok(c)
                    }
                    _ => Err("missing `)`".into()),
                }
            }
            Some(t) => Err(format!("expected a dependency name, found {}", show(t))),
            None => Err("the condition ends where a dependency name is expected".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deps(n: &str) -> Option<usize> {
        ["dep01", "dep02", "dep-03", "a.b"]
            .iter()
            .position(|d| *d == n)
    }

    #[test]
    fn precedence_parentheses_and_dashed_names() {
        let c = parse("(dep01 || dep02) && dep-03", &deps).unwrap();
        let with = |set: &'static [usize]| move |d: usize| set.contains(&d);
        assert!(c.eval(&with(&[0, 2])));
        assert!(c.eval(&with(&[1, 2])));
        assert!(!c.eval(&with(&[0, 1])));
        assert!(!c.is_pure_or());
        // && binds tighter: a || (b && c)
        let c = parse("dep01 || dep02 && dep-03", &deps).unwrap();
        assert!(c.eval(&with(&[0])));
        assert!(!c.eval(&with(&[1])));
        assert!(parse("dep01 || a.b", &deps).unwrap().is_pure_or());
        let mut named = Vec::new();
        parse("dep01 && (dep02 || dep01)", &deps)
            .unwrap()
            .deps(&mut named);
        assert_eq!(named, vec![0, 1]);
    }

    #[test]
    fn errors_say_what_is_wrong() {
        assert!(parse("dep01 && nope", &deps)
            .unwrap_err()
            .contains("`nope` is not a dependency"));
        assert!(parse("(dep01 && dep02", &deps)
            .unwrap_err()
            .contains("missing `)`"));
        assert!(parse("dep01 &&", &deps).unwrap_err().contains("ends where"));
        assert!(parse("dep01 & dep02", &deps)
            .unwrap_err()
            .contains("unexpected `&`"));
        assert!(parse("dep01 dep02", &deps)
            .unwrap_err()
            .contains("after a complete condition"));
        assert!(parse("  ", &deps).unwrap_err().contains("empty"));
    }

    #[test]
    fn all_is_the_and_of_every_dependency() {
        let c = Cond::all(3);
        assert!(c.eval(&|_| true));
        assert!(!c.eval(&|d| d != 1));
        assert!(Cond::all(1).is_pure_or());
    }
}
