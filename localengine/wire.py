"""Property values as they cross the resource monitor and sit in state: Pulumi's JSON form.

A value is plain JSON, except for two markers the engine and providers agree on
(pulumi sdk/python/lib/pulumi/runtime/rpc.py): the unknown sentinel (a value computed
later, only in preview) and the secret wrapper `{SECRET_KEY: SECRET_SIG, "value": v}`.
Resource references, assets and archives are not used by this program and are refused.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from google.protobuf import json_format, struct_pb2

UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
_OTHER_SIGS = {
    "5cf8f73096256a8f31e491e813e4eb8e": "resource reference",
    "c44067f5952c0a294b673a41bacd8c17": "asset",
    "0def7320c3a5731c473e5ecbe6d01bc7": "archive",
    "d0e6a833031e9bbcd3f4e8bde6ca49a4": "output value",
}


class UnsupportedValue(Exception):
    """A value the local engine does not model."""


def from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    value = json_format.MessageToDict(struct)
    check_supported(value, "")
    return value


def to_struct(value: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    json_format.ParseDict(value, struct)
    return struct


def check_supported(value: Any, path: str) -> None:
    if isinstance(value, dict):
        kind = _OTHER_SIGS.get(str(value.get(SIG_KEY)))
        if kind:
            raise UnsupportedValue(f"{path or 'a value'} is a {kind}, which the engine refuses")
        for k, v in value.items():
            check_supported(v, f"{path}.{k}" if path else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_supported(v, f"{path}[{i}]")


def secret(value: Any) -> dict[str, Any]:
    return {SIG_KEY: SECRET_SIG, "value": value}


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SIG_KEY) == SECRET_SIG


def plain(value: Any) -> Any:
    """`value` with every secret wrapper removed (what a provider computes with)."""
    if is_secret(value):
        return plain(value.get("value"))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def contains_secret(value: Any) -> bool:
    if is_secret(value):
        return True
    if isinstance(value, dict):
        return any(contains_secret(v) for v in value.values())
    if isinstance(value, list):
        return any(contains_secret(v) for v in value)
    return False


def has_unknown(value: Any) -> bool:
    if value == UNKNOWN:
        return True
    if isinstance(value, dict):
        return any(has_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(has_unknown(v) for v in value)
    return False


def same(a: Any, b: Any) -> bool:
    """Equal as providers compare: secretness aside; an unknown equals nothing."""
    if has_unknown(a) or has_unknown(b):
        return False
    return bool(plain(a) == plain(b))


def empty(value: Any) -> bool:
    """Unset as Terraform and the go-provider see it (absent, null, "" for optional, [] or {})."""
    return value is None or value == [] or value == {}


def changed_keys(olds: dict[str, Any], news: dict[str, Any]) -> list[str]:
    """Top-level keys whose values differ (absent and empty are equal)."""
    keys = set(olds) | set(news)
    return sorted(
        k
        for k in keys
        if not (empty(olds.get(k)) and empty(news.get(k))) and not same(olds.get(k), news.get(k))
    )


def redacted(value: Any) -> Any:
    """`value` with each secret shown as "[secret]" (for logs and plans)."""
    if is_secret(value):
        return "[secret]"
    if isinstance(value, dict):
        return {k: redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v) for v in value]
    if value == UNKNOWN:
        return "[unknown]"
    return value


# A pulumi-command connection is secret as a whole (it is encrypted at rest), but of its
# fields only password, privateKey and privateKeyPassword are (pulumi-command v1.2.1
# provider/pkg/provider/remote/connection.go: `provider:"secret"`): where a node is and who
# logs in stay readable in what is shown.
_CONNECTION_PUBLIC = {"host", "user", "port", "dialErrorLimit", "perDialTimeout", "hostKey",
                      "agentSocketPath"}  # fmt: skip


def secret_texts(value: Any, inside: bool = False) -> set[str]:
    """The string values held inside secrets anywhere in `value`."""
    if is_secret(value):
        return secret_texts(value.get("value"), inside=True)
    if isinstance(value, dict):
        public = _CONNECTION_PUBLIC if "host" in value else set()
        return set().union(*(secret_texts(v, inside) for k, v in value.items() if k not in public))
    if isinstance(value, list):
        return set().union(*(secret_texts(v, inside) for v in value))
    return {value} if inside and isinstance(value, str) else set()


class SecretFilter:
    """Each known secret text in a line to be shown replaced by "[secret]", as the CLI
    filters what it displays (pulumi sdk/go/common/util/logging/log.go replacements and
    FilterString: texts under 3 characters and "true"/"false" are left, a JSON-escaped
    form is replaced too). The CLI knows the stack's secret config; the local engine also
    knows every secret input and output of the run (a command's error that echoes its
    secret environment, a key in a message)."""

    def __init__(self) -> None:
        self._texts: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self._lock = threading.Lock()

    def add(self, value: Any) -> None:
        new = set()
        for text in secret_texts(value):
            for form in {text, json.dumps(text)[1:-1], *text.splitlines()}:
                if len(form.strip()) >= 3 and form.lower() not in ("true", "false"):
                    new.add(form)
        with self._lock:
            if new - self._texts:
                self._texts |= new
                self._pattern = None  # made again when next used

    def _compiled(self) -> re.Pattern[str] | None:
        """The texts as one pattern, made when first used after a change: a run adds
        secrets at each resource and matches far less often. Longest first, so a secret
        is replaced whole before any part of it; ties in text order, so the same texts
        give the same pattern (the re module's cache then holds it)."""
        with self._lock:
            if self._pattern is None and self._texts:
                words = sorted(self._texts, key=lambda w: (-len(w), w))
                self._pattern = re.compile("|".join(map(re.escape, words)))
            return self._pattern

    def __call__(self, line: str) -> str:
        pattern = self._compiled()
        return pattern.sub("[secret]", line) if pattern is not None else line

    def found(self, text: str) -> bool:
        """Whether `text` holds a known secret."""
        pattern = self._compiled()
        return pattern is not None and pattern.search(text) is not None
