//! The harness: the `sluice` binary started as users start it (`Daemon`), an HTTP client, a
//! scripted HTTP target.

use super::*;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// Where the webhook's `listen` goes in a config body given to [`Daemon::start_with`].
pub(crate) const HOOK: &str = "@HOOK@";

pub(crate) struct Daemon {
    pub(crate) child: Child,
    pub(crate) lines: mpsc::Receiver<String>,
    pub(crate) stderr: Arc<Mutex<Vec<String>>>,
    pub(crate) hook: SocketAddr,
    pub(crate) admin: SocketAddr,
    pub(crate) path: PathBuf,
    pub(crate) body: String,
    /// More arguments for `sluice run` (`-f` manifests).
    pub(crate) args: Vec<String>,
}

impl Daemon {
    pub(crate) fn start(config_dir: &Path, extra: &str) -> Daemon {
        let body = format!(
            "{extra}\nsources:\n  hooks: {{ kind: webhook, listen: {HOOK}, path: / }}\nsinks:\n  console: {{ kind: log }}\nroutes:\n  - {{ from: [hooks], to: [console] }}\n"
        );
        Self::start_with(config_dir, &body)
    }

    /// Starts `sluice run` on `body` (with [`HOOK`] replaced by the webhook's address) plus an
    /// admin server. The ports come from `free_port`, which another test process can take before
    /// the daemon binds them: [`Daemon::wait_ready`] starts it again on other ports when it
    /// exited for that reason. (Local for now: a better `free_port` belongs in the core test kit.)
    pub(crate) fn start_with(config_dir: &Path, body: &str) -> Daemon {
        Self::start_with_args(config_dir, body, &[])
    }

    pub(crate) fn start_with_args(config_dir: &Path, body: &str, args: &[String]) -> Daemon {
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
    pub(crate) fn spawn(
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

    pub(crate) fn stderr_tail(&self) -> String {
        let lines = self.stderr.lock().unwrap();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// If the daemon exited: started again on other ports (true) when it exited because
    /// another process had taken one of its ports; a panic with its log otherwise.
    pub(crate) fn restarted_for_a_taken_port(&mut self) -> bool {
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

    pub(crate) async fn wait_ready(&mut self) {
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

    pub(crate) fn next_line(&self) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(10))
            .expect("a line on stdout");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"))
    }

    pub(crate) fn stop(self) -> std::process::ExitStatus {
        self.stop_collecting().0
    }

    /// SIGTERM, then the exit status and every stdout line not read yet (up to the exit).
    pub(crate) fn stop_collecting(mut self) -> (std::process::ExitStatus, Vec<Value>) {
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

pub(crate) async fn request(
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

pub(crate) async fn get(addr: SocketAddr, path: &str) -> Result<(StatusCode, Bytes), String> {
    request(addr, "GET", path, &[], b"").await
}

pub(crate) fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// A local trigger target: answers each path with the statuses given in turn (the last one
/// repeated) and records `(path, body)` of every request.
pub(crate) async fn scripted_target(
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

/// The test Kubernetes API server's kubeconfig (`scripts/envtest.sh start`, which
/// `scripts/test.sh` runs; or `SLUICE_TEST_KUBECONFIG`).
pub(crate) fn test_kubeconfig() -> String {
    std::env::var("SLUICE_TEST_KUBECONFIG").unwrap_or_else(|_| {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/k8s-envtest/run/kubeconfig");
        assert!(p.exists(), "no test API server: run `scripts/envtest.sh start` (scripts/test.sh does) or set SLUICE_TEST_KUBECONFIG");
        p.display().to_string()
    })
}

/// Argo Workflows in `ns` on the API server of `kubeconfig`.
pub(crate) async fn workflows_api(
    kubeconfig: &str,
    ns: &str,
) -> kube::Api<kube::api::DynamicObject> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(cfg).unwrap();
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Workflow"),
        "workflows",
    );
    kube::Api::namespaced_with(client, ns, &ar)
}
