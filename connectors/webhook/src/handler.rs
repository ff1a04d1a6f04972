//! One request: route → method → auth → limits → events → pipeline → honest answer.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE,
};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use metrics::Counter;
use sha2::{Digest, Sha256};
use sluice_core::event::{check_media_type, check_string, Data, Event, ExtValue, Str, Timestamp};
use sluice_core::http_binding;
use sluice_core::telemetry::SourceTelemetry;
use sluice_core::{SendOptions, SourceContext, SourceSender, Status};

use crate::auth::Auth;
use crate::providers::{self, Provider, Verdict};
use crate::server::{BusyGuard, Listener};
use crate::{AckMode, Format, IdFallback, WebhookConfig};

type Resp = Response<Full<Bytes>>;

/// Status codes counted per source in `sluice_webhook_responses_total{source,status}`.
const COUNTED: [u16; 12] = [200, 202, 204, 400, 401, 403, 405, 408, 413, 415, 422, 503];

/// A webhook source, as its listener sees it.
pub(crate) struct Route {
    name: String,
    sender: SourceSender,
    telemetry: SourceTelemetry,
    methods: Vec<http::Method>,
    allow: HeaderValue,
    max_body: u64,
    body_timeout: Duration,
    accept_timeout: Duration,
    ack_timeout: Duration,
    ack: AckMode,
    auth: Option<Auth>,
    id_headers: Vec<HeaderName>,
    id_fallback: IdFallback,
    format: Format,
    ty: Str,
    source: Str,
    subject: Str,
    header_ext: Vec<(HeaderName, Str)>,
    allowed_origins: Vec<String>,
    metadata: Bytes,
    responses: Vec<(u16, Counter)>,
    /// A SaaS provider's verification and naming (`kind: github`, …).
    provider: Option<Arc<dyn Provider>>,
}

/// `X-Request-Id` → `xrequestid`: the header name's lowercase letters and digits.
pub(crate) use sluice_core::event::extension_name_from as extension_name;

