#!/usr/bin/env bash
# webhook → http sink, in one run with its ceiling. The target is the bare hyper server
# (benches/bare_hyper.rs: reads the body, answers 200). Ceiling: wrk straight at the target.
# Sluice: wrk → webhook → `http` sink → the same target, in binary mode (one request per event)
# and in batched mode (up to 100 events per request, no linger, 4 requests at a time). Every Sluice answer waits for
# the target's 200. 1 KiB JSON events; Sluice and the target one worker thread each; no pinning.
#
#   benches/http_sink.sh        # DURATION=8 ROUNDS=3 CONNS=64
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}
TARGET_PORT=18083
PORT=18084

prepare
BARE=$(bench_exe bare_hyper)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
"$BARE" --listen 127.0.0.1:$TARGET_PORT --threads 1 2>/dev/null &
wait_port $TARGET_PORT
make_load "$work" 1

start_sluice() { # mode
  cat > "$work/sluice.yaml" <<YAML
admin: { enabled: false }
sources:
  hooks: { kind: webhook, listen: 127.0.0.1:$PORT, path: / }
sinks:
  target:
    kind: http
    url: http://127.0.0.1:$TARGET_PORT/events
    mode: $1
    concurrency: $2
    batch: { max_events: 100, linger: ${LINGER:-0ms} }
routes:
  - { from: [hooks], to: [target] }
YAML
  start_sluice_on $PORT
}

ceil_all=""; bin_all=""; bat_all=""
STEALS=""   # the host's steal % per round (rounds above STEAL_MAX are left out of the ratios)
for r in $(seq 1 "$ROUNDS"); do
  st0=$(steal_of); rt0=$(date +%s.%N)
  read -r ceil c_non c_p99 _ <<<"$(run_wrk $TARGET_PORT)"
  start_sluice binary $CONNS;  read -r bin b_non b_p99 _ <<<"$(run_wrk $PORT)"; kill -TERM $spid; wait $spid 2>/dev/null || true
  start_sluice batched ${BATCH_CONCURRENCY:-4}; read -r bat t_non t_p99 _ <<<"$(run_wrk $PORT)"; kill -TERM $spid; wait $spid 2>/dev/null || true
  ceil_all+="$ceil "; bin_all+="$bin "; bat_all+="$bat "
  echo "round $r: target alone $ceil req/s (p99 $c_p99) | webhook → http binary $bin events/s (p99 $b_p99, non-2xx $b_non) | webhook → http batched $bat events/s (p99 $t_p99, non-2xx $t_non)"
  st=$(steal_pct "$st0" "$(steal_of)" "$(python3 -c "import time; print(time.time() - $rt0)")")
  STEALS+="$st "
  echo "round $r: the host's steal $st % of all CPUs"
done
echo -n "binary:  "; paired "$ceil_all" "$bin_all" "events/s" "$STEALS"
echo -n "batched: "; paired "$ceil_all" "$bat_all" "events/s" "$STEALS"
