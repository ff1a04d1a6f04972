//! `kind: slack` — the Slack trigger: one `chat.postMessage` per event, delivered when Slack
//! answers `"ok": true`.
//!
//! The message comes from templates over the event's attributes (`channel`, `message`), or from
//! the event's JSON data: its members `channel`, `text`, `blocks` and `attachments` win, so a
//! Sensor's `payload` (`dest: text`) builds the message from the events. Messages with the same
//! `thread.aggregation_key` go into one thread (Argo's `messageAggregationKey`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sluice_core::pipeline::serve_each;
use sluice_core::template::Template;
use sluice_core::units::HumanDuration;
use sluice_core::{BoxFuture, ConnectorError, Event, Running, SinkConfig, SinkContext, SinkItem};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::{client, retry, RetryConfig, TlsConfig};

/// `kind: slack` options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlackSinkConfig {
    /// A bot token (`xoxb-…`, scope `chat:write`). Take it from a file or the environment:
    /// `${file:/run/secrets/slack-token}`; it never appears in logs.
    pub token: String,
    /// Channel id or name (`C0123…`, `#releases`), a template over the event's attributes. The
    /// data member `channel` overrides it. One of the two must give a channel.
    #[serde(default)]
    pub channel: Option<String>,
    /// The channels messages may go to, whoever names them (exactly as Slack is given them:
    /// `#releases`, `C0123ABCD`). A message for a channel outside the list is rejected, so event
    /// data (a webhook body with a `channel` member) cannot post elsewhere. Empty (the
    /// default): any channel.
    #[serde(default)]
    pub allowed_channels: Vec<String>,
    /// Message text, a template over the event's attributes (`Release {subject}`). The data
    /// member `text` overrides it; without either, the event's data as text.
    #[serde(default)]
    pub message: Option<String>,
    /// Block Kit blocks, a JSON array as text (Argo's `blocks`). The data member `blocks` wins.
    #[serde(default)]
    pub blocks: Option<String>,
    /// Legacy attachments, a JSON array as text. The data member `attachments` wins.
    #[serde(default)]
    pub attachments: Option<String>,
    #[serde(default)]
    pub thread: ThreadConfig,
    #[serde(default)]
    pub sender: Option<SenderConfig>,
    /// Slack's Web API base. Default `https://slack.com/api`.
    #[serde(default = "default_api")]
    pub api_url: String,
    /// Per attempt. Default 10s.
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    /// Transient failures (rate limits with `Retry-After`, 5xx, Slack's `internal_error`) are
    /// retried.
    #[serde(default)]
    pub retry: RetryConfig,
    /// Posts in flight at once. Default 4 (Slack allows about one message per second per
    /// channel; threaded posts go one at a time).
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    #[serde(default)]
    pub tls: TlsConfig,
}

/// `thread:` — replies grouped by key.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadConfig {
    /// A template over the event's attributes; messages with the same value go into the thread
    /// the first of them started. The thread ids of the last 10000 keys are kept (in memory).
    #[serde(default)]
    pub aggregation_key: Option<String>,
    /// Also show replies in the channel (`reply_broadcast`).
    #[serde(default)]
    pub broadcast: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SenderConfig {
    #[serde(default)]
    pub username: Option<String>,
    /// An emoji (`:rocket:`) or an image URL.
    #[serde(default)]
    pub icon: Option<String>,
}

fn default_api() -> String {
    "https://slack.com/api".into()
}
fn default_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_concurrency() -> usize {
    4
}

const THREADS_KEPT: usize = 10_000;

struct Slack {
    uri: Uri,
    auth: HeaderValue,
    channel: Option<Template>,
    allowed_channels: Vec<String>,
    message: Option<Template>,
    blocks: Option<Value>,
    attachments: Option<Value>,
    key: Option<Template>,
    broadcast: bool,
    sender: Option<SenderConfig>,
    timeout: std::time::Duration,
    retry: RetryConfig,
    client: client::HttpClient,
    sink: String,
    retries: metrics::Counter,
    /// aggregation key → (thread ts, last use); held while a threaded message is posted, so
    /// the first message of a key starts the thread and the next ones reply to it.
    threads: Mutex<HashMap<String, (String, u64)>>,
}

