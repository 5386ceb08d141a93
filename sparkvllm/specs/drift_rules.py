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
from sparkvllm.config.stack import model_label
from sparkvllm.probes import script
from sparkvllm.specs import containers, plans, weights
from sparkvllm.specs import router_container as router_specs
from sparkvllm.specs.commands import CommandSpec, fingerprint_script, ray_ready
from sparkvllm.specs.containers import NATIVE, RAY, SPEC_LABEL, ContainerSpec
from sparkvllm.specs.output import key_values, last_json

# Pulumi.yaml sets `options.refresh: always`, so every `up` reads the nodes back first.
RUN_UP = "run `pulumi up` (`python -m localengine up --stack NAME` where the Pulumi CLI is absent)"
NODE_STEP_TYPE = "pulumi-python:dynamic:Resource"


def step_urn(stack: str, component_type: str, step: CommandSpec) -> str:
    """The URN of a read-back node step (a NodeStep, a dynamic resource) of the program."""
    chain = f"{plans.CLUSTER_TYPE}${component_type}${NODE_STEP_TYPE}"
    return f"urn:pulumi:{stack}::{PROJECT}::{chain}::{step.name}"


def rerun_fix(stack: str, component_type: str, step: CommandSpec) -> str:
    """How the step heals: the refresh of the next `up` reads the node, finds it differs
    from what the step left, and the step runs again (components/node_step.py)."""
    urn = step_urn(stack, component_type, step)
    return f"{RUN_UP}: its refresh reads '{urn}' back and runs it again"


def image_fix(cfg: StackConfig, stack: str, node: str) -> str:
    plan = plans.image(cfg, {})
    step = plan.obtain if node == plan.head else plan.streams[node]
    return rerun_fix(stack, plan.TYPE, step)


def weights_fix(cfg: StackConfig, stack: str, node: str) -> str:
    plan = plans.model_weights(cfg, {})
    step = plan.copies.get(node) or plan.downloads[node]
    return rerun_fix(stack, plan.TYPE, step)


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
    restarts: int = 0
    oom_killed: bool = False
    last_log: str = ""


@dataclass
class NodeLive:
    """What one node reported. `error` is set when the node could not be read at all."""

    error: str = ""
    containers: dict[str, ContainerLive] = field(default_factory=dict)
    image_id: str = ""
    fingerprint: str = ""
    weights_manifest: str = ""
    weights_gaps: str = ""
    image_digests: tuple[str, ...] = ()  # the image's registry digests (repo@sha256:...)
    ray: dict[str, Any] | None = None
    server: dict[str, Any] | None = None


def expected_containers(
    cfg: StackConfig, stack: str, launcher: str = containers.RAY
) -> dict[str, list[ContainerSpec]]:
    """node -> the container specs the config puts there under `launcher` (the
    components' own specs)."""
    out: dict[str, list[ContainerSpec]] = {n.name: [] for n in cfg.nodes}
    server = containers.model_server(cfg, stack, launcher)
    if launcher == containers.NATIVE:
        out[cfg.head].append(server)
        for n in cfg.worker_nodes:
            out[n.name].append(containers.vllm_rank(cfg, stack, n))
        return out
    out[cfg.head] += [containers.ray_head(cfg, stack), server]
    for n in cfg.worker_nodes:
        out[n.name].append(containers.ray_worker(cfg, stack, n))
    return out


def read_containers(cfg: StackConfig, stack: str) -> dict[str, list[str]]:
    """node -> the names of the containers either launcher puts there: what is read, before
    it is known which launcher the stack runs (deployed_launcher)."""
    both = [
        expected_containers(view, stack, launcher)
        for view in map(cfg.for_model, cfg.served)
        for launcher in (RAY, NATIVE)
    ]
    return {
        n.name: list(dict.fromkeys(s.name for specs in both for s in specs.get(n.name, [])))
        for n in cfg.nodes
    }


def deployed_launcher(cfg: StackConfig, stack: str, last: dict[str, Any], head: NodeLive) -> str:
    """The launcher the stack runs: the config's when it names one; for `auto`, the one the
    last `up` recorded (its `launcher` output), else what runs on the head (a Ray head
    container: ray; none: native). A stack from before launchers existed ran Ray, and its
    Ray head is found."""
    if cfg.parallelism.launcher != "auto":
        return cfg.parallelism.launcher
    recorded = (last.get("launcher") or {}).get("name")
    if recorded in (RAY, NATIVE):
        return str(recorded)
    return RAY if containers.ray_head(cfg, stack).name in head.containers else NATIVE


