"""Drift the Pulumi providers cannot see, as pure commands and a pure comparison.

The program's refresh reads back containers (pulumi-docker) and its NodeSteps (images,
weights, Ray membership, the server answering); this check reads the same things directly,
without Pulumi state, for CI jobs and operators. This module describes what the deployment should
look like on each node (from the config, via the same specs the components use), the
commands that read what is there, and the differences, each naming the node and the fix.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from sparkvllm.config import PROJECT, NodeConfig, StackConfig
from sparkvllm.probes import script
from sparkvllm.specs import containers, model
from sparkvllm.specs.commands import fingerprint_script
from sparkvllm.specs.containers import SPEC_LABEL, ContainerSpec
from sparkvllm.specs.health import last_json

# Pulumi.yaml sets `options.refresh: always`, so every `up` reads the nodes back first.
FIX = "run `pulumi up` (`python -m localengine up --stack NAME` where the Pulumi CLI is absent)"


def step_urn(stack: str, component_type: str, name: str) -> str:
    """The URN of a read-back node step (a NodeStep, a dynamic resource) of the program."""
    return f"urn:pulumi:{stack}::{PROJECT}::{component_type}$pulumi-python:dynamic:Resource::{name}"


def rerun_fix(stack: str, component_type: str, step: str) -> str:
    """How the step heals: the refresh of the next `up` reads the node, finds it differs
    from what the step left, and the step runs again (components/node_step.py)."""
    urn = step_urn(stack, component_type, step)
    return f"{FIX}: its refresh reads '{urn}' back and runs it again"


def image_fix(cfg: StackConfig, stack: str, node: str) -> str:
    step = f"image-obtain-{node}" if node == cfg.head else f"image-sync-{node}"
    return rerun_fix(stack, "sparkvllm:index:SyncedImage", step)


def weights_fix(cfg: StackConfig, stack: str, node: str) -> str:
    copied = cfg.model.distribution == "copy_from_head" and node != cfg.head
    step = f"model-sync-{node}" if copied else f"model-download-{node}"
    return rerun_fix(stack, "sparkvllm:index:ModelWeights", step)


@dataclass(frozen=True)
class Drift:
    node: str
    what: str
    detail: str

    def render(self) -> str:
        return f"node {self.node}: {self.what}: {self.detail}"


@dataclass(frozen=True)
class ContainerLive:
    status: str  # running, exited, restarting, ... or "absent"
    exit_code: int
    spec: str
    image: str


@dataclass
class NodeLive:
    """What one node reported. `error` is set when the node could not be read at all."""

    error: str = ""
    containers: dict[str, ContainerLive] = field(default_factory=dict)
    image_id: str = ""
    fingerprint: str = ""
    weights_manifest: str = ""
    weights_gaps: str = ""
    ray: dict[str, Any] | None = None
    server: dict[str, Any] | None = None


def expected_containers(cfg: StackConfig, stack: str) -> dict[str, list[ContainerSpec]]:
    """node -> the container specs the config puts there (the components' own specs)."""
    out: dict[str, list[ContainerSpec]] = {n.name: [] for n in cfg.nodes}
    out[cfg.head] += [containers.ray_head(cfg, stack), containers.model_server(cfg, stack)]
    for n in cfg.worker_nodes:
        out[n.name].append(containers.ray_worker(cfg, stack, n))
    return out


def state_command(cfg: StackConfig, stack: str, node: NodeConfig) -> str:
    """Prints `container.<name>=<status> <exit> <spec> <image>` (or `absent`) for each
    expected container, and the node's image ID and fingerprint."""
    fmt = shlex.quote(
        f'{{{{.State.Status}}}} {{{{.State.ExitCode}}}} {{{{index .Config.Labels "{SPEC_LABEL}"}}}}'
        " {{.Image}}"
    )
    ref = shlex.quote(cfg.image.ref)
    lines = [
        f"echo container.{s.name}=$(docker inspect -f {fmt} {s.name} 2>/dev/null || echo absent)"
        for s in expected_containers(cfg, stack)[node.name]
    ]
    lines += [
        f"echo image.id=$(docker image inspect --format '{{{{.Id}}}}' {ref} 2>/dev/null)",
        f"echo image.fingerprint=$({fingerprint_script(cfg.image.ref)})",
        model.weights_state(cfg),
    ]
    return "\n".join(lines)


def ray_probe(cfg: StackConfig, stack: str) -> tuple[str, str]:
    """(command, stdin) that asks Ray, inside the head container, who is in the cluster."""
    # Sorted: the order of the node list is not a change.
    ips = ",".join(sorted(str(n.cluster_link.address) for n in cfg.nodes))
    name = containers.container_name(stack, "ray-head")
    return f"docker exec -i {name} python3 - {ips} {cfg.total_gpus}", script("ray_members")


def server_probe(cfg: StackConfig, stack: str) -> tuple[str, str]:
    """(command, stdin) that probes the model server from inside its container."""
    name = containers.container_name(stack, "model-server")
    url = f"http://127.0.0.1:{cfg.ports.api}"
    model = shlex.quote(cfg.model.name_for_clients)
    return f"docker exec -i {name} python3 - {url} {model}", script("server_health")


def parse_state(stdout: str) -> NodeLive:
    kv = {k: v for k, v in (line.partition("=")[::2] for line in stdout.splitlines()) if k}
    live = NodeLive(
        image_id=kv.get("image.id", ""),
        fingerprint=kv.get("image.fingerprint", ""),
        weights_manifest=kv.get("weights.manifest", ""),
        weights_gaps=kv.get("weights.gaps", "").strip(),
    )
    for key, value in kv.items():
        if key.startswith("container."):
            parts = value.split()
            if parts and parts[0] != "absent" and len(parts) == 4:
                live.containers[key.removeprefix("container.")] = ContainerLive(
                    parts[0], int(parts[1]) if parts[1].lstrip("-").isdigit() else -1,
                    parts[2], parts[3],
                )  # fmt: skip
    return live


def find_drift(cfg: StackConfig, stack: str, live: dict[str, NodeLive]) -> list[Drift]:
    """Every difference between the config and what the nodes reported."""
    drifts: list[Drift] = []
    head = live.get(cfg.head, NodeLive(error="not read"))
    ref = cfg.image.ref
    for node in cfg.nodes:
        got = live.get(node.name, NodeLive(error="not read"))
        if got.error:
            drifts.append(Drift(node.name, "unreachable", f"{got.error}; fix: check the node"))
            continue
        if not got.image_id:
            drifts.append(
                Drift(
                    node.name,
                    "image missing",
                    f"{ref} is not on the node; fix: {image_fix(cfg, stack, node.name)}",
                )
            )
        elif head.fingerprint and got.fingerprint != head.fingerprint:
            drifts.append(
                Drift(
                    node.name,
                    "image replaced",
                    f"{ref} differs from the head's (fingerprint {got.fingerprint[:12]} vs "
                    f"{head.fingerprint[:12]}); fix: {image_fix(cfg, stack, node.name)}",
                )
            )
        drifts += _weights_drift(cfg, stack, node.name, got, head)
        for spec in expected_containers(cfg, stack)[node.name]:
            c = got.containers.get(spec.name)
            want = spec.labels[SPEC_LABEL]
            if c is None:
                drifts.append(
                    Drift(node.name, "container missing", f"{spec.name} is gone; fix: {FIX}")
                )
            elif c.status != "running":
                drifts.append(
                    Drift(
                        node.name,
                        "container not running",
                        f"{spec.name} is {c.status} (exit code {c.exit_code}); fix: {FIX}",
                    )
                )
            elif c.spec != want:
                drifts.append(
                    Drift(
                        node.name,
                        "config not applied",
                        f"{spec.name} runs spec {c.spec}, the config wants {want}; fix: {FIX}",
                    )
                )
            elif got.image_id and c.image != got.image_id:
                drifts.append(
                    Drift(
                        node.name,
                        "container on an old image",
                        f"{spec.name} runs {c.image[:19]}, the node's {ref} is "
                        f"{got.image_id[:19]}; fix: {FIX}",
                    )
                )
    drifts += _ray_drift(cfg, head)
    drifts += _server_drift(cfg, head)
    return drifts


def _weights_drift(
    cfg: StackConfig, stack: str, node: str, got: NodeLive, head: NodeLive
) -> list[Drift]:
    model_ref = f"{cfg.model.id}@{cfg.model.revision}"
    fix = weights_fix(cfg, stack, node)
    if got.weights_gaps:
        return [
            Drift(
                node,
                "weights incomplete",
                f"{model_ref} lacks {got.weights_gaps} in {cfg.model.hf_cache}; fix: {fix}",
            )
        ]
    if head.weights_manifest and got.weights_manifest != head.weights_manifest:
        return [
            Drift(
                node,
                "weights differ",
                f"{model_ref}: manifest {got.weights_manifest[:12] or 'empty'} vs the head's "
                f"{head.weights_manifest[:12]}; fix: {fix}",
            )
        ]
    return []


def _ray_drift(cfg: StackConfig, head: NodeLive) -> list[Drift]:
    if head.error or head.ray is None:
        return []
    if not head.ray:
        return [Drift(cfg.head, "ray unreachable", f"the Ray head did not answer; fix: {FIX}")]
    by_ip = {str(n.cluster_link.address): n.name for n in cfg.nodes}
    out = [
        Drift(
            by_ip.get(ip, ip),
            "left the ray cluster",
            f"{ip} is not a live Ray node (head restarted or worker lost); fix: {FIX}",
        )
        for ip in head.ray.get("missing", [])
    ]
    if not out and float(head.ray.get("gpus", 0)) < cfg.total_gpus:
        out.append(
            Drift(
                cfg.head,
                "ray gpus",
                f"Ray sees {head.ray.get('gpus')} GPU(s), config has {cfg.total_gpus}; fix: {FIX}",
            )
        )
    return out


def _server_drift(cfg: StackConfig, head: NodeLive) -> list[Drift]:
    if head.error or head.server is None:
        return []
    s = head.server
    if not s.get("ready"):
        status = s.get("health_status", 0)
        said = "refused the connection" if not status else f"answered {status}"
        return [Drift(cfg.head, "model server unhealthy", f"/health {said}; fix: {FIX}")]
    if cfg.model.name_for_clients not in s.get("models", []):
        return [
            Drift(
                cfg.head,
                "model server serves another model",
                f"{s.get('models')} instead of {cfg.model.name_for_clients}; fix: {FIX}",
            )
        ]
    return []


def probe_result(stdout: str, returncode: int) -> dict[str, Any]:
    """A probe's JSON, or {} when the container could not be reached (exec failed)."""
    report = last_json(stdout)
    if not report and returncode != 0:
        return {}
    return report
