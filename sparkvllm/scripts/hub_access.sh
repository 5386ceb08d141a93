#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# Preflight on the head: can it download the model? PROBE (probes/hub_access.py) prints
# the hub's verdict and, for a bad one, exits 1 with its line from PROBLEMS (verdict ->
# the line with its fix). Its stdin is the hf_token (empty when the stack has none). With
# COPY_FROM_HEAD=1 a complete snapshot on the head is all the nodes need from the hub:
# then the hub is not asked.
# revision: 1
# uses: weights
# values: HEAD_NAME COPY_FROM_HEAD REPO_DIR REVISION HUB_ENDPOINT MODEL_ID PROBLEMS PROBE
set -euo pipefail
if [ "$COPY_FROM_HEAD" = 1 ]; then
  snapshot "$REPO_DIR" "$REVISION"
  if [ -z "$(gaps_of "$snap")" ]; then echo '{"hub": "not-needed"}'; exit 0; fi
fi
command -v python3 >/dev/null || {
  printf '%s: no python3 to ask the hub with; fix: install python3 there\n' "$HEAD_NAME" >&2
  exit 1
}
python3 -c "$PROBE" "$HUB_ENDPOINT" "$MODEL_ID" "$REVISION" "$PROBLEMS"
