//! `kind: sqs` and `kind: sns` sinks: `SendMessageBatch` / `PublishBatch` of up to 10 events,
//! several batches in flight. Delivered = AWS confirmed that entry; a batch's failed entries
//! fail (or, when AWS says the sender is at fault, reject) only their own events.

use std::future::Future;
use std::time::Duration;

use sluice_core::pipeline::{SinkWindow, Step};
use sluice_core::template::Template;
use sluice_core::units::HumanDuration;
use sluice_core::{BoxFuture, ConnectorError, Event, Running, SinkConfig, SinkContext, SinkItem};

use crate::attrs::{self, Encoded, Mode};
use crate::{api_call, aws_options, check_topic_arn, QueueRef};

/// Entries in one batch call (SQS and SNS).
const BATCH: usize = 10;
/// Bytes in one batch call: SQS and SNS take 256 KiB per batch, attributes included.
const BATCH_BYTES: usize = 256 * 1024;

aws_options! {
    /// `kind: sqs` sink options.
    pub struct SqsSinkConfig {
        /// The queue: name, URL or ARN (FIFO queues end in `.fifo`).
        pub queue: String,
        /// `binary` (default: `ce_*` message attributes, the data as body) or `structured`.
        #[serde(default)]
        pub mode: Mode,
        /// FIFO: the `MessageGroupId`, a template over the event's attributes. Default
        /// `{source}`. The `MessageDeduplicationId` is the event's dedup key.
        pub group_id: Option<String>,
        /// Batch calls in flight at once. Default 8.
        #[serde(default = "eight")]
        pub concurrency: usize,
        /// How long one call may take, the SDK's retries included. Default 30s.
        #[serde(default = "thirty_seconds")]
        pub timeout: HumanDuration,
    }
}

aws_options! {
    /// `kind: sns` sink options.
    pub struct SnsSinkConfig {
        /// `arn:aws:sns:<region>:<account>:<topic>` (FIFO topics end in `.fifo`).
        pub topic_arn: String,
        /// `binary` (default) or `structured`; an event without data is sent structured (SNS
        /// refuses an empty message).
        #[serde(default)]
        pub mode: Mode,
        /// FIFO: the `MessageGroupId` template. Default `{source}`.
        pub group_id: Option<String>,
        /// The SNS `Subject` (e-mail subscriptions), a template. Default: none.
        pub subject: Option<String>,
        /// Batch calls in flight at once. Default 8.
        #[serde(default = "eight")]
        pub concurrency: usize,
        /// How long one call may take, the SDK's retries included. Default 30s.
        #[serde(default = "thirty_seconds")]
        pub timeout: HumanDuration,
    }
}

fn eight() -> usize {
    8
}
fn thirty_seconds() -> HumanDuration {
    HumanDuration::from_secs(30)
}

fn check_common(concurrency: usize, timeout: Duration, group_id: Option<&str>) -> Result<(), String> {
    if concurrency == 0 || concurrency > 256 {
        return Err("concurrency must be between 1 and 256".into());
    }
    if timeout < Duration::from_secs(1) {
        return Err("timeout must be at least 1s".into());
    }
    if let Some(g) = group_id {
        Template::parse("group_id", g)?;
    }
    Ok(())
}

/// The FIFO fields of an event: group from the template, deduplication id = the dedup key.
struct Fifo {
    group: Template,
}

impl Fifo {
    fn new(fifo: bool, group_id: Option<&str>) -> Result<Option<Fifo>, String> {
        if !fifo {
            return Ok(None);
        }
        Ok(Some(Fifo {
            group: Template::parse("group_id", group_id.unwrap_or("{source}"))?,
        }))
    }

    fn fields(&self, e: &Event) -> (String, String) {
        let mut group = self.group.render_with(e, |out, v| out.push_str(v));
        if group.is_empty() {
            group.push('-');
        }
        group.truncate(128);
        (group, format!("{:032x}", e.key()))
    }
}

