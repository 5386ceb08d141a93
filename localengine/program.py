"""Run the project's Pulumi program against the engine's monitor, with the stack's config as
the Pulumi CLI would pass it: `project:key` -> string (structured values as JSON), and the
secret keys named. The program runs in a process of its own (langhost.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localengine import wire
from localengine.executor import Deployment
from localengine.langhost import (
    ProgramError,
    Services,
    default_parallel,
    run_program_process,
)
from localengine.monitor import EngineService
from localengine.project import StackConfigError, project_file, read_stack_file
from sparkvllm.config_sources import has_secure

__all__ = ["ProgramError", "StackConfigError", "project_file", "run_program", "stack_config"]


def stack_config(
    project_dir: Path,
    stack: str,
    config: dict[str, Any] | None = None,
    secret_keys: list[str] | None = None,
) -> tuple[dict[str, str], list[str]]:
    """The config the program gets: Pulumi.<stack>.yaml's `config:`, or `config` (keys
    with or without the project namespace) as `pulumi config set` would have set it, the
    keys in `secret_keys` as with `--secret`."""
    if config is None:
        path = project_dir / f"Pulumi.{stack}.yaml"
        if not path.exists():
            raise StackConfigError(
                f"stack {stack!r}: no {path.name}; fix: create it or pick another --stack"
            )
        config = read_stack_file(path)
    project = project_file(project_dir)
    name = str(project["name"])
    secrets = {k if ":" in k else f"{name}:{k}" for k in secret_keys or []}
    config = apply_project_config(project, stack, config, secrets)
    values: dict[str, str] = {}
    for key, value in config.items():
        full = key if ":" in key else f"{name}:{key}"
        if has_secure(value):
            raise StackConfigError(
                f"{stack}: {key} is an encrypted `secure:` value, which only the Pulumi CLI "
                "can decrypt; fix: run `pulumi` for this stack, or give the value as a file "
                "(e.g. ssh_private_key_file)"
            )
        values[full] = value if isinstance(value, str) else json.dumps(value)
    return values, sorted(secrets)


_CONFIG_TYPES = ("string", "integer", "boolean", "array", "object")


def _typed(type_name: str, items: dict[str, Any] | None, value: Any) -> bool:
    """sdk/go/common/workspace/project.go ValidateConfigValue (v3.259.0)."""
    if type_name == "string":
        return isinstance(value, str)
    if type_name == "integer":
        if isinstance(value, bool):
            return False
        if isinstance(value, int) or (isinstance(value, float) and value == int(value)):
            return True
        return isinstance(value, str) and value.strip().lstrip("+-").isdigit()
    if type_name == "boolean":
        return isinstance(value, bool) or value in ("true", "false")
    if type_name == "object":
        return isinstance(value, dict)
    if not isinstance(value, list) or items is None:
        return False
    return all(_typed(str(items.get("type")), items.get("items"), v) for v in value)


def _full_type(type_name: str, items: dict[str, Any] | None) -> str:
    """project.go InferFullTypeName."""
    if items is not None:
        return f"array<{_full_type(str(items.get('type')), items.get('items'))}>"
    return type_name


def _as_stack_value(value: Any) -> Any:
    """What Pulumi's config map holds for a stack file value: objects and lists as such,
    every other value as its text (pkg config.Value: `true` is "true", 8000 is "8000")."""
    if isinstance(value, dict | list):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def apply_project_config(
    project: dict[str, Any], stack: str, config: dict[str, Any], secret_keys: set[str]
) -> dict[str, Any]:
    """The stack's config with Pulumi.yaml's `config:` block applied as the CLI applies it
    before running the program: the block is checked (project.go Project.Validate), a
    declared key missing on the stack takes its `default` or `value` or is reported missing
    (pkg/workspace/config.go mergeConfig), and each typed key's value is checked against
    its type (validateStackConfigValue). Keys: with or without the project's namespace."""
    name = str(project.get("name"))
    declared = project.get("config") or {}
    if not isinstance(declared, dict):
        raise StackConfigError("Pulumi.yaml: `config:` must be a map of keys to declarations")

    def full(key: str) -> str:
        return key if ":" in key else f"{name}:{key}"

    def ours(key: str) -> bool:
        return ":" not in key or key.startswith(f"{name}:")

    decls: dict[str, dict[str, Any]] = {}
    for key, decl in declared.items():
        if not isinstance(decl, dict):  # a bare value is shorthand for `value:`
            decl = {"value": decl}
        if decl.get("default") is not None and decl.get("value") is not None:
            raise StackConfigError(
                f"project config '{key}' cannot have both a 'default' and 'value' attribute"
            )
        typ, items, default = decl.get("type"), decl.get("items"), decl.get("default")
        if typ is not None and typ not in _CONFIG_TYPES:
            raise StackConfigError(f"Pulumi.yaml: config '{key}': unknown type {typ!r}")
        if ours(key):
            if typ == "array" and items is None:
                raise StackConfigError(
                    f"The configuration key '{key}' declares an array but does not specify "
                    "the underlying type via the 'items' attribute"
                )
            if typ is not None and default is not None and not _typed(typ, items, default):
                raise StackConfigError(
                    f"The default value specified for configuration key '{key}' is not of "
                    f"the expected type '{_full_type(typ, items)}'"
                )
        elif typ is not None:
            raise StackConfigError(
                f"Configuration key '{key}' is not namespaced by the project and should not "
                "define a type"
            )
        elif default is not None:
            raise StackConfigError(
                f"Configuration key '{key}' is not namespaced by the project and should not "
                "define a default value. Did you mean to use the 'value' attribute instead "
                "of 'default'?"
            )
        elif decl.get("value") is None:
            raise StackConfigError(
                f"Configuration key '{key}' is namespaced and must provide an attribute 'value'"
            )
        decls[key] = decl

    merged = {full(k): v for k, v in config.items()}
    missing = []
    for key in sorted(decls):
        decl = decls[key]
        if full(key) in merged:
            continue
        fallback = decl["default"] if decl.get("default") is not None else decl.get("value")
        if fallback is None:
            if ours(key):
                missing.append(key)
            continue
        merged[full(key)] = fallback
    if missing:
        keys = (
            f"'{missing[0]}'"
            if len(missing) == 1
            else ", ".join(f"'{k}'" for k in missing[:-1]) + f" and '{missing[-1]}'"
        )
        plural = "value" if len(missing) == 1 else "values"
        raise StackConfigError(f"Stack '{stack}' is missing configuration {plural} {keys}")
    for key in sorted(decls):
        decl = decls[key]
        value = merged.get(full(key))
        secure = full(key) in secret_keys or (isinstance(value, dict) and set(value) == {"secure"})
        if decl.get("secret") and not secure:
            raise StackConfigError(
                f"Stack '{stack}' with configuration key '{key}' must be encrypted as it's secret"
            )
        typ = decl.get("type")
        if typ is None or secure:
            continue
        if not _typed(typ, decl.get("items"), _as_stack_value(value)):
            raise StackConfigError(
                f"Stack '{stack}' with configuration key '{key}' must be of type "
                f"'{_full_type(typ, decl.get('items'))}'"
            )
    return merged


def run_program(
    project_dir: Path,
    stack: str,
    deployment: Deployment,
    services: Services,
    engine: EngineService,
    config: dict[str, Any] | None = None,
    secret_keys: list[str] | None = None,
    parallel: int | None = None,
) -> None:
    """Run the project's program in its own process (langhost.py), every registration
    going to `deployment` through `services`; raises ProgramError when it fails."""
    project = project_file(project_dir)
    values, secret_keys = stack_config(project_dir, stack, config, secret_keys)
    deployment.secrets.add({k: wire.secret(values[k]) for k in secret_keys if k in values})
    code = run_program_process(
        project_dir, project, stack, services, config=values, secret_keys=secret_keys,
        dry_run=deployment.preview, parallel=parallel or default_parallel(),
        log=deployment.log,
    )  # fmt: skip
    if code != 0:
        raise ProgramError(_first(engine.errors) or f"the program exited with code {code}")


def _first(errors: list[str]) -> str:
    """The program's first error, whole (the CLI's Diagnostics show it once, at the end):
    a config error's one line per problem, a traceback as the language host wrote it."""
    return errors[0].strip() if errors else ""
