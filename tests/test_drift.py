"""Drift the providers cannot see: every kind, from a healthy cluster's reading with one
thing changed -> exactly the finding that names the node and what drifted."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from sparkvllm.config import StackConfig, load_stack_config
from sparkvllm.specs import containers
from sparkvllm.specs.containers import SPEC_LABEL
from sparkvllm.specs.drift_rules import (
    ContainerLive,
    NodeLive,
    expected_containers,
    find_drift,
    parse_state,
    state_command,
)

STACK = "spark"
IMG = "sha256:" + "1" * 64


def healthy(cfg: StackConfig, launcher: str = containers.RAY) -> dict[str, NodeLive]:
    live = {}
    for node, specs in expected_containers(cfg, STACK, launcher).items():
        live[node] = NodeLive(
            containers={
                s.name: ContainerLive("running", 0, s.labels[SPEC_LABEL], IMG) for s in specs
            },
            image_id=IMG,
            fingerprint="f" * 64,
            weights_manifest="e" * 64,
        )
    if launcher == containers.NATIVE:
        live[cfg.head].server = {
            "ready": True, "health_status": 200, "models": [cfg.model.name_for_clients],
            "smoke": {"ok": True, "status": 200, "text": "ok"},
        }  # fmt: skip
        return live
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
        "smoke": {"ok": True, "status": 200, "text": "ok"},
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
    from sparkvllm.specs.weights import weights_state
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


PINNED = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("pin", "digests", "last_fingerprint", "found"),
    [
        (False, (), None, []),
        (False, (), "f" * 64, []),
        (False, (), "0" * 64, ["image changed since the last up"]),
        (True, (f"hellohal2064/vllm-qwen3.5-gb10@{PINNED}",), "f" * 64, []),
        (True, ("hellohal2064/vllm-qwen3.5-gb10@sha256:" + "cd" * 32,), None,
         ["image not the pinned digest"]),
        (True, (), None, ["image not the pinned digest"]),
    ],
)  # fmt: skip
def test_the_head_image_is_the_pinned_and_the_recorded_one(
    spark_raw: dict[str, Any],
    pin: bool,
    digests: tuple[str, ...],
    last_fingerprint: str | None,
    found: list[str],
) -> None:
    """Against the config's digest (the head pulled it; workers get it by `docker load`,
    which records no digest) and the fingerprint the last `up` recorded in its outputs."""
    if pin:
        spark_raw["image"]["ref"] = f"hellohal2064/vllm-qwen3.5-gb10@{PINNED}"
    cfg = load_stack_config(spark_raw)
    live = healthy(cfg)
    live[cfg.head].image_digests = digests
    last = {"image": {"fingerprint": last_fingerprint}} if last_fingerprint else None
    drifts = find_drift(cfg, STACK, live, last)
    assert [d.what for d in drifts] == found
    for d in drifts:
        assert d.node == cfg.head and "image-obtain-spark-1" in d.detail


def test_state_reads_the_image_digests() -> None:
    out = f"image.id={IMG}\nimage.digests=a/b@{PINNED} c/d@{PINNED}\n"
    assert parse_state(out).image_digests == (f"a/b@{PINNED}", f"c/d@{PINNED}")


def test_a_stuck_server_is_found_by_a_token_not_by_health(spark_raw: dict[str, Any]) -> None:
    """/health 200 but no token: the engine is stuck; the finding names the node and the
    server's last log line."""
    cfg = load_stack_config(spark_raw)
    live = healthy(cfg)
    server = live[cfg.head].server
    assert server is not None
    server["smoke"] = {"ok": False, "status": 0, "text": "timed out"}
    server["last_log"] = "EngineCore hung in execute_model"
    (found,) = find_drift(cfg, STACK, live)
    assert (found.node, found.what) == (cfg.head, "model server stuck")
    assert "timed out" in found.detail and "EngineCore hung in execute_model" in found.detail


def test_a_crash_looped_container_says_why(spark_raw: dict[str, Any]) -> None:
    cfg = load_stack_config(spark_raw)
    server = containers.model_server(cfg, STACK)
    out = "\n".join(
        [
            f"container.{server.name}=exited 137 {server.labels[SPEC_LABEL]} {IMG} 3 true",
            f"container_log.{server.name}=torch.OutOfMemoryError: CUDA out of memory",
            f"image.id={IMG}",
        ]
    )
    live = healthy(cfg)
    live[cfg.head].containers[server.name] = parse_state(out).containers[server.name]
    live[cfg.head].server = None
    (found,) = find_drift(cfg, STACK, live)
    assert found.what == "container not running"
    assert "exit code 137, restarted 3 time(s), killed for lack of memory (OOM)" in found.detail
    assert "last log: torch.OutOfMemoryError" in found.detail


@pytest.mark.parametrize(
    ("logs", "told"),
    [
        (  # vLLM refusing its config: the reason, not the link after it
            (
                "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
                "  Value error, User-specified max_model_len (100000) is greater\n"
                "    For further information visit https://errors.pydantic.dev/2.14/v/value_error\n"
            ),
            "  Value error, User-specified max_model_len (100000) is greater",
        ),
        ("loading\ntorch.OutOfMemoryError: CUDA out of memory\nshutting down\n",
         "torch.OutOfMemoryError: CUDA out of memory"),
        ("starting\nall quiet\n", "all quiet"),
    ],
)  # fmt: skip
def test_the_telling_log_line(logs: str, told: str) -> None:
    import shlex
    import subprocess

    from sparkvllm.specs.drift_rules import telling_log_line

    command = telling_log_line("X").replace(
        "docker logs --tail 30 X 2>&1", f"printf '%s' {shlex.quote(logs)}"
    )
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True)
    assert out.stdout.rstrip("\n") == told