impl Route {
    pub(crate) fn new(
        cfg: WebhookConfig,
        provider: Option<Arc<dyn Provider>>,
        ctx: &SourceContext,
    ) -> Result<Route, String> {
        let methods: Vec<http::Method> = cfg.methods.iter().map(|m| m.as_http()).collect();
        let allow = methods
            .iter()
            .map(http::Method::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        let id_headers = cfg
            .id_headers
            .iter()
            .map(|h| HeaderName::try_from(h.as_str()).map_err(|e| format!("id_headers {h:?}: {e}")))
            .collect::<Result<_, _>>()?;
        let header_ext = cfg
            .header_extensions
            .iter()
            .map(|h| {
                HeaderName::try_from(h.as_str())
                    .map(|n| (n, extension_name(h)))
                    .map_err(|e| format!("header_extensions {h:?}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        let metadata = Bytes::from(serde_json::to_vec(&cfg.metadata).map_err(|e| e.to_string())?);
        let name = ctx.name.clone();
        let responses = COUNTED
            .iter()
            .map(|c| {
                (
                    *c,
                    metrics::counter!("sluice_webhook_responses_total", "source" => name.clone(), "status" => c.to_string()),
                )
            })
            .collect();
        Ok(Route {
            telemetry: ctx.sender.telemetry().clone(),
            sender: ctx.sender.clone(),
            allow: HeaderValue::from_str(&allow).map_err(|e| e.to_string())?,
            methods,
            max_body: cfg.max_body.bytes(),
            body_timeout: cfg.body_timeout.get(),
            accept_timeout: cfg.accept_timeout.get(),
            ack_timeout: cfg.ack_timeout.get(),
            ack: cfg.ack,
            auth: cfg.auth.as_ref().map(Auth::new),
            id_headers,
            id_fallback: cfg.id_fallback,
            format: cfg.format,
            ty: cfg.event_type.as_deref().unwrap_or("webhook").into(),
            source: cfg.event_source.as_deref().unwrap_or(&name).into(),
            subject: cfg
                .event_subject
                .as_deref()
                .unwrap_or(match cfg.format {
                    Format::Cloudevents => &cfg.path,
                    Format::Argo => &name,
                })
                .into(),
            header_ext,
            allowed_origins: cfg.allowed_origins.clone(),
            metadata,
            responses,
            provider,
            name,
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn count(&self, r: &Resp) {
        let code = r.status().as_u16();
        if let Some((_, c)) = self.responses.iter().find(|(s, _)| *s == code) {
            c.increment(1);
        }
    }
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// `{"error": "..."}` with `status`.
fn error(status: StatusCode, msg: &str) -> Resp {
    let body = format!(
        "{{\"error\":{}}}",
        serde_json::Value::String(msg.to_owned())
    );
    reply(status, body)
}

fn retry_later(msg: &str) -> Resp {
    let mut r = error(StatusCode::SERVICE_UNAVAILABLE, msg);
    r.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

fn close(mut r: Resp) -> Resp {
    r.headers_mut()
        .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    r
}

pub(crate) async fn handle(
    l: Arc<Listener>,
    req: Request<Incoming>,
    peer: std::net::SocketAddr,
    _busy: BusyGuard,
) -> Result<Resp, Infallible> {
    let path = req.uri().path();
    if path == "/health" {
        return Ok(reply(StatusCode::OK, "{\"status\":\"ok\"}"));
    }
    let Some(route) = l.route(path) else {
        l.not_found.increment(1);
        let msg = format!("no webhook at {path}");
        return Ok(error(StatusCode::NOT_FOUND, &msg));
    };
    let resp = handle_route(&l, &route, req, peer).await;
    route.count(&resp);
    Ok(resp)
}

async fn handle_route(
    l: &Listener,
    route: &Route,
    req: Request<Incoming>,
    peer: std::net::SocketAddr,
) -> Resp {
    let (parts, body) = req.into_parts();
    if parts.method == http::Method::OPTIONS {
        return handshake(route, &parts.headers);
    }
    if !route.methods.contains(&parts.method) {
        let mut r = error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed here; see the Allow header",
        );
        r.headers_mut().insert(ALLOW, route.allow.clone());
        return r;
    }
    if let Some(auth) = &route.auth {
        if let Err(reason) = auth.check(&parts.headers) {
            route.telemetry.rejected("unauthorized", 1);
            let mut r = error(StatusCode::UNAUTHORIZED, reason);
            r.headers_mut()
                .insert(WWW_AUTHENTICATE, auth.challenge.clone());
            return r;
        }
    }
    // A bounded number of requests are handled at once; past that, shed at once rather than
    // hold memory for waiting clients.
    let Some(_permit) = l.in_flight.try_enter() else {
        route.telemetry.rejected("overloaded", 1);
        return retry_later("too many requests in flight; retry later");
    };
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > route.max_body) {
        route.telemetry.rejected("too_large", 1);
        return close(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body larger than max_body",
        ));
    }
    let collect = Limited::new(body, route.max_body as usize).collect();
    tokio::pin!(collect);
    // Fast path: a body that came with its headers (most do) is read at the first poll, and no
    // timer is armed. The poll registers this task's waker as any poll would.
    let first = std::future::poll_fn(|cx| Poll::Ready(collect.as_mut().poll(cx))).await;
    let collected = match first {
        Poll::Ready(r) => Ok(r),
        Poll::Pending => tokio::time::timeout(route.body_timeout, collect).await,
    };
    let body = match collected {
        Err(_) => {
            route.telemetry.rejected("body_timeout", 1);
            return close(error(
                StatusCode::REQUEST_TIMEOUT,
                "the body did not arrive within body_timeout",
            ));
        }
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            route.telemetry.rejected("too_large", 1);
            return close(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body larger than max_body",
            ));
        }
        Ok(Err(e)) => {
            route.telemetry.rejected("bad_body", 1);
            return close(error(
                StatusCode::BAD_REQUEST,
                &format!("could not read the body: {e}"),
            ));
        }
        Ok(Ok(c)) => c.to_bytes(),
    };

    let found = find_headers(&route.id_headers, &parts.headers);
    let events = if let Some(p) = &route.provider {
        match provider_event(route, &**p, &parts.headers, &body, peer) {
            Ok(Verdict::Event { event, fresh }) => {
                finish(route, &found, &parts.headers, event, fresh)
                    .map(|(e, fresh)| (vec![e], fresh))
            }
            Ok(Verdict::Reply(status, body)) => return reply(status, body),
            Ok(Verdict::Filtered) => {
                route.telemetry.filtered(1);
                return reply(StatusCode::OK, "{\"status\":\"filtered\",\"events\":0}");
            }
            Err(r) => return error(r.status, &r.reason),
        }
    } else {
        match route.format {
            Format::Cloudevents => {
                match http_binding::detect_from(found.content_type, found.specversion) {
                    http_binding::Detected::Plain => {
                        plain_event(route, &parts, &found, body).map(|(e, fresh)| (vec![e], fresh))
                    }
                    mode => match http_binding::decode_detected(mode, &parts.headers, body) {
                        Ok(Some(events)) => Ok((events, false)),
                        Ok(None) => Ok((Vec::new(), false)),
                        Err(e) => {
                            Err((StatusCode::BAD_REQUEST, format!("invalid CloudEvent: {e}")))
                        }
                    },
                }
            }
            Format::Argo => {
                argo_event(route, &parts, &found, body).map(|(e, fresh)| (vec![e], fresh))
            }
        }
    };
    let (events, fresh_ids) = match events {
        Ok(e) => e,
        Err((status, msg)) => {
            route.telemetry.rejected("invalid_event", 1);
            return error(status, &msg);
        }
    };
    let n = events.len();
    if n == 0 {
        return reply(StatusCode::OK, "{\"status\":\"delivered\",\"events\":0}");
    }
    // The wait for the sinks is bounded by the sender's deadline table, not a timer per
    // request.
    let within = match route.ack {
        AckMode::Delivered => Some(route.ack_timeout),
        AckMode::Accepted => None,
    };
    let opts = SendOptions {
        timeout: Some(route.accept_timeout),
        skip_dedup: fresh_ids,
        within,
        ..SendOptions::default()
    };
    let pending = match route.sender.send_with(events, opts).await {
        Ok(p) => p,
        Err(_) => {
            route.telemetry.rejected("overloaded", n as u64);
            return retry_later("the pipeline is full (downstream is slow); retry later");
        }
    };
    if route.ack == AckMode::Accepted {
        return reply(
            StatusCode::ACCEPTED,
            format!("{{\"status\":\"accepted\",\"events\":{n}}}"),
        );
    }
    let outcome = pending.await;
    if outcome.deadline_passed() {
        return retry_later(
            "not confirmed within ack_timeout; a retry with the same id is deduplicated",
        );
    }
    match outcome.status {
        Status::Delivered if n == 1 && outcome.duplicates == 0 => reply(
            StatusCode::OK,
            Bytes::from_static(b"{\"status\":\"delivered\",\"events\":1,\"duplicates\":0}"),
        ),
        Status::Delivered => reply(
            StatusCode::OK,
            format!(
                "{{\"status\":\"delivered\",\"events\":{n},\"duplicates\":{}}}",
                outcome.duplicates
            ),
        ),
        Status::InFlight | Status::Failed => retry_later(&format!(
            "not delivered: {}",
            outcome.reason.as_deref().unwrap_or("delivery failed")
        )),
        Status::Rejected => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!(
                "rejected: {}",
                outcome.reason.as_deref().unwrap_or("rejected")
            ),
        ),
    }
}

/// A provider's verification, then its naming. A refusal is counted by reason and logged with
/// the delivery id and the remote address (never the body or a secret).
fn provider_event(
    route: &Route,
    p: &dyn Provider,
    headers: &HeaderMap,
    body: &Bytes,
    peer: std::net::SocketAddr,
) -> Result<Verdict, providers::Refusal> {
    let req = providers::Request {
        headers,
        body,
        now: chrono::Utc::now().timestamp(),
    };
    let naming = providers::Naming {
        source: &route.source,
        subject: &route.subject,
        ty: &route.ty,
        format: route.format,
        metadata: &route.metadata,
    };
    let refused = |r: providers::Refusal| {
        route.telemetry.rejected(r.metric, 1);
        tracing::warn!(
            source = %route.name,
            delivery = p.delivery_id(headers).unwrap_or("-"),
            remote = %peer,
            reason = %r.reason,
            status = r.status.as_u16(),
            "webhook: request refused"
        );
        r
    };
    p.verify(&req).map_err(refused)?;
    p.event(&req, &naming).map_err(refused)
}

/// The CloudEvents webhook validation handshake (abuse protection).
fn handshake(route: &Route, headers: &HeaderMap) -> Resp {
    let Some(origin) = headers.get("webhook-request-origin") else {
        let mut r = reply(StatusCode::NO_CONTENT, Bytes::new());
        r.headers_mut().insert(ALLOW, route.allow.clone());
        return r;
    };
    let allowed = origin.to_str().is_ok_and(|o| {
        route
            .allowed_origins
            .iter()
            .any(|a| a == "*" || a.eq_ignore_ascii_case(o))
    });
    if !allowed {
        return error(StatusCode::FORBIDDEN, "origin not in allowed_origins");
    }
    let mut r = reply(StatusCode::OK, Bytes::new());
    r.headers_mut()
        .insert("webhook-allowed-origin", origin.clone());
    r.headers_mut()
        .insert("webhook-allowed-rate", HeaderValue::from_static("*"));
    r.headers_mut().insert(ALLOW, route.allow.clone());
    r
}

type Reject = (StatusCode, String);

fn header_str<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(value_str)
}

fn value_str(v: &HeaderValue) -> Option<&str> {
    v.to_str().ok().map(str::trim).filter(|s| !s.is_empty())
}

/// Requests with at most this many header values are searched in one pass.
const ID_SCAN_MAX: usize = 12;

/// The headers a generated event is made from, each by its first value as [`HeaderMap::get`]
/// returns it.
#[derive(Default)]
struct Found<'a> {
    /// The first of `id_headers` (in their order) the request carries non-empty.
    id: Option<&'a str>,
    content_type: Option<&'a HeaderValue>,
    traceparent: Option<&'a HeaderValue>,
    tracestate: Option<&'a HeaderValue>,
    /// A `ce-specversion` header is present (a binary-mode CloudEvent).
    specversion: bool,
}

/// Finds `ids`, Content-Type, `ce-specversion` and the tracing headers. A request with few
/// headers (most) is read in one pass, cheaper than a hashed lookup per name.
fn find_headers<'a>(ids: &[HeaderName], headers: &'a HeaderMap) -> Found<'a> {
    if headers.len() > ID_SCAN_MAX || ids.len() > 61 {
        return Found {
            id: ids.iter().find_map(|h| header_str(headers, h)),
            content_type: headers.get(CONTENT_TYPE),
            traceparent: headers.get(&TRACEPARENT),
            tracestate: headers.get(&TRACESTATE),
            specversion: headers.contains_key(&CE_SPECVERSION),
        };
    }
    let mut found = Found::default();
    // Values of one name come in order, its first value first; `seen` skips the later ones
    // (bits 0..=2 the fixed names, 3.. the id headers). A name can be both (an id header
    // named `traceparent`): each role is checked.
    let (mut seen, mut best): (u64, Option<(usize, &str)>) = (0, None);
    for (name, value) in headers {
        let fixed = if name == CONTENT_TYPE {
            Some((0, &mut found.content_type))
        } else if name == TRACEPARENT {
            Some((1, &mut found.traceparent))
        } else if name == TRACESTATE {
            Some((2, &mut found.tracestate))
        } else {
            if name == CE_SPECVERSION {
                found.specversion = true;
            }
            None
        };
        if let Some((bit, slot)) = fixed {
            if seen & (1 << bit) == 0 {
                seen |= 1 << bit;
                *slot = Some(value);
            }
        }
        let Some(i) = ids.iter().position(|h| h == name) else {
            continue;
        };
        let bit = 3 + i;
        if seen & (1 << bit) != 0 {
            continue;
        }
        seen |= 1 << bit;
        if best.is_none_or(|(b, _)| i < b) {
            if let Some(v) = value_str(value) {
                best = Some((i, v));
            }
        }
    }
    found.id = best.map(|(_, v)| v);
    found
}