impl SlackSinkConfig {
    fn compiled(&self, sink: &str) -> Result<Slack, String> {
        if self.token.trim().is_empty() {
            return Err(
                "token: give the bot token (e.g. `${file:/run/secrets/slack-token}`)".into(),
            );
        }
        let mut auth = HeaderValue::from_str(&format!("Bearer {}", self.token.trim()))
            .map_err(|_| "token: has characters a header cannot carry".to_string())?;
        auth.set_sensitive(true);
        let base = self.api_url.trim_end_matches('/');
        let uri: Uri = format!("{base}/chat.postMessage")
            .parse()
            .map_err(|e| format!("api_url `{}`: {e}", self.api_url))?;
        if !matches!(uri.scheme_str(), Some("http") | Some("https")) || uri.authority().is_none() {
            return Err(format!(
                "api_url `{}`: must be an absolute http(s) URL",
                self.api_url
            ));
        }
        let t = |what: &str, s: &Option<String>| {
            s.as_deref().map(|s| Template::parse(what, s)).transpose()
        };
        let json = |what: &str, s: &Option<String>| {
            s.as_deref()
                .map(|s| match serde_json::from_str::<Value>(s) {
                    Ok(v @ Value::Array(_)) => Ok(v),
                    _ => Err(format!("{what}: must be a JSON array (as text)")),
                })
                .transpose()
        };
        if self.concurrency == 0 || self.concurrency > 256 {
            return Err("concurrency must be between 1 and 256".into());
        }
        self.retry.validate()?;
        self.tls.validate()?;
        if let Some(i) = self
            .allowed_channels
            .iter()
            .position(|c| c.is_empty() || c.trim() != c)
        {
            return Err(format!(
                "allowed_channels.{i}: give a channel name or id, without spaces around it"
            ));
        }
        let channel = t("channel", &self.channel)?;
        if let Some(c) = channel
            .as_ref()
            .filter(|c| c.is_fixed())
            .map(Template::literal)
        {
            if !self.allowed_channels.is_empty() && !self.allowed_channels.contains(&c) {
                return Err(format!("channel: {c} is not in allowed_channels"));
            }
        }
        Ok(Slack {
            uri,
            auth,
            channel,
            allowed_channels: self.allowed_channels.clone(),
            message: t("message", &self.message)?,
            blocks: json("blocks", &self.blocks)?,
            attachments: json("attachments", &self.attachments)?,
            key: t("thread.aggregation_key", &self.thread.aggregation_key)?,
            broadcast: self.thread.broadcast,
            sender: self.sender.clone(),
            timeout: self.timeout.get(),
            retry: self.retry,
            client: client::build(&self.tls, self.timeout.get(), self.concurrency)?,
            sink: sink.to_owned(),
            retries: metrics::counter!(sluice_core::telemetry::SINK_RETRIES, "sink" => sink.to_owned()),
            threads: Mutex::new(HashMap::new()),
        })
    }
}

impl SinkConfig for SlackSinkConfig {
    fn validate(&self, name: &str) -> Result<(), String> {
        self.compiled(name).map(drop)
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let slack = Arc::new(self.compiled(&ctx.name).map_err(ConnectorError::new)?);
            tracing::info!(sink = %ctx.name, api = %slack.uri.authority().map(|a| a.as_str()).unwrap_or(""), "slack sink ready");
            let concurrency = self.concurrency;
            let running: Running = Box::pin(async move {
                let grace = ctx.grace_over.clone();
                serve_each(ctx.input, ctx.grace_over, concurrency, |item| {
                    deliver(slack.clone(), item, grace.clone())
                })
                .await;
                Ok(())
            });
            Ok(running)
        })
    }
}

/// The `chat.postMessage` body for `e` (without `thread_ts`), or why there is none.
fn body(s: &Slack, e: &Event) -> Result<Map<String, Value>, String> {
    let data: Option<Map<String, Value>> = e
        .data
        .as_bytes()
        .and_then(|b| serde_json::from_slice::<Value>(b).ok())
        .and_then(|v| match v {
            Value::Object(m) => Some(m),
            _ => None,
        });
    let member = |k: &str| {
        data.as_ref()
            .and_then(|m| m.get(k))
            .filter(|v| !v.is_null())
            .cloned()
    };
    let fill = |t: &Template| t.render_with(e, |o, v| o.push_str(v));
    let channel = member("channel")
        .and_then(|v| v.as_str().map(str::to_owned))
        .or_else(|| s.channel.as_ref().map(fill))
        .filter(|c| !c.is_empty())
        .ok_or("no channel: set `channel`, or give the event a `channel` data member")?;
    if !s.allowed_channels.is_empty() && !s.allowed_channels.contains(&channel) {
        return Err(format!("channel {channel:?} is not in allowed_channels"));
    }
    let text = member("text")
        .map(|v| match v {
            Value::String(s) => s,
            other => other.to_string(),
        })
        .or_else(|| s.message.as_ref().map(fill))
        .or_else(|| {
            if data.is_some() {
                None
            } else {
                e.data
                    .as_bytes()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
            }
        })
        .unwrap_or_else(|| format!("{} from {}", e.ty, e.source));
    let mut m = Map::new();
    m.insert("channel".into(), json!(channel));
    m.insert("text".into(), json!(text));
    if let Some(b) = member("blocks").or_else(|| s.blocks.clone()) {
        m.insert("blocks".into(), b);
    }
    if let Some(a) = member("attachments").or_else(|| s.attachments.clone()) {
        m.insert("attachments".into(), a);
    }
    if let Some(sender) = &s.sender {
        if let Some(u) = &sender.username {
            m.insert("username".into(), json!(u));
        }
        match sender.icon.as_deref() {
            Some(i) if i.starts_with(':') => {
                m.insert("icon_emoji".into(), json!(i));
            }
            Some(i) => {
                m.insert("icon_url".into(), json!(i));
            }
            None => {}
        }
    }
    Ok(m)
}

