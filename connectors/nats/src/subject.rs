//! Subject templates: `events.{source}.{type}` filled from event attributes.
//!
//! NATS subject tokens are separated by `.` and may not contain whitespace, `*` or `>` (the
//! wildcards). A filled-in value keeps letters, digits, `-` and `_`; every other character —
//! including `.`, so one attribute stays one token — becomes `_`. An empty value becomes `_`.

use sluice_core::event::Event;

/// A subject template, checked for NATS.
#[derive(Debug, Clone)]
pub struct Template(sluice_core::template::Template);

impl Template {
    pub fn parse(t: &str) -> Result<Template, String> {
        let inner = sluice_core::template::Template::parse("subject", t)?;
        if inner
            .literal()
            .chars()
            .any(|c| c.is_whitespace() || c == '*' || c == '>')
        {
            return Err(format!(
                "subject {t:?}: whitespace and wildcards cannot be published to"
            ));
        }
        Ok(Template(inner))
    }

    /// The subject when the template has no placeholder.
    pub fn fixed(&self) -> Option<String> {
        self.0.is_fixed().then(|| self.0.literal())
    }

    pub fn render(&self, e: &Event) -> String {
        self.0.render_with(e, push_token)
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
