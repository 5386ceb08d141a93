#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# What a relay hop runs, as `bash -c HOP hop [J K...]`: load the stream arriving on stdin
# while sending it on to J (then K...), over several connections at once (lib/relay
# send). HOP is this very text (BASH_EXECUTION_STRING), so each hop passes it on
# unchanged. The stream passes through memory: the fifo holds no data. tee -p keeps
# loading here if the next hop fails (that node's own step then streams to it from the
# head).
# revision: 1
# uses: relay
# values: ADDRESSES[] USERS[] PORTS[] VERIFY[] KNOWN_HOSTS RELAY_OPTS[] RELAY_OPTS_OPEN[] STRIPE MAX_STREAMS
set -uo pipefail
[ $# -gt 0 ] || exec docker load >&2
# shellcheck disable=SC2034  # send (lib/relay) passes it on
HOP=$BASH_EXECUTION_STRING
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%s' "$KNOWN_HOSTS" > "$tmp/kh"
export SPARKVLLM_KH=$tmp/kh
mkfifo "$tmp/load"
docker load < "$tmp/load" >&2 &
loading=$!
tee -p "$tmp/load" | send "$@" >&2
rc=$?
wait "$loading" || rc=1
exit $rc
