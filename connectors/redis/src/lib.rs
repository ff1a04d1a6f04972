//! Redis connectors.
//!
//! - `kind: redis-streams` source: a consumer group (`XREADGROUP`, the count bounded by the
//!   in-flight window), `XACK` only after delivery, failed entries re-claimed after a backoff,
//!   pending entries of dead consumers taken over with `XAUTOCLAIM` after `claim_idle`, this
//!   consumer's own pending entries replayed on start and after every reconnect.
//! - `kind: redis-streams` sink: `XADD` (optionally `MAXLEN ~`), delivered = the entry id Redis
//!   returned.
//! - `kind: redis` source: Pub/Sub channels and patterns. At-most-once by nature (Redis keeps
//!   nothing for a subscriber); messages dropped under backpressure are counted.
//! - `kind: redis` sink: `PUBLISH`.
//!
//! Stream entries carry CloudEvents with the Kafka binding's field names (`ce_id`, `ce_type`,
//! ..., `content-type`) and the data in field `data`; see `entry`.

pub mod argo;
mod entry;
mod pubsub;
mod streams;
mod streams_sink;

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

pub use pubsub::{PubSubSinkConfig, PubSubSourceConfig};
pub use streams::{Start, StreamsSourceConfig};
pub use streams_sink::StreamsSinkConfig;

pub(crate) fn default_url() -> String {
    "redis://127.0.0.1:6379".into()
}

/// `format:` of a Redis source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// CloudEvents carried in the message are taken as they are, other messages are wrapped
    /// (default).
    #[default]
    Cloudevents,
    /// Argo Events' payload shape for the kind (`redis`: `{channel, pattern, body, metadata}`;
    /// `redisStream`: `{stream, message_id, values, metadata}`).
    Argo,
}

