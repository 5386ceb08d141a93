"""SyncedImage: one image that implements the model, the same on every node.

Obtained once on the head; checked there to implement the model's architectures BEFORE
anything else happens (so a wrong image is never streamed or started); streamed
node-to-node over the cluster link; then each node's copy is read back (a RemoteImage,
which lets refresh notice a node whose image vanished) and its Python/Ray/vLLM/torch
versions compared across nodes. Containers get the image through `image_on(node)`, which
resolves only when every check passed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_docker as docker

from components.adapters import remote_command
from components.gb10_node import GB10Node
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
    private_key: pulumi.Output[str]


class SyncedImage(pulumi.ComponentResource):
    """Outputs: `support` (vLLM version, the model's architectures, where each is
    implemented), `image_ids` (node -> image ID read back by docker on that node),
    `fingerprint` (storage-independent identity, equal on every node), `versions` (the
    Python/Ray/vLLM/torch versions every node agrees on), `transferred` (node -> whether
    this run streamed the image there)."""

    image_ids: pulumi.Output[dict[str, str]]
    supported: pulumi.Output[pulumi.Resource]

    def __init__(
        self,
        name: str,
        args: SyncedImageArgs,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("sparkvllm:index:SyncedImage", name, None, opts)
        cfg = args.cfg
        head = args.nodes[cfg.head]
        obtain = remote_command(
            image_obtain(cfg),
            connection=head.connection,
            parent=self,
            secrets={},
            depends_on=[head.preflight],
            triggers=[cfg.image.ref, cfg.image.source, cfg.image.tarball or ""],
            resource_name=f"{name}-obtain-{cfg.head}",
        )
        steps = {cfg.head: obtain}
        self.remote_images = {cfg.head: self._remote_image(name, cfg, args.nodes[cfg.head], obtain)}

        check = remote_command(
            model.model_support(cfg),
            connection=head.connection,
            parent=self,
            secrets={},
            depends_on=[self.remote_images[cfg.head]],
            triggers=[obtain.stdout, cfg.model.id, cfg.model.revision],
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
            steps[node.name] = remote_command(
                image_sync(cfg, node, args.host_keys.get(node.name)),
                connection=head.connection,
                parent=self,
                secrets={"ssh_private_key": args.private_key},
                depends_on=[obtain, args.nodes[node.name].preflight, self.supported],
                triggers=[cfg.image.ref, obtain.stdout],
                resource_name=f"{name}-sync-{node.name}",
            )
            self.remote_images[node.name] = self._remote_image(
                name, cfg, args.nodes[node.name], steps[node.name]
            )

        probes = {
            n: remote_command(
                versions.image_versions(cfg, args.nodes[n].node),
                connection=args.nodes[n].connection,
                parent=self,
                secrets={},
                depends_on=[img],
                triggers=[img.image_id],
                resource_name=f"{name}-versions-{n}",
            )
            for n, img in self.remote_images.items()
        }
        self.versions = pulumi.Output.all(**{n: p.stdout for n, p in probes.items()}).apply(
            lambda out: versions.agreed_versions(cfg, out)
        )
        fingerprints = pulumi.Output.all(
            **{
                n: s.stdout.apply(lambda out: parse_kv(out).get("fingerprint", ""))
                for n, s in steps.items()
            }
        )
        self.fingerprint = fingerprints.apply(lambda f: same_on_every_node(f, "image differs"))
        self.transferred = pulumi.Output.all(
            **{
                n: s.stdout.apply(lambda out: parse_kv(out).get("transferred") == "1")
                for n, s in steps.items()
                if n != cfg.head
            }
        )
        self.image_ids = pulumi.Output.all(
            **{n: img.image_id for n, img in self.remote_images.items()}
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

    def _remote_image(
        self, name: str, cfg: StackConfig, node: GB10Node, step: pulumi.Resource
    ) -> docker.RemoteImage:
        # It finds the image already loaded, so it never pulls; refresh drops it from
        # state when the image is gone from that node (a drift signal).
        return docker.RemoteImage(
            f"{name}-{node.node.name}",
            name=cfg.image.ref,
            keep_locally=not cfg.image.remove_on_destroy,
            opts=pulumi.ResourceOptions(parent=self, provider=node.provider, depends_on=[step]),
        )

    def image_on(self, node: str) -> pulumi.Output[str]:
        """The image ID to run on `node`: known once the image is there, and resolved only
        when the model is supported, the fingerprints and the versions agree."""
        return pulumi.Output.all(
            self.remote_images[node].image_id, self.supported, self.fingerprint, self.versions
        ).apply(lambda values: str(values[0]))
