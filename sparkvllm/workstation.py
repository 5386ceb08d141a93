"""Workstation side: read the key files the config names, and write what `ssh` needs.

The only local I/O of the program (plus reading which Ray the workstation has).
pulumi-docker reaches a node through the workstation's `ssh` binary, which wants an
identity FILE and a known_hosts FILE; both are written on every run (preview included), so
a fresh CI runner can refresh an existing stack. Files are 0600 in a 0700 directory under
~/.cache/spark-vllm/<stack>/ (override with SPARKVLLM_STATE_DIR). The private key never
leaves that file and Pulumi secrets.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sparkvllm.config import PROJECT, ConfigError, Issue, SshConfig, StackConfig
from sparkvllm.host_keys import FIX as HOST_KEY_FIX
from sparkvllm.host_keys import HostKeyError, find_host_key
from sparkvllm.probes import image_versions
from sparkvllm.specs.ssh import known_hosts


@dataclass(frozen=True)
class SshAccess:
    """What the components need to reach the nodes. `private_key` is secret material.

    `identity_ref`, `node_known_hosts_ref(node)` and `control_dir_ref` name the same files
    as resource inputs do: under `~` (which ssh expands itself) when the state directory is
    the default one, so no input depends on who runs the program or where the checkout is."""

    identity_file: str
    known_hosts_file: str
    host_keys: dict[str, str | None]
    private_key: str = field(repr=False)
    identity_ref: str = ""
    control_dir_ref: str = ""

    def node_known_hosts_ref(self, node: str) -> str:
        """The node's own known_hosts file: it outlives the node's place in the config, so
        a later run can still reach the node to delete what the stack made there."""
        return f"{self.control_dir_ref}/known_hosts.{node}"


def workstation_versions() -> dict[str, str]:
    """Python and Ray versions of the interpreter running the program ("" if no ray),
    read the way the nodes' images are read (the same probe, run here)."""
    found = image_versions.versions()
    return {"python": found["python"], "ray": found["ray"]}


DEFAULT_STATE_DIR = "~/.cache/spark-vllm"


def state_dir_ref(stack: str) -> str:
    """The state directory as inputs name it: `~/.cache/spark-vllm/<stack>` by default."""
    return f"{os.environ.get('SPARKVLLM_STATE_DIR') or DEFAULT_STATE_DIR}/{stack}"


def state_dir(stack: str) -> Path:
    return Path(state_dir_ref(stack)).expanduser()


def _read(path: str, base: Path, field_path: str, fix: str) -> str:
    p = Path(path).expanduser()
    p = p if p.is_absolute() else base / p
    try:
        return p.read_text()
    except OSError as e:
        raise ConfigError(
            [
                Issue(
                    path=field_path,
                    value=path,
                    problem=f"cannot read {p}: {e.strerror}",
                    fix=fix,
                )
            ]
        ) from None


def _host_key(ssh: SshConfig, base: Path, field_path: str) -> str | None:
    if not ssh.verify_host_key:
        return None
    if ssh.host_key is not None:
        return ssh.host_key
    text = _read(
        ssh.host_key_file or "",
        base,
        field_path,
        "point host_key_file at the node's public host key (e.g. from ssh-keyscan)",
    )
    try:
        return find_host_key(text)
    except HostKeyError as e:
        raise ConfigError(
            [
                Issue(
                    path=field_path,
                    value=ssh.host_key_file,
                    problem=f"no usable SSH public host key in the file: {e}",
                    fix=f"write the node's host key into it: {HOST_KEY_FIX}",
                )
            ]
        ) from None


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def prepare_ssh_access(cfg: StackConfig, stack: str, project_dir: Path) -> SshAccess:
    """Resolve key files named in the config and write the files `ssh` needs."""
    host_keys = {
        n.name: _host_key(n.ssh, project_dir, f"nodes[{i}].ssh.host_key_file")
        for i, n in enumerate(cfg.nodes)
    }
    d = state_dir(stack)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(d, 0o700)
    if cfg.ssh_private_key is not None:
        private_key = cfg.ssh_private_key.get_secret_value()
    else:
        keyfile = cfg.ssh_private_key_file or ""
        private_key = _read(
            keyfile,
            project_dir,
            "ssh_private_key_file",
            "point it at a readable private key",
        )
    if "PRIVATE KEY" not in private_key:
        raise ConfigError(
            [
                Issue(
                    path="ssh_private_key",
                    value="[secret]",
                    problem="does not look like an SSH private key (no PRIVATE KEY block)",
                    fix="set it from the key file itself, e.g. "
                    "`pulumi config set --secret ssh_private_key < ~/.ssh/id_ed25519`",
                )
            ]
        )
    # The key always goes into the state directory (also when the config names a key
    # file), so the identity every input names is the same file on every workstation.
    identity = d / "id"
    _write_private(identity, private_key if private_key.endswith("\n") else private_key + "\n")
    kh = d / "known_hosts"
    present = {k: v for k, v in host_keys.items() if v is not None}
    _write_private(kh, known_hosts(cfg.nodes, present))
    for n in cfg.nodes:
        if n.name in present:
            _write_private(d / f"known_hosts.{n.name}", known_hosts([n], present))
    ref = state_dir_ref(stack)
    return SshAccess(
        identity_file=str(identity),
        known_hosts_file=str(kh),
        host_keys=host_keys,
        private_key=private_key,
        identity_ref=f"{ref}/id",
        control_dir_ref=ref,
    )


def stack_file_config(stack: str, project_dir: Path) -> dict[str, Any]:
    """The `spark-vllm:` keys of Pulumi.<stack>.yaml, namespace stripped: what the program
    gets from the Pulumi engine, for tools that run without it (sim, drift check)."""
    data = yaml.safe_load((project_dir / f"Pulumi.{stack}.yaml").read_text())["config"]
    prefix = f"{PROJECT}:"
    return {k.removeprefix(prefix): v for k, v in data.items() if k.startswith(prefix)}
