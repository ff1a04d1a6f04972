//! The SNS endpoint against messages signed the way SNS signs them (RSA SHA1 for version 1,
//! SHA256 for version 2, over the canonical string), by a test certificate served over HTTPS on
//! localhost. Signatures are made by Python's `cryptography` (in the moto environment), not by
//! our code; the canonical strings are written out here, not taken from the crate.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde_json::json;
use sluice_aws::SnsSourceConfig;
use sluice_core::testkit::{self, free_port, start_source};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOPIC: &str = "arn:aws:sns:us-east-1:123456789012:alerts";

/// A signing key and certificate, served over HTTPS with the confirmation URL.
struct Signer {
    key_file: tempfile::NamedTempFile,
    pki: testkit::Pki,
    port: u16,
    cert_hits: Arc<AtomicUsize>,
    confirm_hits: Arc<AtomicUsize>,
}

impl Signer {
    async fn start() -> Signer {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["sns.amazonaws.com".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let mut key_file = tempfile::NamedTempFile::new().unwrap();
        key_file.write_all(key.serialize_pem().as_bytes()).unwrap();
        let pem = cert.pem();
        let pki = testkit::pki();
        let port = free_port();
        let cert_hits = Arc::new(AtomicUsize::new(0));
        let confirm_hits = Arc::new(AtomicUsize::new(0));
        // The HTTPS server: localhost's certificate from the test CA.
        use rustls::pki_types::pem::PemObject;
        let chain = rustls::pki_types::CertificateDer::pem_slice_iter(pki.server_cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let skey =
            rustls::pki_types::PrivateKeyDer::from_pem_slice(pki.server_key.as_bytes()).unwrap();
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, skey)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let (ch, cf) = (cert_hits.clone(), confirm_hits.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let Ok(tls) = acceptor.accept(tcp).await else {
                    continue;
                };
                let (pem, ch, cf) = (pem.clone(), ch.clone(), cf.clone());
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let body = match req.uri().path() {
                            "/cert.pem" => {
                                ch.fetch_add(1, Ordering::SeqCst);
                                pem.clone()
                            }
                            "/confirm" => {
                                cf.fetch_add(1, Ordering::SeqCst);
                                "<ConfirmSubscriptionResponse/>".to_string()
                            }
                            _ => String::new(),
                        };
                        async move {
                            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                                Bytes::from(body),
                            )))
                        }
                    });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        Signer {
            key_file,
            pki,
            port,
            cert_hits,
            confirm_hits,
        }
    }

    fn cert_url(&self) -> String {
        format!("https://localhost:{}/cert.pem", self.port)
    }

    /// Signs `text` with the key: `version` 1 = RSA PKCS#1 v1.5 SHA1, 2 = SHA256.
    fn sign(&self, version: u8, text: &str) -> String {
        let py = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/motoenv/bin/python");
        let script = r#"
import sys, base64
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding
key = serialization.load_pem_private_key(open(sys.argv[1], 'rb').read(), password=None)
alg = hashes.SHA1() if sys.argv[2] == '1' else hashes.SHA256()
print(base64.b64encode(key.sign(sys.stdin.buffer.read(), padding.PKCS1v15(), alg)).decode())
"#;
        let mut child = Command::new(py)
            .args([
                "-c",
                script,
                self.key_file.path().to_str().unwrap(),
                &version.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the moto environment's python (scripts/test.sh installs it)");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "signing failed");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// A signed notification.
    fn notification(
        &self,
        version: u8,
        topic: &str,
        id: &str,
        message: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> serde_json::Value {
        let ts = at.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string();
        let text = format!(
            "Message\n{message}\nMessageId\n{id}\nSubject\nhello\nTimestamp\n{ts}\nTopicArn\n{topic}\nType\nNotification\n"
        );
        json!({
            "Type": "Notification", "MessageId": id, "TopicArn": topic, "Subject": "hello",
            "Message": message, "Timestamp": ts, "SignatureVersion": version.to_string(),
            "Signature": self.sign(version, &text), "SigningCertURL": self.cert_url(),
            "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe",
        })
    }

    fn confirmation(&self, topic: &str) -> serde_json::Value {
        let ts = chrono::Utc::now()
            .format("%Y-%m-%dT%H:%M:%S%.3fZ")
            .to_string();
        let url = format!("https://localhost:{}/confirm", self.port);
        let msg = format!("You have chosen to subscribe to the topic {topic}.");
        let text = format!(
            "Message\n{msg}\nMessageId\nc-1\nSubscribeURL\n{url}\nTimestamp\n{ts}\nToken\ntok-1\nTopicArn\n{topic}\nType\nSubscriptionConfirmation\n"
        );
        json!({
            "Type": "SubscriptionConfirmation", "MessageId": "c-1", "Token": "tok-1", "TopicArn": topic,
            "Message": msg, "SubscribeURL": url, "Timestamp": ts, "SignatureVersion": "2",
            "Signature": self.sign(2, &text), "SigningCertURL": self.cert_url(),
        })
    }
}

/// POSTs `body` to the endpoint; returns the status code.
async fn post(port: u16, body: &str, headers: &[(&str, &str)]) -> u16 {
    let s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    exchange(s, body, headers).await
}

/// [`post`] over TLS, trusting the test CA, to `localhost`.
async fn post_tls(port: u16, ca_pem: &str, body: &str) -> u16 {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .unwrap();
    exchange(tls, body, &[]).await
}

/// Writes the request, reads the answer to its end; returns the status code.
async fn exchange<S>(mut s: S, body: &str, headers: &[(&str, &str)]) -> u16
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut req = format!(
        "POST /sns HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain; charset=UTF-8\r\nx-amz-sns-message-type: Notification\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    // A TLS peer may close without close_notify after the answer: what was read counts.
    let _ = s.read_to_end(&mut out).await;
    let out = String::from_utf8_lossy(&out);
    out.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

async fn endpoint(
    signer: &Signer,
    name: &str,
    extra: serde_json::Value,
) -> (testkit::SourceRig, testkit::Task, u16) {
    let port = free_port();
    let mut cfg = json!({
        "listen": format!("127.0.0.1:{port}"),
        "topic_arns": [TOPIC],
        "cert_hosts": [format!("localhost:{}", signer.port)],
        "ca": signer.pki.dir.path().join("ca.pem"),
        "ack_timeout": "5s",
    });
    if let serde_json::Value::Object(m) = extra {
        for (k, v) in m {
            cfg[k] = v;
        }
    }
    let (rig, task) = start_source::<SnsSourceConfig>(name, cfg).await;
    (rig, task, port)
}

#[tokio::test]
async fn sns_notifications_verified_v1_and_v2_answered_after_delivery() {
    let signer = Signer::start().await;
    let (mut rig, task, port) = endpoint(&signer, "alerts", json!({})).await;
    let mut cap = rig.capture();
    let now = chrono::Utc::now();
    for (version, id) in [(2u8, "m-v2"), (1, "m-v1")] {
        let body = signer
            .notification(version, TOPIC, id, "{\"level\":3}", now)
            .to_string();
        let answer = tokio::spawn(async move { post(port, &body, &[]).await });
        let item = cap.next_within(Duration::from_secs(10)).await;
        let e = &item.event;
        assert_eq!(e.id, id);
        assert_eq!(e.ty, "com.amazonaws.sns.Notification");
        assert_eq!(e.source, TOPIC);
        assert_eq!(e.subject.as_deref(), Some("hello"));
        let data: serde_json::Value = serde_json::from_slice(e.data.as_bytes().unwrap()).unwrap();
        assert_eq!(
            data["Message"], "{\"level\":3}",
            "data is the SNS message as posted"
        );
        assert!(!answer.is_finished(), "not answered before delivery");
        item.delivery.delivered();
        assert_eq!(answer.await.unwrap(), 200, "version {version}");
    }
    // A failed delivery is answered 503, so SNS retries.
    let body = signer
        .notification(2, TOPIC, "m-fail", "x", now)
        .to_string();
    let answer = tokio::spawn(async move { post(port, &body, &[]).await });
    cap.next_within(Duration::from_secs(10))
        .await
        .delivery
        .failed("test: sink down");
    assert_eq!(answer.await.unwrap(), 503);
    assert_eq!(
        signer.cert_hits.load(Ordering::SeqCst),
        1,
        "the certificate is fetched once and cached"
    );
    super::stop(rig, task).await;
}

#[tokio::test]
async fn sns_refuses_tampered_foreign_stale_and_badly_sourced_messages() {
    let signer = Signer::start().await;
    let (mut rig, task, port) =
        endpoint(&signer, "alerts-refusals", json!({"max_age": "10m"})).await;
    let mut cap = rig.capture();
    let now = chrono::Utc::now();
    let mut tampered = signer.notification(2, TOPIC, "t-1", "pay 10", now);
    tampered["Message"] = json!("pay 1000");
    let mut v1_as_v2 = signer.notification(1, TOPIC, "t-2", "x", now);
    v1_as_v2["SignatureVersion"] = json!("2");
    let foreign = signer.notification(
        2,
        "arn:aws:sns:us-east-1:123456789012:other",
        "t-3",
        "x",
        now,
    );
    let stale = signer.notification(2, TOPIC, "t-4", "x", now - chrono::Duration::hours(2));
    let mut elsewhere = signer.notification(2, TOPIC, "t-5", "x", now);
    elsewhere["SigningCertURL"] = json!(format!("https://127.0.0.1:{}/cert.pem", signer.port));
    let mut plain_http = signer.notification(2, TOPIC, "t-6", "x", now);
    plain_http["SigningCertURL"] = json!(format!("http://localhost:{}/cert.pem", signer.port));
    let cases = [
        (tampered.to_string(), 401, "bad_signature"),
        (v1_as_v2.to_string(), 401, "bad_signature"),
        (foreign.to_string(), 403, "topic_not_allowed"),
        (stale.to_string(), 401, "stale"),
        (elsewhere.to_string(), 401, "bad_cert_url"),
        (plain_http.to_string(), 401, "bad_cert_url"),
        ("not json".to_string(), 400, "invalid_message"),
    ];
    for (body, status, reason) in &cases {
        assert_eq!(post(port, body, &[]).await, *status, "{reason}");
        assert!(
            testkit::metric(
                sluice_core::telemetry::EVENTS_REJECTED,
                &[("source", "alerts-refusals"), ("reason", reason)]
            ) >= 1.0,
            "counted as {reason}"
        );
    }
    // Raw message delivery is unsigned: refused unless raw: true.
    let raw = [
        ("x-amz-sns-rawdelivery", "true"),
        ("x-amz-sns-topic-arn", TOPIC),
        ("x-amz-sns-message-id", "r-1"),
    ];
    assert_eq!(post(port, "raw body", &raw).await, 401);
    assert!(
        cap.try_next().is_none(),
        "nothing refused reached the pipeline"
    );
    assert_eq!(
        signer.cert_hits.load(Ordering::SeqCst),
        1,
        "only the allowed URL was fetched"
    );
    super::stop(rig, task).await;
}

#[tokio::test]
async fn sns_confirms_subscriptions_only_for_allowed_topics_and_takes_raw_delivery_when_asked() {
    let signer = Signer::start().await;
    let (mut rig, task, port) = endpoint(&signer, "alerts-confirm", json!({"raw": true})).await;
    let mut cap = rig.capture();
    let foreign = signer
        .confirmation("arn:aws:sns:us-east-1:123456789012:other")
        .to_string();
    assert_eq!(
        post(
            port,
            &foreign,
            &[("x-amz-sns-message-type", "SubscriptionConfirmation")]
        )
        .await,
        403
    );
    assert_eq!(
        signer.confirm_hits.load(Ordering::SeqCst),
        0,
        "a foreign topic is not confirmed"
    );
    let ours = signer.confirmation(TOPIC).to_string();
    assert_eq!(post(port, &ours, &[]).await, 200);
    assert_eq!(
        signer.confirm_hits.load(Ordering::SeqCst),
        1,
        "SubscribeURL was visited once"
    );
    assert!(cap.try_next().is_none(), "a confirmation makes no event");
    let raw = [
        ("x-amz-sns-rawdelivery", "true"),
        ("x-amz-sns-topic-arn", TOPIC),
        ("x-amz-sns-message-id", "r-1"),
    ];
    let answer = tokio::spawn(async move { post(port, "{\"raw\":1}", &raw).await });
    let item = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(item.event.id, "r-1");
    assert_eq!(item.event.data.as_bytes().unwrap().as_ref(), b"{\"raw\":1}");
    item.delivery.delivered();
    assert_eq!(answer.await.unwrap(), 200);
    super::stop(rig, task).await;
}

#[tokio::test]
async fn sns_endpoint_serves_https() {
    let signer = Signer::start().await;
    let dir = signer.pki.dir.path();
    let tls = json!({"tls": {"cert": dir.join("server.pem"), "key": dir.join("server.key")}});
    let (mut rig, task, port) = endpoint(&signer, "alerts-tls", tls).await;
    let mut cap = rig.capture();
    let body = signer
        .notification(2, TOPIC, "m-tls", "x", chrono::Utc::now())
        .to_string();
    let ca = signer.pki.ca_pem.clone();
    let answer = tokio::spawn(async move { post_tls(port, &ca, &body).await });
    let item = cap.next_within(Duration::from_secs(10)).await;
    assert_eq!(item.event.id, "m-tls");
    item.delivery.delivered();
    assert_eq!(answer.await.unwrap(), 200);
    super::stop(rig, task).await;
}

/// The shared push-source compliance check (`testkit::http_push_source_compliance`) on the
/// SNS endpoint, with notifications signed as SNS signs them.
#[tokio::test]
async fn sns_passes_the_push_source_compliance_check() {
    let signer = Signer::start().await;
    let port = free_port();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let cfg = json!({
        "listen": addr.to_string(),
        "topic_arns": [TOPIC],
        "cert_hosts": [format!("localhost:{}", signer.port)],
        "ca": signer.pki.dir.path().join("ca.pem"),
        "ack_timeout": "5s",
    });
    testkit::http_push_source_compliance::<SnsSourceConfig>(
        "sns-compliance",
        cfg,
        json!({"topic_arns": []}),
        addr,
        "/sns",
        |i| {
            let body = signer
                .notification(2, TOPIC, &format!("m-{i}"), "{\"n\":1}", chrono::Utc::now())
                .to_string();
            (
                vec![("content-type".to_owned(), "text/plain".to_owned())],
                body.into_bytes(),
            )
        },
    )
    .await;
}
