"""Live self-check of a running simulation (skipped when `python -m sim up` has not run)."""

from __future__ import annotations

import json
import subprocess

import pytest

from sim.nodes import port_open, ssh_argv
from sim.settings import MODEL_ID, NODE_HF_HUB_DIR, StatePaths

PATHS = StatePaths.at()
pytestmark = pytest.mark.sim


def _nodes() -> list[dict[str, object]]:
    if not PATHS.nodes_json.exists():
        pytest.skip("the simulation is not up (no .sim/nodes.json): run `python -m sim up`")
    nodes: list[dict[str, object]] = json.loads(PATHS.nodes_json.read_text())
    if not all(port_open(str(n["address"]), 22) for n in nodes):
        pytest.skip("a simulated node does not answer on port 22: run `python -m sim up`")
    return nodes


def _ssh(address: str, command: str) -> str:
    argv = ssh_argv(PATHS, address, command)
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout


def test_nodes_answer_with_their_own_dockerd_and_the_model() -> None:
    repo = f"{NODE_HF_HUB_DIR}/models--{MODEL_ID.replace('/', '--')}"
    for node in _nodes():
        out = _ssh(
            str(node["address"]),
            f"hostname; docker info -f '{{{{.Driver}}}}'; cat {repo}/refs/main",
        )
        hostname, driver, revision = out.split()
        assert hostname == node["name"]
        assert driver == "overlay2"
        assert len(revision) == 40


def test_only_the_head_sees_the_image_tarball() -> None:
    nodes = _nodes()
    listing = "ls /var/lib/sparkvllm/images 2>/dev/null || true"
    assert "vllm-sim.tar" in _ssh(str(nodes[0]["address"]), listing)
    for node in nodes[1:]:
        assert _ssh(str(node["address"]), listing).strip() == ""
