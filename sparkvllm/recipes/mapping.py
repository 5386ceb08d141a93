"""A recipe as this program's stack config, and a stack's model as a sparkrun recipe.

Import (`import_recipe`, then `checked`): each flag of the rendered command goes to the
typed field that owns it (read as vLLM's parser reads it: `sparkvllm.vllm_flags`), every
other flag to `vllm.extra_args` word by word; the recipe's `env` to `vllm.env`; the
runtime decides the launcher (`vllm-distributed` native, `vllm-ray` ray, sparkrun's plain
`vllm` by its Ray hints, eugr's by its `--distributed-executor-backend ray`); never `auto`.
What has no place and cannot be done without (a command the recipe would run, another
engine, a flag the program sets to another value) is a RecipeError; what a user can do
without (eugr's mods, build arguments, container options, information fields) is a warning
naming it. The result is validated by the stack config's own rules, on the stack's nodes
when one is given.

Export (`to_recipe`): a sparkrun v2 recipe with an explicit command template (without one,
sparkrun leaves out the parsers, the load format and the speculative config), and the
`spark_vllm` block for what no recipe field holds (the model's short name, hf_cache, its
nodes, its own master port, ...), so importing an export gives the same model entry."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from sparkvllm.config import (
    RESERVED_ENV,
    ConfigError,
    ImageConfig,
    StackConfig,
    load_stack_config,
)
from sparkvllm.config.model import ServedModel
from sparkvllm.recipes.formats import EUGR, SPARKRUN, Recipe, RecipeError, template_keys
from sparkvllm.vllm_flags import BOOLEAN_OPTIONS, OWNED_FLAGS, SECRET_FLAGS, options_read

# sparkrun's runtimes (pyproject entry points) and the launcher each one is.
RUNTIMES = {"vllm-distributed": "native", "vllm-ray": "ray", "eugr-vllm": "ray"}
_NOT_VLLM = ("sglang", "llama-cpp", "trtllm", "atlas")


def human_readable_int(text: str) -> int:
    """vLLM's reading of a token count (engine/arg_utils.py human_readable_int): `32k` is
    32,000, `32K` 32,768 (and m/M, g/G, t/T); otherwise an integer."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text.strip())
    if not m:
        return int(text)
    number, suffix = m.groups()
    if suffix.islower():
        return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
    return int(number) * 2 ** (10 * "KMGT".index(suffix) + 10)


# Typed fields and how a command word's value becomes theirs.
_VALUE_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--gpu-memory-utilization": ("vllm.gpu_memory_utilization", float),
    "--device-memory-utilization": ("vllm.gpu_memory_utilization", float),
    "--max-model-len": ("vllm.max_model_len", human_readable_int),
    "--max-num-batched-tokens": ("vllm.max_num_batched_tokens", human_readable_int),
    "--kv-cache-dtype": ("vllm.kv_cache_dtype", str),
    "--dtype": ("vllm.dtype", str),
    "--load-format": ("vllm.load_format", str),
    "--reasoning-parser": ("vllm.reasoning_parser", str),
    "--tool-call-parser": ("vllm.tool_call_parser", str),
    "--tensor-parallel-size": ("parallelism.tensor", int),
    "-tp": ("parallelism.tensor", int),
    "--pipeline-parallel-size": ("parallelism.pipeline", int),
    "-pp": ("parallelism.pipeline", int),
    "--port": ("ports.api", int),
    "--master-port": ("ports.master", int),
    "--revision": ("revision", str),
    "--model": ("id", str),
}
_FLAG_FIELDS: dict[str, tuple[str, bool]] = {
    "--enable-prefix-caching": ("vllm.enable_prefix_caching", True),
    "--no-enable-prefix-caching": ("vllm.enable_prefix_caching", False),
    "--enable-auto-tool-choice": ("vllm.enable_auto_tool_choice", True),
    "--no-enable-auto-tool-choice": ("vllm.enable_auto_tool_choice", False),
    "--enable-expert-parallel": ("vllm.enable_expert_parallel", True),
    "-ep": ("vllm.enable_expert_parallel", True),
    "--no-enable-expert-parallel": ("vllm.enable_expert_parallel", False),
    "--language-model-only": ("vllm.language_model_only", True),
    "--no-language-model-only": ("vllm.language_model_only", False),
}
# Flags a launcher sets on each node itself (sparkrun's vllm-distributed and eugr's
# launch-cluster.sh add them per node too, and tell users not to write them). Their
# --master-port is not here: it is the model's ports.master.
_PER_NODE = ("--nnodes", "-n", "--node-rank", "-r", "--headless", "--master-addr")
_ANY_HOST = ("0.0.0.0", "::")
# What the program's stack default ports are (a model on them needs no `ports`).
_DEFAULT_API, _DEFAULT_MASTER = 8000, 29501


