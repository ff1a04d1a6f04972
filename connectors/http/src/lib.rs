//! `kind: http` — the HTTP trigger: posts each event to a URL with the CloudEvents HTTP binding
//! (binary, structured or batched), and counts it delivered only on a success status.
//!
//! Transient failures (connect errors, timeouts, 429, 5xx) are retried with exponential backoff
//! and jitter, honouring `Retry-After`; 410 and other refusals stop at once. What is still not
//! delivered after the last attempt fails upstream, or goes to the sink's `dead_letter`.

pub mod argo;
pub mod client;
pub mod retry;
mod slack;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use indexmap::IndexMap;
use serde::Deserialize;
use sluice_core::http_binding::{self, Mode};
use sluice_core::pipeline::{SinkWindow, Step};
use sluice_core::units::{ByteSize, HumanDuration};
use sluice_core::{
    BoxFuture, ConnectorError, Event, Running, SinkConfig, SinkContext, SinkInput, SinkItem,
};
use tokio_util::sync::CancellationToken;

pub use client::TlsConfig;
pub use retry::RetryConfig;
pub use slack::SlackSinkConfig;

/// `batch:` — how `mode: batched` groups events into one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Events per request at most. Default 100.
    #[serde(default = "default_batch_events")]
    pub max_events: usize,
    /// Request body size to stay under (one larger event still goes alone). Default 1MiB.
    #[serde(default = "default_batch_bytes")]
    pub max_bytes: ByteSize,
    /// How long the first event of a batch waits for more. Default 0: a batch is what is
    /// queued when a request slot is free, so batches grow by themselves while requests are in
    /// flight and a lone event never waits.
    #[serde(default = "default_linger")]
    pub linger: HumanDuration,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            max_events: default_batch_events(),
            max_bytes: default_batch_bytes(),
            linger: default_linger(),
        }
    }
}

fn default_batch_events() -> usize {
    100
}
fn default_batch_bytes() -> ByteSize {
    ByteSize(1 << 20)
}
fn default_linger() -> HumanDuration {
    HumanDuration::from_millis(0)
}

/// `kind: http` options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSinkConfig {
    /// Where events go: an `http://` or `https://` URL.
    pub url: String,
    /// Default POST.
    #[serde(default = "default_method")]
    pub method: String,
    /// `binary` (default), `structured` or `batched`.
    #[serde(default)]
    pub mode: Mode,
    /// Headers sent with every request. Take secrets from files or the environment with
    /// `${file:/run/secrets/token}` or `${TOKEN}`; values never appear in logs.
    #[serde(default)]
    pub headers: IndexMap<String, String>,
    /// Per attempt: connecting, sending and reading the answer. Default 10s.
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    /// Statuses that mean delivered. Default: any 2xx. A 5xx never counts unless listed.
    pub success_codes: Option<Vec<u16>>,
    #[serde(default)]
    pub retry: RetryConfig,
    /// Requests in flight at once (retries waiting included). Default 64.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    #[serde(default)]
    pub batch: BatchConfig,
    /// Custom CA and client certificate (mTLS) for `https://` URLs.
    #[serde(default)]
    pub tls: TlsConfig,
}

fn default_method() -> String {
    "POST".into()
}
fn default_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_concurrency() -> usize {
    64
}

/// Everything a request needs, checked once.
struct Target {
    uri: Uri,
    method: Method,
    headers: HeaderMap,
    mode: Mode,
    success: Option<Vec<u16>>,
    retry: RetryConfig,
    timeout: std::time::Duration,
    client: client::HttpClient,
    sink: String,
    retries: metrics::Counter,
    in_flight: metrics::Gauge,
}

