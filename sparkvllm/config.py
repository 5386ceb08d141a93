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

import itertools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, ip_address
from pathlib import Path, PurePosixPath
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sparkvllm.host_keys import HOST_KEY_FIX, HostKeyError, parse_host_key
from sparkvllm.vllm_flags import extra_args_problems

PROJECT = "spark-vllm"
# The project folder (Pulumi.yaml, the stack files, schema/): the default for tools.
PROJECT_DIR = Path(__file__).resolve().parent.parent

# Unified memory (GB10): cudaMemGetInfo ignores reclaimable page cache, and an OOM can
# wedge the host until a power cycle. Above this fraction vLLM's start-up fails with "Free
# memory ... less than desired GPU memory utilization", or the box hangs.
MAX_UNIFIED_MEMORY_UTILIZATION = 0.9

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
# Linux interface names: 1-15 chars, no '/', ':' or whitespace (dev_valid_name); a leading
# '-' would read as an option to `ip`.
_NETDEV = re.compile(r"^(?!\.\.?$)[A-Za-z0-9_.][A-Za-z0-9_.-]{0,14}$")
# Login names as useradd takes them (no leading '-': it would read as an ssh option).
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
# A DNS name (RFC 1123 labels, none starting or ending with '-').
_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*\.?$")
# Absolute paths on the nodes: no spaces or shell/docker metacharacters (':' and ',' split
# docker's -v syntax), no '..' segment.
_NODE_PATH = re.compile(r"^/[A-Za-z0-9._@%+=/-]*$")
# Docker's image reference grammar (distribution/reference regexp.go): [domain[:port]/]
# path[:tag][@digest].
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REF = re.compile(
    rf"^(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:"
    r"[0-9a-fA-F]{32,})?$"
)
# Names of vLLM plugins (parsers, speculative methods): qwen3, qwen3_coder, granite-20b-fc.
_PLUGIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Variables a non-interactive bash (the containers' `bash -c` entrypoints) acts on at start
# or while it runs (bash(1) INVOCATION and Shell Variables): BASH_ENV and ENV name a file it
# sources after expanding them (`$(cmd)` runs), SHELLOPTS/BASHOPTS set options (xtrace),
# PS4 is expanded for every traced command, BASH_XTRACEFD redirects the trace, IFS, CDPATH
# and GLOBIGNORE change how the script's words are split and found; the prompts and
# PROMPT_COMMAND run code in an interactive one. None of them is vLLM's or NCCL's.
SHELL_STARTUP_VARIABLES = frozenset(
    {"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS0", "PS1", "PS2", "PS3", "PS4",
     "PROMPT_COMMAND", "BASH_XTRACEFD", "IFS", "CDPATH", "GLOBIGNORE"}
)  # fmt: skip
# Words of a variable name that mark a secret (HF_TOKEN, OPENAI_API_KEY, DB_PASSWORD ...).
_SECRET_WORDS = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "CREDENTIALS"}
_SECRET_PAIRS = {("API", "KEY"), ("PRIVATE", "KEY"), ("ACCESS", "KEY")}
MAX_CONTEXT_TOKENS = 2**24


def _host_problem(v: str) -> str | None:
    """Why `v` is not an IP address or DNS name, or None."""
    try:
        ip_address(v)
        return None
    except ValueError:
        pass
    if len(v) <= 253 and _HOSTNAME.match(v):
        return None
    return (
        "not an IP address or DNS name (letters, digits, dots and inner dashes); fix: give "
        "the address or name ssh reaches, e.g. 10.1.230.180 or spark-1.lab"
    )


_BEARER_FIX = {
    "api_key": ("an API key", "generate one, e.g. `openssl rand -hex 32`"),
    "hf_token": (
        "a Hugging Face token",
        "copy a read token from https://huggingface.co/settings/tokens",
    ),
}
HUB_ENDPOINT = "https://huggingface.co"
_HUB_PATH = re.compile(r"^(/[A-Za-z0-9._~-]+)*/?$")