RANK = "sparkvllm-spark-rank-spark-2"


def test_the_native_launcher_is_checked_by_its_own_containers(spark_raw: dict[str, Any]) -> None:
    """Which launcher runs: the config's, else (auto) the last up's `launcher` output, else
    a Ray head on the head node; each is checked against its own containers."""
    cfg = load_stack_config(spark_raw)  # launcher: auto
    native = healthy(cfg, containers.NATIVE)
    assert find_drift(cfg, STACK, native) == []  # no Ray head: native
    assert find_drift(cfg, STACK, native, {"launcher": {"name": "native"}}) == []
    del native["spark-2"].containers[RANK]
    found = find_drift(cfg, STACK, native, {"launcher": {"name": "native"}})
    assert [(d.node, d.what) for d in found] == [("spark-2", "container missing")]
    assert RANK in found[0].detail
    # The last up ran Ray, and a native group runs now: Ray's containers are missing.
    found = find_drift(cfg, STACK, healthy(cfg, containers.NATIVE), {"launcher": {"name": "ray"}})
    assert ("spark-2", "container missing") in [(d.node, d.what) for d in found]
    # An explicit native on a Ray deployment: the config is not applied yet.
    raw = copy.deepcopy(spark_raw)
    raw["parallelism"]["launcher"] = "native"
    found = find_drift(load_stack_config(raw), STACK, healthy(cfg))
    assert ("spark-2", "container missing") in [(d.node, d.what) for d in found]
    assert ("spark-1", "config not applied") in [(d.node, d.what) for d in found]


def test_the_state_command_reads_both_launchers_containers(spark_raw: dict[str, Any]) -> None:
    cfg = load_stack_config(spark_raw)
    worker = state_command(cfg, STACK, cfg.nodes[1])
    head = state_command(cfg, STACK, cfg.nodes[0])
    assert f"container.{W}=" in worker and f"container.{RANK}=" in worker
    assert head.count(f"container.{S}=") == 1


def test_the_router_is_read_on_the_stacks_head_and_each_fault_named(
    spark_raw: dict[str, Any],
) -> None:
    """A set's router (its own image, not the models'): gone, stopped (with why) or on
    another config is a finding on the head; a running one on the config's spec is none."""
    from sparkvllm.specs.drift_rules import router_drift, router_spec, router_state_command
    from tests.test_models_config import ROUTER, two_models

    raw = two_models(spark_raw)
    assert router_drift(load_stack_config(raw), STACK, NodeLive()) == []  # no router
    raw["router"] = ROUTER
    cfg = load_stack_config(raw)
    spec = router_spec(cfg, STACK)
    assert spec is not None
    command = router_state_command(cfg, STACK)
    subprocess.run(["bash", "-n", "-c", command], check=True)
    assert f"echo container.{spec.name}=" in command
    want = spec.labels[SPEC_LABEL]
    read = parse_state(f"container.{spec.name}=running 0 {want} sha256:{'9' * 64} 0 false\n")
    assert router_drift(cfg, STACK, read) == []
    cases = {
        "": "container missing",
        f"container.{spec.name}=exited 3 {want} {IMG} 5 false\n"
        f"container_log.{spec.name}=yaml: bad key\n": "container not running",
        f"container.{spec.name}=running 0 older {IMG} 0 false\n": "config not applied",
    }
    for stdout, what in cases.items():
        (found,) = router_drift(cfg, STACK, parse_state(stdout))
        assert (found.node, found.what) == ("spark-1", what), found
        assert spec.name in found.detail
    (stopped,) = router_drift(cfg, STACK, parse_state(list(cases)[1]))
    assert "restarted 5 time(s)" in stopped.detail and "yaml: bad key" in stopped.detail
    (gone,) = router_drift(cfg, STACK, NodeLive(error="ssh to 10.1.230.180 failed: timeout"))
    assert gone.what == "unreachable"


def test_the_drift_check_of_a_set_reads_its_router(spark_raw: dict[str, Any]) -> None:
    """sparkvllm.drift.check with stand-in nodes that hold nothing: the router's absence
    is found on the head beside the models' (one more ssh to the head)."""
    from sparkvllm import drift
    from sparkvllm.specs.drift_rules import router_spec
    from sparkvllm.workstation import prepare_ssh_access
    from tests.conftest import ROOT
    from tests.test_models_config import ROUTER, two_models

    raw = two_models(spark_raw)
    raw["router"] = ROUTER
    cfg = load_stack_config(raw)
    spec = router_spec(cfg, STACK)
    assert spec is not None
    asked: list[tuple[str, str]] = []

    def runner(target: Any, command: str, **_: Any) -> subprocess.CompletedProcess[str]:
        asked.append((target.host, command))
        return subprocess.CompletedProcess([], 0, "", "")

    found = drift.check(cfg, STACK, prepare_ssh_access(cfg, STACK, ROOT), runner)
    head = cfg.head_node.ssh.host
    assert [h for h, c in asked if f"container.{spec.name}=" in c] == [head]
    mine = [d for d in found if spec.name in d.detail]
    assert [(d.node, d.what) for d in mine] == [("spark-1", "container missing")]
