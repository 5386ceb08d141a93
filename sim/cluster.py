"""`sim up`, `sim down`, `sim status`: the simulated DGX Spark cluster's lifecycle."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sim import build, keys, model, preflight
from sim.engine import engine_ready, ensure_engine
from sim.progress import Timer
from sim.runner import Runner
from sim.settings import (
    DEFAULT_SUBNET,
    LABEL,
    NETWORK_NAME,
    NODE_IMAGES_DIR,
    NODE_SIM_CONFIG_DIR,
    PREFIX,
    SSH_PORT,
    SSH_USER,
    VLLM_IMAGE_REF,
    NodeSpec,
    StatePaths,
    gateway_address,
    node_specs,
)
from sparkvllm.specs.ssh import SshOptions, SshTarget

DOCKER = "docker"
NODE_LABEL = f"{LABEL}.node"
NODE_SHM_SIZE = "4g"  # the nodes' /dev/shm: vLLM and Ray run with --ipc host inside them
SSH_WAIT_S = 120.0
# Docker-in-Docker without --privileged (which fails here: SYS_RESOURCE is not available).
DIND_FLAGS = (
    "--cap-add=ALL", "--cap-drop=SYS_RESOURCE",
    "--security-opt", "seccomp=unconfined",
    "--security-opt", "apparmor=unconfined",
    "--security-opt", "systempaths=unconfined",
    "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs", "/run",
)  # fmt: skip


class SimError(RuntimeError):
    """A lifecycle step failed; the message names what and how to fix it."""


@dataclass
class Existing:
    """What of a simulation is on the engine now (found by label and name)."""

    containers: dict[str, str]  # container name -> state ("running", "exited", ...)
    volumes: list[str]
    network: bool

    @property
    def empty(self) -> bool:
        return not (self.containers or self.volumes or self.network)


@dataclass
class Undo:
    """Removal steps for what this `up` created, run in reverse if `up` fails."""

    steps: list[tuple[str, Callable[[], None]]] = field(default_factory=list)

    def push(self, label: str, action: Callable[[], None]) -> None:
        self.steps.append((label, action))

    def run(self, say: Callable[[str], None]) -> None:
        for label, action in reversed(self.steps):
            try:
                action()
                say(f"sim: rolled back {label}")
            except Exception as err:  # keep rolling back the rest
                say(f"sim: could not roll back {label}: {err}")
        self.steps.clear()


def node_run_argv(
    node: NodeSpec, node_image: str, paths: StatePaths, images_mount: bool
) -> list[str]:
    """`docker run` for one simulated Spark node (pure).

    Example:
        node_run_argv(node_specs(2)[0], "sparkvllm/sim-node:abc", StatePaths.at(), True)
    """
    argv = [
        DOCKER, "run", "-d",
        "--name", node.container, "--hostname", node.name,
        "--label", f"{LABEL}=1", "--label", f"{NODE_LABEL}={node.name}",
        "--network", NETWORK_NAME, "--ip", node.address,
        "--shm-size", NODE_SHM_SIZE,
        *DIND_FLAGS,
        "-v", f"{node.volume}:/var/lib/docker",
        "-v", f"{paths.node_config_dir(node.name)}:{NODE_SIM_CONFIG_DIR}:ro",
    ]  # fmt: skip
    if images_mount:
        argv += ["-v", f"{paths.images_dir}:{NODE_IMAGES_DIR}:ro"]
    return [*argv, node_image]


def ssh_argv(paths: StatePaths, address: str, *command: str) -> list[str]:
    """ssh from the host to a node with the simulation's key and known_hosts."""
    options = SshOptions(
        identity=str(paths.client_key), known_hosts=str(paths.known_hosts),
        connect_timeout_s=5, server_alive_s=None, server_alive_count=None, log_level="ERROR",
    )  # fmt: skip
    return [*SshTarget(SSH_USER, address, SSH_PORT, options).argv(), *command]


def nodes_json(nodes: list[NodeSpec], host_keys: dict[str, str]) -> list[dict[str, object]]:
    return [
        {
            "name": n.name,
            "address": n.address,
            "ssh_port": SSH_PORT,
            "user": SSH_USER,
            "host_key": host_keys[n.name],
        }
        for n in nodes
    ]


