//! `kind: stripe` — `Stripe-Signature: t=<unix>,v1=<hex>[,v1=…]`, HMAC-SHA256 with the endpoint
//! secret over `"{t}.{body}"`; any `v1` may match (rotation), no other scheme is accepted (a
//! `v0` alone is refused, so a downgrade cannot pass), |now − t| ≤ `tolerance`. Type
//! `com.stripe.<event type>`, id = the event's `id` (the same across Stripe's retries).

use http::HeaderMap;

use super::{
    check_timestamp, json_event, required, unix_time, Doc, EventFilter, Keys, Naming, Provider,
    Refusal, Request, Secret, Verdict,
};
use crate::Format;
use sluice_core::units::HumanDuration;

provider_config! {
    /// `kind: stripe` options.
    StripeConfig, "stripe", "/stripe", "stripe", 1 {
        /// Endpoint signing secrets (`whsec_…`, as the dashboard shows them); any may match.
        secrets: Vec<Secret>,
        /// Largest accepted |now − t|. Default 5m (Stripe's libraries' default).
        #[serde(default = "super::standard::default_tolerance")]
        tolerance: HumanDuration,
        /// Event types (`charge.succeeded`, `invoice.*`) to turn into events; others are
        /// answered 200 and counted as filtered. Default: all.
        #[serde(default)]
        events: Vec<String>,
    }
}
provider_source!(StripeConfig);

impl StripeConfig {
    pub(crate) fn auth_config(&self) -> Option<crate::AuthConfig> {
        None
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        super::check_secrets("secrets", &self.secrets, false)?;
        EventFilter::new(&self.events).map(drop)
    }

    pub(crate) fn provider(&self) -> Result<Stripe, String> {
        Ok(Stripe {
            keys: Keys::sha256(&self.secrets),
            tolerance: self.tolerance.get(),
            events: EventFilter::new(&self.events)?,
        })
    }
}

pub(crate) struct Stripe {
    keys: Keys,
    tolerance: std::time::Duration,
    events: EventFilter,
}

const HEADER: &str = "stripe-signature";

impl Provider for Stripe {
    fn delivery_id<'h>(&self, _headers: &'h HeaderMap) -> Option<&'h str> {
        None
    }

    fn verify(&self, req: &Request<'_>) -> Result<(), Refusal> {
        let value = required(req.headers, HEADER)?;
        let mut t = None;
        let mut v1 = Vec::new();
        for item in value.split(',') {
            match item.trim().split_once('=') {
                Some(("t", ts)) if t.is_none() => t = Some(ts),
                Some(("t", _)) => {
                    return Err(Refusal::unauthorized(
                        "bad_signature",
                        "Stripe-Signature has more than one t=",
                    ))
                }
                Some(("v1", hex)) => v1.extend(super::unhex(hex)),
                _ => {} // v0 and unknown schemes are never accepted
            }
        }
        let t = t.ok_or_else(|| {
            Refusal::unauthorized("bad_signature", "Stripe-Signature has no t= timestamp")
        })?;
        if v1.is_empty() {
            return Err(Refusal::unauthorized(
                "bad_signature",
                "Stripe-Signature has no v1= signature (only v1 is accepted)",
            ));
        }
        let parts: [&[u8]; 3] = [t.as_bytes(), b".", req.body];
        if !self.keys.verify_any(&parts, v1.iter().map(Vec::as_slice)) {
            return Err(Refusal::unauthorized(
                "bad_signature",
                "Stripe-Signature does not match the body under any configured secret",
            ));
        }
        check_timestamp("Stripe-Signature t=", t, req.now, self.tolerance).map(drop)
    }

    fn event(&self, req: &Request<'_>, naming: &Naming<'_>) -> Result<Verdict, Refusal> {
        let doc = Doc::parse(req.body)?;
        let json = doc.text();
        let ty = doc
            .get("type")
            .ok_or_else(|| Refusal::bad_request("invalid_event", "the event has no `type`"))?;
        if !self.events.allows(&ty) {
            return Ok(Verdict::Filtered);
        }
        let id = doc
            .get("id")
            .ok_or_else(|| Refusal::bad_request("invalid_event", "the event has no `id`"))?;
        if naming.format == Format::Argo {
            let mut data = Vec::with_capacity(json.len() + 64);
            data.extend_from_slice(b"{\"event\":");
            data.extend_from_slice(json.as_bytes());
            data.extend_from_slice(b",\"metadata\":");
            data.extend_from_slice(naming.metadata);
            data.push(b'}');
            return super::argo_verdict(id, naming, data.into());
        }
        // Connect events name the connected account.
        let source = match doc.get("account") {
            Some(acct) => format!("https://stripe.com/{acct}"),
            None => "https://stripe.com".to_owned(),
        };
        let subject = doc.get("data.object.id");
        let time = doc.get("created").and_then(|t| t.parse().ok()).unwrap_or(0);
        let e = json_event(
            id,
            source,
            format!("com.stripe.{ty}"),
            subject,
            unix_time(time),
            req.body.clone(),
        )?;
        Ok(Verdict::Event {
            event: e,
            fresh: false,
        })
    }
}
