"""One problem per line: where, what value, what is wrong, how to fix (`Issue`), and the
one error that carries them all (`ConfigError`), raised before anything is registered."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr

SECRET_FIELDS = {"ssh_private_key", "ssh_private_keys", "api_key", "hf_token"}
# Secrets that are maps: `pulumi config set --secret --path 'ssh_private_keys.spark-2'`
# stores a map, and the program receives it as JSON text (as every structured value).
STRUCTURED_SECRETS = {"ssh_private_keys"}


class Issue(BaseModel):
    """One problem in the stack config: where, what value, what is wrong, how to fix."""

    model_config = ConfigDict(frozen=True)
    path: str
    value: Any
    problem: str
    fix: str

    def render(self) -> str:
        shown = _redacted(self.path, self.value)
        return f"{self.path} = {shown}: {self.problem}. Fix: {self.fix}."


class ConfigError(Exception):
    """The stack config is invalid. Raised before any resource is registered."""

    def __init__(self, issues: Iterable[Issue], what: str = "stack config is invalid"):
        self.issues = list(issues)
        lines = "\n".join(f"  - {i.render()}" for i in self.issues)
        noun = "problem" if len(self.issues) == 1 else "problems"
        super().__init__(f"{what} ({len(self.issues)} {noun}); nothing was deployed:\n{lines}")


def _redacted(path: str, value: Any) -> str:
    if path in SECRET_FIELDS or isinstance(value, SecretStr):
        return "'[secret]'"
    shown = repr(value)
    # A very long value is cut: the line must stay readable in `pulumi up` output.
    return shown if len(shown) <= 200 else f"{shown[:200]}... ({len(shown)} characters)"
