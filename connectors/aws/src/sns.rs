//! `kind: sns`: an HTTP endpoint for SNS subscriptions.
//!
//! Every message is checked before anything else happens: its `TopicArn` must be on the
//! allow-list, its `Timestamp` within `max_age`, and its signature (version 1: RSA SHA1,
//! version 2: RSA SHA256, over the canonical string of the message type) must verify with the
//! signing certificate, which is fetched only over HTTPS from a host of the SNS pattern
//! (`sns.<region>.amazonaws.com[.cn]`, or one of `cert_hosts`) and cached.
//!
//! - `SubscriptionConfirmation`: confirmed (a GET of `SubscribeURL`, same host rule) only for
//!   allow-listed topics; no event.
//! - `UnsubscribeConfirmation`: logged; no event.
//! - `Notification`: one CloudEvent per the CloudEvents SNS adapter (id = `MessageId`); the
//!   answer is 200 only after its sinks confirmed it, so SNS retries otherwise.
//! - Raw message delivery (`x-amz-sns-rawdelivery: true`) carries no signature: refused unless
//!   `raw: true`.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Deserialize;
use sluice_core::event::{Event, Timestamp};
use sluice_core::pipeline::SendOptions;
use sluice_core::units::{ByteSize, HumanDuration};
use sluice_core::{
    BoxFuture, ConnectorError, Running, SourceConfig, SourceContext, SourceSender, Status,
};

/// `format:` of an SNS source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// Named after the CloudEvents SNS adapter (default).
    #[default]
    Cloudevents,
    /// Argo Events' SNS event: type `sns`, data `{header, body: <the SNS message>, metadata}`.
    Argo,
}

/// `kind: sns` source options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnsSourceConfig {
    /// Address to listen on. Default `0.0.0.0:12001`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Request path. Default `/sns`.
    #[serde(default = "default_path")]
    pub path: String,
    /// Topics whose messages are accepted and whose subscriptions are confirmed. Required.
    pub topic_arns: Vec<String>,
    /// Messages whose `Timestamp` is further than this from now are refused (replays).
    /// Default 1h (SNS retries an HTTP delivery for up to about an hour by default).
    #[serde(default = "one_hour")]
    pub max_age: HumanDuration,
    /// Confirm subscriptions of allow-listed topics. Default true.
    #[serde(default = "yes")]
    pub confirm: bool,
    /// Accept raw message delivery, which SNS does not sign. Default false.
    #[serde(default)]
    pub raw: bool,
    /// Hosts (`host` or `host:port`) the signing certificate and `SubscribeURL` may come from
    /// besides `sns.<region>.amazonaws.com[.cn]` (a private endpoint, tests). Always HTTPS.
    #[serde(default)]
    pub cert_hosts: Vec<String>,
    /// PEM CA bundle to trust for fetching certificates, instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// How long a notification waits for its sinks before the answer is 503 (SNS retries).
    /// Default 10s (SNS stops waiting for an HTTP endpoint's answer after about 15 s).
    #[serde(default = "ten_seconds")]
    pub ack_timeout: HumanDuration,
    /// Largest request body. Default 1536KiB: an SNS message is at most 256 KiB, but JSON
    /// escaping in the envelope can more than double it, and a 413 is not retried by SNS.
    #[serde(default = "default_max_body")]
    pub max_body: ByteSize,
    #[serde(default)]
    pub format: Format,
    /// `argo`: `data.metadata`.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// `argo`: the events' `source` (Argo's EventSource name). Default: the source's name.
    #[serde(default, rename = "source")]
    pub event_source: Option<String>,
    /// `argo`: the events' `subject` (Argo's event name). Default: the source's name.
    #[serde(default, rename = "subject")]
    pub event_subject: Option<String>,
    /// Serve HTTPS with this certificate (SNS posts to `https://` endpoints only with a
    /// certificate a public CA signed).
    pub tls: Option<ServerTls>,
}

