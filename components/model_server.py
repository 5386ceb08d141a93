"""ModelServer: `vllm serve` TP x PP in its own container on the head; its bounded
readiness wait yields `health`.

Launcher ray: the Ray driver, started only after Ray reports every node and GPU.
Launcher native: rank 0 of vLLM's own launcher, serving the API; the worker ranks are its
children (VllmRank), started after it and replaced with it. The group is one: a guard per
rank, read back by refresh, and every rank's spec are labels of rank 0, so a rank lost,
stopped or restarted, or a new spec for any of them, replaces every rank together."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi

from components.adapters import container, remote_command
from components.gb10_node import GB10Node
from components.model_weights import ModelWeights
from components.node_step import NodeStep
from components.ray_head import RayHead
from components.ray_worker import RayWorker
from components.synced_image import SyncedImage
from components.vllm_rank import VllmRank, VllmRankArgs
from sparkvllm.specs import containers
from sparkvllm.specs.health import health_report
from sparkvllm.specs.plans import RankPlan, ServerPlan


@dataclass(frozen=True)
class ModelServerArgs:
    plan: ServerPlan
    nodes: Mapping[str, GB10Node]
    image: SyncedImage
    head: RayHead | None  # launcher ray
    workers: Sequence[RayWorker]  # launcher ray
    weights: ModelWeights
    api_key: pulumi.Output[str] | None
    ranks: Sequence[RankPlan] = ()  # launcher native: the worker ranks
    # The servers of earlier models that share a node with this one: it starts once they
    # answer (vLLM's start-up profiling ignores its memory limit on a GB10: two at once can
    # take more than the node has).
    after: Sequence[pulumi.Resource | pulumi.Output[Any]] = ()


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
        self.spec = spec
        self.ranks: list[VllmRank] = []
        if plan.ray_ready is not None:
            assert args.head is not None
            cluster = [args.head.container, *(w.container for w in args.workers)]
            # Ray's membership, read back by refresh: a restarted head or node (new
            # raylets) or a replaced Ray container re-runs the wait, and its new generation
            # replaces the server (vLLM's Ray workers died with the old raylets).
            ray_step = NodeStep(
                plan.ray_ready,
                reach=node.reach,
                triggers=[c.id for c in cluster],
                opts=pulumi.ResourceOptions(parent=self, depends_on=cluster),
            )
            ray_ready: NodeStep | None = ray_step
            before: list[pulumi.Resource] = [ray_step]
        else:
            ray_ready = None
            before = []
        # The server answering, read back by refresh: a stopped or hung server (running,
        # /health failing) replaces the guard, whose new generation replaces the server.
        guard = NodeStep(
            plan.guard,
            reach=node.reach,
            opts=pulumi.ResourceOptions(parent=self, depends_on=before),
        )
        # Native: each worker rank's guard (gone, stopped or restarted reads bad).
        rank_guards = [
            NodeStep(
                r.guard,
                reach=args.nodes[r.container.node].reach,
                opts=pulumi.ResourceOptions(parent=self, depends_on=before),
            )
            for r in args.ranks
        ]
        # Unified memory: free the page cache on every node right before vLLM measures
        # free memory; re-run whenever the server's command changes.
        drops = [
            remote_command(
                drop,
                connection=args.nodes[drop.node].connection,
                parent=self,
                secrets={},
                depends_on=before or [guard, *rank_guards],
                triggers=[json.dumps([spec.command, spec.env], sort_keys=True)],
            )
            for drop in plan.drop_caches
        ]
        labels: dict[str, pulumi.Input[str]] = {containers.GUARD_LABEL: guard.generation}
        if ray_ready is not None:
            labels[containers.RAY_CLUSTER_LABEL] = ray_ready.generation
        if args.ranks:
            specs = [r.container.labels[containers.SPEC_LABEL] for r in args.ranks]
            labels[containers.RANKS_LABEL] = pulumi.Output.all(
                *(g.generation for g in rank_guards)
            ).apply(lambda gens: ",".join([*specs, *map(str, gens)]))
        self.container = container(
            spec,
            image=args.image.ref,
            provider=node.provider,
            parent=self,
            depends_on=[
                *before,
                guard,
                *rank_guards,
                *drops,
                *args.weights.checked,
                *args.image.ready_on(spec.node),
                *args.after,
            ],
            secret_env={"VLLM_API_KEY": args.api_key} if args.api_key is not None else None,
            extra_labels=labels,
        )
        self.ranks = [
            VllmRank(
                r.name,
                VllmRankArgs(
                    r, args.nodes[r.container.node], args.image, args.weights.checked,
                    self.container,
                ),
                pulumi.ResourceOptions(parent=self),
            )
            for r in args.ranks
        ]  # fmt: skip
        ready = remote_command(
            plan.ready,
            connection=node.connection,
            parent=self,
            secrets={},
            depends_on=[self.container, *(r.container for r in self.ranks)],
            triggers=[self.container.id],
        )
        self.ready = ready
        self.endpoint = pulumi.Output.from_input(plan.endpoint)
        members = ray_ready.stdout if ray_ready is not None else pulumi.Output.from_input("")
        self.ray_members = members

        def report(outs: list[str]) -> dict[str, object]:
            health = health_report(outs[0], outs[1], plan.served_name)
            if ray_ready is None:
                health["ray"] = {}  # no Ray: vLLM's own launcher
            if plan.rdma and health["nccl_transport"] == "socket":
                pulumi.log.warn(
                    "NCCL fell back to TCP sockets (NET/Socket) although roce_hcas are set: "
                    "check /dev/infiniband in the containers, NCCL_IB_HCA and the RoCE links",
                    resource=self,
                )
            return health

        self.health = pulumi.Output.all(members, ready.stdout).apply(report)
        self.register_outputs({"endpoint": self.endpoint, "health": self.health})
