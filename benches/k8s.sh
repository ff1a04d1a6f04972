#!/usr/bin/env bash
# The kubernetes connectors against raw kube-rs loops (benches/k8s_loop.rs, the same kube 5
# client), on the test API server of scripts/envtest.sh (apiextensions-apiserver + etcd), in one
# run:
#
# A. create: wrk → webhook → `k8s` sink creating a generateName Workflow per request (every
#    answer waits for the API server's 201), against the raw loop creating the same Workflow
#    with the same concurrency. Rates by creates/s, with the CPU of each side and of the API
#    server and etcd.
# B. relist: FILL Workflows exist; a `k8s` source → null delivers one ADD per object from its
#    first list, against the raw loop listing them in pages of 500. Events/s, Sluice's RSS.
#
# The API server and etcd are the bound of every create (a create costs them far more CPU than
# either client); the figure that is Sluice's own is its CPU per create next to the raw loop's.
#
#   benches/k8s.sh        # CONCURRENCY=16 COUNT=3000 DURATION=8 FILL=10000 ROUNDS=3 PARTS="A B"
#   PARTS=B FILL=100000 ROUNDS=1 benches/k8s.sh     # the source's memory with 100 000 objects
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
CONCURRENCY=${CONCURRENCY:-16}
COUNT=${COUNT:-3000}
DURATION=${DURATION:-8}
FILL=${FILL:-10000}
ROUNDS=${ROUNDS:-3}
PARTS=${PARTS:-A B}
PORT=18091
ADMIN=17793

prepare
LOOP=$(bench_exe k8s_loop)
work=$(mktemp -d)
export ENVTEST_RUN=$work/envtest
trap 'kill $(jobs -p) 2>/dev/null || true; bash scripts/envtest.sh stop >/dev/null 2>&1; rm -rf "$work"' EXIT
bash scripts/envtest.sh start >/dev/null
KC=$ENVTEST_RUN/kubeconfig
API_PID=$(cat "$ENVTEST_RUN/apiserver.pid"); ETCD_PID=$(cat "$ENVTEST_RUN/etcd.pid")
server_cpu() { python3 -c "print('%.2f' % ($(cpu_of "$API_PID") + $(cpu_of "$ETCD_PID")))"; }
make_load "$work" 1

raw_all=""; sl_all=""
[[ " $PARTS " == *" A "* ]] && echo "A. create (concurrency $CONCURRENCY)"
for r in $( [[ " $PARTS " == *" A "* ]] && seq 1 "$ROUNDS"); do
  # The raw loop: COUNT creates.
  s0=$(server_cpu); t0=$(date +%s.%N)
  raw=$(/usr/bin/time -f 'LOADCPU %U %S %e' -o "$work/raw.time" "$LOOP" create --kubeconfig "$KC" --namespace "raw-$r" --count "$COUNT" --concurrency "$CONCURRENCY")
  secs=$(python3 -c "import time; print(time.time() - $t0)")
  raw_cpu=$(awk '/^LOADCPU/ {print $2+$3}' "$work/raw.time")
  raw_srv=$(python3 -c "print('%.0f' % (100*($(server_cpu)-$s0)/$secs))")
  raw_per=$(python3 -c "print('%.0f' % (1e6*$raw_cpu/($raw*$secs)))")
  # Sluice: webhook → k8s create, wrk at the same concurrency.
  cat > "$work/sluice.yaml" <<YAML
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  hooks: { kind: webhook, listen: 127.0.0.1:$PORT, path: / }
sinks:
  wf:
    kind: k8s
    kubeconfig: $KC
    namespace: sluice-$r
    concurrency: $CONCURRENCY
    resource:
$(python3 -c "
import json,subprocess
wf={'apiVersion':'argoproj.io/v1alpha1','kind':'Workflow','metadata':{'generateName':'bench-','labels':{'bench':'create'},'annotations':{'pad':'x'*300}},
 'spec':{'entrypoint':'process','arguments':{'parameters':[{'name':'key','value':'incoming/2026-12-07/orders-0001.csv'}]},
 'templates':[{'name':'process','container':{'image':'alpine:3.20','command':['sh','-c'],'args':['echo processing {{workflow.parameters.key}} && sleep 1'],'resources':{'requests':{'cpu':'100m','memory':'64Mi'}}}}]}}
print('      '+json.dumps(wf))")
routes:
  - { from: [hooks], to: [wf] }
YAML
  start_sluice_on $PORT
  c0=$(cpu_of $spid); s0=$(server_cpu); t0=$(date +%s.%N)
  read -r sl non p99 _ <<<"$(run_wrk $PORT "$CONCURRENCY")"
  secs=$(python3 -c "import time; print(time.time() - $t0)")
  sl_cpu=$(python3 -c "print($(cpu_of $spid)-$c0)")
  sl_srv=$(python3 -c "print('%.0f' % (100*($(server_cpu)-$s0)/$secs))")
  sl_per=$(python3 -c "print('%.0f' % (1e6*$sl_cpu/($sl*$DURATION)))")
  kill -TERM $spid; wait $spid 2>/dev/null || true
  raw_all+="$raw "; sl_all+="$sl "
  echo "round $r: raw loop $raw creates/s (its CPU ${raw_per} µs per create; API server + etcd ${raw_srv} % of a core) | sluice $sl creates/s (p99 $p99, non-2xx $non; its CPU ${sl_per} µs per create; API server + etcd ${sl_srv} % of a core) | ratio $(python3 -c "print('%.2f' % ($sl/$raw))")"
done
[ -z "$raw_all" ] || paired "$raw_all" "$sl_all" "creates/s" ""

[[ " $PARTS " == *" B "* ]] || exit 0
echo "B. relist of $FILL objects"
"$LOOP" fill --kubeconfig "$KC" --namespace relist --count "$FILL" --concurrency 32 >/dev/null
for r in $(seq 1 "$ROUNDS"); do
  list=$("$LOOP" list --kubeconfig "$KC" --namespace relist --count "$FILL" --concurrency 1)
  cat > "$work/sluice.yaml" <<YAML
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  wfs:
    kind: k8s
    kubeconfig: $KC
    group: argoproj.io
    version: v1alpha1
    resource: workflows
    namespace: relist
    filter: { labels: [{ key: bench, value: relist }] }
sinks:
  out: { kind: "null" }
routes:
  - { from: [wfs], to: [out] }
YAML
  t0=$(date +%s.%N)
  RUST_LOG=warn ${SLUICE_BIN:-$SLUICE_DEFAULT} run -c "$work/sluice.yaml" --threads 1 >/dev/null 2>"$work/sluice.err" & spid=$!
  got=0
  for _ in $(seq 1 3000); do
    got=$(curl -s "127.0.0.1:$ADMIN/metrics" | awk '/^sluice_events_delivered_total\{sink="out"\}/ {printf "%d", $2}' || true)
    [ "${got:-0}" -ge "$FILL" ] && break
    sleep 0.02
  done
  secs=$(python3 -c "import time; print(time.time() - $t0)")
  rss=$(awk '/VmRSS/ {printf "%.0f", $2/1024}' "/proc/$spid/status")
  cpu=$(cpu_of $spid)
  kill -TERM $spid; wait $spid 2>/dev/null || true
  echo "round $r: raw list $list objects/s | sluice k8s source → null ${got} events in $(printf %.2f "$secs") s from start: $(python3 -c "print('%.0f' % ($got/$secs))") events/s (start-up included; its CPU $cpu s), RSS $rss MB"
done
