"""The `health` stack output, built from what the probes printed (pure)."""

from __future__ import annotations

import json
from typing import Any

from sparkvllm.specs.commands import parse_kv


def last_json(stdout: str) -> dict[str, Any]:
    """The last line of a probe's output that parses as a JSON object ({} if none)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return {}


def health_report(ray_stdout: str, server_stdout: str, served_name: str) -> dict[str, Any]:
    """{ready, models, vllm_version, ray: {nodes, gpus, ...}, smoke, metrics, nccl_transport}.

    `ready` is true only when the server answered /health, serves `served_name`, and the
    smoke completion came back.
    """
    ray = last_json(ray_stdout)
    server = last_json(server_stdout)
    smoke = server.get("smoke", {"ok": False, "text": "", "status": 0})
    models = server.get("models", [])
    return {
        "ready": bool(server.get("ready")) and served_name in models and bool(smoke.get("ok")),
        "models": models,
        "vllm_version": server.get("vllm_version", ""),
        "ray": {
            "nodes": ray.get("alive", 0),
            "gpus": ray.get("gpus", 0.0),
            "node_ips": sorted(n.get("ip", "") for n in ray.get("nodes", [])),
            "ray_version": ray.get("ray_version", ""),
        },
        "smoke": smoke,
        "metrics": server.get("metrics", {}),
        "nccl_transport": parse_kv(server_stdout).get("nccl_transport", "unknown"),
    }
