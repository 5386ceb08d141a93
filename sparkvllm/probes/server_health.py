"""Model server health probe: /health, /v1/models, /version, /metrics and a smoke completion.

Run inside the model-server container (`python3 - BASE_URL MODEL [SMOKE_TIMEOUT_S]`) or on
the workstation.
The API key, when one is set, comes from the VLLM_API_KEY environment variable (the
server container has it), so no secret is ever on a command line.
Prints one JSON line; exits 0 when the server is ready and the smoke completion answered.
"""

from __future__ import annotations

# What this probe does (sparkvllm.probes.revision): bump it when that changes, not for
# wording, comments or layout; a step that runs it re-runs then.
# revision: 1
import contextlib
import json
import os
import sys
import time
import urllib.error
import urllib.request

METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)
SMOKE_PROMPT = "Reply with the single word: ready."


def _request(url: str, body: dict | None = None, timeout: float = 10.0):
    headers = {"Content-Type": "application/json"}
    key = os.environ.get("VLLM_API_KEY")
    if key:
        headers["Authorization"] = "Bearer " + key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, str(getattr(e, "reason", e))


def parse_metrics(text: str) -> dict:
    """Sum Prometheus samples of the metrics we report, over all label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in METRICS:
            with contextlib.suppress(ValueError):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def probe(base_url: str, model: str, smoke_timeout: float = 300.0) -> dict:
    base = base_url.rstrip("/")
    status, _ = _request(base + "/health")
    report = {"health_status": status, "ready": status == 200}
    if status != 200:
        return report
    status, body = _request(base + "/v1/models")
    report["models"] = [m["id"] for m in json.loads(body)["data"]] if status == 200 else []
    status, body = _request(base + "/version")
    report["vllm_version"] = json.loads(body).get("version", "") if status == 200 else ""
    status, body = _request(base + "/metrics")
    report["metrics"] = parse_metrics(body) if status == 200 else {}
    started = time.monotonic()
    status, body = _request(
        base + "/v1/chat/completions",
        {
            "model": model,
            "messages": [{"role": "user", "content": SMOKE_PROMPT}],
            "max_tokens": 8,
            "temperature": 0,
        },
        timeout=smoke_timeout,
    )
    seconds = time.monotonic() - started
    smoke = {"status": status, "ok": False, "text": ""}
    if status == 200:
        answer = json.loads(body)
        msg = answer["choices"][0].get("message", {})
        smoke["text"] = msg.get("content") or msg.get("reasoning_content") or ""
        smoke["ok"] = True
        # Tokens per second of this one short request, prompt processing included.
        tokens = int((answer.get("usage") or {}).get("completion_tokens") or 0)
        smoke["completion_tokens"] = tokens
        smoke["tokens_per_s"] = round(tokens / seconds, 2) if seconds > 0 else 0.0
    else:
        smoke["text"] = body[:200]
    report["smoke"] = smoke
    return report


def main(argv: list) -> int:
    report = probe(argv[1], argv[2], float(argv[3]) if len(argv) > 3 else 300.0)
    print(json.dumps(report, sort_keys=True))
    ok = report["ready"] and report.get("smoke", {}).get("ok", False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
