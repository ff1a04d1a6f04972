#!/usr/bin/env bash
# CPU time of two Kafka consumers that read the same records at the same time on one core:
# Sluice daemons (Kafka → null) or the raw consume loop. Each reads all COUNT preloaded 1 KiB
# records (librdkafka's mock cluster, PARTITIONS partitions, block preload) with its own group;
# both are pinned to CPU 0 and run together, the mock cluster on CPU 1. What each prints is
# its whole process's task-clock (`perf stat`), start-up and group join included.
#
# Why together: on a host whose speed drifts from minute to minute (docs/benchmarks.md, bus
# sources, "2026-12-05, second session"), runs made one after the other compare the host's
# moments as much as the builds. Two processes that share one core at the same time meet the
# same moments, so the ratio of their CPU times compares the builds. Two copies of one build
# read 0.99–1.01 there. The two also share the core's caches: a change that saves cache misses
# (a prefetch, a smaller table) may gain less here than when it runs alone.
#
#   benches/kafka_pair.sh BIN_A BIN_B     # B's CPU time over A's, per run and the median
#   benches/kafka_pair.sh raw BIN         # `raw`: connectors/kafka/examples/consume_loop;
#                                         # A/B is then issue 13's goal A per CPU-second
#   RUNS=7 COUNT=1000000 PARTITIONS=256 ...
#
# Which of the two starts first alternates from run to run (A first in odd runs). While a daemon
# runs, its /metrics is read every 50 ms; a raw loop is not polled. Needs perf (installed if
# missing).
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
[ $# = 2 ] || { echo "usage: $0 BIN_A|raw BIN_B|raw" >&2; exit 2; }
command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf; }
COUNT=${COUNT:-1000000}
PARTITIONS=${PARTITIONS:-256}
RUNS=${RUNS:-5}
[ "$COUNT" -le $((PARTITIONS * 4000)) ] || { echo "COUNT must be at most PARTITIONS × 4000 (the mock keeps 5 MiB per partition)" >&2; exit 2; }
for b in "$1" "$2"; do
  [ "$b" = raw ] || [ -x "$b" ] || { echo "$b: not an executable (a daemon built with the kafka and console features, or raw)" >&2; exit 2; }
done
cargo build --release -p sluice-kafka --examples >/dev/null
bins=("$1" "$2")
ports=(17786 17787)

work=$(mktemp -d)
# perf does not pass a signal on to the program it counts: its children are stopped first, so
# that no daemon outlives the script on CPU 0 and its port.
trap 'exec 3>&- 2>/dev/null; for p in $(jobs -p); do pkill -TERM -P "$p" 2>/dev/null || true; done; kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
mkfifo "$work/hold"
taskset -c 1 target/release/examples/mock_cluster --brokers 1 --topic bench --partitions "$PARTITIONS" <"$work/hold" >"$work/bootstrap" 2>"$work/mock.err" &
exec 3>"$work/hold"
for _ in $(seq 1 100); do [ -s "$work/bootstrap" ] && break; sleep 0.1; done
BS=$(head -1 "$work/bootstrap")
target/release/examples/produce_loop --brokers "$BS" --topic bench --count "$COUNT" --partitions "$PARTITIONS" --window 10000 --blocks >/dev/null

delivered() {
  curl -s "127.0.0.1:$1/metrics" 2>/dev/null | awk '/^sluice_events_delivered_total\{sink="out"\}/ {print $2}' || true
}

ratios=""
for r in $(seq 1 "$RUNS"); do
  order=(0 1)
  [ $((r % 2)) = 0 ] && order=(1 0)
  pids=()
  for i in "${order[@]}"; do
    group="pair-$r-$i-$(date +%s%N)"
    if [ "${bins[$i]}" = raw ]; then
      perf stat -e task-clock -x, -o "$work/perf.$i" taskset -c 0 target/release/examples/consume_loop \
        --brokers "$BS" --topic bench --group "$group" --count "$COUNT" >"$work/out.$i" 2>&1 &
    else
      cat > "$work/s$i.yaml" <<YAML
admin: { listen: 127.0.0.1:${ports[$i]} }
sources:
  orders: { kind: kafka, brokers: "$BS", topics: [bench], group: "$group", max_in_flight: 10000 }
sinks:
  out: { kind: "null" }
routes:
  - { from: [orders], to: [out] }
YAML
      RUST_LOG=warn perf stat -e task-clock -x, -o "$work/perf.$i" taskset -c 0 "${bins[$i]}" run \
        -c "$work/s$i.yaml" --threads 1 >/dev/null 2>"$work/out.$i" &
    fi
    pids[$i]=$!
  done
  # A daemon is stopped (SIGINT to the process under perf) once its sink counted every record;
  # the raw loop stops by itself.
  left=2
  stopped=(0 0)
  for _ in $(seq 1 6000); do
    left=0
    for i in 0 1; do
      [ "${stopped[$i]}" = 1 ] && continue
      if [ "${bins[$i]}" = raw ]; then
        if kill -0 "${pids[$i]}" 2>/dev/null; then left=$((left + 1)); else stopped[$i]=1; fi
      elif [ "$(delivered "${ports[$i]}")" -ge "$COUNT" ] 2>/dev/null; then
        pkill -INT -P "${pids[$i]}" || true
        stopped[$i]=1
      elif ! kill -0 "${pids[$i]}" 2>/dev/null; then
        echo "run $r: ${bins[$i]} stopped before its sink counted $COUNT events; it said:" >&2
        tail -5 "$work/out.$i" >&2
        exit 1
      else
        left=$((left + 1))
      fi
    done
    [ $left = 0 ] && break
    sleep 0.05
  done
  [ $left = 0 ] || { echo "run $r: not every record was read in 5 minutes" >&2; tail -3 "$work"/out.* >&2; exit 1; }
  # Each side's exit status (perf passes its program's on): a raw loop that gave up before
  # COUNT records, or a daemon that failed its shutdown, makes no figure.
  for i in 0 1; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    [ $rc = 0 ] || { echo "run $r: ${bins[$i]} exited with $rc; it said:" >&2; tail -5 "$work/out.$i" >&2; exit 1; }
  done
  ta=$(awk -F, '/task-clock/ {print $1}' "$work/perf.0")
  tb=$(awk -F, '/task-clock/ {print $1}' "$work/perf.1")
  ratio=$(python3 -c "print(round($tb / $ta, 3))")
  echo "run $r: A ${bins[0]} ${ta} ms, B ${bins[1]} ${tb} ms of CPU; B/A $ratio"
  ratios+="$ratio "
done
python3 -c "import statistics, sys; v = [float(x) for x in sys.argv[1:]]; print(f'B/A: median {statistics.median(v):.3f}, range {min(v):.3f}–{max(v):.3f} over {len(v)} runs')" $ratios
if [ "${bins[0]}" = raw ]; then
  # Goal A per CPU-second: the raw loop's CPU time over Sluice's.
  python3 -c "import statistics, sys; v = [1 / float(x) for x in sys.argv[1:]]; print(f'A/B (the raw loop over Sluice, per CPU-second): median {statistics.median(v):.3f}, range {min(v):.3f}–{max(v):.3f}')" $ratios
fi
