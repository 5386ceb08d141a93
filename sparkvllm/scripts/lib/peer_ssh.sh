#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render(), PEER_* from the step's env
# The head's ssh to one node over the cluster link (TARGET_NAME at TARGET_ADDRESS), as
# a step on the head reaches it: the SSH key arrives on stdin and lives in a 0600 temp
# file removed on exit, the node's host key is pinned ($PEER_HOST_KEY; empty: the
# config's opt-out), and every call of the step shares one connection (a master in a
# 0700 folder). The user and port come at run time ($PEER_USER, $PEER_PORT), so a new one
# is not a new step. SSH_OPTS are the option words sparkvllm/specs/ssh.py makes; they
# name the files by the variables exported here (OpenSSH >= 8.4 expands them).
# revision: 1
# uses: quote

# remote CMD...: run CMD (words the far side's login shell parses) on the node.
remote() { ssh "${SSH_OPTS[@]}" -p "$PEER_PORT" -l "$PEER_USER" -- "$TARGET_ADDRESS" "$@"; }

# on_peer FUNCTION ARGS...: run one of this script's functions on the node (the
# functions it calls go with it).
on_peer() { remote "$(function_call "$@")"; }

# The ciphers a bulk transfer asks for first: AES-GCM where this CPU has AES instructions
# (x86's `aes` flag, arm64's `aes` feature: there several times chacha20-poly1305's rate,
# OpenSSH's first choice), then that; nothing where it has none (OpenSSH's own order).
bulk_ciphers() {
  if grep -qw aes /proc/cpuinfo 2>/dev/null; then
    printf '%s' aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com
  fi
}

# stream_to_peer CMD...: like `remote`, for bulk bytes: a connection of its own (not the
# shared one: a connection's cipher runs on one core, so streams at once use as many),
# with bulk_ciphers. (ssh takes an option's first value: these come before SSH_OPTS.)
stream_to_peer() {
  local ciphers
  ciphers=$(bulk_ciphers)
  ssh -S none ${ciphers:+-c "$ciphers"} "${SSH_OPTS[@]}" -p "$PEER_PORT" -l "$PEER_USER" -- "$TARGET_ADDRESS" "$@"
}

# bulk_streams: how many bulk streams to run at once: this node's cores, at most MAX_STREAMS
# (a value of the script that uses this).
bulk_streams() {
  local n
  n=$(nproc 2>/dev/null || echo 1)
  [ "$n" -le "$MAX_STREAMS" ] || n=$MAX_STREAMS
  echo "$n"
}

# stripe_to_peer N PROBE CMD: stdin to CMD (a line the node's login shell parses) on the
# node over N of stream_to_peer's connections at once: one stream's cipher runs on one
# core, several fill a link one cannot. PROBE (probes/stripe.py) cuts the bytes into
# chunks here and puts them back in order there, into CMD; a cut connection fails the
# whole (CMD sees a cut stream). The named pipes it needs there are in a private folder
# the receiver removes as it opens them. One stream, or no python3 on either end: the
# plain stream. Returns non-zero when any part failed: CMD's code when CMD failed.
stripe_to_peer() {
  local n=$1 probe=$2 cmd=$3 far here i control rc=0 pids=() ins=() outs=()
  if [ "$n" -gt 1 ] && command -v python3 >/dev/null; then
    far=$(remote "command -v python3 >/dev/null && d=\$(mktemp -d) && cd \"\$d\" && mkfifo $(seq -s ' ' 0 $((n - 1))) && pwd" < /dev/null || true)
  fi
  if [ -z "${far:-}" ]; then
    stream_to_peer "$cmd"
    return
  fi
  here=$(mktemp -d)
  for ((i = 0; i < n; i++)); do
    mkfifo "$here/$i"
    ins+=("$here/$i")
    outs+=("$(sq "$far/$i")")
  done
  # (Neither call of `remote` here may read stdin: it is the stream.)
  remote "python3 -c $(sq "$probe") join ${outs[*]} | $cmd" < /dev/null &
  control=$!
  for ((i = 0; i < n; i++)); do
    stream_to_peer "exec cat > ${outs[$i]}" < "${ins[$i]}" &
    pids+=($!)
  done
  python3 -c "$probe" split "${ins[@]}" || rc=$?
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  # CMD's own exit code, when it failed, is the one returned.
  wait "$control" || rc=$?
  rm -rf "$here"
  return "$rc"
}

close_peer() {
  ssh "${SSH_OPTS[@]}" -O exit -p "$PEER_PORT" -l "$PEER_USER" -- "$TARGET_ADDRESS" 2>/dev/null || true
  rm -rf "$SPARKVLLM_KEY" "$SPARKVLLM_KH" "$SPARKVLLM_CM"
}

# open_peer: the key from stdin, the host key, then one call: the node answers, or the
# step stops naming the node, the address, the user and port, and the fix.
open_peer() {
  umask 077
  SPARKVLLM_KEY=$(mktemp); SPARKVLLM_KH=$(mktemp); SPARKVLLM_CM=$(mktemp -d)
  export SPARKVLLM_KEY SPARKVLLM_KH SPARKVLLM_CM
  trap close_peer EXIT
  cat > "$SPARKVLLM_KEY"
  if [ -z "$PEER_HOST_KEY" ]; then
    : > "$SPARKVLLM_KH"
  elif [ "$PEER_PORT" = 22 ]; then
    printf '%s %s\n' "$TARGET_ADDRESS" "$PEER_HOST_KEY" > "$SPARKVLLM_KH"
  else
    printf '[%s]:%s %s\n' "$TARGET_ADDRESS" "$PEER_PORT" "$PEER_HOST_KEY" > "$SPARKVLLM_KH"
  fi
  remote true || {
    printf '%s cannot ssh to %s at %s over the cluster link (user, port): %s %s; fix: let sshd listen on the cluster address and authorize the key for that user\n' \
      "$HEAD_NAME" "$TARGET_NAME" "$TARGET_ADDRESS" "$PEER_USER" "$PEER_PORT" >&2
    exit 1
  }
}
