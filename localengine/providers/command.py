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

`environment`, and on update and delete the previous stdout and stderr when not empty
(PULUMI_COMMAND_STDOUT / _STDERR, unless `addPreviousOutputInEnv` is false), are SSH env
requests, as Go's `session.Setenv` makes them (commandOutputs.go run): here ssh sends them
from its own environment (`-o SendEnv=NAME`; sparkvllm/remote.py run_ssh `env`), so no
value is in any argv (a command line is readable by every user: `ps`). The node's sshd sets
only the names its AcceptEnv lists. pulumi-command fails when an `environment` name is
refused and only warns for the previous outputs; OpenSSH's client does not report a refusal,
so the command is preceded by a check, on the node, that each `environment` name is set
(names only): "could not set environment variable NAME", exit 255. The previous outputs are
sent optimistically, unchecked (pulumi-command warns and goes on).
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

from localengine import wire
from localengine.providers.base import (
    STEP_TIMEOUT,
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
# The bound of a remote command whose resource sets no customTimeouts (the local engine's;
# pulumi-command has none): two hours, above any step of this program (the longest it
# sets is an hour, the image's transfer).
DEFAULT_TIMEOUT_S = 7200.0


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
        # commandOutputs.go run: `environment`, then the previous outputs, are set with SSH
        # env requests (session.Setenv), sent by ssh from its environment (run_ssh `env`).
        env = _environment(name, inputs)
        sent = {**env, **_previous_outputs(inputs, previous)}
        stdin = wire.plain(inputs.get("stdin"))
        # pulumi-command gives a step's customTimeouts to the dial only (pulumi-go-provider
        # middleware/cancel puts it on the context; session.Run does not read the context),
        # so under the CLI a hung command hangs. Here the ssh call is bounded: by the step's
        # customTimeouts, else by DEFAULT_TIMEOUT_S (a difference, docs/engine-rules.md).
        bound = STEP_TIMEOUT.get() or DEFAULT_TIMEOUT_S
        try:
            result = self._transport(
                target, _required(env) + command, stdin=stdin, timeout=bound, env=sent
            )
        except subprocess.TimeoutExpired:
            source = "its customTimeouts" if STEP_TIMEOUT.get() else "the local engine's default"
            raise ProviderError(
                f"{name}: no answer from {target.host} within {bound:.0f}s ({source}); the ssh "
                "call was ended, the command may still be running on the node"
            ) from None
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


# Names the workstation's own ssh, its ProxyCommand or the dynamic loader read from their
# environment: sent this way they would act on the WORKSTATION first (LD_PRELOAD loads code
# into ssh, PATH picks the ProxyCommand). pulumi-command's Go client keeps its own
# environment apart, so it has no such names; here they are refused. The loader's list is
# glibc's unsecure variables (sysdeps/generic/unsecvars.h).
_WORKSTATION_NAMES = {
    "PATH", "HOME", "SHELL", "ENV", "BASH_ENV", "IFS", "TMPDIR", "GCONV_PATH", "GETCONF_DIR",
    "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH", "MALLOC_TRACE", "NIS_PATH",
    "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR", "DISPLAY", "XAUTHORITY",
}  # fmt: skip
_WORKSTATION_PREFIXES = ("LD_", "SSH_", "MALLOC_")


def _environment(name: str, inputs: dict[str, Any]) -> dict[str, str]:
    """`environment`, plain; each name a shell variable name (it is sent by name, and
    checked by name on the node: `_required`), and none the workstation's ssh reads."""
    env = {str(k): str(v) for k, v in (wire.plain(inputs.get("environment")) or {}).items()}
    bad = [k for k in env if not (k.isascii() and k.isidentifier())]
    if bad:
        raise ProviderError(f"{name}: environment name {bad[0]!r} is not a variable name")
    local = [k for k in env if k in _WORKSTATION_NAMES or k.startswith(_WORKSTATION_PREFIXES)]
    if local:
        raise ProviderError(
            f"{name}: environment name {local[0]!r} is not sent by the local engine: the "
            "workstation's own ssh would read it first; fix: set it in the command itself "
            f"(`{local[0]}=... command`), or run this stack with the Pulumi CLI"
        )
    return env


def _previous_outputs(inputs: dict[str, Any], previous: dict[str, str] | None) -> dict[str, str]:
    """commandOutputs.go run: on update and delete, PULUMI_COMMAND_STDOUT / _STDERR when not
    empty, unless `addPreviousOutputInEnv` is false (util/util.go names them)."""
    if not previous or wire.plain(inputs.get("addPreviousOutputInEnv")) is False:
        return {}
    return {f"PULUMI_COMMAND_{k.upper()}": v for k, v in previous.items() if v}


def _required(env: dict[str, str]) -> str:
    """The check before the command that each `environment` name is set on the node
    (names only): an `environment` the node refused is an error in pulumi-command
    (commandOutputs.go run: logAndWrapSetenvErr with diag.Error), and OpenSSH's client does
    not report a refused env request, so the node's shell does. 255: ssh's own failure code,
    never the command's."""
    return "".join(
        f'[ -n "${{{k}+x}}" ] || {{ echo "could not set environment variable {k}: the '
        f"node's sshd must accept it (AcceptEnv {k})\" >&2; exit 255; }}; "
        for k in sorted(env)
    )


def _known(typ: str) -> None:
    if typ != TYPE:
        raise ProviderError(f"the local engine does not model {typ} (pulumi-command models {TYPE})")
