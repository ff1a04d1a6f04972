//! The object a trigger sends: where it comes from (inline, a file, a URL, a ConfigMap), Argo's
//! `parameters` applied to it with the incoming event, and the names and labels Sluice gives
//! it.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};
use sluice_core::params::{Param, ParamConfig, Resolved};
use sluice_core::Event;

/// Argo's `url` artifact: an HTTP(S) GET of a YAML or JSON object.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UrlSource {
    /// The URL.
    pub path: String,
    /// Verify the server's certificate. Default `true` (Argo's default is `false`).
    #[serde(default = "yes", rename = "verifyCert")]
    pub verify_cert: bool,
}

fn yes() -> bool {
    true
}

/// Argo's `configmap` artifact: a key of a ConfigMap, read through the API.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigMapSource {
    pub name: String,
    pub key: String,
    /// Default: the component's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
}

/// Where the object comes from: exactly one of these options.
#[derive(Clone, Debug)]
pub enum Origin {
    Inline(Value),
    File(PathBuf),
    Url(UrlSource),
    ConfigMap(ConfigMapSource),
}

/// The most a `url` artifact may be (Argo's cap).
pub const MAX_URL_BYTES: usize = 512 * 1024;

impl Origin {
    /// Picks the one origin given, or says what is wrong.
    pub fn pick(
        resource: &Option<Value>,
        inline: &Option<String>,
        file: &Option<PathBuf>,
        url: &Option<UrlSource>,
        configmap: &Option<ConfigMapSource>,
    ) -> Result<Origin, String> {
        let given = [
            resource.is_some(),
            inline.is_some(),
            file.is_some(),
            url.is_some(),
            configmap.is_some(),
        ]
        .iter()
        .filter(|g| **g)
        .count();
        if given != 1 {
            return Err(format!(
                "give the object in exactly one of resource, inline, file, url or configmap ({given} given)"
            ));
        }
        if let Some(r) = resource {
            return Ok(Origin::Inline(r.clone()));
        }
        if let Some(text) = inline {
            return parse_document(text.as_bytes(), "inline").map(Origin::Inline);
        }
        if let Some(f) = file {
            return Ok(Origin::File(f.clone()));
        }
        if let Some(u) = url {
            let parsed: http::Uri = u
                .path
                .parse()
                .map_err(|e| format!("url.path {:?}: {e}", u.path))?;
            match parsed.scheme_str() {
                Some("http" | "https") => {}
                _ => return Err(format!("url.path {:?}: only http and https URLs", u.path)),
            }
            return Ok(Origin::Url(u.clone()));
        }
        match configmap {
            Some(c) if c.name.is_empty() || c.key.is_empty() => {
                Err("configmap: give name and key".into())
            }
            Some(c) => Ok(Origin::ConfigMap(c.clone())),
            None => unreachable!("one origin is given"),
        }
    }
}

/// A YAML or JSON document (YAML is a superset; a JSON text parses as YAML too).
pub fn parse_document(bytes: &[u8], what: &str) -> Result<Value, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| format!("{what}: not UTF-8 text"))?;
    let v: Value = yaml_serde::from_str(text).map_err(|e| format!("{what}: {e}"))?;
    match v {
        Value::Object(_) | Value::Array(_) => Ok(v),
        _ => Err(format!(
            "{what}: not an object (or, for a JSON patch, an array)"
        )),
    }
}

/// An HTTP(S) client on the workspace's rustls (made once per component: loading the system's
/// roots and the TLS configuration is not per-request work).
pub type HttpClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Full<bytes::Bytes>,
>;

/// A client that verifies servers' certificates against the system's roots, or (`verify:
/// false`, Argo's `verifyCert: false`) does not.
pub fn http_client(verify: bool) -> HttpClient {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls_config(verify))
        .https_or_http()
        .enable_http1()
        .build();
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https)
}

