"""pulumi-command 1.2.1, `command:remote:Command` (rules and sources: docs/engine-rules.md).

- Diff (pulumi-go-provider 1.3.0 infer's default diff): any changed input is an update;
  a change of `triggers` (the only replaceOnChanges input) is a replacement.
- Create runs `create`; Update runs `update` if set, else `create` again; Delete runs
  `delete` (on destroy and on replacement) with the OLD inputs; Read does not exist, so a
  refresh leaves the state as it was.
- Preview: nothing runs; the outputs of a create or an update are unknown (the provider
  declares no wire dependencies, so every output depends on every input).
- stdout and stderr are recorded with the trailing newline trimmed.

The connection is made here with the workstation's `ssh` binary rather than Go's SSH
library (a stand-in transport with the same key and host-key policy: the host key is
verified exactly when `connection.hostKey` is set).
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from localengine import wire
from localengine.providers.base import (
    DiffResult,
    ProviderError,
    ReadResult,
    Transport,
    refuse_unknown_inputs,
)
from sparkvllm.remote import ConnectionFiles
from sparkvllm.specs.ssh import SshTarget

TYPE = "command:remote:Command"
_INPUTS = {"connection", "create", "update", "delete", "stdin", "triggers",
           "addPreviousOutputInEnv", "environment", "logging"}  # fmt: skip
_REPLACE_ON_CHANGES = {"triggers"}
_CONNECTION_DEFAULTS = {"user": "root", "port": 22, "dialErrorLimit": 10, "perDialTimeout": 15}
_OUTPUTS = ("stdout", "stderr")


def _with_defaults(conn: dict[str, Any]) -> dict[str, Any]:
    out = {**_CONNECTION_DEFAULTS, **conn}
    proxy = out.get("proxy")
    if isinstance(proxy, dict) and wire.is_secret(proxy) and isinstance(proxy.get("value"), dict):
        out["proxy"] = wire.secret({**_CONNECTION_DEFAULTS, **proxy["value"]})
    elif isinstance(proxy, dict):
        out["proxy"] = {**_CONNECTION_DEFAULTS, **proxy}
    return out


class CommandProvider:
    def __init__(self, transport: Transport):
        self._transport = transport
        self._files = ConnectionFiles()

    def check(self, typ: str, olds: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]:
        _known(typ)
        out = dict(news)
        conn = out.get("connection")
        # connection.go Annotate: the defaults of user, port and the dial limits (the
        # connection arrives as a secret: the defaults go inside it); proxyConnection.go
        # Annotate: the same defaults for the bastion.
        if isinstance(conn, dict) and wire.is_secret(conn) and isinstance(conn.get("value"), dict):
            out["connection"] = wire.secret(_with_defaults(conn["value"]))
        elif isinstance(conn, dict):
            out["connection"] = _with_defaults(conn)
        return out

    def diff(
        self, typ: str, id_: str, old_inputs: dict[str, Any], old_outputs: dict[str, Any],
        news: dict[str, Any],
    ) -> DiffResult:  # fmt: skip
        changes = wire.changed_keys(old_inputs, news)
        return DiffResult(
            changes=changes, replaces=[k for k in changes if k in _REPLACE_ON_CHANGES]
        )

    def create(
        self, typ: str, name: str, inputs: dict[str, Any], preview: bool
    ) -> tuple[str, dict[str, Any]]:
        refuse_unknown_inputs(typ, name, inputs, _INPUTS)
        if preview:
            return "", {**inputs, **{k: wire.UNKNOWN for k in _OUTPUTS}}
        outputs = self._run(name, inputs, str(wire.plain(inputs.get("create")) or ""), None)
        # commandController.go Create: the ID is the resource name plus a random suffix.
        return f"{name}{os.urandom(4).hex()}", outputs

    def read(
        self, typ: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any]
    ) -> ReadResult:
        return ReadResult(id_, inputs, outputs)

    def update(
        self, typ: str, name: str, id_: str, old_outputs: dict[str, Any], news: dict[str, Any],
        preview: bool,
    ) -> dict[str, Any]:  # fmt: skip
        refuse_unknown_inputs(typ, name, news, _INPUTS)
        if preview:
            return {**news, **{k: wire.UNKNOWN for k in _OUTPUTS}}
        command = wire.plain(news.get("update")) or wire.plain(news.get("create")) or ""
        previous = {k: str(wire.plain(old_outputs.get(k)) or "") for k in _OUTPUTS}
        if not command:
            # Update with nothing to run keeps the previous stdout and stderr.
            return {**news, **{k: old_outputs.get(k, "") for k in _OUTPUTS}}
        return self._run(name, news, str(command), previous)

    def delete(self, typ: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        # commandController.go Delete: the stored state's delete, connection and stdout.
        state = {**inputs, **outputs}
        command = wire.plain(state.get("delete"))
        if command:
            previous = {k: str(wire.plain(outputs.get(k)) or "") for k in _OUTPUTS}
            self._run(id_, state, str(command), previous)

    # --- the connection -------------------------------------------------------------

    def _run(
        self, name: str, inputs: dict[str, Any], command: str, previous: dict[str, str] | None
    ) -> dict[str, Any]:
        if not command:
            return {**inputs, "stdout": "", "stderr": ""}
        target = self._target(wire.plain(inputs["connection"]))
        # commandOutputs.go run: `environment`, and on update and delete the previous
        # outputs when not empty (PULUMI_COMMAND_STDOUT / _STDERR), are set for the whole
        # session (Go's session.Setenv; here exported before the command).
        env = {str(k): str(v) for k, v in (wire.plain(inputs.get("environment")) or {}).items()}
        bad = [k for k in env if not k.isidentifier()]
        if bad:
            raise ProviderError(f"{name}: environment name {bad[0]!r} is not a variable name")
        if previous and wire.plain(inputs.get("addPreviousOutputInEnv")) is not False:
            env.update({f"PULUMI_COMMAND_{k.upper()}": v for k, v in previous.items() if v})
        if env:
            exports = "; ".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))
            command = f"{exports}; {command}"
        stdin = wire.plain(inputs.get("stdin"))
        # The custom timeout bounds only the dial (ConnectTimeout); a running command is
        # not killed (pulumi-go-provider middleware/cancel).
        result = self._transport(target, command, stdin=stdin, timeout=None)
        if result.returncode != 0:
            tail = "\n".join(str(result.stderr).strip().splitlines()[-15:])
            raise ProviderError(
                f"{name}: command failed on {target.host} (exit {result.returncode}):\n{tail}"
            )
        # stdout/stderr of a secret-bearing command stay secret (additionalSecretOutputs).
        stdout = str(result.stdout).removesuffix("\n")
        stderr = str(result.stderr).removesuffix("\n")
        return {**inputs, "stdout": stdout, "stderr": stderr}

    def _target(self, conn: dict[str, Any]) -> SshTarget:
        return self._files.target(conn)

    def close(self) -> None:
        """At the end of the run (Deployment.close): the key copies go."""
        self._files.close()


def _known(typ: str) -> None:
    if typ != TYPE:
        raise ProviderError(f"the local engine does not model {typ} (pulumi-command models {TYPE})")
