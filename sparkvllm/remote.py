"""The one side-effect seam for talking to nodes from the workstation: the local `ssh`
binary with explicit options (identity file, known_hosts, strict host key checking).

Used by the local engine's providers (localengine/), the program's node checks
(components/node_step.py), the drift check (sparkvllm/drift.py) and the sim helpers;
tests replace `run_ssh` with a recording fake.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkvllm.specs.ssh import SshOptions, SshTarget, known_hosts_line, proxy_command

# Waits for end of input (the pipe closes when the process holding its write end ends),
# then removes the directory it was given.
_WATCH = 'cat >/dev/null; rm -rf -- "$1"'


@dataclass
class ConnectionFiles:
    """ssh targets for pulumi-command-style connections ({host, port, user, privateKey,
    hostKey, perDialTimeout}), which carry the key and host key as values: each is written
    to a 0600 file in a private temp directory, because `ssh` wants files. The host key is
    verified exactly when `hostKey` is set (as pulumi-command's Go client does).

    The directory is removed by `close()` (or leaving a `with` block): a key copy must not
    outlive the calls that need it. Nor the process: a killed one (SIGKILL runs no cleanup)
    is followed by its watch, a `sh` that holds the read end of a pipe only this process
    can write to; when this process ends, however it ends, the pipe closes and the watch
    removes the directory (`_WATCH`)."""

    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sparkvllm-ssh-")))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _watch: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        # The write end stays here alone (pipes are not inherited: PEP 446); a session of
        # its own, so a terminal's ^C does not end the watch before this process cleans up.
        self._watch = subprocess.Popen(
            ["/bin/sh", "-c", _WATCH, "sparkvllm-ssh-watch", str(self.directory)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        watch, self._watch = self._watch, None
        if watch is not None and watch.stdin is not None:
            watch.stdin.close()
            try:
                watch.wait(timeout=5)
            except subprocess.TimeoutExpired:
                watch.kill()

    def __enter__(self) -> ConnectionFiles:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def target(self, conn: dict[str, Any], key_file: str | None = None) -> SshTarget:
        """`key_file`: a key file to use instead of `privateKey` (for the proxy too). A
        `proxy` is dialed first and the host reached from it, each with its own user, key
        and host-key check (pulumi-command `remote/connection.go: Dial`)."""
        identity = key_file
        host, user = str(conn["host"]), str(conn.get("user") or "root")
        port = int(conn.get("port") or 22)
        key_text = str(conn.get("privateKey") or "")
        if identity is None and key_text:
            key = self.directory / f"key-{hashlib.sha256(key_text.encode()).hexdigest()[:16]}"
            self._write(key, key_text if key_text.endswith("\n") else key_text + "\n")
            identity = str(key)
        known = None
        if conn.get("hostKey"):
            line = f"{known_hosts_line(host, port, str(conn['hostKey']))}\n"
            kh = self.directory / f"known_hosts-{hashlib.sha256(line.encode()).hexdigest()[:16]}"
            self._write(kh, line)
            known = str(kh)
        timeout = int(conn.get("perDialTimeout") or 15)
        proxy = None
        if conn.get("proxy"):
            proxy = proxy_command(self.target(dict(conn["proxy"]), key_file))
        options = SshOptions(
            identity=identity, known_hosts=known, connect_timeout_s=timeout, proxy_command=proxy
        )
        return SshTarget(user, host, port, options)

    def _write(self, path: Path, text: str) -> None:
        with self._lock:
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(text)


def run_ssh(
    target: SshTarget,
    command: str,
    *,
    stdin: str | None = None,
    timeout: float | None = 600,
    own_session: bool = False,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `command` in the node's login shell over ssh; never raises on exit status.
    `own_session`: the ssh in a session of its own (a terminal's ^C does not reach it).

    `env`: variables for the command, sent as SSH env requests: the values go into the
    ssh process's environment (this process's environment plus these, nothing else), the
    argv carries `-o SendEnv=NAME` (names, never values: an argv is readable by every user
    of the workstation, `ps`). The node's sshd sets only the names its AcceptEnv lists
    (sshd_config(5)), and OpenSSH's client does not report a refused one: it sends each
    request without asking for a reply (clientloop.c client_session2_setup)."""
    sent = dict(env or {})
    return subprocess.run(
        target.argv(command, send_env=sorted(sent)),
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        start_new_session=own_session,
        env={**os.environ, **sent} if sent else None,
    )
