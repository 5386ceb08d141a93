"""Where a stack's config comes from, in one place. Each returns a validated StackConfig
(ConfigError names every bad field, its value and the fix):

- `from_runtime()`: inside the program, what the Pulumi engine (or the local engine, which
  stands in for it) passed: `spark-vllm:key -> string`, and which keys are secret;
- `from_cli(stack)`: the Pulumi CLI's `pulumi config --json --show-secrets`;
- `from_stack_file(stack)`: Pulumi.<stack>.yaml itself, where the CLI is absent (secrets
  then come from ssh_private_key_file); every reader of a stack file goes through
  `load_yaml_file` (the file, the line and the fix for broken YAML, a key given twice);
- `for_tools(stack)`: what tools outside the program (the drift check) use: the CLI when it
  is installed, else the stack file;
- `stack_without_secrets(stack)`: the stack file's raw keys with each secret replaced by a
  stand-in, for tools that need none (recipes, the metrics config).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from sparkvllm.config import (
    PROJECT,
    PROJECT_DIR,
    SECRET_FIELDS,
    ConfigError,
    Issue,
    StackConfig,
    load_stack_config,
    parse_pulumi_config,
)


def from_runtime() -> StackConfig:
    from pulumi.runtime import config as runtime_config

    values = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    secret = set(runtime_config.get_config_secret_keys_env())
    secret |= {k for k in values if runtime_config.is_config_secret(k)}
    return load_stack_config(parse_pulumi_config(values, secret))


def from_cli(stack: str, project_dir: Path = PROJECT_DIR) -> StackConfig:
    shown = subprocess.run(
        ["pulumi", "config", "--json", "--show-secrets", "--stack", stack],
        capture_output=True, text=True, cwd=project_dir,
    )  # fmt: skip
    if shown.returncode != 0:
        said = (shown.stderr.strip().splitlines() or [f"exit status {shown.returncode}"])[-1]
        raise ConfigError(
            [
                Issue(
                    path="stack",
                    value=stack,
                    problem=f"`pulumi config` failed: {said}",
                    fix="correct what it names (it reads Pulumi.yaml, the stack file and "
                    "the stack's backend)",
                )
            ]
        )
    data = json.loads(shown.stdout)
    values = {k: v["value"] if isinstance(v["value"], str) else json.dumps(v["value"])
              for k, v in data.items() if "value" in v}  # fmt: skip
    secret = [k for k, v in data.items() if v.get("secret")]
    return load_stack_config(parse_pulumi_config(values, secret))


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a mapping key given twice, as the Pulumi CLI's YAML
    parser does (go-yaml v3: `mapping key "head" already defined at line 7`); PyYAML alone
    keeps the last one."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<:` merges; a key given beside it overrides, as in go-yaml
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: the base class names it
                if first is not None:
                    raise _DuplicateKey(
                        None, None, f'mapping key "{key}" already defined at line {first + 1}',
                        key_node.start_mark,
                    )  # fmt: skip
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "true/false"}


def _file_issue(path: Path, problem: str, fix: str, what: str = "stack file") -> ConfigError:
    return ConfigError([Issue(path=what, value=str(path), problem=problem, fix=fix)])


def load_yaml_file(path: Path, what: str = "stack file") -> dict[str, Any]:
    """A Pulumi YAML file (Pulumi.<stack>.yaml, Pulumi.yaml) read as the Pulumi CLI reads
    it: UTF-8, one YAML mapping, no key given twice. Every tool and the program's stand-ins
    read the stack file through this; a ConfigError names the file, the line and the fix."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise _file_issue(path, f"cannot read it: {e.strerror}", "make it readable", what) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise _file_issue(
            path, f"line {line}: byte {data[e.start]:#04x} is not UTF-8", "save it as UTF-8", what
        ) from None
    try:
        doc = yaml.load(text, Loader=_UniqueKeys)  # a SafeLoader: no Python objects
    except yaml.MarkedYAMLError as e:
        raise _file_issue(path, *_yaml_problem(e), what) from None
    except yaml.reader.ReaderError as e:
        line = text[: e.position].count("\n") + 1
        code = e.character if isinstance(e.character, int) else ord(e.character)
        raise _file_issue(
            path, f"line {line}: the control character U+{code:04X} is not allowed in YAML",
            f"remove it from line {line}", what,
        ) from None  # fmt: skip
    except yaml.YAMLError as e:  # every PyYAML error is one of the two above; a safe net
        raise _file_issue(path, f"not valid YAML: {e}", "correct the YAML", what) from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        kind = _KINDS.get(type(doc), type(doc).__name__)
        shape = "a `config:` key" if what == "stack file" else "`name:` and `runtime:` keys"
        raise _file_issue(
            path, f"the top level is {kind}; it must be a mapping with {shape}",
            "write it as `key: value` lines from the first column (e.g. `config:`, then the "
            "settings indented under it)", what,
        )  # fmt: skip
    return doc


