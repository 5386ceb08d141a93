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
# uses: quote bulk

# remote CMD...: run CMD (words the far side's login shell parses) on the node.
remote() { ssh "${SSH_OPTS[@]}" -p "$PEER_PORT" -l "$PEER_USER" -- "$TARGET_ADDRESS" "$@"; }

# on_peer FUNCTION ARGS...: run one of this script's functions on the node (the
# functions it calls go with it).
on_peer() { remote "$(function_call "$@")"; }

# stream_to_peer CMD...: like `remote`, for bulk bytes: a connection of its own (not the
# shared one: a connection's cipher runs on one core, so streams at once use as many),
# with bulk_ciphers. (ssh takes an option's first value: these come before SSH_OPTS.)
stream_to_peer() {
  local ciphers
  ciphers=$(bulk_ciphers)
  ssh -S none ${ciphers:+-c "$ciphers"} "${SSH_OPTS[@]}" -p "$PEER_PORT" -l "$PEER_USER" -- "$TARGET_ADDRESS" "$@"
}

# stripe_to_peer N PROBE CMD [JOINS]: stdin to CMD (a line the node's login shell parses)
# on the node over N of stream_to_peer's connections at once (lib/bulk stripe).
stripe_to_peer() { stripe "$1" "$2" "$3" remote stream_to_peer "${4:-}"; }

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