def find_existing(runner: Runner) -> Existing:
    label = f"label={LABEL}=1"
    fmt = "{{.Names}} {{.State}}"
    # Containers by the node label only `up` sets (images carry LABEL too, and containers
    # inherit image labels, so that one alone would also match e.g. a `docker run` of the
    # vllm-sim image).
    node_label = f"label={NODE_LABEL}"
    out = runner.run([DOCKER, "ps", "-a", "--filter", node_label, "--format", fmt]).stdout
    containers = {
        name: state
        for name, state in (line.split(maxsplit=1) for line in out.splitlines() if line)
        if name.startswith(f"{PREFIX}-")
    }
    vols = runner.run([DOCKER, "volume", "ls", "-q", "--filter", label]).stdout.split()
    nets = runner.run([DOCKER, "network", "ls", "-q", "--filter", f"name=^{NETWORK_NAME}$"])
    return Existing(
        containers=containers,
        volumes=[v for v in vols if v.startswith(f"{PREFIX}-")],
        network=bool(nets.stdout.strip()),
    )


def is_complete(existing: Existing, nodes: list[NodeSpec]) -> bool:
    wanted = {n.container for n in nodes}
    return (
        existing.network
        and set(existing.containers) == wanted
        and all(state == "running" for state in existing.containers.values())
    )


