"""A set of models under Pulumi's mock runtime: each model's parts named for it (no URN or
container name shared), one image for all, each model's weights and ranks on its own
nodes, models that share a node started one after another, and the outputs per model."""

from __future__ import annotations

from typing import Any

import pytest

from sparkvllm.config import StackConfig, load_stack_config
from sparkvllm.workstation import prepare_ssh_access
from tests.conftest import ROOT
from tests.pulumi_mocks import Run, run_program
from tests.test_models_config import two_models

CONTAINER = "docker:index/container:Container"


@pytest.fixture
def set_run(spark_raw: dict[str, Any]) -> tuple[StackConfig, Run]:
    cfg = load_stack_config(two_models(spark_raw))
    return cfg, run_program(cfg, prepare_ssh_access(cfg, "test", ROOT))


def test_each_model_has_its_own_parts(set_run: tuple[StackConfig, Run]) -> None:
    _, run = set_run
    containers = {r.name: r for r in run.of_type(CONTAINER)}
    # The model without a name keeps a single-model stack's parts; the coder's carry its
    # name, on its one node, with its own port.
    assert {"model-server-container", "rank-spark-2-container",
            "coder-model-server-container"} <= set(containers)  # fmt: skip
    coder = containers["coder-model-server-container"]
    assert coder.plain("name") == "sparkvllm-test-coder-model-server"
    assert "--port=8001" in coder.plain("command")[0]
    assert "--tensor-parallel-size=1" in coder.plain("command")[0]
    assert "--nnodes=1" in coder.plain("command")[0]
    assert "--master-port=29502" in coder.plain("command")[0]
    assert "spark-2" in coder.provider
    assert not any(r.name.startswith("coder-rank-") for r in run.of_type(CONTAINER))
    names = [c.plain("name") for c in containers.values()]
    assert len(names) == len(set(names))


def test_one_image_for_every_model(set_run: tuple[StackConfig, Run]) -> None:
    _, run = set_run
    names = {r.name for r in run.registrations.values()}
    assert {"image-obtain-spark-1", "image-sync-spark-2", "image-support-spark-1"} <= names
    assert not any(n.startswith("coder-image-obtain") or n.startswith("coder-image-sync")
                   for n in names)  # fmt: skip
    # The coder's own check that the image implements it, on its rank 0, before its weights.
    assert run.depends("coder-model-download-spark-2", "coder-image-support-spark-2")
    assert run.depends("coder-image-support-spark-2", "image-sync-spark-2")


def test_each_model_downloads_on_its_own_first_node(set_run: tuple[StackConfig, Run]) -> None:
    _, run = set_run
    names = {r.name for r in run.registrations.values()}
    assert {"model-download-spark-1", "model-sync-spark-2", "spark-1-hub-access"} <= names
    assert {"coder-model-download-spark-2", "coder-spark-2-hub-access"} <= names
    assert "coder-model-download-spark-1" not in names


def test_models_that_share_a_node_start_one_after_another(
    set_run: tuple[StackConfig, Run],
) -> None:
    """The coder shares spark-2 with the first model's rank: it starts once that model
    answers (never two vLLM start-up profilings on one GB10 at once)."""
    _, run = set_run
    assert run.depends("coder-model-server-container", "model-server-health")
    assert not run.depends("model-server-container", "coder-model-server-health")


def test_the_outputs_name_each_model(set_run: tuple[StackConfig, Run]) -> None:
    _, run = set_run
    models = run.outputs["models"]
    assert set(models) == {"qwen3.5-122b", "coder"}
    assert models["coder"]["endpoint"] == "http://10.1.230.181:8001/v1"
    assert models["coder"]["served_name"] == "coder"
    assert models["coder"]["launcher"]["name"] == "native"
    assert models["qwen3.5-122b"]["endpoint"] == "http://10.1.230.180:8000/v1"
    assert models["coder"]["health"]["ready"] is True
    assert models["coder"]["model"]["id"] == "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8"


