"""The graph: GB10Node xN -> SyncedImage -> ModelWeights -> the ranks -> outputs, where the
ranks are RayHead -> RayWorker x(N-1) -> ModelServer (launcher ray), or ModelServer (rank
0) -> VllmRank x(N-1) (launcher native: vLLM's own multi-node launcher, no Ray).

`deploy` builds each component's plan from a validated config (sparkvllm/specs/plans.py),
registers the components on them, and returns the stack outputs (a function, so tests
under Pulumi's mocks can inspect them).

`parallelism.launcher: auto` is decided from the Ray the image holds, read on the head
(SyncedImage.head_ray, re-read only for a new image: a new ref that names the image the
stack runs, a pin of its digest, keeps what was read): the serving part is registered once
that reading is known. A preview that cannot know it yet (a new stack or a new image)
shows native and warns, naming the ref, that `up` decides from the Ray the image holds;
an explicit launcher is always previewed exactly."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import pulumi

from components.adapters import gated
from components.cluster_link import ClusterLinks, ClusterLinksArgs
from components.gb10_node import GB10Node, GB10NodeArgs
from components.model_server import ModelServer, ModelServerArgs
from components.model_weights import ModelWeights, ModelWeightsArgs
from components.ray_head import RayHead, RayHeadArgs
from components.ray_worker import RayWorker, RayWorkerArgs
from components.router import Router, RouterArgs
from components.synced_image import SyncedImage, SyncedImageArgs
from sparkvllm.config import StackConfig
from sparkvllm.config.stack import model_label
from sparkvllm.specs import containers, plans, scrape, versions
from sparkvllm.specs.memory import as_output as memory_output
from sparkvllm.specs.memory import check_plan
from sparkvllm.specs.output import last_json
from sparkvllm.workstation import SshAccess, workstation_versions


def deploy(
    cfg: StackConfig, stack: str, access: SshAccess, parent: pulumi.Resource | None = None
) -> dict[str, Any]:
    """Register the deployment (under `parent`, a SparkVllmCluster, when given) and return
    its outputs."""
    # Each part keeps the URN it had as a top-level resource (before the cluster component
    # existed): an alias to "no parent"; their children inherit it (the engine's
    # inheritedChildAlias), so an existing stack changes nothing.
    top = pulumi.ResourceOptions(parent=parent, aliases=[pulumi.Alias(parent=None)])
    for warning in plans.warnings(cfg):
        pulumi.log.warn(warning)
    api_key = (
        pulumi.Output.secret(cfg.api_key.get_secret_value()) if cfg.api_key is not None else None
    )
    nodes = {}
    for n in cfg.nodes:
        node_plan = plans.node(
            cfg,
            n,
            reach=access.reaches[n.name],
            known_hosts_ref=access.node_known_hosts_ref(n.name),
            control_dir_ref=access.control_dir_ref,
            token_file=access.hf_token_ref,
        )
        key = pulumi.Output.secret(access.key_of(n.name))  # the node's own, else the stack's
        nodes[n.name] = GB10Node(node_plan.name, GB10NodeArgs(node_plan, key), top)
    # The memory plan, checked before anything is touched: every node's memory (its facts)
    # against the models placed on it, their weights' sizes as the heads' preflight found
    # them (the hub's file listing, or the snapshot already there). Over budget, nothing
    # after the preflight runs (links, image, weights, containers): one line per node and
    # model. A size not known yet (an offline model not complete on its head) is checked
    # once its download found it, before its server starts (`_fits` below).
    totals = {n: node.facts.apply(_total_gib) for n, node in nodes.items()}
    found = pulumi.Output.all(*(node.weights_bytes for node in nodes.values())).apply(_merged)
    planned = pulumi.Output.all(totals, found).apply(lambda f: check_plan(cfg, *f))
    for node in nodes.values():
        node.hold_until(planned)
    links_plan = plans.links(cfg, access.host_keys)
    links = ClusterLinks(links_plan.name, ClusterLinksArgs(links_plan, nodes), top)
    image_plan = plans.image(cfg, access.host_keys)
    image = SyncedImage(image_plan.name, SyncedImageArgs(image_plan, nodes, links.measured), top)

    # Each model as its parts see it (a one-model view), by its label.
    views = {model_label(m): cfg.for_model(m) for m in cfg.served}
    weights = {}
    for label, view in views.items():
        weights_plan = plans.model_weights(view, access.host_keys, access.hf_token_ref)
        weights[label] = ModelWeights(
            weights_plan.name, ModelWeightsArgs(weights_plan, nodes, image), top
        )
    # The memory plan: each model's budget, weights and KV cache on each of its nodes, from
    # the nodes' facts and the weights' sizes; no server starts while a model's weights
    # leave it no room (sparkvllm/specs/memory.py).
    memory = pulumi.Output.all(totals, {label: w.size for label, w in weights.items()}).apply(
        lambda figures: memory_output(cfg, *figures)
    )

    # Each model's serving part, in the config's order: a model's server starts once the
    # servers of the earlier models that share a node with it answer (one start-up
    # profiling at a time on a node).
    served: dict[str, dict[str, Any]] = {}
    started: dict[str, list[pulumi.Resource | pulumi.Output[Any]]] = {n.name: [] for n in cfg.nodes}
    several = len(cfg.served) > 1
    shared = _Shared(stack, nodes, image, api_key, top)
    for (label, view), m in zip(views.items(), cfg.served, strict=True):
        own = weights[label]
        fits = pulumi.Output.all(totals, own.size).apply(partial(_fits, cfg, label))
        after: list[pulumi.Resource | pulumi.Output[Any]] = [gated(fits, own.head_step)]
        after += [ready for n in view.nodes for ready in started[n.name]]
        serving = _model(view, several, shared, own, after)
        for n in view.nodes:
            started[n.name].append(serving["ready"])
        served[label] = {
            **serving,
            "model": {
                "id": m.id,
                "revision": m.revision,
                "support": own.support,
                "weights_manifest": own.manifest,
            },
        }
    first = next(iter(served.values()))
    # Ray's outputs are its model's (one at most; `launcher.name` says which ran).
    ray = next((s for s in served.values() if s["ray_gcs_address"] != ""), first)
    outputs = {
        **{k: first[k] for k in ("endpoint", "health")},
        "served_model": cfg.served[0].name_for_clients,
        **{k: ray[k] for k in ("ray_dashboard", "ray_dashboard_tunnel", "ray_gcs_address")},
        "launcher": first["launcher"],
        "image": {
            "ref": cfg.image.ref,
            "fingerprint": image.fingerprint,
            "ids": image.image_ids,
            "versions": image.versions,
        },
        "model": first["model"],
        "nodes": {name: node.facts for name, node in nodes.items()},
        "links": links.rates,
        "nccl": pulumi.Output.all(
            image.versions, {n: node.facts for n, node in nodes.items()}, first["health"]
        ).apply(lambda v: _nccl(cfg.nccl.library, *v)),
        "ray_client": image.versions.apply(_ray_client),
        "memory": memory,
        # Every model server's /metrics, for the user's own Prometheus (sparkvllm/metrics.py
        # writes its scrape config and a Grafana dashboard).
        "metrics": {"targets": [t.as_output() for t in scrape.targets(cfg)]},
    }
    router_plan = plans.router(cfg, stack)
    if router_plan is not None:
        router = Router(router_plan.name, RouterArgs(router_plan, nodes, api_key), top)
        outputs["endpoint"] = router.endpoint
        outputs["router"] = {"endpoint": router.endpoint, "ready": router.models.apply(_listed)}
    if not cfg.single_form:
        outputs["models"] = {
            label: {
                "served_name": m.name_for_clients,
                **{k: s[k] for k in ("endpoint", "health", "launcher", "model")},
            }
            for (label, s), m in zip(served.items(), cfg.served, strict=True)
        }
    return outputs


@dataclass(frozen=True)
class _Shared:
    """What every model's serving part builds on."""

    stack: str
    nodes: dict[str, GB10Node]
    image: SyncedImage
    api_key: pulumi.Output[str] | None
    top: pulumi.ResourceOptions


