"""The owned-flag check against vLLM's REAL parser (the sim image's vLLM): every spelling
that vLLM reads as a typed field's option, or as a secret, is refused by
`extra_args_problems`; the spellings it refuses are the ones vLLM reads that way.

The parser runs in a throwaway container of the image with no network; nothing is served.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from sim.settings import VLLM_IMAGE_REF
from sparkvllm.config import StackConfig, load_stack_config
from sparkvllm.config_sources import stack_without_secrets as stack_raw
from sparkvllm.recipes import formats, mapping, shipped
from sparkvllm.specs import containers
from sparkvllm.vllm_flags import extra_args_problems
from tests.conftest import ROOT

pytestmark = pytest.mark.sim

# The serve parser, and what each argv (after the model) sets that a typed field owns.
PROBE = """
import contextlib, io, json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
parser = make_arg_parser(FlexibleArgumentParser())
base = vars(parser.parse_args(["m"]))
owned = json.loads(sys.argv[1])
for argv in json.loads(sys.argv[3]):  # whole serve argvs: what each one sets
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            got = vars(parser.parse_args(argv))
    except BaseException:
        print(json.dumps({"argv": argv, "error": err.getvalue()[-500:]}))
        continue
    shown = {k: got.get(k) for k in [*owned, "model_tag"]}
    print(json.dumps({"argv": argv, "error": "", "set": shown}, default=str))
for words in json.loads(sys.argv[2]):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            got = vars(parser.parse_args(["m", *words]))
    except BaseException:
        print(json.dumps({"words": words, "error": True}))
        continue
    changed = sorted(k for k in owned if got.get(k) != base.get(k))
    print(json.dumps({"words": words, "error": False, "changed": changed}))
