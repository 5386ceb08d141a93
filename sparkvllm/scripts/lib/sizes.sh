#!/usr/bin/env bash
# Byte counts as people read them, and the room a node has.
# revision: 1

# human N: 3145745 prints 3.1 MB.
human() {
  awk -v n="$1" 'BEGIN { split("B KB MB GB TB PB", u); i = 1; while (n >= 1000 && i < 6) { n /= 1000; i++ }; printf "%.1f %s", n, u[i] }'
}

# avail PATH: the bytes free where PATH is or would be (df of its nearest existing
# folder). No path (a failed `docker info` in $(...)): fails, printing nothing, instead
# of measuring the folder it runs in.
avail() {
  local d=$1
  [ -n "$d" ] || return 1
  while [ ! -d "$d" ]; do d=$(dirname "$d"); done
  df -B1 --output=avail "$d" | tail -n 1 | tr -d ' '
}

# room NEED HAVE WHERE FIX: stops unless NEED bytes fit in the HAVE free:
# `<WHERE> needs 3.1 MB, has 1.0 MB; <FIX>`.
room() {
  [ "$1" -le "$2" ] || {
    printf '%s needs %s, has %s; %s\n' "$3" "$(human "$1")" "$(human "$2")" "$4" >&2
    exit 1
  }
}
