"""__main__.py as Pulumi runs it: config from the stack's Pulumi config (JSON strings,
secret keys listed), validated before ANY resource is registered."""

from __future__ import annotations

import json
import runpy
from collections.abc import Iterator
from typing import Any

import pulumi
import pytest
from pulumi.runtime import config as runtime_config

from sparkvllm.config import load_stack_config
from tests.conftest import ROOT
from tests.pulumi_mocks import NodeAnswers, RecordingMonitor, apply_program


@pytest.fixture(autouse=True)
def _clean_pulumi_config() -> Iterator[None]:
    yield
    runtime_config.set_all_config({}, [])


def _set_pulumi_config(raw: dict[str, Any], secret: list[str]) -> None:
    values = {f"spark-vllm:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}
    runtime_config.set_all_config(values, [f"spark-vllm:{k}" for k in secret])


def _main() -> dict[str, Any]:
    runpy.run_path(str(ROOT / "__main__.py"), run_name="__pulumi_main__")
    return {}


def test_main_registers_the_graph_from_pulumi_config(spark_raw: dict[str, Any]) -> None:
    _set_pulumi_config(spark_raw, secret=["ssh_private_key"])
    answers = NodeAnswers(load_stack_config(spark_raw))
    monitor = RecordingMonitor(answers)
    apply_program(_main, answers, stack="spark", monitor=monitor)
    containers = [r for r in monitor.registrations.values() if r.type.endswith("Container")]
    assert len(containers) == 3
    assert all(r.name.startswith(("ray-", "model-server")) for r in containers)


@pytest.mark.parametrize(
    ("change", "secret", "message"),
    [
        (
            {"parallelism": {"tensor": 3}},
            ["ssh_private_key"],
            r"parallelism = .*tensor x pipeline = 3",
        ),
        ({}, [], r"ssh_private_key = '\[secret\]': set in plain text"),
    ],
    ids=["rule broken", "secret in plain text"],
)
def test_bad_config_registers_nothing(
    spark_raw: dict[str, Any], change: dict[str, Any], secret: list[str], message: str
) -> None:
    _set_pulumi_config({**spark_raw, **change}, secret=secret)
    answers = NodeAnswers(load_stack_config(spark_raw))
    monitor = RecordingMonitor(answers)
    with pytest.raises(pulumi.RunError, match=message):
        apply_program(_main, answers, stack="spark", monitor=monitor)
    assert monitor.registrations == {}


def test_runs_leave_the_process_as_they_found_it(spark_raw: dict[str, Any]) -> None:
    """pulumi.dynamic patches pickle's Pickler for each dynamic resource and never undoes
    it (harmless in a process per program); runs in one process must not pile it up."""
    import pickle

    before = pickle._Pickler.__dict__["_batch_setitems"]
    _set_pulumi_config(spark_raw, secret=["ssh_private_key"])
    answers = NodeAnswers(load_stack_config(spark_raw))
    apply_program(_main, answers, stack="spark", monitor=RecordingMonitor(answers))
    assert pickle._Pickler.__dict__["_batch_setitems"] is before
