"""The whole stack config and the rules that span its sections."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sparkvllm.config.errors import ConfigError, Issue
from sparkvllm.config.image import ImageConfig
from sparkvllm.config.model import ModelConfig, ParallelismConfig, ServedModel, VllmConfig
from sparkvllm.config.nodes import JumpConfig, NodeConfig
from sparkvllm.config.ports import PortsConfig, ray_port_owner
from sparkvllm.config.program_env import HOST_NCCL_ENV, RESERVED_ENV, NcclConfig
from sparkvllm.config.routing import RouterConfig
from sparkvllm.config.values import (
    _BEARER_FIX,
    MAX_UNIFIED_MEMORY_UTILIZATION,
    _Closed,
    _host_problem,
    _key_file,
)


class TimeoutsConfig(_Closed):
    """Bounded waits during `pulumi up`."""

    ray_ready_s: int = Field(
        300,
        ge=10,
        le=3600,
        description="Seconds to wait for Ray to report every node and GPU.",
    )
    server_ready_s: int = Field(
        1800,
        ge=30,
        le=4 * 3600,
        description="Seconds to wait for the model server's /health (big models on two "
        "Sparks take 10-15 minutes).",
    )
    answer_s: int = Field(
        60,
        ge=5,
        le=600,
        description="Seconds a served model may take to generate one token before the "
        "liveness reads (refresh's server guard, the drift check) call it stuck. A new "
        "value re-runs nothing: the containers' own Docker healthcheck keeps 60 s.",
    )


class StackConfig(_Closed):
    """The whole stack config (keys under the `spark-vllm:` namespace)."""

    nodes: list[NodeConfig] = Field(min_length=1, description="The GB10 nodes.")
    head: str = Field(description="Name of the node that runs the Ray head and the server.")
    accelerator: Literal["nvidia", "simulated"] = Field(
        "nvidia",
        description="`nvidia`: real GPUs (containers get --gpus all). `simulated`: the sim "
        "stack; no GPU, Ray is told each node has `gpus` GPUs.",
    )
    image: ImageConfig = Field(description="The vLLM image.")
    # The single-model form (`model`, `parallelism`, `vllm`): a set of one. Read them through
    # `served` (every model) or the `model` / `parallelism` / `vllm` properties (the one).
    single_model: ModelConfig | None = Field(
        None, alias="model", description="The model (a stack that serves one; else models)."
    )
    single_parallelism: ParallelismConfig | None = Field(
        None, alias="parallelism", description="Tensor/pipeline parallel sizes (with model)."
    )
    single_vllm: VllmConfig = Field(
        default_factory=lambda: VllmConfig(), alias="vllm", description="vLLM options."
    )
    models: list[ServedModel] | None = Field(
        None,
        min_length=1,
        description="The set of models the stack serves, each with its own parallelism, "
        "vLLM options, nodes and ports (instead of model, parallelism and vllm; docs/models.md).",
    )
    router: RouterConfig | None = Field(
        None,
        description="One OpenAI endpoint for every model: LiteLLM's proxy on the head, "
        "routing by each request's `model` (the `endpoint` output is then its).",
    )
    ports: PortsConfig = Field(default_factory=lambda: PortsConfig(), description="Ports.")
    timeouts: TimeoutsConfig = Field(default_factory=lambda: TimeoutsConfig(), description="Waits.")
    nccl: NcclConfig = Field(
        default_factory=lambda: NcclConfig(), description="Which NCCL library runs."
    )
    drop_page_cache: bool = Field(
        False,
        description="Drop the page cache on every node right before the model server starts "
        "(unified memory: cudaMemGetInfo does not count reclaimable cache as free). Needs "
        "root or passwordless sudo on the nodes.",
    )
    expose_ray_dashboard: bool = Field(
        False,
        description="Bind the Ray dashboard to every interface of the head (the LAN). Its "
        "Jobs API runs any code it is sent, without authentication, so by default it binds "
        "to the head's cluster-link address only; reach it through the "
        "`ray_dashboard_tunnel` output (an ssh port forward) instead.",
    )
    endpoint_host: str | None = Field(
        None,
        description="Host name clients use for the API (default: the head's ssh.host).",
    )
    ssh_private_key: SecretStr | None = Field(
        None,
        description="SECRET. The SSH private key for every node: `pulumi config set --secret "
        "ssh_private_key < ~/.ssh/id_ed25519`.",
    )
    ssh_private_key_file: str | None = Field(
        None,
        description="Instead of ssh_private_key: path on the workstation of the private key.",
    )
    ssh_private_keys: dict[str, SecretStr] | None = Field(
        None,
        description="SECRET, optional. Node name -> that node's own private key (`pulumi "
        "config set --secret --path 'ssh_private_keys.spark-2' < key`); a node without one "
        "uses nodes[].ssh.private_key_file, else the stack-wide key.",
    )
    ssh_jump: JumpConfig | None = Field(
        None,
        description="A jump host (bastion) every node is reached through from the "
        "workstation, unless its nodes[].ssh.jump says another.",
    )
    api_key: SecretStr | None = Field(
        None,
        description="SECRET, optional. API key clients must send (`pulumi config set "
        "--secret api_key ...`).",
    )
    hf_token: SecretStr | None = Field(
        None,
        description="SECRET, optional. Hugging Face access token for a gated or private "
        "model (`pulumi config set --secret hf_token`, which prompts for it). Used only "
        "by the weights download and its preflight check, on stdin: never on a command "
        "line, in an output or in a log.",
    )

    @field_validator("endpoint_host")
    @classmethod
    def _endpoint_host_shape(cls, v: str | None) -> str | None:
        problem = None if v is None else _host_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("ssh_private_key_file")
    @classmethod
    def _key_file_text(cls, v: str | None) -> str | None:
        return None if v is None else _key_file(v)

    @field_validator("api_key", "hf_token")
    @classmethod
    def _bearer_value(cls, v: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        """Both are sent as `Authorization: Bearer VALUE`: 8-512 printable characters."""
        if v is not None and not re.match(r"^[\x21-\x7e]{8,512}$", v.get_secret_value()):
            what, fix = _BEARER_FIX[str(info.field_name)]
            raise ValueError(
                f"{what} is sent as `Authorization: Bearer ...`: 8-512 printable "
                f"characters, no spaces; fix: {fix}"
            )
        return v

    _served: tuple[ServedModel, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _cross_field_rules(self) -> StackConfig:
        issues = list(_form_issues(self))
        if not issues:
            self._served = _served_models(self)
            issues = list(_cross_field_issues(self))
        if issues:
            raise ConfigError(issues)
        return self

    @property
    def single_form(self) -> bool:
        """Written as `model` (+ `parallelism`, `vllm`), not as `models`."""
        return self.models is None

    @property
    def served(self) -> tuple[ServedModel, ...]:
        """Every model the stack serves, in the config's order (the single form: one)."""
        return self._served

    def for_model(self, m: ServedModel) -> StackConfig:
        """The stack as one model's parts see it: that model alone (`model`, `parallelism`,
        `vllm`), its nodes (its rank 0 as `head`) and its own ports. The model without
        `nodes` sees the stack's nodes as they are, so its parts stay what a single-model
        stack's were."""
        if m.nodes is None:
            nodes, head = list(self.nodes), self.head
        else:
            nodes, head = model_nodes(self, m), m.nodes[0]
        api, master = model_ports(self, m)
        view = self.model_copy(
            update={
                "nodes": nodes,
                "head": head,
                "ports": self.ports.model_copy(update={"api": api, "master": master}),
                # The host clients use names the stack's head; another rank 0 is reached
                # by its own ssh host.
                "endpoint_host": self.endpoint_host if head == self.head else None,
            }
        )
        view._served = (m,)
        return view

    def _only(self) -> ServedModel:
        if len(self._served) != 1:
            raise RuntimeError(
                f"read the stack's one model, but it serves {len(self._served)}: a part that "
                "serves one model takes its ServedModel"
            )
        return self._served[0]

    @property
    def model(self) -> ServedModel:
        """The one model (a ServedModel is a ModelConfig) of a stack that serves one."""
        return self._only()

    @property
    def parallelism(self) -> ParallelismConfig:
        return self._only().parallelism

    @property
    def vllm(self) -> VllmConfig:
        return self._only().vllm

    def jump_for(self, node: NodeConfig) -> JumpConfig | None:
        """The jump host `node` is reached through: its own, else the stack's."""
        return node.ssh.jump or self.ssh_jump

    @property
    def head_node(self) -> NodeConfig:
        return next(n for n in self.nodes if n.name == self.head)

    @property
    def worker_nodes(self) -> list[NodeConfig]:
        return [n for n in self.nodes if n.name != self.head]

    @property
    def own_keys(self) -> set[str]:
        """The nodes reached with a key of their own (not the stack-wide key)."""
        secrets = set(self.ssh_private_keys or {})
        return secrets | {n.name for n in self.nodes if n.ssh.private_key_file}

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def host_nccl(self) -> str | None:
        """With nccl.library host: the library's path on every node; else None."""
        if self.nccl.library != "host":
            return None
        return self.nccl.host_path or f"/usr/lib/{self.image.arch}-linux-gnu/libnccl.so.2"