def test_a_single_model_stack_has_no_models_output(spark_raw: dict[str, Any]) -> None:
    cfg = load_stack_config(spark_raw)
    run = run_program(cfg, prepare_ssh_access(cfg, "test", ROOT))
    assert "models" not in run.outputs


def test_the_example_set_of_models_deploys_under_mocks() -> None:
    """Pulumi.spark-models.yaml: the seed's Qwen on Ray across both Sparks, a small model on
    spark-2 alone (mocks only: nothing here reaches its example addresses)."""
    from tests.conftest import TEST_PRIVATE_KEY, stack_file

    raw = stack_file("spark-models")
    raw["ssh_private_key"] = TEST_PRIVATE_KEY
    cfg = load_stack_config(raw)
    run = run_program(cfg, prepare_ssh_access(cfg, "test", ROOT))
    names = {r.name for r in run.of_type(CONTAINER)}
    assert {"ray-head-container", "ray-worker-spark-2-container", "model-server-container",
            "small-model-server-container"} <= names  # fmt: skip
    assert run.outputs["models"]["small"]["launcher"]["name"] == "native"
    assert run.outputs["models"]["qwen3.5-122b"]["launcher"]["name"] == "ray"
    assert run.depends("small-model-server-container", "model-server-health")


def test_the_memory_plan_is_an_output(set_run: tuple[StackConfig, Run]) -> None:
    """The mocks' nodes have 122.5 GiB (MemTotal 128452096 kB); each model's weights 8 GiB."""
    _, run = set_run
    spark2 = run.outputs["memory"]["spark-2"]
    assert spark2["total_gib"] == 122.5 and spark2["reserve_gib"] == 18.4
    assert spark2["models"]["coder"] == {
        "fraction": 0.25, "budget_gib": 30.6, "weights_gib": 8.0, "kv_gib": 22.6,
    }  # fmt: skip
    assert spark2["models"]["qwen3.5-122b"]["weights_gib"] == 4.0  # TP=2: half on each


def test_no_server_starts_while_a_models_weights_leave_it_no_room(
    spark_raw: dict[str, Any],
) -> None:
    from tests.pulumi_mocks import NodeAnswers

    cfg = load_stack_config(two_models(spark_raw))
    answers = NodeAnswers(cfg, weights_bytes={"coder": 31 * 2**30})
    with pytest.raises(Exception, match=r"memory plan: spark-2: model coder's weights take "
                       r"31\.0 GiB of its 30\.6 GiB budget"):  # fmt: skip
        run_program(cfg, prepare_ssh_access(cfg, "test", ROOT), answers)


def test_a_plan_over_a_nodes_memory_is_refused_before_anything_is_touched(
    spark_raw: dict[str, Any],
) -> None:
    """The coder's weights (31 GiB, as the hub lists them) do not fit its 30.6 GiB budget on
    spark-2: the preflight read every node and asked the hub, and then nothing else ran:
    no link measured, no image obtained, no weights downloaded, no container."""
    from tests.pulumi_mocks import NodeAnswers, RecordingMonitor

    cfg = load_stack_config(two_models(spark_raw))
    answers = NodeAnswers(cfg, weights_bytes={"coder": 31 * 2**30})
    monitor = RecordingMonitor(answers)
    with pytest.raises(Exception, match=r"memory plan: spark-2: model coder's weights take "
                       r"31\.0 GiB of its 30\.6 GiB budget \(0\.25 of 122\.5 GiB\)"):  # fmt: skip
        run_program(cfg, prepare_ssh_access(cfg, "test", ROOT), answers, monitor)
    # What acts on a node: its steps, commands and containers (components only group them).
    acting = ("pulumi-python:dynamic:Resource", "command:remote:Command", CONTAINER)
    ran = {r.name for r in monitor.registrations.values() if r.type in acting}
    # The servers' guards only read (a liveness probe, which finds no server yet).
    guards = {"model-server-guard", "rank-guard-spark-2", "coder-model-server-guard"}
    assert ran - guards == {"spark-1-facts", "spark-2-facts", "spark-1-links", "spark-2-links",
                            "spark-1-hub-access", "coder-spark-2-hub-access"}  # fmt: skip


