#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# Make TARGET_NAME's copy of the model equal the head's over the cluster link, moving
# only what it lacks; a no-op when the manifests of resolved files already match. Blob by
# blob: a blob the target holds whole is not sent; one cut off by an interrupted copy
# (<blob>.sparkvllm-part) is resumed where it stopped; each is checked by content on the
# target (its name is its sha256, hashed as the bytes arrive, or its git sha1) before it
# takes its name, so a named blob on a node is a verified one. The target's free space is
# checked first. Several blobs move at once, the largest first, each over a connection of
# its own with a cipher fast on this CPU (lib/peer_ssh stream_to_peer), taken and checked
# on the target in that one session: as many as the head has cores and half as many as
# the target has (it deciphers, writes and hashes), at most MAX_STREAMS (a small blob goes
# over the step's shared connection); each is written and hashed on the target by one process as it arrives (probes/stripe.py
# join: no pipe between the connection and the disk). With fewer big blobs than that (a
# model of one or two big shards, beside its small files), each big one goes over
# several connections, whose stdin that process reads back in order (stripe_to_peer).
# The snapshot's symlink layout and refs follow (a few KB), and the manifests must then
# agree. Besides the transfers, two calls: what the target holds (its manifest with it),
# and the layout unpacked with the manifest read after. Prints transferred=, sent=
# (bytes), streams= and manifest=.
# revision: 5
# uses: peer_ssh sizes weights
# values: HEAD_NAME TARGET_NAME TARGET_ADDRESS SSH_OPTS[] MODEL_ID REPO_DIR REVISION HUB_DIR MAX_STREAMS STRIPE
set -euo pipefail
SMALL=$((64 << 20))  # a small blob under this many bytes goes over the shared connection

# On the target (on_peer), in one call: its manifest (a `manifest M` line, M empty when
# it has none), its blobs (finished and parts, `name size` lines), its free space there
# (an `avail N` line) and its cores (`cores N`). Args: repo folder, revision, blobs folder.
their_state() {
  snapshot "$1" "$2"
  echo "manifest $(manifest "$snap")"
  (cd "$3" 2>/dev/null && find . -maxdepth 1 -type f -printf '%f %s\n') || true
  echo "avail $(avail "$3")"
  echo "cores $(nproc 2>/dev/null || echo 2)"
}
# On the target: the snapshot's layout (a tar on stdin) unpacked into the hub folder,
# then its manifest. Args: hub folder, repo folder, revision.
unpack() { mkdir -p "$1" && tar -C "$1" -xf - && snapshot "$2" "$3" && manifest "$snap"; }
# On the target, in the blob's own session: its bytes as they arrive, appended to its
# part (a new part when OFFSET is 0), the sha256 of the whole part computed on the way
# (the bytes already there, then the new ones: the check costs no second read and runs
# alongside the transfer); then its size, its content (that sha256 for an LFS name, else
# verify_blob), and only then its name. The bytes come from SOURCE: `-` (stdin), or the
# folder where the blob's connections are handed to the joiner (lib/bulk stripe). With
# python3 (3.9 or later), PROBE (probes/stripe.py) joins, writes and hashes in one process; without,
# the stream goes through tee to sha256. Exit 3 when the content is wrong. Args: blobs
# folder, name, size, offset, probe, source.
take() {
  set -euo pipefail
  local p="$1/$2.sparkvllm-part" got
  mkdir -p "$1"
  [ "$4" -gt 0 ] || rm -f "$1/$2" "$p"
  if python3 -c 'import socket; socket.send_fds' 2>/dev/null; then
    got=$(python3 -c "$5" join "$6" --into "$p" --at "$4")
  else
    got=$({ head -c "$4" "$p" 2>/dev/null || true; tee -a "$p"; } | sha256)
  fi
  [ "$(stat -c %s "$p")" = "$3" ] || { echo "$2: short copy" >&2; exit 1; }
  if [[ $2 =~ ^[0-9a-f]{64}$ ]]; then
    [ "$got" = "$2" ] || { rm -f "$p"; exit 3; }
  elif [ -n "$(verify_blob "$p")" ]; then
    rm -f "$p"; exit 3
  fi
  mv -f "$p" "$1/$2"
}

# On the head: one finished blob copy reaped (its failure kept in $failed). `wait -n`
# says 127 when bash already reaped every job (a race of bash's own): then none is left
# running; a failure lost that way still fails the step at the manifest check.
reap() {
  local rc=0
  wait -n || rc=$?
  if [ "$rc" -eq 127 ]; then
    running=0
  else
    [ "$rc" -eq 0 ] || failed=$rc
    running=$((running - 1))
  fi
}

