"""Local executor: apply the Pulumi program WITHOUT the Pulumi engine, for real.

Every resource the program registers reaches a Pulumi mock monitor; instead of faking it,
`LocalExecutor.new_resource` executes it on its node over ssh and returns what the node
said (stdout, image IDs, container IDs). The Python SDK registers a resource only after
everything it depends on has finished registering, so execution follows the program's own
dependency graph. `destroy()` undoes what was applied, in reverse order.

So the simulated-cluster tests run exactly the commands and container inputs the
components register: no second description of the deployment exists.

What it is not: an engine. No state, no diff, no refresh, no preview. Re-applying re-runs
the one-shot commands (they are idempotent by design) and keeps a container that runs the
same spec (its `ai.sparkvllm.spec` label) on the same image, replacing any other. Use
`pulumi up` where the CLI exists. The executor refuses any resource input it does not know
how to honour rather than ignore it. Like the engine's default, the first failure halts the
apply: no further step starts (a refused step repeats that failure), and `halt()` waits for
the steps in flight, so a failed apply leaves nothing running behind its caller.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime.mocks import MockMonitor

from sparkvllm.remote import SshTarget, run_ssh
from sparkvllm.specs.containers import LABEL_PREFIX

# How a secret value looks in a mock monitor's inputs (Pulumi's wire signature).
SECRET_SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"


def unwrap_secrets(value: Any) -> Any:
    """`value` with every secret wrapper replaced by its plain value."""
    if isinstance(value, dict):
        if value.get(SECRET_SIG_KEY) == SECRET_SIG:
            return unwrap_secrets(value.get("value"))
        return {k: unwrap_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap_secrets(v) for v in value]
    return value


class ExecutionError(Exception):
    """A registered resource failed on its node."""


@dataclass
class Applied:
    typ: str
    name: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    target: SshTarget | None


Log = Callable[[str], None]


@dataclass
class LocalExecutor(pulumi.runtime.Mocks):
    """Executes registered resources on the nodes. See the module docstring."""

    log: Log = print
    runner: Callable[..., subprocess.CompletedProcess[str]] = run_ssh
    applied: list[Applied] = field(default_factory=list)
    _providers: dict[str, SshTarget] = field(default_factory=dict)
    _keydir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sparkvllm-exec-")))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _idle: threading.Condition = field(default_factory=threading.Condition)
    _inflight: int = 0
    _halted: bool = False
    _failure: str = ""

    # --- pulumi.runtime.Mocks -----------------------------------------------------------

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        inputs = unwrap_secrets(dict(args.inputs))
        handler = {
            "pulumi:providers:docker": self._provider,
            "command:remote:Command": self._command,
            "docker:index/remoteImage:RemoteImage": self._remote_image,
            "docker:index/container:Container": self._container,
        }.get(args.typ)
        if handler is None:
            if args.custom:
                raise ExecutionError(f"{args.name}: the executor cannot apply {args.typ}")
            return f"{args.name}-component", {}
        with self._idle:
            if self._halted:
                # Like the engine's default: after a failure no new step starts. The first
                # failure is repeated so whichever error surfaces names the cause.
                raise ExecutionError(
                    f"{args.name}: not applied, an earlier step failed: {self._failure}"
                )
            self._inflight += 1
        started = time.monotonic()
        try:
            resource_id, outputs, target = handler(args.name, inputs, args.provider)
        except BaseException as e:
            with self._idle:
                self._failure = self._failure or str(e)
            self.halt(wait=False)
            raise
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()
        self.log(
            f"applied {args.typ.split(':')[-1]} {args.name} ({time.monotonic() - started:.1f}s)"
        )
        with self._lock:
            self.applied.append(Applied(args.typ, args.name, inputs, outputs, target))
        return resource_id, outputs

    def halt(self, wait: bool = True, timeout: float = 3600) -> None:
        """Start no further step; with `wait`, return once the steps in flight finished
        (so a failed apply leaves nothing running behind the caller's back)."""
        with self._idle:
            self._halted = True
            self._failure = self._failure or "the program stopped"
            if wait:
                self._idle.wait_for(lambda: self._inflight == 0, timeout=timeout)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[Any]]:
        raise ExecutionError(f"the executor cannot run invoke {args.token}")

    # --- resources ----------------------------------------------------------------------

    def _provider(
        self, name: str, inputs: dict[str, Any], _provider: str | None
    ) -> tuple[str, dict[str, Any], SshTarget | None]:
        host = str(inputs["host"])
        if not host.startswith("ssh://"):
            raise ExecutionError(f"{name}: only ssh:// docker hosts are supported, got {host}")
        userhost, _, port = host.removeprefix("ssh://").rpartition(":")
        user, _, hostname = userhost.rpartition("@")
        opts = inputs.get("sshOpts") or []
        if isinstance(opts, str):  # provider config crosses the wire as a JSON string
            opts = json.loads(opts)
        target = SshTarget(user, hostname, int(port), tuple(opts))
        pid = f"{name}-provider"
        self._providers[pid] = target
        return pid, inputs, target

    def _docker_target(self, name: str, provider_ref: str | None) -> SshTarget:
        pid = (provider_ref or "").rsplit("::", 1)[-1]
        if pid not in self._providers:
            raise ExecutionError(f"{name}: no docker provider registered ({provider_ref})")
        return self._providers[pid]

    def _command_target(self, conn: Mapping[str, Any]) -> SshTarget:
        """pulumi-command's connection, as `ssh` options (key and host key as files)."""
        host, port, user = str(conn["host"]), int(conn.get("port") or 22), str(conn["user"])
        key = self._keydir / f"key-{abs(hash(conn['privateKey']))}"
        with self._lock:
            if not key.exists():
                fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(conn["privateKey"])
        # Like pulumi-command's per_dial_timeout: a node that does not answer (down, frozen)
        # fails within seconds instead of hanging the apply.
        opts = ["-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15",
                "-o", "ServerAliveCountMax=4"]  # fmt: skip
        if conn.get("hostKey"):
            kh = self._keydir / f"known_hosts-{host}-{port}"
            target = host if port == 22 else f"[{host}]:{port}"
            kh.write_text(f"{target} {conn['hostKey']}\n")
            opts += ["-o", f"UserKnownHostsFile={kh}", "-o", "StrictHostKeyChecking=yes"]
        else:
            opts += ["-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no"]
        return SshTarget(user, host, port, tuple(opts))

    def _command(
        self, name: str, inputs: dict[str, Any], _provider: str | None
    ) -> tuple[str, dict[str, Any], SshTarget | None]:
        known = {"connection", "create", "delete", "stdin", "triggers", "addPreviousOutputInEnv"}
        _refuse_unknown(name, inputs, known)
        target = self._command_target(inputs["connection"])
        result = self._run(name, target, str(inputs["create"]), stdin=inputs.get("stdin"))
        outputs = {**inputs, "stdout": result.stdout.rstrip("\n"), "stderr": result.stderr}
        return f"{name}-{time.time_ns()}", outputs, target

    def _remote_image(
        self, name: str, inputs: dict[str, Any], provider: str | None
    ) -> tuple[str, dict[str, Any], SshTarget | None]:
        _refuse_unknown(name, inputs, {"name", "keepLocally", "forceRemove"})
        target = self._docker_target(name, provider)
        ref = shlex.quote(str(inputs["name"]))
        # Like the provider: use the local image; pull only when it is absent.
        inspect = f"docker image inspect --format '{{{{.Id}}}}' {ref}"
        cmd = f"{inspect} 2>/dev/null || {{ docker pull {ref} >&2 && {inspect}; }}"
        image_id = self._run(name, target, cmd).stdout.strip()
        outputs = {**inputs, "imageId": image_id, "repoDigest": ""}
        return f"{image_id}{inputs['name']}", outputs, target

    def _container(
        self, name: str, inputs: dict[str, Any], provider: str | None
    ) -> tuple[str, dict[str, Any], SshTarget | None]:
        """Converge one container: keep it when it runs with the same labels of ours (spec
        digest, Ray cluster) on the same image, else replace it (docker rm -f, docker run)."""
        target = self._docker_target(name, provider)
        argv = docker_run_argv(name, inputs)
        cname = shlex.quote(str(inputs["name"]))
        labels = {lb["label"]: lb["value"] for lb in inputs.get("labels") or []}
        ours = sorted(k for k in labels if k.startswith(LABEL_PREFIX))
        wanted = shlex.quote(" ".join(["true", *(labels[k] for k in ours), str(inputs["image"])]))
        fmt = shlex.quote(
            " ".join(
                [
                    "{{.State.Running}}",
                    *(f'{{{{index .Config.Labels "{k}"}}}}' for k in ours),
                    "{{.Image}}",
                ]
            )
        )
        cmd = (
            f'if [ "$(docker inspect -f {fmt} {cname} 2>/dev/null)" = {wanted} ]; then '
            f"echo kept {cname} >&2; docker inspect -f '{{{{.Id}}}}' {cname}; "
            f"else docker rm -f {cname} >/dev/null 2>&1; {shlex.join(argv)}; fi"
        )
        container_id = self._run(name, target, cmd).stdout.strip()
        return container_id, {**inputs, "id": container_id}, target

    def _run(
        self, name: str, target: SshTarget, command: str, *, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = self.runner(target, command, stdin=stdin, timeout=3 * 3600)
        for line in result.stderr.splitlines()[-20:]:
            self.log(f"  [{name}] {line}")
        if result.returncode != 0:
            tail = "\n".join(result.stderr.strip().splitlines()[-15:])
            raise ExecutionError(
                f"{name} failed on {target.host} (exit {result.returncode}):\n{tail}"
            )
        return result

    # --- undo ---------------------------------------------------------------------------

    def destroy(self) -> list[str]:
        """Undo everything applied, newest first. Returns the errors (keeps going)."""
        errors = []
        for item in reversed(self.applied):
            cmd = _undo_command(item)
            if cmd is None or item.target is None:
                continue
            result = self.runner(item.target, cmd, timeout=600)
            if result.returncode != 0:
                errors.append(f"{item.name}: {result.stderr.strip()[-300:]}")
            else:
                self.log(f"destroyed {item.typ.split(':')[-1]} {item.name}")
        self.applied.clear()
        return errors


def _undo_command(item: Applied) -> str | None:
    if item.typ == "docker:index/container:Container":
        return f"docker rm -f {shlex.quote(str(item.inputs['name']))} >/dev/null"
    if item.typ == "command:remote:Command":
        return item.inputs.get("delete") or None
    if item.typ == "docker:index/remoteImage:RemoteImage" and not item.inputs.get("keepLocally"):
        return f"docker image rm {shlex.quote(str(item.inputs['name']))} >/dev/null"
    return None


def _refuse_unknown(name: str, inputs: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(k for k, v in inputs.items() if k not in known and v not in (None, [], {}))
    if unknown:
        raise ExecutionError(f"{name}: the executor does not support inputs {unknown}")


_CONTAINER_INPUTS = {
    "name", "image", "command", "entrypoints", "envs", "labels", "networkMode", "ipcMode",
    "pidMode", "gpus", "volumes", "devices", "ulimits", "capabilities", "restart",
    "maxRetryCount", "healthcheck", "stopTimeout", "mustRun", "wait", "shmSize",
}  # fmt: skip


def docker_run_argv(name: str, inputs: Mapping[str, Any]) -> list[str]:
    """`docker run -d ...` for a docker.Container's inputs (camelCase wire names)."""
    _refuse_unknown(name, inputs, _CONTAINER_INPUTS)
    if inputs.get("mustRun") is False:
        raise ExecutionError(f"{name}: mustRun=false is not supported")
    argv = ["docker", "run", "-d", "--name", str(inputs["name"])]
    for label in inputs.get("labels") or []:
        argv += ["--label", f"{label['label']}={label['value']}"]
    for env in inputs.get("envs") or []:
        argv += ["-e", str(env)]
    for flag, key in (("--network", "networkMode"), ("--ipc", "ipcMode"), ("--pid", "pidMode")):
        if inputs.get(key):
            argv += [flag, str(inputs[key])]
    if inputs.get("gpus"):
        argv += ["--gpus", str(inputs["gpus"])]
    if inputs.get("shmSize"):
        argv += ["--shm-size", f"{int(inputs['shmSize'])}m"]
    for v in inputs.get("volumes") or []:
        argv += [
            "-v",
            f"{v['hostPath']}:{v['containerPath']}" + (":ro" if v.get("readOnly") else ""),
        ]
    for d in inputs.get("devices") or []:
        argv += ["--device", f"{d['hostPath']}:{d['containerPath']}:{d.get('permissions', 'rwm')}"]
    for u in inputs.get("ulimits") or []:
        argv += ["--ulimit", f"{u['name']}={int(u['soft'])}:{int(u['hard'])}"]
    for cap in (inputs.get("capabilities") or {}).get("adds") or []:
        argv += ["--cap-add", str(cap)]
    restart = str(inputs.get("restart") or "no")
    if restart == "on-failure" and inputs.get("maxRetryCount"):
        restart += f":{int(inputs['maxRetryCount'])}"
    argv += ["--restart", restart]
    if inputs.get("stopTimeout") is not None:
        argv += ["--stop-timeout", str(int(inputs["stopTimeout"]))]
    hc = inputs.get("healthcheck")
    if hc:
        tests = list(hc["tests"])
        if tests[0] == "CMD":
            cmd = shlex.join(tests[1:])
        elif tests[0] == "CMD-SHELL":
            cmd = tests[1]
        else:
            raise ExecutionError(f"{name}: healthcheck test {tests[0]} not supported")
        argv += ["--health-cmd", cmd]
        for flag, key in (
            ("--health-interval", "interval"),
            ("--health-timeout", "timeout"),
            ("--health-start-period", "startPeriod"),
        ):
            if hc.get(key):
                argv += [flag, str(hc[key])]
        if hc.get("retries"):
            argv += ["--health-retries", str(int(hc["retries"]))]
    entry = list(inputs.get("entrypoints") or [])
    if entry:
        argv += ["--entrypoint", entry[0]]
    argv.append(str(inputs["image"]))
    argv += entry[1:] + [str(c) for c in inputs.get("command") or []]
    return argv


def apply_program(
    program: Callable[[], Mapping[str, Any]],
    mocks: pulumi.runtime.Mocks,
    *,
    stack: str,
    monitor: MockMonitor | None = None,
) -> dict[str, Any]:
    """Run `program` (which registers resources and returns outputs) under `mocks` and
    return its outputs fully resolved. Raises what the program or a resource raised."""
    pulumi.runtime.set_mocks(
        mocks, project="spark-vllm", stack=stack, preview=False, monitor=monitor
    )
    resolved: dict[str, Any] = {}

    @pulumi.runtime.test
    def run() -> pulumi.Output[Any]:
        return pulumi.Output.from_input(dict(program())).apply(resolved.update)

    run()
    return resolved
