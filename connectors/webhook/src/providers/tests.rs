//! Verification of every scheme against the providers' published test vectors, and the ways a
//! request must fail: a body changed by one byte, a wrong secret, a rotated secret, stale and
//! future timestamps, missing and doubled headers, downgraded schemes.

use base64::Engine as _;
use bytes::Bytes;
use http::HeaderMap;
use serde_json::json;

use super::{Provider, Refusal, Request};

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

fn check(p: &dyn Provider, h: &[(&str, &str)], body: &[u8], now: i64) -> Result<(), Refusal> {
    let headers = headers(h);
    let body = Bytes::copy_from_slice(body);
    p.verify(&Request {
        headers: &headers,
        body: &body,
        now,
    })
}

fn reason(r: Result<(), Refusal>) -> &'static str {
    r.expect_err("refused").metric
}

/// One byte of `body` changed.
fn tampered(body: &[u8]) -> Vec<u8> {
    let mut b = body.to_vec();
    let i = b.len() / 2;
    b[i] ^= 0x01;
    b
}

fn hmac256_hex(key: &[u8], parts: &[&[u8]]) -> String {
    let k = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key);
    hex::encode(aws_lc_rs::hmac::sign(&k, &parts.concat()).as_ref())
}

fn github(secrets: &[&str]) -> super::github::Github {
    let cfg: super::github::GithubConfig =
        serde_json::from_value(json!({ "secrets": secrets })).unwrap();
    cfg.provider().unwrap()
}

/// GitHub's docs ("Validating webhook deliveries", "Testing the webhook payload validation"):
/// secret `It's a Secret to Everybody`, payload `Hello, World!`.
const GH_SECRET: &str = "It's a Secret to Everybody";
const GH_BODY: &[u8] = b"Hello, World!";
const GH_SIG: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

#[test]
fn github_published_vector_and_failures() {
    let p = github(&[GH_SECRET]);
    assert!(check(&p, &[("x-hub-signature-256", GH_SIG)], GH_BODY, 0).is_ok());
    assert_eq!(
        reason(check(
            &p,
            &[("x-hub-signature-256", GH_SIG)],
            &tampered(GH_BODY),
            0
        )),
        "bad_signature"
    );
    let wrong = github(&["another secret"]);
    assert_eq!(
        reason(check(
            &wrong,
            &[("x-hub-signature-256", GH_SIG)],
            GH_BODY,
            0
        )),
        "bad_signature"
    );
    // Rotation: the old and the new secret are both accepted while both are configured.
    let rotated = github(&["the new secret", GH_SECRET]);
    assert!(check(&rotated, &[("x-hub-signature-256", GH_SIG)], GH_BODY, 0).is_ok());
    let new_sig = format!("sha256={}", hmac256_hex(b"the new secret", &[GH_BODY]));
    assert!(check(&rotated, &[("x-hub-signature-256", &new_sig)], GH_BODY, 0).is_ok());
    // SHA-1 alone is refused, even when it is right.
    let k1 = aws_lc_rs::hmac::Key::new(
        aws_lc_rs::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        GH_SECRET.as_bytes(),
    );
    let sha1 = format!(
        "sha1={}",
        hex::encode(aws_lc_rs::hmac::sign(&k1, GH_BODY).as_ref())
    );
    let r = check(&p, &[("x-hub-signature", &sha1)], GH_BODY, 0).unwrap_err();
    assert_eq!(r.metric, "missing_header");
    assert!(r.reason.contains("SHA-1"), "{}", r.reason);
    assert_eq!(reason(check(&p, &[], GH_BODY, 0)), "missing_header");
    assert_eq!(
        reason(check(
            &p,
            &[
                ("x-hub-signature-256", GH_SIG),
                ("x-hub-signature-256", GH_SIG)
            ],
            GH_BODY,
            0
        )),
        "duplicated_header"
    );
    assert_eq!(
        reason(check(
            &p,
            &[("x-hub-signature-256", &GH_SIG[7..])],
            GH_BODY,
            0
        )),
        "bad_signature",
        "no sha256= prefix"
    );
    // The reason names the header, never the secret.
    let r = check(&wrong, &[("x-hub-signature-256", GH_SIG)], GH_BODY, 0).unwrap_err();
    assert!(r.reason.contains("X-Hub-Signature-256") && !r.reason.contains("another secret"));
}

