"""SparkVllmCluster: the whole deployment as one component, for this project's program and
for any other Python Pulumi program that imports it.

    import pulumi
    from components.cluster import SparkVllmCluster, SparkVllmClusterArgs
    from sparkvllm.config import load_stack_config

    cfg = load_stack_config({"nodes": [...], "head": "spark-1", ...})  # typed, validated
    llm = SparkVllmCluster("llm", SparkVllmClusterArgs(config=cfg))
    pulumi.export("endpoint", llm.endpoint)

Its outputs are the stack outputs of this project (docs/outputs.md is their contract). One
cluster per stack: its parts are named after the nodes and the model, not after the
cluster, so they keep the names (and URNs, by aliases) they had before this component
existed; a second cluster in the same stack is refused by the engine as a duplicate URN.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi

from components.deployment import deploy
from sparkvllm.config import StackConfig
from sparkvllm.specs.plans import CLUSTER_TYPE
from sparkvllm.workstation import SshAccess, prepare_ssh_access


@dataclass(frozen=True)
class SparkVllmClusterArgs:
    """`config`: a validated StackConfig (sparkvllm.config.load_stack_config turns a dict
    into one, naming every bad field). `project_dir`: where relative key-file paths of the
    config are read from (default: the working directory). `stack`: the name containers
    and the workstation's key directory carry (default: the Pulumi stack's; the directory
    is also named by the Pulumi project). `access`: how to reach the nodes, when the caller
    prepared it (sparkvllm.workstation.prepare_ssh_access); by default the component
    prepares it."""

    config: StackConfig
    project_dir: Path | None = None
    stack: str | None = None
    access: SshAccess | None = None


class SparkVllmCluster(pulumi.ComponentResource):
    """Outputs: endpoint, served_model, health, launcher, ray_dashboard,
    ray_dashboard_tunnel, ray_gcs_address, image, model, nodes, links, nccl, ray_client
    (see docs/outputs.md); all of them also in `outputs`, a dict."""

    TYPE = CLUSTER_TYPE

    endpoint: pulumi.Output[str]
    health: pulumi.Output[dict[str, Any]]

    def __init__(
        self, name: str, args: SparkVllmClusterArgs, opts: pulumi.ResourceOptions | None = None
    ):
        stack = args.stack or pulumi.get_stack()
        # Key files are read (and a bad one refused) before anything is registered.
        access = args.access or prepare_ssh_access(
            args.config, stack, args.project_dir or Path.cwd(), pulumi.get_project()
        )
        super().__init__(self.TYPE, name, None, opts)
        self.outputs: dict[str, Any] = deploy(args.config, stack, access, parent=self)
        for key, value in self.outputs.items():
            setattr(self, key, value)
        self.register_outputs(self.outputs)
