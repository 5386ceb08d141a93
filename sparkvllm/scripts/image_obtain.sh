#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# Get the image onto the head exactly once, as LOCAL (the name the containers run it by):
# pull REF, load TARBALL, or require it (SOURCE: pull, tarball or present). A
# digest-pinned reference (PINNED: repo@sha256:..., else empty) is then tagged LOCAL and
# checked to carry that digest. Prints id= and fingerprint=.
# revision: 1
# uses: image
# values: HEAD_NAME REF LOCAL SOURCE TARBALL PINNED
set -euo pipefail
absent() {
  printf 'image %s is not present on %s; fix: load it there or set image.source to pull or tarball\n' "$REF" "$HEAD_NAME" >&2
  exit 1
}
if ! docker image inspect "$LOCAL" >/dev/null 2>&1; then
  case "$SOURCE" in
    pull) docker pull "$REF" >&2 ;;
    tarball)
      test -r "$TARBALL" || {
        printf 'image tarball %s is not readable on %s; fix: copy it there or correct image.tarball\n' "$TARBALL" "$HEAD_NAME" >&2
        exit 1
      }
      docker load -i "$TARBALL" >&2
      docker image inspect "$REF" >/dev/null 2>&1 || {
        printf 'tarball %s does not contain %s; fix: set image.ref to the tag inside the tarball\n' "$TARBALL" "$REF" >&2
        exit 1
      }
      ;;
    # Present: a pinned image may be there under its reference (then named here).
    *) if [ -n "$PINNED" ]; then docker image inspect "$REF" >/dev/null 2>&1 || absent; else absent; fi ;;
  esac
  if [ -n "$PINNED" ]; then docker tag "$REF" "$LOCAL"; fi
fi
if [ -n "$PINNED" ]; then
  docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$LOCAL" | grep -qxF "$PINNED" || {
    printf 'image %s on %s is not %s; fix: remove that tag there (docker rmi) and run up again\n' "$LOCAL" "$HEAD_NAME" "$PINNED" >&2
    exit 1
  }
fi
echo "id=$(docker image inspect --format '{{.Id}}' "$LOCAL")"
echo "fingerprint=$(fingerprint "$LOCAL")"
