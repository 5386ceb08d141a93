"""vLLM's own multi-node launcher (parallelism.launcher: native) on the SIMULATED cluster:
a live Ray TP=2 stack switched to native by one `up` (nothing of Ray left on the nodes),
answering the same tokens as Ray TP=2; a worker rank lost, then the worker node
restarted, each found by `preview --refresh` and healed by one `up` that replaces the
whole group (vLLM cannot take a rank back), the lost rank with its weights deleted (the
probe drift check names both), then its rank hung and its image removed. The sim image
holds Ray, so `auto` runs Ray there; then a Ray-less image (a SIMULATION stand-in for a
current stock one) under `auto` runs native, with nccl.library host (the nodes' stand-in
library, loaded by the server's processes), and an explicit `ray` on it is refused at
preview; then destroyed."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest

from sim import stack
from sparkvllm import drift
from sparkvllm.config import HOST_NCCL_IN_CONTAINER
from sparkvllm.remote import run_ssh
from sparkvllm.specs.containers import container_name
from tests.conftest import sim_complete, sim_log

pytestmark = pytest.mark.sim

HEAD, WORKER = "spark-1", "spark-2"
RANK = container_name("sim", "rank", WORKER)
BLOB = (
    "$(readlink -f /root/.cache/huggingface/hub/models--sparkvllm--tiny-qwen3/"
    "snapshots/*/model.safetensors)"
)


def restart_node(cfg: Any, access: Any) -> None:
    """A simulated reboot of the worker (as tests/test_sim_drift.py does), then waits until
    its docker answers and its rank container runs again (restart: unless-stopped)."""
    subprocess.run(["docker", "restart", "-t", "1", f"sparkvllm-sim-{WORKER}"], check=True)
    deadline = time.monotonic() + 180
    running = f"docker inspect -f '{{{{.State.Running}}}}' {RANK}"
    while run_ssh(access.targets[WORKER], running, timeout=20).stdout.strip() != "true":
        assert time.monotonic() < deadline, f"{WORKER}'s rank did not come back"
        time.sleep(2)


IMAGE = "sparkvllm/vllm-sim:latest-sim"
NO_RAY = "sparkvllm/vllm-sim:noray-sim"
NO_RAY_BUILD = (
    f"FROM {stack.stack_raw()['image']['ref']}\n"
    "LABEL ai.sparkvllm.sim=ray-less\n"
    "RUN pip uninstall -y ray\n"
)
# SIMULATION: the sim nodes' stand-in for their own NCCL (sim/images/node/nccl-stand-in.c).
STAND_IN = "/usr/lib/x86_64-linux-gnu/libnccl.so.2.27.3"


def ray_less(launcher: str = "auto") -> dict[str, Any]:
    raw = stack.stack_raw()
    raw["image"] = {**raw["image"], "ref": NO_RAY, "source": "present"}
    raw["image"].pop("tarball", None)
    raw["parallelism"]["launcher"] = launcher
    raw["nccl"] = {"library": "host"}
    return raw


def found_and_healed(fault: str, answer: str, replaced: set[str]) -> None:
    """`preview --refresh` plans `replaced` replaced; one `up` heals (the same answer);
    a clean `preview --refresh` after."""
    found = stack.engine("preview", native(), refresh=True, log=sim_log)
    assert not found.error, found.error
    plan = {s.name: s.op for s in found.steps if s.op != "same"}
    sim_log(f"{fault}: preview --refresh plans {sorted(plan.items())}")
    assert {n: plan.get(n) for n in replaced} == dict.fromkeys(replaced, "replace"), plan
    started = time.monotonic()
    healed = stack.engine("up", native(), log=sim_log)
    sim_log(f"phase: heal {fault} with one up {time.monotonic() - started:.1f}s")
    assert not healed.error, healed.error
    assert healed.outputs["health"]["ready"] is True
    assert sim_complete(healed.outputs["endpoint"]) == answer
    after = stack.engine("preview", native(), refresh=True, log=sim_log)
    assert not after.changed, [(s.name, s.op, s.keys) for s in after.steps if s.op != "same"]


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

    # The worker's rank lost and its weights deleted: both found (the rank guard, the
    # weights' read-back; the probe drift check names both), healed by one up.
    stack.run_on(cfg, access, WORKER, f"docker rm -f {RANK} >/dev/null && rm {BLOB}")
    findings = {(f.node, f.what) for f in drift.check(cfg, "sim", access)}
    sim_log(f"rank lost, weights deleted: drift check {sorted(findings)}")
    assert {(WORKER, "container missing"), (WORKER, "weights incomplete")} <= findings
    found_and_healed(
        "a lost rank and deleted weights", ray_answer,
        {"model-server-container", "rank-guard-spark-2", "model-sync-spark-2"},
    )  # fmt: skip

    # The worker node restarts: docker starts its rank again, which cannot rejoin the
    # group rank 0 still holds. Its guard reads it as started again: the group is replaced.
    restart_node(cfg, access)
    found_and_healed(
        "a restarted worker node", ray_answer, {"rank-guard-spark-2", "rank-spark-2-container"}
    )

    # The worker's rank hung (every process of its container frozen, as an NCCL stall
    # leaves it: the container still runs) and its image gone: rank 0 no longer answers
    # (the server guard), the image's read-back finds it missing (the drift check names
    # it); one up replaces the group on the image sent again.
    frozen = f"docker top {RANK} -eo pid | tail -n +2 | xargs kill -STOP"
    stack.run_on(cfg, access, WORKER, f"{frozen} && docker rmi -f {IMAGE} >/dev/null")
    findings = {(f.node, f.what) for f in drift.check(cfg, "sim", access)}
    sim_log(f"rank hung, image removed: drift check {sorted(findings)}")
    assert (WORKER, "image missing") in findings, findings
    found_and_healed(
        "a hung rank and its image gone", ray_answer,
        {"model-server-guard", "image-sync-spark-2"},
    )  # fmt: skip

    # A current stock image has no Ray: a SIMULATION stand-in for one, built on the head
    # from the sim image with Ray uninstalled. `auto` runs native on it; with nccl.library
    # host every container loads the node's own library (the sim nodes' stand-in).
    stack.run_on(cfg, access, HEAD, f"docker build -q -t {NO_RAY} - >&2", stdin=NO_RAY_BUILD)
    try:
        started = time.monotonic()
        stock = stack.engine("up", ray_less(), log=sim_log)
        sim_log(f"phase: Ray-less image under auto, host NCCL {time.monotonic() - started:.1f}s")
        assert not stock.error, stock.error
        assert stock.outputs["launcher"] == {
            "name": "native", "why": f"parallelism.launcher: auto, and {NO_RAY} holds no ray"
        }  # fmt: skip
        assert sim_complete(stock.outputs["endpoint"]) == ray_answer
        nccl = stock.outputs["nccl"]
        sim_log(f"nccl: {nccl}")
        assert nccl["library"] == "host" and nccl["loaded"] == [HOST_NCCL_IN_CONTAINER], nccl
        for node in cfg.nodes:
            found = stock.outputs["nodes"][node.name]["nccl_library"]
            assert found == {"path": STAND_IN, "version": "2.27.3+cuda12.9"}, found
        assert stack.our_containers(cfg, access, WORKER) == [RANK]
        assert not stack.engine("preview", ray_less(), refresh=True, log=sim_log).changed
        # An explicit ray on it is refused before anything changes, naming image and fix.
        refused = stack.engine("preview", ray_less("ray"), log=sim_log)
        assert refused.error and "holds no Ray" in refused.error, refused.error
        assert NO_RAY in refused.error and "parallelism.launcher to native" in refused.error
    finally:
        gone = stack.engine("destroy", ray_less(), log=sim_log)
        for node in cfg.nodes:  # destroy keeps images (image.remove_on_destroy)
            stack.run_on(cfg, access, node.name, f"docker rmi {NO_RAY} >&2 || true")
    assert not gone.error, gone.error
    for node in cfg.nodes:
        assert stack.our_containers(cfg, access, node.name) == []
