#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# The name the containers run the image by, on the head: REF (the config's local name) as
# name=, with the image's ID and each registry digest it carries (digest=repo@sha256:...).
# revision: 1
# values: REF
set -euo pipefail
echo "name=$REF"
echo "id=$(docker image inspect --format '{{.Id}}' "$REF")"
docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$REF" | sed -n 's/^./digest=&/p'
