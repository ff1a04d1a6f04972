//! `kind: email` — the Email trigger: one message per event over SMTP (lettre), delivered when
//! the server accepted it (its `250` after the message data).
//!
//! Subject and body come from templates over the event's attributes, or from the event's JSON
//! data: its members `to`, `subject` and `body` win, so a Sensor's `payload` builds the mail.

pub mod argo;

use std::sync::Arc;

use lettre::message::header::ContentType;
use lettre::message::Mailbox;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use serde::Deserialize;
use serde_json::Value;
use sluice_core::pipeline::serve_each;
use sluice_core::template::Template;
use sluice_core::units::HumanDuration;
use sluice_core::{BoxFuture, ConnectorError, Event, Running, SinkConfig, SinkContext, SinkItem};

/// How the connection is secured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Security {
    /// Plain SMTP, upgraded with STARTTLS, which the server must offer (default; port 587).
    #[default]
    Starttls,
    /// TLS from the first byte (SMTPS; port 465).
    Tls,
    /// No encryption at all (a local relay; port 25). Credentials are refused with it.
    None,
}

/// `kind: email` options.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailSinkConfig {
    /// The SMTP server.
    pub host: String,
    /// Default by `security`: 587, 465 or 25.
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub security: Security,
    /// SMTP AUTH user (with `password`).
    #[serde(default)]
    pub username: Option<String>,
    /// Take it from a file or the environment: `${file:/run/secrets/smtp-password}`.
    #[serde(default)]
    pub password: Option<String>,
    /// The sender, `Name <address>` or an address.
    pub from: String,
    /// Recipients. The data member `to` (a string or a list) overrides them.
    #[serde(default)]
    pub to: Vec<String>,
    /// Where mail may go, whoever names the recipients: addresses (`ops@example.com`) and
    /// whole domains (`@example.com`), compared without regard to case. A message with a
    /// recipient outside the list is rejected, so event data (a webhook body with a `to`
    /// member) cannot send mail elsewhere. Empty (the default): any recipient.
    #[serde(default)]
    pub allowed_recipients: Vec<String>,
    /// A template over the event's attributes. The data member `subject` wins. Default
    /// `{type} from {source}`.
    #[serde(default)]
    pub subject: Option<String>,
    /// A template over the event's attributes. The data member `body` wins; without either,
    /// the event's data as text.
    #[serde(default)]
    pub body: Option<String>,
    /// Per message: connecting, the SMTP dialogue, the data. Default 30s.
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    /// Messages in flight (SMTP connections at most). Default 4.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// A PEM file with a CA certificate to trust besides the system's roots (a relay with a
    /// private CA). Read when the sink starts.
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
}

fn default_timeout() -> HumanDuration {
    HumanDuration::from_secs(30)
}
fn default_concurrency() -> usize {
    4
}

struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    rest: Checked,
}

/// What `validate` checks, without the transport (which needs a runtime for its pool).
struct Checked {
    from: Mailbox,
    to: Vec<Mailbox>,
    allowed: Allowed,
    subject: Template,
    body: Option<Template>,
    sink: String,
}

/// `allowed_recipients`, lowercased: whole addresses and domains (without the `@`).
#[derive(Debug, Default)]
struct Allowed {
    addresses: Vec<String>,
    domains: Vec<String>,
}

impl Allowed {
    fn parse(list: &[String]) -> Result<Allowed, String> {
        let mut a = Allowed::default();
        for (i, entry) in list.iter().enumerate() {
            let e = entry.trim();
            match e.strip_prefix('@') {
                Some(domain) if !domain.is_empty() && !domain.contains(['@', ' ', '<', '>']) => {
                    a.domains.push(domain.to_ascii_lowercase())
                }
                Some(_) => {
                    return Err(format!(
                        "allowed_recipients.{i}: `{entry}` is not a domain (`@example.com`)"
                    ))
                }
                None => {
                    let addr = e.parse::<lettre::Address>().map_err(|err| {
                        format!("allowed_recipients.{i}: `{entry}` is not an address or `@domain` ({err})")
                    })?;
                    a.addresses.push(addr.to_string().to_ascii_lowercase())
                }
            }
        }
        Ok(a)
    }

    /// Whether mail may go to `m` (always, without a list).
    fn admits(&self, m: &Mailbox) -> bool {
        if self.addresses.is_empty() && self.domains.is_empty() {
            return true;
        }
        let domain = m.email.domain().to_ascii_lowercase();
        self.domains.contains(&domain)
            || self
                .addresses
                .iter()
                .any(|a| a.eq_ignore_ascii_case(m.email.as_ref()))
    }

    /// `Err` naming the first recipient the list does not admit.
    fn check(&self, what: &str, to: &[Mailbox]) -> Result<(), String> {
        match to.iter().find(|m| !self.admits(m)) {
            Some(m) => Err(format!("{what}: {} is not in allowed_recipients", m.email)),
            None => Ok(()),
        }
    }
}

fn mailbox(what: &str, s: &str) -> Result<Mailbox, String> {
    s.parse::<Mailbox>()
        .map_err(|e| format!("{what}: `{s}` is not an email address ({e})"))
}

