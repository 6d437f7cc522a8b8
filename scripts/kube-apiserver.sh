#!/usr/bin/env bash
# A real Kubernetes control plane (kube-apiserver and etcd, nothing else) for tests and trials, on
# loopback, in a temp dir.
#
#   scripts/kube-apiserver.sh build    build the binaries from the Go module proxy, once: etcd,
#                                      kube-apiserver, and for scripts/kubelet.sh kubelet,
#                                      kube-controller-manager and kube-scheduler; they are cached under
#                                      $KUBE_CACHE (default ~/.cache/gpusanity/kube-VERSION) and a later
#                                      build returns at once
#   scripts/kube-apiserver.sh start    build if needed, start etcd and the API server; prints
#                                      KUBE_URL=https://127.0.0.1:PORT, KUBE_TOKEN_FILE=FILE (an admin
#                                      bearer token), KUBE_CA=FILE and KUBECONFIG=FILE
#   scripts/kube-apiserver.sh halt     stop the API server, keeping etcd (an outage, for tests)
#   scripts/kube-apiserver.sh resume   start the halted API server again on the same port
#   scripts/kube-apiserver.sh stop     stop both and remove their folder
#
# No registry ships kube-apiserver as a binary, and `go install` cannot build it (its module
# replaces its k8s.io/* modules by ./staging folders): a small wrapper module requires
# k8s.io/kubernetes and points each staging module at its published version of the same minor.
# The first build (all five binaries, niced) takes about 10 minutes on 2 cores and 3 GB of Go
# build cache; 370 MB of binaries.
#
# `start` starts no scheduler, kubelet or controller manager (scripts/kubelet.sh starts them with
# a node): pods stay Pending, and cordoning adds no taint by itself. TaintNodesByCondition is
# off, so a new Node carries exactly the taints a test gives it. Authentication: static bearer
# tokens (tokens.csv); authorization: RBAC. Besides the admin token, `start` writes
# KUBE_LIMITED_TOKEN_FILE, a token of user "gpusanity-isolation" with no rights until a test binds
# a role to it. KUBE_APISERVER_ARGS: more flags for the API server (scripts/kubelet.sh passes
# some), kept for `resume`. State file: $KUBE_STATE (default $TMPDIR/gpusanity-kube.state).
set -euo pipefail
VERSION=1.35.4
ETCD_VERSION=3.6.5
CACHE=${KUBE_CACHE:-$HOME/.cache/gpusanity/kube-$VERSION}
STATE=${KUBE_STATE:-${TMPDIR:-/tmp}/gpusanity-kube.state}
# shellcheck source=scripts/ports.sh
. "$(dirname "$0")/ports.sh"

# The Kubernetes binaries the wrapper module builds (etcd besides).
KUBE_BINS="kube-apiserver kubelet kube-controller-manager kube-scheduler"

