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

from sparkvllm.config.errors import SECRET_FIELDS, STRUCTURED_SECRETS, ConfigError, Issue
from sparkvllm.config.image import ImageConfig
from sparkvllm.config.loading import json_schema, load_stack_config, parse_pulumi_config
from sparkvllm.config.model import ModelConfig, ParallelismConfig, VllmConfig
from sparkvllm.config.nodes import ClusterLinkConfig, JumpConfig, NodeConfig, SshConfig
from sparkvllm.config.ports import RAY_OWN_PORTS, PortsConfig, ray_port_owner

# One module per topic; this is the one way in (and the import path old states' pickles
# name: docs/provider-contract.md).
from sparkvllm.config.program_env import (
    HOST_NCCL_ENV,
    HOST_NCCL_IN_CONTAINER,
    PROGRAM_VARIABLES,
    RESERVED_ENV,
    NcclConfig,
    ProgramVariable,
)
from sparkvllm.config.routing import RouterConfig, RouterImageConfig
from sparkvllm.config.stack import StackConfig, TimeoutsConfig
from sparkvllm.config.values import (
    HUB_ENDPOINT,
    MAX_UNIFIED_MEMORY_UTILIZATION,
    PROJECT,
    PROJECT_DIR,
    is_secret_name,
)

__all__ = [
    "HOST_NCCL_ENV",
    "HOST_NCCL_IN_CONTAINER",
    "HUB_ENDPOINT",
    "MAX_UNIFIED_MEMORY_UTILIZATION",
    "PROGRAM_VARIABLES",
    "PROJECT",
    "PROJECT_DIR",
    "RAY_OWN_PORTS",
    "RESERVED_ENV",
    "SECRET_FIELDS",
    "STRUCTURED_SECRETS",
    "ClusterLinkConfig",
    "ConfigError",
    "ImageConfig",
    "Issue",
    "JumpConfig",
    "ModelConfig",
    "NcclConfig",
    "NodeConfig",
    "ParallelismConfig",
    "PortsConfig",
    "ProgramVariable",
    "RouterConfig",
    "RouterImageConfig",
    "SshConfig",
    "StackConfig",
    "TimeoutsConfig",
    "VllmConfig",
    "is_secret_name",
    "json_schema",
    "load_stack_config",
    "parse_pulumi_config",
    "ray_port_owner",
]
