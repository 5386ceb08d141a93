#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# Make the model's weights complete in this node's HF cache (a no-op when they are):
# blobs whose content does not match their names go first (offline: an error naming
# them), then what is missing is downloaded with the image's own huggingface_hub into the
# mounted cache (it fetches only what is missing); offline, an incomplete snapshot is an
# error naming the missing files. With TOKEN=1 the first line of stdin is the hf_token
# (empty when the stack has none), handed to the container by name, on no command line.
# HUB_ENDPOINT: a mirror, or empty for the hub itself. Prints manifest=, files= and bytes=.
# revision: 1
# uses: weights
# values: NODE_NAME MODEL_ID REVISION REPO_DIR HF_CACHE HF_HOME_IN IMAGE OFFLINE TOKEN HUB_ENDPOINT
set -euo pipefail
where="model $MODEL_ID@$REVISION in $HF_CACHE on $NODE_NAME"
hub_env=()
if [ "$TOKEN" = 1 ]; then
  IFS= read -r HF_TOKEN || true
  export HF_TOKEN
  hub_env+=(-e HF_TOKEN)
fi
if [ -n "$HUB_ENDPOINT" ]; then hub_env+=(-e "HF_ENDPOINT=$HUB_ENDPOINT"); fi
snapshot "$REPO_DIR" "$REVISION"
mapfile -t bad < <(verify_all "$repo/blobs")
if [ "${#bad[@]}" -gt 0 ]; then
  if [ "$OFFLINE" = 1 ]; then
    printf '%s: blobs do not match their names (checksums) and model.offline is true; fix: restore them (or set model.offline: false to download them again): %s\n' "$where" "${bad[*]}" >&2
    exit 1
  fi
  printf '%s: removing blobs that do not match their checksums: %s\n' "$where" "${bad[*]}" >&2
  (cd "$repo/blobs" && rm -f -- "${bad[@]}")
fi
gaps=$(gaps_of "$snap")
if [ -n "$gaps" ]; then
  if [ "$OFFLINE" = 1 ]; then
    printf '%s is incomplete and model.offline is true; fix: complete the files there (or set model.offline: false to let it download). Missing: %s\n' "$where" "$gaps" >&2
    exit 1
  fi
  docker run --rm --entrypoint python3 -v "$HF_CACHE:$HF_HOME_IN" -e "HF_HOME=$HF_HOME_IN" "${hub_env[@]}" "$IMAGE" \
    -c 'import sys; from huggingface_hub import snapshot_download as d; print(d(sys.argv[1], revision=sys.argv[2]))' \
    "$MODEL_ID" "$REVISION" >&2
  snapshot "$REPO_DIR" "$REVISION"
  gaps=$(gaps_of "$snap")
  [ -z "$gaps" ] || {
    printf '%s is still incomplete after the download; fix: check the revision and the disk, then re-run. Missing: %s\n' "$where" "$gaps" >&2
    exit 1
  }
  mapfile -t bad < <(verify_all "$repo/blobs")
  [ "${#bad[@]}" -eq 0 ] || {
    printf '%s: downloaded blobs do not match their names (checksums); fix: check the hub endpoint and the disk, then re-run: %s\n' "$where" "${bad[*]}" >&2
    exit 1
  }
fi
echo "manifest=$(manifest "$snap")"
echo "files=$(find -L "$snap" -type f | wc -l)"
echo "bytes=$(snapshot_bytes "$snap")"
