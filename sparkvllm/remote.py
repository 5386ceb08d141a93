"""The one side-effect seam for talking to nodes from the workstation: the local `ssh`
binary with explicit options (identity file, known_hosts, strict host key checking).

Used by the local executor (sim/executor.py), the drift check (sparkvllm/drift.py) and
the sim helpers; tests replace `run_ssh` with a recording fake.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

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
