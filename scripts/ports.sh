# shellcheck shell=bash
# Sourced by the scripts that start a local server. free_port: a loopback port that nothing
# listens on now, taken below the kernel's range of ephemeral ports, so that no outgoing
# connection (the tests open thousands) can hold it as its local port when the server binds it.
free_port() {
  local low=32768 p
  if [ -r /proc/sys/net/ipv4/ip_local_port_range ]; then
    read -r low _ </proc/sys/net/ipv4/ip_local_port_range
  fi
  local from=20000 span=$((low - 20000))
  # A kernel whose ephemeral range starts low: the old range, a collision then possible.
  if [ "$span" -lt 2000 ]; then span=40000; fi
  while :; do
    p=$((from + RANDOM % span))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
