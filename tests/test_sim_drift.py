"""The fault matrix on the SIMULATED cluster, under Pulumi's own rules (the local engine),
as a schedule: the faults are injected in rounds on the shared deployment, each round's
faults touching parts of the stack that no other fault of the round touches, and

(a) after each fault is injected, `preview --refresh --expect-no-changes` finds IT: the
    refresh reads back a change in the resource that fault breaks (and in none that only a
    later fault breaks), so each fault's detection stands on its own; the preview changes
    nothing on a node;
(b) ONE `up` (Pulumi.yaml: refresh always) heals the round: the health output is ready,
    behind the same endpoint, and the model gives the same TP=2 answer as before;
(c) a `preview --refresh --expect-no-changes` after it is clean (nothing flips back).

The probe-based drift check (`sparkvllm.drift`, read-only) is run after each round's
faults and names each fault's node and finding. A round heals with one vLLM start where a
fault each took one.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

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
    """The TP=2 answer before any fault (taken when the deployment was made)."""
    return sim_deployment.answer


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


@dataclass(frozen=True)
class Fault:
    """One fault: how it is made, the resource whose read-back shows it (refresh), and
    what the drift check says of it (node, finding; None where what it sees depends on
    how far Ray has recovered by itself when it looks)."""

    inject: Callable[[SimDeployment], object]
    reads: str
    finding: tuple[str, str] | None


FAULTS: dict[str, Fault] = {
    "worker container removed": Fault(
        lambda d: on(d, WORKER, f"docker rm -f {RAY_WORKER}"),
        "ray-worker-spark-2-container",
        (WORKER, "container missing"),
    ),
    "model server container stopped": Fault(
        lambda d: on(d, HEAD, f"docker stop {SERVER}"),
        "model-server-container",
        (HEAD, "container not running"),
    ),
    # The API server process frozen (its container still runs, /health never answers).
    # The containers share the node's PID namespace, so the node sees the process.
    "model server hung": Fault(
        lambda d: on(d, HEAD, "pkill -STOP -f '/bin/[v]llm serve'"),
        "model-server-guard",
        (HEAD, "model server unhealthy"),
    ),
    # `-t 1`: `ray start --block` is the container's first process, which the kernel
    # shields from SIGTERM (no handler), so a plain restart waits the whole stop timeout
    # (30 s) and then kills it: the same restart, without the wait.
    "ray head container restarted": Fault(
        lambda d: on(d, HEAD, f"docker restart -t 1 {RAY_HEAD}"),
        "model-server-ray-ready",
        None,
    ),
    # Read right after the node is back, the GCS may still count its old raylet alive
    # (until it misses its health checks), but that raylet's port refuses: Ray's
    # membership read (probes/ray_members.py) shows it gone at once.
    "worker node restarted": Fault(restart_node, "model-server-ray-ready", None),
    "image removed from a worker": Fault(
        lambda d: on(d, WORKER, f"docker rmi -f {REF} >/dev/null"),
        "image-sync-spark-2",
        (WORKER, "image missing"),
    ),
    "image replaced under the same tag on a worker": Fault(
        lambda d: on(d, WORKER, f"docker commit -c 'LABEL drift=1' {RAY_WORKER} {REF} >/dev/null"),
        "image-sync-spark-2",
        (WORKER, "image replaced"),
    ),
    "weights deleted on a worker": Fault(
        lambda d: on(d, WORKER, f"rm {BLOB}"), "model-sync-spark-2", (WORKER, "weights incomplete")
    ),
    "weights truncated on a worker": Fault(
        lambda d: on(d, WORKER, f"truncate -s 1000 {BLOB}"),
        "model-sync-spark-2",
        (WORKER, "weights differ"),
    ),
}

# Each round: faults whose read-backs are apart (no fault of a round changes what a later
# one's is read from: a fault that shows in several reads comes after the faults that own
# them), healed by one `up`. Every fault of FAULTS is in exactly one round. Two rounds, as
# few as the faults allow: image and weights have two faults each, and the server hung
# and stopped cannot both be (the drift check names a hung server only while it runs).
# The worker's image is removed while its Ray container still runs (as `docker rmi -f`
# does it there: the tag goes, the layers stay under the container), then the container:
# the heal sends only what the worker lacks (the whole image is sent by the first deploy).
ROUNDS: dict[str, list[str]] = {
    "the server hung, the Ray head restarted, a worker's image and Ray gone, its weights "
    "truncated": [
        "model server hung", "ray head container restarted", "image removed from a worker",
        "worker container removed", "weights truncated on a worker",
    ],
    "the server stopped, a worker node restarted, its image replaced, its weights "
    "deleted": [
        "model server container stopped", "worker node restarted",
        "image replaced under the same tag on a worker", "weights deleted on a worker",
    ],
}  # fmt: skip


def test_every_fault_is_in_one_round() -> None:
    scheduled = [f for faults in ROUNDS.values() for f in faults]
    assert sorted(scheduled) == sorted(FAULTS)


def _changed_reads(result: object) -> set[str]:
    """The resources whose read-back changed in a refresh (updated or gone)."""
    return {s.name for s in getattr(result, "refresh_steps", []) if s.op != "same"}


@pytest.mark.parametrize("round_name", list(ROUNDS))
def test_each_fault_is_found_and_one_up_heals_the_round_and_it_stays_healed(
    sim_deployment: SimDeployment, baseline: str, round_name: str
) -> None:
    d = sim_deployment
    seen: set[str] = set()
    for name in ROUNDS[round_name]:
        fault = FAULTS[name]
        fault.inject(d)
        found = stack.engine("preview", refresh=True, log=sim_log)
        assert not found.error, found.error
        reads = _changed_reads(found)
        plan = sorted((s.name, s.op) for s in found.steps if s.op != "same")
        sim_log(f"{name}: refresh reads changed {sorted(reads)}; preview plans {plan}")
        assert found.changed, f"{name}: not seen by preview --refresh"
        assert found.provider_writes == 0
        assert fault.reads in reads - seen, f"{name}: {fault.reads} not newly read as changed"
        seen |= reads
    findings = {(f.node, f.what) for f in drift.check(d.cfg, "sim", d.access)}
    sim_log(f"{round_name}: drift check {sorted(findings)}")
    for name in ROUNDS[round_name]:
        finding = FAULTS[name].finding
        assert finding is None or finding in findings, (name, sorted(findings))

    started = time.monotonic()
    healed = stack.engine("up", log=sim_log)
    sim_log(f"phase: heal '{round_name}' with one up {time.monotonic() - started:.1f}s")
    assert not healed.error, healed.error
    assert healed.outputs["endpoint"] == d.outputs["endpoint"]
    assert healed.outputs["health"]["ready"] is True
    assert sim_complete(healed.outputs["endpoint"]) == baseline

    after = stack.engine("preview", refresh=True, log=sim_log)
    assert not after.error, after.error
    assert not after.changed, [(s.name, s.op, s.keys) for s in after.steps if s.op != "same"]
