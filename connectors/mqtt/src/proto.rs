//! The two MQTT protocol versions behind one small interface, so that the source and the sink
//! are written once: rumqttc has a separate client for 3.1.1 (`rumqttc`) and for 5
//! (`rumqttc::v5`), with the same shape and different types.

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::Outgoing;

use crate::{parse_url, AuthConfig, TlsConfig};

/// What a connection needs, whatever the version.
pub(crate) struct Settings<'a> {
    pub url: &'a str,
    pub client_id: &'a str,
    pub keep_alive: Duration,
    /// 3.1.1 clean session / 5 clean start; with 5, `false` also asks the broker to keep the
    /// session after a disconnect (session expiry), which 3.1.1 does by itself.
    pub clean: bool,
    pub session_expiry: Duration,
    pub auth: Option<&'a AuthConfig>,
    pub tls: Option<&'a TlsConfig>,
    pub manual_acks: bool,
}

/// One thing the connection did, as the connectors need it.
pub(crate) enum Polled<P> {
    Publish(P),
    ConnAck {
        session_present: bool,
        /// The broker refused the connection (5 only reports it as a packet).
        refused: Option<String>,
    },
    SubAck {
        /// The index of the first refused filter.
        failed: Option<usize>,
    },
    /// A publish went out with this packet id (0 for QoS 0).
    Sent(u16),
    /// PUBACK or PUBCOMP for a packet id; `refused`: 5's reason code said no.
    Acked {
        pkid: u16,
        refused: Option<Refusal>,
    },
    Disconnected,
    Other,
}

/// An MQTT 5 broker's "no" to a publish.
pub(crate) struct Refusal {
    pub why: String,
    /// Sending it again cannot help (not authorized, an invalid topic or payload).
    pub permanent: bool,
}

/// Why polling stopped.
pub(crate) enum PollError {
    /// The client asked for the disconnect (or every handle is gone).
    Done,
    Lost(String),
}

/// A received message, read the same way in both versions.
pub(crate) struct View<'a> {
    pub topic: Cow<'a, str>,
    pub payload: &'a Bytes,
    pub qos: u8,
    pub dup: bool,
    pub pkid: u16,
    /// 5's Content Type property.
    pub content_type: Option<&'a str>,
    /// 5's user properties.
    pub user_properties: &'a [(String, String)],
}

/// What a publish carries besides topic and payload (5 only; 3.1.1 drops it).
#[derive(Default)]
pub(crate) struct Props {
    pub content_type: Option<String>,
    pub user_properties: Vec<(String, String)>,
}

/// The longest string MQTT writes (a two-byte length). rumqttc writes a longer one's length
/// modulo 65 536 without a word, so the broker reads a shorter topic and takes the rest for
/// the next fields: a topic built from an event could escape its template that way.
pub(crate) const MAX_STRING: usize = u16::MAX as usize;

impl Props {
    /// Why these properties cannot be written, if a string is longer than MQTT allows.
    pub(crate) fn too_long(&self) -> Option<String> {
        let over = |what: &str, s: &str| {
            (s.len() > MAX_STRING).then(|| {
                format!(
                    "{what} is {} bytes; MQTT strings hold at most 65535",
                    s.len()
                )
            })
        };
        self.content_type
            .as_deref()
            .and_then(|c| over("the content type", c))
            .or_else(|| {
                self.user_properties.iter().find_map(|(k, v)| {
                    over("a user property name", k)
                        .or_else(|| over(&format!("user property {k:?}"), v))
                })
            })
    }
}

pub(crate) trait Proto: Send + Sync + 'static {
    type Client: Clone + Send + Sync + 'static;
    type EventLoop: Send + 'static;
    type Publish: Send + Sync + 'static;
    type Options: Clone + Send + Sync + 'static;
    /// 4 (3.1.1) or 5.
    const VERSION: u8;

    fn options(s: &Settings<'_>) -> Result<Self::Options, String>;
    /// Publishes awaiting their acknowledgement, at most.
    fn set_inflight(o: &mut Self::Options, n: u16);
    fn client(o: Self::Options, cap: usize) -> (Self::Client, Self::EventLoop);
    fn poll(
        el: &mut Self::EventLoop,
    ) -> impl Future<Output = Result<Polled<Self::Publish>, PollError>> + Send;
    fn subscribe(
        c: &Self::Client,
        filters: Vec<(String, u8)>,
    ) -> impl Future<Output = Result<(), String>> + Send;
    fn try_unsubscribe(c: &Self::Client, filter: String);
    fn ack(c: &Self::Client, p: &Self::Publish) -> impl Future<Output = Result<(), String>> + Send;
    /// Queues the acknowledgement without waiting: `false` when the client's request queue is
    /// full (or its connection task is gone).
    fn try_ack(c: &Self::Client, p: &Self::Publish) -> bool;
    /// What acknowledging `p` needs (its packet id and QoS), without its topic and payload: an
    /// acknowledgement waiting to be queued holds no message memory.
    fn ack_token(p: &Self::Publish) -> Self::Publish;
    fn disconnect(c: &Self::Client) -> impl Future<Output = ()> + Send;
    fn publish(
        c: &Self::Client,
        topic: String,
        qos: u8,
        retain: bool,
        payload: Bytes,
        props: Props,
    ) -> impl Future<Output = Result<(), String>> + Send;
    fn view(p: &Self::Publish) -> View<'_>;
}

