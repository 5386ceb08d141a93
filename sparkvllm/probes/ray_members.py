"""Ray membership probe: which nodes are alive and how many GPUs Ray sees.

Run inside the Ray head container: `python3 - EXPECTED_IPS_CSV EXPECTED_GPUS [drain|gcs]`.
Prints one JSON line: {"alive": N, "gpus": G, "nodes": [...], "missing": [...],
"unexpected": [...], "duplicated": [...], "refused": [...], "node_ids": [...],
"complete": bool}. Exit 0 when complete, 3 when not yet.

A raylet that died stays "alive" in the GCS's table until the GCS misses its health checks
(about 30 s). Its node manager port then refuses a connection (nothing listens there any
more; a restarted raylet listens on a new port): such a raylet counts as dead here at once
(`refused`), so neither the wait nor a read-back takes it for a member. Only a refusal
counts: a connection that times out proves nothing, and the GCS's word stands.

`alive`, `nodes`, `gpus` and `node_ids` are the stack's own nodes only (by cluster IP);
the others are in `unexpected`. With `drain` (the wait before the server starts; never a
read-back), every other alive node is drained (`ray drain-node`, GCS DrainNode: no new
task or placement group lands there; those it could not drain are listed in
`not_drained`): a node removed from the config keeps its Ray worker until the end of the
`up` that removes it (Pulumi deletes what left the program last), and the new server's
placement group must not put a shard on it. With `gcs` (refresh's read-back), the node
table comes straight from the GCS, without attaching a driver (`ray.init` costs a second
or more of every refresh; the GCS client a few hundred ms), and from `ray.init` where this
Ray has no such client; the answer is the same either way.
"""

from __future__ import annotations

# What this probe does (sparkvllm.probes.revision): bump it when that changes, not for
# wording, comments or layout; a step that runs it re-runs then.
# revision: 2
import json
import logging
import sys


def summarize(nodes: list, expected_ips: list, expected_gpus: float) -> dict:
    alive = [n for n in nodes if n.get("Alive")]
    ips = [n.get("NodeManagerAddress", "") for n in alive]
    mine = [n for n in alive if n.get("NodeManagerAddress", "") in expected_ips]
    gpus = sum(float(n.get("Resources", {}).get("GPU", 0)) for n in mine)
    missing = [ip for ip in expected_ips if ip not in ips]
    unexpected = [ip for ip in ips if ip not in expected_ips]
    # A raylet that died (its node restarted, its container was replaced) stays "alive"
    # until the GCS misses its heartbeats: two alive raylets on one address is not settled.
    duplicated = sorted({ip for ip in ips if ips.count(ip) > 1})
    return {
        "alive": len(mine),
        "gpus": gpus,
        "nodes": [
            {
                "ip": n.get("NodeManagerAddress", ""),
                "hostname": n.get("NodeManagerHostname", ""),
                "gpus": float(n.get("Resources", {}).get("GPU", 0)),
            }
            for n in mine
        ],
        "missing": missing,
        "unexpected": unexpected,
        "duplicated": duplicated,
        # Raylet IDs change when a Ray process restarts (head restart, worker rejoin): the
        # model server is bound to the exact set it started on (another node's raylet,
        # drained, is none of its business).
        "node_ids": sorted(n.get("NodeID", "") for n in mine),
        "unexpected_ids": sorted(n.get("NodeID", "") for n in alive if n not in mine),
        "complete": not missing and not duplicated and gpus >= expected_gpus,
    }


def refused(nodes: list, timeout: float = 2.0) -> list:
    """The IDs of the alive nodes whose raylet refuses a TCP connection to its node
    manager port (dead: see the module's doc)."""
    import socket

    dead = []
    for n in nodes:
        port = int(n.get("NodeManagerPort") or 0)
        if not n.get("Alive") or not port:
            continue
        try:
            socket.create_connection((n.get("NodeManagerAddress", ""), port), timeout).close()
        except ConnectionRefusedError:
            dead.append(n.get("NodeID", ""))
        except OSError:  # a timeout, no route: proves nothing
            pass
    return dead


def without(nodes: list, dead_ids: list) -> list:
    """The table with these nodes marked dead."""
    return [{**n, "Alive": False} if n.get("NodeID") in dead_ids else n for n in nodes]


def drain(node_ids: list) -> list:
    """Drain these nodes (`ray drain-node`, reason preemption: accepted even when busy);
    the IDs the GCS accepted."""
    import subprocess

    done = []
    for node_id in node_ids:
        ran = subprocess.run(
            ["ray", "drain-node", "--node-id", node_id,
             "--reason", "DRAIN_NODE_REASON_PREEMPTION",
             "--reason-message", "not one of the stack's nodes (spark-vllm)"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if ran.returncode == 0:
            done.append(node_id)
    return done


def gcs_nodes():
    """Ray's node table from the GCS, shaped like `ray.nodes()`, without a driver; None
    where this Ray lacks the client (`ray._raylet.GcsClient`) or the cluster's address
    (what `ray start` wrote to /tmp/ray/ray_current_cluster)."""
    import os

    try:
        from ray._raylet import GcsClient

        address = os.environ.get("RAY_ADDRESS", "")
        if address in ("", "auto"):
            with open("/tmp/ray/ray_current_cluster") as f:
                address = f.read().strip()
        table = GcsClient(address=address).get_all_node_info(timeout=10)
    except Exception:  # an older or newer Ray: the driver's way below
        return None
    return [
        {
            "NodeID": node_id.hex(),
            "Alive": info.state == 0,  # GcsNodeInfo.ALIVE
            "NodeManagerAddress": info.node_manager_address,
            "NodeManagerHostname": info.node_manager_hostname,
            "NodeManagerPort": info.node_manager_port,
            "Resources": dict(info.resources_total),
        }
        for node_id, info in table.items()
    ]


def main(argv: list) -> int:
    import ray

    expected_ips = [x for x in argv[1].split(",") if x]
    expected_gpus = float(argv[2])
    nodes = gcs_nodes() if argv[3:] == ["gcs"] else None
    if nodes is None:
        ray.init(address="auto", logging_level=logging.ERROR, log_to_driver=False)
        try:
            nodes = ray.nodes()
        finally:
            ray.shutdown()
    dead = refused(nodes)
    report = summarize(without(nodes, dead), expected_ips, expected_gpus)
    report["refused"] = sorted(n.get("NodeManagerAddress", "") for n in nodes
                               if n.get("NodeID") in dead)  # fmt: skip
    report["ray_version"] = ray.__version__
    if argv[3:] == ["drain"] and report["unexpected_ids"]:
        drained = drain(report["unexpected_ids"])
        print(f"drained {len(drained)} node(s) not in the stack: {report['unexpected']}",
              file=sys.stderr)  # fmt: skip
        # A Ray without `drain-node` (before 2.9) or a refusal blocks nothing: the server
        # may then land on such a node, as it would have without the drain; said here.
        report["not_drained"] = sorted(set(report["unexpected_ids"]) - set(drained))
    print(json.dumps(report, sort_keys=True))
    return 0 if report["complete"] else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv))
