#!/usr/bin/env bash
# Webhook ingest, side by side in one run: a bare hyper server (the ceiling), sluice webhook →
# null, and sluice webhook → log. The server under test is pinned to core 0 with one worker
# thread; the load generator to the other core(s).
#
#   benches/webhook.sh            # DURATION=10s CONNS=64 by default
#   SLUICE_BIN=path BARE_BIN=path benches/webhook.sh   # prebuilt binaries
#   PROFILE=dist benches/webhook.sh                    # both built as the container ships it (fat LTO)
#
# Max rate: wrk (64 connections, 1 KiB JSON POSTs). Latency at half of the max rate: oha with a
# fixed request rate (-q). RSS: VmHWM of the server process after the run.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh

DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
PORT=18080
ADMIN=17777

command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
LATENCY=${LATENCY:-1}   # LATENCY=0: max rate only (no oha run, nor its install)
[ "$LATENCY" = 0 ] || command -v oha >/dev/null || cargo install oha --locked

# SLUICE_BIN / BARE_BIN: prebuilt binaries instead of building them here (e.g. a daemon built
# with `--no-default-features --features mimalloc,webhook,console`, whose hot path is the same
# code as the full build's; say which build it was next to the figures).
if [ -n "${SLUICE_BIN:-}" ]; then SLUICE=$SLUICE_BIN; else
  cargo build --profile "$PROFILE" --bin sluice >/dev/null
  SLUICE=$SLUICE_DEFAULT
fi
BARE=${BARE_BIN:-$(bench_exe bare_hyper)}

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# A 1 KiB JSON body.
python3 - "$work/body.json" <<'EOF'
import json, sys
items = [{"sku": "A-1234", "qty": 3}] * 20
empty = json.dumps({"pad": "", "items": items}, separators=(",", ":"))
doc = json.dumps({"pad": "x" * (1024 - len(empty)), "items": items}, separators=(",", ":"))
assert len(doc) == 1024, len(doc)
open(sys.argv[1], "w").write(doc)
EOF
cat > "$work/post.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$work/body.json", "rb"); wrk.body = f:read("*a"); f:close()
EOF


# QUOTA=50 caps each server under test at 50 % of one core (a cgroup v1 or v2 CPU quota, 10 ms
# period), so the server is the bottleneck even when one wrk thread cannot saturate a whole
# core's worth of server: the ratio is then taken between servers on the same half core.
QUOTA=${QUOTA:-}
quota_setup

# start NAME → starts a server on $PORT, sets $pid
start() {
  case $1 in
    bare) taskset -c "$SERVER_CPU" "$BARE" --listen 127.0.0.1:$PORT --threads 1 2>/dev/null & pid=$! ;;
    null|log|null-noht)
      extra=""; sink=$1
      if [ "$1" = null-noht ]; then extra=", header_timeout: 0s"; sink=null; fi
      cat > "$work/sluice-$1.yaml" <<EOF
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  hooks: { kind: webhook, listen: 127.0.0.1:$PORT, path: /$extra }
sinks:
  out: { kind: $sink }
routes:
  - { from: [hooks], to: [out] }
EOF
      RUST_LOG=warn taskset -c "$SERVER_CPU" "$SLUICE" run -c "$work/sluice-$1.yaml" --threads 1 >/dev/null 2>>"$work/sluice.err" & pid=$! ;;
  esac
  confine "$pid"
  wait_port $PORT
}
stop() { kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; sleep 0.3; }

# Max rate, alternating the servers round by round (this VM's speed drifts by ±15%).
# Each run also records the CPU share (of one core) of the server and of wrk: a ratio means
# something only when the server, not the load generator, is the bottleneck.
declare -A RPS P99 NON2XX RSS SCPU LCPU
STEALS=""   # the host's steal % per round (all servers of the round)
for round in $(seq 1 "$ROUNDS"); do
  st0=$(steal_of); rt0=$(date +%s.%N)
  for s in bare null null-noht log; do
    start $s
    c0=$(cpu_of "$pid"); t0=$(date +%s.%N)
    out=$(taskset -c "$LOAD_CPU" /usr/bin/time -f 'LOADCPU %U %S %e' wrk -t1 -c"$CONNS" -d"$DURATION" --latency -s "$work/post.lua" "http://127.0.0.1:$PORT/" 2>&1)
    c1=$(cpu_of "$pid"); t1=$(date +%s.%N)
    SCPU[$s]+="$(python3 -c "print('%.0f' % (100*($c1-$c0)/($t1-$t0)))") "
    LCPU[$s]+="$(awk '/^LOADCPU/ {printf "%.0f", 100*($2+$3)/$4}' <<<"$out") "
    RPS[$s]+="$(awk '/Requests\/sec/ {print $2}' <<<"$out") "
    P99[$s]+="$(awk '$1=="99%" {print $2}' <<<"$out") "
    NON2XX[$s]+="$(awk '/Non-2xx/ {n=$5} END {print n+0}' <<<"$out") "
    RSS[$s]+="$(awk '/VmHWM/ {printf "%.1f", $2/1024}' "/proc/$pid/status") "
    stop
  done
  STEALS+="$(steal_pct "$st0" "$(steal_of)" "$(python3 -c "import time; print(time.time() - $rt0)")") "
