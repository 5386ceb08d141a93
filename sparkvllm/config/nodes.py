"""The nodes: how the workstation reaches each (ssh, a jump host) and its cluster link."""

from __future__ import annotations

import re
from ipaddress import IPv4Address

from pydantic import Field, field_validator, model_validator

from sparkvllm.config.values import (
    _NAME,
    _NETDEV,
    _USER,
    _Closed,
    _host_problem,
    _key_file,
    _no_control_chars,
)
from sparkvllm.host_keys import HOST_KEY_FIX, HostKeyError, parse_host_key


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
