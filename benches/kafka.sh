#!/usr/bin/env bash
# webhook → Kafka against the ceiling, in one run: librdkafka's mock cluster (real Kafka protocol
# over TCP, one broker, 3 partitions) in its own process; the ceiling is a raw rdkafka produce
# loop with the sink's producer settings (idempotent, acks=all) and the same window; Sluice is
# webhook → `kafka` sink. 1 KiB events; Sluice with one worker thread. BATCH=N > 1 sends each
# request as a CloudEvents batch of N events.
#
#   benches/kafka.sh        # DURATION=8 WINDOW=1024 ROUNDS=3 BATCH=1 CONNS=1024 LINGER_MS=5
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
DURATION=${DURATION:-8}
WINDOW=${WINDOW:-1024}
ROUNDS=${ROUNDS:-3}
BATCH=${BATCH:-1}
CONNS=${CONNS:-1024}
PORT=18082
pin_setup   # PIN=1 (default): Sluice or the raw loop on CPU 0, the mock cluster and wrk on CPU 1

prepare
cargo build --release -p sluice-kafka --examples >/dev/null
work=$(mktemp -d)
trap 'exec 3>&- 2>/dev/null; kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
mkfifo "$work/hold"
$BUS_PIN target/release/examples/mock_cluster --brokers 1 --topic bench --partitions 3 <"$work/hold" >"$work/bootstrap" 2>"$work/mock.err" &
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
start_sluice_on $PORT
STEALS=""   # the host's steal % per round (rounds above STEAL_MAX are left out of the ratio)
for r in $(seq 1 "$ROUNDS"); do
  st0=$(steal_of); rt0=$(date +%s.%N)
  raw=$($SERVER_PIN target/release/examples/produce_loop --brokers "$BS" --topic bench --seconds "$DURATION" --window "$WINDOW")
  read -r rps non2xx _ <<<"$(run_wrk $PORT)"
  sl=$(python3 -c "print(round($rps * $BATCH))")
  raw_all+="$raw "; sl_all+="$sl "
  st=$(steal_pct "$st0" "$(steal_of)" "$(python3 -c "import time; print(time.time() - $rt0)")")
  STEALS+="$st "
  echo "round $r: raw produce $raw msg/s, sluice webhook → Kafka $sl events/s ($rps req/s × $BATCH; non-2xx: $non2xx); the host's steal $st %"
done
kill -TERM $spid; wait $spid 2>/dev/null || true
paired "$raw_all" "$sl_all" "events/s" "$STEALS"