def _hub_url_problem(v: str) -> str | None:
    """Why `v` is not a plain http(s) URL of a hub (scheme, host, port, path), or None."""
    fix = "fix: e.g. https://huggingface.co or http://10.0.0.5:8080 (a mirror)"
    try:
        u = urlsplit(v)
        port = u.port
    except ValueError:
        return f"not a URL; {fix}"
    if u.scheme not in ("http", "https") or not u.hostname:
        return f"needs http:// or https:// and a host; {fix}"
    if u.username or u.password or u.query or u.fragment:
        return f"no user, password, query or fragment (a token is the hf_token secret); {fix}"
    host_problem = _host_problem(u.hostname)
    if host_problem or (port is not None and not 0 < port < 65536):
        return f"the host or port is not valid; {fix}"
    if not _HUB_PATH.match(u.path):
        return f"the path may hold letters, digits and . _ ~ - / only; {fix}"
    return None


def _node_path_problem(v: str) -> str | None:
    if not PurePosixPath(v).is_absolute():
        return (
            "must be an absolute path on the nodes (no ~); fix: e.g. /home/USER/.cache/huggingface"
        )
    if not _NODE_PATH.match(v) or ".." in v.split("/") or v.rstrip("/") == "":
        return (
            "paths on the nodes may hold letters, digits and . _ @ % + = / - only (no spaces, "
            "quotes, ':' or '..') and not be /; fix: use a plain absolute path such as "
            "/var/lib/images/vllm.tar"
        )
    return None


def _node_path(v: str) -> str:
    """A path on the nodes, or ValueError naming the problem (_node_path_problem)."""
    problem = _node_path_problem(v)
    if problem:
        raise ValueError(problem)
    return v


