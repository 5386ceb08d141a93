"""The two recipe formats people share for vLLM on DGX Spark, read as their own tools read
them (docs/decisions/recipes.md has the sources and the commits read):

- **sparkrun** (spark-arena/sparkrun 0041b8f8, `core/recipe.py`): `recipe_version: "2"`
  (or none), a `runtime`, `defaults` that fill the `{key}`s of a `command` template by
  python-vpd's `arg_substitute`, applied until the text stops changing; a recipe without a
  command is `vllm serve {model}` plus the flags of `VLLM_FLAG_MAP`.
- **eugr** (eugr/spark-vllm-docker `run-recipe.py`): `recipe_version: "1"`, a `command`
  filled by Python's `str.format(**defaults)` (`{{`/`}}` are literal braces, a key without
  a value stops the run).

`read(path)` gives a `Recipe`: the fields checked for type, the command rendered by its
dialect's rule and split into argv words as bash would, refusing what bash would do beyond
splitting words (operators, expansions, globs), since this program passes each word to vLLM
as it is and never through a shell."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkvllm.config import ConfigError, Issue
from sparkvllm.config_sources import load_yaml_file

SPARKRUN = "sparkrun"
EUGR = "eugr"

# Every top-level key each format's loader knows (sparkrun: recipe.py `_KNOWN_KEYS`; eugr:
# run-recipe.py `load_recipe` and the keys `main` reads), and its YAML type.
_STR, _INT, _BOOL, _MAP, _LIST = "a string", "an integer", "true or false", "a mapping", "a list"
SPARKRUN_FIELDS: dict[str, str] = {
    "sparkrun_version": _STR,
    "recipe_version": _STR,
    "name": _STR,
    "description": _STR,
    "model": _STR,
    "model_revision": _STR,
    "runtime": _STR,
    "runtime_version": _STR,
    "mode": _STR,
    "min_nodes": _INT,
    "max_nodes": _INT,
    "container": _STR,
    "defaults": _MAP,
    "env": _MAP,
    "command": _STR,
    "runtime_config": _MAP,
    "cluster_only": _BOOL,
    "solo_only": _BOOL,
    "benchmark": _MAP,
    "metadata": _MAP,
    "pre_exec": _LIST,
    "post_exec": _LIST,
    "post_commands": _LIST,
    "mods": _LIST,
    "stop_after_post": _BOOL,
    "builder": _STR,
    "builder_config": _MAP,
    "executor_config": _MAP,
    "distribution_config": _MAP,
    # This program's own block (written by export): what a stack needs that no recipe
    # field holds. sparkrun keeps an unknown top-level key in runtime_config and writes it
    # back on its own export, so the block survives a trip through sparkrun.
    "spark_vllm": _MAP,
}
EUGR_FIELDS: dict[str, str] = {
    "recipe_version": _STR,
    "name": _STR,
    "description": _STR,
    "model": _STR,
    "container": _STR,
    "command": _STR,
    "mods": _LIST,
    "defaults": _MAP,
    "env": _MAP,
    "cluster_only": _BOOL,
    "solo_only": _BOOL,
    "build_args": _LIST,
    "benchmark": _MAP,
}
_EUGR_REQUIRED = ("name", "recipe_version", "container", "command")

# sparkrun's recipe keys with a `vllm serve` flag when the recipe has no command template
# (runtimes/_vllm_common.py VLLM_FLAG_MAP, VLLM_BOOL_FLAGS; vllm_distributed.py
# `_build_base_command` puts `-tp` first and leaves out the backend).
SPARKRUN_FLAG_MAP = {
    "port": "--port",
    "host": "--host",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_model_len": "--max-model-len",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
    "served_model_name": "--served-model-name",
    "dtype": "--dtype",
    "quantization": "--quantization",
    "enforce_eager": "--enforce-eager",
    "enable_prefix_caching": "--enable-prefix-caching",
    "trust_remote_code": "--trust-remote-code",
    "pipeline_parallel": "-pp",
    "data_parallel": "--data-parallel-size",
    "kv_cache_dtype": "--kv-cache-dtype",
    "otlp_traces_endpoint": "--otlp-traces-endpoint",
    "api_key": "--api-key",
}
SPARKRUN_BOOL_KEYS = {"enforce_eager", "enable_prefix_caching", "trust_remote_code"}
# vpd's arg_substitute: `\{(.*?)\}`, the text between looked up with its braces stripped.
_VPD_FIELD = re.compile(r"\{(.*?)\}")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
# bash turns `\<newline>` into nothing (a line continuation); sparkrun first mends
# `\ <newline>` (recipe.py _TRAILING_SPACE_CONTINUATION_RE).
_TRAILING_SPACE_CONTINUATION = re.compile(r"\\ +\n")
_RAY_BACKEND = re.compile(r"--distributed-executor-backend\s+ray\b")  # recipe.py 31


class RecipeError(ConfigError):
    """The recipe cannot be read or mapped: one Issue per problem, each naming the recipe's
    field (`defaults.port`, `command word 7`), its value and the fix."""

    def __init__(self, path: str, value: Any, problem: str, fix: str):
        super().__init__(
            [Issue(path=path, value=value, problem=problem, fix=fix)],
            what="the recipe cannot be used",
        )


@dataclass(frozen=True)
class Recipe:
    """A recipe file as read: its dialect, its fields as given, and its command rendered
    and split into argv words (`words[0:2] == ["vllm", "serve"]`)."""

    path: Path
    dialect: str
    fields: dict[str, Any]
    words: list[str]
    # Template values a command without a template would have used (sparkrun only):
    # defaults with no flag in VLLM_FLAG_MAP, which sparkrun leaves out.
    unused_defaults: list[str] = field(default_factory=list)
    # sparkrun's Ray hints for a runtime `vllm` or none (recipe.py _resolve_vllm_variant):
    # the effective distributed_executor_backend default is ray (any case), or the command
    # TEMPLATE holds `--distributed-executor-backend ray` (a space, not `=`).
    ray_hint: bool = False

    @property
    def what(self) -> str:
        version = self.fields.get("recipe_version", "2" if self.dialect == SPARKRUN else "1")
        return f"{self.dialect}'s recipe format, recipe_version {version}"


def read(path: Path, overrides: dict[str, str] | None = None) -> Recipe:
    """The recipe at `path`, its template filled from `defaults` (and `overrides`, as
    sparkrun's `-o key=value` and eugr's CLI flags fill it first). RecipeError names the
    first problem."""
    try:
        return _read(path, overrides or {})
    except RecursionError:
        raise RecipeError(
            "recipe", str(path), "its YAML is nested too deeply to read",
            "write a recipe (a mapping of the format's fields)",
        ) from None  # fmt: skip


def _read(path: Path, overrides: dict[str, str]) -> Recipe:
    doc = load_yaml_file(path, "recipe")
    if not doc:
        raise RecipeError("recipe", str(path), "it is empty", "write a recipe in it")
    version = doc.get("recipe_version")  # sparkrun reads no other (recipe.py 578)
    dialect = EUGR if str(version) == "1" else SPARKRUN
    if version is not None and str(version) not in ("1", "2"):
        raise RecipeError(
            "recipe_version",
            version,
            "neither format has this version",
            'write "2" (sparkrun) or "1" (eugr/spark-vllm-docker)',
        )
    known = EUGR_FIELDS if dialect == EUGR else SPARKRUN_FIELDS
    for key, value in doc.items():
        if key not in known:
            raise RecipeError(
                field_name(key),
                _short(value),
                f"a {dialect} recipe has no such field",
                f"remove it or fix its spelling; the fields are {', '.join(known)}",
            )
        _check_type(str(key), value, known[str(key)])
    if dialect == EUGR:
        for key in _EUGR_REQUIRED:
            if key not in doc:
                raise RecipeError(
                    key,
                    "(missing)",
                    "eugr's run-recipe.py requires it",
                    f"add {key}, as in eugr's recipes/README.md",
                )
    elif "model" not in doc:
        raise RecipeError(
            "model",
            "(missing)",
            "a sparkrun recipe requires it",
            "add the Hugging Face id, e.g. model: Qwen/Qwen3-4B-Instruct-2507",
        )
    values = _template_values(doc, dialect, overrides)
    unused: list[str] = []
    command = doc.get("command")
    if command is None:  # sparkrun only (eugr requires a command)
        text, unused = _sparkrun_generated(doc, values)
    elif dialect == EUGR:
        text = _eugr_render(command, values)
    else:
        text = _sparkrun_render(command, values)
    ray_hint = False
    if dialect == SPARKRUN:
        # runtimes/base.py _augment_served_model_name: appended, as text, when missing
        served = values.get("served_model_name")
        if served is not None and "--served-model-name" not in text:
            text = f"{text.rstrip()} --served-model-name {_as_text(served)}"
        backend = str(values.get("distributed_executor_backend") or "").lower()
        ray_hint = backend == "ray" or bool(command and _RAY_BACKEND.search(command))
    words = split_command(text)
    return Recipe(
        path=path, dialect=dialect, fields=dict(doc), words=words, unused_defaults=unused,
        ray_hint=ray_hint,
    )  # fmt: skip


def field_name(key: Any) -> str:
    """A recipe key as an error names it: as written, or quoted when it holds a control
    character (a NUL or an escape sequence would reach the terminal)."""
    text = str(key)
    return text if text.isprintable() else repr(text)


def _short(value: Any) -> Any:
    shown = repr(value)
    return value if len(shown) <= 80 else shown[:77] + "..."


def _check_type(key: str, value: Any, kind: str) -> None:
    ok = {
        _STR: isinstance(value, str)
        or (
            key in ("recipe_version", "sparkrun_version")
            and isinstance(value, int)
            and not isinstance(value, bool)
        ),
        # sparkrun coerces min_nodes with int() (recipe.py 591), so "2" is 2 there too
        _INT: (isinstance(value, int) and not isinstance(value, bool))
        or (
            key == "min_nodes"
            and isinstance(value, str)
            and value.strip().isascii()
            and value.strip().isdigit()
        ),
        _BOOL: isinstance(value, bool),
        _MAP: isinstance(value, dict),
        _LIST: isinstance(value, list),
    }[kind] or (
        value is None
        and key in ("model_revision", "max_nodes", "mods", "env", "defaults", "metadata")
    )
    if not ok:
        raise RecipeError(key, _short(value), f"must be {kind}", f"give {key} as {kind}")
    if kind == _MAP and isinstance(value, dict):
        for k in value:
            if not isinstance(k, str):
                raise RecipeError(
                    f"{key}.{field_name(k)}",
                    _short(value[k]),
                    "keys must be strings",
                    "quote the key",
                )


def _template_values(
    doc: dict[str, Any], dialect: str, overrides: dict[str, str]
) -> dict[str, Any]:
    """What fills `{key}`: sparkrun's chain is overrides > defaults (+ `model`, as
    setdefault); eugr's `{**defaults, **overrides}` (its `model` is no template value)."""
    defaults = dict(doc.get("defaults") or {})
    for key, value in defaults.items():
        if not (value is None or isinstance(value, str | int | float | bool)):
            raise RecipeError(
                f"defaults.{field_name(key)}",
                _short(value),
                "a template value must be a string, number "
                "or true/false (the tools insert it as text)",
                "write it as one value (a JSON object as a quoted string)",
            )
    if dialect == SPARKRUN:
        defaults.setdefault("model", doc.get("model"))
    return {**defaults, **overrides}