/// The event id, and whether it is fresh (a UUIDv7 made now, which cannot repeat).
fn event_id(
    route: &Route,
    found: Option<&str>,
    digest_input: &[u8],
    now: chrono::DateTime<chrono::Utc>,
) -> (String, bool) {
    if let Some(id) = found {
        return (id.to_owned(), false);
    }
    match route.id_fallback {
        IdFallback::Uuid => (sluice_core::event::new_event_id_at(now), true),
        IdFallback::BodySha256 => (hex::encode(Sha256::digest(digest_input)), false),
    }
}

/// The id of a plain request's event; `body-sha256` hashes the query string for GET.
fn request_id(
    route: &Route,
    parts: &http::request::Parts,
    found: Option<&str>,
    body: &[u8],
    now: chrono::DateTime<chrono::Utc>,
) -> (String, bool) {
    let digest_input = if parts.method == http::Method::GET {
        parts.uri.query().unwrap_or("").as_bytes()
    } else {
        body
    };
    event_id(route, found, digest_input, now)
}

/// `{key: [values]}` for a query string or a urlencoded form.
fn form_json(input: &[u8]) -> Bytes {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in form_urlencoded::parse(input) {
        map.entry(k.into_owned()).or_default().push(v.into_owned());
    }
    Bytes::from(serde_json::to_vec(&map).unwrap_or_else(|_| b"{}".to_vec()))
}