/// `tls: { cert, key }`: PEM certificate chain and private key.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ServerTls {
    fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.cert)
            .and_then(|it| it.collect::<Result<_, _>>())
            .map_err(|e| format!("tls.cert {}: {e}", self.cert.display()))?;
        if chain.is_empty() {
            return Err(format!(
                "tls.cert {}: no certificate found",
                self.cert.display()
            ));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| format!("tls.key {}: {e}", self.key.display()))?;
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("tls: the key does not fit the certificate: {e}"))?;
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 12001))
}
fn default_path() -> String {
    "/sns".into()
}
fn one_hour() -> HumanDuration {
    HumanDuration::from_secs(3600)
}
fn ten_seconds() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn yes() -> bool {
    true
}
fn default_max_body() -> ByteSize {
    ByteSize(1536 * 1024)
}

impl SourceConfig for SnsSourceConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        if self.topic_arns.is_empty() {
            return Err("topic_arns: name at least one topic ARN to accept (messages of other topics are refused)".into());
        }
        for t in &self.topic_arns {
            crate::check_topic_arn(t).map_err(|e| format!("topic_arns: {e}"))?;
        }
        if !self.path.starts_with('/') {
            return Err(format!("path {:?} must start with /", self.path));
        }
        if self.max_age.get() < Duration::from_secs(1) {
            return Err("max_age must be at least 1s".into());
        }
        for h in &self.cert_hosts {
            if h.is_empty() || h.contains('/') || h.contains("://") {
                return Err(format!(
                    "cert_hosts: {h:?} must be a host or host:port, without scheme or path"
                ));
            }
        }
        Ok(())
    }

    fn build(
        self: Box<Self>,
        ctx: SourceContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let name = ctx.name.clone();
            let err = |m: String| ConnectorError(format!("sns source {name}: {m}"));
            let client = https_client(self.ca.as_ref()).map_err(err)?;
            let tls = self
                .tls
                .as_ref()
                .map(ServerTls::acceptor)
                .transpose()
                .map_err(err)?;
            let listener = tokio::net::TcpListener::bind(self.listen)
                .await
                .map_err(|e| {
                    err(format!(
                        "cannot listen on {} ({e}); is another process using the port?",
                        self.listen
                    ))
                })?;
            let endpoint = Arc::new(Endpoint {
                metadata: serde_json::to_value(&self.metadata).unwrap_or_default(),
                certs: Mutex::new(HashMap::new()),
                client,
                fetches: tokio::sync::Semaphore::new(4),
                sender: ctx.sender.clone(),
                name: name.clone(),
                cfg: *self,
            });
            tracing::info!(source = %name, listen = %endpoint.cfg.listen, path = %endpoint.cfg.path, "sns: listening");
            Ok(Box::pin(serve(listener, tls, endpoint, ctx)) as Running)
        })
    }
}

/// Connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 1024;

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

fn https_client(ca: Option<&PathBuf>) -> Result<HttpsClient, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(ca) => {
            let certs = CertificateDer::pem_file_iter(ca)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("ca {}: {e}", ca.display()))?;
            if roots.add_parsable_certificates(certs).0 == 0 {
                return Err(format!("ca {}: no usable CA certificate", ca.display()));
            }
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(Duration::from_secs(5)));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new()).build(https))
}

async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    endpoint: Arc<Endpoint>,
    ctx: SourceContext,
) -> Result<(), ConnectorError> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    // Connection tasks, owned here: bounded in number, and ended after the drain's bound (each
    // holds the endpoint, whose sender keeps the pipeline open).
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (stream, _) = tokio::select! {
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = listener.accept(), if conns.len() < MAX_CONNECTIONS => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(source = %endpoint.name, error = %e, "sns: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = ctx.shutdown.cancelled() => break,
        };
        let ep = endpoint.clone();
        let svc = hyper::service::service_fn(move |req| {
            let ep = ep.clone();
            async move { Ok::<_, std::convert::Infallible>(ep.handle(req).await) }
        });
        let http = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10))
            .clone();
        match &tls {
            None => {
                let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), svc));
                conns.spawn(async move {
                    let _ = conn.await;
                });
            }
            Some(acceptor) => {
                // The handshake runs on the connection's own task, bounded, so a slow client
                // does not hold the accept loop.
                let (acceptor, watcher) = (acceptor.clone(), graceful.watcher());
                let name = endpoint.name.clone();
                conns.spawn(async move {
                    let tls = match tokio::time::timeout(
                        Duration::from_secs(10),
                        acceptor.accept(stream),
                    )
                    .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(source = %name, error = %e, "sns: TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                    let _ = watcher
                        .watch(http.serve_connection(TokioIo::new(tls), svc))
                        .await;
                });
            }
        }
    }
    drop(listener);
    // Requests in progress finish (each bounded by ack_timeout); connections then close.
    let bound = endpoint.cfg.ack_timeout.get() + Duration::from_secs(5);
    let _ = tokio::time::timeout(bound, graceful.shutdown()).await;
    conns.abort_all();
    while conns.join_next().await.is_some() {}
    tracing::debug!(source = %endpoint.name, "sns: stopped");
    Ok(())
}

