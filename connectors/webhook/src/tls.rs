//! TLS for webhook listeners: rustls with the aws-lc-rs provider, optional client certificates
//! (mTLS), and certificate files re-read when they change.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// `tls: { cert, key, client_ca }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA bundle; when set, clients must present a certificate it signed (mTLS).
    pub client_ca: Option<PathBuf>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Builds a server config from the files.
pub fn load_server_config(cfg: &TlsConfig) -> Result<Arc<ServerConfig>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cfg.cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| format!("tls.cert {}: {e}", cfg.cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "tls.cert {}: no certificate found",
            cfg.cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&cfg.key)
        .map_err(|e| format!("tls.key {}: {e}", cfg.key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &cfg.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca)
                .map_err(|e| format!("tls.client_ca {}: {e}", ca.display()))?
            {
                let c = c.map_err(|e| format!("tls.client_ca {}: {e}", ca.display()))?;
                roots
                    .add(c)
                    .map_err(|e| format!("tls.client_ca {}: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| format!("tls.client_ca {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut sc = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls: the key does not fit the certificate: {e}"))?;
    sc.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(sc))
}

fn mtimes(cfg: &TlsConfig) -> Vec<Option<SystemTime>> {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut v = vec![m(&cfg.cert), m(&cfg.key)];
    if let Some(ca) = &cfg.client_ca {
        v.push(m(ca));
    }
    v
}

/// The current server config, swapped when the files change (checked every `every`).
pub struct Reloading {
    pub current: Arc<ArcSwap<ServerConfig>>,
}

impl Reloading {
    pub fn start(
        cfg: TlsConfig,
        every: std::time::Duration,
        stop: CancellationToken,
    ) -> Result<Self, String> {
        let first = load_server_config(&cfg)?;
        let current = Arc::new(ArcSwap::new(first));
        let swap = current.clone();
        tokio::spawn(async move {
            let mut seen = mtimes(&cfg);
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stop.cancelled() => return,
                }
                let now = mtimes(&cfg);
                if now == seen {
                    continue;
                }
                match load_server_config(&cfg) {
                    Ok(sc) => {
                        swap.store(sc);
                        seen = now;
                        tracing::info!(cert = %cfg.cert.display(), "webhook: TLS certificate reloaded");
                    }
                    // A half-written file: keep serving the old certificate, try again later.
                    Err(e) => {
                        tracing::warn!(error = %e, "webhook: TLS files changed but cannot be loaded yet; keeping the old certificate")
                    }
                }
            }
        });
        Ok(Reloading { current })
    }
}
