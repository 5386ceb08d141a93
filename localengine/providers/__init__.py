"""Models of the providers the program uses, each following its source (docs/engine-rules.md):
pulumi-command 1.2.1 (`command.py`), pulumi-docker 5.2.0 / kreuzwerker's Terraform provider
(`docker.py`) and Python dynamic providers (`dynamic.py`). A type they do not model is
refused, never guessed."""

from __future__ import annotations

from localengine.providers.base import DiffResult, Provider, ProviderError, ReadResult, Transport

__all__ = ["DiffResult", "Provider", "ProviderError", "ReadResult", "Transport"]
