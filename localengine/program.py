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
    secrets = [k if ":" in k else f"{PROJECT}:{k}" for k in secret_keys or []]
    return values, secrets


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
