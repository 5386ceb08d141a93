"""What a config change costs under the docker provider's rules: each Container's new inputs
(the program under Pulumi's mocks) diffed against the old ones by the local engine's
pulumi-docker model (localengine/providers/docker.py, rules in docs/engine-rules.md)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from localengine import wire
from localengine.providers.docker import CONTAINER, DockerProvider
from sparkvllm.config import load_stack_config
from sparkvllm.workstation import prepare_ssh_access
from tests.conftest import ROOT, TEST_PRIVATE_KEY
from tests.pulumi_mocks import run_program

DOCKER = DockerProvider(lambda *a, **k: None, {"host": "ssh://root@spark:22"})


def containers(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cfg = load_stack_config(raw)
    run = run_program(cfg, prepare_ssh_access(cfg, "test", ROOT))
    return {
        r.name: DOCKER.check(CONTAINER, {}, wire.plain(r.state)) for r in run.of_type(CONTAINER)
    }


def replaced(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[str]]:
    """Container name -> the keys that force its replacement."""
    old, new = containers(before), containers(after)
    assert old.keys() == new.keys()
    out = {}
    for name in old:
        diff = DOCKER.diff(CONTAINER, "id", old[name], old[name], new[name])
        if diff.replaces:
            out[name] = diff.replaces
    return out


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(raw: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        d = raw
        for p in parents:
            d = d.setdefault(p, {})
        d[leaf] = value

    return change


def _reverse_hcas(raw: dict[str, Any]) -> None:
    for node in raw["nodes"]:
        node["cluster_link"]["roce_hcas"] = list(reversed(node["cluster_link"]["roce_hcas"]))


def _reorder_speculative(raw: dict[str, Any]) -> None:
    raw["vllm"]["speculative_config"] = {"num_speculative_tokens": 1, "method": "mtp"}


def _rotate_key(raw: dict[str, Any]) -> None:
    raw["ssh_private_key"] = TEST_PRIVATE_KEY.replace("7f3a", "0b2c")


@pytest.fixture
def base(spark_raw: dict[str, Any]) -> dict[str, Any]:
    raw = copy.deepcopy(spark_raw)
    raw["vllm"]["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 1}
    return raw


@pytest.mark.parametrize(
    "change",
    [
        _set("timeouts.server_ready_s", 3000),
        _set("timeouts.ray_ready_s", 900),
        _reverse_hcas,
        _reorder_speculative,
        _rotate_key,
    ],
    ids=[
        "server_ready_s",
        "ray_ready_s",
        "roce_hcas order",
        "speculative_config order",
        "ssh key rotation",
    ],
)
def test_changes_that_replace_no_container(base: dict[str, Any], change: Any) -> None:
    after = copy.deepcopy(base)
    change(after)
    assert replaced(base, after) == {}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (_set("vllm.max_model_len", 4096), {"model-server-container"}),
        (_set("vllm.gpu_memory_utilization", 0.7), {"model-server-container"}),
        (_set("model.served_name", "qwen"), {"model-server-container"}),
    ],
    ids=["max_model_len", "gpu_memory_utilization", "served_name"],
)
def test_server_settings_replace_only_the_model_server(
    base: dict[str, Any], change: Any, expected: set[str]
) -> None:
    after = copy.deepcopy(base)
    change(after)
    assert set(replaced(base, after)) == expected
