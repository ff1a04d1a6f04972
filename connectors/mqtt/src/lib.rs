//! MQTT 3.1.1 and 5 connectors, on rumqttc (`protocol_version: 4 | 5`).
//!
//! - `kind: mqtt` source: QoS 0/1 subscriptions (2 is refused); QoS 1 messages are acknowledged
//!   (PUBACK) only after delivery and **in the order they arrived** (MQTT-4.6.0-2), through the
//!   ordered-ack tracker; a persistent session (`clean_session: false`) makes the broker keep
//!   and resend what was not acknowledged across restarts and disconnects.
//! - `kind: mqtt` sink: QoS 1 publish counts delivered on PUBACK, QoS 2 on PUBCOMP, QoS 0 once
//!   written to the connection.
//!
//! CloudEvents: MQTT 3.1.1 has only the binding's structured mode (the JSON event is the
//! payload); MQTT 5 adds binary mode (user properties and Content Type). Incoming ones are taken
//! as they are in either mode.

pub mod argo;
mod binding;
mod proto;
mod sink;
mod source;

use std::path::PathBuf;
use std::time::Duration;

use rumqttc::QoS;
use serde::Deserialize;

pub use sink::MqttSinkConfig;
pub use source::MqttSourceConfig;

pub(crate) fn default_url() -> String {
    "mqtt://127.0.0.1:1883".into()
}

/// `tls:` for `mqtts://` URLs.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM CA bundle to trust (required: the broker's CA).
    pub ca: Option<PathBuf>,
    /// Client certificate and key, PEM (mTLS).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// `auth:` — username and password.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub username: String,
    #[serde(default)]
    pub password: String,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub(crate) struct Endpoint {
    pub host: String,
    pub port: u16,
    pub tls: bool,
}

/// `mqtt://host[:1883]`, `mqtts://host[:8883]` (`tcp://`, `ssl://` too).
pub(crate) fn parse_url(url: &str) -> Result<Endpoint, String> {
    let bad = || {
        format!("url {url:?} is not an MQTT URL; write mqtt://host:1883 or mqtts://host:8883 (credentials go under auth:)")
    };
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let tls = match scheme {
        "mqtt" | "tcp" => false,
        "mqtts" | "ssl" => true,
        _ => return Err(bad()),
    };
    if rest.contains('@') {
        return Err(format!(
            "url {url:?}: put the username and password under auth:, not in the URL"
        ));
    }
    let hostport = rest.trim_end_matches('/');
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || hostport.starts_with('[') => (
            h.trim_matches(|c| c == '[' || c == ']'),
            p.parse::<u16>().map_err(|_| bad())?,
        ),
        _ => (hostport, if tls { 8883 } else { 1883 }),
    };
    if host.is_empty() || host.contains('/') {
        return Err(bad());
    }
    Ok(Endpoint {
        host: host.to_owned(),
        port,
        tls,
    })
}

pub(crate) fn qos(n: u8) -> Result<QoS, String> {
    match n {
        0 => Ok(QoS::AtMostOnce),
        1 => Ok(QoS::AtLeastOnce),
        2 => Ok(QoS::ExactlyOnce),
        _ => Err(format!("qos {n} is not 0, 1 or 2")),
    }
}

pub(crate) fn check_common(
    url: &str,
    client_id: &str,
    tls: Option<&TlsConfig>,
) -> Result<(), String> {
    let ep = parse_url(url)?;
    if client_id.is_empty() || client_id.len() > 65535 {
        return Err("client_id must not be empty".into());
    }
    match (ep.tls, tls) {
        (true, None) => return Err("mqtts:// needs tls.ca (the broker's CA certificate)".into()),
        (false, Some(_)) => return Err("tls is set but the url is not mqtts://".into()),
        (true, Some(t)) => {
            if t.ca.is_none() {
                return Err("tls.ca is required with mqtts://".into());
            }
            if t.cert.is_some() != t.key.is_some() {
                return Err(
                    "tls.cert and tls.key go together (client certificate and its key)".into(),
                );
            }
        }
        (false, None) => {}
    }
    Ok(())
}

/// `protocol_version`: 4 (MQTT 3.1.1) or 5.
pub(crate) fn check_version(v: u8) -> Result<(), String> {
    match v {
        4 | 5 => Ok(()),
        3 => Err("protocol_version: 3 is MQTT 3.1, which is not supported; 4 is MQTT 3.1.1".into()),
        _ => Err(format!("protocol_version: {v} is not 4 (MQTT 3.1.1) or 5")),
    }
}

/// Reconnect delays: the pull kit's (100 ms doubling, at most 5 s).
pub(crate) fn reconnect_delay(attempt: u32) -> Duration {
    sluice_core::pull::Backoff::RECONNECT.nth(attempt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let e = parse_url("mqtt://127.0.0.1:1883").unwrap();
        assert_eq!((e.host.as_str(), e.port, e.tls), ("127.0.0.1", 1883, false));
        let e = parse_url("mqtts://broker.example").unwrap();
        assert_eq!((e.port, e.tls), (8883, true));
        assert!(parse_url("http://x").is_err());
        assert!(parse_url("mqtt://u:p@h").unwrap_err().contains("auth:"));
        assert!(check_common("mqtts://h", "c", None)
            .unwrap_err()
            .contains("tls.ca"));
        assert!(qos(3).is_err());
    }
}
