//! `kind: s3`: S3 object events.
//!
//! - `mode: notification` (default): from the SQS queue the bucket notifies (directly, or
//!   through an SNS topic, raw or wrapped in the SNS envelope), on the SQS engine. One
//!   CloudEvent per record, named after the CloudEvents S3 adapter; the SQS message is deleted
//!   only when every record of it is delivered; `s3:TestEvent` is deleted and counted as
//!   filtered.
//! - `mode: poll`: for S3-compatible stores without notifications. Lists the bucket by prefix
//!   at an interval, a page (1000 keys) at a time, and emits objects whose ETag it has not
//!   emitted before; what was delivered is remembered in the state store (`state_dir`), so a
//!   restart emits nothing twice and misses nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde::Deserialize;
use serde_json::Value;
use sluice_core::event::{Event, Timestamp};
use sluice_core::state::{MemoryStateStore, StateStore};
use sluice_core::units::HumanDuration;
use sluice_core::{BoxFuture, ConnectorError, Running, SourceConfig, SourceContext, Status};

use crate::sqs::{self, Decode, Made, Polling, Received};
use crate::{api_call, aws_options, poll_backoff};

/// `mode:` of an S3 source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum S3Mode {
    /// Bucket notifications through an SQS queue (default).
    #[default]
    Notification,
    /// List the bucket at an interval (stores without notifications).
    Poll,
}

/// `format:` of an S3 source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// One CloudEvent per record, named after the CloudEvents S3 adapter (default).
    #[default]
    Cloudevents,
    /// Argo Events' `minio` shape: one event per notification, data `{notification: [records],
    /// metadata}`.
    Argo,
}

/// `filter:` — which object keys count.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyFilter {
    pub prefix: Option<String>,
    pub suffix: Option<String>,
}

aws_options! {
    /// `kind: s3` source options.
    pub struct S3SourceConfig {
        #[serde(default)]
        pub mode: S3Mode,
        /// `notification`: the SQS queue the bucket notifies (name, URL or ARN).
        pub queue: Option<String>,
        /// `notification`: event names to forward (`s3:ObjectCreated:*`, `s3:ObjectRemoved:Delete`,
        /// ...; a trailing `*` matches any rest). Default: all.
        #[serde(default)]
        pub events: Vec<String>,
        /// Object keys to forward (the URL-decoded key).
        #[serde(default)]
        pub filter: KeyFilter,
        /// `poll`: the bucket to list.
        pub bucket: Option<String>,
        /// `poll`: list only keys under this prefix.
        pub prefix: Option<String>,
        /// `poll`: time between listings. Default 60s.
        #[serde(default = "one_minute")]
        pub interval: HumanDuration,
        /// `notification`: messages one poll asks for (1 to 10). Default 10.
        #[serde(default = "ten")]
        pub max_messages: i32,
        /// `notification`: long-poll wait (0 to 20s). Default 20s.
        #[serde(default = "twenty_seconds")]
        pub wait_time: HumanDuration,
        /// `notification`: visibility timeout, extended while in flight. Default 2m.
        #[serde(default = "two_minutes")]
        pub visibility_timeout: HumanDuration,
        /// `notification`: long polls at once. Default 2.
        #[serde(default = "two")]
        pub concurrency: usize,
        /// Messages (`notification`) or objects (`poll`) in flight at once. Default 1000.
        #[serde(default = "thousand")]
        pub max_in_flight: usize,
        /// `notification`: the longest a message's visibility is extended. Default 1h.
        #[serde(default = "one_hour")]
        pub max_extension: HumanDuration,
        #[serde(default)]
        pub format: Format,
        /// `argo`: `data.metadata`.
        #[serde(default)]
        pub metadata: BTreeMap<String, String>,
    }
}

fn one_minute() -> HumanDuration {
    HumanDuration::from_secs(60)
}
fn ten() -> i32 {
    10
}
fn twenty_seconds() -> HumanDuration {
    HumanDuration::from_secs(20)
}
fn two_minutes() -> HumanDuration {
    HumanDuration::from_secs(120)
}
fn two() -> usize {
    2
}
fn thousand() -> usize {
    1000
}
fn one_hour() -> HumanDuration {
    HumanDuration::from_secs(3600)
}

