"""What the containers load and carry: which NCCL library, and the variables the program
sets itself (a user value for them is refused)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from sparkvllm.config.values import _Closed, _node_path

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