impl HttpSinkConfig {
    fn parsed(&self) -> Result<(Uri, Method, HeaderMap), String> {
        let uri: Uri = self
            .url
            .parse()
            .map_err(|e| format!("url `{}`: {e}", self.url))?;
        match uri.scheme_str() {
            Some("http") | Some("https") if uri.authority().is_some() => {}
            _ => {
                return Err(format!(
                    "url `{}`: must be an absolute http:// or https:// URL",
                    self.url
                ))
            }
        }
        let method = Method::from_bytes(self.method.as_bytes())
            .map_err(|_| format!("method `{}`: not an HTTP method", self.method))?;
        let mut headers = HeaderMap::new();
        for (k, v) in &self.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| format!("headers: `{k}` is not a valid header name"))?;
            let lower = name.as_str();
            if lower.starts_with("ce-")
                || name == CONTENT_TYPE
                || name == http::header::CONTENT_LENGTH
                || name == http::header::TRANSFER_ENCODING
            {
                return Err(format!(
                    "headers: `{k}` is set from the event by the CloudEvents binding; remove it"
                ));
            }
            let mut value = HeaderValue::from_str(v)
                .map_err(|_| format!("headers.{k}: the value has characters a header cannot carry (control characters or non-ASCII)"))?;
            value.set_sensitive(true);
            headers.append(name, value);
        }
        Ok((uri, method, headers))
    }
}

impl SinkConfig for HttpSinkConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        let (uri, _, _) = self.parsed()?;
        self.retry.validate()?;
        self.tls.validate()?;
        let tls_set = self.tls != TlsConfig::default();
        if tls_set && uri.scheme_str() == Some("http") {
            return Err("tls is set but url is http://; use https://".into());
        }
        if self.concurrency == 0 || self.concurrency > 4096 {
            return Err("concurrency must be between 1 and 4096".into());
        }
        if self.timeout.get().is_zero() {
            return Err("timeout must be above 0".into());
        }
        if let Some(codes) = &self.success_codes {
            if codes.is_empty() {
                return Err("success_codes: list at least one status".into());
            }
            if let Some(c) = codes.iter().find(|c| !(100..=599).contains(*c)) {
                return Err(format!("success_codes: {c} is not an HTTP status"));
            }
        }
        if self.batch.max_events == 0 || self.batch.max_bytes.bytes() == 0 {
            return Err("batch.max_events and batch.max_bytes must be above 0".into());
        }
        Ok(())
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let (uri, method, headers) = self.parsed().map_err(ConnectorError::new)?;
            let timeout = self.timeout.get();
            let client =
                client::build(&self.tls, timeout, self.concurrency).map_err(ConnectorError::new)?;
            let label = ctx.name.clone();
            let target = Arc::new(Target {
                uri,
                method,
                headers,
                mode: self.mode,
                success: self.success_codes.clone(),
                retry: self.retry,
                timeout,
                client,
                sink: ctx.name.clone(),
                retries: metrics::counter!(sluice_core::telemetry::SINK_RETRIES, "sink" => label.clone()),
                in_flight: metrics::gauge!(sluice_core::telemetry::SINK_IN_FLIGHT, "sink" => label),
            });
            tracing::info!(sink = %ctx.name, url = %redacted(&target.uri), mode = ?self.mode, "http sink ready");
            let running: Running = Box::pin(run(
                target,
                ctx.input,
                ctx.grace_over,
                self.concurrency,
                self.batch,
            ));
            Ok(running)
        })
    }
}

/// The URL without its query string (which may carry a token) for logs.
fn redacted(uri: &Uri) -> String {
    match (uri.scheme_str(), uri.authority()) {
        (Some(s), Some(a)) => format!(
            "{s}://{}{}",
            a.as_str().rsplit('@').next().unwrap_or(""),
            uri.path()
        ),
        _ => uri.path().to_owned(),
    }
}

/// Takes events off the queue: one per request, or batches in `mode: batched`.
struct Feed {
    input: SinkInput,
    buf: VecDeque<SinkItem>,
    deadline: Option<tokio::time::Instant>,
    closed: bool,
}

impl Feed {
    /// Up to `room` single events (cancel-safe).
    async fn singles(&mut self, room: usize) -> Option<Vec<SinkItem>> {
        let mut out = Vec::new();
        if self.input.recv_many(&mut out, room).await == 0 {
            self.closed = true;
            return None;
        }
        Some(out)
    }

