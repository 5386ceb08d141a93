"""The memory plan: what each model is promised on each of its nodes, what its weights take
of that, what is left for its KV cache and activations, and what is left to the OS and the
page cache. Pure: the config, each node's total memory (its facts) and each model's weights
size (what its download step found on its first node).

On a GB10 the GPU's memory is the node's unified memory. vLLM's budget for one server is
`gpu_memory_utilization x total memory` (vllm/v1/worker/utils.py `request_memory`), which
holds its share of the weights (1 / (tensor x pipeline) of them on each rank), then its
activations and KV cache; the config checks that the fractions of the models on a node
leave the OS its share (sparkvllm/config/stack.py `_memory_issues`). With the figures known,
this also refuses a model whose weights leave no room for its KV cache: vLLM would load
them and then fail ("No available memory for the cache blocks"), or on unified memory
press the node.

    >>> plan = memory_plan(cfg, {"spark-1": 119.7, "spark-2": 119.7}, {"qwen": 125 << 30})
    >>> problems(plan)
    []
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sparkvllm.config import StackConfig
from sparkvllm.config.stack import model_label, model_nodes

GIB = 2**30
# Below this the KV cache holds too few tokens to serve: refused as "no room".
MIN_KV_GIB = 1.0


@dataclass(frozen=True)
class ModelShare:
    """One model on one node. GiB figures are None where a figure is not known yet."""

    model: str
    fraction: float  # its vllm.gpu_memory_utilization
    budget_gib: float | None  # fraction x the node's memory
    weights_gib: float | None  # its weights' share on this node
    kv_gib: float | None  # what the budget leaves for its KV cache and activations


@dataclass(frozen=True)
class NodeMemory:
    node: str
    total_gib: float | None
    reserve_fraction: float  # left to the OS and the page cache
    models: tuple[ModelShare, ...]

    def as_output(self) -> dict[str, object]:
        return {
            "total_gib": _round(self.total_gib),
            "reserve_gib": _round(
                None if self.total_gib is None else self.total_gib * self.reserve_fraction
            ),
            "models": {
                s.model: {
                    "fraction": s.fraction,
                    "budget_gib": _round(s.budget_gib),
                    "weights_gib": _round(s.weights_gib),
                    "kv_gib": _round(s.kv_gib),
                }
                for s in self.models
            },
        }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


def memory_plan(
    cfg: StackConfig, total_gib: Mapping[str, float], weights_bytes: Mapping[str, int]
) -> list[NodeMemory]:
    """The plan per node, in the config's order. `total_gib`: node -> its memory (the
    facts' mem_total_gib); `weights_bytes`: model label -> the size of its weights (a
    figure missing, or 0, is not known)."""
    out = []
    for node in cfg.nodes:
        total = total_gib.get(node.name) or None
        shares = []
        for m in cfg.served:
            if node not in model_nodes(cfg, m):
                continue
            label = model_label(m)
            fraction = m.vllm.gpu_memory_utilization
            budget = None if total is None else fraction * total
            size = weights_bytes.get(label) or 0
            ranks = m.parallelism.tensor * m.parallelism.pipeline
            weights = size / ranks / GIB if size else None
            kv = None if budget is None or weights is None else budget - weights
            shares.append(ModelShare(label, fraction, budget, weights, kv))
        reserve = 1.0 - sum(s.fraction for s in shares)
        out.append(NodeMemory(node.name, total, reserve, tuple(shares)))
    return out


class MemoryPlanError(Exception):
    """A model's weights leave it no room on a node (one line per node and model)."""


def as_output(
    cfg: StackConfig, total_gib: Mapping[str, float], weights_bytes: Mapping[str, int]
) -> dict[str, object]:
    """The plan as the `memory` output: node -> its figures."""
    return {n.node: n.as_output() for n in memory_plan(cfg, total_gib, weights_bytes)}


def check_plan(
    cfg: StackConfig, total_gib: Mapping[str, float], weights_bytes: Mapping[str, int]
) -> bool:
    """True, or MemoryPlanError naming each node and model whose weights leave it no room,
    with the figures known so far: the whole plan (the preflight's verdict), or one model's
    once its download found its size (only a model with a size can be short of room)."""
    found = problems(memory_plan(cfg, total_gib, weights_bytes))
    if found:
        raise MemoryPlanError("\n".join(found))
    return True


def problems(plan: list[NodeMemory]) -> list[str]:
    """One line per node where a model's weights leave it no room, naming the figures and
    the fix."""
    lines = []
    for node in plan:
        short = [s for s in node.models if s.kv_gib is not None and s.kv_gib < MIN_KV_GIB]
        for s in short:
            assert s.budget_gib is not None and s.weights_gib is not None
            lines.append(
                f"memory plan: {node.node}: model {s.model}'s weights take "
                f"{s.weights_gib:.1f} GiB of its {s.budget_gib:.1f} GiB budget "
                f"({s.fraction:g} of {node.total_gib:.1f} GiB), leaving "
                f"{max(s.kv_gib or 0.0, 0.0):.1f} GiB for its KV cache (at least "
                f"{MIN_KV_GIB:g} needed); fix: raise its vllm.gpu_memory_utilization (the "
                "node's models may take 0.9 in all), lower another model's on the node, or "
                "spread it over more nodes (tensor x pipeline)"
            )
    return lines