def _yaml_problem(e: yaml.MarkedYAMLError) -> tuple[str, str]:
    """(problem, fix) of a YAML error, by the file's line and column (PyYAML's own text
    names `<unicode string>`)."""
    mark = e.problem_mark or e.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = (e.problem or e.context or "not valid YAML").strip()
    if e.context and e.problem and e.context_mark:
        problem += f" ({e.context} at line {e.context_mark.line + 1})"
    if isinstance(e, _DuplicateKey):
        return where + problem, "keep one of the two (the Pulumi CLI refuses the file)"
    return where + problem, f"correct the YAML at line {mark.line + 1}" if mark else "correct it"


def stack_file_config(path: Path) -> dict[str, Any]:
    """The `config:` mapping of a stack file (every namespace), read by load_yaml_file."""
    config = load_yaml_file(path).get("config")
    if config is None:
        return {}
    if not isinstance(config, dict):
        kind = _KINDS.get(type(config), type(config).__name__)
        raise _file_issue(
            path, f"its `config:` is {kind}; it must be a mapping of `{PROJECT}:KEY: value`",
            f"indent the settings under `config:` as `{PROJECT}:KEY: value` lines",
        )  # fmt: skip
    return config


def stack_file_raw(stack: str, project_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """The `spark-vllm:` keys of Pulumi.<stack>.yaml, namespace stripped (the raw input of
    load_stack_config, for tests and tools that change a value first)."""
    path = project_dir / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise ConfigError(
            [
                Issue(
                    path="stack",
                    value=stack,
                    problem=f"there is no {path.name} in {project_dir}",
                    fix="pick a stack that has one (e.g. sim or spark), or create it",
                )
            ]
        )
    prefix = f"{PROJECT}:"
    return {
        k.removeprefix(prefix): v
        for k, v in stack_file_config(path).items()
        if isinstance(k, str) and k.startswith(prefix)
    }


def project_name(project_dir: Path) -> str:
    """The project's name, as Pulumi.yaml gives it (the CLI's `pulumi.get_project()`)."""
    path = project_dir / "Pulumi.yaml"
    if not path.is_file():
        raise _file_issue(
            path, "there is none", "run in the project's folder, or name it with --cwd",
            "project file",
        )  # fmt: skip
    name = load_yaml_file(path, "project file").get("name")
    if not isinstance(name, str) or not name.strip():
        raise _file_issue(path, "it has no `name:`", "name the project", "project file")
    return name.strip()


# What a tool that reads the stack file without the Pulumi CLI takes instead of a secret.
_SECRET_INSTEAD = {
    "ssh_private_key": "without it put the key in a file and name it in ssh_private_key_file",
    "ssh_private_keys": "without it name each node's key file in nodes[].ssh.private_key_file",
}


def has_secure(value: Any) -> bool:
    """An encrypted value anywhere in it (`secure:`; `--path` nests them in a map)."""
    if isinstance(value, dict):
        return set(value) == {"secure"} or any(has_secure(v) for v in value.values())
    if isinstance(value, list):
        return any(has_secure(v) for v in value)
    return False


# What stands in for each secret of the stack (and for the SSH key a stack file leaves to
# `pulumi config set --secret`): no recipe holds one, none is read or written here (only
# the Pulumi CLI could decrypt them), but the stack's rules check that a key is given.
# Never printed: only the image and the models are.
_NOT_READ = "secret-not-read"


def stack_without_secrets(stack: str, project_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """The stack file's `spark-vllm:` keys, each secret replaced by a stand-in: for the
    tools that need none (recipes, the metrics config), which then run without the Pulumi
    CLI and without the SSH key."""
    raw = stack_file_raw(stack, project_dir)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "ssh_private_keys" and isinstance(value, dict) and "secure" not in value:
            out[key] = dict.fromkeys(value, _NOT_READ)
        elif key in SECRET_FIELDS:
            out[key] = _NOT_READ
        elif not has_secure(value):
            out[key] = value
    if "ssh_private_key_file" not in out:  # set with `pulumi config set --secret` later
        out.setdefault("ssh_private_key", _NOT_READ)
    return out


def from_stack_file(stack: str, project_dir: Path = PROJECT_DIR) -> StackConfig:
    """The stack file's config, where the Pulumi CLI is absent: a `secure:` value (which
    only the CLI can decrypt) is refused, naming the key the tools read instead."""
    raw = stack_file_raw(stack, project_dir)
    encrypted = [
        Issue(
            path=key,
            value="[secret]",
            problem="is a Pulumi secret (`secure:`), which only the Pulumi CLI can decrypt, "
            "and it is not installed here",
            fix="run this where the Pulumi CLI is installed"
            + (f", or {_SECRET_INSTEAD[key]}" if key in _SECRET_INSTEAD else ""),
        )
        for key, value in raw.items()
        if has_secure(value)
    ]
    if encrypted:
        raise ConfigError(encrypted)
    return load_stack_config(raw)


def for_tools(stack: str, project_dir: Path = PROJECT_DIR) -> StackConfig:
    """Through the Pulumi CLI where it is installed (the stack file checked first, so a
    broken one is named by its line, as without the CLI), else from the stack file."""
    if shutil.which("pulumi"):
        path = project_dir / f"Pulumi.{stack}.yaml"
        if path.is_file():
            stack_file_config(path)
        return from_cli(stack, project_dir)
    return from_stack_file(stack, project_dir)
