"""RayWorker: a Ray worker container on one non-head node, joining the head."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from components.adapters import container
from components.gb10_node import GB10Node
from components.ray_head import RayHead
from components.synced_image import SyncedImage
from sparkvllm.config import NodeConfig, StackConfig
from sparkvllm.specs import containers


@dataclass(frozen=True)
class RayWorkerArgs:
    cfg: StackConfig
    stack: str
    node_config: NodeConfig
    node: GB10Node
    image: SyncedImage
    head: RayHead


class RayWorker(pulumi.ComponentResource):
    """Outputs: `container_name`. Starts only after the image is on its node and the
    head container exists (`ray start --address` retries until the GCS answers)."""

    def __init__(self, name: str, args: RayWorkerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("sparkvllm:index:RayWorker", name, None, opts)
        spec = containers.ray_worker(args.cfg, args.stack, args.node_config)
        self.spec = spec
        self.container = container(
            spec,
            image_id=args.cfg.image.ref,
            provider=args.node.provider,
            parent=self,
            depends_on=[
                args.node.preflight,
                args.head.container,
                *args.image.ready_on(args.node_config.name),
            ],
            extra_labels={containers.HEAD_LABEL: args.head.container.id},
            resource_name=f"{name}-container",
        )
        self.container_name = self.container.name
        self.register_outputs({"container_name": self.container_name})
