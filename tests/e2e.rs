//! The real `sluice` binary, started as users start it, talked to over HTTP.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use sluice_core::testkit::free_port;
use sluice_core::testkit::peers::{spawn_nats, Relay};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// Where the webhook's `listen` goes in a config body given to [`Daemon::start_with`].
const HOOK: &str = "@HOOK@";

struct Daemon {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<Vec<String>>>,
    hook: SocketAddr,
    admin: SocketAddr,
    path: PathBuf,
    body: String,
    /// More arguments for `sluice run` (`-f` manifests).
    args: Vec<String>,
}

impl Daemon {
    fn start(config_dir: &Path, extra: &str) -> Daemon {
        let body = format!(
            "{extra}\nsources:\n  hooks: {{ kind: webhook, listen: {HOOK}, path: / }}\nsinks:\n  console: {{ kind: log }}\nroutes:\n  - {{ from: [hooks], to: [console] }}\n"
        );
        Self::start_with(config_dir, &body)
    }

    /// Starts `sluice run` on `body` (with [`HOOK`] replaced by the webhook's address) plus an
    /// admin server. The ports come from `free_port`, which another test process can take before
    /// the daemon binds them: [`Daemon::wait_ready`] starts it again on other ports when it
    /// exited for that reason. (Local for now: a better `free_port` belongs in the core test kit.)
    fn start_with(config_dir: &Path, body: &str) -> Daemon {
        Self::start_with_args(config_dir, body, &[])
    }

    fn start_with_args(config_dir: &Path, body: &str, args: &[String]) -> Daemon {
        let path = config_dir.join("sluice.yaml");
        let (child, lines, stderr, hook, admin) = Self::spawn(&path, body, args);
        Daemon {
            child,
            lines,
            stderr,
            hook,
            admin,
            path,
            body: body.to_owned(),
            args: args.to_vec(),
        }
    }

    #[allow(clippy::type_complexity)]
    fn spawn(
        path: &Path,
        body: &str,
        args: &[String],
    ) -> (
        Child,
        mpsc::Receiver<String>,
        Arc<Mutex<Vec<String>>>,
        SocketAddr,
        SocketAddr,
    ) {
        let hook = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let cfg = format!(
            "admin: {{ listen: {admin} }}\n{}",
            body.replace(HOOK, &hook.to_string())
        );
        std::fs::write(path, cfg).unwrap();
        let mut child = Command::new(BIN)
            .args(["run", "-c"])
            .arg(path)
            .args(args)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        // Kept for failure messages and the port check, and passed on as before.
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (err, keep) = (child.stderr.take().unwrap(), stderr.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("{line}");
                keep.lock().unwrap().push(line);
            }
        });
        (child, lines, stderr, hook, admin)
    }

    fn stderr_tail(&self) -> String {
        let lines = self.stderr.lock().unwrap();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// If the daemon exited: started again on other ports (true) when it exited because
    /// another process had taken one of its ports; a panic with its log otherwise.
    fn restarted_for_a_taken_port(&mut self) -> bool {
        let Some(status) = self.child.try_wait().unwrap() else {
            return false;
        };
        // The log reader may still be busy with the last lines.
        std::thread::sleep(Duration::from_millis(200));
        let taken = self
            .stderr
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("cannot listen") && l.contains("Address already in use"));
        assert!(
            taken,
            "sluice exited with {status} while starting; its log:\n{}",
            self.stderr_tail()
        );
        eprintln!("e2e: a port was taken by another process; starting sluice on other ports");
        let (child, lines, stderr, hook, admin) = Self::spawn(&self.path, &self.body, &self.args);
        (self.child, self.lines, self.stderr, self.hook, self.admin) =
            (child, lines, stderr, hook, admin);
        true
    }

    async fn wait_ready(&mut self) {
        let mut deadline = Instant::now() + Duration::from_secs(30);
        let mut restarts = 0;
        loop {
            if self.restarted_for_a_taken_port() {
                restarts += 1;
                assert!(restarts < 10, "no free ports for sluice in 10 tries");
                deadline = Instant::now() + Duration::from_secs(30);
                continue;
            }
            if let Ok(r) = get(self.admin, "/readyz").await {
                if r.0 == StatusCode::OK {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "sluice did not become ready; its log:\n{}",
                self.stderr_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn next_line(&self) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(10))
            .expect("a line on stdout");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"))
    }

    fn stop(self) -> std::process::ExitStatus {
        self.stop_collecting().0
    }

    /// SIGTERM, then the exit status and every stdout line not read yet (up to the exit).
    fn stop_collecting(mut self) -> (std::process::ExitStatus, Vec<Value>) {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "sluice did not stop after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut rest = Vec::new();
        // The reader ends at EOF: the channel disconnects once every line was passed on.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(10)) {
            rest.push(
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}")),
            );
        }
        (status, rest)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(StatusCode, Bytes), String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = sender
        .send_request(req.body(Full::new(Bytes::copy_from_slice(body))).unwrap())
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body))
}

async fn get(addr: SocketAddr, path: &str) -> Result<(StatusCode, Bytes), String> {
    request(addr, "GET", path, &[], b"").await
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

#[test]
fn version_and_connectors() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("sluice "));
    let out = Command::new(BIN).arg("connectors").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for kind in ["webhook", "log", "null"] {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().nth(1) == Some(kind)),
            "{kind} missing:\n{text}"
        );
    }
}

#[test]
fn validate_reports_every_error_and_opens_no_socket() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "sources:\n  hooks: { kind: webhok }\nsinks:\n  out: { kind: log, colour: red }\nroutes:\n  - { from: [hooks], to: [nowhere] }\n").unwrap();
    let out = Command::new(BIN)
        .args(["validate", "-c"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let f = bad.display().to_string();
    assert!(
        err.contains(&format!(
            "{f}:2:18: sources.hooks.kind: unknown source kind `webhok` (did you mean `webhook`?)"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{f}:4:21: sinks.out.colour: unknown field `colour`"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!("{f}:6:27: routes.0.to: no sink named `nowhere`")),
        "{err}"
    );

    // A listen address that is taken does not matter to validate: it binds nothing.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let good = dir.path().join("good.yaml");
    // (No admin server: the default admin port may be taken on a developer's machine.)
    std::fs::write(&good, format!("admin: {{ enabled: false }}\nsources:\n  h: {{ kind: webhook, listen: {} }}\nsinks:\n  o: {{ kind: log }}\nroutes:\n  - {{ from: [h], to: [o] }}\n", taken.local_addr().unwrap())).unwrap();
    let out = Command::new(BIN)
        .args(["validate", "-c"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `run` with the same config fails clearly, naming the source.
    let out = Command::new(BIN)
        .args(["run", "-c"])
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("source h (kind webhook)") && err.contains("cannot listen"),
        "{err}"
    );
}

#[test]
fn malformed_yaml_never_crashes() {
    let dir = tempfile::tempdir().unwrap();
    for text in [
        "sources: [",
        "\u{0}\u{1}",
        "sources:\n  a: 5\n",
        "routes: {x: 1}\n",
        "- - -\n",
    ] {
        let p = dir.path().join("x.yaml");
        std::fs::write(&p, text).unwrap();
        let out = Command::new(BIN)
            .args(["validate", "-c"])
            .arg(&p)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{text:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("x.yaml"),
            "{text:?}"
        );
    }
}

#[tokio::test]
async fn webhook_to_log_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path(), "");
    d.wait_ready().await;
    assert_eq!(get(d.admin, "/healthz").await.unwrap().0, StatusCode::OK);
    let (status, body) = request(
        d.hook,
        "POST",
        "/",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", "e2e-1"),
        ],
        br#"{"n":1}"#,
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "{body:?}");
    let line = d.next_line();
    assert_eq!(line["specversion"], "1.0");
    assert_eq!(line["id"], "e2e-1");
    assert_eq!(line["source"], "hooks");
    assert_eq!(line["data"], serde_json::json!({"n": 1}));
    // A structured CloudEvent passes through untouched.
    let ce = r#"{"specversion":"1.0","id":"ce-1","source":"urn:upstream","type":"com.example.x","data":"hi","datacontenttype":"text/plain"}"#;
    let (status, _) = request(
        d.hook,
        "POST",
        "/",
        &[("content-type", "application/cloudevents+json")],
        ce.as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    let line = d.next_line();
    assert_eq!(
        (
            line["id"].as_str(),
            line["source"].as_str(),
            line["data"].as_str()
        ),
        (Some("ce-1"), Some("urn:upstream"), Some("hi"))
    );

    let (_, metrics) = get(d.admin, "/metrics").await.unwrap();
    let m = String::from_utf8_lossy(&metrics);
    assert_eq!(
        metric(&m, "sluice_events_received_total{source=\"hooks\"}"),
        2.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "sluice_events_delivered_total{sink=\"console\"}"),
        2.0,
        "{m}"
    );
    assert!(
        m.contains("sluice_delivery_latency_seconds_bucket{sink=\"console\",le=\"0.005\"}"),
        "{m}"
    );
    // One latency per delivered event, and one `# TYPE` line for the histogram.
    assert_eq!(
        metric(
            &m,
            "sluice_delivery_latency_seconds_count{sink=\"console\"}"
        ),
        2.0,
        "{m}"
    );
    assert_eq!(
        m.matches("# TYPE sluice_delivery_latency_seconds histogram")
            .count(),
        1,
        "{m}"
    );
    assert!(m.contains("sluice_queue_events{sink=\"console\"}"));
    // Transparent huge pages are off for the daemon unless `--allow-thp` (docs/decisions.md).
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
    assert!(
        status.lines().any(|l| l == "THP_enabled:\t0"),
        "THP_enabled in {status}"
    );
    let status = d.stop();
    assert!(status.success(), "SIGTERM → exit 0, got {status:?}");
}

#[tokio::test]
async fn http_sink_failures_go_to_the_dead_letter_sink() {
    let dir = tempfile::tempdir().unwrap();
    // The target closes every connection at once: every attempt fails. (A port nobody listens on
    // could be taken by another test process meanwhile; this one is held for the whole test.)
    let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = target.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in target.incoming() {
            drop(conn);
        }
    });
    let body = format!(
        "sources:\n  hooks: {{ kind: webhook, listen: {HOOK}, path: / }}\nsinks:\n  trigger:\n    kind: http\n    url: http://127.0.0.1:{dead}/events\n    retry: {{ max_attempts: 2, initial_backoff: 10ms, max_backoff: 20ms }}\n    dead_letter: parked\n  parked: {{ kind: log }}\nroutes:\n  - {{ from: [hooks], to: [trigger] }}\n"
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    let (status, body) = request(
        d.hook,
        "POST",
        "/",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", "dl-1"),
        ],
        br#"{"n":1}"#,
    )
    .await
    .unwrap();
    // Handled: the dead-letter sink confirmed it.
    assert_eq!(status, StatusCode::OK, "{body:?}");
    let line = d.next_line();
    assert_eq!(line["id"], "dl-1");
    assert_eq!(line["deadlettersink"], "trigger");
    assert_eq!(line["deadletterstatus"], "failed");
    let reason = line["deadletterreason"].as_str().unwrap();
    assert!(reason.contains("after 2 attempts"), "{reason}");
    let (_, metrics) = get(d.admin, "/metrics").await.unwrap();
    let m = String::from_utf8_lossy(&metrics);
    assert_eq!(
        metric(
            &m,
            "sluice_events_dead_lettered_total{sink=\"trigger\",dead_letter=\"parked\"}"
        ),
        1.0,
        "{m}"
    );
    assert!(d.stop().success());
}

