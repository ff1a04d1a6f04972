//! AMQP 0-9-1 connectors (RabbitMQ), on lapin.
//!
//! - `kind: amqp` source: a consumer with manual acknowledgements; `prefetch` is the window;
//!   `basic.ack` only after delivery, coalesced with `multiple` over the delivered prefix;
//!   `basic.nack` with requeue after a delay on failure (no hot requeue loop); `basic.reject`
//!   without requeue when a sink rejects the event or it is not a valid CloudEvent (the queue's
//!   dead-letter exchange takes it); reconnect with backoff and declare again.
//! - `kind: amqp` sink: publisher confirms; delivered = the broker's ack; with `mandatory`, a
//!   message the broker returns (no queue bound) is a failure.

pub mod argo;
mod binding;
mod sink;
mod source;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use serde::Deserialize;

pub use binding::Mode;
pub use sink::AmqpSinkConfig;
pub use source::AmqpSourceConfig;

pub(crate) fn default_url() -> String {
    "amqp://guest:guest@127.0.0.1:5672/%2f".into()
}

/// `tls:` for `amqps://` URLs.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM CA bundle to trust instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// Client certificate and key, PEM (mTLS; with `?auth_mechanism=external` in the URL the
    /// broker takes the user from the certificate).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// An exchange to declare.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExchangeDecl {
    pub name: String,
    /// `direct`, `fanout`, `topic` (default), `headers`, or a plugin's type.
    #[serde(rename = "type", default = "topic")]
    pub kind: String,
    #[serde(default = "yes")]
    pub durable: bool,
    #[serde(default)]
    pub auto_delete: bool,
    #[serde(default)]
    pub arguments: BTreeMap<String, serde_json::Value>,
}

/// How the source's queue is declared.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueDecl {
    #[serde(default = "yes")]
    pub durable: bool,
    #[serde(default)]
    pub exclusive: bool,
    #[serde(default)]
    pub auto_delete: bool,
    /// `x-queue-type: quorum`, `x-dead-letter-exchange: dlx`, `x-message-ttl: 60000`, ...
    #[serde(default)]
    pub arguments: BTreeMap<String, serde_json::Value>,
}

/// A binding of the source's queue to an exchange.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingDecl {
    pub exchange: String,
    /// Default `#` (everything, on a topic exchange).
    #[serde(default = "hash")]
    pub routing_key: String,
    #[serde(default)]
    pub arguments: BTreeMap<String, serde_json::Value>,
}

/// `declare:` — what the source declares before consuming (again after every reconnect).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Declare {
    /// Declare the queue with these settings (else it must exist).
    pub queue: Option<QueueDecl>,
    #[serde(default)]
    pub exchanges: Vec<ExchangeDecl>,
    /// Bindings of the queue. An exchange named here but not under `exchanges` must exist, or is
    /// created as a durable topic exchange.
    #[serde(default)]
    pub bindings: Vec<BindingDecl>,
}

fn topic() -> String {
    "topic".into()
}
fn yes() -> bool {
    true
}
fn hash() -> String {
    "#".into()
}

pub(crate) fn exchange_kind(k: &str) -> ExchangeKind {
    match k {
        "direct" => ExchangeKind::Direct,
        "fanout" => ExchangeKind::Fanout,
        "topic" => ExchangeKind::Topic,
        "headers" => ExchangeKind::Headers,
        other => ExchangeKind::Custom(other.to_owned()),
    }
}

/// Arguments from the config as an AMQP field table.
pub(crate) fn field_table(
    args: &BTreeMap<String, serde_json::Value>,
) -> Result<FieldTable, String> {
    let mut t = FieldTable::default();
    for (k, v) in args {
        let value = match v {
            serde_json::Value::String(s) => {
                AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
            }
            serde_json::Value::Bool(b) => AMQPValue::Boolean(*b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => AMQPValue::LongLongInt(i),
                None => AMQPValue::Double(n.as_f64().unwrap_or_default()),
            },
            other => {
                return Err(format!(
                    "argument {k}: {other} is not a string, number or boolean"
                ))
            }
        };
        t.insert(ShortString::from(k.as_str()), value);
    }
    Ok(t)
}