@dataclass
class Imported:
    """A recipe as stack config: the image, the `models` entry, what to tell the user."""

    image: dict[str, Any]
    entry: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    # Where each entry field came from in the recipe, to name it in an error.
    sources: dict[str, str] = field(default_factory=dict)
    # The command's --distributed-executor-backend (value, command word), if any.
    backend: tuple[str, str] | None = None
    # --speculative-config.KEY values: vLLM applies them after every other argument.
    speculative_keys: dict[str, Any] = field(default_factory=dict)


def _set(out: Imported, path: str, value: Any, source: str) -> None:
    node = out.entry
    *parents, last = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if last in node and node[last] != value and path in out.sources:
        raise RecipeError(
            source,
            value,
            f"{out.sources[path]} already set {path} to {node[last]!r}",
            "give it once",
        )
    node[last] = value
    out.sources.setdefault(path, source)


def _get(out: Imported, path: str) -> Any:
    node: Any = out.entry
    for p in path.split("."):
        node = node.get(p) if isinstance(node, dict) else None
    return node


def import_recipe(
    recipe: Recipe,
    *,
    hf_cache: str | None = None,
    name: str | None = None,
    nodes: list[str] | None = None,
    launcher: str | None = None,
) -> Imported:
    """The recipe's image and `models` entry (not yet checked against a stack)."""
    f = recipe.fields
    out = Imported(image={}, entry={})
    block = f.get("spark_vllm") or {}
    _mapped_fields(recipe, out)
    _command(recipe, out)
    model = f.get("model")
    served_literal = out.entry.get("id")
    if served_literal is None:
        if not model:
            raise RecipeError(
                "command",
                " ".join(recipe.words[:3]),
                "names no model",
                "write the model id after vllm serve",
            )
        _set(out, "id", model, "model")
    elif model and model != served_literal:
        raise RecipeError(
            "model",
            model,
            f"the command serves {served_literal}, another model",
            "make model and the command's model the same",
        )
    revision = f.get("model_revision")
    if revision:
        _set(out, "revision", revision, "model_revision")
    out.entry.setdefault("parallelism", {}).setdefault("tensor", 1)
    decided = _launcher(recipe, out)
    if launcher is not None and launcher != decided:
        out.warnings.append(
            f"runtime: the recipe runs the {decided} launcher; --launcher "
            f"{launcher} runs the {launcher} one instead"
        )
    _set(out, "parallelism.launcher", launcher or decided, "runtime")
    _check_node_counts(recipe, out, nodes)
    _env(recipe, out)
    _own_block(block, out)
    if hf_cache is not None:
        out.entry["hf_cache"] = hf_cache
    if name is not None:
        out.entry["name"] = name
    if nodes is not None:
        out.entry["nodes"] = list(nodes)
    out.entry = reordered(out.entry)
    return out