def _as_text(value: Any) -> str:
    return str(value)  # both tools insert Python's str() of the value (True, 0.85, ...)


def template_keys(text: str) -> list[str]:
    """The `{key}`s vpd's arg_substitute would look up in `text`: the text between braces
    (its own braces stripped) when it is a key's shape; other braces (JSON) it leaves."""
    keys = (m.group(1).strip("}{") for m in _VPD_FIELD.finditer(text))
    return [key for key in keys if _KEY.match(key)]


def _sparkrun_render(command: str, values: dict[str, Any]) -> str:
    """recipe.py `render_command`: strip, then arg_substitute until the text stops changing,
    then mend `\\ <newline>`. A `{key}` whose key has no value stays literal in sparkrun
    (and vLLM then receives it); here that is refused."""

    def substitute(text: str) -> str:
        def one(m: re.Match[str]) -> str:
            value = values.get(m.group(1).strip("}{"))
            return m.group(0) if value is None else _as_text(value)

        return _VPD_FIELD.sub(one, text)

    rendered, last = command.strip(), None
    for _ in range(32):
        if rendered == last:
            break
        last, rendered = rendered, substitute(rendered)
    else:
        raise RecipeError(
            "command",
            _short(command),
            "filling its {key}s never ends (a default refers to itself)",
            "give each default a value that does not name its own {key}",
        )
    if unfilled := template_keys(rendered):
        key = unfilled[0]
        raise RecipeError(
            "command",
            f"{{{key}}}",
            f"the template names {{{key}}}, which has no value",
            f"add defaults.{key}, or give it with --set {key}=VALUE",
        )
    return _TRAILING_SPACE_CONTINUATION.sub("\\\n", rendered)


