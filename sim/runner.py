"""The one place where the simulation runs programs (so tests can swap it for a fake)."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class CommandError(RuntimeError):
    """A command exited non-zero; the message names the command and its stderr tail."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        super().__init__(f"command failed (exit {returncode}): {shlex.join(argv)}\n{tail}")


@dataclass(frozen=True)
class Result:
    """What a finished command returned."""

    returncode: int
    stdout: str
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class Runner(Protocol):
    """Runs commands. `SubprocessRunner` is the real one; tests pass a recording fake."""

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        input: bytes | None = None,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> Result: ...

    def spawn(self, argv: Sequence[str], *, log_path: Path) -> int: ...


@dataclass
class SubprocessRunner:
    """Runs commands with subprocess.

    Args:
        verbose: echo each command to stderr before running it.

    Example:
        SubprocessRunner().run(["docker", "info"], check=False).ok
    """

    verbose: bool = False
    base_env: dict[str, str] = field(default_factory=dict)

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        input: bytes | None = None,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> Result:
        """Run argv to completion; with log_path, stdout and stderr go to that file."""
        if self.verbose:
            print(f"+ {shlex.join(argv)}", flush=True)
        merged_env = self._env(env)
        if log_path is not None:
            return self._run_logged(argv, input, timeout, merged_env, log_path, check)
        proc = subprocess.run(
            list(argv),
            check=False,
            input=input,
            capture_output=True,
            timeout=timeout,
            env=merged_env,
        )
        result = Result(proc.returncode, _text(proc.stdout), _text(proc.stderr))
        if check and not result.ok:
            raise CommandError(argv, result.returncode, result.stderr or result.stdout)
        return result

    def spawn(self, argv: Sequence[str], *, log_path: Path) -> int:
        """Start argv detached in its own session, output to log_path; return its pid."""
        if self.verbose:
            print(f"+ {shlex.join(argv)} &", flush=True)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self._env(None),
            )
        return proc.pid

    def _env(self, env: dict[str, str] | None) -> dict[str, str] | None:
        if not env and not self.base_env:
            return None
        import os

        return {**os.environ, **self.base_env, **(env or {})}

    def _run_logged(
        self,
        argv: Sequence[str],
        input: bytes | None,
        timeout: float | None,
        env: dict[str, str] | None,
        log_path: Path,
        check: bool,
    ) -> Result:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            log.write(f"\n$ {shlex.join(argv)}\n".encode())
            log.flush()
            proc = subprocess.run(
                list(argv),
                check=False,
                input=input,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                env=env,
            )
        result = Result(proc.returncode, "", "")
        if check and not result.ok:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
            raise CommandError(argv, proc.returncode, f"{tail}\n(full log: {log_path})")
        return result


def _text(data: bytes | None) -> str:
    return (data or b"").decode(errors="replace")


def shell_pipeline(*commands: Sequence[str]) -> list[str]:
    """One argv that runs `a | b | ...` under bash with pipefail, each part quoted with shlex.

    Example:
        shell_pipeline(["tar", "-C", "/x", "-c", "."], ["docker", "import", "-", "img:1"])
    """
    joined = " | ".join(shlex.join(c) for c in commands)
    return ["bash", "-o", "pipefail", "-c", joined]
