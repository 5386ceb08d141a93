"""RayWorker: a Ray worker container on one non-head node, joining the head."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from components.adapters import container
from components.gb10_node import GB10Node
from components.ray_head import RayHead
from components.synced_image import SyncedImage
from sparkvllm.specs import containers
from sparkvllm.specs.plans import RayWorkerPlan


@dataclass(frozen=True)
class RayWorkerArgs:
    plan: RayWorkerPlan
    node: GB10Node
    image: SyncedImage
    head: RayHead


class RayWorker(pulumi.ComponentResource):
    """Outputs: `container_name`. Starts only after the image is on its node and the
    head container exists (`ray start --address` retries until the GCS answers)."""

    def __init__(self, name: str, args: RayWorkerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(RayWorkerPlan.TYPE, name, None, opts)
        plan = args.plan
        self.spec = plan.container
        self.container = container(
            plan.container,
            image=args.image.ref,
            provider=args.node.provider,
            parent=self,
            depends_on=[
                args.node.checked,
                args.head.container,
                *args.image.ready_on(plan.container.node),
            ],
            extra_labels={containers.HEAD_LABEL: args.head.container.id},
        )
        self.container_name = self.container.name
        self.register_outputs({"container_name": self.container_name})