fn transport(tls: Option<&TlsConfig>) -> Result<Option<rumqttc::Transport>, String> {
    let Some(t) = tls else {
        return Ok(None);
    };
    let read = |p: &std::path::PathBuf, what: &str| {
        std::fs::read(p).map_err(|e| format!("tls.{what} {}: {e}", p.display()))
    };
    let ca = read(t.ca.as_ref().ok_or("tls.ca is required")?, "ca")?;
    let client_auth = match (&t.cert, &t.key) {
        (Some(c), Some(k)) => Some((read(c, "cert")?, read(k, "key")?)),
        _ => None,
    };
    Ok(Some(rumqttc::Transport::Tls(
        rumqttc::TlsConfiguration::Simple {
            ca,
            alpn: None,
            client_auth,
        },
    )))
}

/// MQTT 3.1.1.
pub(crate) struct V4;

fn qos4(n: u8) -> rumqttc::QoS {
    match n {
        0 => rumqttc::QoS::AtMostOnce,
        2 => rumqttc::QoS::ExactlyOnce,
        _ => rumqttc::QoS::AtLeastOnce,
    }
}

impl Proto for V4 {
    type Client = rumqttc::AsyncClient;
    type EventLoop = rumqttc::EventLoop;
    type Publish = rumqttc::Publish;
    type Options = rumqttc::MqttOptions;
    const VERSION: u8 = 4;

    fn options(s: &Settings<'_>) -> Result<Self::Options, String> {
        let ep = parse_url(s.url)?;
        let mut o = rumqttc::MqttOptions::new(s.client_id, ep.host, ep.port);
        o.set_keep_alive(s.keep_alive.max(Duration::from_secs(5)));
        o.set_clean_session(s.clean);
        o.set_max_packet_size(16 << 20, 16 << 20);
        o.set_manual_acks(s.manual_acks);
        if let Some(a) = s.auth {
            o.set_credentials(a.username.clone(), a.password.clone());
        }
        if let Some(t) = transport(s.tls)? {
            o.set_transport(t);
        }
        Ok(o)
    }

    fn set_inflight(o: &mut Self::Options, n: u16) {
        o.set_inflight(n);
    }

    fn client(o: Self::Options, cap: usize) -> (Self::Client, Self::EventLoop) {
        rumqttc::AsyncClient::new(o, cap)
    }

    async fn poll(el: &mut Self::EventLoop) -> Result<Polled<Self::Publish>, PollError> {
        use rumqttc::{Event, Packet};
        match el.poll().await {
            Ok(Event::Incoming(Packet::Publish(p))) => Ok(Polled::Publish(p)),
            Ok(Event::Incoming(Packet::ConnAck(a))) => Ok(Polled::ConnAck {
                session_present: a.session_present,
                refused: None,
            }),
            Ok(Event::Incoming(Packet::SubAck(a))) => Ok(Polled::SubAck {
                failed: a
                    .return_codes
                    .iter()
                    .position(|c| matches!(c, rumqttc::SubscribeReasonCode::Failure)),
            }),
            Ok(Event::Incoming(Packet::PubAck(a))) => Ok(Polled::Acked {
                pkid: a.pkid,
                refused: None,
            }),
            Ok(Event::Incoming(Packet::PubComp(a))) => Ok(Polled::Acked {
                pkid: a.pkid,
                refused: None,
            }),
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => Ok(Polled::Sent(pkid)),
            Ok(Event::Outgoing(Outgoing::Disconnect)) => Ok(Polled::Disconnected),
            Ok(_) => Ok(Polled::Other),
            Err(rumqttc::ConnectionError::RequestsDone) => Err(PollError::Done),
            Err(e) => Err(PollError::Lost(e.to_string())),
        }
    }

    async fn subscribe(c: &Self::Client, filters: Vec<(String, u8)>) -> Result<(), String> {
        c.subscribe_many(
            filters
                .into_iter()
                .map(|(f, q)| rumqttc::SubscribeFilter::new(f, qos4(q))),
        )
        .await
        .map_err(|e| e.to_string())
    }

