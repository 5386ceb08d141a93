"""Run the project's Pulumi program (`__main__.py`) against the engine's monitor, with the
stack's config as the Pulumi CLI would pass it: `project:key` -> string (structured values as
JSON), and the secret keys named."""

from __future__ import annotations

import contextlib
import json
import pickle
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import settings as runtime_settings

from localengine.deployment import Deployment
from localengine.monitor import EngineMonitor
from localengine.state import PROJECT


class StackConfigError(Exception):
    """The stack's config file cannot be used by the local engine."""


def project_file(project_dir: Path) -> dict[str, Any]:
    return yaml.safe_load((project_dir / "Pulumi.yaml").read_text()) or {}


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
        config = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
    secrets = {k if ":" in k else f"{PROJECT}:{k}" for k in secret_keys or []}
    config = apply_project_config(project_file(project_dir), stack, config, secrets)
    values: dict[str, str] = {}
    for key, value in config.items():
        full = key if ":" in key else f"{PROJECT}:{key}"
        if isinstance(value, dict) and set(value) == {"secure"}:
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
    name = str(project.get("name") or PROJECT)
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


@contextlib.contextmanager
def own_process_pickler() -> Iterator[None]:
    """As if the program ran in a process of its own (as the Python language host runs it).

    pulumi.dynamic's serialize_provider patches pickle's pure-Python Pickler for every
    dynamic resource and never undoes it: each patch wraps the one before. Harmless in a
    fresh process per program; the local engine runs programs in-process, one after
    another, where the wrappers would pile up until RecursionError. The patch is undone
    after each run."""
    saved = {k: pickle._Pickler.__dict__[k] for k in ("_batch_setitems", "save_dict")}
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(pickle._Pickler, key, value)


def run_program(
    project_dir: Path,
    stack: str,
    deployment: Deployment,
    config: dict[str, Any] | None = None,
    secret_keys: list[str] | None = None,
) -> None:
    """Run `__main__.py` with every registration going to `deployment`."""
    values, secret_keys = stack_config(project_dir, stack, config, secret_keys)
    pulumi.runtime.set_all_config(values, secret_keys)
    runtime_settings.ROOT.set(None)  # a fresh root stack resource for this run
    monitor = EngineMonitor(deployment)
    pulumi.runtime.set_mocks(
        monitor.mocks, project=PROJECT, stack=stack, preview=deployment.preview, monitor=monitor
    )
    if str(project_dir) not in sys.path:
        sys.path.insert(0, str(project_dir))

    @pulumi.runtime.test
    def program() -> pulumi.Output[Any]:
        runpy.run_path(str(project_dir / "__main__.py"), run_name="__main__")
        root = runtime_settings.get_root_resource()
        assert isinstance(root, pulumi.ComponentResource)
        outputs = dict(getattr(root, "outputs", {}))
        root.register_outputs(outputs)
        return pulumi.Output.from_input(True)

    with own_process_pickler():
        program()
