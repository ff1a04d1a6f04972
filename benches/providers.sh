#!/usr/bin/env bash
# Signature verification on the ingest path, side by side in one run: `kind: webhook` and
# `kind: github` (HMAC-SHA256 over every body, adapter naming), both → null, 1 KiB JSON POSTs
# that each carry a delivery id no request had before (Idempotency-Key for the webhook,
# X-GitHub-Delivery for github), so both go through the same dedup path. Sluice pinned to CPU 0
# with one worker thread, wrk to CPU 1; rounds alternate the two; the server's and wrk's CPU
# are recorded next to every rate.
#
#   benches/providers.sh                    # DURATION=8 ROUNDS=5 CONNS=64
#   QUOTA=50 benches/providers.sh           # each server capped at 50 % of its core (server-bound)
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh

DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-5}
CONNS=${CONNS:-64}
PORT=18090
ADMIN=17790
SECRET=bench-github-secret
LOAD_PIN="taskset -c ${LOAD_CPU:-1}"
SERVER_PIN="taskset -c ${SERVER_CPU:-0}"

prepare
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
make_load "$work"

SIG=$(python3 - "$work/body.json" "$SECRET" <<'PY'
import hashlib, hmac, sys
print("sha256=" + hmac.new(sys.argv[2].encode(), open(sys.argv[1], "rb").read(), hashlib.sha256).hexdigest())
PY
)
# One script for both: the id header differs, the body and the rest do not.
for kind in webhook github; do
  if [ $kind = webhook ]; then idh="Idempotency-Key"; extra=""; else
    idh="X-GitHub-Delivery"
    extra="headers[\"X-GitHub-Event\"] = \"push\"; headers[\"X-Hub-Signature-256\"] = \"$SIG\""
  fi
  keyed_lua "$work/$kind.lua" "$work/body.json" /hook "$idh" "$extra"
done

QUOTA=${QUOTA:-}
quota_setup

start() {
  local src
  if [ "$1" = webhook ]; then
    src="{ kind: webhook, listen: 127.0.0.1:$PORT, path: /hook }"
  else
    src="{ kind: github, listen: 127.0.0.1:$PORT, path: /hook, secrets: [$SECRET] }"
  fi
  cat > "$work/sluice.yaml" <<EOF
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  hooks: $src
sinks:
  out: { kind: null }
routes:
  - { from: [hooks], to: [out] }
EOF
  start_sluice_on $PORT
  confine "$spid"
}

declare -A RPS SCPU LCPU NON2XX P99
STEALS=""   # the host's steal % per round
for round in $(seq 1 "$ROUNDS"); do
  st0=$(steal_of); rt0=$(date +%s.%N)
  for s in webhook github; do
    start $s
    c0=$(cpu_of "$spid"); t0=$(date +%s.%N)
    out=$(LOAD_RUN="$(date +%s%N)" $LOAD_PIN /usr/bin/time -f 'LOADCPU %U %S %e' wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s "$work/$s.lua" "http://127.0.0.1:$PORT/hook" 2>&1)
    c1=$(cpu_of "$spid"); t1=$(date +%s.%N)
    SCPU[$s]+="$(cpu_pct "$c0" "$c1" "$(python3 -c "print($t1-$t0)")") "
    LCPU[$s]+="$(awk '/^LOADCPU/ {printf "%.0f", 100*($2+$3)/$4}' <<<"$out") "
    RPS[$s]+="$(awk '/Requests\/sec/ {print $2}' <<<"$out") "
    NON2XX[$s]+="$(awk '/Non-2xx/ {n=$5} END {print n+0}' <<<"$out") "
    P99[$s]+="$(awk '$1=="99%" {print $2}' <<<"$out") "
    kill -TERM "$spid"; wait "$spid" 2>/dev/null || true; sleep 0.3
  done
  STEALS+="$(steal_pct "$st0" "$(steal_of)" "$(python3 -c "import time; print(time.time() - $rt0)")") "
done

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem/ {print $2}') GiB; $(date -u +%Y-%m-%d)"
echo "load: wrk -t1 -c$CONNS -d${DURATION}s, $ROUNDS alternating rounds; Sluice on cpu ${SERVER_CPU:-0} (--threads 1${QUOTA:+, CPU quota $QUOTA % of the core}), wrk on cpu ${LOAD_CPU:-1}; 1 KiB JSON POST, a new delivery id per request"
echo
echo "| source → null | req/s per round | median | server CPU % | wrk CPU % | p99 per round | non-2xx |"
echo "|---|---|---|---|---|---|---|"
med() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for s in webhook github; do
  echo "| $s | ${RPS[$s]% } | $(med "${RPS[$s]}") | ${SCPU[$s]% } | ${LCPU[$s]% } | ${P99[$s]% } | ${NON2XX[$s]% } |"
done
echo
echo "the host's steal per round (% of all CPUs): ${STEALS% }"
echo "github vs webhook: $(paired "${RPS[webhook]}" "${RPS[github]}" "req/s" "$STEALS")"
worst=$(tr ' ' '\n' <<<"${LCPU[webhook]} ${LCPU[github]}" | grep -v '^$' | sort -g | tail -1)
if [ "$worst" -gt "${LOAD_CPU_LIMIT:-85}" ]; then
  echo "note: wrk reached ${worst} % CPU in a round: that round was load-generator-bound; use QUOTA=50"
fi
