"""The router's readiness: its /v1/models lists every served name it was given.

Run inside the router container (`python3 - BASE_URL BUDGET_S NAME...`). The key, when the
stack has one, comes from the LITELLM_MASTER_KEY environment variable (the container has
it), never from a command line. Retries until BUDGET_S; prints one JSON line
{"ready", "models", "missing", "status", "detail"}; exits 0 once ready.
"""

from __future__ import annotations

# What this probe does (sparkvllm.probes.revision): bump it when that changes.
# revision: 1
import json
import os
import sys
import time
import urllib.error
import urllib.request


def listed(base: str) -> tuple[int, list[str], str]:
    headers = {}
    key = os.environ.get("LITELLM_MASTER_KEY", "")
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(base + "/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            data = json.loads(r.read() or b"{}")
            return r.status, [str(m.get("id")) for m in data.get("data", [])], ""
    except urllib.error.HTTPError as e:
        return e.code, [], str(e.reason)
    except (urllib.error.URLError, OSError, ValueError) as e:
        return 0, [], str(getattr(e, "reason", e))


def main(argv: list[str]) -> int:
    base, budget, names = argv[1].rstrip("/"), float(argv[2]), argv[3:]
    deadline = time.monotonic() + budget
    while True:
        status, models, detail = listed(base)
        missing = [n for n in names if n not in models]
        ready = status == 200 and not missing
        if ready or time.monotonic() >= deadline:
            report = {"ready": ready, "models": models, "missing": missing,
                      "status": status, "detail": detail[:300]}  # fmt: skip
            print(json.dumps(report, sort_keys=True))
            return 0 if ready else 1
        time.sleep(2)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
