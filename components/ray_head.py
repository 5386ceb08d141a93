"""RayHead: the Ray head as a long-running container on the head node."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from components.adapters import container
from components.gb10_node import GB10Node
from components.synced_image import SyncedImage
from sparkvllm.specs.plans import RayHeadPlan


@dataclass(frozen=True)
class RayHeadArgs:
    plan: RayHeadPlan
    node: GB10Node
    image: SyncedImage


class RayHead(pulumi.ComponentResource):
    """Outputs: `gcs_address` (host:port on the cluster link), `dashboard_url` (where the
    dashboard listens), `dashboard_tunnel` (the ssh command that forwards local port
    ports.ray_dashboard to it), `container_name`."""

    def __init__(self, name: str, args: RayHeadArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(RayHeadPlan.TYPE, name, None, opts)
        plan = args.plan
        self.spec = plan.container
        self.container = container(
            plan.container,
            image=args.image.ref,
            provider=args.node.provider,
            parent=self,
            # Nothing starts before the image is on the node and known to implement the
            # model (the reference, not an ID read from a step: known in every preview).
            depends_on=[args.node.checked, *args.image.ready_on(plan.container.node)],
        )
        self.gcs_address = pulumi.Output.from_input(plan.gcs_address)
        self.dashboard_url = pulumi.Output.from_input(plan.dashboard_url)
        self.dashboard_tunnel = pulumi.Output.from_input(plan.dashboard_tunnel)
        self.container_name = self.container.name
        self.register_outputs(
            {
                "gcs_address": self.gcs_address,
                "dashboard_url": self.dashboard_url,
                "container_name": self.container_name,
            }
        )