/// The SNS message body (the fields the signature and the event need).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct Envelope {
    #[serde(rename = "Type")]
    pub kind: String,
    pub message_id: String,
    pub topic_arn: String,
    pub subject: Option<String>,
    pub message: String,
    pub timestamp: String,
    pub signature_version: String,
    pub signature: String,
    #[serde(rename = "SigningCertURL")]
    pub signing_cert_url: String,
    #[serde(rename = "SubscribeURL")]
    pub subscribe_url: Option<String>,
    pub token: Option<String>,
}

/// The string SNS signs: `Key\nValue\n` for the type's keys in byte order.
pub(crate) fn canonical(e: &Envelope) -> Result<String, &'static str> {
    let mut out = String::with_capacity(e.message.len() + 256);
    let mut add = |k: &str, v: &str| {
        out.push_str(k);
        out.push('\n');
        out.push_str(v);
        out.push('\n');
    };
    match e.kind.as_str() {
        "Notification" => {
            add("Message", &e.message);
            add("MessageId", &e.message_id);
            if let Some(s) = &e.subject {
                add("Subject", s);
            }
            add("Timestamp", &e.timestamp);
            add("TopicArn", &e.topic_arn);
            add("Type", &e.kind);
        }
        "SubscriptionConfirmation" | "UnsubscribeConfirmation" => {
            add("Message", &e.message);
            add("MessageId", &e.message_id);
            add(
                "SubscribeURL",
                e.subscribe_url
                    .as_deref()
                    .ok_or("SubscribeURL is missing")?,
            );
            add("Timestamp", &e.timestamp);
            add("Token", e.token.as_deref().ok_or("Token is missing")?);
            add("TopicArn", &e.topic_arn);
            add("Type", &e.kind);
        }
        _ => {
            return Err(
                "Type is not Notification, SubscriptionConfirmation or UnsubscribeConfirmation",
            )
        }
    }
    Ok(out)
}

/// Whether `url` is HTTPS on a host SNS signs from: `sns.<region>.amazonaws.com[.cn]`
/// (region: 3 or more letters, digits, `-`), or one of `extra` (`host` or `host:port`). On an
/// SNS host a certificate URL (`cert`) must also be SNS's own form,
/// `/SimpleNotificationService-<hex>.pem` without a query, so that unsigned requests cannot make
/// Sluice fetch arbitrary paths.
pub(crate) fn allowed_url(url: &str, extra: &[String], cert: bool) -> bool {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return false;
    };
    if uri.scheme_str() != Some("https") {
        return false;
    }
    let Some(auth) = uri.authority() else {
        return false;
    };
    if auth.as_str().contains('@') {
        return false;
    }
    if extra.iter().any(|h| {
        h.eq_ignore_ascii_case(auth.as_str())
            || h.eq_ignore_ascii_case(auth.host()) && auth.port().is_none()
    }) {
        return true;
    }
    if auth.port().is_some() {
        return false;
    }
    let host = auth.host().to_ascii_lowercase();
    let rest = host
        .strip_suffix(".amazonaws.com")
        .or_else(|| host.strip_suffix(".amazonaws.com.cn"));
    let sns_host = rest
        .and_then(|r| r.strip_prefix("sns."))
        .is_some_and(|region| {
            region.len() >= 3
                && region
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if !sns_host || !cert {
        return sns_host;
    }
    let name = uri
        .path()
        .strip_prefix("/SimpleNotificationService-")
        .and_then(|p| p.strip_suffix(".pem"));
    uri.query().is_none()
        && name.is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Verifies `signature` (base64) over `canonical` with the certificate's RSA key: SHA1 for
/// version 1, SHA256 for version 2. The certificate must be within its validity period.
pub(crate) fn verify(
    cert_der: &[u8],
    version: &str,
    canonical: &[u8],
    signature: &str,
) -> Result<(), &'static str> {
    use aws_lc_rs::signature;
    let alg: &dyn signature::VerificationAlgorithm = match version {
        "1" => &signature::RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
        "2" => &signature::RSA_PKCS1_2048_8192_SHA256,
        _ => return Err("SignatureVersion is not 1 or 2"),
    };
    let sig = base64::engine::general_purpose::STANDARD
        .decode(signature)
        .map_err(|_| "Signature is not base64")?;
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der)
        .map_err(|_| "the signing certificate is not an X.509 certificate")?;
    if !cert.validity().is_valid() {
        return Err("the signing certificate is expired or not yet valid");
    }
    let key = &cert.tbs_certificate.subject_pki.subject_public_key.data;
    signature::UnparsedPublicKey::new(alg, key.as_ref())
        .verify(canonical, &sig)
        .map_err(|_| "the signature does not match")
}

