"""The `health` stack output, built from what the probes printed (pure)."""

from __future__ import annotations

import json
from typing import Any

from sparkvllm.specs.output import key_values, last_json

# A liveness answer is one generated token within this bound: /health stays 200 while an
# engine is stuck (its API server still answers), a completion does not. The containers'
# own Docker healthcheck uses it; the liveness reads use timeouts.answer_s (default the
# same), so a new value of that replaces no container.
ANSWER_TIMEOUT_S = 60


def answers_check(port: int, model: str, timeout_s: int = ANSWER_TIMEOUT_S) -> str:
    """Python (for `python3 -c`, inside the server container) that exits 0 when the server
    generates one token for `model` within `timeout_s`, else 1. The API key comes from the
    container's VLLM_API_KEY, never a command line."""
    body = json.dumps({"model": model, "prompt": "ok", "max_tokens": 1, "temperature": 0})
    return (
        "import json,os,sys,urllib.request as u;"
        "k=os.environ.get('VLLM_API_KEY');"
        "h={'Content-Type':'application/json',**({'Authorization':'Bearer '+k} if k else {})};"
        f"r=u.urlopen(u.Request('http://127.0.0.1:{port}/v1/completions',"
        f"{body!r}.encode(),h),timeout={timeout_s});"
        "sys.exit(0 if json.load(r)['choices'] else 1)"
    )


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
        "nccl_transport": key_values(server_stdout).get("nccl_transport", "unknown"),
        "nccl_loaded": [
            p for p in key_values(server_stdout).get("nccl_loaded", "").split(",") if p
        ],
    }
