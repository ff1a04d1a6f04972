//! Subject templates: `events.{source}.{type}` filled from event attributes.
//!
//! NATS subject tokens are separated by `.` and may not contain whitespace, `*` or `>` (the
//! wildcards). A filled-in value keeps letters, digits, `-` and `_`; every other character —
//! including `.`, so one attribute stays one token — becomes `_`. An empty value becomes `_`.

use sluice_core::event::Event;

#[derive(Debug, Clone)]
enum Part {
    Text(String),
    Attr(String),
}

#[derive(Debug, Clone)]
pub struct Template(Vec<Part>);

impl Template {
    pub fn parse(t: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = t;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_owned()));
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("subject {t:?}: unclosed `{{`"))?;
            let name = &rest[open + 1..open + close];
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            {
                return Err(format!(
                    "subject {t:?}: `{{{name}}}` is not an attribute name"
                ));
            }
            parts.push(Part::Attr(name.to_owned()));
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        let literal: String = parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(s) => Some(s.as_str()),
                Part::Attr(_) => None,
            })
            .collect();
        if literal
            .chars()
            .any(|c| c.is_whitespace() || c == '*' || c == '>')
        {
            return Err(format!(
                "subject {t:?}: whitespace and wildcards cannot be published to"
            ));
        }
        if parts.is_empty() {
            return Err("subject must not be empty".into());
        }
        Ok(Template(parts))
    }

    pub fn render(&self, e: &Event) -> String {
        let mut out = String::with_capacity(64);
        for p in &self.0 {
            match p {
                Part::Text(s) => out.push_str(s),
                Part::Attr(name) => {
                    let value = match name.as_str() {
                        "source" => Some(std::borrow::Cow::Borrowed(e.source.as_str())),
                        "type" => Some(std::borrow::Cow::Borrowed(e.ty.as_str())),
                        "id" => Some(std::borrow::Cow::Borrowed(e.id.as_str())),
                        "subject" => e.subject.as_deref().map(std::borrow::Cow::Borrowed),
                        ext => e.extension(ext).map(|v| v.to_canonical()),
                    };
                    push_token(&mut out, value.as_deref().unwrap_or(""));
                }
            }
        }
        out
    }
}

fn push_token(out: &mut String, v: &str) {
    if v.is_empty() {
        out.push('_');
        return;
    }
    out.extend(v.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            c
        } else {
            '_'
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_and_sanitizes() {
        let t = Template::parse("events.{source}.{type}").unwrap();
        let e = Event::new("1", "https://a.example/x y", "com.example.order.created");
        assert_eq!(
            t.render(&e),
            "events.https___a_example_x_y.com_example_order_created"
        );
        let t = Template::parse("x.{subject}.{partitionkey}").unwrap();
        assert_eq!(t.render(&e), "x._._");
        assert!(Template::parse("events.>").is_err());
        assert!(Template::parse("events.{Bad}").is_err());
        assert!(Template::parse("events.{source").is_err());
    }
}
