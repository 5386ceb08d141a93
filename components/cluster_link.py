"""ClusterLinks: what the cluster link carries, measured from the head to each worker in the
preflight (sparkvllm/specs/link_checks.py), one worker after another, before any transfer
uses the link. A slow path is a warning naming it, its rate, the rate expected and the
likely cause with its fix; the figures are the stack's `links` output (the probe drift
check compares the link with them later). The measurements are checks: never read back,
so a refresh moves no payload; they run again only when what they do changes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

from components.adapters import gated
from components.gb10_node import GB10Node
from components.node_step import NodeStep
from sparkvllm.specs.plans import LinksPlan


@dataclass(frozen=True)
class ClusterLinksArgs:
    plan: LinksPlan
    nodes: Mapping[str, GB10Node]


class ClusterLinks(pulumi.ComponentResource):
    """Outputs: `rates` (worker -> figures: the stack's `links` output), `measured` (resolves
    once every measurement ran: depend on it to keep a transfer off the link meanwhile)."""

    rates: pulumi.Output[dict[str, Any]]
    measured: pulumi.Output[Any]

    def __init__(
        self, name: str, args: ClusterLinksArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(LinksPlan.TYPE, name, None, opts)
        plan = args.plan
        head = args.nodes[plan.head]
        steps: dict[str, NodeStep] = {}
        previous: list[pulumi.Input[pulumi.Resource]] = []
        for worker, spec in plan.steps.items():
            target = args.nodes[worker]
            step = NodeStep(
                spec,
                reach=head.reach,
                read_reach=target.reach,  # its stdin: the worker's key
                opts=pulumi.ResourceOptions(
                    parent=self, depends_on=[*previous, head.checked, target.checked]
                ),
            )
            steps[worker] = step
            previous = [step]
        facts = {n: node.facts for n, node in args.nodes.items()}

        def judged(outs: list[Any]) -> dict[str, Any]:
            stdouts = dict(zip(steps, outs[1:], strict=True))
            rates, warnings = plan.verdict(stdouts, outs[0])
            for w in warnings:
                pulumi.log.warn(w, resource=self)
            return rates

        self.rates = pulumi.Output.all(facts, *(s.stdout for s in steps.values())).apply(judged)
        self.measured = (
            gated(self.rates, previous[0]) if previous else pulumi.Output.from_input(head.checked)
        )
        self.register_outputs({"rates": self.rates})