/// Reads a `url` artifact: 200 only, at most [`MAX_URL_BYTES`], TLS verified unless
/// `verifyCert: false` (the `client` was made so).
pub async fn fetch_url(
    client: &HttpClient,
    u: &UrlSource,
    timeout: Duration,
) -> Result<Value, String> {
    use http_body_util::{BodyExt, Full, Limited};
    let uri: http::Uri = u.path.parse().map_err(|e| format!("url {}: {e}", u.path))?;
    let req = http::Request::get(uri)
        .header("user-agent", "sluice")
        .body(Full::default())
        .map_err(|e| format!("url {}: {e}", u.path))?;
    let resp = tokio::time::timeout(timeout, client.request(req))
        .await
        .map_err(|_| format!("url {}: no answer within {timeout:?}", u.path))?
        .map_err(|e| format!("url {}: {e}", u.path))?;
    if resp.status() != http::StatusCode::OK {
        return Err(format!(
            "url {}: answered {} (only 200 is taken)",
            u.path,
            resp.status()
        ));
    }
    let body = tokio::time::timeout(
        timeout,
        Limited::new(resp.into_body(), MAX_URL_BYTES).collect(),
    )
    .await
    .map_err(|_| format!("url {}: body not read within {timeout:?}", u.path))?
    .map_err(|e| format!("url {}: {e} (the limit is {MAX_URL_BYTES} bytes)", u.path))?
    .to_bytes();
    parse_document(&body, &format!("url {}", u.path))
}

fn tls_config(verify: bool) -> rustls::ClientConfig {
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("aws-lc-rs supports the default protocol versions");
    if verify {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(std::sync::Arc::new(NoVerify))
            .with_no_client_auth()
    }
}

/// `verifyCert: false`: Argo's option, kept for manifests that set it.
#[derive(Debug)]
struct NoVerify;

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::aws_lc_rs::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `parameters`, compiled: each reads the incoming event.
pub struct Params(Vec<Param>);

impl Params {
    pub fn compile(list: &[ParamConfig]) -> Result<Params, String> {
        list.iter()
            .enumerate()
            .map(|(i, p)| Param::compile(p, 0, &format!("parameters.{i}")))
            .collect::<Result<Vec<_>, _>>()
            .map(Params)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Applies each parameter to `obj` with `event` (Argo: the first whole-document parameter
    /// replaces the object).
    pub fn apply(&self, obj: &mut Value, event: &Event) -> Result<(), String> {
        for (i, p) in self.0.iter().enumerate() {
            match p
                .resolve(Some(event))
                .map_err(|e| format!("parameters.{i}: {e}"))?
            {
                Resolved::Skip => {}
                Resolved::Value(v) if p.is_whole() => {
                    *obj = match v {
                        Value::String(s) => {
                            parse_document(s.as_bytes(), &format!("parameters.{i}"))?
                        }
                        other => other,
                    };
                }
                Resolved::Value(v) => p.apply(obj, v).map_err(|e| format!("parameters.{i}.{e}"))?,
            }
        }
        Ok(())
    }
}

/// The object's `apiVersion`, `kind`, `metadata.name`, `metadata.generateName` and
/// `metadata.namespace`.
pub struct Ident<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub name: Option<&'a str>,
    pub generate_name: Option<&'a str>,
    pub namespace: Option<&'a str>,
}

pub fn ident(obj: &Value) -> Result<Ident<'_>, String> {
    fn s(v: Option<&Value>) -> Option<&str> {
        v.and_then(Value::as_str).filter(|s| !s.is_empty())
    }
    let meta = obj.get("metadata");
    Ok(Ident {
        api_version: s(obj.get("apiVersion")).ok_or("the object has no apiVersion")?,
        kind: s(obj.get("kind")).ok_or("the object has no kind")?,
        name: s(meta.and_then(|m| m.get("name"))),
        generate_name: s(meta.and_then(|m| m.get("generateName"))),
        namespace: s(meta.and_then(|m| m.get("namespace"))),
    })
}

