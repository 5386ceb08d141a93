"""RayHead: the Ray head as a long-running container on the head node."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from components.adapters import container
from components.gb10_node import GB10Node
from components.synced_image import SyncedImage
from sparkvllm.config import StackConfig
from sparkvllm.specs import containers


@dataclass(frozen=True)
class RayHeadArgs:
    cfg: StackConfig
    stack: str
    node: GB10Node
    image: SyncedImage


class RayHead(pulumi.ComponentResource):
    """Outputs: `gcs_address` (host:port on the cluster link), `dashboard_url` (where the
    dashboard listens), `dashboard_tunnel` (the ssh command that forwards local port
    ports.ray_dashboard to it), `container_name`."""

    def __init__(self, name: str, args: RayHeadArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("sparkvllm:index:RayHead", name, None, opts)
        cfg = args.cfg
        spec = containers.ray_head(cfg, args.stack)
        self.spec = spec
        self.container = container(
            spec,
            image_id=cfg.image.ref,
            provider=args.node.provider,
            parent=self,
            # Nothing starts before the image is on the node and known to implement the
            # model (the reference, not an ID read from a step: known in every preview).
            depends_on=[args.node.preflight, *args.image.ready_on(cfg.head)],
            resource_name=f"{name}-container",
        )
        self.gcs_address = pulumi.Output.from_input(
            f"{cfg.head_node.cluster_link.address}:{cfg.ports.ray_gcs}"
        )
        url, tunnel = containers.dashboard_access(cfg)
        self.dashboard_url = pulumi.Output.from_input(url)
        self.dashboard_tunnel = pulumi.Output.from_input(tunnel)
        self.container_name = self.container.name
        self.register_outputs(
            {
                "gcs_address": self.gcs_address,
                "dashboard_url": self.dashboard_url,
                "container_name": self.container_name,
            }
        )