/// Built once: a `&str` key would be parsed and lowercased on every lookup.
static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
static CE_SPECVERSION: HeaderName = HeaderName::from_static("ce-specversion");

/// Tracing headers and `header_extensions` as extensions (names were checked with the config).
fn add_extensions(
    route: &Route,
    found: &Found<'_>,
    headers: &HeaderMap,
    e: &mut Event,
) -> Result<(), Reject> {
    let tracing = [
        (&TRACEPARENT, "traceparent", found.traceparent),
        (&TRACESTATE, "tracestate", found.tracestate),
    ];
    let configured = route
        .header_ext
        .iter()
        .map(|(h, ext)| (h, ext.as_str(), headers.get(h)));
    for (h, ext, v) in tracing.into_iter().chain(configured) {
        if let Some(v) = v.and_then(|v| v.to_str().ok()) {
            check_string(ext, v, false)
                .map_err(|err| (StatusCode::BAD_REQUEST, format!("header {h}: {err}")))?;
            e.set_extension(ext, ExtValue::String(Str::new(v)));
        }
    }
    Ok(())
}

/// A plain request as a CloudEvent: data is the raw body (GET: the query as JSON).
fn plain_event(
    route: &Route,
    parts: &http::request::Parts,
    found: &Found<'_>,
    body: Bytes,
) -> Result<(Event, bool), Reject> {
    let query = parts.uri.query().unwrap_or("").as_bytes();
    let is_get = parts.method == http::Method::GET;
    // One clock reading for the time and a fresh id.
    let now = chrono::Utc::now();
    let (id, fresh) = request_id(route, parts, found.id, &body, now);
    // Built in place: each builder call would move the whole event once more.
    let mut e = Event {
        id: id.into(),
        source: route.source.clone(),
        ty: route.ty.clone(),
        datacontenttype: None,
        dataschema: None,
        subject: Some(route.subject.clone()),
        time: Some(Timestamp::from_utc(now)),
        extensions: Vec::new(),
        data: Data::None,
    };
    let content_type = found.content_type;
    if is_get {
        e.datacontenttype = Some("application/json".into());
        e.data = Data::Json(form_json(query));
    } else if !body.is_empty() || content_type.is_some() {
        let ct = match content_type {
            Some(v) => {
                let ct = v.to_str().map_err(|_| {
                    (
                        StatusCode::BAD_REQUEST,
                        "Content-Type is not visible ASCII".to_owned(),
                    )
                })?;
                check_media_type(ct).map_err(|e| (StatusCode::BAD_REQUEST, e.0))?;
                Some(ct.to_owned())
            }
            None => Some("application/octet-stream".to_owned()),
        };
        e.data = Data::from_bytes(body, ct.as_deref());
        e.datacontenttype = ct;
    }
    finish(route, found, &parts.headers, e, fresh)
}

