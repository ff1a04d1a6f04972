//! The command line: `version`, `connectors`, `validate` (every error with its position, the
//! shipped configs, `--kube`), logs, and stopping when stdout is blocked.

use super::*;

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

/// `sluice validate --kube` asks the API server about each kubernetes component's permissions
/// and says what it could not confirm. The test API server has no authorization API, so each
/// review is reported as not checkable, and the exit code says the check did not pass.
#[test]
fn validate_kube_reports_each_permission_it_could_not_confirm() {
    let kubeconfig = test_kubeconfig();
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