/// Checks an AMQP URL without connecting.
pub(crate) fn check_url(url: &str, tls: Option<&TlsConfig>) -> Result<(), String> {
    let uri: lapin::uri::AMQPUri = url.parse().map_err(|e| {
        format!(
            "url {:?} is not an AMQP URL ({e}); write amqp://user:password@host:5672/vhost (vhost / is %2f)",
            redact(url)
        )
    })?;
    if let Some(t) = tls {
        if uri.scheme != lapin::uri::AMQPScheme::AMQPS {
            return Err(
                "tls is set but the url is not amqps://: use amqps:// to connect with TLS".into(),
            );
        }
        if t.cert.is_some() != t.key.is_some() {
            return Err("tls.cert and tls.key go together (client certificate and its key)".into());
        }
    }
    Ok(())
}

/// The URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_owned(),
    }
}

/// The largest frame asked for: 128 KiB, RabbitMQ's default.
const MAX_FRAME: u32 = 128 << 10;

/// Connects (bounded by 10 s), with the certificates of `tls` read from disk.
pub(crate) async fn connect(
    url: &str,
    tls: Option<&TlsConfig>,
    name: &str,
) -> Result<Connection, String> {
    let props =
        ConnectionProperties::default().with_connection_name(format!("sluice/{name}").into());
    let mut uri: lapin::uri::AMQPUri = url
        .parse()
        .map_err(|e| format!("url {:?}: {e}", redact(url)))?;
    // lapin parses a message's header tables by recursion on its I/O thread, about 1.4 KB of
    // stack per level of nesting; a frame bounds the nesting (5 bytes a level). Frames of at
    // most 128 KiB (RabbitMQ's default) keep a message within the I/O thread's 64 MiB stack
    // (`src/main.rs`) whatever the broker allows.
    // (0 would mean "whatever the server says".)
    uri.query.frame_max = Some(match uri.query.frame_max {
        Some(f) if f > 0 => f.min(MAX_FRAME),
        _ => MAX_FRAME,
    });
    let connecting = async {
        match tls {
            None => Connection::connect_uri(uri, props)
                .await
                .map_err(|e| e.to_string()),
            Some(t) => {
                let read = |p: &PathBuf, what: &str| {
                    std::fs::read(p).map_err(|e| format!("tls.{what} {}: {e}", p.display()))
                };
                let cert_chain = match &t.ca {
                    Some(p) => Some(
                        String::from_utf8(read(p, "ca")?)
                            .map_err(|_| "tls.ca is not PEM text".to_string())?,
                    ),
                    None => None,
                };
                let identity = match (&t.cert, &t.key) {
                    (Some(c), Some(k)) => Some(lapin::tcp::OwnedIdentity::PKCS8 {
                        pem: read(c, "cert")?,
                        key: read(k, "key")?,
                    }),
                    _ => None,
                };
                let runtime = lapin::runtime::default_runtime().map_err(|e| e.to_string())?;
                Connection::connect_uri_with_config(
                    uri,
                    props,
                    lapin::tcp::OwnedTLSConfig {
                        identity,
                        cert_chain,
                    },
                    runtime,
                )
                .await
                .map_err(|e| e.to_string())
            }
        }
    };
    match tokio::time::timeout(Duration::from_secs(10), connecting).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!(
            "cannot connect to {} ({e}); is the broker up, and are the credentials right?",
            redact(url)
        )),
        Err(_) => Err(format!(
            "cannot connect to {} within 10s; is the broker up?",
            redact(url)
        )),
    }
}

pub(crate) async fn declare_exchange(ch: &Channel, x: &ExchangeDecl) -> Result<(), String> {
    ch.exchange_declare(
        ShortString::from(x.name.as_str()),
        exchange_kind(&x.kind),
        ExchangeDeclareOptions {
            durable: x.durable,
            auto_delete: x.auto_delete,
            ..Default::default()
        },
        field_table(&x.arguments)?,
    )
    .await
    .map_err(|e| {
        format!(
            "cannot declare exchange {} ({e}); if it exists with other settings, match them",
            x.name
        )
    })
}

