//! Templates over event attributes, such as `events.{source}.{type}`: the literal text with
//! `{name}` placeholders for `source`, `type`, `id`, `subject` or an extension name. Each sink
//! decides how a filled-in value is made safe for where it goes (a NATS subject token, a Kafka
//! topic name, a record key as is).

use std::borrow::Cow;

use crate::event::Event;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Attr(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(Vec<Part>);

impl Template {
    /// Parses `t`; `what` names the option in errors (`subject`, `topic`, `key`).
    pub fn parse(what: &str, t: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = t;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_owned()));
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("{what} {t:?}: unclosed `{{`"))?;
            let name = &rest[open + 1..open + close];
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            {
                return Err(format!(
                    "{what} {t:?}: `{{{name}}}` is not an attribute name (lowercase letters and digits)"
                ));
            }
            parts.push(Part::Attr(name.to_owned()));
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        if parts.is_empty() {
            return Err(format!("{what} must not be empty"));
        }
        Ok(Template(parts))
    }

    /// The literal text between placeholders, concatenated (for checks).
    pub fn literal(&self) -> String {
        self.0
            .iter()
            .filter_map(|p| match p {
                Part::Text(s) => Some(s.as_str()),
                Part::Attr(_) => None,
            })
            .collect()
    }

    /// True when the template has no placeholder.
    pub fn is_fixed(&self) -> bool {
        self.0.iter().all(|p| matches!(p, Part::Text(_)))
    }

    /// Fills the template; `value(out, v)` appends a filled-in value (`""` when the event
    /// lacks the attribute) in whatever safe form the destination needs.
    pub fn render_with(&self, e: &Event, mut value: impl FnMut(&mut String, &str)) -> String {
        let mut out = String::with_capacity(64);
        for p in &self.0 {
            match p {
                Part::Text(s) => out.push_str(s),
                Part::Attr(name) => value(&mut out, attr(e, name).as_deref().unwrap_or("")),
            }
        }
        out
    }
}

/// An attribute or extension of `e` by name, as text.
pub fn attr<'a>(e: &'a Event, name: &str) -> Option<Cow<'a, str>> {
    match name {
        "source" => Some(Cow::Borrowed(e.source.as_str())),
        "type" => Some(Cow::Borrowed(e.ty.as_str())),
        "id" => Some(Cow::Borrowed(e.id.as_str())),
        "subject" => e.subject.as_deref().map(Cow::Borrowed),
        "datacontenttype" => e.datacontenttype.as_deref().map(Cow::Borrowed),
        "dataschema" => e.dataschema.as_deref().map(Cow::Borrowed),
        "time" => e.time.as_ref().map(|t| Cow::Borrowed(t.as_str())),
        ext => e.extension(ext).map(|v| v.to_canonical()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_renders() {
        let t = Template::parse("topic", "events.{type}-{partitionkey}").unwrap();
        let mut e = Event::new("1", "/s", "a.b");
        assert_eq!(t.render_with(&e, |o, v| o.push_str(v)), "events.a.b-");
        e.set_extension("partitionkey", "k");
        assert_eq!(t.render_with(&e, |o, v| o.push_str(v)), "events.a.b-k");
        assert_eq!(t.literal(), "events.-");
        assert!(!t.is_fixed());
        assert!(Template::parse("topic", "fixed").unwrap().is_fixed());
        assert!(Template::parse("topic", "").is_err());
        assert!(Template::parse("topic", "a.{Bad}").is_err());
        let e = Template::parse("key", "a.{source").unwrap_err();
        assert!(e.starts_with("key \"a.{source\": unclosed"), "{e}");
    }
}
