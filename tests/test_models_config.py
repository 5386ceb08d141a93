"""A set of models in the stack config (`models:`): the single-model form is a set of one,
and every rule of the set (names, served names, ports, Ray, nodes, GPUs, the memory each
node is promised) is refused in one line naming the field, the value and the fix."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from sparkvllm.config import ConfigError, load_stack_config
from sparkvllm.config.stack import model_nodes, model_ports
from sparkvllm.specs.facts import public_config

Raw = dict[str, Any]


def two_models(spark_raw: Raw) -> Raw:
    """The spark stack as a set: its Qwen across both Sparks (no name: it keeps the
    single-model stack's names and ports) and a small coder on spark-2 alone."""
    raw = copy.deepcopy(spark_raw)
    big = {
        **raw.pop("model"),
        "parallelism": raw.pop("parallelism"),
        "vllm": {**raw.pop("vllm"), "gpu_memory_utilization": 0.6},
    }
    small = {
        "name": "coder",
        "id": "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8",
        "served_name": "coder",
        "hf_cache": big["hf_cache"],
        "parallelism": {"tensor": 1, "launcher": "native"},
        "vllm": {"gpu_memory_utilization": 0.25},
        "nodes": ["spark-2"],
        "ports": {"api": 8001, "master": 29502},
    }
    raw["models"] = [big, small]
    return raw


# A router on the head (LiteLLM's proxy, pulled on a Spark).
ROUTER: dict[str, Any] = {
    "image": {"ref": "ghcr.io/berriai/litellm:v1.108.7-stable", "source": "pull"}
}


@pytest.fixture
def models_raw(spark_raw: Raw) -> Raw:
    return two_models(spark_raw)


def test_the_single_form_is_a_set_of_one(spark_raw: Raw) -> None:
    cfg = load_stack_config(spark_raw)
    (only,) = cfg.served
    assert cfg.single_form
    assert only.name is None
    assert only.id == spark_raw["model"]["id"]
    assert only.parallelism.tensor == spark_raw["parallelism"]["tensor"]
    assert only.vllm.max_model_len == spark_raw["vllm"]["max_model_len"]
    assert cfg.model is only and cfg.vllm is only.vllm
    assert [n.name for n in model_nodes(cfg, only)] == ["spark-1", "spark-2"]
    assert model_ports(cfg, only) == (8000, 29501)


def test_a_set_of_two_is_each_model_with_its_own_nodes_and_ports(models_raw: Raw) -> None:
    cfg = load_stack_config(models_raw)
    big, small = cfg.served
    assert not cfg.single_form
    assert [n.name for n in model_nodes(cfg, big)] == ["spark-1", "spark-2"]
    assert [n.name for n in model_nodes(cfg, small)] == ["spark-2"]
    assert model_ports(cfg, big) == (8000, 29501)
    assert model_ports(cfg, small) == (8001, 29502)
    with pytest.raises(RuntimeError, match="serves 2"):
        _ = cfg.model  # a part that serves one model must be given it


def test_a_list_of_one_is_the_single_form(spark_raw: Raw) -> None:
    """The same model written either way is the same set."""
    single = load_stack_config(spark_raw)
    listed = copy.deepcopy(spark_raw)
    listed["models"] = [
        {**listed.pop("model"), "parallelism": listed.pop("parallelism"),
         "vllm": listed.pop("vllm")}
    ]  # fmt: skip
    assert load_stack_config(listed).served == single.served


def test_a_single_model_stack_carries_the_text_it_always_did(spark_raw: Raw) -> None:
    """A check step's judge carries `public_config` into the state: a new field must not
    change a deployed single-model stack's text (its steps would be updated)."""
    text = public_config(load_stack_config(spark_raw))
    assert '"models"' not in text and '"single_model"' not in text
    assert '"model": {' in text and '"parallelism": {' in text and '"vllm": {' in text


def test_pulumis_injected_vllm_default_is_not_the_single_form(models_raw: Raw) -> None:
    """Pulumi.yaml declares `vllm` with default {}, which the CLI injects into every stack
    that lacks it (pkg/workspace/config.go mergeConfig): not a second form."""
    models_raw["vllm"] = {}
    assert len(load_stack_config(models_raw).served) == 2


def _set(path: str, value: Any) -> Callable[[Raw], None]:
    def apply(raw: Raw) -> None:
        target: Any = raw
        parts = re.findall(r"[^.\[\]]+", path)
        for p in parts[:-1]:
            target = target[int(p)] if p.isdigit() else target[p]
        last = parts[-1]
        target[int(last) if last.isdigit() else last] = value

    return apply


def _drop(key: str) -> Callable[[Raw], None]:
    return lambda raw: raw.pop(key)


def _ports(i: int, api: int, master: int) -> Callable[[Raw], None]:
    return _set(f"models[{i}].ports", {"api": api, "master": master})


def _all(*changes: Callable[[Raw], None]) -> Callable[[Raw], None]:
    def apply(raw: Raw) -> None:
        for change in changes:
            change(raw)

    return apply


def _both_named(name: str) -> Callable[[Raw], None]:
    def apply(raw: Raw) -> None:
        raw["models"][0]["name"] = name
        raw["models"][1]["name"] = name

    return apply


# (case id, change to the two-model stack, field path in the message, words of the problem)
BAD_SETS: list[tuple[str, Callable[[Raw], None], str, str]] = [
    (
        "both forms",
        _set("model", {"id": "a/b", "hf_cache": "/x"}),
        "model",
        "the single-model form beside models",
    ),
    ("neither form", _drop("models"), "model", "Field required"),
    ("an empty set", _set("models", []), "models", "at least 1 item"),
    (
        "a model on an unknown node",
        _set("models[1].nodes", ["spark-9"]),
        "models[1].nodes",
        "not a node name (nodes are spark-1, spark-2)",
    ),
    (
        "a node listed twice",
        _set("models[1].nodes", ["spark-2", "spark-2"]),
        "models[1].nodes",
        "listed twice",
    ),
    (
        "TP x PP over its nodes' GPUs",
        _set("models[1].parallelism", {"tensor": 2}),
        "models[1].parallelism",
        "tensor x pipeline = 2, but its nodes declare 1 GPU(s)",
    ),
    (
        "TP x PP under every node's GPUs",
        _set("models[0].parallelism", {"tensor": 1}),
        "models[0].parallelism",
        "tensor x pipeline = 1, but the nodes declare 2 GPU(s)",
    ),
    (
        "two served under one name",
        _set("models[1].served_name", "qwen3.5-122b"),
        "models[1].served_name",
        "models[0] is served under this name too",
    ),
    (
        "two without a name",
        _set("models[1].name", None),
        "models[1].name",
        "models[0] has no name either",
    ),
    ("two with one name", _both_named("coder"), "models[1].name", "already the name of models[0]"),
    (
        "a name that is no name",
        _set("models[1].name", "Coder_1"),
        "models[1].name",
        "model names are 1-20 lowercase letters",
    ),
    (
        "two on the stack's ports",
        _set("models[1].ports", None),
        "models[1].ports",
        "models[0] already uses the stack's ports (api 8000, master 29501)",
    ),
    (
        "an API port the other model has",
        _ports(1, 8000, 29502),
        "models[1].ports.api",
        "port 8000 is already ports.api",
    ),
    (
        "a rendezvous port the other model has",
        _ports(1, 8001, 29501),
        "models[1].ports.master",
        "port 29501 is already ports.master",
    ),
    (
        "a model port that is Ray's GCS",
        _ports(1, 6379, 29502),
        "models[1].ports.api",
        "port 6379 is already ports.ray_gcs",
    ),
    (
        "a model port in Ray's worker range",
        _ports(1, 8001, 12000),
        "models[1].ports.master",
        "Ray's worker port range",
    ),
    (
        "one model's two ports alike",
        _ports(1, 8001, 8001),
        "models[1].ports.master",
        "port 8001 is already models[1].ports.api",
    ),
    (
        "two models on Ray",
        _all(
            _set("models[0].parallelism.launcher", "ray"),
            _set("models[1].parallelism", {"tensor": 1, "launcher": "ray"}),
        ),
        "models[1].parallelism.launcher",
        "models[0] already runs on the stack's Ray cluster",
    ),
    (
        "a reserved variable in one model",
        _set("models[1].vllm.env", {"VLLM_HOST_IP": "x"}),
        "models[1].vllm.env.VLLM_HOST_IP",
        "set per node by the program",
    ),
    (
        "a router on a model's port",
        _set("router", {**ROUTER, "port": 8001}),
        "router.port",
        "port 8001 is already models[1].ports.api",
    ),
    (
        "a router on Ray's port",
        _set("router", {**ROUTER, "port": 6379}),
        "router.port",
        "port 6379 is already ports.ray_gcs",
    ),
    (
        "a router built for another arch",
        _set("router", {"image": {**ROUTER["image"], "arch": "x86_64"}}),
        "router.image.arch",
        "the router runs on the head, whose image is aarch64",
    ),
    (
        "a node no model runs on",
        _all(
            _set("models[0].nodes", ["spark-1"]),
            _set("models[0].parallelism", {"tensor": 1}),
            _set("models[1].nodes", ["spark-1"]),
        ),
        "nodes[1]",
        "no model runs on this node",
    ),
    (
        "a name that is the unnamed model's served name",
        _all(_set("models[0].served_name", "big"), _set("models[1].name", "big")),
        "models[1].name",
        "models[0] has no name and is known by its served name, which is this",
    ),
    (
        "an unnamed model served under another's name",
        _all(_set("models[0].name", "coder"), _set("models[1].name", None)),
        "models[0].name",
        "models[1] has no name and is known by its served name, which is this",
    ),
    (
        "a worker's sshd on the port its model serves on",
        _set("nodes[1].ssh.port", 8001),
        "nodes[1].ssh.port",
        "sshd on spark-2 listens on it, and so would models[1].ports.api there",
    ),
    (
        "the head's sshd on the router's port",
        _all(_set("router", ROUTER), _set("nodes[0].ssh.port", 4000)),
        "nodes[0].ssh.port",
        "sshd on spark-1 listens on it, and so would router.port there",
    ),
    (
        "a sshd in Ray's worker range on a node of the Ray model",
        _all(_set("models[0].parallelism.launcher", "ray"), _set("nodes[1].ssh.port", 12000)),
        "nodes[1].ssh.port",
        "so would Ray's worker port range there",
    ),
    (
        "a node promised more than its memory",
        _set("models[1].vllm.gpu_memory_utilization", 0.35),
        "models (node spark-2)",
        "promised 95% of its memory, over 90%",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "path", "problem"), [c[1:] for c in BAD_SETS], ids=[c[0] for c in BAD_SETS]
)
def test_a_bad_set_names_field_value_and_fix(
    models_raw: Raw, mutate: Callable[[Raw], None], path: str, problem: str
) -> None:
    mutate(models_raw)
    with pytest.raises(ConfigError) as info:
        load_stack_config(models_raw)
    text = str(info.value)
    lines = [line for line in text.splitlines() if line.startswith(f"  - {path} = ")]
    assert lines, f"no line for {path!r} in:\n{text}"
    assert problem in lines[0], lines[0]
    assert re.match(rf"  - {re.escape(path)} = .+: .+\. Fix: .+\.$", lines[0]), lines[0]


def test_the_memory_line_names_each_model_and_its_share(models_raw: Raw) -> None:
    _set("models[1].vllm.gpu_memory_utilization", 0.35)(models_raw)
    with pytest.raises(ConfigError) as info:
        load_stack_config(models_raw)
    (line,) = [x for x in str(info.value).splitlines() if "node spark-2" in x]
    assert "'qwen3.5-122b 0.6 + coder 0.35 = 0.95'" in line
    assert "Fix: lower vllm.gpu_memory_utilization of one of them" in line
    # spark-1 holds only the big model: no line for it.
    assert "node spark-1" not in str(info.value)


def test_a_set_that_fits_each_node_is_accepted(models_raw: Raw) -> None:
    """0.6 + 0.25 on spark-2 (0.85) and 0.6 alone on spark-1: within 0.9."""
    cfg = load_stack_config(models_raw)
    assert [m.vllm.gpu_memory_utilization for m in cfg.served] == [0.6, 0.25]


# --- the memory plan with figures (sparkvllm/specs/memory.py) ---------------------------

GB10_GIB = 119.7  # what a GB10's MemTotal reads (unified memory, less the firmware's)


def test_the_plan_gives_each_model_its_budget_weights_and_kv(models_raw: Raw) -> None:
    from sparkvllm.specs.memory import memory_plan, problems

    cfg = load_stack_config(models_raw)
    sizes = {"qwen3.5-122b": 125 * 2**30, "coder": 31 * 2**30}
    plan = memory_plan(cfg, {"spark-1": GB10_GIB, "spark-2": GB10_GIB}, sizes)
    spark1, spark2 = (n.as_output() for n in plan)
    # TP=2: each node holds half the big model's weights; the coder (TP=1) all of its own.
    assert spark1["models"] == {
        "qwen3.5-122b": {"fraction": 0.6, "budget_gib": 71.8, "weights_gib": 62.5,
                         "kv_gib": 9.3},
    }  # fmt: skip
    assert spark2["models"] == {
        "qwen3.5-122b": {"fraction": 0.6, "budget_gib": 71.8, "weights_gib": 62.5,
                         "kv_gib": 9.3},
        "coder": {"fraction": 0.25, "budget_gib": 29.9, "weights_gib": 31.0, "kv_gib": -1.1},
    }  # fmt: skip
    assert spark1["reserve_gib"] == 47.9 and spark2["reserve_gib"] == 18.0
    (line,) = problems(plan)
    assert line.startswith("memory plan: spark-2: model coder's weights take 31.0 GiB of its "
                           "29.9 GiB budget (0.25 of 119.7 GiB), leaving 0.0 GiB")  # fmt: skip
    assert "fix: raise its vllm.gpu_memory_utilization" in line


def test_the_plan_says_nothing_it_does_not_know(models_raw: Raw) -> None:
    """Before the facts and the weights are read (a preview of a new stack): fractions only."""
    from sparkvllm.specs.memory import memory_plan, problems

    plan = memory_plan(load_stack_config(models_raw), {}, {})
    assert problems(plan) == []
    out: dict[str, Any] = plan[1].as_output()
    assert out["total_gib"] is None and out["reserve_gib"] is None
    assert out["models"]["coder"] == {"fraction": 0.25, "budget_gib": None,
                                      "weights_gib": None, "kv_gib": None}  # fmt: skip


def test_a_model_that_fits_is_no_problem(models_raw: Raw) -> None:
    from sparkvllm.specs.memory import memory_plan, problems

    cfg = load_stack_config(models_raw)
    sizes = {"qwen3.5-122b": 125 * 2**30, "coder": 8 * 2**30}
    assert problems(memory_plan(cfg, {"spark-1": GB10_GIB, "spark-2": GB10_GIB}, sizes)) == []


def test_a_misspelt_key_is_told_the_keys_a_stack_file_writes(models_raw: Raw) -> None:
    """The allowed keys and a field's description are the stack file's (`model`, not the
    field's internal name), down a `models:` entry too."""
    models_raw["modle"] = {}
    models_raw["models"][1]["vlm"] = {}
    models_raw["models"][1]["parallelism"] = {"tensor": "two"}
    with pytest.raises(ConfigError) as info:
        load_stack_config(models_raw)
    text = str(info.value)
    top = next(line for line in text.splitlines() if "  - modle = " in line)
    assert "model, parallelism, vllm, models, router," in top and "single_" not in top
    inner = next(line for line in text.splitlines() if "  - models[1].vlm = " in line)
    assert "allowed here: id, revision" in inner and "nodes, ports" in inner
    tensor = next(line for line in text.splitlines() if "models[1].parallelism.tensor" in line)
    assert "Fix: give tensor (tensor-parallel size (--tensor-parallel-size))." in tensor


def test_a_model_off_the_stacks_head_is_reached_at_its_own_host(models_raw: Raw) -> None:
    """endpoint_host names the stack's head; a model whose rank 0 is elsewhere is reached
    at that node's own ssh host."""
    models_raw["endpoint_host"] = "spark1.lan"
    cfg = load_stack_config(models_raw)
    big, small = (cfg.for_model(m) for m in cfg.served)
    assert big.endpoint_host == "spark1.lan" and small.endpoint_host is None


def test_a_sshd_port_is_refused_only_where_a_server_listens_on_it(models_raw: Raw) -> None:
    """The coder serves on spark-2 alone: its ports on spark-1, and the big model's
    (native in a set) Ray ports anywhere, are free for a sshd."""
    _set("nodes[0].ssh.port", 8001)(models_raw)
    _set("nodes[1].ssh.port", 6379)(models_raw)
    assert [n.ssh.port for n in load_stack_config(models_raw).nodes] == [8001, 6379]


def test_a_single_models_head_sshd_on_the_ray_gcs_port_is_refused(spark_raw: Raw) -> None:
    """The single form under launcher auto may run Ray: its GCS port on the head is taken."""
    spark_raw["nodes"][0]["ssh"]["port"] = spark_raw.get("ports", {}).get("ray_gcs", 6379)
    with pytest.raises(ConfigError, match=r"nodes\[0\]\.ssh\.port = \d+: sshd on spark-1"):
        load_stack_config(spark_raw)
    spark_raw["parallelism"]["launcher"] = "native"
    assert load_stack_config(spark_raw).single_form
