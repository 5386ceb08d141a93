#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render(), PEER_* from the step's env
# What the cluster link between the head (HEAD_ADDRESS on NETDEV) and TARGET_NAME
# (TARGET_ADDRESS on PEER_NETDEV) carries now, run on the head: the speed each end's
# interface negotiated, then a bounded TCP transfer each way (RATE_PROBE:
# probes/link_rate.py; at most SECONDS_EACH seconds and MAX_BYTES bytes per direction, in
# up to MAX_STREAMS streams: the head's cores, capped), measured where it arrives; and,
# when both ends have RDMA's own tool (perftest's ib_write_bw) and HCAS name the head's
# RoCE devices, an RDMA write of the same length, every HCA pair at once. Prints
# head.speed_mbit=, peer.speed_mbit=, tcp.streams=, tcp.out.gbit= (head -> target),
# tcp.in.gbit= (target -> head), rdma.gbit= (empty: not measured), rdma.hcas=. A rate it
# could not measure is empty; only an unreachable target fails the script.
# revision: 1
# uses: peer_ssh
# values: HEAD_NAME TARGET_NAME TARGET_ADDRESS SSH_OPTS[] HEAD_ADDRESS NETDEV PEER_NETDEV SECONDS_EACH MAX_BYTES MAX_STREAMS RATE_PROBE HCAS[] PEER_HCAS[]
set -uo pipefail
open_peer
work=$(mktemp -d)
trap 'rm -rf "$work"; close_peer' EXIT
# The receiver's port, once it printed it (it listens before the sender starts).
port_of() {
  local i
  for i in $(seq 100); do
    if grep -q '^port=' "$1" 2>/dev/null; then sed -n 's/^port=//p' "$1"; return 0; fi
    sleep 0.1
  done
  return 1
}
streams=$(bulk_streams)
probe=$(sq "$RATE_PROBE")
echo "head.speed_mbit=$(cat "/sys/class/net/$NETDEV/speed" 2>/dev/null)"
echo "peer.speed_mbit=$(remote "cat /sys/class/net/$(sq "$PEER_NETDEV")/speed 2>/dev/null")"
echo "tcp.streams=$streams"

# head -> target: the target receives.
remote "python3 -c $probe receive $(sq "$TARGET_ADDRESS") $(sq "$HEAD_ADDRESS") $streams $SECONDS_EACH" > "$work/out" 2>&1 &
receiver=$!
if port=$(port_of "$work/out"); then
  python3 -c "$RATE_PROBE" send "$TARGET_ADDRESS" "$port" "$streams" "$SECONDS_EACH" "$MAX_BYTES" > /dev/null
fi
wait "$receiver"
echo "tcp.out.gbit=$(sed -n 's/^gbit=//p' "$work/out")"

# target -> head: the head receives.
python3 -c "$RATE_PROBE" receive "$HEAD_ADDRESS" "$TARGET_ADDRESS" "$streams" "$SECONDS_EACH" > "$work/in" 2>&1 &
receiver=$!
if port=$(port_of "$work/in"); then
  remote "python3 -c $probe send $(sq "$HEAD_ADDRESS") $port $streams $SECONDS_EACH $MAX_BYTES" > /dev/null
fi
wait "$receiver"
echo "tcp.in.gbit=$(sed -n 's/^gbit=//p' "$work/in")"

# RDMA, where both ends have the tool: each HCA pair on a port of its own, all at once;
# the sum of their averages (one port is two PCIe halves on a GB10).
rdma=
pairs=0
if [ "${#HCAS[@]}" -gt 0 ] && command -v ib_write_bw > /dev/null 2>&1 \
  && remote "command -v ib_write_bw" > /dev/null 2>&1; then
  limit=$((SECONDS_EACH + 20))
  for i in "${!HCAS[@]}"; do
    [ -n "${PEER_HCAS[$i]:-}" ] || continue
    p=$((18515 + i))
    remote "timeout $limit ib_write_bw -d $(sq "${PEER_HCAS[$i]}") -p $p -D $SECONDS_EACH --report_gbits -F" > /dev/null 2>&1 &
    sleep 1
    timeout "$limit" ib_write_bw -d "${HCAS[$i]}" -p "$p" -D "$SECONDS_EACH" --report_gbits -F "$TARGET_ADDRESS" > "$work/rdma.$i" 2>&1 &
    pairs=$((pairs + 1))
  done
  wait
  # The result line: #bytes #iterations BW-peak BW-average MsgRate (Gb/s with --report_gbits).
  rdma=$(cat "$work"/rdma.* 2>/dev/null | awk '$1 ~ /^[0-9]+$/ && NF >= 5 { s += $4; n++ } END { if (n) printf "%.3f", s }')
fi
echo "rdma.gbit=$rdma"
echo "rdma.hcas=$pairs"