#[tokio::test]
async fn dedup_window_survives_a_restart_with_state_dir() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let extra = format!("state_dir: {}", state.display());
    let mut d = Daemon::start(dir.path(), &extra);
    d.wait_ready().await;
    let (s, _) = request(d.hook, "POST", "/", &[("idempotency-key", "once")], b"{}")
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK);
    assert_eq!(d.next_line()["id"], "once");
    assert!(d.stop().success());

    let mut d = Daemon::start(dir.path(), &extra);
    d.wait_ready().await;
    let (s, body) = request(d.hook, "POST", "/", &[("idempotency-key", "once")], b"{}")
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["duplicates"], 1, "remembered across the restart");
    let (s, _) = request(d.hook, "POST", "/", &[("idempotency-key", "twice")], b"{}")
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        d.next_line()["id"],
        "twice",
        "the duplicate printed nothing; the new one prints"
    );
    assert!(d.stop().success());
}

/// /readyz is 503 while a component is still being built — here a Kafka sink whose build waits
/// for a broker that is down — and 200 once it runs; bad requests do not hurt afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_for_components_and_bad_requests_do_not_hurt() {
    let cluster = rdkafka::mocking::MockCluster::new(1).expect("librdkafka mock cluster");
    cluster.create_topic("events.webhook", 1, 1).unwrap();
    cluster.broker_down(1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "sources:\n  hooks: {{ kind: webhook, listen: {HOOK}, path: / }}\nsinks:\n  stream:\n    kind: kafka\n    brokers: {}\n    topic: \"events.{{type}}\"\n    properties: {{ reconnect.backoff.max.ms: 100 }}\nroutes:\n  - {{ from: [hooks], to: [stream] }}\n",
        cluster.bootstrap_servers()
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    // Not ready while the broker is down: seen on several answers over half a second.
    let mut not_ready = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while not_ready < 5 {
        if d.restarted_for_a_taken_port() {
            not_ready = 0;
            continue;
        }
        if let Ok((status, body)) = get(d.admin, "/readyz").await {
            assert_eq!(
                (status, String::from_utf8_lossy(&body).into_owned()),
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: sink stream, source hooks\n".to_owned()
                ),
                "ready although the Kafka sink cannot have been built"
            );
            not_ready += 1;
        }
        assert!(
            Instant::now() < deadline,
            "the admin server never answered; sluice's log:\n{}",
            d.stderr_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.broker_up(1).unwrap();
    d.wait_ready().await;
    assert_eq!(
        get(d.admin, "/readyz").await.unwrap(),
        (StatusCode::OK, Bytes::from("ready\n"))
    );
    // Garbage on the webhook port: the daemon stays up.
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(d.hook).await.unwrap();
    s.write_all(b"\x16\x03\x01garbage\r\n\r\n").await.unwrap();
    drop(s);
    let (status, _) = request(
        d.hook,
        "POST",
        "/",
        &[("content-type", "application/cloudevents+json")],
        b"{not json",
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(get(d.admin, "/readyz").await.unwrap().0, StatusCode::OK);
    let (status, _) = request(
        d.hook,
        "POST",
        "/",
        &[("idempotency-key", "still-up")],
        b"{}",
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "still serving after the garbage");
    assert!(d.stop().success());
}

#[tokio::test]
async fn schedule_catchup_across_a_restart_emits_no_slot_twice() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "state_dir: {}\nsources:\n  tick: {{ kind: schedule, interval: 1s, catchup: {{ enabled: true, max_duration: 1h }} }}\nsinks:\n  console: {{ kind: log }}\nroutes:\n  - {{ from: [tick], to: [console] }}\n",
        dir.path().join("state").display()
    );
    let id = |v: &Value| v["id"].as_str().unwrap().to_owned();
    let mut ids = Vec::new();
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    for _ in 0..2 {
        ids.push(id(&d.next_line()));
    }
    // Every slot printed before the exit counts, however late in the shutdown it came.
    let (status, rest) = d.stop_collecting();
    assert!(status.success());
    ids.extend(rest.iter().map(id));
    let first_run = ids.len();
    // Down for a while: the slots missed meanwhile are replayed after the restart.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let restarted = chrono::Utc::now();
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    for _ in 0..4 {
        ids.push(id(&d.next_line()));
    }
    let (status, rest) = d.stop_collecting();
    assert!(status.success());
    ids.extend(rest.iter().map(id));
    let slots: Vec<chrono::DateTime<chrono::Utc>> = ids
        .iter()
        .map(|id| id.strip_prefix("tick:").unwrap().parse().unwrap())
        .collect();
    for w in slots.windows(2) {
        assert_eq!(
            (w[1] - w[0]).num_seconds(),
            1,
            "consecutive slots, none twice, none missing: {ids:?}"
        );
    }
    assert!(
        slots[first_run] < restarted - chrono::Duration::seconds(1),
        "the second run began with slots missed while it was down: {ids:?}"
    );
}

/// Runs `tests/interop/<script>` with `url` on the test script's Python (target/pyenv, where
/// scripts/test.sh installs the SDKs and libraries the interop tests use) and returns its stdout;
/// a missing interpreter or a failing script fails the test with what to do or its output.
async fn run_interop_script(script: &str, url: String) -> String {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/pyenv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/test.sh, which installs the Python SDK and the provider libraries there",
        python.display()
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(script);
    let out =
        tokio::task::spawn_blocking(move || Command::new(&python).arg(&script).arg(url).output())
            .await
            .unwrap()
            .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A client no one here wrote: the official Python SDK sends binary and structured events, and
/// they arrive intact. The test script installs the SDK into target/pyenv.
#[tokio::test]
async fn python_cloudevents_sdk_events_arrive_intact() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path(), "");
    d.wait_ready().await;
    let stdout = run_interop_script("python_sdk_client.py", format!("http://{}/", d.hook)).await;
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        ["binary 200", "structured 200"]
    );
    let b = d.next_line();
    assert_eq!(b["id"], "py-binary-1");
    assert_eq!(b["source"], "urn:python-sdk");
    assert_eq!(b["type"], "com.example.py.binary");
    assert_eq!(b["subject"], "orders/7");
    assert_eq!(
        b["comexample"], "a b ü %",
        "percent-encoded header decoded exactly once"
    );
    assert_eq!(b["data"], serde_json::json!({"message": "Hello", "n": 7}));
    let s = d.next_line();
    assert_eq!(s["id"], "py-structured-1");
    assert_eq!(s["type"], "com.example.py.structured");
    assert_eq!(s["data"], serde_json::json!({"message": "World"}));
    assert!(
        s["time"].as_str().is_some(),
        "the SDK's time passes through"
    );
    assert!(d.stop().success());
}

/// Every config we ship (embedded default, examples, deployment configs) is valid.
#[test]
fn shipped_configs_validate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    // Secrets the deploy examples read with ${file:/run/secrets/sluice/...}.
    let secrets = dir.path().join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::write(secrets.join("orders-token"), "t0ken\n").unwrap();
    let mut configs: Vec<(String, String)> = Vec::new();
    let mut add = |p: PathBuf| {
        let text = std::fs::read_to_string(&p).unwrap();
        configs.push((p.display().to_string(), text));
    };
    add(root.join("config/default.yaml"));
    add(root.join("deploy/container/sluice.yaml"));
    add(root.join("deploy/helm/sluice/files/default-config.yaml"));
    for d in ["config/examples", "deploy/kustomize/base"] {
        for entry in std::fs::read_dir(root.join(d)).unwrap() {
            let p = entry.unwrap().path();
            if d.starts_with("config") || p.ends_with("sluice.yaml") {
                add(p);
            }
        }
    }
    for overlay in ["edge", "sidecar", "relay"] {
        add(root.join(format!("deploy/kustomize/overlays/{overlay}/sluice.yaml")));
    }
    // The Helm chart's values files carry a config under `config:` (empty: the chart's default).
    let mut from_values = 0;
    for entry in std::fs::read_dir(root.join("deploy/helm/sluice")).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("values") && name.ends_with(".yaml")) {
            continue;
        }
        let doc: yaml_serde::Value =
            yaml_serde::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let config = &doc["config"];
        if config.as_mapping().is_some_and(|m| !m.is_empty()) {
            configs.push((
                format!("{}: config", p.display()),
                yaml_serde::to_string(config).unwrap(),
            ));
            from_values += 1;
        }
    }
    assert!(
        from_values >= 3,
        "edge, sidecar and relay values carry a config"
    );
    assert!(configs.len() >= 12, "{}", configs.len());
    for (i, (name, text)) in configs.iter().enumerate() {
        let text = text.replace("/run/secrets/sluice/", &format!("{}/", secrets.display()));
        let p = dir.path().join(format!("{i}.yaml"));
        std::fs::write(&p, text).unwrap();
        let out = Command::new(BIN)
            .args(["validate", "-c"])
            .arg(&p)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// POSTs one plain event per id (as `idempotency-key`), each answered 200; returns the ids.
async fn post_ok(d: &Daemon, ids: &[&str]) -> Vec<String> {
    let mut acked = Vec::new();
    for id in ids {
        let (s, b) = request(d.hook, "POST", "/", &[("idempotency-key", id)], b"{}")
            .await
            .unwrap();
        assert_eq!(s, StatusCode::OK, "{id}: {b:?}");
        acked.push((*id).to_owned());
    }
    acked
}

/// POSTs event `id` until it is answered 200 (30 s at most: then fails with `what`).
async fn post_until_ok(d: &Daemon, id: &str, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, _) = request(d.hook, "POST", "/", &[("idempotency-key", id)], b"{}")
            .await
            .unwrap();
        if s == StatusCode::OK {
            return id.to_owned();
        }
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// webhook → JetStream through the real binary: a NATS outage turns answers into non-2xx, and
/// every event answered 200 is in the stream after the server comes back.
#[tokio::test]
async fn webhook_to_jetstream_survives_a_nats_outage() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("js");
    let mut nats = spawn_nats(&store);
    // The daemon reaches NATS through a relay on a port held by this test, so the server can be
    // restarted (on a port of its own) behind the same address.
    let relay = Relay::new();
    relay.point_at(Some(nats.port));
    let nats_port = relay.port;
    let body = format!(
        "sources:\n  hooks: {{ kind: webhook, listen: {HOOK}, path: /, ack_timeout: 3s }}\nsinks:\n  bus:\n    kind: nats\n    url: nats://127.0.0.1:{nats_port}\n    subject: \"events.{{source}}\"\n    ack_timeout: 1s\n    jetstream: {{ stream: EVENTS, create: {{ subjects: [\"events.>\"], duplicate_window: 10m }} }}\nroutes:\n  - {{ from: [hooks], to: [bus] }}\n"
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    let mut acked = post_ok(&d, &["before-0", "before-1", "before-2"]).await;
    relay.point_at(None);
    let _ = nats.child.kill();
    let _ = nats.child.wait();
    let (s, b) = request(d.hook, "POST", "/", &[("idempotency-key", "during")], b"{}")
        .await
        .unwrap();
    assert_eq!(
        s,
        StatusCode::SERVICE_UNAVAILABLE,
        "a NATS outage is answered 503 (retry later): {b:?}"
    );
    let mut nats = spawn_nats(&store);
    relay.point_at(Some(nats.port));
    acked.push(post_until_ok(&d, "after", "no recovery after the NATS restart").await);
    assert!(d.stop().success());
    let client = async_nats::connect(format!("nats://127.0.0.1:{}", nats.port))
        .await
        .unwrap();
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream("EVENTS").await.unwrap();
    let info = stream.info().await.unwrap();
    let mut ids = Vec::new();
    for seq in info.state.first_sequence..=info.state.last_sequence {
        if let Ok(m) = stream.get_raw_message(seq).await {
            ids.push(m.headers.get("ce-id").unwrap().as_str().to_owned());
        }
    }
    for id in &acked {
        assert!(
            ids.contains(id),
            "{id} was answered 200 but is not in the stream: {ids:?}"
        );
    }
    let _ = nats.child.kill();
    let _ = nats.child.wait();
}

/// The records of `topic` (one partition, from the beginning) as (ce_id header, key), until
/// `n` arrived or ten seconds passed.
fn kafka_records(bootstrap: &str, topic: &str, n: usize) -> Vec<(String, Option<String>)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Headers, Message};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "sluice-e2e")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, rdkafka::Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < n && Instant::now() < deadline {
        let Some(m) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m.unwrap();
        let id = m
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "ce_id"))
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .expect("a ce_id header");
        let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
        out.push((id, key));
    }
    out
}

