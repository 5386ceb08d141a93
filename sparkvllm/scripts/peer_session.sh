#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# A session on the head with the steps' own connection to TARGET_NAME open (lib/peer_ssh:
# the key on stdin, the host key pinned, `remote CMD...` reaches the node). bench/ appends
# the raw pipe it measures beside the program's transfers.
# revision: 1
# uses: peer_ssh
# values: HEAD_NAME TARGET_NAME TARGET_ADDRESS SSH_OPTS[]
set -euo pipefail
open_peer
