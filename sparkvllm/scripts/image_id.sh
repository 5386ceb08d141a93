#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# Prints id= of the image REF on the node it runs on (empty when absent). Changes nothing.
# revision: 1
# values: REF
echo "id=$(docker image inspect --format '{{.Id}}' "$REF" 2>/dev/null || true)"
