"""The stack config: a closed schema, validated once, before any resource is registered.

Every field is described (the descriptions feed the JSON Schema for editors and the "fix"
part of error messages). Unknown keys are rejected. Cross-field rules (TP x PP = GPUs,
the head is a node, addresses are unique ...) live in `StackConfig._cross_field_rules`.

`load_stack_config(raw)` is the one entry point: it turns pydantic's errors and the
cross-field rules into one `ConfigError` whose lines each name the field, the bad value
and the fix.

Example:
    >>> cfg = load_stack_config({"nodes": [...], "head": "spark-1", ...})
    >>> cfg.head_node.cluster_link.address
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from ipaddress import IPv4Address
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

PROJECT = "spark-vllm"

# Unified memory (GB10): cudaMemGetInfo ignores reclaimable page cache, and an OOM can
# wedge the host. Above this fraction start-up fails or the box hangs (field notes).
MAX_UNIFIED_MEMORY_UTILIZATION = 0.9

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
_NETDEV = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
_HOST_KEY = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+$")
_FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]*")


class Issue(BaseModel):
    """One problem in the stack config: where, what value, what is wrong, how to fix."""

    model_config = ConfigDict(frozen=True)
    path: str
    value: Any
    problem: str
    fix: str

    def render(self) -> str:
        shown = _redacted(self.path, self.value)
        return f"{self.path} = {shown}: {self.problem}. Fix: {self.fix}."


class ConfigError(Exception):
    """The stack config is invalid. Raised before any resource is registered."""

    def __init__(self, issues: Iterable[Issue]):
        self.issues = list(issues)
        lines = "\n".join(f"  - {i.render()}" for i in self.issues)
        noun = "problem" if len(self.issues) == 1 else "problems"
        super().__init__(
            f"stack config is invalid ({len(self.issues)} {noun}); nothing was deployed:\n{lines}"
        )


def _redacted(path: str, value: Any) -> str:
    if path in SECRET_FIELDS or isinstance(value, SecretStr):
        return "'[secret]'"
    return repr(value)


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class SshConfig(_Closed):
    """How the workstation reaches a node's sshd (and how nodes reach each other)."""

    host: str = Field(
        description="Address or DNS name of the node's sshd as seen from the workstation, "
        "e.g. 10.1.230.180."
    )
    port: int = Field(22, ge=1, le=65535, description="sshd port on the node.")
    user: str = Field(
        min_length=1,
        description="Login user on the node; must be allowed to run `docker` (docker group).",
    )
    host_key: str | None = Field(
        None,
        description="The node's public host key in `ssh-ed25519 AAAA...` form "
        "(`ssh-keyscan -t ed25519 HOST | cut -d' ' -f2-`). Verified on every connection.",
    )
    host_key_file: str | None = Field(
        None,
        description="Path on the workstation of a file holding the node's public host key "
        "(instead of host_key).",
    )
    verify_host_key: bool = Field(
        True,
        description="Verify the node's host key. Setting false is an explicit, insecure "
        "opt-out (then give neither host_key nor host_key_file).",
    )

    @field_validator("host_key")
    @classmethod
    def _host_key_shape(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = v.split()
        key = " ".join(parts[:2])
        if not _HOST_KEY.match(key):
            raise ValueError(
                "not an SSH public host key; fix: paste the `ssh-ed25519 AAAA...` part of "
                "`ssh-keyscan -t ed25519 HOST`"
            )
        return key

    @model_validator(mode="after")
    def _host_key_choice(self) -> SshConfig:
        given = [k for k in ("host_key", "host_key_file") if getattr(self, k) is not None]
        if self.verify_host_key and len(given) != 1:
            raise ValueError(
                "give exactly one of host_key or host_key_file (host keys are verified); "
                "fix: set host_key from `ssh-keyscan -t ed25519 HOST`, or set "
                "verify_host_key: false to opt out explicitly"
            )
        if not self.verify_host_key and given:
            raise ValueError(
                "verify_host_key is false but a host key is given; fix: remove "
                f"{given[0]} or set verify_host_key: true"
            )
        return self


class ClusterLinkConfig(_Closed):
    """The node's side of the fast cluster link (ConnectX-7 on a Spark)."""

    address: IPv4Address = Field(
        description="The node's IPv4 address on the cluster link, e.g. 192.168.100.10. "
        "Ray's node IP, VLLM_HOST_IP and NCCL all use it."
    )
    netdev: str = Field(
        description="The Linux interface holding that address, e.g. enp1s0f1np1 "
        "(`ibdev2netdev` lists them). Used for NCCL/GLOO/TP/UCX interface variables."
    )
    roce_hcas: list[str] = Field(
        default_factory=list,
        description="RoCE HCAs for NCCL_IB_HCA, e.g. [rocep1s0f1, roceP2p1s0f1] (both twins "
        "of a port for full bandwidth). Empty: no RDMA (NCCL uses TCP sockets).",
    )
    expected_mtu: int = Field(
        9000,
        ge=576,
        le=9216,
        description="The MTU the link should have (jumbo frames: 9000).",
    )

    @field_validator("netdev")
    @classmethod
    def _netdev_name(cls, v: str) -> str:
        if not _NETDEV.match(v):
            raise ValueError(
                "not a Linux interface name (1-15 chars, no spaces or slashes); fix: use a "
                "name from `ip -br link` on the node, e.g. enp1s0f1np1"
            )
        return v

    @field_validator("roce_hcas")
    @classmethod
    def _hca_names(cls, v: list[str]) -> list[str]:
        for hca in v:
            if not re.match(r"^[A-Za-z0-9_]+$", hca):
                raise ValueError(
                    f"{hca!r} is not an HCA name; fix: use names from `ibdev2netdev`, "
                    "e.g. rocep1s0f1"
                )
        if len(set(v)) != len(v):
            raise ValueError("an HCA is listed twice; fix: list each HCA once")
        return v


class NodeConfig(_Closed):
    """One GB10 node (a DGX Spark)."""

    name: str = Field(
        description="Short unique node name (lowercase letters, digits, dashes), e.g. "
        "spark-1. Used in resource and container names."
    )
    ssh: SshConfig = Field(description="How to reach the node over SSH.")
    cluster_link: ClusterLinkConfig = Field(description="The node's fast cluster link.")
    gpus: int = Field(1, ge=1, le=8, description="GPUs on the node (a DGX Spark has 1).")

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(
                "node names are 1-32 lowercase letters, digits and inner dashes; fix: use a "
                "name like spark-1"
            )
        return v


class ImageConfig(_Closed):
    """The vLLM image every node runs (the same image ID everywhere)."""

    ref: str = Field(
        description="Image reference, e.g. hellohal2064/vllm-qwen3.5-gb10:latest. It must "
        "contain vLLM with the model's architecture and Ray."
    )
    source: Literal["pull", "tarball", "present"] = Field(
        "pull",
        description="How the head obtains the image once: `pull` from its registry, "
        "`tarball` (docker load -i a file on the head), or `present` (already loaded on the "
        "head). Other nodes always receive it from the head over the cluster link.",
    )
    tarball: str | None = Field(
        None,
        description="Absolute path ON THE HEAD NODE of a `docker save` tarball "
        "(source: tarball only).",
    )
    arch: Literal["aarch64", "x86_64"] = Field(
        "aarch64",
        description="CPU architecture the image is built for; every node must match "
        "(DGX Spark: aarch64).",
    )
    remove_on_destroy: bool = Field(
        False,
        description="Remove the image from the nodes on `pulumi destroy`. Default keeps it: "
        "images are large caches that the next deployment reuses.",
    )

    @model_validator(mode="after")
    def _tarball_rules(self) -> ImageConfig:
        if self.source == "tarball":
            if not self.tarball or not PurePosixPath(self.tarball).is_absolute():
                raise ValueError(
                    "source is tarball but tarball is not an absolute path on the head; "
                    "fix: set image.tarball, e.g. /var/lib/images/vllm.tar"
                )
        elif self.tarball is not None:
            raise ValueError(
                f"tarball is set but source is {self.source!r}; fix: set source: tarball "
                "or remove tarball"
            )
        return self


class ModelConfig(_Closed):
    """The model to serve."""

    id: str = Field(
        description="Hugging Face model id, e.g. Qwen/Qwen3.5-122B-A10B-FP8.",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$",
    )
    revision: str = Field(
        "main",
        description="Model revision (a commit hash pins it; a branch name may move).",
        pattern=r"^[A-Za-z0-9._/-]+$",
    )
    served_name: str | None = Field(
        None, description="Name clients use in requests (default: the model id)."
    )
    hf_cache: str = Field(
        description="Absolute path of the Hugging Face cache ON THE NODES, e.g. "
        "/home/aurora/.cache/huggingface. Mounted into every container."
    )
    offline: bool = Field(
        False,
        description="Serve from the HF cache only (HF_HUB_OFFLINE=1): no node contacts the "
        "hub; the weights must already be in the head's cache.",
    )
    distribution: Literal["copy_from_head", "download_on_each_node"] = Field(
        "copy_from_head",
        description="`copy_from_head`: download once on the head, copy to the other nodes "
        "over the cluster link (verified by the sizes of the resolved files). "
        "`download_on_each_node`: every node downloads for itself.",
    )

    @field_validator("hf_cache")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not PurePosixPath(v).is_absolute():
            raise ValueError(
                "must be an absolute path on the nodes (no ~); fix: e.g. "
                "/home/USER/.cache/huggingface"
            )
        return v

    @property
    def name_for_clients(self) -> str:
        return self.served_name or self.id


class ParallelismConfig(_Closed):
    """How the model is split across GPUs: tensor x pipeline must equal the total GPUs."""

    tensor: int = Field(ge=1, description="Tensor-parallel size (--tensor-parallel-size).")
    pipeline: int = Field(1, ge=1, description="Pipeline-parallel size.")


KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"]
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
LoadFormat = Literal["auto", "safetensors", "fastsafetensors", "pt", "dummy"]

# Flags the typed fields own; extra_args must not set them a second time.
OWNED_FLAGS = {
    "--tensor-parallel-size": "parallelism.tensor",
    "-tp": "parallelism.tensor",
    "--pipeline-parallel-size": "parallelism.pipeline",
    "-pp": "parallelism.pipeline",
    "--distributed-executor-backend": "(always ray)",
    "--host": "(always 0.0.0.0)",
    "--port": "ports.api",
    "--revision": "model.revision",
    "--served-model-name": "model.served_name",
    "--api-key": "the api_key secret",
    "--gpu-memory-utilization": "vllm.gpu_memory_utilization",
    "--max-model-len": "vllm.max_model_len",
    "--max-num-batched-tokens": "vllm.max_num_batched_tokens",
    "--kv-cache-dtype": "vllm.kv_cache_dtype",
    "--dtype": "vllm.dtype",
    "--load-format": "vllm.load_format",
    "--enable-prefix-caching": "vllm.enable_prefix_caching",
    "--reasoning-parser": "vllm.reasoning_parser",
    "--enable-auto-tool-choice": "vllm.enable_auto_tool_choice",
    "--tool-call-parser": "vllm.tool_call_parser",
    "--speculative-config": "vllm.speculative_config",
    "--enable-expert-parallel": "vllm.enable_expert_parallel",
    "--language-model-only": "vllm.language_model_only",
}


class VllmConfig(_Closed):
    """`vllm serve` options (the ones the field notes use, typed) plus extra arguments."""

    gpu_memory_utilization: float = Field(
        0.8,
        gt=0,
        description="Fraction of (unified) memory vLLM may take. At most "
        f"{MAX_UNIFIED_MEMORY_UTILIZATION} on GB10: the OS and page cache share that memory.",
    )
    max_model_len: int | None = Field(None, ge=16, description="Context length (--max-model-len).")
    max_num_batched_tokens: int | None = Field(None, ge=16, description="--max-num-batched-tokens.")
    dtype: Dtype = Field("auto", description="--dtype (weights/activations).")
    kv_cache_dtype: KvCacheDtype = Field("auto", description="--kv-cache-dtype, e.g. fp8.")
    load_format: LoadFormat = Field(
        "auto",
        description="--load-format; fastsafetensors loads big models much faster.",
    )
    enable_prefix_caching: bool = Field(False, description="--enable-prefix-caching.")
    reasoning_parser: str | None = Field(None, description="--reasoning-parser, e.g. qwen3.")
    enable_auto_tool_choice: bool = Field(
        False, description="--enable-auto-tool-choice (needs tool_call_parser)."
    )
    tool_call_parser: str | None = Field(None, description="--tool-call-parser, e.g. qwen3_coder.")
    speculative_config: dict[str, Any] | None = Field(
        None,
        description='--speculative-config as an object, e.g. {"method": "mtp", '
        '"num_speculative_tokens": 1}.',
    )
    enable_expert_parallel: bool = Field(False, description="--enable-expert-parallel.")
    language_model_only: bool = Field(False, description="--language-model-only.")
    extra_args: list[str] = Field(
        default_factory=list,
        description="More `vllm serve` arguments, passed as given (one list item per argv "
        "word). Must not repeat a flag a typed field owns.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment for the model server, e.g. "
        "{VLLM_FLASHINFER_MOE_BACKEND: latency}. Must not override per-node network variables.",
    )
    nccl_debug: Literal["WARN", "INFO", "TRACE"] | None = Field(
        "INFO",
        description="NCCL_DEBUG level. INFO lets the health check tell NET/IB from NET/Socket.",
    )

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _unified_memory(cls, v: float) -> float:
        if v > MAX_UNIFIED_MEMORY_UTILIZATION:
            raise ValueError(
                f"above {MAX_UNIFIED_MEMORY_UTILIZATION}: on GB10 unified memory the OS and "
                "page cache share the GPU's memory, start-up fails or the host wedges; fix: "
                "use 0.7-0.85"
            )
        return v

    @field_validator("extra_args")
    @classmethod
    def _no_owned_flags(cls, v: list[str]) -> list[str]:
        for arg in v:
            flag = arg.split("=", 1)[0]
            if flag in OWNED_FLAGS:
                raise ValueError(
                    f"{arg!r} sets a flag that {OWNED_FLAGS[flag]} owns; fix: remove it from "
                    f"extra_args and set {OWNED_FLAGS[flag]}"
                )
        return v

    @model_validator(mode="after")
    def _tool_choice_needs_parser(self) -> VllmConfig:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError(
                "enable_auto_tool_choice needs tool_call_parser; fix: set "
                "vllm.tool_call_parser, e.g. qwen3_coder"
            )
        return self


class PortsConfig(_Closed):
    """Ports on the nodes (host network): Ray GCS, Ray dashboard, the OpenAI API."""

    ray_gcs: int = Field(6379, ge=1024, le=65535, description="Ray GCS port on the head.")
    ray_dashboard: int = Field(8265, ge=1024, le=65535, description="Ray dashboard port.")
    api: int = Field(8000, ge=1024, le=65535, description="OpenAI-compatible API port.")

    @model_validator(mode="after")
    def _distinct(self) -> PortsConfig:
        used = [self.ray_gcs, self.ray_dashboard, self.api]
        if len(set(used)) != 3:
            raise ValueError(
                f"ports must differ, got ray_gcs={self.ray_gcs}, ray_dashboard="
                f"{self.ray_dashboard}, api={self.api}; fix: give each its own port"
            )
        return self


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
    model: ModelConfig = Field(description="The model.")
    parallelism: ParallelismConfig = Field(description="Tensor/pipeline parallel sizes.")
    vllm: VllmConfig = Field(default_factory=lambda: VllmConfig(), description="vLLM options.")
    ports: PortsConfig = Field(default_factory=lambda: PortsConfig(), description="Ports.")
    timeouts: TimeoutsConfig = Field(default_factory=lambda: TimeoutsConfig(), description="Waits.")
    drop_page_cache: bool = Field(
        False,
        description="Drop the page cache on every node right before the model server starts "
        "(unified memory: cudaMemGetInfo does not count reclaimable cache as free). Needs "
        "root or passwordless sudo on the nodes.",
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
    api_key: SecretStr | None = Field(
        None,
        description="SECRET, optional. API key clients must send (`pulumi config set "
        "--secret api_key ...`).",
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> StackConfig:
        issues = list(_cross_field_issues(self))
        if issues:
            raise ConfigError(issues)
        return self

    @property
    def head_node(self) -> NodeConfig:
        return next(n for n in self.nodes if n.name == self.head)

    @property
    def worker_nodes(self) -> list[NodeConfig]:
        return [n for n in self.nodes if n.name != self.head]

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)


SECRET_FIELDS = {"ssh_private_key", "api_key"}


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
    p = cfg.parallelism
    if p.tensor * p.pipeline != cfg.total_gpus:
        yield Issue(
            path="parallelism",
            value={"tensor": p.tensor, "pipeline": p.pipeline},
            problem=f"tensor x pipeline = {p.tensor * p.pipeline}, but the nodes declare "
            f"{cfg.total_gpus} GPU(s) in all",
            fix=f"make tensor x pipeline equal {cfg.total_gpus} (e.g. tensor: "
            f"{cfg.total_gpus}), or change the nodes",
        )
    for key in cfg.vllm.env:
        if key in RESERVED_ENV:
            yield Issue(
                path=f"vllm.env.{key}",
                value=cfg.vllm.env[key],
                problem="this variable is set per node by the program (each node its own value)",
                fix=f"remove it; {RESERVED_ENV[key]}",
            )
    keys = [k for k in ("ssh_private_key", "ssh_private_key_file") if getattr(cfg, k)]
    if len(keys) != 1:
        yield Issue(
            path="ssh_private_key",
            value=None if not keys else "[both given]",
            problem="exactly one of ssh_private_key (secret) or ssh_private_key_file is needed",
            fix="run `pulumi config set --secret ssh_private_key < ~/.ssh/id_ed25519` or set "
            "ssh_private_key_file",
        )


# Variables the program derives per node; a user value would be copied to every node.
RESERVED_ENV = {
    "VLLM_HOST_IP": "it is each node's cluster_link.address",
    "RAY_NODE_IP_ADDRESS": "it is each node's cluster_link.address",
    "RAY_OVERRIDE_NODE_IP_ADDRESS": "it is each node's cluster_link.address",
    "NCCL_SOCKET_IFNAME": "it is each node's cluster_link.netdev",
    "GLOO_SOCKET_IFNAME": "it is each node's cluster_link.netdev",
    "TP_SOCKET_IFNAME": "it is each node's cluster_link.netdev",
    "UCX_NET_DEVICES": "it is each node's cluster_link.netdev",
    "OMPI_MCA_btl_tcp_if_include": "it is each node's cluster_link.netdev",
    "NCCL_IB_HCA": "set cluster_link.roce_hcas",
    "NCCL_IB_DISABLE": "set cluster_link.roce_hcas (empty disables RDMA)",
    "NCCL_DEBUG": "set vllm.nccl_debug",
    "RAY_ADDRESS": "it is the head's address and ports.ray_gcs",
    "VLLM_API_KEY": "set the api_key secret",
    "HF_HUB_OFFLINE": "set model.offline",
}


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _walk(loc: tuple[int | str, ...]) -> tuple[type[BaseModel] | None, str | None]:
    """The model class reached by `loc` and the description of the last field on it."""
    model: type[BaseModel] | None = StackConfig
    desc = None
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return None, desc
        field = model.model_fields[part]
        desc = field.description
        ann = field.annotation
        candidates = getattr(ann, "__args__", None) or (ann,)
        model = next(
            (a for a in candidates if isinstance(a, type) and issubclass(a, BaseModel)), None
        )
    return model, desc


def _issue_from_pydantic(err: Mapping[str, Any]) -> Issue:
    loc = tuple(err["loc"])
    msg = str(err["msg"])
    msg = msg.removeprefix("Value error, ")
    if "; fix: " in msg:
        problem, fix = msg.split("; fix: ", 1)
    else:
        problem = msg
        _, desc = _walk(loc)
        if err["type"] == "extra_forbidden":
            parent, _ = _walk(loc[:-1])
            allowed = ", ".join(parent.model_fields) if parent else "see the config reference"
            fix = f"remove it or fix its spelling; allowed here: {allowed}"
        elif err["type"] == "missing":
            fix = f"add it: {desc or 'see the config reference'}"
        else:
            fix = f"give {desc or 'a valid value (see the config reference)'}"
    value = err.get("input")
    if err["type"] == "missing":
        value = "(missing)"
    if isinstance(value, dict) and err["type"] not in ("extra_forbidden",):
        value = {k: v for k, v in value.items() if k not in SECRET_FIELDS}
    return Issue(
        path=_format_loc(loc) or "(top level)",
        value=value,
        problem=problem.rstrip("."),
        fix=fix.rstrip("."),
    )


def load_stack_config(raw: Mapping[str, Any]) -> StackConfig:
    """Validate a raw stack config (the `spark-vllm:` keys, namespace stripped).

    Raises ConfigError naming every bad field, its value and the fix.
    """
    try:
        return StackConfig.model_validate(dict(raw))
    except ValidationError as e:
        raise ConfigError(_issue_from_pydantic(err) for err in e.errors()) from None


def parse_pulumi_config(values: Mapping[str, str], secret_keys: Iterable[str]) -> dict[str, Any]:
    """Turn Pulumi's flat `spark-vllm:key -> string` config into the raw schema input.

    Structured values arrive as JSON strings. Keys of other namespaces are ignored.
    Secrets set in plain text are refused: they would sit unencrypted in the stack file.
    """
    secret = set(secret_keys)
    raw: dict[str, Any] = {}
    issues: list[Issue] = []
    for full_key, text in values.items():
        ns, _, key = full_key.partition(":")
        if ns != PROJECT:
            continue
        if key in SECRET_FIELDS and full_key not in secret:
            issues.append(
                Issue(
                    path=key,
                    value="[secret]",
                    problem="set in plain text, so it is stored unencrypted",
                    fix=f"run `pulumi config rm {key}` then `pulumi config set --secret {key} ...`",
                )
            )
            continue
        if key in SECRET_FIELDS:
            raw[key] = text
            continue
        try:
            raw[key] = json.loads(text)
        except json.JSONDecodeError:
            raw[key] = text
    if issues:
        raise ConfigError(issues)
    return raw


def json_schema() -> dict[str, Any]:
    """JSON Schema of a `Pulumi.<stack>.yaml` file for this project (for editors)."""
    inner = StackConfig.model_json_schema(ref_template="#/$defs/{model}")
    defs = inner.pop("$defs", {})
    props: dict[str, Any] = {}
    secret_value = {
        "type": "object",
        "properties": {"secure": {"type": "string"}},
        "required": ["secure"],
        "additionalProperties": False,
        "description": "Encrypted by `pulumi config set --secret`.",
    }
    for key, schema in inner["properties"].items():
        if key in SECRET_FIELDS:
            schema = {"description": schema.get("description", ""), **secret_value}
        props[f"{PROJECT}:{key}"] = schema
    required = [f"{PROJECT}:{k}" for k in inner.get("required", [])]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"Pulumi stack file for {PROJECT}",
        "type": "object",
        "properties": {
            "config": {
                "type": "object",
                "properties": props,
                "required": required,
                "patternProperties": {r"^(?!spark-vllm:).+:.+$": {}},
                "additionalProperties": False,
            },
            "encryptionsalt": {"type": "string"},
            "secretsprovider": {"type": "string"},
            "encryptedkey": {"type": "string"},
        },
        "$defs": defs,
    }
