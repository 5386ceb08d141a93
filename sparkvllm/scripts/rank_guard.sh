#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# A worker rank's liveness (native launcher), as refresh reads it back on its node:
# health=bad when its container is gone, stopped or started again since it joined the
# group (a hung rank shows as rank 0 no longer answering: the server guard).
# revision: 1
# uses: server_state
# values: CONTAINER
container_state "$CONTAINER"
if [ "$s" = running ]; then echo health=ok; else echo health=bad; fi