/// Declares what `d` names for `queue` on `conn`.
pub(crate) async fn declare(conn: &Connection, queue: &str, d: &Declare) -> Result<(), String> {
    let ch = conn
        .create_channel()
        .await
        .map_err(|e| format!("cannot open a channel: {e}"))?;
    for x in &d.exchanges {
        declare_exchange(&ch, x).await?;
    }
    if let Some(q) = &d.queue {
        ch.queue_declare(
            ShortString::from(queue),
            QueueDeclareOptions {
                durable: q.durable,
                exclusive: q.exclusive,
                auto_delete: q.auto_delete,
                ..Default::default()
            },
            field_table(&q.arguments)?,
        )
        .await
        .map_err(|e| {
            format!(
                "cannot declare queue {queue} ({e}); if it exists with other arguments, match them"
            )
        })?;
    }
    for b in &d.bindings {
        if !d.exchanges.iter().any(|x| x.name == b.exchange) {
            // Exists? A passive declare fails (and closes its channel) when it does not.
            let probe = conn
                .create_channel()
                .await
                .map_err(|e| format!("cannot open a channel: {e}"))?;
            let exists = probe
                .exchange_declare(
                    ShortString::from(b.exchange.as_str()),
                    ExchangeKind::Topic,
                    ExchangeDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .is_ok();
            let _ = probe.close(200, "".into()).await;
            if !exists {
                declare_exchange(
                    &ch,
                    &ExchangeDecl {
                        name: b.exchange.clone(),
                        kind: topic(),
                        durable: true,
                        auto_delete: false,
                        arguments: BTreeMap::new(),
                    },
                )
                .await?;
            }
        }
        ch.queue_bind(
            ShortString::from(queue),
            ShortString::from(b.exchange.as_str()),
            ShortString::from(b.routing_key.as_str()),
            QueueBindOptions::default(),
            field_table(&b.arguments)?,
        )
        .await
        .map_err(|e| format!("cannot bind queue {queue} to exchange {} ({e})", b.exchange))?;
    }
    let _ = ch.close(200, "".into()).await;
    Ok(())
}

/// Reconnect delays: the pull kit's (100 ms doubling, at most 5 s).
pub(crate) fn reconnect_delay(attempt: u32) -> Duration {
    sluice_core::pull::Backoff::RECONNECT.nth(attempt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_arguments() {
        assert!(check_url("amqp://guest:guest@127.0.0.1:5672/%2f", None).is_ok());
        assert!(check_url("amqps://h/%2f", Some(&TlsConfig::default())).is_ok());
        assert!(check_url("amqp://h/%2f", Some(&TlsConfig::default()))
            .unwrap_err()
            .contains("amqps://"));
        assert!(check_url("http://h", None)
            .unwrap_err()
            .contains("not an AMQP URL"));
        assert_eq!(redact("amqp://u:p@h:1/%2f"), "amqp://***@h:1/%2f");
        let mut a = BTreeMap::new();
        a.insert("x-queue-type".to_string(), serde_json::json!("quorum"));
        a.insert("x-message-ttl".to_string(), serde_json::json!(60000));
        let t = field_table(&a).unwrap();
        assert_eq!(t.inner().len(), 2);
        a.insert("bad".to_string(), serde_json::json!([1]));
        assert!(field_table(&a).is_err());
    }

    #[test]
    fn a_sink_names_longer_than_a_short_string_are_refused_at_validate() {
        use sluice_core::SinkConfig;
        let sink = |extra: serde_json::Value| {
            let mut cfg = serde_json::json!({ "exchange": "events" });
            cfg.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            serde_json::from_value::<sink::AmqpSinkConfig>(cfg).unwrap()
        };
        assert!(sink(serde_json::json!({})).validate("out").is_ok());
        let long = "e".repeat(256);
        let err = sink(serde_json::json!({ "exchange": long }))
            .validate("out")
            .unwrap_err();
        assert!(err.contains("exchange is 256 bytes"), "{err}");
        let err = sink(serde_json::json!({ "routing_key": long }))
            .validate("out")
            .unwrap_err();
        assert!(err.contains("routing_key is 256 bytes"), "{err}");
        // A template is checked per event (the event is refused, the sink goes on).
        assert!(
            sink(serde_json::json!({ "routing_key": format!("{long}.{{type}}") }))
                .validate("out")
                .is_ok()
        );
    }
}
