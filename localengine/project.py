"""The project file (Pulumi.yaml): its name and runtime options, read as the CLI reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class StackConfigError(Exception):
    """The project's or the stack's config file cannot be used by the local engine."""


def project_file(project_dir: Path) -> dict[str, Any]:
    path = project_dir / "Pulumi.yaml"
    if not path.exists():
        raise StackConfigError(f"no Pulumi.yaml in {project_dir}; fix: run in the project's folder")
    project = yaml.safe_load(path.read_text()) or {}
    if not isinstance(project, dict) or not project.get("name"):
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