struct Endpoint {
    name: String,
    cfg: SnsSourceConfig,
    metadata: serde_json::Value,
    /// Signing certificates by URL (DER). Bounded: a full cache is cleared.
    certs: Mutex<HashMap<String, Arc<Vec<u8>>>>,
    client: HttpsClient,
    /// Outbound fetches (certificates, confirmations) at once.
    fetches: tokio::sync::Semaphore,
    sender: SourceSender,
}

fn answer(status: StatusCode, text: impl Into<String>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(text.into() + "\n")));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

impl Endpoint {
    fn refuse(
        &self,
        status: StatusCode,
        metric: &'static str,
        reason: &str,
        message_id: &str,
    ) -> Response<Full<Bytes>> {
        tracing::warn!(source = %self.name, message = %message_id, reason, "sns: refused");
        self.sender.telemetry().rejected(metric, 1);
        answer(status, reason)
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        if req.uri().path() != self.cfg.path {
            return answer(StatusCode::NOT_FOUND, "no SNS endpoint at this path");
        }
        if req.method() != Method::POST {
            return answer(StatusCode::METHOD_NOT_ALLOWED, "SNS posts: use POST");
        }
        let headers = req.headers().clone();
        let limit = self.cfg.max_body.bytes() as usize;
        let read = tokio::time::timeout(
            Duration::from_secs(10),
            Limited::new(req.into_body(), limit).collect(),
        );
        let Ok(read) = read.await else {
            return answer(
                StatusCode::REQUEST_TIMEOUT,
                "the body did not arrive within 10s",
            );
        };
        let body = match read {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    return self.refuse(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "too_large",
                        "body larger than max_body",
                        "",
                    );
                }
                return answer(StatusCode::BAD_REQUEST, "cannot read the body");
            }
        };
        let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("");
        if header("x-amz-sns-rawdelivery").eq_ignore_ascii_case("true") {
            return self.raw(&headers, body).await;
        }
        let env: Envelope = match serde_json::from_slice(&body) {
            Ok(e) => e,
            Err(e) => {
                return self.refuse(
                    StatusCode::BAD_REQUEST,
                    "invalid_message",
                    &format!("not an SNS message: {e}"),
                    "",
                )
            }
        };
        if !self.cfg.topic_arns.contains(&env.topic_arn) {
            return self.refuse(
                StatusCode::FORBIDDEN,
                "topic_not_allowed",
                &format!("topic {} is not in topic_arns", env.topic_arn),
                &env.message_id,
            );
        }
        let Ok(at) = Timestamp::parse(&env.timestamp) else {
            return self.refuse(
                StatusCode::BAD_REQUEST,
                "invalid_message",
                "Timestamp is not an RFC 3339 time",
                &env.message_id,
            );
        };
        let age = (chrono::Utc::now() - at.instant().to_utc()).abs();
        if age.to_std().unwrap_or(Duration::MAX) > self.cfg.max_age.get() {
            return self.refuse(
                StatusCode::UNAUTHORIZED,
                "stale",
                "Timestamp is further from now than max_age",
                &env.message_id,
            );
        }
        let text = match canonical(&env) {
            Ok(t) => t,
            Err(r) => {
                return self.refuse(
                    StatusCode::BAD_REQUEST,
                    "invalid_message",
                    r,
                    &env.message_id,
                )
            }
        };
        if !allowed_url(&env.signing_cert_url, &self.cfg.cert_hosts, true) {
            return self.refuse(
                StatusCode::UNAUTHORIZED,
                "bad_cert_url",
                "SigningCertURL is not HTTPS on an SNS host",
                &env.message_id,
            );
        }
        let cert = match self.cert(&env.signing_cert_url).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(source = %self.name, url = %env.signing_cert_url, error = %e, "sns: cannot fetch the signing certificate; answered 503 so SNS retries");
                return answer(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "cannot fetch the signing certificate; retry later",
                );
            }
        };
        if let Err(r) = verify(
            &cert,
            &env.signature_version,
            text.as_bytes(),
            &env.signature,
        ) {
            return self.refuse(
                StatusCode::UNAUTHORIZED,
                "bad_signature",
                r,
                &env.message_id,
            );
        }
        match env.kind.as_str() {
            "SubscriptionConfirmation" => self.confirm(&env).await,
            "UnsubscribeConfirmation" => {
                tracing::info!(source = %self.name, topic = %env.topic_arn, "sns: unsubscribed from the topic");
                answer(StatusCode::OK, "ok")
            }
            _ => {
                let event = match self.event(&env, &headers, &body) {
                    Ok(e) => e,
                    Err(r) => {
                        return self.refuse(
                            StatusCode::BAD_REQUEST,
                            "invalid_event",
                            &r,
                            &env.message_id,
                        )
                    }
                };
                self.deliver(event).await
            }
        }
    }

    async fn cert(&self, url: &str) -> Result<Arc<Vec<u8>>, String> {
        if let Some(c) = self
            .certs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(url)
        {
            return Ok(c.clone());
        }
        let pem = self.get(url).await?;
        use rustls::pki_types::pem::PemObject;
        let der = rustls::pki_types::CertificateDer::from_pem_slice(&pem)
            .map_err(|e| format!("not a PEM certificate: {e}"))?;
        let der = Arc::new(der.as_ref().to_vec());
        let mut certs = self.certs.lock().unwrap_or_else(|p| p.into_inner());
        if certs.len() >= 64 {
            certs.clear();
        }
        certs.insert(url.to_owned(), der.clone());
        Ok(der)
    }

    /// A GET over HTTPS, bounded in time and size, at most 4 at once.
    async fn get(&self, url: &str) -> Result<Bytes, String> {
        let _permit = tokio::time::timeout(Duration::from_secs(10), self.fetches.acquire())
            .await
            .map_err(|_| "too many fetches waiting".to_string())?
            .map_err(|e| e.to_string())?;
        let req = Request::get(url)
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(Duration::from_secs(10), self.client.request(req))
            .await
            .map_err(|_| "no answer within 10s".to_string())?
            .map_err(|e| format!("{e:?}"))?;
        if !resp.status().is_success() {
            return Err(format!("answered {}", resp.status()));
        }
        let body = tokio::time::timeout(
            Duration::from_secs(10),
            Limited::new(resp.into_body(), 64 * 1024).collect(),
        )
        .await
        .map_err(|_| "body not read within 10s".to_string())?
        .map_err(|e| e.to_string())?;
        Ok(body.to_bytes())
    }

    async fn confirm(&self, env: &Envelope) -> Response<Full<Bytes>> {
        if !self.cfg.confirm {
            tracing::info!(source = %self.name, topic = %env.topic_arn, "sns: subscription confirmation received; confirm: false, so it is left to the operator");
            return answer(StatusCode::OK, "not confirmed (confirm: false)");
        }
        let url = env.subscribe_url.as_deref().unwrap_or("");
        if !allowed_url(url, &self.cfg.cert_hosts, false) {
            return self.refuse(
                StatusCode::UNAUTHORIZED,
                "bad_subscribe_url",
                "SubscribeURL is not HTTPS on an SNS host",
                &env.message_id,
            );
        }
        match self.get(url).await {
            Ok(_) => {
                tracing::info!(source = %self.name, topic = %env.topic_arn, "sns: subscription confirmed");
                answer(StatusCode::OK, "subscription confirmed")
            }
            Err(e) => {
                tracing::warn!(source = %self.name, topic = %env.topic_arn, error = %e, "sns: subscription confirmation failed; SNS will send it again");
                answer(
                    StatusCode::BAD_GATEWAY,
                    "cannot confirm the subscription; retry later",
                )
            }
        }
    }

    /// A notification as the CloudEvents SNS adapter names it, or in Argo's shape.
    fn event(
        &self,
        env: &Envelope,
        headers: &http::HeaderMap,
        body: &Bytes,
    ) -> Result<Event, String> {
        let time = Timestamp::parse(&env.timestamp).map_err(|e| e.to_string())?;
        if self.cfg.format == Format::Argo {
            let mut h = serde_json::Map::new();
            for (k, v) in headers {
                if let Ok(v) = v.to_str() {
                    if let Some(a) = h
                        .entry(canonical_header(k.as_str()))
                        .or_insert_with(|| serde_json::Value::Array(vec![]))
                        .as_array_mut()
                    {
                        a.push(v.into());
                    }
                }
            }
            let envelope: serde_json::Value =
                serde_json::from_slice(body).map_err(|e| e.to_string())?;
            let data =
                serde_json::json!({"header": h, "body": envelope, "metadata": self.metadata});
            let source = self.cfg.event_source.as_deref().unwrap_or(&self.name);
            let subject = self.cfg.event_subject.as_deref().unwrap_or(&self.name);
            return Ok(Event::new(&*env.message_id, source, "sns")
                .with_subject(subject)
                .with_time(Timestamp::now())
                .with_json(serde_json::to_vec(&data).map_err(|e| e.to_string())?));
        }
        // The header is not signed: taken only when it names a subscription of the signed topic
        // (`<TopicArn>:<id>`), else the topic; the source is part of the dedup key.
        let source = headers
            .get("x-amz-sns-subscription-arn")
            .and_then(|v| v.to_str().ok())
            .filter(|s| {
                s.strip_prefix(env.topic_arn.as_str())
                    .and_then(|r| r.strip_prefix(':'))
                    .is_some_and(|id| !id.is_empty() && !id.contains(':'))
            })
            .unwrap_or(&env.topic_arn);
        let mut e = Event::new(
            &*env.message_id,
            source,
            format!("com.amazonaws.sns.{}", env.kind),
        )
        .with_time(time)
        .with_json(body.clone());
        e.datacontenttype = Some("application/json".into());
        if let Some(s) = &env.subject {
            e = e.with_subject(&**s);
        }
        e.validate().map_err(|e| e.to_string())?;
        Ok(e)
    }

    /// Raw message delivery: no signature exists, so only with `raw: true`; the topic header
    /// must still be on the allow-list.
    async fn raw(&self, headers: &http::HeaderMap, body: Bytes) -> Response<Full<Bytes>> {
        let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("");
        let id = h("x-amz-sns-message-id");
        if !self.cfg.raw {
            return self.refuse(
                StatusCode::UNAUTHORIZED,
                "unsigned",
                "raw message delivery is not signed; set raw: true to accept it",
                id,
            );
        }
        let topic = h("x-amz-sns-topic-arn");
        if !self.cfg.topic_arns.iter().any(|t| t == topic) {
            return self.refuse(
                StatusCode::FORBIDDEN,
                "topic_not_allowed",
                "x-amz-sns-topic-arn is not in topic_arns",
                id,
            );
        }
        if id.is_empty() {
            return self.refuse(
                StatusCode::BAD_REQUEST,
                "missing_header",
                "x-amz-sns-message-id is missing",
                id,
            );
        }
        let sub = h("x-amz-sns-subscription-arn");
        let sub = if sub.strip_prefix(topic).is_some_and(|r| r.starts_with(':')) {
            sub
        } else {
            ""
        };
        let ct = sluice_core::event::guess_content_type(&body);
        let data = sluice_core::Data::from_bytes(body, Some(ct));
        let e = Event::new(
            id,
            if sub.is_empty() { topic } else { sub },
            "com.amazonaws.sns.Notification",
        )
        .with_time(Timestamp::now())
        .with_data(Some(ct.into()), data);
        if let Err(err) = e.validate() {
            return self.refuse(
                StatusCode::BAD_REQUEST,
                "invalid_event",
                &err.to_string(),
                id,
            );
        }
        self.deliver(e).await
    }

    /// 200 once the sinks confirmed the event (or it is a duplicate of one that was); 503
    /// otherwise, so that SNS retries.
    async fn deliver(&self, e: Event) -> Response<Full<Bytes>> {
        let opts = SendOptions {
            timeout: Some(Duration::from_secs(1)),
            ..SendOptions::default()
        };
        let Ok(pending) = self.sender.send_with(vec![e], opts).await else {
            return answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "the pipeline is full; retry later",
            );
        };
        match tokio::time::timeout(self.cfg.ack_timeout.get(), pending).await {
            Ok(o) if o.status == Status::Delivered => answer(StatusCode::OK, "delivered"),
            Ok(o) if o.status == Status::Rejected => answer(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("rejected: {}", o.reason.unwrap_or_default()),
            ),
            Ok(o) => answer(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "not delivered: {}; retry later",
                    o.reason.unwrap_or_default()
                ),
            ),
            Err(_) => answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "not delivered within ack_timeout; retry later",
            ),
        }
    }
}

