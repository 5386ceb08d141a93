#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# Ray's membership as refresh reads it back, from inside the Ray head container
# (probes/ray_members.py on stdin): the raylets Ray reports now, by ID. A restarted head
# or node has new ones (vLLM's Ray workers died with the old ones). Changes nothing.
# revision: 1
# values: CONTAINER PROBE_ARGS[]
docker exec -i "$CONTAINER" python3 - "${PROBE_ARGS[@]}" || true
