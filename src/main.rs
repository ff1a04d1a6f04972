//! `sluice`: the event-source gateway daemon.

mod admin;
#[cfg(feature = "mimalloc")]
mod alloc;
mod argo;
mod config;
mod registry;
mod state;
mod topology;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Event-source gateway: many connectors, CloudEvents 1.0, acknowledged delivery with backpressure"
)]
struct Cli {
    /// Log format on stderr (filter with RUST_LOG, default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon (config: -c FILE, else ./sluice.yaml, else the embedded default).
    Run {
        #[arg(short, long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        argo: ArgoArgs,
        /// Worker threads (default: one per core; 1 uses tokio's current-thread scheduler).
        #[arg(long, env = "SLUICE_THREADS")]
        threads: Option<usize>,
        /// Leave transparent huge pages to the system's setting instead of turning them off
        /// for this process (Linux; docs/decisions.md, "Transparent huge pages off").
        #[arg(long, env = "SLUICE_ALLOW_THP")]
        allow_thp: bool,
    },
    /// Check a config and print every error; opens no sockets. Exit 0 when valid, 1 otherwise.
    Validate {
        #[arg(short, long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        argo: ArgoArgs,
        /// Also ask the Kubernetes API server, for every kubernetes component, whether the
        /// identity it would run as has each permission it needs (SelfSubjectAccessReview);
        /// print each missing one. Talks to the cluster; starts nothing.
        #[arg(long)]
        kube: bool,
    },
    /// Print the native config that Argo Events manifests (-f) become, with a comment for
    /// every field that differs from Argo and why.
    Convert {
        #[command(flatten)]
        argo: ArgoArgs,
    },
    /// List the connector kinds compiled into this binary.
    Connectors,
}

#[derive(clap::Args)]
struct ArgoArgs {
    /// Argo Events manifests (EventSource, Sensor): a file, a directory, or `-` for stdin
    /// (`kubectl kustomize … | sluice run -f -`). Repeatable; mixes with -c.
    #[arg(short = 'f', long = "filename")]
    files: Vec<PathBuf>,
    /// Where Argo's secrets are mounted, as `<name>/<key>` files.
    #[arg(long, env = "SLUICE_SECRETS_DIR", default_value = argo::DEFAULT_SECRETS_DIR)]
    secrets_dir: PathBuf,
    /// The NATS URL of Argo's managed JetStream EventBus (an EventBus document with
    /// `jetstream`); `jetstreamExotic` names its own.
    #[arg(long, env = "SLUICE_EVENTBUS_URL")]
    eventbus_url: Option<String>,
}

impl ArgoArgs {
    /// Makes the options visible to the translation and to the secret lookups of the parse.
    fn export(&self) {
        std::env::set_var("SLUICE_SECRETS_DIR", &self.secrets_dir);
        if let Some(u) = &self.eventbus_url {
            std::env::set_var(argo::EVENTBUS_URL_ENV, u);
        }
    }
}

/// ANSI colour only for a person at a terminal: never into a file, a pipe or a log collector,
/// and never when `NO_COLOR` is set to anything non-empty (<https://no-color.org>).
fn colour_logs() -> bool {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour_logs())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn install_metrics() -> Result<PrometheusHandle, String> {
    // The delivery latency histogram is not the exporter's: see `telemetry::LatencyHistogram`.
    PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))
}

/// `validate --kube`: each component's live checks (its `preflight`); prints what each found
/// and answers whether nothing was.
fn preflight(c: &config::Config) -> bool {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice: no runtime for the live checks: {e}");
            return false;
        }
    };
    rt.block_on(async {
        let mut checks = Vec::new();
        for s in &c.sources {
            checks.push((format!("source {}", s.name), s.config.preflight(&s.name)));
        }
        for p in &c.processors {
            checks.push((format!("processor {}", p.name), p.config.preflight(&p.name)));
        }
        for s in &c.sinks {
            checks.push((format!("sink {}", s.name), s.config.preflight(&s.name)));
        }
        let mut clean = true;
        for (what, check) in checks {
            match check.await {
                Ok(problems) => {
                    for p in problems {
                        println!("{what}: {p}");
                        clean = false;
                    }
                }
                Err(e) => {
                    println!("{what}: could not check: {e}");
                    clean = false;
                }
            }
        }
        if clean {
            println!("live checks: ok");
        }
        clean
    })
}

/// The config from `-c` (or its default) plus the Argo manifests of `-f`; the notes about the
/// manifests go to `note`.
fn load(
    path: Option<&std::path::Path>,
    argo_args: &ArgoArgs,
    note: &dyn Fn(&str),
) -> Result<config::Config, config::ConfigErrors> {
    if argo_args.files.is_empty() {
        let (name, text) = config::resolve(path)?;
        return config::parse(&name, &text);
    }
    argo_args.export();
    let t = argo::translate(&argo::read(&argo_args.files)?);
    for n in &t.notes {
        note(&n.to_string());
    }
    if !t.refused.is_empty() {
        return Err(config::ConfigErrors(t.refused));
    }
    // With -f alone, the manifests are the whole config (not the embedded default).
    let (name, text) = match path {
        Some(_) => config::resolve(path)?,
        None => ("<argo manifests>".to_owned(), String::new()),
    };
    config::parse_with(&name, &text, t.generated)
}

