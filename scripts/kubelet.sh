#!/usr/bin/env bash
# A real one-node Kubernetes cluster for tests and trials, on loopback, in a temp dir: etcd and
# kube-apiserver (through scripts/kube-apiserver.sh), kube-controller-manager, kube-scheduler,
# containerd and a kubelet whose Node is NODE.
#
#   scripts/kubelet.sh start       build if needed (scripts/kube-apiserver.sh build), start all of
#                                  them, wait for the Node to be Ready; prints KEY=VALUE lines:
#                                  what kube-apiserver.sh start prints (KUBE_URL, KUBECONFIG, ...),
#                                  NODE, CONTAINERD (the socket), CONTAINERD_NAMESPACE, SANDBOX_IMAGE
#                                  and IMAGE_LOAD (a command that imports an image archive)
#   scripts/kubelet.sh load FILE   import an image archive (OCI or docker, e.g. from
#                                  `podman save --format oci-archive`) into the node's containerd,
#                                  for pods with `imagePullPolicy: Never`; no registry is reachable
#   scripts/kubelet.sh image NAME ROOTFS.tar OUT.tar [ENTRYPOINT...]
#                                  pack a root file system tarball into an OCI archive named NAME
#   scripts/kubelet.sh stop        delete every container, stop all the processes it started (by
#                                  pid), unmount what they mounted, remove the cgroups, the bridge and
#                                  the folder
#
# It installs nothing. Needs root, cgroup v1 or v2, Go (for the build and a 2 MB `pause` binary,
# cached beside the Kubernetes binaries) and these Debian 12 packages:
#   containerd runc containernetworking-plugins openssl curl util-linux iproute2
# (containerd 1.6.20, runc 1.1.5, CNI plugins 1.1.1 in bookworm). kubectl is not needed. Tried on
# Debian 12, kernel 6.18, cgroup v1 (hybrid), as root without CAP_SYS_RESOURCE.
#
# The Node is named localhost (KUBELET_NODE: another name, which must resolve to 127.0.0.1: the API
# server reaches the kubelet by it for logs and exec). The kubelet runs with a KubeletConfiguration
# for a test node: cgroup v1 allowed (failCgroupV1: false, Kubernetes 1.35 refuses v1 by default),
# cgroupfs driver, pods under the cgroup root /gpusanity-node-ID, swap allowed, no image garbage
# collection, evictions only near empty disks, no iptables chains, anonymous access to its API
# on 127.0.0.1 (the API server reads logs through it), certificates, logs and volumes under the
# temp dir. containerd: its root, state, sockets and runc root under the temp dir,
# restrict_oom_score_adj (see below), snapshotter overlayfs (CONTAINERD_SNAPSHOTTER: native). Pod networking: the CNI bridge plugin on a bridge of its own
# (10.88.X.0/24; hostNetwork pods need none). There is no kube-proxy: Service IPs do not route.
# No image can be pulled: the sandbox (pause) image is built locally. State file: $KUBELET_STATE
# (default $TMPDIR/gpusanity-kubelet.state); the API server's is $KUBE_STATE (default here
# $TMPDIR/gpusanity-node-kube.state, apart from a kube-apiserver.sh of its own).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VERSION=1.35.4
CACHE=${KUBE_CACHE:-$HOME/.cache/gpusanity/kube-$VERSION}
STATE=${KUBELET_STATE:-${TMPDIR:-/tmp}/gpusanity-kubelet.state}
export KUBE_STATE=${KUBE_STATE:-${TMPDIR:-/tmp}/gpusanity-node-kube.state}
SANDBOX_IMAGE=localhost/gpusanity/pause:1
CNI_BIN=${CNI_BIN:-/usr/lib/cni}
# shellcheck source=scripts/ports.sh
. "$HERE/ports.sh"

field() { sed -n "s/^$1=//p" "$STATE"; }

# The sandbox image's only program: sleeps until SIGINT/SIGTERM, reaping children.
build_pause() {
  [ -x "$CACHE/pause" ] && return
  local src
  src=$(mktemp -d "${TMPDIR:-/tmp}/gpusanity-pause.XXXXXX")
  cat >"$src/main.go" <<'EOF'
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 4)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range c {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
EOF
  printf 'module pause\n\ngo 1.22\n' >"$src/go.mod"
  mkdir -p "$CACHE"
  (cd "$src" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS='' nice -n 10 go build -trimpath -ldflags "-s -w" -o "$CACHE/pause" .)
  rm -rf "$src"
}

