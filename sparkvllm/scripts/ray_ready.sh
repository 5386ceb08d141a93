#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# Wait until Ray reports every node (by its cluster IP) and every GPU, from inside the Ray
# head container: probes/ray_members.py arrives on stdin, and drains any node not in the
# stack. A raylet that died counts as dead at once in the probe (its port refuses), and its
# replacement registers seconds after its container starts: an answer unchanged for
# SETTLE_S seconds (two tries in a row) names the raylets that will last. The budget is
# $WAIT_S, given at run time: a new budget is not a new step.
# revision: 1
# uses: probe_loop
# values: CONTAINER PROBE_ARGS[] SETTLE_S
set -uo pipefail
gave_up() { return 1; }
on_success() { :; }
probe_loop "${WAIT_S:?the wait budget}" "ray cluster" "$SETTLE_S" 0