# On the head: one blob to the target over CONNECTIONS of its own (stripe_to_peer: one
# is a plain stream, ssh reading the blob's file itself), or over the step's shared
# connection (CONNECTIONS 0: no handshake of its own, for a small one), from the offset
# its part reached there. Args: name, size, offset, connections.
send_blob() {
  local b=$1 s=$2 off=$3 call rc=0 via
  call=$(function_call take "$blobs" "$b" "$s" "$off" "$STRIPE")
  if [ "$4" -eq 0 ]; then via=(remote "$call -"); else via=(stripe_to_peer "$4" "$STRIPE" "$call" joins); fi
  if [ "$off" -gt 0 ]; then
    printf 'resuming blob %s at byte %s of %s\n' "$b" "$off" "$s" >&2
    tail -c +$((off + 1)) "$blobs/$b" | "${via[@]}" || rc=$?
  else
    "${via[@]}" < "$blobs/$b" || rc=$?
  fi
  if [ "$rc" -eq 3 ]; then
    # shellcheck disable=SC2016  # `up` is a word of the message
    if [ -n "$(verify_blob "$blobs/$b")" ]; then
      printf 'a blob of %s on %s does not match its name (its checksum): the head'"'"'s copy is corrupt; fix: delete it there and re-run `up` (the download fetches it again): %s\n' "$MODEL_ID" "$HEAD_NAME" "$blobs/$b" >&2
    else
      printf 'a blob of %s arrived corrupt on %s (the head'"'"'s copy is good); fix: re-run `up` (only that blob is sent again) and check the cluster link: %s\n' "$MODEL_ID" "$TARGET_NAME" "$b" >&2
    fi
    return 1
  fi
  return "$rc"
}

open_peer
blobs="$REPO_DIR/blobs"
snapshot "$REPO_DIR" "$REVISION"
src=$(manifest "$snap")
[ -n "$src" ] || { printf 'model %s missing on %s\n' "$MODEL_ID" "$HEAD_NAME" >&2; exit 1; }
# What the target holds: its manifest, finished blobs and the parts of interrupted copies.
declare -A has=(); have=; dst=; cores=
while read -r f s; do
  case $f in
    manifest) dst=$s ;;
    avail) have=$s ;;
    cores) cores=$s ;;
    ?*) has[$f]=$s ;;
  esac
done < <(on_peer their_state "$REPO_DIR" "$REVISION" "$blobs" || true)
sent=0
if [ "$src" != "$dst" ]; then
  printf 'copying %s %s -> %s (what it lacks)\n' "$MODEL_ID" "$HEAD_NAME" "$TARGET_NAME" >&2
  # The plan: each blob the target lacks, from the offset its part reached.
  plan=(); need=0
  while read -r b s; do
    [[ $b =~ ^[0-9a-f]+$ ]] || { printf 'not a blob name in %s: %s\n' "$blobs" "$b" >&2; exit 1; }
    [ "${has[$b]:-}" = "$s" ] && continue
    off=${has[$b.sparkvllm-part]:-0}
    [ "$off" -le "$s" ] || off=0
    plan+=("$b $s $off"); need=$((need + s - off))
  done < <(find "$blobs" -maxdepth 1 -type f ! -name '*.incomplete' ! -name '*.sparkvllm-part' -printf '%f %s\n')
  room "$need" "$have" "not enough disk on $TARGET_NAME for $MODEL_ID: $HUB_DIR" \
    "fix: free space there (or set model.hf_cache to a bigger disk)"
  streams=$(bulk_streams "$cores")
  # Fewer big blobs than streams (a model of one or two big shards): each over several.
  # Big: at least a sixteenth of the largest left to send. The small ones (config,
  # tokenizer) count for none: they are done in a moment.
  big=0; largest=0
  for item in "${plan[@]}"; do
    read -r _ s off <<< "$item"
    [ $((s - off)) -le "$largest" ] || largest=$((s - off))
  done
  for item in "${plan[@]}"; do
    read -r _ s off <<< "$item"
    [ $((16 * (s - off))) -lt "$largest" ] || big=$((big + 1))
  done
  per=$((streams / (big > 0 ? big : 1)))
  [ "$per" -ge 1 ] || per=1
  # The largest first, up to `streams` at once; after a failed one, those under way
  # finish (a part resumes next time where it stopped) and no other starts.
  failed=0; running=0
  while read -r left b s off; do
    if [ $((16 * left)) -lt "$largest" ] && [ "$left" -lt "$SMALL" ]; then
      # A small one (under SMALL bytes; they come last): over the shared connection, here
      # and now, beside the big ones under way: it takes no stream and waits for none.
      [ "$failed" -ne 0 ] || send_blob "$b" "$s" "$off" 0 || failed=$?
      continue
    fi
    if [ "$running" -ge "$streams" ]; then
      reap
    fi
    [ "$failed" -eq 0 ] || break
    if [ $((16 * left)) -lt "$largest" ]; then
      send_blob "$b" "$s" "$off" 1 &
    else
      send_blob "$b" "$s" "$off" "$per" &
    fi
    running=$((running + 1))
  done < <(for item in "${plan[@]}"; do
    read -r b s off <<< "$item"
    echo "$((s - off)) $b $s $off"
  done | sort -rn)
  while [ "$running" -gt 0 ]; do reap; done
  [ "$failed" -eq 0 ] || exit "$failed"
  sent=$need
  name=${REPO_DIR##*/}
  layout=("$name/snapshots/$rev")
  if [ -d "$REPO_DIR/refs" ]; then layout+=("$name/refs"); fi
  dst=$(tar -C "$HUB_DIR" -cf - "${layout[@]}" | on_peer unpack "$HUB_DIR" "$REPO_DIR" "$REVISION")
  [ "$src" = "$dst" ] || {
    printf 'weights on %s differ after copy: %s != %s\n' "$TARGET_NAME" "$dst" "$src" >&2
    exit 1
  }
  echo transferred=1
else
  echo transferred=0
fi
echo "sent=$sent"
echo "streams=${streams:-0}"
echo "manifest=$dst"