/// Installs the SIGTERM and SIGINT handlers now (inside the runtime, before anything starts, so a
/// signal that arrives while the components are being built is not the default "terminate at
/// once") and returns the future that resolves on the first of them.
fn stop_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term =
        signal(SignalKind::terminate()).expect("installing a SIGTERM handler cannot fail on Unix");
    let mut int =
        signal(SignalKind::interrupt()).expect("installing a SIGINT handler cannot fail on Unix");
    async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    }
}

/// Exit code when SIGTERM's drain did not finish within `shutdown_grace`.
const EXIT_DRAIN_INCOMPLETE: u8 = 3;

/// mimalloc: per-thread free lists that stay fast when one task allocates an event and another
/// frees it (glibc's tcache overflows to its locked slow path there). Measured in
/// docs/decisions.md; `--no-default-features` builds keep the system allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: alloc::Mimalloc = alloc::Mimalloc;

/// The stack of a thread a library spawns without a size (std's default is 2 MiB): lapin
/// parses an AMQP message's header tables by recursion on its own I/O thread, about 1.4 KB a
/// level in release builds, and a 128 KiB frame nests up to 26 000 levels (~37 MB). A message
/// like that, which RabbitMQ forwards as is, aborted the process on every redelivery. Address
/// space only: pages are committed as they are touched. Tokio's threads keep 2 MiB.
const LIBRARY_THREAD_STACK: usize = 64 << 20;
const TOKIO_THREAD_STACK: usize = 2 << 20;

/// Turns transparent huge pages off for this process (`prctl(PR_SET_THP_DISABLE)`, as Redis's
/// `disable-thp` does), memory already mapped included (Linux 4.13 and later). mimalloc asks
/// for huge pages on its arena (`MADV_HUGEPAGE`), and librdkafka frees and allocates its fetch
/// buffers (megabytes each) at every fetch: the kernel then zeroed a fresh 2 MiB page again and
/// again, about 10 % of a Kafka → null daemon's samples in a `perf` profile (`clear_page_erms`,
/// from the broker thread's `recvmsg`) and 4–5 % of its CPU time measured in pairs
/// (docs/benchmarks.md, bus sources, "2026-12-05, third session").
fn disable_thp() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_THP_DISABLE takes an integer flag and touches no memory of ours.
        let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if r != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "cannot turn transparent huge pages off; leaving the system's setting");
        }
    }
}

fn main() -> ExitCode {
    // Before any thread starts: std reads it once, at the first spawn.
    if std::env::var_os("RUST_MIN_STACK").is_none() {
        std::env::set_var("RUST_MIN_STACK", LIBRARY_THREAD_STACK.to_string());
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Connectors => {
            for k in registry::kinds() {
                println!("{:<9} {:<10} {}", k.role, k.name, k.description);
            }
            ExitCode::SUCCESS
        }
        Command::Convert { argo: a } => {
            if a.files.is_empty() {
                eprintln!("sluice convert: give the Argo manifests with -f FILE|DIR|-");
                return ExitCode::FAILURE;
            }
            a.export();
            let t = match argo::read(&a.files) {
                Ok(inputs) => argo::translate(&inputs),
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            if !t.refused.is_empty() {
                eprintln!("{}", config::ConfigErrors(t.refused));
                return ExitCode::FAILURE;
            }
            print!("{}", t.to_native_yaml());
            ExitCode::SUCCESS
        }
        Command::Validate {
            config,
            argo: a,
            kube,
        } => match load(config.as_deref(), &a, &|n| println!("note: {n}")) {
            Ok(c) => {
                println!(
                    "{}: ok ({} sources, {} processors, {} sinks, {} routes)",
                    c.file,
                    c.sources.len(),
                    c.processors.len(),
                    c.sinks.len(),
                    c.routes.len()
                );
                if kube && !preflight(&c) {
                    return ExitCode::FAILURE;
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Run {
            config,
            argo: a,
            threads,
            allow_thp,
        } => {
            init_logs(cli.log_format);
            if !allow_thp {
                disable_thp();
            }
            // Two TLS stacks' features can both be compiled in; pick the provider explicitly.
            let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
            let cfg = match load(config.as_deref(), &a, &|n| tracing::info!("argo: {n}")) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            let metrics = match install_metrics() {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("sluice: {e}");
                    return ExitCode::FAILURE;
                }
            };
            // One worker: the current-thread scheduler (no work stealing, no cross-thread queue
            // atomics), as a sidecar on one core wants. More: the multi-thread scheduler.
            let mut rt = match threads {
                Some(1) => tokio::runtime::Builder::new_current_thread(),
                Some(n) => {
                    let mut b = tokio::runtime::Builder::new_multi_thread();
                    b.worker_threads(n.max(1));
                    b
                }
                None => tokio::runtime::Builder::new_multi_thread(),
            };
            let rt = match rt
                .enable_all()
                .thread_stack_size(TOKIO_THREAD_STACK)
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("sluice: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let result = rt.block_on(async { topology::run(cfg, metrics, stop_signal()).await });
            // Never wait for ever on a blocking task (a write to a pipe nobody reads, a stuck
            // file system): what is still running after this bound is abandoned with the
            // process. Its events were already reported failed when the grace was over.
            rt.shutdown_timeout(std::time::Duration::from_secs(2));
            match result {
                Ok(topology::Drain::Complete) => ExitCode::SUCCESS,
                Ok(topology::Drain::Incomplete) => ExitCode::from(EXIT_DRAIN_INCOMPLETE),
                Err(e) => {
                    tracing::error!("{e}");
                    eprintln!("sluice: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
