//! The email sink against a real SMTP server: aiosmtpd, which `scripts/test.sh` installs in
//! `target/pyenv` (the test fails, naming the script, when it is missing).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::json;
use sluice_core::testkit::{free_port, start_sink};
use sluice_core::{Event, SinkConfig, Status};
use sluice_email::EmailSinkConfig;

struct Smtp {
    child: Child,
    port: u16,
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Drop for Smtp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn smtp() -> Smtp {
    smtp_with(&[])
}

/// An SMTP server; with `[cert, key]` it requires STARTTLS.
fn smtp_with(tls: &[&Path]) -> Smtp {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/pyenv/bin/python");
    assert!(
        root.exists(),
        "{} is missing: run scripts/test.sh, which installs aiosmtpd there",
        root.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mail");
    let port = free_port();
    let mut child = Command::new(&root)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/smtp_server.py"))
        .arg(port.to_string())
        .arg(&dir)
        .args(tls)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "READY", "the SMTP server did not start");
    Smtp {
        child,
        port,
        dir,
        _tmp: tmp,
    }
}

fn mails(dir: &Path) -> Vec<String> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|r| r.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect()
}

#[tokio::test]
async fn mail_is_delivered_when_the_server_accepted_it() {
    let s = smtp();
    let rig = start_sink::<EmailSinkConfig>(
        "mail",
        json!({"host": "127.0.0.1", "port": s.port, "security": "none", "from": "Sluice <sluice@example.com>",
               "to": ["ops@example.com"], "subject": "{type} for {subject}", "body": "event {id} from {source}"}),
    )
    .await;
    let o = rig
        .send(vec![
            Event::new("e-1", "/ci", "build.finished").with_subject("app")
        ])
        .await;
    assert_eq!(o.status, Status::Delivered, "{o:?}");
    // A sensor payload's data members win.
    let data = json!({"to": ["dev@example.com", "qa@example.com"], "subject": "Release abc123", "body": "Hi team,\n\n\tabc123 is out."});
    let o = rig
        .send(vec![Event::new(
            "e-2",
            "/sensors/release",
            "sluice.sensor.notify",
        )
        .with_json(data.to_string())])
        .await;
    assert_eq!(o.status, Status::Delivered, "{o:?}");
    let got = mails(&s.dir);
    assert_eq!(got.len(), 2);
    assert!(
        got[0].contains("X-Envelope-To: ops@example.com"),
        "{}",
        got[0]
    );
    assert!(
        got[0].contains("Subject: build.finished for app"),
        "{}",
        got[0]
    );
    assert!(got[0].contains("event e-1 from /ci"), "{}", got[0]);
    assert!(
        got[0].contains("From: Sluice <sluice@example.com>"),
        "{}",
        got[0]
    );
    assert!(
        got[1].contains("X-Envelope-To: dev@example.com,qa@example.com"),
        "{}",
        got[1]
    );
    assert!(got[1].contains("Subject: Release abc123"), "{}", got[1]);
    assert!(got[1].contains("abc123 is out."), "{}", got[1]);
}

#[tokio::test]
async fn refusals_reject_temporary_errors_and_outages_fail() {
    let s = smtp();
    let base = |to: &str, port: u16| json!({"host": "127.0.0.1", "port": port, "security": "none", "from": "sluice@example.com", "to": [to], "timeout": "5s"});
    let rig = start_sink::<EmailSinkConfig>("mail-550", base("x@nowhere.invalid", s.port)).await;
    let o = rig.send(vec![Event::new("1", "/s", "t")]).await;
    assert_eq!(o.status, Status::Rejected, "{o:?}");
    assert!(o.reason.unwrap().contains("no such user"));
    let rig = start_sink::<EmailSinkConfig>("mail-451", base("busy@example.com", s.port)).await;
    let o = rig.send(vec![Event::new("1", "/s", "t")]).await;
    assert_eq!(o.status, Status::Failed, "{o:?}");
    let rig =
        start_sink::<EmailSinkConfig>("mail-gone", base("ops@example.com", free_port())).await;
    let o = rig.send(vec![Event::new("1", "/s", "t")]).await;
    assert_eq!(o.status, Status::Failed, "{o:?}");
    assert!(mails(&s.dir).is_empty());
}

