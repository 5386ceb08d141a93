#!/usr/bin/env bash
# shellcheck disable=SC2154  # MAX_STREAMS comes from render()
# Bulk bytes over ssh at the link's speed, not one stream's: a cipher fast on this CPU,
# and one stream over several connections at once (a connection's cipher runs on one
# core). Used by the head's ssh to a node (lib/peer_ssh) and by the image relay's hops
# (lib/relay), each giving `stripe` its own two ways to reach the next node.
# revision: 1
# uses: quote

# The ciphers a bulk transfer asks for first: AES-GCM where this CPU has AES instructions
# (x86's `aes` flag, arm64's `aes` feature: there several times chacha20-poly1305's rate,
# OpenSSH's first choice), then that; nothing where it has none (OpenSSH's own order).
bulk_ciphers() {
  if grep -qw aes /proc/cpuinfo 2>/dev/null; then
    printf '%s' aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com
  fi
}

# bulk_streams: how many bulk streams to run at once: this node's cores, at most MAX_STREAMS
# (a value of the script that uses this).
bulk_streams() {
  local n
  n=$(nproc 2>/dev/null || echo 1)
  [ "$n" -le "$MAX_STREAMS" ] || n=$MAX_STREAMS
  echo "$n"
}

# stripe N PROBE CMD CONTROL STREAM: stdin to CMD (a line the node's login shell parses)
# on the next node over N connections at once. CONTROL and STREAM are the caller's
# functions that run a command line there: CONTROL over any connection (it never reads
# stdin here), STREAM over a bulk connection of its own. PROBE (probes/stripe.py) cuts
# the bytes into chunks here and puts them back in order there, into CMD; a cut
# connection fails the whole (CMD sees a cut stream). The named pipes it needs there are
# in a private folder the receiver removes as it opens them. One stream, or no python3 on
# either end: the plain stream. Returns non-zero when any part failed: CMD's code when
# CMD failed.
stripe() {
  local n=$1 probe=$2 cmd=$3 control=$4 stream=$5 far here i joiner rc=0 pids=() ins=() outs=()
  if [ "$n" -gt 1 ] && command -v python3 >/dev/null; then
    far=$("$control" "command -v python3 >/dev/null && d=\$(mktemp -d) && cd \"\$d\" && mkfifo $(seq -s ' ' 0 $((n - 1))) && pwd" < /dev/null || true)
  fi
  if [ -z "${far:-}" ]; then
    "$stream" "$cmd"
    return
  fi
  here=$(mktemp -d)
  for ((i = 0; i < n; i++)); do
    mkfifo "$here/$i"
    ins+=("$here/$i")
    outs+=("$(sq "$far/$i")")
  done
  # (Neither call of CONTROL here may read stdin: it is the stream.)
  "$control" "python3 -c $(sq "$probe") join ${outs[*]} | $cmd" < /dev/null &
  joiner=$!
  for ((i = 0; i < n; i++)); do
    "$stream" "exec cat > ${outs[$i]}" < "${ins[$i]}" &
    pids+=($!)
  done
  python3 -c "$probe" split "${ins[@]}" || rc=$?
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  # CMD's own exit code, when it failed, is the one returned.
  wait "$joiner" || rc=$?
  rm -rf "$here"
  return "$rc"
}
