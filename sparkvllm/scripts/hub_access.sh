#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# Preflight on the head: can it download the model, and how big are its weights? PROBE
# (probes/hub_access.py) prints the hub's verdict with the size of the revision's files
# (the memory plan's figure, before anything is downloaded) and, for a bad verdict, exits 1
# with its line from PROBLEMS (verdict -> the line with its fix). Its stdin is the hf_token
# (empty when the stack has none). With COPY_FROM_HEAD=1 a complete snapshot on the head is
# all the nodes need from the hub, and with OFFLINE=1 the hub is never asked: then the
# snapshot's own size is the figure (0, not known, when it is incomplete: the download
# step names what is missing).
# revision: 2
# uses: weights
# values: HEAD_NAME COPY_FROM_HEAD OFFLINE REPO_DIR REVISION HUB_ENDPOINT MODEL_ID PROBLEMS PROBE
set -euo pipefail
if [ "$COPY_FROM_HEAD" = 1 ] || [ "$OFFLINE" = 1 ]; then
  snapshot "$REPO_DIR" "$REVISION"
  if [ -z "$(gaps_of "$snap")" ]; then
    printf '{"hub": "not-needed", "bytes": %s}\n' "$(snapshot_bytes "$snap")"
    exit 0
  fi
  if [ "$OFFLINE" = 1 ]; then echo '{"hub": "offline", "bytes": 0}'; exit 0; fi
fi
command -v python3 >/dev/null || {
  printf '%s: no python3 to ask the hub with; fix: install python3 there\n' "$HEAD_NAME" >&2
  exit 1
}
python3 -c "$PROBE" "$HUB_ENDPOINT" "$MODEL_ID" "$REVISION" "$PROBLEMS"
