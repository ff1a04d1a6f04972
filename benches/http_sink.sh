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

command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
cargo build --release --bin sluice >/dev/null
BARE=$(cargo bench --bench bare_hyper --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="bare_hyper" and m.get("executable"): print(m["executable"])')
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
"$BARE" --listen 127.0.0.1:$TARGET_PORT --threads 1 2>/dev/null &
wait_port $TARGET_PORT
make_load "$work" 1

run_wrk() { # port → "req/s non2xx p99"
  local out; out=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s "$work/post.lua" "http://127.0.0.1:$1/" 2>&1)
  echo "$(awk '/Requests\/sec/ {print $2}' <<<"$out") $(awk '/Non-2xx/ {n=$4} END {print n+0}' <<<"$out") $(awk '$1=="99%" {print $2}' <<<"$out")"
}

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
  RUST_LOG=warn target/release/sluice run -c "$work/sluice.yaml" --threads 1 >/dev/null 2>"$work/sluice.err" & spid=$!
  wait_port $PORT
}

ceil_all=""; bin_all=""; bat_all=""
for r in $(seq 1 "$ROUNDS"); do
  read -r ceil c_non c_p99 <<<"$(run_wrk $TARGET_PORT)"
  start_sluice binary $CONNS;  read -r bin b_non b_p99 <<<"$(run_wrk $PORT)"; kill -TERM $spid; wait $spid 2>/dev/null || true
  start_sluice batched ${BATCH_CONCURRENCY:-4}; read -r bat t_non t_p99 <<<"$(run_wrk $PORT)"; kill -TERM $spid; wait $spid 2>/dev/null || true
  ceil_all+="$ceil "; bin_all+="$bin "; bat_all+="$bat "
  echo "round $r: target alone $ceil req/s (p99 $c_p99) | webhook → http binary $bin events/s (p99 $b_p99, non-2xx $b_non) | webhook → http batched $bat events/s (p99 $t_p99, non-2xx $t_non)"
done
echo -n "binary:  "; paired "$ceil_all" "$bin_all"
echo -n "batched: "; paired "$ceil_all" "$bat_all"
