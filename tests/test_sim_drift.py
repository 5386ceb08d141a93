"""The fault matrix on the SIMULATED cluster, under Pulumi's own rules (the local engine):
for each fault, injected on the shared deployment,

(a) `preview --refresh --expect-no-changes` finds it (its refresh reads the containers
    and the NodeSteps back) and changes nothing on a node;
(b) ONE `up` (Pulumi.yaml: refresh always) heals it: the health output is ready, behind
    the same endpoint, and the model gives the same TP=2 answer as before the fault;
(c) a `preview --refresh --expect-no-changes` after it is clean (nothing flips back).

The probe-based drift check (`sparkvllm.drift`, read-only) is run alongside and its
findings logged.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import pytest

from sim import stack
from sparkvllm import drift
from sparkvllm.remote import run_ssh
from sparkvllm.specs.containers import container_name
from tests.conftest import SimDeployment, sim_complete, sim_log

pytestmark = pytest.mark.sim

HEAD, WORKER = "spark-1", "spark-2"
RAY_WORKER = container_name("sim", "ray-worker", WORKER)
RAY_HEAD = container_name("sim", "ray-head")
SERVER = container_name("sim", "model-server")
REF = "sparkvllm/vllm-sim:latest-sim"
BLOB = (
    "$(readlink -f /root/.cache/huggingface/hub/models--sparkvllm--tiny-qwen3/"
    "snapshots/*/model.safetensors)"
)


@pytest.fixture(scope="module")
def baseline(sim_deployment: SimDeployment) -> str:
    """The TP=2 answer before any fault."""
    return sim_complete(sim_deployment.outputs["endpoint"])


def on(d: SimDeployment, node: str, command: str) -> str:
    return stack.run_on(d.cfg, d.access, node, command, timeout=300)


def restart_node(d: SimDeployment) -> None:
    """A simulated reboot: the node container restarts, its dockerd and sshd with it."""
    subprocess.run(["docker", "restart", "-t", "1", f"sparkvllm-sim-{WORKER}"], check=True)
    deadline = time.monotonic() + 120
    target = d.access.targets[WORKER]
    while run_ssh(target, "docker info >/dev/null", timeout=20).returncode != 0:
        assert time.monotonic() < deadline, f"{WORKER} did not come back"
        time.sleep(2)


FAULTS: dict[str, Callable[[SimDeployment], object]] = {
    "worker container removed": lambda d: on(d, WORKER, f"docker rm -f {RAY_WORKER}"),
    "model server container stopped": lambda d: on(d, HEAD, f"docker stop {SERVER}"),
    # The API server process frozen (its container still runs, /health never answers).
    # The containers share the node's PID namespace, so the node sees the process.
    "model server hung": lambda d: on(d, HEAD, "pkill -STOP -f '/bin/[v]llm serve'"),
    "ray head container restarted": lambda d: on(d, HEAD, f"docker restart {RAY_HEAD}"),
    "worker node restarted": restart_node,
    "image removed from a worker": lambda d: on(d, WORKER, f"docker rmi -f {REF} >/dev/null"),
    "image replaced under the same tag on a worker": lambda d: on(
        d, WORKER, f"docker commit -c 'LABEL drift=1' {RAY_WORKER} {REF} >/dev/null"
    ),
    "weights deleted on a worker": lambda d: on(d, WORKER, f"rm {BLOB}"),
    "weights truncated on a worker": lambda d: on(d, WORKER, f"truncate -s 1000 {BLOB}"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_is_found_healed_by_one_up_and_stays_healed(
    sim_deployment: SimDeployment, baseline: str, fault: str
) -> None:
    d = sim_deployment
    FAULTS[fault](d)

    found = stack.engine("preview", refresh=True, log=sim_log)
    assert not found.error, found.error
    plan = sorted((s.name, s.op) for s in found.steps if s.op != "same")
    sim_log(f"{fault}: preview --refresh plans {plan}")
    assert found.changed, f"{fault}: not seen by preview --refresh"
    assert found.provider_writes == 0
    for finding in drift.check(d.cfg, "sim", d.access):
        sim_log(f"{fault}: drift check: {finding.render()}")

    started = time.monotonic()
    healed = stack.engine("up", log=sim_log)
    sim_log(f"phase: heal '{fault}' with one up {time.monotonic() - started:.1f}s")
    assert not healed.error, healed.error
    assert healed.outputs["endpoint"] == d.outputs["endpoint"]
    assert healed.outputs["health"]["ready"] is True
    assert sim_complete(healed.outputs["endpoint"]) == baseline

    after = stack.engine("preview", refresh=True, log=sim_log)
    assert not after.error, after.error
    assert not after.changed, [(s.name, s.op, s.keys) for s in after.steps if s.op != "same"]
