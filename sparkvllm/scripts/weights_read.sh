#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# Prints manifest= of the weights on the node it runs on: the manifest of the resolved
# files when complete, `incomplete` when a file is missing (deleted, a dangling link).
# Changes nothing.
# revision: 1
# uses: weights
# values: REPO_DIR REVISION
snapshot "$REPO_DIR" "$REVISION"
if [ -n "$(gaps_of "$snap")" ]; then echo manifest=incomplete; else echo "manifest=$(manifest "$snap")"; fi