def _cross_field_issues(cfg: StackConfig) -> Iterable[Issue]:
    names = [n.name for n in cfg.nodes]
    for i, n in enumerate(cfg.nodes):
        if names.index(n.name) != i:
            yield Issue(
                path=f"nodes[{i}].name",
                value=n.name,
                problem=f"duplicate node name, already nodes[{names.index(n.name)}]",
                fix="give every node its own name",
            )
    addrs = [n.cluster_link.address for n in cfg.nodes]
    for i, a in enumerate(addrs):
        first = addrs.index(a)
        if first != i:
            yield Issue(
                path=f"nodes[{i}].cluster_link.address",
                value=str(a),
                problem=f"already used by node {cfg.nodes[first].name!r}",
                fix="give every node its own address on the cluster link",
            )
    ssh_ends = [(n.ssh.host, n.ssh.port) for n in cfg.nodes]
    for i, e in enumerate(ssh_ends):
        first = ssh_ends.index(e)
        if first != i:
            yield Issue(
                path=f"nodes[{i}].ssh.host",
                value=e[0],
                problem=f"port {e[1]} on this host is already node {cfg.nodes[first].name!r}",
                fix="each node needs its own ssh host (or port)",
            )
    if cfg.head not in names:
        yield Issue(
            path="head",
            value=cfg.head,
            problem=f"not a node name (nodes are {', '.join(names)})",
            fix="set head to one of the node names",
        )
    if cfg.head in names:
        yield from _models_issues(cfg)
    if cfg.nccl.library != "host" and cfg.nccl.host_path is not None:
        yield Issue(
            path="nccl.host_path",
            value=cfg.nccl.host_path,
            problem="only used with nccl.library host",
            fix="set nccl.library: host, or remove nccl.host_path",
        )
    keys = [k for k in ("ssh_private_key", "ssh_private_key_file") if getattr(cfg, k)]
    own = cfg.own_keys
    keyless = [n.name for n in cfg.nodes if n.name not in own]
    if len(keys) > 1 or (not keys and keyless):
        yield Issue(
            path="ssh_private_key",
            value=None if not keys else "[both given]",
            problem="exactly one of ssh_private_key (secret) or ssh_private_key_file is needed"
            + (f" (nodes without a key of their own: {', '.join(keyless)})" if keyless else ""),
            fix="run `pulumi config set --secret ssh_private_key < ~/.ssh/id_ed25519` or set "
            "ssh_private_key_file",
        )
    for name in sorted(set(cfg.ssh_private_keys or {}) - set(names)):
        yield Issue(
            path=f"ssh_private_keys.{name}",
            value="[secret]",
            problem="no node has this name",
            fix=f"key it by a node's name ({', '.join(names)})",
        )


