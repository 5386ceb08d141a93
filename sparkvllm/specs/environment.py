"""Per-node environment: each node its OWN cluster-link values (config.PROGRAM_VARIABLES).

Why per node: Ray and vLLM pick interfaces and addresses from these variables. VLLM_HOST_IP
must equal Ray's node IP or vLLM's placement group never schedules; NCCL/GLOO/TP/UCX must
name the node's own cluster netdev or NCCL hangs or silently falls back to the LAN; and
vLLM's Ray executor copies the driver's (head's) environment to every worker unless a
variable is listed in VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json, which
`NON_CARRY_OVER` feeds.
"""

from __future__ import annotations

from sparkvllm.config import PROGRAM_VARIABLES, NodeConfig, StackConfig

# Ray misreads page cache as memory pressure on unified memory and kills workers.
RAY_MEMORY_MONITOR_OFF = {"RAY_memory_monitor_refresh_ms": "0"}

# Mount point of the nodes' HF cache inside every container.
HF_HOME = "/root/.cache/huggingface"

# Variables whose value differs per node: never copied from the head to Ray workers.
NON_CARRY_OVER = tuple(v.name for v in PROGRAM_VARIABLES if v.per_node)


def node_env(cfg: StackConfig, node: NodeConfig) -> dict[str, str]:
    """The environment every container on `node` gets (Ray head, worker, model server).

    >>> node_env(cfg, cfg.nodes[1])["NCCL_SOCKET_IFNAME"]
    'enp1s0f1np1'
    """
    link = node.cluster_link
    own = {"address": str(link.address), "netdev": link.netdev}
    env = {v.name: own[v.per_node] for v in PROGRAM_VARIABLES if v.per_node in own}
    env |= {"HF_HOME": HF_HOME, **RAY_MEMORY_MONITOR_OFF}
    if link.roce_hcas:
        # Sorted: the order of the list does not matter to NCCL, and a reordered config
        # must not change the containers' env (which would replace them).
        env["NCCL_IB_HCA"] = ",".join(sorted(link.roce_hcas))
        env["NCCL_IB_DISABLE"] = "0"
    else:
        env["NCCL_IB_DISABLE"] = "1"
    if cfg.vllm.nccl_debug:
        env["NCCL_DEBUG"] = cfg.vllm.nccl_debug
    if cfg.model.offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def rdma_enabled(node: NodeConfig) -> bool:
    return bool(node.cluster_link.roce_hcas)
