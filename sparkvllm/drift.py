"""Drift check: compare the running cluster with the stack config, node by node.

    python -m sparkvllm.drift --stack spark

Complements `pulumi preview --refresh --expect-no-changes` (which compares Pulumi's state
and the program with what the providers read back) with what they cannot see; see
sparkvllm/specs/drift_rules.py. Exit status: 0 no drift, 1 drift (one line per finding, naming
the node), 2 the config is invalid.

Config: read through the Pulumi CLI (`pulumi config --json --show-secrets`) when it is
installed, else from Pulumi.<stack>.yaml (secrets then come from ssh_private_key_file).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkvllm import outputs
from sparkvllm.config import PROJECT_DIR, StackConfig
from sparkvllm.remote import run_ssh
from sparkvllm.specs import drift_rules as drift
from sparkvllm.workstation import SshAccess, tool_inputs

Runner = Callable[..., subprocess.CompletedProcess[str]]


def read_live(
    cfg: StackConfig, stack: str, access: SshAccess, runner: Runner = run_ssh
) -> dict[str, drift.NodeLive]:
    """Ask every node what runs there (one ssh per node, two more on the head)."""
    live: dict[str, drift.NodeLive] = {}
    for node in cfg.nodes:
        target = access.targets[node.name]
        result = runner(target, drift.state_command(cfg, stack, node), timeout=120)
        if result.returncode != 0:
            reason = (result.stderr.strip().splitlines() or ["no answer"])[-1]
            live[node.name] = drift.NodeLive(error=f"ssh to {node.ssh.host} failed: {reason}")
            continue
        state = drift.parse_state(result.stdout)
        if node.name == cfg.head:
            for attr, probe in (("ray", drift.ray_probe), ("server", drift.server_probe)):
                p = probe(cfg, stack)
                found = state.containers.get(p.container)
                if found is None or found.status != "running":
                    continue  # already reported as a missing or stopped container
                answer = runner(target, p.command, stdin=p.stdin, timeout=300)
                report = drift.probe_result(answer.stdout, answer.returncode)
                if attr == "server" and report and not (report.get("smoke") or {}).get("ok"):
                    report["last_log"] = runner(target, p.logs, timeout=60).stdout.strip()
                setattr(state, attr, report)
        live[node.name] = state
    return live


def last_outputs(stack: str, project_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """The outputs of the stack's last `up`, or {} when there are none."""
    try:
        return outputs.stack_outputs(stack, project_dir)
    except outputs.OutputsError:
        return {}


def check(
    cfg: StackConfig,
    stack: str,
    access: SshAccess,
    runner: Runner = run_ssh,
    last: dict[str, Any] | None = None,
) -> list[drift.Drift]:
    return drift.find_drift(cfg, stack, read_live(cfg, stack, access, runner), last)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkvllm.drift", description=__doc__)
    parser.add_argument("--stack", required=True, help="stack name, e.g. spark or sim")
    args = parser.parse_args(argv)
    inputs = tool_inputs(args.stack)
    if inputs is None:
        return 2
    cfg, access = inputs
    found = check(cfg, args.stack, access, last=last_outputs(args.stack))
    for d in found:
        print(d.render())
    if not found:
        print(f"drift: none ({len(cfg.nodes)} node(s) match the {args.stack} stack config)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
