"""SIMULATION of a DGX Spark cluster on the local Docker engine.

python -m sim up [--nodes N] [--subnet CIDR] [-v]
python -m sim down [--purge]
python -m sim status
python -m sim apply      # = python -m localengine up --stack sim
python -m sim destroy    # = python -m localengine destroy --stack sim
python -m sim drift      # compare the running sim stack with its config
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from sim.nodes import Cluster
from sim.progress import Timer
from sim.runner import SubprocessRunner
from sim.settings import DEFAULT_SUBNET, REPO_ROOT, SIM_STACK, StatePaths


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sim", description="Simulated DGX Spark cluster (containers)."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="echo every command")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build images (cached) and start the simulated nodes")
    up.add_argument("--nodes", type=int, default=2, help="number of nodes (default 2)")
    up.add_argument("--subnet", default=DEFAULT_SUBNET, help=f"default {DEFAULT_SUBNET}")
    down = sub.add_parser("down", help="remove nodes, their volumes and the network")
    down.add_argument("--purge", action="store_true", help="also remove the cached images")
    sub.add_parser("status", help="print the node table as JSON")
    sub.add_parser("apply", help="= python -m localengine up --stack sim")
    sub.add_parser("destroy", help="= python -m localengine destroy --stack sim")
    sub.add_parser("drift", help="compare the running sim stack with Pulumi.sim.yaml")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    quiet = args.command == "status"
    cluster = Cluster(SubprocessRunner(verbose=args.verbose), StatePaths.at(), Timer(quiet))
    if args.command in ("apply", "destroy", "drift"):
        return _stack_alias(args.command, cluster)
    start = time.monotonic()
    try:
        if args.command == "up":
            table = cluster.up(args.nodes, args.subnet)
            print(json.dumps(table, indent=2))
            print(f"sim: up took {time.monotonic() - start:.1f}s", file=sys.stderr)
        elif args.command == "down":
            cluster.down(purge=args.purge)
        else:
            print(json.dumps(cluster.status(), indent=2))
    except (RuntimeError, ValueError, OSError) as err:
        print(f"sim {args.command}: error: {err}", file=sys.stderr)
        return 1
    return 0


def _stack_alias(command: str, cluster: Cluster) -> int:
    """`apply`, `destroy`, `drift`: the program's own tools on the `sim` stack (the local
    engine, the drift check), after making sure the simulated nodes are up."""
    from localengine.__main__ import main as engine
    from localengine.state import StateFile
    from sparkvllm import drift
    from sparkvllm.specs.containers import LABEL_PREFIX

    if command == "drift":
        return drift.main(["--stack", SIM_STACK])
    if command == "destroy":
        return engine(["destroy", "--stack", SIM_STACK, "--cwd", str(REPO_ROOT)])
    cluster.up(2)
    if not any(StateFile(REPO_ROOT, SIM_STACK).load()):
        # Containers that no state knows of (a deleted state) would block the creates.
        cluster.remove_inner_containers(f"{LABEL_PREFIX}.stack={SIM_STACK}")
    return engine(["up", "--stack", SIM_STACK, "--cwd", str(REPO_ROOT)])


if __name__ == "__main__":
    sys.exit(main())