/// `x-amz-sns-message-type` → `X-Amz-Sns-Message-Type` (Go's canonical form, as Argo shows it).
fn canonical_header(name: &str) -> String {
    name.split('-')
        .map(|p| {
            let mut c = p.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_urls_only_https_on_sns_hosts() {
        let none: Vec<String> = vec![];
        let cert = |u: &str, extra: &[String]| allowed_url(u, extra, true);
        assert!(cert(
            "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-9c6465fa7f48f5cacd23014631ec1136.pem",
            &none
        ));
        assert!(cert(
            "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem",
            &none
        ));
        for bad in [
            "http://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
            "https://sns.us-east-1.amazonaws.com.evil.com/SimpleNotificationService-abc.pem",
            "https://evil.com/sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
            "https://sns.us.amazonaws.com/SimpleNotificationService-abc.pem",
            "https://s3.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
            "https://user@sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
            "https://sns.us-east-1.amazonaws.com:8443/SimpleNotificationService-abc.pem",
            // SNS's host, but not SNS's certificate file names: unsigned requests must not
            // choose what Sluice fetches.
            "https://sns.us-east-1.amazonaws.com/x.pem",
            "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem?n=1",
            "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-zz.pem",
            "not a url",
        ] {
            assert!(!cert(bad, &none), "{bad} allowed");
        }
        // SubscribeURL: any path on an SNS host.
        assert!(allowed_url(
            "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&Token=t",
            &none,
            false
        ));
        assert!(!allowed_url(
            "http://sns.us-east-1.amazonaws.com/?Action=x",
            &none,
            false
        ));
        let extra = vec!["127.0.0.1:8443".to_string()];
        assert!(cert("https://127.0.0.1:8443/c.pem", &extra));
        assert!(!cert("http://127.0.0.1:8443/c.pem", &extra));
        assert!(!cert("https://127.0.0.1:9443/c.pem", &extra));
    }

    #[test]
    fn canonical_strings_follow_the_type() {
        let mut e = Envelope {
            kind: "Notification".into(),
            message_id: "id".into(),
            topic_arn: "arn:aws:sns:us-east-1:1:t".into(),
            subject: None,
            message: "hello\nworld".into(),
            timestamp: "2026-01-01T00:00:00.000Z".into(),
            signature_version: "2".into(),
            signature: String::new(),
            signing_cert_url: String::new(),
            subscribe_url: Some("https://x".into()),
            token: Some("tok".into()),
        };
        assert_eq!(
            canonical(&e).unwrap(),
            "Message\nhello\nworld\nMessageId\nid\nTimestamp\n2026-01-01T00:00:00.000Z\nTopicArn\narn:aws:sns:us-east-1:1:t\nType\nNotification\n"
        );
        e.subject = Some("s".into());
        assert!(canonical(&e)
            .unwrap()
            .contains("MessageId\nid\nSubject\ns\nTimestamp"));
        e.kind = "SubscriptionConfirmation".into();
        assert_eq!(
            canonical(&e).unwrap(),
            "Message\nhello\nworld\nMessageId\nid\nSubscribeURL\nhttps://x\nTimestamp\n2026-01-01T00:00:00.000Z\nToken\ntok\nTopicArn\narn:aws:sns:us-east-1:1:t\nType\nSubscriptionConfirmation\n"
        );
        e.token = None;
        assert!(canonical(&e).is_err());
        e.kind = "Other".into();
        assert!(canonical(&e).is_err());
        assert_eq!(
            canonical_header("x-amz-sns-message-type"),
            "X-Amz-Sns-Message-Type"
        );
    }
}
