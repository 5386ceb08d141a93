"""Run the program under Pulumi's mock runtime (no CLI) and record every registration,
with the resource options mocks normally hide: dependencies, parent, provider,
delete-before-replace, timeouts, and which inputs are secret.

Node answers are fixtures: what a healthy GB10 node prints for each command (pyinfra's
"fake facts"), derived from the config, with hooks to make a node answer differently.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pulumi
from google.protobuf import json_format
from pulumi.runtime.mocks import MockMonitor

from components.cluster import SparkVllmCluster, SparkVllmClusterArgs
from components.node_step import step_id
from localengine.wire import SECRET_SIG
from localengine.wire import SIG_KEY as SECRET_SIG_KEY
from localengine.wire import plain as unwrap_secrets
from sparkvllm.config import NodeConfig, StackConfig
from sparkvllm.config.stack import model_label
from sparkvllm.workstation import SshAccess


@contextlib.contextmanager
def own_process_pickler() -> Iterator[None]:
    """As if each program ran in a process of its own (as the Python language host runs
    it). pulumi.dynamic's serialize_provider patches pickle's pure-Python Pickler for every
    dynamic resource and never undoes it: each patch wraps the one before. Harmless in a
    fresh process per program; these mock runs are in one process, one after another,
    where the wrappers would pile up until RecursionError. The patch is undone after each."""
    saved = {k: pickle._Pickler.__dict__[k] for k in ("_batch_setitems", "save_dict")}
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(pickle._Pickler, key, value)


def apply_program(
    program: Callable[[], Any],
    mocks: pulumi.runtime.Mocks,
    *,
    stack: str,
    monitor: MockMonitor | None = None,
    project: str = "spark-vllm",
) -> dict[str, Any]:
    """Run `program` (which registers resources and returns outputs) under `mocks` and
    return its outputs fully resolved. Raises what the program or a resource raised."""
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor)
    resolved: dict[str, Any] = {}

    @pulumi.runtime.test
    def run() -> pulumi.Output[Any]:
        return pulumi.Output.from_input(dict(program())).apply(resolved.update)

    with own_process_pickler():
        try:
            run()
        finally:
            _drop_leftover_tasks()
    return resolved


def _drop_leftover_tasks() -> None:
    """A program that raised leaves its other applies scheduled on the shared event loop;
    run on, they would fail the NEXT program run in this process with this one's error (as
    a process per program would not). Cancel them."""
    import asyncio

    loop = asyncio.get_event_loop()
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


@dataclass
class Registration:
    urn: str
    type: str
    name: str
    parent: str
    dependencies: set[str]
    provider: str
    delete_before_replace: bool
    create_timeout: str
    state: dict[str, Any]
    wire: dict[str, Any]

    def secret_input(self, key: str) -> bool:
        """True when input `key` is, or holds, a value sent as a Pulumi secret."""

        def has_secret(value: Any) -> bool:
            if isinstance(value, dict):
                return value.get(SECRET_SIG_KEY) == SECRET_SIG or any(
                    map(has_secret, value.values())
                )
            if isinstance(value, list):
                return any(map(has_secret, value))
            return False

        return has_secret(self.wire.get(key))

    def plain(self, key: str) -> Any:
        """Input `key` with any secret wrapper removed (what the provider would get)."""
        return unwrap_secrets(self.state.get(key))


class RecordingMonitor(MockMonitor):
    def __init__(self, mocks: pulumi.runtime.Mocks):
        super().__init__(mocks)
        self.registrations: dict[str, Registration] = {}

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        """The URN as the engine makes it: the parent's whole qualified type prefixes the
        type (pkg/resource/deploy/deployment.go generateURN), where the SDK's mock monitor
        keeps only the parent's last type."""
        qualified = parent.split("::")[2] if parent else ""
        if qualified and qualified != "pulumi:pulumi:Stack":
            type_ = f"{qualified}${type_}"
        return "urn:pulumi:" + "::".join([pulumi.get_stack(), pulumi.get_project(), type_, name])

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)
        if request.type == "pulumi:pulumi:Stack":
            return response
        if response.urn in self.registrations:
            # As the engine refuses it (pkg/resource/deploy/step_generator.go: "Duplicate
            # resource URN '%s'; try giving it a unique name").
            raise ValueError(f"Duplicate resource URN '{response.urn}'")
        deps = set(request.dependencies)
        for prop in request.propertyDependencies.values():
            deps |= set(prop.urns)
        self.registrations[response.urn] = Registration(
            urn=response.urn,
            type=request.type,
            name=request.name,
            parent=request.parent,
            dependencies=deps,
            provider=request.provider,
            delete_before_replace=request.deleteBeforeReplace,
            create_timeout=request.customTimeouts.create,
            state=self.resources[response.urn].state,
            wire=json_format.MessageToDict(request.object),
        )
        return response


