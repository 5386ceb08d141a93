"""SyncedImage: one image that implements the model, the same on every node.

Obtained once on the head; checked there to implement the model's architectures BEFORE
anything else happens (so a wrong image is never streamed or started); streamed
node-to-node over the cluster link; each node's copy compared by fingerprint and by its
Python/Ray/vLLM/torch versions. The obtain and stream steps are NodeSteps: a refresh reads
each node's fingerprint back, so an image removed or replaced under the same tag on a node
re-runs that node's stream on the next `up`. Containers run the image by its reference and
wait for `ready_on(node)`, which resolves only when every check passed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

from components.adapters import remote_command
from components.gb10_node import GB10Node
from components.node_step import NodeStep
from sparkvllm.config import StackConfig
from sparkvllm.specs import model, versions
from sparkvllm.specs.commands import image_obtain, image_sync, parse_kv, same_on_every_node


class ModelSupportError(Exception):
    """The image cannot serve the model."""


@dataclass(frozen=True)
class SyncedImageArgs:
    cfg: StackConfig
    nodes: Mapping[str, GB10Node]
    host_keys: Mapping[str, str | None]


class SyncedImage(pulumi.ComponentResource):
    """Outputs: `support` (vLLM version, the model's architectures, where each is
    implemented), `image_ids` (node -> image ID on that node), `fingerprint`
    (storage-independent identity, equal on every node), `versions` (the
    Python/Ray/vLLM/torch versions every node agrees on), `transferred` (node -> whether
    the stream step moved the image there when it last ran)."""

    supported: pulumi.Output[pulumi.Resource]

    def __init__(
        self, name: str, args: SyncedImageArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("sparkvllm:index:SyncedImage", name, None, opts)
        cfg = args.cfg
        head = args.nodes[cfg.head]
        obtain_spec = image_obtain(cfg)
        obtain = NodeStep(
            f"{name}-obtain-{cfg.head}",
            obtain_spec,
            reach=head.reach,
            triggers=[cfg.image.ref, cfg.image.source, cfg.image.tarball or ""],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[head.preflight]),
        )
        self.steps: dict[str, NodeStep] = {cfg.head: obtain}

        check = remote_command(
            model.model_support(cfg),
            connection=head.connection,
            parent=self,
            secrets={},
            depends_on=[obtain],
            triggers=[obtain.generation, cfg.model.id, cfg.model.revision],
            resource_name=f"image-support-{cfg.head}",
        )

        def validated(stdout: str) -> dict[str, Any]:
            problems = model.check_model_support(cfg, stdout)
            if problems:
                raise ModelSupportError("model check failed:\n  - " + "\n  - ".join(problems))
            return model.describe(stdout)

        self.support = check.stdout.apply(validated)
        # Resolves to the check only when the image implements the model: nothing is
        # streamed to another node or started before that.
        self.supported = self.support.apply(lambda _: check)

        for node in cfg.worker_nodes:
            target = args.nodes[node.name]
            self.steps[node.name] = NodeStep(
                f"{name}-sync-{node.name}",
                image_sync(cfg, node, args.host_keys.get(node.name)),
                reach=head.reach,
                read_reach=target.reach,
                triggers=[cfg.image.ref, obtain.generation],
                opts=pulumi.ResourceOptions(
                    parent=self, depends_on=[obtain, target.preflight, self.supported]
                ),
            )

        probes = {
            n: remote_command(
                versions.image_versions(cfg, args.nodes[n].node),
                connection=args.nodes[n].connection,
                parent=self,
                secrets={},
                depends_on=[step],
                triggers=[step.generation],
                resource_name=f"{name}-versions-{n}",
            )
            for n, step in self.steps.items()
        }
        self.versions = pulumi.Output.all(**{n: p.stdout for n, p in probes.items()}).apply(
            lambda out: versions.agreed_versions(cfg, out)
        )
        kv = {n: s.stdout.apply(parse_kv) for n, s in self.steps.items()}
        self.fingerprint = pulumi.Output.all(
            **{n: v.apply(lambda d: d.get("fingerprint", "")) for n, v in kv.items()}
        ).apply(lambda f: same_on_every_node(f, "image differs"))
        self.transferred = pulumi.Output.all(
            **{
                n: v.apply(lambda d: d.get("transferred") == "1")
                for n, v in kv.items()
                if n != cfg.head
            }
        )
        self.image_ids = pulumi.Output.all(
            **{n: v.apply(lambda d: d.get("id", "")) for n, v in kv.items()}
        )
        # Resolve only when the model is supported and fingerprints and versions agree.
        self._checked = pulumi.Output.all(self.supported, self.fingerprint, self.versions).apply(
            lambda _: check
        )
        self.register_outputs(
            {
                "support": self.support,
                "image_ids": self.image_ids,
                "fingerprint": self.fingerprint,
                "versions": self.versions,
                "transferred": self.transferred,
            }
        )

    def ready_on(self, node: str) -> list[pulumi.Input[pulumi.Resource]]:
        """What a container on `node` waits for: the image there, and every check passed
        (an apply that raised blocks it)."""
        return [self.steps[node], self._checked]