enum Attempt {
    /// Slack's `ts` of the message.
    Delivered(String),
    Transient(String, Option<std::time::Duration>),
    Permanent(String),
}

/// Slack errors that a retry cannot fix (the rest are retried).
const PERMANENT: [&str; 16] = [
    "invalid_auth",
    "not_authed",
    "account_inactive",
    "token_revoked",
    "token_expired",
    "no_permission",
    "missing_scope",
    "channel_not_found",
    "not_in_channel",
    "is_archived",
    "msg_too_long",
    "no_text",
    "invalid_blocks",
    "invalid_attachments",
    "too_many_attachments",
    "restricted_action",
];

async fn post(s: &Slack, body: &Map<String, Value>) -> Attempt {
    let bytes = Bytes::from(serde_json::to_vec(body).unwrap_or_default());
    let mut req = Request::new(Full::new(bytes));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = s.uri.clone();
    req.headers_mut().insert(AUTHORIZATION, s.auth.clone());
    req.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    let deadline = tokio::time::Instant::now() + s.timeout;
    let resp = match tokio::time::timeout_at(deadline, s.client.request(req)).await {
        Err(_) => {
            return Attempt::Transient(format!("no answer within timeout ({:?})", s.timeout), None)
        }
        Ok(Err(e)) => return Attempt::Transient(format!("request failed: {e}"), None),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    let asked = resp
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| retry::parse_retry_after(v.as_bytes(), SystemTime::now()));
    let text =
        match tokio::time::timeout_at(deadline, Limited::new(resp.into_body(), 64 << 10).collect())
            .await
        {
            Ok(Ok(b)) => b.to_bytes(),
            _ => Bytes::new(),
        };
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        return Attempt::Transient(format!("HTTP {status}"), asked);
    }
    let answer: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
    match (
        status.is_success(),
        answer["ok"].as_bool(),
        answer["error"].as_str(),
    ) {
        (true, Some(true), _) => Attempt::Delivered(answer["ts"].as_str().unwrap_or("").to_owned()),
        (_, _, Some("ratelimited")) => Attempt::Transient("slack: ratelimited".into(), asked),
        (_, _, Some(e)) if PERMANENT.contains(&e) => Attempt::Permanent(format!("slack: {e}")),
        (_, _, Some(e)) => Attempt::Transient(format!("slack: {e}"), asked),
        _ if status.is_client_error() => Attempt::Permanent(format!("HTTP {status}")),
        _ => Attempt::Transient(format!("HTTP {status}: not a Slack API answer"), None),
    }
}

async fn deliver(s: Arc<Slack>, item: SinkItem, grace_over: CancellationToken) {
    let SinkItem { event, delivery } = item;
    let mut msg = match body(&s, &event) {
        Ok(m) => m,
        Err(reason) => return delivery.rejected(reason),
    };
    let key = s
        .key
        .as_ref()
        .map(|t| t.render_with(&event, |o, v| o.push_str(v)))
        .filter(|k| !k.is_empty());
    // Threaded posts go one at a time, so a key's first message starts its thread.
    let mut threads = match &key {
        Some(_) => Some(s.threads.lock().await),
        None => None,
    };
    if let (Some(k), Some(t)) = (&key, threads.as_ref()) {
        if let Some((ts, _)) = t.get(k) {
            msg.insert("thread_ts".into(), json!(ts));
            if s.broadcast {
                msg.insert("reply_broadcast".into(), json!(true));
            }
        }
    }
    let started = Instant::now();
    let mut attempt = 0u32;
    let outcome = loop {
        attempt += 1;
        match post(&s, &msg).await {
            Attempt::Delivered(ts) => break Ok(ts),
            Attempt::Permanent(r) => break Err((true, r)),
            Attempt::Transient(r, asked) => {
                match retry::next(&s.retry, attempt, asked, started.elapsed()) {
                    retry::Next::GiveUp(why) => break Err((false, format!("{r}; {why}"))),
                    retry::Next::RetryAfter(wait) => {
                        s.retries.increment(1);
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = grace_over.cancelled() => return delivery.failed(format!("stopped while waiting to retry ({r})")),
                        }
                    }
                }
            }
        }
    };
    match outcome {
        Ok(ts) => {
            if let (Some(k), Some(t)) = (key, threads.as_mut()) {
                if !msg.contains_key("thread_ts") && !ts.is_empty() {
                    if t.len() >= THREADS_KEPT {
                        if let Some(oldest) = t
                            .iter()
                            .min_by_key(|(_, (_, at))| *at)
                            .map(|(k, _)| k.clone())
                        {
                            t.remove(&oldest);
                        }
                    }
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    t.insert(k, (ts, now));
                }
            }
            delivery.delivered()
        }
        Err((permanent, reason)) => {
            tracing::warn!(sink = %s.sink, attempts = attempt, permanent, reason = %reason, "slack: message not posted");
            if permanent {
                delivery.rejected(reason)
            } else {
                delivery.failed(reason)
            }
        }
    }
}
