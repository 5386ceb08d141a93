"""Python dynamic providers (`pulumi-python:dynamic:Resource`), called in the SDK's own
provider host (`python -m pulumi.dynamic`, sdk/python/lib/pulumi/dynamic/__main__.py) over
gRPC, the host started as the Pulumi CLI starts it (pulumi/pulumi v3.259.0; the rules with
their sources are in docs/engine-rules.md):

- the host is `localengine/vendor/pulumi-resource-pulumi-python` (the CLI's script,
  verbatim), run with the engine's address as its argument, in the PROGRAM's folder
  (sdk/go/common/resource/plugin/plugin.go execPlugin: `cmd.Dir = pwd`), with each
  Pulumi.yaml runtime option as `PULUMI_RUNTIME_<NAME>` and `PULUMI_PROJECT`
  (provider_plugin.go NewProvider); it prints its port; one host per provider resource,
  loaded on first use (pkg/resource/deploy/providers/registry.go); the host, the python its
  script starts included, dies with the engine, a killed one too (localengine/children.py:
  a stand-in difference, docs/engine-rules.md);
- Configure first (the host answers acceptSecrets false, so secret values reach it as plain
  values: provider_plugin.go marshals with KeepSecrets = acceptSecrets), then Check, Diff,
  Create, Read, Update, Delete with the SDK's provider_pb2 messages; the host serves at
  most 4 calls at once (its ThreadPoolExecutor(max_workers=4));
- the provider is the dill-pickled `__provider` property: Check/Diff/Create/Update use the
  new one, Read and Delete the one in the state (the pickle of the last create or update:
  for a class of an importable module, a REFERENCE to it, resolved in the host);
- Diff gets the OLD OUTPUTS as olds; DIFF_UNKNOWN (no `diff()`): the engine compares the
  inputs itself, `__provider` included;
- outputs named like a secret input are secret (provider_plugin.go annotateSecrets);
- in preview, Create and Update are not called (the host does not support preview:
  provider_plugin.go returns the inputs as the planned outputs).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
from collections import deque
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import struct_pb2
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from localengine import children, wire
from localengine.langhost import GRPC_OPTIONS
from localengine.project import runtime_options
from localengine.providers.base import STEP_TIMEOUT, DiffResult, ProviderError, ReadResult

TYPE = "pulumi-python:dynamic:Resource"
PROVIDER_KEY = "__provider"
HOST = Path(__file__).resolve().parent.parent / "vendor" / "pulumi-resource-pulumi-python"
START_TIMEOUT_S = 60.0
_DIFF = provider_pb2.DiffResponse


class PluginContext:
    """Where and how provider hosts start: the program's folder, its Pulumi.yaml runtime
    options and project name, and the engine's address (the host's argument)."""

    def __init__(self, project_dir: Path, project: dict[str, Any], engine_address: str):
        self.project_dir = project_dir
        self.project = project
        self.engine_address = engine_address

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        for key, value in runtime_options(self.project).items():
            text = value if isinstance(value, str) else str(value).lower()
            env[f"PULUMI_RUNTIME_{key.upper()}"] = text
        env["PULUMI_PROJECT"] = str(self.project.get("name"))
        return env


class ProviderHost:
    """One `python -m pulumi.dynamic` process and a gRPC client of it."""

    def __init__(self, context: PluginContext):
        self.context = context
        self.stderr: deque[str] = deque(maxlen=40)
        # In a session of its own, armed to die with the engine, the python the script
        # starts with it (localengine/children.py).
        self.proc: subprocess.Popen[str] = children.start(
            ["/bin/sh", str(HOST), context.engine_address],
            cwd=context.project_dir, env=context.environment(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        _LIVE.add(self.proc)
        threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True).start()
        port = self._port()
        # After the port, whatever a provider prints is read too (as the CLI reads a
        # plugin's output), so a full pipe never stalls the host.
        threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True).start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS)
        try:
            grpc.channel_ready_future(self.channel).result(timeout=START_TIMEOUT_S)
            self.stub = provider_pb2_grpc.ResourceProviderStub(self.channel)
            self.stub.Configure(
                provider_pb2.ConfigureRequest(
                    args=struct_pb2.Struct(), acceptSecrets=True, acceptResources=True
                )
            )
        except (grpc.FutureTimeoutError, grpc.RpcError) as e:
            self.close()
            raise ProviderError(
                f"the dynamic provider host in {context.project_dir} did not answer on port "
                f"{port}: {e}; fix: see its output: {' | '.join(list(self.stderr)[-5:])}"
            ) from None

    def _drain(self, stream: Any) -> None:
        for line in iter(stream.readline, ""):
            self.stderr.append(line.rstrip("\n"))

    def _port(self) -> int:
        assert self.proc.stdout is not None
        result: list[str] = []
        reader = threading.Thread(
            target=lambda: result.append(self.proc.stdout.readline()),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        reader.join(START_TIMEOUT_S)
        line = result[0].strip() if result else ""
        if not line.isdigit():
            self.close()
            said = " | ".join(list(self.stderr)[-5:]) or "nothing"
            raise ProviderError(
                f"the dynamic provider host ({HOST.name} in {self.context.project_dir}) did "
                f"not start: it said {said}; fix: the virtualenv Pulumi.yaml names must have "
                "the pulumi package"
            )
        return int(line)

    def close(self) -> None:
        """Stop the host: its whole process group (the script's shell AND the python it
        started; cmdutil.RegisterProcessGroup / KillChildren in the CLI)."""
        _stop_group(self.proc)
        _LIVE.discard(self.proc)
        if hasattr(self, "channel"):
            self.channel.close()


def _stop_group(proc: subprocess.Popen[str]) -> None:
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            # The group may outlive its leader by a moment: make sure it is gone.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue


# Hosts still running when this process exits (a run that raised past its cleanup).
_LIVE: set[subprocess.Popen[str]] = set()


@atexit.register
def _stop_all() -> None:
    for proc in list(_LIVE):
        _stop_group(proc)


def _struct(props: dict[str, Any]) -> struct_pb2.Struct:
    """Properties as the engine sends them to a host that does not accept secrets: plain
    values, unknowns as the unknown sentinel."""
    return wire.to_struct(wire.plain(props))


def _props(struct: struct_pb2.Struct) -> dict[str, Any]:
    return wire.from_struct(struct)


def _secret_like(source: dict[str, Any], outs: dict[str, Any]) -> dict[str, Any]:
    """provider_plugin.go annotateSecrets: an output named like a secret input is secret."""
    return {
        k: wire.secret(v) if wire.is_secret(source.get(k)) and not wire.is_secret(v) else v
        for k, v in outs.items()
    }


def explain(error: grpc.RpcError, context: PluginContext) -> str:
    """The host's error in one line (its traceback's last line), with the fix when the
    provider cannot be loaded."""
    details = (error.details() or str(error)).strip()
    last = details.splitlines()[-1] if details else str(error.code())
    if "ModuleNotFoundError" in last or "Can't get attribute" in last or "ImportError" in last:
        return (
            f"the dynamic provider cannot be loaded in the provider host (working directory "
            f"{context.project_dir}): {last}; fix: install the package that defines it into "
            "the virtualenv Pulumi.yaml names (`pip install` it: a sys.path edit in the "
            "program does not reach the host), at an import path the state's provider still has"
        )
    return last


class DynamicProvider:
    def __init__(self, context: PluginContext):
        self.context = context
        self._host: ProviderHost | None = None
        self._lock = threading.Lock()

    def host(self) -> ProviderHost:
        with self._lock:
            if self._host is None:
                self._host = ProviderHost(self.context)
            return self._host

    def close(self) -> None:
        with self._lock:
            if self._host is not None:
                self._host.close()
                self._host = None

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self.host().stub, method)(request)
        except grpc.RpcError as e:
            raise ProviderError(explain(e, self.context)) from None

    def check(self, typ: str, olds: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]:
        if typ != TYPE:
            raise ProviderError(f"the local engine does not model {typ}")
        if wire.has_unknown(news.get(PROVIDER_KEY)):
            return news
        response = self._call(
            "Check", provider_pb2.CheckRequest(olds=_struct(olds), news=_struct(news))
        )
        if response.failures:
            reasons = "; ".join(f"{f.property}: {f.reason}" for f in response.failures)
            raise ProviderError(f"check failed: {reasons}")
        checked = {**_props(response.inputs), PROVIDER_KEY: news[PROVIDER_KEY]}
        return _secret_like(news, checked)

    def diff(
        self, typ: str, id_: str, old_inputs: dict[str, Any], old_outputs: dict[str, Any],
        news: dict[str, Any],
    ) -> DiffResult:  # fmt: skip
        response = self._call(
            "Diff",
            provider_pb2.DiffRequest(
                id=id_, olds=_struct(old_outputs), news=_struct(news),
                old_inputs=_struct(old_inputs),
            ),
        )  # fmt: skip
        replaces = list(response.replaces)
        dbr = bool(response.deleteBeforeReplace)
        if response.changes == _DIFF.DIFF_UNKNOWN:
            # The engine compares the inputs itself (no change: same).
            changes = wire.changed_keys(old_inputs, news)
            return DiffResult(changes, replaces if changes else [], dbr)
        if response.changes == _DIFF.DIFF_NONE:
            return DiffResult()
        changes = wire.changed_keys(old_inputs, news) or replaces or ["(provider)"]
        return DiffResult(sorted(set(changes) | set(replaces)), replaces, dbr)

    def create(
        self, typ: str, name: str, inputs: dict[str, Any], preview: bool
    ) -> tuple[str, dict[str, Any]]:
        if preview:
            return "", dict(inputs)
        try:
            request = provider_pb2.CreateRequest(
                properties=_struct(inputs), timeout=STEP_TIMEOUT.get()
            )
            response = self._call("Create", request)
        except ProviderError as e:  # the provider's own error, reported with the resource
            raise ProviderError(f"{name}: {e}") from None
        outs = _secret_like(inputs, _props(response.properties))
        return response.id, {**outs, PROVIDER_KEY: inputs[PROVIDER_KEY]}

    def read(
        self, typ: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any]
    ) -> ReadResult:
        try:
            response = self._call(
                "Read",
                provider_pb2.ReadRequest(
                    id=id_, properties=_struct(outputs), inputs=_struct(inputs)
                ),
            )
        except ProviderError as e:
            raise ProviderError(f"{id_}: read failed: {e}") from None
        if not response.id:
            return ReadResult(None, inputs, outputs)
        outs = {
            **_secret_like(outputs, _props(response.properties)),
            PROVIDER_KEY: outputs[PROVIDER_KEY],
        }
        new_inputs = inputs
        if response.HasField("inputs"):
            new_inputs = {
                **_secret_like(inputs, _props(response.inputs)),
                PROVIDER_KEY: outputs[PROVIDER_KEY],
            }
        return ReadResult(response.id, new_inputs, outs)

    def update(
        self, typ: str, name: str, id_: str, old_outputs: dict[str, Any], news: dict[str, Any],
        preview: bool,
    ) -> dict[str, Any]:  # fmt: skip
        if preview:
            return dict(news)
        try:
            response = self._call(
                "Update",
                provider_pb2.UpdateRequest(
                    id=id_,
                    olds=_struct(old_outputs),
                    news=_struct(news),
                    timeout=STEP_TIMEOUT.get(),
                ),
            )
        except ProviderError as e:
            raise ProviderError(f"{name}: {e}") from None
        outs = _secret_like(news, _props(response.properties))
        return {**outs, PROVIDER_KEY: news[PROVIDER_KEY]}

    def delete(self, typ: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        try:
            request = provider_pb2.DeleteRequest(
                id=id_, properties=_struct(outputs), timeout=STEP_TIMEOUT.get()
            )
            self._call("Delete", request)
        except ProviderError as e:
            raise ProviderError(f"{id_}: delete failed: {e}") from None
