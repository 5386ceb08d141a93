#!/usr/bin/env bash
# shellcheck disable=SC2154  # MAX_STREAMS comes from render()
# Bulk bytes over ssh at the link's speed, not one stream's: a cipher fast on this CPU,
# and one stream over several connections at once (a connection's cipher runs on one
# core). Used by the head's ssh to a node (lib/peer_ssh) and by the image relay's hops
# (lib/relay), each giving `stripe` its own two ways to reach the next node.
# revision: 2
# uses: quote

# The ciphers a bulk transfer asks for first: AES-GCM where this CPU has AES instructions
# (x86's `aes` flag, arm64's `aes` feature: there several times chacha20-poly1305's rate,
# OpenSSH's first choice), then that; nothing where it has none (OpenSSH's own order).
bulk_ciphers() {
  if grep -qw aes /proc/cpuinfo 2>/dev/null; then
    printf '%s' aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com
  fi
}

# bulk_streams [THEIR_CORES]: how many bulk streams to run at once: this node's cores, at
# most MAX_STREAMS (a value of the script that uses this); given the receiver's cores, at
# most half of them, for a receiver that does a stream's work twice over: its cipher, then
# writing and hashing every byte (the weights copy: measured on the sim, one AES-GCM stream
# of 1 GB took 2.2-2.5 core-s on the receiver, 1.0 on the sender).
bulk_streams() {
  local n theirs=${1:-}
  n=$(nproc 2>/dev/null || echo 1)
  [ "$n" -le "$MAX_STREAMS" ] || n=$MAX_STREAMS
  if [ -n "$theirs" ] && [ "$n" -gt $((theirs / 2)) ]; then
    n=$((theirs / 2))
    [ "$n" -ge 1 ] || n=1
  fi
  echo "$n"
}

# stripe N PROBE CMD CONTROL STREAM [JOINS]: stdin to CMD (a line the node's login shell
# parses) on the next node over N connections at once. CONTROL and STREAM are the
# caller's functions that run a command line there: CONTROL over any connection (it never
# reads stdin here), STREAM over a bulk connection of its own. PROBE (probes/stripe.py)
# cuts the bytes into chunks here; there, each connection hands its stdin to one joiner,
# which reads them back in order, into CMD; a cut connection fails the whole (CMD sees a
# cut stream). The joiner listens in a private folder it removes once every connection
# is in. JOINS non-empty: CMD joins the stream itself (`PROBE join SOURCE ...`) and is
# given SOURCE as one more word: the folder, or `-` (its stdin) for the plain stream.
# One stream, or no python3 3.9 or later on either end: the plain stream.
# Returns non-zero when any part failed: CMD's code when CMD failed.
stripe() {
  local n=$1 probe=$2 cmd=$3 control=$4 stream=$5 joins=${6:-} far here i joiner rc=0 pids=() ins=()
  if [ "$n" -gt 1 ] && python3 -c 'import socket; socket.send_fds' 2>/dev/null; then
    far=$("$control" "python3 -c 'import socket; socket.send_fds' 2>/dev/null && mktemp -d" < /dev/null || true)
  fi
  if [ -z "${far:-}" ]; then
    "$stream" "$cmd${joins:+ -}"
    return
  fi
  here=$(mktemp -d)
  for ((i = 0; i < n; i++)); do
    mkfifo "$here/$i"
    ins+=("$here/$i")
  done
  # (Neither call of CONTROL here may read stdin: it is the stream.) The folder goes when
  # the joining ends however it ends, so that no connection waits for a joiner that failed
  # to start.
  if [ -n "$joins" ]; then
    "$control" "$cmd $(sq "$far"); rc=\$?; rm -rf $(sq "$far"); exit \$rc" < /dev/null &
  else
    "$control" "python3 -c $(sq "$probe") join $(sq "$far") | $cmd; rc=\$?; rm -rf $(sq "$far"); exit \$rc" < /dev/null &
  fi
  joiner=$!
  for ((i = 0; i < n; i++)); do
    "$stream" "exec python3 -c $(sq "$probe") hand $(sq "$far") $i $n" < "${ins[$i]}" &
    pids+=($!)
  done
  python3 -c "$probe" split "${ins[@]}" || rc=$?
  if [ "$rc" -ne 0 ]; then
    # A connection failed (or never opened its pipe): end the others here, and remove the
    # joiner's folder there, so that it stops waiting for a connection that will not come.
    kill "${pids[@]}" 2>/dev/null || true
    "$control" "rm -rf $(sq "$far")" < /dev/null || true
  fi
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  # CMD's own exit code, when it failed, is the one returned.
  wait "$joiner" || rc=$?
  rm -rf "$here"
  return "$rc"
}
