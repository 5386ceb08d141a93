"""What the engine asks of a provider (pulumi's ResourceProvider gRPC interface, the calls
this program needs) and the one seam through which providers touch nodes."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from localengine import wire

# The side-effect seam: run a shell command on a node over ssh (stdin optional), return the
# completed process. sparkvllm.remote.run_ssh in real use; a recording fake in tests.
Transport = Callable[..., Any]

# The customTimeouts of the step whose provider call is in flight in this thread, in seconds
# (0: none set): what the CLI passes in CreateRequest, UpdateRequest and DeleteRequest
# `timeout` (pkg/resource/deploy/step.go). Set by the engine around each call.
STEP_TIMEOUT: ContextVar[float] = ContextVar("step_timeout", default=0.0)


class ProviderError(Exception):
    """A provider call failed; the message names the resource and the cause."""


class PartialCreate(ProviderError):
    """The resource came to exist but the create failed afterwards (the bridge's
    initialization error): the engine records it with the error, and the step fails."""

    def __init__(self, message: str, id_: str, outputs: dict[str, Any]):
        super().__init__(message)
        self.id = id_
        self.outputs = outputs


@dataclass
class DiffResult:
    """Top-level input keys that changed, and those of them that force a replacement."""

    changes: list[str] = field(default_factory=list)
    replaces: list[str] = field(default_factory=list)
    delete_before_replace: bool = False


@dataclass
class ReadResult:
    """`id` None: the resource is gone (refresh drops it from state)."""

    id: str | None
    inputs: dict[str, Any]
    outputs: dict[str, Any]


class Provider(Protocol):
    def check(self, typ: str, olds: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]: ...

    def diff(
        self, typ: str, id_: str, old_inputs: dict[str, Any], old_outputs: dict[str, Any],
        news: dict[str, Any],
    ) -> DiffResult: ...  # fmt: skip

    def create(
        self, typ: str, name: str, inputs: dict[str, Any], preview: bool
    ) -> tuple[str, dict[str, Any]]: ...

    def read(
        self, typ: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any]
    ) -> ReadResult: ...

    def update(
        self, typ: str, name: str, id_: str, old_outputs: dict[str, Any], news: dict[str, Any],
        preview: bool,
    ) -> dict[str, Any]: ...  # fmt: skip

    def delete(
        self, typ: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any]
    ) -> None: ...


def refuse_unknown_inputs(typ: str, name: str, inputs: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(k for k, v in inputs.items() if k not in known and not wire.empty(v))
    if unknown:
        raise ProviderError(
            f"{name}: the local engine does not model {typ} input(s) {unknown}; "
            "fix: drop them or add them to the provider model with their source rule"
        )
