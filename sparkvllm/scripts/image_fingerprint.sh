#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# Prints fingerprint= of the image REF on the node it runs on (empty when absent).
# Changes nothing.
# revision: 1
# uses: image
# values: REF
echo "fingerprint=$(fingerprint "$REF" || true)"