/// The name Sluice gives an object that has only `generateName`: the prefix and a hash of the
/// event's id (and source), so that the event delivered again — a retry, a replica's
/// duplicate, a replay after a crash — names the same object, and the API server answers 409
/// AlreadyExists instead of starting a second Workflow. 10 base-36 characters (about 52 bits),
/// with the prefix cut so the name fits 63 characters.
pub fn derived_name(generate_name: &str, event: &Event, salt: &str) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for part in [salt, "\0", &event.source, "\0", &event.id] {
        h.update(part.as_bytes());
    }
    let mut n = h.digest128();
    let mut suffix = String::with_capacity(10);
    for _ in 0..10 {
        let d = (n % 36) as u8;
        n /= 36;
        suffix.push(if d < 10 {
            (b'0' + d) as char
        } else {
            (b'a' + d - 10) as char
        });
    }
    let prefix: String = generate_name.chars().take(63 - suffix.len()).collect();
    prefix + &suffix
}

/// Sets `metadata.<key>` (creating `metadata`).
pub fn set_meta(obj: &mut Value, key: &str, v: Value) {
    if let Value::Object(o) = obj {
        let meta = o
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if !meta.is_object() {
            *meta = Value::Object(Map::new());
        }
        if let Value::Object(m) = meta {
            m.insert(key.to_owned(), v);
        }
    }
}

/// Adds labels to `metadata.labels`.
pub fn add_labels(obj: &mut Value, labels: &[(&str, String)]) {
    if let Value::Object(o) = obj {
        let meta = o
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = meta {
            let l = m
                .entry("labels")
                .or_insert_with(|| Value::Object(Map::new()));
            if !l.is_object() {
                *l = Value::Object(Map::new());
            }
            if let Value::Object(l) = l {
                for (k, v) in labels {
                    l.insert((*k).to_owned(), Value::String(v.clone()));
                }
            }
        }
    }
}

/// Argo's labels on what a Sensor's trigger creates: `events.argoproj.io/sensor`, `…/trigger`
/// (when a Sensor's trigger built the event from a `payload`: its `sensor` and `trigger`
/// extensions; a forwarded event is passed through untouched and carries neither) and
/// `…/action-timestamp` (Unix milliseconds).
pub fn argo_labels(event: &Event) -> Vec<(&'static str, String)> {
    let mut out = Vec::with_capacity(3);
    let ext = |k: &str| {
        event
            .extensions
            .iter()
            .find(|(n, _)| n.as_str() == k)
            .map(|(_, v)| v.to_canonical().into_owned())
    };
    if let Some(s) = ext("sensor") {
        out.push(("events.argoproj.io/sensor", s));
    }
    if let Some(t) = ext("trigger") {
        out.push(("events.argoproj.io/trigger", t));
    }
    out.push((
        "events.argoproj.io/action-timestamp",
        chrono::Utc::now().timestamp_millis().to_string(),
    ));
    out
}

