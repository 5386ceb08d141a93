"""ModelServer: `vllm serve` TP x PP on Ray in its own container on the head; started only
after Ray reports every node and GPU; its bounded readiness wait yields `health`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi

from components.adapters import container, remote_command
from components.gb10_node import GB10Node
from components.model_weights import ModelWeights
from components.node_step import NodeStep
from components.ray_head import RayHead
from components.ray_worker import RayWorker
from components.synced_image import SyncedImage
from sparkvllm.config import StackConfig
from sparkvllm.specs import commands, containers
from sparkvllm.specs.health import health_report


@dataclass(frozen=True)
class ModelServerArgs:
    cfg: StackConfig
    stack: str
    node: GB10Node
    image: SyncedImage
    head: RayHead
    workers: Sequence[RayWorker]
    weights: ModelWeights
    nodes: Mapping[str, GB10Node]
    api_key: pulumi.Output[str] | None


class ModelServer(pulumi.ComponentResource):
    """Outputs: `endpoint` (OpenAI base URL), `health` (dict, see specs/health.py),
    `ray_members` (what Ray reported before the server started)."""

    endpoint: pulumi.Output[str]
    health: pulumi.Output[dict[str, object]]

    def __init__(
        self,
        name: str,
        args: ModelServerArgs,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("sparkvllm:index:ModelServer", name, None, opts)
        cfg = args.cfg
        cluster = [args.head.container, *(w.container for w in args.workers)]
        # Ray's membership, read back by refresh: a restarted head or node (new raylets)
        # or a replaced Ray container re-runs the wait, and its new generation replaces
        # the server (vLLM's Ray workers died with the old raylets).
        ray_ready = NodeStep(
            f"{name}-ray-ready",
            commands.ray_ready(cfg, args.stack),
            reach=args.node.reach,
            triggers=[c.id for c in cluster],
            opts=pulumi.ResourceOptions(parent=self, depends_on=cluster),
        )
        # The server answering, read back by refresh: a stopped or hung server (running,
        # /health failing) replaces the guard, whose new generation replaces the server.
        guard = NodeStep(
            f"{name}-guard",
            commands.server_guard(cfg, args.stack),
            reach=args.node.reach,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[ray_ready]),
        )
        spec = containers.model_server(cfg, args.stack)
        self.spec = spec
        # Unified memory: free the page cache on every node right before vLLM measures
        # free memory; re-run whenever the server's command changes.
        drops = [
            remote_command(
                commands.drop_page_cache(n),
                connection=args.nodes[n.name].connection,
                parent=self,
                secrets={},
                depends_on=[ray_ready],
                triggers=[json.dumps([spec.command, spec.env], sort_keys=True)],
                resource_name=f"{name}-drop-caches-{n.name}",
            )
            for n in cfg.nodes
            if cfg.drop_page_cache
        ]
        self.container = container(
            spec,
            image_id=cfg.image.ref,
            provider=args.node.provider,
            parent=self,
            depends_on=[
                ray_ready,
                guard,
                *drops,
                *args.weights.complete,
                *args.image.ready_on(cfg.head),
            ],
            secret_env={"VLLM_API_KEY": args.api_key} if args.api_key is not None else None,
            extra_labels={
                containers.RAY_CLUSTER_LABEL: ray_ready.generation,
                containers.GUARD_LABEL: guard.generation,
            },
            resource_name=f"{name}-container",
        )
        ready = remote_command(
            commands.server_ready(cfg, args.stack),
            connection=args.node.connection,
            parent=self,
            secrets={},
            depends_on=[self.container],
            triggers=[self.container.id],
            resource_name=f"{name}-health",
        )
        host = cfg.endpoint_host or cfg.head_node.ssh.host
        self.endpoint = pulumi.Output.from_input(f"http://{host}:{cfg.ports.api}/v1")
        self.ray_members = ray_ready.stdout
        served = cfg.model.name_for_clients
        rdma = any(n.cluster_link.roce_hcas for n in cfg.nodes)

        def report(outs: list[str]) -> dict[str, object]:
            health = health_report(outs[0], outs[1], served)
            if rdma and health["nccl_transport"] == "socket":
                pulumi.log.warn(
                    "NCCL fell back to TCP sockets (NET/Socket) although roce_hcas are set: "
                    "check /dev/infiniband in the containers, NCCL_IB_HCA and the RoCE links",
                    resource=self,
                )
            return health

        self.health = pulumi.Output.all(ray_ready.stdout, ready.stdout).apply(report)
        self.register_outputs({"endpoint": self.endpoint, "health": self.health})