    /// The next batch: full, over the byte bound, lingered long enough, or the last one.
    /// Cancel-safe: everything taken off the queue stays in `self` until returned.
    async fn batch(&mut self, cfg: &BatchConfig) -> Option<Vec<SinkItem>> {
        let max_bytes = cfg.max_bytes.bytes() as usize;
        loop {
            let bytes: usize = self.buf.iter().map(|i| i.event.approx_size()).sum();
            if !self.buf.is_empty()
                && (self.buf.len() >= cfg.max_events || bytes >= max_bytes || self.closed)
            {
                return Some(self.take(cfg.max_events, max_bytes));
            }
            if self.closed {
                return None;
            }
            let mut more = Vec::new();
            if self.buf.is_empty() {
                if self.input.recv_many(&mut more, cfg.max_events).await == 0 {
                    self.closed = true;
                    continue;
                }
                self.deadline = Some(tokio::time::Instant::now() + cfg.linger.get());
            } else {
                let deadline = self.deadline.unwrap_or_else(tokio::time::Instant::now);
                let want = cfg.max_events - self.buf.len();
                match tokio::time::timeout_at(deadline, self.input.recv_many(&mut more, want)).await
                {
                    Err(_) => return Some(self.take(cfg.max_events, max_bytes)),
                    Ok(0) => self.closed = true,
                    Ok(_) => {}
                }
            }
            self.buf.extend(more);
        }
    }

    fn take(&mut self, max_events: usize, max_bytes: usize) -> Vec<SinkItem> {
        let mut out = Vec::new();
        let mut bytes = 0;
        while let Some(item) = self.buf.front() {
            let size = item.event.approx_size();
            if !out.is_empty() && (out.len() >= max_events || bytes + size > max_bytes) {
                break;
            }
            bytes += size;
            out.extend(self.buf.pop_front());
        }
        // What is left has waited already: it goes with the next batch without lingering.
        self.deadline = Some(tokio::time::Instant::now());
        out
    }
}

async fn run(
    target: Arc<Target>,
    input: SinkInput,
    grace_over: CancellationToken,
    concurrency: usize,
    batch: BatchConfig,
) -> Result<(), ConnectorError> {
    let mut feed = Feed {
        input,
        buf: VecDeque::new(),
        deadline: None,
        closed: false,
    };
    let mut in_flight = SinkWindow::new(concurrency);
    loop {
        if feed.closed && feed.buf.is_empty() && in_flight.is_empty() {
            return Ok(());
        }
        let open = !(feed.closed && feed.buf.is_empty());
        let (feed, batch, mode) = (&mut feed, &batch, target.mode);
        let step = in_flight
            .step(&grace_over, open, |room| async move {
                if mode == Mode::Batched {
                    feed.batch(batch).await.map(|b| vec![b])
                } else {
                    feed.singles(room)
                        .await
                        .map(|v| v.into_iter().map(|i| vec![i]).collect())
                }
            })
            .await;
        match step {
            // Grace is over: what is in flight is dropped, and each dropped delivery counts as
            // failed.
            Step::GraceOver => return Ok(()),
            Step::Settled | Step::Idle => {}
            Step::Input(work) => {
                for items in work.into_iter().flatten() {
                    in_flight.push(deliver(target.clone(), items, grace_over.clone()));
                }
            }
        }
    }
}

/// The request body and headers for `items` in the target's mode.
fn encode(target: &Target, items: &[SinkItem]) -> (HeaderMap, Bytes) {
    let mut headers = target.headers.clone();
    let body = match target.mode {
        Mode::Binary => {
            let e = &items[0].event;
            http_binding::encode_binary_headers(e, &mut headers);
            http_binding::binary_body(e)
        }
        Mode::Structured => {
            let (ct, body) = http_binding::encode_structured(&items[0].event);
            headers.insert(CONTENT_TYPE, ct);
            body
        }
        Mode::Batched => {
            let events: Vec<Event> = items.iter().map(|i| (*i.event).clone()).collect();
            let (ct, body) = http_binding::encode_batched(&events);
            headers.insert(CONTENT_TYPE, ct);
            body
        }
    };
    (headers, body)
}

/// How one attempt ended.
enum Attempt {
    Delivered,
    /// Try again (after `Retry-After`, if the target said).
    Transient(String, Option<std::time::Duration>),
    /// Retrying will not help.
    Permanent(String),
}