/// `tls:` — trust and client certificate for `rediss://` URLs.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM CA bundle to trust instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// Client certificate and key (mTLS), PEM.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// Checks a Redis URL without connecting.
pub(crate) fn check_url(url: &str, tls: Option<&TlsConfig>) -> Result<(), String> {
    use redis::IntoConnectionInfo;
    let info = url.into_connection_info().map_err(|e| {
        format!("url {:?} is not a Redis URL ({e}); write redis://[user:password@]host:port[/db] or rediss://... for TLS", redact(url))
    })?;
    if let Some(t) = tls {
        if !matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
            return Err(
                "tls is set but the url is not rediss://: use rediss:// to connect with TLS".into(),
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

/// A client for `url`, with the certificates of `tls` read from disk.
pub(crate) fn client(url: &str, tls: Option<&TlsConfig>) -> Result<redis::Client, String> {
    let Some(t) = tls else {
        return redis::Client::open(url).map_err(|e| format!("url {}: {e}", redact(url)));
    };
    let read = |p: &PathBuf, what: &str| {
        std::fs::read(p).map_err(|e| format!("tls.{what} {}: {e}", p.display()))
    };
    let root_cert = t.ca.as_ref().map(|p| read(p, "ca")).transpose()?;
    let client_tls = match (&t.cert, &t.key) {
        (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
            client_cert: read(c, "cert")?,
            client_key: read(k, "key")?,
        }),
        _ => None,
    };
    redis::Client::build_with_tls(
        url,
        redis::TlsCertificates {
            client_tls,
            root_cert,
        },
    )
    .map_err(|e| format!("url {}: {e}", redact(url)))
}

/// A multiplexed connection whose commands time out after `response` (`None`: never, for
/// blocking reads that carry their own bound).
pub(crate) async fn connect(
    client: &redis::Client,
    response: Option<Duration>,
) -> Result<redis::aio::MultiplexedConnection, redis::RedisError> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(response);
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// A reconnecting connection whose commands time out after `timeout` (the sinks', and the
/// streams source's control connection).
pub(crate) async fn managed(
    url: &str,
    tls: Option<&TlsConfig>,
    timeout: Duration,
) -> Result<redis::aio::ConnectionManager, String> {
    client(url, tls)?
        .get_connection_manager_with_config(
            redis::aio::ConnectionManagerConfig::new()
                .set_response_timeout(Some(timeout))
                .set_connection_timeout(Some(Duration::from_secs(5))),
        )
        .await
        .map_err(|e| format!("cannot connect to {} ({e}); is Redis up?", redact(url)))
}

/// Sink defaults: commands per pipeline, and how long one may take.
pub(crate) fn default_batch() -> usize {
    500
}
pub(crate) fn five_seconds() -> sluice_core::units::HumanDuration {
    sluice_core::units::HumanDuration::from_secs(5)
}

/// The loop of a pipelining Redis sink: takes up to `batch` events, sends one pipeline with one
/// command per event (`command` writes it), and settles each event from its own reply (`check`:
/// `Ok` delivered, `Err(reason)` failed); a pipeline that fails as a whole (connection lost,
/// timeout, grace period over) fails all of its events. `verb` names the command in reasons.
///
/// One pipeline is sent at a time, so Redis applies the events in the order they were queued.
/// While it waits for its replies, the next one is taken from the queue and its commands are
/// written, so that work overlaps the round trip instead of following it; it is sent only after
/// the replies of the one before.
pub(crate) async fn run_pipelined(
    name: &str,
    verb: &str,
    conn: redis::aio::ConnectionManager,
    mut ctx: sluice_core::SinkContext,
    batch: usize,
    mut command: impl FnMut(&mut redis::Pipeline, &sluice_core::Event),
    check: impl Fn(redis::Value) -> Result<(), String>,
) -> Result<(), sluice_core::ConnectorError> {
    use sluice_core::SinkItem;
    let new_pipe = || {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe
    };
    // The events of the pipeline in flight, and those taken to follow it with their commands
    // in `next` (written as they arrive, up to `batch`).
    let mut items: Vec<SinkItem> = Vec::with_capacity(batch);
    let mut following: Vec<SinkItem> = Vec::with_capacity(batch);
    let mut next = new_pipe();
    // The queue is closed and drained: nothing follows what has been taken.
    let mut input_done = false;
    loop {
        if following.is_empty() {
            // Nothing was taken while the last pipeline was in flight: wait for events.
            if input_done {
                break;
            }
            let n = tokio::select! {
                n = ctx.input.recv_many(&mut following, batch) => n,
                _ = ctx.grace_over.cancelled() => 0,
            };
            if n == 0 {
                break;
            }
            for item in &following {
                command(&mut next, &item.event);
            }
        }
        std::mem::swap(&mut items, &mut following);
        let pipe = std::mem::replace(&mut next, new_pipe());
        let mut c = conn.clone();
        let send = async move {
            pipe.query_async::<Vec<redis::RedisResult<redis::Value>>>(&mut c)
                .await
        };
        tokio::pin!(send);
        let replies = loop {
            let room = batch - following.len();
            tokio::select! {
                biased;
                r = &mut send => break r,
                _ = ctx.grace_over.cancelled() => break Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "shutdown grace period over",
                ))),
                n = ctx.input.recv_many(&mut following, room), if room > 0 && !input_done => {
                    if n == 0 {
                        input_done = true;
                    }
                    for item in &following[following.len() - n..] {
                        command(&mut next, &item.event);
                    }
                }
            }
        };
        match replies {
            Ok(replies) => {
                let mut replies = replies.into_iter();
                for SinkItem { delivery, .. } in items.drain(..) {
                    match replies.next() {
                        Some(Ok(v)) => match check(v) {
                            Ok(()) => delivery.delivered(),
                            Err(reason) => delivery.failed(reason),
                        },
                        Some(Err(e)) => delivery.failed(format!("{verb} failed: {e}")),
                        None => delivery.failed(format!("{verb}: no reply")),
                    }
                }
            }
            Err(e) => {
                tracing::warn!(sink = %name, events = items.len(), error = %e, "redis: {verb} pipeline failed");
                for SinkItem { delivery, .. } in items.drain(..) {
                    delivery.failed(format!("{verb} failed: {e}"));
                }
            }
        }
        if ctx.grace_over.is_cancelled() {
            // The grace period is over: what was taken to follow is not sent.
            for SinkItem { delivery, .. } in following.drain(..) {
                delivery.failed("shutdown grace period over".to_owned());
            }
            break;
        }
    }
    tracing::debug!(sink = %name, "redis: stopped");
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
    fn urls_are_checked_and_passwords_redacted() {
        assert!(check_url("redis://127.0.0.1:6379/0", None).is_ok());
        assert!(check_url("rediss://h:6380", Some(&TlsConfig::default())).is_ok());
        let e = check_url("http://h", None).unwrap_err();
        assert!(e.contains("not a Redis URL"), "{e}");
        let e = check_url("redis://h", Some(&TlsConfig::default())).unwrap_err();
        assert!(e.contains("rediss://"), "{e}");
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
