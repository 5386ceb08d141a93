"""Ray membership probe: which nodes are alive and how many GPUs Ray sees.

Run inside the Ray head container: `python3 - EXPECTED_IPS_CSV EXPECTED_GPUS`.
Prints one JSON line: {"alive": N, "gpus": G, "nodes": [...], "missing": [...],
"unexpected": [...], "duplicated": [...], "node_ids": [...],
"complete": bool}. Exit 0 when complete, 3 when not yet.
"""

from __future__ import annotations

import json
import logging
import sys


def summarize(nodes: list, expected_ips: list, expected_gpus: float) -> dict:
    alive = [n for n in nodes if n.get("Alive")]
    ips = [n.get("NodeManagerAddress", "") for n in alive]
    gpus = sum(float(n.get("Resources", {}).get("GPU", 0)) for n in alive)
    missing = [ip for ip in expected_ips if ip not in ips]
    unexpected = [ip for ip in ips if ip not in expected_ips]
    # A raylet that died (its node restarted, its container was replaced) stays "alive"
    # until the GCS misses its heartbeats: two alive raylets on one address is not settled.
    duplicated = sorted({ip for ip in ips if ips.count(ip) > 1})
    return {
        "alive": len(alive),
        "gpus": gpus,
        "nodes": [
            {
                "ip": n.get("NodeManagerAddress", ""),
                "hostname": n.get("NodeManagerHostname", ""),
                "gpus": float(n.get("Resources", {}).get("GPU", 0)),
            }
            for n in alive
        ],
        "missing": missing,
        "unexpected": unexpected,
        "duplicated": duplicated,
        # Raylet IDs change when a Ray process restarts (head restart, worker rejoin): the
        # model server is bound to the exact set it started on.
        "node_ids": sorted(n.get("NodeID", "") for n in alive),
        "complete": not missing and not duplicated and gpus >= expected_gpus,
    }


def main(argv: list) -> int:
    import ray

    expected_ips = [x for x in argv[1].split(",") if x]
    expected_gpus = float(argv[2])
    ray.init(address="auto", logging_level=logging.ERROR, log_to_driver=False)
    try:
        report = summarize(ray.nodes(), expected_ips, expected_gpus)
        report["ray_version"] = ray.__version__
    finally:
        ray.shutdown()
    print(json.dumps(report, sort_keys=True))
    return 0 if report["complete"] else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv))