def healthy_facts(cfg: StackConfig, node: NodeConfig) -> str:
    link = node.cluster_link
    arch = cfg.image.arch
    return "\n".join(
        [
            f"arch={arch}",
            "kernel=6.11.0-1016-nvidia",
            f"hostname={node.name}",
            "mem_total_kb=128452096",
            "mem_available_kb=119537664",
            "docker_version=28.3.3",
            "docker_api=1.51",
            "gpu_name=NVIDIA GB10",
            "gpu_driver=580.95.05",
            f"gpu_count={node.gpus}",
            "netdev_present=1",
            "netdev_state=up",
            "netdev_mtu=9000",
            f"netdev_addresses={link.address}",
            f"netdevs=lo,enP7s7,{link.netdev}",
            f"rdma_devices={','.join(link.roce_hcas)}",
            "nccl_host=2.27.3",
            "hf_cache_free_kb=2936012800",
            # nccl.library host: the configured path resolves to the host's library.
            *(
                [f"nccl_lib={cfg.host_nccl}.2.27.3", "nccl_lib_version=2.27.3+cuda12.9"]
                if cfg.host_nccl
                else []
            ),
        ]
    )


def healthy_links(cfg: StackConfig, node: NodeConfig) -> str:
    link = node.cluster_link
    lines = []
    for peer in cfg.nodes:
        if peer.name != node.name:
            addr = peer.cluster_link.address
            lines += [
                f"peer.{peer.name}.route={addr} dev {link.netdev} src {link.address} uid 0",
                f"peer.{peer.name}.tcp=ok",
                f"peer.{peer.name}.mtu=ok",
            ]
    return "\n".join(lines)


IMAGE_VERSIONS = {
    "python": "3.12.3",
    "ray": "2.60.0",
    "torch": "2.9.0",
    "vllm": "0.17.1",
    "nccl": "2.27.3+pip:nvidia-nccl-cu12",
}


