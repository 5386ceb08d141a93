"""The owned-flag check against vLLM's REAL parser (the sim image's vLLM): every spelling
that vLLM reads as a typed field's option, or as a secret, is refused by
`extra_args_problems`; the spellings it refuses are the ones vLLM reads that way.

The parser runs in a throwaway container of the image with no network; nothing is served.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from sim.settings import VLLM_IMAGE_REF
from sparkvllm.vllm_flags import extra_args_problems

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


@pytest.fixture(scope="module")
def vllm_reads() -> list[dict[str, object]]:
    from sim import stack

    stack.ensure_up()  # builds the sim image if it is not there
    argv = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3",
            VLLM_IMAGE_REF, "-c", PROBE, json.dumps(OWNED_DESTS),
            json.dumps(SPELLINGS)]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith('{"words"')]
    assert [r["words"] for r in rows] == SPELLINGS
    return rows


def test_every_spelling_vllm_reads_as_an_owned_option_is_refused(
    vllm_reads: list[dict[str, object]],
) -> None:
    wrong = []
    for row in vllm_reads:
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
    assert any(r["changed"] for r in vllm_reads) and any(
        not r["changed"] and not r["error"] for r in vllm_reads
    )
