"""ModelWeights: the weights on every node, downloaded once on the head (after the image
was found to implement the model) and copied over the cluster link, or downloaded by each
node; complete (no file of the snapshot or its weight index missing) and verified by the
manifest of the resolved files."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pulumi

from components.adapters import remote_command
from components.gb10_node import GB10Node
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
    private_key: pulumi.Output[str]


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
        steps = {
            n.name: remote_command(
                model.weights_download(cfg, n),
                connection=args.nodes[n.name].connection,
                parent=self,
                secrets={},
                depends_on=[args.image.supported, args.image.remote_images[n.name]],
                triggers=[cfg.model.id, cfg.model.revision],
                resource_name=f"{name}-download-{n.name}",
            )
            for n in downloaders
        }
        if not each:
            for n in cfg.worker_nodes:
                steps[n.name] = remote_command(
                    model.weights_sync(cfg, n, args.host_keys.get(n.name)),
                    connection=head.connection,
                    parent=self,
                    secrets={"ssh_private_key": args.private_key},
                    depends_on=[steps[cfg.head], args.nodes[n.name].preflight],
                    triggers=[cfg.model.id, cfg.model.revision, steps[cfg.head].stdout],
                    resource_name=f"{name}-sync-{n.name}",
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
