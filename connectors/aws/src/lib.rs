//! AWS connectors, on the official SDK (hyper 1 + rustls, one HTTP/TLS stack with the daemon).
//!
//! - `kind: sqs` source: several long polls at once, a bounded window of messages in flight
//!   (full = stop polling), visibility extended while their events are in the pipeline,
//!   `DeleteMessageBatch` only after delivery, failures left to reappear after a backoff,
//!   rejections moved to the queue's dead-letter queue.
//! - `kind: s3` source: S3 object events from the SQS queue the bucket notifies (also inside SNS
//!   envelopes), one CloudEvent per record, named after the CloudEvents S3 adapter; or `mode:
//!   poll` for S3-compatible stores without notifications.
//! - `kind: sns` source: an HTTP(S) endpoint for SNS subscriptions, signatures verified.
//! - `kind: sqs` and `kind: sns` sinks: `SendMessageBatch` / `PublishBatch`; delivered = AWS
//!   confirmed that entry.
//! - `kind: aws-lambda` sink (the Lambda trigger): `Invoke`; delivered = the function returned
//!   without an error (or, `invocation_type: Event`, Lambda queued the invocation).
//!
//! Credentials and region come from the standard chain (environment, profile, web identity /
//! IRSA, container and instance roles); `endpoint` points at an S3-compatible store or a test
//! server; `assume_role` assumes a role on top of the chain.

pub mod argo;
mod attrs;
mod lambda;
mod s3;
mod sink;
mod sns;
mod sqs;

use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use serde::Deserialize;

pub use lambda::LambdaSinkConfig;
pub use s3::{S3Mode, S3SourceConfig};
pub use sink::{SnsSinkConfig, SqsSinkConfig};
pub use sns::SnsSourceConfig;
pub use sqs::SqsSourceConfig;

/// `assume_role:` — a role assumed with the credentials of the standard chain.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssumeRole {
    /// `arn:aws:iam::<account>:role/<name>`.
    pub role_arn: String,
    /// Default `sluice`.
    pub session_name: Option<String>,
    pub external_id: Option<String>,
}

/// `credentials:` — a static access key, instead of the standard chain (Argo's `accessKey`,
/// `secretKey`, `sessionToken`). Give them through `${file:…}` or `${ENV}`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StaticCredentials(***)")
    }
}

/// The connection options every AWS connector has (flattened into each kind's options by
/// [`aws_options!`], since serde's `flatten` cannot be combined with `deny_unknown_fields`).
#[derive(Clone, Debug, Default)]
pub struct Connection {
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub assume_role: Option<AssumeRole>,
    pub credentials: Option<StaticCredentials>,
}

/// Declares a kind's options struct with the AWS connection options (`region`, `endpoint`,
/// `assume_role`) in front of its own.
macro_rules! aws_options {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// AWS region. Default: the standard chain (`AWS_REGION`, the profile, instance
            /// metadata); a queue URL or ARN names its own region.
            pub region: Option<String>,
            /// Endpoint URL instead of AWS's (an S3-compatible store, a test server).
            pub endpoint: Option<String>,
            /// Assume this role with the credentials of the standard chain.
            pub assume_role: Option<$crate::AssumeRole>,
            /// A static access key instead of the standard chain.
            pub credentials: Option<$crate::StaticCredentials>,
            $( $(#[$fmeta])* pub $field : $ty ),*
        }

        impl $name {
            pub(crate) fn connection(&self) -> $crate::Connection {
                $crate::Connection {
                    region: self.region.clone(),
                    endpoint: self.endpoint.clone(),
                    assume_role: self.assume_role.clone(),
                    credentials: self.credentials.clone(),
                }
            }
        }
    };
}
pub(crate) use aws_options;

