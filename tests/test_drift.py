"""Drift the providers cannot see: every kind, from a healthy cluster's reading with one
thing changed -> exactly the finding that names the node and what drifted."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from sparkvllm.config import StackConfig, load_stack_config
from sparkvllm.specs.containers import SPEC_LABEL
from sparkvllm.specs.drift import (
    ContainerLive,
    NodeLive,
    expected_containers,
    find_drift,
    parse_state,
    state_command,
)

STACK = "spark"
IMG = "sha256:" + "1" * 64


def healthy(cfg: StackConfig) -> dict[str, NodeLive]:
    live = {}
    for node, specs in expected_containers(cfg, STACK).items():
        live[node] = NodeLive(
            containers={
                s.name: ContainerLive("running", 0, s.labels[SPEC_LABEL], IMG) for s in specs
            },
            image_id=IMG,
            fingerprint="f" * 64,
            weights_manifest="e" * 64,
        )
    live[cfg.head].ray = {
        "missing": [],
        "unexpected": [],
        "gpus": float(cfg.total_gpus),
        "alive": 2,
    }
    live[cfg.head].server = {
        "ready": True,
        "health_status": 200,
        "models": [cfg.model.name_for_clients],
    }
    return live


W = "sparkvllm-spark-ray-worker-spark-2"
S = "sparkvllm-spark-model-server"


def _container(node: str, name: str, **changes: Any) -> Callable[[dict[str, NodeLive]], None]:
    def apply(live: dict[str, NodeLive]) -> None:
        c = live[node].containers[name]
        live[node].containers[name] = ContainerLive(**{**c.__dict__, **changes})

    return apply


def _remove(node: str, name: str) -> Callable[[dict[str, NodeLive]], None]:
    def apply(live: dict[str, NodeLive]) -> None:
        del live[node].containers[name]

    return apply


def _set(node: str, **changes: Any) -> Callable[[dict[str, NodeLive]], None]:
    def apply(live: dict[str, NodeLive]) -> None:
        for k, v in changes.items():
            setattr(live[node], k, v)

    return apply


CASES: list[tuple[str, Callable[[dict[str, NodeLive]], None], list[tuple[str, str]]]] = [
    ("nothing drifted", lambda live: None, []),
    ("worker removed", _remove("spark-2", W), [("spark-2", "container missing")]),
    (
        "worker stopped",
        _container("spark-2", W, status="exited", exit_code=137),
        [("spark-2", "container not running")],
    ),
    (
        "head restarted, worker lost",
        _set("spark-1", ray={"missing": ["192.168.100.11"], "gpus": 1.0}),
        [("spark-2", "left the ray cluster")],
    ),
    (
        "server crashed",
        _container("spark-1", S, status="restarting", exit_code=1),
        [("spark-1", "container not running")],
    ),
    (
        "server engine dead",
        _set("spark-1", server={"ready": False, "health_status": 503}),
        [("spark-1", "model server unhealthy")],
    ),
    (
        "server refuses",
        _set("spark-1", server={"ready": False, "health_status": 0}),
        [("spark-1", "model server unhealthy")],
    ),
    ("image removed", _set("spark-2", image_id="", fingerprint=""), [("spark-2", "image missing")]),
    ("image replaced", _set("spark-2", fingerprint="e" * 64), [("spark-2", "image replaced")]),
    (
        "node rebooted, containers gone",
        _set("spark-2", containers={}),
        [("spark-2", "container missing")],
    ),
    (
        "node unreachable",
        _set("spark-2", error="ssh: connect timed out"),
        [("spark-2", "unreachable")],
    ),
    (
        "weight blob deleted on a worker",
        _set("spark-2", weights_gaps="model-00002-of-00039.safetensors"),
        [("spark-2", "weights incomplete")],
    ),
    (
        "weights on a worker differ from the head's",
        _set("spark-2", weights_manifest="d" * 64),
        [("spark-2", "weights differ")],
    ),
    (
        "container left on the old image",
        _container("spark-2", W, image="sha256:" + "0" * 64),
        [("spark-2", "container on an old image")],
    ),
]


@pytest.mark.parametrize(("mutate", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_kind_of_drift(
    spark_raw: dict[str, Any],
    mutate: Callable[[dict[str, NodeLive]], None],
    expected: list[tuple[str, str]],
) -> None:
    cfg = load_stack_config(spark_raw)
    live = healthy(cfg)
    mutate(live)
    found = find_drift(cfg, STACK, live)
    assert [(d.node, d.what) for d in found] == expected
    for d in found:
        assert d.render().startswith(f"node {d.node}: {d.what}: ")
        assert "fix:" in d.render()


def test_a_config_change_not_yet_applied(spark_raw: dict[str, Any]) -> None:
    running = load_stack_config(spark_raw)
    live = healthy(running)
    changed = copy.deepcopy(spark_raw)
    changed["vllm"]["max_model_len"] = 131072
    found = find_drift(load_stack_config(changed), STACK, live)
    assert [(d.node, d.what) for d in found] == [("spark-1", "config not applied")]
    assert S in found[0].detail


def test_state_command_output_parses(spark_raw: dict[str, Any]) -> None:
    cfg = load_stack_config(spark_raw)
    cmd = state_command(cfg, STACK, cfg.nodes[1])
    subprocess.run(["bash", "-n", "-c", cmd], check=True)
    out = f"container.{W}=running 0 abc123 {IMG}\nimage.id={IMG}\nimage.fingerprint={'f' * 64}\n"
    live = parse_state(out)
    assert live.containers[W] == ContainerLive("running", 0, "abc123", IMG)
    assert parse_state(f"container.{W}=absent\nimage.id=\nimage.fingerprint=\n").containers == {}


def test_fixes_name_steps_the_program_registers(spark_raw: dict[str, Any]) -> None:
    """The step URNs the fixes name are exactly the URNs the program registers."""
    from sparkvllm.workstation import prepare_ssh_access
    from tests.conftest import ROOT
    from tests.pulumi_mocks import run_program

    cfg = load_stack_config(spark_raw)
    registered = set(run_program(cfg, prepare_ssh_access(cfg, "test", ROOT)).registrations)
    live = healthy(cfg)
    for node in ("spark-1", "spark-2"):
        live[node].image_id = ""
        live[node].weights_gaps = "config.json"
    found = find_drift(cfg, "test", live)
    urns = [d.detail.split("reads '")[1].split("'")[0] for d in found if "reads '" in d.detail]
    assert len(urns) == 4
    assert set(urns) <= registered, set(urns) - registered
    assert {u.rsplit("::", 1)[1] for u in urns} == {
        "image-obtain-spark-1",
        "image-sync-spark-2",
        "model-download-spark-1",
        "model-sync-spark-2",
    }


def test_weights_state_reads_a_real_snapshot(spark_raw: dict[str, Any], tmp_path: Any) -> None:
    from sparkvllm.specs.model import weights_state
    from tests.conftest import hf_snapshot

    raw = copy.deepcopy(spark_raw)
    raw["model"]["hf_cache"] = str(tmp_path / "hf")
    cfg = load_stack_config(raw)
    snap = hf_snapshot(tmp_path / "hf", {"config.json": b"{}", "model.safetensors": b"w" * 9})

    def read() -> NodeLive:
        out = subprocess.run(
            ["bash", "-c", weights_state(cfg)], capture_output=True, text=True, check=True
        )
        return parse_state(out.stdout)

    whole = read()
    assert len(whole.weights_manifest) == 64 and whole.weights_gaps == ""
    (snap / "model.safetensors").resolve().unlink()
    broken = read()
    assert broken.weights_gaps == "model.safetensors"
    assert broken.weights_manifest != whole.weights_manifest