# oci_archive NAME LAYER.tar OUT.tar [ENTRYPOINT...]: a one-layer OCI image archive (the layer
# uncompressed), named NAME for `ctr images import`.
oci_archive() {
  local name=$1 layer=$2 out=$3
  shift 3
  local d ld ls cd cs md ms ep=
  d=$(mktemp -d "${TMPDIR:-/tmp}/gpusanity-oci.XXXXXX")
  mkdir -p "$d/blobs/sha256"
  ld=$(sha256sum "$layer" | cut -d' ' -f1)
  ls=$(stat -c %s "$layer")
  cp "$layer" "$d/blobs/sha256/$ld"
  if [ $# -gt 0 ]; then
    local a
    for a in "$@"; do ep="$ep${ep:+,}\"$a\""; done
    ep="\"Entrypoint\":[$ep],"
  fi
  printf '{"architecture":"amd64","os":"linux","config":{%s"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$ep" "$ld" >"$d/config"
  cd=$(sha256sum "$d/config" | cut -d' ' -f1)
  cs=$(stat -c %s "$d/config")
  mv "$d/config" "$d/blobs/sha256/$cd"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$cd" "$cs" "$ld" "$ls" >"$d/manifest"
  md=$(sha256sum "$d/manifest" | cut -d' ' -f1)
  ms=$(stat -c %s "$d/manifest")
  mv "$d/manifest" "$d/blobs/sha256/$md"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$md" "$ms" "$name" "${name##*:}" >"$d/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$d/oci-layout"
  tar -C "$d" -cf "$out" oci-layout index.json blobs
  rm -rf "$d"
}

ctr_() { ctr --address "$(field dir)/containerd.sock" -n k8s.io "$@"; }

load() {
  [ -f "$STATE" ] || { echo "no state file $STATE" >&2; exit 1; }
  ctr_ images import --snapshotter "$(field snapshotter)" "$1"
}

wait_for() { # what, seconds, command...: until the command succeeds; its status 2: give up
  local what=$1 end=$((SECONDS + $2)) rc
  shift 2
  while [ "$SECONDS" -lt "$end" ]; do
    rc=0
    "$@" >/dev/null 2>&1 || rc=$?
    [ "$rc" != 0 ] || return 0
    [ "$rc" != 2 ] || return 1
    sleep 0.2
  done
  echo "$what: not ready after $2 s" >&2
  return 1
}

containerd_up() { # dir: containerd alive and answering on its socket
  alive "$1/containerd.pid" || return 2
  [ -S "$1/containerd.sock" ] && ctr --address "$1/containerd.sock" --connect-timeout 2s version
}

alive() { kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
  [ "$(id -u)" = 0 ] || { echo "the kubelet and containerd need root" >&2; exit 1; }
  [ ! -f "$STATE" ] || { echo "already started (state file $STATE); stop it first" >&2; exit 1; }
  "$HERE/kube-apiserver.sh" build
  build_pause
  local t0 dir id node
  t0=$(date +%s.%N)
  dir=$(mktemp -d "${TMPDIR:-/tmp}/gpusanity-node.XXXXXX")
  id=$(head -c 3 /dev/urandom | od -An -tx1 | tr -d ' \n')
  # The API server reaches the kubelet (logs, exec, port-forward) at the Node's Hostname address,
  # which is its name: it must resolve to loopback. A loopback --node-ip is refused ("nodeIP
  # can't be loopback address") and the Node then has no address at all.
  node=${KUBELET_NODE:-localhost}
  local snapshotter=${CONTAINERD_SNAPSHOTTER:-overlayfs}
  local bridge=gpsn$id subnet="10.88.$((16#${id:0:2})).0/24" cgroup_root=/gpusanity-node-$id
  # Paths that the kubelet and containerd-shim use whatever their configuration: removed on stop
  # where they did not exist before (kubelet: /var/lib/kubelet/device-plugins/kubelet.sock;
  # containerd 1.6: the shims' sockets in /run/containerd/s).
  local fresh=
  [ -e /var/lib/kubelet ] || fresh="$fresh /var/lib/kubelet"
  [ -e /var/lib/kubelet/device-plugins ] || fresh="$fresh /var/lib/kubelet/device-plugins"
  [ -e /run/containerd ] || fresh="$fresh /run/containerd"
  [ -e /run/containerd/s ] || fresh="$fresh /run/containerd/s"
  # The CRI plugin bind-mounts /run/netns on itself (shared) for the pods' network namespaces.
  mountpoint -q /run/netns 2>/dev/null || fresh="$fresh netns-mount"
  [ -e /run/netns ] || fresh="$fresh /run/netns"
  printf 'dir=%s\nnode=%s\nbridge=%s\ncgroup_root=%s\nsnapshotter=%s\nip_forward=%s\nfresh=%s\n' "$dir" "$node" \
    "$bridge" "$cgroup_root" "$snapshotter" "$(cat /proc/sys/net/ipv4/ip_forward)" "$fresh" >"$STATE"
  trap start_failed EXIT

  # The control plane. --kubelet-preferred-address-types: the Node's name, localhost (see above).
  local kube_out
  kube_out=$(KUBE_APISERVER_ARGS="--allow-privileged=true --kubelet-preferred-address-types=Hostname" \
    "$HERE/kube-apiserver.sh" start)
  echo "$kube_out" >"$dir/kube.env"
  local kdir kubeconfig
  kdir=$(sed -n 's/^dir=//p' "$KUBE_STATE")
  kubeconfig=$(sed -n 's/^KUBECONFIG=//p' <<<"$kube_out")
  local cm_port sched_port kubelet_port healthz_port
  cm_port=$(free_port)
  sched_port=$(free_port)
  kubelet_port=$(free_port)
  healthz_port=$(free_port)

  "$CACHE/kube-controller-manager" --kubeconfig="$kubeconfig" --authentication-kubeconfig="$kubeconfig" \
    --authorization-kubeconfig="$kubeconfig" --bind-address=127.0.0.1 --secure-port="$cm_port" \
    --controllers='*,-cloud-node-lifecycle-controller,-service-lb-controller,-node-route-controller' \
    --service-account-private-key-file="$kdir/sa.key" --root-ca-file="$kdir/ca.crt" \
    --use-service-account-credentials=false --leader-elect=false \
    >"$dir/controller-manager.log" 2>&1 &
  echo $! >"$dir/controller-manager.pid"
  "$CACHE/kube-scheduler" --kubeconfig="$kubeconfig" --authentication-kubeconfig="$kubeconfig" \
    --authorization-kubeconfig="$kubeconfig" --bind-address=127.0.0.1 --secure-port="$sched_port" \
    --leader-elect=false >"$dir/scheduler.log" 2>&1 &
  echo $! >"$dir/scheduler.pid"

  # containerd, all of its state under $dir.
  mkdir -p "$dir/containerd/root" "$dir/containerd/state" "$dir/cni" "$dir/cni-ipam" "$dir/opt"
  cat >"$dir/containerd.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$dir/containerd.sock"
[ttrpc]
  address = "$dir/containerd.ttrpc.sock"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$SANDBOX_IMAGE"
  enable_selinux = false
  disable_apparmor = true
  # Sandboxes ask for oom_score_adj -998; without CAP_SYS_RESOURCE (as in this kind of VM) runc
  # fails ("failed to update /proc/self/oom_score_adj: Permission denied"): clamp to ours.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "$snapshotter"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$dir/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$dir/cni"
EOF
  cat >"$dir/cni/10-gpusanity.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "gpusanity", "plugins": [
  {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$subnet"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$dir/cni-ipam"}}]}
