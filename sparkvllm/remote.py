"""The one side-effect seam for talking to nodes from the workstation: the local `ssh`
binary with explicit options (identity file, known_hosts, strict host key checking).

Used by the local engine's providers (localengine/), the program's node checks
(components/node_step.py), the drift check (sparkvllm/drift.py) and the sim helpers;
tests replace `run_ssh` with a recording fake.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkvllm.config import NodeConfig


@dataclass(frozen=True)
class SshTarget:
    """How to reach a node: user, host, port and the `ssh` options."""

    user: str
    host: str
    port: int
    options: tuple[str, ...]

    def argv(self, remote_command: str) -> list[str]:
        return [
            "ssh",
            *self.options,
            "-p",
            str(self.port),
            f"{self.user}@{self.host}",
            remote_command,
        ]


def node_target(node: NodeConfig, identity_file: str, known_hosts_file: str) -> SshTarget:
    """ssh to `node` the way the docker provider does (same key and host-key policy)."""
    opts = ["-i", identity_file, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15",
            "-o", "ServerAliveCountMax=4"]  # fmt: skip
    if node.ssh.verify_host_key:
        opts += ["-o", f"UserKnownHostsFile={known_hosts_file}", "-o", "StrictHostKeyChecking=yes"]
    else:
        opts += ["-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no"]
    return SshTarget(node.ssh.user, node.ssh.host, node.ssh.port, tuple(opts))


@dataclass
class ConnectionFiles:
    """ssh targets for pulumi-command-style connections ({host, port, user, privateKey,
    hostKey, perDialTimeout}), which carry the key and host key as values: each is written
    to a 0600 file in a private temp directory, because `ssh` wants files. The host key is
    verified exactly when `hostKey` is set (as pulumi-command's Go client does)."""

    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sparkvllm-ssh-")))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def target(self, conn: dict[str, Any]) -> SshTarget:
        host, user = str(conn["host"]), str(conn.get("user") or "root")
        port = int(conn.get("port") or 22)
        key_text = str(conn.get("privateKey") or "")
        opts = ["-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", f"ConnectTimeout={int(conn.get('perDialTimeout') or 15)}",
                "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"]  # fmt: skip
        if key_text:
            key = self.directory / f"key-{hashlib.sha256(key_text.encode()).hexdigest()[:16]}"
            self._write(key, key_text if key_text.endswith("\n") else key_text + "\n")
            opts = ["-i", str(key), *opts]
        if conn.get("hostKey"):
            line_host = host if port == 22 else f"[{host}]:{port}"
            line = f"{line_host} {conn['hostKey']}\n"
            kh = self.directory / f"known_hosts-{hashlib.sha256(line.encode()).hexdigest()[:16]}"
            self._write(kh, line)
            opts += ["-o", f"UserKnownHostsFile={kh}", "-o", "StrictHostKeyChecking=yes"]
        else:
            opts += ["-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no"]
        return SshTarget(user, host, port, tuple(opts))

    def _write(self, path: Path, text: str) -> None:
        with self._lock:
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(text)


def run_ssh(
    target: SshTarget, command: str, *, stdin: str | None = None, timeout: float | None = 600
) -> subprocess.CompletedProcess[str]:
    """Run `command` in the node's login shell over ssh; never raises on exit status."""
    return subprocess.run(
        target.argv(command),
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