_SINGLE_FORM = {"single_model": "model", "single_parallelism": "parallelism", "single_vllm": "vllm"}


def _form_issues(cfg: StackConfig) -> Iterable[Issue]:
    """Exactly one form: `model` with `parallelism` (and `vllm`), or `models`."""
    given = [key for field, key in _SINGLE_FORM.items() if field in cfg.model_fields_set]
    if cfg.single_vllm == VllmConfig():
        # Pulumi injects a declared key's default (`vllm: {}`, Pulumi.yaml) into every
        # stack that lacks it: the defaults say nothing.
        given = [key for key in given if key != "vllm"]
    if cfg.models is not None:
        for key in given:
            yield Issue(
                path=key,
                value="(given with models)",
                problem="the single-model form beside models",
                fix=f"move {key} into each entry of models, or remove models",
            )
        return
    for key, described in (
        ("model", "the model"),
        ("parallelism", "tensor/pipeline parallel sizes"),
    ):
        if key not in given:
            yield Issue(
                path=key,
                value="(missing)",
                problem="Field required",
                fix=f"add {key} ({described}), or give the models list instead",
            )


def _served_models(cfg: StackConfig) -> tuple[ServedModel, ...]:
    if cfg.models is not None:
        return tuple(cfg.models)
    assert cfg.single_model is not None and cfg.single_parallelism is not None
    return (
        ServedModel.model_validate(
            {
                **cfg.single_model.model_dump(),
                "parallelism": cfg.single_parallelism,
                "vllm": cfg.single_vllm,
            }
        ),
    )


