#!/usr/bin/env bash
# A profile-guided (PGO) build of the daemon: an instrumented build, a training run over the
# ingest hot paths, then the optimized build with that profile (docs/decisions.md).
#
#   scripts/pgo.sh                       # → target/pgo/sluice (release profile, all features)
#   PROFILE=dist scripts/pgo.sh          # the container's profile (fat LTO; two slow builds)
#   FEATURES=webhook,console,mimalloc scripts/pgo.sh
#   TRAIN_ONLY=1 SLUICE_BIN=… scripts/pgo.sh   # only the training run of an instrumented binary
#
# The training run drives one daemon over real HTTP with wrk: plain JSON webhooks with and
# without an id header, CloudEvents in binary mode and as batches, a GitHub delivery with its
# signature, the log sink and a Sensor with a data and an expr filter. Each phase must answer
# 2xx to every request, or the script fails (a profile of error paths would misguide the build).
# A build with the Kafka connector (all features, or FEATURES naming kafka) also trains it
# against librdkafka's mock cluster, a process of its own (nothing to install, so this runs in a
# container build too): the source reads KAFKA_COUNT preloaded 1 KiB records (default 100 000,
# at most 128 000: the mock keeps 5 MiB per partition, 64 partitions, and the sink's records go
# to the same topic) into the null sink, and webhook requests go to the Kafka sink (its records,
# CloudEvents in binary mode, are read back by the source). Every record must reach the null
# sink.
# Needs wrk (installed if missing) and llvm-profdata (rustup component llvm-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh

PROFILE=${PROFILE:-release}
FEATURES=${FEATURES:-}
PHASE=${PHASE_SECONDS:-4}
OUT=${OUT:-target/pgo}
PORT=18190
ADMIN=17890
SECRET=pgo-github-secret

command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
sysroot=$(rustc --print sysroot)
PROFDATA=$(ls "$sysroot"/lib/rustlib/*/bin/llvm-profdata 2>/dev/null | head -1 || true)
if [ -z "$PROFDATA" ]; then
  rustup component add llvm-tools >/dev/null
  PROFDATA=$(ls "$sysroot"/lib/rustlib/*/bin/llvm-profdata | head -1)
fi

features=()
[ -n "$FEATURES" ] && features=(--no-default-features --features "$FEATURES")
KAFKA=0
if [ -z "$FEATURES" ] || [[ ",$FEATURES," == *,kafka,* ]]; then KAFKA=1; fi
KAFKA_COUNT=${KAFKA_COUNT:-100000}
[ "$KAFKA_COUNT" -le 128000 ] || { echo "pgo: KAFKA_COUNT must be at most 128000 (the mock keeps 5 MiB per partition)" >&2; exit 2; }
data=${PGO_DATA:-$(realpath -m "$OUT/data")}   # TRAIN_ONLY: where the binary was built to write
mkdir -p "$OUT"

if [ "${TRAIN_ONLY:-0}" != 1 ]; then
  rm -rf "$data"
  echo "pgo: instrumented build ($PROFILE)"
  RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$data" CARGO_TARGET_DIR=target/pgo-gen \
    cargo build --profile "$PROFILE" --locked --bin sluice "${features[@]}"
  # Build scripts ran instrumented too and wrote their own profiles: only the daemon's count.
  rm -rf "$data"
  SLUICE_BIN=target/pgo-gen/$PROFILE/sluice
fi
: "${SLUICE_BIN:?}"

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/batch"
make_load "$work" 1
cp "$work/body.json" "$work/one.json"
make_load "$work/batch" 10
sed 's#wrk.format("POST", "/"#wrk.format("POST", "/plain"#' "$work/batch/post.lua" > "$work/batch.lua"
sig=$(python3 - "$work/one.json" "$SECRET" <<'PY'
import hashlib, hmac, sys
print("sha256=" + hmac.new(sys.argv[2].encode(), open(sys.argv[1], "rb").read(), hashlib.sha256).hexdigest())
PY
)
# lua NAME PATH [SETUP] [PER-REQUEST]: wrk script NAME posting the 1 KiB body to PATH; SETUP
# sets fixed headers once, PER-REQUEST runs before each request (n counts them: fresh ids).
lua() {
  cat > "$work/$1.lua" <<LUA
local f = io.open("$work/one.json", "rb"); local body = f:read("*a"); f:close()
local headers = {["Content-Type"] = "application/json"}
${3:-}
local n = 0
request = function()
  n = n + 1
  ${4:-}
  return wrk.format("POST", "$2", headers, body)
end
LUA
}
lua plain /plain
lua keyed /plain "" 'headers["Idempotency-Key"] = "pgo-" .. n'
lua binary /plain 'headers["ce-specversion"] = "1.0"; headers["ce-source"] = "/pgo"; headers["ce-type"] = "pgo.order"' \
  'headers["ce-id"] = "b-" .. n'
lua log /log
lua github /github 'headers["X-GitHub-Event"] = "push"; headers["X-Hub-Signature-256"] = "'"$sig"'"' \
  'headers["X-GitHub-Delivery"] = "g-" .. n'
lua sensor /sensor "" 'headers["Idempotency-Key"] = "s-" .. n'
lua kafka /kafka "" 'headers["Idempotency-Key"] = "k-" .. n'

