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
from sparkvllm.specs import containers
from sparkvllm.specs.health import health_report
from sparkvllm.specs.plans import ServerPlan


@dataclass(frozen=True)
class ModelServerArgs:
    plan: ServerPlan
    nodes: Mapping[str, GB10Node]
    image: SyncedImage
    head: RayHead
    workers: Sequence[RayWorker]
    weights: ModelWeights
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
        super().__init__(ServerPlan.TYPE, name, None, opts)
        plan = args.plan
        spec = plan.container
        node = args.nodes[spec.node]
        cluster = [args.head.container, *(w.container for w in args.workers)]
        # Ray's membership, read back by refresh: a restarted head or node (new raylets)
        # or a replaced Ray container re-runs the wait, and its new generation replaces
        # the server (vLLM's Ray workers died with the old raylets).
        ray_ready = NodeStep(
            plan.ray_ready,
            reach=node.reach,
            triggers=[c.id for c in cluster],
            opts=pulumi.ResourceOptions(parent=self, depends_on=cluster),
        )
        # The server answering, read back by refresh: a stopped or hung server (running,
        # /health failing) replaces the guard, whose new generation replaces the server.
        guard = NodeStep(
            plan.guard,
            reach=node.reach,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[ray_ready]),
        )
        self.spec = spec
        # Unified memory: free the page cache on every node right before vLLM measures
        # free memory; re-run whenever the server's command changes.
        drops = [
            remote_command(
                drop,
                connection=args.nodes[drop.node].connection,
                parent=self,
                secrets={},
                depends_on=[ray_ready],
                triggers=[json.dumps([spec.command, spec.env], sort_keys=True)],
            )
            for drop in plan.drop_caches
        ]
        self.container = container(
            spec,
            image=args.image.ref,
            provider=node.provider,
            parent=self,
            depends_on=[
                ray_ready,
                guard,
                *drops,
                *args.weights.checked,
                *args.image.ready_on(spec.node),
            ],
            secret_env={"VLLM_API_KEY": args.api_key} if args.api_key is not None else None,
            extra_labels={
                containers.RAY_CLUSTER_LABEL: ray_ready.generation,
                containers.GUARD_LABEL: guard.generation,
            },
        )
        ready = remote_command(
            plan.ready,
            connection=node.connection,
            parent=self,
            secrets={},
            depends_on=[self.container],
            triggers=[self.container.id],
        )
        self.endpoint = pulumi.Output.from_input(plan.endpoint)
        self.ray_members = ray_ready.stdout

        def report(outs: list[str]) -> dict[str, object]:
            health = health_report(outs[0], outs[1], plan.served_name)
            if plan.rdma and health["nccl_transport"] == "socket":
                pulumi.log.warn(
                    "NCCL fell back to TCP sockets (NET/Socket) although roce_hcas are set: "
                    "check /dev/infiniband in the containers, NCCL_IB_HCA and the RoCE links",
                    resource=self,
                )
            return health

        self.health = pulumi.Output.all(ray_ready.stdout, ready.stdout).apply(report)
        self.register_outputs({"endpoint": self.endpoint, "health": self.health})
