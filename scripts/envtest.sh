#!/usr/bin/env bash
# scripts/envtest.sh build|start|stop — a real Kubernetes API server for the kubernetes
# connector's tests: the upstream apiextensions-apiserver (Kubernetes 1.36 code: CRDs, custom
# resources, generateName, watch, label and field selectors, schema validation, merge / JSON /
# server-side-apply patches) with etcd 3.5. No registry reachable here ships a kube-apiserver,
# kind, k3s or envtest binary, so both are built from Debian sid's source packages with Debian's
# Go (about 3 minutes, once; the two binaries are cached under ~/.cache/sluice/k8s-envtest).
#
#   build   build the binaries and the test PKI if they are missing (idempotent)
#   start   start etcd and the API server on free loopback ports, install the test CRDs
#           (tests/k8s/crds/*.json), write $RUN/kubeconfig; prints KUBECONFIG=…
#   stop    stop both
#
# What it is not: no core/v1 (Pods, ConfigMaps, Namespaces), no controllers, no RBAC (the test
# client is system:masters). Those paths are tested against local mock servers.
set -euo pipefail
cd "$(dirname "$0")/.."
# The built binaries and the test PKI are cached outside the checkout (a fresh clone reuses
# them); the running servers' files are under target/.
ROOT=${ENVTEST_ROOT:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/sluice/k8s-envtest}
RUN=${ENVTEST_RUN:-$PWD/target/k8s-envtest/run}
die() { printf 'scripts/envtest.sh: %s\n' "$*" >&2; exit 1; }