impl S3SourceConfig {
    fn polling(&self) -> Polling {
        Polling {
            queue: self.queue.clone().unwrap_or_default(),
            max_messages: self.max_messages,
            wait_time: self.wait_time.get(),
            visibility_timeout: self.visibility_timeout.get(),
            concurrency: self.concurrency,
            max_in_flight: self.max_in_flight,
            max_extension: self.max_extension.get(),
        }
    }
}

impl SourceConfig for S3SourceConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        self.connection().check()?;
        for p in &self.events {
            let body = p.strip_suffix('*').unwrap_or(p);
            let ok = p.starts_with("s3:") && p.len() > 3 && !body.contains('*');
            if !ok {
                return Err(format!(
                    "events: {p:?} is not an S3 event name (s3:ObjectCreated:*, s3:ObjectRemoved:Delete, ...; '*' only at the end)"
                ));
            }
        }
        match self.mode {
            S3Mode::Notification => {
                if self.queue.is_none() {
                    return Err(
                        "queue is required: the SQS queue the bucket notifies (or mode: poll with bucket)"
                            .into(),
                    );
                }
                if self.bucket.is_some() || self.prefix.is_some() {
                    return Err("bucket and prefix are options of mode: poll; in notification mode the bucket is configured to notify the queue, and filter.prefix filters keys".into());
                }
                self.polling().check()?;
            }
            S3Mode::Poll => {
                let Some(b) = &self.bucket else {
                    return Err("mode: poll needs bucket: the bucket to list".into());
                };
                if b.len() < 3 || b.len() > 63 || b.contains('/') {
                    return Err(format!("bucket {b:?} is not a bucket name"));
                }
                if self.queue.is_some() || !self.events.is_empty() {
                    return Err(
                        "queue and events are options of mode: notification, not poll".into(),
                    );
                }
                if self.interval.get() < Duration::from_secs(1) {
                    return Err("interval must be at least 1s".into());
                }
                if self.max_in_flight == 0 || self.max_in_flight > 100_000 {
                    return Err("max_in_flight must be between 1 and 100000".into());
                }
            }
        }
        Ok(())
    }

    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        match self.mode {
            S3Mode::Notification => {
                let decode = Notifications {
                    events: self.events.clone(),
                    filter: self.filter.clone(),
                    format: self.format,
                    metadata: serde_json::to_value(&self.metadata).unwrap_or_default(),
                    name: ctx.name.clone(),
                };
                sqs::start(self.connection(), self.polling(), decode, ctx)
            }
            S3Mode::Poll => Box::pin(start_poll(*self, ctx)),
        }
    }
}

/// Whether an event name (`ObjectCreated:Put`, as records carry it) matches one of the patterns
/// (`s3:ObjectCreated:*`); no patterns match everything.
fn event_matches(patterns: &[String], event_name: &str) -> bool {
    if patterns.is_empty() {
        return true;
    }
    let name = event_name.strip_prefix("s3:").unwrap_or(event_name);
    patterns.iter().any(|p| {
        let p = p.strip_prefix("s3:").unwrap_or(p);
        match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == p,
        }
    })
}

impl KeyFilter {
    fn matches(&self, key: &str) -> bool {
        self.prefix.as_deref().is_none_or(|p| key.starts_with(p))
            && self.suffix.as_deref().is_none_or(|s| key.ends_with(s))
    }
}

/// A key as notifications carry it (form-URL-encoded: `+` for space) → the key.
pub(crate) fn decode_key(raw: &str) -> String {
    let spaced = raw.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8_lossy()
        .into_owned()
}

/// Notification mode: records of S3 event messages.
struct Notifications {
    events: Vec<String>,
    filter: KeyFilter,
    format: Format,
    metadata: Value,
    name: String,
}

/// The S3 notification in a message body: as S3 sent it, or inside an SNS envelope.
fn notification(body: &[u8]) -> Result<Value, String> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| format!("the message body is not JSON ({e}), not an S3 event notification"))?;
    if v.get("Type").and_then(Value::as_str) == Some("Notification") {
        if let Some(inner) = v.get("Message").and_then(Value::as_str) {
            return serde_json::from_str(inner).map_err(|e| {
                format!(
                    "the SNS envelope's Message is not JSON ({e}), not an S3 event notification"
                )
            });
        }
    }
    Ok(v)
}

