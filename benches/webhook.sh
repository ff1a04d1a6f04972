#!/usr/bin/env bash
# Webhook ingest, side by side in one run: a bare hyper server (the ceiling), sluice webhook →
# null, and sluice webhook → log. The server under test is pinned to core 0 with one worker
# thread; the load generator to the other core(s).
#
#   benches/webhook.sh            # DURATION=10s CONNS=64 by default
#
# Max rate: wrk (64 connections, 1 KiB JSON POSTs). Latency at half of the max rate: oha with a
# fixed request rate (-q). RSS: VmHWM of the server process after the run.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
PORT=18080
ADMIN=17777

command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
command -v oha >/dev/null || cargo install oha --locked

cargo build --release --bin sluice >/dev/null
BARE=$(cargo bench --bench bare_hyper --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="bare_hyper" and m.get("executable"): print(m["executable"])')
SLUICE=target/release/sluice

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

wait_port() { for _ in $(seq 1 100); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

# measure NAME → prints one markdown row
measure() {
  local name=$1 pid=$2
  local out rps p99max half p50h p99h rss
  out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"$DURATION" --latency -s "$work/post.lua" "http://127.0.0.1:$PORT/" 2>&1)
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p99max=$(awk '$1=="99%" {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $4}' <<<"$out"); non2xx=${non2xx:-0}
  half=$(python3 -c "print(int(float('$rps')/2))")
  out=$(taskset -c "$LOAD_CPU" oha -z "$DURATION" -c "$CONNS" -q "$half" --no-tui --output-format json \
        -m POST -H 'content-type: application/json' -D "$work/body.json" "http://127.0.0.1:$PORT/" 2>/dev/null)
  read -r p50h p99h <<<"$(python3 -c '
import json,sys
p=json.loads(sys.stdin.read())["latencyPercentiles"]
print("%.3f %.3f" % (p["p50"]*1000, p["p99"]*1000))' <<<"$out")"
  rss=$(awk '/VmHWM/ {printf "%.1f", $2/1024}' "/proc/$pid/status")
  echo "| $name | $rps | $p99max | $half | $p50h | $p99h | $rss | $non2xx |"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem/ {print $2}') GiB; $(date -u +%Y-%m-%d)"
echo "load: wrk -t1 -c$CONNS -d$DURATION (max rate); oha -c$CONNS -q <half> (latency); server on cpu $SERVER_CPU, load on cpu $LOAD_CPU"
echo
echo "| server | max req/s | p99 at max (wrk) | half rate | p50 ms at half | p99 ms at half | peak RSS MB | non-2xx |"
echo "|---|---|---|---|---|---|---|---|"

taskset -c "$SERVER_CPU" "$BARE" --listen 127.0.0.1:$PORT --threads 1 2>/dev/null & pid=$!
wait_port $PORT; measure "bare hyper (ceiling)" $pid; kill $pid; wait $pid 2>/dev/null || true

for sink in null log; do
  cat > "$work/sluice.yaml" <<EOF
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  hooks: { kind: webhook, listen: 127.0.0.1:$PORT, path: / }
sinks:
  out: { kind: $sink }
routes:
  - { from: [hooks], to: [out] }
EOF
  RUST_LOG=warn taskset -c "$SERVER_CPU" "$SLUICE" run -c "$work/sluice.yaml" --threads 1 >/dev/null 2>"$work/sluice.err" & pid=$!
  wait_port $PORT; measure "sluice webhook → $sink" $pid
  kill -TERM $pid; wait $pid 2>/dev/null || true
done
