#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# From this node, for every other node (PEER_NAMES, PEER_ADDRESSES: their cluster-link
# addresses, PEER_PORTS: their sshd's): the route the kernel picks to it (device and
# source address), a TCP connect to its sshd, and a don't-fragment ping of PING_SIZE bytes
# (the expected MTU less the IPv4 and ICMP headers). Prints peer.<name>.<fact>=value
# lines; never fails by itself.
# revision: 1
# values: PEER_NAMES[] PEER_ADDRESSES[] PEER_PORTS[] PING_SIZE
set -u
for i in "${!PEER_NAMES[@]}"; do
  key="peer.${PEER_NAMES[$i]}"
  addr=${PEER_ADDRESSES[$i]}
  echo "$key.route=$(ip -o route get "$addr" 2>/dev/null | head -1)"
  # shellcheck disable=SC2016  # expanded by the inner bash, from its arguments
  if timeout 5 bash -c '</dev/tcp/"$1"/"$2"' _ "$addr" "${PEER_PORTS[$i]}" 2>/dev/null; then
    echo "$key.tcp=ok"
  else
    echo "$key.tcp=fail"
  fi
  if command -v ping >/dev/null 2>&1; then
    if ping -c 1 -W 2 -M "do" -s "$PING_SIZE" "$addr" >/dev/null 2>&1; then echo "$key.mtu=ok"; else echo "$key.mtu=fail"; fi
  else
    echo "$key.mtu=unknown"
  fi
done
