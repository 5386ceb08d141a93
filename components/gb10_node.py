"""GB10Node: one DGX Spark: its SSH connection, a docker provider over ssh://, and its
preflight facts (validated: a mismatch fails naming the node and the fact)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from components.adapters import gated
from components.node_step import NodeStep
from sparkvllm.specs.plans import NodePlan
from sparkvllm.specs.weights import preflight_bytes


@dataclass(frozen=True)
class GB10NodeArgs:
    plan: NodePlan
    private_key: pulumi.Output[str]


class GB10Node(pulumi.ComponentResource):
    """A node. Outputs: `facts` (validated dict), `provider` (docker over ssh),
    `connection` (for remote commands, secret), `reach` (for NodeSteps), `checked` (the
    facts command, resolved only once the facts passed: depend on it to run after a good
    preflight)."""

    facts: pulumi.Output[dict[str, object]]
    checked: pulumi.Output[pulumi.Resource]

    def __init__(self, name: str, args: GB10NodeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(NodePlan.TYPE, name, None, opts)
        plan = args.plan
        reach = plan.reach
        conn = reach.connection()
        proxy = conn.get("proxy")
        self.connection = command.remote.ConnectionArgs(
            host=conn["host"],
            port=float(conn["port"]),
            user=conn["user"],
            private_key=args.private_key,
            host_key=conn["hostKey"],
            dial_error_limit=5,
            per_dial_timeout=15,
            # pulumi-command dials the jump host, then the node from it (the node's key).
            proxy=command.remote.ProxyConnectionArgs(
                host=proxy["host"], port=float(proxy["port"]), user=proxy["user"],
                private_key=args.private_key, host_key=proxy["hostKey"],
                dial_error_limit=5, per_dial_timeout=15,
            )
            if proxy is not None
            else None,
        )  # fmt: skip
        # How the node's read-back steps reach it from the workstation (no secret inside).
        self.reach = reach
        self.provider = docker.Provider(
            f"{name}-docker",
            host=plan.docker_host,
            ssh_opts=list(plan.docker_ssh_opts),
            opts=pulumi.ResourceOptions(parent=self),
        )
        # The preflight: each step judged in its own create (a failed one records nothing,
        # so the next `up` checks again); links after the facts (the netdev is there).
        mine = pulumi.ResourceOptions(parent=self)
        facts_step = NodeStep(plan.facts, reach=self.reach, check=plan.facts_check, opts=mine)
        links_step = NodeStep(
            plan.links, reach=self.reach, check=plan.links_check,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[facts_step]),
        )  # fmt: skip
        hub_step = {
            label: NodeStep(hub, reach=self.reach, stdin_file=plan.token_file, opts=mine)
            for label, hub in plan.hubs.items()
        }

        def validated(outs: list[str]) -> dict[str, object]:
            facts, warnings = plan.verdict(outs[0], outs[1])
            for w in warnings:
                pulumi.log.warn(w, resource=self)
            return facts

        self.facts = pulumi.Output.all(
            facts_step.stdout, links_step.stdout, *(s.stdout for s in hub_step.values())
        ).apply(validated)
        # model label -> its weights' size as this node's preflight found it (0: not known).
        sizes = {label: s.stdout.apply(preflight_bytes) for label, s in hub_step.items()}
        self.weights_bytes: pulumi.Output[dict[str, int]] = (
            pulumi.Output.all(**sizes) if sizes else pulumi.Output.from_input({})
        )
        self.checked = gated(self.facts, facts_step)
        self.register_outputs({"facts": self.facts})

    def hold_until(self, check: pulumi.Output[Any]) -> None:
        """Everything that waits on this node's preflight (`checked`) waits on `check` too:
        a verdict over every node's facts (the stack's memory plan). Call it before any
        part that depends on the node is registered."""
        self.checked = pulumi.Output.all(check, self.checked).apply(lambda done: done[1])
