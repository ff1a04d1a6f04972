//! Processors that reshape events on their way through: `set`.
//!
//! A processor takes events from its queue and emits new ones; each input is acknowledged only
//! once what it became was delivered (`pipeline::hand_off`), so a processor between a source
//! and its sinks keeps the source's promise ("200 only after delivery") intact.

use indexmap::IndexMap;
use serde::Deserialize;
use sluice_core::event::CORE_ATTRIBUTES;
use sluice_core::pipeline::{hand_off, SinkWindow, Step};
use sluice_core::template::Template;
use sluice_core::{
    BoxFuture, ConnectorError, Event, ProcessorConfig, ProcessorContext, Running, SinkItem, Str,
};

/// Events taken from the queue at a time.
const BATCH: usize = 256;

/// `kind: set` — sets attributes and extensions of every event from templates over its own
/// attributes (`{type}`, `{source}`, `{subject}`, `{id}`, `{time}`, or an extension name), then
/// passes it on. `id` and `source` cannot be set: they are the event's identity (dedup).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetConfig {
    /// New `type`, e.g. `com.example.{type}`.
    #[serde(rename = "type")]
    pub ty: Option<String>,
    /// New `subject`, e.g. `orders/{region}`.
    pub subject: Option<String>,
    /// Extensions to set: name → template. Names are CloudEvents extension names
    /// (lowercase letters and digits, at most 20).
    #[serde(default)]
    pub extensions: IndexMap<String, String>,
    /// Extensions to remove (after setting).
    #[serde(default)]
    pub remove: Vec<String>,
    /// Events handed on whose delivery is awaited at once. Default 1024.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
}

fn default_concurrency() -> usize {
    1024
}

/// The compiled `set` rules.
#[derive(Debug)]
struct Set {
    ty: Option<Template>,
    subject: Option<Template>,
    /// Names held as the event holds them, so setting one copies no heap text.
    extensions: Vec<(Str, Template)>,
    remove: Vec<String>,
}

impl SetConfig {
    fn compile(&self) -> Result<Set, String> {
        let check_ext = |name: &str, what: &str| -> Result<(), String> {
            let reserved =
                CORE_ATTRIBUTES.contains(&name) || name == "data" || name == "data_base64";
            if reserved {
                return Err(format!(
                    "{what}: `{name}` is a core attribute, not an extension{}",
                    if name == "type" || name == "subject" {
                        format!(" (set it with `{name}:`)")
                    } else {
                        String::new()
                    }
                ));
            }
            let mut probe = Event::new("probe", "/probe", "probe");
            probe.set_extension(name, "v");
            probe.validate().map_err(|e| format!("{what}: {e}"))
        };
        let mut extensions = Vec::new();
        for (name, t) in &self.extensions {
            check_ext(name, &format!("extensions.{name}"))?;
            extensions.push((
                Str::new(name),
                Template::parse(&format!("extensions.{name}"), t)?,
            ));
        }
        for name in &self.remove {
            check_ext(name, "remove")?;
        }
        if self.concurrency == 0 {
            return Err("concurrency: must be at least 1".into());
        }
        if self.ty.is_none()
            && self.subject.is_none()
            && extensions.is_empty()
            && self.remove.is_empty()
        {
            return Err("nothing to set: give `type`, `subject`, `extensions` or `remove`".into());
        }
        Ok(Set {
            ty: self
                .ty
                .as_deref()
                .map(|t| Template::parse("type", t))
                .transpose()?,
            subject: self
                .subject
                .as_deref()
                .map(|t| Template::parse("subject", t))
                .transpose()?,
            extensions,
            remove: self.remove.clone(),
        })
    }
}