def test_one_endpoint_routes_to_each_model(spark_raw: dict[str, Any]) -> None:
    """The router on the head: its model list names each model's own server; the stack's
    api_key is its key (secret environment, never in its spec); `endpoint` is its."""
    import json

    from tests.conftest import TEST_API_KEY
    from tests.test_models_config import ROUTER

    raw = {**two_models(spark_raw), "router": ROUTER, "api_key": TEST_API_KEY}
    cfg = load_stack_config(raw)
    run = run_program(cfg, prepare_ssh_access(cfg, "test", ROOT))
    router = run.by_name("router-container")
    assert "spark-1" in router.provider and router.plain("name") == "sparkvllm-test-router"
    env = dict(e.split("=", 1) for e in router.plain("envs"))
    listed = json.loads(env["SPARKVLLM_ROUTER_CONFIG"])["model_list"]
    assert [(m["model_name"], m["litellm_params"]["api_base"]) for m in listed] == [
        ("qwen3.5-122b", "http://192.168.100.10:8000/v1"),
        ("coder", "http://192.168.100.11:8001/v1"),
    ]
    assert env["LITELLM_MASTER_KEY"] == TEST_API_KEY and router.secret_input("envs")
    assert TEST_API_KEY not in json.dumps(listed)
    assert "--port 4000" in router.plain("command")[0]
    assert run.outputs["endpoint"] == "http://10.1.230.180:4000/v1"
    assert run.outputs["router"]["endpoint"] == run.outputs["endpoint"]
    assert run.depends("router-container", "router-image-obtain-spark-1")
    assert run.depends("router-ready", "router-container")


def test_a_router_without_a_key_is_told_so_and_warned(spark_raw: dict[str, Any]) -> None:
    """LiteLLM refuses to start without a master key (litellm 1.108.7
    proxy/auth/master_key_boot_check.py) unless told that is meant: a stack without
    api_key runs its servers without one too, and every preview and up says so."""
    import json

    from sparkvllm.specs import plans
    from sparkvllm.specs.router_container import router_config
    from tests.test_models_config import ROUTER

    cfg = load_stack_config({**two_models(spark_raw), "router": ROUTER})
    settings = json.loads(router_config(cfg))["general_settings"]
    assert settings == {"dangerously_permit_weak_or_unset_master_key": True}
    assert any("the router listens on 0.0.0.0:4000 of spark-1 with no api_key" in w
               for w in plans.warnings(cfg))  # fmt: skip


@pytest.mark.parametrize(
    ("change", "changed"),
    [
        (lambda m: m["vllm"].update(max_model_len=8192), {"coder-model-server-container"}),
        (lambda m: m.update(revision="0123abc"), {"coder-model-server-container"}),
    ],
    ids=["flags", "revision"],
)
def test_changing_one_model_changes_only_its_own_parts(
    spark_raw: dict[str, Any], change: Any, changed: set[str]
) -> None:
    """Every registration of the other model (and of the nodes and the image) is the
    same, input for input; the changed model's server is among what changes."""
    import copy

    raw = two_models(spark_raw)
    before = run_program(
        load_stack_config(raw), prepare_ssh_access(load_stack_config(raw), "test", ROOT)
    )
    after_raw = copy.deepcopy(raw)
    change(after_raw["models"][1])
    cfg = load_stack_config(after_raw)
    after = run_program(cfg, prepare_ssh_access(cfg, "test", ROOT))
    differ = {
        r.name
        for urn, r in after.registrations.items()
        if urn not in before.registrations or before.registrations[urn].state != r.state
    }
    assert changed <= differ
    # Besides the coder's parts, only each node's preflight steps' registrations differ:
    # their judge carries the stack's public config (specs/facts.py public_config), which
    # is no defining input of a NodeStep, so its diff finds no change and the engine keeps
    # them (the single-model case, a flag change planning only the server, is
    # tests/test_plan_engine.py's).
    preflight = {f"{n}-{step}" for n in ("spark-1", "spark-2") for step in ("facts", "links")}
    assert {n for n in differ if not n.startswith("coder-")} == preflight, differ
