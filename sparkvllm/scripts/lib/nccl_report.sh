#!/usr/bin/env bash
# What NCCL the model server runs with, as the readiness step reports it.
# revision: 1

# nccl_transport NAME: prints nccl_transport=ib|socket|gloo|unknown from the server's
# logs (NCCL_DEBUG=INFO: "via NET/IB" is RDMA; "via NET/Socket" or "NET/IB : No device
# found" is the silent TCP fallback). vLLM's Ray workers log through the driver, so the
# server's logs hold both.
nccl_transport() {
  local logs
  logs=$(docker logs "$1" 2>&1 || true)
  if grep -q "via NET/IB" <<<"$logs"; then echo nccl_transport=ib
  elif grep -qE "via NET/Socket|NET/IB : No device found" <<<"$logs"; then echo nccl_transport=socket
  # No NCCL at all: torch.distributed over gloo (vLLM on CPU, as on the sim).
  elif grep -qi "gloo" <<<"$logs"; then echo nccl_transport=gloo
  else echo nccl_transport=unknown; fi
}

# nccl_loaded NAME: prints nccl_loaded= every libnccl file mapped by a process the
# server's container sees (its own, or with Ray the host's: the Ray workers), read from
# /proc, so it names the library that runs, not the one the config asked for. The reading
# shell preloads nothing itself (LD_PRELOAD emptied).
nccl_loaded() {
  local loaded
  # shellcheck disable=SC2016  # expanded by the container's shell
  loaded=$(docker exec -e LD_PRELOAD= "$1" sh -c 'cat /proc/[0-9]*/maps 2>/dev/null; true' \
    2>/dev/null | awk '$6 ~ /libnccl[.]so/ {print $6}' | sort -u | paste -sd, -)
  echo nccl_loaded="$loaded"
}
