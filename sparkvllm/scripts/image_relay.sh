#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# The image REF to several workers, leaving the head once: the workers that lack it form
# a chain, head -> w1 -> w2 -> ..., each loading the stream while passing it on (HOP:
# relay_hop.sh), so every link carries it once and the whole takes about one transfer's
# time, not one per worker. Each hop sends over several connections at once (lib/relay
# send: as many as the sender's cores, at most MAX_STREAMS).
#
# Two or more workers that hold none of the image's layers get it whole; otherwise two or
# more that hold some (an update: the version before) get one thin stream, without the
# layers every one of them holds (LAYER_FILTER: probes/image_layers.py). A worker with the
# image, one without room for it, and one of a kind when the chain is of the other kind,
# are left to their own image-sync steps; so is everything when fewer than two workers
# are alike. Those steps run after this one, find the image in place (or send what a
# worker still lacks) and check every node's fingerprint. Best effort: a broken chain
# fails nothing here. The key arrives on stdin; the hops authenticate through the head's
# forwarded ssh-agent. Prints relayed= (the workers it gave the image to, comma separated).
# revision: 1
# uses: sizes image relay
# values: HEAD_NAME REF LAYER_FILTER HOP NAMES[] ADDRESSES[] USERS[] PORTS[] VERIFY[] KNOWN_HOSTS HEAD_OPTS[] HEAD_OPTS_OPEN[] RELAY_OPTS[] RELAY_OPTS_OPEN[] STRIPE MAX_STREAMS
set -euo pipefail
umask 077

# node_ssh I [OPTION...] -- [CMD...]: the head's own ssh to node I (its key, one shared
# connection per node).
node_ssh() {
  local i=$1 opts=()
  shift
  while [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  if [ "${VERIFY[$i]}" = 1 ]; then opts=("${HEAD_OPTS[@]}" "${opts[@]}"); else opts=("${HEAD_OPTS_OPEN[@]}" "${opts[@]}"); fi
  ssh "${opts[@]}" -p "${PORTS[$i]}" -l "${USERS[$i]}" -- "${ADDRESSES[$i]}" "$@"
}
# on_node I FUNCTION ARGS...: one of this script's functions on node I.
on_node() { local i=$1; shift; node_ssh "$i" -- "$(function_call "$@")"; }
cleanup() {
  local i
  for i in "${!NAMES[@]}"; do node_ssh "$i" -O exit -- 2>/dev/null || true; done
  rm -rf "$SPARKVLLM_KEY" "$SPARKVLLM_KH" "$SPARKVLLM_CM"
}

SPARKVLLM_KEY=$(mktemp); SPARKVLLM_KH=$(mktemp); SPARKVLLM_CM=$(mktemp -d)
export SPARKVLLM_KEY SPARKVLLM_KH SPARKVLLM_CM
trap cleanup EXIT
cat > "$SPARKVLLM_KEY"
printf '%s' "$KNOWN_HOSTS" > "$SPARKVLLM_KH"
for i in "${!NAMES[@]}"; do
  node_ssh "$i" -- true || {
    printf '%s cannot ssh to %s at %s over the cluster link (port %s, user %s); fix: let sshd listen on the cluster address and authorize the key for that user\n' \
      "$HEAD_NAME" "${NAMES[$i]}" "${ADDRESSES[$i]}" "${PORTS[$i]}" "${USERS[$i]}" >&2
    exit 1
  }
done

src=$(fingerprint "$REF" || true)
[ -n "$src" ] || { printf 'image %s is missing on %s\n' "$REF" "$HEAD_NAME" >&2; exit 1; }
size=$(docker image inspect -f '{{.Size}}' "$REF")
mine=$(docker image inspect -f '{{json .RootFS.Layers}}' "$REF") || mine=
# The candidates: each worker that lacks the image and has room for it, holding none of
# its layers (bare) or some but not all (a holder: what it holds is kept, in the step's
# private folder, for the thin stream).
bare=(); holders=()
for i in "${!NAMES[@]}"; do
  [ "$(on_node "$i" fingerprint "$REF" || true)" != "$src" ] || continue
  weigh "$size" "$mine" "$(on_node "$i" holds "$REF" || true)" "$LAYER_FILTER"
  if [ -n "$have" ] && [ "$have" -ge "$need" ]; then
    if [ "$held" -eq 0 ]; then
      bare+=("$i")
    elif [ "$held" -lt "$total" ]; then
      holders+=("$i")
      printf '%s\n' "$theirs" > "$SPARKVLLM_CM/held.$i"
    fi
  fi
done
chain=(); held_files=()
if [ "${#bare[@]}" -ge 2 ]; then
  chain=("${bare[@]}")
elif [ "${#holders[@]}" -ge 2 ]; then
  chain=("${holders[@]}")
  for i in "${holders[@]}"; do held_files+=("$SPARKVLLM_CM/held.$i"); done
fi
relayed=
if [ "${#chain[@]}" -ge 2 ]; then
  eval "$(ssh-agent -s)" >/dev/null
  trap 'ssh-agent -k >/dev/null 2>&1; cleanup' EXIT
  ssh-add -q "$SPARKVLLM_KEY" 2>/dev/null || {
    printf '%s: ssh-agent on %s did not take the key (it has a passphrase?); each worker'"'"'s own step streams the image from the head\n' "$REF" "$HEAD_NAME" >&2
    chain=()
  }
fi
if [ "${#chain[@]}" -ge 2 ]; then
  chain_names=()
  for i in "${chain[@]}"; do chain_names+=("${NAMES[$i]}"); done
  printf 'streaming %s %s -> (relayed hop by hop) %s\n' "$REF" "$HEAD_NAME" "${chain_names[*]}" >&2
  broken="$REF: the relay did not complete; each worker's own step sends what it lacks"
  if [ "${#held_files[@]}" -gt 0 ]; then
    printf '%s: they hold some of its layers; sending the layers not all of them hold\n' "$REF" >&2
    # The layers none of them lacks are left out; a failed read sends nothing (the
    # workers' own steps then do).
    paths=$(docker save "$REF" | python3 -c "$LAYER_FILTER" paths) || paths=
    { [ -n "$paths" ] && docker save "$REF" | python3 -c "$LAYER_FILTER" thin "$paths" "$mine" "${held_files[@]}" | send "${chain[@]}" >&2; } ||
      printf '%s\n' "$broken" >&2
  else
    docker save "$REF" | send "${chain[@]}" >&2 || printf '%s\n' "$broken" >&2
  fi
  for k in "${!chain[@]}"; do
    got=$(on_node "${chain[$k]}" fingerprint "$REF" || true)
    [ "$got" != "$src" ] || relayed+="${relayed:+,}${chain_names[$k]}"
  done
fi
echo "relayed=$relayed"