def model_path(cfg: StackConfig, index: int, field: str = "") -> str:
    """Where a model's field is written: `vllm.env.X` in the single form, `models[1].vllm.env.X`
    in the list (an empty field: the model itself)."""
    if cfg.single_form:
        if field.startswith(("parallelism", "vllm")):
            return field
        return f"model.{field}" if field else "model"
    return f"models[{index}].{field}" if field else f"models[{index}]"


def model_nodes(cfg: StackConfig, model: ServedModel) -> list[NodeConfig]:
    """The nodes a model's ranks run on, rank 0 first: its own list, else every node with
    the head first."""
    if model.nodes is None:
        return [cfg.head_node, *cfg.worker_nodes]
    by_name = {n.name: n for n in cfg.nodes}
    return [by_name[name] for name in model.nodes if name in by_name]


def model_label(model: ServedModel) -> str:
    """How a message names a model: its name, else its served name."""
    return model.name or model.name_for_clients


def model_ports(cfg: StackConfig, model: ServedModel) -> tuple[int, int]:
    """(api, master): its own, else the stack's."""
    if model.ports is not None:
        return model.ports.api, model.ports.master
    return cfg.ports.api, cfg.ports.master


def _models_issues(cfg: StackConfig) -> Iterable[Issue]:
    """Each model's rules (its nodes, its GPUs, its variables), then the set's (names,
    served names, ports, Ray, the memory each node is promised)."""
    names = [n.name for n in cfg.nodes]
    for i, m in enumerate(cfg.served):
        for name in m.nodes or []:
            if name not in names:
                yield Issue(
                    path=model_path(cfg, i, "nodes"),
                    value=name,
                    problem=f"not a node name (nodes are {', '.join(names)})",
                    fix="list node names from nodes, or leave nodes out (every node)",
                )
        placed = model_nodes(cfg, m)
        gpus = sum(n.gpus for n in placed)
        p = m.parallelism
        if m.nodes is None or len(placed) == len(m.nodes):
            where = "the nodes declare" if m.nodes is None else "its nodes declare"
            if p.tensor * p.pipeline != gpus:
                yield Issue(
                    path=model_path(cfg, i, "parallelism"),
                    value={"tensor": p.tensor, "pipeline": p.pipeline},
                    problem=f"tensor x pipeline = {p.tensor * p.pipeline}, but {where} "
                    f"{gpus} GPU(s) in all",
                    fix=f"make tensor x pipeline equal {gpus} (e.g. tensor: {gpus}), or "
                    "change the nodes",
                )
        if cfg.nccl.library == "host":
            for key in sorted(set(m.vllm.env) & set(HOST_NCCL_ENV)):
                yield Issue(
                    path=model_path(cfg, i, f"vllm.env.{key}"),
                    value=m.vllm.env[key],
                    problem="nccl.library host sets it to the host's NCCL library",
                    fix="remove it (or set nccl.library: image)",
                )
        for key in m.vllm.env:
            if key in RESERVED_ENV:
                yield Issue(
                    path=model_path(cfg, i, f"vllm.env.{key}"),
                    value=m.vllm.env[key],
                    problem="this variable is set per node by the program (each node its own "
                    "value)",
                    fix=f"remove it; {RESERVED_ENV[key]}",
                )
    if not cfg.single_form:
        yield from _set_issues(cfg)
    if cfg.router is not None:
        yield from _router_issues(cfg, cfg.router)
    yield from _ssh_port_issues(cfg)


