#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# For the drift check: weights.manifest= and weights.gaps= on the node it runs on (its
# weights gone incomplete, or differing from the head's). Changes nothing.
# revision: 1
# uses: weights
# values: REPO_DIR REVISION
snapshot "$REPO_DIR" "$REVISION"
echo "weights.manifest=$(manifest "$snap")"
echo "weights.gaps=$(gaps_of "$snap")"
