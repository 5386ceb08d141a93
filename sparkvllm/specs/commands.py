"""One-shot node commands, each with its lifecycle: create is idempotent, delete undoes it.

Pure: strings and data. `components/` turns a CommandSpec into a pulumi-command
remote.Command or a NodeStep on the node; the local engine (localengine/) runs the same
resource inputs over ssh.

stdin: a command gets either literal text (a probe script) or, for `stdin_secret`, a secret
the component supplies (the SSH private key for node-to-node streaming, the HF token for
the weights download and its preflight). Secrets never
appear in a command line, so they never reach a log or an error message.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from sparkvllm import scripts
from sparkvllm.config import NodeConfig, StackConfig
from sparkvllm.probes import revision, script
from sparkvllm.specs import containers
from sparkvllm.specs.health import answers_check
from sparkvllm.specs.scope import scoped
from sparkvllm.specs.ssh import (
    known_hosts_line,
    peer_options,
    relay_options,
)


@dataclass(frozen=True)
class CommandSpec:
    """A one-shot command on `node`. `timeout_s` bounds create; `delete` undoes it."""

    name: str
    node: str
    create: str
    delete: str | None = None
    stdin: str | None = None
    stdin_secret: Literal["ssh_private_key", "hf_token"] | None = None
    timeout_s: int = 300
    # How a refresh reads the step back (components/node_step.py): `read` runs on
    # `read_node` (default: `node`), changes nothing, and prints the value of `state_key`
    # that `create` printed when it left the node as it should be.
    read: str | None = None
    read_stdin: str | None = None
    read_node: str | None = None
    state_key: str | None = None
    # A wait budget the command reads from $WAIT_S at run time (not part of the command).
    wait_s: int | None = None
    # Values the command reads from its environment at run time, not part of its text: how
    # a node is reached (PEER_USER, PEER_PORT, PEER_HOST_KEY of the node a head-to-worker
    # step reaches). A new value re-runs nothing (the step's result does not depend on it).
    env: tuple[tuple[str, str], ...] = ()
    # What the step does, apart from its wording (sparkvllm/scripts: the scripts' names and
    # revisions, and the values): a step whose `defines` is unchanged re-runs for no new
    # text; one whose `reads` changed records its new read and runs nothing. None: the
    # texts themselves define it (a step not yet made of script files).
    defines: str | None = None
    reads: str | None = None

    @property
    def shell_command(self) -> str:
        """`create` as the node runs it: under bash whatever the user's login shell is
        (pulumi-command hands the string to the login shell), `env` assigned first."""
        return f"{env_assignments(self.env)}bash -c {shlex.quote(self.create)}"

    @property
    def shell_delete(self) -> str | None:
        return f"bash -c {shlex.quote(self.delete)}" if self.delete else None


def env_assignments(env: Sequence[tuple[str, str]]) -> str:
    """`NAME='value' ` words for a command line (values quoted; names are the program's)."""
    for name, _ in env:
        if not name.isidentifier():
            raise ValueError(f"not an environment variable name: {name!r}")
    return "".join(f"{name}={shlex.quote(value)} " for name, value in env)


# Identity of an image independent of the storage driver: the content of its layers and
# the config that decides what runs. `.Id` differs between graph drivers and the
# containerd store, so comparing IDs would re-transfer a multi-GB image on every run.
_FINGERPRINT_FORMAT = (
    "{{json .RootFS.Layers}}{{json .Config.Entrypoint}}{{json .Config.Cmd}}{{json .Config.Env}}"
)


def fingerprint_script(ref: str) -> str:
    """Prints the image fingerprint (sha256 hex), or nothing if the image is absent."""
    fmt = shlex.quote(_FINGERPRINT_FORMAT)
    return (
        f"f=$(docker image inspect --format {fmt} {shlex.quote(ref)} 2>/dev/null) && "
        "printf '%s' \"$f\" | sha256sum | cut -c1-64"
    )


def image_obtain(cfg: StackConfig) -> CommandSpec:
    """Get the image onto the head exactly once: pull, load a tarball, or require it. A
    digest-pinned reference is then tagged with its local name (config
    ImageConfig.local_ref) and checked to carry that digest (scripts/image_obtain.sh).

    Prints `id=` and `fingerprint=` lines.
    """
    img = cfg.image
    obtain = scripts.render(
        "image_obtain",
        HEAD_NAME=cfg.head_node.name,
        REF=img.ref,
        LOCAL=img.local_ref,
        SOURCE=img.source,
        TARBALL=img.tarball or "",
        PINNED=f"{img.repository}@{img.digest}" if img.digest else "",
    )
    read = scripts.render("image_fingerprint", REF=img.local_ref)
    return CommandSpec(
        name=f"image-obtain-{cfg.head_node.name}", node=cfg.head_node.name,
        create=obtain.text, timeout_s=3600, read=read.text, state_key="fingerprint",
        defines=obtain.identity, reads=read.identity,
    )  # fmt: skip


def image_name(cfg: StackConfig) -> CommandSpec:
    """The name the containers run the image by, on the head: the config's local name
    when this step runs, printed as `name=`, with the image's ID and each registry digest
    it carries (`digest=repo@sha256:...`; scripts/image_name.sh). Run after the obtain
    step; read back by its ID, so a name that came to mean another image re-runs it (and
    the containers follow).

    A later pin of the digest this image carries keeps the step (NodeStep `keep_if`,
    `name_kept_for`): the containers keep their name, which still means the pinned image,
    and nothing is replaced."""
    name = scripts.render("image_name", REF=cfg.image.local_ref)
    read = scripts.render("image_id", REF=cfg.image.local_ref)
    return CommandSpec(
        name=f"image-name-{cfg.head_node.name}", node=cfg.head_node.name, create=name.text,
        timeout_s=120, read=read.text, state_key="id", defines=name.identity,
        reads=read.identity,
    )  # fmt: skip


def name_kept_for(cfg: StackConfig) -> str | None:
    """The line (as image_name prints it) that keeps the containers' name when the
    config pins a digest: the image they run carries that digest."""
    img = cfg.image
    return f"digest={img.repository}@{img.digest}" if img.digest else None


# Bulk streams from a node at once (the weights copy's blobs, the image stream's and each
# relay hop's connections, the link measurement's TCP streams): as many as the sending
# node has cores, at most this. One ssh stream's cipher and
# one hash run on one core each; a Spark's 20 cores and 200 Gb/s link need several.
MAX_STREAMS = 4


def peer_values(cfg: StackConfig, target: NodeConfig) -> dict[str, scripts.Value]:
    """How a step on the head reaches `target` over the cluster link: the values of
    scripts/lib/peer_ssh.sh (its user, port and host key come at run time: `peer_env`)."""
    return {
        "HEAD_NAME": cfg.head_node.name,
        "TARGET_NAME": target.name,
        "TARGET_ADDRESS": str(target.cluster_link.address),
        "SSH_OPTS": peer_options(target.ssh.verify_host_key),
    }


def peer_env(node: NodeConfig, host_key: str | None) -> tuple[tuple[str, str], ...]:
    """How a head-to-worker step reaches `node`, as run-time values (CommandSpec.env): its
    ssh user, port and pinned host key (empty: not verified, the config's opt-out)."""
    return (
        ("PEER_USER", node.ssh.user),
        ("PEER_PORT", str(node.ssh.port)),
        ("PEER_HOST_KEY", host_key or ""),
    )


def _kh_lines(targets: Sequence[tuple[NodeConfig, str | None]]) -> str:
    """known_hosts text for the head's (and the relay hops') ssh to `targets` over the
    cluster link: their pinned host keys."""
    return "".join(
        known_hosts_line(str(n.cluster_link.address), n.ssh.port, key) + "\n"
        for n, key in targets
        if key
    )


def image_sync(cfg: StackConfig, target: NodeConfig, host_key: str | None) -> CommandSpec:
    """Stream the image from the head to `target` over the cluster link, if it differs
    (scripts/image_sync.sh: only the layers it lacks when it holds some; its free space
    checked first; nothing staged on disk; over several connections at once,
    probes/stripe.py).

    Runs on the head; stdin is the SSH private key (a 0600 temp file removed on exit);
    the target's user, port and host key come at run time (`peer_env`). Prints
    `transferred=0|1`, `id=` (the target's image ID) and `fingerprint=`.
    """
    ref = cfg.image.local_ref
    sync = scripts.render(
        "image_sync",
        **peer_values(cfg, target),
        REF=ref,
        LAYER_FILTER=scripts.Probe("image_layers"),
        STRIPE=scripts.Probe("stripe"),
        MAX_STREAMS=MAX_STREAMS,
    )
    read = scripts.render("image_fingerprint", REF=ref)
    return CommandSpec(
        name=f"image-sync-{target.name}",
        node=cfg.head_node.name,
        create=sync.text,
        stdin_secret="ssh_private_key",
        timeout_s=3600,
        read=read.text,
        read_node=target.name,
        state_key="fingerprint",
        env=peer_env(target, host_key),
        defines=sync.identity,
        reads=read.identity,
    )


def _relay_nodes(
    targets: Sequence[NodeConfig], host_keys: Mapping[str, str | None]
) -> dict[str, scripts.Value]:
    """How the relay's nodes are reached, as the relay's and its hops' values: the
    cluster-link addresses, users, ports, whether each host key is verified, the pinned
    keys, and ssh.py's option words for a hop (agent forwarded) to a verified and an
    unverified node."""
    return {
        "ADDRESSES": [str(n.cluster_link.address) for n in targets],
        "USERS": [n.ssh.user for n in targets],
        "PORTS": [str(n.ssh.port) for n in targets],
        "VERIFY": [str(int(n.ssh.verify_host_key)) for n in targets],
        "KNOWN_HOSTS": _kh_lines([(n, host_keys.get(n.name)) for n in targets]),
        "RELAY_OPTS": relay_options(True),
        "RELAY_OPTS_OPEN": relay_options(False),
    }


def image_relay(
    cfg: StackConfig, targets: Sequence[NodeConfig], host_keys: Mapping[str, str | None]
) -> CommandSpec:
    """The image to several workers, leaving the head once: the workers that lack it form a
    chain, head -> w1 -> w2 -> ..., each loading the stream while passing it on (over
    several connections at once, probes/stripe.py), so every link carries it once
    (scripts/image_relay.sh, its hops scripts/relay_hop.sh: which
    workers form the chain, and what a thin stream leaves out, are said there). Best
    effort: the workers' own `image-sync-*` steps run after it and check every node. Hops
    authenticate through the head's forwarded ssh-agent (the key is never written on a
    worker). Prints `relayed=` (the workers it gave the image to, comma separated).
    """
    nodes = _relay_nodes(targets, host_keys)
    # Each hop's stream over several connections (scripts/lib/relay.sh send).
    bulk: dict[str, scripts.Value] = {"STRIPE": scripts.Probe("stripe"), "MAX_STREAMS": MAX_STREAMS}
    hop = scripts.render("relay_hop", **nodes, **bulk)
    relay = scripts.render(
        "image_relay",
        HEAD_NAME=cfg.head_node.name,
        REF=cfg.image.local_ref,
        LAYER_FILTER=scripts.Probe("image_layers"),
        HOP=hop,
        NAMES=[n.name for n in targets],
        HEAD_OPTS=peer_options(True),
        HEAD_OPTS_OPEN=peer_options(False),
        **nodes,
        **bulk,
    )
    return CommandSpec(
        name="image-relay",
        node=cfg.head_node.name,
        create=relay.text,
        stdin_secret="ssh_private_key",
        timeout_s=3600,
        defines=relay.identity,
    )


# Two tries in a row with one answer (tries are 3 s apart): a dead raylet no longer needs
# the GCS's 30 s to show (probes/ray_members.py refuses it at once).
RAY_SETTLE_S = 3


def ray_ready(cfg: StackConfig, ray_head: str) -> CommandSpec:
    """Wait until Ray reports every node (by its cluster IP) and every GPU, draining any
    other node (probes/ray_members.py: one just removed from the config still runs its
    Ray worker until this `up` ends, and the server must not be placed on it).

    Runs on the head, probing from inside the Ray head container (named `ray_head`):
    scripts/ray_ready.sh. Prints the membership JSON (nodes, gpus, missing, unexpected).
    """
    head = cfg.head_node.name
    # Sorted: the order of the node list is not a change.
    ips = ",".join(sorted(str(n.cluster_link.address) for n in cfg.nodes))
    wait = scripts.render(
        "ray_ready",
        CONTAINER=ray_head,
        PROBE_ARGS=[ips, str(cfg.total_gpus), "drain"],
        SETTLE_S=RAY_SETTLE_S,
    )
    read = scripts.render(
        "ray_members_read", CONTAINER=ray_head, PROBE_ARGS=[ips, str(cfg.total_gpus), "gcs"]
    )
    return CommandSpec(
        name=scoped(cfg, "model-server-ray-ready"),
        node=head,
        create=wait.text,
        stdin=script("ray_members"),
        timeout_s=cfg.timeouts.ray_ready_s + 120,
        wait_s=cfg.timeouts.ray_ready_s,
        # Read back: the raylets Ray reports now, by ID (a restarted head or node has new
        # ones, and vLLM's Ray workers died with the old ones).
        read=read.text,
        read_stdin=script("ray_members"),
        state_key="json:node_ids",
        defines=scripts.identity(wait.identity, "ray_members", revision("ray_members")),
        reads=scripts.identity(read.identity, "ray_members", revision("ray_members")),
    )


def server_guard(cfg: StackConfig, server: str, launcher: str = containers.RAY) -> CommandSpec:
    """The model server's liveness, read back by refresh (scripts/server_guard.sh):
    `health=ok` while its container runs and generates a token (or while it is still
    loading), `health=bad` when it stopped, gave up starting, or once served and no longer
    generates within timeouts.answer_s (a stuck engine: its /health may still say 200). A
    bad reading replaces the guard and, through its generation label, the server
    container (named `server`). Native launcher: the server is rank 0 of a group that
    cannot take a rank back, so a rank 0 gone or started again is bad too."""
    answer_s = cfg.timeouts.answer_s
    read = scripts.render(
        "server_guard",
        CONTAINER=server,
        NATIVE=int(launcher == containers.NATIVE),
        ANSWER_S=answer_s,
        PROBE=answers_check(cfg.ports.api, cfg.model.name_for_clients, answer_s),
        GAVE_UP_MARK=containers.GAVE_UP,
    )
    return CommandSpec(
        name=scoped(cfg, "model-server-guard"), node=cfg.head, create="echo health=ok",
        read=read.text, state_key="health", timeout_s=60, reads=read.identity,
    )  # fmt: skip


def rank_guard(cfg: StackConfig, node: NodeConfig, rank: str) -> CommandSpec:
    """A worker rank's liveness (native launcher), read back by refresh on its node
    (scripts/rank_guard.sh): `health=bad` when its container (named `rank`) is gone,
    stopped or started again since it joined the group. A bad reading replaces this
    guard; its generation is a label of rank 0, so the whole group is replaced."""
    read = scripts.render("rank_guard", CONTAINER=rank)
    return CommandSpec(
        name=scoped(cfg, f"rank-guard-{node.name}"), node=node.name, create="echo health=ok",
        read=read.text, state_key="health", timeout_s=60, reads=read.identity,
    )  # fmt: skip


PROBE_TRY_S = 360


def server_ready(cfg: StackConfig, server: str) -> CommandSpec:
    """Wait for the model server (the container named `server`) to load and answer; then
    print its health JSON (scripts/server_ready.sh).

    Bounded by timeouts.server_ready_s; logs progress (the server's last log line) every
    30 s so a 15-minute model load is visible in `pulumi up`.
    """
    wait = scripts.render(
        "server_ready",
        CONTAINER=server,
        PROBE_ARGS=[f"http://127.0.0.1:{cfg.ports.api}", cfg.model.name_for_clients],
        BUDGET=cfg.timeouts.server_ready_s,
        TRY_S=PROBE_TRY_S,
        GAVE_UP_MARK=containers.GAVE_UP,
    )
    return CommandSpec(
        name=scoped(cfg, "model-server-health"),
        node=cfg.head_node.name,
        create=wait.text,
        stdin=script("server_health"),
        timeout_s=cfg.timeouts.server_ready_s + 300,
        defines=scripts.identity(wait.identity, "server_health", revision("server_health")),
    )


def drop_page_cache(cfg: StackConfig, node: NodeConfig) -> CommandSpec:
    """Free the page cache on `node` (as root, or through passwordless sudo), right before
    the server of the model `cfg` serves starts."""
    drop = scripts.render("drop_page_cache", NODE=node.name, LOGIN_USER=node.ssh.user)
    return CommandSpec(
        name=scoped(cfg, f"model-server-drop-caches-{node.name}"), node=node.name, create=drop.text,
        timeout_s=300, defines=drop.identity,
    )  # fmt: skip
