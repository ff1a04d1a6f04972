#!/usr/bin/env bash
# SQS → null against a raw SDK loop (ReceiveMessage 10 + DeleteMessageBatch, the same number of
# long polls in parallel), in one run (issue 12's goal: ≥ 0.9 of the raw loop and ≤ 0.25 API
# calls per message). Both run against benches/sqs_server.rs, an in-memory SQS on CPU 1 (moto,
# which the tests use, does O(queue length) work per call: it would be the bottleneck of both
# sides; BACKEND=moto runs against moto anyway, with a small COUNT), the system under test on
# CPU 0, one thread. Each round preloads COUNT messages of 1 KiB for
# the raw loop, drains them, preloads again for Sluice, drains them. Sluice's rate is taken from
# its /metrics (polled every 20 ms) between the first delivered event and the last; its API
# calls from sluice_aws_api_calls_total once every message is deleted. Every figure has the CPU
# of the system under test and of moto next to it.
#
# The raw loop runs RAW_CONCURRENCY (default: CONCURRENCY) receive loops, each sending its
# DeleteMessageBatch without waiting for it before the next receive (waiting halved its rate);
# measured at 1, 4 and 32 loops on this machine, 4 was its best. Sluice runs with `concurrency:
# CONCURRENCY` long polls and its default window of 1000 messages.
#
#   benches/sqs.sh        # COUNT=20000 ROUNDS=3 CONCURRENCY=4 RAW_CONCURRENCY=4
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
COUNT=${COUNT:-20000}
ROUNDS=${ROUNDS:-3}
CONCURRENCY=${CONCURRENCY:-4}
RAW_CONCURRENCY=${RAW_CONCURRENCY:-$CONCURRENCY}
ADMIN=17791
MOTO_PORT=15000
pin_setup
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true

cargo build --profile "$PROFILE" --bin sluice >/dev/null
LOOP=$(bench_exe sqs_loop)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
if [ "${BACKEND:-memory}" = moto ]; then
  [ -x target/motoenv/bin/moto_server ] || { python3 -m venv target/motoenv && target/motoenv/bin/pip install -q 'moto[server]==5.2.5'; }
  $BUS_PIN target/motoenv/bin/moto_server -H 127.0.0.1 -p $MOTO_PORT >/dev/null 2>&1 & mpid=$!
else
  $BUS_PIN "$(bench_exe sqs_server)" --port $MOTO_PORT & mpid=$!
fi
wait_port $MOTO_PORT
URL=http://127.0.0.1:$MOTO_PORT

raw_rates=""; sl_rates=""
STEALS=""   # the host's steal % per round (rounds above STEAL_MAX are left out of the ratios)
for r in $(seq 1 "$ROUNDS"); do
  st0=$(steal_of); rt0=$(date +%s.%N)
  "$LOOP" fill --url "$URL" --queue bench --count "$COUNT" 2>/dev/null
  read -r raw raw_calls raw_cpu raw_b <<<"$(run_raw $mpid "$LOOP" drain --url "$URL" --queue bench --count "$COUNT" --concurrency "$RAW_CONCURRENCY" | tr '\n' ' ')"
  "$LOOP" fill --url "$URL" --queue bench --count "$COUNT" 2>/dev/null
  cat > "$work/sluice.yaml" <<YAML
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  jobs: { kind: sqs, queue: bench, endpoint: "$URL", region: us-east-1, concurrency: $CONCURRENCY, wait_time: 1s, max_in_flight: 1000 }
sinks:
  out: { kind: "null" }
routes:
  - { from: [jobs], to: [out] }
YAML
  RUST_LOG=warn $SERVER_PIN ${SLUICE_BIN:-target/release/sluice} run -c "$work/sluice.yaml" --threads 1 >/dev/null 2>"$work/sluice.err" & sp=$!
  out=$(python3 - "$ADMIN" "$COUNT" "$sp" "$mpid" "$(getconf CLK_TCK)" <<'PY'
import sys, time, urllib.request
port, count, sp, bp, tck = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tck
def metrics():
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
    except Exception:
        return None
def value(text, prefix, *labels):
    return sum(float(l.split()[-1]) for l in text.splitlines()
               if l.startswith(prefix) and all(x in l for x in labels))
deadline, first = time.time() + 900, None
while time.time() < deadline:
    text = metrics(); now = time.time()
    if text is None:
        time.sleep(0.02); continue
    v = value(text, 'sluice_events_delivered_total{sink="out"}')
    if v and first is None:
        first = (now, v, cpu(sp), cpu(bp))
    if v >= count:
        t0, v0, s0, b0 = first; secs = now - t0
        rate, scpu, bcpu = (v - v0) / secs, 100 * (cpu(sp) - s0) / secs, 100 * (cpu(bp) - b0) / secs
        # Deletes follow delivery within the 20 ms linger: wait for all of them.
        for _ in range(500):
            text = metrics()
            if value(text, "sluice_source_settled_total{", 'result="ack"', 'source="jobs"') >= count:
                break
            time.sleep(0.02)
        calls = value(text, "sluice_aws_api_calls_total{")
        print(f"{rate:.0f} {calls / count:.3f} {scpu:.0f} {bcpu:.0f}")
        break
    time.sleep(0.02)
else:
    print("0 0 0 0")
PY
)
  kill -TERM $sp; wait $sp 2>/dev/null || true
  read -r sl sl_calls sl_cpu sl_b <<<"$out"
  echo "round $r: raw receive+delete $raw msg/s, $raw_calls calls/msg (loop $raw_cpu %, server $raw_b %) | sluice sqs → null $sl ev/s, $sl_calls calls/msg (sluice $sl_cpu %, server $sl_b %)"
  raw_rates+="$raw "; sl_rates+="$sl "
  st=$(steal_pct "$st0" "$(steal_of)" "$(python3 -c "import time; print(time.time() - $rt0)")")
  STEALS+="$st "
  echo "round $r: the host's steal $st % of all CPUs"
done
paired "$raw_rates" "$sl_rates" "msg/s" "$STEALS"
