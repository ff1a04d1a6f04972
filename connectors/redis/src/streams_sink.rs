//! `kind: redis-streams` sink: `XADD` in pipelines, delivered = the entry id Redis returned.

use redis::aio::ConnectionManager;
use redis::Value;
use serde::Deserialize;
use sluice_core::template::Template;
use sluice_core::units::HumanDuration;
use sluice_core::{BoxFuture, ConnectorError, Running, SinkConfig, SinkContext};

use crate::entry::{self, Mode};
use crate::{check_url, TlsConfig};

/// `maxlen:` — `1000000` (exact trim) or `~1000000` (approximate, cheaper).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum MaxLen {
    Exact(u64),
    Text(String),
}

impl MaxLen {
    fn parse(&self) -> Result<(bool, u64), String> {
        match self {
            MaxLen::Exact(n) => Ok((false, *n)),
            MaxLen::Text(t) => {
                let t = t.trim();
                let (approx, n) = match t.strip_prefix('~') {
                    Some(rest) => (true, rest.trim()),
                    None => (false, t.strip_prefix('=').unwrap_or(t).trim()),
                };
                n.parse::<u64>().map(|n| (approx, n)).map_err(|_| {
                    format!("maxlen {t:?} is not a length: write 1000000 (exact) or ~1000000 (approximate)")
                })
            }
        }
    }
}

/// `kind: redis-streams` sink options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamsSinkConfig {
    #[serde(default = "crate::default_url")]
    pub url: String,
    /// The stream key, a template over event attributes (`events.{type}`). Default `events`.
    #[serde(default = "default_stream")]
    pub stream: String,
    /// Trim the stream as entries are added: `1000000` or `~1000000` (approximate).
    pub maxlen: Option<MaxLen>,
    /// `binary` (default: `ce_*` fields, data in `data`) or `structured` (the JSON event in
    /// `data`).
    #[serde(default)]
    pub mode: Mode,
    /// `XADD`s sent in one pipeline (one round trip). Default 500.
    #[serde(default = "crate::default_batch")]
    pub batch: usize,
    /// How long a pipeline may take before its events count as failed. Default 5s.
    #[serde(default = "crate::five_seconds")]
    pub timeout: HumanDuration,
    pub tls: Option<TlsConfig>,
}

fn default_stream() -> String {
    "events".into()
}

impl SinkConfig for StreamsSinkConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        check_url(&self.url, self.tls.as_ref())?;
        Template::parse("stream", &self.stream)?;
        if let Some(m) = &self.maxlen {
            m.parse()?;
        }
        if self.batch == 0 || self.batch > 10_000 {
            return Err("batch must be between 1 and 10000".into());
        }
        Ok(())
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("redis-streams sink {name}: {m}"));
            let conn = crate::managed(&self.url, self.tls.as_ref(), self.timeout.get())
                .await
                .map_err(err)?;
            let sink = StreamsSink {
                template: Template::parse("stream", &self.stream).map_err(err)?,
                maxlen: self
                    .maxlen
                    .as_ref()
                    .map(MaxLen::parse)
                    .transpose()
                    .map_err(err)?,
                mode: self.mode,
                batch: self.batch,
                name,
            };
            Ok(Box::pin(sink.run(conn, ctx)) as Running)
        })
    }
}

struct StreamsSink {
    name: String,
    template: Template,
    maxlen: Option<(bool, u64)>,
    mode: Mode,
    batch: usize,
}

impl StreamsSink {
    fn key(&self, e: &sluice_core::Event) -> String {
        self.template.render_with(e, |out, v| out.push_str(v))
    }

    async fn run(self, conn: ConnectionManager, ctx: SinkContext) -> Result<(), ConnectorError> {
        let name = self.name.clone();
        crate::run_pipelined(
            &name,
            "XADD",
            conn,
            ctx,
            self.batch,
            |pipe, event| {
                let key = self.key(event);
                let fields = entry::fields_of(event, self.mode);
                // Sized up front: growing the command's buffer argument by argument copied
                // each entry (its KiB of data included) several times over.
                let data =
                    32 + key.len() + fields.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
                let mut cmd = redis::Cmd::with_capacity(7 + 2 * fields.len(), data);
                cmd.arg("XADD").arg(key);
                if let Some((approx, len)) = self.maxlen {
                    cmd.arg("MAXLEN");
                    if approx {
                        cmd.arg("~");
                    }
                    cmd.arg(len);
                }
                cmd.arg("*");
                for (k, v) in &fields {
                    cmd.arg(&**k).arg(&**v);
                }
                pipe.add_command(cmd);
            },
            |reply| match reply {
                Value::BulkString(_) | Value::SimpleString(_) => Ok(()),
                other => Err(format!("XADD answered {other:?}")),
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maxlen_forms() {
        assert_eq!(MaxLen::Exact(5).parse().unwrap(), (false, 5));
        assert_eq!(
            MaxLen::Text("~1000000".into()).parse().unwrap(),
            (true, 1_000_000)
        );
        assert_eq!(MaxLen::Text("= 10".into()).parse().unwrap(), (false, 10));
        assert!(MaxLen::Text("~lots".into())
            .parse()
            .unwrap_err()
            .contains("not a length"));
    }
}