    fn try_unsubscribe(c: &Self::Client, filter: String) {
        let _ = c.try_unsubscribe(filter);
    }

    async fn ack(c: &Self::Client, p: &Self::Publish) -> Result<(), String> {
        c.ack(p).await.map_err(|e| e.to_string())
    }

    fn try_ack(c: &Self::Client, p: &Self::Publish) -> bool {
        c.try_ack(p).is_ok()
    }

    fn ack_token(p: &Self::Publish) -> Self::Publish {
        rumqttc::Publish {
            dup: p.dup,
            qos: p.qos,
            retain: p.retain,
            topic: String::new(),
            pkid: p.pkid,
            payload: Bytes::new(),
        }
    }

    async fn disconnect(c: &Self::Client) {
        let _ = c.disconnect().await;
    }

    async fn publish(
        c: &Self::Client,
        topic: String,
        qos: u8,
        retain: bool,
        payload: Bytes,
        _props: Props,
    ) -> Result<(), String> {
        c.publish_bytes(topic, qos4(qos), retain, payload)
            .await
            .map_err(|e| e.to_string())
    }

    fn view(p: &Self::Publish) -> View<'_> {
        View {
            topic: Cow::Borrowed(p.topic.as_str()),
            payload: &p.payload,
            qos: p.qos as u8,
            dup: p.dup,
            pkid: p.pkid,
            content_type: None,
            user_properties: &[],
        }
    }
}

/// MQTT 5.
pub(crate) struct V5;

fn qos5(n: u8) -> rumqttc::v5::mqttbytes::QoS {
    use rumqttc::v5::mqttbytes::QoS;
    match n {
        0 => QoS::AtMostOnce,
        2 => QoS::ExactlyOnce,
        _ => QoS::AtLeastOnce,
    }
}

impl Proto for V5 {
    type Client = rumqttc::v5::AsyncClient;
    type EventLoop = rumqttc::v5::EventLoop;
    type Publish = rumqttc::v5::mqttbytes::v5::Publish;
    type Options = rumqttc::v5::MqttOptions;
    const VERSION: u8 = 5;

    fn options(s: &Settings<'_>) -> Result<Self::Options, String> {
        let ep = parse_url(s.url)?;
        let mut o = rumqttc::v5::MqttOptions::new(s.client_id, ep.host, ep.port);
        o.set_keep_alive(s.keep_alive.max(Duration::from_secs(5)));
        o.set_clean_start(s.clean);
        if !s.clean {
            // 5 ends a session at the disconnect unless asked to keep it.
            o.set_session_expiry_interval(Some(
                u32::try_from(s.session_expiry.as_secs()).unwrap_or(u32::MAX),
            ));
        }
        o.set_max_packet_size(Some(16 << 20));
        o.set_manual_acks(s.manual_acks);
        if let Some(a) = s.auth {
            o.set_credentials(a.username.clone(), a.password.clone());
        }
        if let Some(t) = transport(s.tls)? {
            o.set_transport(t);
        }
        Ok(o)
    }

    fn set_inflight(o: &mut Self::Options, n: u16) {
        o.set_outgoing_inflight_upper_limit(n);
    }

    fn client(o: Self::Options, cap: usize) -> (Self::Client, Self::EventLoop) {
        rumqttc::v5::AsyncClient::new(o, cap)
    }