def _no_control_chars(v: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise ValueError("holds a control character (newline, tab, NUL ...); fix: remove it")
    return v


def _key_file(v: str) -> str:
    """A key file's path: given, so not empty (an empty one would quietly mean "unset")."""
    if not v.strip():
        raise ValueError("is empty; fix: give the key file's path, or leave the key out")
    return _no_control_chars(v)


_JSON_TEXT = re.compile(r"^[A-Za-z0-9._/:@+=-]{0,256}$")


def _json_value_problem(value: Any, where: str, depth: int) -> str | None:
    """Why `value` (a config object passed to vLLM as JSON) is not plain data, or None."""
    if depth > 3:
        return f"{where} nests deeper than 3 levels; fix: flatten it"
    if isinstance(value, dict):
        for k, v in value.items():
            if not (isinstance(k, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$", k)):
                return f"{where} key {str(k)[:80]!r} is not an option name; fix: rename it"
            problem = _json_value_problem(v, f"{where}.{k}", depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, list):
        for i, v in enumerate(value[:64]):
            problem = _json_value_problem(v, f"{where}[{i}]", depth + 1)
            if problem:
                return problem
        return None if len(value) <= 64 else f"{where} has more than 64 items; fix: shorten it"
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        ok = abs(value) < 2**31
    elif isinstance(value, float):
        ok = value == value and abs(value) < 1e12
    elif isinstance(value, str):
        ok = bool(_JSON_TEXT.match(value))
    else:
        ok = False
    if ok:
        return None
    return (
        f"{where} = {str(value)[:80]!r} is not a plain value (a number, true/false, or a "
        "name of letters, digits and . _ / : @ + = -); fix: correct it"
    )


def is_secret_name(name: str) -> bool:
    """True for variable names that say they hold a secret (HF_TOKEN, X_API_KEY ...)."""
    words = name.upper().split("_")
    return bool(_SECRET_WORDS & set(words)) or any(
        pair in _SECRET_PAIRS for pair in itertools.pairwise(words)
    )


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

    def __init__(self, issues: Iterable[Issue], what: str = "stack config is invalid"):
        self.issues = list(issues)
        lines = "\n".join(f"  - {i.render()}" for i in self.issues)
        noun = "problem" if len(self.issues) == 1 else "problems"
        super().__init__(f"{what} ({len(self.issues)} {noun}); nothing was deployed:\n{lines}")


def _redacted(path: str, value: Any) -> str:
    if path in SECRET_FIELDS or isinstance(value, SecretStr):
        return "'[secret]'"
    shown = repr(value)
    # A very long value is cut: the line must stay readable in `pulumi up` output.
    return shown if len(shown) <= 200 else f"{shown[:200]}... ({len(shown)} characters)"


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class _SshEndpoint(_Closed):
    """An sshd the workstation logs in to: a node or a jump host."""

    host: str = Field(
        description="Address or DNS name of the sshd as seen from the workstation, "
        "e.g. 10.1.230.180."
    )
    port: int = Field(22, ge=1, le=65535, description="sshd port.")
    user: str = Field(
        min_length=1,
        description="Login user (on a node: must be allowed to run `docker`, the docker group).",
    )
    host_key: str | None = Field(
        None,
        description="The sshd's public host key in `ssh-ed25519 AAAA...` form "
        "(`ssh-keyscan -t ed25519 HOST | cut -d' ' -f2-`). Verified on every connection.",
    )
    host_key_file: str | None = Field(
        None,
        description="Path on the workstation of a file holding the public host key "
        "(instead of host_key).",
    )
    verify_host_key: bool = Field(
        True,
        description="Verify the host key. Setting false is an explicit, insecure "
        "opt-out (then give neither host_key nor host_key_file).",
    )

    @field_validator("host")
    @classmethod
    def _host_shape(cls, v: str) -> str:
        problem = _host_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("user")
    @classmethod
    def _user_shape(cls, v: str) -> str:
        if not _USER.match(v):
            raise ValueError(
                "not a login name (1-32 letters, digits, '_', '.', '-', not starting with "
                "'-' or a digit); fix: give the user you ssh in as, e.g. aurora"
            )
        return v

    @field_validator("host_key")
    @classmethod
    def _host_key_shape(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            return parse_host_key(v)
        except HostKeyError as e:
            raise ValueError(
                f"not a usable SSH public host key: {e}; fix: {HOST_KEY_FIX}"
            ) from None

    @field_validator("host_key_file")
    @classmethod
    def _host_key_file_text(cls, v: str | None) -> str | None:
        return None if v is None else _no_control_chars(v)

    @model_validator(mode="after")
    def _host_key_choice(self) -> _SshEndpoint:
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


class JumpConfig(_SshEndpoint):
    """A jump host (bastion) the workstation reaches a node through (ssh's ProxyJump; its
    host key verified like a node's). It is logged in to with the node's own key."""


class SshConfig(_SshEndpoint):
    """How the workstation reaches a node's sshd (and how nodes reach each other)."""

    jump: JumpConfig | None = Field(
        None,
        description="The jump host this node is reached through (default: the stack-wide "
        "ssh_jump, if any). Nodes reach each other directly over the cluster link.",
    )
    private_key_file: str | None = Field(
        None,
        description="Path on the workstation of this node's own private key (default: its "
        "entry in the ssh_private_keys secret, else the stack-wide key).",
    )

    @field_validator("private_key_file")
    @classmethod
    def _key_file_path(cls, v: str | None) -> str | None:
        return None if v is None else _key_file(v)


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
                "not a Linux interface name (1-15 letters, digits, '_', '.', '-', not "
                "starting with '-'); fix: use a name from `ip -br link` on the node, e.g. "
                "enp1s0f1np1"
            )
        return v

    @field_validator("roce_hcas")
    @classmethod
    def _hca_names(cls, v: list[str]) -> list[str]:
        for hca in v:
            if not re.match(r"^[A-Za-z0-9_]{1,64}$", hca):
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
        "contain vLLM with the model's architecture (and Ray, for parallelism.launcher ray)."
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

    @field_validator("ref")
    @classmethod
    def _ref_grammar(cls, v: str) -> str:
        if len(v) > 255 or not _IMAGE_REF.match(v):
            raise ValueError(
                "not a Docker image reference ([registry[:port]/]name[:tag][@sha256:...], "
                "lowercase name); fix: e.g. hellohal2064/vllm-qwen3.5-gb10:latest"
            )
        return v

    @property
    def digest(self) -> str | None:
        """The `sha256:...` the reference pins, or None (a tag, which may move)."""
        return self.ref.split("@", 1)[1] if "@" in self.ref else None

    @property
    def repository(self) -> str:
        """The reference without tag or digest."""
        name = self.ref.split("@", 1)[0]
        last = name.rsplit("/", 1)[-1]
        return name[: len(name) - len(last)] + last.split(":", 1)[0]

    @property
    def moving(self) -> bool:
        """No digest and the tag `latest` (or none, which means latest)."""
        if self.digest:
            return False
        last = self.ref.rsplit("/", 1)[-1]
        return ":" not in last or last.split(":", 1)[1] == "latest"

    @property
    def local_ref(self) -> str:
        """What every node runs and checks: the reference itself, or for a digest-pinned
        one a local tag that names the digest (`repo:sha256-<hex>`): a registry digest
        exists only where the image was pulled, and `docker save | docker load` carries
        tags, not digests, to the other nodes."""
        if not self.digest:
            return self.ref
        return f"{self.repository}:{self.digest.replace(':', '-')}"

    @field_validator("tarball")
    @classmethod
    def _tarball_path(cls, v: str | None) -> str | None:
        return None if v is None else _node_path(v)

    @model_validator(mode="after")
    def _tarball_rules(self) -> ImageConfig:
        if self.digest and self.source == "tarball":
            raise ValueError(
                f"ref {self.ref} pins a registry digest, which `docker load` of a tarball does "
                "not record; fix: use source: pull (or present, for an image pulled by that "
                "digest), or give the tarball's tag as ref"
            )
        if self.digest and not self.digest.startswith("sha256:"):
            raise ValueError(
                f"ref {self.ref}: only sha256 digests are supported; fix: use @sha256:<64 hex>"
            )
        if self.digest and len(self.digest) != len("sha256:") + 64:
            raise ValueError(
                f"ref {self.ref}: a sha256 digest has 64 hex digits; fix: copy it whole"
            )
        if self.digest and self.digest != self.digest.lower():
            # distribution/reference digest.go: the encoded part is lower-case hex (docker
            # refuses "invalid reference format" at the pull, after the plan).
            raise ValueError(
                f"ref {self.ref}: a digest is lower-case hex; fix: write it in lower case"
            )
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
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$",
    )
    revision: str = Field(
        "main",
        description="Model revision (a commit hash pins it; a branch name may move).",
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9._/-]{0,127}$",
    )
    served_name: str | None = Field(
        None,
        description="Name clients use in requests (default: the model id).",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$",
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
    hub_endpoint: str = Field(
        HUB_ENDPOINT,
        description="The hub the weights are downloaded from (huggingface_hub's "
        "HF_ENDPOINT): the Hugging Face hub, or a mirror of it.",
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
        return _node_path(v)

    @field_validator("hub_endpoint")
    @classmethod
    def _hub_endpoint_is_a_url(cls, v: str) -> str:
        problem = _hub_url_problem(v)
        if problem:
            raise ValueError(problem)
        return v.rstrip("/")

    @field_validator("revision")
    @classmethod
    def _revision_stays_in_the_cache(cls, v: str) -> str:
        if ".." in v.split("/") or v.endswith("/"):
            raise ValueError(
                "a revision is a branch, tag or commit hash (no '..' segment or trailing "
                "'/'); fix: e.g. main or a 40-character commit hash"
            )
        return v

    @property
    def name_for_clients(self) -> str:
        return self.served_name or self.id


Launcher = Literal["auto", "ray", "native"]


class ParallelismConfig(_Closed):
    """How the model is split across GPUs: tensor x pipeline must equal the total GPUs."""

    tensor: int = Field(ge=1, description="Tensor-parallel size (--tensor-parallel-size).")
    pipeline: int = Field(1, ge=1, description="Pipeline-parallel size.")
    launcher: Launcher = Field(
        "auto",
        description="How the ranks run across the nodes. `native`: vLLM's own multi-node "
        "launcher, one `vllm serve` container per node (rank 0 on the head serves the API, "
        "the others `--headless`), no Ray; `ray`: a Ray cluster and `vllm serve "
        "--distributed-executor-backend ray` on the head (needs an image with Ray); `auto`: "
        "`ray` when the image holds Ray, else `native` (read on the head with the image's "
        "versions).",
    )


KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"]
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
LoadFormat = Literal["auto", "safetensors", "fastsafetensors", "pt", "dummy"]


class VllmConfig(_Closed):
    """`vllm serve` options (the ones a GB10 deployment sets, typed) plus extra arguments."""

    gpu_memory_utilization: float = Field(
        0.8,
        gt=0,
        allow_inf_nan=False,
        description="Fraction of (unified) memory vLLM may take. At most "
        f"{MAX_UNIFIED_MEMORY_UTILIZATION} on GB10: the OS and page cache share that memory.",
    )
    max_model_len: int | None = Field(
        None, ge=16, le=MAX_CONTEXT_TOKENS, description="Context length (--max-model-len)."
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=16, le=MAX_CONTEXT_TOKENS, description="--max-num-batched-tokens."
    )
    dtype: Dtype = Field("auto", description="--dtype (weights/activations).")
    kv_cache_dtype: KvCacheDtype = Field("auto", description="--kv-cache-dtype, e.g. fp8.")
    load_format: LoadFormat = Field(
        "auto",
        description="--load-format; fastsafetensors loads big models much faster.",
    )
    enable_prefix_caching: bool = Field(False, description="--enable-prefix-caching.")
    reasoning_parser: str | None = Field(
        None, description="--reasoning-parser, e.g. qwen3.", pattern=_PLUGIN_NAME.pattern
    )
    enable_auto_tool_choice: bool = Field(
        False, description="--enable-auto-tool-choice (needs tool_call_parser)."
    )
    tool_call_parser: str | None = Field(
        None, description="--tool-call-parser, e.g. qwen3_coder.", pattern=_PLUGIN_NAME.pattern
    )
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
        if len(v) > 128:
            raise ValueError("more than 128 arguments; fix: keep extra_args short")
        problems = extra_args_problems(v)
        if problems:
            i, problem, fix = problems[0]
            raise ValueError(f"item {i} {v[i][:80]!r}: {problem}; fix: {fix}")
        for i, arg in enumerate(v):
            if len(arg) > 4096:
                raise ValueError(f"item {i} is longer than 4096 characters; fix: shorten it")
        return v

    @field_validator("speculative_config")
    @classmethod
    def _speculative_values(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        problem = _json_value_problem(v, "speculative_config", depth=0)
        if problem:
            raise ValueError(problem)
        method = v.get("method")
        if method is not None and not (isinstance(method, str) and _PLUGIN_NAME.match(method)):
            raise ValueError(
                f"method {str(method)[:80]!r} is not a method name; fix: e.g. mtp, eagle, ngram"
            )
        return v

    @field_validator("env")
    @classmethod
    def _env_names_and_values(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _ENV_NAME.match(key):
                raise ValueError(
                    f"{key[:80]!r} is not a variable name (letters, digits, '_', not starting "
                    "with a digit); fix: rename it"
                )
            if key in SHELL_STARTUP_VARIABLES:
                raise ValueError(
                    f"{key} is read by the shell that starts the model server (bash "
                    "expands and runs what it names before the container's own command), "
                    "so its value could run a command; fix: remove it"
                )
            if is_secret_name(key):
                raise ValueError(
                    f"{key} names a secret, which would sit in plain text in the stack "
                    "config, the state and the container's inspect output; fix: remove it "
                    "(the API key is the api_key secret)"
                )
            if len(value) > 4096 or any(ord(c) < 32 and c != "\t" for c in value):
                raise ValueError(
                    f"the value of {key} holds a control character (newline, NUL ...) or "
                    "is longer than 4096 characters; fix: give a one-line value"
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


# Ports Ray takes on its own on every node (ray start's defaults): Ray Client on the head,
# the range its worker processes listen in, the dashboard agent, the dashboard's and the
# autoscaler's Prometheus servers, and the Ray Client's per-session servers.
RAY_OWN_PORTS = (
    (10001, 10001, "Ray Client server (head)"),
    (10002, 19999, "Ray's worker port range"),
    (23000, 23999, "Ray Client session servers (head)"),
    (44217, 44217, "Ray autoscaler metrics (head)"),
    (44227, 44227, "Ray dashboard metrics (head)"),
    (52365, 52365, "Ray dashboard agent"),
)


def ray_port_owner(port: int) -> str | None:
    return next((what for lo, hi, what in RAY_OWN_PORTS if lo <= port <= hi), None)


class PortsConfig(_Closed):
    """Ports on the nodes (host network): Ray GCS and dashboard (launcher ray), the
    native launcher's master port, the OpenAI API."""

    ray_gcs: int = Field(6379, ge=1024, le=65535, description="Ray GCS port on the head.")
    ray_dashboard: int = Field(8265, ge=1024, le=65535, description="Ray dashboard port.")
    master: int = Field(
        29501,
        ge=1024,
        le=65535,
        description="The native launcher's rendezvous port on the head's cluster-link "
        "address (--master-port; vLLM's default).",
    )
    api: int = Field(8000, ge=1024, le=65535, description="OpenAI-compatible API port.")

    @model_validator(mode="after")
    def _distinct(self) -> PortsConfig:
        named = {"ray_gcs": self.ray_gcs, "ray_dashboard": self.ray_dashboard,
                 "master": self.master, "api": self.api}  # fmt: skip
        if len(set(named.values())) != len(named):
            given = ", ".join(f"{k}={v}" for k, v in named.items())
            raise ValueError(f"ports must differ, got {given}; fix: give each its own port")
        for name, port in named.items():
            owner = ray_port_owner(port)
            if owner:
                raise ValueError(
                    f"{name}={port} is taken by {owner} on the nodes; fix: pick a port "
                    "outside 10001-19999, 23000-23999, 44217, 44227 and 52365 (defaults: "
                    "ray_gcs 6379, ray_dashboard 8265, master 29501, api 8000)"
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
    answer_s: int = Field(
        60,
        ge=5,
        le=600,
        description="Seconds a served model may take to generate one token before the "
        "liveness reads (refresh's server guard, the drift check) call it stuck. A new "
        "value re-runs nothing: the containers' own Docker healthcheck keeps 60 s.",
    )


NcclLibrary = Literal["image", "host"]
# Where the host's library appears in every Ray and rank container (mounted read-only).
HOST_NCCL_IN_CONTAINER = "/opt/sparkvllm/host-nccl/libnccl.so.2"
# What loads it: the dynamic loader before any other library (torch.distributed's NCCL
# and every other user), and vLLM's own pynccl (vllm/utils find_nccl_library).
HOST_NCCL_ENV = {"LD_PRELOAD": HOST_NCCL_IN_CONTAINER, "VLLM_NCCL_SO_PATH": HOST_NCCL_IN_CONTAINER}


class NcclConfig(_Closed):
    """Which NCCL library the containers load."""

    library: NcclLibrary = Field(
        "image",
        description="`image`: the NCCL the image ships (pip's nvidia-nccl). `host`: each "
        "node's own libnccl (DGX OS's), mounted read-only into every Ray and rank container "
        "and preloaded there (LD_PRELOAD, VLLM_NCCL_SO_PATH): the fix for the TP=2 stall "
        "seen with the pip-bundled library on two Sparks (vllm-project/vllm#42354). Checked "
        "on every node at preflight.",
    )
    host_path: str | None = Field(
        None,
        description="nccl.library host: the library's path on every node (default "
        "/usr/lib/<image.arch>-linux-gnu/libnccl.so.2, where Debian's and DGX OS's libnccl2 "
        "put it).",
    )

    @field_validator("host_path")
    @classmethod
    def _host_path(cls, v: str | None) -> str | None:
        return None if v is None else _node_path(v)


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

    @model_validator(mode="after")
    def _cross_field_rules(self) -> StackConfig:
        issues = list(_cross_field_issues(self))
        if issues:
            raise ConfigError(issues)
        return self

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


SECRET_FIELDS = {"ssh_private_key", "ssh_private_keys", "api_key", "hf_token"}
# Secrets that are maps: `pulumi config set --secret --path 'ssh_private_keys.spark-2'`
# stores a map, and the program receives it as JSON text (as every structured value).
STRUCTURED_SECRETS = {"ssh_private_keys"}


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
    if cfg.nccl.library == "host":
        for key in sorted(set(cfg.vllm.env) & set(HOST_NCCL_ENV)):
            yield Issue(
                path=f"vllm.env.{key}",
                value=cfg.vllm.env[key],
                problem="nccl.library host sets it to the host's NCCL library",
                fix="remove it (or set nccl.library: image)",
            )
    elif cfg.nccl.host_path is not None:
        yield Issue(
            path="nccl.host_path",
            value=cfg.nccl.host_path,
            problem="only used with nccl.library host",
            fix="set nccl.library: host, or remove nccl.host_path",
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


@dataclass(frozen=True)
class ProgramVariable:
    """An environment variable the program sets in the containers itself. A user value in
    vllm.env is refused (it would be copied to every node); `set_by` says what to set
    instead. `per_node` names the node's own value it carries (its cluster address or
    netdev, or its RoCE HCAs): those are never copied from the head to Ray workers."""

    name: str
    set_by: str
    per_node: Literal["address", "netdev", "roce"] | None = None


_OWN_ADDRESS = "it is each node's cluster_link.address"
_OWN_NETDEV = "it is each node's cluster_link.netdev"
# The one table: the refusal of vllm.env keys, vLLM's non-carry-over list
# (specs/environment.NON_CARRY_OVER) and each node's variables (node_env) derive from it.
PROGRAM_VARIABLES = (
    ProgramVariable("VLLM_HOST_IP", _OWN_ADDRESS, "address"),
    ProgramVariable("RAY_NODE_IP_ADDRESS", _OWN_ADDRESS, "address"),
    ProgramVariable("RAY_OVERRIDE_NODE_IP_ADDRESS", _OWN_ADDRESS, "address"),
    ProgramVariable("NCCL_SOCKET_IFNAME", _OWN_NETDEV, "netdev"),
    ProgramVariable("GLOO_SOCKET_IFNAME", _OWN_NETDEV, "netdev"),
    ProgramVariable("TP_SOCKET_IFNAME", _OWN_NETDEV, "netdev"),
    ProgramVariable("UCX_NET_DEVICES", _OWN_NETDEV, "netdev"),
    ProgramVariable("OMPI_MCA_btl_tcp_if_include", _OWN_NETDEV, "netdev"),
    ProgramVariable("NCCL_IB_HCA", "set cluster_link.roce_hcas", "roce"),
    ProgramVariable("NCCL_IB_DISABLE", "set cluster_link.roce_hcas (empty disables RDMA)", "roce"),
    ProgramVariable("NCCL_DEBUG", "set vllm.nccl_debug"),
    ProgramVariable("RAY_OWN_ADDRESS", "it is the head's address and ports.ray_gcs"),
    ProgramVariable("VLLM_API_KEY", "set the api_key secret"),
    ProgramVariable("HF_HUB_OFFLINE", "set model.offline"),
)
RESERVED_ENV = {v.name: v.set_by for v in PROGRAM_VARIABLES}


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


def _named(loc: tuple[int | str, ...], desc: str | None) -> str:
    """A field as a fix names it: `nodes (the GB10 nodes)`, from its description (without
    its SECRET marker; a leading word in lower case unless it is a name, e.g. RoCE)."""
    name = next((str(p) for p in reversed(loc) if isinstance(p, str)), "a valid value")
    text = re.sub(r"^SECRET(, optional)?\. ", "", (desc or "").strip()).rstrip(".")
    if not text:
        return f"{name} (see the config reference)"
    if text[:1].isupper() and text[1:2].islower():
        text = text[0].lower() + text[1:]
    return f"{name} ({text})"


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
            fix = f"add {_named(loc, desc)}"
        else:
            fix = f"give {_named(loc, desc)}"
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
        if key in SECRET_FIELDS and key not in STRUCTURED_SECRETS:
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