impl Decode for Notifications {
    fn kind(&self) -> &'static str {
        "s3"
    }

    fn events(&self, r: &Received, _queue_arn: &str) -> Result<Made, String> {
        let doc = notification(&r.body)?;
        if doc.get("Event").and_then(Value::as_str) == Some("s3:TestEvent") {
            return Ok(Made::Skip("s3_test_event"));
        }
        let Some(records) = doc.get("Records").and_then(Value::as_array) else {
            return Err("no Records: not an S3 event notification".into());
        };
        let mut kept = Vec::new();
        for rec in records {
            let name = rec.get("eventName").and_then(Value::as_str).unwrap_or("");
            let raw_key = rec
                .pointer("/s3/object/key")
                .and_then(Value::as_str)
                .ok_or("a record without s3.object.key")?;
            let key = decode_key(raw_key);
            if event_matches(&self.events, name) && self.filter.matches(&key) {
                kept.push((rec, key));
            }
        }
        if kept.is_empty() {
            return Ok(Made::Skip("filtered"));
        }
        if self.format == Format::Argo {
            let data = serde_json::json!({
                "notification": kept.iter().map(|(rec, _)| (*rec).clone()).collect::<Vec<_>>(),
                "metadata": self.metadata,
            });
            let e = Event::new(&*r.message_id, &*self.name, "minio")
                .with_subject(&*self.name)
                .with_time(
                    r.sent
                        .map(Timestamp::from_utc)
                        .unwrap_or_else(Timestamp::now),
                )
                .with_json(serde_json::to_vec(&data).map_err(|e| e.to_string())?);
            return Ok(Made::Events(vec![e]));
        }
        let many = records.len() > 1;
        let mut out = Vec::with_capacity(kept.len());
        for (i, (rec, key)) in kept.into_iter().enumerate() {
            out.push(
                record_event(rec, key, &r.message_id, many.then_some(i))
                    .map_err(|e| e.to_string())?,
            );
        }
        Ok(Made::Events(out))
    }
}

/// One record as the CloudEvents S3 adapter names it: id `<x-amz-request-id>.<x-amz-id-2>`
/// (`.<index>` added when a message holds several records; `<MessageId>.<index>` when the
/// record has no response elements), source `<eventSource>.<awsRegion>.<bucket>`, type
/// `com.amazonaws.s3.<eventName>`, subject the key, time `eventTime`, data the record.
fn record_event(
    rec: &Value,
    key: String,
    message_id: &str,
    index: Option<usize>,
) -> Result<Event, sluice_core::EventError> {
    let s = |p: &str| rec.pointer(p).and_then(Value::as_str).unwrap_or("");
    let (req, id2) = (
        s("/responseElements/x-amz-request-id"),
        s("/responseElements/x-amz-id-2"),
    );
    let mut id = if !req.is_empty() && !id2.is_empty() {
        format!("{req}.{id2}")
    } else {
        format!("{message_id}.{}", index.unwrap_or(0))
    };
    if let (Some(i), false) = (index, req.is_empty()) {
        id.push_str(&format!(".{i}"));
    }
    let source = format!(
        "{}.{}.{}",
        s("/eventSource"),
        s("/awsRegion"),
        s("/s3/bucket/name")
    );
    let mut e = Event::new(id, source, format!("com.amazonaws.s3.{}", s("/eventName")))
        .with_subject(key)
        .with_json(serde_json::to_vec(rec).map_err(|e| sluice_core::EventError(e.to_string()))?);
    e.datacontenttype = Some("application/json".into());
    let t = s("/eventTime");
    if !t.is_empty() {
        e = e.with_time(Timestamp::parse(t)?);
    }
    e.validate()?;
    Ok(e)
}

/// The state table of a polling source: object key → the ETag last delivered.
fn table(name: &str) -> String {
    format!("s3-poll/{name}")
}

