"""parallelism.launcher: vLLM's own multi-node launcher (native) beside Ray, chosen from the
image (auto), previewed truthfully and switched on a live stack by one `up` that leaves
nothing of the other behind. The real program through the local engine against in-memory
nodes (tests/test_plan_engine.py); the simulated cluster runs it for real
(tests/test_sim_native.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from sparkvllm.config import load_stack_config
from sparkvllm.vllm_flags import extra_args_problems
from tests.pulumi_mocks import IMAGE_VERSIONS
from tests.test_plan_engine import Stack, base, changed

# The real program through the local engine (a program process per operation): end to end.
pytestmark = pytest.mark.engine

__all__ = ["base"]  # the fixture: the spark stack with a key file

NO_RAY = {**IMAGE_VERSIONS, "ray": "", "vllm": "0.27.1"}
RAY_PARTS = ("ray-head", "ray-worker-", "model-server-ray-ready")
NATIVE_PARTS = {"rank-spark-2", "rank-spark-2-container", "rank-guard-spark-2"}


def with_launcher(raw: dict[str, Any], launcher: str) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    out["parallelism"]["launcher"] = launcher
    return out


def names(result: Any) -> set[str]:
    return {s.name for s in result.steps}


def state_names(stack: Stack, tmp_path: Path) -> set[str]:
    state = json.loads((tmp_path / "backend/.localengine/stacks/spark-vllm/spark.json").read_text())
    return {r["urn"].rsplit("::", 1)[-1] for r in state["checkpoint"]["latest"]["resources"]}


def container_inputs(stack: Stack, tmp_path: Path, name: str) -> dict[str, Any]:
    state = json.loads((tmp_path / "backend/.localengine/stacks/spark-vllm/spark.json").read_text())
    for r in state["checkpoint"]["latest"]["resources"]:
        if r["urn"].endswith(f"::{name}"):
            return dict(r["inputs"])
    raise KeyError(name)


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Stack:
    return Stack(tmp_path / "backend", monkeypatch)


def test_native_is_previewed_exactly_and_runs_a_rank_per_node_without_ray(
    base: dict[str, Any], stack: Stack, tmp_path: Path
) -> None:
    raw = with_launcher(base, "native")
    plan = changed(stack.run("preview", raw))
    done = changed(stack.run("up", raw))
    assert plan == done and set(done.values()) == {"create"}
    assert set(done) >= NATIVE_PARTS
    assert not [n for n in done if n.startswith(RAY_PARTS)]
    assert changed(stack.run("up", raw)) == {}
    cfg = load_stack_config(raw)
    head_addr = cfg.head_node.cluster_link.address
    rank1 = container_inputs(stack, tmp_path, "rank-spark-2-container")["command"]
    rank0 = container_inputs(stack, tmp_path, "model-server-container")["command"]
    for argv, rank in ((rank1, "1"), (" ".join(rank0), "0")):
        text = " ".join(argv) if isinstance(argv, list) else argv
        assert f"--node-rank={rank}" in text and "--nnodes=2" in text
        assert f"--master-addr={head_addr}" in text and "--master-port=29501" in text
        assert "--distributed-executor-backend=mp" in text
    assert "--headless" in rank1 and "--headless" not in " ".join(rank0)
    out = stack.run("up", raw).outputs
    assert out["launcher"] == {"name": "native", "why": "parallelism.launcher: native"}
    assert out["ray_gcs_address"] == "" and out["health"]["ray"] == {}


def test_auto_runs_native_on_an_image_without_ray_and_ray_on_one_with_it(
    base: dict[str, Any], stack: Stack, tmp_path: Path
) -> None:
    stack.versions = NO_RAY
    out = stack.run("up", base).outputs
    assert out["launcher"]["name"] == "native" and "holds no ray" in out["launcher"]["why"]
    assert state_names(stack, tmp_path) >= NATIVE_PARTS
    assert not [n for n in state_names(stack, tmp_path) if n.startswith(RAY_PARTS)]
    # Deployed: the decision is known in preview (from the image-ray step's ID).
    assert changed(stack.run("preview", base)) == {}
    assert not any("assumed" in m for m in stack.logged)


def test_auto_on_a_new_stack_previews_native_and_says_it_assumed_it(
    base: dict[str, Any], stack: Stack
) -> None:
    plan = changed(stack.run("preview", base))
    assert set(plan) >= NATIVE_PARTS
    assert any("launcher: native assumed" in m and "set parallelism.launcher" in m
               for m in stack.logged)  # fmt: skip
    done = changed(stack.run("up", base))  # the mocked image holds Ray
    assert "ray-head-container" in done and not NATIVE_PARTS & set(done)


@pytest.mark.parametrize(("first", "second"), [("ray", "native"), ("native", "ray")])
def test_switching_a_live_stack_is_one_up_that_leaves_nothing_of_the_other(
    base: dict[str, Any], stack: Stack, tmp_path: Path, first: str, second: str
) -> None:
    stack.run("up", with_launcher(base, first))
    raw = with_launcher(base, second)
    plan = changed(stack.run("preview", raw))
    done = changed(stack.run("up", raw))
    assert plan == done, (plan, done)
    assert done["model-server-container"] == "replace"
    left = state_names(stack, tmp_path)
    ray_left = [n for n in left if n.startswith(RAY_PARTS)]
    if second == "native":
        assert {n for n, op in done.items() if op == "delete"} >= {
            "ray-head-container", "ray-worker-spark-2-container", "model-server-ray-ready"
        }  # fmt: skip
        assert not ray_left and left >= NATIVE_PARTS
    else:
        # The rank container goes first, as a dependent of rank 0's delete-before-replace.
        assert {n for n, op in done.items() if op == "delete"} >= NATIVE_PARTS - {
            "rank-spark-2-container"
        }
        assert ray_left and not NATIVE_PARTS & left
    assert changed(stack.run("up", raw)) == {}


def test_an_explicit_ray_on_an_image_without_ray_fails_at_preflight_naming_the_fix(
    base: dict[str, Any], stack: Stack, tmp_path: Path
) -> None:
    stack.versions = NO_RAY
    result = stack.run("up", with_launcher(base, "ray"), check=False)
    assert result.error
    text = result.error + "\n".join(stack.logged)
    assert "has no ray installed" in text and "hellohal2064/vllm-qwen3.5-gb10" in text
    assert "fix: set parallelism.launcher to native" in text
    assert not [n for n in state_names(stack, tmp_path) if n.endswith("-container")]


@pytest.mark.parametrize(
    ("flag", "owner"),
    [("--nnodes", "parallelism.launcher"), ("--headless", "parallelism.launcher"),
     ("--master-port", "ports.master"), ("--node-rank", "parallelism.launcher")],
)  # fmt: skip
def test_the_launchers_flags_are_owned(flag: str, owner: str) -> None:
    problems = extra_args_problems([flag, "1"])
    assert problems and owner in problems[0][2], problems


def test_the_master_port_must_differ_from_the_others(base: dict[str, Any]) -> None:
    raw = copy.deepcopy(base)
    raw["ports"] = {"master": 8000}
    with pytest.raises(Exception, match=r"ports must differ.*master=8000.*api=8000"):
        load_stack_config(raw)


@pytest.mark.parametrize(
    ("inspect", "health"),
    [
        ("running 2026-12-05T01:00:00.123456789Z 2026-12-05T01:00:01.5Z", "ok"),
        # Started again 10 minutes after it was created: its node restarted, or it crashed.
        ("running 2026-12-05T01:00:00.123456789Z 2026-12-05T01:10:00.5Z", "bad"),
        ("exited 2026-12-05T01:00:00Z 2026-12-05T01:00:01Z", "bad"),
        ("", "bad"),  # no such container
    ],
)  # fmt: skip
def test_a_rank_guard_reads_gone_stopped_and_restarted_as_bad(
    base: dict[str, Any], inspect: str, health: str
) -> None:
    """The guard's read under bash with the real `date`, docker answering `inspect`."""
    import subprocess

    from sparkvllm.specs import commands

    cfg = load_stack_config(base)
    guard = commands.rank_guard(cfg, cfg.nodes[1], "sparkvllm-spark-rank-spark-2")
    assert guard.read is not None
    docker = 'docker() { [ -n "$INSPECT" ] && echo "$INSPECT"; }\n'
    out = subprocess.run(
        ["bash", "-c", docker + guard.read], env={"INSPECT": inspect, "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out.strip() == f"health={health}"
