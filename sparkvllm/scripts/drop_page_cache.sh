#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# Free the page cache (as root, or through passwordless sudo), right before vLLM measures
# free memory: on unified memory the cache counts against it.
# revision: 1
# values: NODE LOGIN_USER
set -uo pipefail
sync
if [ "$(id -u)" = 0 ]; then
  echo 3 > /proc/sys/vm/drop_caches
else
  sudo -n sh -c 'echo 3 > /proc/sys/vm/drop_caches' || {
    printf 'cannot drop the page cache on %s: needs root or passwordless sudo for %s; fix: allow it, or set drop_page_cache: false\n' "$NODE" "$LOGIN_USER" >&2
    exit 1
  }
fi
echo "mem_available_kb=$(awk '/^MemAvailable:/{print $2}' /proc/meminfo)"