build() {
  local b missing=
  for b in $KUBE_BINS etcd; do [ -x "$CACHE/$b" ] || missing=1; done
  [ -n "$missing" ] || return 0
  command -v go >/dev/null 2>&1 || { echo "go is missing: the API server is built from the Go module proxy" >&2; exit 1; }
  local src
  src=$(mktemp -d "${TMPDIR:-/tmp}/gpusanity-kube-build.XXXXXX")
  mkdir -p "$CACHE" "$src/etcd"
  export GOTOOLCHAIN=local GOFLAGS=-mod=mod
  (
    cd "$src"
    local gomod
    gomod=$(go mod download -json "k8s.io/kubernetes@v$VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')
    [ -f "$gomod" ] || { echo "could not fetch k8s.io/kubernetes v$VERSION" >&2; exit 1; }
    {
      echo "module local/kapi"
      echo
      echo "go 1.25.0"
      echo
      echo "require k8s.io/kubernetes v$VERSION"
      echo
      # Each `k8s.io/x => ./staging/src/k8s.io/x` of Kubernetes' own go.mod, at its published version.
      sed -n 's#^\s*\(k8s\.io/[A-Za-z0-9._/-]*\) => \./staging/.*#\1#p' "$gomod" | sort -u \
        | while read -r m; do echo "replace $m => $m v0.${VERSION#1.}"; done
    } >go.mod
    {
      printf '//go:build tools\n\npackage tools\n\nimport (\n'
      for b in $KUBE_BINS; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$b"; done
      printf ')\n'
    } >tools.go
    printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' >etcd/main.go
    echo "== go mod tidy (kube-apiserver v$VERSION)" >&2
    go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >&2
    go mod tidy >&2
    local minor ldflags
    minor=$(cut -d. -f2 <<<"$VERSION")
    ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$VERSION"
    ldflags="$ldflags -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
    # nice: the build takes both cores for many minutes, and it must not starve other work.
    local pkgs=
    for b in $KUBE_BINS; do pkgs="$pkgs k8s.io/kubernetes/cmd/$b"; done
    echo "== go build$pkgs (about 10 minutes on 2 cores the first time)" >&2
    mkdir -p "$src/bin"
    # shellcheck disable=SC2086
    nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$src/bin/" $pkgs
    nice -n 10 go build -trimpath -ldflags "-s -w" -o "$src/bin/etcd" ./etcd
  )
  for b in $KUBE_BINS etcd; do mv "$src/bin/$b" "$CACHE/"; done
  rm -rf "$src"
}

start_apiserver() {
  local dir=$1 port=$2 etcd_port=$3
  # shellcheck disable=SC2046 # the extra flags are words
  "$CACHE/kube-apiserver" --etcd-servers="http://127.0.0.1:$etcd_port" --bind-address=127.0.0.1 \
    --advertise-address=127.0.0.1 --secure-port="$port" --cert-dir="$dir/certs" \
    --token-auth-file="$dir/tokens.csv" --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$dir/sa.pub" \
    --service-account-signing-key-file="$dir/sa.key" --service-cluster-ip-range=10.96.0.0/24 \
    --endpoint-reconciler-type=none --disable-admission-plugins=TaintNodesByCondition \
    $(cat "$dir/apiserver.args" 2>/dev/null) >>"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
  local token
  token=$(cat "$dir/admin.token")
  for _ in $(seq 1 300); do
    if curl -sfk -H "Authorization: Bearer $token" "https://127.0.0.1:$port/readyz" >/dev/null 2>&1; then return; fi
    kill -0 "$(cat "$dir/apiserver.pid")" 2>/dev/null || { tail -30 "$dir/apiserver.log" >&2; exit 1; }
    sleep 0.2
  done
  echo "the API server did not become ready in 60 s" >&2
  tail -30 "$dir/apiserver.log" >&2
  exit 1
}

start() {
  build
  local dir port etcd_port peer_port metrics_port
  dir=$(mktemp -d "${TMPDIR:-/tmp}/gpusanity-kube.XXXXXX")
  port=$(free_port)
  etcd_port=$(free_port)
  peer_port=$(free_port)
  metrics_port=$(free_port)
  mkdir -p "$dir/certs"
  openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
  openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/admin.token"
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/limited.token"
  printf '%s,admin,admin-uid,system:masters\n%s,gpusanity-isolation,gpusanity-isolation-uid\n' \
    "$(cat "$dir/admin.token")" "$(cat "$dir/limited.token")" >"$dir/tokens.csv"
  chmod 600 "$dir"/*.token "$dir/tokens.csv" "$dir/sa.key"
  echo "${KUBE_APISERVER_ARGS:-}" >"$dir/apiserver.args"
  "$CACHE/etcd" --name kube --data-dir "$dir/etcd" --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "kube=http://127.0.0.1:$peer_port" --listen-metrics-urls "http://127.0.0.1:$metrics_port" \
    >"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"
  printf 'dir=%s\nport=%s\netcd_port=%s\n' "$dir" "$port" "$etcd_port" >"$STATE"
  start_apiserver "$dir" "$port" "$etcd_port"
  # The serving certificate is self-signed by a CA of the API server's own: its second PEM block.
  awk 'BEGIN{n=0} /BEGIN CERTIFICATE/{n++} n==2{print}' "$dir/certs/apiserver.crt" >"$dir/ca.crt"
  cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority: $dir/ca.crt
users:
- name: admin
  user:
    token: $(cat "$dir/admin.token")
contexts:
- name: local
  context:
    cluster: local
    user: admin
current-context: local
EOF
  chmod 600 "$dir/kubeconfig"
  echo "KUBE_URL=https://127.0.0.1:$port"
  echo "KUBE_TOKEN_FILE=$dir/admin.token"
  echo "KUBE_LIMITED_TOKEN_FILE=$dir/limited.token"
  echo "KUBE_CA=$dir/ca.crt"
  echo "KUBECONFIG=$dir/kubeconfig"
}

field() { sed -n "s/^$1=//p" "$STATE"; }

stop_pid() {
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$f"
}

stop() {
  [ -f "$STATE" ] || { echo "no state file $STATE" >&2; exit 1; }
  local dir
  dir=$(field dir)
  stop_pid "$dir/apiserver.pid"
  stop_pid "$dir/etcd.pid"
  rm -rf "$dir" "$STATE"
}

halt() {
  [ -f "$STATE" ] || { echo "no state file $STATE" >&2; exit 1; }
  stop_pid "$(field dir)/apiserver.pid"
}

resume() {
  [ -f "$STATE" ] || { echo "no state file $STATE" >&2; exit 1; }
  start_apiserver "$(field dir)" "$(field port)" "$(field etcd_port)"
}

case "${1:-}" in
  build) build ;;
  start) start ;;
  stop) stop ;;
  halt) halt ;;
  resume) resume ;;
  *) echo "usage: $0 build|start|stop|halt|resume" >&2; exit 2 ;;
esac
