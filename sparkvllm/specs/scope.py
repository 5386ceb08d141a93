"""One model's names: the parts of a model (its weights, ranks, server and their steps and
containers) are named for it, so two models' parts never share a URN or a container name.

The model without a name keeps the names a single-model stack always had (`model-server`,
`rank-spark-2` ...): a deployed stack upgrades, and gains a second model, with nothing of
the first renamed (a renamed resource is a new one). A named model's parts carry its name
first (`coder-model-server`).
"""

from __future__ import annotations

from sparkvllm.config import StackConfig


def scoped(cfg: StackConfig, name: str) -> str:
    """`name` for the model `cfg` serves (a one-model view: StackConfig.for_model)."""
    own = cfg.model.name
    return name if own is None else f"{own}-{name}"