def _eugr_render(command: str, values: dict[str, Any]) -> str:
    """run-recipe.py `generate_launch_script`: `command.format(**params)`. Only plain
    `{key}`s are read here: Python's format would also follow `{key.attr}`, `{key[0]}`,
    `!r` and `:spec`, which no recipe uses."""
    try:
        parts = list(string.Formatter().parse(command))
    except ValueError as e:
        raise RecipeError(
            "command",
            _short(command),
            f"not a format template: {e}",
            "write a literal brace as {{ or }}",
        ) from None
    out: list[str] = []
    for literal, name, spec, conversion in parts:
        out.append(literal)
        if name is None:
            continue
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or spec or conversion:
            raise RecipeError(
                "command",
                f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}",
                "only a plain {key} is filled here",
                "write {key} with a key of defaults, or a literal brace as {{ or }}",
            )
        if name not in values:
            raise RecipeError(
                "command",
                f"{{{name}}}",
                f"the template names {{{name}}}, which has no "
                "value (run-recipe.py stops: Missing parameter)",
                f"add defaults.{name}, or give it with --set {name}=VALUE",
            )
        if values[name] is None:
            raise RecipeError(
                f"defaults.{name}", None, "null: run-recipe.py would write the text None "
                "into the command", f"give defaults.{name} a value",
            )  # fmt: skip
        out.append(_as_text(values[name]))
    return "".join(out).strip().removesuffix("\\").strip()