"""
# vLLM's dest names of the options a typed field owns, and of the secrets.
OWNED_DESTS = [
    "model", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "nnodes",
    "node_rank", "distributed_executor_backend", "host", "port", "revision",
    "served_model_name", "gpu_memory_utilization", "max_model_len", "max_num_batched_tokens",
    "kv_cache_dtype", "dtype", "load_format", "enable_prefix_caching", "reasoning_parser",
    "enable_auto_tool_choice", "tool_call_parser", "speculative_config",
    "enable_expert_parallel", "language_model_only", "api_key", "hf_token",
    # --spec-method/--spec-model/--spec-tokens: merged into speculative_config later.
    "spec_method", "spec_model", "spec_tokens",
]  # fmt: skip
SPELLINGS = [
    ["--tensor_parallel_size", "4"], ["--tensor-parallel", "4"], ["--tensor-parallel-size=4"],
    ["--pipeline_parallel_size=2"], ["-tp", "4"], ["-tp=4"], ["-t", "4"], ["-pp", "2"],
    ["--hos", "1.2.3.4"], ["--host=1.2.3.4"], ["--por", "9"], ["--served_model", "x"],
    ["--api_key", "k"], ["--api-key=k"], ["--hf_token", "t"], ["--no-enable-prefix-caching"],
    ["--enable-prefix"], ["--speculative-config.method=mtp"], ["-sc.method", "mtp"],
    ["--spec-tokens", "2"], ["--device-memory-util", "0.5"], ["--max_model_len=64"],
    ["-dp", "2"], ["-n2"], ["--model", "x"], ["--kv_cache_dtype", "fp8"], ["--dtype=half"],
    ["--language-model-only"], ["-ep"], ["--distributed_executor_backend", "mp"],
    # Legitimate arguments: vLLM reads none of them as an owned option.
    ["--enforce-eager"], ["--max-num-seqs", "8"], ["--max_num_seqs=8"], ["-O3"],
    ["--trust-remote-code"], ["--swap-space", "4"], ["--model-impl", "vllm"],
    ["--data-parallel-size-local", "1"], ["-q", "fp8"], ["--enable-chunked-prefill"],
]  # fmt: skip


def recipe_servers() -> list[tuple[str, StackConfig, list[str]]]:
    """(recipe, the stack's view of its model, the `vllm serve` argv of each rank after
    `vllm serve`) for each project recipe, imported onto the spark-models stack's nodes
    (the argv only: nothing is sent to those example addresses)."""
    out = []
    for name, path in shipped().items():
        imported = mapping.import_recipe(formats.read(path), hf_cache="/home/aurora/.cache/hf")
        raw = {**stack_raw("spark-models", ROOT), "image": imported.image}
        entry = mapping.checked(imported, None)["models"][0]
        ranks = entry["parallelism"]["tensor"] * entry["parallelism"].get("pipeline", 1)
        raw["nodes"] = raw["nodes"][:ranks]
        raw["models"] = [entry]
        cfg = load_stack_config(raw)
        view = cfg.for_model(cfg.served[0])
        launcher = view.parallelism.launcher
        # Ray: one server on the head (the other nodes hold Ray workers); native: a rank
        # on each node
        for node in view.nodes if launcher == "native" else [view.head_node]:
            out.append((name, view, containers.vllm_serve_args(view, launcher, node)[2:]))
    return out


@pytest.fixture(scope="module")
def vllm_reads() -> tuple[list[dict[str, object]], list[dict[str, Any]]]:
    """What vLLM's parser makes of each spelling, and of each project recipe's argvs."""
    from sim import stack

    stack.ensure_up()  # builds the sim image if it is not there
    servers = [argv for _, _, argv in recipe_servers()]
    argv = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3",
            VLLM_IMAGE_REF, "-c", PROBE, json.dumps(OWNED_DESTS),
            json.dumps(SPELLINGS), json.dumps(servers)]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith('{"words"')]
    assert [r["words"] for r in rows] == SPELLINGS
    full = [json.loads(line) for line in out.splitlines() if line.startswith('{"argv"')]
    assert [r["argv"] for r in full] == servers
    return rows, full


def test_every_spelling_vllm_reads_as_an_owned_option_is_refused(
    vllm_reads: tuple[list[dict[str, object]], list[dict[str, Any]]],
) -> None:
    wrong = []
    spellings = vllm_reads[0]
    for row in spellings:
        words = row["words"]
        assert isinstance(words, list)
        refused = bool(extra_args_problems(words))
        if row["error"]:
            continue  # vLLM itself stops on it (ambiguous, or missing its value)
        if row["changed"] and not refused:
            wrong.append(f"vLLM reads {words} as {row['changed']}, but it was accepted")
        if not row["changed"] and refused:
            wrong.append(f"vLLM reads {words} as nothing owned, but it was refused")
    assert not wrong, "\n".join(wrong)
    # Both kinds were seen: the check can tell them apart.
    assert any(r["changed"] for r in spellings) and any(
        not r["changed"] and not r["error"] for r in spellings
    )


def test_the_project_recipes_are_read_by_vllms_own_parser(
    vllm_reads: tuple[list[dict[str, object]], list[dict[str, Any]]],
) -> None:
    """Each rank's `vllm serve` argv of each project recipe (sparkvllm/recipes/library) is
    accepted by the real parser and sets what the recipe says."""
    servers = recipe_servers()
    assert {name for name, _, _ in servers} == set(shipped())
    for (name, view, _), row in zip(servers, vllm_reads[1], strict=True):
        assert row["error"] == "", (name, row["error"])
        got, v = row["set"], view.vllm
        assert got["model_tag"] == view.model.id and got["revision"] == view.model.revision
        assert got["tensor_parallel_size"] == view.parallelism.tensor
        assert got["pipeline_parallel_size"] == view.parallelism.pipeline
        assert got["served_model_name"] == [view.model.name_for_clients]
        assert got["gpu_memory_utilization"] == v.gpu_memory_utilization
        assert got["max_model_len"] == v.max_model_len
        assert got["load_format"] == v.load_format
        assert got["kv_cache_dtype"] == v.kv_cache_dtype
        assert got["enable_prefix_caching"] is v.enable_prefix_caching
        assert got["tool_call_parser"] == v.tool_call_parser
        assert got["reasoning_parser"] == (v.reasoning_parser or got["reasoning_parser"])
        if v.speculative_config is not None:
            assert json.loads(json.dumps(got["speculative_config"])) == v.speculative_config