impl Connection {
    /// Checks what can be checked without AWS.
    pub(crate) fn check(&self) -> Result<(), String> {
        if let Some(r) = &self.region {
            if r.is_empty() || !r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(format!(
                    "region {r:?} is not an AWS region name (like us-east-1)"
                ));
            }
        }
        if let Some(e) = &self.endpoint {
            let ok = (e.starts_with("http://") || e.starts_with("https://"))
                && e.parse::<http::Uri>().is_ok_and(|u| u.host().is_some());
            if !ok {
                return Err(format!(
                    "endpoint {e:?} is not an http:// or https:// URL with a host"
                ));
            }
        }
        if let Some(c) = &self.credentials {
            if c.access_key_id.is_empty() || c.secret_access_key.is_empty() {
                return Err(
                    "credentials: access_key_id and secret_access_key must not be empty".into(),
                );
            }
        }
        if let Some(a) = &self.assume_role {
            if !a.role_arn.starts_with("arn:") || !a.role_arn.contains(":role/") {
                return Err(format!(
                    "assume_role.role_arn {:?} is not a role ARN (arn:aws:iam::<account>:role/<name>)",
                    a.role_arn
                ));
            }
        }
        Ok(())
    }

    /// The SDK configuration: the standard chain, with this connection's region, endpoint and
    /// assumed role. `region_hint` (from a queue URL or ARN) is used when no region is set.
    pub(crate) async fn sdk_config(&self, region_hint: Option<&str>) -> SdkConfig {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(r) = self.region.as_deref().or(region_hint) {
            loader = loader.region(Region::new(r.to_owned()));
        }
        if let Some(e) = &self.endpoint {
            loader = loader.endpoint_url(e);
        }
        if let Some(c) = &self.credentials {
            loader = loader.credentials_provider(aws_sdk_sqs::config::Credentials::new(
                &c.access_key_id,
                &c.secret_access_key,
                c.session_token.clone(),
                None,
                "sluice-config",
            ));
        }
        let base = loader.load().await;
        let Some(a) = &self.assume_role else {
            return base;
        };
        let mut provider = aws_config::sts::AssumeRoleProvider::builder(&a.role_arn)
            .session_name(a.session_name.as_deref().unwrap_or("sluice"));
        if let Some(x) = &a.external_id {
            provider = provider.external_id(x);
        }
        let provider = provider.configure(&base).build().await;
        base.into_builder()
            .credentials_provider(aws_sdk_sqs::config::SharedCredentialsProvider::new(
                provider,
            ))
            .build()
    }
}

/// A queue named by name, URL or ARN.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum QueueRef {
    Url(String),
    Name(String),
    /// `arn:aws:sqs:<region>:<account>:<name>`.
    Arn {
        region: String,
        account: String,
        name: String,
    },
}

impl QueueRef {
    pub(crate) fn parse(s: &str) -> Result<QueueRef, String> {
        if s.starts_with("https://") || s.starts_with("http://") {
            let uri: http::Uri = s
                .parse()
                .map_err(|e| format!("queue {s:?} is not a URL ({e})"))?;
            let segs: Vec<&str> = uri.path().split('/').filter(|p| !p.is_empty()).collect();
            if uri.host().is_none() || segs.len() != 2 {
                return Err(format!(
                    "queue URL {s:?} must look like https://sqs.<region>.amazonaws.com/<account>/<name>"
                ));
            }
            check_queue_name(segs[1])?;
            return Ok(QueueRef::Url(s.to_owned()));
        }
        if let Some(rest) = s.strip_prefix("arn:") {
            let parts: Vec<&str> = rest.split(':').collect();
            match parts.as_slice() {
                [_partition, "sqs", region, account, name] if !region.is_empty() => {
                    check_queue_name(name)?;
                    return Ok(QueueRef::Arn {
                        region: (*region).to_owned(),
                        account: (*account).to_owned(),
                        name: (*name).to_owned(),
                    });
                }
                _ => {
                    return Err(format!(
                    "queue {s:?} is not an SQS queue ARN (arn:aws:sqs:<region>:<account>:<name>)"
                ))
                }
            }
        }
        check_queue_name(s)?;
        Ok(QueueRef::Name(s.to_owned()))
    }

    /// The region a URL (`sqs.<region>.amazonaws.com`) or ARN names.
    pub(crate) fn region(&self) -> Option<&str> {
        match self {
            QueueRef::Arn { region, .. } => Some(region),
            QueueRef::Url(u) => {
                let host = u.split("://").nth(1)?.split('/').next()?;
                let mut parts = host.split('.');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some("sqs"), Some(region), Some("amazonaws")) => Some(region),
                    _ => None,
                }
            }
            QueueRef::Name(_) => None,
        }
    }

    pub(crate) fn name(&self) -> &str {
        match self {
            QueueRef::Url(u) => u.rsplit('/').find(|s| !s.is_empty()).unwrap_or(u),
            QueueRef::Name(n) | QueueRef::Arn { name: n, .. } => n,
        }
    }

    pub(crate) fn is_fifo(&self) -> bool {
        self.name().ends_with(".fifo")
    }

    /// The queue's URL (a `GetQueueUrl` call unless given).
    pub(crate) async fn resolve(&self, client: &aws_sdk_sqs::Client) -> Result<String, String> {
        let (name, account) = match self {
            QueueRef::Url(u) => return Ok(u.clone()),
            QueueRef::Name(n) => (n, None),
            QueueRef::Arn { name, account, .. } => (name, Some(account)),
        };
        let mut call = client.get_queue_url().queue_name(name);
        if let Some(a) = account {
            call = call.queue_owner_aws_account_id(a);
        }
        let out = call.send().await.map_err(|e| {
            format!(
                "cannot find queue {name} ({}); does it exist in this region and account, and may these credentials read it?",
                aws_sdk_sqs::error::DisplayErrorContext(&e)
            )
        })?;
        out.queue_url
            .ok_or_else(|| format!("GetQueueUrl returned no URL for queue {name}"))
    }
}

