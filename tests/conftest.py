"""Shared fixtures: the spark stack's own config file, a four-node variant, a test key."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from sim.stack import stack_raw

ROOT = Path(__file__).resolve().parent.parent

# A program that fails on purpose (bad preflight) leaves Pulumi's internal futures holding
# the exception; asyncio logs each one when it is garbage collected. The tests assert on
# the raised error itself, so this noise is dropped.
logging.getLogger("asyncio").setLevel(logging.CRITICAL)

# Not a real key: the shape the program checks for, nothing more.
TEST_PRIVATE_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "TEST-ONLY-NOT-A-KEY-7f3a\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)
TEST_API_KEY = "test-api-key-5b9e1c"


def stack_file(stack: str) -> dict[str, Any]:
    """The `spark-vllm:` keys of Pulumi.<stack>.yaml, namespace stripped."""
    return stack_raw(stack, ROOT)


@pytest.fixture
def spark_raw() -> dict[str, Any]:
    raw = stack_file("spark")
    raw["ssh_private_key"] = TEST_PRIVATE_KEY
    return raw


def four_node_raw(raw: dict[str, Any]) -> dict[str, Any]:
    """Four Sparks: each node its own address AND its own netdev name, so a value copied
    from the head would show."""
    out = copy.deepcopy(raw)
    base = out["nodes"][0]
    out["nodes"] = []
    for i in range(4):
        node = copy.deepcopy(base)
        node["name"] = f"spark-{i + 1}"
        node["ssh"]["host"] = f"10.1.230.{180 + i}"
        node["cluster_link"]["address"] = f"192.168.100.{10 + i}"
        node["cluster_link"]["netdev"] = f"enp1s0f{i % 2}np{i}"
        node["cluster_link"]["roce_hcas"] = [f"rocep1s0f{i % 2}", f"roceP2p1s0f{i % 2}"]
        out["nodes"].append(node)
    out["parallelism"] = {"tensor": 4, "pipeline": 1}
    return out


@pytest.fixture
def spark4_raw(spark_raw: dict[str, Any]) -> dict[str, Any]:
    return four_node_raw(spark_raw)


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Workstation files (identity, known_hosts) go to a temp dir, never to ~/.cache.
    monkeypatch.setenv("SPARKVLLM_STATE_DIR", str(tmp_path / "state"))


def hf_snapshot(root: Any, files: dict[str, bytes], index: list[str] | None = None) -> Any:
    """An HF hub cache under `root` for Qwen/Qwen3.5-122B-A10B-FP8@main: blobs + links."""
    repo = root / "hub" / "models--Qwen--Qwen3.5-122B-A10B-FP8"
    blobs, snap = repo / "blobs", repo / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    if index is not None:
        files = {
            **files,
            "model.safetensors.index.json": json.dumps(
                {"weight_map": {f"layer.{i}.w": f for i, f in enumerate(index)}}
            ).encode(),
        }
    for i, (name, data) in enumerate(files.items()):
        (blobs / f"b{i}").write_bytes(data)
        (snap / name).symlink_to(blobs / f"b{i}")
    return snap
