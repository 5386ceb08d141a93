"""`vllm.extra_args` read the way vLLM's own parser reads them, so a typed field cannot be
overridden by another spelling of its flag, and no secret is put on argv.

vLLM's `FlexibleArgumentParser` (vllm/utils/argparse_utils.py) is argparse with
`allow_abbrev` left on, plus its own preprocessing. Checked against the real parser of
vLLM 0.32.0 (the sim image, `make_arg_parser(FlexibleArgumentParser())`), spelling by
spelling (tests/test_sim_vllm_parser.py repeats it):

- `--tensor_parallel_size 4`: underscores in a long flag's name become dashes;
- `--pipeline_parallel_size=2`: `--flag=value`;
- `--tensor-parallel 4`, `--hos 1.2.3.4`, `-t 4`: any unique prefix of an option is that
  option (an ambiguous one is an error);
- `--no-enable-prefix-caching`: boolean flags have `--no-` negations;
- `-tp`, `-pp`, `-dp`, `-sc`, `-ep`, `-n`, `-r`: short aliases; `-n2` is `-n 2`, but
  `-tp4` is no option at all (argparse attaches a value to one-letter options only) and
  vLLM stops with "unrecognized arguments": refused here;
- `--speculative-config.method=mtp`, `-sc.method mtp`: dotted keys set one field of a
  JSON option;
- `--config FILE`: options read from a YAML file (any of them);
- `--device-memory-utilization`, `--spec-method/--spec-model/--spec-tokens`: other names
  of typed options;
- `'--tensor-parallel-size 4'` as ONE word: argparse reads a word with a space as a
  positional, and vLLM stops with "unrecognized arguments" after the image is on every
  node; refused here instead;
- the last occurrence of an option wins, so an extra `--tensor-parallel-size` after the
  typed one would silently override it.
"""

from __future__ import annotations

import re

# The typed field each option belongs to (or why the program sets it itself), by every
# name vLLM's serve parser gives it.
_OWNED_BY: dict[str, tuple[str, ...]] = {
    "model.id": ("--model",),
    "parallelism.tensor": ("--tensor-parallel-size", "-tp"),
    "parallelism.pipeline": ("--pipeline-parallel-size", "-pp"),
    "always 1: tensor x pipeline uses every GPU": ("--data-parallel-size", "-dp"),
    # The launcher gives each node its rank (native) or places the ranks by Ray (ray).
    "parallelism.launcher": (
        "--distributed-executor-backend", "--nnodes", "-n", "--node-rank", "-r", "--headless",
    ),
    "ports.master": ("--master-port",),
    "always the head's cluster-link address": ("--master-addr",),
    "always 0.0.0.0": ("--host",),
    "ports.api": ("--port",),
    "model.revision": ("--revision",),
    "model.served_name": ("--served-model-name",),
    "vllm.gpu_memory_utilization": ("--gpu-memory-utilization", "--device-memory-utilization"),
    "vllm.max_model_len": ("--max-model-len",),
    "vllm.max_num_batched_tokens": ("--max-num-batched-tokens",),
    "vllm.kv_cache_dtype": ("--kv-cache-dtype",),
    "vllm.dtype": ("--dtype",),
    "vllm.load_format": ("--load-format",),
    "vllm.enable_prefix_caching": ("--enable-prefix-caching", "--no-enable-prefix-caching"),
    "vllm.reasoning_parser": ("--reasoning-parser",),
    "vllm.enable_auto_tool_choice": (
        "--enable-auto-tool-choice", "--no-enable-auto-tool-choice",
    ),
    "vllm.tool_call_parser": ("--tool-call-parser",),
    "vllm.speculative_config": (
        "--speculative-config", "-sc", "--spec-method", "--spec-model", "--spec-tokens",
    ),
    "vllm.enable_expert_parallel": (
        "--enable-expert-parallel", "--no-enable-expert-parallel", "-ep",
    ),
    "vllm.language_model_only": ("--language-model-only", "--no-language-model-only"),
    "a file of options could set any typed field": ("--config",),
}  # fmt: skip
_SECRETS: dict[str, tuple[str, ...]] = {
    "use api_key (a Pulumi secret): on argv it is in the state, `ps` and `docker inspect` in "
    "plain text": ("--api-key",),
    "keep the HF token out of extra_args: on argv it is in the state, `ps` and `docker "
    "inspect` in plain text": ("--hf-token",),
}

