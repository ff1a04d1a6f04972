#!/usr/bin/env bash
# webhook → Kafka against the ceiling, in one run: librdkafka's mock cluster (real Kafka protocol
# over TCP, one broker, 3 partitions) in its own process; the ceiling is a raw rdkafka produce
# loop with the sink's producer settings (idempotent, acks=all) and the same window; Sluice is
# webhook → `kafka` sink. 1 KiB events; Sluice with one worker thread. BATCH=N > 1 sends each
# request as a CloudEvents batch of N events.
#
#   benches/kafka.sh        # DURATION=8 WINDOW=1024 ROUNDS=3 BATCH=1
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
DURATION=${DURATION:-8}
WINDOW=${WINDOW:-1024}
ROUNDS=${ROUNDS:-3}
BATCH=${BATCH:-1}
CONNS=${CONNS:-64}
PORT=18082

command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
cargo build --release --bin sluice >/dev/null
cargo build --release -p sluice-kafka --examples >/dev/null
work=$(mktemp -d)
trap 'exec 3>&- 2>/dev/null; kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
mkfifo "$work/hold"
target/release/examples/mock_cluster --brokers 1 --topic bench --partitions 3 <"$work/hold" >"$work/bootstrap" 2>"$work/mock.err" &
exec 3>"$work/hold"
for _ in $(seq 1 100); do [ -s "$work/bootstrap" ] && break; sleep 0.1; done
BS=$(head -1 "$work/bootstrap")
echo "mock cluster at $BS"
make_load "$work" "$BATCH"
cat > "$work/sluice.yaml" <<YAML
admin: { enabled: false }
sources:
  hooks: { kind: webhook, listen: 127.0.0.1:$PORT, path: / }
sinks:
  stream:
    kind: kafka
    brokers: "$BS"
    topic: bench
    max_in_flight: $WINDOW
    properties: { linger.ms: ${LINGER_MS:-5} }
routes:
  - { from: [hooks], to: [stream] }
YAML

raw_all=""; sl_all=""
RUST_LOG=warn target/release/sluice run -c "$work/sluice.yaml" --threads 1 >/dev/null 2>"$work/sluice.err" & spid=$!
wait_port $PORT
for r in $(seq 1 "$ROUNDS"); do
  raw=$(target/release/examples/produce_loop --brokers "$BS" --topic bench --seconds "$DURATION" --window "$WINDOW")
  out=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$work/post.lua" "http://127.0.0.1:$PORT/" 2>&1)
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  sl=$(python3 -c "print(round($rps * $BATCH))")
  non2xx=$(awk '/Non-2xx/ {n=$4} END {print n+0}' <<<"$out")
  raw_all+="$raw "; sl_all+="$sl "
  echo "round $r: raw produce $raw msg/s, sluice webhook → Kafka $sl events/s ($rps req/s × $BATCH; non-2xx: $non2xx)"
done
kill -TERM $spid; wait $spid 2>/dev/null || true
paired "$raw_all" "$sl_all"