def _may_run_ray(cfg: StackConfig, model: ServedModel) -> bool:
    """Whether a model's nodes may run Ray: launcher ray, or auto in the single form (in a
    set, auto means native)."""
    launcher = model.parallelism.launcher
    return launcher == "ray" or (cfg.single_form and launcher == "auto")


def ray_heads(cfg: StackConfig) -> list[str]:
    """The node that heads Ray for each model that may run on it (its rank 0): at most one
    in a set (_set_issues), the stack's head for a single model under ray or auto."""
    return [cfg.for_model(m).head for m in cfg.served if _may_run_ray(cfg, m)]


def _ports_bound(cfg: StackConfig) -> dict[str, dict[int, str]]:
    """For each node, the ports a server of the stack listens on there (host network), by
    the key that sets each: each model's API and rendezvous ports on its rank 0, Ray's on
    the Ray model's head, the router's on the stack's head."""
    bound: dict[str, dict[int, str]] = {n.name: {} for n in cfg.nodes}
    for i, _, port, key in _model_ports_held(cfg):
        bound.setdefault(cfg.for_model(cfg.served[i]).head, {}).setdefault(port, key)
    for head in ray_heads(cfg):
        for port, key in _ray_ports(cfg).items():
            bound.setdefault(head, {}).setdefault(port, key)
    if cfg.router is not None:
        bound[cfg.head].setdefault(cfg.router.port, "router.port")
    return bound


def _ssh_port_issues(cfg: StackConfig) -> Iterable[Issue]:
    """A node's sshd port (the program reaches the node on it, and the nodes each other over
    the cluster link) is no port a server of the stack listens on there: that server would
    fail to bind after the images and weights were sent."""
    bound = _ports_bound(cfg)
    ray_nodes = {n.name for m in cfg.served if _may_run_ray(cfg, m) for n in model_nodes(cfg, m)}
    for i, n in enumerate(cfg.nodes):
        owner = bound[n.name].get(n.ssh.port)
        if owner is None and n.name in ray_nodes:
            owner = ray_port_owner(n.ssh.port)
        if owner:
            yield Issue(
                path=f"nodes[{i}].ssh.port",
                value=n.ssh.port,
                problem=f"sshd on {n.name} listens on it, and so would {owner} there",
                fix=f"give {owner} another port, or move sshd on {n.name} to another port",
            )


def _ray_ports(cfg: StackConfig) -> dict[int, str]:
    """The stack's own Ray ports, by the key that sets each."""
    return {cfg.ports.ray_gcs: "ports.ray_gcs", cfg.ports.ray_dashboard: "ports.ray_dashboard"}


def _model_ports_held(cfg: StackConfig) -> Iterable[tuple[int, str, int, str]]:
    """(model index, api or master, port, the key that sets it) for each model's ports in
    the config's order; the stack's ports.api and ports.master once, for the first model
    on them (another one there is refused on its own, _set_issues)."""
    on_stack = [i for i, m in enumerate(cfg.served) if m.ports is None]
    for i, m in enumerate(cfg.served):
        if m.ports is None and i in on_stack[1:]:
            continue
        api, master = model_ports(cfg, m)
        for what, port in (("api", api), ("master", master)):
            own = m.ports is not None
            yield i, what, port, model_path(cfg, i, f"ports.{what}") if own else f"ports.{what}"


def _router_issues(cfg: StackConfig, router: RouterConfig) -> Iterable[Issue]:
    taken = _ray_ports(cfg)
    for _, _, port, key in _model_ports_held(cfg):
        taken.setdefault(port, key)
    owner = taken.get(router.port) or ray_port_owner(router.port)
    if owner:
        yield Issue(
            path="router.port",
            value=router.port,
            problem=f"port {router.port} is already {owner}",
            fix="give the router a port of its own (default 4000)",
        )
    if router.image.arch != cfg.image.arch:
        yield Issue(
            path="router.image.arch",
            value=router.image.arch,
            problem=f"the router runs on the head, whose image is {cfg.image.arch}",
            fix=f"use a router image built for {cfg.image.arch}",
        )


def _first_seen(values: list[object]) -> Iterable[tuple[int, int]]:
    """(i, j) for each value at i that an earlier entry j already has."""
    for i, v in enumerate(values):
        j = values.index(v)
        if j != i:
            yield i, j


