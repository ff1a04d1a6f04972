//! `kind: pubsub` sink: `Publish` calls of up to `max_batch` events, several in flight; an
//! event is delivered when the server returned its message id.

use std::sync::Arc;
use std::time::Duration;

use gcloud_pubsub::publisher::{Publisher, PublisherConfig};
use google_cloud_gax::grpc::Code;
use google_cloud_googleapis::pubsub::v1::PubsubMessage;
use sluice_core::pipeline::{SinkWindow, Step};
use sluice_core::template::Template;
use sluice_core::{BoxFuture, ConnectorError, Running, SinkConfig, SinkContext, SinkItem};

use crate::binding::{self, Mode};
use crate::{api_call, resource_id, PubSubSinkConfig};

/// One Publish request stays under this many bytes of message data and attributes (Pub/Sub's
/// limit is 10 MB per request).
const MAX_REQUEST_BYTES: usize = 9 * 1024 * 1024;

impl SinkConfig for PubSubSinkConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        self.check()
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("pubsub sink {name}: {m}"));
            self.check().map_err(err)?;
            let topic_id = resource_id("topic", "topics", &self.topic, &self.project)
                .map_err(err)?
                .to_owned();
            let client = self.connection().client().await.map_err(err)?;
            let topic = client.topic(&topic_id);
            // Proves the topic exists and the credentials reach it.
            match topic.exists(None).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(err(format!(
                        "topic {} does not exist: create it first",
                        topic.fully_qualified_name()
                    )))
                }
                Err(s) => {
                    return Err(err(format!(
                    "cannot read topic {} ({}: {}); may these credentials call pubsub.topics.get?",
                    topic.fully_qualified_name(),
                    s.code(),
                    s.message()
                )))
                }
            }
            let ordering_key = self
                .ordering_key
                .as_deref()
                .map(|t| Template::parse("ordering_key", t))
                .transpose()
                .map_err(err)?;
            // Only `publish_immediately` is used (our own batches): one worker, idle.
            let publisher = topic.new_publisher(Some(PublisherConfig {
                workers: 1,
                ..PublisherConfig::default()
            }));
            // Events of one ordering key go out in order only if one call for them is in
            // flight at a time.
            let concurrency = if ordering_key.is_some() {
                1
            } else {
                self.concurrency
            };
            let sink = Sink {
                name: name.clone(),
                publisher,
                mode: self.mode,
                ordering_key: ordering_key.map(Arc::new),
                timeout: self.timeout.get(),
            };
            tracing::info!(sink = %name, topic = %topic.fully_qualified_name(), "pubsub: ready");
            Ok(Box::pin(sink.run(ctx, self.max_batch, concurrency)) as Running)
        })
    }
}

struct Sink {
    name: String,
    publisher: Publisher,
    mode: Mode,
    ordering_key: Option<Arc<Template>>,
    timeout: Duration,
}

impl Sink {
    async fn run(
        mut self,
        mut ctx: SinkContext,
        max_batch: usize,
        concurrency: usize,
    ) -> Result<(), ConnectorError> {
        let mut window = SinkWindow::new(concurrency);
        let mut buf: Vec<SinkItem> = Vec::with_capacity(max_batch);
        loop {
            match window
                .step(&ctx.grace_over, true, |_| {
                    ctx.input.recv_many(&mut buf, max_batch)
                })
                .await
            {
                Step::Input(0) => {
                    window.drain_until(&ctx.grace_over).await;
                    break;
                }
                Step::Input(_) => {
                    let mut batch = Vec::with_capacity(buf.len());
                    let mut bytes = 0;
                    for item in buf.drain(..) {
                        let m = self.message(&item);
                        // Pub/Sub refuses a whole Publish for one message over its limits:
                        // such a message is refused alone, before it can take a batch down.
                        if let Some(why) = over_limits(&m) {
                            item.delivery
                                .rejected(format!("pubsub sink {}: {why}", self.name));
                            continue;
                        }
                        let size = m.data.len()
                            + m.attributes
                                .iter()
                                .map(|(k, v)| k.len() + v.len())
                                .sum::<usize>();
                        if !batch.is_empty() && bytes + size > MAX_REQUEST_BYTES {
                            window.push(self.publish(std::mem::take(&mut batch)));
                            bytes = 0;
                        }
                        bytes += size;
                        batch.push((item, m));
                    }
                    if !batch.is_empty() {
                        window.push(self.publish(batch));
                    }
                }
                Step::Settled | Step::Idle => {}
                Step::GraceOver => break,
            }
        }
        self.publisher.shutdown().await;
        tracing::debug!(sink = %self.name, "pubsub: stopped");
        Ok(())
    }