/// The common end of a generated event: extensions from headers, then the one check left. Type,
/// source and subject come from the config (checked at start) and the content type was checked
/// by the caller; only the id, which may come from a request header, is left.
fn finish(
    route: &Route,
    found: &Found<'_>,
    headers: &HeaderMap,
    mut e: Event,
    fresh: bool,
) -> Result<(Event, bool), Reject> {
    add_extensions(route, found, headers, &mut e)?;
    // A fresh id is a UUID made here: nothing to check.
    if !fresh {
        check_string("id", &e.id, true).map_err(|err| {
            (
                StatusCode::BAD_REQUEST,
                format!("cannot make a CloudEvent: {err}"),
            )
        })?;
    }
    Ok((e, fresh))
}

/// Go's `textproto.CanonicalMIMEHeaderKey`: `x-github-event` → `X-Github-Event`.
fn canonical(name: &str) -> String {
    let mut up = true;
    name.chars()
        .map(|c| {
            let out = if up {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            };
            up = c == '-';
            out
        })
        .collect()
}

/// The request headers as Go's `http.Header` marshals them: `{Canonical-Name: [values]}`,
/// `Authorization` and `X-Gitlab-Token` left out (secrets never reach the event).
pub(crate) fn write_argo_headers(out: &mut Vec<u8>, headers: &HeaderMap) {
    let mut map: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (k, v) in headers {
        // Secrets that travel in headers never reach the event.
        if k == http::header::AUTHORIZATION || k == "x-gitlab-token" {
            continue;
        }
        if let Ok(v) = v.to_str() {
            map.entry(canonical(k.as_str())).or_default().push(v);
        }
    }
    // A map of strings always serialises.
    let _ = serde_json::to_writer(out, &map);
}