done
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sed 's/ms$//' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# Latency at half of each server's own median max rate.
declare -A P50H P99H
for s in bare null null-noht log; do
  [ "$LATENCY" = 0 ] && { P50H[$s]=-; P99H[$s]=-; continue; }
  half=$(python3 -c "print(int($(median "${RPS[$s]}")/2))")
  start $s
  out=$(taskset -c "$LOAD_CPU" oha -z "$DURATION" -c "$CONNS" -q "$half" --no-tui --output-format json \
        -m POST -H 'content-type: application/json' -D "$work/body.json" "http://127.0.0.1:$PORT/" 2>/dev/null)
  read -r P50H[$s] P99H[$s] <<<"$(python3 -c '
import json,sys
p=json.loads(sys.stdin.read())["latencyPercentiles"]
print("%.3f %.3f" % (p["p50"]*1000, p["p99"]*1000))' <<<"$out")"
  RSS[$s]+="$(awk '/VmHWM/ {printf "%.1f", $2/1024}' "/proc/$pid/status") "
  stop
done

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem/ {print $2}') GiB; $(date -u +%Y-%m-%d)"
echo "load: wrk -t1 -c$CONNS -d$DURATION, $ROUNDS alternating rounds (median); oha -c$CONNS -q <half of median> for latency; server on cpu $SERVER_CPU (1 worker thread, current-thread scheduler${QUOTA:+, CPU quota $QUOTA % of the core}), load on cpu $LOAD_CPU; 1 KiB JSON POST"
echo "the host's steal per round (% of all CPUs): ${STEALS% }; rounds above STEAL_MAX=$STEAL_MAX % are left out of the ratios"
echo
bare=$(median "${RPS[bare]}")
LIMIT=${LOAD_CPU_LIMIT:-85}
echo "| server | max req/s (median) | rounds | vs ceiling (median of per-round ratios) | server CPU % | wrk CPU % | p99 at max (wrk) | p50 / p99 ms at half rate | peak RSS MB | non-2xx |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for s in bare null null-noht log; do
  case $s in
    bare) name="bare hyper (ceiling)";;
    null-noht) name="sluice webhook → null, header_timeout: 0s";;
    *) name="sluice webhook → $s";;
  esac
  m=$(median "${RPS[$s]}")
  # Paired: each round's rate over the ceiling's rate in the same round, then the median, so a
  # drift of the VM's speed during the run cancels out.
  pct=$(python3 -c "
a=[float(x) for x in '${RPS[$s]}'.split()]; b=[float(x) for x in '${RPS[bare]}'.split()]
st=[float(x) for x in '$STEALS'.split()]
# Rounds on a throttled host (steal above STEAL_MAX) are left out.
r=sorted(x/y for x,y,t in zip(a,b,st) if t <= $STEAL_MAX); n=len(r)
print('%.0f %% (%d of %d rounds)' % (100*(r[n//2] if n%2 else (r[n//2-1]+r[n//2])/2), n, len(a)) if n else 'n/a (steal above $STEAL_MAX %% in every round)')")
  # Refused when wrk was near its core's limit in any round of this server or of the ceiling:
  # then wrk, not the server, set the rate.
  worst=$(tr ' ' '\n' <<<"${LCPU[$s]} ${LCPU[bare]}" | grep -v '^$' | sort -g | tail -1)
  if [ "$worst" -gt "$LIMIT" ]; then pct="n/a (wrk at ${worst} % CPU: load-generator-bound)"; fi
  echo "| $name | $m | ${RPS[$s]% } | $pct | ${SCPU[$s]% } | ${LCPU[$s]% } | $(median "${P99[$s]}") ms | ${P50H[$s]} / ${P99H[$s]} | $(tr ' ' '\n' <<<"${RSS[$s]}" | sort -g | tail -1) | $(tr ' ' '+' <<<"${NON2XX[$s]}" | sed 's/+$//; s/^+*//' ) |"
done