OWNED_FLAGS: dict[str, str] = {f: owner for owner, fs in _OWNED_BY.items() for f in fs}
SECRET_FLAGS: dict[str, str] = {f: fix for fix, fs in _SECRETS.items() for f in fs}
_ALL = {**OWNED_FLAGS, **SECRET_FLAGS}
# Values that look like tokens: Hugging Face (hf_...) and OpenAI-style (sk-...) keys.
_SECRET_VALUE = re.compile(r"hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{20,}")


def _key(word: str) -> str:
    """The option name vLLM's parser looks up for `word` (which starts with '-')."""
    key = word.split("=", 1)[0]
    if key.startswith("--"):
        key = "--" + key[2:].replace("_", "-")
    return key.split(".", 1)[0]  # `--json-option.field`: dotted keys set that option


def _reads_as(key: str) -> list[str]:
    """The options of ours `key` can stand for: itself, or one it is a prefix of
    (argparse's abbreviations), or for a short option with its value attached (`-n2`)."""
    if key in _ALL:
        return [key]
    long = key.startswith("--")
    if len(key) < (4 if long else 2):
        return []
    found = [f for f in _ALL if f.startswith(key) and f.startswith("--") == long]
    if not long and key[:2] in _ALL:
        found.append(key[:2])
    return found


def _attached_to_long_short(key: str) -> str | None:
    """For `-tp4`: the short option of two or more letters it starts with (`-tp`), which
    argparse cannot read with its value attached (only `-n2` works: one letter)."""
    if key.startswith("--") or key in _ALL:
        return None
    shorts = [f for f in _ALL if not f.startswith("--") and len(f) > 2 and key.startswith(f)]
    return max(shorts, key=len) if shorts else None


def extra_args_problems(args: list[str]) -> list[tuple[int, str, str]]:
    """(index, problem, fix) for each item of extra_args that vLLM's parser would read as
    a flag a typed field owns, or that puts a secret on argv, or that it cannot read."""
    out: list[tuple[int, str, str]] = []
    for i, word in enumerate(args):
        if any(ord(c) < 32 and c != "\t" for c in word):
            out.append((i, "an argv word cannot hold a newline or NUL", "remove it"))
            continue
        if _SECRET_VALUE.search(word):
            out.append((i, "looks like an access token", SECRET_FLAGS["--api-key"]))
            continue
        if not word.startswith("-") or word in ("-", "--"):
            continue
        name = word.split("=", 1)[0]
        if any(c.isspace() for c in name):
            out.append(
                (
                    i,
                    (
                        "a flag and its value in one word, which vLLM reads as a stray "
                        "positional argument and stops"
                    ),
                    "give one argv word per list item, e.g. ['--max-num-seqs', '8']",
                )
            )
            continue
        key = _key(word)
        attached = _attached_to_long_short(key)
        if attached is not None:
            owner = OWNED_FLAGS.get(attached, "")
            fix = (
                f"remove it and set {owner}"
                if re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", owner)
                else f"give {attached} and its value as two items"
            )
            said = (
                "argparse attaches a value only to a one-letter option, so vLLM reads it as "
                f"no option at all and stops (unrecognized arguments); it means {attached}"
            )
            out.append((i, said, fix))
            continue
        for flag in _reads_as(key):
            read = f"vLLM's parser reads it as {flag}"
            if flag in SECRET_FLAGS:
                out.append((i, f"{read}: a secret on argv", SECRET_FLAGS[flag]))
            elif re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", OWNED_FLAGS[flag]):
                field = OWNED_FLAGS[flag]
                out.append((i, f"{read}, which {field} owns", f"remove it and set {field}"))
            else:
                why = OWNED_FLAGS[flag]
                out.append((i, f"{read}, which the program sets ({why})", "remove it"))
            break
    return out


# The owned options that take no value (argparse store_true and their --no- negations).
BOOLEAN_OPTIONS = frozenset(
    {
        "--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-auto-tool-choice",
        "--no-enable-auto-tool-choice", "--enable-expert-parallel",
        "--no-enable-expert-parallel", "-ep", "--language-model-only",
        "--no-language-model-only", "--headless",
    }
)  # fmt: skip


def options_read(word: str) -> list[str]:
    """The options of ours (owned or secret) vLLM's parser reads the flag `word` as: one, or
    several when it is an ambiguous abbreviation, or none."""
    return _reads_as(_key(word))
