"""Names, addresses and paths of the simulated cluster (pure data, no I/O)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SIM_SOURCE_DIR = Path(__file__).resolve().parent

PREFIX = "sparkvllm-sim"
LABEL = "io.sparkvllm.sim"  # every object `up` creates carries this label (value: "1")
NETWORK_NAME = PREFIX
SIM_STACK = "sim"  # the stack (Pulumi.sim.yaml) deployed onto the simulated nodes
DEFAULT_SUBNET = "172.28.0.0/24"
FIRST_HOST_OFFSET = 10  # node i (from 1) lives at subnet base + 10 + i
SSH_USER = "root"
SSH_PORT = 22
NODE_INTERFACE = "eth0"

MODEL_ID = "sparkvllm/tiny-qwen3"
# SIMULATION: a second repo in every node's HF cache holding a copy of the tiny model's
# files, for the second model of a set (sim/stack.py set_of_two): its own folder, so a
# fault on its weights is its alone, and the same weights, so its answers (TP=1) can be
# compared with the first model's (TP=2).
SECOND_MODEL_ID = "sparkvllm/tiny-qwen3-two"
VLLM_IMAGE_REF = "sparkvllm/vllm-sim:latest-sim"
# SIMULATION: the router of a set of models (LiteLLM's proxy from PyPI), on the head only.
ROUTER_IMAGE_REF = "sparkvllm/router-sim:latest-sim"
NODE_IMAGES_DIR = "/var/lib/sparkvllm/images"  # read-only bind mount, head node only
NODE_HF_HUB_DIR = "/root/.cache/huggingface/hub"
NODE_SIM_CONFIG_DIR = "/etc/sparkvllm-sim"  # per-node keys, read by the node entrypoint
HUB_CONTAINER = f"{PREFIX}-hub"  # the hub stand-in (sim/hub.py), when a test starts it
HUB_HOST_OFFSET = 9  # at subnet base + 9, below the nodes
HUB_PORT = 8080
JUMP_CONTAINER = f"{PREFIX}-jump"  # a jump host (bastion), when a test starts it
JUMP_HOST_OFFSET = 8  # at subnet base + 8


@dataclass(frozen=True)
class StatePaths:
    """Where `up` keeps its state: `.sim/` at the repo root (gitignored).

    Example:
        StatePaths.at(Path("/work/main")).client_key  # /work/main/.sim/id_ed25519
    """

    root: Path

    @classmethod
    def at(cls, repo_root: Path = REPO_ROOT) -> StatePaths:
        return cls(repo_root / ".sim")

    @property
    def client_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def client_public_key(self) -> Path:
        return self.root / "id_ed25519.pub"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def nodes_json(self) -> Path:
        return self.root / "nodes.json"

    @property
    def model_json(self) -> Path:
        return self.root / "model.json"

    @property
    def images_dir(self) -> Path:
        return self.root / "images"

    @property
    def vllm_tarball(self) -> Path:
        return self.images_dir / "vllm-sim.tar"

    @property
    def router_tarball(self) -> Path:
        return self.images_dir / "router-sim.tar"

    @property
    def vllm_ref_file(self) -> Path:
        return self.images_dir / "vllm-sim.ref"

    @property
    def jump_dir(self) -> Path:
        """The jump host's sshd config: its host key and authorized_keys."""
        return self.root / "jump"

    @property
    def hub_dir(self) -> Path:
        """The hub stand-in's token file."""
        return self.root / "hub"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def dockerd_log(self) -> Path:
        return self.logs_dir / "dockerd.log"

    def host_key_dir(self, node: str) -> Path:
        return self.root / "host_keys" / node

    def host_key_pub(self, node: str) -> Path:
        return self.root / f"{node}.host_key.pub"

    def node_config_dir(self, node: str) -> Path:
        return self.root / "nodes" / node


@dataclass(frozen=True)
class NodeSpec:
    """One simulated Spark node."""

    index: int
    name: str
    container: str
    volume: str
    address: str

    @property
    def is_head(self) -> bool:
        return self.index == 1


def node_specs(count: int, subnet: str = DEFAULT_SUBNET) -> list[NodeSpec]:
    """The nodes of an N-node simulation.

    Example:
        node_specs(2)[1].address  # "172.28.0.12"
    """
    if count < 1:
        raise ValueError(f"--nodes must be at least 1, got {count}")
    network = ipaddress.ip_network(subnet)
    last = FIRST_HOST_OFFSET + count
    if last >= network.num_addresses - 1:
        raise ValueError(
            f"subnet {subnet} is too small for {count} nodes (node {count} would be at "
            f"offset {last}); pass a larger --subnet"
        )
    return [
        NodeSpec(
            index=i,
            name=f"spark-{i}",
            container=f"{PREFIX}-spark-{i}",
            volume=f"{PREFIX}-spark-{i}-docker",
            address=str(network.network_address + FIRST_HOST_OFFSET + i),
        )
        for i in range(1, count + 1)
    ]


def gateway_address(subnet: str) -> str:
    """The bridge's own address on the simulation network (first host address)."""
    return str(ipaddress.ip_network(subnet).network_address + 1)
