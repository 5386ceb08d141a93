"""The project file (Pulumi.yaml): its name and runtime options, read as the CLI reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkvllm.config import ConfigError
from sparkvllm.config_sources import load_yaml_file, stack_file_config


class StackConfigError(Exception):
    """The project's or the stack's config file cannot be used by the local engine."""


def project_file(project_dir: Path) -> dict[str, Any]:
    path = project_dir / "Pulumi.yaml"
    if not path.exists():
        raise StackConfigError(f"no Pulumi.yaml in {project_dir}; fix: run in the project's folder")
    project = _loaded(path, "project file")
    if not project.get("name"):
        raise StackConfigError(f"{path}: no project `name:`; fix: name the project")
    return project


def project_name(project_dir: Path) -> str:
    """The project's name: the second part of every URN and the folder of its states."""
    return str(project_file(project_dir)["name"])


def runtime_options(project: dict[str, Any]) -> dict[str, Any]:
    """Pulumi.yaml's `runtime.options` (none when `runtime` is the short form, a name)."""
    runtime = project.get("runtime")
    if isinstance(runtime, dict):
        return dict(runtime.get("options") or {})
    return {}


def _loaded(path: Path, what: str) -> dict[str, Any]:
    """A Pulumi YAML file read as the CLI reads it (sparkvllm.config_sources: UTF-8, a
    mapping, no key twice); its problem in one line naming the file, the line and the fix."""
    try:
        return stack_file_config(path) if what == "stack file" else load_yaml_file(path, what)
    except ConfigError as e:
        raise StackConfigError("; ".join(i.render() for i in e.issues)) from None


def read_stack_file(path: Path) -> dict[str, Any]:
    """The `config:` of a stack file (Pulumi.<stack>.yaml)."""
    return _loaded(path, "stack file")
