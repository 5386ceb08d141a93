#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# Wait for the model server to load and answer (probes/server_health.py on stdin, run
# inside its container), then print its health JSON and the NCCL it runs with. Each try
# is watched (TRY_S: the probe's own bounds, four 10 s reads and a 300 s first token,
# with room): an exec into a container restarted under it can hang for good.
# revision: 1
# uses: probe_loop server_state nccl_report
# values: CONTAINER PROBE_ARGS[] BUDGET TRY_S GAVE_UP_MARK
set -uo pipefail
gave_up() { gave_up_starting "$CONTAINER" "$GAVE_UP_MARK"; }
on_success() { nccl_transport "$CONTAINER"; nccl_loaded "$CONTAINER"; }
probe_loop "$BUDGET" "model server" 0 "$TRY_S"