def _sparkrun_generated(doc: dict[str, Any], values: dict[str, Any]) -> tuple[str, list[str]]:
    """The command sparkrun builds for a recipe without one: `vllm serve MODEL -tp N` and the
    flags of the defaults it maps; the rest it leaves out (returned, to be named)."""
    words = ["vllm", "serve", str(doc["model"])]
    tp = values.get("tensor_parallel")
    if tp:
        words += ["-tp", _as_text(tp)]
    for key, flag in SPARKRUN_FLAG_MAP.items():
        value = values.get(key)
        if value is None:
            continue
        if key in SPARKRUN_BOOL_KEYS:
            if str(value).strip().lower() in ("1", "true", "yes", "on", "y", "t"):
                words.append(flag)
        else:
            words += [flag, _as_text(value)]
    skipped = {"model", "tensor_parallel", "distributed_executor_backend", *SPARKRUN_FLAG_MAP}
    unused = sorted(k for k in values if k not in skipped)
    # base.py: `" ".join(parts)`, values unquoted, then run by bash: split as bash would
    return " ".join(words), unused


def split_command(text: str) -> list[str]:
    """The argv words bash makes of `text` (its quoting: `'...'`, `"..."`, `\\`, and
    `\\<newline>` continuing a line), refusing anything bash would do beyond splitting and
    unquoting: this program runs no shell, so `$(...)`, `;`, a glob or `~` would mean one
    thing to the recipe's tool and another here. (shlex is not bash: it keeps `\\$` in
    double quotes, splits on a carriage return, and knows no continuation.)"""
    words: list[str] = []
    word: list[str] = []
    started = False  # a word is open (an empty '' is a word)
    i, n = 0, len(text)

    def refuse(what: str) -> None:
        _shell_refusal(text, i, what)

    while i < n:
        c = text[i]
        if (ord(c) < 32 and c not in "\t\n") or c == "\x7f":
            refuse("a control character")
        if c in " \t":
            if started:
                words.append("".join(word))
                word, started = [], False
            i += 1
            continue
        at_start = not started or (word and word[-1] in "=:")
        started = True
        if c == "\\":
            if i + 1 < n and text[i + 1] == "\n":
                started = bool(word)  # a continuation: no character
            elif i + 1 < n:
                word.append(text[i + 1])
            i += 2
            continue
        if c == "'":
            close = text.find("'", i + 1)
            if close < 0:
                refuse("a ' quote never closed")
            word.append(text[i + 1 : close])
            i = close + 1
            continue
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] in "$`":
                    refuse("an expansion inside double quotes")
                if text[i] == "\\" and i + 1 < n and text[i + 1] in '$`"\\\n':
                    word.append("" if text[i + 1] == "\n" else text[i + 1])
                    i += 2
                    continue
                word.append(text[i])
                i += 1
            if i >= n:
                refuse('a " quote never closed')
            i += 1
            continue
        if c in "$`":
            refuse("a shell expansion (a variable or a command's output)")
        if c in ";&|<>()\n":
            refuse("a shell operator: the command must be one `vllm serve`")
        if c in "*?[{}" or (c == "~" and at_start) or (c == "#" and not word):
            refuse("bash would expand it (a glob, a brace list, ~) or read a comment")
        word.append(c)
        i += 1
    if started:
        words.append("".join(word))
    if words[:2] != ["vllm", "serve"]:
        raise RecipeError(
            "command",
            " ".join(words[:3]),
            "it is not `vllm serve ...` (this program runs vLLM's OpenAI server, nothing else)",
            "start the command with vllm serve",
        )
    return words


def _shell_refusal(text: str, i: int, what: str) -> None:
    start = max(0, text.rfind(" ", 0, i) + 1)
    end = text.find(" ", i)
    word = text[start : end if end >= 0 else len(text)]
    raise RecipeError(
        "command",
        word[:80],
        f"{text[i]!r}: {what}; this program passes each word to vLLM "
        "as written, without a shell, so the recipe would mean something else here",
        "write the value out (quote a literal character: '...')",
    )