/// webhook → Kafka (librdkafka's mock cluster: the Kafka protocol on real sockets) through the
/// real binary: 200 only after the broker took the record, non-2xx while the broker is down,
/// and every event answered 200 is in the topic, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_to_kafka_answers_after_the_broker_took_the_record() {
    let cluster = rdkafka::mocking::MockCluster::new(1).expect("librdkafka mock cluster");
    cluster.create_topic("events.webhook", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "sources:\n  hooks: {{ kind: webhook, listen: {HOOK}, path: /, ack_timeout: 5s }}\nsinks:\n  stream:\n    kind: kafka\n    brokers: {bootstrap}\n    topic: \"events.{{type}}\"\n    key: \"{{id}}\"\n    message_timeout: 2s\n    properties: {{ reconnect.backoff.max.ms: 100 }}\nroutes:\n  - {{ from: [hooks], to: [stream] }}\n"
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    let mut acked = post_ok(&d, &["before-0", "before-1", "before-2"]).await;
    // The same event again: answered from the dedup window, not written twice.
    let (s, _) = request(
        d.hook,
        "POST",
        "/",
        &[("idempotency-key", "before-0")],
        b"{}",
    )
    .await
    .unwrap();
    assert_eq!(s, StatusCode::OK);

    cluster.broker_down(1).unwrap();
    let (s, b) = request(d.hook, "POST", "/", &[("idempotency-key", "during")], b"{}")
        .await
        .unwrap();
    assert_eq!(
        s,
        StatusCode::SERVICE_UNAVAILABLE,
        "a broker outage is answered 503 (retry later): {b:?}"
    );
    cluster.broker_up(1).unwrap();
    acked.push(post_until_ok(&d, "after", "no recovery after the broker came back").await);
    assert!(d.stop().success());

    let got = kafka_records(&bootstrap, "events.webhook", acked.len());
    for id in &acked {
        let n = got.iter().filter(|(g, _)| g == id).count();
        assert_eq!(
            n, 1,
            "{id} was answered 200: it must be in the topic once: {got:?}"
        );
    }
    for (id, key) in &got {
        assert_eq!(key.as_deref(), Some(id.as_str()), "the key template");
    }
}

