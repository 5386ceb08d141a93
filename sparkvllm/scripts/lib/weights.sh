#!/usr/bin/env bash
# shellcheck disable=SC2034  # snapshot sets $repo, $rev and $snap for its caller
# The model's weights in a node's HF cache: complete means the RESOLVED files are there
# (config.json, every file the snapshot links to, every shard a weight index names), not
# just the cache's symlink layout. An interrupted download or a copy of the layout alone
# leaves dangling links: missing files here, never a success.
# revision: 1

# A blob whose copy is in progress is named <blob>.sparkvllm-part (not part of its name).

# snapshot REPO_DIR REVISION: sets $repo, $rev (resolved through refs/) and $snap.
snapshot() {
  repo=$1
  rev=$2
  if [ -f "$repo/refs/$rev" ]; then rev=$(cat "$repo/refs/$rev"); fi
  snap="$repo/snapshots/$rev"
}

# manifest DIR: the sha256 of "path size" lines of the resolved files, sorted; nothing
# when DIR is absent. A dangling symlink is not a regular file under -L: it changes this.
manifest() {
  [ -d "$1" ] || return 0
  (cd "$1" && find -L . -type f -printf '%P %s\n' | LC_ALL=C sort | sha256sum | cut -c1-64)
}

# snapshot_bytes DIR: the size of the resolved files, in bytes (0 when DIR is absent).
snapshot_bytes() {
  [ -d "$1" ] || { echo 0; return 0; }
  find -L "$1" -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}'
}

# incomplete DIR: the files the snapshot needs but lacks, one a line: config.json,
# dangling symlinks, and any shard a weight index names that is not there.
incomplete() {
  [ -f "$1/config.json" ] || echo config.json
  [ -d "$1" ] || return 0
  find "$1" -xtype l -printf '%P\n'
  local idx f
  for idx in "$1"/*.index.json; do
    [ -f "$idx" ] || continue
    grep -o '"[^"]*\.\(safetensors\|bin\)"' "$idx" | tr -d '"' | sort -u |
      while read -r f; do [ -f "$1/$f" ] || echo "$f"; done || true
  done
}

# gaps_of DIR: the first five gaps on one line (awk reads all: no SIGPIPE under pipefail).
gaps_of() {
  incomplete "$1" | awk 'NR <= 5' | tr '\n' ' '
}

# sha256: the sha256 of stdin, as hex; openssl's where there is one (it uses the CPU's
# SHA instructions, x86 SHA-NI or Arm's SHA2 extensions: 5x coreutils' here).
sha256() {
  if command -v openssl >/dev/null 2>&1; then openssl dgst -sha256 -r; else sha256sum; fi | cut -c1-64
}

# verify_blob FILE: prints the blob's name when its content does not match it. The HF
# cache names an LFS file's blob by its sha256 and any other file's by its git blob sha1,
# so the name is the checksum (a name of neither form is checked by size only).
verify_blob() {
  local f=$1 b
  b=${1##*/}
  b=${b%.sparkvllm-part}
  if [[ $b =~ ^[0-9a-f]{64}$ ]]; then
    [ "$(sha256 < "$f")" = "$b" ] || echo "$b"
  elif [[ $b =~ ^[0-9a-f]{40}$ ]]; then
    [ "$({ printf 'blob %s\0' "$(stat -c %s "$f")"; cat "$f"; } | sha1sum | cut -c1-40)" = "$b" ] || echo "$b"
  fi
}

# verify_all DIR: every finished blob of DIR hashed, on every core: the names that differ.
verify_all() {
  [ -d "$1" ] || return 0
  find "$1" -maxdepth 1 -type f ! -name '*.incomplete' ! -name '*.sparkvllm-part' -print0 |
    xargs -0 -r -P "$(nproc)" -n 1 bash -c "$(declare -f sha256 verify_blob); verify_blob \"\$1\"" _
}
