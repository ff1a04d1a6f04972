//! `kind: amqp` sink: publish with publisher confirms; delivered = the broker's ack.

use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{Channel, Confirmation, Connection};
use serde::Deserialize;
use sluice_core::pipeline::{SinkWindow, Step};
use sluice_core::template::Template;
use sluice_core::units::HumanDuration;
use sluice_core::{
    BoxFuture, ConnectorError, Delivery, Running, SinkConfig, SinkContext, SinkItem,
};
use tokio::time::Instant;

use crate::binding::{self, Mode};
use crate::{check_url, connect, declare_exchange, reconnect_delay, ExchangeDecl, TlsConfig};

/// `kind: amqp` sink options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSinkConfig {
    #[serde(default = "crate::default_url")]
    pub url: String,
    /// The exchange to publish to (`""`: the default exchange, which routes by queue name).
    #[serde(default)]
    pub exchange: String,
    /// The routing key, a template over event attributes. Default `{type}`.
    #[serde(default = "default_key")]
    pub routing_key: String,
    /// Declare the exchange first (name taken from `exchange`).
    pub declare: Option<SinkDeclare>,
    /// `binary` (default: `cloudEvents:*` headers) or `structured`.
    #[serde(default)]
    pub mode: Mode,
    /// A message no queue is bound for comes back and counts as failed (default true). With
    /// false the broker drops it and it counts as delivered.
    #[serde(default = "yes")]
    pub mandatory: bool,
    /// Persistent messages (`delivery-mode: 2`), kept across a broker restart on durable queues
    /// (default true).
    #[serde(default = "yes")]
    pub persistent: bool,
    /// Publishes awaiting their confirm at once. Default 1000.
    #[serde(default = "default_window")]
    pub max_in_flight: usize,
    /// How long a confirm may take before the event counts as failed. Default 10s.
    #[serde(default = "ten_seconds")]
    pub timeout: HumanDuration,
    pub tls: Option<TlsConfig>,
}

/// `declare:` of the sink's exchange.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkDeclare {
    #[serde(rename = "type", default = "topic")]
    pub kind: String,
    #[serde(default = "yes")]
    pub durable: bool,
}

fn default_key() -> String {
    "{type}".into()
}
fn topic() -> String {
    "topic".into()
}
fn yes() -> bool {
    true
}
fn default_window() -> usize {
    1000
}
fn ten_seconds() -> HumanDuration {
    HumanDuration::from_secs(10)
}

impl SinkConfig for AmqpSinkConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        check_url(&self.url, self.tls.as_ref())?;
        let key = Template::parse("routing_key", &self.routing_key)?;
        binding::short("exchange", &self.exchange)?;
        if key.is_fixed() {
            binding::short("routing_key", &key.literal())?;
        }
        if self.declare.is_some() && self.exchange.is_empty() {
            return Err(
                "declare needs an exchange name (the default exchange \"\" always exists)".into(),
            );
        }
        if self.max_in_flight == 0 || self.max_in_flight > 100_000 {
            return Err("max_in_flight must be between 1 and 100000".into());
        }
        Ok(())
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("amqp sink {name}: {m}"));
            let sink = AmqpSink {
                template: Template::parse("routing_key", &self.routing_key).map_err(err)?,
                name: name.clone(),
                cfg: *self,
            };
            let link = sink.open().await.map_err(err)?;
            Ok(Box::pin(sink.run(link, ctx)) as Running)
        })
    }
}

struct Link {
    conn: Connection,
    channel: Channel,
}

struct AmqpSink {
    name: String,
    cfg: AmqpSinkConfig,
    template: Template,
}