async fn start_poll(cfg: S3SourceConfig, ctx: SourceContext) -> Result<Running, ConnectorError> {
    let name = ctx.name.clone();
    let err = |m: String| ConnectorError(format!("s3 source {name}: {m}"));
    let sdk = cfg.connection().sdk_config(None).await;
    let mut b = aws_sdk_s3::config::Builder::from(&sdk);
    if cfg.endpoint.is_some() {
        // S3-compatible stores (MinIO, moto, Ceph) address buckets by path.
        b = b.force_path_style(true);
    }
    let client = aws_sdk_s3::Client::from_conf(b.build());
    let bucket = cfg.bucket.clone().unwrap_or_default();
    // Proves the bucket exists and the credentials may list it.
    client
        .list_objects_v2()
        .bucket(&bucket)
        .max_keys(1)
        .send()
        .await
        .map_err(|e| {
            err(format!(
                "cannot list bucket {bucket} ({}); does it exist, and may these credentials call s3:ListBucket?",
                aws_sdk_s3::error::DisplayErrorContext(&e)
            ))
        })?;
    api_call(&name, "ListObjectsV2", true);
    let state: Arc<dyn StateStore> = match &ctx.state {
        Some(s) => s.clone(),
        None => {
            tracing::warn!(source = %name, "s3: no state_dir: what was emitted is remembered in memory only, so a restart emits every object again (dedup drops repeats within its window)");
            Arc::new(MemoryStateStore::default())
        }
    };
    let region = sdk
        .region()
        .map(|r| r.as_ref().to_owned())
        .unwrap_or_else(|| "us-east-1".into());
    let poller = Poller {
        source: format!("aws:s3.{region}.{bucket}"),
        region,
        client,
        bucket,
        state,
        table: table(&name),
        name,
        cfg,
    };
    Ok(Box::pin(poller.run(ctx)) as Running)
}

struct Poller {
    name: String,
    client: aws_sdk_s3::Client,
    bucket: String,
    region: String,
    source: String,
    state: Arc<dyn StateStore>,
    table: String,
    cfg: S3SourceConfig,
}

/// An object seen in a listing.
struct Seen {
    key: String,
    etag: String,
    size: i64,
    modified: Option<chrono::DateTime<chrono::Utc>>,
}

