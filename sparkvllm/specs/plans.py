"""What each component adapts, built from the config once (components/deployment.py).

One plan per component: its name, the specs of its steps (each owning its resource name),
the values its steps are re-run on (triggers), and the pure checks on what they print. A
component takes its plan and turns it into resources; it never reads the StackConfig. The
drift check takes step names from the same plans (`TYPE` is each component's type token,
the URN's parent chain).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

from sparkvllm.config import NodeConfig, StackConfig
from sparkvllm.config.stack import model_label
from sparkvllm.specs import (
    commands,
    containers,
    facts,
    link_checks,
    model_support,
    versions,
    weights,
)
from sparkvllm.specs import router_container as router_specs
from sparkvllm.specs.commands import CommandSpec
from sparkvllm.specs.containers import ContainerSpec
from sparkvllm.specs.scope import scoped
from sparkvllm.specs.ssh import Reach, url_host

# The component that holds every part (components/cluster.py).
CLUSTER_TYPE = "sparkvllm:index:SparkVllmCluster"


@dataclass(frozen=True)
class NodePlan:
    TYPE: ClassVar[str] = "sparkvllm:index:GB10Node"
    name: str
    reach: Reach  # how the workstation reaches the node (ssh, pulumi-command, NodeSteps)
    docker_host: str  # the docker provider's, over ssh (`reach`'s)
    docker_ssh_opts: tuple[str, ...]
    facts: CommandSpec
    links: CommandSpec
    # Each judges its step's stdout and raises PreflightError (in the step's create).
    facts_check: Callable[[str], None]
    links_check: Callable[[str], None]
    # (facts stdout, links stdout) -> (facts output, warnings), once both checks passed.
    verdict: Callable[[str, str], tuple[dict[str, object], list[str]]]
    # For each model whose rank 0 it is (by label): can the node download it, and how big
    # are its weights (an offline model's only read in its cache)? It fails on the node
    # with the fix; its stdin is the hf_token (from `token_file`).
    hubs: Mapping[str, CommandSpec] = field(default_factory=dict)
    token_file: str | None = None


@dataclass(frozen=True)
class LinksPlan:
    """The cluster link measured from the head to each worker, one after another (two
    measurements through the head's port at once would each see half of it), after every
    node's preflight and before any transfer uses the link."""

    TYPE: ClassVar[str] = "sparkvllm:index:ClusterLinks"
    name: str
    head: str
    steps: Mapping[str, CommandSpec]  # worker -> its measurement, in the nodes' order
    # (worker -> stdout, node -> facts output) -> (the `links` output, warnings)
    verdict: Callable[[Mapping[str, str], Mapping[str, Any]], tuple[dict[str, Any], list[str]]]


@dataclass(frozen=True)
class ImagePlan:
    TYPE: ClassVar[str] = "sparkvllm:index:SyncedImage"
    name: str
    ref: str  # the config's local name of the image (ImageConfig.local_ref)
    head: str
    obtain: CommandSpec
    obtain_triggers: tuple[str, ...]
    # The name the containers run the image by, and the line that keeps it when the
    # config pins the digest that image carries (commands.image_name).
    run_name: CommandSpec
    run_name_kept_for: str | None
    # Does the image implement the model without a name (None: every model has one; each
    # named model's check is its weights' plan's)? Run on `support_node`, that model's
    # rank 0; where that is the head, nothing is streamed before it passed.
    support: CommandSpec | None
    support_node: str
    support_triggers: tuple[str, ...]
    # stdout of the support probe -> its summary; raises ModelSupportError.
    support_verdict: Callable[[str], dict[str, Any]] | None
    # The transfer to two or more workers that lack the image (whole, or an update's new
    # layers), relayed hop by hop (None: one worker).
    relay: CommandSpec | None
    streams: Mapping[str, CommandSpec]  # worker -> the stream from the head
    versions: Mapping[str, CommandSpec]  # every node -> its versions probe
    ray: CommandSpec  # the head's image's Ray: what `launcher: auto` decides on
    decide_launcher: bool  # parallelism.launcher is auto
    # node -> versions probe stdout -> the versions all agree on; raises NodesDisagreeError.
    agreed_versions: Callable[[Mapping[str, str]], dict[str, str]]


@dataclass(frozen=True)
class WeightsPlan:
    TYPE: ClassVar[str] = "sparkvllm:index:ModelWeights"
    name: str
    head: str
    downloads: Mapping[str, CommandSpec]  # the head, or every node
    copies: Mapping[str, CommandSpec]  # worker -> the copy from the head (may be empty)
    triggers: tuple[str, ...]
    # The workstation file the downloads read the hf_token from (the secret stays there).
    token_file: str | None = None
    # A named model's own check that the image implements it, on its rank 0 before its
    # downloads (the model without a name has it in the image's plan).
    support: CommandSpec | None = None
    support_verdict: Callable[[str], dict[str, Any]] | None = None


@dataclass(frozen=True)
class _ContainerPlan:
    """A component around one long-running container."""

    name: str
    container: ContainerSpec


@dataclass(frozen=True)
class RayHeadPlan(_ContainerPlan):
    TYPE: ClassVar[str] = "sparkvllm:index:RayHead"
    gcs_address: str
    dashboard_url: str
    dashboard_tunnel: str


@dataclass(frozen=True)
class RayWorkerPlan(_ContainerPlan):
    TYPE: ClassVar[str] = "sparkvllm:index:RayWorker"


@dataclass(frozen=True)
class RankPlan(_ContainerPlan):
    """A worker rank of vLLM's own launcher (native), with the guard a refresh reads."""

    TYPE: ClassVar[str] = "sparkvllm:index:VllmRank"
    guard: CommandSpec


@dataclass(frozen=True)
class ServerPlan(_ContainerPlan):
    TYPE: ClassVar[str] = "sparkvllm:index:ModelServer"
    ray_ready: CommandSpec | None  # launcher ray: Ray's membership, before the server
    guard: CommandSpec
    drop_caches: tuple[CommandSpec, ...]  # one per node, or none (drop_page_cache: false)
    ready: CommandSpec
    endpoint: str
    served_name: str
    rdma: bool


def node(
    cfg: StackConfig,
    n: NodeConfig,
    *,
    reach: Reach,
    known_hosts_ref: str,
    control_dir_ref: str,
    token_file: str | None = None,
) -> NodePlan:
    public = facts.public_config(cfg)  # what the judges carry into the state
    return NodePlan(
        name=n.name,
        reach=reach,
        docker_host=reach.docker_host(),
        docker_ssh_opts=tuple(reach.docker_ssh_opts(known_hosts_ref, control_dir_ref)),
        facts=facts.facts_step(cfg, n),
        links=facts.links_step(cfg, n),
        facts_check=partial(facts.facts_check, public, n.name),
        links_check=partial(facts.links_check, public, n.name),
        verdict=partial(facts.verdict, cfg, n),
        hubs={
            model_label(m): weights.hub_access(view)
            for m in cfg.served
            if (view := cfg.for_model(m)).head == n.name
        },
        token_file=token_file,
    )


def links(cfg: StackConfig, host_keys: Mapping[str, str | None]) -> LinksPlan:
    return LinksPlan(
        name="link",
        head=cfg.head,
        steps={
            n.name: link_checks.link_rate_step(cfg, n, host_keys.get(n.name))
            for n in cfg.worker_nodes
        },
        verdict=partial(link_checks.links_verdict, cfg),
    )


def image(cfg: StackConfig, host_keys: Mapping[str, str | None]) -> ImagePlan:
    img = cfg.image
    unnamed = next((cfg.for_model(m) for m in cfg.served if m.name is None), None)
    return ImagePlan(
        name="image",
        ref=img.local_ref,
        head=cfg.head,
        obtain=commands.image_obtain(cfg),
        obtain_triggers=(img.ref, img.source, img.tarball or ""),
        run_name=commands.image_name(cfg),
        run_name_kept_for=commands.name_kept_for(cfg),
        support=model_support.model_support(unnamed) if unnamed else None,
        support_node=unnamed.head if unnamed else cfg.head,
        support_triggers=(unnamed.model.id, unnamed.model.revision) if unnamed else (),
        support_verdict=partial(model_support.support_verdict, unnamed) if unnamed else None,
        # The relay's hops all authenticate with one key (the head's agent forwards it):
        # the stack-wide one, so not when a worker has a key of its own.
        relay=commands.image_relay(cfg, cfg.worker_nodes, host_keys)
        if len(cfg.worker_nodes) >= 2 and not cfg.own_keys & {n.name for n in cfg.worker_nodes}
        else None,
        streams={
            n.name: commands.image_sync(cfg, n, host_keys.get(n.name)) for n in cfg.worker_nodes
        },
        versions={n.name: versions.image_versions(cfg, n) for n in cfg.nodes},
        ray=versions.image_ray(cfg),
        # Only a model alone is decided from the image (in a set, auto is native).
        decide_launcher=len(cfg.served) == 1 and cfg.served[0].parallelism.launcher == "auto",
        agreed_versions=partial(versions.agreed_versions, cfg),
    )


def model_weights(
    cfg: StackConfig, host_keys: Mapping[str, str | None], token_file: str | None = None
) -> WeightsPlan:
    """The weights of the model `cfg` serves (a one-model view: StackConfig.for_model)."""
    each = cfg.model.distribution == "download_on_each_node"
    downloaders = cfg.nodes if each else [cfg.head_node]
    copied = [] if each else cfg.worker_nodes
    named = cfg.model.name is not None
    return WeightsPlan(
        name=scoped(cfg, "model"),
        head=cfg.head,
        downloads={n.name: weights.weights_download(cfg, n) for n in downloaders},
        copies={n.name: weights.weights_sync(cfg, n, host_keys.get(n.name)) for n in copied},
        triggers=(cfg.model.id, cfg.model.revision),
        token_file=token_file,
        support=model_support.model_support(cfg) if named else None,
        support_verdict=partial(model_support.support_verdict, cfg) if named else None,
    )


def ray_head(cfg: StackConfig, stack: str) -> RayHeadPlan:
    url, tunnel = containers.dashboard_access(cfg)
    return RayHeadPlan(
        name="ray-head",
        container=containers.ray_head(cfg, stack),
        gcs_address=containers.gcs_address(cfg),
        dashboard_url=url,
        dashboard_tunnel=tunnel,
    )


def ray_worker(cfg: StackConfig, stack: str, n: NodeConfig) -> RayWorkerPlan:
    return RayWorkerPlan(
        name=f"ray-worker-{n.name}", container=containers.ray_worker(cfg, stack, n)
    )


def launcher(
    cfg: StackConfig, image_ray: str | None = None, *, several: bool = False
) -> tuple[str, str]:
    """(ray | native, why). `image_ray`: the Ray version the image holds on the head (""
    for none; None: not read yet, which only a preview of a new stack or image sees: it
    shows `native`, saying why). A new ref that names the image the stack read (a pin of
    the digest it carries) is not new: its Ray is known (SyncedImage.head_ray). An
    explicit `ray` on an image without Ray is refused by the image's checks."""
    chosen = cfg.parallelism.launcher
    if chosen != "auto":
        return chosen, f"parallelism.launcher: {chosen}"
    if several:
        return containers.NATIVE, (
            "parallelism.launcher: auto in a set of models: native, the launcher every vLLM "
            "image has (Ray serves at most one model of a set, named with launcher: ray; "
            "docs/models.md)"
        )
    ref = cfg.image.ref
    if image_ray is None:
        return containers.NATIVE, (
            f"parallelism.launcher: auto, and {ref} is new to the head (not known to name "
            "the image whose Ray the stack read there): its Ray is read once `up` has "
            "obtained it, and `up` decides from the Ray it holds (ray if it holds Ray, else "
            "native); this preview shows native (set parallelism.launcher to preview exactly)"
        )
    if image_ray:
        return containers.RAY, f"parallelism.launcher: auto, and {ref} holds ray {image_ray}"
    return containers.NATIVE, f"parallelism.launcher: auto, and {ref} holds no ray"


def vllm_rank(cfg: StackConfig, stack: str, n: NodeConfig) -> RankPlan:
    rank = containers.vllm_rank(cfg, stack, n)
    return RankPlan(
        name=scoped(cfg, f"rank-{n.name}"),
        container=rank,
        guard=commands.rank_guard(cfg, n, rank.name),
    )


def model_server(cfg: StackConfig, stack: str, launcher: str = containers.RAY) -> ServerPlan:
    server = containers.model_server(cfg, stack, launcher)
    host = cfg.endpoint_host or cfg.head_node.ssh.host
    ray = launcher == containers.RAY
    return ServerPlan(
        name=scoped(cfg, "model-server"),
        container=server,
        ray_ready=commands.ray_ready(cfg, containers.ray_head(cfg, stack).name) if ray else None,
        guard=commands.server_guard(cfg, server.name, launcher),
        drop_caches=tuple(commands.drop_page_cache(cfg, n) for n in cfg.nodes)
        if cfg.drop_page_cache
        else (),
        ready=commands.server_ready(cfg, server.name),
        endpoint=f"http://{url_host(host)}:{cfg.ports.api}/v1",
        served_name=cfg.model.name_for_clients,
        rdma=any(n.cluster_link.roce_hcas for n in cfg.nodes),
    )


@dataclass(frozen=True)
class RouterPlan(_ContainerPlan):
    TYPE: ClassVar[str] = "sparkvllm:index:Router"
    head: str
    ref: str  # the router image's local name on the head
    obtain: CommandSpec
    obtain_triggers: tuple[str, ...]
    ready: CommandSpec
    endpoint: str


def router(cfg: StackConfig, stack: str) -> RouterPlan | None:
    """The router's plan, or None when the stack has none."""
    if cfg.router is None:
        return None
    r = cfg.router
    return RouterPlan(
        name="router",
        container=router_specs.router_container(cfg, r, stack),
        head=cfg.head,
        ref=r.image.local_ref,
        obtain=router_specs.router_obtain(cfg, r),
        obtain_triggers=(r.image.ref, r.image.source, r.image.tarball or ""),
        ready=router_specs.router_ready(cfg, r, stack),
        endpoint=router_specs.router_endpoint(cfg, r),
    )


def warnings(cfg: StackConfig) -> list[str]:
    """What the config risks, said at every preview and up: what the deployment exposes,
    and an image that may change under its tag."""
    out = containers.exposure_warnings(cfg)
    img = cfg.image
    if img.moving and img.source == "pull":
        out.append(
            f"image.ref {img.ref} is a moving tag: the registry can serve another image under "
            "it (a new vLLM, another executor) on a node that pulls it again; fix: pin it by "
            f"digest, e.g. {img.repository}@sha256:<digest> (`docker inspect --format "
            "'{{index .RepoDigests 0}}' IMAGE` shows it)"
        )
    return out
