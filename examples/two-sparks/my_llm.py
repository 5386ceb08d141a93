"""An example program of its own: its config keys (Pulumi.yaml) mapped onto the typed
SparkVllmCluster args, and the cluster's outputs re-exported. `__main__.py` runs it.
"""

from __future__ import annotations

from typing import Any

import pulumi

from components.cluster import SparkVllmCluster, SparkVllmClusterArgs
from sparkvllm.config import ConfigError, StackConfig, load_stack_config


def cluster_config(config: pulumi.Config) -> StackConfig:
    """This project's keys -> the cluster's typed config (every bad field named)."""
    hosts: list[dict[str, Any]] = config.require_object("hosts")
    user = config.get("user") or "nvidia"
    return load_stack_config(
        {
            "nodes": [
                {
                    "name": h["name"],
                    "ssh": {"host": h["ssh"], "user": user, "host_key": h["host_key"]},
                    "cluster_link": {
                        "address": h["cluster"],
                        "netdev": config.require("netdev"),
                    },
                    "gpus": 1,
                }
                for h in hosts
            ],
            "head": hosts[0]["name"],
            "image": {"ref": config.require("image")},
            "model": {
                "id": config.require("model"),
                "hf_cache": f"/home/{user}/.cache/huggingface",
            },
            "parallelism": {"tensor": len(hosts), "pipeline": 1},
            "ssh_private_key_file": config.get("ssh_key_file") or "~/.ssh/id_ed25519",
        }
    )


def main() -> None:
    try:
        cfg = cluster_config(pulumi.Config())
        llm = SparkVllmCluster("llm", SparkVllmClusterArgs(config=cfg))
    except ConfigError as e:
        raise pulumi.RunError(str(e)) from None
    pulumi.export("endpoint", llm.endpoint)
    pulumi.export("served_model", llm.outputs["served_model"])
    pulumi.export("ready", llm.health.apply(lambda h: h["ready"]))