@dataclass
class NodeAnswers(pulumi.runtime.Mocks):
    """What each remote command prints, by resource name. Override any entry."""

    cfg: StackConfig
    overrides: dict[str, str] = field(default_factory=dict)
    fingerprint: Callable[[str], str] = lambda node: "f" * 64
    manifest: Callable[[list[str]], str] = lambda node: "e" * 64
    versions: Callable[[str], dict[str, str]] = lambda node: dict(IMAGE_VERSIONS)
    # The registry digest the head's image carries (it was pulled from a registry).
    repo_digest: str = "sha256:" + "d" * 64
    # model label -> the size of its weights the head's preflight and its download print
    # (default 8 GiB).
    weights_bytes: dict[str, int] = field(default_factory=dict)

    def stdout_for(self, name: str) -> str:
        if name in self.overrides:
            return self.overrides[name]
        cfg = self.cfg
        for n in cfg.nodes:
            if name == f"{n.name}-facts":
                return healthy_facts(cfg, n)
            if name == f"{n.name}-links":
                return healthy_links(cfg, n)
            if name in (f"image-obtain-{n.name}", f"image-sync-{n.name}"):
                fp = self.fingerprint(n.name)
                return f"transferred=1\nid=sha256:{fp}\nfingerprint={fp}\n"
            if name == f"image-name-{n.name}":
                img = cfg.image
                return (
                    f"name={img.local_ref}\nid=sha256:{self.fingerprint(n.name)}\n"
                    f"digest={img.repository}@{self.repo_digest}\n"
                )
            if name in (f"image-versions-{n.name}", f"image-ray-{n.name}"):
                return json.dumps(self.versions(n.name))
        view, name = self._model_of(name)
        return self._model_stdout(view, name)

    def _model_of(self, name: str) -> tuple[StackConfig, str]:
        """The one-model view a per-model step belongs to, and its name without the
        model's (a named model's parts carry its name first)."""
        cfg = self.cfg
        for m in cfg.served:
            if m.name is not None and name.startswith(f"{m.name}-"):
                return cfg.for_model(m), name.removeprefix(f"{m.name}-")
        unnamed = next((m for m in cfg.served if m.name is None), cfg.served[0])
        return cfg.for_model(unnamed), name

    def _model_stdout(self, cfg: StackConfig, name: str) -> str:
        size = self.weights_bytes.get(model_label(cfg.model), 8 * 2**30)
        if name == f"{cfg.head}-hub-access":
            return json.dumps({"hub": "ok", "status": 200, "gated": False,
                               "token": cfg.hf_token is not None, "detail": "",
                               "bytes": size})  # fmt: skip
        if name == f"{cfg.head}-weights-size":
            return json.dumps({"hub": "not-needed", "bytes": size})
        if name == f"image-support-{cfg.head}":
            return json.dumps(
                {
                    "model": cfg.model.id,
                    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
                    "vllm_found": True,
                    "vllm_version": "0.17.1rc1.dev25",
                    "ray_version": "2.60.0",
                    "support": {
                        "Qwen3_5MoeForConditionalGeneration": {
                            "module": "qwen3_5",
                            "module_file": True,
                        }
                    },
                }
            )
        if name.startswith("model-download-"):
            manifest = self.manifest(name.rsplit("-", 2)[-2:])
            return f"transferred=1\nmanifest={manifest}\nbytes={size}\n"
        if name.startswith("model-sync-"):
            return f"transferred=1\nmanifest={self.manifest(name.rsplit('-', 2)[-2:])}\n"
        if name == "model-server-ray-ready":
            nodes = [
                {"ip": str(n.cluster_link.address), "hostname": n.name, "gpus": float(n.gpus)}
                for n in cfg.nodes
            ]
            return json.dumps(
                {
                    "alive": len(nodes),
                    "gpus": float(cfg.total_gpus),
                    "nodes": nodes,
                    "missing": [],
                    "unexpected": [],
                    "complete": True,
                    "ray_version": "2.60.0",
                    "node_ids": [f"raylet-{n.name}" for n in cfg.nodes],
                }
            )
        if name == "model-server-health":
            return json.dumps(
                {
                    "health_status": 200,
                    "ready": True,
                    "models": [cfg.model.name_for_clients],
                    "vllm_version": "0.17.1",
                    "metrics": {"vllm:generation_tokens_total": 8.0},
                    "smoke": {"status": 200, "ok": True, "text": "ready"},
                }
            )
        return ""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        outputs = dict(args.inputs)
        if args.typ in ("command:remote:Command", "pulumi-python:dynamic:Resource"):
            outputs["stdout"] = self.stdout_for(args.name)
            outputs["stderr"] = ""
        if args.typ == "pulumi-python:dynamic:Resource":
            # As NodeStepProvider.create names it.
            outputs["generation"] = hashlib.sha256(args.name.encode()).hexdigest()[:16]
            return step_id(args.inputs, outputs["stdout"], outputs["generation"]), outputs
        digest = hashlib.sha256(args.name.encode()).hexdigest()[:12]
        return f"{args.name}-{digest}", outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[Any]]:
        return {}, []


@dataclass
class Run:
    outputs: dict[str, Any]
    registrations: dict[str, Registration]

    def by_name(self, name: str) -> Registration:
        return next(r for r in self.registrations.values() if r.name == name)

    def of_type(self, typ: str) -> list[Registration]:
        return [r for r in self.registrations.values() if r.type == typ]

    def closure(self, urn: str) -> set[str]:
        """Every URN `urn` transitively depends on (component deps expand to children)."""
        seen: set[str] = set()
        todo = [urn]
        while todo:
            for dep in self.registrations[todo.pop()].dependencies:
                if dep not in seen and dep in self.registrations:
                    seen.add(dep)
                    todo.append(dep)
        return seen

    def depends(self, later: str, earlier: str) -> bool:
        return self.by_name(earlier).urn in self.closure(self.by_name(later).urn)


def run_program(
    cfg: StackConfig,
    access: SshAccess,
    answers: NodeAnswers | None = None,
    monitor: RecordingMonitor | None = None,
) -> Run:
    """The program under the mocks; `monitor` (made with `answers`) keeps what was
    registered when the program fails."""
    answers = answers or NodeAnswers(cfg)
    monitor = monitor or RecordingMonitor(answers)

    def program() -> dict[str, Any]:
        args = SparkVllmClusterArgs(config=cfg, stack="test", access=access)
        return SparkVllmCluster("spark-vllm", args).outputs

    outputs = apply_program(program, answers, stack="test", monitor=monitor)
    return Run(outputs=outputs, registrations=monitor.registrations)
