#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# The image relay's hops: from whichever node holds the stream to the next, with the
# head's key through the forwarded ssh-agent (never a copy on a worker's disk), each
# node's host key pinned in $SPARKVLLM_KH (KNOWN_HOSTS) unless VERIFY says the config
# opts out. Nodes are indexes into NAMES, ADDRESSES, USERS, PORTS and VERIFY; RELAY_OPTS
# and RELAY_OPTS_OPEN are sparkvllm/specs/ssh.py's option words for a verified and an
# unverified node.
# revision: 1
# uses: quote

# relay_ssh I CMD: ssh from this hop to node I over the cluster link.
relay_ssh() {
  local i=$1
  shift
  if [ "${VERIFY[$i]}" = 1 ]; then
    ssh "${RELAY_OPTS[@]}" -p "${PORTS[$i]}" -l "${USERS[$i]}" -- "${ADDRESSES[$i]}" "$@"
  else
    ssh "${RELAY_OPTS_OPEN[@]}" -p "${PORTS[$i]}" -l "${USERS[$i]}" -- "${ADDRESSES[$i]}" "$@"
  fi
}

# send I J K...: stream stdin to node I as `bash -c "$HOP" hop J K...`, so that I loads
# it and sends it on to J, which sends it on to K.
send() {
  local i=$1
  shift
  relay_ssh "$i" "$(shell_words bash -c "$HOP" hop "$@")"
}