EOF
  containerd --config "$dir/containerd.toml" >"$dir/containerd.log" 2>&1 &
  echo $! >"$dir/containerd.pid"
  wait_for containerd 30 containerd_up "$dir" || { tail -20 "$dir/containerd.log" >&2; exit 1; }
  # The sandbox image: the pause binary alone.
  mkdir -p "$dir/pause-root"
  cp "$CACHE/pause" "$dir/pause-root/pause"
  tar -C "$dir/pause-root" --owner=0 --group=0 -cf "$dir/pause-layer.tar" pause
  oci_archive "$SANDBOX_IMAGE" "$dir/pause-layer.tar" "$dir/pause.tar" /pause
  ctr --address "$dir/containerd.sock" -n k8s.io images import --snapshotter "$snapshotter" "$dir/pause.tar" >/dev/null
  rm -rf "$dir/pause-root" "$dir/pause-layer.tar" "$dir/pause.tar"

  # The pods' cgroup root, in each v1 hierarchy (cpuset needs its cpus and mems set).
  local h
  if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
    for h in /sys/fs/cgroup/*/; do
      [ -f "$h/cgroup.procs" ] && [ "$h" != /sys/fs/cgroup/unified/ ] || continue
      mkdir -p "$h$cgroup_root"
      if [ -f "$h/cpuset.cpus" ]; then
        cat "$h/cpuset.cpus" >"$h$cgroup_root/cpuset.cpus"
        cat "$h/cpuset.mems" >"$h$cgroup_root/cpuset.mems"
      fi
    done
  else
    mkdir -p "/sys/fs/cgroup$cgroup_root"
  fi

  mkdir -p "$dir/kubelet" "$dir/pod-logs" "$dir/volume-plugins"
  local resolv=/etc/resolv.conf
  [ -f "$resolv" ] || resolv=""
  cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $cgroup_root
failSwapOn: false
address: 127.0.0.1
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz_port
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix://$dir/containerd.sock
podLogsDir: $dir/pod-logs
volumePluginDir: $dir/volume-plugins
resolvConf: "$resolv"
serializeImagePulls: true
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 10Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
  imagefs.inodesFree: 1%
nodeStatusUpdateFrequency: 5s
# Else the kubelet adds iptables chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY, ...) that outlive it.
makeIPTablesUtilChains: false
syncFrequency: 10s
EOF
  "$CACHE/kubelet" --config="$dir/kubelet.yaml" --kubeconfig="$kubeconfig" --root-dir="$dir/kubelet" \
    --cert-dir="$dir/kubelet/pki" --hostname-override="$node" --v="${KUBELET_V:-2}" >"$dir/kubelet.log" 2>&1 &
  echo $! >"$dir/kubelet.pid"

  local ready='' url token
  url=$(sed -n 's/^KUBE_URL=//p' <<<"$kube_out")
  token=$(cat "$(sed -n 's/^KUBE_TOKEN_FILE=//p' <<<"$kube_out")")
  local end=$((SECONDS + 120))
  while [ "$SECONDS" -lt "$end" ]; do
    if curl -sf --cacert "$kdir/ca.crt" -H "Authorization: Bearer $token" "$url/api/v1/nodes/$node" 2>/dev/null \
      | tr -d ' \n' | grep -q '"type":"Ready","status":"True"'; then
      ready=1
      break
    fi
    for h in kubelet containerd controller-manager scheduler; do
      alive "$dir/$h.pid" || { echo "$h exited:" >&2; tail -30 "$dir/$h.log" >&2; exit 1; }
    done
    sleep 0.2
  done
  [ -n "$ready" ] || { echo "node $node not Ready after 120 s" >&2; tail -30 "$dir/kubelet.log" >&2; exit 1; }
  trap - EXIT
  echo "$kube_out"
  echo "NODE=$node"
  echo "CONTAINERD=$dir/containerd.sock"
  echo "CONTAINERD_NAMESPACE=k8s.io"
  echo "SANDBOX_IMAGE=$SANDBOX_IMAGE"
  echo "IMAGE_LOAD=$HERE/kubelet.sh load"
  echo "NODE_LOGS=$dir"
  echo "READY_AFTER_S=$(echo "$(date +%s.%N) - $t0" | bc 2>/dev/null || true)"
}

# A failed start stops what it started, unless KUBELET_KEEP_ON_FAILURE is set (to read the logs
# in the folder; `stop` then).
start_failed() {
  local rc=$?
  [ "$rc" != 0 ] || return 0
  if [ -n "${KUBELET_KEEP_ON_FAILURE:-}" ]; then
    echo "start failed; logs in $(field dir); run '$0 stop'" >&2
  else
    echo "start failed; stopping what it started" >&2
    stop >&2 || true
  fi
  exit "$rc"
}

stop_pids() { # pid files: SIGTERM to all, then SIGKILL to whichever still runs after 10 s
  local f pids=''
  for f in "$@"; do [ -f "$f" ] && pids="$pids $(cat "$f")"; done
  # shellcheck disable=SC2086
  [ -n "$pids" ] && kill $pids 2>/dev/null || true
  local p left
  for _ in $(seq 1 100); do
    left=''
    for p in $pids; do kill -0 "$p" 2>/dev/null && left=1; done
    [ -n "$left" ] || break
    sleep 0.1
  done
  for f in "$@"; do
    if [ -f "$f" ]; then kill -9 "$(cat "$f")" 2>/dev/null || true; fi
    rm -f "$f"
  done
}

stop() {
  [ -f "$STATE" ] || { echo "no state file $STATE" >&2; exit 1; }
  local dir cgroup_root bridge
  dir=$(field dir)
  cgroup_root=$(field cgroup_root)
  bridge=$(field bridge)
  stop_pids "$dir/kubelet.pid" "$dir/scheduler.pid" "$dir/controller-manager.pid"
  # Every container and sandbox of this containerd: kill, delete (their shims exit), and note
  # the network namespaces that the CRI plugin bind-mounted for the sandboxes.
  local c netns=
  if [ -f "$dir/containerd.pid" ] && alive "$dir/containerd.pid"; then
    for c in $(ctr_ containers list -q 2>/dev/null); do
      netns="$netns $(ctr_ containers info "$c" 2>/dev/null \
        | sed -n 's#.*"path": "\(/[^"]*netns/[^"]*\)".*#\1#p' | sort -u)"
      ctr_ tasks kill -s SIGKILL "$c" >/dev/null 2>&1 || true
    done
    for c in $(ctr_ containers list -q 2>/dev/null); do
      for _ in $(seq 1 50); do ctr_ tasks delete "$c" >/dev/null 2>&1 && break; ctr_ tasks list -q 2>/dev/null | grep -qx "$c" || break; sleep 0.1; done
      ctr_ containers delete "$c" >/dev/null 2>&1 || true
    done
  fi
  stop_pids "$dir/containerd.pid"
  # Shims that outlived containerd (they daemonize): those of this containerd's socket only.
  local f
  for f in "$dir"/containerd/state/io.containerd.runtime.v2.task/*/*/shim.pid; do
    [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
  done
  # What was mounted under the folder (the kubelet's volumes, containerd's root file systems and
  # shm), deepest first, and the sandboxes' network namespaces.
  local m
  # shellcheck disable=SC2013 # the paths are mktemp names, no blanks
  for m in $(awk -v d="$dir/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  for m in $netns; do
    umount "$m" 2>/dev/null || true
    rm -f "$m"
  done
  # The cgroups (deepest first) and the bridge.
  if [ -n "$cgroup_root" ]; then
    local h
    for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
      [ -d "$h$cgroup_root" ] || continue
      find "$h$cgroup_root" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
  fi
  ip link del "$bridge" 2>/dev/null || true
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  # shellcheck disable=SC2046
  for m in $(printf '%s\n' $(field fresh) | sort -r); do
    if [ "$m" = netns-mount ]; then
      [ -n "$(ls -A /run/netns 2>/dev/null)" ] || umount /run/netns 2>/dev/null || true
    else
      rmdir "$m" 2>/dev/null || true
    fi
  done
  [ "$(field ip_forward)" = 0 ] && echo 0 >/proc/sys/net/ipv4/ip_forward
  "$HERE/kube-apiserver.sh" stop || true
  # --one-file-system: whatever could not be unmounted is left alone.
  rm -rf --one-file-system "$dir" "$STATE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  load) load "$2" ;;
  image) shift; oci_archive "$@" ;;
  *) echo "usage: $0 start|stop|load FILE|image NAME LAYER.tar OUT.tar [ENTRYPOINT...]" >&2; exit 2 ;;
esac
