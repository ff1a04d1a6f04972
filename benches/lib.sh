# Shared pieces of the benchmark scripts (sourced).

# PIN=1 (default): the system under test (a raw loop, or Sluice) on CPU 0, the bus and the load
# generator on CPU 1, as in benches/webhook.sh. PIN=0: the scheduler places them all. Sets the
# command prefixes SERVER_PIN, BUS_PIN and LOAD_PIN.
pin_setup() {
  if [ "${PIN:-1}" = 1 ]; then
    SERVER_PIN="taskset -c 0"; BUS_PIN="taskset -c 1"; LOAD_PIN="taskset -c 1"
  else
    SERVER_PIN=""; BUS_PIN=""; LOAD_PIN=""
  fi
}

# Waits until something listens on 127.0.0.1:$1.
wait_port() {
  for _ in $(seq 1 200); do (echo > /dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "nothing listens on port $1" >&2; return 1
}

# Writes the wrk script $1: POST the body in file $2 to path $3 as application/json, each request
# with an id no earlier request had (a prefix from LOAD_RUN, else the clock and a random number,
# then a counter) in header $4 (default Idempotency-Key), so that every request is a new event
# to the dedup window. $5: Lua run once before the first request (fixed headers).
keyed_lua() {
  cat > "$1" <<LUA
local f = io.open("$2", "rb"); local body = f:read("*a"); f:close()
local run = os.getenv("LOAD_RUN") or (tostring(os.time()) .. "-" .. tostring(math.random(1000000)))
local headers = {["Content-Type"] = "application/json"}
${5:-}
local n = 0
request = function()
  n = n + 1
  headers["${4:-Idempotency-Key}"] = run .. "-" .. n
  return wrk.format("POST", "$3", headers, body)
end
LUA
}

# Prints the Sensor of #16's end-to-end benchmark as a top-level `sensors:` block: it reads
# source $1 and forwards to sink $2 (one dependency with a data filter and an expr filter over
# make_load's body, both of which pass, and a trigger with atLeastOnce, so a request is answered
# after the sink took its event). benches/sensor.sh, benches/webhook_callgrind.sh and
# scripts/pgo.sh run this one.
bench_sensor() {
  cat <<YAML
sensors:
  s:
    dependencies:
      - name: order
        source: $1
        filters:
          data: [{ path: items.0.sku, type: string, value: ['^A-'] }]
          exprs: [{ expr: 'qty >= 3 && sku != "B"', fields: [{ name: qty, path: items.0.qty }, { name: sku, path: items.0.sku }] }]
    triggers:
      - { name: fwd, sink: $2, atLeastOnce: true }
YAML
}

# Writes the daemon config $work/sluice.yaml for Kafka → null: the admin server on port $ADMIN,
# a Kafka source reading topic `bench` from brokers $1 with consumer group $2 (window 10 000),
# and the null sink `out` (its delivered count: sluice_events_delivered_total{sink="out"}).
kafka_null_config() {
  # KAFKA_PROPS, e.g. '"fetch.max.bytes": "1048576"': librdkafka properties for the source.
  local props=""
  [ -z "${KAFKA_PROPS:-}" ] || props=", properties: { $KAFKA_PROPS }"
  cat > "$work/sluice.yaml" <<YAML
admin: { listen: 127.0.0.1:$ADMIN }
sources:
  orders: { kind: kafka, brokers: "$1", topics: [bench], group: "$2", max_in_flight: 10000$props }
sinks:
  out: { kind: "null" }
routes:
  - { from: [orders], to: [out] }
YAML
}

# callgrind_drain BIN SLUG COUNT: runs daemon BIN on $work/sluice.yaml under callgrind until its
# null sink `out` (admin server on port $ADMIN) counted COUNT delivered events, stops it and prints
# "EVENTS INSTRUCTIONS_PER_EVENT" (the whole process, start-up included). The profile is
# $work/cg.SLUG (copied to $KEEP.SLUG when KEEP is set). Exits when COUNT is not reached in 20
# minutes. CG_OPTS adds valgrind options (`--cache-sim=yes` counts simulated cache misses too).
callgrind_drain() {
  local bin=$1 slug=$2 count=$3 got=0 pid ir
  # shellcheck disable=SC2086
  RUST_LOG=warn valgrind --tool=callgrind ${CG_OPTS:-} --callgrind-out-file="$work/cg.$slug" "$bin" run -c "$work/sluice.yaml" --threads 1 >/dev/null 2>"$work/vg.$slug" &
  pid=$!
  # Scraped every 2 s: a scrape under callgrind costs instructions of its own.
  for _ in $(seq 1 600); do
    got=$(curl -s "127.0.0.1:$ADMIN/metrics" | awk '/^sluice_events_delivered_total\{sink="out"\}/ {printf "%d", $2}' || true)
    [ "${got:-0}" -ge "$count" ] && break
    sleep 2
  done
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  if [ "${got:-0}" -lt "$count" ]; then
    echo "$bin: delivered ${got:-0} of $count in 20 minutes; valgrind said:" >&2
    tail -5 "$work/vg.$slug" >&2
    exit 1
  fi
  [ -n "${KEEP:-}" ] && cp "$work/cg.$slug" "$KEEP.$slug"
  ir=$(callgrind_annotate "$work/cg.$slug" 2>/dev/null | awk '/PROGRAM TOTALS/ && !d {gsub(",","",$1); print $1; d=1}')
  echo "$got $((ir / got))"
}

# Writes $1/body.json (a 1 KiB JSON order) and $1/post.lua (wrk: POST it as application/json).
# With $2 = N > 1, the body is a CloudEvents batch of N 1 KiB events instead.
make_load() {
  python3 - "$1/body.json" "${2:-1}" <<'PY'
import json, sys
items = [{"sku": "A-1234", "qty": 3}] * 20
empty = json.dumps({"pad": "", "items": items}, separators=(",", ":"))
doc = {"pad": "x" * (1024 - len(empty)), "items": items}
n = int(sys.argv[2])
if n <= 1:
    body = json.dumps(doc, separators=(",", ":"))
else:
    # Unique ids per request do not matter here: each request's events are new to the dedup
    # window only if ids differ, so ids carry a random part filled in by wrk's Lua below.
    body = json.dumps([{"specversion": "1.0", "id": f"ID-{i}", "source": "bench", "type": "bench.order",
                        "datacontenttype": "application/json", "data": doc} for i in range(n)],
                      separators=(",", ":"))
open(sys.argv[1], "w").write(body)
PY
  if [ "${2:-1}" -le 1 ]; then
    cat > "$1/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$1/body.json", "rb"); wrk.body = f:read("*a"); f:close()
LUA
  else
    # A batch: every request gets ids no earlier request had, in this run or an earlier one
    # (Sluice and JetStream drop repeats, which would measure dedup instead of delivery): a
    # prefix unique to this wrk run and thread, then a counter. The body is put together from
    # pieces split once at the ids (cheap for wrk: no pattern matching per request).
    cat > "$1/post.lua" <<LUA
local f = io.open("$1/body.json", "rb"); local template = f:read("*a"); f:close()
local parts, pos = {}, 1
while true do
  local s, e = template:find("ID-", pos, true)
  if not s then break end
  parts[#parts + 1] = template:sub(pos, s - 1)
  pos = e + 1
end
local tail = template:sub(pos)
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
local run = os.getenv("LOAD_RUN") or tostring(os.time())
local headers = {["Content-Type"] = "application/cloudevents-batch+json"}
local n, buf = 0, {}
request = function()
  n = n + 1
  local p = run .. "." .. (tid or 0) .. "." .. n .. "-"
  for i = 1, #parts do buf[2 * i - 1] = parts[i]; buf[2 * i] = p end
  buf[2 * #parts + 1] = tail
  return wrk.format("POST", "/", headers, table.concat(buf))
end
LUA
  fi
}

# Prints the median of the paired ratios of two space-separated lists (ceiling, ours), one
# entry per round. A round with a rate of 0 on either side (the script recorded 0 for a rate it
# could not take) is left out and counted in the note.
paired() {
  python3 - "$1" "$2" "${3:-events/s}" "${4:-}" "$STEAL_MAX" <<'PY'
import sys
ceil = [float(x) for x in sys.argv[1].split()]; ours = [float(x) for x in sys.argv[2].split()]
if len(ceil) != len(ours):
    sys.exit(f"paired: {len(ceil)} ceiling rates but {len(ours)} of ours: a round lost its rate "
             "(its line above shows which); record 0 for a rate that could not be taken")
med = lambda v: sorted(v)[len(v)//2] if len(v) % 2 else sum(sorted(v)[len(v)//2-1:len(v)//2+1]) / 2
# $4: the host's steal % per round (optional); rounds above STEAL_MAX are left out.
steal = [float(x) for x in sys.argv[4].split()] or [0.0] * len(ceil)
keep = [i for i, st in enumerate(steal) if st <= float(sys.argv[5]) and i < len(ceil) and ceil[i] > 0 and ours[i] > 0]
missing = sum(1 for i in range(len(ceil)) if ceil[i] <= 0 or ours[i] <= 0)
note = f" ({len(keep)} of {len(ceil)} rounds: steal ≤ {sys.argv[5]} %)" if sys.argv[4] else ""
if missing:
    note += f" ({missing} round(s) without a rate left out)"
if not keep:
    print(f"no round with a rate on both sides and steal ≤ {sys.argv[5]} % (steal per round: {sys.argv[4] or 'not taken'}; rounds without a rate: {missing}): no ratio")
else:
    c = [ceil[i] for i in keep]; o = [ours[i] for i in keep]
    print(f"median ceiling {med(c):.0f} {sys.argv[3]}, median sluice {med(o):.0f} {sys.argv[3]}, paired ratio {100*med([x/y for x, y in zip(o, c)]):.0f} %{note}")
PY
}

# The cargo profile the daemon and the bench targets are built with: PROFILE=dist measures what
# the container image ships (release + fat LTO, docs/decisions.md); the default is release.
PROFILE=${PROFILE:-release}
SLUICE_DEFAULT=target/$PROFILE/sluice

# Prints the path of the executable of bench target $1 (building it with $PROFILE).
bench_exe() {
  cargo bench --bench "$1" --no-run --profile "$PROFILE" --message-format=json 2>/dev/null | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]==sys.argv[1] and m.get("executable"): print(m["executable"])' "$1"
}

# Installs wrk when missing and builds the daemon ($PROFILE).
# With SLUICE_BIN set, that prebuilt daemon is used and nothing is built.
prepare() {
  command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
  [ -n "${SLUICE_BIN:-}" ] || cargo build --profile "$PROFILE" --bin sluice >/dev/null
}

# One wrk run against 127.0.0.1:$1/ with $work/post.lua (LOAD_PIN: a command prefix);
# prints "req/s non-2xx p99 wrk-cpu%" (wrk's CPU share of one core over the run).
run_wrk() {
  local out; out=$(LOAD_RUN="$(date +%s%N)" ${LOAD_PIN:-} /usr/bin/time -f 'LOADCPU %U %S %e' wrk -t1 -c"${2:-$CONNS}" -d"${DURATION}s" --latency -s "$work/post.lua" "http://127.0.0.1:$1/" 2>&1)
  echo "$(awk '/Requests\/sec/ {print $2}' <<<"$out") $(awk '/Non-2xx/ {n=$5} END {print n+0}' <<<"$out") $(awk '$1=="99%" {print $2}' <<<"$out") $(awk '/^LOADCPU/ {printf "%.0f", 100*($2+$3)/$4}' <<<"$out")"
}

# CPU seconds (user + system) process $1 has used so far.
cpu_of() { awk '{printf "%.2f", ($14 + $15) / '"$(getconf CLK_TCK)"'}' "/proc/$1/stat"; }

# The machine's steal time so far (CPU time the hypervisor gave to others), all CPUs, in ticks.
steal_of() { awk '/^cpu / {print $9}' /proc/stat; }

# Steal as a share (%) of the machine's CPU time, from two steal_of readings $1 $2 over $3
# seconds. Rounds above STEAL_MAX (default 5) ran on a throttled host: scripts that check it
# print them but leave them out of their medians.
steal_pct() { python3 -c "print('%.0f' % (100*($2-$1)/$(getconf CLK_TCK)/$3/$(nproc)))"; }
STEAL_MAX=${STEAL_MAX:-5}

# CPU share (% of one core) from two cpu_of readings $1 $2 over $3 seconds.
cpu_pct() { python3 -c "print('%.0f' % (100*($2-$1)/$3))"; }

# Runs Sluice on $work/sluice.yaml (THREADS worker threads, default 1; SERVER_PIN, e.g.
# "taskset -c 0", as a command prefix) and waits for port $1; sets $spid.
start_sluice_on() {
  RUST_LOG=warn ${SERVER_PIN:-} ${SLUICE_BIN:-$SLUICE_DEFAULT} run -c "$work/sluice.yaml" --threads "${THREADS:-1}" >/dev/null 2>"$work/sluice.err" & spid=$!
  wait_port "$1"
}

# QUOTA=N (percent): a cgroup (v1 or v2) CPU quota of N % of one core, 10 ms period, for the
# server under test, so that it, not the load generator, is the bottleneck. Sets $CG (empty
# without QUOTA); `confine PID` moves a process into it.
quota_setup() {
  CG=""
  [ -n "${QUOTA:-}" ] || return 0
  if [ -d /sys/fs/cgroup/cpu ] && mkdir -p /sys/fs/cgroup/cpu/sluicebench 2>/dev/null; then
    CG=/sys/fs/cgroup/cpu/sluicebench
    echo 10000 > $CG/cpu.cfs_period_us; echo $((QUOTA * 100)) > $CG/cpu.cfs_quota_us
  elif [ -f /sys/fs/cgroup/cgroup.controllers ] && mkdir -p /sys/fs/cgroup/sluicebench 2>/dev/null; then
    CG=/sys/fs/cgroup/sluicebench
    echo "$((QUOTA * 100)) 10000" > $CG/cpu.max
  else
    echo "QUOTA needs a writable cgroup cpu controller" >&2; exit 1
  fi
}
confine() { if [ -n "${CG:-}" ]; then echo "$1" > "$CG/cgroup.procs"; fi; }

# Runs Sluice on $work/sluice.yaml (admin on $ADMIN) until `series` on /metrics reaches $COUNT
# (or $3); prints "rate sluice-cpu% broker-cpu%" (broker: the pid in $2), the rate taken between
# the first sample with a delivered event and the last.
run_sluice() {
  local series=$1 bpid=$2 count=${3:-$COUNT}
  RUST_LOG=warn $SERVER_PIN ${SLUICE_BIN:-$SLUICE_DEFAULT} run -c "$work/sluice.yaml" --threads 1 >/dev/null 2>"$work/sluice.err" & local sp=$!
  local out
  out=$(python3 - "$ADMIN" "$series" "$count" "$sp" "$bpid" "$(getconf CLK_TCK)" <<'PY'
import sys, time, urllib.request
port, series, count, sp, bp, tck = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tck
def value():
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
    except Exception:
        return None
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[1])
    return 0.0
def gone(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True
deadline = time.time() + 600
first = None
while time.time() < deadline:
    if gone(sp):
        sys.exit(f"sluice exited before its sink counted {count} events (see sluice.err)")
    v = value()
    now = time.time()
    if v and first is None:
        first = (now, v, cpu(sp), cpu(bp))
    if v is not None and v >= count:
        t0, v0, s0, b0 = first
        secs = now - t0
        if secs < 1:
            sys.exit(f"sluice read all {count} records before the second sample: raise COUNT")
        print(f"{(v - v0) / secs:.0f} {100 * (cpu(sp) - s0) / secs:.0f} {100 * (cpu(bp) - b0) / secs:.0f}")
        break
    time.sleep(0.02)
else:
    print("0 0 0")
PY
) || true
  kill -TERM $sp; wait $sp 2>/dev/null || true
  [ -n "$out" ] || { echo "run_sluice: no figure; the end of sluice.err:" >&2; tail -5 "$work/sluice.err" >&2; }
  echo "$out"
}

# Runs a raw loop (the command in "$@") on CPU 0; prints "rate loop-cpu% broker-cpu%". A loop
# that prints "rate loop-cpu% broker-cpu%" itself (measured over the span its rate covers, as
# Sluice's are) is taken at its word; for the others both CPUs cover the whole process (start-up
# and group join included), so they read low.
run_raw() {
  local bpid=$1; shift
  local b0 t0; b0=$(cpu_of $bpid); t0=$(date +%s.%N)
  local rate; rate=$($SERVER_PIN /usr/bin/time -f 'LOADCPU %U %S %e' -o "$work/raw.time" "$@")
  local secs; secs=$(python3 -c "import time; print(time.time() - $t0)")
  if [ "$(wc -w <<<"$rate")" = 3 ]; then
    echo "$rate"
  else
    echo "$rate $(awk '/^LOADCPU/ {printf "%.0f", 100*($2+$3)/$4}' "$work/raw.time") $(cpu_pct "$b0" "$(cpu_of $bpid)" "$secs")"
  fi
}
