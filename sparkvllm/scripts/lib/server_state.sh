#!/usr/bin/env bash
# What a container of the stack is doing, as the guards and the readiness wait read it.
# revision: 1

# A rank of the native launcher started again after it was created (its node restarted,
# or it crashed and docker restarted it) left the group it formed: vLLM cannot take a rank
# back. Docker creates and starts a container seconds apart; 120 s missed a node restarted
# 90 s after its rank was created (seen on the sim), so 30.
RESTART_MARGIN_S=30

# container_state NAME: sets $s to absent, running, restarted (running, but started again
# well after it was created) or docker's other states.
container_state() {
  local created started up
  read -r s created started < <(docker inspect -f '{{.State.Status}} {{.Created}} {{.State.StartedAt}}' "$1" 2>/dev/null || echo absent)
  up=$(( $(date -d "$started" +%s) - $(date -d "$created" +%s) ))
  if [ "$s" = running ] && [ "$up" -gt "$RESTART_MARGIN_S" ]; then s=restarted; fi
}

# gave_up_starting NAME MARK: the model server gave up starting (its entrypoint's bound on
# starts; MARK is the line it then logs), so it stays down by itself.
gave_up_starting() {
  docker logs --tail 5 "$1" 2>&1 | grep -qF "$2"
}