/// Slack's docs ("Verifying requests from Slack", the worked example): signing secret
/// `8f742231b10e8888abcd99yyyzzz85a5`, timestamp `1531420618`, a slash-command body.
const SLACK_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const SLACK_TS: &str = "1531420618";
const SLACK_BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
const SLACK_SIG: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

fn slack(secrets: &[&str]) -> super::slack::Slack {
    let cfg: super::slack::SlackConfig =
        serde_json::from_value(json!({ "secrets": secrets })).unwrap();
    cfg.provider().unwrap()
}

#[test]
fn slack_published_vector_and_failures() {
    let p = slack(&[SLACK_SECRET]);
    let now: i64 = SLACK_TS.parse::<i64>().unwrap() + 60;
    let ok = [
        ("x-slack-signature", SLACK_SIG),
        ("x-slack-request-timestamp", SLACK_TS),
    ];
    assert!(check(&p, &ok, SLACK_BODY, now).is_ok());
    assert_eq!(
        reason(check(&p, &ok, &tampered(SLACK_BODY), now)),
        "bad_signature"
    );
    assert_eq!(
        reason(check(&slack(&["other"]), &ok, SLACK_BODY, now)),
        "bad_signature"
    );
    assert!(check(&slack(&["other", SLACK_SECRET]), &ok, SLACK_BODY, now).is_ok());
    // Stale (6 minutes after) and future (6 minutes before) with a valid signature.
    assert_eq!(reason(check(&p, &ok, SLACK_BODY, now + 300)), "stale");
    assert_eq!(reason(check(&p, &ok, SLACK_BODY, now - 420)), "stale");
    assert_eq!(
        reason(check(
            &p,
            &[("x-slack-signature", SLACK_SIG)],
            SLACK_BODY,
            now
        )),
        "missing_header"
    );
    assert_eq!(
        reason(check(
            &p,
            &[("x-slack-request-timestamp", SLACK_TS)],
            SLACK_BODY,
            now
        )),
        "missing_header"
    );
    let dup = [
        ("x-slack-signature", SLACK_SIG),
        ("x-slack-signature", SLACK_SIG),
        ("x-slack-request-timestamp", SLACK_TS),
    ];
    assert_eq!(
        reason(check(&p, &dup, SLACK_BODY, now)),
        "duplicated_header"
    );
    let v1 = [
        ("x-slack-signature", &SLACK_SIG.replace("v0=", "v1=")[..]),
        ("x-slack-request-timestamp", SLACK_TS),
    ];
    assert_eq!(reason(check(&p, &v1, SLACK_BODY, now)), "bad_signature");
}

/// The Standard Webhooks reference vector (the spec's libraries' tests, and Svix's docs
/// "Verifying payloads manually"): secret `whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`.
const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SW_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SW_TS: &str = "1614265330";
const SW_BODY: &[u8] = br#"{"test": 2432232314}"#;
const SW_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn standard(cfg: serde_json::Value) -> super::standard::Standard {
    let cfg: super::standard::StandardWebhooksConfig = serde_json::from_value(cfg).unwrap();
    cfg.check().unwrap();
    cfg.provider().unwrap()
}

