//! `kind: sqs` and `kind: sns` sinks: `SendMessageBatch` / `PublishBatch` of up to 10 events,
//! several batches in flight. Delivered = AWS confirmed that entry; a batch's failed entries
//! fail (or, when AWS says the sender is at fault, reject) only their own events.

use std::collections::{HashMap, HashSet};
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

fn check_common(
    concurrency: usize,
    timeout: Duration,
    group_id: Option<&str>,
) -> Result<(), String> {
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
        // At most 128 bytes, cut at a character boundary (`truncate` panics inside one).
        let mut end = group.len().min(128);
        while !group.is_char_boundary(end) {
            end -= 1;
        }
        group.truncate(end);
        (group, format!("{:032x}", e.key()))
    }
}

/// Splits what was taken from the queue into batches of at most 10 entries and 256 KiB.
fn batches(items: Vec<(SinkItem, Encoded)>) -> Vec<Vec<(SinkItem, Encoded)>> {
    let mut out = Vec::new();
    let mut cur: Vec<(SinkItem, Encoded)> = Vec::with_capacity(BATCH);
    let mut bytes = 0;
    for (item, enc) in items {
        let size = enc.body.len()
            + enc
                .attrs
                .iter()
                .map(|(k, v)| k.len() + v.len() + 6)
                .sum::<usize>();
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

/// What one batch call answered: the ids AWS took, and per failed id whether the sender is at
/// fault and why.
pub(crate) struct BatchAnswer {
    ok: HashSet<String>,
    failed: HashMap<String, (bool, String)>,
}

/// A batch call that failed as a whole: `sender_fault` when AWS blames the request (one bad
/// entry makes SQS refuse the whole batch), else a transient failure.
pub(crate) struct BatchError {
    pub(crate) sender_fault: bool,
    pub(crate) reason: String,
}

impl BatchError {
    pub(crate) fn from_sdk<E>(
        verb: &str,
        e: &aws_sdk_sqs::error::SdkError<E, aws_sdk_sqs::config::http::HttpResponse>,
    ) -> BatchError
    where
        E: aws_sdk_sqs::error::ProvideErrorMetadata + std::error::Error + 'static,
    {
        use aws_sdk_sqs::error::SdkError;
        match e {
            SdkError::ServiceError(se) => {
                let status = se.raw().status().as_u16();
                let err = se.err();
                let code = err.code().unwrap_or("");
                BatchError {
                    // SQS and SNS answer throttling, KMS and auth trouble with 4xx too: those
                    // pass; only what is wrong with the request itself is the sender's fault.
                    sender_fault: (400..500).contains(&status)
                        && status != 429
                        && status != 403
                        && !is_transient_code(code),
                    reason: format!(
                        "{verb}: {} {} (HTTP {status})",
                        err.code().unwrap_or("error"),
                        err.message().unwrap_or("")
                    ),
                }
            }
            other => BatchError {
                sender_fault: false,
                reason: format!(
                    "{verb} failed: {}",
                    aws_sdk_sqs::error::DisplayErrorContext(other)
                ),
            },
        }
    }
}

/// One call, bounded by `timeout`, counted.
async fn attempt<T, Fut>(
    name: &str,
    verb: &'static str,
    timeout: Duration,
    call: impl FnOnce(Vec<T>) -> Fut,
    entries: Vec<T>,
) -> Result<BatchAnswer, BatchError>
where
    Fut: Future<Output = Result<BatchAnswer, BatchError>>,
{
    let answer = match tokio::time::timeout(timeout, call(entries)).await {
        Ok(r) => r,
        Err(_) => Err(BatchError {
            sender_fault: false,
            reason: format!("{verb} took longer than {timeout:?}"),
        }),
    };
    api_call(name, verb, answer.is_ok());
    answer
}

/// Settles each item from its own entry's result (ids are the items' indexes), or all of them
/// with the whole call's failure.
fn settle(name: &str, verb: &str, answer: Result<BatchAnswer, BatchError>, items: Vec<SinkItem>) {
    match answer {
        Ok(a) => {
            for (i, SinkItem { delivery, .. }) in items.into_iter().enumerate() {
                let id = i.to_string();
                match a.failed.get(&id) {
                    Some((true, r)) => delivery.rejected(r.clone()),
                    Some((false, r)) => delivery.failed(r.clone()),
                    None if a.ok.contains(&id) => delivery.delivered(),
                    None => delivery.failed(format!("{verb}: no result for this entry")),
                }
            }
        }
        Err(e) => {
            tracing::warn!(sink = %name, error = %e.reason, events = items.len(), "{verb} failed");
            for SinkItem { delivery, .. } in items {
                if e.sender_fault {
                    delivery.rejected(e.reason.clone());
                } else {
                    delivery.failed(e.reason.clone());
                }
            }
        }
    }
}

/// A failed entry of a batch answer: its id, whether it is the sender's fault (never for a
/// transient code), and the reason.
fn failed_entry(
    verb: &str,
    id: String,
    sender_fault: bool,
    code: &str,
    message: Option<String>,
) -> (String, (bool, String)) {
    let reason = format!("{verb}: {code} {}", message.unwrap_or_default());
    (id, (sender_fault && !is_transient_code(code), reason))
}

/// Error codes SQS and SNS answer with a 4xx that are not the request's fault: throttling, KMS
/// and credential trouble, a queue or topic being created or deleted.
fn is_transient_code(code: &str) -> bool {
    let c = code.to_ascii_lowercase();
    c.contains("throttl")
        || c.contains("limitexceeded")
        || c.contains("overlimit")
        || c.starts_with("kms")
        || c.contains("token")
        || c.contains("signature")
        || c.contains("accessdenied")
        || c.contains("authorization")
        || c.contains("unavailable")
        || c.contains("internal")
        || c.contains("nonexistent")
        || c.contains("notfound")
}

/// Sends `entries` in one call and settles each item from its own entry's result. A batch of
/// several that AWS refuses as a whole for the sender's fault is sent again one entry at a
/// time, so that only the entry at fault is refused.
async fn send_batch<T, F, Fut>(
    name: &str,
    verb: &'static str,
    timeout: Duration,
    entries: Vec<T>,
    items: Vec<SinkItem>,
    call: F,
) where
    T: Clone,
    F: Fn(Vec<T>) -> Fut,
    Fut: Future<Output = Result<BatchAnswer, BatchError>>,
{
    let n = entries.len();
    match attempt(name, verb, timeout, &call, entries.clone()).await {
        Err(e) if e.sender_fault && n > 1 => {
            tracing::debug!(sink = %name, reason = %e.reason, "{verb} refused as a whole; sending its entries one by one");
            for (entry, item) in entries.into_iter().zip(items) {
                let answer = attempt(name, verb, timeout, &call, vec![entry]).await;
                settle(name, verb, answer, vec![item]);
            }
        }
        answer => settle(name, verb, answer, items),
    }
}

/// One batch's entries, built by `entry(id, message, its FIFO group and deduplication ids,
/// event)`, and its items in the same order; `None` (every item rejected) when an entry cannot be
/// built.
fn build_entries<T, E: std::fmt::Display>(
    batch: Vec<(SinkItem, Encoded)>,
    fifo: Option<&Fifo>,
    mut entry: impl FnMut(String, Encoded, Option<(String, String)>, &Event) -> Result<T, E>,
) -> Option<(Vec<T>, Vec<SinkItem>)> {
    let mut entries = Vec::with_capacity(batch.len());
    let mut items = Vec::with_capacity(batch.len());
    let mut broken = None;
    for (i, (item, enc)) in batch.into_iter().enumerate() {
        let ids = fifo.map(|f| f.fields(&item.event));
        match entry(i.to_string(), enc, ids, &item.event) {
            Ok(e) => entries.push(e),
            Err(e) => broken = Some(e.to_string()),
        }
        items.push(item);
    }
    if let Some(reason) = broken {
        for SinkItem { delivery, .. } in items {
            delivery.rejected(format!("a batch entry could not be built: {reason}"));
        }
        return None;
    }
    Some((entries, items))
}

/// The loop both sinks run: take up to 10 events, encode, send in batches, several in flight.
async fn run_batches<F>(
    kind: &str,
    name: String,
    mut ctx: SinkContext,
    concurrency: usize,
    mode: Mode,
    mut send: impl FnMut(Vec<(SinkItem, Encoded)>) -> F,
) -> Result<(), ConnectorError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let mut window = SinkWindow::new(concurrency);
    let mut buf: Vec<SinkItem> = Vec::with_capacity(BATCH);
    loop {
        match window
            .step(&ctx.grace_over, true, |_| {
                ctx.input.recv_many(&mut buf, BATCH)
            })
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
                        let enc = attrs::encode(&item.event, mode);
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
        check_common(
            self.concurrency,
            self.timeout.get(),
            self.group_id.as_deref(),
        )
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
                let built = build_entries(batch, fifo.as_ref().as_ref(), |id, enc, ids, _| {
                    let mut e = aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                        .id(id)
                        .message_body(enc.body);
                    for (k, v) in enc.attrs {
                        let a = aws_sdk_sqs::types::MessageAttributeValue::builder()
                            .data_type("String")
                            .string_value(v)
                            .build()?;
                        e = e.message_attributes(k, a);
                    }
                    if let Some((group, dedup)) = ids {
                        e = e.message_group_id(group).message_deduplication_id(dedup);
                    }
                    e.build()
                });
                let client = client.clone();
                let url = url.clone();
                let name = n.clone();
                async move {
                    let Some((entries, items)) = built else {
                        return;
                    };
                    let call = |entries: Vec<aws_sdk_sqs::types::SendMessageBatchRequestEntry>| {
                        let req = client
                            .send_message_batch()
                            .queue_url(&url)
                            .set_entries(Some(entries));
                        async move {
                            let out = req
                                .send()
                                .await
                                .map_err(|e| BatchError::from_sdk("SendMessageBatch", &e))?;
                            Ok(BatchAnswer {
                                ok: out.successful.into_iter().map(|s| s.id).collect(),
                                failed: out
                                    .failed
                                    .into_iter()
                                    .map(|f| {
                                        failed_entry(
                                            "SendMessageBatch",
                                            f.id,
                                            f.sender_fault,
                                            &f.code,
                                            f.message,
                                        )
                                    })
                                    .collect(),
                            })
                        }
                    };
                    send_batch(&name, "SendMessageBatch", timeout, entries, items, call).await;
                }
            };
            tracing::info!(sink = %name, queue = %self.queue, "sqs: ready");
            Ok(Box::pin(run_batches(
                "sqs",
                name,
                ctx,
                self.concurrency,
                self.mode,
                send,
            )) as Running)
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
        check_common(
            self.concurrency,
            self.timeout.get(),
            self.group_id.as_deref(),
        )
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
            let fifo = Fifo::new(self.topic_arn.ends_with(".fifo"), self.group_id.as_deref())
                .map_err(err)?;
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
                let built = build_entries(batch, fifo.as_ref().as_ref(), |id, enc, ids, event| {
                    let mut e = aws_sdk_sns::types::PublishBatchRequestEntry::builder()
                        .id(id)
                        .message(enc.body);
                    for (k, v) in enc.attrs {
                        let a = aws_sdk_sns::types::MessageAttributeValue::builder()
                            .data_type("String")
                            .string_value(v)
                            .build()?;
                        e = e.message_attributes(k, a);
                    }
                    if let Some((group, dedup)) = ids {
                        e = e.message_group_id(group).message_deduplication_id(dedup);
                    }
                    if let Some(t) = &subject {
                        let s = t.render_with(event, |out, v| out.push_str(v));
                        if !s.is_empty() {
                            e = e.subject(s.chars().take(100).collect::<String>());
                        }
                    }
                    e.build()
                });
                let client = client.clone();
                let topic = topic.clone();
                let name = n.clone();
                async move {
                    let Some((entries, items)) = built else {
                        return;
                    };
                    let call = |entries: Vec<aws_sdk_sns::types::PublishBatchRequestEntry>| {
                        let req = client
                            .publish_batch()
                            .topic_arn(&topic)
                            .set_publish_batch_request_entries(Some(entries));
                        async move {
                            let out = req
                                .send()
                                .await
                                .map_err(|e| BatchError::from_sdk("PublishBatch", &e))?;
                            Ok(BatchAnswer {
                                ok: out
                                    .successful
                                    .unwrap_or_default()
                                    .into_iter()
                                    .filter_map(|s| s.id)
                                    .collect(),
                                failed: out
                                    .failed
                                    .unwrap_or_default()
                                    .into_iter()
                                    .map(|f| {
                                        failed_entry(
                                            "PublishBatch",
                                            f.id,
                                            f.sender_fault,
                                            &f.code,
                                            f.message,
                                        )
                                    })
                                    .collect(),
                            })
                        }
                    };
                    send_batch(&name, "PublishBatch", timeout, entries, items, call).await;
                }
            };
            tracing::info!(sink = %name, topic = %self.topic_arn, "sns: ready");
            Ok(Box::pin(run_batches(
                "sns",
                name,
                ctx,
                self.concurrency,
                self.mode,
                send,
            )) as Running)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_group_id_is_cut_at_128_bytes_on_a_character_boundary() {
        let fifo = Fifo::new(true, Some("{subject}")).unwrap().unwrap();
        let subject = format!("a{}", "\u{e9}".repeat(64));
        let e = sluice_core::Event::new("1", "/s", "t").with_subject(subject.clone());
        let (group, dedup) = fifo.fields(&e);
        assert_eq!(group.len(), 127, "byte 128 falls inside a character");
        assert!(subject.starts_with(&group));
        assert_eq!(dedup.len(), 32);
        let e = sluice_core::Event::new("1", "/s", "t").with_subject("x".repeat(300));
        assert_eq!(fifo.fields(&e).0.len(), 128);
    }

    #[test]
    fn throttling_and_credential_codes_are_not_the_senders_fault() {
        for code in [
            "RequestThrottled",
            "ThrottlingException",
            "KmsThrottled",
            "KMS.ThrottlingException",
            "KmsAccessDenied",
            "AccessDenied",
            "ExpiredToken",
            "InvalidClientTokenId",
            "SignatureDoesNotMatch",
            "AWS.SimpleQueueService.NonExistentQueue",
            "NotFound",
            "ServiceUnavailable",
            "InternalError",
        ] {
            assert!(is_transient_code(code), "{code}");
        }
        for code in [
            "InvalidParameterValue",
            "InvalidMessageContents",
            "BatchRequestTooLong",
            "InvalidParameter",
            "ValidationError",
        ] {
            assert!(!is_transient_code(code), "{code}");
        }
    }
}