/// SQS queue names: 1 to 80 letters, digits, `-` and `_`, with `.fifo` at the end of FIFO
/// queues.
pub(crate) fn check_queue_name(n: &str) -> Result<(), String> {
    let base = n.strip_suffix(".fifo").unwrap_or(n);
    if n.is_empty()
        || n.len() > 80
        || !base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(format!(
            "queue {n:?} is not a valid SQS queue name (1 to 80 letters, digits, '-' and '_', with .fifo last for FIFO queues), URL or ARN"
        ));
    }
    Ok(())
}

/// An SNS topic ARN: `arn:<partition>:sns:<region>:<account>:<name>`; returns the region.
pub(crate) fn check_topic_arn(arn: &str) -> Result<&str, String> {
    let parts: Vec<&str> = arn.split(':').collect();
    match parts.as_slice() {
        ["arn", _, "sns", region, account, name]
            if !region.is_empty() && !account.is_empty() && !name.is_empty() =>
        {
            Ok(region)
        }
        _ => Err(format!(
            "topic ARN {arn:?} is not an SNS topic ARN (arn:aws:sns:<region>:<account>:<topic>)"
        )),
    }
}

/// Counts AWS API calls by operation: `sluice_aws_api_calls_total{connector, call, result}`.
pub(crate) fn api_call(connector: &str, call: &'static str, ok: bool) {
    metrics::counter!(
        "sluice_aws_api_calls_total",
        "connector" => connector.to_owned(),
        "call" => call,
        "result" => if ok { "ok" } else { "error" }
    )
    .increment(1);
}

/// Retry delays after a failed poll: 100 ms doubling, at most 10 s.
pub(crate) fn poll_backoff(failures: u32) -> Duration {
    Duration::from_millis(100u64.saturating_mul(1 << failures.min(7)).min(10_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_by_name_url_and_arn() {
        assert_eq!(
            QueueRef::parse("jobs").unwrap(),
            QueueRef::Name("jobs".into())
        );
        let u =
            QueueRef::parse("https://sqs.eu-west-1.amazonaws.com/123456789012/jobs.fifo").unwrap();
        assert_eq!(u.region(), Some("eu-west-1"));
        assert_eq!(u.name(), "jobs.fifo");
        assert!(u.is_fifo());
        let a = QueueRef::parse("arn:aws:sqs:us-east-2:123456789012:jobs").unwrap();
        assert_eq!(a.region(), Some("us-east-2"));
        assert_eq!(a.name(), "jobs");
        assert!(QueueRef::parse("http://127.0.0.1:5000/123456789012/q")
            .unwrap()
            .region()
            .is_none());
        for bad in [
            "",
            "has space",
            "x".repeat(81).as_str(),
            "arn:aws:sns:us-east-1:1:t",
            "https://sqs.us-east-1.amazonaws.com/q",
        ] {
            assert!(QueueRef::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn topic_arns_and_connection_options() {
        assert_eq!(
            check_topic_arn("arn:aws:sns:us-east-1:123456789012:alerts").unwrap(),
            "us-east-1"
        );
        assert!(check_topic_arn("arn:aws:sqs:us-east-1:123456789012:q").is_err());
        assert!(check_topic_arn("alerts").is_err());
        let mut c = Connection {
            region: Some("us-east-1".into()),
            endpoint: Some("http://127.0.0.1:5000".into()),
            assume_role: None,
            credentials: None,
        };
        assert!(c.check().is_ok());
        c.endpoint = Some("127.0.0.1:5000".into());
        assert!(c.check().unwrap_err().contains("endpoint"));
        c.endpoint = None;
        c.region = Some("us east".into());
        assert!(c.check().unwrap_err().contains("region"));
        c.region = None;
        c.assume_role = Some(AssumeRole {
            role_arn: "role".into(),
            session_name: None,
            external_id: None,
        });
        assert!(c.check().unwrap_err().contains("role_arn"));
    }
}