@dataclass
class Cluster:
    """The simulated cluster on the local engine.

    Args:
        runner: runs every command (tests pass a fake).
        paths: the state folder (.sim/).
        timer: prints progress and keeps step durations.
    """

    runner: Runner
    paths: StatePaths
    timer: Timer

    def say(self, message: str) -> None:
        self.timer.say(message)

    # ---- up -------------------------------------------------------------------
    def up(self, count: int, subnet: str = DEFAULT_SUBNET) -> list[dict[str, object]]:
        """Bring up `count` nodes (idempotent: a running simulation is left as it is)."""
        nodes = node_specs(count, subnet)
        with self.timer.step("docker engine"):
            ensure_engine(self.runner, self.paths, self.say)
        existing = find_existing(self.runner)
        if not existing.empty and not self._state_here(nodes):
            # Nodes made from another checkout (e.g. CI's fresh clone): their keys are not
            # in this .sim/, so this checkout cannot reach them. Recreate from here.
            self.say("sim: the running simulation was made from another checkout; recreating")
            self.down()
            existing = find_existing(self.runner)
        if not existing.empty:
            return self._already_up(existing, nodes)
        for folder in (self.paths.root, self.paths.cache_dir, self.paths.logs_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self._preflight(nodes, subnet)
        host_keys = keys.ensure_node_keys(self.runner, self.paths, nodes)
        images = build.ensure_images(self.runner, self.paths, self.timer)
        with self.timer.step("tiny model"):
            hub_model = model.ensure_model(self.runner, self.paths, images.vllm)
        self._export_vllm_image()
        undo = Undo()
        table = nodes_json(nodes, host_keys)
        try:
            self._create(nodes, subnet, images.node, hub_model, undo)
            self._write_state(table, hub_model)
        except BaseException:
            self.say("sim: up failed; removing what this run created")
            undo.run(self.say)
            self.paths.nodes_json.unlink(missing_ok=True)
            raise
        self.say(f"sim: up: {count} node(s); model {hub_model.model_id}@{hub_model.revision}")
        return table

    def _write_state(self, table: list[dict[str, object]], hub_model: model.HubModel) -> None:
        """nodes.json (the node table) and model.json (what every node has in its cache)."""
        self.paths.nodes_json.write_text(json.dumps(table, indent=2) + "\n")
        self.paths.model_json.write_text(json.dumps(hub_model.describe(), indent=2) + "\n")

    def _state_here(self, nodes: list[NodeSpec]) -> bool:
        """Whether the running nodes were made from this checkout: its .sim/ holds their
        keys, and each node mounts this checkout's config folder (another checkout's .sim/
        may hold keys too, of other nodes)."""
        needed = [self.paths.client_key, self.paths.nodes_json]
        needed += [self.paths.host_key_pub(n.name) for n in nodes]
        if not all(p.exists() for p in needed):
            return False
        fmt = (
            "{{range .Mounts}}{{if eq .Destination "
            f'"{NODE_SIM_CONFIG_DIR}"'
            "}}{{.Source}}{{end}}{{end}}"
        )
        for n in nodes:
            found = self.runner.run([DOCKER, "inspect", "-f", fmt, n.container], check=False)
            source = found.stdout.strip() if found.ok else ""
            if source and Path(source).resolve() != self.paths.node_config_dir(n.name).resolve():
                return False
        return True

    def _already_up(self, existing: Existing, nodes: list[NodeSpec]) -> list[dict[str, object]]:
        wanted = {n.container for n in nodes}
        if (
            existing.network
            and set(existing.containers) == wanted
            and not is_complete(existing, nodes)
        ):
            # Our own nodes, stopped (the engine restarted, e.g. a new CI run on this
            # machine): start them again; their volumes still hold their images.
            with self.timer.step("restart stopped nodes"):
                for node in nodes:
                    if existing.containers[node.container] != "running":
                        self.runner.run([DOCKER, "start", node.container])
                for node in nodes:
                    self._wait_for_node(node)
            existing = find_existing(self.runner)
        if is_complete(existing, nodes):
            self.say(f"sim: already up with {len(nodes)} node(s); nothing to do")
            host_keys = {
                n.name: keys.public_key_line(self.paths.host_key_pub(n.name)) for n in nodes
            }
            return nodes_json(nodes, host_keys)
        parts = [f"{n} ({s})" for n, s in sorted(existing.containers.items())]
        parts += [f"volume {v}" for v in existing.volumes]
        parts += [f"network {NETWORK_NAME}"] if existing.network else []
        raise SimError(
            f"a simulation is already there but does not match {len(nodes)} running "
            f"node(s): {', '.join(parts)}. Run `python -m sim down`, then `up` again."
        )

    def _preflight(self, nodes: list[NodeSpec], subnet: str) -> None:
        images_built = build.image_exists(self.runner, VLLM_IMAGE_REF)
        need = preflight.required_gib(len(nodes), images_built, self.paths.vllm_tarball.exists())
        docker_root = self.runner.run(
            [DOCKER, "info", "--format", "{{.DockerRootDir}}"]
        ).stdout.strip()
        preflight.check_disk(Path(docker_root or "/var/lib/docker"), need)
        preflight.check_subnet(self.runner, subnet)

    def _export_vllm_image(self) -> None:
        """docker save the vLLM image to .sim/images/vllm-sim.tar once per image ID."""
        image_id = build.image_id(self.runner, VLLM_IMAGE_REF)
        stamp = self.paths.cache_dir / "vllm-sim.tar.image-id"
        tarball = self.paths.vllm_tarball
        self.paths.images_dir.mkdir(parents=True, exist_ok=True)
        self.paths.vllm_ref_file.write_text(VLLM_IMAGE_REF + "\n")
        if tarball.exists() and stamp.exists() and stamp.read_text().strip() == image_id:
            return
        partial = tarball.with_suffix(".tar.partial")
        with self.timer.step(f"docker save {VLLM_IMAGE_REF} -> {tarball}"):
            self.runner.run([DOCKER, "save", "-o", str(partial), VLLM_IMAGE_REF])
            os.replace(partial, tarball)
            stamp.write_text(image_id + "\n")

    def _create(
        self,
        nodes: list[NodeSpec],
        subnet: str,
        node_image: str,
        hub_model: model.HubModel,
        undo: Undo,
    ) -> None:
        with self.timer.step(f"network {NETWORK_NAME} ({subnet})"):
            self._create_network(subnet, undo)
        with self.timer.step(f"start {len(nodes)} node(s)"):
            for node in nodes:
                self._create_node(node, node_image, undo)
        with self.timer.step("copy tiny model into every node"):
            tarball = model.node_tarball(hub_model)
            for node in nodes:
                cp = [DOCKER, "cp", "-", f"{node.container}:/"]
                self.runner.run(cp, input=tarball)
        with self.timer.step("wait for sshd and dockerd on every node"):
            for node in nodes:
                self._wait_for_node(node)

    def _create_network(self, subnet: str, undo: Undo) -> None:
        argv = [
            DOCKER, "network", "create", "--driver", "bridge",
            "--subnet", subnet, "--gateway", gateway_address(subnet),
            "--label", f"{LABEL}=1", NETWORK_NAME,
        ]  # fmt: skip
        self.runner.run(argv)
        undo.push(f"network {NETWORK_NAME}", lambda: self._rm(["network", "rm", NETWORK_NAME]))

    def _create_node(self, node: NodeSpec, node_image: str, undo: Undo) -> None:
        """Create the node's volume and container; undo only what this call created."""
        if self.runner.run([DOCKER, "volume", "inspect", node.volume], check=False).ok:
            raise SimError(
                f"docker volume {node.volume} already exists and `sim up` did not create it "
                f"in this run; remove it (`docker volume rm {node.volume}`) and retry"
            )
        volume = [DOCKER, "volume", "create", "--label", f"{LABEL}=1", node.volume]
        self.runner.run(volume)
        undo.push(f"volume {node.volume}", lambda: self._rm(["volume", "rm", node.volume]))
        try:
            self.runner.run(node_run_argv(node, node_image, self.paths, node.is_head))
        except RuntimeError:
            # `docker run` may leave a created-but-not-started container behind: remove it
            # only if it carries this node's label (a foreign one with the name is kept).
            if self._node_label_of(node.container) == node.name:
                self._rm(["rm", "-f", node.container])
            raise
        undo.push(f"container {node.container}", lambda: self._rm(["rm", "-f", node.container]))

    def _node_label_of(self, container: str) -> str:
        fmt = f'{{{{index .Config.Labels "{NODE_LABEL}"}}}}'
        result = self.runner.run([DOCKER, "inspect", "--format", fmt, container], check=False)
        return result.stdout.strip() if result.ok else ""

    def _wait_for_node(self, node: NodeSpec) -> None:
        deadline = time.monotonic() + SSH_WAIT_S
        probe = ssh_argv(self.paths, node.address, "docker", "info", "--format", "{{.Driver}}")
        last = ""
        while time.monotonic() < deadline:
            result = self.runner.run(probe, check=False, timeout=30)
            if result.ok:
                return
            last = (result.stderr or result.stdout).strip()
            time.sleep(1.0)
        logs = self.runner.run([DOCKER, "logs", "--tail", "20", node.container], check=False)
        raise SimError(
            f"node {node.name} ({node.address}) did not answer `ssh ... docker info` within "
            f"{SSH_WAIT_S:.0f}s; last error: {last}\nnode log tail:\n{logs.stdout}{logs.stderr}"
        )

    def _rm(self, args: list[str]) -> None:
        self.runner.run([DOCKER, *args])

    # ---- down -----------------------------------------------------------------
    def _require_engine(self) -> None:
        if not engine_ready(self.runner):
            raise SimError(
                "the Docker engine is not running, so there is no simulation to act on; "
                "`python -m sim up` starts it"
            )

    def down(self, purge: bool = False) -> None:
        """Remove the nodes, their volumes and the network; with purge, the images too."""
        self._require_engine()
        existing = find_existing(self.runner)
        if existing.empty:
            self.say("sim: nothing to remove")
        for container in sorted(existing.containers):
            self.say(f"sim: removing container {container}")
            self._rm(["rm", "-f", "-v", container])
        for volume in sorted(existing.volumes):
            self.say(f"sim: removing volume {volume}")
            self._rm(["volume", "rm", volume])
        if existing.network:
            self.say(f"sim: removing network {NETWORK_NAME}")
            self._rm(["network", "rm", NETWORK_NAME])
        self.paths.nodes_json.unlink(missing_ok=True)
        self.paths.model_json.unlink(missing_ok=True)
        if purge:
            self._purge_images()

    def _purge_images(self) -> None:
        fmt = "{{.Repository}}:{{.Tag}}"
        out = self.runner.run(
            [DOCKER, "images", "--filter", f"label={LABEL}=1", "--format", fmt]
        ).stdout.split()
        refs = sorted({r for r in out if r.startswith("sparkvllm/")} | {VLLM_IMAGE_REF})
        present = [r for r in refs if build.image_exists(self.runner, r)]
        if present:
            self.say(f"sim: removing images {' '.join(present)}")
            self._rm(["rmi", "-f", *present])
        for path in (self.paths.vllm_tarball, self.paths.vllm_ref_file):
            path.unlink(missing_ok=True)

    # ---- status ---------------------------------------------------------------
    def status(self) -> list[dict[str, object]]:
        """One row per node container: name, address, state, whether ssh answers."""
        self._require_engine()
        existing = find_existing(self.runner)
        rows = []
        for container, state in sorted(existing.containers.items()):
            fmt = (
                f'{{{{index .Config.Labels "{NODE_LABEL}"}}}} '
                f"{{{{(index .NetworkSettings.Networks {json.dumps(NETWORK_NAME)}).IPAddress}}}}"
            )
            info = self.runner.run([DOCKER, "inspect", "--format", fmt, container], check=False)
            name, _, address = info.stdout.strip().partition(" ")
            rows.append(
                {
                    "name": name,
                    "container": container,
                    "address": address,
                    "ssh_port": SSH_PORT,
                    "user": SSH_USER,
                    "state": state,
                    "ssh_open": bool(address) and port_open(address, SSH_PORT),
                }
            )
        return rows


def port_open(address: str, port: int, timeout: float = 1.0) -> bool:
    """True if a TCP connect to a simulation node's port succeeds."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False
