#!/usr/bin/env bash
# Instructions per request (user space, callgrind) of the bare hyper ceiling and of Sluice
# webhook → null: the same 1 KiB JSON POSTs as benches/webhook.sh, counted only while wrk runs.
# Counts, unlike rates, repeat to within a percent on a busy VM, so they show what a change to
# the hot path saves.
#
#   SLUICE_BIN=target/release/sluice BARE_BIN=path/to/bare_hyper benches/webhook_callgrind.sh
#   CACHE=1 ...   # also callgrind's cache and branch model: L1 instruction misses, L1 data read
#                 # and write misses, mispredicted conditional and indirect branches per request
#   KEEP=/tmp/cg ...   # keeps the profiles as /tmp/cg.bare and /tmp/cg.sluice (callgrind_annotate)
#   SENSOR=1 ...  # two more rows, each request with a new Idempotency-Key: webhook → null and
#                 # webhook → sensor → null in benches/sensor.sh's configuration (a data filter,
#                 # an expr filter, a forwarding trigger with atLeastOnce); profiles .keyed, .sensor
#   BARE=0 ...    # without the ceiling's row (no bare_hyper build needed)
#
# Without SLUICE_BIN / BARE_BIN both are built (release). Needs valgrind and wrk.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
if [ -z "${SLUICE_BIN:-}" ]; then cargo build --profile "$PROFILE" --bin sluice >/dev/null; SLUICE_BIN=$SLUICE_DEFAULT; fi
[ "${BARE:-1}" = 0 ] || BARE_BIN=${BARE_BIN:-$(bench_exe bare_hyper)}
DURATION=${DURATION:-6s}
PORT=18080
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
make_load "$work"
cat > "$work/null.yaml" <<YAML
admin: { listen: 127.0.0.1:17777 }
sources:
  hooks: { kind: webhook, listen: 127.0.0.1:$PORT, path: / }
sinks:
  out: { kind: null }
routes:
  - { from: [hooks], to: [out] }
YAML
# benches/sensor.sh's sensor, on this script's port and path.
sed '/^routes:/,$d' "$work/null.yaml" > "$work/sensor.yaml"
bench_sensor hooks out >> "$work/sensor.yaml"
keyed_lua "$work/keyed.lua" "$work/body.json" /

# count NAME SLUG CMD... → a table row: NAME, requests, non-2xx, instructions per request
count() {
  local name=$1 slug=$2 lua=${LUA:-post}; shift 2
  local sim=""; [ "${CACHE:-0}" = 1 ] && sim="--cache-sim=yes --branch-sim=yes"
  RUST_LOG=warn valgrind --tool=callgrind $sim --instr-atstart=no --callgrind-out-file="$work/cg.$slug" "$@" >/dev/null 2>"$work/vg.$slug" &
  local pid=$!
  # Under valgrind start-up takes seconds: wait up to a minute for the port.
  for _ in $(seq 1 600); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
  wait_port $PORT
  sleep 1
  callgrind_control -i on "$pid" >/dev/null 2>&1
  local out; out=$(wrk -t1 -c32 -d"$DURATION" -s "$work/$lua.lua" "http://127.0.0.1:$PORT/" 2>&1)
  callgrind_control -i off "$pid" >/dev/null 2>&1
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then cp "$work/cg.$slug" "$KEEP.$slug"; fi
  local reqs ir non
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  non=$(awk '/Non-2xx/ {print $5}' <<<"$out")
  ir=$(callgrind_annotate "$work/cg.$slug" 2>/dev/null | awk '/PROGRAM TOTALS/ && !d {gsub(",","",$1); print $1; d=1}')
  if [ -z "$reqs" ] || [ "$reqs" = 0 ] || [ -z "$ir" ]; then
    echo "$name: no requests or no callgrind total; wrk said:" >&2; echo "$out" >&2
    tail -5 "$work/vg.$slug" >&2; exit 1
  fi
  if [ "${CACHE:-0}" = 1 ]; then
    # PROGRAM TOTALS: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw Bc Bcm Bi Bim
    local t; t=$(callgrind_annotate "$work/cg.$slug" 2>/dev/null | awk '/PROGRAM TOTALS/ && !d {d=1; print}' | sed 's/([^)]*)//g; s/,//g')
    echo "| $name | $reqs | ${non:-0} | $((ir / reqs)) | $(awk -v r="$reqs" '{printf "%d | %d | %d | %d | %d", $4/r, $5/r, $6/r, $11/r, $13/r}' <<<"$t") |"
  else
    echo "| $name | $reqs | ${non:-0} | $((ir / reqs)) |"
  fi
}
if [ "${CACHE:-0}" = 1 ]; then
  echo "| server | requests | non-2xx | instructions per request | L1i misses | L1d read misses | L1d write misses | mispredicted cond. branches | mispredicted indirect branches |"
  echo "|---|---|---|---|---|---|---|---|---|"
else
  echo "| server | requests | non-2xx | instructions per request |"
  echo "|---|---|---|---|"
fi
[ "${BARE:-1}" = 0 ] || count "bare hyper" bare "$BARE_BIN" --listen 127.0.0.1:$PORT --threads 1
count "sluice webhook → null" sluice "$SLUICE_BIN" run -c "$work/null.yaml" --threads 1
if [ "${SENSOR:-0}" = 1 ]; then
  LUA=keyed count "sluice webhook → null, keyed" keyed "$SLUICE_BIN" run -c "$work/null.yaml" --threads 1
  LUA=keyed count "sluice webhook → sensor → null, keyed" sensor "$SLUICE_BIN" run -c "$work/sensor.yaml" --threads 1
fi