    async fn poll(el: &mut Self::EventLoop) -> Result<Polled<Self::Publish>, PollError> {
        use rumqttc::v5::mqttbytes::v5::{
            ConnectReturnCode, Packet, PubAckReason, PubCompReason, PubRecReason,
            SubscribeReasonCode,
        };
        use rumqttc::v5::Event;
        match el.poll().await {
            Ok(Event::Incoming(Packet::Publish(p))) => Ok(Polled::Publish(p)),
            Ok(Event::Incoming(Packet::ConnAck(a))) => Ok(Polled::ConnAck {
                session_present: a.session_present,
                refused: (a.code != ConnectReturnCode::Success)
                    .then(|| format!("the broker refused the connection: {:?}", a.code)),
            }),
            Ok(Event::Incoming(Packet::SubAck(a))) => Ok(Polled::SubAck {
                failed: a
                    .return_codes
                    .iter()
                    .position(|c| !matches!(c, SubscribeReasonCode::Success(_))),
            }),
            Ok(Event::Incoming(Packet::PubAck(a))) => Ok(Polled::Acked {
                pkid: a.pkid,
                // No subscriber is not a refusal: the broker took the message.
                refused: (!matches!(
                    a.reason,
                    PubAckReason::Success | PubAckReason::NoMatchingSubscribers
                ))
                .then(|| Refusal {
                    why: format!("the broker refused it: {:?}", a.reason),
                    permanent: matches!(
                        a.reason,
                        PubAckReason::NotAuthorized
                            | PubAckReason::TopicNameInvalid
                            | PubAckReason::PayloadFormatInvalid
                    ),
                }),
            }),
            // QoS 2: a refusal comes in the PUBREC (rumqttc then ends the exchange there).
            Ok(Event::Incoming(Packet::PubRec(a)))
                if !matches!(
                    a.reason,
                    PubRecReason::Success | PubRecReason::NoMatchingSubscribers
                ) =>
            {
                Ok(Polled::Acked {
                    pkid: a.pkid,
                    refused: Some(Refusal {
                        why: format!("the broker refused it: {:?}", a.reason),
                        permanent: matches!(
                            a.reason,
                            PubRecReason::NotAuthorized
                                | PubRecReason::TopicNameInvalid
                                | PubRecReason::PayloadFormatInvalid
                        ),
                    }),
                })
            }
            Ok(Event::Incoming(Packet::PubComp(a))) => Ok(Polled::Acked {
                pkid: a.pkid,
                refused: (a.reason != PubCompReason::Success).then(|| Refusal {
                    why: format!("the broker lost the exchange: {:?}", a.reason),
                    permanent: false,
                }),
            }),
            Ok(Event::Incoming(Packet::Disconnect(d))) => Err(PollError::Lost(format!(
                "the broker disconnected: {:?}",
                d.reason_code
            ))),
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => Ok(Polled::Sent(pkid)),
            Ok(Event::Outgoing(Outgoing::Disconnect)) => Ok(Polled::Disconnected),
            Ok(_) => Ok(Polled::Other),
            Err(rumqttc::v5::ConnectionError::RequestsDone) => Err(PollError::Done),
            Err(e) => Err(PollError::Lost(e.to_string())),
        }
    }

    async fn subscribe(c: &Self::Client, filters: Vec<(String, u8)>) -> Result<(), String> {
        c.subscribe_many(
            filters
                .into_iter()
                .map(|(f, q)| rumqttc::v5::mqttbytes::v5::Filter::new(f, qos5(q))),
        )
        .await
        .map_err(|e| e.to_string())
    }

    fn try_unsubscribe(c: &Self::Client, filter: String) {
        let _ = c.try_unsubscribe(filter);
    }

    async fn ack(c: &Self::Client, p: &Self::Publish) -> Result<(), String> {
        c.ack(p).await.map_err(|e| e.to_string())
    }

    fn try_ack(c: &Self::Client, p: &Self::Publish) -> bool {
        c.try_ack(p).is_ok()
    }

    fn ack_token(p: &Self::Publish) -> Self::Publish {
        rumqttc::v5::mqttbytes::v5::Publish {
            dup: p.dup,
            qos: p.qos,
            retain: p.retain,
            topic: Bytes::new(),
            pkid: p.pkid,
            payload: Bytes::new(),
            properties: None,
        }
    }

    async fn disconnect(c: &Self::Client) {
        let _ = c.disconnect().await;
    }

    async fn publish(
        c: &Self::Client,
        topic: String,
        qos: u8,
        retain: bool,
        payload: Bytes,
        props: Props,
    ) -> Result<(), String> {
        let properties = rumqttc::v5::mqttbytes::v5::PublishProperties {
            content_type: props.content_type,
            user_properties: props.user_properties,
            ..Default::default()
        };
        c.publish_bytes_with_properties(topic, qos5(qos), retain, payload, properties)
            .await
            .map_err(|e| e.to_string())
    }

    fn view(p: &Self::Publish) -> View<'_> {
        let props = p.properties.as_ref();
        View {
            topic: String::from_utf8_lossy(&p.topic),
            payload: &p.payload,
            qos: p.qos as u8,
            dup: p.dup,
            pkid: p.pkid,
            content_type: props.and_then(|p| p.content_type.as_deref()),
            user_properties: props.map(|p| p.user_properties.as_slice()).unwrap_or(&[]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_longer_than_mqtt_strings_are_named() {
        let mut p = Props::default();
        assert_eq!(p.too_long(), None);
        p.user_properties
            .push(("ok".into(), "v".repeat(MAX_STRING)));
        assert_eq!(p.too_long(), None);
        p.user_properties
            .push(("ce_x".into(), "v".repeat(MAX_STRING + 1)));
        assert!(p
            .too_long()
            .unwrap()
            .contains("user property \"ce_x\" is 65536 bytes"));
        let p = Props {
            content_type: Some("t".repeat(70_000)),
            ..Props::default()
        };
        assert!(p.too_long().unwrap().contains("content type"));
    }
}