def _model(
    view: StackConfig,
    several: bool,
    shared: _Shared,
    weights: ModelWeights,
    after: list[pulumi.Resource | pulumi.Output[Any]],
) -> dict[str, Any]:
    """Register the serving part of the model `view` serves (a one-model view) on the
    launcher its config names, or (auto) the one the image's Ray decides."""

    def serve(launcher: str, why: str) -> dict[str, Any]:
        return _serve(view, launcher, why, shared, weights, after)

    if view.parallelism.launcher != "auto" or several:
        return serve(*plans.launcher(view, several=several))

    def decide(ray: str | None) -> dict[str, Any]:
        known = ray if isinstance(ray, str) else None
        chosen, why = plans.launcher(view, known)
        if known is None:
            pulumi.log.warn(f"launcher: {chosen} assumed ({why})")
        return serve(chosen, why)

    # Run with unknowns too: a preview that cannot know the image's Ray yet still shows a
    # serving part (and says which it assumed), rather than none.
    decided = shared.image.head_ray.apply(decide, run_with_unknowns=True)
    return {k: decided.apply(partial(_pick, k)) for k in _SERVING}


def _listed(stdout: str) -> dict[str, Any]:
    """What the router's readiness probe saw (probes/router_models.py)."""
    return last_json(stdout)