type Confirming = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl AmqpSink {
    async fn open(&self) -> Result<Link, String> {
        let conn = connect(&self.cfg.url, self.cfg.tls.as_ref(), &self.name).await?;
        let channel = conn
            .create_channel()
            .await
            .map_err(|e| format!("cannot open a channel: {e}"))?;
        if let Some(d) = &self.cfg.declare {
            declare_exchange(
                &channel,
                &ExchangeDecl {
                    name: self.cfg.exchange.clone(),
                    kind: d.kind.clone(),
                    durable: d.durable,
                    auto_delete: false,
                    arguments: Default::default(),
                },
            )
            .await?;
        }
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| format!("confirm.select: {e}"))?;
        Ok(Link { conn, channel })
    }

    async fn run(self, first: Link, mut ctx: SinkContext) -> Result<(), ConnectorError> {
        let mut link = Some(first);
        let mut next_attempt = Instant::now();
        let mut attempts = 0u32;
        let mut batch: Vec<SinkItem> = Vec::with_capacity(self.cfg.max_in_flight);
        let mut window: SinkWindow<Confirming> = SinkWindow::new(self.cfg.max_in_flight);
        let exchange = ShortString::from(self.cfg.exchange.as_str());
        let opts = BasicPublishOptions {
            mandatory: self.cfg.mandatory,
            immediate: false,
        };
        loop {
            let input = &mut ctx.input;
            let step = window
                .step(&ctx.grace_over, true, |room| {
                    input.recv_many(&mut batch, room)
                })
                .await;
            match step {
                Step::GraceOver => break,
                Step::Settled | Step::Idle => continue,
                Step::Input(0) => {
                    window.drain().await;
                    break;
                }
                Step::Input(_) => {}
            }
            if link
                .as_ref()
                .is_some_and(|l| !l.channel.status().connected())
            {
                link = None;
            }
            if link.is_none() && Instant::now() >= next_attempt {
                match self.open().await {
                    Ok(l) => {
                        tracing::info!(sink = %self.name, "amqp: reconnected");
                        attempts = 0;
                        link = Some(l);
                    }
                    Err(e) => {
                        tracing::warn!(sink = %self.name, error = %e, "amqp: reconnect failed");
                        next_attempt = Instant::now() + reconnect_delay(attempts);
                        attempts += 1;
                    }
                }
            }
            let Some(l) = &link else {
                for SinkItem { delivery, .. } in batch.drain(..) {
                    delivery.failed("not connected to the broker (reconnecting)");
                }
                continue;
            };
            for SinkItem { event, delivery } in batch.drain(..) {
                let key = self.template.render_with(&event, |out, v| out.push_str(v));
                let encoded = binding::short("the routing key", &key).and_then(|key| {
                    binding::encode(&event, self.cfg.mode, self.cfg.persistent)
                        .map(|(props, body)| (key, props, body))
                });
                let (key, props, body) = match encoded {
                    Ok(e) => e,
                    Err(why) => {
                        delivery.rejected(format!("amqp sink {}: {why}", self.name));
                        continue;
                    }
                };
                // Bounded by the grace period: a blocked connection (a broker resource alarm)
                // must not hold up shutdown.
                let publishing = l
                    .channel
                    .basic_publish(exchange.clone(), key, opts, &body, props);
                let published = tokio::select! {
                    r = publishing => r,
                    _ = ctx.grace_over.cancelled() => {
                        delivery.failed("the shutdown grace period ended before the broker took it");
                        continue;
                    }
                };
                match published {
                    Ok(confirm) => {
                        let timeout = self.cfg.timeout.get();
                        window.push(Box::pin(async move {
                            settle(
                                delivery,
                                tokio::time::timeout(timeout, confirm).await,
                                timeout,
                            );
                        }));
                    }
                    Err(e) => {
                        delivery.failed(format!("publish failed: {e}"));
                    }
                }
            }
        }
        if let Some(l) = link {
            let _ = l.channel.close(200, "".into()).await;
            let _ = l.conn.close(200, "".into()).await;
        }
        tracing::debug!(sink = %self.name, "amqp: stopped");
        Ok(())
    }
}

fn settle(
    delivery: Delivery,
    r: Result<lapin::Result<Confirmation>, tokio::time::error::Elapsed>,
    timeout: Duration,
) {
    match r {
        Ok(Ok(Confirmation::Ack(None))) => delivery.delivered(),
        Ok(Ok(Confirmation::Ack(Some(ret)))) => delivery.failed(format!(
            "returned by the broker: {} {} (no queue is bound for routing key {:?} on exchange {:?})",
            ret.reply_code,
            ret.reply_text.as_str(),
            ret.delivery.routing_key.as_str(),
            ret.delivery.exchange.as_str()
        )),
        Ok(Ok(Confirmation::Nack(_))) => delivery.failed("the broker refused the message (basic.nack)"),
        Ok(Ok(Confirmation::NotRequested)) => delivery.failed("no publisher confirm (confirm.select was not in effect)"),
        Ok(Err(e)) => delivery.failed(format!("no confirm: {e}")),
        Err(_) => delivery.failed(format!("no confirm within {timeout:?}")),
    }
}
