#!/usr/bin/env bash
# Instructions per event of Kafka → null under callgrind: each daemon reads COUNT preloaded
# 1 KiB records (librdkafka's mock cluster, 64 partitions) with a new consumer group into the
# null sink. The whole process is counted, start-up and librdkafka's threads included (start-up
# is a few percent at COUNT=100000). Counts, unlike rates, repeat to within a percent or two,
# so they show what a change to the Kafka source or the pipeline saves; benches/consume.sh
# measures the rate.
#
#   benches/kafka_callgrind.sh                          # the daemon built here (release)
#   COUNT=100000 benches/kafka_callgrind.sh BIN...      # prebuilt daemons, in this order
#   KEEP=/tmp/kcg ...                                   # keeps the profiles as /tmp/kcg.1, .2, …
#   RAW=1 ...                                           # and the raw consume loop, same records
#   BLOCKS=1 ...                                        # preload each partition in one block
#                                                       # (full batches, as benches/consume.sh)
#   CG_OPTS=--cache-sim=yes ...                         # also simulated cache misses (read them
#                                                       # with callgrind_annotate --show=…)
#
# RAW=1 adds a row for connectors/kafka/examples/consume_loop (the ceiling of benches/consume.sh)
# counted the same way, whole process with librdkafka's threads, so the two counts form the
# instruction ratio that issue #13's Kafka → null goal is measured by where the raw loop is not
# bound by its CPU (it waits on the mock cluster: docs/benchmarks.md, bus sources).
#
# Needs valgrind (installed if missing). A daemon under callgrind runs about 50 times slower:
# 100 000 records take a minute or two.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
COUNT=${COUNT:-100000}
PARTITIONS=64
[ "$COUNT" -le $((PARTITIONS * 4000)) ] || { echo "COUNT must be at most $((PARTITIONS * 4000)) (the mock keeps 5 MiB per partition)" >&2; exit 2; }
ADMIN=17783
bins=("$@")
if [ ${#bins[@]} = 0 ]; then
  cargo build --profile "$PROFILE" --bin sluice >/dev/null
  bins=("$SLUICE_DEFAULT")
fi
cargo build --release -p sluice-kafka --examples >/dev/null

work=$(mktemp -d)
trap 'exec 3>&- 2>/dev/null; kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
mkfifo "$work/hold"
target/release/examples/mock_cluster --brokers 1 --topic bench --partitions $PARTITIONS <"$work/hold" >"$work/bootstrap" 2>"$work/mock.err" &
exec 3>"$work/hold"
for _ in $(seq 1 100); do [ -s "$work/bootstrap" ] && break; sleep 0.1; done
BS=$(head -1 "$work/bootstrap")
target/release/examples/produce_loop --brokers "$BS" --topic bench --count "$COUNT" --partitions $PARTITIONS --window 10000 $([ "${BLOCKS:-0}" = 1 ] && echo --blocks) >/dev/null

echo "| daemon | events | instructions per event |"
echo "|---|---|---|"
i=0
for bin in "${bins[@]}"; do
  i=$((i + 1))
  kafka_null_config "$BS" "cg-$i-$(date +%s%N)"
  out=$(callgrind_drain "$bin" "$i" "$COUNT") || exit 1
  read -r got per <<<"$out"
  echo "| $bin | $got | $per |"
done
if [ "${RAW:-0}" = 1 ]; then
  # shellcheck disable=SC2086
  valgrind --tool=callgrind ${CG_OPTS:-} --callgrind-out-file="$work/cg.raw" target/release/examples/consume_loop \
    --brokers "$BS" --topic bench --group "cg-raw-$(date +%s%N)" --count "$COUNT" >/dev/null 2>"$work/vg.raw" \
    || { echo "the raw loop failed; valgrind said:" >&2; tail -5 "$work/vg.raw" >&2; exit 1; }
  [ -n "${KEEP:-}" ] && cp "$work/cg.raw" "$KEEP.raw"
  ir=$(callgrind_annotate "$work/cg.raw" 2>/dev/null | awk '/PROGRAM TOTALS/ && !d {gsub(",","",$1); print $1; d=1}')
  echo "| raw consume loop | $COUNT | $((ir / COUNT)) |"
fi
