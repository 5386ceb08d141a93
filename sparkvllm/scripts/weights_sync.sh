#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# Make TARGET_NAME's copy of the model equal the head's over the cluster link, moving
# only what it lacks; a no-op when the manifests of resolved files already match. Blob by
# blob: a blob the target holds whole is not sent; one cut off by an interrupted copy
# (<blob>.sparkvllm-part) is resumed where it stopped; each is checked by content on the
# target (its name is its sha256, hashed as the bytes arrive, or its git sha1) before it
# takes its name, so a named blob on a node is a verified one. The target's free space is
# checked first. The snapshot's symlink layout and refs follow (a few KB), and the
# manifests must then agree. Prints transferred=, sent= (bytes) and manifest=.
# revision: 1
# uses: peer_ssh sizes weights
# values: HEAD_NAME TARGET_NAME TARGET_ADDRESS SSH_OPTS[] MODEL_ID REPO_DIR REVISION HUB_DIR
set -euo pipefail

# On the target (on_peer): its manifest; its blobs (finished and parts); its free space.
their_manifest() { snapshot "$1" "$2"; manifest "$snap"; }
their_blobs() { cd "$1" 2>/dev/null && find . -maxdepth 1 -type f -printf '%f %s\n' || true; }
# A blob's bytes as they arrive: appended to its part, and the sha256 of the whole part
# (the bytes already there, then the new ones) computed on the way, so the check costs no
# second read and runs alongside the transfer. Args: blobs folder, name, offset.
receive() {
  local p="$1/$2.sparkvllm-part"
  { head -c "$3" "$p" 2>/dev/null || true; tee -a "$p"; } | sha256
}
# Then its size, its content (that sha256 for an LFS name, else verify_blob), and only
# then its name; exit 3 when the content is wrong. Args: blobs folder, name, size, sha256.
finish() {
  set -euo pipefail
  local p="$1/$2.sparkvllm-part"
  [ "$(stat -c %s "$p")" = "$3" ] || { echo "$2: short copy" >&2; exit 1; }
  if [[ $2 =~ ^[0-9a-f]{64}$ ]]; then
    [ "$4" = "$2" ] || { rm -f "$p"; exit 3; }
  elif [ -n "$(verify_blob "$p")" ]; then
    rm -f "$p"; exit 3
  fi
  mv -f "$p" "$1/$2"
}
unpack() { mkdir -p "$1" && tar -C "$1" -xf -; }
clear_blob() { rm -f "$1/$2" "$1/$2.sparkvllm-part"; }

open_peer
blobs="$REPO_DIR/blobs"
snapshot "$REPO_DIR" "$REVISION"
src=$(manifest "$snap")
[ -n "$src" ] || { printf 'model %s missing on %s\n' "$MODEL_ID" "$HEAD_NAME" >&2; exit 1; }
dst=$(on_peer their_manifest "$REPO_DIR" "$REVISION" || true)
sent=0
if [ "$src" != "$dst" ]; then
  printf 'copying %s %s -> %s (what it lacks)\n' "$MODEL_ID" "$HEAD_NAME" "$TARGET_NAME" >&2
  # What the target holds: finished blobs and the parts of interrupted copies.
  declare -A has=()
  while read -r f s; do [ -n "$f" ] && has[$f]=$s; done < <(on_peer their_blobs "$blobs")
  # The plan: each blob the target lacks, from the offset its part reached.
  plan=(); need=0
  while read -r b s; do
    [[ $b =~ ^[0-9a-f]+$ ]] || { printf 'not a blob name in %s: %s\n' "$blobs" "$b" >&2; exit 1; }
    [ "${has[$b]:-}" = "$s" ] && continue
    off=${has[$b.sparkvllm-part]:-0}
    [ "$off" -le "$s" ] || off=0
    plan+=("$b $s $off"); need=$((need + s - off))
  done < <(find "$blobs" -maxdepth 1 -type f ! -name '*.incomplete' ! -name '*.sparkvllm-part' -printf '%f %s\n')
  have=$(on_peer avail "$blobs")
  room "$need" "$have" "not enough disk on $TARGET_NAME for $MODEL_ID: $HUB_DIR" \
    "fix: free space there (or set model.hf_cache to a bigger disk)"
  on_peer mkdir -p "$blobs"
  for item in "${plan[@]}"; do
    read -r b s off <<< "$item"
    if [ "$off" -gt 0 ]; then
      printf 'resuming blob %s at byte %s of %s\n' "$b" "$off" "$s" >&2
    else
      on_peer clear_blob "$blobs" "$b"
    fi
    got=$(tail -c +$((off + 1)) "$blobs/$b" | on_peer receive "$blobs" "$b" "$off")
    sent=$((sent + s - off))
    rc=0; on_peer finish "$blobs" "$b" "$s" "$got" || rc=$?
    if [ "$rc" -eq 3 ]; then
      # shellcheck disable=SC2016  # `up` is a word of the message
      if [ -n "$(verify_blob "$blobs/$b")" ]; then
        printf 'a blob of %s on %s does not match its name (its checksum): the head'"'"'s copy is corrupt; fix: delete it there and re-run `up` (the download fetches it again): %s\n' "$MODEL_ID" "$HEAD_NAME" "$blobs/$b" >&2
      else
        printf 'a blob of %s arrived corrupt on %s (the head'"'"'s copy is good); fix: re-run `up` (only that blob is sent again) and check the cluster link: %s\n' "$MODEL_ID" "$TARGET_NAME" "$b" >&2
      fi
      exit 1
    elif [ "$rc" -ne 0 ]; then
      exit "$rc"
    fi
  done
  name=${REPO_DIR##*/}
  layout=("$name/snapshots/$rev")
  if [ -d "$REPO_DIR/refs" ]; then layout+=("$name/refs"); fi
  tar -C "$HUB_DIR" -cf - "${layout[@]}" | on_peer unpack "$HUB_DIR"
  dst=$(on_peer their_manifest "$REPO_DIR" "$REVISION")
  [ "$src" = "$dst" ] || {
    printf 'weights on %s differ after copy: %s != %s\n' "$TARGET_NAME" "$dst" "$src" >&2
    exit 1
  }
  echo transferred=1
else
  echo transferred=0
fi
echo "sent=$sent"
echo "manifest=$dst"
