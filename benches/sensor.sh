#!/usr/bin/env bash
# The Sensor on the ingest path, side by side in one run (#16's goal: ≥ 0.8): webhook → null
# against webhook → sensor → null, where the sensor has one dependency with a data filter and
# an expr filter over the body (both pass) and a trigger that forwards each event to the null
# sink with `atLeastOnce: true`, so both answer 200 only after the null sink took the event.
# 1 KiB JSON POSTs, a new Idempotency-Key per request (the same dedup path for both). Sluice
# pinned to CPU 0 with one worker thread, wrk to CPU 1; rounds alternate; the server's and
# wrk's CPU are recorded next to every rate.
#
#   benches/sensor.sh                    # DURATION=8 ROUNDS=5 CONNS=64
#   QUOTA=50 benches/sensor.sh           # each server capped at 50 % of its core (server-bound)
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh

DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-5}
CONNS=${CONNS:-64}
PORT=18091
ADMIN=17791
LOAD_PIN="taskset -c ${LOAD_CPU:-1}"
SERVER_PIN="taskset -c ${SERVER_CPU:-0}"

prepare
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
make_load "$work"
keyed_lua "$work/hook.lua" "$work/body.json" /hook

QUOTA=${QUOTA:-}
quota_setup

start() {
  if [ "$1" = webhook ]; then
    wiring="routes:
  - { from: [hooks], to: [out] }"
  else
    wiring=$(bench_sensor hooks out)
  fi
  cat > "$work/sluice.yaml" <<CFG
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  hooks: { kind: webhook, listen: 127.0.0.1:$PORT, path: /hook }
sinks:
  out: { kind: null }
$wiring
CFG
  start_sluice_on $PORT
  confine "$spid"
}

declare -A RPS SCPU LCPU NON2XX P99
FIRED=""
STEALS=""   # the host's steal % per round
for round in $(seq 1 "$ROUNDS"); do
  st0=$(steal_of); rt0=$(date +%s.%N)
  for s in webhook sensor; do
    start $s
    c0=$(cpu_of "$spid"); t0=$(date +%s.%N)
    out=$(LOAD_RUN="$(date +%s%N)" $LOAD_PIN /usr/bin/time -f 'LOADCPU %U %S %e' wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s "$work/hook.lua" "http://127.0.0.1:$PORT/hook" 2>&1)
    c1=$(cpu_of "$spid"); t1=$(date +%s.%N)
    SCPU[$s]+="$(cpu_pct "$c0" "$c1" "$(python3 -c "print($t1-$t0)")") "
    LCPU[$s]+="$(awk '/^LOADCPU/ {printf "%.0f", 100*($2+$3)/$4}' <<<"$out") "
    RPS[$s]+="$(awk '/Requests\/sec/ {print $2}' <<<"$out") "
    NON2XX[$s]+="$(awk '/Non-2xx/ {n=$5} END {print n+0}' <<<"$out") "
    P99[$s]+="$(awk '$1=="99%" {print $2}' <<<"$out") "
    if [ $s = sensor ]; then
      fired=$(curl -s "127.0.0.1:$ADMIN/metrics" | awk '/^sluice_sensor_triggers_total.*result="fired"/ {print $2}')
      FIRED+="${fired:-0} "
    fi
    kill -TERM "$spid"; wait "$spid" 2>/dev/null || true; sleep 0.3
  done
  STEALS+="$(steal_pct "$st0" "$(steal_of)" "$(python3 -c "import time; print(time.time() - $rt0)")") "
done

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem/ {print $2}') GiB; $(date -u +%Y-%m-%d)"
echo "load: wrk -t1 -c$CONNS -d${DURATION}s, $ROUNDS alternating rounds; Sluice on cpu ${SERVER_CPU:-0} (--threads 1${QUOTA:+, CPU quota $QUOTA % of the core}), wrk on cpu ${LOAD_CPU:-1}; 1 KiB JSON POST, a new Idempotency-Key per request"
echo
echo "| webhook → | req/s per round | median | server CPU % | wrk CPU % | p99 per round | non-2xx |"
echo "|---|---|---|---|---|---|---|"
med() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for s in webhook sensor; do
  echo "| $s → null | ${RPS[$s]% } | $(med "${RPS[$s]}") | ${SCPU[$s]% } | ${LCPU[$s]% } | ${P99[$s]% } | ${NON2XX[$s]% } |"
done
echo
echo "trigger runs counted per sensor round: ${FIRED% }"
echo "the host's steal per round (% of all CPUs): ${STEALS% }"
echo "sensor vs webhook: $(paired "${RPS[webhook]}" "${RPS[sensor]}" "req/s" "$STEALS")"
worst=$(tr ' ' '\n' <<<"${LCPU[webhook]} ${LCPU[sensor]}" | grep -v '^$' | sort -g | tail -1)
if [ "$worst" -gt "${LOAD_CPU_LIMIT:-85}" ]; then
  echo "note: wrk reached ${worst} % CPU in a round: that round was load-generator-bound; use QUOTA=50"
fi
