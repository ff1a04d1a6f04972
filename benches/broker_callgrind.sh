#!/usr/bin/env bash
# Instructions per event of the broker sources → null under callgrind (issue 14's source goals):
#   R. redis-streams: COUNT preloaded 1 KiB entries of one stream, read with a new group
#   M. mqtt: COUNT 1 KiB QoS 1 messages queued for a persistent session, then read by Sluice
# The whole process is counted, start-up included (a few percent at COUNT=50000). Counts, unlike
# rates, repeat to within a percent or two, so they show what a change to a source or to the
# pipeline saves; benches/brokers.sh measures the rates against the raw client loops.
#
#   SOURCES="R M" COUNT=50000 benches/broker_callgrind.sh BIN...   # prebuilt daemons, in order
#   KEEP=/tmp/bcg ...        # keeps the profiles as /tmp/bcg.R.1, /tmp/bcg.M.1, …
#   LOOPS_BIN=...            # a prebuilt broker_loops (else built here)
#
# A daemon built with the redis and mqtt features. Starts its own redis-server and mosquitto on
# free ports. Needs valgrind (installed if missing); a daemon under callgrind runs about 50 times
# slower: 50 000 events take a minute or two.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
COUNT=${COUNT:-50000}
SOURCES=${SOURCES:-"R M"}
ADMIN=17784
REDIS_PORT=16381
MQTT_PORT=11885
bins=("$@")
if [ ${#bins[@]} = 0 ]; then
  cargo build --profile "$PROFILE" --bin sluice >/dev/null
  bins=("$SLUICE_DEFAULT")
fi
LOOPS=${LOOPS_BIN:-$(bench_exe broker_loops)}

work=$(mktemp -d)
chmod 777 "$work"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
redis-server --port $REDIS_PORT --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nmax_inflight_messages 1000\nmax_queued_messages 10000000\n' $MQTT_PORT > "$work/mosquitto.conf"
/usr/sbin/mosquitto -c "$work/mosquitto.conf" >/dev/null 2>&1 &
wait_port $REDIS_PORT; wait_port $MQTT_PORT
[[ " $SOURCES " == *" R "* ]] && "$LOOPS" redis-preload --url redis://127.0.0.1:$REDIS_PORT --stream bench --count "$COUNT"

# measure LETTER INDEX BIN SOURCE_YAML: one daemon under callgrind until COUNT events reached null.
measure() {
  local letter=$1 i=$2 bin=$3
  cat > "$work/sluice.yaml" <<YAML
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  in: $4
sinks:
  out: { kind: "null" }
routes:
  - { from: [in], to: [out] }
YAML
  local out got per
  out=$(callgrind_drain "$bin" "$letter.$i" "$COUNT") || exit 1
  read -r got per <<<"$out"
  echo "| $letter | $bin | $got | $per |"
}

echo "| source | daemon | events | instructions per event |"
echo "|---|---|---|---|"
i=0
for bin in "${bins[@]}"; do
  i=$((i + 1))
  tag="cg$(date +%s%N)"
  if [[ " $SOURCES " == *" R "* ]]; then
    measure R $i "$bin" "{ kind: redis-streams, url: \"redis://127.0.0.1:$REDIS_PORT\", streams: [bench], group: \"$tag\", max_in_flight: 1000 }"
  fi
  if [[ " $SOURCES " == *" M "* ]]; then
    "$LOOPS" mqtt-session --port $MQTT_PORT --topic bench/t --client-id "$tag"
    "$LOOPS" mqtt-preload --port $MQTT_PORT --topic bench/t --count "$COUNT" --inflight 1000
    measure M $i "$bin" "{ kind: mqtt, url: \"mqtt://127.0.0.1:$MQTT_PORT\", topics: [bench/t], qos: 1, client_id: \"$tag\", max_in_flight: 1000 }"
    "$LOOPS" mqtt-clear --port $MQTT_PORT --client-id "$tag"
  fi
done
