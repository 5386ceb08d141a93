#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# The image relay's hops: from whichever node holds the stream to the next, with the
# head's key through the forwarded ssh-agent (never a copy on a worker's disk), each
# node's host key pinned in $SPARKVLLM_KH (KNOWN_HOSTS) unless VERIFY says the config
# opts out. Nodes are indexes into NAMES, ADDRESSES, USERS, PORTS and VERIFY; RELAY_OPTS
# and RELAY_OPTS_OPEN are sparkvllm/specs/ssh.py's option words for a verified and an
# unverified node.
# revision: 2
# uses: quote bulk

# relay_ssh I [OPTION...] -- CMD: ssh from this hop to node I over the cluster link
# (OPTIONs first: ssh takes an option's first value).
relay_ssh() {
  local i=$1 opts=()
  shift
  while [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  if [ "${VERIFY[$i]}" = 1 ]; then
    ssh "${opts[@]}" "${RELAY_OPTS[@]}" -p "${PORTS[$i]}" -l "${USERS[$i]}" -- "${ADDRESSES[$i]}" "$@"
  else
    ssh "${opts[@]}" "${RELAY_OPTS_OPEN[@]}" -p "${PORTS[$i]}" -l "${USERS[$i]}" -- "${ADDRESSES[$i]}" "$@"
  fi
}

# The next node's two ways in for `stripe` (lib/bulk): a call, and a bulk connection of
# its own with bulk_ciphers. The node is $next (send sets it).
next_call() { relay_ssh "$next" -- "$@"; }
next_stream() {
  local ciphers
  ciphers=$(bulk_ciphers)
  relay_ssh "$next" ${ciphers:+-c "$ciphers"} -- "$@"
}

# send I J K...: stream stdin to node I as `bash -c "$HOP" hop J K...`, so that I loads
# it and sends it on to J, which sends it on to K; over as many connections at once as
# this node has cores (at most MAX_STREAMS), STRIPE (probes/stripe.py) cutting the stream
# here and putting it back in order there.
send() {
  next=$1
  shift
  stripe "$(bulk_streams)" "$STRIPE" "$(shell_words bash -c "$HOP" hop "$@")" next_call next_stream
}