def state_command(cfg: StackConfig, stack: str, node: NodeConfig) -> str:
    """Prints `container.<name>=<status> <exit> <spec> <image>` (or `absent`) for each
    expected container, and the node's image ID and fingerprint."""
    ref = shlex.quote(cfg.image.local_ref)
    lines = _container_lines(read_containers(cfg, stack)[node.name])
    lines += [
        f"echo image.id=$(docker image inspect --format '{{{{.Id}}}}' {ref} 2>/dev/null)",
        f"echo image.fingerprint=$({fingerprint_script(cfg.image.local_ref)})",
        (
            "echo image.digests=$(docker image inspect --format "
            f"'{{{{range .RepoDigests}}}}{{{{.}}}} {{{{end}}}}' {ref} 2>/dev/null)"
        ),
        weights.weights_state(cfg),
    ]
    return "\n".join(lines)


def _container_lines(names: list[str]) -> list[str]:
    """Bash printing `container.<name>=<status> <exit> <spec> <image> <restarts> <oom>` (or
    `absent`) for each name, and the telling log line of each that is not running."""
    fmt = shlex.quote(
        f'{{{{.State.Status}}}} {{{{.State.ExitCode}}}} {{{{index .Config.Labels "{SPEC_LABEL}"}}}}'
        " {{.Image}} {{.RestartCount}} {{.State.OOMKilled}}"
    )
    lines = []
    for name in names:
        lines += [
            f"c=$(docker inspect -f {fmt} {name} 2>/dev/null || echo absent)",
            f'echo container.{name}="$c"',
            # Why a container stopped: its last log line.
            (
                f'case "$c" in running*|absent) ;; *) echo container_log.{name}='
                f'"$({telling_log_line(name)})";; esac'
            ),
        ]
    return lines


def router_spec(cfg: StackConfig, stack: str) -> ContainerSpec | None:
    """The router's container on the stack's head (None: the stack has no router)."""
    if cfg.router is None:
        return None
    return router_specs.router_container(cfg, cfg.router, stack)


def router_state_command(cfg: StackConfig, stack: str) -> str:
    """Bash (on the stack's head) printing the router container's state line."""
    spec = router_spec(cfg, stack)
    return "\n".join(_container_lines([spec.name] if spec else []))


def router_drift(cfg: StackConfig, stack: str, got: NodeLive | None) -> list[Drift]:
    """The router gone, stopped or on another config than the stack's (`got`: what the
    head reported for it; its own image is the router's, not the models')."""
    spec = router_spec(cfg, stack)
    if spec is None or got is None:
        return []
    if got.error:
        return [Drift(cfg.head, "unreachable", f"{got.error}; fix: check the node")]
    return _containers_drift(cfg.image.ref, cfg.head, [spec], NodeLive(containers=got.containers))


def telling_log_line(container: str) -> str:
    """Bash printing the line of `container`'s last 30 log lines that says why it failed
    (the last one naming an error, an exception, OOM or a kill, links to docs aside), else
    its last line."""
    return (
        f"docker logs --tail 30 {container} 2>&1 | tr -d '\\r' | awk "
        "'{ last = $0 } tolower($0) ~ /error|exception|out of memory|killed/ "
        "&& $0 !~ /https?:[/][/]/ { why = $0 } "
        'END { print (why != "" ? why : last) }\' | cut -c1-200'
    )


@dataclass(frozen=True)
class Probe:
    """A probe run inside one of our containers: `command` with `stdin` on the node;
    `logs` prints the container's last log lines (read when the probe finds a fault)."""

    container: str
    command: str
    stdin: str

    @property
    def logs(self) -> str:
        return telling_log_line(self.container)


def ray_probe(cfg: StackConfig, stack: str) -> Probe:
    """Asks Ray, inside the head container, who is in the cluster: the read-back of the
    program's own membership step (a failed exec prints no JSON, which reads as no answer)."""
    name = containers.ray_head(cfg, stack).name
    members = ray_ready(cfg, name)
    assert members.read is not None and members.read_stdin is not None
    return Probe(name, members.read, members.read_stdin)


def server_probe(cfg: StackConfig, stack: str) -> Probe:
    """Probes the model server from inside its container."""
    name = containers.model_server(cfg, stack).name
    url = f"http://127.0.0.1:{cfg.ports.api}"
    served = shlex.quote(cfg.model.name_for_clients)
    command = f"docker exec -i {name} python3 - {url} {served} {cfg.timeouts.answer_s}"
    return Probe(name, command, script("server_health"))


