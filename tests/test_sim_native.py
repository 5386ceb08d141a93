"""vLLM's own multi-node launcher (parallelism.launcher: native) on the SIMULATED cluster:
a live Ray TP=2 stack switched to native by one `up` (nothing of Ray left on the nodes),
answering the same tokens as Ray TP=2; a worker rank lost, and then the worker node
restarted, each found by `preview --refresh` and healed by one `up` that replaces the
whole group (vLLM cannot take a rank back); then destroyed. The sim image holds Ray, so
`auto` runs Ray there (tests/test_launcher.py covers an image without it)."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest

from sparkvllm.remote import run_ssh
from sparkvllm.specs.containers import container_name
from tests import sim_stack as stack
from tests.conftest import sim_complete, sim_log

pytestmark = pytest.mark.sim

HEAD, WORKER = "spark-1", "spark-2"
RANK = container_name("sim", "rank", WORKER)


def restart_node(cfg: Any, access: Any) -> None:
    """A simulated reboot of the worker (as tests/test_sim_drift.py does), then waits until
    its docker answers and its rank container runs again (restart: unless-stopped)."""
    subprocess.run(["docker", "restart", "-t", "1", f"sparkvllm-sim-{WORKER}"], check=True)
    deadline = time.monotonic() + 180
    running = f"docker inspect -f '{{{{.State.Running}}}}' {RANK}"
    while run_ssh(access.targets[WORKER], running, timeout=20).stdout.strip() != "true":
        assert time.monotonic() < deadline, f"{WORKER}'s rank did not come back"
        time.sleep(2)


def native() -> dict[str, Any]:
    raw = stack.stack_raw()
    raw["parallelism"]["launcher"] = "native"
    return raw


def test_native_answers_as_ray_heals_a_lost_rank_and_leaves_no_ray_behind() -> None:
    stack.ensure_up()
    cfg, access = stack.load()
    if not stack.has_state():
        stack.cluster().remove_inner_containers(f"ai.sparkvllm.stack={stack.STACK}")
    ray = stack.engine("up", log=sim_log)  # auto: the sim image holds Ray
    assert not ray.error, ray.error
    assert ray.outputs["launcher"]["name"] == "ray"
    ray_answer = sim_complete(ray.outputs["endpoint"])

    started = time.monotonic()
    switched = stack.engine("up", native(), log=sim_log)
    sim_log(f"phase: switch ray -> native (engine up) {time.monotonic() - started:.1f}s")
    assert not switched.error, switched.error
    assert switched.outputs["launcher"] == {"name": "native", "why": "parallelism.launcher: native"}
    assert switched.outputs["health"]["ready"] is True
    native_answer = sim_complete(switched.outputs["endpoint"])
    sim_log(f"ray TP=2 vs native TP=2: {ray_answer!r} vs {native_answer!r}")
    assert native_answer == ray_answer and native_answer.strip()
    assert stack.our_containers(cfg, access, HEAD) == [container_name("sim", "model-server")]
    assert stack.our_containers(cfg, access, WORKER) == [RANK]
    assert stack.engine("preview", native(), refresh=True, log=sim_log).changed is False

    stack.run_on(cfg, access, WORKER, f"docker rm -f {RANK}")
    found = stack.engine("preview", native(), refresh=True, log=sim_log)
    assert not found.error, found.error
    plan = {s.name: s.op for s in found.steps if s.op != "same"}
    sim_log(f"rank lost: preview --refresh plans {sorted(plan.items())}")
    assert plan.get("model-server-container") == "replace", plan
    assert plan.get("rank-guard-spark-2") == "replace", plan
    started = time.monotonic()
    healed = stack.engine("up", native(), log=sim_log)
    sim_log(f"phase: heal a lost rank with one up {time.monotonic() - started:.1f}s")
    assert not healed.error, healed.error
    assert healed.outputs["health"]["ready"] is True
    assert sim_complete(healed.outputs["endpoint"]) == ray_answer
    after = stack.engine("preview", native(), refresh=True, log=sim_log)
    assert not after.changed, [(s.name, s.op, s.keys) for s in after.steps if s.op != "same"]

    # The worker node restarts: docker starts its rank again, which cannot rejoin the
    # group rank 0 still holds. Its guard reads it as started again: the group is replaced.
    restart_node(cfg, access)
    found = stack.engine("preview", native(), refresh=True, log=sim_log)
    assert not found.error, found.error
    plan = {s.name: s.op for s in found.steps if s.op != "same"}
    sim_log(f"worker node restarted: preview --refresh plans {sorted(plan.items())}")
    assert plan.get("rank-guard-spark-2") == "replace", plan
    assert plan.get("rank-spark-2-container") == "replace", plan
    started = time.monotonic()
    healed = stack.engine("up", native(), log=sim_log)
    sim_log(f"phase: heal a restarted worker node with one up {time.monotonic() - started:.1f}s")
    assert not healed.error, healed.error
    assert sim_complete(healed.outputs["endpoint"]) == ray_answer
    after = stack.engine("preview", native(), refresh=True, log=sim_log)
    assert not after.changed, [(s.name, s.op, s.keys) for s in after.steps if s.op != "same"]

    gone = stack.engine("destroy", native(), log=sim_log)
    assert not gone.error, gone.error
    for node in cfg.nodes:
        assert stack.our_containers(cfg, access, node.name) == []