def _fits(cfg: StackConfig, label: str, figures: list[Any]) -> bool:
    """Whether model `label`'s weights leave it room on its nodes (else MemoryPlanError)."""
    return check_plan(cfg, figures[0], {label: figures[1]})


def _merged(sizes: list[dict[str, int]]) -> dict[str, int]:
    return {label: size for found in sizes for label, size in found.items()}


def _total_gib(facts: dict[str, object]) -> float:
    total = facts.get("mem_total_gib")
    return float(total) if isinstance(total, (int, float)) else 0.0


def _nccl(
    wanted: str,
    agreed: dict[str, str],
    facts: dict[str, dict[str, object]],
    health: dict[str, object],
) -> dict[str, Any]:
    hosts = {n: str(f.get("nccl_host") or "") for n, f in facts.items()}
    loaded = health.get("nccl_loaded")
    report = versions.nccl_report(
        agreed.get("nccl", ""),
        hosts,
        str(health.get("nccl_transport", "unknown")),
        [str(p) for p in loaded] if isinstance(loaded, list) else [],
        wanted,
    )
    for warning in report["warnings"]:
        pulumi.log.warn(warning)
    return report


def _ray_client(cluster: dict[str, str]) -> dict[str, object]:
    """Could a Ray Client on this workstation attach? Warned about, never required."""
    here = workstation_versions()
    problem = versions.ray_client_compatibility(cluster, here)
    if problem and here.get("ray"):
        pulumi.log.warn(problem)
    return {"compatible": not problem, "workstation": here, "detail": problem}


def _pick(key: str, outputs: dict[str, Any]) -> Any:
    return outputs[key]


_SERVING = ("endpoint", "health", "ray_dashboard", "ray_dashboard_tunnel", "ray_gcs_address",
            "launcher", "ready")  # fmt: skip


def _serve(
    cfg: StackConfig,
    launcher: str,
    why: str,
    shared: _Shared,
    weights: ModelWeights,
    after: list[pulumi.Resource | pulumi.Output[Any]],
) -> dict[str, Any]:
    """Register the ranks of `launcher` and return their outputs (_SERVING)."""
    pulumi.log.info(f"launcher: {launcher} ({why})")
    stack, nodes, image, api_key, top = (
        shared.stack,
        shared.nodes,
        shared.image,
        shared.api_key,
        shared.top,
    )
    if launcher == containers.NATIVE:
        server_plan = plans.model_server(cfg, stack, launcher)
        server = ModelServer(
            server_plan.name,
            ModelServerArgs(
                server_plan, nodes, image, None, [], weights, api_key,
                ranks=[plans.vllm_rank(cfg, stack, n) for n in cfg.worker_nodes], after=after,
            ),
            top,
        )  # fmt: skip
        return {
            "endpoint": server.endpoint,
            "health": server.health,
            # No Ray: empty (a None output would vanish, and keys never do).
            "ray_dashboard": "",
            "ray_dashboard_tunnel": "",
            "ray_gcs_address": "",
            "launcher": {"name": launcher, "why": why},
            "ready": server.ready,
        }
    head_plan = plans.ray_head(cfg, stack)
    head = RayHead(head_plan.name, RayHeadArgs(head_plan, nodes[cfg.head], image), top)
    workers = []
    for n in cfg.worker_nodes:
        worker_plan = plans.ray_worker(cfg, stack, n)
        workers.append(
            RayWorker(worker_plan.name, RayWorkerArgs(worker_plan, nodes[n.name], image, head), top)
        )
    server_plan = plans.model_server(cfg, stack)
    server = ModelServer(
        server_plan.name,
        ModelServerArgs(server_plan, nodes, image, head, workers, weights, api_key, after=after),
        top,
    )
    return {
        "endpoint": server.endpoint,
        "health": server.health,
        "ray_dashboard": head.dashboard_url,
        "ray_dashboard_tunnel": head.dashboard_tunnel,
        "ray_gcs_address": head.gcs_address,
        "launcher": {"name": launcher, "why": why},
        "ready": server.ready,
    }
