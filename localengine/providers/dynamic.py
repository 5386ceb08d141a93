"""Python dynamic providers (`pulumi-python:dynamic:Resource`), called as pulumi's own
provider host calls them (sdk/python/lib/pulumi/dynamic/__main__.py; docs/engine-rules.md):

- the provider is the dill-pickled `__provider` input; Delete and Read use the one stored
  in the state (the code of the last create or update), Check/Diff/Create/Update the new one;
- Diff gets the OLD OUTPUTS as olds; without a `diff()` (DiffResult changes None) the engine
  compares every input, `__provider` included, and a change is an update;
- Create/Update store only what the provider returned, plus `__provider`;
- Read's outputs replace the state; an empty ID means the resource is gone;
- preview runs no provider code: the planned outputs are the inputs.

Here they run in the engine's process, which is what the provider host is: a Python
process with the program's virtualenv.
"""

from __future__ import annotations

import base64
import threading
from typing import Any

import dill
from pulumi.dynamic import ResourceProvider

from localengine import wire
from localengine.providers.base import DiffResult, ProviderError, ReadResult

TYPE = "pulumi-python:dynamic:Resource"
PROVIDER_KEY = "__provider"

_cache: dict[str, ResourceProvider] = {}
_lock = threading.Lock()


def _provider(props: dict[str, Any]) -> ResourceProvider:
    blob = str(wire.plain(props.get(PROVIDER_KEY)) or "")
    if not blob or blob == wire.UNKNOWN:
        raise ProviderError("a dynamic resource has no __provider")
    with _lock:
        if blob not in _cache:
            _cache[blob] = dill.loads(base64.b64decode(blob))
        return _cache[blob]


def _py(props: dict[str, Any]) -> dict[str, Any]:
    """Wire values as the host hands them to the provider: plain Python (secrets unwrapped)."""
    return {k: wire.plain(v) for k, v in props.items()}


def _secret_like(source: dict[str, Any], outs: dict[str, Any]) -> dict[str, Any]:
    """Outputs keep the secretness of the inputs of the same name (the SDK's rule)."""
    return {
        k: wire.secret(v) if wire.is_secret(source.get(k)) and not wire.is_secret(v) else v
        for k, v in outs.items()
    }


class DynamicProvider:
    def check(self, typ: str, olds: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]:
        if typ != TYPE:
            raise ProviderError(f"the local engine does not model {typ}")
        if wire.has_unknown(news.get(PROVIDER_KEY)):
            return news
        result = _provider(news).check(_py(olds), _py(news))
        if result.failures:
            reasons = "; ".join(f"{f.property}: {f.reason}" for f in result.failures)
            raise ProviderError(f"check failed: {reasons}")
        checked = {**result.inputs, PROVIDER_KEY: news[PROVIDER_KEY]}
        return _secret_like(news, checked)

    def diff(
        self, typ: str, id_: str, old_inputs: dict[str, Any], old_outputs: dict[str, Any],
        news: dict[str, Any],
    ) -> DiffResult:  # fmt: skip
        # In preview an unknown input reaches the provider's diff as the unknown sentinel
        # (dynamic/__main__.py Diff deserializes with keep_unknowns).
        provider = _provider(old_outputs if wire.has_unknown(news.get(PROVIDER_KEY)) else news)
        result = provider.diff(id_, _py(old_outputs), _py(news))
        if result.changes is None:
            # DIFF_UNKNOWN: the engine compares the inputs itself (no change: same).
            changes = wire.changed_keys(old_inputs, news)
            return DiffResult(
                changes=changes,
                replaces=list(result.replaces or []) if changes else [],
                delete_before_replace=bool(result.delete_before_replace),
            )
        if not result.changes:
            return DiffResult()
        replaces = list(result.replaces or [])
        changes = wire.changed_keys(old_inputs, news) or replaces or ["(provider)"]
        return DiffResult(
            changes=sorted(set(changes) | set(replaces)),
            replaces=replaces,
            delete_before_replace=bool(result.delete_before_replace),
        )

    def create(
        self, typ: str, name: str, inputs: dict[str, Any], preview: bool
    ) -> tuple[str, dict[str, Any]]:
        if preview:
            return "", dict(inputs)
        try:
            result = _provider(inputs).create(_py(inputs))
        except Exception as e:  # the provider's own error, reported with the resource
            raise ProviderError(f"{name}: {e}") from None
        outs = _secret_like(inputs, dict(result.outs or {}))
        return str(result.id), {**outs, PROVIDER_KEY: inputs[PROVIDER_KEY]}

    def read(
        self, typ: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any]
    ) -> ReadResult:
        try:
            result = _provider(outputs).read(id_, _py(outputs))
        except Exception as e:
            raise ProviderError(f"{id_}: read failed: {e}") from None
        if not result.id:
            return ReadResult(None, inputs, outputs)
        outs = {
            **_secret_like(outputs, dict(result.outs or {})),
            PROVIDER_KEY: outputs[PROVIDER_KEY],
        }
        new_inputs = inputs
        if result.inputs is not None:
            new_inputs = {
                **_secret_like(inputs, dict(result.inputs)),
                PROVIDER_KEY: outputs[PROVIDER_KEY],
            }
        return ReadResult(str(result.id), new_inputs, outs)

    def update(
        self, typ: str, name: str, id_: str, old_outputs: dict[str, Any], news: dict[str, Any],
        preview: bool,
    ) -> dict[str, Any]:  # fmt: skip
        if preview:
            return dict(news)
        try:
            result = _provider(news).update(id_, _py(old_outputs), _py(news))
        except Exception as e:
            raise ProviderError(f"{name}: {e}") from None
        outs = _secret_like(news, dict(result.outs or {}))
        return {**outs, PROVIDER_KEY: news[PROVIDER_KEY]}

    def delete(self, typ: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        try:
            _provider(outputs).delete(id_, _py(outputs))
        except Exception as e:
            raise ProviderError(f"{id_}: delete failed: {e}") from None