/// Delivers one request's events: attempts, waits, and reports every delivery once.
async fn deliver(target: Arc<Target>, items: Vec<SinkItem>, shutdown: CancellationToken) {
    target.in_flight.increment(1.0);
    let _gauge = scopeguard(&target.in_flight);
    let (headers, body) = encode(&target, &items);
    let started = Instant::now();
    let mut attempt = 0u32;
    let outcome = loop {
        attempt += 1;
        match attempt_once(&target, headers.clone(), body.clone()).await {
            Attempt::Delivered => break Ok(()),
            Attempt::Permanent(reason) => break Err((true, reason)),
            Attempt::Transient(reason, asked) => {
                match retry::next(&target.retry, attempt, asked, started.elapsed()) {
                    retry::Next::GiveUp(why) => break Err((false, format!("{reason}; {why}"))),
                    retry::Next::RetryAfter(wait) => {
                        target.retries.increment(1);
                        tracing::debug!(sink = %target.sink, attempt, wait = ?wait, reason = %reason, "retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            // Interrupted, not failed for good: the deliveries are dropped,
                            // which fails them upstream without dead-lettering them.
                            _ = shutdown.cancelled() => return,
                        }
                    }
                }
            }
        }
    };
    match outcome {
        Ok(()) => items.into_iter().for_each(|i| i.delivery.delivered()),
        Err((permanent, reason)) => {
            let dead_letter = items.first().is_some_and(|i| i.delivery.has_dead_letter());
            tracing::warn!(
                sink = %target.sink,
                url = %redacted(&target.uri),
                events = items.len(),
                attempts = attempt,
                permanent,
                dead_letter,
                reason = %reason,
                "delivery failed"
            );
            for i in items {
                if permanent {
                    i.delivery.rejected(reason.clone());
                } else {
                    i.delivery.failed(reason.clone());
                }
            }
        }
    }
}

/// Decrements the in-flight gauge when dropped (also when the delivery is cancelled).
struct GaugeGuard<'a>(&'a metrics::Gauge);

fn scopeguard(g: &metrics::Gauge) -> GaugeGuard<'_> {
    GaugeGuard(g)
}

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Answers longer than this are not read for the error message (and the connection is closed).
const MAX_ANSWER: usize = 64 * 1024;

async fn attempt_once(target: &Target, headers: HeaderMap, body: Bytes) -> Attempt {
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = target.method.clone();
    *req.uri_mut() = target.uri.clone();
    *req.headers_mut() = headers;
    // One deadline for the answer's head; the status alone decides the outcome. The body is
    // read (bounded in size, by the same deadline) only so the connection can be reused and for
    // an error message: a slow body never turns an accepted event into a retry.
    let deadline = tokio::time::Instant::now() + target.timeout;
    let resp = match tokio::time::timeout_at(deadline, target.client.request(req)).await {
        Err(_) => {
            return Attempt::Transient(
                format!("no answer within timeout ({:?})", target.timeout),
                None,
            )
        }
        Ok(Err(e)) => return Attempt::Transient(error_chain(&e), None),
        Ok(Ok(resp)) => resp,
    };
    let status = resp.status();
    let asked = resp
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| retry::parse_retry_after(v.as_bytes(), SystemTime::now()));
    let body = Limited::new(resp.into_body(), MAX_ANSWER).collect();
    let text = match tokio::time::timeout_at(deadline, body).await {
        Ok(Ok(b)) => b.to_bytes(),
        _ => Bytes::new(),
    };
    classify(target, status, asked, &text)
}

fn classify(
    target: &Target,
    status: StatusCode,
    asked: Option<std::time::Duration>,
    text: &[u8],
) -> Attempt {
    let ok = match &target.success {
        Some(codes) => codes.contains(&status.as_u16()),
        None => status.is_success(),
    };
    if ok {
        return Attempt::Delivered;
    }
    let snippet = String::from_utf8_lossy(&text[..text.len().min(200)]);
    let snippet = snippet.trim();
    let reason = if snippet.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {snippet}")
    };
    if status == StatusCode::GONE {
        Attempt::Permanent(format!("{reason} (410: the target asks not to send again)"))
    } else if status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
        || status.is_server_error()
    {
        Attempt::Transient(reason, asked)
    } else {
        Attempt::Permanent(reason)
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let s_msg = s.to_string();
        if !msg.contains(&s_msg) {
            msg.push_str(": ");
            msg.push_str(&s_msg);
        }
        cur = s.source();
    }
    msg
}
