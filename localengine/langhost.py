"""Run a Pulumi Python program in its own process, as the Pulumi CLI's Python language host
runs it, against this engine's ResourceMonitor and Engine services over gRPC.

The steps, read at pulumi/pulumi v3.259.0 (the newest tag of the project's mirror; the
pinned SDK is 3.272.0):

- `sdk/python/cmd/pulumi-language-python/main.go` Run: the command is the virtualenv's
  python with the exec script and `constructArguments` (`--monitor`, `--engine`,
  `--project`, `--root_directory`, `--stack`, `--pwd`, `--dry_run`, `--parallel`,
  `--organization`, then the entry point: "." for a program folder); the config as JSON in
  `PULUMI_CONFIG`, the secret keys as a JSON list in `PULUMI_CONFIG_SECRET_KEYS`; the
  program's stdout and stderr are the CLI's.
- `sdk/python/toolchain/pip.go` Command / ActivateVirtualEnv: `<virtualenv>/bin/python`
  with `VIRTUAL_ENV` set, its `bin` first on PATH and PYTHONHOME unset; no virtualenv
  option: `python3` (or `PULUMI_PYTHON_CMD`).
- The exec script itself (`localengine/vendor/pulumi-language-python-exec`, verbatim)
  configures the SDK's runtime settings, runs the program with `runpy.run_path(".")` (so
  the program's folder is on sys.path, nothing else of ours) inside `run_in_stack`, and
  reports a failure through Engine.Log before exiting non-zero.

Nothing of the program runs in the engine's process, and the program's process does not
outlive the engine, even a killed one (localengine/children.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from pulumi.runtime.proto import engine_pb2_grpc, resource_pb2_grpc

from localengine import children
from localengine.project import runtime_options

VENDOR = Path(__file__).resolve().parent / "vendor"
EXEC = VENDOR / "pulumi-language-python-exec"
ORGANIZATION = "organization"  # the file backend's organization (filestate backend.go)
# The gRPC options the SDK's own servers use (pulumi/runtime/_grpc_settings.py): messages
# of up to 400 MiB (a program's state and outputs can be large).
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 400 * 1024 * 1024),
    ("grpc.max_send_message_length", 400 * 1024 * 1024),
]


class ProgramError(Exception):
    """The program could not be started, or it failed (the message says why)."""


def virtualenv(project_dir: Path, project: dict[str, Any]) -> Path | None:
    """The `virtualenv` runtime option, resolved against the project's folder."""
    venv = runtime_options(project).get("virtualenv")
    if not venv:
        return None
    path = Path(str(venv))
    return path if path.is_absolute() else (project_dir / path).resolve()


def python_command(project_dir: Path, project: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The interpreter and environment the language host runs the program with."""
    env = dict(os.environ)
    venv = virtualenv(project_dir, project)
    if venv is None:
        return env.get("PULUMI_PYTHON_CMD", "python3"), env
    python = venv / "bin" / "python"
    if not python.exists():
        where = "doesn't appear to be a virtual environment" if venv.is_dir() else "doesn't exist"
        raise ProgramError(
            f"The 'virtualenv' option in Pulumi.yaml is set to {str(venv)!r}, but it {where}; "
            f"fix: python3 -m venv {venv} && {venv}/bin/pip install -r requirements.txt"
        )
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONHOME", None)
    return str(python), env


class Services:
    """The monitor and engine services on one loopback port, for the length of a run."""

    def __init__(self, monitor: Any, engine: Any):
        # Every RegisterResource blocks its server thread for the whole step (a model
        # server's readiness wait: many minutes), so the pool is as wide as the most steps
        # a program can have in flight.
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=256), options=GRPC_OPTIONS)
        resource_pb2_grpc.add_ResourceMonitorServicer_to_server(monitor, self.server)
        engine_pb2_grpc.add_EngineServicer_to_server(engine, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)


def _pump(stream: Any, log: Callable[[str], None]) -> None:
    for line in iter(stream.readline, ""):
        log(line.rstrip("\n"))
    stream.close()


# Linux's MAX_ARG_STRLEN (32 pages): the most one environment string can hold; the language
# host passes the whole config in one (sdk/python/cmd/pulumi-language-python/main.go, v3.259.0:
# PULUMI_CONFIG=<JSON>), so a larger one fails the program's exec with E2BIG.
MAX_ENV_STRING = 32 * 4096


def config_variable(config: dict[str, str]) -> str:
    """PULUMI_CONFIG's value; a config too large for it names its largest key."""
    text = json.dumps(config)
    if len(f"PULUMI_CONFIG={text}".encode()) < MAX_ENV_STRING:
        return text
    key = max(config, key=lambda k: len(json.dumps(config[k])))
    size = len(json.dumps(config[key]).encode())
    raise ProgramError(
        f"{key} holds {size} bytes: the program gets its whole config in one environment "
        f"variable (PULUMI_CONFIG), at most {MAX_ENV_STRING // 1024} KiB on Linux. Fix: "
        "shorten that value (a long text belongs in a file the config names)"
    )


def run_program_process(
    project_dir: Path,
    project: dict[str, Any],
    stack: str,
    services: Services,
    *,
    config: dict[str, str],
    secret_keys: list[str],
    dry_run: bool,
    parallel: int,
    log: Callable[[str], None],
) -> int:
    """Start the program, wait for it, return its exit code (0: it finished)."""
    python, env = python_command(project_dir, project)
    env["PULUMI_CONFIG"] = config_variable(config)
    env["PULUMI_CONFIG_SECRET_KEYS"] = json.dumps(secret_keys)
    argv = [
        python, str(EXEC),
        "--monitor", services.address,
        "--engine", services.address,
        "--project", str(project.get("name")),
        "--root_directory", str(project_dir),
        "--stack", stack,
        "--pwd", str(project_dir),
        "--dry_run", "true" if dry_run else "false",
        "--parallel", str(parallel),
        "--organization", ORGANIZATION,
        ".",
    ]  # fmt: skip
    try:
        # In a session of its own, armed to die with the engine (localengine/children.py).
        proc = children.start(
            argv, cwd=project_dir, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    except OSError as e:
        raise ProgramError(f"cannot start the program with {python}: {e}") from None
    pumps = [
        threading.Thread(target=_pump, args=(s, log), daemon=True)
        for s in (proc.stdout, proc.stderr)
    ]
    for t in pumps:
        t.start()
    try:
        code = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    for t in pumps:
        t.join(timeout=5)
    return code


def default_parallel() -> int:
    """The CLI's default for --parallel (pkg/cmd/pulumi/operations/up.go defaultParallel:
    PULUMI_PARALLEL if set, else GOMAXPROCS (the CPUs) times four)."""
    env = os.environ.get("PULUMI_PARALLEL", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return (os.cpu_count() or 1) * 4
