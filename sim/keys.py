"""SSH keys of the simulation: one client key, one stable host key per node."""

from __future__ import annotations

from pathlib import Path

from sim.runner import Runner
from sim.settings import NodeSpec, StatePaths

HOST_KEY_FILE = "ssh_host_ed25519_key"


def ensure_keypair(runner: Runner, private_key: Path, comment: str) -> None:
    """Generate an ed25519 key pair at private_key once; an existing one is kept."""
    if private_key.exists() and private_key.with_suffix(".pub").exists():
        return
    private_key.parent.mkdir(parents=True, exist_ok=True)
    private_key.unlink(missing_ok=True)
    argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"]
    runner.run([*argv, str(private_key)])


def public_key_line(pub_file: Path) -> str:
    """`ssh-ed25519 AAAA...` (type and key, comment dropped)."""
    fields = pub_file.read_text().split()
    if len(fields) < 2:
        raise ValueError(f"{pub_file} is not an OpenSSH public key; delete it and rerun up")
    return f"{fields[0]} {fields[1]}"


def known_hosts_text(nodes: list[NodeSpec], host_keys: dict[str, str]) -> str:
    """known_hosts lines for the nodes, by address.

    Example:
        known_hosts_text(node_specs(1), {"spark-1": "ssh-ed25519 AAAA"})
        # "172.28.0.11 ssh-ed25519 AAAA\\n"
    """
    return "".join(f"{node.address} {host_keys[node.name]}\n" for node in nodes)


def ensure_node_keys(runner: Runner, paths: StatePaths, nodes: list[NodeSpec]) -> dict[str, str]:
    """Client key and host keys (made once, stable across down/up); per-node config files.

    Returns the host public key line of each node by name.
    """
    ensure_keypair(runner, paths.client_key, "sparkvllm-sim-client")
    client_pub = public_key_line(paths.client_public_key)
    host_keys: dict[str, str] = {}
    for node in nodes:
        conf = paths.node_config_dir(node.name)
        ensure_keypair(runner, conf / HOST_KEY_FILE, f"root@{node.name}")
        host_keys[node.name] = public_key_line(conf / f"{HOST_KEY_FILE}.pub")
        paths.host_key_pub(node.name).write_text(host_keys[node.name] + "\n")
        (conf / "authorized_keys").write_text(client_pub + "\n")
    known_hosts = known_hosts_text(nodes, host_keys)
    for node in nodes:
        (paths.node_config_dir(node.name) / "ssh_known_hosts").write_text(known_hosts)
    paths.known_hosts.write_text(known_hosts)
    return host_keys