def _mapped_fields(recipe: Recipe, out: Imported) -> None:
    """The image, and the warnings for every field with no place."""
    f = recipe.fields
    for hook in ("pre_exec", "post_exec", "post_commands"):
        if f.get(hook):
            raise RecipeError(
                hook,
                f[hook],
                "runs commands (in the containers or on this machine); this "
                "program runs no command that a config names",
                f"remove {hook}: build what it does into the image, or run it yourself",
            )
    runtime = str(f.get("runtime") or "")
    if runtime and runtime != "vllm" and runtime not in RUNTIMES:
        known = ", ".join(["vllm", *RUNTIMES])
        why = "another engine, not vLLM" if runtime in _NOT_VLLM else "not a vLLM runtime"
        raise RecipeError("runtime", runtime, why, f"use a vLLM recipe (runtime: {known})")
    container = f.get("container")
    if not container:
        container = "ghcr.io/spark-arena/dgx-vllm-eugr-nightly-tf5:latest"
        out.warnings.append(
            f"container: none given; sparkrun's default for vLLM ({container}) is used"
        )
    out.image = {"ref": container, "source": "pull"}
    if recipe.dialect == EUGR:
        out.image["source"] = "present"
        out.warnings.append(
            f"container: {container} is an image eugr's build-and-copy.sh builds locally; "
            "it is imported with image.source present: build it on the head first (or "
            "save it and use image.source tarball)"
        )
    no_place = {
        "mods": "patches the container at each start (a run.sh); use an image that holds "
        "the patch, or flags a mod supplies (e.g. a chat template file) fail at start",
        "build_args": "builds the image; build it with them elsewhere and use that image",
        "builder": "builds or pulls the image; this program obtains image.ref itself",
        "builder_config": "builds the image; build it elsewhere and use that image",
        "executor_config": "sets `docker run` options; this program sets the container's "
        "options itself",
        "distribution_config": "says what sparkrun copies to which node; this program "
        "copies the model and the image itself (models[].distribution)",
        "runtime_config": "holds settings for sparkrun's runtime, which this program does not run",
        "stop_after_post": "stops after the post hooks, which this program does not run",
        "benchmark": "configures sparkrun's or eugr's benchmark run",
        "metadata": "is information (VRAM figures, description); not carried over",
        "description": "is information; not carried over",
        "runtime_version": "is information; not carried over",
        "sparkrun_version": "is information; not carried over",
        "name": "is the recipe's display name (--name gives the model's short name)",
    }
    for key, why in no_place.items():
        value = f.get(key)
        if value in (None, [], {}, False, ""):
            continue
        if key == "builder" and value == "docker-pull":
            continue
        shown = ", ".join(map(str, value)) if isinstance(value, list) else _brief(value)
        out.warnings.append(f"{key}: {shown}: not imported; it {why}")
    for key in recipe.unused_defaults:
        out.warnings.append(
            f"defaults.{key}: not imported; without a command template sparkrun passes only "
            "the defaults it has a flag for, and leaves this one out"
        )


