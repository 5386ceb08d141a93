"""VllmRank: a worker rank of vLLM's own multi-node launcher (parallelism.launcher native):
`vllm serve --headless` in its own container on one non-head node. A child of the
ModelServer, whose container is rank 0."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_docker as docker

from components.adapters import container
from components.gb10_node import GB10Node
from components.synced_image import SyncedImage
from sparkvllm.specs import containers
from sparkvllm.specs.plans import RankPlan


@dataclass(frozen=True)
class VllmRankArgs:
    plan: RankPlan
    node: GB10Node
    image: SyncedImage
    weights_checked: Sequence[pulumi.Input[pulumi.Resource]]
    rank0: docker.Container


class VllmRank(pulumi.ComponentResource):
    """Outputs: `container_name`. Starts after rank 0 (it retries until rank 0's master
    port answers) and is replaced with it: vLLM cannot take a rank back into a running
    group, so a new rank 0 needs new ranks (the label naming rank 0's container)."""

    def __init__(self, name: str, args: VllmRankArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(RankPlan.TYPE, name, None, opts)
        plan = args.plan
        self.spec = plan.container
        self.container = container(
            plan.container,
            image=args.image.ref,
            provider=args.node.provider,
            parent=self,
            depends_on=[
                args.node.checked,
                args.rank0,
                *args.weights_checked,
                *args.image.ready_on(plan.container.node),
            ],
            extra_labels={containers.RANK0_LABEL: args.rank0.id},
        )
        self.container_name = self.container.name
        self.register_outputs({"container_name": self.container_name})
