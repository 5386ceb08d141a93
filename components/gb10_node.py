"""GB10Node: one DGX Spark: its SSH connection, a docker provider over ssh://, and its
preflight facts (validated: a mismatch fails naming the node and the fact)."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from components.adapters import remote_command
from components.node_step import Reach
from sparkvllm.config import NodeConfig, StackConfig
from sparkvllm.specs.commands import CommandSpec
from sparkvllm.specs.facts import (
    PreflightError,
    check_facts,
    check_links,
    facts_command,
    links_command,
    parse_facts,
    warnings_for,
)
from sparkvllm.specs.ssh import docker_host, docker_ssh_opts
from sparkvllm.workstation import SshAccess


@dataclass(frozen=True)
class GB10NodeArgs:
    cfg: StackConfig
    node: NodeConfig
    access: SshAccess
    private_key: pulumi.Output[str]


class GB10Node(pulumi.ComponentResource):
    """A node. Outputs: `facts` (validated dict), `provider` (docker over ssh),
    `connection` (for remote commands, secret), `reach` (for NodeSteps), `preflight` (the
    facts command, resolved only once the facts passed: depend on it to run after a good
    preflight)."""

    facts: pulumi.Output[dict[str, object]]
    preflight: pulumi.Output[pulumi.Resource]

    def __init__(self, name: str, args: GB10NodeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("sparkvllm:index:GB10Node", name, None, opts)
        node = args.node
        self.node = node
        self.connection = command.remote.ConnectionArgs(
            host=node.ssh.host,
            port=float(node.ssh.port),
            user=node.ssh.user,
            private_key=args.private_key,
            host_key=args.access.host_keys.get(node.name),
            dial_error_limit=5,
            per_dial_timeout=15,
        )
        access = args.access
        # How the node's read-back steps reach it from the workstation (no secret inside).
        self.reach = Reach(
            host=node.ssh.host,
            port=node.ssh.port,
            user=node.ssh.user,
            host_key=access.host_keys.get(node.name),
            identity_file=access.identity_ref,
        )
        self.provider = docker.Provider(
            f"{name}-docker",
            host=docker_host(node),
            ssh_opts=docker_ssh_opts(
                node,
                access.identity_ref,
                access.node_known_hosts_ref(node.name),
                access.control_dir_ref,
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        facts_cmd = remote_command(
            CommandSpec(
                name="facts",
                node=node.name,
                create=facts_command(args.cfg, node),
                timeout_s=120,
            ),
            connection=self.connection,
            parent=self,
            secrets={},
            resource_name=f"{name}-facts",
        )
        cfg = args.cfg
        links_cmd = remote_command(
            CommandSpec(
                name="links", node=node.name, create=links_command(cfg, node), timeout_s=120
            ),
            connection=self.connection,
            parent=self,
            secrets={},
            resource_name=f"{name}-links",
        )

        def validated(outs: list[str]) -> dict[str, object]:
            facts = parse_facts(outs[0])
            problems = check_facts(cfg, node, facts)
            link_problems, link_warnings = (
                check_links(cfg, node, outs[1]) if facts.netdev_present else ([], [])
            )
            problems += link_problems
            if problems:
                raise PreflightError("preflight failed:\n  - " + "\n  - ".join(problems))
            for w in warnings_for(node, facts) + link_warnings:
                pulumi.log.warn(w, resource=self)
            return facts.as_output()

        self.facts = pulumi.Output.all(facts_cmd.stdout, links_cmd.stdout).apply(validated)
        self.preflight = self.facts.apply(lambda _: facts_cmd)
        self.register_outputs({"facts": self.facts})