impl Poller {
    async fn run(self, ctx: SourceContext) -> Result<(), ConnectorError> {
        tracing::info!(source = %self.name, bucket = %self.bucket, "s3: polling");
        let mut failures = 0u32;
        loop {
            let wait = match self.sweep(&ctx).await {
                Ok(()) => {
                    failures = 0;
                    self.cfg.interval.get()
                }
                Err(e) => {
                    failures += 1;
                    let wait = poll_backoff(failures)
                        .max(Duration::from_secs(1))
                        .min(self.cfg.interval.get());
                    tracing::warn!(source = %self.name, bucket = %self.bucket, error = %e, retry_in = ?wait, "s3: listing failed");
                    wait
                }
            };
            if ctx.shutdown.is_cancelled() {
                break;
            }
            tokio::select! {
                _ = ctx.shutdown.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        tracing::debug!(source = %self.name, "s3: stopped");
        Ok(())
    }

    /// One pass over the bucket, a page at a time: new or changed objects of a page are sent,
    /// and those settled are remembered before the next page is listed. Objects not delivered
    /// are sent again at the next pass; the pass goes on past them.
    async fn sweep(&self, ctx: &SourceContext) -> Result<(), String> {
        let mut token: Option<String> = None;
        let mut failed = 0;
        loop {
            if ctx.shutdown.is_cancelled() {
                return Ok(());
            }
            let mut call = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .set_prefix(self.cfg.prefix.clone())
                .set_continuation_token(token.take());
            call = call.max_keys(self.cfg.max_in_flight.min(1000) as i32);
            let page = call.send().await;
            api_call(&self.name, "ListObjectsV2", page.is_ok());
            let page = page.map_err(|e| aws_sdk_s3::error::DisplayErrorContext(&e).to_string())?;
            let mut fresh = Vec::new();
            for o in page.contents.unwrap_or_default() {
                let (Some(key), Some(etag)) = (o.key, o.e_tag) else {
                    continue;
                };
                if !self.cfg.filter.matches(&key) {
                    continue;
                }
                let known = self
                    .state
                    .get(&self.table, key.as_bytes())
                    .map_err(|e| e.to_string())?;
                if known.as_deref() == Some(etag.as_bytes()) {
                    continue;
                }
                fresh.push(Seen {
                    key,
                    etag,
                    size: o.size.unwrap_or(0),
                    modified: o
                        .last_modified
                        .and_then(|t| chrono::DateTime::from_timestamp(t.secs(), t.subsec_nanos())),
                });
            }
            failed += self.emit(ctx, fresh).await?;
            match page.next_continuation_token {
                Some(t) if page.is_truncated == Some(true) => token = Some(t),
                _ if failed > 0 => {
                    return Err(format!(
                        "{failed} object event(s) not delivered; they are sent again at the next listing"
                    ))
                }
                _ => return Ok(()),
            }
        }
    }

    fn event(&self, o: &Seen) -> Result<Event, String> {
        let etag = o.etag.trim_matches('"');
        let time = o
            .modified
            .map(Timestamp::from_utc)
            .unwrap_or_else(Timestamp::now);
        let data = serde_json::json!({
            "eventSource": "aws:s3",
            "awsRegion": self.region,
            "eventTime": time.as_str(),
            "eventName": "ObjectCreated:Poll",
            "s3": {
                "bucket": { "name": self.bucket },
                "object": { "key": o.key, "size": o.size, "eTag": etag },
            },
        });
        let mut e = Event::new(
            format!("{}/{}/{}", self.bucket, o.key, etag),
            &*self.source,
            "com.amazonaws.s3.ObjectCreated:Poll",
        )
        .with_subject(&*o.key)
        .with_time(time)
        .with_json(serde_json::to_vec(&data).map_err(|e| e.to_string())?);
        e.datacontenttype = Some("application/json".into());
        e.validate().map_err(|e| e.to_string())?;
        Ok(e)
    }

    /// Sends each object as its own unit, waits for their outcomes, and remembers the settled
    /// ones: delivered, or rejected by a sink for good (logged and counted; sending it again
    /// would not change the answer). Returns how many failed (sent again next time).
    async fn emit(&self, ctx: &SourceContext, objects: Vec<Seen>) -> Result<usize, String> {
        if objects.is_empty() {
            return Ok(0);
        }
        let mut pending = FuturesUnordered::new();
        for (i, o) in objects.iter().enumerate() {
            let e = self.event(o)?;
            let p = ctx.sender.send(vec![e]).await;
            pending.push(async move { (i, p.await) });
        }
        let mut delivered = Vec::new();
        let mut failed = 0;
        while let Some((i, outcome)) = pending.next().await {
            match outcome.status {
                Status::Delivered => delivered.push(i),
                Status::Rejected => {
                    tracing::warn!(source = %self.name, key = %objects[i].key, reason = outcome.reason.as_deref().unwrap_or(""), "s3: object event rejected by a sink; not sent again until the object changes");
                    delivered.push(i);
                }
                Status::Failed | Status::InFlight => failed += 1,
            }
        }
        if !delivered.is_empty() {
            let puts: Vec<(&[u8], &[u8])> = delivered
                .iter()
                .map(|&i| (objects[i].key.as_bytes(), objects[i].etag.as_bytes()))
                .collect();
            self.state
                .write(&self.table, &puts, &[])
                .map_err(|e| e.to_string())?;
        }
        Ok(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_patterns_and_keys() {
        let p = vec![
            "s3:ObjectCreated:*".to_string(),
            "s3:ObjectRemoved:Delete".into(),
        ];
        assert!(event_matches(&p, "ObjectCreated:Put"));
        assert!(event_matches(&p, "ObjectRemoved:Delete"));
        assert!(!event_matches(&p, "ObjectRemoved:DeleteMarkerCreated"));
        assert!(event_matches(&[], "anything"));
        assert_eq!(decode_key("dir%2Fmy+file%C3%A9.csv"), "dir/my fileé.csv");
        let f = KeyFilter {
            prefix: Some("incoming/".into()),
            suffix: Some(".csv".into()),
        };
        assert!(f.matches("incoming/a.csv"));
        assert!(!f.matches("incoming/a.log"));
        assert!(!f.matches("other/a.csv"));
    }

    /// The record of AWS's documented example notification.
    const RECORD: &str = r#"{"eventVersion":"2.1","eventSource":"aws:s3","awsRegion":"us-west-2","eventTime":"1970-01-01T00:00:00.000Z","eventName":"ObjectCreated:Put","userIdentity":{"principalId":"AIDAJDPLRKLG7UEXAMPLE"},"requestParameters":{"sourceIPAddress":"127.0.0.1"},"responseElements":{"x-amz-request-id":"C3D13FE58DE4C810","x-amz-id-2":"FMyUVURIY8/IgAtTv8xRjskZQpcIZ9KG4V5Wp6S7S/JRWeUWerMUE5JgHvANOjpD"},"s3":{"s3SchemaVersion":"1.0","configurationId":"testRule","bucket":{"name":"amzn-s3-demo-bucket","ownerIdentity":{"principalId":"A3NL1KOZZKExample"},"arn":"arn:aws:s3:::amzn-s3-demo-bucket"},"object":{"key":"HappyFace.jpg","size":1024,"eTag":"d41d8cd98f00b204e9800998ecf8427e","versionId":"096fKKXTRTtl3on89fVO.nfljtsv6qko","sequencer":"0055AED6DCD90281E5"}}}"#;

    fn received(body: String) -> Received {
        Received {
            message_id: "m-1".into(),
            receipt: "r".into(),
            body: body.into(),
            attrs: vec![],
            sent: None,
            receives: 1,
            group: None,
        }
    }

    fn decoder(events: &[&str], filter: KeyFilter) -> Notifications {
        Notifications {
            events: events.iter().map(|s| s.to_string()).collect(),
            filter,
            format: Format::Cloudevents,
            metadata: Value::Null,
            name: "up".into(),
        }
    }

    #[test]
    fn records_are_named_after_the_adapter_directly_and_inside_sns_envelopes() {
        let direct = format!(r#"{{"Records":[{RECORD}]}}"#);
        let envelope =
            serde_json::json!({"Type": "Notification", "MessageId": "x", "Message": direct})
                .to_string();
        for body in [direct.clone(), envelope] {
            let Made::Events(ev) = decoder(&[], KeyFilter::default())
                .events(&received(body), "arn")
                .unwrap()
            else {
                panic!("skipped")
            };
            assert_eq!(ev.len(), 1);
            let e = &ev[0];
            assert_eq!(
                e.id,
                "C3D13FE58DE4C810.FMyUVURIY8/IgAtTv8xRjskZQpcIZ9KG4V5Wp6S7S/JRWeUWerMUE5JgHvANOjpD"
            );
            assert_eq!(e.source, "aws:s3.us-west-2.amzn-s3-demo-bucket");
            assert_eq!(e.ty, "com.amazonaws.s3.ObjectCreated:Put");
            assert_eq!(e.subject.as_deref(), Some("HappyFace.jpg"));
            assert_eq!(
                e.time.as_ref().unwrap().as_str(),
                "1970-01-01T00:00:00.000Z"
            );
            let data: Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
            assert_eq!(data, serde_json::from_str::<Value>(RECORD).unwrap());
        }
        let only_csv = KeyFilter {
            prefix: None,
            suffix: Some(".csv".into()),
        };
        assert!(matches!(
            decoder(&[], only_csv)
                .events(&received(direct.clone()), "arn")
                .unwrap(),
            Made::Skip("filtered")
        ));
        assert!(matches!(
            decoder(&["s3:ObjectRemoved:*"], KeyFilter::default())
                .events(&received(direct), "arn")
                .unwrap(),
            Made::Skip("filtered")
        ));
        let test_event = r#"{"Service":"Amazon S3","Event":"s3:TestEvent","Time":"2014-10-13T15:57:02.089Z","Bucket":"b","RequestId":"5582815E1AEA5ADF","HostId":"8cLeGAmw"}"#;
        assert!(matches!(
            decoder(&[], KeyFilter::default())
                .events(&received(test_event.into()), "arn")
                .unwrap(),
            Made::Skip("s3_test_event")
        ));
        assert!(decoder(&[], KeyFilter::default())
            .events(&received("hello".into()), "arn")
            .is_err());
        assert!(decoder(&[], KeyFilter::default())
            .events(&received("{}".into()), "arn")
            .is_err());
    }
}