impl EmailSinkConfig {
    fn compiled(&self, sink: &str) -> Result<Mailer, String> {
        let rest = self.checked(sink)?;
        let port = self.port.unwrap_or(match self.security {
            Security::Starttls => 587,
            Security::Tls => 465,
            Security::None => 25,
        });
        let ca = match &self.ca_file {
            None => None,
            Some(p) => {
                let pem = std::fs::read(p)
                    .map_err(|e| format!("ca_file {}: cannot read it: {e}", p.display()))?;
                Some(
                    lettre::transport::smtp::client::Certificate::from_pem(&pem).map_err(|e| {
                        format!("ca_file {}: not a PEM certificate: {e}", p.display())
                    })?,
                )
            }
        };
        let tls = |host: &str| {
            let mut b = TlsParameters::builder(host.to_owned());
            if let Some(c) = ca.clone() {
                b = b.add_root_certificate(c);
            }
            b.build_rustls()
                .map_err(|e| format!("tls for `{host}`: {e}"))
        };
        let mut b = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&self.host)
            .port(port)
            .timeout(Some(self.timeout.get()))
            .tls(match self.security {
                Security::Starttls => Tls::Required(tls(&self.host)?),
                Security::Tls => Tls::Wrapper(tls(&self.host)?),
                Security::None => Tls::None,
            });
        if let (Some(u), Some(p)) = (&self.username, &self.password) {
            b = b.credentials(Credentials::new(u.clone(), p.clone()));
        }
        Ok(Mailer {
            transport: b.build(),
            rest,
        })
    }

    fn checked(&self, sink: &str) -> Result<Checked, String> {
        if self.host.trim().is_empty() {
            return Err("host: give the SMTP server".into());
        }
        let from = mailbox("from", &self.from)?;
        let to = self
            .to
            .iter()
            .map(|t| mailbox("to", t))
            .collect::<Result<Vec<_>, _>>()?;
        let allowed = Allowed::parse(&self.allowed_recipients)?;
        allowed.check("to", &to)?;
        let creds = match (&self.username, &self.password) {
            (Some(_), Some(_)) => true,
            (None, None) => false,
            _ => return Err("username and password go together".into()),
        };
        if creds && self.security == Security::None {
            return Err(
                "security: none would send the password in clear; use starttls or tls".into(),
            );
        }
        if self.ca_file.is_some() && self.security == Security::None {
            return Err(
                "ca_file: with security: none nothing is encrypted; use starttls or tls".into(),
            );
        }
        if self.concurrency == 0 || self.concurrency > 64 {
            return Err("concurrency must be between 1 and 64".into());
        }
        let t = |what: &str, s: &str| Template::parse(what, s);
        Ok(Checked {
            from,
            to,
            allowed,
            subject: t(
                "subject",
                self.subject.as_deref().unwrap_or("{type} from {source}"),
            )?,
            body: self.body.as_deref().map(|b| t("body", b)).transpose()?,
            sink: sink.to_owned(),
        })
    }
}

impl SinkConfig for EmailSinkConfig {
    fn validate(&self, name: &str) -> Result<(), String> {
        self.checked(name).map(drop)
    }

    fn build(
        self: Box<Self>,
        ctx: SinkContext,
    ) -> BoxFuture<'static, Result<Running, ConnectorError>> {
        Box::pin(async move {
            let mailer = Arc::new(self.compiled(&ctx.name).map_err(ConnectorError::new)?);
            tracing::info!(sink = %ctx.name, host = %self.host, security = ?self.security, "email sink ready");
            let concurrency = self.concurrency;
            let running: Running = Box::pin(async move {
                serve_each(ctx.input, ctx.grace_over, concurrency, |item| {
                    deliver(mailer.clone(), item)
                })
                .await;
                Ok(())
            });
            Ok(running)
        })
    }
}

/// The message for `e`, or why there is none (a permanent refusal).
fn message(m: &Checked, e: &Event) -> Result<Message, String> {
    let data: Option<serde_json::Map<String, Value>> = e
        .data
        .as_bytes()
        .and_then(|b| serde_json::from_slice::<Value>(b).ok())
        .and_then(|v| match v {
            Value::Object(o) => Some(o),
            _ => None,
        });
    let member = |k: &str| {
        data.as_ref()
            .and_then(|d| d.get(k))
            .filter(|v| !v.is_null())
    };
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let fill = |t: &Template| t.render_with(e, |o, v| o.push_str(v));
    let to: Vec<Mailbox> = match member("to") {
        Some(Value::String(s)) => vec![mailbox("data.to", s)?],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| mailbox("data.to", &text(v)))
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(format!(
                "data.to: {other} is not an address or a list of them"
            ))
        }
        None => m.to.clone(),
    };
    if to.is_empty() {
        return Err("no recipients: set `to`, or give the event a `to` data member".into());
    }
    m.allowed.check("data.to", &to)?;
    let subject = member("subject")
        .map(text)
        .unwrap_or_else(|| fill(&m.subject));
    let body = member("body")
        .map(text)
        .or_else(|| m.body.as_ref().map(fill))
        .or_else(|| {
            e.data
                .as_bytes()
                .map(|b| String::from_utf8_lossy(b).into_owned())
        })
        .unwrap_or_default();
    let mut b = Message::builder().from(m.from.clone()).subject(subject);
    for t in to {
        b = b.to(t);
    }
    b.header(ContentType::TEXT_PLAIN)
        .body(body)
        .map_err(|e| format!("the message cannot be built: {e}"))
}

async fn deliver(m: Arc<Mailer>, item: SinkItem) {
    let SinkItem { event, delivery } = item;
    let msg = match message(&m.rest, &event) {
        Ok(msg) => msg,
        Err(reason) => return delivery.rejected(reason),
    };
    match m.transport.send(msg).await {
        Ok(_) => delivery.delivered(),
        Err(e) => {
            // 5xx: the server refused for good (bad recipient, policy); the rest may pass later.
            let permanent = e.is_permanent();
            tracing::warn!(sink = %m.rest.sink, id = %event.id, permanent, error = %e, "email: message not accepted");
            let reason = e.to_string();
            if permanent {
                delivery.rejected(reason)
            } else {
                delivery.failed(reason)
            }
        }
    }
}
