"""A bash sandbox for rendered node commands: PATH holds logging stubs, nothing real runs.

Every program a node command could start that would touch docker, the network or the
node (docker, ssh, vllm, ray, python3, sudo, curl, tar, ip, ping, nvidia-smi ...) is a
stub that appends its argv to a log and exits 0, or 1 (see `Sandbox.run`'s modes), so a
script's error branches run too. `ssh` is a stub that parses its options as OpenSSH's
getopt does, logs them, and runs the remote command the way sshd does: its words joined by
spaces, under bash, in this same sandbox. A few harmless text tools (cat, mktemp,
sha256sum, awk ...) are the real ones, so scripts run as far as they would on a node.
Everything runs in a network namespace of its own: nothing can reach any address.

The canary: `pwned` is a stub too, and every hostile value in the tests runs it if it is
ever executed as a command; `Sandbox.calls("pwned")` must stay empty.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

# Programs that would act on the node, the network or docker: stubbed.
STUBBED = (
    "docker", "vllm", "ray", "python3", "python", "sudo", "curl", "wget", "tar", "ip",
    "ping", "nvidia-smi", "rsync", "scp", "nc", "socat", "sync", "sleep", "pwned", "touch",
    "sh", "dd", "chmod", "chown", "kill", "pkill", "systemctl", "mv",
)  # fmt: skip
# Harmless tools the scripts use to compute and format: the real binaries.
REAL = (
    "bash", "cat", "mktemp", "rm", "sha256sum", "cut", "awk", "sort", "find", "grep",
    "tr", "wc", "head", "tail", "sed", "paste", "ls", "df", "id", "env", "timeout", "uname",
    "hostname", "mkdir", "basename", "dirname", "tee", "true", "false", "printf", "test",
    "seq", "xargs", "stat", "nproc", "sha1sum",
)  # fmt: skip

FIELD, RECORD = "\x1f", "\x1e"
UNSHARE = shutil.which("unshare") or "unshare"


def available() -> str | None:
    """Why the sandbox cannot run here (it needs a network namespace), or None."""
    try:
        subprocess.run([UNSHARE, "--net", "--", "true"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return "the stub sandbox needs `unshare --net` (root): no network namespace here"
    return None


_STUB = f"""#!/bin/bash
{{ printf '%s{FIELD}' "${{0##*/}}" "$@"; printf '{RECORD}'; }} >> "$SANDBOX_LOG"
case "${{SANDBOX_MODE:-ok}}" in
  fail) exit 1;;
  absent) case " $* " in *" inspect "*) exit 1;; esac;;
esac
exit 0
"""

# OpenSSH's option letters (ssh.c getopt string): those followed by ':' take a value.
_SSH_OPTSTRING = "1246ab:c:e:fgi:kl:m:no:p:qstvxAB:CD:E:F:GI:J:KL:MNO:P:Q:R:S:TVw:W:XYy"
_SSH = f"""#!/bin/bash
# Parse like ssh: options (getopts stops at '--' or the first non-option), the host, and
# then options again (ssh.c re-parses what follows the host).
opts=()
parse() {{
  OPTIND=1
  while getopts '{_SSH_OPTSTRING}' o; do opts+=("-$o${{OPTARG:-}}"); unset OPTARG; done
}}
parse "$@"; shift $((OPTIND - 1))
host=$1; shift
parse "$@"; shift $((OPTIND - 1))
{{ printf '%s{FIELD}' ssh "${{opts[@]}}" "--" "$host" "$*"; printf '{RECORD}'; }} >> "$SANDBOX_LOG"
[ $# -eq 0 ] && exit 0
# sshd hands the remote words, joined by spaces, to the login shell.
exec bash -c "$*"
"""


@dataclass
class Sandbox:
    root: Path
    bin: Path = field(init=False)
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.bin = self.root / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.log = self.root / "calls.log"
        for name in STUBBED:
            _write_exe(self.bin / name, _STUB)
        _write_exe(self.bin / "ssh", _SSH)
        for name in REAL:
            real = shutil.which(name)
            if real and not (self.bin / name).exists():
                (self.bin / name).symlink_to(real)
        (self.root / "home").mkdir(exist_ok=True)
        (self.root / "work").mkdir(exist_ok=True)

    def run(
        self,
        argv: list[str],
        *,
        stdin: str = "",
        mode: str = "ok",
        timeout: float = 30,
        home: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` (e.g. ["bash", "-c", script]) with only the sandbox on PATH. `mode`:
        stubs succeed (`ok`), fail (`fail`), or fail only `... inspect ...` (`absent`: no
        such image or container), so a script's error branches run too. `home`: $HOME for
        this run (a fresh one is a fresh container's). `env`: more variables (a
        container's)."""
        extra = env or {}
        env = {
            "PATH": str(self.bin),
            "HOME": str(home or self.root / "home"),
            "TMPDIR": str(self.root / "work"),
            "SANDBOX_LOG": str(self.log),
            "SANDBOX_MODE": mode,
            "WAIT_S": "1",
            "LC_ALL": "C",
            **extra,
        }
        # In a network namespace of its own (loopback only, down): a script that opens a
        # socket itself (bash's /dev/tcp) reaches nothing, not even the example addresses.
        # A session of its own: on a timeout the whole group goes (a script's background
        # children would otherwise hold its output open, and the test, forever).
        proc = subprocess.Popen(
            [UNSHARE, "--net", "--", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=self.root / "work",
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # what it left running in the background
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def all_calls(self) -> list[list[str]]:
        """Every stub call so far: [program, arg1, arg2, ...]."""
        if not self.log.exists():
            return []
        records = self.log.read_text(errors="replace").split(RECORD)
        return [r.split(FIELD)[:-1] for r in records if r]

    def calls(self, program: str) -> list[list[str]]:
        return [c for c in self.all_calls() if c and c[0] == program]


def _write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)
