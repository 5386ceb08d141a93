"""Pulumi program: validate the stack config, then register the deployment graph (one
SparkVllmCluster, components/cluster.py) and export its outputs (docs/outputs.md).

A bad config raises before any resource is registered, so nothing on a node is touched.
"""

from pathlib import Path

import pulumi

from components.cluster import SparkVllmCluster, SparkVllmClusterArgs
from sparkvllm import config_sources
from sparkvllm.config import ConfigError


def main() -> None:
    try:
        cfg = config_sources.from_runtime()
        cluster = SparkVllmCluster(
            "spark-vllm",
            SparkVllmClusterArgs(config=cfg, project_dir=Path(__file__).resolve().parent),
        )
    except ConfigError as e:
        raise pulumi.RunError(str(e)) from None
    for key, value in cluster.outputs.items():
        pulumi.export(key, value)


main()