#[tokio::test]
async fn allowed_recipients_bound_where_event_data_sends_mail() {
    let s = smtp();
    let rig = start_sink::<EmailSinkConfig>(
        "mail-allowed",
        json!({"host": "127.0.0.1", "port": s.port, "security": "none", "from": "sluice@example.com",
               "to": ["ops@example.com"], "allowed_recipients": ["@Example.com", "oncall@partner.org"]}),
    )
    .await;
    let n = std::cell::Cell::new(0);
    let send = |to: serde_json::Value| {
        n.set(n.get() + 1);
        let e = Event::new(format!("e-{}", n.get()), "/s", "t")
            .with_json(json!({"to": to, "body": "x"}).to_string());
        rig.send(vec![e])
    };
    // Inside the list: a domain (any case) and a whole address.
    let o = send(json!(["dev@EXAMPLE.com", "OnCall@partner.org"])).await;
    assert_eq!(o.status, Status::Delivered, "{o:?}");
    // One recipient outside it: nothing is sent, and the reason names the address.
    let o = send(json!(["dev@example.com", "someone@partner.org"])).await;
    assert_eq!(o.status, Status::Rejected, "{o:?}");
    let reason = o.reason.unwrap();
    assert!(
        reason.contains("someone@partner.org") && reason.contains("allowed_recipients"),
        "{reason}"
    );
    // A subdomain is not the domain.
    let o = send(json!("x@mail.example.com.evil.net")).await;
    assert_eq!(o.status, Status::Rejected, "{o:?}");
    let got = mails(&s.dir);
    assert_eq!(got.len(), 1, "only the admitted message went out");
    assert!(
        got[0].contains("X-Envelope-To: dev@EXAMPLE.com,OnCall@partner.org"),
        "{}",
        got[0]
    );
}

#[test]
fn bad_configs_are_refused() {
    let bad = |v: serde_json::Value| {
        serde_json::from_value::<EmailSinkConfig>(v)
            .unwrap()
            .validate("m")
            .unwrap_err()
    };
    assert!(bad(json!({"host": "h", "from": "not an address"})).contains("from"));
    assert!(bad(json!({"host": "h", "from": "a@b.c", "to": ["x"]})).contains("to"));
    assert!(bad(json!({"host": "h", "from": "a@b.c", "username": "u"})).contains("together"));
    assert!(bad(
        json!({"host": "h", "from": "a@b.c", "security": "none", "username": "u", "password": "p"})
    )
    .contains("clear"));
    assert!(bad(json!({"host": "h", "from": "a@b.c", "subject": "{x"})).contains("unclosed"));
    assert!(
        bad(json!({"host": "h", "from": "a@b.c", "security": "none", "ca_file": "/x.pem"}))
            .contains("ca_file")
    );
    // The configured recipients must be in the list, and every entry must be an address or a
    // domain.
    assert!(bad(
        json!({"host": "h", "from": "a@b.c", "to": ["x@other.org"], "allowed_recipients": ["@b.c"]})
    )
    .contains("x@other.org is not in allowed_recipients"));
    assert!(
        bad(json!({"host": "h", "from": "a@b.c", "allowed_recipients": ["@"]}))
            .contains("allowed_recipients.0")
    );
    assert!(
        bad(json!({"host": "h", "from": "a@b.c", "allowed_recipients": ["@b.c", "nobody"]}))
            .contains("allowed_recipients.1")
    );
}

#[tokio::test]
async fn starttls_against_a_server_with_a_private_ca() {
    let pki = sluice_core::testkit::pki();
    let (cert, key) = (
        pki.dir.path().join("server.pem"),
        pki.dir.path().join("server.key"),
    );
    let s = smtp_with(&[&cert, &key]);
    let base = |extra: serde_json::Value| {
        let mut v = json!({"host": "localhost", "port": s.port, "security": "starttls", "from": "sluice@example.com", "to": ["ops@example.com"], "timeout": "5s"});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    // Trusting the test CA: delivered over STARTTLS.
    let ok = start_sink::<EmailSinkConfig>(
        "mail-tls",
        base(json!({"ca_file": pki.dir.path().join("ca.pem")})),
    )
    .await;
    let o = ok
        .send(vec![
            Event::new("t-1", "/s", "t").with_json(r#"{"body":"over tls"}"#)
        ])
        .await;
    assert_eq!(o.status, Status::Delivered, "{o:?}");
    // Without it the certificate is not trusted: nothing is sent, the event fails.
    let untrusted = start_sink::<EmailSinkConfig>("mail-untrusted", base(json!({}))).await;
    let o = untrusted.send(vec![Event::new("t-2", "/s", "t")]).await;
    assert_eq!(o.status, Status::Failed, "{o:?}");
    let got = mails(&s.dir);
    assert_eq!(got.len(), 1);
    assert!(got[0].contains("over tls"));
}

/// The shared sink compliance check (`testkit::sink_compliance`) against the SMTP server: the
/// mails it stored hold the events' data as their bodies.
#[tokio::test]
async fn passes_the_sink_compliance_check() {
    let s = smtp();
    let dir = s.dir.clone();
    let base = json!({"host": "127.0.0.1", "port": s.port, "security": "none",
        "from": "Sluice <sluice@example.com>", "to": ["ops@example.com"]});
    let mut bad = base.clone();
    bad["from"] = json!("not an address");
    let mut dead = base.clone();
    dead["port"] = json!(free_port());
    dead["timeout"] = json!("1s");
    sluice_core::testkit::sink_compliance::<EmailSinkConfig>(
        "mail-compliance",
        base,
        bad,
        dead,
        move || {
            let got: Vec<Vec<u8>> = mails(&dir).into_iter().map(String::into_bytes).collect();
            Box::pin(async move { got })
        },
    )
    .await;
    drop(s);
}