kafka_sources="" kafka_sinks="" kafka_routes=""
if [ "$KAFKA" = 1 ]; then
  # The mock cluster and the preload tool are plain builds (their profiles would not count).
  echo "pgo: the Kafka mock cluster and preload tool (plain release build)"
  cargo build --release --locked -p sluice-kafka --examples
  mkfifo "$work/hold"
  target/release/examples/mock_cluster --brokers 1 --topic pgo --partitions 64 <"$work/hold" >"$work/bootstrap" 2>"$work/mock.err" &
  exec 3>"$work/hold"
  for _ in $(seq 1 100); do [ -s "$work/bootstrap" ] && break; sleep 0.1; done
  BS=$(head -1 "$work/bootstrap")
  [ -n "$BS" ] || { echo "pgo: the mock cluster did not start: $(cat "$work/mock.err")" >&2; exit 1; }
  target/release/examples/produce_loop --brokers "$BS" --topic pgo --count "$KAFKA_COUNT" --partitions 64 --window 10000 >/dev/null
  kafka_sources="
  fromkafka: { kind: kafka, brokers: \"$BS\", topics: [pgo], group: pgo, max_in_flight: 10000 }
  kafkahook: { kind: webhook, listen: 127.0.0.1:$PORT, path: /kafka }"
  kafka_sinks="
  tokafka: { kind: kafka, brokers: \"$BS\", topic: pgo }
  drained: { kind: null }"
  kafka_routes="
  - { from: [fromkafka], to: [drained] }
  - { from: [kafkahook], to: [tokafka] }"
fi

cat > "$work/pgo.yaml" <<CFG
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  plain: { kind: webhook, listen: 127.0.0.1:$PORT, path: /plain }
  logged: { kind: webhook, listen: 127.0.0.1:$PORT, path: /log }
  gh: { kind: github, listen: 127.0.0.1:$PORT, path: /github, secrets: ["$SECRET"] }
  sensed: { kind: webhook, listen: 127.0.0.1:$PORT, path: /sensor }$kafka_sources
sinks:
  out: { kind: null }
  shown: { kind: log }$kafka_sinks
routes:
  - { from: [plain, gh], to: [out] }
  - { from: [logged], to: [shown] }$kafka_routes
$(bench_sensor sensed out)
CFG
"$SLUICE_BIN" run -c "$work/pgo.yaml" --threads 1 > /dev/null 2> "$work/sluice.err" &
spid=$!
wait_port $PORT
phase() {
  local name=$1 out non reqs   # each wrk script names its own path
  out=$(wrk -t1 -c32 -d"${PHASE}s" -s "$work/$name.lua" "http://127.0.0.1:$PORT/" 2>&1)
  non=$(awk '/Non-2xx/ {print $5}' <<<"$out")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  echo "pgo: $name $(awk '/Requests\/sec/ {print $2}' <<<"$out") req/s, non-2xx ${non:-0}"
  # A phase that sent nothing, lost connections or got refusals trained the wrong code.
  if [ "${reqs:-0}" = 0 ] || grep -q 'Socket errors' <<<"$out" || { [ -n "$non" ] && [ "$non" != 0 ]; }; then
    echo "pgo: phase $name: ${reqs:-0} requests, non-2xx ${non:-0}, wrk said: $out" >&2
    echo "pgo: stopping; the daemon's stderr ($work/sluice.err) follows" >&2
    cat "$work/sluice.err" >&2
    exit 1
  fi
}
phase plain
phase keyed
phase binary
phase batch
phase log
phase github
phase sensor
if [ "$KAFKA" = 1 ]; then
  phase kafka
  # The source must have read every preloaded record and every record the sink wrote.
  want=$((KAFKA_COUNT + $(curl -s "127.0.0.1:$ADMIN/metrics" | awk '/^sluice_events_delivered_total\{.*sink="tokafka"/ {s+=$2} END {printf "%d", s}')))
  got=0
  for _ in $(seq 1 600); do
    got=$(curl -s "127.0.0.1:$ADMIN/metrics" | awk '/^sluice_events_delivered_total\{.*sink="drained"/ {s+=$2} END {printf "%d", s}')
    [ "$got" -ge "$want" ] && break
    sleep 0.1
  done
  echo "pgo: kafka source → null: $got of $want records"
  if [ "$got" -lt "$want" ]; then
    echo "pgo: the Kafka source read $got of $want records in a minute; the daemon's stderr follows" >&2
    cat "$work/sluice.err" >&2
    exit 1
  fi
fi
kill -TERM "$spid"; wait "$spid" || true
# The mock cluster ends when its standard input does.
if [ "$KAFKA" = 1 ]; then exec 3>&-; fi

"$PROFDATA" merge -o "$OUT/sluice.profdata" "$data"
echo "pgo: profile $OUT/sluice.profdata ($(du -h "$OUT/sluice.profdata" | cut -f1))"
[ "${TRAIN_ONLY:-0}" = 1 ] && exit 0

echo "pgo: optimized build ($PROFILE)"
# -pgso=false: code the training run never reached (the other broker and the cloud connectors) is
# optimized for speed as in a plain build, not for size as LLVM does by default for code a
# profile calls cold.
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$(realpath "$OUT/sluice.profdata") -Cllvm-args=-pgso=false" \
  CARGO_TARGET_DIR=target/pgo-use cargo build --profile "$PROFILE" --locked --bin sluice "${features[@]}"
cp "target/pgo-use/$PROFILE/sluice" "$OUT/sluice"
echo "pgo: $OUT/sluice"