build() {
  if [ -x "$ROOT/bin/apiextensions-apiserver" ] && [ -x "$ROOT/bin/etcd" ] && [ -f "$ROOT/pki/admin.crt" ]; then
    return 0
  fi
  command -v apt-get >/dev/null 2>&1 || die "needs apt-get (Debian) to fetch the source packages"
  command -v openssl >/dev/null 2>&1 || die "needs openssl for the test PKI"
  echo "building the test API server (apiextensions-apiserver + etcd from Debian sid sources; about 3 minutes, once)"
  mkdir -p "$ROOT"/{apt/lists/partial,apt/cache/archives/partial,debs,root,overlay/src/k8s.io,bin}
  # The system's own Debian mirror, suite sid, with private apt state (the system's is untouched).
  local mirror
  mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$mirror" ] || die "no Debian mirror found in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror sid main" > "$ROOT/apt/sources.list"
  local APT=(-o Dir::Etc::SourceList="$ROOT/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
             -o Dir::State::Lists="$ROOT/apt/lists" -o Dir::Cache="$ROOT/apt/cache" -o Debug::NoLocking=1)
  apt-get "${APT[@]}" -qq update
  apt-cache "${APT[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances golang-k8s-apiextensions-apiserver-dev > "$ROOT/deps.txt" ||
    die "apt-cache could not resolve golang-k8s-apiextensions-apiserver-dev in Debian sid"
  { grep -E '^golang-.*-dev$' "$ROOT/deps.txt" || true; } | sort -u > "$ROOT/pkgs.txt"
  [ -s "$ROOT/pkgs.txt" ] || die "Debian sid lists no Go source packages for golang-k8s-apiextensions-apiserver-dev"
  # The Go toolchain: the newest golang-1.NN that sid has.
  local go
  go=$({ apt-cache "${APT[@]}" pkgnames golang-1. 2>/dev/null || true; } | { grep -E '^golang-1\.[0-9]+-go$' || true; } | sort -V | tail -1)
  go=${go%-go}
  [ -n "$go" ] || die "no golang-1.NN-go package in Debian sid"
  # (apt warns that a download as root is unsandboxed: that line alone is dropped.)
  ( cd "$ROOT/debs" && apt-get "${APT[@]}" -qq download $(cat "$ROOT/pkgs.txt") "$go-go" "$go-src" etcd-server \
      2> >(grep -v unsandboxed >&2) ) || die "downloading the source packages from $mirror failed (output above)"
  for d in "$ROOT"/debs/*.deb; do dpkg-deb -x "$d" "$ROOT/root"; done
  local gv=${go#golang-}    # golang-1.NN is unpacked as usr/lib/go-1.NN and usr/share/go-1.NN
  ln -sfn "../../share/go-$gv/src" "$ROOT/root/usr/lib/go-$gv/src"
  cp "$ROOT/root/usr/bin/etcd" "$ROOT/bin/etcd"
  rm -rf "$ROOT/overlay/src/k8s.io/apiextensions-apiserver"
  cp -a "$ROOT/root/usr/share/gocode/src/k8s.io/apiextensions-apiserver" "$ROOT/overlay/src/k8s.io/"
  # Discovery (/apis) on, so clients can resolve the custom kinds.
  sed -i 's/c.GenericConfig.EnableDiscovery = false/c.GenericConfig.EnableDiscovery = true/' \
    "$ROOT/overlay/src/k8s.io/apiextensions-apiserver/pkg/apiserver/apiserver.go"
  local V=k8s.io/component-base/version
  GOROOT="$ROOT/root/usr/lib/go-$gv" GOPATH="$ROOT/overlay:$ROOT/root/usr/share/gocode" \
    GO111MODULE=off GOPROXY=off GOTOOLCHAIN=local GOFLAGS= CGO_ENABLED=0 GOCACHE="$ROOT/gocache" \
    "$ROOT/root/usr/lib/go-$gv/bin/go" build -trimpath \
      -ldflags "-s -w -X $V.gitVersion=v1.36.4 -X $V.gitMajor=1 -X $V.gitMinor=36" \
      -o "$ROOT/bin/apiextensions-apiserver" k8s.io/apiextensions-apiserver
  # An admin client certificate in group system:masters; X.509 v3 (rustls refuses v1).
  local P="$ROOT/pki"
  mkdir -p "$P"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$P/ca.key" -out "$P/ca.crt" -days 3650 -subj "/CN=envtest-ca" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout "$P/admin.key" -out "$P/admin.csr" -subj "/O=system:masters/CN=envtest-admin" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > "$P/client.ext"
  openssl x509 -req -in "$P/admin.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 3650 \
    -extfile "$P/client.ext" -out "$P/admin.crt" 2>/dev/null
  # The unpacked sources are 4 GB; the binaries are all that is kept.
  rm -rf "$ROOT/root" "$ROOT/overlay" "$ROOT/debs" "$ROOT/gocache" "$ROOT/apt/cache"
  echo "built $ROOT/bin/apiextensions-apiserver and $ROOT/bin/etcd"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

curl_api() {
  curl -sf --cacert "$RUN/certs/apiserver.crt" --cert "$ROOT/pki/admin.crt" --key "$ROOT/pki/admin.key" "$@"
}

start() {
  build
  stop
  # Whatever fails from here stops what was started.
  trap 'stop' ERR
  mkdir -p "$RUN"
  rm -rf "$RUN/etcd-data" "$RUN/certs"
  local port eport pport
  port=${ENVTEST_PORT:-$(free_port)}; eport=$(free_port); pport=$(free_port)
  # The server insists on kubeconfigs for delegated authn/authz and the core API: point them nowhere.
  printf 'apiVersion: v1\nkind: Config\nclusters: [{name: none, cluster: {server: "http://127.0.0.1:1"}}]\nusers: [{name: none, user: {}}]\ncontexts: [{name: none, context: {cluster: none, user: none}}]\ncurrent-context: none\n' > "$RUN/none.kubeconfig"
  setsid "$ROOT/bin/etcd" --data-dir "$RUN/etcd-data" --listen-client-urls "http://127.0.0.1:$eport" \
    --advertise-client-urls "http://127.0.0.1:$eport" --listen-peer-urls "http://127.0.0.1:$pport" \
    --initial-advertise-peer-urls "http://127.0.0.1:$pport" --initial-cluster "default=http://127.0.0.1:$pport" \
    > "$RUN/etcd.log" 2>&1 < /dev/null & echo $! > "$RUN/etcd.pid"
  setsid "$ROOT/bin/apiextensions-apiserver" --etcd-servers "http://127.0.0.1:$eport" \
    --bind-address 127.0.0.1 --secure-port "$port" --cert-dir "$RUN/certs" --client-ca-file "$ROOT/pki/ca.crt" \
    --kubeconfig "$RUN/none.kubeconfig" --authentication-kubeconfig "$RUN/none.kubeconfig" --authentication-skip-lookup \
    --authorization-kubeconfig "$RUN/none.kubeconfig" \
    --disable-admission-plugins NamespaceLifecycle,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,MutatingAdmissionPolicy,ValidatingAdmissionPolicy \
    > "$RUN/apiserver.log" 2>&1 < /dev/null & echo $! > "$RUN/apiserver.pid"
  cat > "$RUN/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: envtest, cluster: {server: "https://127.0.0.1:$port", certificate-authority: "$RUN/certs/apiserver.crt"}}]
users: [{name: admin, user: {client-certificate: "$ROOT/pki/admin.crt", client-key: "$ROOT/pki/admin.key"}}]
contexts: [{name: envtest, context: {cluster: envtest, user: admin, namespace: default}}]
current-context: envtest
KC
  # The server's own /readyz stays red (it waits for the absent core API): probe the CRD API.
  local up=0
  for _ in $(seq 1 150); do
    if [ -f "$RUN/certs/apiserver.crt" ] && curl_api "https://127.0.0.1:$port/apis/apiextensions.k8s.io/v1/customresourcedefinitions" >/dev/null 2>&1; then up=1; break; fi
    sleep 0.2
  done
  [ $up = 1 ] || { stop; die "the API server did not come up within 30s; see $RUN/apiserver.log and $RUN/etcd.log"; }
  # The CRDs the tests use, then wait until each is served.
  local crd
  for crd in tests/k8s/crds/*.json; do
    curl_api -X POST -H 'content-type: application/json' --data-binary "@$crd" \
      "https://127.0.0.1:$port/apis/apiextensions.k8s.io/v1/customresourcedefinitions" >/dev/null ||
      { stop; die "could not install $crd; see $RUN/apiserver.log"; }
  done
  for path in apis/argoproj.io/v1alpha1/workflows apis/argoproj.io/v1alpha1/workflowtemplates \
              apis/argoproj.io/v1alpha1/clusterworkflowtemplates apis/argoproj.io/v1alpha1/cronworkflows; do
    up=0
    for _ in $(seq 1 100); do curl_api "https://127.0.0.1:$port/$path" >/dev/null 2>&1 && { up=1; break; }; sleep 0.1; done
    [ $up = 1 ] || { stop; die "/$path is not served after installing the CRDs; see $RUN/apiserver.log"; }
  done
  trap - ERR
  echo "KUBECONFIG=$RUN/kubeconfig"
}

stop() {
  local p
  for p in apiserver etcd; do
    [ -f "$RUN/$p.pid" ] || continue
    kill "$(cat "$RUN/$p.pid")" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$(cat "$RUN/$p.pid")" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$(cat "$RUN/$p.pid")" 2>/dev/null || true
    rm -f "$RUN/$p.pid"
  done
}

case "${1:-}" in
  build) build ;;
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 build|start|stop" >&2; exit 2 ;;
esac