/// Argo's `update`: the template merged over the live object. Objects merge key by key, the
/// template's value winning (an explicit `null` included); arrays and scalars are replaced
/// whole; keys the template lacks are kept.
pub fn merge_over(live: &mut Value, tmpl: &Value) {
    match (live, tmpl) {
        (Value::Object(l), Value::Object(t)) => {
            for (k, tv) in t {
                match l.get_mut(k) {
                    Some(lv) if lv.is_object() && tv.is_object() => merge_over(lv, tv),
                    _ => {
                        l.insert(k.clone(), tv.clone());
                    }
                }
            }
        }
        (l, t) => *l = t.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_origin_exactly() {
        let none = Origin::pick(&None, &None, &None, &None, &None).unwrap_err();
        assert!(none.contains("exactly one"), "{none}");
        let two =
            Origin::pick(&Some(json!({})), &Some("a: 1".into()), &None, &None, &None).unwrap_err();
        assert!(two.contains("2 given"), "{two}");
        match Origin::pick(
            &None,
            &Some("kind: Job\napiVersion: batch/v1\n".into()),
            &None,
            &None,
            &None,
        )
        .unwrap()
        {
            Origin::Inline(v) => assert_eq!(v, json!({"kind":"Job","apiVersion":"batch/v1"})),
            other => panic!("{other:?}"),
        }
        let bad_url = UrlSource {
            path: "ftp://x/y".into(),
            verify_cert: true,
        };
        assert!(Origin::pick(&None, &None, &None, &Some(bad_url), &None).is_err());
        assert!(parse_document(b"just text", "inline").is_err());
    }

    #[test]
    fn derived_names_are_stable_per_event_and_fit() {
        let e = Event::new("id-1", "s3", "t");
        let a = derived_name("s3-processing-", &e, "sink");
        assert_eq!(a, derived_name("s3-processing-", &e, "sink"));
        assert!(
            a.starts_with("s3-processing-") && a.len() == "s3-processing-".len() + 10,
            "{a}"
        );
        assert!(a
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
        let other = Event::new("id-2", "s3", "t");
        assert_ne!(a, derived_name("s3-processing-", &other, "sink"));
        assert_ne!(a, derived_name("s3-processing-", &e, "another-sink"));
        let long = derived_name(&"x".repeat(80), &e, "sink");
        assert_eq!(long.len(), 63);
    }

    #[test]
    fn update_merges_the_template_over_the_live_object() {
        let mut live = json!({"metadata":{"name":"a","resourceVersion":"7","labels":{"x":"1"}},
            "spec":{"replicas":1,"list":[1,2],"keep":true}});
        merge_over(
            &mut live,
            &json!({"metadata":{"labels":{"y":"2"}},"spec":{"replicas":3,"list":[9],"gone":null}}),
        );
        assert_eq!(
            live,
            json!({"metadata":{"name":"a","resourceVersion":"7","labels":{"x":"1","y":"2"}},
            "spec":{"replicas":3,"list":[9],"keep":true,"gone":null}})
        );
    }

    #[test]
    fn parameters_write_into_the_object() {
        let cfg: Vec<ParamConfig> = serde_json::from_value(json!([
            {"src": {"dataKey": "s3.object.key"}, "dest": "spec.arguments.parameters.0.value"},
            {"src": {"contextKey": "id"}, "dest": "metadata.labels.event"},
            {"src": {"dataKey": "missing", "value": "dflt"}, "dest": "metadata.labels.d"}
        ]))
        .unwrap();
        let p = Params::compile(&cfg).unwrap();
        let mut obj = json!({"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow",
            "spec":{"arguments":{"parameters":[{"name":"key"}]}}});
        let e = Event::new("ev-1", "s3", "t").with_json(r#"{"s3":{"object":{"key":"in/a.csv"}}}"#);
        p.apply(&mut obj, &e).unwrap();
        assert_eq!(
            obj["spec"]["arguments"]["parameters"][0],
            json!({"name":"key","value":"in/a.csv"})
        );
        assert_eq!(
            obj["metadata"]["labels"],
            json!({"event":"ev-1","d":"dflt"})
        );
        // A key that resolves to nothing, without a value, is an error that names it.
        let cfg: Vec<ParamConfig> =
            serde_json::from_value(json!([{"src": {"dataKey": "nope"}, "dest": "x"}])).unwrap();
        let err = Params::compile(&cfg)
            .unwrap()
            .apply(&mut obj, &e)
            .unwrap_err();
        assert!(
            err.contains("parameters.0") && err.contains("nope"),
            "{err}"
        );
    }

    #[test]
    fn labels_name_the_sensor_and_trigger() {
        let mut e = Event::new("i", "s", "t");
        e.set_extension("sensor".to_owned(), "s3-sensor".to_owned());
        e.set_extension("trigger".to_owned(), "make-wf".to_owned());
        let mut obj = json!({"metadata":{"labels":{"app":"x"}}});
        add_labels(&mut obj, &argo_labels(&e));
        let l = &obj["metadata"]["labels"];
        assert_eq!(l["app"], "x");
        assert_eq!(l["events.argoproj.io/sensor"], "s3-sensor");
        assert_eq!(l["events.argoproj.io/trigger"], "make-wf");
        assert!(l["events.argoproj.io/action-timestamp"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .is_ok());
    }
}
