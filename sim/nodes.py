"""`sim up`, `sim down`, `sim status`: the simulated DGX Spark cluster's lifecycle."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sim import build, host_checks, keys, tiny_model
from sim.dockerd import dockerd_ready, ensure_dockerd
from sim.progress import Timer
from sim.runner import Runner
from sim.settings import (
    DEFAULT_SUBNET,
    HUB_CONTAINER,
    HUB_HOST_OFFSET,
    HUB_PORT,
    JUMP_CONTAINER,
    JUMP_HOST_OFFSET,
    LABEL,
    NETWORK_NAME,
    NODE_IMAGES_DIR,
    NODE_SIM_CONFIG_DIR,
    PREFIX,
    ROUTER_IMAGE_REF,
    SIM_SOURCE_DIR,
    SIM_STACK,
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
HUB_LABEL = f"{LABEL}.hub"
JUMP_LABEL = f"{LABEL}.jump"
# The jump host: the node image's sshd alone (no Docker engine), with its own host key.
JUMP_ENTRYPOINT = (
    "set -e; c=/etc/sparkvllm-sim; install -d -m 0700 /root/.ssh; "
    "install -m 0600 $c/authorized_keys /root/.ssh/authorized_keys; "
    "install -m 0600 $c/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key; "
    "install -d -m 0755 /run/sshd; exec /usr/sbin/sshd -D -e"
)
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
    """What of a simulation is on the local dockerd now (found by label and name)."""

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
    """The simulated cluster on the local Docker daemon (dockerd).

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
            ensure_dockerd(self.runner, self.paths, self.say)
        existing = find_existing(self.runner)
        if not existing.empty and not self._state_here(nodes):
            # Nodes made from another checkout (e.g. CI's fresh clone): their keys are not
            # in this .sim/, so this checkout cannot reach them. Recreate from here.
            self.say("sim: the running simulation was made from another checkout; recreating")
            self.down()
            existing = find_existing(self.runner)
        if not existing.empty and not self._models_current():
            self.say("sim: the nodes predate the model repos this checkout puts in their "
                     "caches; recreating")  # fmt: skip
            self.down()
            existing = find_existing(self.runner)
        if not existing.empty:
            return self._already_up(existing, nodes)
        for folder in (self.paths.root, self.paths.cache_dir, self.paths.logs_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self._check_host(nodes, subnet)
        host_keys = keys.ensure_node_keys(self.runner, self.paths, nodes)
        images = build.ensure_images(self.runner, self.paths, self.timer)
        with self.timer.step("tiny model"):
            hub_model = tiny_model.ensure_model(self.runner, self.paths, images.vllm)
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

    def _write_state(self, table: list[dict[str, object]], hub_model: tiny_model.HubModel) -> None:
        """nodes.json (the node table) and model.json (what every node has in its cache)."""
        self.paths.nodes_json.write_text(json.dumps(table, indent=2) + "\n")
        self.paths.model_json.write_text(json.dumps(hub_model.record(), indent=2) + "\n")

    def _models_current(self) -> bool:
        """Whether the nodes' caches hold every repo this checkout puts there (model.json
        says which they were given)."""
        try:
            record = json.loads(self.paths.model_json.read_text())
        except (OSError, ValueError):
            return False
        return record.get("repos") == list(tiny_model.NODE_REPOS)

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
            # Our own nodes, stopped (dockerd restarted, e.g. a new CI run on this
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

    def _check_host(self, nodes: list[NodeSpec], subnet: str) -> None:
        images_built = build.image_exists(self.runner, VLLM_IMAGE_REF)
        need = host_checks.required_gib(len(nodes), images_built, self.paths.vllm_tarball.exists())
        docker_root = self.runner.run(
            [DOCKER, "info", "--format", "{{.DockerRootDir}}"]
        ).stdout.strip()
        host_checks.check_disk(Path(docker_root or "/var/lib/docker"), need)
        host_checks.check_subnet(self.runner, subnet)

    def _export_vllm_image(self) -> None:
        """docker save the vLLM image to .sim/images/vllm-sim.tar, and the router's to
        router-sim.tar, each once per image ID."""
        self.paths.images_dir.mkdir(parents=True, exist_ok=True)
        self.paths.vllm_ref_file.write_text(VLLM_IMAGE_REF + "\n")
        for ref, tarball in (
            (VLLM_IMAGE_REF, self.paths.vllm_tarball),
            (ROUTER_IMAGE_REF, self.paths.router_tarball),
        ):
            image_id = build.image_id(self.runner, ref)
            stamp = self.paths.cache_dir / f"{tarball.name}.image-id"
            if tarball.exists() and stamp.exists() and stamp.read_text().strip() == image_id:
                continue
            partial = tarball.with_suffix(".tar.partial")
            with self.timer.step(f"docker save {ref} -> {tarball}"):
                self.runner.run([DOCKER, "save", "-o", str(partial), ref])
                os.replace(partial, tarball)
                stamp.write_text(image_id + "\n")

    def _create(
        self,
        nodes: list[NodeSpec],
        subnet: str,
        node_image: str,
        hub_model: tiny_model.HubModel,
        undo: Undo,
    ) -> None:
        with self.timer.step(f"network {NETWORK_NAME} ({subnet})"):
            self._create_network(subnet, undo)
        with self.timer.step(f"start {len(nodes)} node(s)"):
            for node in nodes:
                self._create_node(node, node_image, undo)
        with self.timer.step("copy tiny model into every node"):
            tarball = tiny_model.node_tarball(hub_model)
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
    def _require_dockerd(self) -> None:
        if not dockerd_ready(self.runner):
            raise SimError(
                "the Docker engine is not running, so there is no simulation to act on; "
                "`python -m sim up` starts it"
            )

    def down(self, purge: bool = False) -> None:
        """Remove the nodes, their volumes and the network; with purge, the images too."""
        self._require_dockerd()
        existing = find_existing(self.runner)
        self.hub_down()  # attached to the network
        self.jump_down()
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
        self._forget_stack_state()
        if purge:
            self._purge_images()

    def _forget_stack_state(self) -> None:
        """The local engine's state of the `sim` stack in this checkout describes the nodes
        just removed (their containers, their host keys, the key that reached them): kept,
        the next `up` would refresh against new nodes with old credentials and fail. The
        nodes are gone, so is what it recorded of them (`pulumi stack rm --force` after the
        machines are wiped). A stack deployed with the Pulumi CLI keeps its own state."""
        from localengine.state import StateFile
        from sparkvllm.config import PROJECT

        state = StateFile(self.paths.root.parent, SIM_STACK, project=PROJECT)
        if state.path.exists():
            self.say(f"sim: removing the local engine's state of the removed nodes ({state.path})")
            state.remove()

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

    def remove_inner_containers(self, label: str) -> dict[str, list[str]]:
        """Remove the containers carrying `label` (key=value) from every node's own
        dockerd, as wiping a node would; node container -> the names removed."""
        self._require_dockerd()
        removed = {}
        for container in sorted(find_existing(self.runner).containers):
            listing = self.runner.run(
                [DOCKER, "exec", container, "docker", "ps", "-a", "--filter", f"label={label}",
                 "--format", "{{.Names}}"],
                check=False,
            )  # fmt: skip
            names = listing.stdout.split()
            if names:
                self.runner.run([DOCKER, "exec", container, "docker", "rm", "-f", *names])
            removed[container] = names
        return removed

    # ---- the jump host ---------------------------------------------------------
    def jump_up(self, authorized: list[str], subnet: str = DEFAULT_SUBNET) -> tuple[str, str]:
        """SIMULATION: a jump host (bastion) on the sim network: sshd in the sim-node image,
        letting in the `authorized` public keys (it forwards to the nodes, as a bastion
        does). Returns its address and its host key line. Replaces a running one."""
        self._require_dockerd()
        self.jump_down()
        conf = self.paths.jump_dir
        keys.ensure_keypair(self.runner, conf / "ssh_host_ed25519_key", "root@jump")
        (conf / "authorized_keys").write_text("".join(f"{k}\n" for k in authorized))
        node_image = self._node_image(subnet)
        address = str(ipaddress.ip_network(subnet).network_address + JUMP_HOST_OFFSET)
        self.runner.run([
            DOCKER, "run", "-d", "--name", JUMP_CONTAINER,
            "--label", f"{LABEL}=1", "--label", f"{JUMP_LABEL}=1",
            "--network", NETWORK_NAME, "--ip", address,
            "-v", f"{conf}:/etc/sparkvllm-sim:ro",
            "--entrypoint", "bash", node_image, "-c", JUMP_ENTRYPOINT,
        ])  # fmt: skip
        self._wait_listening(address, SSH_PORT, JUMP_CONTAINER)
        self.say(f"sim: jump host at {address}")
        return address, keys.public_key_line(conf / "ssh_host_ed25519_key.pub")

    def jump_down(self) -> None:
        """Remove the jump host if it runs."""
        self._remove_labelled(JUMP_LABEL, JUMP_CONTAINER)

    def _remove_labelled(self, label: str, name: str) -> None:
        found = self.runner.run(
            [DOCKER, "ps", "-aq", "--filter", f"label={label}"], check=False
        ).stdout.split()
        if found:
            self.say(f"sim: removing container {name}")
            self._rm(["rm", "-f", *found])

    def _node_image(self, subnet: str) -> str:
        """The sim-node image the nodes run (helpers run in it too)."""
        head = node_specs(1, subnet)[0].container
        return self.runner.run([DOCKER, "inspect", "-f", "{{.Config.Image}}", head]).stdout.strip()

    def _wait_listening(self, address: str, port: int, container: str) -> None:
        deadline = time.monotonic() + 30
        while not port_open(address, port):
            if time.monotonic() > deadline:
                logs = self.runner.run([DOCKER, "logs", container], check=False)
                raise SimError(f"{container} did not listen: {logs.stdout}{logs.stderr}")
            time.sleep(0.5)

    # ---- the hub stand-in -------------------------------------------------------
    def hub_up(self, model_id: str, token: str | None, subnet: str = DEFAULT_SUBNET) -> str:
        """SIMULATION: start sim/hub.py on the sim network serving the tiny model as
        `model_id`, gated behind `token` when given (replacing a running one); returns its
        endpoint. It runs in the sim-node image (python3), with the token in a 0600 file."""
        self._require_dockerd()
        self.hub_down()
        record = json.loads(self.paths.model_json.read_text())
        snapshot = tiny_model.host_snapshot(self.paths, str(record["revision"]))
        node_image = self._node_image(subnet)
        self.paths.hub_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        token_file = self.paths.hub_dir / "token"
        token_file.unlink(missing_ok=True)
        token_args: list[str] = []
        if token is not None:
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token)
            token_args = ["--token-file", "/hub/token"]
        address = str(ipaddress.ip_network(subnet).network_address + HUB_HOST_OFFSET)
        repo = snapshot.parent.parent  # models--ORG--NAME: the snapshot's links resolve in it
        argv = [
            DOCKER, "run", "-d", "--name", HUB_CONTAINER,
            "--label", f"{LABEL}=1", "--label", f"{HUB_LABEL}=1",
            "--network", NETWORK_NAME, "--ip", address,
            "-v", f"{SIM_SOURCE_DIR / 'hub.py'}:/hub.py:ro",
            "-v", f"{repo}:/repo:ro", "-v", f"{self.paths.hub_dir}:/hub:ro",
            "--entrypoint", "python3", node_image, "/hub.py",
            "--port", str(HUB_PORT), "--model", model_id,
            "--files", f"/repo/snapshots/{snapshot.name}", *token_args,
        ]  # fmt: skip
        self.runner.run(argv)
        self._wait_listening(address, HUB_PORT, HUB_CONTAINER)
        self.say(f"sim: hub stand-in serving {model_id} at http://{address}:{HUB_PORT}")
        return f"http://{address}:{HUB_PORT}"

    def hub_down(self) -> None:
        """Remove the hub stand-in if it runs."""
        self._remove_labelled(HUB_LABEL, HUB_CONTAINER)

    # ---- status ---------------------------------------------------------------
    def status(self) -> list[dict[str, object]]:
        """One row per node container: name, address, state, whether ssh answers."""
        self._require_dockerd()
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