def _set_issues(cfg: StackConfig) -> Iterable[Issue]:
    models = cfg.served
    unnamed = [i for i, m in enumerate(models) if m.name is None]
    for i in unnamed[1:]:
        yield Issue(
            path=model_path(cfg, i, "name"),
            value=None,
            problem=f"models[{unnamed[0]}] has no name either (only one model may keep the "
            "single-model stack's resource names)",
            fix="give this model a name, e.g. name: coder",
        )
    for i, j in _first_seen([m.name for m in models if m.name is not None]):
        named = [k for k, m in enumerate(models) if m.name is not None]
        yield Issue(
            path=model_path(cfg, named[i], "name"),
            value=models[named[i]].name,
            problem=f"already the name of models[{named[j]}]",
            fix="give every model its own name",
        )
    labels = [model_label(m) for m in models]
    for i, j in _first_seen(list(labels)):
        if (models[i].name is None) == (models[j].name is None):
            continue  # two names alike, or two without: said below and above
        own, other = (i, j) if models[i].name is not None else (j, i)
        yield Issue(
            path=model_path(cfg, own, "name"),
            value=labels[own],
            problem=f"models[{other}] has no name and is known by its served name, which is "
            "this (each model's parts and outputs go by one of them)",
            fix="give this model another name",
        )
    served = [m.name_for_clients for m in models]
    for i, j in _first_seen(list(served)):
        yield Issue(
            path=model_path(cfg, i, "served_name"),
            value=served[i],
            problem=f"models[{j}] is served under this name too (requests name the model "
            "they want by it)",
            fix="give each model its own served_name",
        )
    shared = [i for i, m in enumerate(models) if m.ports is None]
    for i in shared[1:]:
        yield Issue(
            path=model_path(cfg, i, "ports"),
            value="(missing)",
            problem=f"models[{shared[0]}] already uses the stack's ports (api "
            f"{cfg.ports.api}, master {cfg.ports.master})",
            fix="give this model its own, e.g. ports: {api: 8001, master: 29502}",
        )
    taken = _ray_ports(cfg)
    for i, what, port, key in _model_ports_held(cfg):
        owner = taken.get(port) or ray_port_owner(port)
        if owner:
            yield Issue(
                path=model_path(cfg, i, f"ports.{what}"),
                value=port,
                problem=f"port {port} is already {owner}",
                fix="give each model ports of its own (no two alike, none of Ray's)",
            )
        else:
            taken[port] = key
    for j, node in enumerate(cfg.nodes):
        if not any(node in model_nodes(cfg, m) for m in models):
            yield Issue(
                path=f"nodes[{j}]",
                value=node.name,
                problem="no model runs on this node",
                fix="list it in a model's nodes, or remove it from nodes",
            )
    rays = [i for i, m in enumerate(models) if m.parallelism.launcher == "ray"]
    for i in rays[1:]:
        yield Issue(
            path=model_path(cfg, i, "parallelism.launcher"),
            value="ray",
            problem=f"models[{rays[0]}] already runs on the stack's Ray cluster (Ray serves "
            "at most one model: a Spark's one GPU is one Ray bundle; docs/models.md)",
            fix="set launcher: native for this model",
        )
    yield from _memory_issues(cfg)


def _memory_issues(cfg: StackConfig) -> Iterable[Issue]:
    """What the config alone promises each node: the sum of its models' memory fractions
    (vLLM's gpu_memory_utilization is per server) within MAX_UNIFIED_MEMORY_UTILIZATION,
    the rest left to the OS and the page cache."""
    for node in cfg.nodes:
        on = [m for m in cfg.served if node in model_nodes(cfg, m)]
        total = sum(m.vllm.gpu_memory_utilization for m in on)
        if len(on) > 1 and total > MAX_UNIFIED_MEMORY_UTILIZATION + 1e-9:
            shares = " + ".join(f"{model_label(m)} {m.vllm.gpu_memory_utilization:g}" for m in on)
            yield Issue(
                path=f"models (node {node.name})",
                value=f"{shares} = {total:.2f}",
                problem=f"the models placed on {node.name} are promised {total:.0%} of its "
                f"memory, over {MAX_UNIFIED_MEMORY_UTILIZATION:.0%} (the OS and the page "
                "cache share a GB10's unified memory; an over-committed node wedges)",
                fix="lower vllm.gpu_memory_utilization of one of them, or place one on "
                "other nodes (models[].nodes)",
            )
