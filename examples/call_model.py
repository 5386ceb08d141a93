"""Read a stack's outputs (docs/outputs.md) and call the model it serves.

    .venv/bin/python examples/call_model.py --stack sim [--prompt TEXT] [--max-tokens N]

Outputs come from `pulumi stack output --json` where the Pulumi CLI is installed, else from
the local engine's state (`python -m localengine output --json`). The API key, when the
stack sets one, is read from $SPARK_VLLM_API_KEY (it is a Pulumi secret, never an output:
`export SPARK_VLLM_API_KEY=$(pulumi config get api_key)`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's sparkvllm (or `pip install -e` it)

from sparkvllm.outputs import OutputsError, stack_outputs  # noqa: E402


def complete(outputs: dict[str, Any], prompt: str, max_tokens: int) -> dict[str, Any]:
    """One chat completion from the stack's endpoint; the answer, tokens and tokens/s."""
    body = {
        "model": outputs["served_model"],
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    headers = {"Content-Type": "application/json"}
    if key := os.environ.get("SPARK_VLLM_API_KEY"):
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        f"{outputs['endpoint']}/chat/completions", json.dumps(body).encode(), headers
    )
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.load(response)
    seconds = time.monotonic() - started
    tokens = int(answer.get("usage", {}).get("completion_tokens", 0))
    return {
        "text": answer["choices"][0]["message"]["content"],
        "completion_tokens": tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stack", default="sim")
    p.add_argument("--prompt", default="Say hello in five words.")
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args(argv)
    try:
        outputs = stack_outputs(args.stack, ROOT)
    except OutputsError as e:
        raise SystemExit(str(e)) from None
    if not outputs.get("health", {}).get("ready"):
        print(f"warning: the last up reported the server not ready: {outputs.get('health')}")
    print(json.dumps(complete(outputs, args.prompt, args.max_tokens), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
