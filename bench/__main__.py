"""What the deployment costs, on the SIMULATED cluster, beside the raw alternatives.

    .venv/bin/python -m bench [--quick] [--cold] [--nodes N]

Brings the simulation up and the `sim` stack to converged if needed, measures, prints one
table and writes bench/results.json (figure -> value, unit, how, goal). --quick measures
the no-op and drift figures and the served model only (a few minutes on a converged sim;
to bench/results-quick.json); --reads only the no-op `up` and the drift check, on the
stack's two nodes and (with --nodes 3) grown to three, each the median of five runs (to
bench/results-reads.json); --transfers only the image and weights distribution beside their
raw pipes (to bench/results-transfers.json); --models only a set of two models behind the
router: the router's cost beside the model's own endpoint, one model's flags changed while
both are asked, each node's available memory before, with and after the second model (to
bench/results-models.json);
--cold also destroys the stack and times a deploy from nothing, and each launcher (Ray,
native) from nothing with its idle CPU per node (--launchers: only that); --nodes 3 (or more) brings
up that many simulated nodes and also measures the image to one worker vs to two over
shaped links, and grows the `sim` stack to 3 nodes (TP=3) for its drift check there, then
back to its two nodes. Read bench/README.md.
Not part of the tests: benchmarks print figures, tests never assert times.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from bench import measure, models, relay
from bench.chart import chart
from bench.figures import Figures, git_commit
from sim import stack

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="no-op, drift and the model only")
    p.add_argument("--cold", action="store_true", help="also time a deploy from nothing")
    p.add_argument("--nodes", type=int, default=2, help="simulated nodes (3: one vs two workers)")
    p.add_argument(
        "--reads",
        action="store_true",
        help="only the no-op up and the drift check, on the stack's nodes and grown to --nodes",
    )
    p.add_argument(
        "--transfers",
        action="store_true",
        help="only the image and weights distribution, beside their raw pipes",
    )
    p.add_argument(
        "--launchers",
        action="store_true",
        help="only Ray vs native: each from nothing to healthy, and its idle CPU per node",
    )
    p.add_argument(
        "--models",
        action="store_true",
        help="only a set of models: the router's cost, one model changed, memory",
    )
    p.add_argument(
        "--out", type=Path, help="default bench/results.json (--quick: results-quick.json)"
    )
    args = p.parse_args(argv)
    # A quick run measures a few figures: it never replaces the full run's file.
    name = (
        "results-models.json"
        if args.models
        else "results-launchers.json"
        if args.launchers
        else "results-reads.json"
        if args.reads
        else "results-transfers.json"
        if args.transfers
        else "results.json"
    )
    out: Path = args.out or HERE / ("results-quick.json" if args.quick else name)
    stack.ensure_up(nodes=args.nodes, quiet=True)
    cfg, access = stack.load()
    sim = measure.Sim(cfg, access, say=lambda m: print(f"  {m}", flush=True))
    figures = Figures(
        run={
            "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": git_commit(HERE.parent),
            "nodes": len(cfg.nodes),
            "sim_nodes": args.nodes,
            "quick": args.quick,
            "cold": args.cold,
            "where": "the simulated cluster on this machine (CPU; Docker-in-Docker nodes)",
        }
    )
    if args.models:
        print("bench: a set of two models behind the router", flush=True)
        models.measure(sim, figures)
        return _written(figures, out)
    if args.launchers:
        print("bench: Ray vs native, cold and idle", flush=True)
        measure.launchers(sim, figures)
        stack.engine("up", log=lambda _m: None)  # converged again
        return _written(figures, out)
    if args.transfers:
        stack.engine("up", log=lambda _m: None)  # converged first
        print("bench: image distribution", flush=True)
        measure.image(sim, figures)
        print("bench: weights distribution", flush=True)
        measure.model_weights(sim, figures)
        return _written(figures, out)
    print("bench: no-op up and drift check", flush=True)
    measure.noop(sim, figures)
    if args.reads:
        if args.nodes > len(cfg.nodes):
            print(f"bench: the stack grown to {args.nodes} nodes and back", flush=True)
            measure.scale(sim, figures, args.nodes)
        return _written(figures, out)
    if not args.quick:
        print("bench: image distribution", flush=True)
        measure.image(sim, figures)
        print("bench: weights distribution", flush=True)
        measure.model_weights(sim, figures)
        if args.nodes >= 3:
            print("bench: image to one worker vs two, shaped links", flush=True)
            cfg3, access3 = stack.load(relay.config(3))
            relay.measure(measure.Sim(cfg3, access3, sim.say), figures)
            stack.load()  # the sim stack's own ssh files again
            print("bench: the stack grown to 3 nodes and back, its drift check there", flush=True)
            measure.scale(sim, figures, 3)
    if args.cold:
        print("bench: cold deploy", flush=True)
        measure.cold(sim, figures)
        print("bench: Ray vs native, cold and idle", flush=True)
        measure.launchers(sim, figures)
    outputs = stack.engine("up", log=lambda _m: None).outputs  # converged again
    print("bench: the served model", flush=True)
    measure.served_model(outputs["endpoint"], str(outputs["served_model"]), figures)
    return _written(figures, out)


def _written(figures: Figures, out: Path) -> int:
    """Print the table and write the figures to `out`, and their chart beside it (.png)."""
    print(figures.table())
    figures.write(out)
    drawn = chart(json.loads(out.read_text()), out.with_suffix(".png"))
    print(
        f"bench: wrote {out} and {out.with_suffix('.png')} ({len(drawn)} figures against "
        f"their goals, {sum(b.met for b in drawn)} met)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
