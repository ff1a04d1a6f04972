//! `kind: aws-lambda` — the Lambda trigger: one `Invoke` per event. With `RequestResponse`
//! (default) an event is delivered when the function ran and returned without an error; with
//! `Event`, when Lambda accepted the asynchronous invocation (HTTP 202).

use std::sync::Arc;

use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::InvocationType;
use serde::Deserialize;
use sluice_core::pipeline::serve_each;
use sluice_core::units::HumanDuration;
use sluice_core::{format, BoxFuture, ConnectorError, Running, SinkConfig, SinkContext, SinkItem};

use crate::sink::BatchError;
use crate::{api_call, aws_options};

/// How the function is invoked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum Invocation {
    /// Wait for the function's answer (default).
    #[default]
    RequestResponse,
    /// Queue the invocation; Lambda runs it (and retries it) later.
    Event,
}

/// What the function receives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Payload {
    /// The event's data, as Argo's Lambda trigger sends its payload (default; a Sensor's
    /// `payload` builds it).
    #[default]
    Data,
    /// The whole CloudEvent in the JSON format.
    Structured,
}

aws_options! {
    /// `kind: aws-lambda` sink options.
    pub struct LambdaSinkConfig {
        /// The function: name, ARN or partial ARN.
        pub function_name: String,
        /// A version or alias.
        #[serde(default)]
        pub qualifier: Option<String>,
        /// `RequestResponse` (default) or `Event`.
        #[serde(default)]
        pub invocation_type: Invocation,
        /// `data` (default) or `structured`.
        #[serde(default)]
        pub payload: Payload,
        /// Invocations in flight at once. Default 8.
        #[serde(default = "eight")]
        pub concurrency: usize,
        /// How long one invocation may take, the SDK's retries included. Default 60s.
        #[serde(default = "sixty_seconds")]
        pub timeout: HumanDuration,
    }
}

fn eight() -> usize {
    8
}
fn sixty_seconds() -> HumanDuration {
    HumanDuration::from_secs(60)
}

impl SinkConfig for LambdaSinkConfig {
    fn validate(&self, _name: &str) -> Result<(), String> {
        self.connection().check()?;
        let f = self.function_name.trim();
        if f.is_empty() || f.len() > 170 || f.contains(char::is_whitespace) {
            return Err(format!(
                "function_name {:?}: give the function's name, ARN or partial ARN",
                self.function_name
            ));
        }
        if self.concurrency == 0 || self.concurrency > 1000 {
            return Err("concurrency must be between 1 and 1000".into());
        }
        if self.timeout.get().is_zero() {
            return Err("timeout must be above 0".into());
        }
        Ok(())
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            // A function ARN names its region.
            let hint = self
                .function_name
                .strip_prefix("arn:")
                .and_then(|r| r.split(':').nth(2))
                .filter(|r| !r.is_empty())
                .map(str::to_owned);
            let sdk = self.connection().sdk_config(hint.as_deref()).await;
            let client = aws_sdk_lambda::Client::new(&sdk);
            let target = Arc::new(Lambda {
                client,
                function: self.function_name.clone(),
                qualifier: self.qualifier.clone(),
                invocation: self.invocation_type,
                payload: self.payload,
                timeout: self.timeout.get(),
                sink: ctx.name.clone(),
            });
            tracing::info!(sink = %ctx.name, function = %self.function_name, invocation = ?self.invocation_type, "aws-lambda: ready");
            let concurrency = self.concurrency;
            Ok(Box::pin(async move {
                serve_each(ctx.input, ctx.grace_over, concurrency, |item| {
                    invoke(target.clone(), item)
                })
                .await;
                Ok(())
            }) as Running)
        })
    }
}

struct Lambda {
    client: aws_sdk_lambda::Client,
    function: String,
    qualifier: Option<String>,
    invocation: Invocation,
    payload: Payload,
    timeout: std::time::Duration,
    sink: String,
}

async fn invoke(l: Arc<Lambda>, item: SinkItem) {
    let SinkItem { event, delivery } = item;
    let body = match l.payload {
        Payload::Structured => format::encode_event(&event),
        Payload::Data => event
            .data
            .as_bytes()
            .map(|b| b.to_vec())
            .unwrap_or_default(),
    };
    let req = l
        .client
        .invoke()
        .function_name(&l.function)
        .set_qualifier(l.qualifier.clone())
        .invocation_type(match l.invocation {
            Invocation::RequestResponse => InvocationType::RequestResponse,
            Invocation::Event => InvocationType::Event,
        })
        .payload(Blob::new(body));
    let out = match tokio::time::timeout(l.timeout, req.send()).await {
        Err(_) => {
            api_call(&l.sink, "Invoke", false);
            return delivery.failed(format!("Invoke: no answer within {:?}", l.timeout));
        }
        Ok(r) => r,
    };
    api_call(&l.sink, "Invoke", out.is_ok());
    match out {
        Ok(o) => match o.function_error() {
            // The function ran and threw (or timed out inside Lambda): a retry may succeed.
            Some(kind) => {
                let detail = o
                    .payload()
                    .map(|p| {
                        String::from_utf8_lossy(p.as_ref())
                            .chars()
                            .take(300)
                            .collect::<String>()
                    })
                    .unwrap_or_default();
                tracing::warn!(sink = %l.sink, id = %event.id, function_error = %kind, %detail, "aws-lambda: the function failed");
                delivery.failed(format!("the function failed ({kind}): {detail}"))
            }
            None => delivery.delivered(),
        },
        Err(e) => {
            let b = BatchError::from_sdk("Invoke", &e);
            tracing::warn!(sink = %l.sink, id = %event.id, sender_fault = b.sender_fault, reason = %b.reason, "aws-lambda: not invoked");
            let reason = b.reason;
            if b.sender_fault {
                delivery.rejected(reason)
            } else {
                delivery.failed(reason)
            }
        }
    }
}
