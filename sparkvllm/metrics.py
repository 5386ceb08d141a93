"""Write a Prometheus scrape config and a Grafana dashboard for a stack's model servers.

    python -m sparkvllm.metrics --stack NAME [--out DIR]

Writes DIR/prometheus.yml (every model server's vLLM /metrics, labelled by stack, model and
node: the `metrics` output's targets) and DIR/grafana-dashboard.json (tokens/s, time to
first token, the queue, KV cache use, speculative acceptance, each node's memory where a
node_exporter runs; import it in Grafana and pick the Prometheus data source). Reads the
stack file only: no secret, no node contacted. Exit status: 0 written, 2 a bad config or
folder (one line naming it; nothing written), 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml

from sparkvllm.config import load_stack_config
from sparkvllm.config_sources import stack_without_secrets
from sparkvllm.specs import scrape as metrics
from sparkvllm.workstation import add_tool_flags, run_tool, write_whole

# Read by the user's Prometheus and Grafana (another user, maybe): no secret is in them.
READABLE = 0o644


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparkvllm.metrics",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--stack", required=True, help="stack name, e.g. spark or sim")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path.cwd(),
        help="the folder to write in (default: the current one)",
    )
    add_tool_flags(parser)
    args = parser.parse_args(argv)
    out = args.out.absolute()
    if not out.is_dir() or not os.access(out, os.W_OK | os.X_OK):
        parser.error(
            f"--out {out}: not a folder this user can write in; fix: give a folder "
            "that exists and is writable"
        )

    def body() -> int:
        out = args.out.absolute()
        cfg = load_stack_config(stack_without_secrets(args.stack, args.cwd))
        config = metrics.prometheus_config(cfg, args.stack)
        board = metrics.dashboard(args.stack)
        write_whole(out / "prometheus.yml", yaml.safe_dump(config, sort_keys=False), READABLE)
        board_text = json.dumps(board, indent=2, sort_keys=True) + "\n"
        write_whole(out / "grafana-dashboard.json", board_text, READABLE)
        for t in metrics.targets(cfg):
            print(f"metrics: {t.model} on {t.node}: {t.url}")
        print(f"metrics: wrote {out / 'prometheus.yml'} and {out / 'grafana-dashboard.json'}")
        return 0

    return run_tool(parser.prog, args.debug, body)


if __name__ == "__main__":
    sys.exit(main())
