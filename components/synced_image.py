"""SyncedImage: the same image on every node, obtained once on the head and streamed
node-to-node over the cluster link; a per-node RemoteImage lets refresh notice a node
whose image vanished."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_docker as docker

from components.adapters import remote_command
from components.gb10_node import GB10Node
from sparkvllm.config import StackConfig
from sparkvllm.specs.commands import image_obtain, image_sync, parse_kv, same_on_every_node


@dataclass(frozen=True)
class SyncedImageArgs:
    cfg: StackConfig
    nodes: Mapping[str, GB10Node]
    host_keys: Mapping[str, str | None]
    private_key: pulumi.Output[str]


class SyncedImage(pulumi.ComponentResource):
    """Outputs: `image_ids` (node -> image ID read back by docker on that node),
    `fingerprint` (storage-independent identity, equal on every node), `transferred`
    (node -> whether this run streamed the image there)."""

    image_ids: pulumi.Output[dict[str, str]]

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
        for node in cfg.worker_nodes:
            steps[node.name] = remote_command(
                image_sync(cfg, node, args.host_keys.get(node.name)),
                connection=head.connection,
                parent=self,
                secrets={"ssh_private_key": args.private_key},
                depends_on=[obtain, args.nodes[node.name].preflight],
                triggers=[cfg.image.ref, obtain.stdout],
                resource_name=f"{name}-sync-{node.name}",
            )
        # The RemoteImage finds the image already loaded, so it never pulls; refresh
        # drops it from state when the image is gone from that node (a drift signal).
        self.remote_images = {
            n: docker.RemoteImage(
                f"{name}-{n}",
                name=cfg.image.ref,
                keep_locally=not cfg.image.remove_on_destroy,
                opts=pulumi.ResourceOptions(
                    parent=self, provider=args.nodes[n].provider, depends_on=[step]
                ),
            )
            for n, step in steps.items()
        }
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
                "image_ids": self.image_ids,
                "fingerprint": self.fingerprint,
                "transferred": self.transferred,
            }
        )

    def image_on(self, node: str) -> pulumi.Output[str]:
        """The image ID to run on `node`: only known once the image is there."""
        return self.remote_images[node].image_id
