"""Router: one OpenAI endpoint for every model of the stack (config `router`): LiteLLM's
proxy in a container on the head, its image obtained there (a NodeStep, read back like the
vLLM image's), and a wait until it lists every served name. A change of the set of models
changes its config, so it is replaced (a short gap through the router; each model's own
endpoint keeps serving)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pulumi

from components.adapters import container, remote_command
from components.gb10_node import GB10Node
from components.node_step import NodeStep
from sparkvllm.specs.plans import RouterPlan


@dataclass(frozen=True)
class RouterArgs:
    plan: RouterPlan
    nodes: Mapping[str, GB10Node]
    api_key: pulumi.Output[str] | None


class Router(pulumi.ComponentResource):
    """Outputs: `endpoint` (the router's OpenAI base URL), `models` (what it lists)."""

    def __init__(self, name: str, args: RouterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(RouterPlan.TYPE, name, None, opts)
        plan = args.plan
        head = args.nodes[plan.head]
        obtain = NodeStep(
            plan.obtain,
            reach=head.reach,
            triggers=list(plan.obtain_triggers),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[head.checked]),
        )
        key = args.api_key
        self.container = container(
            plan.container,
            image=plan.ref,
            provider=head.provider,
            parent=self,
            depends_on=[obtain],
            secret_env={"LITELLM_MASTER_KEY": key, "VLLM_API_KEY": key} if key else None,
        )
        ready = remote_command(
            plan.ready,
            connection=head.connection,
            parent=self,
            secrets={},
            depends_on=[self.container],
            triggers=[self.container.id],
        )
        self.endpoint = pulumi.Output.from_input(plan.endpoint)
        self.models = ready.stdout
        self.register_outputs({"endpoint": self.endpoint})