def parse_state(stdout: str) -> NodeLive:
    kv = key_values(stdout)
    live = NodeLive(
        image_id=kv.get("image.id", ""),
        fingerprint=kv.get("image.fingerprint", ""),
        weights_manifest=kv.get("weights.manifest", ""),
        weights_gaps=kv.get("weights.gaps", ""),
        image_digests=tuple(kv.get("image.digests", "").split()),
    )
    for key, value in kv.items():
        if key.startswith("container."):
            parts = value.split()
            if parts and parts[0] != "absent" and len(parts) in (4, 6):
                name = key.removeprefix("container.")
                restarts, oom = (parts[4], parts[5]) if len(parts) == 6 else ("0", "false")
                live.containers[name] = ContainerLive(
                    parts[0], int(parts[1]) if parts[1].lstrip("-").isdigit() else -1,
                    parts[2], parts[3], int(restarts) if restarts.isdigit() else 0,
                    oom == "true", kv.get(f"container_log.{name}", ""),
                )  # fmt: skip
    return live


def find_drift(
    cfg: StackConfig,
    stack: str,
    live: dict[str, NodeLive],
    last_outputs: dict[str, Any] | None = None,
) -> list[Drift]:
    """Every difference between the config of a stack that serves one model (and, when
    given, the outputs of the last `up`) and what the nodes reported."""
    drifts: list[Drift] = []
    head = live.get(cfg.head, NodeLive(error="not read"))
    drifts += _image_identity_drift(cfg, stack, head, last_outputs or {})
    launcher = deployed_launcher(cfg, stack, last_outputs or {}, head)
    expected = expected_containers(cfg, stack, launcher)
    for node in cfg.nodes:
        got = live.get(node.name, NodeLive(error="not read"))
        if got.error:
            drifts.append(Drift(node.name, "unreachable", f"{got.error}; fix: check the node"))
            continue
        drifts += _node_image_drift(cfg, stack, node.name, got, head)
        drifts += _weights_drift(cfg, stack, node.name, got, head)
        drifts += _containers_drift(cfg.image.ref, node.name, expected[node.name], got)
    drifts += _ray_drift(cfg, head)
    drifts += _server_drift(cfg, head)
    return drifts


def find_set_drift(
    cfg: StackConfig,
    stack: str,
    lives: dict[str, dict[str, NodeLive]],
    last_outputs: dict[str, Any] | None = None,
) -> list[Drift]:
    """find_drift for a stack that serves a set of models: the image once for every node,
    then each model's parts (read as its one-model view; `lives`: model label -> what its
    nodes reported), each finding naming its model. In a set, `auto` runs native."""
    merged: dict[str, NodeLive] = {}
    for live in lives.values():
        for name, got in live.items():
            if name not in merged or merged[name].error:
                merged[name] = got
    head = merged.get(cfg.head, NodeLive(error="not read"))
    drifts = _image_identity_drift(cfg, stack, head, last_outputs or {})
    for node in cfg.nodes:
        got = merged.get(node.name, NodeLive(error="not read"))
        if got.error:
            drifts.append(Drift(node.name, "unreachable", f"{got.error}; fix: check the node"))
        else:
            drifts += _node_image_drift(cfg, stack, node.name, got, head)
    for m in cfg.served:
        view, label = cfg.for_model(m), model_label(m)
        live = lives.get(label, {})
        model_head = live.get(view.head, NodeLive(error="not read"))
        launcher = RAY if m.parallelism.launcher == RAY else NATIVE
        expected = expected_containers(view, stack, launcher)
        found: list[Drift] = []
        for node in view.nodes:
            got = live.get(node.name, NodeLive(error="not read"))
            if got.error:
                continue  # said once above
            found += _weights_drift(view, stack, node.name, got, model_head)
            found += _containers_drift(cfg.image.ref, node.name, expected[node.name], got)
        found += _ray_drift(view, model_head)
        found += _server_drift(view, model_head)
        drifts += [Drift(d.node, f"model {label}: {d.what}", d.detail) for d in found]
    return drifts


def _node_image_drift(
    cfg: StackConfig, stack: str, node: str, got: NodeLive, head: NodeLive
) -> list[Drift]:
    ref = cfg.image.ref
    if not got.image_id:
        return [
            Drift(
                node,
                "image missing",
                f"{ref} is not on the node; fix: {image_fix(cfg, stack, node)}",
            )
        ]
    if head.fingerprint and got.fingerprint != head.fingerprint:
        return [
            Drift(
                node,
                "image replaced",
                f"{ref} differs from the head's (fingerprint {got.fingerprint[:12]} vs "
                f"{head.fingerprint[:12]}); fix: {image_fix(cfg, stack, node)}",
            )
        ]
    return []