/// Argo Events' webhook event: data `{header, body, metadata}`.
fn argo_event(
    route: &Route,
    parts: &http::request::Parts,
    found: &Found<'_>,
    body: Bytes,
) -> Result<(Event, bool), Reject> {
    let query = parts.uri.query().unwrap_or("").as_bytes();
    let is_get = parts.method == http::Method::GET;
    let now = chrono::Utc::now();
    let (id, fresh) = request_id(route, parts, found.id, &body, now);
    let form = found
        .content_type
        .is_some_and(|v| v.as_bytes() == b"application/x-www-form-urlencoded");
    let body_json: Bytes = if is_get {
        form_json(query)
    } else if form {
        form_json(&body)
    } else if sluice_core::event::is_json(&body) {
        body
    } else if body.is_empty() {
        Bytes::from_static(b"null")
    } else {
        // Argo refuses non-JSON bodies; we keep them, as a JSON string.
        Bytes::from(serde_json::to_vec(&String::from_utf8_lossy(&body)).unwrap_or_default())
    };
    let mut data = Vec::with_capacity(body_json.len() + 256);
    data.extend_from_slice(b"{\"header\":");
    write_argo_headers(&mut data, &parts.headers);
    data.extend_from_slice(b",\"body\":");
    data.extend_from_slice(&body_json);
    data.extend_from_slice(b",\"metadata\":");
    data.extend_from_slice(&route.metadata);
    data.push(b'}');
    let e = Event::new(id, route.source.clone(), route.ty.clone())
        .with_subject(route.subject.clone())
        .with_time(Timestamp::from_utc(now))
        .with_json(data);
    finish(route, found, &parts.headers, e, fresh)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_found_in_one_pass_as_by_lookups() {
        let ids: Vec<HeaderName> = ["x-request-id", "idempotency-key", "x-delivery"]
            .iter()
            .map(|h| HeaderName::from_static(h))
            .collect();
        let lookups = |h: &HeaderMap| ids.iter().find_map(|n| header_str(h, n)).map(str::to_owned);
        let cases: &[&[(&str, &str)]] = &[
            &[],
            &[("content-type", "application/json")],
            &[("idempotency-key", "k1"), ("x-request-id", "r1")],
            &[("x-delivery", "d1"), ("idempotency-key", "k1")],
            // An empty or blank first value counts as absent, even with a later value.
            &[
                ("x-request-id", " "),
                ("x-request-id", "r2"),
                ("x-delivery", "d1"),
            ],
            &[("x-request-id", "r1"), ("x-request-id", "r2")],
            &[("x-delivery", " d1 "), ("host", "h")],
            &[("x-request-id", "caf\u{e9}"), ("x-delivery", "d1")],
            &[
                ("content-type", "text/plain"),
                ("traceparent", "00-a-b-01"),
                ("content-type", "application/json"),
                ("tracestate", "k=v"),
                ("tracestate", "k2=v2"),
                ("idempotency-key", "k1"),
            ],
            &[("ce-specversion", "1.0"), ("x-delivery", "d1")],
        ];
        // An id header that is also one of the fixed names is found in both roles.
        let tp_ids = [TRACEPARENT.clone()];
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT.clone(), HeaderValue::from_static("00-t-p-01"));
        let found = find_headers(&tp_ids, &h);
        assert_eq!(found.id, Some("00-t-p-01"));
        assert!(found.traceparent.is_some());
        let get = |h: &HeaderMap, n: &HeaderName| h.get(n).map(|v| v.as_bytes().to_vec());
        let bytes = |v: Option<&HeaderValue>| v.map(|v| v.as_bytes().to_vec());
        for case in cases {
            let mut h = HeaderMap::new();
            for (k, v) in *case {
                h.append(
                    HeaderName::from_static(k),
                    HeaderValue::from_bytes(v.as_bytes()).unwrap(),
                );
            }
            let found = find_headers(&ids, &h);
            assert_eq!(found.id.map(str::to_owned), lookups(&h), "{case:?}");
            assert_eq!(
                bytes(found.content_type),
                get(&h, &CONTENT_TYPE),
                "{case:?}"
            );
            assert_eq!(bytes(found.traceparent), get(&h, &TRACEPARENT), "{case:?}");
            assert_eq!(bytes(found.tracestate), get(&h, &TRACESTATE), "{case:?}");
            assert_eq!(
                found.specversion,
                h.contains_key(&CE_SPECVERSION),
                "{case:?}"
            );
        }
        // Past the one-pass bound the lookups answer, the same way.
        let mut many = HeaderMap::new();
        for i in 0..ID_SCAN_MAX + 1 {
            many.append(
                HeaderName::from_bytes(format!("x-pad-{i}").as_bytes()).unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        many.insert("idempotency-key", HeaderValue::from_static("k"));
        assert_eq!(find_headers(&ids, &many).id, Some("k"));
    }

    #[test]
    fn canonical_header_names() {
        assert_eq!(canonical("x-github-event"), "X-Github-Event");
        assert_eq!(canonical("content-type"), "Content-Type");
        assert_eq!(canonical("etag"), "Etag");
    }

    #[test]
    fn extension_names_from_headers() {
        assert_eq!(extension_name("X-Request-Id"), "xrequestid");
    }

    #[test]
    fn query_as_json() {
        assert_eq!(
            &form_json(b"a=1&a=2&b=x%20y")[..],
            br#"{"a":["1","2"],"b":["x y"]}"#
        );
        assert_eq!(&form_json(b"")[..], b"{}");
    }
}