def _brief(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(map(str, value)) + "}"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _command(recipe: Recipe, out: Imported) -> None:
    words = recipe.words[2:]
    first = 0
    if words and not words[0].startswith("-"):
        _set(out, "id", words[0], "command word 3")
        first = 1
    elif not any(options_read(w) == ["--model"] for w in words):
        raise RecipeError(
            "command",
            " ".join(recipe.words[:4]),
            "names no model right after `vllm serve` (after a flag, a word may be its value "
            "or the model: which, only vLLM's parser knows)",
            "write the model right after vllm serve",
        )
    extra: list[str] = []
    i = first
    while i < len(words):
        word, where = words[i], f"command word {i + 3}"
        if not word.startswith("-") or re.fullmatch(r"-\d.*", word):
            raise RecipeError(
                where,
                word,
                "a second positional argument (vLLM takes one: the model)",
                "remove it, or give it to its flag",
            )
        found = options_read(word)
        if len(found) > 1:
            raise RecipeError(
                where,
                word,
                f"an abbreviation of {', '.join(sorted(found))}; vLLM stops on it",
                "write the option out in full",
            )
        if not found:  # no typed field owns it: the flag and the values after it
            extra.append(word)
            i += 1
            while i < len(words) and (
                not words[i].startswith("-") or re.fullmatch(r"-\d.*", words[i])
            ):
                extra.append(words[i])
                i += 1
            continue
        flag = found[0]
        value: str | None = None
        consumed = 1
        if "=" in word:
            if flag in BOOLEAN_OPTIONS:
                raise RecipeError(
                    where, word, f"{flag} takes no value (vLLM stops on it)",
                    f"write {flag} alone, or leave it out",
                )  # fmt: skip
            value = word.split("=", 1)[1]
        elif re.fullmatch(r"-[a-z]\d+", word):
            value = word[2:]  # `-n2`: one-letter options take an attached value
        elif flag not in BOOLEAN_OPTIONS:
            if i + 1 >= len(words):
                raise RecipeError(where, word, "the option has no value", "give its value")
            value, consumed = words[i + 1], 2
        if flag == "--served-model-name" and i + consumed < len(words):
            after = words[i + consumed]
            if not after.startswith("-"):
                raise RecipeError(
                    where, f"{word} {value} {after}", "several served names (vLLM answers to "
                    "each); this program serves a model under one", "keep one name",
                )  # fmt: skip
        _option(out, flag, word, value, where)
        i += consumed
    if out.speculative_keys:  # vLLM sets the dotted keys after the whole JSON
        spec = dict(_get(out, "vllm.speculative_config") or {})
        spec.update(out.speculative_keys)
        out.entry.setdefault("vllm", {})["speculative_config"] = spec
    if extra:
        _set(out, "vllm.extra_args", extra, "command")


_SUFFIXED = " (e.g. 32768, 32k or 32K)"


def _option(out: Imported, flag: str, word: str, value: str | None, where: str) -> None:
    shown = word if value is None or "=" in word else f"{word} {value}"
    if flag in SECRET_FLAGS:
        raise RecipeError(where, word, "a secret on the command line", SECRET_FLAGS[flag])
    if flag == "--max-model-len" and value in ("auto", "-1"):
        raise RecipeError(
            where, shown, "vLLM then fits the length to the memory at start; this program "
            "sets a length", "give a number, e.g. --max-model-len 32768",
        )  # fmt: skip
    if flag in _VALUE_FIELDS:
        path, kind = _VALUE_FIELDS[flag]
        try:
            typed: Any = kind(str(value))
        except ValueError:
            suffixed = _SUFFIXED if kind is human_readable_int else ""
            raise RecipeError(
                where, shown, f"{flag} takes a number", f"give {path} as a number{suffixed}"
            ) from None
        _set(out, path, typed, where)
    elif flag in _FLAG_FIELDS:
        path, on = _FLAG_FIELDS[flag]
        _set(out, path, on, where)
    elif flag == "--served-model-name":
        _set(out, "served_name", value, where)
    elif flag in ("--speculative-config", "-sc"):
        _speculative(out, word, value, where)
    elif flag in ("--data-parallel-size", "-dp"):
        if value != "1":
            raise RecipeError(
                where, shown, "data parallelism (several copies of the model) has no place "
                "here: tensor x pipeline uses every GPU",
                "remove it, or serve the copies as models of a set",
            )  # fmt: skip
    elif flag == "--distributed-executor-backend":
        out.backend = (str(value), where)
    elif flag == "--host":
        if value not in _ANY_HOST:
            raise RecipeError(
                where, shown, "the program binds every address (0.0.0.0) so the router and "
                "clients reach the server", "remove --host or give 0.0.0.0",
            )  # fmt: skip
    elif flag in ("--spec-method", "--spec-model", "--spec-tokens"):
        raise RecipeError(
            where, shown, f"{flag} is a short form of --speculative-config",
            "write --speculative-config '{\"method\": ..., \"num_speculative_tokens\": ...}'",
        )  # fmt: skip
    elif flag in _PER_NODE:
        raise RecipeError(
            where, word, f"{flag} is set on each node by the launcher",
            "remove it (parallelism.launcher decides it)",
        )  # fmt: skip
    else:
        owner = OWNED_FLAGS.get(flag, "")
        raise RecipeError(
            where, word, f"vLLM reads it as {flag} ({owner}), which the recipe cannot set here",
            "remove it",
        )  # fmt: skip


def _speculative(out: Imported, word: str, value: str | None, where: str) -> None:
    name = word.split("=", 1)[0]
    out.sources.setdefault("vllm.speculative_config", where)
    if "." in name:  # --speculative-config.method=mtp: one key, after everything else
        key = name.split(".", 1)[1]
        try:
            out.speculative_keys[key] = json.loads(value or "")
        except json.JSONDecodeError:
            out.speculative_keys[key] = value
        return
    try:
        parsed = json.loads(value or "")
    except json.JSONDecodeError as e:
        raise RecipeError(
            where, value, f"--speculative-config is not JSON: {e.msg}",
            'give a JSON object, e.g. \'{"method": "mtp"}\'',
        ) from None  # fmt: skip
    if not isinstance(parsed, dict):
        raise RecipeError(
            where, value, "--speculative-config is not a JSON object",
            'give a JSON object, e.g. \'{"method": "mtp"}\'',
        )  # fmt: skip
    # The last one given is the one vLLM reads (argparse keeps the last value).
    out.entry.setdefault("vllm", {})["speculative_config"] = parsed


def _launcher(recipe: Recipe, out: Imported) -> str:
    """The runtime decides: `vllm-distributed` native, `vllm-ray`/`eugr-vllm` ray;
    sparkrun's `vllm` or none by its Ray hints (recipe.py _resolve_vllm_variant); an eugr
    recipe by its command's --distributed-executor-backend. A backend flag in the command
    that the launcher contradicts is refused."""
    runtime = str(recipe.fields.get("runtime") or "")
    backend, where = out.backend or ("", "command")
    if runtime in RUNTIMES:
        launcher = RUNTIMES[runtime]
        why = f"runtime {runtime} runs the {launcher} launcher"
    elif recipe.dialect == SPARKRUN:
        launcher = "ray" if recipe.ray_hint else "native"
        why = (f"sparkrun runs a runtime `{runtime or 'vllm'}` recipe with "
               f"{'vllm-ray' if recipe.ray_hint else 'vllm-distributed'} (its Ray hints: "
               "defaults.distributed_executor_backend, or the template's "
               "`--distributed-executor-backend ray`)")  # fmt: skip
    else:
        launcher = "ray" if backend == "ray" else "native"
        why = ""
    if backend and (backend == "ray") != (launcher == "ray"):
        raise RecipeError(
            where, f"--distributed-executor-backend {backend}", why,
            "remove the flag, or change runtime (or give --launcher)",
        )  # fmt: skip
    return launcher


def _node_range(recipe: Recipe) -> tuple[int, int | None, str]:
    f = recipe.fields
    low, high = int(f.get("min_nodes") or 1), f.get("max_nodes")
    said = "min_nodes/max_nodes"
    if f.get("mode") == "solo":  # recipe.py 593: both become 1
        low, high, said = 1, 1, "mode: solo"
    if f.get("solo_only"):
        high, said = 1, "solo_only"
    if f.get("cluster_only"):  # recipe.py 601 (mode: cluster alone changes no count)
        low, said = max(low, 2), "cluster_only"
    if f.get("mode") not in (None, "auto", "solo", "cluster"):
        raise RecipeError("mode", f["mode"], "not a sparkrun mode", "give auto, solo or cluster")
    return low, high, said


def _check_node_counts(recipe: Recipe, out: Imported, nodes: list[str] | None) -> None:
    """tensor x pipeline ranks, one per Spark (a GB10 has one GPU), against the recipe's
    node range and the nodes given."""
    par = out.entry["parallelism"]
    ranks = int(par.get("tensor", 1)) * int(par.get("pipeline", 1))
    low, high, said = _node_range(recipe)
    if high is not None and high < low:
        raise RecipeError(
            "max_nodes", high, f"below min_nodes {low}", "give max_nodes >= min_nodes"
        )
    if ranks < low or (high is not None and ranks > high):
        span = f"{low}" if high == low else f"{low} to {high if high is not None else 'any'}"
        raise RecipeError(
            said,
            span,
            f"the command's tensor x pipeline ({ranks}) runs on {ranks} "
            "Spark(s), outside the recipe's node range",
            "make -tp x -pp fit the recipe's nodes (one GPU per Spark)",
        )
    if nodes is not None and len(nodes) != ranks:
        raise RecipeError(
            "--nodes",
            ",".join(nodes),
            f"the recipe's tensor x pipeline is {ranks}: it runs "
            f"on {ranks} Spark(s), not {len(nodes)}",
            f"name {ranks} node(s)",
        )


def _env(recipe: Recipe, out: Imported) -> None:
    env = recipe.fields.get("env") or {}
    kept: dict[str, str] = {}
    for key, value in env.items():
        where = f"env.{key}"
        if value is None or not isinstance(value, str | int | float | bool):
            raise RecipeError(
                where, _brief(value), "an environment value is one string", "give one value"
            )
        text = str(value)
        # eugr writes `export K="V"` into a bash script: `"`, `$`, `` ` `` and `\` act
        # there (a `"` ends the quotes and what follows runs). sparkrun passes `docker run
        # -e 'K=V'` quoted, after os.path.expandvars on this machine: `$` acts.
        special = '"$`\\' if recipe.dialect == EUGR else "$"
        if any(c in text for c in special):
            tool = (
                'eugr writes `export K="V"` into a bash script, where it would be shell '
                "syntax (a command could run)"
                if recipe.dialect == EUGR
                else "sparkrun expands $VAR from this machine's environment"
            )
            raise RecipeError(
                where,
                text,
                f"{tool}; here values are kept as given, so the recipe would mean another",
                "write the value out, without " + " ".join(special),
            )
        if key in RESERVED_ENV:
            raise RecipeError(
                where,
                text,
                "the program sets this variable itself",
                f"remove it; {RESERVED_ENV[key]}",
            )
        kept[key] = text
    if kept:
        _set(out, "vllm.env", kept, "env")


def _own_block(block: dict[str, Any], out: Imported) -> None:
    """This program's `spark_vllm` block: the stack fields no recipe field holds."""
    allowed = {"name", "hf_cache", "offline", "hub_endpoint", "distribution", "nccl_debug",
               "image", "nodes", "master_port"}  # fmt: skip
    for key, value in block.items():
        if key not in allowed:
            raise RecipeError(
                f"spark_vllm.{key}",
                _brief(value),
                "no such field",
                f"the fields are {', '.join(sorted(allowed))}",
            )
        if key == "image":
            if not isinstance(value, dict) or set(value) - {"source", "tarball", "arch"}:
                raise RecipeError(
                    "spark_vllm.image",
                    _brief(value),
                    "holds source, tarball and arch only",
                    "remove the other keys",
                )
            out.image.update(value)
        elif key == "nccl_debug":
            _set(out, "vllm.nccl_debug", value, f"spark_vllm.{key}")
        elif key == "master_port":
            _set(out, "ports.master", value, f"spark_vllm.{key}")
        else:
            _set(out, key, value, f"spark_vllm.{key}")


_ORDER = (
    "name",
    "id",
    "revision",
    "served_name",
    "hf_cache",
    "offline",
    "hub_endpoint",
    "distribution",
    "nodes",
    "ports",
    "parallelism",
    "vllm",
)


def reordered(entry: dict[str, Any]) -> dict[str, Any]:
    ordered = {k: entry[k] for k in _ORDER if k in entry}
    ordered.update({k: v for k, v in entry.items() if k not in ordered})
    return ordered


def checked(imported: Imported, stack: dict[str, Any] | None) -> dict[str, Any]:
    """The raw stack config with the imported model: alone on its own (a one-entry set with
    no nodes to check against), or added to `stack`'s models (its single form converted).
    ConfigError names a problem, the recipe's field where one is known."""
    entry = dict(imported.entry)
    if "ports" in entry:
        ports = dict(entry["ports"])
        own = (stack or {}).get("ports") or {}
        stack_api, stack_master = own.get("api", _DEFAULT_API), own.get("master", _DEFAULT_MASTER)
        ports.setdefault("api", stack_api)
        if ports["api"] == stack_api and ports.get("master", stack_master) == stack_master:
            del entry["ports"]  # the stack's own ports.api and ports.master
        else:
            if "master" not in ports:  # the first free one after the stack's
                taken = {
                    p
                    for m in (stack or {}).get("models") or []
                    for p in (m.get("ports") or {}).values()
                }
                ports["master"] = next(p for p in range(stack_master + 1, 65536) if p not in taken)
            entry["ports"] = ports
    try:
        ImageConfig.model_validate(imported.image)
        ServedModel.model_validate(entry)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"] if not isinstance(p, int))
        if e.title == ImageConfig.__name__:
            loc = f"image.{loc}" if loc else "image"
            imported.sources.setdefault("image", "container")
        source = _source_of(imported, loc)
        msg = str(err["msg"]).removeprefix("Value error, ")
        problem, _, fix = msg.partition("; fix: ")
        raise RecipeError(
            source,
            _brief(err.get("input")),
            f"as {loc}: {problem}",
            fix or f"give {loc} a valid value (docs/config.md)",
        ) from None
    if stack is None:
        return {"image": imported.image, "models": [entry]}
    raw = dict(stack)
    models = list(raw.pop("models", None) or [])
    if not models and "model" in raw:
        single = dict(raw.pop("model"))
        single["parallelism"] = raw.pop("parallelism", {"tensor": 1})
        if "vllm" in raw:
            single["vllm"] = raw.pop("vllm")
        models = [single]
    if models and "name" not in entry:
        raise RecipeError(
            "--name",
            "(none)",
            "the stack already serves a model, and in a set at most one model goes without a name",
            "give the model a name with --name, e.g. --name coder",
        )
    raw["models"] = [*models, entry]
    if raw.get("image", {}).get("ref") not in (None, imported.image["ref"]):
        imported.warnings.append(
            f"container: {imported.image['ref']}: not imported; the stack's models share "
            f"its image {raw['image']['ref']} (change image.ref if this model needs the "
            "recipe's image)"
        )
    raw.setdefault("image", imported.image)
    try:
        load_stack_config(raw)
    except ConfigError as e:
        issue = e.issues[0]
        mine = f"models[{len(models)}]."
        if issue.path.startswith(mine):
            issue = issue.model_copy(
                update={"path": _source_of(imported, issue.path.removeprefix(mine))}
            )
        raise ConfigError([issue], what="the stack with the imported model is invalid") from None
    return {"image": raw["image"], "models": raw["models"]}


def _source_of(imported: Imported, loc: str) -> str:
    field = loc if loc.split(".")[0] == "image" else f"models[].{loc}"
    for path in sorted(imported.sources, key=len, reverse=True):
        if loc == path or loc.startswith(path + "."):
            return f"{imported.sources[path]} ({field})"
    return field


# --- export --------------------------------------------------------------------------


def to_recipe(
    cfg: StackConfig, model: ServedModel, stack: str, deployed: str | None = None
) -> dict[str, Any]:
    """`model` of the stack as a sparkrun v2 recipe (an explicit command template).
    `deployed`: the launcher the last `up` chose, for a model whose launcher is auto."""
    view = cfg.for_model(model)
    launcher: str = model.parallelism.launcher
    if launcher == "auto":
        launcher = deployed or launcher
    if launcher not in ("native", "ray"):
        raise RecipeError(
            "parallelism.launcher",
            "auto",
            "a recipe's runtime names its launcher, and auto "
            "is decided from the image at `up`, which has not run",
            "set "
            "parallelism.launcher to native or ray, or give --launcher, or run `up` first "
            "(export then takes the launcher it chose)",
        )
    v = model.vllm
    ranks = model.parallelism.tensor * model.parallelism.pipeline
    defaults: dict[str, Any] = {
        "port": view.ports.api,
        "host": "0.0.0.0",
        "tensor_parallel": model.parallelism.tensor,
        "pipeline_parallel": model.parallelism.pipeline,
        "gpu_memory_utilization": v.gpu_memory_utilization,
    }
    lines = [
        "vllm serve {model}",
        "--host {host}",
        "--port {port}",
        "-tp {tensor_parallel}",
        "-pp {pipeline_parallel}",
        "--gpu-memory-utilization {gpu_memory_utilization}",
    ]
    if model.served_name:
        defaults["served_model_name"] = model.served_name
        lines.append("--served-model-name {served_model_name}")
    valued = [
        ("max_model_len", "--max-model-len", v.max_model_len, None),
        ("max_num_batched_tokens", "--max-num-batched-tokens", v.max_num_batched_tokens, None),
        ("dtype", "--dtype", v.dtype, "auto"),
        ("kv_cache_dtype", "--kv-cache-dtype", v.kv_cache_dtype, "auto"),
        ("load_format", "--load-format", v.load_format, "auto"),
        ("reasoning_parser", "--reasoning-parser", v.reasoning_parser, None),
        ("tool_call_parser", "--tool-call-parser", v.tool_call_parser, None),
    ]
    for key, flag, value, unset in valued:
        if value != unset:
            defaults[key] = value
            lines.append(f"{flag} {{{key}}}")
    for on, flag in (
        (v.enable_prefix_caching, "--enable-prefix-caching"),
        (v.enable_auto_tool_choice, "--enable-auto-tool-choice"),
        (v.enable_expert_parallel, "--enable-expert-parallel"),
        (v.language_model_only, "--language-model-only"),
    ):
        if on:
            lines.append(flag)
    if v.speculative_config is not None:
        defaults["speculative_config"] = json.dumps(v.speculative_config)
        lines.append("--speculative-config '{speculative_config}'")
    for i, word in enumerate(v.extra_args):
        if template_keys(word):  # sparkrun would fill it; JSON braces it leaves
            raise RecipeError(
                f"vllm.extra_args[{i}]",
                word,
                "holds a {...}, which sparkrun's template "
                "would fill (it has no escape for a brace)",
                "leave it out of the export",
            )
    if v.extra_args:
        lines.append(shlex.join(v.extra_args))
    block: dict[str, Any] = {"hf_cache": model.hf_cache}
    if model.name:
        block["name"] = model.name
    if model.nodes is not None:
        block["nodes"] = list(model.nodes)
    if model.ports is not None:
        # Not --master-port in the command: sparkrun's vllm-distributed appends its own
        # (25000) on each node after it, and the last one wins.
        block["master_port"] = model.ports.master
    stack_fields: tuple[tuple[str, object, object], ...] = (
        ("offline", model.offline, False),
        ("hub_endpoint", model.hub_endpoint, type(model).model_fields["hub_endpoint"].default),
        ("distribution", model.distribution, "copy_from_head"),
        ("nccl_debug", v.nccl_debug, "INFO"),
    )
    for name, given, default in stack_fields:
        if given != default:
            block[name] = given
    image = {
        k: v
        for k, v in cfg.image.model_dump().items()
        if k in ("source", "tarball", "arch") and v is not None and v != "pull"
    }
    if image != {"arch": "aarch64"}:
        block["image"] = image
    recipe: dict[str, Any] = {
        "recipe_version": "2",
        "model": model.id,
        "model_revision": model.revision,
        "runtime": "vllm-ray" if launcher == "ray" else "vllm-distributed",
        "container": cfg.image.ref,
        "min_nodes": ranks,
        "max_nodes": ranks,
        "metadata": {
            "description": f"{model.name_for_clients}, exported from the {stack} "
            "stack of spark-vllm"
        },
        "defaults": defaults,
    }
    for key, value in v.env.items():
        if "$" in value:
            raise RecipeError(
                f"vllm.env.{key}", value, "sparkrun expands $VAR in env values from the "
                "environment of the machine it runs on", "leave it out of the export, or "
                "write the value without $",
            )  # fmt: skip
    if v.env:
        recipe["env"] = dict(v.env)
    recipe["command"] = " \\\n  ".join(lines) + "\n"
    recipe["spark_vllm"] = block
    return recipe