#[test]
fn standard_webhooks_published_vector_and_failures() {
    let p = standard(json!({ "secrets": [SW_SECRET] }));
    let now: i64 = SW_TS.parse().unwrap();
    let hdrs = |sig: &'static str| {
        vec![
            ("webhook-id", SW_ID),
            ("webhook-timestamp", SW_TS),
            ("webhook-signature", sig),
        ]
    };
    assert!(check(&p, &hdrs(SW_SIG), SW_BODY, now).is_ok());
    // Several signatures (rotation on the sender's side): any may match.
    assert!(check(
        &p,
        &hdrs("v1,bm9wZQ== v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
        SW_BODY,
        now
    )
    .is_ok());
    // The same under Svix's header names.
    let svix = [
        ("svix-id", SW_ID),
        ("svix-timestamp", SW_TS),
        ("svix-signature", SW_SIG),
    ];
    assert!(check(&p, &svix, SW_BODY, now).is_ok());
    assert_eq!(
        reason(check(&p, &hdrs(SW_SIG), &tampered(SW_BODY), now)),
        "bad_signature"
    );
    let other = standard(json!({ "secrets": ["whsec_dGhlIG5ldyBzZWNyZXQgb2YgMjQgYnl0ZXM="] }));
    assert_eq!(
        reason(check(&other, &hdrs(SW_SIG), SW_BODY, now)),
        "bad_signature"
    );
    let rotated =
        standard(json!({ "secrets": ["whsec_dGhlIG5ldyBzZWNyZXQgb2YgMjQgYnl0ZXM=", SW_SECRET] }));
    assert!(check(&rotated, &hdrs(SW_SIG), SW_BODY, now).is_ok());
    assert_eq!(
        reason(check(&p, &hdrs(SW_SIG), SW_BODY, now + 301)),
        "stale"
    );
    assert_eq!(
        reason(check(&p, &hdrs(SW_SIG), SW_BODY, now - 301)),
        "stale"
    );
    assert_eq!(
        reason(check(
            &p,
            &[("webhook-timestamp", SW_TS), ("webhook-signature", SW_SIG)],
            SW_BODY,
            now
        )),
        "missing_header"
    );
    assert_eq!(reason(check(&p, &[], SW_BODY, now)), "missing_header");
    // The id is signed: another id with the same signature fails.
    let moved = [
        ("webhook-id", "msg_other"),
        ("webhook-timestamp", SW_TS),
        ("webhook-signature", SW_SIG),
    ];
    assert_eq!(reason(check(&p, &moved, SW_BODY, now)), "bad_signature");
    // Unknown versions are ignored, not accepted.
    assert_eq!(
        reason(check(
            &p,
            &hdrs("v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
            SW_BODY,
            now
        )),
        "bad_signature"
    );
}

#[test]
fn standard_webhooks_ed25519_v1a() {
    use aws_lc_rs::signature::KeyPair as _;
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let pkcs8 = aws_lc_rs::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let pair = aws_lc_rs::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let public = format!("whpk_{}", b64.encode(pair.public_key().as_ref()));
    let p = standard(json!({ "public_keys": [public] }));
    let now: i64 = SW_TS.parse().unwrap();
    let msg = [SW_ID.as_bytes(), b".", SW_TS.as_bytes(), b".", SW_BODY].concat();
    let sig = format!("v1a,{}", b64.encode(pair.sign(&msg).as_ref()));
    let h = [
        ("webhook-id", SW_ID),
        ("webhook-timestamp", SW_TS),
        ("webhook-signature", &sig[..]),
    ];
    assert!(check(&p, &h, SW_BODY, now).is_ok());
    assert_eq!(
        reason(check(&p, &h, &tampered(SW_BODY), now)),
        "bad_signature"
    );
    // A v1 (symmetric) signature does not pass a verifier that only has public keys.
    let h = [
        ("webhook-id", SW_ID),
        ("webhook-timestamp", SW_TS),
        ("webhook-signature", SW_SIG),
    ];
    assert_eq!(reason(check(&p, &h, SW_BODY, now)), "bad_signature");
}

fn stripe(secrets: &[&str]) -> super::stripe::Stripe {
    let cfg: super::stripe::StripeConfig =
        serde_json::from_value(json!({ "secrets": secrets })).unwrap();
    cfg.provider().unwrap()
}

/// Stripe publishes no fixed vector; its libraries' tests sign with `whsec_test_secret` at run
/// time. This one was computed with Python's `hmac` (and is checked against the `stripe`
/// library by the interop test, tests/interop/provider_signatures.py).
const STRIPE_SECRET: &str = "whsec_test_secret";
const STRIPE_T: &str = "1700000000";
const STRIPE_BODY: &[u8] = br#"{"id":"evt_test_webhook","object":"event"}"#;
const STRIPE_V1: &str = "d95c6b7477fbd7e9f90b1b0ef5f9c7ac25abca5382460e0d988c2b2a5b71b990";

#[test]
fn stripe_scheme_and_failures() {
    let v1 = hmac256_hex(
        STRIPE_SECRET.as_bytes(),
        &[STRIPE_T.as_bytes(), b".", STRIPE_BODY],
    );
    assert_eq!(v1, STRIPE_V1, "the known answer");
    let p = stripe(&[STRIPE_SECRET]);
    let now: i64 = STRIPE_T.parse().unwrap();
    let header = format!("t={STRIPE_T},v1={v1}");
    let h = |v: &str| vec![("stripe-signature", v.to_owned())];
    let run = |p: &dyn Provider, v: &str, body: &[u8], now| {
        let pairs = h(v);
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        check(p, &pairs, body, now)
    };
    assert!(run(&p, &header, STRIPE_BODY, now).is_ok());
    // Any v1 may match (Stripe sends one per active secret while rolling).
    assert!(run(
        &p,
        &format!("t={STRIPE_T},v1={},v1={v1}", "00".repeat(32)),
        STRIPE_BODY,
        now
    )
    .is_ok());
    assert_eq!(
        reason(run(&p, &header, &tampered(STRIPE_BODY), now)),
        "bad_signature"
    );
    assert_eq!(
        reason(run(&stripe(&["whsec_other"]), &header, STRIPE_BODY, now)),
        "bad_signature"
    );
    assert!(run(
        &stripe(&["whsec_other", STRIPE_SECRET]),
        &header,
        STRIPE_BODY,
        now
    )
    .is_ok());
    assert_eq!(reason(run(&p, &header, STRIPE_BODY, now + 301)), "stale");
    assert_eq!(reason(run(&p, &header, STRIPE_BODY, now - 301)), "stale");
    // v0 alone is never accepted, even when it holds the right HMAC (no downgrade).
    assert_eq!(
        reason(run(&p, &format!("t={STRIPE_T},v0={v1}"), STRIPE_BODY, now)),
        "bad_signature"
    );
    assert_eq!(
        reason(run(&p, &format!("v1={v1}"), STRIPE_BODY, now)),
        "bad_signature"
    );
    assert_eq!(reason(check(&p, &[], STRIPE_BODY, now)), "missing_header");
    let dup = [
        ("stripe-signature", header.as_str()),
        ("stripe-signature", header.as_str()),
    ];
    assert_eq!(
        reason(check(&p, &dup, STRIPE_BODY, now)),
        "duplicated_header"
    );
    // The timestamp is signed: another t with the same v1 fails.
    assert_eq!(
        reason(run(&p, &format!("t={},v1={v1}", now + 1), STRIPE_BODY, now)),
        "bad_signature"
    );
}

#[test]
fn gitlab_token_and_signing_token() {
    let cfg: super::gitlab::GitlabConfig = serde_json::from_value(json!({
        "secrets": ["tok-old", "tok-new"],
        "signing_secrets": [SW_SECRET],
    }))
    .unwrap();
    cfg.check().unwrap();
    let p = cfg.provider().unwrap();
    let now: i64 = SW_TS.parse().unwrap();
    assert!(check(&p, &[("x-gitlab-token", "tok-old")], b"{}", now).is_ok());
    assert!(check(&p, &[("x-gitlab-token", "tok-new")], b"{}", now).is_ok());
    assert_eq!(
        reason(check(&p, &[("x-gitlab-token", "tok-x")], b"{}", now)),
        "bad_token"
    );
    assert_eq!(reason(check(&p, &[], b"{}", now)), "missing_header");
    // Where GitLab signs, the signature decides (a right token does not rescue a bad one).
    let signed = [
        ("webhook-id", SW_ID),
        ("webhook-timestamp", SW_TS),
        ("webhook-signature", SW_SIG),
        ("x-gitlab-token", "tok-old"),
    ];
    assert!(check(&p, &signed, SW_BODY, now).is_ok());
    assert_eq!(
        reason(check(&p, &signed, &tampered(SW_BODY), now)),
        "bad_signature"
    );
}

#[test]
fn bitbucket_signatures() {
    let server: super::bitbucket::BitbucketServerConfig =
        serde_json::from_value(json!({ "secrets": ["bb"] })).unwrap();
    let p = server.provider().unwrap();
    let sig = format!("sha256={}", hmac256_hex(b"bb", &[b"{\"a\":1}"]));
    assert!(check(&p, &[("x-hub-signature", &sig)], b"{\"a\":1}", 0).is_ok());
    assert_eq!(
        reason(check(&p, &[("x-hub-signature", &sig)], b"{\"a\":2}", 0)),
        "bad_signature"
    );
    assert_eq!(reason(check(&p, &[], b"{\"a\":1}", 0)), "missing_header");
    // Cloud without a secret: not verified (said in the docs and at start).
    let cloud: super::bitbucket::BitbucketConfig = serde_json::from_value(json!({})).unwrap();
    assert!(check(&cloud.provider().unwrap(), &[], b"{}", 0).is_ok());
    let server_without: Result<super::bitbucket::BitbucketServerConfig, _> =
        serde_json::from_value(json!({ "secrets": [] }));
    assert!(server_without.unwrap().check().is_err());
}

#[test]
fn generic_hmac_options() {
    let cfg: super::hmac::HmacConfig = serde_json::from_value(json!({
        "header": "X-Signature",
        "secrets": ["s3"],
        "algorithm": "sha512",
        "encoding": "base64",
        "prefix": "sha512=",
        "timestamp_header": "X-Timestamp",
        "signed": "{timestamp}.{body}",
    }))
    .unwrap();
    cfg.check().unwrap();
    let p = cfg.provider().unwrap();
    let k = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA512, b"s3");
    let tag = aws_lc_rs::hmac::sign(&k, b"1000.hello");
    let sig = format!(
        "sha512={}",
        base64::engine::general_purpose::STANDARD.encode(tag.as_ref())
    );
    let h = [("x-signature", sig.as_str()), ("x-timestamp", "1000")];
    assert!(check(&p, &h, b"hello", 1000).is_ok());
    assert_eq!(reason(check(&p, &h, b"hellp", 1000)), "bad_signature");
    assert_eq!(reason(check(&p, &h, b"hello", 1400)), "stale");
    assert_eq!(
        reason(check(&p, &[("x-signature", sig.as_str())], b"hello", 1000)),
        "missing_header"
    );
    // sha1 + hex without a prefix, body only.
    let cfg: super::hmac::HmacConfig = serde_json::from_value(json!({
        "header": "X-Sig", "secrets": ["k"], "algorithm": "sha1",
    }))
    .unwrap();
    let p = cfg.provider().unwrap();
    let k = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, b"k");
    let sig = hex::encode(aws_lc_rs::hmac::sign(&k, b"x").as_ref());
    assert!(check(&p, &[("x-sig", &sig)], b"x", 0).is_ok());
    assert_eq!(
        reason(check(&p, &[("x-sig", &sig.to_uppercase()[..39])], b"x", 0)),
        "bad_signature"
    );
    // `{timestamp}` without a timestamp header is a config error.
    let bad: super::hmac::HmacConfig = serde_json::from_value(json!({
        "header": "X-Sig", "secrets": ["k"], "signed": "{timestamp}{body}",
    }))
    .unwrap();
    assert!(bad.check().unwrap_err().contains("timestamp_header"));
    // A timestamp header that is not signed stops no replay: refused too.
    let unsigned: super::hmac::HmacConfig = serde_json::from_value(json!({
        "header": "X-Sig", "secrets": ["k"], "timestamp_header": "X-Ts",
    }))
    .unwrap();
    assert!(unsigned.check().unwrap_err().contains("{timestamp}"));
}

#[test]
fn secrets_never_print() {
    let cfg: super::stripe::StripeConfig =
        serde_json::from_value(json!({ "secrets": ["whsec_do_not_print"] })).unwrap();
    assert!(!format!("{cfg:?}").contains("do_not_print"));
}
