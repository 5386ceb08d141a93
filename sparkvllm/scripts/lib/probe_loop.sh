#!/usr/bin/env bash
# shellcheck disable=SC2154  # CONTAINER and PROBE_ARGS come from render()
# A readiness wait: feed the probe arriving on stdin to `python3 -` inside $CONTAINER
# (arguments PROBE_ARGS) until it exits 0 and gives the same answer for SETTLE seconds;
# then print its last line and call on_success. Progress every 30 s on stderr; the wait
# is bounded by BUDGET seconds, and stops at once when the container is not running (or
# gave_up, the caller's, says it stays down by itself).
# revision: 1

# One watched try ($out, $rc): it ends when the probe does, when the container is no
# longer the one it entered (stopped, or started again: an exec into it can then hang
# for good), or after $1 seconds; checked every second.
watched_try() {
  local limit=$1 was now try t=0
  was=$(docker inspect -f '{{.State.Status}} {{.State.StartedAt}}' "$CONTAINER" 2>/dev/null || echo absent)
  docker exec -i "$CONTAINER" python3 - "${PROBE_ARGS[@]}" < "$probe" > "$probe.out" 2>/dev/null &
  try=$!
  while kill -0 "$try" 2>/dev/null; do
    sleep 1; t=$((t + 1))
    now=$(docker inspect -f '{{.State.Status}} {{.State.StartedAt}}' "$CONTAINER" 2>/dev/null || echo absent)
    if [ "$now" != "$was" ] || [ "$t" -ge "$limit" ]; then kill "$try" 2>/dev/null; fi
  done
  wait "$try"; rc=$?; out=$(cat "$probe.out")
}

# probe_loop BUDGET WHAT SETTLE TRY: WHAT names the wait in its messages; TRY > 0 watches
# each try (watched_try), 0 runs it plainly.
probe_loop() {
  local budget=$1 what=$2 settle=$3 try_s=$4 deadline next state settled='' since=0
  probe=$(mktemp); trap 'rm -f "$probe" "$probe.out"' EXIT; cat > "$probe"
  deadline=$((SECONDS + budget)); next=$((SECONDS + 30))
  while :; do
    state=$(docker inspect -f '{{.State.Status}}' "$CONTAINER" 2>/dev/null || echo absent)
    if gave_up; then state=gave-up; fi
    if [ "$state" != running ]; then
      printf '%s is not running (%s); last logs:\n' "$CONTAINER" "$state" >&2
      docker logs --tail 40 "$CONTAINER" >&2 2>&1 || true
      exit 1
    fi
    if [ "$try_s" -gt 0 ]; then
      watched_try "$try_s"
    else
      out=$(docker exec -i "$CONTAINER" python3 - "${PROBE_ARGS[@]}" < "$probe" 2>/dev/null)
      rc=$?
    fi
    if [ "$rc" -eq 0 ]; then
      if [ "$out" != "$settled" ]; then settled=$out; since=$SECONDS; fi
      if [ $((SECONDS - since)) -ge "$settle" ]; then
        printf '%s\n' "$out" | tail -n 1
        on_success
        exit 0
      fi
    else
      settled=
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      printf '%s: not ready after %ss; last answer: %s; last logs:\n' "$what" "$budget" "$out" >&2
      docker logs --tail 40 "$CONTAINER" >&2 2>&1 || true
      exit 1
    fi
    if [ "$SECONDS" -ge "$next" ]; then
      printf '%s: waiting (%s s): %s\n' "$what" "$SECONDS" \
        "$(docker logs --tail 1 "$CONTAINER" 2>&1 | cut -c1-160)" >&2
      next=$((SECONDS + 30))
    fi
    sleep 3
  done
}
