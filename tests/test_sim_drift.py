"""Drift on a running deployment of the SIMULATED cluster: for each kind, inject it on
the nodes, show the check's verdict (each finding names the node and what drifted), then
re-apply and show a healthy cluster behind the same endpoint with no drift left.

Detection here is `sparkvllm.drift.check` (the probe half of the CI check; the
`pulumi preview --refresh` half needs the Pulumi CLI and runs in the engine e2e test).
Healing is re-applying the program through the local executor, which, like `pulumi up`,
re-runs the idempotent node commands and replaces only containers that no longer match.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from sim import stack
from sparkvllm import drift
from sparkvllm.config import StackConfig
from sparkvllm.probes import server_health
from sparkvllm.remote import run_ssh
from sparkvllm.specs.containers import container_name
from sparkvllm.workstation import SshAccess

pytestmark = pytest.mark.sim

HEAD, WORKER = "spark-1", "spark-2"
RAY_WORKER = container_name("sim", "ray-worker", WORKER)
RAY_HEAD = container_name("sim", "ray-head")
SERVER = container_name("sim", "model-server")
REF = "sparkvllm/vllm-sim:latest-sim"


@dataclass
class Cluster:
    cfg: StackConfig
    access: SshAccess
    endpoint: str


def _log(message: str) -> None:
    print(message, flush=True)


def on(c: Cluster, node: str, command: str) -> str:
    return stack.run_on(c.cfg, c.access, node, command, timeout=300)


def heal(c: Cluster, cfg: StackConfig | None = None) -> dict[str, Any]:
    started = time.monotonic()
    _, outputs = stack.apply(cfg or c.cfg, c.access, log=_log)
    _log(f"phase: heal {time.monotonic() - started:.1f}s")
    return outputs


def findings(c: Cluster, cfg: StackConfig | None = None) -> set[tuple[str, str]]:
    found = drift.check(cfg or c.cfg, "sim", c.access)
    for d in found:
        _log(f"drift: {d.render()}")
    return {(d.node, d.what) for d in found}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    stack.ensure_up()
    cfg, access = stack.load()
    started = time.monotonic()
    _, outputs = stack.apply(cfg, access, log=_log)
    _log(f"phase: deploy for drift tests {time.monotonic() - started:.1f}s")
    assert outputs["health"]["ready"] is True
    c = Cluster(cfg, access, outputs["endpoint"])
    assert findings(c) == set()
    yield c
    stack.destroy_by_label(cfg, access)


def _healed(c: Cluster, outputs: dict[str, Any]) -> None:
    assert outputs["endpoint"] == c.endpoint
    assert outputs["health"]["ready"] is True
    assert server_health.probe(c.endpoint.removesuffix("/v1"), "tiny-qwen3")["ready"] is True
    assert findings(c) == set()


DRIFTS: list[tuple[str, str, str, tuple[str, str]]] = [
    (
        "worker container removed",
        WORKER,
        f"docker rm -f {RAY_WORKER}",
        (WORKER, "container missing"),
    ),
    (
        "worker container stopped",
        WORKER,
        f"docker stop {RAY_WORKER}",
        (WORKER, "container not running"),
    ),
    ("model server stopped", HEAD, f"docker stop {SERVER}", (HEAD, "container not running")),
    ("image removed from a node", WORKER, f"docker rmi -f {REF}", (WORKER, "image missing")),
    (
        "weight file deleted on a node",
        WORKER,
        (
            "rm $(readlink -f /root/.cache/huggingface/hub/models--sparkvllm--tiny-qwen3/"
            "snapshots/*/model.safetensors)"
        ),
        (WORKER, "weights incomplete"),
    ),
    (
        "image replaced under the same tag",
        WORKER,
        f"docker commit -c 'LABEL drift=1' {RAY_WORKER} {REF}",
        (WORKER, "image replaced"),
    ),
]


@pytest.mark.parametrize(
    ("node", "inject", "expected"), [d[1:] for d in DRIFTS], ids=[d[0] for d in DRIFTS]
)
def test_drift_is_detected_and_healed(
    cluster: Cluster, node: str, inject: str, expected: tuple[str, str]
) -> None:
    on(cluster, node, inject)
    assert expected in findings(cluster)
    _healed(cluster, heal(cluster))


def test_head_restart_loses_the_workers_and_is_healed(cluster: Cluster) -> None:
    on(cluster, HEAD, f"docker restart {RAY_HEAD}")
    found = findings(cluster)
    assert (WORKER, "left the ray cluster") in found or (HEAD, "model server unhealthy") in found
    _healed(cluster, heal(cluster))


def test_node_reboot_is_detected_and_healed(cluster: Cluster) -> None:
    """A simulated reboot: the node container restarts, its dockerd and sshd with it."""
    import subprocess

    subprocess.run(["docker", "restart", "-t", "1", f"sparkvllm-sim-{WORKER}"], check=True)
    found = findings(cluster)
    assert any(n == WORKER for n, _ in found) or (HEAD, "model server unhealthy") in found, found
    _wait_for_ssh(cluster, WORKER)
    _healed(cluster, heal(cluster))


def test_config_change_not_applied_is_detected_and_applied(cluster: Cluster) -> None:
    raw = stack.stack_raw()
    raw["vllm"]["max_model_len"] = 256
    changed, _ = stack.load(raw)
    assert (HEAD, "config not applied") in findings(cluster, changed)
    heal(cluster, changed)
    assert findings(cluster, changed) == set()
    assert (HEAD, "config not applied") in findings(cluster)  # back to the committed config
    _healed(cluster, heal(cluster))


def test_unreachable_node_mid_apply_names_it_and_a_rerun_converges(cluster: Cluster) -> None:
    import subprocess

    on(cluster, WORKER, f"docker rm -f {RAY_WORKER}")
    subprocess.run(["docker", "pause", f"sparkvllm-sim-{WORKER}"], check=True)
    try:
        with pytest.raises(Exception, match=r"spark-2.*172\.28\.0\.12|172\.28\.0\.12.*spark-2"):
            stack.apply(cluster.cfg, cluster.access, log=_log)
        assert (WORKER, "unreachable") in findings(cluster)
    finally:
        subprocess.run(["docker", "unpause", f"sparkvllm-sim-{WORKER}"], check=True)
    _healed(cluster, heal(cluster))


def _wait_for_ssh(c: Cluster, node: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (
            run_ssh(
                stack.node_target(c.cfg, c.access, node), "docker info >/dev/null", timeout=20
            ).returncode
            == 0
        ):
            return
        time.sleep(2)
    raise AssertionError(f"{node} did not come back within {timeout}s")
