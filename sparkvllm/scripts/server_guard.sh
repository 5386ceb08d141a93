#!/usr/bin/env bash
# shellcheck disable=SC2154  # the values come from render()
# The model server's liveness, as refresh reads it back: health=ok while its container
# runs and generates a token within ANSWER_S seconds (PROBE, python run inside it), or
# while it is still loading (it has not logged that its API server started: the readiness
# wait bounds that); health=bad when it stopped, gave up starting, or once served and no
# longer generates (a stuck engine: /health may still say 200). With NATIVE=1 the server
# is rank 0 of a group that cannot take a rank back: gone or started again is bad too.
# revision: 1
# uses: server_state
# values: CONTAINER NATIVE ANSWER_S PROBE GAVE_UP_MARK
if [ "$NATIVE" = 1 ]; then
  container_state "$CONTAINER"
else
  s=$(docker inspect -f '{{.State.Status}}' "$CONTAINER" 2>/dev/null || echo absent)
fi
case "$s" in
  # No container: with Ray the docker resource's own read reports it.
  absent) if [ "$NATIVE" = 1 ]; then echo health=bad; else echo health=ok; fi;;
  running)
    if gave_up_starting "$CONTAINER" "$GAVE_UP_MARK"; then
      echo health=bad
    elif timeout $((ANSWER_S + 20)) docker exec "$CONTAINER" python3 -c "$PROBE" >/dev/null 2>&1; then
      echo health=ok
    elif docker logs "$CONTAINER" 2>&1 | grep -q 'Application startup complete'; then
      echo health=bad
    else
      echo health=ok
    fi;;
  *) echo health=bad;;
esac
