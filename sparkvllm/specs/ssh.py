"""SSH access: the docker provider's ssh:// host and options, known_hosts lines.

pulumi-docker shells out to the workstation's `ssh` binary (`docker system dial-stdio` on
the node), so it needs an identity FILE and a known_hosts FILE; pulumi-command uses Go's SSH
library with the key and host key as values. Both verify the same configured host key.
"""

from __future__ import annotations

from sparkvllm.config import NodeConfig


def known_hosts_line(host: str, port: int, host_key: str) -> str:
    """One known_hosts line; non-22 ports use the `[host]:port` form."""
    target = host if port == 22 else f"[{host}]:{port}"
    return f"{target} {host_key}"


def known_hosts(nodes: list[NodeConfig], host_keys: dict[str, str]) -> str:
    """known_hosts for the workstation: every node by its ssh address."""
    lines = [
        known_hosts_line(n.ssh.host, n.ssh.port, host_keys[n.name])
        for n in nodes
        if n.name in host_keys
    ]
    return "".join(f"{line}\n" for line in lines)


def docker_host(node: NodeConfig) -> str:
    return f"ssh://{node.ssh.user}@{node.ssh.host}:{node.ssh.port}"


def docker_ssh_opts(
    node: NodeConfig, identity_ref: str, known_hosts_ref: str, control_dir_ref: str
) -> list[str]:
    """Options for the docker provider's ssh (each `-o` its own argv word). The paths are
    given as the caller names them (`~/...`: ssh expands `~` itself), so the provider's
    config is the same on every workstation.

    ControlMaster/ControlPersist reuse one connection: the provider opens a new ssh for
    every API call, and bursts of connections get refused (kreuzwerker issue 262). The
    control socket lives in the stack's own 0700 directory, not the shared /tmp.
    """
    opts = [
        "-o", f"IdentityFile={identity_ref}",
        "-o", "IdentitiesOnly=yes",
        "-o", "BatchMode=yes",
        "-o", "ConnectTimeout=15",
        "-o", "ServerAliveInterval=15",
        "-o", "ControlMaster=auto",
        "-o", f"ControlPath={control_dir_ref}/cm-%C",
        "-o", "ControlPersist=120",
    ]  # fmt: skip
    if node.ssh.verify_host_key:
        opts += ["-o", f"UserKnownHostsFile={known_hosts_ref}", "-o", "StrictHostKeyChecking=yes"]
    else:
        opts += ["-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no"]
    return opts