/// Splits what was taken from the queue into batches of at most 10 entries and 256 KiB.
fn batches(items: Vec<(SinkItem, Encoded)>) -> Vec<Vec<(SinkItem, Encoded)>> {
    let mut out = Vec::new();
    let mut cur: Vec<(SinkItem, Encoded)> = Vec::with_capacity(BATCH);
    let mut bytes = 0;
    for (item, enc) in items {
        let size = enc.body.len() + enc.attrs.iter().map(|(k, v)| k.len() + v.len() + 6).sum::<usize>();
        if !cur.is_empty() && (cur.len() == BATCH || bytes + size > BATCH_BYTES) {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        bytes += size;
        cur.push((item, enc));
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// How one entry of a batch ended.
enum EntryResult {
    Ok,
    /// AWS says the entry itself is at fault (too large, invalid): it will never succeed.
    Refused(String),
    Failed(String),
}

/// Settles a batch's items from per-entry results keyed by the entry id (its index).
fn settle(items: Vec<SinkItem>, mut result: impl FnMut(usize) -> EntryResult) {
    for (i, SinkItem { delivery, .. }) in items.into_iter().enumerate() {
        match result(i) {
            EntryResult::Ok => delivery.delivered(),
            EntryResult::Refused(r) => delivery.rejected(r),
            EntryResult::Failed(r) => delivery.failed(r),
        }
    }
}

/// The loop both sinks run: take up to 10 events, encode, send in batches, several in flight.
async fn run_batches<F>(
    kind: &str,
    name: String,
    mut ctx: SinkContext,
    concurrency: usize,
    mode: Mode,
    non_empty_body: bool,
    mut send: impl FnMut(Vec<(SinkItem, Encoded)>) -> F,
) -> Result<(), ConnectorError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let mut window = SinkWindow::new(concurrency);
    let mut buf: Vec<SinkItem> = Vec::with_capacity(BATCH);
    loop {
        match window
            .step(&ctx.grace_over, true, |_| ctx.input.recv_many(&mut buf, BATCH))
            .await
        {
            Step::Input(0) => {
                window.drain_until(&ctx.grace_over).await;
                break;
            }
            Step::Input(_) => {
                let encoded: Vec<(SinkItem, Encoded)> = buf
                    .drain(..)
                    .map(|item| {
                        let mut enc = attrs::encode(&item.event, mode);
                        if non_empty_body && enc.body.is_empty() {
                            enc = attrs::encode(&item.event, Mode::Structured);
                        }
                        (item, enc)
                    })
                    .collect();
                for b in batches(encoded) {
                    window.push(send(b));
                }
            }
            Step::Settled | Step::Idle => {}
            Step::GraceOver => break,
        }
    }
    tracing::debug!(sink = %name, "{kind}: stopped");
    Ok(())
}

impl SinkConfig for SqsSinkConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        self.connection().check()?;
        QueueRef::parse(&self.queue)?;
        check_common(self.concurrency, self.timeout.get(), self.group_id.as_deref())
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("sqs sink {name}: {m}"));
            let q = QueueRef::parse(&self.queue).map_err(err)?;
            let sdk = self.connection().sdk_config(q.region()).await;
            let client = aws_sdk_sqs::Client::new(&sdk);
            // Resolving the URL proves the queue exists and the credentials reach it.
            let url = q.resolve(&client).await.map_err(err)?;
            let fifo = Fifo::new(q.is_fifo(), self.group_id.as_deref()).map_err(err)?;
            let fifo = std::sync::Arc::new(fifo);
            let timeout = self.timeout.get();
            let n = name.clone();
            let send = move |batch: Vec<(SinkItem, Encoded)>| {
                let mut entries = Vec::with_capacity(batch.len());
                let mut items = Vec::with_capacity(batch.len());
                for (i, (item, enc)) in batch.into_iter().enumerate() {
                    let mut e = aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(enc.body);
                    for (k, v) in enc.attrs {
                        if let Ok(a) = aws_sdk_sqs::types::MessageAttributeValue::builder()
                            .data_type("String")
                            .string_value(v)
                            .build()
                        {
                            e = e.message_attributes(k, a);
                        }
                    }
                    if let Some(f) = fifo.as_ref() {
                        let (group, dedup) = f.fields(&item.event);
                        e = e.message_group_id(group).message_deduplication_id(dedup);
                    }
                    entries.push(e.build());
                    items.push(item);
                }
                let call = client
                    .send_message_batch()
                    .queue_url(&url)
                    .set_entries(entries.into_iter().collect::<Result<Vec<_>, _>>().ok());
                let name = n.clone();
                async move {
                    let r = tokio::time::timeout(timeout, call.send()).await;
                    match r {
                        Ok(Ok(out)) => {
                            api_call(&name, "SendMessageBatch", true);
                            let failed: std::collections::HashMap<String, (bool, String)> = out
                                .failed
                                .into_iter()
                                .map(|f| (f.id, (f.sender_fault, format!("SendMessageBatch: {} {}", f.code, f.message.unwrap_or_default()))))
                                .collect();
                            let ok: std::collections::HashSet<String> =
                                out.successful.into_iter().map(|s| s.id).collect();
                            settle(items, |i| {
                                let id = i.to_string();
                                match failed.get(&id) {
                                    Some((true, r)) => EntryResult::Refused(r.clone()),
                                    Some((false, r)) => EntryResult::Failed(r.clone()),
                                    None if ok.contains(&id) => EntryResult::Ok,
                                    None => EntryResult::Failed("SendMessageBatch: no result for this entry".into()),
                                }
                            });
                        }
                        Ok(Err(e)) => {
                            api_call(&name, "SendMessageBatch", false);
                            let reason = format!("SendMessageBatch failed: {}", aws_sdk_sqs::error::DisplayErrorContext(&e));
                            tracing::warn!(sink = %name, error = %reason, "sqs: batch failed");
                            settle(items, |_| EntryResult::Failed(reason.clone()));
                        }
                        Err(_) => {
                            api_call(&name, "SendMessageBatch", false);
                            settle(items, |_| EntryResult::Failed(format!("SendMessageBatch took longer than {timeout:?}")));
                        }
                    }
                }
            };
            tracing::info!(sink = %name, queue = %self.queue, "sqs: ready");
            Ok(Box::pin(run_batches("sqs", name, ctx, self.concurrency, self.mode, false, send)) as Running)
        })
    }
}

