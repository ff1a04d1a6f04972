//! The HTTP client: hyper's pooled client over rustls (aws-lc-rs), HTTP/1.1 and HTTP/2 (ALPN).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use serde::Deserialize;

pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// `tls: { ca, cert, key }`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM CA bundle trusted instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain (mTLS); needs `key`.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
}

impl TlsConfig {
    pub fn validate(&self) -> Result<(), String> {
        match (&self.cert, &self.key) {
            (Some(_), None) => Err("tls.cert is set without tls.key".into()),
            (None, Some(_)) => Err("tls.key is set without tls.cert".into()),
            _ => Ok(()),
        }
    }
}

fn roots(tls: &TlsConfig) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match &tls.ca {
        Some(ca) => {
            let certs = CertificateDer::pem_file_iter(ca)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("tls.ca {}: {e}", ca.display()))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(format!("tls.ca {}: no usable CA certificate", ca.display()));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::debug!(error = %e, "a system CA certificate could not be read");
            }
            roots.add_parsable_certificates(found.certs);
        }
    }
    Ok(roots)
}

/// Builds the TLS config (roots, client certificate) from the files.
pub fn tls_config(tls: &TlsConfig) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(tls)?);
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<_, _>>())
                .map_err(|e| format!("tls.cert {}: {e}", cert.display()))?;
            if chain.is_empty() {
                return Err(format!("tls.cert {}: no certificate found", cert.display()));
            }
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("tls.key {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("tls.cert/tls.key: {e}"))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// A pooled client keeping up to `idle_per_host` idle connections.
pub fn build(
    tls: &TlsConfig,
    connect_timeout: Duration,
    idle_per_host: usize,
) -> Result<HttpClient, String> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls_config(tls)?)
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(idle_per_host)
        .pool_idle_timeout(Duration::from_secs(60))
        .build(https))
}
