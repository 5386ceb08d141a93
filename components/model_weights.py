"""ModelWeights: the weights on every node, downloaded once on the head (after the image
was found to implement the model) and copied over the cluster link, or downloaded by each
node; complete (no file of the snapshot or its weight index missing) and verified by the
manifest of the resolved files. Each step is a NodeStep: a refresh reads every node's
manifest back, so weights deleted or truncated on a node are copied again by the next
`up` (and only there)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pulumi

from components.adapters import gated, remote_command
from components.gb10_node import GB10Node
from components.node_step import NodeStep
from components.synced_image import SyncedImage
from sparkvllm.specs.output import key_values, same_on_every_node
from sparkvllm.specs.plans import WeightsPlan


@dataclass(frozen=True)
class ModelWeightsArgs:
    plan: WeightsPlan
    nodes: Mapping[str, GB10Node]
    image: SyncedImage


class ModelWeights(pulumi.ComponentResource):
    """Output: `manifest` (one hash of the resolved weight files, equal on every node).
    `checked`: every weight step, each resolved once the manifests agree."""

    checked: list[pulumi.Output[pulumi.Resource]]

    def __init__(
        self, name: str, args: ModelWeightsArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(WeightsPlan.TYPE, name, None, opts)
        plan = args.plan
        # The model's own image check (a named model), once the image is on its rank 0;
        # the model without a name was checked by the image itself.
        self.support = args.image.support
        checked = args.image.model_checked
        if plan.support is not None and plan.support_verdict is not None:
            check = remote_command(
                plan.support,
                connection=args.nodes[plan.head].connection,
                parent=self,
                secrets={},
                depends_on=[args.image.steps[plan.head]],
                triggers=[args.image.obtained.generation, *plan.triggers],
            )
            self.support = check.stdout.apply(plan.support_verdict)
            checked = gated(self.support, check)
        steps: dict[str, NodeStep] = {
            n: NodeStep(
                spec,
                reach=args.nodes[n].reach,
                triggers=list(plan.triggers),
                stdin_file=plan.token_file,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[checked, args.image.steps[n]]),
            )
            for n, spec in plan.downloads.items()
        }
        for n, spec in plan.copies.items():
            steps[n] = NodeStep(
                spec,
                reach=args.nodes[plan.head].reach,
                read_reach=args.nodes[n].reach,
                triggers=[*plan.triggers, steps[plan.head].generation],
                opts=pulumi.ResourceOptions(
                    parent=self, depends_on=[steps[plan.head], args.nodes[n].checked]
                ),
            )
        self.steps = steps
        manifests = pulumi.Output.all(
            **{
                n: s.stdout.apply(lambda out: key_values(out).get("manifest", ""))
                for n, s in steps.items()
            }
        )
        self.manifest = manifests.apply(lambda m: same_on_every_node(m, "model weights differ"))
        # The weights' size as the first node's download found them (0: not said).
        self.size: pulumi.Output[int] = steps[plan.head].stdout.apply(_size)
        self.head_step = steps[plan.head]
        # The server waits on every step, each resolved once the manifests agree.
        self.checked = [gated(self.manifest, step) for step in steps.values()]
        named = {"support": self.support} if plan.support is not None else {}
        self.register_outputs({"manifest": self.manifest, **named})


def _size(stdout: str) -> int:
    said = key_values(stdout).get("bytes", "")
    return int(said) if said.isdigit() else 0