impl SinkConfig for SnsSinkConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        self.connection().check()?;
        check_topic_arn(&self.topic_arn)?;
        if let Some(s) = &self.subject {
            Template::parse("subject", s)?;
        }
        check_common(self.concurrency, self.timeout.get(), self.group_id.as_deref())
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("sns sink {name}: {m}"));
            let region = check_topic_arn(&self.topic_arn).map_err(err)?.to_owned();
            let sdk = self.connection().sdk_config(Some(&region)).await;
            let client = aws_sdk_sns::Client::new(&sdk);
            // Reading the topic proves it exists and the credentials reach it.
            client
                .get_topic_attributes()
                .topic_arn(&self.topic_arn)
                .send()
                .await
                .map_err(|e| {
                    err(format!(
                        "cannot read topic {} ({}); does it exist, and may these credentials call sns:GetTopicAttributes?",
                        self.topic_arn,
                        aws_sdk_sns::error::DisplayErrorContext(&e)
                    ))
                })?;
            let fifo = Fifo::new(self.topic_arn.ends_with(".fifo"), self.group_id.as_deref()).map_err(err)?;
            let fifo = std::sync::Arc::new(fifo);
            let subject = self
                .subject
                .as_deref()
                .map(|s| Template::parse("subject", s))
                .transpose()
                .map_err(err)?;
            let topic = self.topic_arn.clone();
            let timeout = self.timeout.get();
            let n = name.clone();
            let send = move |batch: Vec<(SinkItem, Encoded)>| {
                let mut entries = Vec::with_capacity(batch.len());
                let mut items = Vec::with_capacity(batch.len());
                for (i, (item, enc)) in batch.into_iter().enumerate() {
                    let mut e = aws_sdk_sns::types::PublishBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message(enc.body);
                    for (k, v) in enc.attrs {
                        if let Ok(a) = aws_sdk_sns::types::MessageAttributeValue::builder()
                            .data_type("String")
                            .string_value(v)
                            .build()
                        {
                            e = e.message_attributes(k, a);
                        }
                    }
                    if let Some(f) = fifo.as_ref() {
                        let (group, dedup) = f.fields(&item.event);
                        e = e.message_group_id(group).message_deduplication_id(dedup);
                    }
                    if let Some(t) = &subject {
                        let s = t.render_with(&item.event, |out, v| out.push_str(v));
                        if !s.is_empty() {
                            e = e.subject(s.chars().take(100).collect::<String>());
                        }
                    }
                    entries.push(e.build());
                    items.push(item);
                }
                let call = client
                    .publish_batch()
                    .topic_arn(&topic)
                    .set_publish_batch_request_entries(entries.into_iter().collect::<Result<Vec<_>, _>>().ok());
                let name = n.clone();
                async move {
                    match tokio::time::timeout(timeout, call.send()).await {
                        Ok(Ok(out)) => {
                            api_call(&name, "PublishBatch", true);
                            let failed: std::collections::HashMap<String, (bool, String)> = out
                                .failed
                                .unwrap_or_default()
                                .into_iter()
                                .map(|f| (f.id, (f.sender_fault, format!("PublishBatch: {} {}", f.code, f.message.unwrap_or_default()))))
                                .collect();
                            let ok: std::collections::HashSet<String> = out
                                .successful
                                .unwrap_or_default()
                                .into_iter()
                                .filter_map(|s| s.id)
                                .collect();
                            settle(items, |i| {
                                let id = i.to_string();
                                match failed.get(&id) {
                                    Some((true, r)) => EntryResult::Refused(r.clone()),
                                    Some((false, r)) => EntryResult::Failed(r.clone()),
                                    None if ok.contains(&id) => EntryResult::Ok,
                                    None => EntryResult::Failed("PublishBatch: no result for this entry".into()),
                                }
                            });
                        }
                        Ok(Err(e)) => {
                            api_call(&name, "PublishBatch", false);
                            let reason = format!("PublishBatch failed: {}", aws_sdk_sns::error::DisplayErrorContext(&e));
                            tracing::warn!(sink = %name, error = %reason, "sns: batch failed");
                            settle(items, |_| EntryResult::Failed(reason.clone()));
                        }
                        Err(_) => {
                            api_call(&name, "PublishBatch", false);
                            settle(items, |_| EntryResult::Failed(format!("PublishBatch took longer than {timeout:?}")));
                        }
                    }
                }
            };
            tracing::info!(sink = %name, topic = %self.topic_arn, "sns: ready");
            Ok(Box::pin(run_batches("sns", name, ctx, self.concurrency, self.mode, true, send)) as Running)
        })
    }
}
