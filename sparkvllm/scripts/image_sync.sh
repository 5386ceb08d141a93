#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# The image REF from the head to TARGET_NAME over the cluster link, when it differs
# there (by fingerprint). When the target holds some of the image's layers (an earlier
# version, the same base), only the others are sent (LAYER_FILTER: probes/image_layers.py,
# `docker save` read once for its layer files, then again without the held ones), and the
# whole image if that load does not give the head's fingerprint. The target's free space
# is checked first. Nothing is staged on disk; the stream goes over connections of its
# own, as many at once as the head has cores (at most MAX_STREAMS), with a cipher fast on
# this CPU, cut into chunks and put back in order on the target (lib/peer_ssh
# stripe_to_peer, probes/stripe.py). Prints transferred=0|1, id= (the target's image ID)
# and fingerprint=.
# revision: 3
# uses: peer_ssh sizes image
# values: HEAD_NAME TARGET_NAME TARGET_ADDRESS SSH_OPTS[] REF LAYER_FILTER STRIPE MAX_STREAMS
set -euo pipefail
# load_there: stdin (a `docker save` archive, whole or thin) into the target's docker load.
load_there() { stripe_to_peer "$streams" "$STRIPE" "docker load"; }
open_peer
# `|| true`: an absent image must reach the message below, not end the script silently.
src=$(fingerprint "$REF" || true)
[ -n "$src" ] || { printf 'image %s is missing on %s\n' "$REF" "$HEAD_NAME" >&2; exit 1; }
dst=$(on_peer fingerprint "$REF" || true)
if [ "$src" != "$dst" ]; then
  streams=$(bulk_streams)
  size=$(docker image inspect -f '{{.Size}}' "$REF")
  mine=$(docker image inspect -f '{{json .RootFS.Layers}}' "$REF") || mine=
  weigh "$size" "$mine" "$(on_peer holds "$REF" || true)" "$LAYER_FILTER"
  [ -z "$have" ] || room "$need" "$have" "not enough disk on $TARGET_NAME for the image $REF: docker's data root" \
    "fix: free space there (docker image prune; or move docker's data-root to a bigger disk)"
  dst=
  if [ "$held" -gt 0 ]; then
    if [ "$held" -eq "$total" ]; then
      # Every layer held (an untagged or re-tagged copy): one read, no layer sent.
      docker save "$REF" | python3 -c "$LAYER_FILTER" thin-all "$mine" | load_there >&2 || true
    else
      printf '%s: %s holds %s of its layers; sending the others\n' "$REF" "$TARGET_NAME" "$held" >&2
      paths=$(docker save "$REF" | python3 -c "$LAYER_FILTER" paths) || paths=
      [ -z "$paths" ] || docker save "$REF" | python3 -c "$LAYER_FILTER" thin "$paths" "$mine" <(printf '%s\n' "$theirs") | load_there >&2 || true
    fi
    dst=$(on_peer fingerprint "$REF" || true)
    [ "$src" = "$dst" ] || printf '%s: loading only the missing layers on %s did not give the head'"'"'s image; sending it whole\n' "$REF" "$TARGET_NAME" >&2
  fi
  if [ "$src" != "$dst" ]; then
    printf 'streaming %s %s -> %s\n' "$REF" "$HEAD_NAME" "$TARGET_NAME" >&2
    docker save "$REF" | load_there >&2
    dst=$(on_peer fingerprint "$REF")
  fi
  [ "$src" = "$dst" ] || {
    printf 'image %s on %s differs after transfer: %s != %s\n' "$REF" "$TARGET_NAME" "$dst" "$src" >&2
    exit 1
  }
  echo transferred=1
else
  echo transferred=0
fi
echo "id=$(remote "docker image inspect --format '{{.Id}}' $(sq "$REF")")"
echo "fingerprint=$dst"