def _containers_drift(
    ref: str, node: str, expected: list[ContainerSpec], got: NodeLive
) -> list[Drift]:
    drifts = []
    for spec in expected:
        c = got.containers.get(spec.name)
        want = spec.labels[SPEC_LABEL]
        if c is None:
            drifts.append(Drift(node, "container missing", f"{spec.name} is gone; fix: {RUN_UP}"))
        elif c.status != "running":
            why = f"exit code {c.exit_code}"
            why += f", restarted {c.restarts} time(s)" if c.restarts else ""
            why += ", killed for lack of memory (OOM)" if c.oom_killed else ""
            log = f"; last log: {c.last_log}" if c.last_log else ""
            drifts.append(
                Drift(
                    node,
                    "container not running",
                    f"{spec.name} is {c.status} ({why}){log}; fix: {RUN_UP}",
                )
            )
        elif c.spec != want:
            drifts.append(
                Drift(
                    node,
                    "config not applied",
                    f"{spec.name} runs spec {c.spec}, the config wants {want}; fix: {RUN_UP}",
                )
            )
        elif got.image_id and c.image != got.image_id:
            drifts.append(
                Drift(
                    node,
                    "container on an old image",
                    f"{spec.name} runs {c.image[:19]}, the node's {ref} is "
                    f"{got.image_id[:19]}; fix: {RUN_UP}",
                )
            )
    return drifts


def _image_identity_drift(
    cfg: StackConfig, stack: str, head: NodeLive, last: dict[str, Any]
) -> list[Drift]:
    """The head's image against the pinned digest, and against the fingerprint the last
    `up` recorded (a tag that now names another image)."""
    if head.error or not head.image_id:
        return []
    out = []
    img = cfg.image
    fix = image_fix(cfg, stack, cfg.head)
    pinned = f"{img.repository}@{img.digest}" if img.digest else ""
    if pinned and pinned not in head.image_digests:
        have = ", ".join(head.image_digests) or "no registry digest"
        out.append(
            Drift(
                cfg.head,
                "image not the pinned digest",
                f"{img.local_ref} is {have}, the config pins {pinned}; fix: {fix}",
            )
        )
    recorded = (last.get("image") or {}).get("fingerprint")
    if isinstance(recorded, str) and recorded and head.fingerprint not in ("", recorded):
        out.append(
            Drift(
                cfg.head,
                "image changed since the last up",
                f"{img.local_ref} has fingerprint {head.fingerprint[:12]}, the last up ran "
                f"{recorded[:12]} (the tag now names another image); fix: {fix}",
            )
        )
    return out


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
        return [Drift(cfg.head, "ray unreachable", f"the Ray head did not answer; fix: {RUN_UP}")]
    by_ip = {str(n.cluster_link.address): n.name for n in cfg.nodes}
    out = [
        Drift(
            by_ip.get(ip, ip),
            "left the ray cluster",
            f"{ip} is not a live Ray node (head restarted or worker lost); fix: {RUN_UP}",
        )
        for ip in head.ray.get("missing", [])
    ]
    if not out and float(head.ray.get("gpus", 0)) < cfg.total_gpus:
        out.append(
            Drift(
                cfg.head,
                "ray gpus",
                f"Ray sees {head.ray.get('gpus')} GPU(s), config has {cfg.total_gpus}; "
                f"fix: {RUN_UP}",
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
        log = f"; last log: {s['last_log']}" if s.get("last_log") else ""
        return [Drift(cfg.head, "model server unhealthy", f"/health {said}{log}; fix: {RUN_UP}")]
    if not (s.get("smoke") or {}).get("ok"):
        smoke = s.get("smoke") or {}
        said = f"status {smoke.get('status')}: {str(smoke.get('text', ''))[:120]}"
        log = f"; last log: {s['last_log']}" if s.get("last_log") else ""
        return [
            Drift(
                cfg.head,
                "model server stuck",
                f"/health answers 200 but no token came within {cfg.timeouts.answer_s}s ({said})"
                f"{log}; fix: {RUN_UP}",
            )
        ]
    if cfg.model.name_for_clients not in s.get("models", []):
        return [
            Drift(
                cfg.head,
                "model server serves another model",
                f"{s.get('models')} instead of {cfg.model.name_for_clients}; fix: {RUN_UP}",
            )
        ]
    return []


def probe_result(stdout: str, returncode: int) -> dict[str, Any]:
    """A probe's JSON, or {} when the container could not be reached (exec failed)."""
    report = last_json(stdout)
    if not report and returncode != 0:
        return {}
    return report
