"""Signs webhook requests with the providers' own Python libraries and sends them to Sluice.

Usage: provider_signatures.py BASE_URL
Prints one line per request: `<name> <status>`, and `stripe-known <header>` (a fixed-time
signature the Rust tests hold as a known answer).
"""

import datetime
import json
import sys
import time
import urllib.error
import urllib.request

import stripe
from slack_sdk.signature import SignatureVerifier
from standardwebhooks.webhooks import Webhook

STRIPE_SECRET = "whsec_interop_stripe"
SLACK_SECRET = "interop-slack-signing-secret"
STANDARD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def post(url, body, headers):
    req = urllib.request.Request(url, data=body.encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def main():
    base = sys.argv[1].rstrip("/")
    ctype = {"Content-Type": "application/json"}

    # Stripe: the library's own header generator; our known answer at a fixed time.
    known = stripe.WebhookSignature.generate_signature_header(
        '{"id":"evt_test_webhook","object":"event"}', "whsec_test_secret", timestamp=1700000000
    )
    print("stripe-known", known)
    event = json.dumps(
        {
            "id": "evt_interop_1",
            "object": "event",
            "type": "charge.succeeded",
            "created": int(time.time()),
            "data": {"object": {"id": "ch_interop_1", "object": "charge", "amount": 2000}},
        }
    )
    header = stripe.WebhookSignature.generate_signature_header(event, STRIPE_SECRET)
    # The library accepts what it made (so a failure below is Sluice's).
    stripe.Webhook.construct_event(event, header, STRIPE_SECRET)
    print("stripe", post(base + "/stripe", event, {**ctype, "Stripe-Signature": header}))
    print(
        "stripe-tampered",
        post(base + "/stripe", event.replace("2000", "2001"), {**ctype, "Stripe-Signature": header}),
    )

    # Slack: slack_sdk's SignatureVerifier signs and verifies.
    body = json.dumps(
        {
            "type": "event_callback",
            "team_id": "T0INTEROP",
            "event_id": "Ev0INTEROP1",
            "event_time": int(time.time()),
            "event": {"type": "app_mention", "channel": "C0INTEROP", "text": "<@U0> hi"},
        }
    )
    ts = str(int(time.time()))
    verifier = SignatureVerifier(SLACK_SECRET)
    sig = verifier.generate_signature(timestamp=ts, body=body)
    assert verifier.is_valid(body=body, timestamp=ts, signature=sig)
    headers = {**ctype, "X-Slack-Request-Timestamp": ts, "X-Slack-Signature": sig}
    print("slack", post(base + "/slack", body, headers))
    print("slack-wrong-secret", post(base + "/slack", body, {
        **headers,
        "X-Slack-Signature": SignatureVerifier("not-it").generate_signature(timestamp=ts, body=body),
    }))

    # Standard Webhooks: the reference Python library.
    wh = Webhook(STANDARD_SECRET)
    payload = json.dumps({"type": "invoice.paid", "timestamp": "2026-12-01T10:00:00Z", "data": {"n": 1}})
    now = datetime.datetime.now(tz=datetime.timezone.utc)
    sig = wh.sign("msg_interop_1", now, payload)
    headers = {
        **ctype,
        "webhook-id": "msg_interop_1",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": sig,
    }
    wh.verify(payload, headers)
    print("standard", post(base + "/standard", payload, headers))
    old = now - datetime.timedelta(minutes=10)
    stale = {
        **headers,
        "webhook-timestamp": str(int(old.timestamp())),
        "webhook-signature": wh.sign("msg_interop_1", old, payload),
    }
    print("standard-stale", post(base + "/standard", payload, stale))


if __name__ == "__main__":
    main()
