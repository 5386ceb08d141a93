#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# The node's facts for the preflight, as key=value lines (bash, no sudo); changes nothing.
# NETDEV: its cluster-link interface; HF_CACHE: where the weights go; HOST_NCCL_GLOBS:
# where a host NCCL may be; NCCL_PATH: with nccl.library host, the library the containers
# will load (else empty).
# revision: 1
# uses: nccl_library
# values: NETDEV HF_CACHE HOST_NCCL_GLOBS[] NCCL_PATH
set -u
echo "arch=$(uname -m)"
echo "kernel=$(uname -r)"
echo "hostname=$(hostname)"
echo "mem_total_kb=$(awk '/^MemTotal:/{print $2}' /proc/meminfo)"
echo "mem_available_kb=$(awk '/^MemAvailable:/{print $2}' /proc/meminfo)"
if command -v docker >/dev/null 2>&1; then
  echo "docker_version=$(docker version --format '{{.Server.Version}}' 2>/dev/null)"
  echo "docker_api=$(docker version --format '{{.Server.APIVersion}}' 2>/dev/null)"
else
  echo docker_version=; echo docker_api=
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  g=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
  echo "gpu_name=${g%%,*}"
  driver=${g#*,}
  echo "gpu_driver=${driver# }"
  echo "gpu_count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
else
  echo gpu_name=; echo gpu_driver=; echo gpu_count=0
fi
d="/sys/class/net/$NETDEV"
if [ -e "$d" ]; then
  echo netdev_present=1
  echo "netdev_state=$(cat "$d/operstate")"
  echo "netdev_mtu=$(cat "$d/mtu")"
  echo "netdev_addresses=$(ip -o -4 addr show dev "$NETDEV" 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | paste -sd, -)"
else
  echo netdev_present=0; echo netdev_state=; echo netdev_mtu=0; echo netdev_addresses=
fi
# shellcheck disable=SC2012  # interface and device names are plain words
echo "netdevs=$(ls /sys/class/net | paste -sd, -)"
# shellcheck disable=SC2012
echo "rdma_devices=$(ls /sys/class/infiniband 2>/dev/null | paste -sd, -)"
# Each HCA's PCI address: a GB10's ConnectX-7 port is two PCIe halves.
echo "rdma_pci=$(for h in /sys/class/infiniband/*; do [ -e "$h" ] && echo "${h##*/}@$(basename "$(readlink -f "$h/device")")"; done | paste -sd, -)"
echo "hf_cache_free_kb=$(df -Pk "$HF_CACHE" 2>/dev/null | awk 'NR==2{print $4}')"
# The host's own NCCL, if any (the image brings its own; they should agree).
nccl_host "${HOST_NCCL_GLOBS[@]}"
# nccl.library host: the library the containers will load, where it really is.
if [ -n "$NCCL_PATH" ]; then nccl_library "$NCCL_PATH"; fi
