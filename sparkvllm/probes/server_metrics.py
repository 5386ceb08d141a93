"""A model server's throughput and queue, read from vLLM's Prometheus `/metrics` (nothing
else: no request is made to the model). Run inside the model-server container
(`python3 -c SOURCE BASE_URL`) by `python -m sparkvllm.monitor`; the API key, when one is
set, comes from the container's VLLM_API_KEY (never a command line).
Prints one JSON line: {"ok": true, "metrics": {name: value}} or {"ok": false, "error": ...}.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

# Counters and gauges summed over their label sets (vllm/v1/metrics/loggers.py), and the
# time-to-first-token histogram's sum and count.
WANTED = (
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:request_success_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_draft_tokens_total",
)


def summed(text: str) -> dict:
    """Each wanted sample summed over its label sets (a Prometheus text exposition)."""
    out: dict = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in WANTED:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def main(base_url: str) -> dict:
    headers = {}
    key = os.environ.get("VLLM_API_KEY")
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(base_url.rstrip("/") + "/metrics", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return {"ok": True, "metrics": summed(resp.read().decode("utf-8", "replace"))}
    except (urllib.error.URLError, OSError) as e:
        return {"ok": False, "error": str(getattr(e, "reason", e))[:200]}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