impl Set {
    /// The event with the rules applied (every template reads the event as it arrived), or
    /// why the result is not a valid CloudEvent.
    fn apply(&self, mut e: Event) -> Result<Event, String> {
        let fill = |t: &Template, e: &Event| t.render_with(e, |o, v| o.push_str(v));
        let ty = self.ty.as_ref().map(|t| fill(t, &e));
        let subject = self.subject.as_ref().map(|t| fill(t, &e));
        let exts: Vec<(Str, String)> = self
            .extensions
            .iter()
            .map(|(n, t)| (n.clone(), fill(t, &e)))
            .collect();
        if let Some(ty) = ty {
            e.ty = ty.into();
        }
        if let Some(s) = subject {
            e.subject = Some(s.into());
        }
        for (n, v) in exts {
            e.set_extension(n, v);
        }
        if !self.remove.is_empty() {
            e.extensions
                .retain(|(n, _)| !self.remove.iter().any(|r| r == n));
        }
        e.validate().map_err(|err| {
            format!("set: the result is not a valid CloudEvent ({err}); check the templates")
        })?;
        Ok(e)
    }
}

impl ProcessorConfig for SetConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        self.compile().map(drop)
    }

    fn build(
        self: Box<Self>,
        ctx: ProcessorContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let set = self.compile().map_err(ConnectorError::new)?;
            Ok(Box::pin(run(set, self.concurrency, ctx)) as Running)
        })
    }
}

async fn run(
    set: Set,
    concurrency: usize,
    mut ctx: ProcessorContext,
) -> Result<(), ConnectorError> {
    let mut window = SinkWindow::new(concurrency);
    let mut batch: Vec<SinkItem> = Vec::with_capacity(BATCH);
    loop {
        let input = &mut ctx.input;
        let step = window
            .step(&ctx.grace_over, true, |room| {
                input.recv_many(&mut batch, room.min(BATCH))
            })
            .await;
        match step {
            Step::GraceOver => break,
            Step::Settled | Step::Idle => {}
            Step::Input(0) => {
                // Input done: wait for what was handed on (bounded by the grace period).
                window.drain_until(&ctx.grace_over).await;
                break;
            }
            Step::Input(_) => {
                for SinkItem { event, delivery } in batch.drain(..) {
                    match set.apply(*event) {
                        Ok(out) => {
                            window.push(hand_off(&ctx.sender, vec![delivery], vec![out]).await)
                        }
                        Err(reason) => {
                            tracing::warn!(processor = %ctx.name, %reason, "event rejected");
                            delivery.rejected(reason);
                        }
                    }
                }
            }
        }
    }
    tracing::debug!(processor = %ctx.name, "set: stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(yaml_like: SetConfig) -> Set {
        yaml_like.compile().unwrap()
    }

    fn base() -> SetConfig {
        SetConfig {
            ty: None,
            subject: None,
            extensions: IndexMap::new(),
            remove: Vec::new(),
            concurrency: 8,
        }
    }

    #[test]
    fn templates_read_the_event_as_it_arrived() {
        let mut c = base();
        c.ty = Some("com.example.{type}".into());
        c.subject = Some("{region}/{type}".into());
        c.extensions.insert("origin".into(), "{source}".into());
        c.remove = vec!["region".into()];
        let mut e = Event::new("1", "/orders", "created");
        e.set_extension("region", "eu");
        let out = cfg(c).apply(e).unwrap();
        assert_eq!(out.ty, "com.example.created");
        assert_eq!(out.subject.as_deref(), Some("eu/created"));
        assert_eq!(
            out.extension("origin")
                .map(|v| v.to_canonical().into_owned()),
            Some("/orders".into())
        );
        assert!(out.extension("region").is_none());
        assert_eq!((out.id.as_str(), out.source.as_str()), ("1", "/orders"));
    }

    #[test]
    fn bad_rules_are_refused_with_the_reason() {
        let mut c = base();
        c.extensions.insert("Bad_Name".into(), "x".into());
        assert!(c.compile().unwrap_err().starts_with("extensions.Bad_Name:"));
        let mut c = base();
        c.extensions.insert("id".into(), "x".into());
        assert!(c.compile().unwrap_err().contains("core attribute"));
        let mut c = base();
        c.subject = Some("{unclosed".into());
        assert!(c.compile().unwrap_err().contains("unclosed"));
        assert!(base().compile().unwrap_err().starts_with("nothing to set"));
    }

    #[test]
    fn a_result_that_is_no_cloudevent_is_an_error() {
        let mut c = base();
        c.ty = Some("{missing}".into());
        let err = cfg(c).apply(Event::new("1", "/s", "t")).unwrap_err();
        assert!(err.contains("not a valid CloudEvent"), "{err}");
    }
}
