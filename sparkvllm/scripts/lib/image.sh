#!/usr/bin/env bash
# shellcheck disable=SC2034  # weigh sets need, have, theirs, held and total for its caller
# The image as the steps compare it across nodes and send it between them.
# revision: 1
# uses: sizes

# fingerprint REF: the image's identity independent of the storage driver (sha256 of its
# layers and the config that decides what runs), or nothing when it is absent. `.Id`
# differs between graph drivers and the containerd store: comparing IDs would send a
# multi-GB image again on every run.
fingerprint() {
  local f
  f=$(docker image inspect --format '{{json .RootFS.Layers}}{{json .Config.Entrypoint}}{{json .Config.Cmd}}{{json .Config.Env}}' "$1" 2>/dev/null) &&
    printf '%s' "$f" | sha256sum | cut -c1-64
}

# holds REF (on a target): a first line `OLD HAVE`, the size of what REF names there (0
# when absent) and the bytes free in docker's data root (empty when docker cannot say
# where that is); then every image's layers there, one JSON list a line.
holds() {
  local old have ids
  old=$(docker image inspect -f '{{.Size}}' "$1" 2>/dev/null) || old=0
  have=$(avail "$(docker info -f '{{.DockerRootDir}}')") || have=
  printf '%s %s\n' "${old:-0}" "$have"
  ids=$(docker image ls -q)
  # shellcheck disable=SC2086  # one word an image ID
  [ -z "$ids" ] || docker image inspect -f '{{json .RootFS.Layers}}' $ids || true
}

# weigh SIZE MINE HOLDS FILTER (on the head): from the image's size and layers here and
# what `holds` printed on a target, sets `need` (what docker load takes in its data root:
# it unpacks the whole archive before it stores the layers the node lacks, so the image's
# size plus what it adds), `have` (free there; empty if docker could not say), `theirs`
# (the target's layers) and `held` of the image's `total` layers (what it holds already:
# an earlier version, an image on the same base; FILTER: probes/image_layers.py).
weigh() {
  local size=$1 mine=$2 old
  read -r old have <<< "$(head -n 1 <<< "$3")"
  old=${old:-0}
  need=$((size + (size > old ? size - old : 0)))
  theirs=$(tail -n +2 <<< "$3")
  held=0; total=0
  if [ -n "$mine" ] && [ -n "$theirs" ] && command -v python3 >/dev/null; then
    read -r held total < <(python3 -c "$4" held "$mine" <(printf '%s\n' "$theirs") || echo 0 0) || true
  fi
}
