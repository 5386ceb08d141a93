"""The graph: GB10Node xN -> SyncedImage -> RayHead -> RayWorker x(N-1) -> ModelServer.

`deploy` registers every resource of a validated config and returns the stack outputs
(a function, so tests under Pulumi's mocks can inspect them)."""

from __future__ import annotations

from typing import Any

import pulumi

from components.gb10_node import GB10Node, GB10NodeArgs
from components.model_server import ModelServer, ModelServerArgs
from components.model_weights import ModelWeights, ModelWeightsArgs
from components.ray_head import RayHead, RayHeadArgs
from components.ray_worker import RayWorker, RayWorkerArgs
from components.synced_image import SyncedImage, SyncedImageArgs
from sparkvllm.config import StackConfig
from sparkvllm.specs import containers, versions
from sparkvllm.workstation import SshAccess, workstation_versions


def deploy(cfg: StackConfig, stack: str, access: SshAccess) -> dict[str, Any]:
    for warning in containers.exposure_warnings(cfg):
        pulumi.log.warn(warning)
    private_key = pulumi.Output.secret(access.private_key)
    api_key = (
        pulumi.Output.secret(cfg.api_key.get_secret_value()) if cfg.api_key is not None else None
    )
    nodes = {
        n.name: GB10Node(
            n.name,
            GB10NodeArgs(cfg=cfg, node=n, access=access, private_key=private_key),
        )
        for n in cfg.nodes
    }
    image = SyncedImage(
        "image",
        SyncedImageArgs(cfg=cfg, nodes=nodes, host_keys=access.host_keys),
    )
    weights = ModelWeights(
        "model",
        ModelWeightsArgs(cfg=cfg, nodes=nodes, image=image, host_keys=access.host_keys),
    )
    head = RayHead(
        "ray-head",
        RayHeadArgs(cfg=cfg, stack=stack, node=nodes[cfg.head], image=image),
    )
    workers = [
        RayWorker(
            f"ray-worker-{n.name}",
            RayWorkerArgs(
                cfg=cfg,
                stack=stack,
                node_config=n,
                node=nodes[n.name],
                image=image,
                head=head,
            ),
        )
        for n in cfg.worker_nodes
    ]
    server = ModelServer(
        "model-server",
        ModelServerArgs(
            cfg=cfg,
            stack=stack,
            node=nodes[cfg.head],
            image=image,
            head=head,
            workers=workers,
            weights=weights,
            nodes=nodes,
            api_key=api_key,
        ),
    )
    return {
        "endpoint": server.endpoint,
        "health": server.health,
        "served_model": cfg.model.name_for_clients,
        "ray_dashboard": head.dashboard_url,
        "ray_dashboard_tunnel": head.dashboard_tunnel,
        "ray_gcs_address": head.gcs_address,
        "image": {
            "ref": cfg.image.ref,
            "fingerprint": image.fingerprint,
            "ids": image.image_ids,
            "versions": image.versions,
        },
        "model": {
            "id": cfg.model.id,
            "revision": cfg.model.revision,
            "support": image.support,
            "weights_manifest": weights.manifest,
        },
        "nodes": {name: node.facts for name, node in nodes.items()},
        "ray_client": image.versions.apply(_ray_client),
    }


def _ray_client(cluster: dict[str, str]) -> dict[str, object]:
    """Could a Ray Client on this workstation attach? Warned about, never required."""
    here = workstation_versions()
    problem = versions.ray_client_compatibility(cluster, here)
    if problem and here.get("ray"):
        pulumi.log.warn(problem)
    return {"compatible": not problem, "workstation": here, "detail": problem}