/// The distinct `ce-id`s in a JetStream stream, and how many messages it holds.
async fn stream_ids(url: &str, stream: &str) -> (std::collections::BTreeSet<String>, u64) {
    let client = async_nats::connect(url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let Ok(mut stream) = js.get_stream(stream).await else {
        return (Default::default(), 0);
    };
    let info = stream.info().await.unwrap().clone();
    let mut ids = std::collections::BTreeSet::new();
    if info.state.messages > 0 {
        for seq in info.state.first_sequence..=info.state.last_sequence {
            if let Ok(m) = stream.get_raw_message(seq).await {
                ids.insert(m.headers.get("ce-id").unwrap().as_str().to_owned());
            }
        }
    }
    (ids, info.state.messages)
}

/// Runs the relay `body` (into the JetStream stream `stream` at `url`, whose messages carry
/// `ce-id`), kills it with SIGKILL once a fifth of the `n` messages are in the stream, starts a
/// second one, and waits (at most `bound_s` seconds) until every message is in the stream, each
/// once; then stops it and checks its drain wrote nothing twice. Returns the ids.
async fn relay_survives_kill_9(
    dir: &Path,
    body: &str,
    url: &str,
    stream: &str,
    n: usize,
    bound_s: u64,
) -> std::collections::BTreeSet<String> {
    let mut d = Daemon::start_with(dir, body);
    d.wait_ready().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    loop {
        let got = match js.get_stream(stream).await {
            Ok(mut s) => s.info().await.unwrap().state.messages,
            Err(_) => 0,
        };
        if got >= (n / 5) as u64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the relay did not start: {got} messages; log:\n{}",
            d.stderr_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = d.child.kill(); // SIGKILL: no drain, no last commit or ack
    let _ = d.child.wait();
    let (at_kill, _) = stream_ids(url, stream).await;
    assert!(
        at_kill.len() < n * 3 / 4,
        "the kill came too late to test anything: {} of {n}",
        at_kill.len()
    );

    let dir2 = tempfile::tempdir().unwrap();
    let mut d2 = Daemon::start_with(dir2.path(), body);
    d2.wait_ready().await;
    let deadline = Instant::now() + Duration::from_secs(bound_s);
    let ids = loop {
        let (ids, count) = stream_ids(url, stream).await;
        if ids.len() == n {
            assert_eq!(count, n as u64, "each message once in the stream");
            break ids;
        }
        if Instant::now() >= deadline {
            let m = get(d2.admin, "/metrics")
                .await
                .map(|r| String::from_utf8_lossy(&r.1).into_owned())
                .unwrap_or_default();
            let m: Vec<&str> = m.lines().filter(|l| l.starts_with("sluice_")).collect();
            panic!(
                "{} of {n} messages in the stream after the restart; metrics:\n{}\nlog:\n{}",
                ids.len(),
                m.join("\n"),
                d2.stderr_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(d2.stop().success());
    let (_, count) = stream_ids(url, stream).await;
    assert_eq!(count, n as u64, "nothing written twice by the drain");
    ids
}

/// Kafka → JetStream relay through the binary, with `kill -9` of Sluice in the middle: after a
/// second Sluice takes over the group, every record is in the stream, each once (offsets were
/// committed only after the PubAck; what is sent again is dropped by `Nats-Msg-Id`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_jetstream_relay_survives_kill_9() {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    const N: usize = 10_000;
    let cluster = rdkafka::mocking::MockCluster::new(1).expect("librdkafka mock cluster");
    cluster.create_topic("relay", 2, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let sends: Vec<_> = (0..N)
        .map(|i| {
            let payload = format!("{{\"i\":{i}}}");
            producer
                // Both partitions explicitly: keyless records go where the sticky partitioner
                // puts them, which can be one partition for the whole run.
                .send_result(
                    FutureRecord::<(), _>::to("relay")
                        .payload(&payload)
                        .partition((i % 2) as i32),
                )
                .unwrap()
        })
        .collect();
    for s in sends {
        s.await.unwrap().unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let nats = spawn_nats(&dir.path().join("js"));
    let url = format!("nats://127.0.0.1:{}", nats.port);
    // A short session timeout: the group gives the killed member's partitions to the second
    // one quickly. A small window, so the kill lands with records in flight.
    let body = format!(
        "sources:\n  orders:\n    kind: kafka\n    brokers: {bootstrap}\n    topics: [relay]\n    group: relay\n    max_in_flight: 64\n    commit_interval: 100ms\n    properties: {{ session.timeout.ms: 3000, heartbeat.interval.ms: 500 }}\nsinks:\n  bus:\n    kind: nats\n    url: {url}\n    subject: relay.events\n    max_in_flight: 64\n    jetstream: {{ stream: RELAY, create: {{ subjects: [\"relay.>\"], duplicate_window: 10m }} }}\nroutes:\n  - {{ from: [orders], to: [bus] }}\n"
    );
    let ids = relay_survives_kill_9(dir.path(), &body, &url, "RELAY", N, 60).await;
    assert!(ids.contains("relay-0-0") && ids.contains("relay-1-0"));
}

/// GCP Pub/Sub → JetStream relay through the binary, against the Pub/Sub emulator, with
/// `kill -9` of Sluice in the middle: after a second Sluice starts, every message is in the
/// stream, each once (acknowledged only after the PubAck; what Pub/Sub redelivers is dropped by
/// `Nats-Msg-Id`, the message id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcp_pubsub_to_jetstream_relay_survives_kill_9() {
    use gcloud_pubsub::client::{Client, ClientConfig};
    use gcloud_pubsub::subscription::SubscriptionConfig;
    const N: usize = 3000;
    let dir = tempfile::tempdir().unwrap();
    let (host, _emulator) = sluice_core::testkit::peers::pubsub_emulator(dir.path());
    let client = Client::new(ClientConfig {
        project_id: Some("relay".into()),
        environment: google_cloud_gax::conn::Environment::Emulator(host.clone()),
        pool_size: 1,
        ..ClientConfig::default()
    })
    .await
    .unwrap();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let (topic, sub) = (format!("orders-{stamp}"), format!("relay-{stamp}"));
    client.topic(&topic).create(None, None).await.unwrap();
    client
        .subscription(&sub)
        .create(
            &client.fully_qualified_topic_name(&topic),
            SubscriptionConfig {
                ack_deadline_seconds: 10,
                ..SubscriptionConfig::default()
            },
            None,
        )
        .await
        .unwrap();
    let publisher = client.topic(&topic).new_publisher(None);
    let mut published = std::collections::BTreeSet::new();
    for chunk in (0..N).collect::<Vec<_>>().chunks(500) {
        let msgs = chunk
            .iter()
            .map(|i| google_cloud_googleapis::pubsub::v1::PubsubMessage {
                data: Bytes::from(format!("{{\"i\":{i}}}")),
                ..Default::default()
            })
            .collect();
        published.extend(publisher.publish_immediately(msgs, None).await.unwrap());
    }
    assert_eq!(published.len(), N);
    let nats = spawn_nats(&dir.path().join("js"));
    let url = format!("nats://127.0.0.1:{}", nats.port);
    let body = format!(
        "sources:\n  gcp:\n    kind: pubsub\n    project: relay\n    endpoint: {host}\n    subscription: {sub}\n    ack_deadline: 10s\n    max_outstanding_messages: 64\nsinks:\n  bus:\n    kind: nats\n    url: {url}\n    subject: relay.events\n    max_in_flight: 64\n    jetstream: {{ stream: PSRELAY, create: {{ subjects: [\"relay.>\"], duplicate_window: 10m }} }}\nroutes:\n  - {{ from: [gcp], to: [bus] }}\n"
    );
    // A restart bound, not a wait: messages in flight at the kill come again after their 10 s
    // deadline, and a cold emulator sometimes hands a redelivery to the killed process's stream
    // first (another 10 s).
    let ids = relay_survives_kill_9(dir.path(), &body, &url, "PSRELAY", N, 180).await;
    assert_eq!(ids, published, "the event ids are the Pub/Sub message ids");
}

/// A Kafka source whose brokers vanished must not hold the process at SIGTERM: librdkafka's
/// close never returns without brokers, so the daemon stops within its bounds anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_the_process_when_the_kafka_brokers_are_gone() {
    let cluster = rdkafka::mocking::MockCluster::new(1).expect("librdkafka mock cluster");
    cluster.create_topic("gone", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "shutdown_grace: 2s\nsources:\n  orders: {{ kind: kafka, brokers: \"{bootstrap}\", topics: [gone], group: gone, properties: {{ session.timeout.ms: 3000, heartbeat.interval.ms: 500 }} }}\nsinks:\n  out: {{ kind: \"null\" }}\nroutes:\n  - {{ from: [orders], to: [out] }}\n"
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    // Let it join the group, then take the brokers away.
    tokio::time::sleep(Duration::from_secs(4)).await;
    drop(cluster);
    // Long enough for the session to time out: the assignment is lost, the consumer keeps
    // trying to rejoin a coordinator that is gone.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let started = Instant::now();
    let status = d.stop();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?} to stop",
        started.elapsed()
    );
    assert!(status.code().is_some(), "exited by itself: {status}");
}

/// Starts `sluice run` on a config with a schedule source (no ports) and returns it with its
/// stderr piped; `env` adds variables, `NO_COLOR` is removed unless given.
fn spawn_plain(dir: &Path, env: &[(&str, &str)]) -> Child {
    let path = dir.join("plain.yaml");
    std::fs::write(
        &path,
        "admin: { enabled: false }\nsources:\n  tick: { kind: schedule, interval: 1h }\nsinks:\n  out: { kind: null }\nroutes:\n  - { from: [tick], to: [out] }\n",
    )
    .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "-c"]).arg(&path).env_remove("NO_COLOR");
    cmd.env("RUST_LOG", "info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads stderr until "sluice is running", SIGTERMs, and returns all of it.
fn run_and_stop(mut child: Child) -> String {
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !text.contains("sluice is running") {
        assert!(Instant::now() < deadline, "did not start: {text}");
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("sluice exited: {text}");
        }
        text.push_str(&line);
    }
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    std::io::Read::read_to_string(&mut err, &mut text).unwrap();
    assert!(child.wait().unwrap().success(), "{text}");
    text
}

#[test]
fn logs_into_a_pipe_carry_no_escape_codes() {
    let dir = tempfile::tempdir().unwrap();
    let text = run_and_stop(spawn_plain(dir.path(), &[]));
    assert!(text.contains("INFO"), "{text}");
    assert!(!text.contains('\x1b'), "escape codes in a pipe: {text:?}");
}

#[test]
fn logs_on_a_terminal_are_coloured_unless_no_color() {
    // `script` gives the daemon a pseudo-terminal as stdout and stderr.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tty.yaml");
    std::fs::write(
        &cfg,
        "admin: { enabled: false }\nsources:\n  tick: { kind: schedule, interval: 1h }\nsinks:\n  out: { kind: null }\nroutes:\n  - { from: [tick], to: [out] }\n",
    )
    .unwrap();
    let on_tty = |no_color: Option<&str>| -> String {
        // The daemon stops itself: `timeout` sends SIGTERM after 2 s.
        let inner = format!("timeout -s TERM 2 {BIN} run -c {}", cfg.display());
        let mut cmd = Command::new("script");
        cmd.args(["-qefc", &inner, "/dev/null"])
            .env_remove("NO_COLOR")
            .env("RUST_LOG", "info");
        if let Some(v) = no_color {
            cmd.env("NO_COLOR", v);
        }
        let out = cmd.output().expect("script (util-linux) runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let coloured = on_tty(None);
    assert!(coloured.contains("sluice is running"), "{coloured:?}");
    assert!(
        coloured.contains('\x1b'),
        "a terminal gets colour: {coloured:?}"
    );
    let plain = on_tty(Some("1"));
    assert!(plain.contains("sluice is running"), "{plain:?}");
    assert!(
        !plain.contains('\x1b'),
        "NO_COLOR=1 on a terminal: {plain:?}"
    );
}

#[tokio::test]
async fn sigterm_ends_the_process_even_when_stdout_is_blocked() {
    let dir = tempfile::tempdir().unwrap();
    let hook = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let path = dir.path().join("blocked.yaml");
    std::fs::write(
        &path,
        format!(
            "admin: {{ enabled: false }}\nshutdown_grace: 1s\nsources:\n  hooks: {{ kind: webhook, listen: {hook}, path: /, ack_timeout: 1s }}\nsinks:\n  console: {{ kind: log }}\nroutes:\n  - {{ from: [hooks], to: [console] }}\n"
        ),
    )
    .unwrap();
    // stdout is a pipe nobody reads (a stuck log collector): it fills and the log sink's write
    // blocks in a blocking-pool thread for good.
    let mut child = Command::new(BIN)
        .args(["run", "-c"])
        .arg(&path)
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _stdout_never_read = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let keep = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            keep.lock().unwrap().push_str(&(line + "\n"));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while !log.lock().unwrap().contains("sluice is running") {
        assert!(
            Instant::now() < deadline,
            "did not start: {}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // 200 events of 8 KiB: far more than a 64 KiB pipe holds.
    let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(8192));
    let mut posts = Vec::new();
    for i in 0..200 {
        let body = body.clone();
        posts.push(tokio::spawn(async move {
            let id = format!("blocked-{i}");
            let headers = [
                ("content-type", "application/json"),
                ("idempotency-key", id.as_str()),
            ];
            let _ = tokio::time::timeout(
                Duration::from_secs(5),
                request(hook, "POST", "/", &headers, body.as_bytes()),
            )
            .await;
        }));
    }
    for p in posts {
        let _ = p.await;
    }
    let stopped_at = Instant::now();
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            stopped_at.elapsed() < Duration::from_secs(15),
            "still running 15 s after SIGTERM with shutdown_grace 1s; log:\n{}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        status.code(),
        Some(3),
        "a drain cut short by the grace says so; log:\n{}",
        log.lock().unwrap()
    );
}

#[tokio::test]
async fn a_processor_between_webhook_and_log_reshapes_and_drains() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "sources:\n  hooks: {{ kind: webhook, listen: {HOOK}, path: / }}\nprocessors:\n  tag: {{ kind: set, type: 'com.example.{{type}}', extensions: {{ region: eu, via: '{{source}}' }} }}\nsinks:\n  console: {{ kind: log }}\nroutes:\n  - {{ from: [hooks], to: [tag] }}\n  - {{ from: [tag], to: [console] }}\n"
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    let ready = get(d.admin, "/readyz").await.unwrap();
    assert_eq!(ready.0, StatusCode::OK);
    let ce =
        r#"{"specversion":"1.0","id":"p-1","source":"urn:shop","type":"order","data":{"n":1}}"#;
    let (status, body) = request(
        d.hook,
        "POST",
        "/",
        &[("content-type", "application/cloudevents+json")],
        ce.as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "{body:?}");
    let line = d.next_line();
    assert_eq!(line["id"], "p-1");
    assert_eq!(line["source"], "urn:shop");
    assert_eq!(line["type"], "com.example.order");
    assert_eq!(line["region"], "eu");
    assert_eq!(line["via"], "urn:shop");
    let metrics = get(d.admin, "/metrics").await.unwrap();
    let text = String::from_utf8_lossy(&metrics.1);
    assert_eq!(
        metric(&text, "sluice_events_received_total{processor=\"tag\"}"),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "sluice_events_delivered_total{processor=\"tag\"}"),
        1.0
    );
    // SIGTERM drains through the processor: events accepted just before are delivered, exit 0.
    let (status, _) = request(
        d.hook,
        "POST",
        "/",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", "p-2"),
        ],
        b"{}",
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    let (status, rest) = d.stop_collecting();
    assert!(status.success(), "{status}");
    assert_eq!(
        rest.iter()
            .map(|l| l["id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["p-2"]
    );
}

fn github_signature(secret: &str, body: &[u8]) -> String {
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = aws_lc_rs::hmac::sign(&key, body);
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// GitHub through the binary: a signed push reaches the sink named after the CloudEvents GitHub
/// adapter, with the delivery id as its id; the same delivery again is a duplicate; a bad
/// signature is a 401 that reaches nothing and is counted by reason.
#[tokio::test]
async fn github_push_is_verified_named_and_deduplicated() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gh-secret"), "s3cr3t-old\n").unwrap();
    let body = format!(
        "sources:\n  gh:\n    kind: github\n    listen: {HOOK}\n    path: /github\n    secrets: [\"${{file:{}}}\", \"s3cr3t-new\"]\n    events: [push]\nsinks:\n  console: {{ kind: log }}\nroutes:\n  - {{ from: [gh], to: [console] }}\n",
        dir.path().join("gh-secret").display()
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    let push = br#"{"ref":"refs/heads/main","after":"6113728f27ae82c7b1a177c8d03f9e96e0adf246","repository":{"id":1296269,"full_name":"octocat/Hello-World","url":"https://github.com/octocat/Hello-World"},"pusher":{"name":"octocat"}}"#;
    let headers = |sig: &str| {
        vec![
            ("content-type", "application/json".to_owned()),
            ("x-github-event", "push".to_owned()),
            (
                "x-github-delivery",
                "72d3162e-cc78-11e3-81ab-4c9367dc0958".to_owned(),
            ),
            ("x-hub-signature-256", sig.to_owned()),
        ]
    };
    let send = |h: Vec<(&'static str, String)>, body: &'static [u8]| {
        let addr = d.hook;
        async move {
            let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
            request(addr, "POST", "/github", &h, body).await.unwrap()
        }
    };
    // Signed with the secret read from the file (the file's newline is not part of it).
    let (status, reply) = send(headers(&github_signature("s3cr3t-old", push)), push).await;
    assert_eq!(status, StatusCode::OK, "{reply:?}");
    let line = d.next_line();
    assert_eq!(line["type"], "com.github.push");
    assert_eq!(line["id"], "72d3162e-cc78-11e3-81ab-4c9367dc0958");
    assert_eq!(line["source"], "https://github.com/octocat/Hello-World");
    assert_eq!(line["subject"], "refs/heads/main");
    assert_eq!(
        line["data"]["after"],
        "6113728f27ae82c7b1a177c8d03f9e96e0adf246"
    );
    // GitHub redelivers with the same delivery id: answered 200 as a duplicate, not forwarded.
    let (status, reply) = send(headers(&github_signature("s3cr3t-new", push)), push).await;
    assert_eq!(status, StatusCode::OK);
    let reply: Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(reply["duplicates"], 1, "{reply}");
    // A wrong secret: 401 naming the header, nothing forwarded.
    let (status, reply) = send(headers(&github_signature("wrong", push)), push).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(String::from_utf8_lossy(&reply).contains("X-Hub-Signature-256"));
    // An event not in `events`: 200, counted as filtered, nothing forwarded.
    let mut h = headers(&github_signature("s3cr3t-old", push));
    h[1].1 = "issues".into();
    h[2].1 = "other-delivery".into();
    assert_eq!(send(h, push).await.0, StatusCode::OK);

    let (_, metrics) = get(d.admin, "/metrics").await.unwrap();
    let m = String::from_utf8_lossy(&metrics);
    assert_eq!(
        metric(
            &m,
            "sluice_events_rejected_total{source=\"gh\",reason=\"bad_signature\"}"
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "sluice_events_filtered_total{source=\"gh\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "sluice_events_deduplicated_total{source=\"gh\"}"),
        1.0,
        "{m}"
    );
    let (status, rest) = d.stop_collecting();
    assert!(status.success());
    assert!(
        rest.is_empty(),
        "nothing but the first push reached the sink: {rest:?}"
    );
}

/// Requests signed by the providers' own Python libraries (`stripe`, `slack_sdk`,
/// `standardwebhooks`, installed by the test script into target/pyenv) verify in Sluice; the
/// same libraries' tampered, wrong-secret and stale requests do not.
#[tokio::test]
async fn provider_libraries_signatures_verify() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "sources:\n  pay: {{ kind: stripe, listen: {HOOK}, path: /stripe, secrets: [whsec_interop_stripe] }}\n  chat: {{ kind: slack, listen: {HOOK}, path: /slack, secrets: [interop-slack-signing-secret] }}\n  std: {{ kind: standard-webhooks, listen: {HOOK}, path: /standard, secrets: [whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw], type_prefix: com.example. }}\nsinks:\n  console: {{ kind: log }}\nroutes:\n  - {{ from: [pay, chat, std], to: [console] }}\n"
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    let stdout = run_interop_script("provider_signatures.py", format!("http://{}", d.hook)).await;
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            // The known answer held by the unit tests (providers/tests.rs, STRIPE_V1).
            "stripe-known t=1700000000,v1=d95c6b7477fbd7e9f90b1b0ef5f9c7ac25abca5382460e0d988c2b2a5b71b990",
            "stripe 200",
            "stripe-tampered 401",
            "slack 200",
            "slack-wrong-secret 401",
            "standard 200",
            "standard-stale 401",
        ]
    );
    let mut got: Vec<(String, String)> = (0..3)
        .map(|_| {
            let l = d.next_line();
            (
                l["type"].as_str().unwrap().to_owned(),
                l["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (
                "com.example.invoice.paid".to_owned(),
                "msg_interop_1".to_owned()
            ),
            ("com.slack.app_mention".to_owned(), "Ev0INTEROP1".to_owned()),
            (
                "com.stripe.charge.succeeded".to_owned(),
                "evt_interop_1".to_owned()
            ),
        ]
    );
    let (status, rest) = d.stop_collecting();
    assert!(status.success());
    assert!(
        rest.is_empty(),
        "refused requests reached the sink: {rest:?}"
    );
}

/// The `data` fields of every entry of a Redis stream.
/// A connection to the machine's RabbitMQ and a channel on it (keep the connection while the
/// channel is in use).
async fn rabbitmq() -> (lapin::Connection, lapin::Channel) {
    let amqp = lapin::Connection::connect(
        "amqp://guest:guest@127.0.0.1:5672/%2f",
        lapin::ConnectionProperties::default(),
    )
    .await
    .expect("RabbitMQ on 127.0.0.1:5672 (scripts/test.sh starts it)");
    let ch = amqp.create_channel().await.unwrap();
    (amqp, ch)
}

async fn redis_stream_data(c: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<String> {
    let reply: redis::streams::StreamRangeReply =
        redis::AsyncCommands::xrange_all(c, key).await.unwrap();
    reply
        .ids
        .iter()
        .filter_map(|e| {
            e.map
                .get("data")
                .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
        })
        .collect()
}

/// RabbitMQ, MQTT and Redis Streams sources relaying into Redis Streams through the binary, killed
/// with SIGKILL while messages are in flight and started again: every message arrives.
#[tokio::test]
async fn broker_sources_survive_kill_9() {
    const N: usize = 400;
    let tag = uuid::Uuid::now_v7().simple().to_string();
    let queue = format!("e2e-{tag}");
    let topic = format!("e2e/{tag}");
    let stream = format!("e2e-in-{tag}");
    let redis_client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
    let mut rc = redis_client
        .get_multiplexed_async_connection()
        .await
        .expect("Redis on 127.0.0.1:6379 (scripts/test.sh starts it)");
    let (_amqp, ch) = rabbitmq().await;
    let mut mo = rumqttc::MqttOptions::new(format!("e2e-pub-{tag}"), "127.0.0.1", 1883);
    mo.set_inflight(50);
    let (mqtt, mut mqtt_loop) = rumqttc::AsyncClient::new(mo, 1000);
    tokio::spawn(async move {
        loop {
            if mqtt_loop.poll().await.is_err() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "sources:\n  rabbit: {{ kind: amqp, queue: \"{queue}\", prefetch: 20, declare: {{ queue: {{ durable: true }} }} }}\n  devices: {{ kind: mqtt, topics: [\"{topic}/#\"], client_id: \"e2e-{tag}\", max_in_flight: 20 }}\n  stream: {{ kind: redis-streams, streams: [\"{stream}\"], group: g, consumer: c1, max_in_flight: 20 }}\nsinks:\n  out: {{ kind: redis-streams, stream: \"e2e-out-{tag}-{{source}}\", batch: 10 }}\nroutes:\n  - {{ from: [rabbit, devices, stream], to: [out] }}\n"
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    // Messages go in all along, across the kill and the restart.
    let publish = |i: usize| {
        let (ch, mqtt, redis_client, queue, topic, stream) = (
            ch.clone(),
            mqtt.clone(),
            redis_client.clone(),
            queue.clone(),
            topic.clone(),
            stream.clone(),
        );
        async move {
            let body = format!("{{\"i\":{i}}}");
            ch.basic_publish(
                "".into(),
                queue.as_str().into(),
                Default::default(),
                body.as_bytes(),
                lapin::BasicProperties::default()
                    .with_message_id(format!("m-{i}").into())
                    .with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
            mqtt.publish(
                format!("{topic}/x"),
                rumqttc::QoS::AtLeastOnce,
                false,
                body.clone(),
            )
            .await
            .unwrap();
            let mut c = redis_client
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let _: String =
                redis::AsyncCommands::xadd(&mut c, &stream, "*", &[("data", body.as_str())])
                    .await
                    .unwrap();
        }
    };
    // The kill comes while the first half is still being published, once some messages went
    // through: waiting for the whole first half let a fast relay finish it before the kill.
    let first_half = async {
        for i in 0..N / 2 {
            publish(i).await;
        }
    };
    let kill_midway = async {
        let mut watch = redis_client
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let started = Instant::now();
        loop {
            let mut relayed = 0;
            for source in ["rabbit", "devices", "stream"] {
                relayed += redis_stream_data(&mut watch, &format!("e2e-out-{tag}-{source}"))
                    .await
                    .len();
            }
            if relayed >= 10 || started.elapsed() > Duration::from_secs(20) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let _ = d.child.kill(); // SIGKILL: no drain, no acknowledgement of what is in flight
        let _ = d.child.wait();
    };
    tokio::join!(first_half, kill_midway);
    let mut relayed_at_kill = 0;
    for source in ["rabbit", "devices", "stream"] {
        relayed_at_kill += redis_stream_data(&mut rc, &format!("e2e-out-{tag}-{source}"))
            .await
            .len();
    }
    assert!(
        relayed_at_kill < 3 * N / 2,
        "the kill came after everything was relayed: it tests nothing"
    );
    for i in N / 2..N {
        publish(i).await;
    }
    let dir2 = tempfile::tempdir().unwrap();
    let mut d2 = Daemon::start_with(dir2.path(), &body);
    d2.wait_ready().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    for source in ["rabbit", "devices", "stream"] {
        // A plain stream entry's event data is the JSON object of its fields.
        let want: std::collections::BTreeSet<String> = (0..N)
            .map(|i| {
                let body = format!("{{\"i\":{i}}}");
                match source {
                    "stream" => serde_json::json!({ "data": body }).to_string(),
                    _ => body,
                }
            })
            .collect();
        let key = format!("e2e-out-{tag}-{source}");
        loop {
            let got: std::collections::BTreeSet<String> =
                redis_stream_data(&mut rc, &key).await.into_iter().collect();
            if got == want {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{source}: {} of {N} messages relayed after the restart; missing e.g. {:?}; log:\n{}",
                got.len(),
                want.difference(&got).next(),
                d2.stderr_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(d2.stop().success());
    let _ = ch
        .queue_delete(queue.as_str().into(), Default::default())
        .await;
}

/// Waits (up to 20 s) until the queue has no visible and no in-flight message; answers the
/// last counts read.
async fn queue_drained(sqs: &aws_sdk_sqs::Client, url: &str) -> String {
    let mut left = String::new();
    for _ in 0..200 {
        let a = sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(
                aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            )
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap();
        left = format!("{a:?}");
        if a.values().all(|v| v == "0") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    left
}

/// A moto bucket whose object-created notifications go to an SQS queue: the S3 client, the
/// SQS client and the queue's URL.
async fn s3_bucket_notifying_queue(
    moto_url: &str,
    bucket: &str,
    queue: &str,
) -> (aws_sdk_s3::Client, aws_sdk_sqs::Client, String) {
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(moto_url)
        .load()
        .await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let url = sqs
        .create_queue()
        .queue_name(queue)
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let arn = sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap()
        .remove(&aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .unwrap();
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&sdk)
            .force_path_style(true)
            .build(),
    );
    s3.create_bucket().bucket(bucket).send().await.unwrap();
    s3.put_bucket_notification_configuration()
        .bucket(bucket)
        .notification_configuration(
            aws_sdk_s3::types::NotificationConfiguration::builder()
                .queue_configurations(
                    aws_sdk_s3::types::QueueConfiguration::builder()
                        .queue_arn(&arn)
                        .events(aws_sdk_s3::types::Event::from("s3:ObjectCreated:*"))
                        .build()
                        .unwrap(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    (s3, sqs, url)
}

#[tokio::test]
async fn s3_upload_of_a_csv_triggers_the_http_sink_and_a_log_upload_does_not() {
    // The test kit sets the SDK's standard credential chain for moto; the daemon inherits it.
    let dir = tempfile::tempdir().unwrap();
    let moto = sluice_core::testkit::peers::spawn_moto(dir.path());
    let moto_url = format!("http://127.0.0.1:{}", moto.port);
    let (s3, sqs, url) = s3_bucket_notifying_queue(&moto_url, "data", "uploads-events").await;
    // The trigger target: records each request's ce-subject and ce-type.
    let target = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target_port = target.local_addr().unwrap().port();
    let (tx, mut got) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = target.accept().await else {
                return;
            };
            let tx = tx.clone();
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let h = |n: &str| {
                    req.headers()
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned()
                };
                let _ = tx.send((h("ce-subject"), h("ce-type")));
                async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    let body = format!(
        "sources:\n  uploads:\n    kind: s3\n    queue: uploads-events\n    events: [\"s3:ObjectCreated:*\"]\n    filter: {{ prefix: incoming/, suffix: .csv }}\n    region: us-east-1\n    endpoint: {}\n    wait_time: 1s\nsinks:\n  trigger: {{ kind: http, url: \"http://127.0.0.1:{target_port}/run\" }}\nroutes:\n  - {{ from: [uploads], to: [trigger] }}\n",
        moto_url
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    for key in ["incoming/report.log", "incoming/2026-12-01.csv"] {
        s3.put_object()
            .bucket("data")
            .key(key)
            .body(b"a,b\n".to_vec().into())
            .send()
            .await
            .unwrap();
    }
    let (subject, ty) = tokio::time::timeout(Duration::from_secs(20), got.recv())
        .await
        .expect("the .csv upload reached the HTTP sink")
        .unwrap();
    assert_eq!(subject, "incoming/2026-12-01.csv");
    assert_eq!(ty, "com.amazonaws.s3.ObjectCreated:Put");
    // Every message settled: the .csv one deleted after delivery, the .log one and the test
    // event deleted as filtered.
    let left = queue_drained(&sqs, &url).await;
    assert!(
        !left.contains("\"1\"") && !left.contains("\"2\""),
        "queue not empty: {left}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(got.try_recv().is_err(), "the .log upload triggered nothing");
    let (_, metrics) = get(d.admin, "/metrics").await.unwrap();
    let m = String::from_utf8_lossy(&metrics);
    assert!(
        metric(&m, "sluice_events_filtered_total{source=\"uploads\"}") >= 2.0,
        "the test event and the .log record are counted as filtered: {m}"
    );
    assert!(d.stop().success());
}

/// A local trigger target: answers each path with the statuses given in turn (the last one
/// repeated) and records `(path, body)` of every request.
async fn scripted_target(
    script: Vec<(&'static str, Vec<u16>)>,
) -> (u16, tokio::sync::mpsc::UnboundedReceiver<(String, Value)>) {
    let target = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = target.local_addr().unwrap().port();
    let (tx, got) = tokio::sync::mpsc::unbounded_channel::<(String, Value)>();
    let counts = Arc::new(Mutex::new(std::collections::HashMap::<String, usize>::new()));
    let script = Arc::new(script);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = target.accept().await else {
                return;
            };
            let (tx, counts, script) = (tx.clone(), counts.clone(), script.clone());
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let (tx, counts, script) = (tx.clone(), counts.clone(), script.clone());
                async move {
                    let path = req.uri().path().to_owned();
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let n = {
                        let mut c = counts.lock().unwrap();
                        let n = c.entry(path.clone()).or_default();
                        *n += 1;
                        *n
                    };
                    let statuses = script
                        .iter()
                        .find(|(p, _)| *p == path)
                        .map(|(_, s)| s.clone())
                        .unwrap_or(vec![404]);
                    let status = statuses[(n - 1).min(statuses.len() - 1)];
                    let _ = tx.send((path, serde_json::from_slice(&body).unwrap_or(Value::Null)));
                    let mut resp = http::Response::new(Full::new(Bytes::new()));
                    *resp.status_mut() = StatusCode::from_u16(status).unwrap();
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (port, got)
}

#[tokio::test]
async fn sensor_fires_on_both_dependencies_across_a_restart_retries_and_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (port, mut got) = scripted_target(vec![
        ("/release", vec![500, 500, 200]),
        ("/broken", vec![500]),
    ])
    .await;
    let body = r#"state_dir: @STATE@
sources:
  gh: { kind: webhook, listen: @HOOK@, path: /push }
  nightly: { kind: webhook, listen: @HOOK@, path: /nightly }
sensors:
  release:
    dependencies:
      - name: push
        source: gh
        filters:
          data: [{ path: ref, type: string, value: ['refs/heads/main'] }]
      - { name: nightly, source: nightly }
    triggers:
      - name: submit
        conditions: push && nightly
        sink: release-api
        atLeastOnce: true
        retryStrategy: { steps: 3, duration: 50ms, jitter: 0 }
        payload:
          - { src: { dependencyName: push, dataKey: after }, dest: commit }
          - { src: { dependencyName: push, dataTemplate: '{{ .Input.ref | trimPrefix "refs/heads/" }}' }, dest: branch }
      - name: notify
        conditions: nightly
        sink: broken
        atLeastOnce: true
        retryStrategy: { steps: 2, duration: 20ms, jitter: 0 }
        dlqTrigger: parked
sinks:
  release-api: { kind: http, url: 'http://127.0.0.1:@PORT@/release', retry: { max_attempts: 1 } }
  broken: { kind: http, url: 'http://127.0.0.1:@PORT@/broken', retry: { max_attempts: 1 } }
  parked: { kind: log }
"#
    .replace("@STATE@", &state.display().to_string())
    .replace("@PORT@", &port.to_string());
    let post = |d: &Daemon, path: &'static str, key: &'static str, json: &'static str| {
        let hook = d.hook;
        async move {
            request(
                hook,
                "POST",
                path,
                &[
                    ("content-type", "application/json"),
                    ("idempotency-key", key),
                ],
                json.as_bytes(),
            )
            .await
            .unwrap()
        }
    };
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    // One dependency (and a push to another branch, filtered): answered, nothing fired.
    assert_eq!(
        post(
            &d,
            "/push",
            "p1",
            r#"{"ref":"refs/heads/main","after":"abc123"}"#
        )
        .await
        .0,
        StatusCode::OK
    );
    assert_eq!(
        post(
            &d,
            "/push",
            "p2",
            r#"{"ref":"refs/heads/dev","after":"fff"}"#
        )
        .await
        .0,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(got.try_recv().is_err(), "a trigger fired on one dependency");
    // A restart keeps the partial match (state_dir).
    assert!(d.stop().success());
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    // The nightly event completes `submit` (500, 500, then 200 on the third step) and fires
    // `notify`, whose target always answers 500: it goes to the dlqTrigger. The webhook
    // answers once both runs finished (atLeastOnce).
    let (status, answer) = post(&d, "/nightly", "n1", r#"{"ok":true}"#).await;
    assert_eq!(status, StatusCode::OK, "{answer:?}");
    let mut release = Vec::new();
    let mut broken = 0;
    while let Ok((path, body)) = got.try_recv() {
        match path.as_str() {
            "/release" => release.push(body),
            _ => broken += 1,
        }
    }
    assert_eq!(release.len(), 3, "three attempts: {release:?}");
    for b in &release {
        assert_eq!(
            b,
            &serde_json::json!({"commit": "abc123", "branch": "main"})
        );
    }
    assert_eq!(broken, 2, "notify: two steps, then the dead letter");
    let parked = d.next_line();
    assert_eq!(parked["deadlettersink"], "broken");
    assert_eq!(
        parked["type"], "webhook",
        "notify forwards the nightly event itself"
    );
    let metrics = get(d.admin, "/metrics").await.unwrap();
    let text = String::from_utf8_lossy(&metrics.1);
    assert_eq!(
        metric(
            &text,
            "sluice_sensor_triggers_total{sensor=\"release\",trigger=\"submit\",result=\"fired\"}"
        ),
        1.0,
        "{text}"
    );
    assert_eq!(metric(&text, "sluice_sensor_triggers_total{sensor=\"release\",trigger=\"notify\",result=\"dead_lettered\"}"), 1.0);
    // Fired: the state is clear, another nightly alone fires only `notify`.
    assert!(d.stop().success());
}

/// A body nested deeper than any thread's stack (150 000 brackets, 300 KB, under the webhook's
/// default `max_body`) reaches a sensor's data filter, exprs field and jq transform: each
/// answers with an error for that event, the daemon goes on. gjson's recursive `valid` and
/// jaq's reader overflowed a worker's stack on it and aborted the process.
#[tokio::test]
async fn a_sensor_takes_data_nested_deeper_than_a_stack_without_crashing() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"sources:
  hooks: { kind: webhook, listen: @HOOK@, path: /in }
sinks:
  console: { kind: log }
sensors:
  deep:
    dependencies:
      - name: bydata
        source: hooks
        filters:
          data: [{ path: kind, type: string, value: ['^order$'] }]
          exprs: [{ expr: 'n > 1', fields: [{ name: n, path: n }] }]
      - name: byjq
        source: hooks
        transform: { jq: "{kind, copied: true}" }
    triggers:
      - { name: fwd, conditions: bydata || byjq, sink: console, atLeastOnce: true }
"#;
    let mut d = Daemon::start_with(dir.path(), body);
    d.wait_ready().await;
    let levels = 150_000;
    let deep = format!(
        r#"{{"kind":"order","n":{}2{}}}"#,
        "[".repeat(levels),
        "]".repeat(levels)
    );
    let (status, answer) = request(
        d.hook,
        "POST",
        "/in",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", "deep"),
        ],
        deep.as_bytes(),
    )
    .await
    .expect("the daemon answers the deep body");
    assert_eq!(status, StatusCode::OK, "{answer:?}");
    // Still up, and still firing: a plain event passes both dependencies.
    let (status, answer) = request(
        d.hook,
        "POST",
        "/in",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", "plain"),
        ],
        br#"{"kind":"order","n":2}"#,
    )
    .await
    .expect("the daemon answers after the deep body");
    assert_eq!(status, StatusCode::OK, "{answer:?}");
    // The trigger's output, from the plain event (the deep one matched nothing).
    let line = d.next_line();
    assert_eq!(line["data"]["kind"], "order", "{line}");
    let metrics = String::from_utf8_lossy(&get(d.admin, "/metrics").await.unwrap().1).to_string();
    // The deep event: an error in each dependency (the exprs field too deep to convert, the jq
    // reader refused); the plain one matched both.
    for dep in ["bydata", "byjq"] {
        let series = |result: &str| {
            format!("sluice_sensor_dependency_events_total{{sensor=\"deep\",dependency=\"{dep}\",result=\"{result}\"}}")
        };
        assert_eq!(metric(&metrics, &series("error")), 1.0, "{dep}: {metrics}");
        assert_eq!(
            metric(&metrics, &series("matched")),
            1.0,
            "{dep}: {metrics}"
        );
    }
    assert!(d.stop().success());
}

/// A message whose headers nest arrays 1 000 levels deep (RabbitMQ forwards it as is) reaches
/// an AMQP source: lapin parses header tables by recursion on its own I/O thread, which
/// overflowed std's default 2 MiB stack and aborted the daemon, again on every redelivery.
/// The daemon now gives threads that libraries spawn a larger stack: the message is consumed
/// and so is the next one. 1 000 levels overflow 2 MiB in the dev profile the suite runs in
/// (a release build needs about 1 500; this test's own publisher, on lapin's 2 MiB thread,
/// cannot send much more than 1 000 in the dev profile).
#[tokio::test]
async fn an_amqp_message_with_deeply_nested_headers_does_not_abort_the_daemon() {
    let tag = uuid::Uuid::now_v7().simple().to_string();
    let queue = format!("e2e-deep-{tag}");
    let (_amqp, ch) = rabbitmq().await;
    ch.queue_declare(
        queue.as_str().into(),
        lapin::options::QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        Default::default(),
    )
    .await
    .unwrap();
    let mut deep = lapin::types::AMQPValue::LongString("x".into());
    for _ in 0..1_000 {
        deep = lapin::types::AMQPValue::FieldArray(vec![deep].into());
    }
    let mut headers = lapin::types::FieldTable::default();
    headers.insert("deep".into(), deep);
    for (id, h) in [("deep", Some(headers)), ("plain", None)] {
        let mut props = lapin::BasicProperties::default()
            .with_message_id(id.into())
            .with_delivery_mode(2);
        if let Some(h) = h {
            props = props.with_headers(h);
        }
        ch.basic_publish(
            "".into(),
            queue.as_str().into(),
            Default::default(),
            format!("{{\"m\":\"{id}\"}}").as_bytes(),
            props,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "sources:\n  rabbit: {{ kind: amqp, queue: \"{queue}\", declare: {{ queue: {{ durable: true }} }} }}\nsinks:\n  console: {{ kind: log }}\nroutes:\n  - {{ from: [rabbit], to: [console] }}\n"
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    let mut got = Vec::new();
    for _ in 0..2 {
        let line = d.next_line();
        got.push(line["data"]["m"].as_str().unwrap_or_default().to_string());
    }
    got.sort();
    assert_eq!(got, ["deep", "plain"]);
    assert!(d.stop().success());
    ch.queue_delete(queue.as_str().into(), Default::default())
        .await
        .unwrap();
}

/// Argo Events' most common flow, on a real API server: a file lands in S3 → the `s3` source
/// (bucket notifications through SQS) → a Sensor keeps the `.csv` keys → a `k8s` trigger creates
/// an Argo Workflow whose parameter is the key. A `.log` upload creates nothing; the same
/// notification delivered twice, and again after a kill -9, creates one Workflow.
#[tokio::test]
async fn s3_to_sensor_to_argo_workflow() {
    let kubeconfig = std::env::var("SLUICE_TEST_KUBECONFIG").unwrap_or_else(|_| {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/k8s-envtest/run/kubeconfig");
        assert!(p.exists(), "no test API server: run `scripts/envtest.sh start` (scripts/test.sh does) or set SLUICE_TEST_KUBECONFIG");
        p.display().to_string()
    });
    let ns = format!("seed-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let moto = sluice_core::testkit::peers::spawn_moto(dir.path());
    let moto_url = format!("http://127.0.0.1:{}", moto.port);
    let (s3, sqs, queue_url) =
        s3_bucket_notifying_queue(&moto_url, "landing", "landing-events").await;
    let body = format!(
        r#"state_dir: {state}
sources:
  uploads: {{ kind: s3, queue: landing-events, region: us-east-1, endpoint: "{moto_url}", wait_time: 1s }}
sensors:
  csv:
    dependencies:
      - name: upload
        source: uploads
        filters:
          data: [{{ path: s3.object.key, type: string, value: ['\.csv$'] }}]
    triggers:
      - {{ name: process, sink: process, atLeastOnce: true }}
sinks:
  process:
    kind: k8s
    kubeconfig: {kubeconfig}
    namespace: {ns}
    resource:
      apiVersion: argoproj.io/v1alpha1
      kind: Workflow
      metadata: {{ generateName: s3-processing-, labels: {{ flow: seed }} }}
      spec:
        entrypoint: process
        arguments: {{ parameters: [{{ name: key }}] }}
        templates: [{{ name: process, container: {{ image: alpine, command: [cat] }} }}]
    parameters:
      # The subject is the object key decoded (S3 sends s3.object.key URL-encoded).
      - {{ src: {{ contextKey: subject }}, dest: spec.arguments.parameters.0.value }}
"#,
        state = state.display()
    );
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    for key in ["incoming/app.log", "incoming/2026-12-07.csv"] {
        s3.put_object()
            .bucket("landing")
            .key(key)
            .body(b"a,b\n".to_vec().into())
            .send()
            .await
            .unwrap();
    }
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(cfg).unwrap();
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Workflow"),
        "workflows",
    );
    let api: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(client, &ns, &ar);
    let keys = || async {
        let l = api
            .list(&kube::api::ListParams::default().labels("flow=seed"))
            .await
            .unwrap();
        let mut k: Vec<String> = l
            .items
            .iter()
            .map(|w| {
                w.data["spec"]["arguments"]["parameters"][0]["value"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect();
        k.sort();
        k
    };
    let mut got = Vec::new();
    for _ in 0..200 {
        got = keys().await;
        if !got.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        got,
        ["incoming/2026-12-07.csv"],
        "one Workflow, for the .csv; log:\n{}",
        d.stderr_tail()
    );
    let wf = api.list(&Default::default()).await.unwrap().items.remove(0);
    let labels = wf.metadata.labels.unwrap();
    assert!(
        labels.contains_key("events.argoproj.io/action-timestamp"),
        "{labels:?}"
    );
    let name = wf.metadata.name.unwrap();
    assert!(
        name.starts_with("s3-processing-") && name.len() == 24,
        "a name derived from the event: {name}"
    );

    // The same notification twice (S3 delivers at least once), then again after a kill -9.
    let record = serde_json::json!({"Records": [{"eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1",
        "eventTime": "2026-12-07T10:00:00.000Z", "eventName": "ObjectCreated:Put",
        "responseElements": {"x-amz-request-id": "REQ123", "x-amz-id-2": "ID2abc"},
        "s3": {"s3SchemaVersion": "1.0", "bucket": {"name": "landing", "arn": "arn:aws:s3:::landing"},
               "object": {"key": "incoming/dup.csv", "size": 4, "sequencer": "00AA"}}}]})
    .to_string();
    let notify = || {
        sqs.send_message()
            .queue_url(&queue_url)
            .message_body(record.clone())
            .send()
    };
    notify().await.unwrap();
    notify().await.unwrap();
    let want = ["incoming/2026-12-07.csv", "incoming/dup.csv"];
    for _ in 0..200 {
        got = keys().await;
        if got.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        keys().await,
        want,
        "the duplicate notification made one Workflow"
    );
    let _ = d.child.kill(); // SIGKILL
    let _ = d.child.wait();
    let mut d = Daemon::start_with(dir.path(), &body);
    d.wait_ready().await;
    notify().await.unwrap();
    // Settled (deleted from the queue) and still one Workflow for the key.
    queue_drained(&sqs, &queue_url).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        keys().await,
        want,
        "after kill -9 the notification again made no second Workflow; log:\n{}",
        d.stderr_tail()
    );
}

/// `sluice validate --kube` asks the API server about each kubernetes component's permissions
/// and says what it could not confirm. The test API server has no authorization API, so each
/// review is reported as not checkable, and the exit code says the check did not pass.
#[test]
fn validate_kube_reports_each_permission_it_could_not_confirm() {
    let kubeconfig = std::env::var("SLUICE_TEST_KUBECONFIG").unwrap_or_else(|_| {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/k8s-envtest/run/kubeconfig");
        assert!(p.exists(), "no test API server: run `scripts/envtest.sh start` (scripts/test.sh does) or set SLUICE_TEST_KUBECONFIG");
        p.display().to_string()
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.yaml");
    std::fs::write(
        &path,
        format!(
            "sources:\n  hooks: {{ kind: webhook, listen: 127.0.0.1:0, path: / }}\nsinks:\n  wf:\n    kind: k8s\n    kubeconfig: {kubeconfig}\n    namespace: argo\n    resource: {{ apiVersion: argoproj.io/v1alpha1, kind: Workflow, metadata: {{ generateName: w- }}, spec: {{ entrypoint: x }} }}\nroutes:\n  - {{ from: [hooks], to: [wf] }}\n"
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["validate", "--kube", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains(
            "sink wf: could not check create argoproj.io/workflows in namespace argo: 404"
        ),
        "{stdout}"
    );
    // Without --kube nothing talks to the cluster.
    let out = Command::new(BIN)
        .args(["validate", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
}

/// The `log` sink's promise, through the binary: one CloudEvent per line, also for a body sent
/// pretty-printed (as Stripe and many senders send theirs), with the same JSON inside.
#[tokio::test]
async fn the_log_sink_writes_a_pretty_printed_body_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path(), "");
    d.wait_ready().await;
    let pretty = b"{\n  \"id\": \"evt_1\",\r\n  \"data\": {\n    \"amount\": 10,\n    \"memo\": \"line\\nbreak\"\n  }\n}\n";
    let (status, body) = request(
        d.hook,
        "POST",
        "/",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", "pretty-1"),
        ],
        pretty,
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "{body:?}");
    // next_line fails unless the whole event is one JSON line.
    let e = d.next_line();
    assert_eq!(e["id"], "pretty-1");
    assert_eq!(
        e["data"],
        serde_json::json!({"id": "evt_1", "data": {"amount": 10, "memo": "line\nbreak"}})
    );
    let (status, rest) = d.stop_collecting();
    assert!(status.success());
    assert!(rest.is_empty(), "nothing else on stdout: {rest:?}");
}

/// Argo Events' own examples through the binary (`sluice run -f`): the webhook EventSource with
/// a Sensor whose http trigger builds a body from the event, and the calendar EventSource with
/// the log Sensor, in one process with no bus.
#[tokio::test]
async fn argo_manifests_run_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/argo/corpus");
    let read = |p: &str| std::fs::read_to_string(corpus.join(p)).unwrap();
    let (target, mut got) = scripted_target(vec![("/hello", vec![200])]).await;
    let port = free_port();
    // The examples as Argo ships them, but for the listen port and the trigger's URL; the
    // http-trigger Sensor's dependency is pointed at the webhook example instead of minio.
    let es = read("event-sources/webhook.yaml").replace("\"12000\"", &format!("\"{port}\""));
    let sensor = read("sensors/http-trigger.yaml")
        .replace("eventSourceName: minio", "eventSourceName: webhook")
        .replace("notification.0.s3.bucket.name", "body.bucket")
        .replace(
            "http://http-server.argo-events.svc:8090/hello",
            &format!("http://127.0.0.1:{target}/hello"),
        );
    let files = [
        ("webhook-es.yaml", es),
        ("http-sensor.yaml", sensor),
        ("calendar-es.yaml", read("event-sources/calendar.yaml")),
        ("log-sensor.yaml", read("sensors/log.yaml")),
    ];
    let mut args = Vec::new();
    for (name, text) in &files {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        args.push("-f".to_owned());
        args.push(p.display().to_string());
    }
    let out = Command::new(BIN)
        .arg("validate")
        .args(&args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ok (") && stdout.contains("2 processors, 2 sinks"),
        "{stdout}"
    );
    // Kubernetes-only fields are noted at their place in the manifest.
    assert!(
        stdout.contains("webhook-es.yaml:7:5: spec.service.ports"),
        "{stdout}"
    );

    let mut d = Daemon::start_with_args(dir.path(), "", &args);
    d.wait_ready().await;
    let hook = SocketAddr::from(([127, 0, 0, 1], port));
    let (status, _) = request(
        hook,
        "POST",
        "/example",
        &[("content-type", "application/json")],
        br#"{"bucket": "uploads"}"#,
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    let (path, body) = tokio::time::timeout(Duration::from_secs(10), got.recv())
        .await
        .expect("the http trigger ran")
        .unwrap();
    assert_eq!(path, "/hello");
    // Argo's payload: `bucket` from the data (Argo's webhook shape: {header, body}), `type` from
    // the context (the EventSource type, as Argo sets it).
    assert_eq!(
        body,
        serde_json::json!({"bucket": "uploads", "type": "webhook"})
    );

    // The calendar ticks every 10 s; the log trigger writes the event Argo would have sent.
    let line = tokio::task::spawn_blocking(move || {
        let l = d
            .lines
            .recv_timeout(Duration::from_secs(25))
            .expect("a calendar event");
        (l, d)
    })
    .await
    .unwrap();
    let (line, d) = line;
    let ev: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(ev["type"], "calendar");
    assert_eq!(ev["source"], "calendar");
    assert_eq!(ev["subject"], "example-with-interval");
    assert!(ev["data"]["eventTime"].is_string(), "{ev}");
    assert!(d.stop().success());
}

/// Argo's `aws-sqs` EventSource and Sensor examples through the binary: a message on the queue
/// (moto) makes the Sensor's k8s trigger create the Workflow on the test API server, with the
/// message body as its parameter and Argo's labels. The examples' secrets come from the
/// environment (`SLUICE_SECRET_<NAME>_<KEY>`).
#[tokio::test]
async fn argo_sqs_example_creates_the_workflow() {
    let kubeconfig = std::env::var("SLUICE_TEST_KUBECONFIG").unwrap_or_else(|_| {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/k8s-envtest/run/kubeconfig");
        assert!(p.exists(), "no test API server: run `scripts/envtest.sh start` (scripts/test.sh does) or set SLUICE_TEST_KUBECONFIG");
        p.display().to_string()
    });
    let ns = format!("argo-sqs-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let moto = sluice_core::testkit::peers::spawn_moto(dir.path());
    let moto_url = format!("http://127.0.0.1:{}", moto.port);
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(&moto_url)
        .load()
        .await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue_url = sqs
        .create_queue()
        .queue_name("test")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    // The examples as Argo ships them, with the endpoint of the test AWS and a namespace.
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/argo/corpus");
    let es = std::fs::read_to_string(corpus.join("event-sources/aws-sqs.yaml"))
        .unwrap()
        .replace(
            "queue: test",
            &format!("queue: test\n      endpoint: {moto_url}"),
        );
    let sensor = std::fs::read_to_string(corpus.join("sensors/aws-sqs.yaml"))
        .unwrap()
        .replace(
            "  name: aws-sqs\n",
            &format!("  name: aws-sqs\n  namespace: {ns}\n"),
        );
    let (es_path, sensor_path) = (dir.path().join("es.yaml"), dir.path().join("sensor.yaml"));
    std::fs::write(&es_path, es).unwrap();
    std::fs::write(&sensor_path, sensor).unwrap();
    // Inherited by the daemon: its secrets and the cluster it acts on.
    std::env::set_var("SLUICE_SECRET_AWS_SECRET_ACCESSKEY", "test");
    std::env::set_var("SLUICE_SECRET_AWS_SECRET_SECRETKEY", "test");
    std::env::set_var("KUBECONFIG", &kubeconfig);
    let args: Vec<String> = [
        "-f",
        &es_path.display().to_string(),
        "-f",
        &sensor_path.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut d = Daemon::start_with_args(dir.path(), "", &args);
    d.wait_ready().await;
    sqs.send_message()
        .queue_url(&queue_url)
        .message_body(r#"{"greeting":"hello from sqs"}"#)
        .send()
        .await
        .unwrap();

    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(cfg).unwrap();
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Workflow"),
        "workflows",
    );
    let api: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(client, &ns, &ar);
    let mut items = Vec::new();
    for _ in 0..200 {
        items = api.list(&Default::default()).await.unwrap().items;
        if !items.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(items.len(), 1, "one Workflow; log:\n{}", d.stderr_tail());
    let wf = &items[0];
    assert!(wf
        .metadata
        .name
        .as_deref()
        .unwrap()
        .starts_with("aws-sqs-workflow-"));
    // Argo's parameter: `dataKey: body` of the sqs event (jsonBody: the message as JSON),
    // inserted as its JSON text.
    let value = wf.data["spec"]["arguments"]["parameters"][0]["value"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        serde_json::from_str::<Value>(&value).unwrap(),
        serde_json::json!({"greeting": "hello from sqs"})
    );
    let labels = wf.metadata.labels.clone().unwrap();
    assert_eq!(labels["events.argoproj.io/sensor"], "aws-sqs");
    assert_eq!(labels["events.argoproj.io/trigger"], "sqs-workflow");
    assert!(d.stop().success());
}

/// Argo's FNV-1a 32-bit hash, as its Sensors name their durable consumers
/// (`group-<fnv32a("<sensor>-<trigger>-<dependency>")>`).
fn fnv32a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(16_777_619)
    })
}

/// Argo's JetStream EventBus, both ways, on a real nats-server: an EventSource run by Sluice
/// publishes what a consumer configured exactly as an Argo Sensor's reads, and a message built
/// as Argo's EventSources build it fires a Sluice Sensor. One directory of manifests (EventBus,
/// EventSource, Sensor), as a team keeps them.
#[tokio::test]
async fn argo_eventbus_both_ways() {
    use async_nats::jetstream::{self, consumer, stream};
    let dir = tempfile::tempdir().unwrap();
    let nats = spawn_nats(dir.path());
    let url = format!("nats://127.0.0.1:{}", nats.port);
    let client = async_nats::connect(&url).await.unwrap();
    let js = jetstream::new(client.clone());
    // The stream as Argo's controller makes it (file storage, `default.*.*`, 5 minutes of dedup).
    let stream = js
        .create_stream(stream::Config {
            name: "default".into(),
            subjects: vec!["default.*.*".into()],
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(300),
            ..Default::default()
        })
        .await
        .unwrap();
    // An Argo Sensor's consumer for webhook/example: durable, explicit acks, new messages only.
    let argo_consumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(format!("group-{}", fnv32a("webhook-http-trigger-test-dep"))),
            filter_subject: "default.webhook.example".into(),
            ack_policy: consumer::AckPolicy::Explicit,
            deliver_policy: consumer::DeliverPolicy::New,
            ..Default::default()
        })
        .await
        .unwrap();

    let (target, mut got) = scripted_target(vec![("/hello", vec![200])]).await;
    let port = free_port();
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/argo/corpus");
    let read = |p: &str| std::fs::read_to_string(corpus.join(p)).unwrap();
    let manifests = dir.path().join("argo");
    std::fs::create_dir_all(&manifests).unwrap();
    let bus = format!(
        "apiVersion: argoproj.io/v1alpha1\nkind: EventBus\nmetadata:\n  name: default\nspec:\n  jetstreamExotic:\n    url: {url}\n"
    );
    std::fs::write(manifests.join("eventbus.yaml"), bus).unwrap();
    std::fs::write(
        manifests.join("webhook.yaml"),
        read("event-sources/webhook.yaml").replace("\"12000\"", &format!("\"{port}\"")),
    )
    .unwrap();
    // The Sensor depends on an EventSource Sluice does not run (it stays in Argo).
    std::fs::write(
        manifests.join("sensor.yaml"),
        read("sensors/http-trigger.yaml")
            .replace("eventSourceName: minio", "eventSourceName: argo-webhook")
            .replace("notification.0.s3.bucket.name", "body.bucket")
            .replace(
                "http://http-server.argo-events.svc:8090/hello",
                &format!("http://127.0.0.1:{target}/hello"),
            ),
    )
    .unwrap();
    let args = vec!["-f".to_owned(), manifests.display().to_string()];
    let mut d = Daemon::start_with_args(dir.path(), "", &args);
    d.wait_ready().await;

    // Sluice → Argo: a request to the webhook EventSource lands on the bus as Argo's would.
    let hook = SocketAddr::from(([127, 0, 0, 1], port));
    let (status, _) = request(
        hook,
        "POST",
        "/example",
        &[("content-type", "application/json")],
        br#"{"message": "to argo"}"#,
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    let mut batch = argo_consumer
        .fetch()
        .max_messages(1)
        .expires(Duration::from_secs(10))
        .messages()
        .await
        .unwrap();
    use futures_util::StreamExt;
    let msg = batch.next().await.expect("a message on the bus").unwrap();
    assert_eq!(msg.subject.as_str(), "default.webhook.example");
    let ce: Value = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(ce["specversion"], "1.0");
    assert_eq!(ce["source"], "webhook");
    assert_eq!(ce["subject"], "example");
    assert_eq!(ce["type"], "webhook");
    assert_eq!(ce["datacontenttype"], "application/json");
    assert_eq!(
        ce["data"]["body"],
        serde_json::json!({"message": "to argo"})
    );
    assert!(ce["data"]["header"].is_object(), "{ce}");
    let msg_id = msg
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Msg-Id"))
        .unwrap();
    assert_eq!(msg_id.as_str(), ce["id"].as_str().unwrap());
    msg.ack().await.unwrap();

    // Argo → Sluice: a message built as Argo's EventSources build it (sdk-go's structured JSON,
    // `Nats-Msg-Id` = the id) fires the Sluice Sensor's http trigger.
    let id = "6a4c0f3f2b0e4e4f9e1d2c3b4a596877";
    let body = format!(
        r#"{{"specversion":"1.0","id":"{id}","source":"argo-webhook","type":"webhook","subject":"example","datacontenttype":"application/json","time":"2026-12-07T10:00:00.123456789Z","data":{{"header":{{"Content-Type":["application/json"]}},"body":{{"bucket":"from-argo"}}}}}}"#
    );
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", id);
    js.publish_with_headers("default.argo-webhook.example", headers, body.into())
        .await
        .unwrap()
        .await
        .unwrap();
    let (path, payload) = tokio::time::timeout(Duration::from_secs(15), got.recv())
        .await
        .unwrap_or_else(|_| panic!("the Sensor did not fire; log:\n{}", d.stderr_tail()))
        .unwrap();
    assert_eq!(path, "/hello");
    assert_eq!(
        payload,
        serde_json::json!({"bucket": "from-argo", "type": "webhook"})
    );
    assert!(d.stop().success());
}

/// `kubectl kustomize … | sluice validate -f -`: a rendered bundle on stdin, with kinds that
/// are not Argo's passed over; and `sluice convert` prints a native config that validates on
/// its own.
#[test]
fn argo_manifests_from_stdin_and_convert() {
    use std::io::Write;
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/argo/corpus");
    let read = |p: &str| std::fs::read_to_string(corpus.join(p)).unwrap();
    let bundle = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: legacy\nspec: {{}}\n---\n{}\n---\n{}",
        read("event-sources/calendar.yaml"),
        read("sensors/log.yaml")
    );
    let mut child = Command::new(BIN)
        .args(["validate", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(bundle.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("note: <stdin>:2:1: Deployment legacy: not an Argo Events EventSource, Sensor or EventBus; passed over"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok (1 sources, 1 processors, 1 sinks"),
        "{stdout}"
    );

    // A refused field fails validation with its position in the stdin document.
    let bad = bundle.replace("interval: 10s", "interval: 10s\n      bogus: 1");
    let mut child = Command::new(BIN)
        .args(["validate", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(bad.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(": spec.calendar.example-with-interval.bogus: not supported by Sluice"),
        "{stderr}"
    );
    assert!(stderr.starts_with("<stdin>:"), "{stderr}");

    // convert → a native config that validates by itself.
    let dir = tempfile::tempdir().unwrap();
    let (es, sensor) = (dir.path().join("es.yaml"), dir.path().join("s.yaml"));
    std::fs::write(&es, read("event-sources/webhook.yaml")).unwrap();
    std::fs::write(
        &sensor,
        read("sensors/http-trigger.yaml")
            .replace("eventSourceName: minio", "eventSourceName: webhook"),
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("convert")
        .arg("-f")
        .arg(&es)
        .arg("-f")
        .arg(&sensor)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let native = String::from_utf8(out.stdout).unwrap();
    assert!(
        native.contains("#   ") && native.contains("spec.service.ports"),
        "{native}"
    );
    let native_path = dir.path().join("native.yaml");
    std::fs::write(&native_path, &native).unwrap();
    let out = Command::new(BIN)
        .arg("validate")
        .arg("-c")
        .arg(&native_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{native}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
