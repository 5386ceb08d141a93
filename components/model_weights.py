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

from components.gb10_node import GB10Node
from components.node_step import NodeStep
from components.synced_image import SyncedImage
from sparkvllm.config import StackConfig
from sparkvllm.specs import model
from sparkvllm.specs.commands import parse_kv, same_on_every_node


@dataclass(frozen=True)
class ModelWeightsArgs:
    cfg: StackConfig
    nodes: Mapping[str, GB10Node]
    image: SyncedImage
    host_keys: Mapping[str, str | None]


class ModelWeights(pulumi.ComponentResource):
    """Output: `manifest` (one hash of the resolved weight files, equal on every node)."""

    complete: list[pulumi.Output[pulumi.Resource]]

    def __init__(
        self, name: str, args: ModelWeightsArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("sparkvllm:index:ModelWeights", name, None, opts)
        cfg = args.cfg
        head = args.nodes[cfg.head]
        each = cfg.model.distribution == "download_on_each_node"
        downloaders = cfg.nodes if each else [cfg.head_node]
        steps: dict[str, NodeStep] = {
            n.name: NodeStep(
                f"{name}-download-{n.name}",
                model.weights_download(cfg, n),
                reach=args.nodes[n.name].reach,
                triggers=[cfg.model.id, cfg.model.revision],
                opts=pulumi.ResourceOptions(
                    parent=self, depends_on=[args.image.supported, args.image.steps[n.name]]
                ),
            )
            for n in downloaders
        }
        if not each:
            for n in cfg.worker_nodes:
                steps[n.name] = NodeStep(
                    f"{name}-sync-{n.name}",
                    model.weights_sync(cfg, n, args.host_keys.get(n.name)),
                    reach=head.reach,
                    read_reach=args.nodes[n.name].reach,
                    triggers=[cfg.model.id, cfg.model.revision, steps[cfg.head].generation],
                    opts=pulumi.ResourceOptions(
                        parent=self, depends_on=[steps[cfg.head], args.nodes[n.name].preflight]
                    ),
                )
        self.steps = steps
        manifests = pulumi.Output.all(
            **{
                n: s.stdout.apply(lambda out: parse_kv(out).get("manifest", ""))
                for n, s in steps.items()
            }
        )
        self.manifest = manifests.apply(lambda m: same_on_every_node(m, "model weights differ"))
        # Resolves to every weight step once the manifests agree: the server waits on it.
        self.complete = [_after(self.manifest, step) for step in steps.values()]
        self.register_outputs({"manifest": self.manifest})


def _after(gate: pulumi.Output[str], step: pulumi.Resource) -> pulumi.Output[pulumi.Resource]:
    """`step`, resolved only once `gate` resolved (an apply that raises blocks it)."""
    return gate.apply(lambda _: step)
