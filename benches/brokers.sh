#!/usr/bin/env bash
# Broker connectors against raw client loops, in one run (issue 14's goals):
#   sources → null  vs  a raw consume loop with the same acknowledgement discipline   goal ≥ 0.8
#     R. redis-streams: XREADGROUP (COUNT 500) + XACK of what was read
#     A. amqp: basic.consume, prefetch 500, basic.ack after each message
#     M. mqtt: QoS 1 subscription, PUBACK after each message (manual acks)
#   webhook → sink  vs  a raw publish loop that waits for the broker's confirmation  goal ≥ 0.7
#     R. redis-streams: pipelined XADD MAXLEN ~ (500 per round trip)
#     A. amqp: publisher confirms, 1000 in flight, persistent, mandatory
#     M. mqtt: QoS 1, PUBACK = done, 100 in flight
# 1 KiB messages. Sluice (one worker thread) and the raw loops on CPU 0; redis-server, mosquitto
# and wrk on CPU 1 (PIN=1). RabbitMQ is the machine's own broker (not pinned; its beam.smp CPU is
# shown). Sluice's source rates come from its /metrics between the first delivered event and the
# last; the raw loops time themselves; webhook → sink rates are wrk's (every request one event,
# `ack: delivered`: answered after the sink's confirmation; non-2xx must be 0).
#
# Counts per broker are sized so that each side runs for seconds (Sluice's rate needs two
# samples of its /metrics): RCOUNT Redis entries, ACOUNT RabbitMQ messages, MCOUNT MQTT messages.
# (The raw MQTT loop is bounded by a 120 s timeout. It stalled once with a 300 000-message backlog
# before its acknowledgements were queued with try_ack; 400 000 did not stall in 11 rounds on
# 2026-12-04. At 200 000 Sluice read the backlog before its rate's second sample, at about
# 170 000 events/s.)
#
#   benches/brokers.sh        # RCOUNT=400000 ACOUNT=100000 MCOUNT=400000 ROUNDS=3 DURATION=8 CONNS=256 AMQP_CONNS=1000
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
RCOUNT=${RCOUNT:-400000}
ACOUNT=${ACOUNT:-100000}
MCOUNT=${MCOUNT:-400000}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8}
CONNS=${CONNS:-256}
# The AMQP sink's confirms take tens of milliseconds under load: as many requests in flight as the
# raw loop keeps publishes in flight (1000), or the load, not the sink, sets the rate.
AMQP_CONNS=${AMQP_CONNS:-1000}
# PARTS: which halves run; BATCH=N > 1 sends each webhook request as a CloudEvents batch of N
# events (the sink rounds then count N events per request).
PARTS=${PARTS:-"sources sinks"}
# SOURCES: which source benchmarks run (R Redis Streams, A RabbitMQ, M mosquitto).
SOURCES=${SOURCES:-"R A M"}
# SINKS: which sink benchmarks run (the same letters).
SINKS=${SINKS:-"R A M"}
# RAW_CE=1: the R and A sink rounds also run their raw loop with --ce, each message written as
# the sink writes the benchmark's events (the binary-mode CloudEvents fields or headers), and
# print Sluice's ratio against that too (keys redis-sink-ce, amqp-sink-ce).
BATCH=${BATCH:-1}
REDIS_PORT=16380
MQTT_PORT=11884
AMQP=${AMQP:-amqp://guest:guest@127.0.0.1:5672/%2f}
ADMIN=17782
PORT=18093
pin_setup
prepare
LOOPS=${LOOPS_BIN:-$(bench_exe broker_loops)}   # LOOPS_BIN: a prebuilt broker_loops

work=$(mktemp -d)
chmod 777 "$work"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
$BUS_PIN redis-server --port $REDIS_PORT --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 & rpid=$!
printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nmax_inflight_messages 1000\nmax_queued_messages 10000000\n' $MQTT_PORT > "$work/mosquitto.conf"
$BUS_PIN /usr/sbin/mosquitto -c "$work/mosquitto.conf" >/dev/null 2>&1 & mpid=$!
wait_port $REDIS_PORT; wait_port $MQTT_PORT
apid=$(pgrep -f beam.smp | head -1) || { echo "RabbitMQ is not running on this machine (scripts/test.sh starts it)" >&2; exit 1; }
make_load "$work" "$BATCH"
declare -A RAW SL
DROPPED=""
# keep KEY RAW SLUICE STEAL0 T0: records a round pair for the medians unless the host's steal
# since STEAL0 (read at T0) was above STEAL_MAX; prints the steal either way.
keep() {
  local st; st=$(steal_pct "$4" "$(steal_of)" "$(python3 -c "import time; print(time.time() - $5)")")
  if [ "$st" -gt "$STEAL_MAX" ]; then
    DROPPED+="$1 "; echo "    (steal $st % > $STEAL_MAX %: this round is left out of the medians)"
  else
    RAW[$1]+="$2 "; SL[$1]+="$3 "; echo "    (steal $st %)"
  fi
}

ratio() { python3 -c "import sys; r, s = (float(x or 0) for x in sys.argv[1:]); print(f'{s / r:.2f}' if r > 0 else 'n/a')" "$1" "$2"; }

[[ " $PARTS " == *" sources "* && " $SOURCES " == *" R "* ]] && {
echo "preloading $RCOUNT messages of 1 KiB into Redis ..."
"$LOOPS" redis-preload --url redis://127.0.0.1:$REDIS_PORT --stream bench --count "$RCOUNT"
}

for r in $(seq 1 "$ROUNDS"); do
  [[ " $PARTS " == *" sources "* ]] || break
  tag="$(date +%s)$r"
  # R source
  if [[ " $SOURCES " == *" R "* ]]; then
  st0=$(steal_of); t0=$(date +%s.%N)
  read -r raw raw_cpu raw_b <<<"$(run_raw $rpid "$LOOPS" redis-consume --url redis://127.0.0.1:$REDIS_PORT --stream bench --group "raw$tag" --count "$RCOUNT" --window 1000)"
  cat > "$work/sluice.yaml" <<YAML
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  in: { kind: redis-streams, url: "redis://127.0.0.1:$REDIS_PORT", streams: [bench], group: "sl$tag", max_in_flight: 1000 }
sinks:
  out: { kind: "null" }
routes:
  - { from: [in], to: [out] }
YAML
  read -r sl sl_cpu sl_b <<<"$(run_sluice 'sluice_events_delivered_total{sink="out"}' $rpid "$RCOUNT")"
  echo "round $r R source: raw XREADGROUP+XACK $raw msg/s (loop $raw_cpu %, redis $raw_b %) | sluice redis-streams → null $sl ev/s (sluice $sl_cpu %, redis $sl_b %) = $(ratio "$raw" "$sl")"
  keep rs "$raw" "$sl" "$st0" "$t0"
  fi

  # A source: two queues preloaded, one for each side.
  if [[ " $SOURCES " == *" A "* ]]; then
  st0=$(steal_of); t0=$(date +%s.%N)
  for q in "raw$tag" "sl$tag"; do "$LOOPS" amqp-preload --url "$AMQP" --queue "$q" --count "$ACOUNT"; done
  read -r raw raw_cpu raw_b <<<"$(run_raw $apid "$LOOPS" amqp-consume --url "$AMQP" --queue "raw$tag" --count "$ACOUNT" --prefetch 500)"
  cat > "$work/sluice.yaml" <<YAML
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  in: { kind: amqp, url: "$AMQP", queue: "sl$tag", prefetch: 500 }
sinks:
  out: { kind: "null" }
routes:
  - { from: [in], to: [out] }
YAML
  read -r sl sl_cpu sl_b <<<"$(run_sluice 'sluice_events_delivered_total{sink="out"}' $apid "$ACOUNT")"
  for q in "raw$tag" "sl$tag"; do "$LOOPS" amqp-delete --url "$AMQP" --queue "$q"; done
  echo "round $r A source: raw consume+ack $raw msg/s (loop $raw_cpu %, rabbitmq $raw_b %) | sluice amqp → null $sl ev/s (sluice $sl_cpu %, rabbitmq $sl_b %) = $(ratio "$raw" "$sl")"
  keep am "$raw" "$sl" "$st0" "$t0"
  fi

  # M source: two persistent sessions subscribed, then the backlog published to both.
  if [[ " $SOURCES " == *" M "* ]]; then
  st0=$(steal_of); t0=$(date +%s.%N)
  for c in "raw$tag" "sl$tag"; do "$LOOPS" mqtt-session --port $MQTT_PORT --topic bench/t --client-id "$c"; done
  "$LOOPS" mqtt-preload --port $MQTT_PORT --topic bench/t --count "$MCOUNT" --inflight 1000
  read -r raw raw_cpu raw_b <<<"$(run_raw $mpid timeout 120 "$LOOPS" mqtt-consume --port $MQTT_PORT --topic bench/t --client-id "raw$tag" --count "$MCOUNT")"
  cat > "$work/sluice.yaml" <<YAML
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  in: { kind: mqtt, url: "mqtt://127.0.0.1:$MQTT_PORT", topics: [bench/t], qos: 1, client_id: "sl$tag", max_in_flight: 1000 }
sinks:
  out: { kind: "null" }
routes:
  - { from: [in], to: [out] }
YAML
  read -r sl sl_cpu sl_b <<<"$(run_sluice 'sluice_events_delivered_total{sink="out"}' $mpid "$MCOUNT")"
  echo "round $r M source: raw QoS1 consume $raw msg/s (loop $raw_cpu %, mosquitto $raw_b %) | sluice mqtt → null $sl ev/s (sluice $sl_cpu %, mosquitto $sl_b %) = $(ratio "$raw" "$sl")"
  for c in "raw$tag" "sl$tag"; do "$LOOPS" mqtt-clear --port $MQTT_PORT --client-id "$c"; done
  keep mq "$raw" "$sl" "$st0" "$t0"
  fi
done

# Sinks: webhook → sink against the raw publish loops.
# RESET (a command, optional) runs before each half of a sink round, so that both halves find
# the broker in the same state (the Redis stream empty: a full one trims on every XADD).
# Runs a raw loop (the command line in "$@") where Sluice runs; prints "rate loop-CPU% broker-CPU%".
raw_run() {
  local b0 t0 rate; b0=$(cpu_of "$BPID"); t0=$(date +%s.%N)
  rate=$($SERVER_PIN /usr/bin/time -f 'LOADCPU %U %S %e' -o "$work/raw.time" "$@")
  echo "$rate $(awk '/^LOADCPU/ {printf "%.0f", 100*($2+$3)/$4}' "$work/raw.time") $(cpu_pct "$b0" "$(cpu_of "$BPID")" "$(python3 -c "import time; print(time.time() - $t0)")")"
}
sink_round() { # name raw-command... ; the sink config is in $work/sink.yaml
  local key=$1; shift
  ${RESET:-true} >/dev/null
  local t0 st0; t0=$(date +%s.%N); st0=$(steal_of)
  local raw raw_cpu raw_b; read -r raw raw_cpu raw_b <<<"$(raw_run "$@")"
  # RAW_CE=1: the raw loop also runs with --ce (messages shaped as the sink writes them).
  local rawce="" rawce_cpu rawce_b
  if [ "${RAW_CE:-0}" = 1 ] && [ -n "${CE_OK:-}" ]; then
    ${RESET:-true} >/dev/null
    read -r rawce rawce_cpu rawce_b <<<"$(raw_run "$@" --ce)"
  fi
  { printf 'admin: { enabled: false }\nsources:\n  hooks: { kind: webhook, listen: 127.0.0.1:%s, path: /, ack: delivered }\nsinks:\n' $PORT; cat "$work/sink.yaml"; printf 'routes:\n  - { from: [hooks], to: [out] }\n'; } > "$work/sluice.yaml"
  ${RESET:-true} >/dev/null
  start_sluice_on $PORT
  local s0 b1 t1; s0=$(cpu_of $spid); b1=$(cpu_of "$BPID"); t1=$(date +%s.%N)
  read -r rps non2xx _ wrk_cpu <<<"$(run_wrk $PORT "${SINK_CONNS:-$CONNS}")"
  local secs; secs=$(python3 -c "import time; print(time.time() - $t1)")
  rps=$(python3 -c "print(round($rps * $BATCH))")
  local sl_cpu sl_b; sl_cpu=$(cpu_pct "$s0" "$(cpu_of $spid)" "$secs"); sl_b=$(cpu_pct "$b1" "$(cpu_of "$BPID")" "$secs")
  kill -TERM $spid; wait $spid 2>/dev/null || true
  echo "  $key: raw $raw msg/s (loop $raw_cpu %, broker $raw_b %) | sluice webhook → sink ${rps%.*} ev/s (batch $BATCH) (sluice $sl_cpu %, broker $sl_b %, wrk $wrk_cpu %, non-2xx $non2xx) = $(ratio "$raw" "$rps")"
  [ -z "$rawce" ] || echo "  $key: raw with the sink's CloudEvents fields (--ce) $rawce msg/s (loop $rawce_cpu %, broker $rawce_b %) = $(ratio "$rawce" "$rps")"
  keep "$key" "$raw" "${rps%.*}" "$st0" "$t0"
  [ -z "$rawce" ] || keep "$key-ce" "$rawce" "${rps%.*}" "$st0" "$t0"
}
# Each half of an A sink round starts from an empty queue (messages left by the half before
# would make RabbitMQ's queue longer for the next).
amqp_reset() {
  "$LOOPS" amqp-delete --url "$AMQP" --queue bench-out
  "$LOOPS" amqp-preload --url "$AMQP" --queue bench-out --count 0
}
for r in $(seq 1 "$ROUNDS"); do
  [[ " $PARTS " == *" sinks "* ]] || break
  echo "round $r sinks:"
  BPID=$rpid
  if [[ " $SINKS " == *" R "* ]]; then
  printf '  out: { kind: redis-streams, url: "redis://127.0.0.1:%s", stream: out, maxlen: "~1000000" }\n' $REDIS_PORT > "$work/sink.yaml"
  CE_OK=1 RESET="redis-cli -p $REDIS_PORT DEL out" sink_round "redis-sink" "$LOOPS" redis-publish --url redis://127.0.0.1:$REDIS_PORT --stream out --seconds "$DURATION" --batch 500
  fi
  if [[ " $SINKS " == *" A "* ]]; then
  BPID=$apid
  "$LOOPS" amqp-preload --url "$AMQP" --queue bench-out --count 0
  printf '  out: { kind: amqp, url: "%s", exchange: "", routing_key: bench-out, max_in_flight: 1000 }\n' "$AMQP" > "$work/sink.yaml"
  CE_OK=1 RESET=amqp_reset SINK_CONNS=$AMQP_CONNS sink_round "amqp-sink" "$LOOPS" amqp-publish --url "$AMQP" --exchange "" --key bench-out --seconds "$DURATION" --window 1000
  "$LOOPS" amqp-delete --url "$AMQP" --queue bench-out
  fi
  if [[ " $SINKS " == *" M "* ]]; then
  BPID=$mpid
  printf '  out: { kind: mqtt, url: "mqtt://127.0.0.1:%s", topic: bench/out, qos: 1, max_in_flight: 100 }\n' $MQTT_PORT > "$work/sink.yaml"
  sink_round "mqtt-sink" "$LOOPS" mqtt-publish --port $MQTT_PORT --topic bench/out --seconds "$DURATION" --inflight 100
  fi
done

echo
echo "medians of the paired ratios (Sluice / raw), rounds with steal ≤ $STEAL_MAX % (left out: ${DROPPED:-none}):"
for k in rs am mq redis-sink redis-sink-ce amqp-sink amqp-sink-ce mqtt-sink; do
  [ -n "${RAW[$k]:-}" ] || continue
  python3 - "$k" "${RAW[$k]}" "${SL[$k]}" <<'PY'
import statistics, sys
k, raw, sl = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
print(f"  {k:11s} {statistics.median(s / r for r, s in zip(raw, sl) if r > 0):.2f}   (raw median {statistics.median(raw):.0f}/s, sluice median {statistics.median(sl):.0f}/s)")
PY
done