    fn message(&self, item: &SinkItem) -> PubsubMessage {
        let (data, attributes) = binding::encode(&item.event, self.mode);
        let ordering_key = self
            .ordering_key
            .as_ref()
            .map(|t| t.render_with(&item.event, |out, v| out.push_str(v)))
            .unwrap_or_default();
        PubsubMessage {
            data,
            attributes,
            ordering_key,
            ..PubsubMessage::default()
        }
    }

    fn publish(&self, batch: Vec<(SinkItem, PubsubMessage)>) -> BoxFuture<'static, ()> {
        let publisher = self.publisher.clone();
        let name = self.name.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            let (items, messages): (Vec<SinkItem>, Vec<PubsubMessage>) = batch.into_iter().unzip();
            let r =
                tokio::time::timeout(timeout, publisher.publish_immediately(messages, None)).await;
            let reason = match r {
                Ok(Ok(ids)) if ids.len() == items.len() => {
                    api_call(("sink", &name), "Publish", true);
                    for (item, id) in items.into_iter().zip(ids) {
                        tracing::trace!(sink = %name, event = %item.event.id, message = %id, "pubsub: published");
                        item.delivery.delivered();
                    }
                    return;
                }
                Ok(Ok(ids)) => {
                    api_call(("sink", &name), "Publish", false);
                    format!(
                        "Publish returned {} message ids for {} messages",
                        ids.len(),
                        items.len()
                    )
                }
                Ok(Err(s)) => {
                    api_call(("sink", &name), "Publish", false);
                    if s.code() == Code::InvalidArgument {
                        // Too large, a bad attribute: trying again cannot help.
                        for item in items {
                            item.delivery
                                .rejected(format!("Publish refused it: {}", s.message()));
                        }
                        return;
                    }
                    format!("Publish failed ({}: {})", s.code(), s.message())
                }
                Err(_) => {
                    api_call(("sink", &name), "Publish", false);
                    format!("Publish did not answer within {timeout:?}")
                }
            };
            tracing::warn!(sink = %name, error = %reason, events = items.len(), "pubsub: publish failed");
            for item in items {
                item.delivery.failed(reason.clone());
            }
        })
    }
}

/// Why Pub/Sub would refuse `m` on its own (its documented per-message limits: an ordering
/// key of at most 1 024 bytes, at most 100 attributes, attribute names of at most 256 bytes and
/// values of at most 1 024 bytes, data of at most 10 MB), if it would.
fn over_limits(m: &PubsubMessage) -> Option<String> {
    if m.ordering_key.len() > 1024 {
        return Some(format!(
            "the ordering key is {} bytes; Pub/Sub allows 1024",
            m.ordering_key.len()
        ));
    }
    // The binding keeps attributes within these (an event that does not fit goes structured);
    // checked again here with its limits, as the batch is at stake.
    use crate::binding::{MAX_ATTRIBUTES, MAX_ATTRIBUTE_NAME, MAX_ATTRIBUTE_VALUE};
    if m.attributes.len() > MAX_ATTRIBUTES {
        return Some(format!(
            "{} attributes; Pub/Sub allows {MAX_ATTRIBUTES}",
            m.attributes.len()
        ));
    }
    if let Some((k, v)) = m
        .attributes
        .iter()
        .find(|(k, v)| k.len() > MAX_ATTRIBUTE_NAME || v.len() > MAX_ATTRIBUTE_VALUE)
    {
        return Some(format!(
            "attribute {:?} ({} bytes, value {} bytes) is over Pub/Sub's 256-byte name or 1024-byte value",
            k.chars().take(40).collect::<String>(),
            k.len(),
            v.len()
        ));
    }
    if m.data.len() > 10_000_000 {
        return Some(format!(
            "the data is {} bytes; Pub/Sub allows 10 MB",
            m.data.len()
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_over_pubsubs_limits_is_named_before_it_can_take_a_batch_down() {
        let ok = PubsubMessage {
            ordering_key: "k".repeat(1024),
            ..PubsubMessage::default()
        };
        assert_eq!(over_limits(&ok), None);
        let long_key = PubsubMessage {
            ordering_key: "k".repeat(1025),
            ..PubsubMessage::default()
        };
        assert!(over_limits(&long_key)
            .unwrap()
            .contains("ordering key is 1025 bytes"));
        let mut attrs = PubsubMessage::default();
        attrs.attributes.insert("ce-x".into(), "v".repeat(1025));
        assert!(over_limits(&attrs).unwrap().contains("1025 bytes"));
    }
}
